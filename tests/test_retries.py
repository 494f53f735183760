"""Delayed retries live in Redis: due later, claimed once, back on their own lane at their own priority,
and released by any worker's clock, also one started after the worker that delayed them died."""

from __future__ import annotations

import json
import time

import pytest
import redis

from paperlane.priority.broker import make_celery
from paperlane.priority.connection import open_redis
from paperlane.priority.delayed import DelayedPages
from paperlane.priority.keyspace import prefix_of
from paperlane.priority.lanes import Lane, broker_keys
from paperlane.priority.messages import PageMessage
from paperlane.settings import RedisSettings, Settings
from paperlane.workers.retry_clock import RetryClock
from tests.conftest import until
from tests.services import Service


@pytest.fixture
def redis_cfg(redis_client: redis.Redis, redis_service: Service) -> RedisSettings:
    """The test Redis under the prefix of ``redis_client`` (whose keys are deleted after the test)."""
    return RedisSettings(url=redis_service.url, key_prefix=prefix_of(redis_client))


def test_a_delayed_page_is_due_later_and_claimed_once(redis_cfg: RedisSettings) -> None:
    a, b = DelayedPages(open_redis(redis_cfg)), DelayedPages(open_redis(redis_cfg))
    page = PageMessage(job_id="job-1", lane=Lane.INTERACTIVE, message_priority=3)
    a.add(page, 0.4)
    pages, wait = a.claim_due()
    assert pages == [] and wait is not None and 0.2 < wait <= 0.4
    time.sleep(wait)
    claims = [a.claim_due()[0], b.claim_due()[0]]
    assert sorted(map(len, claims)) == [0, 1] and page in claims[0] + claims[1]
    assert a.pending() == 1  # claimed, not yet released
    a.released([page])
    assert a.pending() == 0 and a.claim_due() == ([], None)


def test_a_claim_whose_releaser_died_is_put_back(redis_cfg: RedisSettings) -> None:
    dying = DelayedPages(open_redis(redis_cfg), stale_s=0.3)
    dying.add(PageMessage(job_id="job-2", lane=Lane.BATCH, message_priority=7), 0)
    assert len(dying.claim_due()[0]) == 1  # ... and it never says released
    heir = DelayedPages(open_redis(redis_cfg), stale_s=0.3)
    pages, wait = heir.claim_due()
    assert pages == [] and wait is not None and wait <= 0.3
    time.sleep(wait + 0.05)
    assert heir.claim_due()[0] == [PageMessage(job_id="job-2", lane=Lane.BATCH, message_priority=7)]


def test_the_clock_puts_pages_back_on_their_lane_at_their_priority(redis_cfg: RedisSettings) -> None:
    # Delayed by a worker that is gone: nobody was running a clock when they were added.
    gone = DelayedPages(open_redis(redis_cfg))
    gone.add(PageMessage(job_id="job-i", lane=Lane.INTERACTIVE, message_priority=3), 0.2)
    gone.add(PageMessage(job_id="job-b", lane=Lane.BATCH, message_priority=6), 0.0)
    app = make_celery(Settings(redis=redis_cfg))

    def publish(pages: list[PageMessage]) -> None:
        from paperlane.priority.broker import send_page

        for p in pages:
            send_page(app, p.job_id, p.lane, p.message_priority)

    own = open_redis(redis_cfg)
    clock = RetryClock(own, DelayedPages(own), publish)
    clock.start()
    try:
        client = open_redis(redis_cfg)
        until(lambda: client.llen(broker_keys(Lane.BATCH)[6]) == 1, timeout=10, every=0.02)
        until(lambda: client.llen(broker_keys(Lane.INTERACTIVE)[3]) == 1, timeout=10, every=0.02)
        message = json.loads(client.lindex(broker_keys(Lane.INTERACTIVE)[3], 0))
        assert message["headers"]["argsrepr"] == "['job-i']"
        # A page delayed while the clock sleeps wakes it (no polling): released about when due.
        t0 = time.monotonic()
        DelayedPages(client).add(PageMessage(job_id="job-late", lane=Lane.BATCH, message_priority=5), 0.3)
        until(lambda: client.llen(broker_keys(Lane.BATCH)[5]) == 1, timeout=10, every=0.02)
        assert 0.25 < time.monotonic() - t0 < 5
        until(lambda: clock.released == 3, timeout=5, every=0.02)  # counted once its release is recorded
        assert gone.pending() == 0
    finally:
        clock.stop()
