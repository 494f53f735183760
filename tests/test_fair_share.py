"""Fair share within a lane (``priority.fair``): its scripts on a real Redis, then through Celery's own publish and
pop, then a worker that serves a small batch behind a large backlog."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import date
from pathlib import Path

import pytest
import redis

from paperlane.priority import keys, presence
from paperlane.priority.broker import BATCH, PagePublisher, make_celery
from paperlane.priority.fair import FairLanes, Share
from paperlane.priority.keyspace import prefix_of
from paperlane.priority.lanes import Lane, broker_keys
from paperlane.priority.messages import JOB_HEADER, PageMessage, page_job_id
from paperlane.producer.input_items import Document
from paperlane.producer.submit import submit_documents
from paperlane.schemas import TaskSpec
from paperlane.settings import FairShareSettings, RedisSettings, Settings
from paperlane.storage import ingests, tenants, usage
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.storage.objects import open_store
from tests.conftest import Stack, until, wait_terminal
from tests.pages import tiny_page
from tests.services import Service
from tests.sim_engine import start_sim_engine


@pytest.fixture
def broker(redis_client: redis.Redis) -> redis.Redis:
    return redis_client


class Lanes:
    """The scripts as producers and workers run them: ``put`` publishes, ``pop`` is a worker's BRPOP plus its refill."""

    def __init__(self, client: redis.Redis, buffer: int = 1) -> None:
        self.client = client
        self.fair = FairLanes(client, buffer=buffer)

    def put(self, tenant: str, ingest: str, n: int, *, lane: Lane = Lane.BATCH, priority: int = 5,
            tenant_weight: float = 1.0, ingest_weight: float = 1.0, start: int = 0) -> None:
        share = Share(tenant, ingest, tenant_weight, ingest_weight)
        for i in range(start, start + n):
            self.fair.put(lane, f"{tenant}/{ingest}/{priority}/{i}", priority, share)

    def pop(self, lane: Lane = Lane.BATCH) -> str | None:
        popped = self.client.brpop(broker_keys(lane), timeout=0.01)  # the lane's lists, priority 0 first
        if popped is None:
            return None
        self.fair.refill(lane)
        return str(popped[1].decode())

    def take(self, n: int, lane: Lane = Lane.BATCH) -> list[str]:
        return [m for m in (self.pop(lane) for _ in range(n)) if m is not None]


def owners(messages: list[str], depth: int = 1) -> Counter[str]:
    return Counter("/".join(m.split("/")[:depth]) for m in messages)


def test_two_tenants_share_equally_and_a_late_one_gets_its_share_at_once(broker: redis.Redis) -> None:
    lanes = Lanes(broker)
    lanes.put("A", "a1", 1000)
    assert owners(lanes.take(50)) == {"A": 50}  # alone, A has the whole lane
    lanes.put("B", "b1", 20)
    # B arrives behind 950 of A's pages and is served from the next pick on, turn about with A.
    nxt = lanes.take(40)
    assert nxt[0].startswith("A/")  # the one already in the buffer (of size 1)
    assert owners(nxt[1:]) == {"A": 20, "B": 19}
    assert owners(lanes.take(10)) == {"A": 9, "B": 1}  # B done: A alone again, nothing lost or doubled
    assert broker.hget(keys.fair("batch").state, "held") == b"919"  # 1020 put, 100 taken, 1 in the buffer


def test_weights_set_the_shares(broker: redis.Redis) -> None:
    lanes = Lanes(broker)
    lanes.put("A", "a1", 400, tenant_weight=3)
    lanes.put("B", "b1", 400)
    assert owners(lanes.take(400)) == {"A": 300, "B": 100}


def test_a_tenants_ingests_share_its_share(broker: redis.Redis) -> None:
    lanes = Lanes(broker)
    lanes.put("A", "archive", 1000)
    lanes.put("B", "b1", 1000)
    lanes.take(10)
    lanes.put("A", "nightly", 1000)  # a second ingest of A: half of A's half
    got = owners(lanes.take(400), depth=2)
    assert got == {"B/b1": 200, "A/archive": 100, "A/nightly": 100}, got
    lanes.put("A", "urgent", 1000, ingest_weight=2)  # an ingest given weight 2: twice its sibling's share
    got = owners(lanes.take(400), depth=2)
    assert got == {"B/b1": 200, "A/urgent": 100, "A/archive": 50, "A/nightly": 50}, got


def test_priorities_within_an_ingest_keep_their_order(broker: redis.Redis) -> None:
    lanes = Lanes(broker)
    lanes.put("A", "a1", 5, priority=9)
    lanes.put("A", "a1", 5, priority=6, start=100)
    lanes.put("A", "a1", 5, priority=9, start=200)
    got = lanes.take(15)
    # The first page was in the buffer before the others came; then priority 6 first, each priority in order.
    assert got == ["A/a1/9/0", *[f"A/a1/6/{i}" for i in range(100, 105)], *[f"A/a1/9/{i}" for i in range(1, 5)],
                   *[f"A/a1/9/{i}" for i in range(200, 205)]], got


