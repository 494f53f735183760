"""An item read: a document, or the documents of the archive it is (zip, tar, gzip/bzip2/xz tar), members read
one at a time, an archive nested in an archive spooled to a temporary file, bombs refused while they inflate."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import stat
import struct
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from functools import partial
from typing import IO

from paperlane import filetypes
from paperlane.filetypes import Compression, FileType
from paperlane.producer.input_items import (
    CHUNK,
    ArchiveFull,
    Document,
    Inflation,
    Item,
    Reading,
    Refused,
    Skipped,
    bomb_reason,
    check_size,
    clean_text,
    copy_checked,
    document_of,
    is_hidden,
    read_head,
    refusal,
    size_text,
    why_unreadable,
)
from paperlane.settings import IngestSettings


def guarded(item: Item, what: str, documents: Iterator[Document | Skipped], *,
             member: bool = False) -> Iterator[Document | Skipped]:
    """``documents``, and in place of the exception that stops them a refusal of ``item``; an archive that holds too
    much stops its container too (``member``: the container says so, from this member on)."""
    try:
        yield from documents
    except ArchiveFull as exc:
        if member:
            raise
        yield refusal(item.source, item.name, f"archive refused: {exc}")
    except Exception as exc:
        yield refusal(item.source, item.name, f"unreadable {what} ({why_unreadable(exc)})")


def read_item(item: Item, ctx: Reading, depth: int, *, explicit: bool) -> Iterator[Document | Skipped]:
    """``item`` as a document, or the documents of the archive it is (``depth``: archives it is inside).

    An error reading its bytes propagates, for its container knows whether the rest can still be read;
    anything else wrong with it is its refusal.
    """
    if not explicit and is_hidden(item.name):
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
            head = read_head(stream)
            fmt = filetypes.sniff(head) or filetypes.of_name(item.name)
            if fmt is None:
                raise Refused("unsupported file type")
            if fmt.archive:
                yield from _archive(item, fmt, head, stream, ctx, depth)
                return
            check_size(item, item.size, limits.max_document_bytes, "max_document_bytes", limits)
            sink = io.BytesIO()
            copy_checked(item, head, stream, sink, limits.max_document_bytes, "max_document_bytes", limits)
    except Refused as exc:
        yield refusal(item.source, item.name, str(exc))
        return
    document = document_of(item, fmt, sink.getvalue(), limits)
    document.read_s = time.perf_counter() - started
    yield document


def _archive(item: Item, fmt: FileType, head: bytes, stream: IO[bytes], ctx: Reading,
             depth: int) -> Iterator[Document | Skipped]:
    limits = ctx.limits
    if depth > limits.max_depth:
        raise Refused(f"archive nested more than {limits.max_depth} deep (ingest.max_depth)")
    members = _zip if fmt is FileType.ZIP else _tar
    if item.seekable:  # a local file, read in place: bounded by what it holds
        stream.seek(0)
        yield from members(item, stream, head, ctx, depth + 1)
        return
    # Spooled: one inside an archive is a member like any other; a top-level one (an S3 object) is bounded by
    # what it may hold, before it fills the disk.
    setting = "max_document_bytes" if depth else "max_archive_bytes"
    limit: int = getattr(limits, setting)
    check_size(item, item.size, limit, setting, limits)
    with tempfile.SpooledTemporaryFile(max_size=limits.spool_bytes) as spool:
        copy_checked(item, head, stream, spool, limit, setting, limits)
        spool.seek(0)
        yield from members(item, spool, head, ctx, depth + 1)


def _full(limits: IngestSettings, members: int, size: int) -> str | None:
    """Why an archive of ``members`` members and ``size`` bytes uncompressed so far holds too much, or None."""
    if members > limits.max_members:
        return f"more than {limits.max_members:,} members (ingest.max_members)"
    if size > limits.max_archive_bytes:
        return f"more than {size_text(limits.max_archive_bytes)} uncompressed (ingest.max_archive_bytes)"
    return None


def _zip(archive: Item, fh: IO[bytes], head: bytes, ctx: Reading,
         depth: int) -> Iterator[Document | Skipped]:
    """The members of a zip archive, in its directory's order, each read on its own."""
    limits = ctx.limits
    try:
        # zipfile loads the whole directory: refuse one too long before it does.
        if _zip_entries(fh, limits.max_members) > limits.max_members:
            raise Refused(f"more than {limits.max_members:,} members (ingest.max_members)")
        zf = zipfile.ZipFile(fh)
    except Refused as exc:
        yield refusal(archive.source, archive.name, str(exc))
        return
    except Exception as exc:
        yield refusal(archive.source, archive.name, f"unreadable zip archive ({why_unreadable(exc)})")
        return
    with zf:
        size = 0
        for n, info in enumerate(zf.infolist(), 1):
            size += info.file_size
            if why := _full(limits, n, size):
                yield refusal(archive.source, archive.name, f"archive refused from member {n:,} on: {why}")
                return
            source = f"{archive.source}!{clean_text(info.filename)}"
            if info.is_dir():
                continue
            if stat.S_ISLNK(info.external_attr >> 16):
                yield Skipped(source, "zip symlink ignored")
                continue
            member = Item(source, info.filename, info.file_size, partial(_zip_open, zf, info, ctx.inflation),
                           info.compress_size)
            try:
                yield from guarded(member, "zip member", read_item(member, ctx, depth, explicit=False), member=True)
            except ArchiveFull as exc:
                yield refusal(archive.source, archive.name, f"archive refused from member {n:,} on: {exc}")
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
        raise Refused("encrypted zip member (password required)")
    return _Counted(zf.open(info), inflation)  # type: ignore[return-value]  # a counting reader stands in for the file


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

    def __init__(self, fh: IO[bytes], head: bytes, ctx: Reading) -> None:
        self._raw, self._limits, self._inflation, self._total = fh, ctx.limits, ctx.inflation, 0
        # read1 for the compressed kinds: a read that meets a truncation raises, losing all it inflated before.
        self._read: Callable[[int], bytes] = fh.read
        kind = filetypes.compression(head)
        if kind is Compression.GZIP:
            self._read = gzip.GzipFile(fileobj=fh, mode="rb").read1
        elif kind is Compression.BZIP2:
            self._read = bz2.BZ2File(fh).read1
        elif kind is Compression.XZ:
            self._read = lzma.LZMAFile(fh).read1

    def read(self, size: int = -1) -> bytes:
        data = self._read(size)
        self._total += len(data)
        if why := bomb_reason(self._total, self._raw.tell(), self._limits):
            raise ArchiveFull(why)
        self._inflation.inflate(len(data))
        return data


