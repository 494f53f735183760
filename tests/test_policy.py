"""The lane policy: interactive first, batch keeps its share, batch leaves slots for interactive."""

from __future__ import annotations

from paperlane.priority.lanes import Lane, broker_keys, message_priority
from paperlane.priority.policy import LanePolicy


def test_interactive_first_but_batch_gets_its_share() -> None:
    policy = LanePolicy(batch_share=0.25)  # burst of 3 interactive starts, then one batch
    order = []
    for _ in range(12):
        lane = policy.pick(interactive_waiting=True, batch_waiting=True)
        assert lane is not None
        policy.started(lane)
        order.append(lane.value[0])
    assert "".join(order) == "iiibiiibiiib"


def test_each_lane_alone_gets_everything() -> None:
    policy = LanePolicy(batch_share=0.2)
    assert [policy.pick(interactive_waiting=False, batch_waiting=True) for _ in range(3)] == [Lane.BATCH] * 3
    for _ in range(10):
        policy.started(Lane.INTERACTIVE)
    assert policy.pick(interactive_waiting=True, batch_waiting=False) is Lane.INTERACTIVE
    assert policy.pick(interactive_waiting=False, batch_waiting=False) is None


def test_batch_leaves_reserved_slots_free() -> None:
    policy = LanePolicy(batch_limit=2)
    for _ in range(2):
        policy.started(Lane.BATCH)
    assert policy.blocked(batch_waiting=True) == {Lane.BATCH}
    assert policy.pick(interactive_waiting=False, batch_waiting=True) is None
    assert policy.pick(interactive_waiting=True, batch_waiting=True) is Lane.INTERACTIVE
    policy.finished(Lane.BATCH)
    assert policy.pick(interactive_waiting=False, batch_waiting=True) is Lane.BATCH


def test_priorities_and_broker_keys() -> None:
    assert message_priority(Lane.INTERACTIVE, 4) < message_priority(Lane.BATCH, 0)
    assert broker_keys(Lane.BATCH)[:2] == ["paperlane.batch", "paperlane.batch:1"]
