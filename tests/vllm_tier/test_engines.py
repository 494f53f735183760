"""The three VLM engines against the real vLLM (server and in-process) and transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import MAX_TOKENS, SERVED_NAME, VllmServer

from paperlane.errors import EngineError, EngineOutputError, EngineUnavailable, UsageError
from paperlane.models.engine import EngineOutput, EngineRequest
from paperlane.models.factory import build_engine
from paperlane.schemas import Task, TaskSpec
from paperlane.settings import EngineSettings
from paperlane.workers.preprocess import prepare
from tests.pages import render_page, sample_lines

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _requests(engine, n: int, spec: TaskSpec = TaskSpec()) -> list[EngineRequest]:
    return [EngineRequest(image=prepare(render_page(sample_lines(i)), engine.input_spec), spec=spec)
            for i in range(n)]


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
    too_long = build_engine(EngineSettings(kind="vllm", url=vllm_server.url, max_tokens=100_000))
    too_long.start()
    try:
        [outcome] = too_long.infer(_requests(too_long, 1))
        assert isinstance(outcome, EngineError) and not outcome.retryable
        assert "HTTP 400" in str(outcome)
    finally:
        too_long.close()


def test_inprocess_engine(tiny_model: Path) -> None:
    engine = build_engine(EngineSettings(kind="vllm-inprocess", model=str(tiny_model), max_tokens=MAX_TOKENS,
                                         vllm_args={"max_model_len": 512, "max_num_seqs": 8, "dtype": "float32",
                                                    "enforce_eager": True}))
    engine.start()
    try:
        _check_outputs(engine.infer(_requests(engine, 4)), 4)
        assert engine.info.name == "vllm-inprocess"
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
