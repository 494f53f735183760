"""What reading inputs yields, and the rules every item is read under: a ``Document`` (its pages counted) or a
``Skipped``; an item's refusal, with its name made safe; the bytes one item may hold.

What archives may cost is bounded over the whole call (an upload, a submit, an S3 ingest) by an ``Inflation``:
the bytes read out of archives, counted as they inflate, against a multiple of the bytes sent. Crossing it
refuses the archive being read at once (and every archive after it); ``Inflation.exceeded`` says so.
"""

from __future__ import annotations

import io
import logging
import lzma
import re
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from paperlane import filetypes, pdfium
from paperlane.errors import InputError
from paperlane.filetypes import FileType
from paperlane.settings import IngestSettings

log = logging.getLogger(__name__)

CHUNK = 1 << 20
_RATIO_FLOOR = 1 << 20  # small members (a blank page) compress far beyond a bomb's ratio without harm
_NAME_BYTES = 100


@dataclass
class Document:
    """One input file or archive member holding pages: stored once as an original, its pages processed by workers."""

    source: str  # "dir/a.jpg", "x.zip!sub/a.jpg", "x.tar!inner.zip!p.pdf", "s3://bucket/key"
    name: str  # output stem: the member's file stem, safe for a file name, at most 100 UTF-8 bytes, never empty
    ext: str  # lower-case suffix: ".jpg", ".pdf", ".tif", ... (of what the bytes are, when the name says otherwise)
    data: bytes  # the original bytes, whole; b"" when refused
    page_count: int  # 1 for an image; pages of a PDF; frames of a TIFF; 1 when refused
    error: InputError | None = None  # refused: one readable line, stage="upload"
    read_s: float = 0.0  # seconds spent reading it


@dataclass
class Skipped:
    """A file or member that is not a document, for the caller to count."""

    source: str
    reason: str  # "unsupported file type", "hidden file", "tar symlink ignored", ...


@dataclass
class Item:
    """One file, archive member or S3 object, before it is read."""

    source: str
    name: str  # its path in its archive or under its prefix, or its file name
    size: int  # as declared: file size, member header, S3 listing
    open: Callable[[], IO[bytes]]
    compressed: int | None = None  # a zip member's compressed size
    seekable: bool = False  # a local file: an archive is read in place, not spooled


class Refused(Exception):
    """This item is refused; the message is its one line."""


class ArchiveFull(Exception):
    """The archive being streamed holds too much: the rest of it is refused."""


class Inflation:
    """What one upload, submit or ingest may read out of archives: ``ingest.max_expansion`` times the bytes it was
    sent (at least ``ingest.expansion_floor``), never more than ``ingest.max_inflated_bytes``. Crossing it refuses
    the archive being read, and every archive after it: ``exceeded`` says why."""

    def __init__(self, limits: IngestSettings) -> None:
        self._limits = limits
        self.sent = 0  # bytes of the files, uploads and objects read
        self.inflated = 0  # bytes read out of archives (a member of a nested archive counts at each level)
        self.exceeded: str | None = None

    def send(self, size: int) -> None:
        self.sent += size

    def allowed(self) -> int:
        limits = self._limits
        return min(limits.max_inflated_bytes, max(limits.expansion_floor, int(limits.max_expansion * self.sent)))

    def inflate(self, size: int) -> None:
        """Count ``size`` bytes just read out of an archive; raises ArchiveFull once past what is allowed."""
        self.inflated += size
        if self.exceeded is None and self.inflated > (allowed := self.allowed()):
            if allowed >= self._limits.max_inflated_bytes:
                self.exceeded = f"archives inflate past {size_text(allowed)} (ingest.max_inflated_bytes)"
            else:
                self.exceeded = (f"archives inflate past {size_text(allowed)}, {self._limits.max_expansion:g} "
                                 f"times the {size_text(self.sent)} sent (ingest.max_expansion, "
                                 "ingest.expansion_floor)")
        if self.exceeded is not None:
            raise ArchiveFull(self.exceeded)


@dataclass
class Reading:
    """What one call of ``expand`` (or ``expand_upload``) reads under: its limits and its inflation so far."""

    limits: IngestSettings
    inflation: Inflation


def check_size(item: Item, size: int, limit: int, setting: str, limits: IngestSettings) -> None:
    """Refuse ``item`` at ``size`` bytes, declared or read so far: past ``limit`` or a zip bomb's ratio."""
    if size > limit:
        raise Refused(f"larger than {size_text(limit)} (ingest.{setting})")
    if item.compressed is not None and (why := bomb_reason(size, item.compressed, limits)):
        raise Refused(why)