def _tar(archive: Item, fh: IO[bytes], head: bytes, ctx: Reading,
         depth: int) -> Iterator[Document | Skipped]:
    """The members of a tar archive (plain, gzip, bzip2, xz), streamed in archive order. The stream cannot
    go on past an error, so one ends the archive with a refusal; the documents before it stay good. A member's
    name that is not UTF-8 is read with U+FFFD in place of its bad bytes."""
    limits = ctx.limits
    meter, n, done = _Meter(fh, head, ctx), 0, 0
    try:
        # Stream mode only reads; the stub asks for the seek and write of a random-access file.
        tf = tarfile.open(fileobj=meter, mode="r|", bufsize=CHUNK)  # type: ignore[call-overload]
        while (info := tf.next()) is not None:
            tf.members.clear()  # a streamed TarFile keeps every header it has read
            n += 1
            if why := _full(limits, n, info.offset_data + info.size):
                raise ArchiveFull(why)
            name = clean_text(info.name)
            source = f"{archive.source}!{name}"
            if info.isfile():
                member = Item(source, name, info.size, partial(_tar_open, tf, info))
                yield from read_item(member, ctx, depth, explicit=False)
            elif info.issym() or info.islnk():
                yield Skipped(source, f"tar {'symlink' if info.issym() else 'hardlink'} ignored")
            elif not info.isdir():
                yield Skipped(source, "tar device or special file ignored")
            done = n
    except ArchiveFull as exc:
        where = f" from member {n:,} on" if n else ""
        yield refusal(archive.source, archive.name, f"archive refused{where}: {exc}")
    except Exception as exc:
        where = f" after {done:,} members" if done else ""
        yield refusal(archive.source, archive.name, f"unreadable tar archive{where} ({why_unreadable(exc)})")


def _tar_open(tf: tarfile.TarFile, info: tarfile.TarInfo) -> IO[bytes]:
    fh = tf.extractfile(info)
    if fh is None:
        raise Refused("not a regular file")
    return fh
