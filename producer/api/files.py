"""A document's or a page's output in one format: what the workers wrote to the object store, or, for an archive
format (ALTO, PAGE XML, hOCR, METS) they did not write, built now from the stored page results, for documents of
at most ``api.max_build_pages`` pages. Built on request or written, a file has the same bytes: both come from the
same page results (PAGE XML's time is when its page was finished); but a METS built on request lists its pages'
ALTO and PAGE XML at this API's URLs (``/v1/pages/{id}?format=alto``), since no worker wrote them beside it.
Builds run in the API's build processes (``producer.api.builds``); this module only decides what to build."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime
from typing import Any

from fastapi.responses import Response

from paperlane.errors import ObjectNotFound, redact
from paperlane.formats import ARCHIVE_FORMATS, FORMATS, file_name, format_of, media_type, media_type_of
from paperlane.producer.api.builds import BuildTask, DrawTask
from paperlane.producer.api.errors import ApiError
from paperlane.producer.api.limits import retry_after
from paperlane.producer.api.service import Service
from paperlane.schemas import OutputFormat
from paperlane.status import JobStatus, OutputsState
from paperlane.storage import status_reads, views
from paperlane.storage.db import as_utc
from paperlane.storage.objects import built_key, document_key, drawn_key
from paperlane.storage.outputs import written_formats
from paperlane.storage.tables import DocumentRow

_PAGE_ONLY = [spec for spec in FORMATS.values() if not spec.document]  # one page a file (PAGE XML)


def _contents(formats: list[OutputFormat]) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of a route that answers in one of ``formats``."""
    media = {media_type(f).split(";")[0]: {"schema": {"type": "string"} if f is not OutputFormat.JSON else {}}
             for f in formats}
    return {200: {"description": "the file", "content": media}}


_PRIVATE = {"Cache-Control": "private, max-age=300"}  # an annotated image: the same for a page's result
DOCUMENT_FILES = _contents(list(OutputFormat))
PAGE_FILES = _contents([OutputFormat.JSON, *(f for f in ARCHIVE_FORMATS if FORMATS[f].page)])


def document_file(svc: Service, row: DocumentRow, *, done: bool, fmt: OutputFormat, page: int | None,
                  tenant_id: str, waiting: Callable[[], None]) -> Response:
    """The document in ``fmt`` (``page``: which page's PAGE XML, when it has several). 409 until every page is final
    (and, for JSON, markdown and PDF, until the outputs are written); 404 for what is not there and cannot be built.
    ``waiting``: called when a build is handed to a build process (``Builder.build``)."""
    if not done:
        raise ApiError(409, "not_ready", "the document's pages are still being processed", {"Retry-After": "1"})
    total = row.pages_total
    number = _page_number(fmt, page, total)
    if fmt in written_formats(row):
        data = svc.store.get(document_key(row.id, fmt, number, total))
    elif FORMATS[fmt].archive:
        data = _kept(svc, row, fmt, number, tenant_id=tenant_id, waiting=waiting)
    else:
        raise _not_written(row, fmt)
    return _response(data, fmt, name=row.name, page=number, total=total)


def page_file(svc: Service, found: status_reads.PageView, fmt: OutputFormat, *, tenant_id: str,
              waiting: Callable[[], None]) -> Response:
    """The page alone in an archive format (ALTO, PAGE XML, hOCR), built from its result (one page of the tenant's
    ``api.build_pages_per_minute``); 409 until it is final. ``waiting``: as ``document_file``'s."""
    document, number = found.document, found.page.page_no
    if not views.page_state(found.job).final:
        raise ApiError(409, "not_ready", "the page is still being processed", {"Retry-After": "1"})
    _spend(svc, tenant_id, 1)
    data = svc.builder.build(BuildTask(document.id, fmt, page_id=found.page.id), waiting=waiting)
    return _response(data, fmt, name=document.name, page=number, total=document.pages_total)


def _page_number(fmt: OutputFormat, page: int | None, total: int) -> int | None:
    """The page a document's file is of: a page-only format's (PAGE XML: one page a file) when it has several;
    None otherwise."""
    if FORMATS[fmt].document:
        if page is not None:
            raise ApiError(422, "invalid_request", f"page= is for format={'|'.join(s.key.value for s in _PAGE_ONLY)} "
                           f"only ({', '.join(s.title for s in _PAGE_ONLY)} holds one page a file)")
        return None
    if total == 1 and page in (None, 1):
        return None
    if page is None:
        raise ApiError(422, "invalid_request", f"PAGE XML holds one page a file: give page=N (1 to {total})")
    if not 1 <= page <= total:
        raise ApiError(404, "not_found", f"the document has pages 1 to {total}")
    return page


