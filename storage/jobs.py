"""Reads and writes of job rows and the results index.

Every write is idempotent: a job is found by its key before it is created, a result row is
replaced, not added, and finishing a job that already finished changes nothing it should not.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, bindparam, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from paperlane.errors import JobNotFound
from paperlane.retry import LOST_WORKER_STAGE, RetryPolicy
from paperlane.schemas import PageResult, Stage
from paperlane.status import JobStatus
from paperlane.storage import ingests
from paperlane.storage.db import Database, as_utc, get_row, utcnow
from paperlane.storage.line_stats import LineStats
from paperlane.storage.tables import JobRow, ResultRow
from paperlane.storage.usage import EngineWork

STAGE_COLUMNS: dict[Stage, str] = {stage: f"{stage.value}_s" for stage in Stage}


def requeue(db: Database, job_id: str, *, upload_s: float | None = None) -> None:
    """Put a finished job back in the queue (resubmission of a failed page, or --force); its pages
    leave the counts they were in."""
    with db.session() as s:
        was, error, review = s.execute(select(JobRow.status, JobRow.error, JobRow.needs_review)
                                       .where(JobRow.id == job_id).with_for_update()).one()
        if was in (JobStatus.SUCCEEDED, JobStatus.FAILED):
            ingests.rollup(s, job_id, succeeded=-(was == JobStatus.SUCCEEDED),
                           failed=-(was == JobStatus.FAILED), now=utcnow(), reason=error,
                           review=-int(was == JobStatus.SUCCEEDED and bool(review)))
        s.execute(update(JobRow).where(JobRow.id == job_id).values(
            status=JobStatus.QUEUED, error=None, error_stage=None, attempts=0, needs_review=False,
            review_flags=None, confidence=None,
            started_at=None, finished_at=None, created_at=utcnow(), enqueued_at=None, upload_s=upload_s,
            queue_wait_s=None, preprocess_s=None, inference_s=None, postprocess_s=None, store_s=None))


def mark_enqueued(db: Database, job_ids: Sequence[str]) -> None:
    with db.session() as s:
        s.execute(update(JobRow).where(JobRow.id.in_(job_ids)).values(enqueued_at=utcnow()))


def get_job(db: Database, job_id: str) -> JobRow:
    """The job's row. Raises JobNotFound."""
    with db.session() as s:
        return get_row(s, JobRow, job_id, JobNotFound)


def get_jobs(db: Database, job_ids: Iterable[str]) -> list[JobRow]:
    ids = list(job_ids)
    with db.session() as s:
        rows = {r.id: r for r in s.scalars(select(JobRow).where(JobRow.id.in_(ids)))}
    return [rows[i] for i in ids if i in rows]


def start_attempt(db: Database, job_id: str, *, policy: RetryPolicy | None, worker: str | None = None,
                  lease: float | None = None) -> JobRow | None:
    """Mark the job running and count the attempt; None when there is nothing to do.

    Nothing to do: the job already finished (a redelivered message), or its earlier attempts all
    died with their worker (it was still ``running``) and it has used up the ``policy``'s attempts — then
    it is failed here with the policy's reason, so a page that kills workers cannot loop forever (``None``:
    no such limit, for a runner whose crash stops everything anyway). Raises JobNotFound.

    The usual case is one statement (``UPDATE ... RETURNING``); the row is read first only when
    that finds nothing to start, to say why.
    """
    now = utcnow()
    stmt = _start_statement(db.engine.dialect.name, limited=policy is not None)
    params = {"job_id": job_id, "now": now, "worker": worker,
              "lease_until": now + timedelta(seconds=lease) if lease else None}
    if policy is not None:
        params["max_attempts"] = policy.max_attempts
    with db.session() as s:
        row = s.scalars(stmt, params, execution_options={"synchronize_session": False}).one_or_none()
        if row is not None:
            return row
        _not_started(s, job_id, policy, now)
        return None


@functools.cache
def _start_statement(dialect: str, *, limited: bool) -> Any:
    """Starting a page (``start_attempt``), built once per dialect with bound parameters (job_id, now, worker,
    lease_until, and max_attempts when ``limited``), as the finishing writes are: building it anew for every page
    was a third of its cost in the process feeding the engine."""
    now = bindparam("now", type_=JobRow.__table__.c.created_at.type)
    # Running is startable again only when no live lease holds it: a message delivered twice (Redis hands an
    # un-acked message out again after its visibility timeout) must not start a page its worker still runs.
    running = (JobRow.status == JobStatus.RUNNING) & (JobRow.lease_until.is_(None) | (JobRow.lease_until < now))
    if limited:
        running = running & (JobRow.attempts < bindparam("max_attempts"))
    return (update(JobRow).where(JobRow.id == bindparam("job_id"), (JobRow.status == JobStatus.QUEUED) | running)
            .values(status=JobStatus.RUNNING, attempts=JobRow.attempts + 1, started_at=now,
                    queue_wait_s=func.coalesce(JobRow.queue_wait_s, _seconds_since(JobRow.created_at, now, dialect)),
                    worker=bindparam("worker"),
                    lease_until=bindparam("lease_until", type_=JobRow.__table__.c.lease_until.type))
            .returning(JobRow))


