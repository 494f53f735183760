"""One shape for a page on its way to a worker (``priority.messages.PageMessage``) and one publisher
(``priority.broker.PagePublisher``): what is published is what the task is handed and what the delayed set keeps."""

from __future__ import annotations

import json

import pytest
import redis
from pydantic import ValidationError

from paperlane.errors import EngineUnavailable
from paperlane.priority.broker import PagePublisher, make_celery
from paperlane.priority.fair import HEADER, Share
from paperlane.priority.keyspace import KeyPrefixedRedis
from paperlane.priority.lanes import Lane
from paperlane.priority.messages import PageMessage, page_job_id
from paperlane.retry import Action, RetryPolicy
from paperlane.settings import RedisSettings, Settings
from tests.conftest import until
from tests.services import Service

SHARE = Share("acme", "ingest-1", 2.0, 0.5)


def test_a_message_is_kept_in_the_delayed_set_as_it_is() -> None:
    for page in (PageMessage(job_id="j1", lane=Lane.INTERACTIVE, message_priority=2, share=SHARE),
                 PageMessage(job_id="j2", lane=Lane.BATCH, message_priority=9)):
        assert PageMessage.parse(page.member().encode()) == page
    # A member delayed before fair share: no share.
    assert PageMessage.parse("j3 batch 6").share is None


def test_a_message_that_no_lane_could_hold_is_refused() -> None:
    for wrong in ({"message_priority": 10}, {"message_priority": -1}, {"job_id": ""}, {"job_id": "x" * 65}):
        with pytest.raises(ValidationError):
            PageMessage.model_validate({"job_id": "j", "lane": "batch", "message_priority": 5, **wrong})


def test_what_a_task_is_handed_defaults_as_the_worker_always_did() -> None:
    got = PageMessage.received("j", queue="elsewhere", priority=None, headers={HEADER: {"tenant": "a b"}})
    assert got == PageMessage(job_id="j", lane=Lane.BATCH, message_priority=Lane.BATCH.base_priority)


def test_a_published_page_is_handed_to_its_task_as_it_was_published(redis_service: Service,
                                                                    redis_client: redis.Redis) -> None:
    client = redis_client  # this test's own keys (conftest deletes them after): none left for later tests to find
    assert isinstance(client, KeyPrefixedRedis)
    app = make_celery(Settings(redis=RedisSettings(url=redis_service.url, key_prefix=client.key_prefix)))
    page = PageMessage(job_id="job-42", lane=Lane.INTERACTIVE, message_priority=3, share=SHARE)
    PagePublisher(app).publish([page])
    raw = until(lambda: client.rpop(f"{Lane.INTERACTIVE.queue}:3"), what="the published message")
    envelope = json.loads(raw)
    info = envelope["properties"]["delivery_info"]
    received = PageMessage.received(page_job_id(raw), queue=info["routing_key"],
                                    priority=envelope["properties"]["priority"], headers=envelope["headers"])
    assert received == page


def test_the_unrecorded_delay_is_twice_the_last_retrys_wait() -> None:
    for policy in (RetryPolicy(), RetryPolicy(max_attempts=2, backoff=0.5), RetryPolicy(max_attempts=5, backoff=3)):
        waits = [d.delay for attempt in range(1, policy.max_attempts + 1)
                 if (d := policy.decide(EngineUnavailable("down", stage="inference"), attempts=attempt)).action
                 is Action.RETRY]
        assert len(waits) == policy.max_attempts - 1
        assert policy.unrecorded_delay() == 2 * waits[-1]
    assert RetryPolicy(max_attempts=1, backoff=4).unrecorded_delay() == 4  # no retry at all: the first wait
