"""PDFs kept near the preprocessing pool: one download and one parse per worker process, not one per page.

Every page of a PDF is a job of its own, and each used to fetch the whole original from the object
store and have PDFium parse it again: a 1,000-page PDF meant 1,000 downloads and 1,000 parses, a
100 MB one of 10,000 pages ~1 TB of reads. Two caches, each bounded in bytes (object keys of
originals are content-addressed, so what is cached never goes stale):

- ``Spool``, in the worker process: each PDF its pages need, downloaded once into a local folder
  that the pool's processes read. A PDF in use by a page in flight stays; the others go, least
  recently used first, beyond ``worker.document_cache_bytes``. A PDF larger than that budget (or than
  ``worker.max_input_bytes``) is not kept: its pages read it from the store each, as before.
- ``OpenDocuments``, in each process that prepares pages (a pool process; the worker itself for
  urgent pages): PDFs opened by PDFium from the spool and kept open for their next pages, least
  recently used closed beyond ``worker.open_document_bytes``. PDFium reads from the file only what a
  page needs (the cross-reference table once, then that page's objects), and keeps what it has read,
  so an open PDF counts as its file's size. A PDF larger than the budget is opened for each page
  from the local copy: a parse per page, but no download.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from paperlane import filetypes
from paperlane.models.engine import InputSpec
from paperlane.storage.objects import ObjectStore, split_range
from paperlane.workers.preprocess import PDFIUM_LOCK, Limits, PdfFile, PreparedPage, open_pdf, prepare_pdf_page

log = logging.getLogger(__name__)


def spooled_kind(key: str) -> bool:
    """Whether the original under ``key`` is one the spool keeps: a PDF stored on its own (packed
    originals are small, and read by their byte range)."""
    base, span = split_range(key)
    return span is None and base.lower().endswith(".pdf")


@dataclass
class _Spooled:
    path: Path | None  # None: not kept here (too large, not a PDF, its download failed)
    size: int = 0
    users: int = 1  # pages in flight that hold it
    ready: threading.Event = field(default_factory=threading.Event)


class Spool:
    """The worker's local copies of the PDFs its pages need (see the module docstring). Thread-safe."""

    def __init__(self, store: ObjectStore, *, budget: int, max_bytes: int) -> None:
        self._store, self._budget, self._max_bytes = store, budget, max_bytes
        self._folder = Path(tempfile.mkdtemp(prefix="paperlane-pdfs-"))
        self._lock = threading.Lock()
        self._files: OrderedDict[str, _Spooled] = OrderedDict()  # least recently used first
        self._bytes = 0
        self.downloads = 0  # PDFs downloaded: what the spool saves is pages minus this

    def acquire(self, key: str) -> Path | None:
        """The local copy of the PDF under ``key``, downloaded now unless it is here; held for the caller
        until ``release(key)``, which the caller must call whatever this returned or raised.

        None: it is not kept here (the caller reads the store itself). Raises what the store raises
        when this call is the one that downloads it.
        """
        with self._lock:
            entry = self._files.get(key)
            download = entry is None
            if entry is None:
                entry = self._files[key] = _Spooled(path=None)
            else:
                entry.users += 1
                self._files.move_to_end(key)
        if not download:
            entry.ready.wait()  # another page's download of it
            return entry.path
        try:
            entry.path, entry.size = self._download(key)
        finally:
            with self._lock:
                self._bytes += entry.size
                entry.ready.set()
                self._evict()
        return entry.path

    def _download(self, key: str) -> tuple[Path | None, int]:
        data = self._store.get(key)
        self.downloads += 1
        if not data or len(data) > min(self._budget, self._max_bytes) or not filetypes.is_pdf(data):
            return None, 0  # refused or read as it is by the page itself
        path = self._folder / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.pdf"
        partial = path.with_suffix(".part")
        partial.write_bytes(data)
        os.replace(partial, path)
        return path, len(data)

    def release(self, key: str) -> None:
        """A page done with ``key`` (see ``acquire``)."""
        with self._lock:
            entry = self._files.get(key)
            if entry is not None:
                entry.users -= 1
                self._evict()

    def _evict(self) -> None:
        """Remove copies nobody holds, least recently used first, while the spool is over its budget; and
        entries of PDFs not kept here, once nobody holds them."""
        for key, entry in list(self._files.items()):
            if entry.users > 0 or not entry.ready.is_set():
                continue
            if entry.path is None or self._bytes > self._budget:
                del self._files[key]
                self._bytes -= entry.size
                if entry.path is not None:
                    entry.path.unlink(missing_ok=True)  # processes that have it open keep reading it

    @property
    def bytes(self) -> int:
        """Bytes of the copies kept now."""
        return self._bytes

    def close(self) -> None:
        shutil.rmtree(self._folder, ignore_errors=True)


class OpenDocuments:
    """PDFs a process keeps open for their next pages (see the module docstring). Every call holds
    ``PDFIUM_LOCK``, which guards these documents as it guards PDFium."""

    def __init__(self, *, budget: int) -> None:
        self._budget = budget
        self._open: OrderedDict[str, tuple[PdfFile, int]] = OrderedDict()  # least recently used first
        self._bytes = 0
        self.opened = 0  # documents PDFium has parsed: what keeping them open saves is pages minus this

    def prepare(self, key: str, path: Path, spec: InputSpec, limits: Limits, *, page: int,
                preview_side: int) -> PreparedPage:
        """Page ``page`` of the PDF under ``key``, whose local copy is ``path`` (``Spool``), prepared as
        ``preprocess.prepare_page`` prepares it. Raises what that raises."""
        with PDFIUM_LOCK:
            pdf, kept = self._get(key, path, limits)
            try:
                return prepare_pdf_page(pdf, spec, limits, page=page, preview_side=preview_side)
            finally:
                if not kept:
                    pdf.close()

    def _get(self, key: str, path: Path, limits: Limits) -> tuple[PdfFile, bool]:
        found = self._open.get(key)
        if found is not None:
            self._open.move_to_end(key)
            return found[0], True
        size = path.stat().st_size
        pdf = open_pdf(str(path), contents=lambda: _mapped(path))
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
