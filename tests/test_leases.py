"""Leases on running jobs (storage level, SQLite and PostgreSQL): renewed by their worker, taken back once
they run out, failed when their attempts are used up; jobs whose message never went out found again."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import text

from paperlane.producer.submit import submit_documents
from paperlane.retry import RetryPolicy
from paperlane.schemas import JobStatus, TaskSpec
from paperlane.storage import jobs as jobstore
from paperlane.storage import leases
from paperlane.storage.db import Database, utcnow
from paperlane.storage.localfs import LocalStore
from tests.pages import tiny_page
from tests.test_ingests import doc

ATTEMPTS_2 = RetryPolicy(max_attempts=2)
ATTEMPTS_3 = RetryPolicy(max_attempts=3)


def _jobs(db: Database, tmp_path: Path, n: int) -> list[str]:
    pages = submit_documents([doc(f"p{i}", tiny_page(i)) for i in range(n)], db=db, store=LocalStore(tmp_path),
                             spec=TaskSpec())
    jobstore.mark_enqueued(db, [p.job_id for p in pages])
    return [p.job_id for p in pages]


def test_a_lapsed_lease_goes_back_to_its_lane_and_a_live_one_stays(db: Database, tmp_path: Path) -> None:
    a, b = _jobs(db, tmp_path, 2)
    now = utcnow()
    for job_id, worker in ((a, "w1"), (b, "w2")):
        assert jobstore.start_attempt(db, job_id, policy=ATTEMPTS_3, worker=worker, lease=5) is not None
    with db.session() as s:  # operators see who holds a running page in SQL too
        assert s.execute(text("SELECT status, worker FROM page_status WHERE job_id = :j"), {"j": a}).one() == (
            "running", "w1")
    # A second delivery of a's message while w1 holds it does not start it again.
    assert jobstore.start_attempt(db, a, policy=ATTEMPTS_3, worker="w3", lease=5) is None
    assert leases.renew(db, [a, b], worker="w1", until=now + timedelta(seconds=60)) == 1  # w1 holds only a
    later = now + timedelta(seconds=10)
    [back] = leases.take_back(db, now=later, policy=ATTEMPTS_3)
    assert (back.job_id, back.worker, back.failed) == (b, "w2", False)
    assert leases.take_back(db, now=later, policy=ATTEMPTS_3) == []  # taken back once
    row = jobstore.get_job(db, b)
    assert (row.status, row.attempts, row.enqueued_at) == (JobStatus.QUEUED.value, 1, None)
    assert jobstore.get_job(db, a).status == JobStatus.RUNNING.value
    # Its message not out yet: found by the sweep once it has waited long enough, not before.
    assert leases.unpublished(db, before=now - timedelta(seconds=60)) == []
    assert [j for j, _, _ in leases.unpublished(db, before=utcnow() + timedelta(seconds=1))] == [b]
    jobstore.mark_enqueued(db, [b])
    assert leases.unpublished(db, before=utcnow() + timedelta(seconds=1)) == []


def test_a_page_whose_worker_keeps_dying_fails_with_the_reason(db: Database, tmp_path: Path) -> None:
    [job_id] = _jobs(db, tmp_path, 1)
    for attempt in range(1, 3):
        assert jobstore.start_attempt(db, job_id, policy=ATTEMPTS_2, worker=f"w{attempt}", lease=1) is not None
        [back] = leases.take_back(db, now=utcnow() + timedelta(seconds=2), policy=ATTEMPTS_2)
        assert back.failed is (attempt == 2)
    row = jobstore.get_job(db, job_id)
    assert row.status == JobStatus.FAILED.value and "w2" in (row.error or "") and row.error_stage == "worker"


def test_a_queued_page_whose_message_redis_lost_is_published_again(stack_factory) -> None:
    import redis

    from paperlane.priority import keys
    from paperlane.priority.delayed import DelayedPages
    from paperlane.priority.lanes import Lane, broker_keys
    from paperlane.priority.messages import page_job_id
    from paperlane.settings import WorkerSettings
    from paperlane.workers.leases import LeaseKeeper
    from tests.sentinels import published_long_ago
    from tests.test_scheduling import Producer

    stack = stack_factory()
    producer = Producer(stack)
    ids = producer.submit(range(3), Lane.BATCH)
    published_long_ago(producer.db, ids)
    client = stack.broker()
    [key] = [k for k in broker_keys(Lane.BATCH) if client.llen(k)]
    lost = next(m for m in client.lrange(key, 0, -1) if page_job_id(m) == ids[1])
    client.lrem(key, 1, lost)  # popped, and its worker killed before it was recorded as un-acked
    client.srem(keys.PRESENT, ids[1])  # the pop took its presence marker (priority.transport)
    delayed = DelayedPages(client)
    keeper = LeaseKeeper(producer.db, delayed, client, WorkerSettings(), RetryPolicy(), worker="w")
    try:
        keeper.sweep()
        assert [m.decode().split()[0] for m in client.zrange(keys.DELAYED, 0, -1)] == [ids[1]]
        keeper.sweep()  # found in Redis now (delayed): not published twice
        assert client.zcard(keys.DELAYED) == 1
        assert sorted(page_job_id(m) for m in client.lrange(key, 0, -1)) == sorted([ids[0], ids[2]])
    finally:
        keeper.stop()


def test_a_queued_page_held_un_acked_by_a_worker_that_died_before_starting_it_is_published_again(
        stack_factory) -> None:
    # A worker killed after receiving a page and before starting it leaves the message un-acked; kombu gives it back
    # only after its visibility timeout (an hour). A live worker starts what it receives at once (prefetch 1), so
    # a queued page un-acked for longer than the sweep's wait is lost; one delivered just now is not.
    import json
    import time

    import redis

    from paperlane.priority import keys
    from paperlane.priority.delayed import DelayedPages
    from paperlane.priority.lanes import Lane, broker_keys
    from paperlane.priority.messages import page_job_id
    from paperlane.settings import WorkerSettings
    from paperlane.workers.leases import LeaseKeeper
    from tests.sentinels import published_long_ago
    from tests.test_scheduling import Producer

    stack = stack_factory()
    producer = Producer(stack)
    ids = producer.submit(range(3), Lane.BATCH)
    published_long_ago(producer.db, ids)
    client = stack.broker()
    [key] = [k for k in broker_keys(Lane.BATCH) if client.llen(k)]
    delivered = {ids[0]: time.time() - 600, ids[1]: time.time()}  # to a dead worker; to a live one, just now
    for job_id, at in delivered.items():
        message = next(m for m in client.lrange(key, 0, -1) if page_job_id(m) == job_id)
        client.lrem(key, 1, message)
        client.srem(keys.PRESENT, job_id)  # the pop took its presence marker (priority.transport)
        tag = f"tag-{job_id}"
        client.hset(keys.UNACKED, tag, json.dumps([json.loads(message), "", Lane.BATCH.queue]))
        client.zadd(keys.UNACKED_INDEX, {tag: at})
    keeper = LeaseKeeper(producer.db, DelayedPages(client), client, WorkerSettings(), RetryPolicy(), worker="w")
    try:
        keeper.sweep()
        assert [m.decode().split()[0] for m in client.zrange(keys.DELAYED, 0, -1)] == [ids[0]]
    finally:
        keeper.stop()
