"""A paperlane worker, assembled: a Celery worker whose one task is a page, and whose long-lived parts are opened
in one order, by one Celery bootstep, and closed in the reverse order once the last page has returned.

    part        what it is                                                  opened
    redis       the process's one Redis client (``priority.connection``)     first
    runtime     database, object store, the engine (loaded), CPU pool,
                micro-batcher, the engine answers kept in Redis
    delayed     the delayed set of retries (``priority.delayed``)
    letters     the dead-letter list
    clock       the retry clock: delayed pages back on their lanes (thread)
    leases      the lease keeper: renew, take back, publish what is missing (thread)
    outputs     the outputs sweep: document outputs nobody is writing (thread)
    gate        the lane gate: which lanes the consumer takes pages from
    stopping    the graceful stop on SIGTERM (thread)
    metrics     the /metrics server, and the per-tenant series' labels       last

The flow of one page: Redis hands its message to the consumer (its lane's fair share picked it: ``priority.fair``;
the message says whose page it is); the lane gate counts it as started; the task (``process_page``) reads it into
a ``PageMessage`` and hands it to the attempt runner (``attempts.AttemptRunner``, the same one ``paperlane run``
uses: claim under a lease, prepare, infer, post-process, store, settle by the retry policy, write the outputs of
any document it finished). What is left here is the worker's: a retried or handed-back page goes to the delayed
set (behind the same tenant and ingest), an unknown job to the dead letters, and the tenant's series are counted.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from contextlib import ExitStack
from typing import Any

from celery import Task, bootsteps
from celery.exceptions import Reject
from celery.worker import state as celery_state

from paperlane import heap
from paperlane.errors import JobNotFound, StorageUnavailable, UsageError
from paperlane.models.engine import Engine
from paperlane.models.factory import build_engine
from paperlane.priority.broker import PagePublisher, make_celery
from paperlane.priority.connection import open_redis
from paperlane.priority.deadletter import DeadLetters
from paperlane.priority.delayed import DelayedPages
from paperlane.priority.depth import QueueDepth
from paperlane.priority.fair import HEADER, FairLanes
from paperlane.priority.lanes import TASK_PROCESS_PAGE, Lane
from paperlane.priority.messages import PageMessage
from paperlane.priority.policy import LanePolicy
from paperlane.priority.scheduler import LaneScheduler
from paperlane.retry import Action, RetryPolicy
from paperlane.schemas import Stage
from paperlane.settings import Settings
from paperlane.status import JobStatus
from paperlane.storage.usage import EngineWork
from paperlane.workers.answers import EngineAnswers
from paperlane.workers.attempts import Attempt, AttemptRunner
from paperlane.workers.exporter import MetricsServer, TenantSeries
from paperlane.workers.lane_gate import ConsumerLanes, LaneGate
from paperlane.workers.leases import LeaseKeeper
from paperlane.workers.outputs import OutputsSweep
from paperlane.workers.pipeline import Runtime, Slots
from paperlane.workers.retry_clock import RetryClock
from paperlane.workers.shutdown import GracefulStop

log = logging.getLogger(__name__)


class Worker:
    """One worker process: its Celery app and its parts (see the module docstring)."""

    def __init__(self, settings: Settings, *, lanes: list[Lane] | None = None, engine: Engine | None = None) -> None:
        self.settings = settings
        self.lanes = lanes or list(Lane)
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.policy = RetryPolicy.of(settings.worker)
        # Built, not loaded: its capacity sizes the task slots Celery is started with.
        self.engine = engine or build_engine(settings.engine)
        self.slots = Slots.plan(settings.worker, self.engine.capacity)
        self.app = make_celery(settings)
        self._stack = ExitStack()
        self._register()

    # -- parts -------------------------------------------------------------------------------------

    def open(self) -> None:
        """Open every part in order; on a failure, close what was opened and raise."""
        with ExitStack() as stack:
            cfg = self.settings.worker
            self.redis = open_redis(self.settings.redis)
            stack.callback(self.redis.close)
            self.runtime = Runtime.start(self.settings, engine=self.engine, answers=EngineAnswers(self.redis),
                                         images_back=False, results_back=False, claim_outputs=cfg.write_outputs)
            stack.callback(self.runtime.close)
            self.delayed = DelayedPages(self.redis)
            self.letters = DeadLetters(self.redis)
            publisher = PagePublisher(self.app, stage=Stage.QUEUE_WAIT)
            self.clock = _started(stack, RetryClock(self.redis, self.delayed, publisher.publish))
            fair = self.settings.fair_share
            self.leases = _started(stack, LeaseKeeper(self.runtime.db, self.delayed, self.redis, cfg, self.policy,
                                                      worker=self.name, fair=FairLanes(self.redis, buffer=fair.buffer),
                                                      fair_share=fair.enabled))
            # Document outputs are built on processes of their own (``workers.outputs_pool``), not here; or left due
            # for ``paperlane outputs`` (``worker.write_outputs`` false: ``workers.outputs_service``).
            if cfg.write_outputs:
                _started(stack, OutputsSweep(self.runtime.outputs, every=cfg.lease / 3))
            self.runner = AttemptRunner(self.runtime, self.policy, worker=self.name, lease=cfg.lease,
                                        leases=self.leases, outputs=self.runtime.outputs if cfg.write_outputs else None)
            # The batch limit keeps slots free for interactive pages; a worker that serves no interactive lane
            # needs none.
            limit = self.slots.batch if Lane.INTERACTIVE in self.lanes else None
            self.scheduler = LaneScheduler(LanePolicy(batch_share=cfg.batch_share, batch_limit=limit),
                                           source := ConsumerLanes(self.redis), lanes=self.lanes)
            self.gate = _started(stack, LaneGate(self.scheduler, source))
            _started(stack, GracefulStop(self.runtime.batcher, grace=cfg.shutdown_grace))
            _started(stack, MetricsServer(self.settings, QueueDepth(self.redis)))
            self.tenants = TenantSeries(self.runtime.db, labels=self.settings.metrics.tenant_labels)
            self._stack = stack.pop_all()

    def close(self) -> None:
        """Close every part, the last opened first."""
        self._stack.close()

    # -- the task ------------------------------------------------------------------------------------

    def _register(self) -> None:
        worker = self

        @self.app.task(name=TASK_PROCESS_PAGE, bind=True, acks_late=True)
        def process_page_task(self: Task, job_id: str) -> str:
            page = _message_of(self, str(job_id))
            try:
                return worker.handle(page)
            finally:
                worker.scheduler.finished(page.lane)

        self.app.steps["worker"].add(_parts_step(self))
        self.app.steps["consumer"].add(_gate_step(self))

    def handle(self, page: PageMessage) -> str:
        """One message: attempt its page and settle it (done, failed, or back on its lane later, behind the same
        share); the action taken, or "unknown" (no such job) or "duplicate" (nothing to do)."""
        try:
            attempt = self.runner.run(page)
        except JobNotFound as exc:
            message = json.dumps({"task": TASK_PROCESS_PAGE, "args": [page.job_id]})
            self.letters.add(message, reason=str(exc), queue=page.lane.queue)
            return "unknown"
        except StorageUnavailable as exc:
            # The database is unreachable: nothing about the page can be recorded, so the whole message goes
            # back to its lane later, its attempt not counted (processing a page twice is harmless).
            delay = self.policy.unrecorded_delay()
            self._delay(page, delay)
            log.warning("job %s: %s; back on its lane in %.0fs", page.job_id, exc, delay)
            return Action.RETRY.value
        if attempt is None:  # final already (a redelivery), or another worker holds it under a live lease
            return "duplicate"
        return self._followed(page, attempt)

    def _followed(self, page: PageMessage, attempt: Attempt) -> str:
        """What follows an attempt on a worker: its tenant's series counted; a retried or handed-back page (its
        worker is stopping: due now) on its lane again, at the job's own lane and priority, behind its share."""
        decision, outcome, job = attempt.decision, attempt.outcome, attempt.outcome.job
        tenant = page.share.tenant if page.share else None
        if decision.action in (Action.DONE, Action.FAILED):
            status = JobStatus.SUCCEEDED if decision.action is Action.DONE else JobStatus.FAILED
            self.tenants.count(tenant, status.value, EngineWork.of(outcome.result, outcome.timings))
        if decision.action in (Action.RETRY, Action.HANDED_BACK):
            self._delay(PageMessage(job_id=job.id, lane=Lane(job.lane), message_priority=job.message_priority,
                                    share=page.share), decision.delay)
        return decision.action.value

    def _delay(self, page: PageMessage, delay: float) -> None:
        try:
            self.delayed.add(page, delay)
        except StorageUnavailable as exc:  # Redis is down too: hand the message back as it is
            raise Reject(str(exc), requeue=True) from exc

    def wait_for_tasks(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) until no task of this worker is running: the parts they use must
        outlive them."""
        deadline = time.monotonic() + timeout
        while celery_state.active_requests and time.monotonic() < deadline:
            time.sleep(0.05)


def _started(stack: ExitStack, part: Any) -> Any:
    """Start ``part`` and have ``stack`` stop it."""
    part.start()
    stack.callback(part.stop)
    return part


def _message_of(task: Task, job_id: str) -> PageMessage:
    """The page a task was handed: the lane its routing key names, its message priority and the fair share its
    headers carry (Celery gives a message's headers as the request's attributes)."""
    delivery = task.request.delivery_info or {}
    priority = delivery.get("priority")
    return PageMessage.received(job_id, queue=delivery.get("routing_key"),
                                priority=None if priority is None else int(priority),
                                headers={HEADER: getattr(task.request, HEADER, None)})


def _parts_step(worker: Worker) -> type[bootsteps.StartStopStep]:
    class PaperlaneParts(bootsteps.StartStopStep):
        """Opens the worker's parts before its consumer takes a message; closes them once the tasks are done."""

        requires = ("celery.worker.components:Pool",)

        def start(self, w: Any) -> None:
            try:
                worker.open()
            except UsageError as exc:  # misconfigured: one line and exit code 2, as the CLI's own usage errors
                log.error("error: %s", exc)
                raise SystemExit(2) from None
            heap.after_start()  # the engine, the pools and every part are up: what is left is pages

        def stop(self, w: Any) -> None:
            # Celery stops this step before its pool: pages still on their threads must finish first (a stopping
            # worker's pages are handed back within shutdown_grace).
            worker.wait_for_tasks(worker.settings.worker.shutdown_grace + 30)
            worker.close()

    return PaperlaneParts


def _gate_step(worker: Worker) -> type[bootsteps.StartStopStep]:
    class LaneGateStep(bootsteps.StartStopStep):
        """In the consumer: applies the lanes the scheduler keeps open to the lane queues it consumes."""

        requires = ("celery.worker.consumer.tasks:Tasks",)

        def start(self, c: Any) -> None:
            worker.gate.consumer_started(c)

        def stop(self, c: Any) -> None:
            worker.gate.consumer_stopped()

    return LaneGateStep


def celery_argv(worker: Worker, *, hostname: str | None = None) -> list[str]:
    """The ``celery worker`` arguments that run ``worker``: a thread per page slot, its lanes' queues."""
    argv = ["worker", "--pool=threads", f"--concurrency={worker.slots.total}", "--without-gossip", "--without-mingle",
            f"--queues={','.join(lane.queue for lane in worker.lanes)}", f"--loglevel={worker.settings.log_level}"]
    return [*argv, f"--hostname={hostname}"] if hostname else argv
