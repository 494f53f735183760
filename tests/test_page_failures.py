"""A page whose processing raises something unexpected ends ``failed`` with a one-line reason; its row
is never left ``running``, the micro-batcher's count of pages on their way is back to zero, and the
next page is not held up waiting for a page that is not coming.

Real pieces throughout (SQLite, the local store, the CPU pool's own process, the micro-batcher, the
embedded runner; a real worker for the last test); only the engine, a boundary, is a stand-in here,
so that it can fail the ways a GPU engine does.
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image

from paperlane.errors import INTERNAL_REASON
from paperlane.models.engine import Capacity, EngineOutput, EngineRequest, Outcome
from paperlane.producer.input_items import Document
from paperlane.producer.submit import submit_documents
from paperlane.retry import Action, Decision, RetryPolicy
from paperlane.schemas import EngineInfo, JobStatus, Line, TaskSpec
from paperlane.settings import Settings, WorkerSettings
from paperlane.storage import jobs as jobstore
from paperlane.storage.tables import JobRow
from paperlane.workers.attempts import settle
from paperlane.workers.embedded import run_embedded
from paperlane.workers.pipeline import PageOutcome, Runtime, process_page
from tests.conftest import Stack, cli, wait_terminal
from tests.pages import prepare, render_page, sample_lines
from tests.test_preprocess import VLM_SPEC, very_wide_tiff

# Long enough that a batch left waiting for a page that is not coming shows in a page's time.
BATCH_WAIT = 4.0


@dataclass
class Raise:
    """A fault the stub engine raises: the whole batch fails, as when a real engine's call does."""

    exc: BaseException


class StubEngine:
    """A GPU engine stand-in: one line per page, or ``faults[h]`` for a page prepared ``h`` px tall:
    returned as that page's outcome, or raised for its batch when it is a ``Raise``."""

    def __init__(self, faults: dict[int, object] | None = None) -> None:
        self.faults = faults or {}

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(name="stub", version="0")

    @property
    def input_spec(self) -> object:
        return VLM_SPEC

    @property
    def capacity(self) -> Capacity:
        return Capacity(batch_size=4, batches_in_flight=1)

    def start(self) -> None:
        pass

    def infer(self, requests: Sequence[EngineRequest]) -> list[Outcome]:
        outcomes = []
        for req in requests:
            fault = self.faults.get(req.image.height)
            if isinstance(fault, Raise):
                raise fault.exc
            line = Line(text="paid", quad=[(10.0, 10.0), (90.0, 10.0), (90.0, 30.0), (10.0, 30.0)])
            outcomes.append(fault if fault is not None else EngineOutput(text="paid", lines=[line]))
        return outcomes  # type: ignore[return-value]

    def close(self) -> None:
        pass


def page(lines: int) -> bytes:
    """A page whose prepared height depends on ``lines``: the stub engine tells pages apart by it."""
    return render_page(sample_lines(lines, n=lines))


def height(data: bytes) -> int:
    return prepare(data, VLM_SPEC).height


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Callable[[StubEngine], Runtime]]:
    started: list[Runtime] = []

    def start(engine: StubEngine) -> Runtime:
        settings = Settings(data_dir=tmp_path / "data", worker=WorkerSettings(
            batch_wait=BATCH_WAIT, retry_backoff=0.0, preprocess_processes=1))
        started.append(Runtime.start(settings, engine=engine))  # type: ignore[arg-type]
        return started[-1]

    yield start
    for rt in started:
        rt.close()


def submit(rt: Runtime, *pages: tuple[str, bytes]) -> list[JobRow]:
    inputs = (Document(source=name, name=Path(name).stem, ext=Path(name).suffix, data=data, page_count=1)
              for name, data in pages)
    return [jobstore.get_job(rt.db, s.job_id) for s in submit_documents(inputs, db=rt.db, store=rt.store,
                                                                        spec=TaskSpec())]


def attempt_until_settled(rt: Runtime, job: JobRow) -> tuple[PageOutcome, Decision]:
    """What a runner does with a page: attempts under the retry rules until it is done or failed."""
    while True:
        started = jobstore.start_attempt(rt.db, job.id, policy=None)
        assert started is not None
        outcome = process_page(rt, started)
        decision = settle(rt.db, outcome, RetryPolicy.of(rt.settings.worker)).decision
        if decision.action is not Action.RETRY:
            return outcome, decision


def assert_next_page_not_delayed(rt: Runtime) -> None:
    assert rt.batcher.expected == 0  # no page announced that will never come
    [good] = submit(rt, ("next.png", page(1)))
    t0 = time.monotonic()
    outcome, decision = attempt_until_settled(rt, good)
    assert outcome.ok and decision.action is Action.DONE
    assert time.monotonic() - t0 < BATCH_WAIT / 2  # its batch did not wait for a page that failed


