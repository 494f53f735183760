"""The vLLM server client against a real HTTP server with vLLM's shape (tests/sim_engine.py): the served
context length, priorities, and the way the server's refusals become page outcomes.

The simulated engine answers like ``vllm serve``: 400 for ``max_tokens`` above ``max_model_len`` ("max_tokens=4096
cannot be greater than max_model_len=..."), 400 for a non-zero ``priority`` without
``--scheduling-policy priority`` ("Got priority 5 but Priority scheduling is not enabled.", as vLLM's V0
engine and its documentation word it; vLLM 0.32 itself accepts and ignores such a priority, see
tests/vllm_tier), and a context that cuts answers with ``finish_reason: "length"``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from paperlane.errors import EngineError, EngineUnavailable
from paperlane.models.engine import EngineOutput, EngineRequest
from paperlane.models.vllm_server import VllmServerEngine
from paperlane.schemas import Task, TaskSpec
from paperlane.settings import EngineSettings
from tests.pages import prepare, render_page, sample_lines
from tests.sim_engine import DEFAULT_MAX_MODEL_LEN, SimEngine, start_sim_engine

LOGGER = "paperlane.models.vllm_server"
LATENCY = 0.05

SimFactory = Callable[..., SimEngine]
EngineFactory = Callable[..., VllmServerEngine]


@pytest.fixture
def sim_factory(tmp_path: Path) -> Iterator[SimFactory]:
    """Starts simulated engines (priority scheduling unless said otherwise, as docs/engines.md's ``vllm serve``
    command) and stops them after the test."""
    started: list[SimEngine] = []

    def start(*, slots: int = 4, latency: float = LATENCY, scheduling_policy: str = "priority",
              max_model_len: int = DEFAULT_MAX_MODEL_LEN) -> SimEngine:
        sim = start_sim_engine(tmp_path / f"sim{len(started)}", slots=slots, latency=latency,
                               scheduling_policy=scheduling_policy, max_model_len=max_model_len)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()


@pytest.fixture
def engine_factory() -> Iterator[EngineFactory]:
    """Started clients of a server, closed after the test."""
    engines: list[VllmServerEngine] = []

    def start(url: str, *, max_tokens: int = EngineSettings().max_tokens) -> VllmServerEngine:
        engine = VllmServerEngine(EngineSettings(kind="vllm", url=url, startup_timeout=30, max_tokens=max_tokens))
        engines.append(engine)
        engine.start()
        return engine

    yield start
    for engine in engines:
        engine.close()


def _requests(engine: VllmServerEngine, priorities: list[int], spec: TaskSpec = TaskSpec()) -> list[EngineRequest]:
    return [EngineRequest(image=prepare(render_page(sample_lines(i)), engine.input_spec), spec=spec, priority=p)
            for i, p in enumerate(priorities)]


def _outputs(outcomes: list[object]) -> list[EngineOutput]:
    assert all(isinstance(o, EngineOutput) for o in outcomes), outcomes
    return [o for o in outcomes if isinstance(o, EngineOutput)]


# --- the served context length -------------------------------------------------------------------------------


def test_default_max_tokens_is_kept_within_max_model_len(sim_factory: SimFactory, engine_factory: EngineFactory,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    # A page's prompt is ~690 tokens here and its answer several hundred more: 1024 cuts every answer.
    sim = sim_factory(max_model_len=1024)
    assert EngineSettings().max_tokens == 4096
    with caplog.at_level(logging.INFO, logger=LOGGER):
        engine = engine_factory(sim.url)
    assert engine.max_model_len == 1024 and engine.max_tokens == 1024
    assert "max_model_len 1024" in caplog.text and "max_tokens 1024 (configured 4096)" in caplog.text
    for out in _outputs(engine.infer(_requests(engine, [0, 5]))):
        assert out.usage is not None and out.usage.prompt_tokens + out.usage.completion_tokens == 1024
        assert out.truncated  # cut where the context ends: flagged, never passed off as complete
    assert [r["status"] for r in sim.requests()] == [200, 200]


def test_a_smaller_max_tokens_is_kept(sim_factory: SimFactory, engine_factory: EngineFactory) -> None:
    sim = sim_factory(max_model_len=32768)
    engine = engine_factory(sim.url, max_tokens=40)
    assert engine.max_model_len == 32768 and engine.max_tokens == 40
    [out] = _outputs(engine.infer(_requests(engine, [3])))
    assert out.truncated and out.usage is not None and out.usage.completion_tokens == 40
    [whole] = _outputs(engine_factory(sim.url, max_tokens=32768 * 2).infer(_requests(engine, [3])))
    assert not whole.truncated and whole.text  # the full context leaves room for the whole answer


# --- priorities ----------------------------------------------------------------------------------------------


def test_each_page_carries_its_priority(sim_factory: SimFactory, engine_factory: EngineFactory,
                                        caplog: pytest.LogCaptureFixture) -> None:
    # One slot: the first page to arrive runs, the rest wait, and the server serves the waiting by priority.
    sim = sim_factory(slots=1, latency=0.3)
    engine = engine_factory(sim.url)
    priorities = [9, 8, 7, 6, 5, 0]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _outputs(engine.infer(_requests(engine, priorities)))
    assert engine.sends_priority and not caplog.records
    log = sim.requests()
    assert sorted(r["priority"] for r in log) == sorted(priorities) and all(r["status"] == 200 for r in log)
    waited = [r["priority"] for r in log[1:]]  # in the order the server finished them
    assert waited == sorted(waited), waited


def test_a_server_refusing_priorities_gets_pages_without_them(sim_factory: SimFactory, engine_factory: EngineFactory,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    sim = sim_factory(scheduling_policy="fcfs")
    engine = engine_factory(sim.url)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _outputs(engine.infer(_requests(engine, [5, 6, 7, 0])))  # sent together: each non-zero one is refused
        first = sim.requests()
        _outputs(engine.infer(_requests(engine, [9, 1, 5])))
        second = sim.requests()[len(first):]
    [warning] = caplog.records
    assert "Priority scheduling is not enabled" in warning.getMessage()
    assert "--scheduling-policy priority" in warning.getMessage()
    assert not engine.sends_priority
    refused = [r for r in first if r["status"] == 400]
    assert 1 <= len(refused) <= 3 and all(r["priority"] in (5, 6, 7) for r in refused)
    assert all("Got priority" in r["error"] for r in refused)
    answered = [r for r in first if r["status"] == 200]
    assert len(answered) == 4 and all(r["priority"] == 0 for r in answered)  # resent without it
    # From then on: one call per page, none with a priority.
    assert [(r["status"], r["priority"]) for r in second] == [(200, 0)] * 3


def test_a_page_with_priority_zero_never_needs_the_fallback(sim_factory: SimFactory,
                                                            engine_factory: EngineFactory) -> None:
    sim = sim_factory(scheduling_policy="fcfs")
    engine = engine_factory(sim.url)
    _outputs(engine.infer(_requests(engine, [0, 0])))
    assert engine.sends_priority and [r["status"] for r in sim.requests()] == [200, 200]


# --- other refusals keep their meaning -----------------------------------------------------------------------


def test_refusals_and_outages_become_page_outcomes(sim_factory: SimFactory, engine_factory: EngineFactory) -> None:
    sim = sim_factory(max_model_len=2048, scheduling_policy="fcfs")
    engine = engine_factory(sim.url)
    keys = tuple(f"field number {i} of a very long form" for i in range(300))  # a prompt beyond the context
    too_long, fine = engine.infer([*_requests(engine, [5], TaskSpec(task=Task.FIELDS, fields=keys)),
                                   *_requests(engine, [5])])
    assert isinstance(too_long, EngineError) and not isinstance(too_long, EngineUnavailable)
    assert not too_long.retryable and "HTTP 400" in str(too_long) and "maximum context length" in str(too_long)
    assert isinstance(fine, EngineOutput)
    sim.stop()
    [down] = engine.infer(_requests(engine, [0]))
    assert isinstance(down, EngineUnavailable) and down.retryable


def test_the_client_lets_urgent_pages_take_the_next_free_place_first() -> None:
    import asyncio

    from paperlane.models.aio import PriorityLimiter

    async def scenario() -> list[str]:
        limiter, order = PriorityLimiter(1), []
        release = asyncio.Event()

        async def page(name: str, priority: int) -> None:
            async with limiter.slot(priority):
                order.append(name)
                if name == "first":
                    await release.wait()

        tasks = [asyncio.create_task(page("first", 9))]
        await asyncio.sleep(0)
        tasks += [asyncio.create_task(page(f"batch{i}", 5 + i)) for i in range(3)]
        await asyncio.sleep(0)
        doomed = asyncio.create_task(page("cancelled", 0))
        tasks.append(asyncio.create_task(page("urgent", 1)))
        await asyncio.sleep(0)
        doomed.cancel()  # a waiter that gives up holds no place
        release.set()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["first", "urgent", "batch0", "batch1", "batch2"]


def test_an_interactive_page_goes_past_the_bound_at_once_and_the_place_it_borrowed_is_paid_back() -> None:
    import asyncio

    from paperlane.models.aio import PriorityLimiter

    async def scenario() -> tuple[list[str], int]:
        limiter, order, most = PriorityLimiter(2), [], 0
        held: dict[str, asyncio.Event] = {}

        async def page(name: str, priority: int, *, urgent: bool = False) -> None:
            nonlocal most
            held[name] = asyncio.Event()
            async with limiter.slot(priority, urgent=urgent):
                order.append(name)
                most = max(most, sum(not e.is_set() for n, e in held.items() if n in order))
                await held[name].wait()

        batch = [asyncio.create_task(page(f"batch{i}", 5)) for i in range(4)]
        await asyncio.sleep(0)
        assert order == ["batch0", "batch1"]  # the bound: two at once, two waiting
        urgent = asyncio.create_task(page("urgent", 0, urgent=True))
        await asyncio.sleep(0)
        assert order == ["batch0", "batch1", "urgent"]  # in at once, over the bound
        held["batch0"].set()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert order == ["batch0", "batch1", "urgent"]  # batch0's place paid back the borrowed one
        held["urgent"].set()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert order == ["batch0", "batch1", "urgent", "batch2"]  # back at the bound: one more gets in
        for name in ("batch1", "batch2"):
            held[name].set()
        await asyncio.sleep(0)
        while "batch3" not in held:
            await asyncio.sleep(0)
        held["batch3"].set()
        await asyncio.gather(*batch, urgent)
        return order, most

    order, most = asyncio.run(scenario())
    assert order == ["batch0", "batch1", "urgent", "batch2", "batch3"] and most == 3


def _read_events(*chunks: bytes) -> list[tuple[str, str | None, int | None]]:
    """The deltas of a streamed answer whose body arrives in ``chunks``: (text, finish reason, completion tokens)."""
    import asyncio

    import httpx

    from paperlane.models.vllm_server import _deltas

    async def body() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    async def read() -> list[tuple[str, str | None, int | None]]:
        resp = httpx.Response(200, content=body())
        return [(d.text, d.finish_reason, d.completion_tokens) async for d in _deltas(resp)]

    return asyncio.run(read())


def test_answer_events_are_read_across_chunk_boundaries_up_to_done() -> None:
    one = b'data: {"choices":[{"delta":{"content":"he"}}],"usage":{"completion_tokens":1}}\n\n'
    two = (b'data: {"choices":[{"delta":{"content":"llo"},"finish_reason":"stop"}],"usage":{"completion_tokens":2}}'
           b"\r\n\r\n")
    want = [("he", None, 1), ("llo", "stop", 2)]
    # Split anywhere: inside "data:", inside the JSON, between \r and \n; comments and other fields skipped.
    whole = b": keep-alive\n\n" + one + b"event: chunk\n" + two + b"data: [DONE]\n\n"
    for cut in range(1, len(whole), 7):
        assert _read_events(whole[:cut], whole[cut:]) == want, cut
    # Past [DONE] nothing counts; a last event the body ends without ending still does.
    assert _read_events(one + b"data: [DONE]\n\n" + two) == want[:1]
    assert _read_events(one, two.rstrip()) == want
    with pytest.raises(EngineUnavailable, match="malformed"):
        _read_events(one, b'data: {"choices": [\n\n')


# --- streamed chunks -----------------------------------------------------------------------------------------


@pytest.mark.processes
@pytest.mark.parametrize(("server", "warning"), [
    ("honour", None),  # vLLM 0.32
    ("ignore", "start the server with --stream-interval 16"),  # an older vLLM: the field is unknown, and ignored
    ("refuse", "refuses stream_interval"),  # a stricter server: HTTP 400 naming it, once; the page is sent again
])
def test_answers_stream_in_the_chunks_asked_or_the_operator_hears_why_not(
        tmp_path: Path, server: str, warning: str | None, caplog: pytest.LogCaptureFixture) -> None:
    # A chunk per token is what vLLM streams unasked: each costs the process feeding the engine an event to read.
    sim = start_sim_engine(tmp_path / "sim", shape="quarter-h200-hunyuanocr", scheduling_policy="priority",
                           stream_interval_field=server)
    engine = VllmServerEngine(EngineSettings(kind="vllm", url=sim.url, startup_timeout=30))
    try:
        engine.start()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            _outputs(engine.infer(_requests(engine, [5, 5])))
            _outputs(engine.infer(_requests(engine, [5])))
        stats = sim.stats()
    finally:
        engine.close()
        sim.stop()
    per_chunk = stats["decoded_tokens"] / stats["chunks"]
    if warning is None:
        assert per_chunk >= 12 and not caplog.records, (per_chunk, caplog.text)
        return
    assert per_chunk < 4, per_chunk
    [record] = caplog.records  # once, whatever the pages in flight
    assert warning in record.getMessage()
    refused = [r["status"] for r in sim.requests()].count(400)  # the two pages sent together may both be
    assert 1 <= refused <= 2 if server == "refuse" else refused == 0
