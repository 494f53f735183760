"""The Celery side of a worker: a thin task that validates its payload and calls the pipeline.

The worker runs Celery's thread pool with one thread per page slot (prefetch 1 per slot, late
acks): every message it holds is a page in progress, none sits reserved behind others, so Redis
priority decides what starts next, and the one ``LaneScheduler`` (``paperlane.workers.lane_gate``)
decides which lanes this worker takes pages from. A message is acked only when its page is settled:
stored, failed, or delayed for a retry — a retry is a page in Redis's delayed set
(``paperlane.priority.delayed``), never a countdown message held by a worker.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass

from celery import Celery, Task
from celery.exceptions import Reject

from paperlane.errors import JobNotFound, StorageUnavailable, public_reason
from paperlane.priority.broker import send_page
from paperlane.priority.deadletter import DeadLetters
from paperlane.priority.delayed import DelayedPage, DelayedPages
from paperlane.priority.lanes import TASK_PROCESS_PAGE, Lane
from paperlane.priority.policy import LanePolicy
from paperlane.priority.scheduler import LaneScheduler
from paperlane.storage import ingests
from paperlane.storage import jobs as jobstore
from paperlane.workers.answers import EngineAnswers
from paperlane.workers.attempts import Action, settle
from paperlane.workers.documents import write_outputs
from paperlane.workers.lane_gate import ConsumerLanes, install_lane_gate
from paperlane.workers.leases import LeaseKeeper
from paperlane.workers.pipeline import Runtime, process_page
from paperlane.workers.retry_clock import RetryClock
from paperlane.workers.shutdown import install_graceful_stop

log = logging.getLogger(__name__)


@dataclass
class WorkerParts:
    """What the Celery task needs besides the runtime: the scheduler, the delayed set, the retry clock,
    the dead-letter list."""

    scheduler: LaneScheduler
    delayed: DelayedPages
    clock: RetryClock
    dead_letters: DeadLetters
    leases: LeaseKeeper

    def close(self) -> None:
        self.leases.stop()
        self.clock.stop()
        self.delayed.close()
        self.dead_letters.close()


def register_tasks(app: Celery, runtime: Runtime, *, lanes: list[Lane] | None = None) -> WorkerParts:
    """Register paperlane's task on ``app``, served by the resident ``runtime``, with its scheduler."""
    served = lanes or list(Lane)
    # The batch limit keeps slots free for interactive pages; a worker that serves no interactive lane needs none.
    limit = runtime.batch_slots if Lane.INTERACTIVE in served else None
    policy = LanePolicy(batch_share=runtime.settings.worker.batch_share, batch_limit=limit)
    source = ConsumerLanes(runtime.settings.redis.url)
    scheduler = LaneScheduler(policy, source, lanes=served)
    install_lane_gate(app, scheduler, source)
    delayed = DelayedPages.from_url(runtime.settings.redis.url)

    def publish(pages: list[DelayedPage]) -> None:
        with app.producer_or_acquire() as producer:
            for page in pages:
                send_page(app, page.job_id, page.lane, page.priority, producer=producer)

    clock = RetryClock(runtime.settings.redis.url, publish)
    runtime.answers = EngineAnswers(runtime.settings.redis.url)
    keeper = LeaseKeeper(runtime.db, delayed, runtime.settings.worker, worker=f"{socket.gethostname()}:{os.getpid()}",
                         redis_url=runtime.settings.redis.url)
    parts = WorkerParts(scheduler, delayed, clock, DeadLetters.from_url(runtime.settings.redis.url), keeper)

    @app.task(name=TASK_PROCESS_PAGE, bind=True, acks_late=True)
    def process_page_task(self: Task, job_id: str) -> str:
        lane = _lane_of(self)
        try:
            return handle_page(runtime, parts, str(job_id), lane, self.request.delivery_info or {})
        finally:
            scheduler.finished(lane)

    install_graceful_stop(runtime.batcher, grace=runtime.settings.worker.shutdown_grace)
    clock.start()
    keeper.start()
    return parts


def _lane_of(task: Task) -> Lane:
    queue = (task.request.delivery_info or {}).get("routing_key")
    return Lane.of_queue(queue) or Lane.BATCH


def handle_page(rt: Runtime, parts: WorkerParts, job_id: str, lane: Lane, delivery: dict) -> str:
    """One message: attempt its page and settle it (done, failed, or delayed for a retry)."""
    try:
        return _attempt(rt, parts, job_id, lane)
    except StorageUnavailable as exc:
        # The database is unreachable: nothing about the page can be recorded, so the whole message
        # goes back to its lane later (processing a page twice is harmless).
        delay = rt.settings.worker.retry_backoff * 4
        priority = delivery.get("priority")
        _delay(parts, DelayedPage(job_id, lane, lane.base_priority if priority is None else int(priority)), delay)
        log.warning("job %s: %s; back on its lane in %.0fs", job_id, exc, delay)
        return "delayed"


def _attempt(rt: Runtime, parts: WorkerParts, job_id: str, lane: Lane) -> str:
    try:
        job = jobstore.start_attempt(rt.db, job_id, max_attempts=rt.settings.worker.max_attempts,
                                     worker=parts.leases.worker, lease=rt.settings.worker.lease)
    except JobNotFound as exc:
        message = json.dumps({"task": TASK_PROCESS_PAGE, "args": [job_id]})
        parts.dead_letters.add(message, reason=str(exc), queue=lane.queue)
        return "unknown"
    if job is None:
        # Nothing to start: the job is final (a redelivery, or a document registered with every page already
        # final), or another worker runs it under a live lease. Finished documents get the outputs they lack.
        missing = ingests.documents_without_outputs(rt.db, job_id)
        for document_id in missing:
            _document_outputs(rt, document_id)
        log.info("job %s not started (final, or held under a live lease); %d document outputs written", job_id,
                 len(missing))
        return "duplicate"
    parts.leases.hold(job.id)
    try:
        decision = settle(rt.db, process_page(rt, job), rt.settings.worker)
    finally:
        parts.leases.release(job.id)
    if decision.action in (Action.RETRY, Action.HANDED_BACK):  # handed back: its worker is stopping, due now
        _delay(parts, DelayedPage(job.id, Lane(job.lane), job.priority), decision.delay)
    for document_id in decision.finished_documents:
        _document_outputs(rt, document_id)
    return decision.action.value


def _document_outputs(rt: Runtime, document_id: str) -> None:
    """The document's last page is final: its outputs are written now (a failure is logged; the page stays done)."""
    try:
        write_outputs(rt.db, rt.store, document_id, max_pixels=rt.settings.worker.max_image_pixels)
    except Exception as exc:
        log.error("document %s: outputs not written (%s)", document_id, public_reason(exc), exc_info=exc)


def _delay(parts: WorkerParts, page: DelayedPage, delay: float) -> None:
    try:
        parts.delayed.add(page, delay)
    except StorageUnavailable as exc:  # Redis is down too: hand the message back as it is
        raise Reject(str(exc), requeue=True) from exc
