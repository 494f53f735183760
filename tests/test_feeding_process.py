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


# --- paperlane run with several feeding processes (workers.run_feeders) ------------------------------------------

RUN_POOLS = {"WORKER__PREPROCESS_PROCESSES": "1", "WORKER__URGENT_PROCESSES": "1"}


def _run_config(stack_root: Path, **values: str) -> Path:
    config = stack_root / "run.env"
    config.write_text("".join(f"PAPERLANE_{k}={v}\n" for k, v in
                              {"DATA_DIR": str(stack_root / "data"), **RUN_POOLS, **values}.items()))
    return config


def _scans(folder: Path, n: int) -> Path:
    from tests.pages import tiny_page

    folder.mkdir()
    for i in range(n):
        (folder / f"p{i:02d}.png").write_bytes(tiny_page(i))
    return folder


def _run_args(config: Path, src: Path, out: Path, url: str) -> list[str]:
    from tests.conftest import PAPERLANE

    return [*PAPERLANE, "--config", str(config), "-v", "run", str(src), "--out", str(out), "--engine", "vllm",
            "--engine-url", url]


def _rows(config: Path) -> list[object]:
    from sqlalchemy import select

    from paperlane.settings import load_settings
    from paperlane.storage.db import Database
    from paperlane.storage.localfs import LocalStore
    from paperlane.storage.tables import JobRow

    db = Database(load_settings(config).database_url)
    try:
        with db.session() as s:
            return list(s.scalars(select(JobRow)).all())
    finally:
        db.dispose()


def _statuses(out: Path) -> list[str]:
    return [json.loads(p.read_text())["status"] for p in sorted(out.glob("p*.json"))]


