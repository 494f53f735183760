"""Lanes, micro-batches and failures on real worker processes, Redis, Postgres and S3."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import date
from pathlib import Path

import pytest
import redis
from sqlalchemy import func, select

from paperlane.priority import keys
from paperlane.priority.broker import PagePublisher, make_celery
from paperlane.priority.lanes import Lane, broker_keys
from paperlane.priority.messages import PageMessage
from paperlane.producer.input_items import Document
from paperlane.producer.submit import submit_documents
from paperlane.schemas import TaskSpec
from paperlane.storage import ingests, usage
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.storage.objects import open_store
from paperlane.storage.tables import JobRow, ResultRow
from tests import services
from tests.conftest import Stack, WorkerProcess, until, wait_terminal
from tests.pages import tiny_page
from tests.sim_engine import start_sim_engine

pytestmark = pytest.mark.slow


class Producer:
    """Publishes pages through the real producer code, without a CLI process per call."""

    def __init__(self, stack: Stack) -> None:
        self.db = Database(stack.settings.database_url)
        self.db.upgrade()
        self.store = open_store(stack.settings)
        self.publisher = PagePublisher(make_celery(stack.settings))

    def submit(self, numbers: range | list[int], lane: Lane, *, level: int = 0) -> list[str]:
        docs = (Document(source=f"{lane.value}-{i}.png", name=f"{lane.value}-{i}", ext=".png", data=tiny_page(i),
                         page_count=1) for i in numbers)
        return [s.job_id for s in submit_documents(docs, db=self.db, store=self.store, spec=TaskSpec(), lane=lane,
                                                   priority=level, publisher=self.publisher)]

    def rows(self, ids: list[str]) -> dict[str, JobRow]:
        return {r.id: r for r in jobstore.get_jobs(self.db, ids)}

    def rows_ingest(self, job_id: str) -> str:
        """The ingest a job's page was registered in."""
        return ingests.owners(self.db, [job_id])[job_id].ingest_id

    def wait(self, ids: list[str], timeout: float = 240) -> dict[str, JobRow]:
        return wait_terminal(self.db, ids, timeout)


def test_interactive_overtakes_a_queued_backlog(stack_factory: Callable[..., Stack], worker_factory) -> None:
    stack = stack_factory(WORKER__BATCH_SIZE="4")
    producer = Producer(stack)
    batch = producer.submit(range(300), Lane.BATCH)
    worker_factory(stack)
    until(lambda: sum(r.status == "succeeded" for r in producer.rows(batch).values()) >= 8,
          what="the backlog being worked on")
    interactive = producer.submit(range(1000, 1003), Lane.INTERACTIVE)
    rows = producer.wait(interactive)
    assert all(r.status == "succeeded" for r in rows.values())
    all_rows = producer.rows(batch)
    for row in rows.values():
        # Batch pages that STARTED after this interactive page was published and before it started:
        # at most one the lane policy may owe batch, and one fetch already under way.
        overtaken_by = [b for b in all_rows.values()
                        if b.started_at and row.enqueued_at < b.started_at < row.started_at]
        assert len(overtaken_by) <= 2, len(overtaken_by)
    pending = sum(1 for b in all_rows.values() if b.status == "queued")
    assert pending > 100, "the backlog should still be mostly queued when interactive pages finish"


def test_batch_progresses_under_endless_interactive_traffic(stack_factory: Callable[..., Stack],
                                                           worker_factory) -> None:
    stack = stack_factory(WORKER__BATCH_SIZE="4", WORKER__BATCH_SHARE="0.25")
    producer = Producer(stack)
    batch = producer.submit(range(40), Lane.BATCH)
    stop = threading.Event()
    interactive: list[str] = []

    def flood() -> None:  # always keep far more interactive pages waiting than the worker can take
        n = 10_000
        flood_producer = Producer(stack)
        while not stop.is_set():
            waiting = sum(1 for r in flood_producer.rows(interactive[-60:]).values() if r.status == "queued")
            if waiting < 30:
                interactive.extend(flood_producer.submit(range(n, n + 20), Lane.INTERACTIVE))
                n += 20
            time.sleep(0.2)

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    until(lambda: len(interactive) >= 40, what="the interactive flood queued")
    worker_factory(stack)
    # The flood keeps interactive pages waiting all along; watch until 60 pages are done, whatever their lane.

    def done() -> tuple[int, int]:
        return (sum(1 for r in producer.rows(batch).values() if r.status == "succeeded"),
                sum(1 for r in producer.rows(interactive).values() if r.status == "succeeded"))
    until(lambda: sum(done()) >= 60 or done()[0] == len(batch), what="60 pages done under the flood", timeout=300,
          every=0.5)
    stop.set()
    thread.join()
    done_batch, done_interactive = done()
    assert done_interactive > 0
    share = done_batch / (done_batch + done_interactive)
    assert done_batch >= 5 and share >= 0.15, (done_batch, done_interactive)


