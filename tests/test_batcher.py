"""The micro-batcher with a stub engine (the engine is the boundary): how batches form, who waits, what fails."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from paperlane.errors import EngineError, EngineUnavailable, WorkerStopping
from paperlane.models.engine import Capacity, EngineOutput, EngineRequest, InputSpec, Outcome, PreparedImage
from paperlane.schemas import EngineInfo
from paperlane.workers.batcher import MicroBatcher

URGENT_BELOW = 5  # message priorities 0-4: interactive


class StubEngine:
    """Records each batch (as the requests' tags); can be held so that pages pile up meanwhile."""

    def __init__(self, *, fail: BaseException | None = None) -> None:
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail = fail

    info = EngineInfo(name="stub", version="0")
    input_spec = InputSpec()
    capacity = Capacity()

    def start(self) -> None:
        pass

    def infer(self, requests: Sequence[EngineRequest]) -> list[Outcome]:
        self.entered.set()
        self.gate.wait(10)
        self.batches.append([r.spec.fields[0] for r in requests])
        if self.fail is not None:
            raise self.fail
        return [EngineOutput(text=r.spec.fields[0]) for r in requests]

    def close(self) -> None:
        pass


def request(tag: str) -> EngineRequest:
    from paperlane.schemas import Task, TaskSpec

    return EngineRequest(image=PreparedImage(1, 1, 1, 1), spec=TaskSpec(task=Task.FIELDS, fields=(tag,)))


@pytest.fixture
def make():
    made: list[MicroBatcher] = []

    def build(engine: StubEngine, **kw: object) -> MicroBatcher:
        opts: dict = {"max_size": 4, "max_wait": 0.5, "urgent_below": URGENT_BELOW, "batch_share": 0.25, **kw}
        b = MicroBatcher(engine, **opts)
        made.append(b)
        return b

    yield build
    for b in made:
        b.close()


def hold_engine(engine: StubEngine, batcher: MicroBatcher) -> None:
    """Keep the engine busy with a first batch so that later pages pile up in the batcher."""
    engine.gate.clear()
    engine.entered.clear()
    batcher.submit(request("first"), priority=9)
    assert engine.entered.wait(5)


def test_most_urgent_first_with_batch_keeping_its_share(make) -> None:
    engine = StubEngine()
    batcher = make(engine)
    hold_engine(engine, batcher)
    futures = [batcher.submit(request(f"b{i}"), priority=5 + i % 3) for i in range(4)]
    futures += [batcher.submit(request(f"i{i}"), priority=i % 2) for i in range(8)]
    engine.gate.set()
    for f in futures:
        f.result(5)
    first, *rest = engine.batches[1:]
    # Interactive first, in priority order; but one place in four stays with the batch lane.
    assert first == ["i0", "i2", "i4", "b0"]
    assert rest[0] == ["i6", "i1", "i3", "b3"]
    assert sum(tag.startswith("b") for batch in engine.batches[1:] for tag in batch) == 4


def test_a_batch_waits_only_for_pages_on_their_way(make) -> None:
    engine = StubEngine()
    batcher = make(engine, max_wait=0.4)
    t0 = time.monotonic()
    batcher.submit(request("alone"), priority=5).result(5)
    assert time.monotonic() - t0 < 0.3  # nothing announced: no waiting for pages that are not coming
    batcher.expect()
    batcher.expect()
    t0 = time.monotonic()
    batcher.submit(request("early"), priority=5).result(5)
    assert time.monotonic() - t0 >= 0.35  # the other announced page never came: waited max_wait, no longer
    batcher.unexpect()
    assert batcher.expected == 0


def test_an_interactive_page_never_waits_for_a_batch_to_fill(make) -> None:
    engine = StubEngine()
    batcher = make(engine, max_wait=5.0)
    for _ in range(3):
        batcher.expect()
    t0 = time.monotonic()
    batcher.submit(request("urgent"), priority=0).result(5)
    assert time.monotonic() - t0 < 1.0
    for _ in range(3):
        batcher.unexpect()


def test_an_engine_failure_fails_that_batch_only(make) -> None:
    engine = StubEngine(fail=MemoryError("boom"))
    batcher = make(engine)
    outcome, _ = batcher.submit(request("doomed"), priority=5).result(5)
    assert isinstance(outcome, MemoryError)
    engine.fail = None
    outcome, _ = batcher.submit(request("fine"), priority=5).result(5)
    assert isinstance(outcome, EngineOutput) and outcome.text == "fine"
    assert batcher.stats.batches == 2 and batcher.stats.pages == 2


def test_a_closed_batcher_hands_pages_back(make) -> None:
    batcher = make(StubEngine())
    batcher.close()
    with pytest.raises(WorkerStopping) as err:  # its worker is stopping: back on the lane, no attempt counted
        batcher.submit(request("late"), priority=5)
    assert err.value.retryable and not isinstance(err.value, EngineUnavailable)


def test_an_engine_answering_fewer_pages_fails_the_rest(make) -> None:
    class Forgetful(StubEngine):
        def infer(self, requests: Sequence[EngineRequest]) -> list[Outcome]:
            return super().infer(requests)[:1]

    engine = Forgetful()
    batcher = make(engine)
    hold_engine(engine, batcher)
    futures = [batcher.submit(request(f"b{i}"), priority=5) for i in range(3)]
    engine.gate.set()
    outcomes = [f.result(5)[0] for f in futures]
    assert isinstance(outcomes[0], EngineOutput)
    assert all(isinstance(o, EngineError) and "no answer" in str(o) for o in outcomes[1:])
