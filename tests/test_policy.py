"""The lane policy and the one scheduler that applies it: interactive first, batch keeps its share and
leaves slots for interactive, and the question "is batch waiting?" asked once per burst, not per call."""

from __future__ import annotations

from paperlane.priority.lanes import Lane, broker_keys, message_priority
from paperlane.priority.policy import LanePolicy
from paperlane.priority.scheduler import InMemoryLanes, LaneScheduler

INT, B = Lane.INTERACTIVE, Lane.BATCH


class CountingLanes(InMemoryLanes[str]):
    """The in-memory source, counting how often the scheduler asks it whether batch waits."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0
        self.opened: list[frozenset[Lane]] = []

    def batch_waiting(self) -> bool:
        self.asked += 1
        return super().batch_waiting()

    def open_lanes(self, lanes: frozenset[Lane]) -> None:
        self.opened.append(lanes)
        super().open_lanes(lanes)


def drain(sched: LaneScheduler, lanes: InMemoryLanes[str], n: int) -> str:
    """Start ``n`` pages one by one, each finishing before the next starts; their lanes' initials."""
    order = []
    for _ in range(n):
        sched.refresh()
        picked = lanes.take()
        assert picked is not None
        sched.started(picked[0])
        sched.finished(picked[0])
        order.append(picked[0].value[0])
    return "".join(order)


def test_interactive_first_but_batch_gets_its_share() -> None:
    lanes = CountingLanes()
    for i in range(20):
        lanes.add(INT, f"i{i}")
        lanes.add(B, f"b{i}")
    sched = LaneScheduler(LanePolicy(batch_share=0.25), lanes)  # bursts of 3 interactive, then one batch
    assert drain(sched, lanes, 12) == "iiibiiibiiib"
    # "Is batch waiting?" costs a round trip on a worker: asked only when batch is owed a start.
    assert lanes.asked <= 2 * 3 * 2


def test_each_lane_alone_gets_everything() -> None:
    lanes = CountingLanes()
    for i in range(5):
        lanes.add(B, f"b{i}")
    sched = LaneScheduler(LanePolicy(batch_share=0.2), lanes)
    assert drain(sched, lanes, 5) == "bbbbb"
    for i in range(10):
        lanes.add(INT, f"i{i}")
    assert drain(sched, lanes, 10) == "i" * 10  # no batch waiting: interactive never pauses
    assert lanes.take() is None


def test_batch_leaves_reserved_slots_free() -> None:
    lanes = CountingLanes()
    for i in range(5):
        lanes.add(B, f"b{i}")
    sched = LaneScheduler(LanePolicy(batch_limit=2), lanes)
    for _ in range(2):
        picked = lanes.take()
        assert picked is not None and picked[0] is B
        sched.started(B)
    assert sched.open == frozenset({INT}) and lanes.take() is None  # the rest of the slots wait for interactive
    lanes.add(INT, "urgent")
    assert lanes.take() == (INT, "urgent")
    sched.started(INT)
    sched.finished(B)
    assert B in sched.open and lanes.take() == (B, "b2")


def test_open_lanes_change_only_on_events_that_change_them() -> None:
    lanes = CountingLanes()
    sched = LaneScheduler(LanePolicy(batch_limit=1), lanes)
    for _ in range(50):
        sched.refresh()
    assert lanes.opened == []  # nothing changed: the source is not touched
    sched.started(B)
    sched.finished(B)
    assert lanes.opened == [frozenset({INT}), frozenset({INT, B})] and sched.changes == 2


def test_a_runner_serving_one_lane_never_opens_the_other() -> None:
    lanes = CountingLanes()
    sched = LaneScheduler(LanePolicy(batch_limit=1), lanes, lanes=[B])
    sched.started(B)
    assert sched.open == frozenset()
    sched.finished(B)
    assert sched.open == frozenset({B})


def test_priorities_and_broker_keys() -> None:
    assert message_priority(Lane.INTERACTIVE, 4) < message_priority(Lane.BATCH, 0)
    assert broker_keys(Lane.BATCH)[:2] == ["paperlane.batch", "paperlane.batch:1"]
