"""Turn what a user points at into documents: files, folders, zip and tar archives, S3 prefixes.

A *document* is one file or archive member holding pages (an image, a PDF, a multi-page TIFF). It is
stored once as an original and its pages are rendered or decoded by the workers; here only its bytes
are read and its pages counted. Everything is streamed in bounded memory whatever the input's size:
folders are listed one level at a time, zip members are read one at a time, tar archives are read as
a stream, and an archive nested in an archive goes to a spooled temporary file. What comes out, in a
stable order, is a ``Document`` or a ``Skipped`` (an unsupported type, a hidden file, a tar link).

Hostile input is one item's refusal, never an exception out of ``expand``: a ``Document`` whose
``error`` says in one line what is wrong with it (too large, a zip bomb's ratio, nested too deep,
encrypted, corrupt, truncated, not a regular file), while the rest goes on. The limits are
``IngestSettings``. Member names are only strings: nothing is ever extracted to the filesystem.

What archives may cost is bounded over the whole call (an upload, a submit, an S3 ingest) by an ``Inflation``:
the bytes read out of archives, counted as they inflate, against a multiple of the bytes sent. Crossing it
refuses the archive being read at once (and every archive after it); ``Inflation.exceeded`` says so.
"""

from __future__ import annotations

import bz2
import gzip
import io
import logging
import lzma
import os
import re
import stat
import struct
import tarfile
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any

from paperlane import filetypes
from paperlane.errors import InputError, PaperlaneError, StorageUnavailable, UsageError
from paperlane.filetypes import FileType
from paperlane.pdfium import LOCK as PDFIUM_LOCK
from paperlane.settings import IngestSettings

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
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
class _Item:
    """One file, archive member or S3 object, before it is read."""

    source: str
    name: str  # its path in its archive or under its prefix, or its file name
    size: int  # as declared: file size, member header, S3 listing
    open: Callable[[], IO[bytes]]
    compressed: int | None = None  # a zip member's compressed size
    seekable: bool = False  # a local file: an archive is read in place, not spooled


class _Refused(Exception):
    """This item is refused; the message is its one line."""


class _ArchiveFull(Exception):
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
        """Count ``size`` bytes just read out of an archive; raises _ArchiveFull once past what is allowed."""
        self.inflated += size
        if self.exceeded is None and self.inflated > (allowed := self.allowed()):
            if allowed >= self._limits.max_inflated_bytes:
                self.exceeded = f"archives inflate past {_bytes(allowed)} (ingest.max_inflated_bytes)"
            else:
                self.exceeded = (f"archives inflate past {_bytes(allowed)}, {self._limits.max_expansion:g} times the "
                                 f"{_bytes(self.sent)} sent (ingest.max_expansion, ingest.expansion_floor)")
        if self.exceeded is not None:
            raise _ArchiveFull(self.exceeded)


@dataclass
class _Reading:
    """What one call of ``expand`` (or ``expand_upload``) reads under: its limits and its inflation so far."""

    limits: IngestSettings
    inflation: Inflation


def check_paths(paths: Iterable[str | Path]) -> None:
    """Raise UsageError for a local path that does not exist or an s3:// URL without a bucket. Opens nothing."""
    for raw in paths:
        text = str(raw)
        if text.startswith("s3://"):
            if not text[5:].partition("/")[0]:
                raise UsageError(f"no bucket in {text} (s3://BUCKET/PREFIX)")
        elif not os.path.exists(text):
            raise UsageError(f"no such file or folder: {text}")