def _seconds_since(column: Any, at: Any, dialect: str) -> ColumnElement[Any]:
    """SQL for the seconds from ``column`` to ``at`` (clamped at 0), in the database's own dialect."""
    if dialect == "postgresql":
        return func.greatest(func.extract("epoch", at - column), 0.0)
    # SQLite keeps timestamps as ISO text.
    return func.max((func.julianday(at) - func.julianday(column)) * 86400.0, 0.0)


def _not_started(s: Any, job_id: str, policy: RetryPolicy | None, now: Any) -> None:
    """Nothing was started: raise JobNotFound, or fail a page whose attempts all died with their worker."""
    row = s.get(JobRow, job_id, with_for_update=True)
    if row is None:
        raise JobNotFound(job_id)
    lease_live = row.lease_until is not None and as_utc(row.lease_until) >= now
    if (policy is not None and row.status == JobStatus.RUNNING and policy.exhausted(row.attempts)
            and not lease_live):
        row.status = JobStatus.FAILED
        row.error = policy.lost_worker_reason(row.attempts, row.worker)
        row.error_stage = LOST_WORKER_STAGE
        row.finished_at = now
        s.flush()
        ingests.rollup(s, row.id, succeeded=0, failed=1, now=now, reason=row.error)


def record_retry(db: Database, job_id: str, reason: str, stage: str | None) -> None:
    """The attempt failed but will be tried again: back to queued, the reason kept for operators."""
    with db.session() as s:
        s.execute(update(JobRow).where(JobRow.id == job_id).values(
            status=JobStatus.QUEUED, error=f"retrying: {reason}", error_stage=stage))


def hand_back(db: Database, job_id: str) -> None:
    """The attempt was cut short by its worker stopping: queued again, the attempt not counted."""
    with db.session() as s:
        s.execute(update(JobRow).where(JobRow.id == job_id, JobRow.status == JobStatus.RUNNING).values(
            status=JobStatus.QUEUED, attempts=JobRow.attempts - 1))


# The writes every page ends with, built once with bound parameters: SQLAlchemy compiles each
# once, so a page's finish costs its round trips and little else (building the statements anew for
# every page cost more CPU than the rest of the write). A stage time not given keeps the row's value.
# ``from`` names the states the job may be in: the usual finish moves it from queued or running and
# moves its pages in the counts; a job final already (a redelivered message, a late duplicate) is
# rewritten without counting its pages twice.
_JOBS, _RESULTS = JobRow.__table__, ResultRow.__table__
_TIMES: dict[str, ColumnElement[Any]] = {column: func.coalesce(bindparam(column), _JOBS.c[column])
                                         for column in STAGE_COLUMNS.values()}
_IN_STATES = _JOBS.c.status.in_(bindparam("from", expanding=True))
_FAILED = update(_JOBS).where(_JOBS.c.id == bindparam("job"), _IN_STATES).values(
    status=JobStatus.FAILED, error=bindparam("reason"), error_stage=bindparam("stage"),
    finished_at=bindparam("finished"), **_TIMES)
_SUCCEEDED = update(_JOBS).where(_JOBS.c.id == bindparam("job"), _IN_STATES).values(
    status=JobStatus.SUCCEEDED, error=None, error_stage=None, engine=bindparam("engine"),
    result_key=bindparam("result"), annotated_key=bindparam("annotated"), finished_at=bindparam("finished"),
    needs_review=bindparam("review"), review_flags=bindparam("flags"), confidence=bindparam("confidence"), **_TIMES)
_LIVE = [JobStatus.QUEUED, JobStatus.RUNNING]
_ERROR_IF_FAILED = select(func.coalesce(_JOBS.c.error, "unknown")).where(
    _JOBS.c.id == bindparam("job"), _JOBS.c.status == JobStatus.FAILED).with_for_update()
_REVIEW_IF_SUCCEEDED = select(_JOBS.c.needs_review).where(
    _JOBS.c.id == bindparam("job"), _JOBS.c.status == JobStatus.SUCCEEDED).with_for_update()


def _upsert(stmt: postgresql.Insert | sqlite.Insert) -> postgresql.Insert | sqlite.Insert:
    """Insert a results-index row, or replace the job's row when it was done before."""
    return stmt.on_conflict_do_update(index_elements=[_RESULTS.c.job_id],
                                      set_={c.name: stmt.excluded[c.name] for c in _RESULTS.c if c.name != "job_id"})