def test_the_interactive_lane_has_its_own_share_and_still_overtakes(broker: redis.Redis) -> None:
    lanes = Lanes(broker)
    lanes.put("A", "a1", 100)
    lanes.put("A", "i1", 3, lane=Lane.INTERACTIVE, priority=0)
    lanes.put("B", "i2", 3, lane=Lane.INTERACTIVE, priority=1)
    # One worker's pop over both lanes' lists, interactive (0-4) before batch (5-9), then the popped lane's refill.
    popped = []
    for _ in range(8):
        key, message = broker.brpop(broker_keys(Lane.INTERACTIVE) + broker_keys(Lane.BATCH), timeout=0.01)
        popped.append(message.decode())
        lanes.fair.refill(Lane.INTERACTIVE if key.decode().startswith(Lane.INTERACTIVE.queue) else Lane.BATCH)
    assert owners(popped[:6], depth=2) == {"A/i1": 3, "B/i2": 3} and popped[6].startswith("A/a1"), popped


def test_idle_tenants_leave_no_keys_and_cost_nothing(broker: redis.Redis) -> None:
    lanes = Lanes(broker, buffer=2)
    lanes.put("A", "a1", 30)
    lanes.put("B", "b1", 3)
    lanes.put("C", "c1", 1, lane=Lane.INTERACTIVE, priority=0)
    before = _calls(broker)
    assert len(lanes.take(34)) == 33 and lanes.take(2, Lane.INTERACTIVE) == ["C/c1/0/0"]
    calls = _calls(broker) - before
    # Per page: its pop and one refill script; the script's own commands are a few per page, none per tenant.
    assert calls["cmdstat_evalsha"] <= 36 and sum(calls.values()) < 36 * 30, calls
    left = sorted(k.decode() for k in broker.keys("paperlane.fair*") if not k.startswith(b"paperlane.fair.picks"))
    assert left == [keys.fair("batch").state, keys.fair("interactive").state], left
    assert broker.hget(keys.fair("batch").state, "held") == b"0"


def test_a_tenant_that_leaves_ahead_and_comes_back_does_not_jump_the_line(broker: redis.Redis) -> None:
    lanes = Lanes(broker)
    lanes.put("A", "a1", 200)
    lanes.put("B", "b1", 1, tenant_weight=0.1)  # B's one page costs it 10 turns
    lanes.take(4)
    lanes.put("B", "b1", 20, tenant_weight=0.1, start=1)  # back at once: its pass is still ahead of A's
    got = owners(lanes.take(100))
    assert got["B"] <= 10, got  # weight 0.1: about one page in eleven, not every other page
    lanes.take(200)
    assert broker.zcard(keys.fair("batch").gone) == 0  # the lane emptied: nothing remembered


def _calls(client: redis.Redis) -> Counter[str]:
    return Counter({k: int(v["calls"]) for k, v in client.info("commandstats").items() if k != "cmdstat_info"})


def test_share_of_an_ingest_reads_its_weights_and_the_lanes_starts(broker: redis.Redis) -> None:
    lanes = Lanes(broker)
    lanes.put("A", "a1", 100)
    lanes.put("A", "a2", 100)
    lanes.put("B", "b1", 100)
    lanes.take(20)
    share = lanes.fair.share(Lane.BATCH, "A", "a2")
    assert share is not None and share.fraction == pytest.approx(0.25)
    assert share.pages_per_s is not None and share.pages_per_s > 0
    assert lanes.fair.share(Lane.BATCH, "A", "nope") is None
    assert lanes.fair.set_weight("B", 2.0) == 1  # B's waiting pages now count twice
    share = lanes.fair.share(Lane.BATCH, "A", "a2")
    assert share is not None and share.fraction == pytest.approx(1 / 6)
    assert json.loads(json.dumps(Share("A", "a2").header()))["tenant"] == "A"


def test_turned_off_the_structure_drains_in_order_and_stale_entries_are_skipped(broker: redis.Redis) -> None:
    lanes = Lanes(broker)
    lanes.put("A", "a1", 5)
    lanes.put("B", "b1", 5)
    lanes.put("C", "c1", 5)
    broker.delete(keys.fair("batch").ingest_prefix + "C.c1")  # removed by hand: C is listed with nothing behind it
    assert lanes.fair.drain(Lane.BATCH, chunk=3) == 9  # A's and B's behind the one in the buffer; C's are gone
    got = [m.decode() for m in reversed(broker.lrange(Lane.BATCH.queue + ":5", 0, -1))]
    # In fair-share order: B arrived at A's pass, ties go by name.
    assert owners(got) == {"A": 5, "B": 5} and got[:5] == ["A/a1/5/0", "A/a1/5/1", "B/b1/5/0", "A/a1/5/2",
                                                           "B/b1/5/1"], got
    assert broker.zcard(keys.fair("batch").tenants) == 0 and lanes.fair.refill(Lane.BATCH) == 0


