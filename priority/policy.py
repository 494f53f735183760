"""The scheduling policy between lanes: interactive first, and batch never starves.

- Interactive pages overtake any batch backlog (strict priority), except that while batch pages
  are waiting, at most ``burst`` interactive pages start in a row before one batch page must
  start: batch keeps a guaranteed share of ``batch_share`` of the starts under any interactive
  load, and an interactive page waits for at most one batch page ahead of it.
- Batch pages may hold at most ``batch_limit`` of a runner's page slots: the rest stay free for
  interactive pages, which then start at once instead of waiting for a busy slot to free.

The rules live here only. ``priority.scheduler.LaneScheduler`` applies them, on every start and
finish, to whatever holds the waiting pages: the embedded runner's in-memory lanes, or the Celery
worker's consumer of the Redis lanes. The micro-batcher applies the same share when it fills a batch
from the pages in progress (``pick``), so batch pages that started also reach the engine.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from paperlane.priority.lanes import Lane


class LanePolicy:
    def __init__(self, *, batch_share: float = 0.2, batch_limit: int | None = None) -> None:
        if not 0 < batch_share <= 0.5:
            raise ValueError("batch_share must be in (0, 0.5]")
        self.burst = max(1, math.ceil(1 / batch_share) - 1)
        self.batch_limit = batch_limit
        self._since_batch = 0
        self._running = {lane: 0 for lane in Lane}
        self._lock = threading.Lock()

    def blocked(self, batch_waiting: Callable[[], bool]) -> frozenset[Lane]:
        """The lanes that must not start a page now.

        ``batch_waiting`` is asked only when the answer depends on it (after ``burst`` interactive
        starts in a row), so a runner whose check costs a round trip pays it per burst, not per call.
        """
        with self._lock:
            if self.batch_limit is not None and self._running[Lane.BATCH] >= self.batch_limit:
                return frozenset({Lane.BATCH})
            owed = self._since_batch >= self.burst
        if owed and batch_waiting():
            return frozenset({Lane.INTERACTIVE})
        return frozenset()

    def pick(self, *, interactive_waiting: bool, batch_waiting: bool) -> Lane | None:
        """The lane whose page goes next when both may be waiting (None: neither may start now)."""
        blocked = self.blocked(lambda: batch_waiting)
        if interactive_waiting and Lane.INTERACTIVE not in blocked:
            return Lane.INTERACTIVE
        if batch_waiting and Lane.BATCH not in blocked:
            return Lane.BATCH
        return None

    def started(self, lane: Lane) -> None:
        """Record that a page of ``lane`` started."""
        with self._lock:
            self._since_batch = 0 if lane is Lane.BATCH else self._since_batch + 1
            self._running[lane] += 1

    def finished(self, lane: Lane) -> None:
        """Record that a page of ``lane`` is done (its slot is free again)."""
        with self._lock:
            self._running[lane] = max(0, self._running[lane] - 1)
