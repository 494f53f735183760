"""Ingests, documents and pages: registration in bulk and the counts that roll up (their status reads:
``storage.status_reads``).

An ingest is registered a chunk of documents at a time, each chunk one transaction: its jobs
(``INSERT ... ON CONFLICT DO NOTHING``: the same original page asked for the same task is one job,
whoever asked), its documents and its pages. Ids are derived from what they name (uuid5 of the
ingest and the source, of the document and the page number), so registering a chunk again, as a
resumed ingest does, adds nothing.

The counts on ingests and documents move in the same transaction as the job state they count:
``rollup`` when a job becomes final (or stops being final), and registration for a page whose job
was final before the page existed. Each tenant's usage (``storage.usage``) moves with them, in the same
transaction. Registration reads those jobs' status ``FOR SHARE`` (PostgreSQL),
so a job that finishes meanwhile is counted exactly once: by whichever transaction comes second.

So does a tenant's count of pages in flight (``storage.tenants``): registration keeps what was reserved for
the pages it registers that are still live and gives back the rest, ``rollup`` releases pages as they become
final (and takes them again when they stop being final).
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Table, bindparam, case, func, select, true, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from paperlane.status import JobStatus, OutputsState
from paperlane.storage import timeids, usage, webhooks
from paperlane.storage.db import Database, as_utc, utcnow
from paperlane.storage.tables import DocumentRow, IngestFailureRow, IngestRow, JobKeyRow, JobRow, PageRow, TenantRow
from paperlane.storage.tables import unpublished as unpublished_jobs

_NAMESPACE = uuid.UUID("6a0b3c8e-3f0e-4f43-9d55-70617065726c")
_INGESTS: Table = IngestRow.__table__
_DOCUMENTS: Table = DocumentRow.__table__
_PAGES: Table = PageRow.__table__
_JOBS: Table = JobRow.__table__
_FAILURES: Table = IngestFailureRow.__table__
_TENANTS: Table = TenantRow.__table__
_KEYS: Table = JobKeyRow.__table__


def document_id_for(ingest_id: str, source: str) -> str:
    """Derived from the ingest (time-first: in its month's partition; an ingest made before those: uuid5)."""
    if timeids.is_time_first(ingest_id):
        return timeids.derived(ingest_id, f"document:{source}")
    return str(uuid.uuid5(_NAMESPACE, f"document:{ingest_id}:{source}"))


def page_id_for(document_id: str, page_no: int) -> str:
    if timeids.is_time_first(document_id):
        return timeids.derived(document_id, f"page:{page_no}")
    return str(uuid.uuid5(_NAMESPACE, f"page:{document_id}:{page_no}"))


@dataclass(frozen=True)
class Owner:
    """Whose ingest it is: nobody's (the command line), or an API tenant's, with the key that made it and the
    URL to call when it finishes."""

    tenant_id: str | None = None
    api_key_id: str | None = None
    callback_url: str | None = None


def ingest_key(*, name: str, sources: Sequence[str], lane: str, task_key: str) -> str:
    return hashlib.sha256("\0".join([name, lane, task_key, *sources]).encode()).hexdigest()


def open_ingest(db: Database, *, key: str, name: str, lane: str, task: str, task_options: dict,
                owner: Owner | None = None, weight: float = 1.0) -> tuple[IngestRow, bool]:
    """The unfinished ingest with this key (an interrupted submit of the same thing), or a new one (with
    ``weight`` in its tenant's fair share).

    Returns (ingest, resumed)."""
    owner = owner or Owner()
    with db.session() as s:
        row = s.scalars(select(IngestRow).where(IngestRow.ingest_key == key, IngestRow.registered_at.is_(None))
                        .order_by(IngestRow.created_at.desc()).limit(1)).one_or_none()
        if row is not None and row.tenant_id == owner.tenant_id:
            return row, True
        row = IngestRow(id=timeids.mint(), ingest_key=key, name=name, lane=lane, task=task,
                        task_options=task_options, documents_total=0, pages_total=0, pages_succeeded=0,
                        pages_failed=0, skipped=0, created_at=utcnow(), tenant_id=owner.tenant_id,
                        api_key_id=owner.api_key_id, callback_url=owner.callback_url, weight=weight)
        s.add(row)
    return row, False


def close_ingest(db: Database, ingest_id: str, *, skipped: int, error: str | None = None) -> None:
    """Every document is registered, or (``error``: why) no more will be: the ingest's totals are final."""
    now = utcnow()
    i = _INGESTS.c
    values: dict[str, Any] = dict(registered_at=now, skipped=skipped, finished_at=_finished_at(
        i.pages_succeeded + i.pages_failed, now, registering=True))
    if error is not None:
        values["error"] = error
    with db.session() as s:
        _finished(s, s.execute(update(_INGESTS).where(i.id == ingest_id).values(**values).returning(*_FINISHED)),
                  now)


def discard_ingest(db: Database, ingest_id: str) -> bool:
    """Delete an ingest nothing was registered into (an upload refused as a whole); False when it holds documents
    (then it stays, for the caller to close)."""
    with db.session() as s:
        has_documents = select(_DOCUMENTS.c.id).where(_DOCUMENTS.c.ingest_id == ingest_id).exists()
        done = s.execute(_INGESTS.delete().where(_INGESTS.c.id == ingest_id, ~has_documents))
        return bool(done.rowcount)


# An ingest is finished once it is registered and every page is final; the UPDATE that makes it so
# returns it (its finished_at becomes exactly ``now``) and queues its webhook in the same transaction.
_FINISHED = (_INGESTS.c.id, _INGESTS.c.finished_at, _INGESTS.c.tenant_id, _INGESTS.c.callback_url)


def _finished_at(final_after: Any, now: Any, *, registering: bool = False) -> Any:
    """finished_at once the ingest's final pages are ``final_after`` (an expression over its old values); ``now``:
    a datetime, or the parameter that binds it."""
    i = _INGESTS.c
    done = final_after >= i.pages_total
    if not registering:
        done = done & i.registered_at.is_not(None)
    return case((done, func.coalesce(i.finished_at, now)), else_=None)


def _finished(s: Session, rows: Any, now: datetime) -> None:
    for ingest_id, finished_at, tenant_id, callback_url in rows:
        if callback_url and finished_at is not None and as_utc(finished_at) == now:
            webhooks.enqueue(s, ingest_id=ingest_id, tenant_id=tenant_id, url=callback_url,
                             event="ingest.finished", now=now)


@dataclass
class NewDocument:
    id: str
    seq: int
    source: str
    name: str
    ext: str
    pages_total: int
    content_sha256: str | None = None
    original_key: str | None = None
    error: str | None = None


@dataclass
class NewPage:
    id: str
    document_id: str
    page_no: int
    job_id: str


@dataclass
class Registered:
    """What a chunk's registration found: the jobs' state, and which documents and pages are new."""

    new_jobs: set[str] = field(default_factory=set)
    errors: dict[str, str] = field(default_factory=dict)  # failed jobs' reasons
    job_status: dict[str, JobStatus] = field(default_factory=dict)
    unpublished: set[str] = field(default_factory=set)  # queued jobs whose message never went out
    new_documents: set[str] = field(default_factory=set)
    new_pages: set[str] = field(default_factory=set)
    needs_review: set[str] = field(default_factory=set)  # succeeded jobs whose result needs a person's eyes


def register(db: Database, ingest_id: str, *, jobs: list[dict[str, Any]], documents: list[NewDocument],
             pages: list[NewPage], reserved: int = 0) -> Registered:
    """Insert a chunk's jobs, documents and pages (what exists is kept) and count what is already final. A page whose
    job's key was registered before gets that job's id (``page.job_id`` is replaced in place).

    ``reserved``: pages reserved for this chunk from the ingest's tenant's budget; what is not a new page still in
    flight once registered (final already, or registered before) is given back in the same transaction."""
    dialect = db.engine.dialect.name
    out = Registered()
    now = utcnow()
    with db.session() as s:
        if jobs:
            out.new_jobs = _insert_jobs(s, dialect, jobs, pages)
        if documents:
            rows = [dict(vars(d), ingest_id=ingest_id, created_at=now) for d in documents]
            stmt = _insert(dialect, _DOCUMENTS).on_conflict_do_nothing(index_elements=["id"])
            out.new_documents = set(s.scalars(stmt.returning(_DOCUMENTS.c.id), rows))
        if pages:
            rows = [dict(vars(p), ingest_id=ingest_id, created_at=now) for p in pages]
            stmt = _insert(dialect, _PAGES).on_conflict_do_nothing(index_elements=["id"])
            out.new_pages = set(s.scalars(stmt.returning(_PAGES.c.id), rows))
        job_ids = sorted({p.job_id for p in pages})
        query = (select(_JOBS.c.id, _JOBS.c.status, _JOBS.c.enqueued_at, _JOBS.c.error, _JOBS.c.needs_review)
                 .where(_JOBS.c.id.in_(job_ids)))
        if dialect == "postgresql":
            query = query.with_for_update(read=True)  # a job finishing now waits, then sees these pages
        for job_id, status, enqueued_at, error, needs_review in s.execute(query):
            state = out.job_status[job_id] = JobStatus(status)
            if state is JobStatus.SUCCEEDED and needs_review:
                out.needs_review.add(job_id)
            if state is JobStatus.FAILED:
                out.errors[job_id] = error or "unknown"
            if state is JobStatus.QUEUED and enqueued_at is None:
                out.unpublished.add(job_id)
        _count_new(s, ingest_id, documents, pages, out, now)
        if reserved:
            live = sum(1 for p in pages if p.id in out.new_pages and not out.job_status[p.job_id].terminal)
            tenant = select(_INGESTS.c.tenant_id).where(_INGESTS.c.id == ingest_id).scalar_subquery()
            s.execute(update(_TENANTS).where(_TENANTS.c.id == tenant)
                      .values(pages_in_flight=_TENANTS.c.pages_in_flight - (reserved - live)))
    return out


def _insert_jobs(s: Session, dialect: str, jobs: list[dict[str, Any]], pages: list[NewPage]) -> set[str]:
    """Insert the jobs whose key is new and return their ids; a page whose job's key was registered before (under
    another id) is pointed at that job. The keys are claimed in ``job_keys`` first: jobs are partitioned by id on
    PostgreSQL, where no unique key can span partitions, and a key claimed twice, even at once, is one job."""
    claims = [{"job_key": j["job_key"], "job_id": j["id"]} for j in jobs]
    # RETURNING makes it a few multi-row INSERTs (insertmanyvalues); without it psycopg2 sends one per key.
    stmt = _insert(dialect, _KEYS).on_conflict_do_nothing(index_elements=["job_key"])
    owner: dict[str, str] = {key: job_id for key, job_id in s.execute(stmt.returning(_KEYS.c.job_key, _KEYS.c.job_id),
                                                                         claims)}
    taken = {j["job_key"] for j in jobs} - owner.keys()  # claimed before (another id), not by this chunk
    if taken:
        owner.update((key, job_id) for key, job_id in s.execute(
            select(_KEYS.c.job_key, _KEYS.c.job_id).where(_KEYS.c.job_key.in_(taken))))
    moved = {j["id"]: owner[j["job_key"]] for j in jobs if owner[j["job_key"]] != j["id"]}
    fresh = [j for j in jobs if j["id"] not in moved]
    for page in pages:
        page.job_id = moved.get(page.job_id, page.job_id)
    if not fresh:
        return set()
    stmt = _insert(dialect, _JOBS).on_conflict_do_nothing(index_elements=["id"])
    return set(s.scalars(stmt.returning(_JOBS.c.id), fresh))


def _count_new(s: Session, ingest_id: str, documents: list[NewDocument], pages: list[NewPage], out: Registered,
               now: datetime) -> None:
    """Add the chunk's new documents and pages to the ingest's totals, and its already-final pages to the counts;
    a new document whose every page is final already is finished, its outputs due."""
    final: dict[str, Counter[JobStatus]] = {}
    reasons: Counter[str] = Counter()
    review: Counter[str] = Counter()  # document id -> its new pages already done and needing review
    for page in pages:
        status = out.job_status.get(page.job_id)
        if page.id in out.new_pages and status is not None and status.terminal:
            final.setdefault(page.document_id, Counter())[status] += 1
            if status is JobStatus.FAILED:
                reasons[out.errors[page.job_id]] += 1
            if page.job_id in out.needs_review:
                review[page.document_id] += 1
    for reason, n in reasons.items():
        _add_failures(s, ingest_id, reason, n)
    for doc_id, counts in final.items():
        s.execute(update(_DOCUMENTS).where(_DOCUMENTS.c.id == doc_id).values(
            pages_succeeded=_DOCUMENTS.c.pages_succeeded + counts[JobStatus.SUCCEEDED],
            pages_failed=_DOCUMENTS.c.pages_failed + counts[JobStatus.FAILED],
            pages_review=_DOCUMENTS.c.pages_review + review[doc_id]))
    succeeded = sum(c[JobStatus.SUCCEEDED] for c in final.values())
    failed = sum(c[JobStatus.FAILED] for c in final.values())
    values: dict[str, Any] = dict(
        documents_total=_INGESTS.c.documents_total + len(out.new_documents),
        pages_total=_INGESTS.c.pages_total + len(out.new_pages),
        pages_succeeded=_INGESTS.c.pages_succeeded + succeeded, pages_failed=_INGESTS.c.pages_failed + failed,
        pages_review=_INGESTS.c.pages_review + sum(review.values()))
    if succeeded + failed:
        values.update(first_done_at=func.coalesce(_INGESTS.c.first_done_at, now), last_done_at=now)
    values["finished_at"] = _finished_at(_INGESTS.c.pages_succeeded + _INGESTS.c.pages_failed + succeeded + failed, now)
    finished = s.execute(update(_INGESTS).where(_INGESTS.c.id == ingest_id).values(**values).returning(*_FINISHED))
    _finished(s, finished, now)
    if succeeded + failed:  # pages new to the ingest whose job was final already count now (a job reused)
        tenant_id = s.scalar(select(_INGESTS.c.tenant_id).where(_INGESTS.c.id == ingest_id))
        usage.add(s, tenant_id, now, pages_succeeded=succeeded, pages_failed=failed, pages_review=sum(review.values()))
    done = [d.id for d in documents if d.id in out.new_documents
            and sum(final.get(d.id, Counter()).values()) >= d.pages_total]
    if done:
        s.execute(update(_DOCUMENTS).where(_DOCUMENTS.c.id.in_(done)).values(finished_at=now, **outputs_due(True)))


def _insert(dialect: str, table: Table) -> Any:
    return (postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table))


