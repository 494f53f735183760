"""A document's or a page's output in one format: what the workers wrote to the object store, or, for an archive
format (ALTO, PAGE XML, hOCR, METS) they did not write, built now from the stored page results, for documents of
at most ``api.max_build_pages`` pages. Built on request or written, a file has the same bytes: both come from the
same page results (PAGE XML's time is when its page was finished); but a METS built on request lists its pages'
ALTO and PAGE XML at this API's URLs (``/v1/pages/{id}?format=alto``), since no worker wrote them beside it."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from fastapi.responses import Response

from paperlane.errors import redact
from paperlane.formats import FORMATS, Content, build, file_name, media_type
from paperlane.producer.api.errors import ApiError
from paperlane.producer.api.service import Service
from paperlane.schemas import OutputFormat
from paperlane.status import OutputsState
from paperlane.storage import ingests, views
from paperlane.storage.db import as_utc
from paperlane.storage.objects import document_key
from paperlane.storage.outputs import written_formats
from paperlane.storage.results import document_content, document_results, page_result
from paperlane.storage.tables import DocumentRow, JobRow

_PAGE_ONLY = [spec for spec in FORMATS.values() if not spec.document]  # one page a file (PAGE XML)


def document_file(svc: Service, row: DocumentRow, *, done: bool, fmt: OutputFormat, page: int | None) -> Response:
    """The document in ``fmt`` (``page``: which page's PAGE XML, when it has several). 409 until every page is final
    (and, for JSON, markdown and PDF, until the outputs are written); 404 for what is not there and cannot be built."""
    if not done:
        raise ApiError(409, "not_ready", "the document's pages are still being processed", {"Retry-After": "1"})
    total = row.pages_total
    number = _page_number(fmt, page, total)
    if fmt in written_formats(row):
        data = svc.store.get(document_key(row.id, fmt, number, total))
    elif FORMATS[fmt].archive:
        data = _built(svc, row, fmt, number)
    else:
        raise _not_written(row, fmt)
    return _response(data, fmt, name=row.name, page=number, total=total)


def page_file(svc: Service, found: ingests.PageView, fmt: OutputFormat) -> Response:
    """The page alone in an archive format (ALTO, PAGE XML, hOCR), built from its result; 409 until it is final."""
    document, job, number = found.document, found.job, found.page.page_no
    if not views.page_state(job).final:
        raise ApiError(409, "not_ready", "the page is still being processed", {"Retry-After": "1"})
    data = _page_built(svc, document, job, fmt, number)
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


def _built(svc: Service, row: DocumentRow, fmt: OutputFormat, page: int | None) -> bytes:
    """``fmt`` built now from the stored page results (see the module docstring)."""
    if row.pages_total > svc.settings.api.max_build_pages:
        raise ApiError(404, "not_written", f"{fmt.value} was not written by the workers, and a document of "
                       f"{row.pages_total} pages is more than this API builds on request "
                       f"({svc.settings.api.max_build_pages}: api.max_build_pages)")
    if not FORMATS[fmt].document:
        number = page or 1
        job = next((j for p, j in ingests.document_pages(svc.db, row.id) if p.page_no == number), None)
        if job is None:
            raise ApiError(404, "not_found", f"the document has no page {number}")
        return _page_built(svc, row, job, fmt, number)
    read = document_results(svc.db, svc.store, row.id)
    content = document_content(svc.store, row, read.pages, created=read.finished)
    if FORMATS[fmt].companions:  # it lists page files nobody wrote: this API's own URLs for them
        ids = {p.page_no: p.id for p, _ in ingests.document_pages(svc.db, row.id)}
        content = replace(content, page_file_href=lambda each, number: f"/v1/pages/{ids[number]}?format={each.value}")
    return build(fmt, content)


def _page_built(svc: Service, row: DocumentRow, job: JobRow, fmt: OutputFormat, number: int) -> bytes:
    """Page ``number`` alone in ``fmt``, built from its job's result."""
    result = page_result(svc.store, job, source=row.source, page_no=number)
    content = Content([result], name=row.name, ext=row.ext, document_id=row.id, source=row.source,
                      page_count=row.pages_total, created=_finished(job, number))
    return build(fmt, content, page=number)


def _finished(job: JobRow, number: int) -> dict[int, datetime]:
    at = as_utc(job.finished_at)
    return {number: at} if at is not None else {}


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
