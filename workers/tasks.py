"""The Celery side of a worker: a thin task that validates its payload and calls the pipeline."""

from __future__ import annotations

import logging

from celery import Celery, Task

from paperlane.errors import JobNotFound
from priority.lanes import TASK_PROCESS_PAGE
from storage import jobs as jobstore
from workers.attempts import settle
from workers.pipeline import Runtime, run_batch

log = logging.getLogger(__name__)


def register_tasks(app: Celery, runtime: Runtime) -> None:
    """Register paperlane's tasks on ``app``, all served by the resident ``runtime``."""

    @app.task(name=TASK_PROCESS_PAGE, bind=True, acks_late=True, max_retries=None)
    def process_page(self: Task, job_id: str) -> str:
        return handle_page(runtime, self, str(job_id))


def handle_page(rt: Runtime, task: Task, job_id: str) -> str:
    try:
        job = jobstore.start_attempt(rt.db, job_id)
    except JobNotFound:
        log.error("message for unknown job %s dropped", job_id)
        return "unknown"
    if job is None:
        log.info("job %s already succeeded; redelivered message ignored", job_id)
        return "duplicate"
    outcome = run_batch(rt, [job])[0]
    decision = settle(rt.db, outcome, rt.settings.worker)
    if decision.action == "retry":
        raise task.retry(countdown=decision.delay, queue=task.request.delivery_info.get("routing_key"),
                         priority=job.priority)
    return decision.action
