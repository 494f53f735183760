"""Originals kept near the preprocessing pool: what a page costs is its page, not its document.

Every page of a PDF or a multi-page TIFF is a job of its own, and each used to fetch the whole
original from the object store and parse it again: a 1,000-page PDF meant 1,000 downloads and
1,000 parses, a 100 MB one of 10,000 pages ~1 TB of reads. This module is where a worker decides how
its pages read an original (object keys of originals are content-addressed, so nothing cached goes
stale). The size comes first (``ObjectStore.size``, a HEAD): an original larger than
``worker.max_input_bytes`` is refused on its page before a byte of it is read. Then:

- a PDF larger than ``worker.ranged_pdf_bytes`` is read by byte range (``storage.reader``): each
  process that prepares its pages opens it over the store and PDFium reads the cross-reference table
  once, then each page's own objects, in blocks, so a page costs its objects, not the file;
- any other PDF, and a TIFF (which cannot be read by range), is downloaded once by ``Spool``, in the
  worker process, into a local folder that the pool's processes read. One in use by a page in flight
  stays; the others go, least recently used first, beyond ``worker.document_cache_bytes``; one larger
  than that budget is read from the store whole by each page, as before;
- ``OpenDocuments``, in each process that prepares pages, keeps PDFs opened by PDFium (from the spool
  or over the store) for their next pages, least recently used closed beyond
  ``worker.open_document_bytes``. PDFium keeps what it has read of one, so an open PDF counts as its
  file's size; a larger one is opened again for each page.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from paperlane import filetypes
from paperlane.errors import InputError, ObjectTooLarge, PaperlaneError
from paperlane.models.engine import InputSpec
from paperlane.storage.objects import ObjectStore, split_range
from paperlane.storage.reader import ObjectReader
from paperlane.workers.input_limits import Limits
from paperlane.workers.pdf_pages import PDFIUM_LOCK, PdfFile, open_pdf
from paperlane.workers.preprocess import PreparedPage, prepare_pdf_page
from paperlane.workers.scratch import ScratchFolder

log = logging.getLogger(__name__)


_SPOOLED = (".pdf", ".tif", ".tiff")
_RANGED_KEPT = 1024  # PDFs read by range whose size the spool remembers


def spooled_kind(key: str) -> bool:
    """Whether the original under ``key`` is one the spool decides for: a PDF or TIFF stored on its own
    (packed originals are small, and read by their byte range)."""
    base, span = split_range(key)
    return span is None and base.lower().endswith(_SPOOLED)


def checked_size(store: ObjectStore, key: str, max_bytes: int) -> int:
    """The size of the original under ``key``, looked up without reading it. Raises InputError when it is
    larger than ``max_bytes``, and what the store raises."""
    size = store.size(key)
    if size > max_bytes:
        raise _too_large(size, max_bytes)
    return size


def read_whole(store: ObjectStore, key: str, max_bytes: int) -> bytes:
    """The original under ``key``, whole, unless it is larger than ``max_bytes`` (InputError): one request, the
    size read from its answer before the body (no size lookup first). Raises what the store raises."""
    try:
        return store.get(key, max_bytes=max_bytes)
    except ObjectTooLarge as exc:
        raise _too_large(exc.size, max_bytes) from None


def _too_large(size: int, max_bytes: int) -> InputError:
    return InputError(f"file too large ({size / 2**20:.0f} MiB, limit {max_bytes / 2**20:.0f} MiB)",
                      stage="preprocess")


@dataclass(frozen=True)
class Source:
    """Where a page's process reads an original: ``path``, a local copy; else, when ``ranged``, the store
    by byte range (an object of ``size`` bytes); else the store, whole."""

    path: Path | None = None
    ranged: bool = False
    size: int = 0


@dataclass
class _Spooled:
    source: Source = Source()  # path None: not kept here (read by range, too large, its download failed)
    size: int = 0  # bytes of the local copy
    users: int = 1  # pages in flight that hold it
    error: PaperlaneError | None = None  # why its lookup failed
    ready: threading.Event = field(default_factory=threading.Event)


class Spool:
    """The worker's local copies of the PDFs its pages need (see the module docstring). Thread-safe."""

    def __init__(self, store: ObjectStore, *, budget: int, max_bytes: int, ranged_above: int | None = None) -> None:
        """``ranged_above``: PDFs larger than this are read by range, not downloaded (None: none are)."""
        self._store, self._budget, self._max_bytes = store, budget, max_bytes
        self._ranged_above = ranged_above
        self._scratch = ScratchFolder("paperlane-pdfs-")  # a killed worker's copies go with the next worker
        self._folder = self._scratch.path
        self._lock = threading.Lock()
        self._files: OrderedDict[str, _Spooled] = OrderedDict()  # least recently used first
        self._bytes = 0
        self.downloads = 0  # PDFs downloaded: what the spool saves is pages minus this

    def acquire(self, key: str) -> Source:
        """How pages read the original under ``key`` (see the module docstring), downloaded now when it is
        kept here and not here yet; held for the caller until ``release(key)``, which the caller must call
        whatever this returned or raised.

        Raises InputError for an original larger than ``max_bytes`` (found before any of it is read), and
        what the store raises when this call is the one that looks it up.
        """
        with self._lock:
            entry = self._files.get(key)
            download = entry is None
            if entry is None:
                entry = self._files[key] = _Spooled()
            else:
                entry.users += 1
                self._files.move_to_end(key)
        if not download:
            entry.ready.wait()  # another page's download of it
            if entry.error is not None:
                raise entry.error
            return entry.source
        try:
            entry.source, entry.size = self._fetch(key)
        except PaperlaneError as exc:
            entry.error = exc  # for the pages waiting on this lookup; gone with its entry when they are done
            raise
        finally:
            with self._lock:
                self._bytes += entry.size
                entry.ready.set()
                self._evict()
        return entry.source

    def _fetch(self, key: str) -> tuple[Source, int]:
        size = checked_size(self._store, key, self._max_bytes)
        is_pdf = key.lower().endswith(".pdf")
        if is_pdf and self._ranged_above is not None and size > self._ranged_above:
            return Source(ranged=True, size=size), 0
        if not size or size > self._budget:
            return Source(), 0  # read as it is by the page itself
        data = self._store.get(key)
        self.downloads += 1
        if is_pdf and not filetypes.is_pdf(data):
            return Source(), 0
        path = self._folder / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}{Path(key).suffix.lower()}"
        partial = path.with_suffix(".part")
        partial.write_bytes(data)
        os.replace(partial, path)
        return Source(path=path, size=len(data)), len(data)

    def release(self, key: str) -> None:
        """A page done with ``key`` (see ``acquire``)."""
        with self._lock:
            entry = self._files.get(key)
            if entry is not None:
                entry.users -= 1
                self._evict()

    def _evict(self) -> None:
        """Remove copies nobody holds, least recently used first, while the spool is over its budget; entries
        of originals not kept here once nobody holds them; and those of PDFs read by range (what their size
        said, kept so their next pages skip the lookup) beyond the most recent ``_RANGED_KEPT``."""
        ranged = sum(1 for entry in self._files.values() if entry.source.ranged)
        for key, entry in list(self._files.items()):
            if entry.users > 0 or not entry.ready.is_set():
                continue
            if entry.source.ranged:
                if ranged > _RANGED_KEPT:
                    del self._files[key]
                    ranged -= 1
            elif entry.source.path is None or self._bytes > self._budget:
                del self._files[key]
                self._bytes -= entry.size
                if entry.source.path is not None:
                    entry.source.path.unlink(missing_ok=True)  # processes that have it open keep reading it

    @property
    def bytes(self) -> int:
        """Bytes of the copies kept now."""
        return self._bytes

    def close(self) -> None:
        self._scratch.close()