def expand(paths: Iterable[str | Path], limits: IngestSettings, *, s3: Any = None,
           inflation: Inflation | None = None) -> Iterator[Document | Skipped]:
    """Every document under ``paths``, in a stable order, and every file skipped on the way.

    Folders are walked in name order, archive members come in archive order, S3 objects in key order.
    ``s3`` is a boto3 S3 client, needed only for ``s3://bucket/prefix`` paths. Raises UsageError for a path
    that does not exist (``check_paths`` says so before anything loads), an s3:// path without a client or
    with nothing under it, or a bucket that cannot be listed; StorageUnavailable when S3 cannot be reached.
    Anything wrong with one input is that input's refused ``Document``, never an exception. ``inflation``: what
    archives have cost so far (one is made for this call otherwise).
    """
    ctx = _Reading(limits, inflation or Inflation(limits))
    for raw in paths:
        text = str(raw)
        if text.startswith("s3://"):
            yield from _s3_objects(text, ctx, s3)
        elif os.path.isdir(text):
            yield from _walk(text, ctx)
        elif os.path.exists(text):
            yield from _file(Path(text), ctx, explicit=True)
        else:
            raise UsageError(f"no such file or folder: {_text(text)}")


def expand_upload(source: str, name: str, fh: IO[bytes], size: int, limits: IngestSettings, *,
                  inflation: Inflation | None = None) -> Iterator[Document | Skipped]:
    """An uploaded file (the HTTP API, which checks its type by ``filetypes.sniff`` first): a document, or an archive's
    documents. ``fh`` is seekable (a spooled temporary file); it is closed when read."""
    item = _Item(source, _text(name), size, lambda: fh, seekable=True)
    yield from _guarded(item, "upload", _item(item, _Reading(limits, inflation or Inflation(limits)), 0,
                                                   explicit=True))


def safe_name(name: str) -> str:
    """A file name from outside (an upload's) as a document's output stem: no path, no control character."""
    return _safe_name(name)


def _walk(root: str, ctx: _Reading) -> Iterator[Document | Skipped]:
    """Every file under ``root``, depth first in name order; one listing per level is held, never the tree."""
    seen: set[tuple[int, int]] = set()
    stack = [_listing(root, seen)]
    while stack:
        entry = next(stack[-1], None)
        if entry is None:
            stack.pop()
        elif isinstance(entry, Skipped):
            yield entry
        elif _hidden(entry.name):
            yield Skipped(_text(entry.path), "hidden folder" if _is_dir(entry) else "hidden file")
        elif _is_dir(entry):
            stack.append(_listing(entry.path, seen))
        else:
            yield from _file(Path(entry.path), ctx, explicit=False)


def _listing(folder: str, seen: set[tuple[int, int]]) -> Iterator[os.DirEntry[str] | Skipped]:
    """The entries of ``folder`` by name, or why it is skipped: unreadable, or walked already (a symlink loop)."""
    try:
        st = os.stat(folder)
        if (st.st_dev, st.st_ino) in seen:
            yield Skipped(_text(folder), "folder already walked (symbolic link)")
            return
        seen.add((st.st_dev, st.st_ino))
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        yield Skipped(_text(folder), f"cannot list folder ({exc.strerror})")
        return
    yield from entries


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # follows a symlink
    except OSError:
        return False  # _file says why it cannot be read


def _file(path: Path, ctx: _Reading, *, explicit: bool) -> Iterator[Document | Skipped]:
    # stat before open: opening a FIFO blocks until a writer comes, maybe forever.
    source, name = _text(str(path)), _text(path.name)
    try:
        st = os.stat(path)
    except OSError as exc:
        yield _refusal(source, name, f"cannot read ({exc.strerror})")
        return
    if not stat.S_ISREG(st.st_mode):
        yield _refusal(source, name, "not a regular file")
        return
    item = _Item(source, name, st.st_size, partial(_open_regular, path), seekable=True)
    yield from _guarded(item, "file", _item(item, ctx, 0, explicit=explicit))


def _open_regular(path: Path) -> IO[bytes]:
    # O_NONBLOCK: a file swapped for a FIFO since its stat must not block the open either.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _Refused("not a regular file")
    return os.fdopen(fd, "rb")


def _guarded(item: _Item, what: str, documents: Iterator[Document | Skipped], *,
             member: bool = False) -> Iterator[Document | Skipped]:
    """``documents``, and in place of the exception that stops them a refusal of ``item``; an archive that holds too
    much stops its container too (``member``: the container says so, from this member on)."""
    try:
        yield from documents
    except _ArchiveFull as exc:
        if member:
            raise
        yield _refusal(item.source, item.name, f"archive refused: {exc}")
    except Exception as exc:
        yield _refusal(item.source, item.name, f"unreadable {what} ({_why(exc)})")


