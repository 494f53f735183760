"""Redis Sentinel: a master killed mid-run loses no page; messages Redis lost are published again, at a cost
bounded by the pages asked about, not by the backlog."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import date
from pathlib import Path

import pytest
import redis
from pydantic import ValidationError

from paperlane.priority import keys
from paperlane.priority.delayed import DelayedPages
from paperlane.priority.fair import FairLanes
from paperlane.priority.lanes import Lane, broker_keys
from paperlane.priority.messages import page_job_id
from paperlane.retry import RetryPolicy
from paperlane.settings import RedisSettings, WorkerSettings
from paperlane.storage import usage
from paperlane.workers.leases import LeaseKeeper
from tests.conftest import Stack, until
from tests.sentinels import (MASTER_NAME, SentinelGroup, fill_backlog, published_long_ago,
                             start_sentinel_group)
from tests.sim_engine import start_sim_engine
from tests.test_scheduling import Producer

pytestmark = pytest.mark.slow


def test_a_sentinel_url_lists_only_sentinels() -> None:
    cfg = RedisSettings(url="sentinel://10.0.0.1:26379;sentinel://10.0.0.2/1")
    assert cfg.sentinels == [("10.0.0.1", 26379), ("10.0.0.2", 26379)]
    assert RedisSettings().sentinels == []
    with pytest.raises(ValidationError, match="lists only Sentinels"):
        RedisSettings(url="sentinel://10.0.0.1:26379;redis://10.0.0.2:6379/0")


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
    engine = start_sim_engine(tmp_path / "engine", slots=2, latency=0.5)  # 4 pages/s: a run of 50 s
    try:
        vllm = ("--engine", "vllm", "--engine-url", engine.url)
        producer = Producer(stack)
        ids = producer.submit(range(200), Lane.BATCH)
        started = time.monotonic()
        workers = [worker_factory(stack, *vllm, name=name) for name in ("a", "b")]

        def done() -> int:
            return sum(r.status in ("succeeded", "failed") for r in producer.rows(ids).values())
        until(lambda: done() >= 30, what="pages being worked on", timeout=180)
        old = sentinel_group.kill_master()
        done_at_kill, killed_at = done(), time.monotonic()
        assert done_at_kill <= len(ids) - 50, "the master should die mid-run"
        new = sentinel_group.wait_failover(old)
        failover_s = time.monotonic() - killed_at
        rows = producer.wait(ids, timeout=300)
        recovered_s = time.monotonic() - killed_at
        # The new master had none of the scripts: each answered NOSCRIPT once and was loaded again.
        reloaded = redis.Redis(port=new).info("errorstats").get("errorstat_NOSCRIPT", {}).get("count", 0)
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
    assert reloaded > 0
    assert max(per_page.values()) <= 2, per_page.most_common(5)
    assert all(w.alive() for w in workers), [w.output()[-3000:] for w in workers]
    assert len(stack.keys("results/")) == len(ids)
    metered = usage.totals(usage.days(producer.db, since=date(2000, 1, 1), tenant_id=usage.NO_TENANT))
    assert (metered["pages_succeeded"], metered["pages_failed"]) == (len(ids), 0), metered


def _remove_by_hand(client: redis.Redis, job_ids: set[str]) -> None:
    """What a write lost at a failover leaves: the pages' messages gone from the lane, and their markers with them
    (one script wrote both)."""
    for key in broker_keys(Lane.BATCH):
        for raw in client.lrange(key, 0, -1):
            if page_job_id(raw) in job_ids:
                client.lrem(key, 1, raw)
    for key in client.keys(keys.fair(Lane.BATCH.value).ingest_prefix + "*"):
        for member in client.zrange(key, 0, -1):  # "<job id>\n<message>"
            if member.split(b"\n", 1)[0].decode() in job_ids:
                client.zrem(key, member)
    client.srem(keys.PRESENT, *job_ids)


def _cost(client: redis.Redis, action: Callable[[], object]) -> tuple[int, int]:
    """Redis commands run and bytes Redis sent while ``action`` ran (two INFO calls included, the same each time)."""
    def reading() -> tuple[int, int]:
        calls = sum(int(v["calls"]) for v in client.info("commandstats").values())
        return calls, int(client.info("stats")["total_net_output_bytes"])
    (calls, sent), _, (calls_after, sent_after) = reading(), action(), reading()
    return calls_after - calls, sent_after - sent


def test_messages_lost_by_hand_are_published_again_at_a_cost_the_backlog_does_not_change(
        stack_factory: Callable[..., Stack]) -> None:
    stack = stack_factory()
    producer = Producer(stack)
    ids = producer.submit(range(40), Lane.BATCH)
    published_long_ago(producer.db, ids)
    client = stack.broker()
    # Marked present while they wait by fair share; those moved onto the lane's buffer no longer.
    assert client.scard(keys.PRESENT) == len(ids) - stack.settings.fair_share.buffer
    keeper = LeaseKeeper(producer.db, DelayedPages(client), client, WorkerSettings(lost_check_pages=100),
                         RetryPolicy(), worker="w")
    try:
        keeper.sweep()  # its scripts loaded (a first EVALSHA answers NOSCRIPT)
        small = _cost(client, keeper.sweep)
        assert client.zcard(keys.DELAYED) == 0  # nothing lost, nothing published
        fill_backlog(client, FairLanes(client).waiting(Lane.BATCH)[0], 20_000)
        large = _cost(client, keeper.sweep)
        waiting = sum(len(m) for m in FairLanes(client).waiting(Lane.BATCH))
        print(f"\none sweep with {len(ids)} pages waiting: {small[0]} commands, {small[1]} bytes read; with "
              f"{len(ids) + 20_000} ({waiting} bytes of messages): {large[0]} commands, {large[1]} bytes read")
        # The same commands; the bytes differ only by the INFO replies' own length.
        assert large[0] <= small[0] and large[1] <= small[1] + 1024, (small, large)
        assert waiting > 1000 * large[1]
        lost = set(ids[5:8])
        _remove_by_hand(client, lost)
        keeper.sweep()
        assert {m.decode().split()[0] for m in client.zrange(keys.DELAYED, 0, -1)} == lost
        keeper.sweep()  # marked present again (delayed): not published twice
        assert client.zcard(keys.DELAYED) == len(lost)
    finally:
        keeper.stop()
