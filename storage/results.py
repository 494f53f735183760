"""A page's result as stored: its job's result JSON, told which document and page it is; a document's pages'."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from paperlane.errors import PaperlaneError
from paperlane.schemas import JobStatus, PageResult, Task
from paperlane.storage import status_reads
from paperlane.storage.db import Database, as_utc
from paperlane.storage.objects import ObjectStore
from paperlane.storage.tables import DocumentRow, JobRow

log = logging.getLogger(__name__)


def page_result(store: ObjectStore, job: JobRow, *, source: str, page_no: int,
                known: Mapping[str, PageResult] | None = None) -> PageResult:
    """A page's result: its job's stored result (``known[job.id]`` when the caller holds what it stored), or a
    failed one saying why there is none."""
    result: PageResult | None = None
    if job.status == JobStatus.SUCCEEDED and job.result_key:
        result = known.get(job.id) if known else None
        try:
            result = result or PageResult.model_validate_json(store.get(job.result_key))
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
                     known: Mapping[str, PageResult] | None = None) -> DocumentResults:
    """The document and its pages' results (one read of each page's stored result, but for the pages in ``known``:
    job id -> the result the caller stored for it). Raises DocumentNotFound."""
    document = status_reads.get_document(db, document_id)
    pages, finished = [], {}
    for page, job in status_reads.document_pages(db, document_id):
        pages.append(page_result(store, job, source=document.source, page_no=page.page_no, known=known))
        if (at := as_utc(job.finished_at)) is not None:
            finished[page.page_no] = at
    return DocumentResults(document, pages, finished)