def _item(item: _Item, ctx: _Reading, depth: int, *, explicit: bool) -> Iterator[Document | Skipped]:
    """``item`` as a document, or the documents of the archive it is (``depth``: archives it is inside).

    An error reading its bytes propagates, for its container knows whether the rest can still be read;
    anything else wrong with it is its refusal.
    """
    if not explicit and _hidden(item.name):
        yield Skipped(item.source, "hidden file")
        return
    if not explicit and filetypes.of_name(item.name) is None:
        yield Skipped(item.source, "unsupported file type")
        return
    limits = ctx.limits
    if depth == 0:
        ctx.inflation.send(item.size)
    started = time.perf_counter()
    try:
        with item.open() as stream:
            head = _head(stream)
            fmt = filetypes.sniff(head) or filetypes.of_name(item.name)
            if fmt is None:
                raise _Refused("unsupported file type")
            if fmt.archive:
                yield from _archive(item, fmt, head, stream, ctx, depth)
                return
            _check(item, item.size, limits.max_document_bytes, "max_document_bytes", limits)
            sink = io.BytesIO()
            _copy(item, head, stream, sink, limits.max_document_bytes, "max_document_bytes", limits)
    except _Refused as exc:
        yield _refusal(item.source, item.name, str(exc))
        return
    document = _document(item, fmt, sink.getvalue(), limits)
    document.read_s = time.perf_counter() - started
    yield document


def _archive(item: _Item, fmt: FileType, head: bytes, stream: IO[bytes], ctx: _Reading,
             depth: int) -> Iterator[Document | Skipped]:
    limits = ctx.limits
    if depth > limits.max_depth:
        raise _Refused(f"archive nested more than {limits.max_depth} deep (ingest.max_depth)")
    members = _zip if fmt is FileType.ZIP else _tar
    if item.seekable:  # a local file, read in place: bounded by what it holds
        stream.seek(0)
        yield from members(item, stream, head, ctx, depth + 1)
        return
    # Spooled: one inside an archive is a member like any other; a top-level one (an S3 object) is bounded by
    # what it may hold, before it fills the disk.
    setting = "max_document_bytes" if depth else "max_archive_bytes"
    limit: int = getattr(limits, setting)
    _check(item, item.size, limit, setting, limits)
    with tempfile.SpooledTemporaryFile(max_size=limits.spool_bytes) as spool:
        _copy(item, head, stream, spool, limit, setting, limits)
        spool.seek(0)
        yield from members(item, spool, head, ctx, depth + 1)


def _check(item: _Item, size: int, limit: int, setting: str, limits: IngestSettings) -> None:
    """Refuse ``item`` at ``size`` bytes, declared or read so far: past ``limit`` or a zip bomb's ratio."""
    if size > limit:
        raise _Refused(f"larger than {_bytes(limit)} (ingest.{setting})")
    if item.compressed is not None and (why := _inflated(size, item.compressed, limits)):
        raise _Refused(why)


def _copy(item: _Item, head: bytes, stream: IO[bytes], sink: IO[bytes], limit: int, setting: str,
          limits: IngestSettings) -> None:
    """``head`` and the rest of ``stream`` into ``sink`` a chunk at a time, checked before each is kept."""
    size, chunk = 0, head
    while chunk:
        size += len(chunk)
        _check(item, size, limit, setting, limits)
        sink.write(chunk)
        chunk = stream.read(_CHUNK)


def _inflated(size: int, compressed: int, limits: IngestSettings) -> str | None:
    """Why ``size`` bytes inflated from ``compressed`` look like a bomb; None when they do not."""
    if size > max(_RATIO_FLOOR, limits.max_ratio * compressed):
        return f"compression ratio over {limits.max_ratio:g} (ingest.max_ratio)"
    return None