_UPSERT_RESULT = {"postgresql": _upsert(postgresql.insert(_RESULTS)), "sqlite": _upsert(sqlite.insert(_RESULTS))}


def finish_failed(db: Database, job_id: str, reason: str, stage: str | None,
                  timings: dict[str, float] | None = None, *, work: EngineWork | None = None) -> list[str]:
    """Fail the job (a succeeded job stays succeeded); ``work``: what the engine spent on it, when it got that far
    (metered with the failure). Returns the documents whose last page this was."""
    now = utcnow()
    params = {"job": job_id, "reason": reason, "stage": stage, "finished": now, **_timing_values(timings or {})}
    with db.session() as s:
        if s.execute(_FAILED, {**params, "from": _LIVE}).rowcount:
            return ingests.rollup(s, job_id, succeeded=0, failed=1, now=now, reason=reason, work=work)
        before = s.scalar(_ERROR_IF_FAILED, {"job": job_id})
        if before is None or before == reason:
            return []
        # Failed again for another reason: its pages move from the old reason to the new one.
        s.execute(_FAILED, {**params, "from": [JobStatus.FAILED]})
        ingests.rollup(s, job_id, succeeded=0, failed=-1, now=now, reason=before)
        return ingests.rollup(s, job_id, succeeded=0, failed=1, now=now, reason=reason)


def finish_succeeded(db: Database, job: JobRow, result: PageResult, *, engine: str,
                     result_key: str, annotated_key: str | None, timings: dict[str, float],
                     lines: LineStats | None = None, claim_until: datetime | None = None) -> list[str]:
    """Write the job's success, its results-index row and its tenant's usage in one transaction (the index row is
    inserted or, for a job done again, replaced in one statement; a job done again is not metered again). Returns
    the documents whose last page this was (their outputs due; ``claim_until``: claimed by the caller until then,
    in the same transaction: ``ingests.rollup``). ``lines``: the result's line figures, when ``result`` came without
    its lines (taken from ``result.lines`` otherwise)."""
    lines = lines or LineStats.of(result)
    now = utcnow()
    row = dict(
        job_id=job.id, content_sha256=job.content_sha256, task=result.task.value, engine=engine,
        line_count=lines.count, mean_confidence=lines.mean_confidence, text=result.text, result_key=result_key,
        annotated_key=annotated_key, created_at=now)
    quality = result.quality
    review = bool(quality and quality.needs_review)
    params = {"job": job.id, "engine": engine, "result": result_key, "annotated": annotated_key,
              "finished": now, "review": review, "flags": ",".join(f.value for f in quality.flags) if quality else None,
              "confidence": quality.confidence if quality else None, **_timing_values(timings)}
    finished: list[str] = []
    work = EngineWork.of(result, timings)
    with db.session() as s:
        if s.execute(_SUCCEEDED, {**params, "from": _LIVE}).rowcount:
            finished = ingests.rollup(s, job.id, succeeded=1, failed=0, now=now, review=int(review), work=work,
                                      claim_until=claim_until)
        elif (error := s.scalar(_ERROR_IF_FAILED, {"job": job.id})) is not None:
            s.execute(_SUCCEEDED, {**params, "from": [JobStatus.FAILED]})
            finished = ingests.rollup(s, job.id, succeeded=1, failed=-1, now=now, reason=error, review=int(review),
                                      work=work, claim_until=claim_until)
        else:  # done before: this result replaces that one (and its grade, in the counts too; not metered again)
            before = bool(s.scalar(_REVIEW_IF_SUCCEEDED, {"job": job.id}))
            s.execute(_SUCCEEDED, {**params, "from": [JobStatus.SUCCEEDED]})
            if before != review:
                ingests.rollup(s, job.id, succeeded=0, failed=0, now=now, review=int(review) - int(before))
        s.execute(_UPSERT_RESULT[db.engine.dialect.name], row)
    return finished


def _timing_values(timings: dict[str, float]) -> dict[str, float | None]:
    """Every stage column: the given seconds, None for a stage not given (the row keeps its value)."""
    return {column: timings.get(stage.value) for stage, column in STAGE_COLUMNS.items()}


def recent_timings(db: Database, *, last: int) -> list[dict[str, float]]:
    """The stage timings of the ``last`` jobs to finish, newest first."""
    with db.session() as s:
        rows = s.scalars(select(JobRow).where(JobRow.finished_at.is_not(None))
                         .order_by(JobRow.finished_at.desc()).limit(last)).all()
    return [job_timings(r) for r in rows]


def job_timings(row: JobRow) -> dict[str, float]:
    """The stage timings recorded on a row, in pipeline order, stages not reached left out."""
    out = {}
    for stage, column in STAGE_COLUMNS.items():
        value = getattr(row, column)
        if value is not None:
            out[stage.value] = value
    return out
