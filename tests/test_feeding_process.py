"""The process that feeds the engine does only feeding: a page's objects are drawn, serialised and stored on the CPU
pool, and a document's outputs are built, stored and recorded on processes of their own (``workers.outputs_pool``),
their failures a readable reason on that document; ``paperlane run`` copies its files out from there."""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

import pytest

from paperlane.priority.messages import PageMessage
from paperlane.producer.submit import SubmittedPage, submit_documents
from paperlane.retry import Action, RetryPolicy
from paperlane.schemas import OutputFormat, TaskSpec
from paperlane.storage import status_reads, views
from paperlane.storage.objects import ObjectStore, document_key
from paperlane.workers.attempts import AttemptRunner
from paperlane.workers.embedded import run_embedded
from paperlane.workers.outputs import DocumentOutputs
from paperlane.workers.pipeline import Runtime
from tests.test_retry_path import FlakyEngine, pages, runtime_factory  # noqa: F401 (a fixture)

pytestmark = pytest.mark.processes

POOLS = {"WORKER__PREPROCESS_PROCESSES": "1", "WORKER__URGENT_PROCESSES": "1", "WORKER__OUTPUT_PROCESSES": "1"}


def _note_pid(path: Path, store: ObjectStore, outputs: DocumentOutputs) -> None:
    path.write_text(f"{os.getpid()} {len(outputs.files)}")


def _done(rt: Runtime) -> SubmittedPage:
    """A page registered and attempted (prepared and stored on the pool); its document's outputs due, not written."""
    [page] = submit_documents(pages(1), db=rt.db, store=rt.store, spec=TaskSpec())
    runner = AttemptRunner(rt, RetryPolicy.of(rt.settings.worker), crash_limit=False)
    attempt = runner.run(PageMessage(job_id=page.job_id, lane=page.lane, message_priority=page.lane.base_priority))
    assert attempt is not None and attempt.decision.action is Action.DONE, attempt
    assert attempt.outcome.annotated is not None  # drawn on the pool, and asked back (as paperlane run does)
    assert json.loads(rt.store.get(f"results/{page.job_id}.json"))["timings"]["store"] > 0
    return page


def _outputs(rt: Runtime, document_id: str) -> dict[str, object]:
    return views.document_view(*status_reads.document_progress(rt.db, document_id))["outputs"]


def test_document_outputs_are_built_on_a_process_of_their_own(runtime_factory, tmp_path: Path) -> None:  # noqa: F811
    rt = runtime_factory(FlakyEngine(), **POOLS)
    page = _done(rt)
    noted = tmp_path / "pid"
    assert rt.outputs.write(page.document_id, then=partial(_note_pid, noted)).result(timeout=120) is True
    pid, files = map(int, noted.read_text().split())
    assert pid != os.getpid() and files >= 3  # JSON, markdown, the searchable PDF at least
    assert _outputs(rt, page.document_id)["state"] == "written"
    assert b"hello" in rt.store.get(document_key(page.document_id, OutputFormat.MD))
    # Written: not due again, nothing handed to the pool.
    assert rt.outputs.write(page.document_id).result(timeout=30) is False and rt.outputs.write_due() == 0


def test_outputs_whose_process_runs_past_its_limit_fail_with_a_reason(runtime_factory) -> None:  # noqa: F811
    # A millisecond of CPU: building a searchable PDF takes more, so its process is killed and replaced.
    rt = runtime_factory(FlakyEngine(), **POOLS, WORKER__PAGE_TIMEOUT="0.001")
    page = _done(rt)
    assert rt.outputs.write(page.document_id).result(timeout=120) is False
    state = _outputs(rt, page.document_id)
    assert state["state"] == "failed", state
    assert str(state["error"]).startswith("building this document's outputs crashed its process or ran past a "
                                          "worker's limits"), state


def test_paperlane_run_copies_outputs_written_on_the_pools(runtime_factory, tmp_path: Path) -> None:  # noqa: F811
    rt = runtime_factory(FlakyEngine(), **POOLS)
    summary = run_embedded(rt, pages(2), out_dir=tmp_path / "out", spec=TaskSpec())
    assert (summary.pages, summary.failed, summary.documents) == (2, 0, 2)
    for name in ("p0", "p1"):  # written by the time the run returns
        assert {p.name for p in (tmp_path / "out").glob(f"{name}.*")} >= {
            f"{name}.json", f"{name}.md", f"{name}.pdf", f"{name}.annotated.jpg"}


@pytest.mark.slow
def test_two_feeders_share_one_server_and_every_page_finishes_once(stack_factory, worker_factory,
                                                                   tmp_path: Path) -> None:
    from paperlane.priority.lanes import Lane
    from tests.conftest import until
    from tests.sim_engine import start_sim_engine
    from tests.test_scheduling import Producer

    # A few slots each, so that neither feeder can hold every page at once.
    stack = stack_factory(WORKER__FEEDERS="2", WORKER__PREPROCESS_PROCESSES="1", WORKER__URGENT_PROCESSES="1",
                          WORKER__OUTPUT_PROCESSES="1", WORKER__SLOTS="6")
    engine = start_sim_engine(tmp_path / "engine", slots=4, latency=0.3)
    try:
        worker = worker_factory(stack, "--engine", "vllm", "--engine-url", engine.url)
        until(lambda: worker.output().count("ready.") == 2, timeout=120)  # both feeders consume
        producer = Producer(stack)
        ids = producer.submit(range(40), Lane.BATCH)
        rows = producer.wait(ids, timeout=180)
        assert {row.status for row in rows.values()} == {"succeeded"}
        assert len({row.worker for row in rows.values()}) == 2  # both feeding processes took pages
        stats = engine.stats()
        # Each page reached the server's queue once and was answered once (a refused request never reaches it).
        assert sorted(stats["per_image"].values()) == [1] * len(ids) and stats["completed"] == len(ids)
        assert worker.alive()
    finally:
        engine.stop()


def test_the_default_number_of_feeders_follows_the_hosts_cpus() -> None:
    from paperlane.settings import Settings
    from paperlane.workers.feeders import feeder_count, feeder_settings

    settings = Settings()
    assert [feeder_count(settings, cpus) for cpus in (2, 8, 16, 31, 64, 256)] == [1, 1, 2, 3, 4, 4]
    assert feeder_count(settings.model_copy(update={"worker": settings.worker.model_copy(update={"feeders": 3})}),
                        2) == 3
    second = feeder_settings(settings.model_copy(update={"metrics": settings.metrics.model_copy(
        update={"port": 9100})}), 1, 2, cpus=16)
    assert second.worker.preprocess_processes == 7 and second.metrics.port == 9101  # half the CPUs, less its own


def test_a_pool_runs_tasks_marked_first_before_those_waiting_in_turn() -> None:
    import time

    from paperlane.bounded import BoundedPool

    pool = BoundedPool(1, name="order", memory_bytes=0, timeout=30)
    try:
        busy = pool.submit(time.sleep, 0.5)  # holds the one process while the others queue
        in_turn = [pool.submit(time.monotonic) for _ in range(2)]
        first = pool.submit(time.monotonic, first=True)  # a page's objects: before pages still to be prepared
        busy.result(timeout=30)
        assert first.result(timeout=30) < min(f.result(timeout=30) for f in in_turn)
        assert in_turn[0].result() < in_turn[1].result()  # each kind in the order submitted
    finally:
        pool.close()
