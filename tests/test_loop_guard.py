"""The loop guard on the production client against the simulated engine with a real model's shape.

The simulated engine (tests/sim_engine.py, ``fast`` shape) loops on a share of pages until max_tokens unless
the request asks for a repetition penalty above 1.1, and on a "stubborn" share whatever the penalty; it streams
as vLLM does and frees a sequence the moment its client closes the stream. Assertions read the engine's own
bookkeeping (requests per page, tokens decoded by outcome, running sequences) and the graded outcomes.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import bindparam, text

from paperlane.models.engine import EngineOutput, EngineRequest, Outcome
from paperlane.models.vllm_server import VllmServerEngine
from paperlane.priority.lanes import Lane
from paperlane.schemas import QualityFlag, Task, TaskSpec
from paperlane.settings import EngineSettings, LoopGuardSettings
from tests.conftest import cli
from tests.pages import prepare, render_page, sample_lines
from tests.services import free_port
from tests.sim_engine import SimEngine, start_sim_engine
from tests.sim_shape import Behaviour
from tests.test_scheduling import Producer

LOOPS = Behaviour(loop_share=1.0)  # every page loops at the usual penalty; a retry at 1.15 is clean
STUBBORN = Behaviour(loop_share=1.0, stubborn_share=1.0)  # every page loops whatever the penalty


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Callable[..., SimEngine]]:
    started: list[SimEngine] = []

    def start(behaviour: Behaviour = Behaviour(), **options: Any) -> SimEngine:
        engine = start_sim_engine(tmp_path / f"sim{len(started)}", shape="fast", behaviour=behaviour,
                                  scheduling_policy="priority", **options)
        started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.stop()


def infer(engine: SimEngine, specs: list[TaskSpec], **settings: Any) -> list[Outcome]:
    client = VllmServerEngine(EngineSettings(kind="vllm", url=engine.url, startup_timeout=30, **settings))
    client.start()
    try:
        reqs = [EngineRequest(image=prepare(render_page(sample_lines(i), fmt="JPEG"), client.input_spec), spec=spec)
                for i, spec in enumerate(specs)]
        return client.infer(reqs)
    finally:
        client.close()


def output(outcome: Outcome) -> EngineOutput:
    assert isinstance(outcome, EngineOutput), outcome
    assert outcome.quality is not None and outcome.usage is not None
    return outcome


def test_a_clean_page_streams_once_with_a_confident_grade(sim: Callable[..., SimEngine]) -> None:
    engine = sim()
    out = output(infer(engine, [TaskSpec()])[0])
    assert out.quality.flags == [] and not out.quality.needs_review
    assert out.quality.confidence is not None and 0.9 < out.quality.confidence < 0.99  # from the logprobs
    assert out.usage.engine_calls == 1 and out.usage.abandoned_tokens == 0 and out.usage.completion_tokens > 100
    assert len(out.lines) > 5 and not out.truncated
    stats = engine.stats()
    assert stats["tokens"] == {"completed": out.usage.completion_tokens, "abandoned": 0}
    assert [r["stream"] for r in engine.requests()] == [True]


def test_a_loop_is_stopped_mid_stream_and_the_retry_recovers_the_page(sim: Callable[..., SimEngine]) -> None:
    engine = sim(LOOPS)
    out = output(infer(engine, [TaskSpec()])[0])
    assert out.quality.flags == [QualityFlag.RETRIED] and not out.quality.needs_review  # a clean second answer
    assert out.usage.engine_calls == 2 and not out.truncated and len(out.lines) > 5
    # The loop was stopped within a few hundred tokens of where it began, not at max_tokens (4096).
    assert 0 < out.usage.abandoned_tokens < 1500
    stats = engine.wait_for(lambda s: s["running"] == 0, timeout=2)  # the abandoned sequence was freed
    assert stats["aborted"] == 1 and stats["completed"] == 1
    # The engine decoded what the client read and what was on its way when it closed the stream: not much more.
    assert out.usage.abandoned_tokens <= stats["tokens"]["abandoned"] < out.usage.abandoned_tokens + 400
    first, retry = sorted(engine.requests(), key=lambda r: r["n"])
    assert (first["status"], first["looped"], retry["status"], retry["looped"]) == (499, True, 200, False)
    assert first["image"] == retry["image"] and retry["repetition_penalty"] == 1.15 > first["repetition_penalty"]


@pytest.mark.slow
def test_a_stubborn_loop_falls_back_to_the_embedded_engine(sim: Callable[..., SimEngine]) -> None:
    engine = sim(STUBBORN)
    out = output(infer(engine, [TaskSpec()])[0])
    assert out.quality.flags == [QualityFlag.RETRIED, QualityFlag.FALLBACK] and out.quality.needs_review
    assert out.engine is not None and out.engine.name == "rapidocr" and out.engine.fallback_for == "vllm"
    assert out.usage.engine_calls == 2 and out.usage.completion_tokens == 0 and out.usage.abandoned_tokens > 0
    assert "Invoice" in out.text or "invoice" in out.text.lower() or len(out.lines) >= 3  # RapidOCR read the page
    assert all(line.quad for line in out.lines) and out.quality.confidence is not None  # its line scores
    stats = engine.wait_for(lambda s: s["running"] == 0, timeout=2)
    assert stats["aborted"] == 2 and stats["tokens"]["completed"] == 0


@pytest.mark.parametrize("task", [Task.FIELDS, Task.TRANSLATE, Task.TABLE])
def test_a_task_without_a_fallback_keeps_what_it_has_flagged(sim: Callable[..., SimEngine], task: Task) -> None:
    engine = sim(STUBBORN)
    spec = TaskSpec(task=task, fields=("total",) if task is Task.FIELDS else ())
    out = output(infer(engine, [spec])[0])
    assert QualityFlag.LOOP_STOPPED in out.quality.flags and QualityFlag.RETRIED in out.quality.flags
    assert out.quality.needs_review and out.engine is None and out.usage.engine_calls == 2
    if task is Task.FIELDS:
        assert out.fields == {} and out.missing_fields == ["total"]
    else:  # the answer up to its loop, and at most one copy of what repeated
        body = out.markdown if task is Task.TABLE else out.text
        assert body and body.count("the customer account the customer account") == 0
        assert body.count("<tr><td></td><td></td><td></td></tr>") <= 1


def test_without_the_guard_a_loop_runs_to_max_tokens_and_is_flagged(sim: Callable[..., SimEngine]) -> None:
    engine = sim(LOOPS)
    out = output(infer(engine, [TaskSpec()], max_tokens=1500, guard=LoopGuardSettings(enabled=False))[0])
    # Cut at max_tokens, and the looping text's tokens were unsure: both flags, reviewed.
    assert out.truncated and out.quality.needs_review
    assert out.quality.flags == [QualityFlag.TRUNCATED, QualityFlag.LOW_CONFIDENCE]
    assert out.usage.engine_calls == 1 and out.usage.completion_tokens == 1500
    assert engine.stats()["tokens"] == {"completed": 1500, "abandoned": 0}


def test_a_page_read_with_low_confidence_needs_review(sim: Callable[..., SimEngine]) -> None:
    engine = sim(Behaviour(hard_share=1.0))
    out = output(infer(engine, [TaskSpec(task=Task.TEXT)])[0])
    assert out.quality.confidence is not None and out.quality.confidence < 0.8
    assert out.quality.flags == [QualityFlag.LOW_CONFIDENCE] and out.quality.needs_review
    unasked = output(infer(engine, [TaskSpec(task=Task.TEXT)], logprobs=False)[0])
    assert unasked.quality.confidence is None and unasked.quality.flags == []  # no logprobs: no confidence


def test_a_retry_with_a_temperature_lifts_top_k(sim: Callable[..., SimEngine]) -> None:
    engine = sim(LOOPS)
    guard = LoopGuardSettings(retry_temperature=0.4, retry_repetition_penalty=1.3)
    output(infer(engine, [TaskSpec()], guard=guard)[0])
    first, retry = sorted(engine.requests(), key=lambda r: r["n"])
    assert (first["temperature"], first["top_k"]) == (0.0, 1)
    assert (retry["temperature"], retry["top_k"], retry["repetition_penalty"]) == (0.4, -1, 1.3)


@pytest.mark.slow
def test_many_pages_at_once_each_get_their_own_outcome(sim: Callable[..., SimEngine]) -> None:
    engine = sim(Behaviour(loop_share=0.5, stubborn_share=0.1))
    outcomes = [output(o) for o in infer(engine, [TaskSpec()] * 1 + [TaskSpec(task=Task.TEXT)] * 11)]
    stats = engine.wait_for(lambda s: s["running"] == 0, timeout=2)
    calls = sum(o.usage.engine_calls for o in outcomes)
    assert calls == stats["requests"] == stats["completed"] + stats["aborted"]
    for o in outcomes:
        retried = QualityFlag.RETRIED in o.quality.flags
        assert o.usage.engine_calls == (2 if retried else 1)
        assert o.quality.needs_review == (QualityFlag.FALLBACK in o.quality.flags or QualityFlag.LOOP_STOPPED
                                          in o.quality.flags)


# --- through a worker ---------------------------------------------------------------------------------------


def test_through_a_worker_a_looping_page_is_one_attempt_and_its_engine_calls_are_counted(
        stack_factory, worker_factory, tmp_path: Path) -> None:  # noqa: ANN001
    port = free_port()
    stack = stack_factory(METRICS__PORT=str(port))
    # Every page loops; at this stubborn share one of the six (the draws follow the images) loops again after the
    # retry: the RapidOCR fallback runs once (seconds of CPU, more on a busy machine).
    engine = start_sim_engine(tmp_path / "engine", shape="fast", scheduling_policy="priority",
                              behaviour=Behaviour(loop_share=1.0, stubborn_share=0.05))
    try:
        producer = Producer(stack)
        ids = producer.submit(range(6), Lane.BATCH)
        worker = worker_factory(stack, "--engine", "vllm", "--engine-url", engine.url)
        try:
            rows = producer.wait(ids, timeout=300)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nworker log:\n{worker.output()[-4000:]}") from exc
        results = {job_id: json.loads(producer.store.get(row.result_key)) for job_id, row in rows.items()}  # type: ignore[arg-type]
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        stats = engine.stats()
    finally:
        engine.stop()
    kinds = set()
    for job_id, row in rows.items():
        result = results[job_id]
        assert row.status == "succeeded" and row.attempts == 1, (row.status, row.error)  # stop and retry: one attempt
        assert result["usage"]["engine_calls"] == 2 and result["usage"]["abandoned_tokens"] > 0
        flags = result["quality"]["flags"]
        if "fallback" in flags:
            assert flags == ["retried", "fallback"] and result["quality"]["needs_review"]
            assert result["engine"]["name"] == "rapidocr" and result["engine"]["fallback_for"] == "vllm"
            assert row.engine.startswith("rapidocr ") and row.engine.endswith("fallback for vllm")  # type: ignore[union-attr]
        else:
            assert flags == ["retried"] and not result["quality"]["needs_review"]
            assert result["engine"]["name"] == "vllm" and row.engine.startswith("vllm ")  # type: ignore[union-attr]
        kinds.add(tuple(flags))
    assert kinds == {("retried",), ("retried", "fallback")}
    assert stats["requests"] == sum(r["usage"]["engine_calls"] for r in results.values()) == 12
    assert sorted(stats["per_image"].values()) == [2] * 6  # each page: its loop stopped, one retry
    assert 'paperlane_page_flags_total{flag="retried"} 6.0' in metrics
    assert 'paperlane_pages_graded_total{needs_review="false"}' in metrics
    abandoned = float(metrics.split('paperlane_engine_tokens_total{outcome="abandoned"} ')[1].split()[0])
    assert abandoned == sum(r["usage"]["abandoned_tokens"] for r in results.values())
    # The fallback pages, and only they, need review: counted on the ingest, listed with why, in SQL too.
    fallbacks = sorted(job_id for job_id, r in results.items() if r["quality"]["needs_review"])
    with producer.db.session() as s:
        ingest_id = s.execute(text("SELECT DISTINCT ingest_id FROM pages WHERE job_id IN :ids")
                              .bindparams(bindparam("ids", expanding=True)), {"ids": list(ids)}).scalar_one()
        queue = s.execute(text("SELECT job_id, flags FROM review_queue WHERE ingest_id = :i"), {"i": ingest_id}).all()
    assert sorted(job_id for job_id, _ in queue) == fallbacks and {f for _, f in queue} == {"retried,fallback"}
    status = json.loads(cli(stack, "status", "--json", "--ingest", ingest_id).stdout)
    assert status["needs_review"] == len(fallbacks)
    listed = json.loads(cli(stack, "review", "--json", "--ingest", ingest_id).stdout)
    assert sorted(p["job_id"] for p in listed) == fallbacks
    assert all(p["flags"] == ["retried", "fallback"] and p["engine"].startswith("rapidocr") for p in listed)


def test_a_kept_answer_keeps_its_grade_and_engine(redis_client) -> None:  # noqa: ANN001
    from paperlane.schemas import EngineInfo, Quality
    from paperlane.workers.answers import EngineAnswers

    answers = EngineAnswers(redis_client)
    flags = {QualityFlag.RETRIED, QualityFlag.FALLBACK}
    out = EngineOutput(text="read by the fallback", quality=Quality.grade(flags, 0.91),
                       engine=EngineInfo(name="rapidocr", version="3", fallback_for="vllm"))
    answers.put("job-kept", out)
    kept = answers.get("job-kept")
    assert kept is not None and kept.quality == out.quality and kept.quality.needs_review
    assert kept.engine == out.engine


def test_a_worker_killed_mid_stream_frees_its_sequences_and_loses_no_page(
        stack_factory, worker_factory, tmp_path: Path) -> None:  # noqa: ANN001
    stack = stack_factory(WORKER__LEASE="2")
    # The real shape: a page streams for a second or more, so the kill lands mid-answer.
    engine = start_sim_engine(tmp_path / "engine", shape="h200-hunyuanocr", scheduling_policy="priority")
    try:
        producer = Producer(stack)
        ids = producer.submit(range(4), Lane.BATCH)
        vllm = ("--engine", "vllm", "--engine-url", engine.url)
        doomed = worker_factory(stack, *vllm, name="doomed")
        # Decoding begun (past prefill), so the answers the kill cuts have tokens to abandon.
        engine.wait_for(lambda s: s["running"] >= 2 and s.get("decoded_tokens", 0) > 0
                        and s["tokens"]["completed"] == 0, timeout=60)
        os.killpg(doomed.proc.pid, signal.SIGKILL)
        stats = engine.wait_for(lambda s: s["running"] == 0, timeout=2)  # the connections dropped: aborted at once
        assert stats["aborted"] >= 2 and stats["tokens"]["abandoned"] > 0
        worker_factory(stack, *vllm, name="heir")
        rows = producer.wait(ids, timeout=120)
    finally:
        engine.stop()
    assert all(r.status == "succeeded" for r in rows.values())
    assert max(r.attempts for r in rows.values()) == 2  # the killed attempts counted once each
