"""Micro-batches formed from the pages a worker is working on right now.

Every page in progress (one per task slot) announces itself with ``expect`` when its
preprocessing starts, then hands its prepared image to the ``MicroBatcher`` and waits on a
future. A dispatcher thread (one per batch the engine runs at once) takes up to
``max_size`` ready pages at a time, most urgent first (lowest message priority, then arrival) but
with the lane policy's share for batch pages (``LanePolicy.pick``), and runs them as one
``engine.infer`` call. A batch waits to fill only while announced pages
are still being preprocessed, at most ``max_wait``, and not at all when an interactive page is
waiting: an interactive page never waits for batch pages to arrive, and a lone page does not
wait for pages that are not coming.

This keeps Celery's per-message acks and priorities (each message is its own task) while the
engine still sees batches; post-processing and storing run back on the task threads, overlapped
with the next batch's inference.

When the worker stops (``workers.shutdown``) the batcher is drained: pages not yet in the engine get
``WorkerStopping`` at once and new ones are refused, batches in the engine run on; ``give_up`` hands
back those too, and an answer that comes after that is dropped.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

from paperlane.errors import EngineError, PaperlaneError, WorkerStopping
from paperlane.metrics import BATCH_SIZE, ENGINE_IN_FLIGHT
from paperlane.models.engine import Engine, EngineRequest, Outcome
from paperlane.priority.lanes import Lane
from paperlane.priority.policy import LanePolicy

log = logging.getLogger(__name__)


@dataclass(order=True)
class _Pending:
    priority: int
    seq: int
    request: EngineRequest = field(compare=False)
    future: Future[tuple[Outcome, float]] = field(compare=False)
    since: float = field(compare=False)


@dataclass
class BatcherStats:
    batches: int = 0
    pages: int = 0
    busy_s: float = 0.0  # time spent inside engine.infer, summed over dispatchers


class MicroBatcher:
    def __init__(self, engine: Engine, *, max_size: int, max_wait: float, urgent_below: int,
                 dispatchers: int = 1, batch_share: float = 0.2) -> None:
        """``urgent_below``: pages with a message priority below this (the interactive lane) never wait
        for a batch to fill.

        ``dispatchers``: batches handed to the engine at once (1 for a sequential engine; more for
        a continuously batching server, so an urgent page never waits for a batch in flight).

        ``batch_share``: the lane policy's share; while batch pages are ready, they get at least this
        share of the places in batches, so a flood of interactive pages cannot starve batch pages that
        already started.
        """
        self._engine = engine
        self._max_size = max_size
        self._max_wait = max_wait
        self._urgent_below = urgent_below
        self._heaps: dict[Lane, list[_Pending]] = {lane: [] for lane in Lane}
        self._policy = LanePolicy(batch_share=batch_share)
        self._seq = itertools.count()
        # One lock, two conditions: a page wakes ONE idle dispatcher (and the urgent one, for an urgent
        # page), not all of them. With dozens of dispatchers for a server engine, waking every one on
        # every page cost more CPU than the page's own trip to the engine.
        lock = threading.Lock()
        self._cond = threading.Condition(lock)
        self._urgent = threading.Condition(lock)
        self._idle = threading.Condition(lock)  # a batch came back from the engine
        self._closed = False
        self._draining = False  # the worker is stopping: no page goes into the engine any more
        self._given_up = False
        self._in_engine: dict[int, list[_Pending]] = {}  # batches in the engine, by their first page's seq
        self._expected = 0  # pages being preprocessed that will be submitted
        self.stats = BatcherStats()
        self._stats_lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, name=f"engine-{i}", daemon=True)
                         for i in range(dispatchers)]
        if dispatchers > 1:
            # A server that batches continuously has room for one more request at any time: urgent
            # pages (only those) go straight to it instead of waiting for a batch in flight to return.
            self._threads.append(threading.Thread(target=self._loop, args=(True,), name="engine-urgent", daemon=True))
        for thread in self._threads:
            thread.start()

    def expect(self) -> None:
        """A page has started preprocessing: a batch may wait (up to ``max_wait``) for it.

        Raises WorkerStopping once the batcher is drained."""
        with self._cond:
            if self._draining:
                raise _stopping()
            self._expected += 1

    @property
    def expected(self) -> int:
        """Pages announced and not yet submitted (0 when the accounting is balanced and idle)."""
        with self._cond:
            return self._expected

    def unexpect(self) -> None:
        """An expected page will not come (it failed before inference)."""
        with self._cond:
            self._expected = max(0, self._expected - 1)
            self._cond.notify_all()  # only dispatchers waiting for a batch to fill care, and they are few

    def submit(self, request: EngineRequest, *, priority: int) -> Future[tuple[Outcome, float]]:
        """Queue one prepared page; the future gives its outcome and the seconds its batch took.

        Raises WorkerStopping once the batcher is drained."""
        fut: Future[tuple[Outcome, float]] = Future()
        with self._cond:
            if self._draining:
                raise _stopping()
            if self._closed:
                raise _stopping()
            self._expected = max(0, self._expected - 1)
            lane = Lane.INTERACTIVE if priority < self._urgent_below else Lane.BATCH
            heapq.heappush(self._heaps[lane], _Pending(priority, next(self._seq), request, fut, time.monotonic()))
            self._cond.notify()
            if lane is Lane.INTERACTIVE:
                self._urgent.notify()
        return fut

    def drain(self) -> tuple[int, int]:
        """The worker is stopping: hand back the pages waiting for the engine (their futures give
        ``WorkerStopping``) and refuse new ones; batches in the engine run on. The pages handed back,
        and those in the engine."""
        with self._cond:
            self._draining = True
            waiting = [p for heap in self._heaps.values() for p in heap]
            for heap in self._heaps.values():
                heap.clear()
            in_engine = sum(map(len, self._in_engine.values()))
        _hand_back(waiting)
        return len(waiting), in_engine

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the engine to have no batch of ours; whether it has none."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._in_engine:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
            return True

    def give_up(self) -> int:
        """Hand back the pages still in the engine (an answer that comes later is dropped); how many."""
        with self._cond:
            self._given_up = True
            pages = [p for batch in self._in_engine.values() for p in batch]
        return _hand_back(pages)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._urgent.notify_all()
            # Dispatchers still waiting on the engine for pages handed back are not waited for.
            timeout = 0.1 if self._given_up else 30
        for thread in self._threads:
            thread.join(timeout=timeout)

    def _take(self, urgent_only: bool) -> list[_Pending] | None:
        with self._cond:
            while True:
                batch = self._take_locked(urgent_only)
                if batch is None or batch:
                    return batch
                if self._closed:  # only pages this dispatcher may not take are left: the others drain them
                    return None
                # else another dispatcher took the pages this one was waiting to fill up with

    def _take_locked(self, urgent_only: bool) -> list[_Pending] | None:
        wake = self._urgent if urgent_only else self._cond
        while not self._closed and not (self._urgent_first() if urgent_only else self._ready()):
            wake.wait()
        if not self._ready():
            return None
        # Wait for a fuller batch only while pages are on their way (preprocessing), at most
        # max_wait, and never when an urgent page is waiting.
        deadline = min(h[0].since for h in self._heaps.values() if h) + self._max_wait
        while self._ready() < self._max_size and self._expected > 0 and not self._closed \
                and not self._urgent_first():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(left)
        batch: list[_Pending] = []
        while len(batch) < self._max_size and (lane := self._next_lane(urgent_only)) is not None:
            batch.append(heapq.heappop(self._heaps[lane]))
            self._policy.started(lane)
        if batch:
            self._in_engine[batch[0].seq] = batch
        return batch

    def _ready(self) -> int:
        return sum(map(len, self._heaps.values()))

    def _urgent_first(self) -> bool:
        return bool(self._heaps[Lane.INTERACTIVE])

    def _next_lane(self, urgent_only: bool) -> Lane | None:
        """The lane of the next page into a batch: most urgent first, batch keeping its share."""
        urgent, normal = bool(self._heaps[Lane.INTERACTIVE]), bool(self._heaps[Lane.BATCH])
        if urgent_only:
            return Lane.INTERACTIVE if urgent else None
        return self._policy.pick(interactive_waiting=urgent, batch_waiting=normal)

    def _loop(self, urgent_only: bool = False) -> None:
        while (batch := self._take(urgent_only)) is not None:
            t0 = time.perf_counter()
            BATCH_SIZE.observe(len(batch))
            ENGINE_IN_FLIGHT.inc(len(batch))
            try:
                outcomes: list[Outcome] = list(self._engine.infer([p.request for p in batch]))
            except PaperlaneError as exc:
                outcomes = [exc] * len(batch)
            except Exception as exc:  # an engine bug fails this batch's pages, not the worker
                if not self._given_up:  # after that, the engine may be closed under a batch: no news
                    log.exception("engine failed on a batch of %d", len(batch))
                outcomes = [exc] * len(batch)
            finally:
                ENGINE_IN_FLIGHT.dec(len(batch))
            if len(outcomes) != len(batch):  # an engine bug must not leave pages waiting forever
                log.error("engine returned %d outcomes for %d pages", len(outcomes), len(batch))
                missing = EngineError("the engine returned no answer for this page", stage="inference")
                outcomes = (outcomes + [missing] * len(batch))[: len(batch)]
            seconds = time.perf_counter() - t0
            with self._stats_lock:
                self.stats.batches += 1
                self.stats.pages += len(batch)
                self.stats.busy_s += seconds
            for pending, outcome in zip(batch, outcomes):
                _resolve(pending.future, (outcome, seconds))
            with self._cond:
                del self._in_engine[batch[0].seq]
                self._idle.notify_all()


def _stopping() -> WorkerStopping:
    return WorkerStopping("the worker stopped before this page was done", stage="inference")


def _hand_back(pages: list[_Pending]) -> int:
    """Give each page ``WorkerStopping`` for its outcome (unless it has one already); how many got it."""
    return sum(_resolve(p.future, (_stopping(), 0.0)) for p in pages)


def _resolve(future: Future[tuple[Outcome, float]], result: tuple[Outcome, float]) -> bool:
    """Set the page's outcome unless it has one (handed back, then answered late); whether it was set."""
    try:
        future.set_result(result)
        return True
    except InvalidStateError:
        return False