class OpenDocuments:
    """PDFs a process keeps open for their next pages (see the module docstring). Every call holds
    ``PDFIUM_LOCK``, which guards these documents as it guards PDFium."""

    def __init__(self, *, budget: int, max_requests: int = 1024) -> None:
        """``max_requests``: ranged reads of one PDF before its reader fetches it whole
        (``storage.reader``): at ~20 ms each on S3, a cold open of a late page of a flat page tree stays
        well inside ``worker.render_timeout``."""
        self._budget, self._max_requests = budget, max_requests
        self._open: OrderedDict[str, tuple[PdfFile, int]] = OrderedDict()  # least recently used first
        self._bytes = 0
        self.opened = 0  # documents PDFium has parsed: what keeping them open saves is pages minus this

    def prepare(self, key: str, path: Path, spec: InputSpec, limits: Limits, *, page: int,
                preview_side: int) -> PreparedPage:
        """Page ``page`` of the PDF under ``key``, whose local copy is ``path`` (``Spool``), prepared as
        ``preprocess.prepare_page`` prepares it. Raises what that raises."""
        with PDFIUM_LOCK:
            pdf, kept = self._get(key, lambda: (open_pdf(str(path), contents=lambda: _mapped(path)),
                                                path.stat().st_size))
            try:
                return prepare_pdf_page(pdf, spec, limits, page=page, preview_side=preview_side)
            finally:
                if not kept:
                    pdf.close()

    def prepare_ranged(self, key: str, store: ObjectStore, size: int, spec: InputSpec, limits: Limits, *,
                       page: int, preview_side: int) -> PreparedPage:
        """Page ``page`` of the PDF under ``key`` (``size`` bytes), read from ``store`` by byte range
        (``storage.reader``), prepared as ``prepare`` does it. Raises what that raises, and the store's own
        error when a read PDFium asked for failed."""
        reader: ObjectReader | None = None

        def opened() -> tuple[PdfFile, int]:
            nonlocal reader
            reader = ObjectReader(store, key, size=size, max_requests=self._max_requests)
            return open_pdf(reader, contents=reader.runs), size

        with PDFIUM_LOCK:
            try:
                pdf, kept = self._get(key, opened)
            except InputError:  # PDFium says "unreadable" when a read failed: say why it failed
                if reader is not None and reader.error is not None:
                    raise reader.error from None
                raise
            try:
                return prepare_pdf_page(pdf, spec, limits, page=page, preview_side=preview_side)
            except InputError:
                error = pdf.reader.error if pdf.reader is not None else None
                if error is None:
                    raise
                if kept:  # a read failed: the next page opens it afresh
                    self._bytes -= self._open.pop(key)[1]
                    kept = False
                raise error from None
            finally:
                if not kept:
                    pdf.close()

    def _get(self, key: str, opener: Callable[[], tuple[PdfFile, int]]) -> tuple[PdfFile, bool]:
        found = self._open.get(key)
        if found is not None:
            self._open.move_to_end(key)
            return found[0], True
        pdf, size = opener()
        self.opened += 1
        if size > self._budget:
            return pdf, False
        self._open[key] = (pdf, size)
        self._bytes += size
        while self._bytes > self._budget:
            _, (oldest, oldest_size) = self._open.popitem(last=False)
            oldest.close()
            self._bytes -= oldest_size
        return pdf, True

    def close(self) -> None:
        with PDFIUM_LOCK:
            for pdf, _ in self._open.values():
                pdf.close()
            self._open.clear()
            self._bytes = 0


def _mapped(path: Path) -> bytes | mmap.mmap:
    """The file's bytes, mapped (the page cache's copy, shared by every process that reads it); nothing
    when it is gone: then no image dictionary is found, and scanned pages are rendered."""
    try:
        with path.open("rb") as fh:
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return b""