@pytest.mark.processes
@pytest.mark.parametrize("fault, reason, stage, attempts", [
    (Raise(MemoryError()), "not enough memory to process this page", "inference", 3),  # retried: memory may free up
    (Raise(RuntimeError("engine bug")), INTERNAL_REASON, "inference", 1),
    (MemoryError(), "not enough memory to process this page", "inference", 3),  # one page's outcome, not raised
    ("not an outcome", INTERNAL_REASON, "inference", 1),
    (EngineOutput(text="x", lines=["not a line"]), INTERNAL_REASON, "postprocess", 1),  # type: ignore[list-item]
], ids=["raises-memory-error", "raises-a-bug", "returns-memory-error", "returns-garbage", "garbage-in-a-result"])
def test_an_engine_fault_fails_the_page_with_a_reason(runtime: Callable[[StubEngine], Runtime], fault: object,
                                                      reason: str, stage: str, attempts: int,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    data = page(2)
    rt = runtime(StubEngine({height(data): fault}))
    [job] = submit(rt, ("bad.png", data))
    with caplog.at_level(logging.INFO):
        outcome, decision = attempt_until_settled(rt, job)
    assert decision.action is Action.FAILED and outcome.result.error == reason
    row = jobstore.get_job(rt.db, job.id)
    assert (row.status, row.error, row.error_stage, row.attempts) == ("failed", reason, stage, attempts)
    if reason == INTERNAL_REASON:  # the details are in the log, not in the row
        assert "unexpected error" in caplog.text or "the engine returned str" in caplog.text
    assert_next_page_not_delayed(rt)


@pytest.mark.processes
def test_a_page_opencv_refuses_in_the_pool_fails_and_the_next_page_is_not_delayed(
        runtime: Callable[[StubEngine], Runtime]) -> None:
    rt = runtime(StubEngine())
    [job] = submit(rt, ("wide.tif", very_wide_tiff()))
    outcome, decision = attempt_until_settled(rt, job)
    assert decision.action is Action.FAILED
    row = jobstore.get_job(rt.db, job.id)
    assert row.status == "failed" and row.error_stage == "preprocess" and row.attempts == 1
    assert row.error.startswith("cannot decode this image (OpenCV: ") and "\n" not in row.error
    assert_next_page_not_delayed(rt)


@pytest.mark.processes
def test_a_run_with_misbehaving_pages_reports_each_and_finishes(runtime: Callable[[StubEngine], Runtime],
                                                                 tmp_path: Path) -> None:
    memory, garbage, good = page(2), page(3), page(4)
    # Faults of single pages (a batch that raises fails all its pages, whichever they are).
    rt = runtime(StubEngine({height(memory): MemoryError(), height(garbage): "not an outcome"}))
    inputs = [Document(source=name, name=name, ext=ext, data=data, page_count=1) for name, data, ext in (
        ("wide", very_wide_tiff(), ".tif"), ("memory", memory, ".png"), ("garbage", garbage, ".png"),
        ("good", good, ".png"), ("good-too", page(5), ".png"))]
    out = tmp_path / "out"
    summary = run_embedded(rt, inputs, out_dir=out, spec=TaskSpec())
    assert (summary.pages, summary.failed) == (5, 3)
    results = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert {name: r["status"] for name, r in results.items()} == {
        "wide": "failed", "memory": "failed", "garbage": "failed", "good": "succeeded", "good-too": "succeeded"}
    assert results["memory"]["error"] == "not enough memory to process this page"
    assert results["garbage"]["error"] == INTERNAL_REASON
    assert results["wide"]["error"].startswith("cannot decode this image (OpenCV: ")
    assert sorted(p.name for p in out.glob("*.jpg")) == ["good-too.annotated.jpg", "good.annotated.jpg"]
    rows = jobstore.get_jobs(rt.db, [r["job_id"] for r in results.values()])
    assert sorted(row.status for row in rows) == ["failed"] * 3 + ["succeeded"] * 2
    assert rt.batcher.expected == 0


@pytest.mark.slow
def test_a_worker_fails_a_page_opencv_refuses_and_goes_on(stack: Stack, worker_factory, tmp_path: Path) -> None:
    wide = tmp_path / "wide.ppm"  # a .ppm is stored as it is (a .tif would be re-encoded page by page)
    buf = io.BytesIO()
    Image.new("L", (2_000_000, 1), 128).save(buf, format="PPM")
    wide.write_bytes(buf.getvalue())
    good = tmp_path / "good.png"
    good.write_bytes(render_page(sample_lines(9)))
    worker = worker_factory(stack)
    res = cli(stack, "submit", str(wide), str(good))
    assert res.returncode == 0, res.stderr
    wide_id, good_id = res.stdout.split()
    from paperlane.storage.db import Database

    db = Database(stack.settings.database_url)
    try:
        rows = wait_terminal(db, [wide_id, good_id])
    finally:
        db.dispose()
    assert rows[wide_id].status == JobStatus.FAILED.value and rows[wide_id].error_stage == "preprocess"
    assert rows[wide_id].error.startswith("cannot decode this image (OpenCV: ")
    assert rows[good_id].status == JobStatus.SUCCEEDED.value and rows[good_id].result_key
    assert worker.alive()
