"""Workers in production: /metrics after a real run, GPU series absent without a GPU, and leases: a hung
worker's page taken back by another worker, a page whose engine call hangs failed with the reason."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from paperlane.priority.lanes import Lane
from paperlane.schemas import JobStatus
from paperlane.workers.exporter import Nvml
from tests.conftest import Stack, cli, until
from tests.services import free_port
from tests.sim_engine import start_sim_engine
from tests.test_scheduling import Producer

pytestmark = pytest.mark.slow


def _gpu_here() -> bool:
    """Whether this machine has an NVIDIA GPU and driver (the device nodes the driver makes)."""
    return Path("/dev/nvidiactl").exists() and any(Path("/dev").glob("nvidia[0-9]*"))


def test_nvml_gives_gpu_series_exactly_where_there_is_a_gpu() -> None:
    nvml = Nvml()
    series = {family.name for family in nvml.collect()}
    if _gpu_here():
        assert nvml.present and {"paperlane_gpu_memory_used_bytes", "paperlane_gpu_temperature_celsius"} <= series
    else:
        assert not nvml.present and series == set()


def test_a_worker_serves_its_metrics_after_a_real_run(stack_factory: Callable[..., Stack], worker_factory) -> None:
    port = free_port()
    stack = stack_factory(METRICS__PORT=str(port))
    producer = Producer(stack)
    ids = producer.submit(range(3), Lane.BATCH)
    worker_factory(stack)
    rows = producer.wait(ids)
    assert all(r.status == "succeeded" for r in rows.values())
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    for series in ('paperlane_stage_seconds_bucket{le="0.005",stage="inference"}',
                   'paperlane_pages_total{outcome="done",reason=""}', "paperlane_batch_size_count",
                   "paperlane_engine_pages_in_flight", 'paperlane_queue_depth{lane="batch"}',
                   'paperlane_queue_depth{lane="interactive"}'):
        assert series in text, series
    assert ("paperlane_gpu_" in text) is _gpu_here()  # without a GPU those series are absent, not zero


def test_a_hung_workers_page_is_taken_back_by_another(stack_factory: Callable[..., Stack], worker_factory,
                                                       tmp_path: Path) -> None:
    stack = stack_factory(WORKER__LEASE="2")
    engine = start_sim_engine(tmp_path / "engine", slots=4, latency=4.0)
    try:
        vllm = ("--engine", "vllm", "--engine-url", engine.url)
        producer = Producer(stack)
        [job_id] = producer.submit([7], Lane.BATCH)
        hung = worker_factory(stack, *vllm, name="hung")
        until(lambda: producer.rows([job_id])[job_id].status == "running", what="the page never started")
        view = json.loads(cli(stack, "status", "--json", job_id).stdout)
        assert view["worker"] and view["worker"].endswith(f":{hung.proc.pid}") and view["lease_until"]
        os.killpg(hung.proc.pid, signal.SIGSTOP)  # hung: alive, renewing nothing
        try:
            worker_factory(stack, *vllm, name="heir")
            [row] = producer.wait([job_id], timeout=60).values()
            assert row.status == JobStatus.SUCCEEDED.value and row.attempts == 2
            assert not row.worker.endswith(f":{hung.proc.pid}")  # type: ignore[union-attr]
        finally:
            os.killpg(hung.proc.pid, signal.SIGCONT)
    finally:
        engine.stop()


def test_a_page_whose_engine_call_hangs_is_let_go_and_fails_with_the_reason(stack_factory: Callable[..., Stack],
                                                                            worker_factory, tmp_path: Path) -> None:
    stack = stack_factory(WORKER__LEASE="1", WORKER__PAGE_TIMEOUT="1", WORKER__MAX_ATTEMPTS="2")
    engine = start_sim_engine(tmp_path / "engine", slots=4, latency=90.0)  # the engine never answers in time
    try:
        producer = Producer(stack)
        [job_id] = producer.submit([8], Lane.BATCH)
        worker = worker_factory(stack, "--engine", "vllm", "--engine-url", engine.url)
        [row] = producer.wait([job_id], timeout=60).values()
        assert row.status == JobStatus.FAILED.value and row.attempts == 2, (row.status, row.error)
        assert "stopped answering 2 times" in (row.error or "") and row.error_stage == "worker"
        assert worker.alive()
    finally:
        engine.stop()


def test_a_retried_page_takes_the_engines_answer_from_its_earlier_attempt(stack_factory: Callable[..., Stack],
                                                                          worker_factory, tmp_path: Path) -> None:
    import redis

    from paperlane.models.engine import EngineOutput
    from paperlane.schemas import Line
    from paperlane.storage.tables import JobRow
    from paperlane.workers.answers import EngineAnswers

    stack = stack_factory()
    engine = start_sim_engine(tmp_path / "engine", slots=4, latency=0.2)
    try:
        producer = Producer(stack)
        [job_id] = producer.submit([9], Lane.BATCH)
        with producer.db.session() as s:  # its first attempt died after the engine answered
            s.get(JobRow, job_id).attempts = 1  # type: ignore[union-attr]
        client = stack.broker()
        EngineAnswers(client).put(job_id, EngineOutput(text="kept answer", lines=[Line(text="kept answer")],
                                                       seconds=0.3))
        client.close()
        worker_factory(stack, "--engine", "vllm", "--engine-url", engine.url)
        [row] = producer.wait([job_id], timeout=60).values()
        assert row.status == JobStatus.SUCCEEDED.value and row.attempts == 2
        assert json.loads(producer.store.get(row.result_key))["text"] == "kept answer"  # type: ignore[arg-type]
        assert engine.stats(per_image=False)["requests"] == 0
    finally:
        engine.stop()
