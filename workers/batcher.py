"""Micro-batches formed from the pages a worker is working on right now.

Every page in progress (one per task slot) hands its prepared image to the ``MicroBatcher`` and
waits on a future. One engine thread takes up to ``max_size`` ready pages at a time, most urgent
first (lowest message priority, then arrival), and runs them as one ``engine.infer`` call. It
waits at most ``max_wait`` for a batch to fill, and not at all when an interactive page is
waiting: an interactive page never waits for batch pages to arrive.

This keeps Celery's per-message acks and priorities (each message is its own task) while the
engine still sees batches; post-processing and storing run back on the task threads, overlapped
with the next batch's inference.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from models.engine import Engine, EngineRequest, Outcome
from paperlane.errors import EngineError, PaperlaneError

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
    busy_s: float = 0.0  # time spent inside engine.infer


class MicroBatcher:
    def __init__(self, engine: Engine, *, max_size: int, max_wait: float, urgent_below: int) -> None:
        """``urgent_below``: pages with a message priority below this never wait for a batch to fill."""
        self._engine = engine
        self._max_size = max_size
        self._max_wait = max_wait
        self._urgent_below = urgent_below
        self._heap: list[_Pending] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self.stats = BatcherStats()
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self._thread.start()

    def submit(self, request: EngineRequest, *, priority: int) -> Future[tuple[Outcome, float]]:
        """Queue one prepared page; the future gives its outcome and the seconds its batch took."""
        fut: Future[tuple[Outcome, float]] = Future()
        with self._cond:
            if self._closed:
                raise EngineError("worker is shutting down", stage="inference", retryable=True)
            heapq.heappush(self._heap, _Pending(priority, next(self._seq), request, fut, time.monotonic()))
            self._cond.notify()
        return fut

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def _take(self) -> list[_Pending] | None:
        with self._cond:
            while not self._heap and not self._closed:
                self._cond.wait()
            if not self._heap:
                return None
            deadline = min(p.since for p in self._heap) + self._max_wait
            while (len(self._heap) < self._max_size and not self._closed
                   and self._heap[0].priority >= self._urgent_below):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return [heapq.heappop(self._heap) for _ in range(min(self._max_size, len(self._heap)))]

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            t0 = time.perf_counter()
            try:
                outcomes: list[Outcome] = list(self._engine.infer([p.request for p in batch]))
            except PaperlaneError as exc:
                outcomes = [exc] * len(batch)
            except Exception as exc:  # an engine bug fails this batch's pages, not the worker
                log.exception("engine failed on a batch of %d", len(batch))
                outcomes = [exc] * len(batch)  # type: ignore[list-item]
            seconds = time.perf_counter() - t0
            self.stats.batches += 1
            self.stats.pages += len(batch)
            self.stats.busy_s += seconds
            for pending, outcome in zip(batch, outcomes):
                pending.future.set_result((outcome, seconds))
