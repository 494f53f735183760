"""Ingests', documents' and pages' status reads: progress (pages final, running, unpublished; pages/s and time
left), failures by reason, a page with its document and job, a document's pages, pages needing review."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Table, func, select
from sqlalchemy.orm import Session

from paperlane.errors import DocumentNotFound, IngestNotFound, PageNotFound
from paperlane.status import JobStatus, Progress
from paperlane.storage.db import Database, as_utc, get_row
from paperlane.storage.ingests import derived_from
from paperlane.storage.tables import DocumentRow, IngestFailureRow, IngestRow, JobRow, PageRow
from paperlane.storage.tables import unpublished as unpublished_jobs

_DOCUMENTS: Table = DocumentRow.__table__
_PAGES: Table = PageRow.__table__
_JOBS: Table = JobRow.__table__
_FAILURES: Table = IngestFailureRow.__table__


def ingest_progress(db: Database, ingest_id: str, *,
                    tenant_id: str | None = None) -> tuple[IngestRow, Progress, list[tuple[str, int]]]:
    """The ingest, its progress, and its failures grouped by reason (most frequent first, at most 20).

    Raises IngestNotFound (also for another tenant's ingest, when ``tenant_id`` is given)."""
    with db.session() as s:
        live = _live((_PAGES.c.ingest_id == ingest_id) & derived_from(ingest_id))
        query = select(IngestRow, *live).where(IngestRow.id == ingest_id)
        found = s.execute(_of_tenant(query, tenant_id)).one_or_none()
        if found is None:
            raise IngestNotFound(ingest_id)
        row, running, unpublished = found
        f = _FAILURES.c
        failures = [(r, int(n)) for r, n in s.execute(
            select(f.reason, f.pages).where(f.ingest_id == ingest_id, f.pages > 0).order_by(f.pages.desc()).limit(20))
        ] if row.pages_failed else []
    progress = Progress(row.pages_total, row.pages_succeeded, row.pages_failed, int(running or 0),
                        int(unpublished or 0))
    _rate(progress, as_utc(row.first_done_at), as_utc(row.last_done_at))
    return row, progress, failures


def document_progress(db: Database, document_id: str, *,
                      tenant_id: str | None = None) -> tuple[DocumentRow, Progress, list[tuple[str, int]]]:
    """The document, its progress, and its failures grouped by reason.

    Raises DocumentNotFound (also for another tenant's document, when ``tenant_id`` is given)."""
    with db.session() as s:
        live = _live((_PAGES.c.document_id == document_id) & derived_from(document_id))
        query = select(DocumentRow, *live).where(DocumentRow.id == document_id)
        if tenant_id is not None:
            query = _of_tenant(query.join(IngestRow, IngestRow.id == DocumentRow.ingest_id), tenant_id)
        found = s.execute(query).one_or_none()
        if found is None:
            raise DocumentNotFound(document_id)
        row, running, unpublished = found
        failures = (_failures(s, (_PAGES.c.document_id == document_id) & derived_from(document_id))
                    if row.pages_failed else [])
    return row, Progress(row.pages_total, row.pages_succeeded, row.pages_failed, int(running or 0),
                         int(unpublished or 0)), failures


def _of_tenant(query: Any, tenant_id: str | None) -> Any:
    """``query`` (which joins ingests) narrowed to one tenant's rows, when a tenant is given."""
    return query if tenant_id is None else query.where(IngestRow.tenant_id == tenant_id)


def _live(where: Any) -> tuple[Any, Any]:
    """Running and unpublished pages, as two columns read with the row: found from the few such jobs
    (partial indexes on jobs), then their pages."""
    j = _JOBS.c
    joined = _JOBS.join(_PAGES, _PAGES.c.job_id == j.id)
    running = select(func.count()).select_from(joined).where(j.status == JobStatus.RUNNING, where)
    unpublished = select(func.count()).select_from(joined).where(unpublished_jobs(_JOBS), where)
    return running.scalar_subquery(), unpublished.scalar_subquery()


def _failures(s: Session, where: Any) -> list[tuple[str, int]]:
    j = _JOBS.c
    rows = s.execute(select(j.error, func.count().label("n")).select_from(_JOBS.join(_PAGES, _PAGES.c.job_id == j.id))
                     .where(j.status == JobStatus.FAILED, where).group_by(j.error)
                     .order_by(func.count().desc()).limit(20)).all()
    return [(error or "unknown", int(n)) for error, n in rows]


def _rate(p: Progress, first: datetime | None, last: datetime | None) -> None:
    finished = p.succeeded + p.failed
    if first is None or last is None or finished < 2 or last <= first:
        return
    p.pages_per_s = (finished - 1) / (last - first).total_seconds()
    p.eta_s = (p.total - finished) / p.pages_per_s if p.pages_per_s > 0 else None


@dataclass
class PageView:
    page: PageRow
    document: DocumentRow
    job: JobRow


def get_page(db: Database, page_id: str, *, tenant_id: str | None = None) -> PageView:
    """A page with its document and job. Raises PageNotFound (also for another tenant's page)."""
    # The job's id from a subquery as well as from the join: PostgreSQL then reads the job's one partition whatever
    # join it plans (storage.history).
    job_id = select(PageRow.job_id).where(PageRow.id == page_id).scalar_subquery()
    query = (select(PageRow, DocumentRow, JobRow).join(DocumentRow, DocumentRow.id == PageRow.document_id)
             .join(JobRow, JobRow.id == PageRow.job_id).where(PageRow.id == page_id, JobRow.id == job_id))
    if tenant_id is not None:
        query = _of_tenant(query.join(IngestRow, IngestRow.id == PageRow.ingest_id), tenant_id)
    with db.session() as s:
        found = s.execute(query).one_or_none()
    if found is None:
        raise PageNotFound(page_id)
    return PageView(*found)


def document_pages(db: Database, document_id: str) -> list[tuple[PageRow, JobRow]]:
    """The document's pages in order, each with its job."""
    with db.session() as s:
        return _pages(s, document_id)


def document_with_pages(db: Database, document_id: str) -> tuple[DocumentRow, list[tuple[PageRow, JobRow]]]:
    """The document and its pages in order, each with its job, read in one transaction (one moment's view, and one
    round of the connection's ping, BEGIN and COMMIT where two cost two: a one-page document's outputs read this).
    Raises DocumentNotFound."""
    with db.session() as s:
        return get_row(s, DocumentRow, document_id, DocumentNotFound), _pages(s, document_id)


def _pages(s: Session, document_id: str) -> list[tuple[PageRow, JobRow]]:
    return [tuple(r) for r in s.execute(
        select(PageRow, JobRow).join(JobRow, JobRow.id == PageRow.job_id)
        .where(PageRow.document_id == document_id, derived_from(document_id)).order_by(PageRow.page_no))]


def get_document(db: Database, document_id: str) -> DocumentRow:
    with db.session() as s:
        return get_row(s, DocumentRow, document_id, DocumentNotFound)


@dataclass(frozen=True)
class ReviewPage:
    """A succeeded page whose result a person should look at, and why."""

    page_id: str
    document_id: str
    source: str
    page_no: int
    job_id: str
    flags: list[str]
    confidence: float | None
    engine: str | None


def review_pages(db: Database, ingest_id: str, *, tenant_id: str | None = None, limit: int = 1000,
                 after: tuple[str, int] | None = None) -> list[ReviewPage]:
    """The ingest's pages needing review, by document source and page number, at most ``limit`` of them (from the
    partial index on such jobs); ``after``: the (source, page number) the previous list ended with. Raises
    IngestNotFound (also for another tenant's ingest, when ``tenant_id`` is given)."""
    j, p, d = _JOBS.c, _PAGES.c, _DOCUMENTS.c
    with db.session() as s:
        found = s.execute(_of_tenant(select(IngestRow.id).where(IngestRow.id == ingest_id), tenant_id)).one_or_none()
        if found is None:
            raise IngestNotFound(ingest_id)
        query = (select(p.id, p.document_id, d.source, p.page_no, j.id, j.review_flags, j.confidence, j.engine)
                 .select_from(_JOBS.join(_PAGES, p.job_id == j.id).join(_DOCUMENTS, d.id == p.document_id))
                 .where(j.needs_review, j.status == JobStatus.SUCCEEDED, p.ingest_id == ingest_id, derived_from(ingest_id))
                 .order_by(d.source, p.page_no).limit(limit))
        if after is not None:
            query = query.where((d.source > after[0]) | ((d.source == after[0]) & (p.page_no > after[1])))
        rows = s.execute(query).all()
    return [ReviewPage(page_id, document_id, source, page_no, job_id, flags.split(",") if flags else [], confidence,
                       engine)
            for page_id, document_id, source, page_no, job_id, flags, confidence, engine in rows]
