"""The scheduling policy between lanes: interactive first, and batch never starves.

- Interactive pages overtake any batch backlog (strict priority), except that while batch pages
  are waiting, at most ``burst`` interactive pages start in a row before one batch page must
  start: batch keeps a guaranteed share of ``batch_share`` of the starts under any interactive
  load, and an interactive page waits for at most one batch page ahead of it.
- Batch pages may hold at most ``batch_limit`` of a worker's page slots: the rest stay free for
  interactive pages, which then start at once instead of waiting for a busy slot to free.

The same policy object drives the embedded runner (which picks each next page itself) and the
Celery worker's lane governor (which pauses a lane's queue while it must not start pages).
"""

from __future__ import annotations

import math
import threading

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

    def blocked(self, *, batch_waiting: bool) -> set[Lane]:
        """The lanes that must not start a page now."""
        with self._lock:
            if self.batch_limit is not None and self._running[Lane.BATCH] >= self.batch_limit:
                return {Lane.BATCH}
            if batch_waiting and self._since_batch >= self.burst:
                return {Lane.INTERACTIVE}
            return set()

    def pick(self, *, interactive_waiting: bool, batch_waiting: bool) -> Lane | None:
        """The lane whose page starts next, or None when nothing may start."""
        blocked = self.blocked(batch_waiting=batch_waiting)
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