def test_killed_worker_loses_no_page_and_duplicates_none(stack_factory: Callable[..., Stack], worker_factory,
                                                         tmp_path: Path) -> None:
    stack = stack_factory(REDIS__VISIBILITY_TIMEOUT="4")
    engine = start_sim_engine(tmp_path / "engine", slots=4, latency=0.3, scheduling_policy="priority")
    try:
        vllm = ("--engine", "vllm", "--engine-url", engine.url)
        producer = Producer(stack)
        ids = producer.submit(range(60), Lane.BATCH)
        first: WorkerProcess = worker_factory(stack, *vllm, name="doomed")
        deadline = time.monotonic() + 120
        while sum(r.status == "succeeded" for r in producer.rows(ids).values()) < 8:
            assert time.monotonic() < deadline, "worker made no progress"
            time.sleep(0.1)
        first.stop(signal.SIGKILL)  # mid-batch: pages in flight, un-acked
        in_flight = [r.id for r in producer.rows(ids).values() if r.status == "running"]
        assert in_flight, "the kill should have hit pages in progress"
        worker_factory(stack, *vllm, name="heir")
        rows = producer.wait(ids)
        calls = engine.requests()
    finally:
        engine.stop()
    assert all(r.status == "succeeded" for r in rows.values()), [r.error for r in rows.values() if r.error]
    assert any(rows[i].attempts >= 2 for i in in_flight)
    # What could go wrong is counted where it happens: the engine's own log of the calls it served.
    # Every page reached the engine; only pages the kill caught in progress may have reached it twice.
    per_page = Counter(c["image"] for c in calls if c["status"] == 200)
    assert len(per_page) == len(ids)
    assert sum(per_page.values()) - len(ids) <= len(in_flight), per_page.most_common(5)
    assert max(per_page.values()) <= 2
    with producer.db.session() as s:
        assert s.scalar(select(func.count()).select_from(ResultRow).where(ResultRow.job_id.in_(ids))) == len(ids)
    assert len(stack.keys("results/")) == len(ids)
    # Metered once per page, whatever the kill made run twice.
    metered = usage.totals(usage.days(producer.db, since=date(2000, 1, 1), tenant_id=usage.NO_TENANT))
    assert (metered["pages_succeeded"], metered["pages_failed"]) == (len(ids), 0), metered


@pytest.fixture
def private_s3(tmp_path: Path):
    svc = services.start_seaweedfs(tmp_path / "s3")
    yield svc
    svc.stop()


def _stop_s3(svc: services.Service) -> None:
    assert svc.proc is not None
    os.killpg(svc.proc.pid, signal.SIGKILL)
    svc.proc.wait()


def test_retry_then_success_and_retry_exhausted(stack_factory: Callable[..., Stack], worker_factory,
                                               private_s3: services.Service, tmp_path: Path) -> None:
    stack = stack_factory(s3_url=private_s3.url, WORKER__MAX_ATTEMPTS="4", WORKER__RETRY_BACKOFF="3")
    producer = Producer(stack)
    [recovers] = producer.submit([1], Lane.INTERACTIVE, level=2)
    _stop_s3(private_s3)  # the worker cannot fetch the original: retryable
    first = worker_factory(stack, name="doomed")
    broker = stack.broker()
    deadline = time.monotonic() + 60
    while not broker.zrange(keys.DELAYED, 0, -1):
        assert time.monotonic() < deadline, "no retry delayed"
        time.sleep(0.05)
    # The retry waits in Redis with its lane, priority and fair share, not in the worker: kill the worker meanwhile.
    [member] = broker.zrange(keys.DELAYED, 0, -1)
    delayed = PageMessage.parse(member)
    assert (delayed.job_id, delayed.lane, delayed.message_priority) == (recovers, Lane.INTERACTIVE, 2)
    assert delayed.share is not None and delayed.share.ingest == producer.rows_ingest(recovers)
    assert (producer.rows([recovers])[recovers].error or "").startswith("retrying")
    first.stop(signal.SIGKILL)
    restarted = services.start_seaweedfs(tmp_path / "s3", ports_from=private_s3)
    try:
        worker_factory(stack, name="heir")
        row = producer.wait([recovers], timeout=120)[recovers]
        assert row.status == "succeeded" and row.attempts == 2 and row.lane == "interactive"
        [doomed] = producer.submit([2], Lane.BATCH)
    finally:
        restarted.stop()
    row = producer.wait([doomed], timeout=180)[doomed]
    assert row.status == "failed" and row.attempts == 4
    assert "object store" in (row.error or "")
    assert broker.zcard(keys.DELAYED) == 0


