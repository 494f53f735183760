"""Leases on running jobs: no page stays ``running`` because its worker died or hung.

A worker takes a job with a lease (``jobs.start_attempt``) and pushes the leases of the jobs it holds ahead every few
seconds (``renew``, one UPDATE for all of them). Any worker takes back the jobs whose lease ran out
(``take_back``, one UPDATE ... RETURNING, so two workers never take back the same job): back to
``queued`` with the attempt counted, for the caller to put on its lane again, or failed with the reason
once the attempts are used up. A worker that hangs stops renewing, exactly as a dead one does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, tuple_, update

from paperlane.retry import LOST_WORKER_STAGE, RetryPolicy
from paperlane.status import JobStatus
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.storage.tables import JobRow
from paperlane.storage.tables import unpublished as unpublished_jobs

_JOBS = JobRow.__table__


@dataclass(frozen=True)
class TakenBack:
    job_id: str
    lane: str
    message_priority: int
    worker: str | None
    failed: bool  # its attempts were used up: failed with the reason, not queued again


def renew(db: Database, job_ids: list[str], *, worker: str, until: datetime) -> int:
    """Push the leases of this worker's running jobs to ``until``; how many it still holds."""
    if not job_ids:
        return 0
    j = _JOBS.c
    with db.session() as s:
        done = s.execute(update(_JOBS).where(j.id.in_(job_ids), j.status == JobStatus.RUNNING,
                                             j.worker == worker).values(lease_until=until))
        return int(done.rowcount or 0)


def take_back(db: Database, *, now: datetime, policy: RetryPolicy, limit: int = 500) -> list[TakenBack]:
    """Jobs whose lease ran out: queued again (their attempt counted), or failed with the policy's reason when
    their attempts are used up."""
    j = _JOBS.c
    expired = and_(j.status == JobStatus.RUNNING, j.lease_until < now)
    with db.session() as s:
        rows = s.execute(update(_JOBS).where(j.id.in_(
            _JOBS.select().with_only_columns(j.id).where(expired).limit(limit).scalar_subquery()), expired)
            # Unpublished until the caller has put it on its lane (``unpublished`` finds it if that never happens).
            .values(status=JobStatus.QUEUED, lease_until=None, enqueued_at=None)
            .returning(j.id, j.lane, j.priority, j.worker, j.attempts)).all()
    out = []
    for job_id, lane, message_priority, worker, attempts in rows:
        failed = policy.exhausted(attempts)
        if failed:
            jobstore.finish_failed(db, job_id, policy.lost_worker_reason(attempts, worker), LOST_WORKER_STAGE)
        out.append(TakenBack(job_id, lane, int(message_priority), worker, failed))
    return out


def unpublished(db: Database, *, before: datetime, limit: int = 500) -> list[tuple[str, str, int]]:
    """(job id, lane, message priority) of queued jobs whose message has not gone out since ``before``: a producer or
    a worker died between registering or taking back a job and publishing it. From the partial index on
    unpublished jobs, so it costs nothing when there are none."""
    return _queued(db, unpublished_jobs(_JOBS), _JOBS.c.updated_at < before, limit=limit)


@dataclass(frozen=True)
class Queued:
    job_id: str
    lane: str
    message_priority: int
    enqueued_at: datetime


def queued_before(db: Database, *, before: datetime, after: tuple[datetime, str] | None = None,
                  limit: int = 1000) -> list[Queued]:
    """Queued jobs whose message went out before ``before``, in order of (when it went out, id), from just past
    ``after`` (the last one of the previous call: a cursor through them all), at most ``limit``."""
    j = _JOBS.c
    where = [j.enqueued_at < before]
    if after is not None:
        where.append(tuple_(j.enqueued_at, j.id) > tuple_(*after))
    query = _queued_query(*where).add_columns(j.enqueued_at).order_by(j.enqueued_at, j.id).limit(limit)
    with db.session() as s:
        return [Queued(r[0], r[1], int(r[2]), r[3]) for r in s.execute(query).all()]


def _queued_query(*where: Any) -> Any:
    j = _JOBS.c
    return _JOBS.select().with_only_columns(j.id, j.lane, j.priority).where(j.status == JobStatus.QUEUED.value, *where)


def _queued(db: Database, *where: Any, limit: int) -> list[tuple[str, str, int]]:
    with db.session() as s:
        rows = s.execute(_queued_query(*where).limit(limit)).all()
    return [(r[0], r[1], int(r[2])) for r in rows]
