"""Redis Sentinel: a master killed mid-run loses no page; messages Redis lost are published again, at a cost
bounded by the pages asked about, not by the backlog."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import date, timedelta
from pathlib import Path

import pytest
import redis

from paperlane.priority import keys
from paperlane.priority.delayed import DelayedPages
from paperlane.priority.fair import FairLanes, Share
from paperlane.priority.lanes import Lane, broker_keys
from paperlane.priority.messages import page_job_id
from paperlane.retry import RetryPolicy
from paperlane.settings import WorkerSettings
from paperlane.storage import usage
from paperlane.storage.db import utcnow
from paperlane.storage.tables import JobRow
from paperlane.workers.leases import LeaseKeeper
from tests.conftest import Stack, until
from tests.sentinels import MASTER_NAME, SentinelGroup, start_sentinel_group
from tests.sim_engine import start_sim_engine
from tests.test_scheduling import Producer

pytestmark = pytest.mark.slow


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[SentinelGroup]:
    group = start_sentinel_group(tmp_path / "sentinels")
    yield group
    group.stop()


def test_a_master_killed_mid_run_loses_no_page(stack_factory: Callable[..., Stack], worker_factory,
                                               sentinel_group: SentinelGroup, tmp_path: Path) -> None:
    # Shorter than the defaults so the test waits seconds, not minutes: a page lost by the failover is published
    # again lost_after (default 120 s) after it went out, looked for every sweep_interval (60 s); an un-acked
    # message comes back after the visibility timeout (an hour).
    stack = stack_factory(REDIS__URL=sentinel_group.url, REDIS__MASTER_NAME=MASTER_NAME,
                          REDIS__VISIBILITY_TIMEOUT="30", WORKER__SWEEP_INTERVAL="5", WORKER__LOST_AFTER="15")
    engine = start_sim_engine(tmp_path / "engine", slots=4, latency=0.5)
    try:
        vllm = ("--engine", "vllm", "--engine-url", engine.url)
        producer = Producer(stack)
        ids = producer.submit(range(200), Lane.BATCH)
        started = time.monotonic()
        workers = [worker_factory(stack, *vllm, name=name) for name in ("a", "b")]

        def done() -> int:
            return sum(r.status in ("succeeded", "failed") for r in producer.rows(ids).values())
        until(lambda: done() >= 30, what="pages being worked on", timeout=180)
        done_at_kill, killed_at = done(), time.monotonic()
        old = sentinel_group.kill_master()
        new = sentinel_group.wait_failover(old)
        failover_s = time.monotonic() - killed_at
        rows = producer.wait(ids, timeout=300)
        recovered_s = time.monotonic() - killed_at
        calls = engine.requests()
    finally:
        engine.stop()
    per_page = Counter(c["image"] for c in calls if c["status"] == 200)
    lost = len(ids) - len(per_page)
    duplicated = sum(n - 1 for n in per_page.values())
    print(f"\nsentinel failover: {len(ids)} pages, master {old} killed {killed_at - started:.1f}s into the run "
          f"({done_at_kill} pages done), new master {new} after {failover_s:.1f}s, all pages done "
          f"{recovered_s:.1f}s after the kill; lost {lost}, duplicated {duplicated} (engine calls per page: "
          f"{dict(Counter(per_page.values()))})")
    assert all(r.status == "succeeded" for r in rows.values()), [r.error for r in rows.values() if r.error]
    assert lost == 0
    assert max(per_page.values()) <= 2, per_page.most_common(5)
    assert all(w.alive() for w in workers), [w.output()[-3000:] for w in workers]
    assert len(stack.keys("results/")) == len(ids)
    metered = usage.totals(usage.days(producer.db, since=date(2000, 1, 1), tenant_id=usage.NO_TENANT))
    assert (metered["pages_succeeded"], metered["pages_failed"]) == (len(ids), 0), metered