def _full(limits: IngestSettings, members: int, size: int) -> str | None:
    """Why an archive of ``members`` members and ``size`` bytes uncompressed so far holds too much, or None."""
    if members > limits.max_members:
        return f"more than {limits.max_members:,} members (ingest.max_members)"
    if size > limits.max_archive_bytes:
        return f"more than {_bytes(limits.max_archive_bytes)} uncompressed (ingest.max_archive_bytes)"
    return None


def _zip(archive: _Item, fh: IO[bytes], head: bytes, ctx: _Reading,
         depth: int) -> Iterator[Document | Skipped]:
    """The members of a zip archive, in its directory's order, each read on its own."""
    limits = ctx.limits
    try:
        # zipfile loads the whole directory: refuse one too long before it does.
        if _zip_entries(fh, limits.max_members) > limits.max_members:
            raise _Refused(f"more than {limits.max_members:,} members (ingest.max_members)")
        zf = zipfile.ZipFile(fh)
    except _Refused as exc:
        yield _refusal(archive.source, archive.name, str(exc))
        return
    except Exception as exc:
        yield _refusal(archive.source, archive.name, f"unreadable zip archive ({_why(exc)})")
        return
    with zf:
        size = 0
        for n, info in enumerate(zf.infolist(), 1):
            size += info.file_size
            if why := _full(limits, n, size):
                yield _refusal(archive.source, archive.name, f"archive refused from member {n:,} on: {why}")
                return
            source = f"{archive.source}!{_text(info.filename)}"
            if info.is_dir():
                continue
            if stat.S_ISLNK(info.external_attr >> 16):
                yield Skipped(source, "zip symlink ignored")
                continue
            member = _Item(source, info.filename, info.file_size, partial(_zip_open, zf, info, ctx.inflation),
                           info.compress_size)
            try:
                yield from _guarded(member, "zip member", _item(member, ctx, depth, explicit=False), member=True)
            except _ArchiveFull as exc:
                yield _refusal(archive.source, archive.name, f"archive refused from member {n:,} on: {exc}")
                return


_DIRECTORY_ENTRY = struct.Struct("<4s24xHHH12x")  # signature, then the name, extra field and comment lengths


def _zip_entries(fh: IO[bytes], cap: int) -> int:
    """The entries of a zip's central directory, counted in the directory itself (up to ``cap + 1``), where and as
    long as its end record places it: zipfile reads them all, whatever count the end record claims. 0 without an
    end record (zipfile then says it is no zip)."""
    end = fh.seek(0, os.SEEK_END)
    tail_at = max(0, end - 22 - 65_535)  # the end record and the longest comment after it
    fh.seek(tail_at)
    tail = fh.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) < at + 22:
        return 0
    size, offset = struct.unpack("<II", tail[at + 12:at + 20])
    start = tail_at + at - size  # where zipfile looks: the end record's place less the directory's size
    at64 = tail.rfind(b"PK\x06\x06", 0, at)
    if at64 >= 0 and len(tail) >= at64 + 56 and 0xFFFFFFFF in (size, offset):  # zip64: its own end record
        size = struct.unpack("<Q", tail[at64 + 40:at64 + 48])[0]
        start = tail_at + at64 - size
    count, pos, stop = 0, max(0, start), max(0, start) + size
    while count <= cap and pos + _DIRECTORY_ENTRY.size <= stop:
        fh.seek(pos)
        header = fh.read(_DIRECTORY_ENTRY.size)
        if len(header) < _DIRECTORY_ENTRY.size:
            break
        signature, name, extra, comment = _DIRECTORY_ENTRY.unpack(header)
        if signature != b"PK\x01\x02":
            break
        count += 1
        pos += _DIRECTORY_ENTRY.size + name + extra + comment
    return count


def _zip_open(zf: zipfile.ZipFile, info: zipfile.ZipInfo, inflation: Inflation) -> IO[bytes]:
    if info.flag_bits & 0x1:
        raise _Refused("encrypted zip member (password required)")
    return _Counted(zf.open(info), inflation)  # type: ignore[return-value]  # file-like, not an IO subclass


class _Counted:
    """A zip member's stream, its bytes counted against the inflation allowance as they come out."""

    def __init__(self, raw: IO[bytes], inflation: Inflation) -> None:
        self._raw, self._inflation = raw, inflation

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self._inflation.inflate(len(data))
        return data

    def __enter__(self) -> _Counted:
        return self

    def __exit__(self, *exc: object) -> None:
        self._raw.close()


