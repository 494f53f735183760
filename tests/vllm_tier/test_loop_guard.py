"""The loop guard on the real vLLM engine (the tiny random-weight HunyuanOCR, whose answers degenerate readily).

Its greedy answers fall into runs such as ``wwwwwwww...`` within the first few dozen tokens; with thresholds
lowered to match (a unit 8 times over 24 characters), the guard stops them mid-stream. The checks read vLLM's
own accounting: the server's ``vllm:num_requests_running`` and ``vllm:generation_tokens_total`` on its
/metrics, the in-process engine's unfinished requests.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from conftest import MAX_MODEL_LEN, VllmServer

from paperlane.models.engine import EngineOutput, EngineRequest
from paperlane.models.factory import build_engine
from paperlane.schemas import QualityFlag, Task, TaskSpec
from paperlane.settings import EngineSettings, LoopGuardSettings
from tests.pages import prepare, render_page, sample_lines

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TINY_LOOPS = dict(repeats=8, structure_repeats=8, min_span=24)  # the tiny model's runs are short
BUDGET = MAX_MODEL_LEN - 40  # max_tokens: what a page's prompt leaves of the context, about


def _metric(server: VllmServer, name: str) -> float:
    text = httpx.get(server.url.removesuffix("/v1") + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def _settled(server: VllmServer) -> float:
    """The server's generated-token count once nothing runs and it stops moving (its gauges update after steps)."""
    last = -1.0
    while (now := _metric(server, "vllm:generation_tokens_total")) != last or _metric(
            server, "vllm:num_requests_running"):
        last = now
        time.sleep(0.5)
    return now


def _request(engine, task: Task = Task.TEXT) -> EngineRequest:  # noqa: ANN001
    return EngineRequest(image=prepare(render_page(sample_lines(3)), engine.input_spec), spec=TaskSpec(task=task))


def test_a_looping_answer_is_stopped_mid_stream_and_the_server_aborts_it(paced_vllm_server: VllmServer) -> None:
    # The paced server decodes at most 100 tokens/s: the answer is still decoding when the guard stops reading it.
    server = paced_vllm_server
    guard = LoopGuardSettings(**TINY_LOOPS, retries=0, fallback=False)
    engine = build_engine(EngineSettings(kind="vllm", url=server.url, max_tokens=BUDGET, guard=guard))
    engine.start()
    try:
        engine.infer([_request(engine, Task.TABLE)])  # warm: the server's gauges are live from its first answer
        before = _settled(server)
        [out] = engine.infer([_request(engine)])
        stopped = time.monotonic()
        while (running := _metric(server, "vllm:num_requests_running")) > 0 and time.monotonic() < stopped + 1:
            time.sleep(0.05)
        decoded = _settled(server) - before
    finally:
        engine.close()
    assert isinstance(out, EngineOutput) and out.quality is not None and out.usage is not None
    assert out.quality.flags[0] is QualityFlag.LOOP_STOPPED and out.quality.needs_review
    # The abort freed its slot within a second. (Whether the gauge ever showed it running is a race: a stopped
    # answer can start and end between two scrapes. That it ran is the generation-token counter below.)
    assert running == 0
    # The engine stopped decoding soon after the client stopped reading, far from max_tokens (a request left running
    # decodes to BUDGET): what it decoded more is the tokens on their way and those decoded while the abort travelled,
    # under a second's worth at the paced 100 tokens/s.
    assert out.usage.completion_tokens < BUDGET // 2, out.usage
    assert out.usage.completion_tokens <= decoded <= out.usage.completion_tokens + 100 < BUDGET, (out.usage, decoded)


def test_the_retry_and_the_fallback_run_end_to_end(vllm_server: VllmServer) -> None:
    # Every answer over 40 characters counts as more than the page holds: both tries degenerate, then RapidOCR.
    guard = LoopGuardSettings(**TINY_LOOPS, min_page_chars=40, chars_per_megapixel=1)
    engine = build_engine(EngineSettings(kind="vllm", url=vllm_server.url, max_tokens=BUDGET, guard=guard))
    engine.start()
    try:
        [fallback] = engine.infer([_request(engine, Task.SPOTTING)])
        # With thresholds for a loop only: the answer loops, the retry (repetition penalty 1.15) is read until it
        # loops too (the random model does) or to its end.
        engine.close()
        engine = build_engine(EngineSettings(kind="vllm", url=vllm_server.url, max_tokens=BUDGET,
                                             guard=LoopGuardSettings(**TINY_LOOPS)))
        engine.start()
        [retried] = engine.infer([_request(engine, Task.TEXT)])
    finally:
        engine.close()
    assert isinstance(fallback, EngineOutput) and fallback.quality is not None and fallback.usage is not None
    assert fallback.quality.flags == [QualityFlag.RETRIED, QualityFlag.FALLBACK]
    assert fallback.engine is not None and (fallback.engine.name, fallback.engine.fallback_for) == ("rapidocr", "vllm")
    assert fallback.usage.engine_calls == 2 and len(fallback.lines) >= 3  # RapidOCR read the rendered lines
    assert isinstance(retried, EngineOutput) and retried.quality is not None and retried.usage is not None
    assert QualityFlag.RETRIED in retried.quality.flags and retried.usage.engine_calls == 2
    assert 0 < retried.usage.abandoned_tokens < BUDGET  # each try stopped well before max_tokens
    assert _metric(vllm_server, "vllm:num_requests_running") == 0


def test_the_inprocess_engine_aborts_a_looping_answer(tiny_model: Path) -> None:
    engine = build_engine(EngineSettings(kind="vllm-inprocess", model=str(tiny_model), max_tokens=BUDGET,
                                         guard=LoopGuardSettings(**TINY_LOOPS, retries=1, fallback=False),
                                         vllm_args={"max_model_len": MAX_MODEL_LEN, "dtype": "float32",
                                                    "enforce_eager": True}))
    engine.start()
    try:
        [out] = engine.infer([_request(engine)])
        assert engine.unfinished_requests == 0  # type: ignore[attr-defined]
    finally:
        engine.close()
    assert isinstance(out, EngineOutput) and out.quality is not None and out.usage is not None
    assert QualityFlag.RETRIED in out.quality.flags and out.usage.engine_calls == 2
    assert 0 < out.usage.abandoned_tokens < BUDGET // 2
    assert out.quality.confidence is not None  # log-probabilities from the engine