def test_redis_work_grows_with_pages_not_with_time(stack_factory: Callable[..., Stack], worker_factory) -> None:
    # Sweeps every 2 s instead of 60, so a few seconds' watch sees several of them.
    stack = stack_factory(WORKER__SWEEP_INTERVAL="2")
    producer = Producer(stack)
    broker = stack.broker()
    worker_factory(stack)

    def commands() -> Counter[str]:
        return Counter({k: int(v["calls"]) for k, v in broker.info("commandstats").items() if k != "cmdstat_info"})

    def idle_window(seconds: float) -> Counter[str]:
        before = commands()
        time.sleep(seconds)
        return commands() - before

    # Idle, a worker's Redis traffic is a constant few commands a second: its consumer's blocking pop (one a second),
    # Celery's heartbeat (every 2 s), kombu's look for un-acked messages (every 10 s) and the sweep (a refill of each
    # lane's buffer, whose script reads the size of every lane list; and one SMISMEMBER of the queued pages published
    # long ago, none here: every sweep_interval). The worker's start-up traffic (its queues bound, scripts loaded) is
    # let pass first;
    # then two windows of 11 s each, longer than kombu's restore interval (10 s) and five sweeps.
    lists = len(broker_keys(Lane.BATCH)) + len(broker_keys(Lane.INTERACTIVE))
    sweep = ("llen", "hlen", "zcard", "hget", "lrange", "hvals", "zrange", "eval", "evalsha", "smismember")
    idle_window(4)
    first, second = idle_window(11), idle_window(11)
    for window in (first, second):
        # The sweeps happened in the window: it was long enough (each sweep's two refills read the size of their
        # lane's own priority lists, half of the lists).
        assert window["cmdstat_llen"] >= 4 * lists // 2, window
        rest = sum(window.values()) - sum(window[f"cmdstat_{c}"] for c in sweep)
        assert rest <= 11 * (1 + 0.5) + 10, window  # blocking pops, heartbeats, kombu's restore: not per tick
    assert sum(second.values()) <= sum(first.values()) * 1.5 + 10, (first, second)  # it does not grow with time
    ids = producer.submit(range(20), Lane.INTERACTIVE) + producer.submit(range(100, 120), Lane.BATCH)
    t0, started = commands(), time.monotonic()
    producer.wait(ids)
    window = commands() - t0
    # What the pages cost: the traffic while they ran, less the sweeps that ran meanwhile (one every 2 s, at what a
    # sweep costs idle) and what the worker sends idle besides over as long a time.
    elapsed = time.monotonic() - started
    per_second_sweeping = sum(first[f"cmdstat_{c}"] for c in sweep) / 11
    besides = (sum(first.values()) - per_second_sweeping * 11) / 11
    # A busy sweep also asks about pages queued for longer than lost_after (slow runs under load): their markers
    # (SMISMEMBER) and, for those in a buffer, the buffers (LRANGE): the sweep's, not the pages'.
    asked = window["cmdstat_smismember"] + window["cmdstat_lrange"]
    busy = sum(window.values()) - (per_second_sweeping + besides) * elapsed - asked
    # Per page: its pop, ack and task events, a lane change or two, and the refill of its lane's buffer after its
    # pop (one script of about twenty O(log n) commands inside Redis); never a poll per tick.
    assert busy < 40 * 35, (busy, window)
    # Still a plain Celery worker: remote control answers (what `celery inspect` and Flower use).
    ping = subprocess.run([sys.executable, "-m", "celery", "-A", "paperlane.priority.celery_app", "inspect", "ping",
                           "-t", "5"], capture_output=True, text=True, timeout=60,
                          env={**stack.env(), "PAPERLANE_REDIS__URL": stack.settings.redis.url,
                               "PAPERLANE_REDIS__KEY_PREFIX": stack.settings.redis.key_prefix}, cwd=stack.root)
    assert ping.returncode == 0 and "w1@test" in ping.stdout and "pong" in ping.stdout, ping.stdout + ping.stderr