class _Meter:
    """A tar archive's uncompressed stream, stopped once it has inflated more than max_ratio times or past what
    archives may cost: a bomb is caught while it inflates, whether a member is read or tarfile skips it."""

    def __init__(self, fh: IO[bytes], head: bytes, ctx: _Reading) -> None:
        self._raw, self._limits, self._inflation, self._total = fh, ctx.limits, ctx.inflation, 0
        # read1 for the compressed kinds: a read that meets a truncation raises, losing all it inflated before.
        self._read: Callable[[int], bytes] = fh.read
        if head.startswith(b"\x1f\x8b"):
            self._read = gzip.GzipFile(fileobj=fh, mode="rb").read1
        elif head.startswith(b"BZh"):
            self._read = bz2.BZ2File(fh).read1
        elif head.startswith(b"\xfd7zXZ\x00"):
            self._read = lzma.LZMAFile(fh).read1

    def read(self, size: int = -1) -> bytes:
        data = self._read(size)
        self._total += len(data)
        if why := _inflated(self._total, self._raw.tell(), self._limits):
            raise _ArchiveFull(why)
        self._inflation.inflate(len(data))
        return data


def _tar(archive: _Item, fh: IO[bytes], head: bytes, ctx: _Reading,
         depth: int) -> Iterator[Document | Skipped]:
    """The members of a tar archive (plain, gzip, bzip2, xz), streamed in archive order. The stream cannot
    go on past an error, so one ends the archive with a refusal; the documents before it stay good. A member's
    name that is not UTF-8 is read with U+FFFD in place of its bad bytes."""
    limits = ctx.limits
    meter, n, done = _Meter(fh, head, ctx), 0, 0
    try:
        # Stream mode only reads; the stub asks for the seek and write of a random-access file.
        tf = tarfile.open(fileobj=meter, mode="r|", bufsize=_CHUNK)  # type: ignore[call-overload]
        while (info := tf.next()) is not None:
            tf.members.clear()  # a streamed TarFile keeps every header it has read
            n += 1
            if why := _full(limits, n, info.offset_data + info.size):
                raise _ArchiveFull(why)
            name = _text(info.name)
            source = f"{archive.source}!{name}"
            if info.isfile():
                member = _Item(source, name, info.size, partial(_tar_open, tf, info))
                yield from _item(member, ctx, depth, explicit=False)
            elif info.issym() or info.islnk():
                yield Skipped(source, f"tar {'symlink' if info.issym() else 'hardlink'} ignored")
            elif not info.isdir():
                yield Skipped(source, "tar device or special file ignored")
            done = n
    except _ArchiveFull as exc:
        where = f" from member {n:,} on" if n else ""
        yield _refusal(archive.source, archive.name, f"archive refused{where}: {exc}")
    except Exception as exc:
        where = f" after {done:,} members" if done else ""
        yield _refusal(archive.source, archive.name, f"unreadable tar archive{where} ({_why(exc)})")


def _tar_open(tf: tarfile.TarFile, info: tarfile.TarInfo) -> IO[bytes]:
    fh = tf.extractfile(info)
    if fh is None:
        raise _Refused("not a regular file")
    return fh


def _s3_objects(url: str, ctx: _Reading, client: Any) -> Iterator[Document | Skipped]:
    """The objects under ``s3://bucket/prefix``, listed a page at a time, each read on its own. The prefix is one
    object's key or a folder's: "scans" holds "scans/a.jpg", not "scans2/b.jpg"."""
    from botocore.exceptions import BotoCoreError, ClientError

    if client is None:
        raise UsageError(f"{url}: reading s3:// inputs needs S3 settings")
    bucket, _, prefix = url[5:].partition("/")
    found = False
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                key: str = obj["Key"]
                under = key[len(prefix):]
                if key.endswith("/") or (prefix and not prefix.endswith("/") and under[:1] not in ("", "/")):
                    continue  # a folder marker, or "scans2/..." under the prefix "scans"
                found = True
                item = _Item(f"s3://{bucket}/{key}", under.lstrip("/") or key, obj["Size"],
                             partial(_s3_open, client, bucket, key))
                yield from _guarded(item, "S3 object", _item(item, ctx, 0, explicit=key == prefix))
    except (BotoCoreError, ClientError) as exc:
        raise _listing_error(url, exc) from exc
    if not found:
        raise UsageError(f"nothing under {url}")


