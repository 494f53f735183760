"""Rendering is bounded: a PDF that hides a huge image where the page's objects do not show it, or that
draws for minutes or allocates gigabytes, fails alone with a reason; the worker's pool replaces the
process it killed, and every other page, batch or interactive, is prepared as before.

Real pieces (SQLite, the local store, the CPU pool's bounded processes, the micro-batcher); the engine
is the stand-in of ``test_page_failures``.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from paperlane.errors import InputError
from paperlane.priority.lanes import Lane
from paperlane.producer.input_items import Document
from paperlane.producer.submit import submit_documents
from paperlane.retry import Action
from paperlane.schemas import TaskSpec
from paperlane.settings import Settings, WorkerSettings
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.storage.tables import JobRow
from paperlane.bounded import BoundedPool, ProcessDied, TaskTimedOut
from paperlane.workers.pipeline import Runtime
from paperlane.workers.preprocess import prepare_page
from tests import hostile_pdfs
from tests.conftest import Stack, cli, wait_terminal
from tests.test_page_failures import StubEngine, attempt_until_settled, page
from tests.test_preprocess import VLM_SPEC, pdf_pages

BOMBS = {
    "annotation": (hostile_pdfs.annotation_bomb, r"^PDF page 1 holds an image too large in an annotation "
                                                 r"\(40000x40000 = 1600 MP, limit 150 MP\)$"),
    "pattern": (hostile_pdfs.pattern_bomb, r"^PDF page 1: the file holds an image too large to draw "
                                           r"\(40000x40000 = 1600 MP, limit 150 MP\)$"),
    "type3": (hostile_pdfs.type3_bomb, r"^PDF page 1: the file holds an image too large to draw"),
    "soft-mask": (hostile_pdfs.soft_mask_bomb, r"^PDF page 1: the file holds an image too large to draw"),
}
# A hostile page is told apart by which limit stops it (CPU, not wall-clock time): beside other tests on two cores,
# its process gets too little of a core for that to hold (scripts/test runs these alone).
pytestmark = pytest.mark.serial

TIMEOUT = 4.0
MEMORY = 256 << 20


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_an_image_hidden_from_the_page_objects_is_refused_before_pdfium_decodes_it(name: str) -> None:
    build, reason = BOMBS[name]
    with pytest.raises(InputError, match=reason):
        prepare_page(build(), VLM_SPEC)
    # The same drawings with an image of a sane size render.
    assert prepare_page(build(side=300), VLM_SPEC).width == 2479


def _square(x: int) -> int:
    return x * x


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _unpicklable() -> object:
    return lambda: None


def _abort() -> None:
    import os

    os.abort()


@pytest.mark.processes
def test_a_bounded_pool_fails_only_the_task_that_killed_its_process() -> None:
    pool = BoundedPool(1, name="test", memory_bytes=0, timeout=5.0)  # importing this module counts
    try:
        crashed, slow = pool.submit(_abort), pool.submit(_sleep, 30)
        odd, unsent = pool.submit(_unpicklable), pool.submit(_square, lambda: 1)
        after = [pool.submit(_square, i) for i in range(5)]
        with pytest.raises(ProcessDied, match=r"SIGABRT"):
            crashed.result(timeout=60)
        t0 = time.monotonic()
        with pytest.raises(TaskTimedOut, match=r"^ran longer than 15 s$"):  # no CPU used: the wall-clock limit
            slow.result(timeout=60)
        assert time.monotonic() - t0 < 25  # killed at its limit, not slept out
        for bad in (odd, unsent):  # a result or arguments that do not pickle: that task's error, no process lost
            with pytest.raises(Exception, match=r"pickle|lambda"):
                bad.result(timeout=60)
        assert [f.result(timeout=60) for f in after] == [0, 1, 4, 9, 16]
        assert pool.replaced == 2
    finally:
        pool.close()


@pytest.mark.processes
def test_a_stop_signalled_to_the_process_group_lets_a_pool_task_finish() -> None:
    # SIGTERM to the whole group (systemd's default stop, ``kill -- -PGID``): the parent stops gracefully, so a
    # pool process must not die mid-task (a document's outputs were recorded as failed, given up, on every such stop).
    pool = BoundedPool(1, name="test", memory_bytes=0, timeout=30.0)
    try:
        assert pool.submit(_square, 2).result(timeout=60) == 4  # started and initialised
        running = pool.submit(_sleep, 1.5)
        time.sleep(0.5)
        for sig in (signal.SIGTERM, signal.SIGINT):
            os.kill(pool.pids[0], sig)
        assert running.result(timeout=60) == 1.5
        assert pool.replaced == 0
    finally:
        pool.close()


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


@pytest.mark.processes
def test_the_time_limit_is_the_tasks_own_cpu_time() -> None:
    """A task waiting (on a read, or on a machine busy with others) is not killed at its CPU limit; one that
    computes past it is, as soon as it has."""
    pool = BoundedPool(1, name="test", memory_bytes=0, timeout=3.0)
    try:
        assert pool.submit(_square, 3).result(timeout=60) == 9  # the child imports this module here
        assert pool.submit(_sleep, 4.0).result(timeout=60) == 4.0  # past 3 s, but no CPU
        t0 = time.monotonic()
        with pytest.raises(TaskTimedOut, match=r"^used more than 3 s of CPU$"):
            pool.submit(_spin, 60.0).result(timeout=120)
        assert time.monotonic() - t0 < 30
        assert pool.replaced == 1
    finally:
        pool.close()


@pytest.fixture
def bounded_runtime(tmp_path: Path) -> Iterator[Runtime]:
    settings = Settings(data_dir=tmp_path / "data", worker=WorkerSettings(
        retry_backoff=0.0, preprocess_processes=1, urgent_processes=1, render_timeout=TIMEOUT,
        render_memory_bytes=MEMORY, batch_wait=0.05))
    rt = Runtime.start(settings, engine=StubEngine())  # type: ignore[arg-type]
    yield rt
    rt.close()


def _submit(rt: Runtime, name: str, data: bytes, *, lane: Lane = Lane.BATCH) -> JobRow:
    doc = Document(source=name, name=Path(name).stem, ext=Path(name).suffix, data=data, page_count=1)
    [submitted] = submit_documents([doc], db=rt.db, store=rt.store, spec=TaskSpec(), lane=lane)
    return jobstore.get_job(rt.db, submitted.job_id)


def _settle(rt: Runtime, job: JobRow) -> JobRow:
    outcome, decision = attempt_until_settled(rt, job)
    assert decision.action in (Action.DONE, Action.FAILED), decision
    return jobstore.get_job(rt.db, job.id)


HOSTILE: dict[str, tuple[Callable[[], bytes], str]] = {
    **{name: (build, reason) for name, (build, reason) in BOMBS.items()},
    "slow": (lambda: hostile_pdfs.tiling_bomb(0.03),
             rf"^preparing this page took longer than a worker gives one page: it used more than {TIMEOUT:g} s "
             r"of CPU$"),
    "memory": (lambda: hostile_pdfs.slow_page(22),
               r"^preparing this page crashed its process or needed more memory than a worker gives one page "
               r"\(256 MiB\); its process died \(SIG[A-Z]+\)$"),
}


@pytest.mark.processes
@pytest.mark.parametrize("lane", [Lane.BATCH, Lane.INTERACTIVE])
def test_hostile_pages_fail_alone_with_a_reason_and_the_worker_goes_on(bounded_runtime: Runtime,
                                                                      lane: Lane) -> None:
    rt = bounded_runtime
    jobs = {name: _submit(rt, f"{name}.pdf", build(), lane=lane) for name, (build, _) in HOSTILE.items()}
    good = [_submit(rt, f"good{i}.png", page(i + 1), lane=lane) for i in range(2)]
    good.append(_submit(rt, "good.pdf", pdf_pages((595, 842)), lane=lane))
    for name, job in jobs.items():
        row = _settle(rt, job)
        assert (row.status, row.error_stage, row.attempts) == ("failed", "preprocess", 1), (name, row.error)
        assert re.match(HOSTILE[name][1], row.error or ""), (name, row.error)
    for job in good:
        assert _settle(rt, job).status == "succeeded"
    assert rt.pool.replaced == 2  # the slow page's process, killed; the memory bomb's, dead
    assert rt.batcher.expected == 0


@pytest.mark.slow
def test_a_worker_fails_hostile_pdfs_alone_and_goes_on(stack_factory: Callable[..., Stack], worker_factory,
                                                       tmp_path: Path) -> None:
    stack = stack_factory(WORKER__RENDER_TIMEOUT=str(TIMEOUT), WORKER__RENDER_MEMORY_BYTES=str(MEMORY),
                          WORKER__PREPROCESS_PROCESSES="1", WORKER__URGENT_PROCESSES="1")
    files = {}
    for name, data in (("annotation.pdf", hostile_pdfs.annotation_bomb()), ("memory.pdf", hostile_pdfs.slow_page(22)),
                       ("slow.pdf", hostile_pdfs.tiling_bomb(0.03)), ("good.png", page(3)),
                       ("good-too.png", page(4))):
        files[name] = tmp_path / name
        files[name].write_bytes(data)
    worker = worker_factory(stack)
    batch = cli(stack, "submit", *(str(files[n]) for n in ("annotation.pdf", "memory.pdf", "good.png")))
    urgent = cli(stack, "submit", "--lane", "interactive", str(files["slow.pdf"]), str(files["good-too.png"]))
    assert batch.returncode == 0 and urgent.returncode == 0, batch.stderr + urgent.stderr
    ids = dict(zip(("annotation", "memory", "good", "slow", "good-too"), batch.stdout.split() + urgent.stdout.split()))
    db = Database(stack.settings.database_url)
    try:
        found = wait_terminal(db, list(ids.values()))
        rows = {name: found[job_id] for name, job_id in ids.items()}
    finally:
        db.dispose()
    for name in ("annotation", "memory", "slow"):
        row = rows[name]
        assert (row.status, row.error_stage, row.attempts) == ("failed", "preprocess", 1), (name, row.error)
        assert re.match(HOSTILE[name][1], row.error or ""), (name, row.error)
    assert rows["good"].status == rows["good-too"].status == "succeeded"
    assert worker.alive()
