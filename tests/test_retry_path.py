"""The retry path around one attempt, with a stub engine (the engine is the boundary) and everything else real:
the embedded runner's pages, SQLite rows, the local object store, the CPU pool in-process."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from paperlane.errors import EngineOutputError, EngineUnavailable
from paperlane.models.engine import Capacity, EngineOutput, EngineRequest, InputSpec, Outcome
from paperlane.priority.lanes import Lane
from paperlane.producer.input_items import Document
from paperlane.schemas import EngineInfo, JobStatus, Line, TaskSpec
from paperlane.settings import load_settings
from paperlane.storage import jobs as jobstore
from paperlane.workers.embedded import run_embedded
from paperlane.workers.pipeline import Runtime
from tests.pages import render_page, sample_lines


class FlakyEngine:
    """Answers every page with one line, after refusing the first ``down_for`` calls as unreachable."""

    def __init__(self, *, down_for: int = 0, permanent: bool = False) -> None:
        self.down_for = down_for
        self.permanent = permanent
        self.calls = 0
        self._lock = threading.Lock()

    info = EngineInfo(name="flaky", version="0")
    input_spec = InputSpec(max_side=800, grayscale=True)
    capacity = Capacity()

    def start(self) -> None:
        pass

    def infer(self, requests: Sequence[EngineRequest]) -> list[Outcome]:
        with self._lock:
            self.calls += 1
            down = self.calls <= self.down_for
        if self.permanent:
            return [EngineOutputError("the engine's answer is unusable", stage="inference") for _ in requests]
        if down:
            return [EngineUnavailable("engine unreachable (stub)", stage="inference") for _ in requests]
        return [EngineOutput(text="hello", lines=[Line(text="hello", quad=[(1, 1), (9, 1), (9, 5), (1, 5)])])
                for _ in requests]

    def close(self) -> None:
        pass


@pytest.fixture
def runtime_factory(tmp_path: Path) -> Iterator:
    started: list[Runtime] = []

    def make(engine: FlakyEngine, **overrides: str) -> Runtime:
        values = {"DATA_DIR": str(tmp_path / "data"), "WORKER__PREPROCESS_PROCESSES": "0",
                  "WORKER__RETRY_BACKOFF": "0.2", **overrides}
        config = tmp_path / "paperlane.env"
        config.write_text("".join(f"PAPERLANE_{k}={v}\n" for k, v in values.items()))
        rt = Runtime.start(load_settings(config), engine=engine)
        started.append(rt)
        return rt

    yield make
    for rt in started:
        rt.close()


def pages(n: int) -> list[Document]:
    return [Document(source=f"p{i}.png", name=f"p{i}", ext=".png", data=render_page(sample_lines(i, 2)), page_count=1)
            for i in range(n)]


def test_a_retryable_failure_is_retried_off_its_slot_then_succeeds(runtime_factory, tmp_path: Path) -> None:
    engine = FlakyEngine(down_for=2)
    rt = runtime_factory(engine, WORKER__MAX_ATTEMPTS="3")
    summary = run_embedded(rt, pages(1), out_dir=tmp_path / "out", spec=TaskSpec(), lane=Lane.BATCH)
    assert summary.pages == 1 and summary.failed == 0
    [job] = jobstore.get_jobs(rt.db, [_only_job_id(tmp_path)])
    assert job.status == JobStatus.SUCCEEDED.value and job.attempts == 3 and job.error is None
    assert engine.calls == 3
    assert rt.batcher.expected == 0


def test_retries_run_out_and_the_page_fails_with_the_reason(runtime_factory, tmp_path: Path) -> None:
    engine = FlakyEngine(down_for=99)
    rt = runtime_factory(engine, WORKER__MAX_ATTEMPTS="2")
    summary = run_embedded(rt, pages(2), out_dir=tmp_path / "out", spec=TaskSpec())
    assert summary.failed == 2
    rows = jobstore.get_jobs(rt.db, _job_ids(tmp_path))
    assert {(r.status, r.attempts, r.error) for r in rows} == {("failed", 2, "engine unreachable (stub)")}
    assert engine.calls == 4 and rt.batcher.expected == 0


def test_a_permanent_failure_is_not_retried(runtime_factory, tmp_path: Path) -> None:
    engine = FlakyEngine(permanent=True)
    rt = runtime_factory(engine, WORKER__MAX_ATTEMPTS="3")
    summary = run_embedded(rt, pages(1), out_dir=tmp_path / "out", spec=TaskSpec())
    assert summary.failed == 1 and engine.calls == 1
    [row] = jobstore.get_jobs(rt.db, _job_ids(tmp_path))
    assert row.attempts == 1 and row.error == "the engine's answer is unusable" and row.error_stage == "inference"


def _job_ids(tmp_path: Path) -> list[str]:
    import json

    return [json.loads(p.read_text())["job_id"] for p in sorted((tmp_path / "out").glob("*.json"))]


def _only_job_id(tmp_path: Path) -> str:
    [job_id] = _job_ids(tmp_path)
    return job_id