def _s3_open(client: Any, bucket: str, key: str) -> IO[bytes]:
    from botocore.exceptions import ClientError

    try:
        body: IO[bytes] = client.get_object(Bucket=bucket, Key=key)["Body"]
    except ClientError as exc:
        raise _Refused(f"cannot read from S3 ({exc.response.get('Error', {}).get('Code', 'error')})") from exc
    return body


def _listing_error(url: str, exc: Exception) -> PaperlaneError:
    response: dict[str, Any] = getattr(exc, "response", None) or {}
    code = response.get("Error", {}).get("Code") or type(exc).__name__
    if 400 <= response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) < 500:
        return UsageError(f"cannot list {url}: {code}")
    return StorageUnavailable(f"cannot list {url}: {code}", stage="upload")


def _document(item: _Item, fmt: FileType, data: bytes, limits: IngestSettings) -> Document:
    ext = filetypes.document_ext(item.name, fmt)
    if not data:
        return _refusal(item.source, item.name, "empty file", ext)
    try:
        pages = (_pdf_pages(data) if fmt is FileType.PDF
                 else _tiff_pages(data, limits.max_pages) if fmt is FileType.TIFF else 1)
    except _Refused as exc:
        return _refusal(item.source, item.name, str(exc), ext)
    except Exception as exc:  # PDF and TIFF parsers raise a zoo of errors on hostile files
        log.debug("cannot count the pages of %s", item.source, exc_info=exc)
        return _refusal(item.source, item.name, f"unreadable {fmt.value.upper()}", ext)
    if pages > limits.max_pages:
        return _refusal(item.source, item.name, f"more than {limits.max_pages:,} pages (ingest.max_pages)", ext)
    return Document(item.source, _safe_name(item.name), ext, data, pages)


def _pdf_pages(data: bytes) -> int:
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    with PDFIUM_LOCK:  # paperlane run reads inputs while its worker threads may render PDF pages
        try:
            pdf = pdfium.PdfDocument(data)
        except pdfium.PdfiumError as exc:
            encrypted = exc.err_code == pdfium_c.FPDF_ERR_PASSWORD
            raise _Refused("encrypted PDF (password required)" if encrypted else "unreadable PDF") from exc
        try:
            if not (pages := len(pdf)):
                raise _Refused("PDF has no pages")
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


def _head(stream: IO[bytes]) -> bytes:
    head = b""
    while len(head) < filetypes.HEAD and (chunk := stream.read(filetypes.HEAD - len(head))):
        head += chunk
    return head


def _text(name: str) -> str:
    """A name from outside as text a database and a terminal take: bytes that are not UTF-8 (surrogate escapes of a
    tar or file name) and NUL become U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace").replace("\x00", "\ufffd")


def _hidden(name: str) -> bool:
    return any(part.startswith(".") and part not in (".", "..") or part == "__MACOSX" for part in name.split("/"))


def _safe_name(name: str) -> str:
    """The output stem: no '/', NUL or control character, no leading '.', at most 100 UTF-8 bytes, never empty."""
    stem = _text(filetypes.split_name(name)[0])
    stem = re.sub(r"[\x00-\x1f\x7f]", "_", stem).lstrip(".")
    return stem.encode()[:_NAME_BYTES].decode("utf-8", "ignore") or "document"


def _refusal(source: str, name: str, why: str, ext: str | None = None) -> Document:
    return Document(source, _safe_name(name), filetypes.split_name(name)[1] if ext is None else ext, b"", 1,
                    InputError(why, stage="upload"))


def _why(exc: Exception) -> str:
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


def _bytes(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n:,} bytes"
