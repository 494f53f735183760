"""One scheduler for both runners: the lane policy applied on events to whatever holds waiting pages.

The rules are ``priority.policy.LanePolicy``; this module decides WHEN they are applied and to
what, the same way for both runners:

- after every page start and finish (the only moments the answer can change) the scheduler asks
  the policy which lanes must not start pages, and tells its ``LaneSource`` which lanes are open;
- the source hands out the most urgent waiting page among the open lanes.

Sources: the embedded runner's in-memory lanes (``InMemoryLanes`` below), and the Celery worker's
consumer of the Redis lane queues (``paperlane.workers.lane_gate``), which stops and resumes
consuming a lane's queue. Nothing here polls: the cost is a few operations per page, never per
unit of time.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

from paperlane.priority.lanes import Lane
from paperlane.priority.policy import LanePolicy

ALL_LANES: frozenset[Lane] = frozenset(Lane)


class LaneSource(Protocol):
    def batch_waiting(self) -> bool:
        """Whether a batch page is waiting to start (asked at most once per interactive burst)."""
        ...

    def open_lanes(self, lanes: frozenset[Lane]) -> None:
        """From now on, hand out pages of ``lanes`` only."""
        ...


class LaneScheduler:
    """Applies ``policy`` to ``source`` whenever a page starts or finishes."""

    def __init__(self, policy: LanePolicy, source: LaneSource, *, lanes: Iterable[Lane] = ALL_LANES) -> None:
        self.policy = policy
        self._source = source
        self._lanes = frozenset(lanes)  # the lanes this runner serves at all
        self._lock = threading.Lock()
        self.open: frozenset[Lane] = self._lanes
        self.changes = 0  # how often the open lanes changed: the work this scheduler caused

    def started(self, lane: Lane) -> frozenset[Lane]:
        """A page of ``lane`` started; the lanes open now."""
        self.policy.started(lane)
        return self.refresh()

    def finished(self, lane: Lane) -> frozenset[Lane]:
        """A page of ``lane`` finished (its slot is free); the lanes open now."""
        self.policy.finished(lane)
        return self.refresh()

    def refresh(self) -> frozenset[Lane]:
        """Apply the policy now (also when pages were added to an idle source); the lanes open now."""
        with self._lock:
            blocked = self.policy.blocked(self._source.batch_waiting)
            wanted = self._lanes - blocked
            if wanted != self.open:
                self.open = wanted
                self.changes += 1
                self._source.open_lanes(wanted)
            return wanted


T = TypeVar("T")


class InMemoryLanes(Generic[T]):
    """Waiting pages held in memory, one FIFO per lane (``paperlane run``): a ``LaneSource``."""

    def __init__(self) -> None:
        self._waiting: dict[Lane, deque[T]] = {lane: deque() for lane in Lane}
        self._open: frozenset[Lane] = ALL_LANES

    def add(self, lane: Lane, item: T) -> None:
        self._waiting[lane].append(item)

    def __len__(self) -> int:
        return sum(map(len, self._waiting.values()))

    def batch_waiting(self) -> bool:
        return bool(self._waiting[Lane.BATCH])

    def open_lanes(self, lanes: frozenset[Lane]) -> None:
        self._open = lanes

    def take(self) -> tuple[Lane, T] | None:
        """The next page to start: interactive first, from open lanes only; None when none may start."""
        for lane in (Lane.INTERACTIVE, Lane.BATCH):
            if lane in self._open and self._waiting[lane]:
                return lane, self._waiting[lane].popleft()
        return None