def _add_failures(s: Session, ingest_id: str, reason: str, n: int) -> None:
    stmt = _insert(s.get_bind().dialect.name, _FAILURES).values(ingest_id=ingest_id, reason=reason, pages=n)
    s.execute(stmt.on_conflict_do_update(index_elements=["ingest_id", "reason"],
                                         set_={"pages": _FAILURES.c.pages + stmt.excluded.pages}))


def outputs_due(done: Any, claimed: Any = None) -> dict[str, Any]:
    """The document columns that make its outputs due (``done``, a boolean or SQL condition), or not due (not
    finished): pending and claimable at once, or (``claimed``, with a condition: an SQL time) held by the caller
    until then. A finished document whose pages change (a page redone) has them written again; a worker writing
    them meanwhile no longer holds the claim its write is checked against."""
    pending = OutputsState.PENDING.value
    if done is True:
        return {"outputs": pending, "outputs_attempts": 0, "outputs_claimed_until": None, "outputs_error": None}
    return {"outputs": case((done, pending), else_=None), "outputs_attempts": 0,
            "outputs_claimed_until": None if claimed is None else case((done, claimed), else_=None),
            "outputs_error": None}


def rollup(s: Session, job_id: str, *, succeeded: int, failed: int, now: datetime,
           reason: str | None = None, review: int = 0, work: usage.EngineWork | None = None,
           claim_until: datetime | None = None) -> list[str]:
    """Move every page of ``job_id`` in the counts of its documents and ingests, and in its tenant's usage, by
    (succeeded, failed, needing review), each -1, 0 or +1; ``reason``: the job's failure (the new one, or the one it
    leaves); ``work``: the engine work of its move into a final state. Returns the documents whose outputs this made
    due: those whose last page just became final, and finished ones whose pages changed; ``claim_until``: claimed
    until then, in this transaction, by the caller, who writes them (``storage.outputs.Claim``, 0 attempts)."""
    # Every page's finish runs this: its statements are built once for each move (``_Rollup``), and SQLAlchemy
    # keeps their compiled forms, so a page pays for executing them, not for building them again.
    st = _Rollup.of(succeeded, failed, review, claims=claim_until is not None)
    params = {"job": job_id, "now": now, "claimed": claim_until}
    finished = s.execute(st.documents, params).all()
    _finished(s, s.execute(st.ingests, params), now)
    if failed:
        for ingest_id, n in s.execute(st.per_ingest_rows, params):
            _add_failures(s, ingest_id, reason or "unknown", failed * n)
    if st.release is not None:
        s.execute(st.release, params)
    usage.count(s, st.tenant_pages, params, succeeded=succeeded, failed=failed, now=now, work=work)
    return [doc_id for doc_id, outputs in finished if outputs == OutputsState.PENDING.value]


