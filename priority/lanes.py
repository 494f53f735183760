"""Lanes and the names they map to in the broker.

Two lanes: ``interactive`` (one page back fast) and ``batch`` (the bulk backlog). Each lane is a
Celery queue of its own, and every message also carries a *message priority* (0-9): with kombu's
``priority`` queue-order strategy, 0 is served first across ALL queues a worker listens to, so an
interactive page (0-4) overtakes any batch backlog (5-9) that is still in Redis. Within a lane, a
caller orders pages with a *priority* 0-4 (0 first): the page's message priority is its lane's base
plus that. The queues' Redis names are in ``priority.keys``.
"""

from __future__ import annotations

from enum import Enum

from paperlane.errors import UsageError
from paperlane.priority import keys

TASK_PROCESS_PAGE = "paperlane.process_page"

PRIORITY_STEPS: list[int] = list(range(10))  # message priorities
LEVELS_PER_LANE = 5  # priorities within a lane


class Lane(str, Enum):
    INTERACTIVE = "interactive"
    BATCH = "batch"

    @property
    def queue(self) -> str:
        return keys.queue(self.value)

    @property
    def base_priority(self) -> int:
        return 0 if self is Lane.INTERACTIVE else LEVELS_PER_LANE

    @classmethod
    def of_queue(cls, queue: str | None) -> Lane | None:
        """The lane whose queue is named ``queue`` (a message's routing key); None for any other name."""
        return _BY_QUEUE.get(queue) if queue is not None else None


_BY_QUEUE: dict[str, Lane] = {lane.queue: lane for lane in Lane}  # of_queue runs for every message published and popped
ALL_QUEUES: tuple[str, ...] = tuple(_BY_QUEUE)


def broker_keys(lane: Lane) -> list[str]:
    """The Redis lists that hold ``lane``'s waiting messages, one per message priority."""
    return keys.priority_lists(lane.queue, PRIORITY_STEPS)


def message_priority(lane: Lane, priority: int = 0) -> int:
    """The message priority (0-9, 0 first: what Redis and vLLM order by) of a page in ``lane`` with ``priority``
    (0-4, 0 first: the order within its lane that the CLI and the API take)."""
    if not 0 <= priority < LEVELS_PER_LANE:
        raise UsageError(f"priority must be between 0 and {LEVELS_PER_LANE - 1}, got {priority}")
    return lane.base_priority + priority
