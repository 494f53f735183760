"""The Celery side of a worker: a thin task that validates its payload and calls the pipeline.

The worker runs Celery's thread pool with one thread per page slot (prefetch 1 per slot, late
acks): every message it holds is a page in progress, none sits reserved behind others, so Redis
priority decides what starts next. A message is acked only when its page is settled: stored,
failed, or handed back for a retry.
"""

from __future__ import annotations

import logging

from celery import Celery, Task

from paperlane.errors import JobNotFound, StorageUnavailable
from paperlane.priority.lanes import TASK_PROCESS_PAGE, Lane
from paperlane.priority.policy import LanePolicy
from paperlane.storage import jobs as jobstore
from paperlane.workers.attempts import settle
from paperlane.workers.governor import install_governor
from paperlane.workers.pipeline import Runtime, process_page

log = logging.getLogger(__name__)


def register_tasks(app: Celery, runtime: Runtime) -> None:
    """Register paperlane's task on ``app``, served by the resident ``runtime``, and its lane governor."""
    policy = LanePolicy(batch_share=runtime.settings.worker.batch_share, batch_limit=runtime.batch_slots)
    install_governor(app, policy, runtime.settings.redis.url)

    @app.task(name=TASK_PROCESS_PAGE, bind=True, acks_late=True, max_retries=None)
    def process_page_task(self: Task, job_id: str) -> str:
        return handle_page(runtime, policy, self, str(job_id))


def handle_page(rt: Runtime, policy: LanePolicy, task: Task, job_id: str) -> str:
    try:
        return _handle_page(rt, policy, task, job_id)
    except StorageUnavailable as exc:
        # The database itself is unreachable: nothing about the page can be recorded, so the whole
        # message is tried again later (processing a page twice is harmless).
        delay = min(60.0, rt.settings.worker.retry_backoff * 2 ** min(task.request.retries, 5))
        log.warning("job %s: %s; message retried in %.0fs", job_id, exc, delay)
        raise task.retry(countdown=delay, queue=task.request.delivery_info.get("routing_key"),
                         priority=(task.request.delivery_info or {}).get("priority")) from exc


def _handle_page(rt: Runtime, policy: LanePolicy, task: Task, job_id: str) -> str:
    try:
        job = jobstore.start_attempt(rt.db, job_id, max_attempts=rt.settings.worker.max_attempts)
    except JobNotFound:
        log.error("message for unknown job %s dropped", job_id)
        return "unknown"
    if job is None:
        log.info("job %s already finished; redelivered message ignored", job_id)
        return "duplicate"
    lane = Lane(job.lane)
    policy.started(lane)
    try:
        decision = settle(rt.db, process_page(rt, job), rt.settings.worker)
    finally:
        policy.finished(lane)
    if decision.action == "retry":
        raise task.retry(countdown=decision.delay, queue=Lane(job.lane).queue, priority=job.priority)
    return decision.action
