"""redis.key_prefix: two deployments on one Redis do not see each other's keys, channels or messages."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from paperlane.priority import keys
from paperlane.priority.delayed import DelayedPages
from paperlane.priority.messages import PageMessage
from paperlane.priority.keyspace import UnknownCommand, prefixed_args, with_prefix
from paperlane.priority.lanes import Lane
from paperlane.priority import presence
from paperlane.storage.db import Database
from tests.conftest import Stack, cli, lane_messages, until, wait_terminal
from tests.pages import render_page, sample_lines
from tests.services import Service


def test_every_key_argument_is_prefixed_and_an_unknown_command_is_refused() -> None:
    assert prefixed_args("p:", ("GET", "a")) == ("GET", "p:a")
    assert prefixed_args("p:", ("DEL", "a", b"b")) == ("DEL", "p:a", b"p:b")
    assert prefixed_args("p:", ("BRPOP", "a", "b", 5)) == ("BRPOP", "p:a", "p:b", 5)
    assert prefixed_args("p:", ("EVALSHA", "sha", 2, "k1", "k2", "arg")) == ("EVALSHA", "sha", 2, "p:k1", "p:k2", "arg")
    assert prefixed_args("p:", ("PING",)) == ("PING",)
    with pytest.raises(UnknownCommand, match="FLUSHALL"):
        prefixed_args("p:", ("FLUSHALL",))


def test_a_prefixed_client_reads_and_writes_only_under_its_prefix(redis_service: Service) -> None:
    plain = redis.Redis.from_url(redis_service.url)
    a, b = (with_prefix(redis.Redis.from_url(redis_service.url), p) for p in ("ks_a:", "ks_b:"))
    try:
        a.set("same", "A")
        b.set("same", "B")
        with a.pipeline() as pipe:
            pipe.lpush("list", "x").get("same")
            assert pipe.execute() == [1, b"A"]
        assert b.get("same") == b"B" and b.llen("list") == 0
        assert b.brpop(["list"], timeout=0.01) is None and a.brpop(["list"], timeout=0.01) == (b"list", b"x")
        assert sorted(plain.keys("ks_*")) == [b"ks_a:same", b"ks_b:same"]
        assert a.keys("*") == [b"same"]
    finally:
        plain.delete("ks_a:same", "ks_b:same")
        for client in (plain, a, b):
            client.close()


def test_a_channel_is_heard_only_under_its_prefix(redis_client: redis.Redis, redis_service: Service) -> None:
    other = with_prefix(redis.Redis.from_url(redis_service.url), "ks_other:")
    mine, theirs = redis_client.pubsub(ignore_subscribe_messages=True), other.pubsub(ignore_subscribe_messages=True)
    try:
        mine.subscribe(keys.DELAYED_CHANNEL)
        theirs.subscribe(keys.DELAYED_CHANNEL)
        until(lambda: redis_client.publish(keys.DELAYED_CHANNEL, b"1"), what="a subscriber", timeout=10)
        heard = until(lambda: mine.get_message(timeout=0.1), what="the message", timeout=10)
        assert heard["channel"] == keys.DELAYED_CHANNEL.encode()  # type: ignore[index]
        assert theirs.get_message(timeout=0.2) is None
    finally:
        mine.close()
        theirs.close()
        other.close()


@pytest.mark.slow
def test_two_stacks_on_one_redis_keep_apart(stack_factory: Callable[..., Stack], worker_factory,  # noqa: ANN001
                                             redis_service: Service, tmp_path: Path) -> None:
    one, two = stack_factory(), stack_factory()
    page = tmp_path / "page.png"
    page.write_bytes(render_page(sample_lines(0)))
    res = cli(one, "submit", "--lane", "interactive", str(page))
    assert res.returncode == 0, res.stderr
    [job] = res.stdout.split()
    a, b = one.broker(), two.broker()
    DelayedPages(a).add(PageMessage(job_id="job-later", lane=Lane.BATCH, message_priority=6), 3600)
    assert _waiting(a, [job, "job-later"]) == {job, "job-later"}
    assert _waiting(b, [job, "job-later"]) == set() and lane_messages(b, Lane.INTERACTIVE) == []

    worker_factory(two)  # consumes only its own stack's lanes: the page waits for stack one's worker
    worker_factory(one, name="w2")
    db = Database(one.settings.database_url)
    try:
        assert wait_terminal(db, [job])[job].status == "succeeded"
    finally:
        db.dispose()
    everything = redis.Redis.from_url(redis_service.url).keys("*")
    prefixes = (one.settings.redis.key_prefix, two.settings.redis.key_prefix)
    # Every test's keys live under t_<id>: (stacks) or r_<id>: (redis_client): anything else escaped its prefix.
    outside = [k for k in everything if not k.startswith((b"t_", b"r_"))]
    assert outside == [], f"keys outside any stack's prefix: {outside}"
    assert any(k.decode().startswith(prefixes[0]) for k in everything)
    assert b.hlen(keys.UNACKED) == 0 and _waiting(b, [job, "job-later"]) == set()


def _waiting(client: redis.Redis, job_ids: list[str]) -> set[str]:
    """Which of ``job_ids`` have a message waiting in this client's Redis keys: marked present, or on a lane's buffer."""
    return (set(job_ids) - set(presence.missing(client, job_ids))) | (presence.in_buffers(client) & set(job_ids))
