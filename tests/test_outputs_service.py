"""``paperlane outputs`` (workers.outputs_service): a GPU worker run with ``worker.write_outputs`` false leaves a
finished document's outputs due; CPU-only services claim and write them, and /metrics says how many are due."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from paperlane.priority.messages import PageMessage
from paperlane.producer.submit import SubmittedPage, submit_documents
from paperlane.retry import Action, RetryPolicy
from paperlane.schemas import OutputFormat, TaskSpec
from paperlane.status import OutputsState
from paperlane.storage import outputs as recorded
from paperlane.storage.objects import document_key
from paperlane.storage.status_reads import get_document
from paperlane.workers.attempts import AttemptRunner
from paperlane.workers.outputs_pool import output_processes
from paperlane.workers.outputs_service import OutputsDue, OutputsService
from paperlane.workers.pipeline import Runtime
from tests.conftest import PAPERLANE
from tests.test_retry_path import FlakyEngine, pages, runtime_factory  # noqa: F401 (a fixture)

pytestmark = pytest.mark.processes  # the service's pool and `paperlane outputs` are processes


def _finished_by_a_gpu_worker(rt: Runtime, n: int) -> list[SubmittedPage]:
    """``n`` one-page documents done as a worker with ``write_outputs`` false does them: no outputs writer."""
    assert output_processes(rt.settings) == 0  # no output processes started for nothing
    runner = AttemptRunner(rt, RetryPolicy.of(rt.settings.worker), outputs=None)
    done = submit_documents(pages(n), db=rt.db, store=rt.store, spec=TaskSpec())
    for page in done:
        attempt = runner.run(PageMessage(job_id=page.job_id, lane=page.lane, message_priority=5))
        assert attempt is not None and attempt.decision.action is Action.DONE
        assert attempt.settled.outputs_due == (page.document_id,)  # due, and left for the service
    return done


def _written(rt: Runtime, page: SubmittedPage) -> bool:
    return get_document(rt.db, page.document_id).outputs == OutputsState.WRITTEN.value


def test_outputs_left_due_by_a_gpu_worker_are_written_by_the_service(runtime_factory) -> None:  # noqa: F811
    rt = runtime_factory(FlakyEngine(), WORKER__WRITE_OUTPUTS="false", WORKER__PREPROCESS_PROCESSES="1")
    done = _finished_by_a_gpu_worker(rt, 3)
    assert recorded.due_count(rt.db) == 3 and not any(_written(rt, p) for p in done)
    [family] = OutputsDue(rt.db).collect()
    assert family.samples[0].value == 3

    service = OutputsService(rt.settings, poll=0.05)
    thread = threading.Thread(target=service.run)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not all(_written(rt, p) for p in done) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        service.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert all(_written(rt, p) for p in done) and recorded.due_count(rt.db) == 0 and service.claimed == 3
    assert b"hello" in rt.store.get(document_key(done[0].document_id, OutputFormat.MD))


def test_paperlane_outputs_serves_its_metrics_writes_what_is_due_and_stops_on_sigterm(  # noqa: F811
        runtime_factory, tmp_path: Path) -> None:
    rt = runtime_factory(FlakyEngine(), WORKER__WRITE_OUTPUTS="false", WORKER__PREPROCESS_PROCESSES="0")
    [page] = _finished_by_a_gpu_worker(rt, 1)
    log = tmp_path / "outputs.log"
    proc = subprocess.Popen([*PAPERLANE, "--config", str(tmp_path / "paperlane.env"), "outputs"],
                            env={**_env(), "PAPERLANE_METRICS__PORT": "0"}, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not _written(rt, page) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert _written(rt, page), log.read_text()
        port = int(log.read_text().split("metrics on :", 1)[1].split("/", 1)[0])
        assert "paperlane_outputs_due 0.0" in httpx.get(f"http://127.0.0.1:{port}/metrics").text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PAPERLANE_")}
