"""``paperlane run``: the whole pipeline in one process, on the embedded stack by default.

Pages are registered exactly as ``paperlane submit`` does (originals in the object store, rows
in the database) and flow through the same pieces as on a worker: page slots on threads, the
CPU pool preparing pages while the engine runs, the micro-batcher, the lane policy choosing what
starts next, the same retry rules. Inputs are read lazily, so a run over millions of pages holds
only a few slots' worth in memory. Pages done earlier with the same content and task are not
redone: their stored result is copied out.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import queue
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from paperlane.errors import PaperlaneError
from paperlane.priority.lanes import Lane
from paperlane.priority.policy import LanePolicy
from paperlane.priority.scheduler import InMemoryLanes, LaneScheduler
from paperlane.producer.inputs import PageInput
from paperlane.producer.submit import Submitted, submit_pages
from paperlane.schemas import JobStatus, PageResult, Task, TaskSpec
from paperlane.storage import jobs as jobstore
from paperlane.storage.tables import JobRow
from paperlane.workers.attempts import Action, Decision, settle
from paperlane.workers.pipeline import PageOutcome, Runtime, process_page, result_json
from paperlane.workers.render import format_of

log = logging.getLogger(__name__)

Emit = Callable[[str, PageResult, "bytes | None"], None]


@dataclass
class RunSummary:
    """What a run did, kept small: a run over millions of pages must not hold their results."""

    pages: int = 0
    failed: int = 0
    timings: list[dict[str, float]] = field(default_factory=list)  # per page, seconds per stage
    seconds: float = 0.0


def run_embedded(rt: Runtime, pages: Iterable[PageInput], *, out_dir: Path, spec: TaskSpec,
                 lane: Lane = Lane.BATCH, force: bool = False,
                 on_page: Callable[[str, PageResult], None] | None = None) -> RunSummary:
    """Process ``pages`` and write ``out_dir/<name>.json`` (+ the annotated image on success) for each."""
    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = RunSummary()

    def emit(name: str, result: PageResult, image: bytes | None) -> None:
        (out_dir / f"{name}.json").write_bytes(result_json(result))
        if image is not None:
            # A page done by an earlier run may have been stored in another format: its bytes say which.
            # "<name>.annotated.jpg", never "<name>.jpg": run with --out on the input folder must not
            # overwrite the scans themselves.
            fmt = format_of(image) or rt.settings.worker.annotated_format
            (out_dir / f"{name}.annotated.{fmt.suffix}").write_bytes(image)
        summary.pages += 1
        summary.failed += result.status is JobStatus.FAILED
        summary.timings.append(result.timings)
        if on_page:
            on_page(name, result)

    subs = submit_pages(pages, db=rt.db, store=rt.store, spec=spec, lane=lane, force=force)
    _Scheduler(rt, _named(subs), emit).run()
    summary.seconds = time.perf_counter() - t0
    return summary


def _named(subs: Iterable[Submitted]) -> Iterator[tuple[str, Submitted]]:
    """Output stems unique within one run: a repeated stem gets -2, -3, ..."""
    seen: dict[str, int] = {}
    for sub in subs:
        n = seen[sub.page.name] = seen.get(sub.page.name, 0) + 1
        yield (sub.page.name if n == 1 else f"{sub.page.name}-{n}"), sub


class _Scheduler:
    """Keeps every page slot busy; the one ``LaneScheduler`` decides which lane starts next.

    A page whose attempt should be retried waits out its backoff here, off its slot, and then goes
    back to its lane: the same rule as on a worker, where it waits in Redis's delayed set.
    """

    def __init__(self, rt: Runtime, subs: Iterator[tuple[str, Submitted]], emit: Emit) -> None:
        self.rt = rt
        self.subs = subs
        self.emit = emit
        self.slots = rt.slots
        self.waiting: InMemoryLanes[tuple[str, JobRow]] = InMemoryLanes()
        # No interactive page arrives from outside a run: batch pages may use every slot.
        self.lanes = LaneScheduler(LanePolicy(batch_share=rt.settings.worker.batch_share), self.waiting)
        self.delayed: list[tuple[float, int, str, JobRow]] = []  # (due, seq, name, job): retries due later
        self._seq = itertools.count()
        self.done: queue.Queue[tuple[str, JobRow, Future[_Attempt | None]]] = queue.Queue()
        self.exhausted = False

    def run(self) -> None:
        in_flight = 0
        with ThreadPoolExecutor(max_workers=self.slots, thread_name_prefix="slot") as slots:
            while True:
                self._refill()
                self._release_due()
                self.lanes.refresh()
                while in_flight < self.slots and (picked := self.waiting.take()) is not None:
                    lane, (name, job) = picked
                    self.lanes.started(lane)
                    fut = slots.submit(self._attempt, job)
                    fut.add_done_callback(partial(self._done, name, job))
                    in_flight += 1
                if in_flight == 0 and self.exhausted and not len(self.waiting) and not self.delayed:
                    return
                try:
                    name, job, fut = self.done.get(timeout=self._until_due())
                except queue.Empty:
                    continue  # a delayed page is due
                in_flight -= 1
                self.lanes.finished(Lane(job.lane))
                self._settled(name, job, fut.result())

    def _done(self, name: str, job: JobRow, fut: Future[_Attempt | None]) -> None:
        self.done.put((name, job, fut))

    def _refill(self) -> None:
        while not self.exhausted and len(self.waiting) < 2 * self.slots:
            try:
                name, sub = next(self.subs)
            except StopIteration:
                self.exhausted = True
                return
            if sub.action == "failed" or (sub.action == "exists" and sub.job.status == JobStatus.SUCCEEDED.value):
                self.emit(name, *_stored(self.rt, sub.job))
            else:  # new, requeued, or left queued/running by an earlier run that stopped
                self.waiting.add(Lane(sub.job.lane), (name, sub.job))

    def _release_due(self) -> None:
        now = time.monotonic()
        while self.delayed and self.delayed[0][0] <= now:
            _, _, name, job = heapq.heappop(self.delayed)
            self.waiting.add(Lane(job.lane), (name, job))

    def _until_due(self) -> float | None:
        return max(0.0, self.delayed[0][0] - time.monotonic()) if self.delayed else None

    def _attempt(self, job: JobRow) -> _Attempt | None:
        """One attempt at one page under the retry rules; None when it needs none (finished elsewhere)."""
        # No crash-loop limit here: a page that kills this process stops the run where the user sees it,
        # and an interrupted run (Ctrl-C) must not count against the pages it was working on.
        started = jobstore.start_attempt(self.rt.db, job.id, max_attempts=None)
        if started is None:
            return None
        outcome = process_page(self.rt, started)
        return _Attempt(outcome, settle(self.rt.db, outcome, self.rt.settings.worker))

    def _settled(self, name: str, job: JobRow, attempt: _Attempt | None) -> None:
        if attempt is None:  # finished without an attempt here: report what the row says
            self.emit(name, *_stored(self.rt, jobstore.get_job(self.rt.db, job.id)))
        elif attempt.decision.action is Action.RETRY:
            heapq.heappush(self.delayed, (time.monotonic() + attempt.decision.delay, next(self._seq), name, job))
        else:
            self.emit(name, attempt.outcome.result, attempt.outcome.annotated)


@dataclass
class _Attempt:
    outcome: PageOutcome
    decision: Decision


def _stored(rt: Runtime, job: JobRow) -> tuple[PageResult, bytes | None]:
    """The result of a page that needs no work now: done earlier, or refused at submission."""
    if job.status == JobStatus.SUCCEEDED.value and job.result_key:
        try:
            result = PageResult.model_validate(json.loads(rt.store.get(job.result_key)))
            image = rt.store.get(job.annotated_key) if job.annotated_key else None
            return result, image
        except PaperlaneError as exc:
            log.warning("stored result of job %s unreadable (%s)", job.id, exc)
    return PageResult(job_id=job.id, source=job.source, page=job.page, status=JobStatus.FAILED,
                      error=job.error or "stored result missing", task=Task(job.task)), None