def _kept(svc: Service, row: DocumentRow, fmt: OutputFormat, page: int | None, *, tenant_id: str,
          waiting: Callable[[], None]) -> bytes:
    """``fmt`` as built for this version of the document's pages: read back when it was built before, else built
    now (its pages spent from the tenant's ``api.build_pages_per_minute``: 429 past it) and kept beside the
    document's outputs. The version changes when a page's result does (the document finishes again)."""
    version = _version(row.finished_at, row.pages_succeeded, row.pages_failed, row.pages_total)
    key = built_key(row.id, version, fmt, page, row.pages_total)
    if row.pages_total > svc.settings.api.max_build_pages:
        raise ApiError(404, "not_written", f"{fmt.value} was not written by the workers, and a document of "
                       f"{row.pages_total} pages is more than this API builds on request "
                       f"({svc.settings.api.max_build_pages}: api.max_build_pages)")
    try:
        return svc.store.get(key)
    except ObjectNotFound:
        pass
    _spend(svc, tenant_id, 1 if not FORMATS[fmt].document else row.pages_total)
    return svc.builder.build(BuildTask(row.id, fmt, page, keep=key), waiting=waiting)  # built, kept, in a process


def annotated_file(svc: Service, found: status_reads.PageView, *, tenant_id: str,
                   waiting: Callable[[], None]) -> Response:
    """The page's annotated image: the worker's, or one drawn now from its original and its result (one page of the
    tenant's ``api.build_pages_per_minute``) and kept for the next request (``workers.drawing``). 409 until the
    page is final; 404 for a page not read (failed), or when this API draws none. ``waiting``: as ``page_file``'s."""
    job = found.job
    if job.annotated_key:
        data = svc.store.get(job.annotated_key)
        encoding = format_of(data)
        suffix = "." + job.annotated_key.rsplit(".", 1)[-1]
        media = media_type(encoding) if encoding is not None else media_type_of(suffix)
        return Response(data, media_type=media, headers=_PRIVATE)
    if not views.page_state(job).final:
        raise ApiError(409, "not_ready", "the page is still being processed", {"Retry-After": "1"})
    draw = svc.builder.draw
    if job.status != JobStatus.SUCCEEDED or draw is None:
        raise ApiError(404, "not_found", "this page has no annotated image")
    fmt = svc.settings.worker.annotated_format
    key = drawn_key(job.id, _version(job.finished_at), fmt)
    try:
        data = svc.store.get(key)
    except ObjectNotFound:
        _spend(svc, tenant_id, 1)
        data = svc.builder.build(DrawTask(found.page.id, key, draw), waiting=waiting)  # drawn, kept, in a process
    return Response(data, media_type=media_type(fmt), headers=_PRIVATE)


def _version(finished_at: datetime | None, *counts: int) -> str:
    """What names one version of what was built from results: when they last finished, and any ``counts`` that
    change with them (a document's pages succeeded, failed and in all)."""
    finished = as_utc(finished_at)
    parts = [finished.isoformat() if finished else "-", *map(str, counts)]
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:16]


def _spend(svc: Service, tenant_id: str, pages: int) -> None:
    per_minute = svc.settings.api.build_pages_per_minute
    wait = svc.limits.spend(f"tenant.{tenant_id}", pages, per_minute=per_minute)
    if wait:
        raise ApiError(429, "build_limited", f"this tenant has had {per_minute:,} pages of archive formats built in "
                       "the last minute (api.build_pages_per_minute); what was built is kept and read back freely",
                       {"Retry-After": retry_after(wait)})


def _not_written(row: DocumentRow, fmt: OutputFormat) -> ApiError:
    if row.outputs == OutputsState.FAILED.value:
        return ApiError(404, "outputs_failed",
                        f"the document's outputs could not be written: {redact(row.outputs_error or 'unknown')}")
    if row.outputs != OutputsState.WRITTEN.value:
        return ApiError(409, "outputs_pending", "every page is final; the document's outputs are being written",
                        {"Retry-After": "1"})
    if FORMATS[fmt].best_effort:
        return ApiError(404, "not_written", f"no {FORMATS[fmt].title} was written for this document (the "
                        f"workers write the formats in worker.output_formats; a {fmt.value.upper()} that cannot be "
                        "made is left out)")
    return ApiError(404, "not_written", f"no {fmt.value} was written for this document (the workers write the "
                    "formats in worker.output_formats)")


def _response(data: bytes, fmt: OutputFormat, *, name: str, page: int | None, total: int) -> Response:
    filename = file_name(_header_safe(name), fmt, page, total)
    return Response(data, media_type=media_type(fmt),
                    headers={"Content-Disposition": f'inline; filename="{filename}"'})


def _header_safe(name: str) -> str:
    return "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in name)[:100] or "document"