@dataclass(frozen=True)
class _Rollup:
    """``rollup``'s statements for one move (succeeded, failed, review; ``claims``: the documents it finishes claimed
    until ``claimed``), bound to the job (``job``) and the time (``now``) when executed."""

    documents: Any
    ingests: Any
    per_ingest_rows: Any  # (ingest_id, its pages of the job)
    tenant_pages: Any  # (tenant_id, its pages of the job): ``usage.count``
    release: Any | None  # the job's pages leave (or rejoin) their tenants' pages in flight

    @staticmethod
    @functools.cache
    def of(succeeded: int, failed: int, review: int, *, claims: bool = False) -> _Rollup:
        job = bindparam("job", type_=_PAGES.c.job_id.type)
        d, i = _DOCUMENTS.c, _INGESTS.c
        per_doc = (select(_PAGES.c.document_id, func.count().label("n")).where(_PAGES.c.job_id == job)
                   .group_by(_PAGES.c.document_id).subquery())
        now = bindparam("now", type_=d.finished_at.type)
        # SQLite's RETURNING sees only the updated table: a document that finishes now is one whose
        # finished_at becomes exactly ``now`` (one finished before keeps its time).
        done_after = d.pages_succeeded + d.pages_failed + (succeeded + failed) * per_doc.c.n >= d.pages_total
        # (PostgreSQL types a CASE of NULLs as text: a statement that claims nothing leaves the claim out.)
        claimed = bindparam("claimed", type_=d.outputs_claimed_until.type) if claims else None
        documents = (update(_DOCUMENTS).where(d.id == per_doc.c.document_id)
                     .values(pages_succeeded=d.pages_succeeded + succeeded * per_doc.c.n,
                             pages_failed=d.pages_failed + failed * per_doc.c.n,
                             pages_review=d.pages_review + review * per_doc.c.n,
                             finished_at=case((done_after, func.coalesce(d.finished_at, now)), else_=None),
                             **outputs_due(done_after, claimed))
                     .returning(d.id, d.outputs))
        per_ingest = (select(_PAGES.c.ingest_id, func.count().label("n")).where(_PAGES.c.job_id == job)
                      .group_by(_PAGES.c.ingest_id).subquery())
        now = bindparam("now", type_=i.finished_at.type)
        values: dict[str, Any] = dict(pages_succeeded=i.pages_succeeded + succeeded * per_ingest.c.n,
                                      pages_failed=i.pages_failed + failed * per_ingest.c.n,
                                      pages_review=i.pages_review + review * per_ingest.c.n)
        if succeeded + failed > 0:
            values.update(first_done_at=func.coalesce(i.first_done_at, now), last_done_at=now)
        values["finished_at"] = _finished_at(i.pages_succeeded + i.pages_failed
                                             + (succeeded + failed) * per_ingest.c.n, now)
        ingests = update(_INGESTS).where(i.id == per_ingest.c.ingest_id).values(**values).returning(*_FINISHED)
        return _Rollup(documents, ingests, select(per_ingest.c.ingest_id, per_ingest.c.n),
                       usage.tenant_pages(per_ingest),
                       _release(job, succeeded + failed) if succeeded + failed else None)