def test_purge_empties_the_structure(broker: redis.Redis) -> None:
    lanes = Lanes(broker, buffer=3)
    lanes.put("A", "a1", 10)
    lanes.put("B", "b1", 5)
    assert lanes.fair.purge(Lane.BATCH) == 12
    assert broker.keys(keys.fair("batch").ingest_prefix + "*") == [] and broker.zcard(keys.fair("batch").tenants) == 0


@pytest.mark.slow
def test_a_small_batch_behind_a_large_backlog_finishes_while_the_backlog_waits(
        stack_factory: Callable[..., Stack], worker_factory: Callable[..., object], tmp_path: Path) -> None:
    # A worker of 8 slots on the batch lane (no reserve for interactive pages), on a simulated engine.
    stack = stack_factory(WORKER__SLOTS="8", ENGINE__MAX_IN_FLIGHT="4")
    db = Database(stack.settings.database_url)
    db.upgrade()
    store, publisher = open_store(stack.settings), PagePublisher(make_celery(stack.settings))
    archive = tenants.create_key(db, tenant="archive").tenant_id
    nightly = tenants.create_key(db, tenant="nightly").tenant_id

    def submit(tenant_id: str, numbers: range) -> list[str]:
        docs = (Document(source=f"{tenant_id}-{i}.png", name=f"p{i}", ext=".png", data=tiny_page(i), page_count=1)
                for i in numbers)
        return [p.job_id for p in submit_documents(docs, db=db, store=store, spec=TaskSpec(), publisher=publisher,
                                                   owner=ingests.Owner(archive if tenant_id == "a" else nightly))]

    backlog = submit("a", range(400))
    broker = stack.broker()
    assert int(broker.hget(keys.fair("batch").state, "held") or 0) == 400 - 4  # behind a buffer of 4
    engine = start_sim_engine(tmp_path / "engine", slots=4, latency=0.1, scheduling_policy="priority")
    try:
        worker_factory(stack, "--engine", "vllm", "--engine-url", engine.url, "-Q", "batch")
        until(lambda: _finished(db, backlog) >= 20, what="the backlog being worked on", timeout=120)
        small = submit("b", range(1000, 1020))
        rows = wait_terminal(db, small, timeout=120)
        done_at = max(r.finished_at for r in rows.values())
        arrived = min(r.created_at for r in rows.values())
        archive_rows = jobstore.get_jobs(db, backlog)
    finally:
        engine.stop()
    assert all(r.status == "succeeded" for r in rows.values())
    # Between the small batch's arrival and its last page: the archive's pages already taken (the worker's 8
    # slots, the buffer's 4) and about one of its pages per page of the small batch. In arrival order (FIFO)
    # every page of the backlog would have gone first.
    during = [r for r in archive_rows if r.finished_at and arrived < r.finished_at <= done_at]
    assert len(during) <= 20 + 8 + 4 + 12, len(during)
    assert sum(r.status == "queued" for r in archive_rows) >= 250
    # Metered per tenant as the pages finished, with the engine's usage report.
    total = usage.totals(usage.days(db, since=date(2000, 1, 1), tenant_id=nightly))
    assert total["pages_succeeded"] == 20 and total["prompt_tokens"] > 0 and total["engine_seconds"] > 0, total


def _finished(db: Database, ids: list[str]) -> int:
    return sum(r.status == "succeeded" for r in jobstore.get_jobs(db, ids))


@pytest.mark.parametrize("fair_share", [True, False], ids=["fair", "fifo"])
def test_published_pages_go_out_in_pipelines_each_once_present_and_in_order(redis_client: redis.Redis,
                                                                           redis_service: Service,
                                                                           fair_share: bool) -> None:
    """PagePublisher sends pages in pipelines of up to BATCH commands (kombu's Producer.batch on the transport's
    prefixed client): more pages than one pipeline holds all arrive, once each, under the key prefix, marked present,
    in the order they were published."""
    settings = Settings(redis=RedisSettings(url=redis_service.url, key_prefix=prefix_of(redis_client)),
                        fair_share=FairShareSettings(enabled=fair_share))
    ids = [f"job-{i:05d}" for i in range(BATCH + 200)]
    share = Share("acme", "ingest-1")
    PagePublisher(make_celery(settings)).publish(
        [PageMessage(job_id=j, lane=Lane.BATCH, message_priority=5, share=share) for j in ids])
    on_lists = [m for key in reversed(broker_keys(Lane.BATCH)) for m in reversed(redis_client.lrange(key, 0, -1))]
    waiting = FairLanes(redis_client).waiting(Lane.BATCH)
    # The header the transport marks a page present by names the job its body names.
    assert all(json.loads(m)["headers"][JOB_HEADER] == page_job_id(m) for m in on_lists + waiting)
    buffered, behind = [page_job_id(m) for m in on_lists], [page_job_id(m) for m in waiting]
    assert buffered + behind == ids  # each once, in order: the buffer's first, then those waiting by fair share
    assert len(buffered) == (settings.fair_share.buffer if fair_share else len(ids))
    # Marked present while they wait: by fair share (the buffer's no longer, priority.presence), or on the lane.
    assert presence.missing(redis_client, ids) == (buffered if fair_share else [])
