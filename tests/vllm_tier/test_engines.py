"""The three VLM engines against the real vLLM (server and in-process) and transformers."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import MAX_MODEL_LEN, MAX_TOKENS, SERVED_NAME, VllmServer
from prometheus_client import REGISTRY

from paperlane.errors import EngineError, EngineOutputError, EngineUnavailable, UsageError
from paperlane.models.engine import EngineOutput, EngineRequest
from paperlane.models.factory import build_engine
from paperlane.schemas import Task, TaskSpec
from paperlane.settings import EngineSettings
from tests.pages import prepare, render_page, sample_lines

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _requests(engine, n: int, spec: TaskSpec = TaskSpec(), priorities: list[int] | None = None) -> list[EngineRequest]:
    priorities = priorities or [0] * n
    return [EngineRequest(image=prepare(render_page(sample_lines(i)), engine.input_spec), spec=spec,
                          priority=priorities[i]) for i in range(n)]


def _check_outputs(outcomes: list, n: int) -> None:
    assert len(outcomes) == n
    for out in outcomes:
        assert isinstance(out, EngineOutput), out
        # The random model never ends on its own: every answer is cut at max_tokens, and says so.
        assert out.truncated and out.usage is not None
        assert out.usage.completion_tokens == MAX_TOKENS and out.usage.prompt_tokens > 0
        assert out.raw is not None and out.seconds is not None and out.seconds > 0


def test_server_engine_sends_a_micro_batch_concurrently(vllm_server: VllmServer) -> None:
    engine = build_engine(EngineSettings(kind="vllm", url=vllm_server.url, max_tokens=MAX_TOKENS, max_in_flight=16))
    engine.start()
    try:
        assert engine.info.model and SERVED_NAME in engine.info.model  # discovered from /v1/models
        spec = engine.input_spec
        assert spec.encoding == "jpeg" and spec.multiple_of == 32
        reqs = _requests(engine, 8)
        assert all(r.image.width % 32 == 0 and r.image.width * r.image.height >= 512 * 512 for r in reqs)
        _check_outputs(engine.infer(reqs), 8)
        assert engine.peak_in_flight == 8  # the whole micro-batch was at the server at once
        parse = engine.infer(_requests(engine, 2, TaskSpec(task=Task.PARSE)))
        assert all(isinstance(o, EngineOutput) and o.markdown is not None for o in parse)
        fields = engine.infer(_requests(engine, 1, TaskSpec(task=Task.FIELDS, fields=("total",))))
        assert isinstance(fields[0], EngineOutputError) and not fields[0].retryable  # no JSON: reported, not guessed
    finally:
        engine.close()


def test_server_engine_keeps_the_default_max_tokens_within_max_model_len(vllm_server: VllmServer,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    # The issue: with max_tokens=4096 (the default) against --max-model-len 512 vLLM refused every page with
    # HTTP 400 "max_tokens=4096 cannot be greater than max_model_len=512".
    cfg = EngineSettings(kind="vllm", url=vllm_server.url)
    assert cfg.max_tokens > MAX_MODEL_LEN
    engine = build_engine(cfg)
    with caplog.at_level(logging.INFO, logger="paperlane.models.vllm_server"):
        engine.start()
    try:
        assert engine.max_model_len == MAX_MODEL_LEN and engine.max_tokens == MAX_MODEL_LEN
        assert f"max_model_len {MAX_MODEL_LEN}), profile" in caplog.text
        assert f"max_tokens {MAX_MODEL_LEN} (configured {cfg.max_tokens})" in caplog.text
        outcomes = engine.infer(_requests(engine, 2, priorities=[0, 7]))
        for out in outcomes:
            assert isinstance(out, EngineOutput), out
            assert out.usage is not None and out.usage.prompt_tokens > 0
            # vLLM lowers max_tokens to what the prompt leaves of the context; the cut answer says so.
            assert out.usage.prompt_tokens + out.usage.completion_tokens == MAX_MODEL_LEN and out.truncated
    finally:
        engine.close()


# vLLM 0.32 documents an error for a non-zero priority without --scheduling-policy priority, yet accepts and
# ignores it: pages succeed at either server and the client keeps sending priorities (a refusal would cost one
# warning and a resend; tests/test_vllm_client.py covers that against the simulated engine).
@pytest.mark.parametrize(("server", "priorities"), [("vllm_server", list(range(10))),
                                                    ("fcfs_vllm_server", [5, 9, 1, 0])])
def test_server_engine_sends_priorities(server: str, priorities: list[int], request: pytest.FixtureRequest,
                                        caplog: pytest.LogCaptureFixture) -> None:
    url = request.getfixturevalue(server).url  # the fcfs server starts only for the test that needs it
    engine = build_engine(EngineSettings(kind="vllm", url=url, max_tokens=MAX_TOKENS))
    engine.start()
    try:
        with caplog.at_level(logging.WARNING, logger="paperlane.models.vllm_server"):
            _check_outputs(engine.infer(_requests(engine, len(priorities), priorities=priorities)), len(priorities))
        assert engine.sends_priority and not caplog.records
    finally:
        engine.close()


def _streamed() -> tuple[float, float]:
    """The tokens and the chunks answers have streamed to this process so far (paperlane's metrics)."""
    tokens = sum(REGISTRY.get_sample_value("paperlane_engine_tokens_total", {"outcome": o}) or 0.0
                 for o in ("completed", "abandoned"))
    return tokens, REGISTRY.get_sample_value("paperlane_engine_chunks_total") or 0.0


@pytest.mark.parametrize("interval", [16, 1])
def test_server_engine_asks_for_chunks_of_its_stream_interval(vllm_server: VllmServer, interval: int) -> None:
    # vLLM streams a chunk per token unless asked (its request field stream_interval, 0.32): the tier's server is
    # started without --stream-interval, so what the chunks hold is what the requests asked.
    engine = build_engine(EngineSettings(kind="vllm", url=vllm_server.url, max_tokens=128, stream_interval=interval))
    engine.start()
    try:
        tokens0, chunks0 = _streamed()
        outcomes = engine.infer(_requests(engine, 2))
        tokens, chunks = (a - b for a, b in zip(_streamed(), (tokens0, chunks0), strict=True))
    finally:
        engine.close()
    assert all(isinstance(o, EngineOutput) and o.usage and o.usage.completion_tokens == 128 for o in outcomes)
    assert tokens == 256
    # Each answer also has a chunk with the role, a last one with the finish reason and one with the usage.
    assert (tokens / chunks >= 8) if interval == 16 else (tokens / chunks < 1.1), (tokens, chunks)


def test_server_engine_errors(vllm_server: VllmServer) -> None:
    down = build_engine(EngineSettings(kind="vllm", url="http://127.0.0.1:9/v1", startup_timeout=1))
    with pytest.raises(EngineUnavailable) as info:
        down.start()
    assert info.value.retryable
    down.close()
    wrong = build_engine(EngineSettings(kind="vllm", url=vllm_server.url, model="no-such-model"))
    with pytest.raises(UsageError, match="not served"):
        wrong.start()
    wrong.close()
    engine = build_engine(EngineSettings(kind="vllm", url=vllm_server.url, max_tokens=MAX_TOKENS))
    engine.start()
    try:
        # A prompt longer than the context is refused for that page only, for good.
        keys = tuple(f"field_number_{i}" for i in range(200))
        too_long, fine = engine.infer([*_requests(engine, 1, TaskSpec(task=Task.FIELDS, fields=keys)),
                                       *_requests(engine, 1)])
        assert isinstance(too_long, EngineError) and not too_long.retryable
        assert "HTTP 400" in str(too_long) and "maximum context length" in str(too_long)
        assert isinstance(fine, EngineOutput)
    finally:
        engine.close()


def test_inprocess_engine(tiny_model: Path, caplog: pytest.LogCaptureFixture) -> None:
    # One sequence at a time, so that pages queue inside the engine and their priority decides the order.
    engine = build_engine(EngineSettings(kind="vllm-inprocess", model=str(tiny_model), max_tokens=MAX_TOKENS,
                                         vllm_args={"max_model_len": MAX_MODEL_LEN, "max_num_seqs": 1,
                                                    "dtype": "float32", "enforce_eager": True}))
    with caplog.at_level(logging.INFO, logger="paperlane.models.vllm_inprocess"):
        engine.start()
    assert f"max_tokens {MAX_TOKENS}, scheduling priority)" in caplog.text  # priority unless vllm_args say not
    try:
        tokens0, chunks0 = _streamed()
        _check_outputs(engine.infer(_requests(engine, 4)), 4)
        tokens, chunks = (a - b for a, b in zip(_streamed(), (tokens0, chunks0), strict=True))
        # 16 tokens an answer, in chunks of engine.stream_interval (16): the first token, the rest (and its end).
        assert tokens == 4 * MAX_TOKENS and chunks <= 4 * 3, (tokens, chunks)
        assert engine.info.name == "vllm-inprocess"
        # Five batch pages, then one interactive page, submitted together: it overtakes all but the first.
        outcomes = engine.infer(_requests(engine, 6, priorities=[9, 9, 9, 9, 9, 0]))
        _check_outputs(outcomes, 6)
        finished = sorted(range(6), key=lambda i: outcomes[i].seconds)
        assert finished.index(5) <= 1, [round(outcomes[i].seconds, 3) for i in range(6)]
    finally:
        engine.close()


def test_inprocess_engine_keeps_max_tokens_within_max_model_len(tiny_model: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    cfg = EngineSettings(kind="vllm-inprocess", model=str(tiny_model),
                         vllm_args={"max_model_len": MAX_MODEL_LEN, "max_num_seqs": 2, "dtype": "float32",
                                    "enforce_eager": True, "scheduling_policy": "fcfs"})
    assert cfg.max_tokens > MAX_MODEL_LEN
    engine = build_engine(cfg)
    with caplog.at_level(logging.INFO, logger="paperlane.models.vllm_inprocess"):
        engine.start()
    assert f"max_model_len {MAX_MODEL_LEN}, max_tokens {MAX_MODEL_LEN}, scheduling fcfs)" in caplog.text
    try:
        assert engine.max_tokens == MAX_MODEL_LEN
        [out] = engine.infer(_requests(engine, 1, priorities=[3]))
        assert isinstance(out, EngineOutput) and out.usage is not None
        assert out.usage.prompt_tokens + out.usage.completion_tokens == MAX_MODEL_LEN and out.truncated
    finally:
        engine.close()


def test_transformers_engine(tiny_model: Path) -> None:
    engine = build_engine(EngineSettings(kind="transformers", model=str(tiny_model), max_tokens=MAX_TOKENS))
    engine.start()
    try:
        _check_outputs(engine.infer(_requests(engine, 3)), 3)
    finally:
        engine.close()
    with pytest.raises(UsageError):
        build_engine(EngineSettings(kind="transformers", model="/nonexistent/model")).start()