def _release(job: Any, final: int) -> Any:
    """Pages of the job ``job`` leave (``final`` 1) or rejoin (-1) their tenants' pages in flight."""
    per_tenant = (select(_INGESTS.c.tenant_id, func.count().label("n"))
                  .select_from(_PAGES.join(_INGESTS, _INGESTS.c.id == _PAGES.c.ingest_id))
                  .where(_PAGES.c.job_id == job, _INGESTS.c.tenant_id.is_not(None))
                  .group_by(_INGESTS.c.tenant_id).subquery())
    t = _TENANTS.c
    return (update(_TENANTS).where(t.id == per_tenant.c.tenant_id)
            .values(pages_in_flight=t.pages_in_flight - final * per_tenant.c.n))


def next_seq(db: Database, ingest_id: str) -> int:
    with db.session() as s:
        last = s.scalar(select(func.max(_DOCUMENTS.c.seq)).where(_DOCUMENTS.c.ingest_id == ingest_id))
    return 0 if last is None else int(last) + 1


def unpublished_work(db: Database, ingest_id: str) -> list[tuple[str, str, int]]:
    """(job id, lane, message priority) of the ingest's queued jobs whose message never went out."""
    j = _JOBS.c
    with db.session() as s:
        rows = s.execute(select(j.id, j.lane, j.priority).distinct()
                         .select_from(_JOBS.join(_PAGES, _PAGES.c.job_id == j.id))
                         .where(unpublished_jobs(_JOBS), _PAGES.c.ingest_id == ingest_id,
                                derived_from(ingest_id))).all()
    return [(r[0], r[1], int(r[2])) for r in rows]


