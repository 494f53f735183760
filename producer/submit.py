"""Submission: pages -> originals in object storage, job rows in the database, messages to publish.

A page's job is keyed by its content hash and what is asked of it, so submitting the same file
twice finds the same job: a queued, running or succeeded job is left alone, a failed one is
queued again (or any one, with ``force``), and one whose message never reached the broker (the
broker was down) is published now.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from paperlane.errors import public_reason
from paperlane.priority.lanes import Lane, message_priority
from paperlane.producer.inputs import PageInput
from paperlane.schemas import JobStatus, Stage, TaskSpec
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.storage.objects import ObjectStore, original_key
from paperlane.storage.tables import JobRow

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger(__name__)

_JOB_NAMESPACE = uuid.UUID("6a0b3c8e-3f0e-4f43-9d55-70617065726c")


class Publisher(Protocol):
    def publish(self, jobs: list[JobRow]) -> None:
        """Hand the jobs to the workers. Raises StorageUnavailable when the broker is down."""
        ...


@dataclass
class Submitted:
    page: PageInput
    job: JobRow
    action: str  # "queued" | "requeued" | "exists" | "failed"


def job_key(content_sha256: str, spec: TaskSpec) -> str:
    return hashlib.sha256(f"{content_sha256}:{spec.cache_key()}".encode()).hexdigest()


def job_id_for(key: str) -> str:
    return str(uuid.uuid5(_JOB_NAMESPACE, key))


def submit_pages(pages: Iterable[PageInput], *, db: Database, store: ObjectStore, spec: TaskSpec,
                 lane: Lane = Lane.BATCH, level: int = 0, force: bool = False,
                 publisher: Publisher | None = None, publish_every: int = 100) -> Iterator[Submitted]:
    """Store and register each page; publish new work in chunks when a publisher is given."""
    pending: list[JobRow] = []
    for page, read_s in _timed(pages):
        sub = _register(page, db=db, store=store, spec=spec, lane=lane, level=level, force=force,
                        upload_s=read_s)
        if sub.action in ("queued", "requeued"):
            pending.append(sub.job)
        if publisher is not None and len(pending) >= publish_every:
            _publish(db, publisher, pending)
        yield sub
    if publisher is not None and pending:
        _publish(db, publisher, pending)


def _timed(pages: Iterable[PageInput]) -> Iterator[tuple[PageInput, float]]:
    """Each page with the seconds spent reading it (rendering, for PDF pages)."""
    it = iter(pages)
    while True:
        t0 = time.perf_counter()
        try:
            page = next(it)
        except StopIteration:
            return
        yield page, time.perf_counter() - t0


def _publish(db: Database, publisher: Publisher, pending: list[JobRow]) -> None:
    publisher.publish(pending)
    jobstore.mark_enqueued(db, [j.id for j in pending])
    pending.clear()


def _register(page: PageInput, *, db: Database, store: ObjectStore, spec: TaskSpec, lane: Lane, level: int,
              force: bool, upload_s: float) -> Submitted:
    t0 = time.perf_counter()
    sha = hashlib.sha256(page.data).hexdigest()
    key = job_key(sha, spec)
    new = jobstore.NewJob(id=job_id_for(key), job_key=key, content_sha256=sha, source=page.source,
                          page=page.page, lane=lane.value, priority=message_priority(lane, level),
                          task=spec.task.value, task_options=spec.model_dump(mode="json", exclude={"task"}))
    if page.error is not None:
        row, _ = jobstore.create_job(db, new, status=JobStatus.FAILED, error=public_reason(page.error),
                                     error_stage=page.error.stage)
        return Submitted(page, row, "failed" if row.status == JobStatus.FAILED.value else "exists")
    new.original_key = original_key(sha, page.ext)
    if not store.exists(new.original_key):
        store.put(new.original_key, page.data)
    new.upload_s = upload_s + time.perf_counter() - t0
    row, created = jobstore.create_job(db, new)
    if created:
        return Submitted(page, row, "queued")
    if force or row.status == JobStatus.FAILED.value:
        jobstore.requeue(db, row.id, upload_s=new.upload_s)
        return Submitted(page, jobstore.get_job(db, row.id), "requeued")
    if row.status == JobStatus.QUEUED.value and row.enqueued_at is None:
        return Submitted(page, row, "queued")  # registered by a submit whose publish failed: publish now
    return Submitted(page, row, "exists")


class CeleryPublisher:
    """Publishes jobs to the lane's queue with the lane's message priority."""

    def __init__(self, app: Celery) -> None:
        self._app = app

    def publish(self, jobs: list[JobRow]) -> None:
        from kombu.exceptions import OperationalError

        from paperlane.errors import StorageUnavailable
        from paperlane.priority.broker import send_page

        try:
            with self._app.producer_or_acquire() as producer:
                for job in jobs:
                    send_page(self._app, job.id, Lane(job.lane), job.priority, producer=producer)
        except OperationalError as exc:
            raise StorageUnavailable(f"broker unreachable: {exc}", stage=Stage.UPLOAD.value) from exc
