"""The scheduling policy between lanes: interactive first, and batch never starves.

Interactive pages overtake any batch backlog (strict priority), except that while batch pages
are waiting, at most ``burst`` interactive pages start in a row before one batch page must
start: batch keeps a guaranteed share of ``batch_share`` of the starts under any interactive
load, and an interactive page waits for at most one batch page ahead of it. With no interactive
pages waiting, batch gets everything; with no batch pages waiting, interactive does.

The same policy object drives the embedded runner (which picks each next page itself) and the
Celery worker's lane governor (which pauses the interactive queue when batch is owed a start).
"""

from __future__ import annotations

import math
import threading

from priority.lanes import Lane


class LanePolicy:
    def __init__(self, *, batch_share: float = 0.2) -> None:
        if not 0 < batch_share <= 0.5:
            raise ValueError("batch_share must be in (0, 0.5]")
        self.burst = max(1, math.ceil(1 / batch_share) - 1)
        self._since_batch = 0
        self._lock = threading.Lock()

    def batch_owed(self, *, batch_waiting: bool) -> bool:
        """True when the next page to start must be a batch page."""
        with self._lock:
            return batch_waiting and self._since_batch >= self.burst

    def pick(self, *, interactive_waiting: bool, batch_waiting: bool) -> Lane | None:
        """The lane whose page starts next, or None when nothing waits."""
        if interactive_waiting and not self.batch_owed(batch_waiting=batch_waiting):
            return Lane.INTERACTIVE
        if batch_waiting:
            return Lane.BATCH
        return None

    def started(self, lane: Lane) -> None:
        """Record that a page of ``lane`` started."""
        with self._lock:
            self._since_batch = 0 if lane is Lane.BATCH else self._since_batch + 1
