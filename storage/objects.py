"""The object store seam: originals, result JSON and annotated images.

Backends beside this module: ``storage.localfs`` (a folder, the embedded default) and
``storage.s3`` (any S3-compatible server through boto3). Keys are built only here, so the
layout of the bucket is in one place:

    originals/<sha256[:2]>/<sha256><ext>     content-addressed: uploading twice is a no-op
    packs/<ingest>/<id>.pack#<start>-<end>    small originals of an ingest packed into one object
                                              (one PUT for hundreds of pages); the key names a
                                              byte range of it, read with a ranged GET
    results/<job_id>.json                     one per job: a rewrite replaces it
    annotated/<job_id>.<jpg|webp|png>         drawn by the worker (worker.annotated stored); annotated_format
                                              decides the encoding
    annotated/drawn/<version>/<job_id>.<jpg|webp|png>   drawn by the API when first asked for, kept per
                                              version of the job's result (drawn_key)
    documents/<document_id><suffix>           a finished document's outputs, one a format: .json, .md, .pdf,
                                              .alto.xml, .hocr, .mets.xml; a page's of a document of several
    documents/<document_id>-p<N><suffix>      pages (PAGE XML, and the ALTO and PAGE XML its METS lists), as
                                              paperlane.formats.file_name names files
    documents/built/<version>/<document_id>...   an archive format the API built on request, kept per version of
                                              the document's pages (built_key)
"""

from __future__ import annotations

from typing import Protocol

from paperlane.errors import ObjectTooLarge
from paperlane.formats import file_name
from paperlane.schemas import OutputFormat
from paperlane.settings import ImageFormat, Settings, StorageBackend


class ObjectStore(Protocol):
    def put(self, key: str, data: bytes, *, content_type: str = "application/octet-stream") -> None:
        """Store ``data`` under ``key``, replacing what was there. Raises StorageUnavailable."""
        ...

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        """The bytes under ``key`` (only its byte range for a ``...#start-end`` key). ``max_bytes``: raise
        ObjectTooLarge (with its size) instead when it is larger, found in the same request before its body is
        read (no size lookup first). Raises ObjectNotFound or StorageUnavailable."""
        ...

    def exists(self, key: str) -> bool:
        """Whether ``key`` holds an object. Raises StorageUnavailable."""
        ...

    def size(self, key: str) -> int:
        """The size in bytes of the object under ``key`` (of its byte range for a ``...#start-end`` key),
        without reading it. Raises ObjectNotFound or StorageUnavailable."""
        ...

    def url(self, key: str) -> str:
        """Where a person or a script finds the object (s3://bucket/key or a file path)."""
        ...


class DelegatingStore:
    """``store``'s every call, passed on: the base of a store that changes one of them."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def put(self, key: str, data: bytes, *, content_type: str = "application/octet-stream") -> None:
        self.store.put(key, data, content_type=content_type)

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        return self.store.get(key, max_bytes=max_bytes)

    def exists(self, key: str) -> bool:
        return self.store.exists(key)

    def size(self, key: str) -> int:
        return self.store.size(key)

    def url(self, key: str) -> str:
        return self.store.url(key)


def original_key(sha256: str, ext: str) -> str:
    return f"originals/{sha256[:2]}/{sha256}{ext.lower()}"


def pack_key(ingest_id: str, pack_id: str) -> str:
    return f"packs/{ingest_id}/{pack_id}.pack"


def ranged(key: str, start: int, end: int) -> str:
    """The key of bytes [start, end) of the object ``key``."""
    return f"{key}#{start}-{end}"


def too_large(key: str, size: int, max_bytes: int) -> ObjectTooLarge:
    """What ``ObjectStore.get`` raises for an object of ``size`` bytes past ``max_bytes``."""
    return ObjectTooLarge(f"object {key} has {size} bytes, more than the {max_bytes} asked for", size=size)


def split_range(key: str) -> tuple[str, tuple[int, int] | None]:
    """(object key, (start, end) or None) of a key that may name a byte range."""
    base, sep, span = key.partition("#")
    if not sep:
        return key, None
    start, _, end = span.partition("-")
    return base, (int(start), int(end))


def document_key(document_id: str, fmt: OutputFormat, page: int | None = None, page_count: int = 1) -> str:
    """Where a document's output in ``fmt`` goes: the document's file (``page`` None, or its only page), or
    page ``page``'s file of a document of ``page_count`` pages."""
    return "documents/" + file_name(document_id, fmt, page, page_count)


def built_key(document_id: str, version: str, fmt: OutputFormat, page: int | None = None, page_count: int = 1) -> str:
    """Where the API keeps an archive format it built on request, beside the document's outputs: one per version
    of the document's pages (``version``: what changes when a page's result does), so a later request reads it."""
    return f"documents/built/{version}/" + file_name(document_id, fmt, page, page_count)


def result_key(job_id: str) -> str:
    return f"results/{job_id}.json"


def annotated_key(job_id: str, fmt: ImageFormat) -> str:
    return f"annotated/{job_id}.{fmt.suffix}"


def drawn_key(job_id: str, version: str, fmt: ImageFormat) -> str:
    """Where the API keeps an annotated image it drew on request: one per version of the job's result
    (``version``: what changes when the job finishes again), so a later request reads it."""
    return f"annotated/drawn/{version}/{job_id}.{fmt.suffix}"


def open_store(settings: Settings) -> ObjectStore:
    """The object store the settings name."""
    if settings.storage.backend is StorageBackend.S3:
        from paperlane.storage.s3 import S3Store

        return S3Store.from_settings(settings.storage)
    from paperlane.storage.localfs import LocalStore

    return LocalStore(settings.storage_root)
