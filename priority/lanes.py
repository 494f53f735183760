"""Lanes and the names they map to in the broker.

Two lanes: ``interactive`` (one page back fast) and ``batch`` (the bulk backlog). Each lane is a
Celery queue of its own, and every message also carries a Redis priority: with kombu's
``priority`` queue-order strategy, priority 0 is served first across ALL queues a worker
listens to, so an interactive page overtakes any batch backlog that is still in Redis.
Within a lane, a caller may order pages with a level 0..4 (0 first).
"""

from __future__ import annotations

from enum import Enum

from paperlane.errors import UsageError

TASK_PROCESS_PAGE = "paperlane.process_page"

PRIORITY_STEPS: list[int] = list(range(10))
LEVELS_PER_LANE = 5


class Lane(str, Enum):
    INTERACTIVE = "interactive"
    BATCH = "batch"

    @property
    def queue(self) -> str:
        return f"paperlane.{self.value}"

    @property
    def base_priority(self) -> int:
        return 0 if self is Lane.INTERACTIVE else LEVELS_PER_LANE

    @classmethod
    def of_queue(cls, queue: str | None) -> Lane | None:
        """The lane whose queue is named ``queue`` (a message's routing key); None for any other name."""
        return next((lane for lane in cls if lane.queue == queue), None)


ALL_QUEUES: tuple[str, ...] = tuple(lane.queue for lane in Lane)

# kombu's Redis transport keeps one list per (queue, priority): "queue" for 0, "queue:N" otherwise.
BROKER_PRIORITY_SEP = ":"

# Pages whose retry is due later: a sorted set scored by the time they are due, a sorted set of those
# being put back on their lane right now (scored by when that began), and a channel that tells every
# worker a new one was added (see priority/delayed.py).
DELAYED_KEY = "paperlane.delayed"
RELEASING_KEY = "paperlane.delayed.releasing"
DELAYED_CHANNEL = "paperlane.delayed"

# Messages a worker could not take off a lane (not JSON, not a page message, no such job): a list for
# operators, newest first, trimmed to DEAD_LETTER_KEEP entries (see priority/deadletter.py).
DEAD_LETTER_KEY = "paperlane.dead-letter"
DEAD_LETTER_KEEP = 1000


def broker_keys(lane: Lane) -> list[str]:
    """The Redis lists that hold ``lane``'s waiting messages."""
    return [lane.queue if p == 0 else f"{lane.queue}{BROKER_PRIORITY_SEP}{p}" for p in PRIORITY_STEPS]


def message_priority(lane: Lane, level: int = 0) -> int:
    """The Redis message priority (0 = first) of a page in ``lane`` at ``level`` within it."""
    if not 0 <= level < LEVELS_PER_LANE:
        raise UsageError(f"priority level must be between 0 and {LEVELS_PER_LANE - 1}, got {level}")
    return lane.base_priority + level