@dataclass(frozen=True)
class Owned:
    """Whose a job's pages are, for fair share: an ingest of it (the newest), its tenant, and their weights."""

    tenant_id: str | None
    ingest_id: str
    tenant_weight: float
    ingest_weight: float


def owners(db: Database, job_ids: Sequence[str]) -> dict[str, Owned]:
    """For each of ``job_ids`` with pages, the ingest its message goes behind (the newest that has it: a page
    wanted again by a new ingest waits with that one) and the weights; one query."""
    if not job_ids:
        return {}
    p, i = _PAGES.c, _INGESTS.c
    t = TenantRow.__table__.c
    newest = (select(p.job_id, func.max(i.created_at).label("at"))
              .select_from(_PAGES.join(_INGESTS, i.id == p.ingest_id))
              .where(p.job_id.in_(list(job_ids))).group_by(p.job_id).subquery())
    query = (select(p.job_id, i.id, i.tenant_id, func.coalesce(t.weight, 1.0), i.weight)
             .select_from(_PAGES.join(_INGESTS, i.id == p.ingest_id)
                          .join(newest, (newest.c.job_id == p.job_id) & (newest.c.at == i.created_at))
                          .outerjoin(TenantRow.__table__, t.id == i.tenant_id)))
    with db.session() as s:
        return {job_id: Owned(tenant_id, ingest_id, float(tw), float(iw or 1.0))
                for job_id, ingest_id, tenant_id, tw, iw in s.execute(query)}


def registered_sources(db: Database, ingest_id: str) -> set[str]:
    """Sources of the documents an interrupted ingest registered before it stopped."""
    with db.session() as s:
        return set(s.scalars(select(DocumentRow.source).where(DocumentRow.ingest_id == ingest_id)))


def derived_from(parent_id: str) -> Any:
    """SQL: pages whose id is derived from ``parent_id`` (its ingest or document), which names their one partition on
    PostgreSQL (``storage.history``); true for an id made before time-first ids."""
    bounds = timeids.span(parent_id)
    return true() if bounds is None else _PAGES.c.id.between(*bounds)
