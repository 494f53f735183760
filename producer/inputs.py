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
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import IO, Any

from paperlane.errors import PaperlaneError, StorageUnavailable, UsageError
from paperlane.producer.archives import guarded, read_item
from paperlane.producer.input_items import (
    Document,
    Inflation,
    Item,
    Reading,
    Refused,
    Skipped,
    clean_text,
    is_hidden,
    refusal,
)
from paperlane.settings import IngestSettings


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
           inflation: Inflation | None = None, listed: dict[str, str] | None = None) -> Iterator[Document | Skipped]:
    """Every document under ``paths``, in a stable order, and every file skipped on the way.

    Folders are walked in name order, archive members come in archive order, S3 objects in key order.
    ``s3`` is a boto3 S3 client, needed only for ``s3://bucket/prefix`` paths. Raises UsageError for a path
    that does not exist (``check_paths`` says so before anything loads), an s3:// path without a client or
    with nothing under it, or a bucket that cannot be listed; StorageUnavailable when S3 cannot be reached.
    Anything wrong with one input is that input's refused ``Document``, never an exception. ``inflation``: what
    archives have cost so far (one is made for this call otherwise). ``listed``: s3:// URL -> the key of the last
    object of it whose documents were all yielded, kept up to date as they are; an s3:// URL in it is listed again
    from after that key (ListObjectsV2's StartAfter), so a continuation reads on from where one stopped (an object
    whose documents were not all taken is read again whole: skip what is registered).
    """
    ctx = Reading(limits, inflation or Inflation(limits))
    for raw in paths:
        text = str(raw)
        if text.startswith("s3://"):
            yield from _s3_objects(text, ctx, s3, {} if listed is None else listed)
        elif os.path.isdir(text):
            yield from _walk(text, ctx)
        elif os.path.exists(text):
            yield from _file(Path(text), ctx, explicit=True)
        else:
            raise UsageError(f"no such file or folder: {clean_text(text)}")


def expand_upload(source: str, name: str, fh: IO[bytes], size: int, limits: IngestSettings, *,
                  inflation: Inflation | None = None) -> Iterator[Document | Skipped]:
    """An uploaded file (the HTTP API, which checks its type by ``filetypes.sniff`` first): a document, or an archive's
    documents. ``fh`` is seekable (a spooled temporary file); it is closed when read."""
    item = Item(source, clean_text(name), size, lambda: fh, seekable=True)
    yield from guarded(item, "upload", read_item(item, Reading(limits, inflation or Inflation(limits)), 0,
                                                   explicit=True))


def _walk(root: str, ctx: Reading) -> Iterator[Document | Skipped]:
    """Every file under ``root``, depth first in name order; one listing per level is held, never the tree."""
    seen: set[tuple[int, int]] = set()
    stack = [_listing(root, seen)]
    while stack:
        entry = next(stack[-1], None)
        if entry is None:
            stack.pop()
        elif isinstance(entry, Skipped):
            yield entry
        elif is_hidden(entry.name):
            yield Skipped(clean_text(entry.path), "hidden folder" if _is_dir(entry) else "hidden file")
        elif _is_dir(entry):
            stack.append(_listing(entry.path, seen))
        else:
            yield from _file(Path(entry.path), ctx, explicit=False)


def _listing(folder: str, seen: set[tuple[int, int]]) -> Iterator[os.DirEntry[str] | Skipped]:
    """The entries of ``folder`` by name, or why it is skipped: unreadable, or walked already (a symlink loop)."""
    try:
        st = os.stat(folder)
        if (st.st_dev, st.st_ino) in seen:
            yield Skipped(clean_text(folder), "folder already walked (symbolic link)")
            return
        seen.add((st.st_dev, st.st_ino))
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        yield Skipped(clean_text(folder), f"cannot list folder ({exc.strerror})")
        return
    yield from entries


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # follows a symlink
    except OSError:
        return False  # _file says why it cannot be read


def _file(path: Path, ctx: Reading, *, explicit: bool) -> Iterator[Document | Skipped]:
    # stat before open: opening a FIFO blocks until a writer comes, maybe forever.
    source, name = clean_text(str(path)), clean_text(path.name)
    try:
        st = os.stat(path)
    except OSError as exc:
        yield refusal(source, name, f"cannot read ({exc.strerror})")
        return
    if not stat.S_ISREG(st.st_mode):
        yield refusal(source, name, "not a regular file")
        return
    item = Item(source, name, st.st_size, partial(_open_regular, path), seekable=True)
    yield from guarded(item, "file", read_item(item, ctx, 0, explicit=explicit))


def _open_regular(path: Path) -> IO[bytes]:
    # O_NONBLOCK: a file swapped for a FIFO since its stat must not block the open either.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Refused("not a regular file")
    return os.fdopen(fd, "rb")


def _s3_objects(url: str, ctx: Reading, client: Any, listed: dict[str, str]) -> Iterator[Document | Skipped]:
    """The objects under ``s3://bucket/prefix``, listed a page at a time (after ``listed[url]`` when it is there,
    and it follows each object done), each read on its own. The prefix is one object's key or a folder's: "scans"
    holds "scans/a.jpg", not "scans2/b.jpg"."""
    from botocore.exceptions import BotoCoreError, ClientError

    if client is None:
        raise UsageError(f"{url}: reading s3:// inputs needs S3 settings")
    bucket, _, prefix = url[5:].partition("/")
    found = url in listed  # going on: an earlier listing found something
    after = {"StartAfter": listed[url]} if url in listed else {}
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, **after):
            for obj in page.get("Contents", []):
                key: str = obj["Key"]
                under = key[len(prefix):]
                if key.endswith("/") or (prefix and not prefix.endswith("/") and under[:1] not in ("", "/")):
                    continue  # a folder marker, or "scans2/..." under the prefix "scans"
                found = True
                item = Item(f"s3://{bucket}/{key}", under.lstrip("/") or key, obj["Size"],
                             partial(_s3_open, client, bucket, key))
                yield from guarded(item, "S3 object", read_item(item, ctx, 0, explicit=key == prefix))
                listed[url] = key  # every document of it taken
    except (BotoCoreError, ClientError) as exc:
        raise _listing_error(url, exc) from exc
    if not found:
        raise UsageError(f"nothing under {url}")


def _s3_open(client: Any, bucket: str, key: str) -> IO[bytes]:
    from botocore.exceptions import ClientError

    try:
        body: IO[bytes] = client.get_object(Bucket=bucket, Key=key)["Body"]
    except ClientError as exc:
        raise Refused(f"cannot read from S3 ({exc.response.get('Error', {}).get('Code', 'error')})") from exc
    return body


def _listing_error(url: str, exc: Exception) -> PaperlaneError:
    response: dict[str, Any] = getattr(exc, "response", None) or {}
    code = response.get("Error", {}).get("Code") or type(exc).__name__
    if 400 <= response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) < 500:
        return UsageError(f"cannot list {url}: {code}")
    return StorageUnavailable(f"cannot list {url}: {code}", stage="upload")
