"""A page's result as stored: its job's result JSON, told which document and page it is; a document's pages', the
document as the formats build it (``document_content``), and a document or a page built now in an archive format
from those results (``built_document``, ``built_page``: the API has them built in a process of its own)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from paperlane.errors import PageNotFound, PaperlaneError
from paperlane.formats import FORMATS, Content, build
from paperlane.schemas import JobStatus, OutputFormat, PageResult, Task
from paperlane.storage import status_reads
from paperlane.storage.db import Database, as_utc
from paperlane.storage.objects import ObjectStore, split_range
from paperlane.storage.tables import DocumentRow, JobRow

log = logging.getLogger(__name__)


# Job id -> the result the caller just stored for it, or the JSON it stored (read instead of the store's copy).
Known = Mapping[str, "PageResult | bytes"]


def page_result(store: ObjectStore, job: JobRow, *, source: str, page_no: int,
                known: Known | None = None) -> PageResult:
    """A page's result: its job's stored result (``known[job.id]`` when the caller holds what it stored), or a
    failed one saying why there is none."""
    result: PageResult | None = None
    if job.status == JobStatus.SUCCEEDED and job.result_key:
        kept = known.get(job.id) if known else None
        try:
            if isinstance(kept, bytes):
                kept = PageResult.model_validate_json(kept)
            result = kept or PageResult.model_validate_json(store.get(job.result_key))
        except (PaperlaneError, ValueError) as exc:
            log.warning("stored result of job %s unreadable (%s)", job.id, exc)
    if result is None:
        error = job.error or ("not finished" if job.status in (JobStatus.QUEUED, JobStatus.RUNNING)
                              else "stored result missing")
        result = PageResult(job_id=job.id, source=source, page=page_no, status=JobStatus.FAILED,
                            error=error, task=Task(job.task))
    return result.model_copy(update={"source": source, "page": page_no})


@dataclass(frozen=True)
class DocumentResults:
    document: DocumentRow
    pages: list[PageResult]  # in page order, each told its document and page
    finished: dict[int, datetime]  # page number -> when its job became final (a page not final has none)


def document_results(db: Database, store: ObjectStore, document_id: str, *,
                     known: Known | None = None) -> DocumentResults:
    """The document and its pages' results (one read of each page's stored result, but for the pages in ``known``:
    job id -> the result the caller stored for it). Raises DocumentNotFound."""
    document, rows = status_reads.document_with_pages(db, document_id)
    pages, finished = [], {}
    for page, job in rows:
        pages.append(page_result(store, job, source=document.source, page_no=page.page_no, known=known))
        if (at := as_utc(job.finished_at)) is not None:
            finished[page.page_no] = at
    return DocumentResults(document, pages, finished)


def document_content(store: ObjectStore, document: DocumentRow, pages: list[PageResult], *,
                     created: Mapping[int, datetime] | None = None, stem: str | None = None,
                     max_pixels: int = 150_000_000) -> Content:
    """What the formats build the document from: its pages, its names, and its original, read from the store only
    when a format needs it (the searchable PDF). Files are named after ``stem`` (default the document's id).

    A METS's image group points at the original where the store keeps it (``original_location``): a METS
    references only files that exist, and a copy of every original beside its METS would double what is stored."""
    key = document.original_key
    return Content(pages, name=document.name, ext=document.ext, document_id=document.id, source=document.source,
                   stem=stem or document.id, original=(lambda: store.get(key)) if key else (lambda: None),
                   original_href=original_location(store, key) if key else None, created=created or {},
                   max_pixels=max_pixels)


def original_location(store: ObjectStore, key: str) -> str:
    """The URL of the original under ``key``: the store's (``s3://bucket/...``, or a ``file:`` URL of the local
    store's file); an original packed with others (a byte range of a pack) adds ``#bytes=START-END``."""
    base, span = split_range(key)
    url = store.url(base)
    if "://" not in url:
        url = Path(url).absolute().as_uri()
    return url + (f"#bytes={span[0]}-{span[1]}" if span else "")


def built_document(db: Database, store: ObjectStore, document_id: str, fmt: OutputFormat, page: int | None, *,
                   page_href: str) -> bytes:
    """The document in the archive format ``fmt``, built now from its pages' stored results (``page``: which page,
    for a format of one page a file; default 1). A METS lists its pages' ALTO and PAGE XML at ``page_href`` with
    ``{page_id}`` and ``{format}`` filled in, since nobody wrote them beside it. Raises DocumentNotFound,
    PageNotFound, and what ``build`` raises."""
    if not FORMATS[fmt].document:
        number = page or 1
        document, rows = status_reads.document_with_pages(db, document_id)
        job = next((j for p, j in rows if p.page_no == number), None)
        if job is None:
            raise PageNotFound(f"the document has no page {number}")
        return built_page(store, document, job, fmt, number)
    read = document_results(db, store, document_id)
    content = document_content(store, read.document, read.pages, created=read.finished)
    if FORMATS[fmt].companions:
        ids = {p.page_no: p.id for p, _ in status_reads.document_pages(db, document_id)}
        content = replace(content, page_file_href=lambda each, number: page_href.format(page_id=ids[number],
                                                                                         format=each.value))
    return build(fmt, content)


def built_page(store: ObjectStore, document: DocumentRow, job: JobRow, fmt: OutputFormat, number: int) -> bytes:
    """Page ``number`` of ``document`` alone in the archive format ``fmt``, built now from its job's result."""
    result = page_result(store, job, source=document.source, page_no=number)
    at = as_utc(job.finished_at)
    content = Content([result], name=document.name, ext=document.ext, document_id=document.id, source=document.source,
                      page_count=document.pages_total, created={number: at} if at is not None else {})
    return build(fmt, content, page=number)