@pytest.mark.parametrize("slots", [4, 32])
def test_a_run_with_two_feeding_processes_answers_every_page_once(tmp_path: Path, slots: int) -> None:
    import subprocess

    from tests.sim_engine import start_sim_engine

    # 4 slots each: neither feeding process can hold every page; 32: each could hold all 24, and still they share
    # them (the first one ready does not take every page before the other is up).
    config = _run_config(tmp_path, WORKER__FEEDERS="2", WORKER__SLOTS=str(slots))
    src, out = _scans(tmp_path / "scans", 24), tmp_path / "out"
    engine = start_sim_engine(tmp_path / "engine", slots=4, latency=0.3, scheduling_policy="priority")
    try:
        res = subprocess.run(_run_args(config, src, out, engine.url), capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
        stats = engine.stats()
    finally:
        engine.stop()
    assert _statuses(out) == ["succeeded"] * 24
    assert len(list(out.glob("p*.annotated.jpg"))) == 24  # written by the feeding processes
    # Each page reached the server once and was answered once.
    assert sorted(stats["per_image"].values()) == [1] * 24 and stats["completed"] == 24
    workers = [row.worker for row in _rows(config)]  # type: ignore[attr-defined]
    assert sorted(set(workers)) == ["run-feeder-1", "run-feeder-2"], workers  # both took pages
    assert min(workers.count("run-feeder-1"), workers.count("run-feeder-2")) >= 8, workers  # about half each
    assert "24 succeeded, 0 failed" in res.stdout


def _held_by_2_and_some_done(config: Path) -> bool:
    rows = _rows(config)
    return (any(r.worker == "run-feeder-2" and r.status == "running" for r in rows)  # type: ignore[attr-defined]
            and any(r.status == "succeeded" for r in rows))  # type: ignore[attr-defined]


def test_a_feeding_process_killed_mid_run_stops_the_run_and_the_next_run_loses_nothing(tmp_path: Path) -> None:
    import re
    import signal
    import subprocess

    from tests.conftest import until
    from tests.sim_engine import start_sim_engine

    n = 16
    config = _run_config(tmp_path, WORKER__FEEDERS="2", WORKER__SLOTS="3")
    src, log = _scans(tmp_path / "scans", n), tmp_path / "run.log"
    engine = start_sim_engine(tmp_path / "engine", slots=2, latency=1.0, scheduling_policy="priority")
    try:
        with log.open("wb") as sink:
            proc = subprocess.Popen(_run_args(config, src, tmp_path / "a", engine.url), stdout=sink,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                until(lambda: re.search(r"run-feeder-2 \(pid (\d+)\) ready", log.read_text()) is not None, timeout=120)
                # Killed while it holds a page, once some page is done (so that "nothing done twice" is tested).
                until(lambda: _held_by_2_and_some_done(config), timeout=60)
                pid = int(re.findall(r"run-feeder-2 \(pid (\d+)\) ready", log.read_text())[0])
                os.kill(pid, signal.SIGKILL)
                assert proc.wait(timeout=120) == 1
            finally:
                if proc.poll() is None:
                    proc.kill()
        text = log.read_text()
        assert re.search(r"feeding process run-feeder-2 \(pid \d+\) died \(killed by signal 9\) holding \d+ pages",
                         text), text[-3000:]
        rows = _rows(config)
        assert "running" not in {r.status for r in rows}  # type: ignore[attr-defined]  # its pages queued again
        done_first = sum(r.status == "succeeded" for r in rows)  # type: ignore[attr-defined]
        assert 0 < done_first < n
        until(lambda: engine.stats(per_image=False)["running"] == 0, timeout=30)
        asked_first = sum(engine.stats()["per_image"].values())

        res = subprocess.run(_run_args(config, src, tmp_path / "b", engine.url), capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
        assert _statuses(tmp_path / "b") == ["succeeded"] * n  # nothing lost
        # Nothing done twice: the second run asked the engine exactly for the pages the first did not finish.
        assert sum(engine.stats()["per_image"].values()) - asked_first == n - done_first
        assert {r.attempts for r in _rows(config)} == {1}  # type: ignore[attr-defined]  # the lost try not counted
    finally:
        engine.stop()


def test_paperlane_run_starts_feeders_for_an_engine_server_only(caplog: pytest.LogCaptureFixture) -> None:
    from paperlane.settings import EngineKind, EngineSettings, Settings
    from paperlane.workers.run_feeders import run_feeder_count

    def settings(kind: EngineKind, feeders: int | None = None) -> Settings:
        s = Settings()
        engine = EngineSettings(kind=kind, url="http://127.0.0.1:1/v1", model="m")
        return s.model_copy(update={"engine": engine, "worker": s.worker.model_copy(update={"feeders": feeders})})

    # An engine server: the rule of paperlane worker (one per 8 usable CPUs, 1 to 4; worker.feeders says).
    assert [run_feeder_count(settings(EngineKind.VLLM), cpus) for cpus in (2, 16, 64)] == [1, 2, 4]
    assert run_feeder_count(settings(EngineKind.VLLM, 3), 2) == 3
    # In the process (the model loaded again by each) or RapidOCR on the CPU: one, and a warning if more were asked.
    for kind in (EngineKind.VLLM_INPROCESS, EngineKind.TRANSFORMERS, EngineKind.RAPID):
        assert run_feeder_count(settings(kind), 64) == 1
        caplog.clear()
        assert run_feeder_count(settings(kind, 3), 64) == 1
        assert f"paperlane run keeps one feeding process for engine {kind.value}" in caplog.text


@pytest.mark.processes
def test_a_page_handed_to_a_feeding_process_that_just_died_goes_back_with_its_others(tmp_path: Path) -> None:
    # The run can hand a page to a feeding process killed since its last look (its sentinel not yet seen): the
    # pipe is broken. That page is the dead process's like the pages it held, not an exception that ends the run
    # without a word (the run exited 1 without its "died" line about once in 14 runs of the test above).
    import multiprocessing
    import time

    from paperlane.storage.db import Database
    from paperlane.storage.localfs import LocalStore
    from paperlane.workers.embedded import Handout
    from paperlane.workers.run_feeders import RunFeeders, _Feeder

    ctx = multiprocessing.get_context("spawn")
    inbox_r, inbox_w = ctx.Pipe(duplex=False)
    outbox_r, outbox_w = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=time.sleep, args=(60,))
    proc.start()
    outbox_w.close()
    feeder = _Feeder("run-feeder-1", proc, inbox_w, outbox_r, slots=2)
    db = Database(f"sqlite:///{tmp_path / 'run.db'}")
    db.upgrade()
    feeders = RunFeeders([feeder], db)
    page = next(iter(submit_documents(pages(1), db=db, store=LocalStore(tmp_path / "objects"), spec=TaskSpec())))
    try:
        proc.kill()
        proc.join()
        inbox_r.close()  # the dead process's end of its pipe: nothing reads it any more
        feeders.hand(Handout(page, "p1"))
        [(handout, reported)] = feeders.reports(timeout=5)
        assert handout.page.job_id == page.job_id and reported.lost
        assert feeders.broken is not None and "died (killed by signal 9) holding 1 pages" in feeders.broken
    finally:
        feeders.close()