def copy_checked(item: Item, head: bytes, stream: IO[bytes], sink: IO[bytes], limit: int, setting: str,
          limits: IngestSettings) -> None:
    """``head`` and the rest of ``stream`` into ``sink`` a chunk at a time, checked before each is kept."""
    size, chunk = 0, head
    while chunk:
        size += len(chunk)
        check_size(item, size, limit, setting, limits)
        sink.write(chunk)
        chunk = stream.read(CHUNK)


def bomb_reason(size: int, compressed: int, limits: IngestSettings) -> str | None:
    """Why ``size`` bytes inflated from ``compressed`` look like a bomb; None when they do not."""
    if size > max(_RATIO_FLOOR, limits.max_ratio * compressed):
        return f"compression ratio over {limits.max_ratio:g} (ingest.max_ratio)"
    return None


def document_of(item: Item, fmt: FileType, data: bytes, limits: IngestSettings) -> Document:
    ext = filetypes.document_ext(item.name, fmt)
    if not data:
        return refusal(item.source, item.name, "empty file", ext)
    try:
        pages = (_pdf_pages(data) if fmt is FileType.PDF
                 else _tiff_pages(data, limits.max_pages) if fmt is FileType.TIFF else 1)
    except Refused as exc:
        return refusal(item.source, item.name, str(exc), ext)
    except Exception as exc:  # PDF and TIFF parsers raise a zoo of errors on hostile files
        log.debug("cannot count the pages of %s", item.source, exc_info=exc)
        return refusal(item.source, item.name, f"unreadable {fmt.value.upper()}", ext)
    if pages > limits.max_pages:
        return refusal(item.source, item.name, f"more than {limits.max_pages:,} pages (ingest.max_pages)", ext)
    return Document(item.source, safe_name(item.name), ext, data, pages)


def _pdf_pages(data: bytes) -> int:
    with pdfium.LOCK:  # paperlane run reads inputs while its worker threads may render PDF pages
        try:
            pdf = pdfium.open_document(data, stage="upload")
        except InputError as exc:
            raise Refused(str(exc)) from exc
        try:
            if not (pages := len(pdf)):
                raise Refused("PDF has no pages")
            return pages
        finally:
            pdf.close()


def _tiff_pages(data: bytes, cap: int) -> int:
    """A TIFF's frames, counted up to ``cap + 1`` from its directories alone. Not through ``Image.open``: no pixel
    is decoded, so a frame declaring billions of pixels (a DecompressionBombError there) is counted like any
    other, for the worker to refuse with its own pixel limit."""
    from PIL import TiffImagePlugin

    with TiffImagePlugin.TiffImageFile(io.BytesIO(data)) as im:
        pages = 1
        while pages <= cap:
            try:
                im.seek(pages)
            except EOFError:
                break
            pages += 1
        return pages


def read_head(stream: IO[bytes]) -> bytes:
    head = b""
    while len(head) < filetypes.HEAD and (chunk := stream.read(filetypes.HEAD - len(head))):
        head += chunk
    return head


def clean_text(name: str) -> str:
    """A name from outside as text a database and a terminal take: bytes that are not UTF-8 (surrogate escapes of a
    tar or file name) and NUL become U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace").replace("\x00", "\ufffd")


def is_hidden(name: str) -> bool:
    return any(part.startswith(".") and part not in (".", "..") or part == "__MACOSX" for part in name.split("/"))


def safe_name(name: str) -> str:
    """The output stem: no '/', NUL or control character, no leading '.', at most 100 UTF-8 bytes, never empty."""
    stem = clean_text(filetypes.split_name(name)[0])
    stem = re.sub(r"[\x00-\x1f\x7f]", "_", stem).lstrip(".")
    return stem.encode()[:_NAME_BYTES].decode("utf-8", "ignore") or "document"


def refusal(source: str, name: str, why: str, ext: str | None = None) -> Document:
    return Document(source, safe_name(name), filetypes.split_name(name)[1] if ext is None else ext, b"", 1,
                    InputError(why, stage="upload"))


def why_unreadable(exc: Exception) -> str:
    """A short reason for an error reading an input; an unexpected one goes to the log with its traceback."""
    text = str(exc).lower()
    if isinstance(exc, EOFError) or "end of data" in text or "truncated" in text:
        return "truncated"
    if "crc" in text:
        return "bad CRC"
    if isinstance(exc, RecursionError):
        return "nested too deep"
    if isinstance(exc, NotImplementedError):
        return "unsupported compression"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    if isinstance(exc, (zipfile.BadZipFile, tarfile.TarError, zlib.error, lzma.LZMAError, OSError, ValueError)):
        return "corrupt data"
    log.warning("unexpected error reading an input", exc_info=exc)
    return "internal error, see the log"


def size_text(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n:,} bytes"
