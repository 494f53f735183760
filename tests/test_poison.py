"""Poison messages on the lane queues: garbage among real pages, a real worker, the dead-letter list."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable

import pytest
import redis

from paperlane.priority import keys
from paperlane.priority.broker import make_celery, send_page
from paperlane.priority.deadletter import DeadLetter, DeadLetters
from paperlane.priority.lanes import TASK_PROCESS_PAGE, Lane, broker_keys
from paperlane.priority.messages import BadMessage, page_job_id
from tests.conftest import Stack, cli, until
from tests.test_scheduling import Producer


def _template(app: object, broker: redis.Redis) -> dict:
    """A real page message as the producer writes it, taken back off its lane."""
    send_page(app, "template-job", Lane.BATCH, 5)  # type: ignore[arg-type]
    raw = broker.rpop(f"{Lane.BATCH.queue}:5")
    assert isinstance(raw, bytes)
    return dict(json.loads(raw))


def _changed(envelope: dict, change: Callable[[dict], object]) -> bytes:
    copy = json.loads(json.dumps(envelope))
    change(copy)
    return json.dumps(copy).encode()


def _garbage(envelope: dict) -> dict[str, tuple[bytes, str]]:
    """Raw messages pushed straight onto a lane key, and a piece of the reason each must be set aside with."""
    return {
        "not JSON": (b"this is not json {", "not JSON"),
        "not UTF-8": (b"\xff\xfe\x00\x01 binary", "not JSON"),
        "empty": (b"", "not JSON"),
        "JSON, not a message": (b"[1, 2, 3]", "message: Input should be an object"),
        "no properties": (_changed(envelope, lambda e: e.pop("properties")), "message.properties: Field required"),
        "no delivery tag": (_changed(envelope, lambda e: e["properties"].pop("delivery_tag")), "delivery_tag"),
        "headers not an object": (_changed(envelope, lambda e: e.__setitem__("headers", "x")), "message.headers"),
        "body not base64": (_changed(envelope, lambda e: e.__setitem__("body", "!!!")), "not base64"),
        "pickle": (_changed(envelope, lambda e: e.__setitem__("content-type", "application/x-python-serialize")),
                   "content-type"),
        "an ETA": (_changed(envelope, lambda e: e["headers"].__setitem__("eta", "2030-01-01T00:00:00")), "eta"),
        "a share naming other keys": (_changed(envelope, lambda e: e["headers"].__setitem__(
            "paperlane_share", {"tenant": "x.y *", "ingest": "i"})), "paperlane_share.tenant"),
    }


def _sent(app: object) -> dict[str, tuple[str, str]]:
    """Messages sent through Celery itself, well-formed but wrong: task id -> (what, piece of the reason)."""
    sent = {
        "unknown task": app.send_task("os.system", args=["true"], queue=Lane.BATCH.queue, priority=5),  # type: ignore[attr-defined]
        "no job id": app.send_task(TASK_PROCESS_PAGE, args=[], queue=Lane.BATCH.queue, priority=5),  # type: ignore[attr-defined]
        "job id not a string": app.send_task(TASK_PROCESS_PAGE, args=[42], queue=Lane.INTERACTIVE.queue,  # type: ignore[attr-defined]
                                             priority=0),
        "two job ids": app.send_task(TASK_PROCESS_PAGE, args=["a", "b"], queue=Lane.BATCH.queue, priority=5),  # type: ignore[attr-defined]
    }
    reasons = {"unknown task": "unknown task 'os.system'", "no job id": "expected one job id",
               "job id not a string": "job id must be a string", "two job ids": "expected one job id"}
    return {result.id: (what, reasons[what]) for what, result in sent.items()}


@pytest.mark.slow
def test_garbage_on_the_lanes_is_set_aside_and_every_page_is_done(stack: Stack, worker_factory) -> None:
    producer = Producer(stack)
    broker = stack.broker()
    app = make_celery(stack.settings)
    garbage = _garbage(_template(app, broker))
    before = producer.submit(range(3), Lane.BATCH)
    # Garbage on both lanes, between real pages: on batch behind the first pages, on interactive ahead of all.
    for i, (raw, _) in enumerate(garbage.values()):
        broker.lpush(f"{Lane.BATCH.queue}:5" if i % 2 else Lane.INTERACTIVE.queue, raw)
    sent = _sent(app)
    send_page(app, "no-such-job", Lane.BATCH, 5)
    after = producer.submit(range(3, 6), Lane.BATCH) + producer.submit(range(6, 8), Lane.INTERACTIVE)

    worker = worker_factory(stack)
    rows = producer.wait(before + after, timeout=120)
    assert all(r.status == "succeeded" for r in rows.values()), {r.id: r.error for r in rows.values()}
    expected = len(garbage) + len(sent) + 1
    deadline = time.monotonic() + 30
    while broker.llen(keys.DEAD_LETTERS) < expected and time.monotonic() < deadline:
        time.sleep(0.2)
    assert worker.alive(), worker.output()[-3000:]
    letters = DeadLetters(broker).recent()
    assert len(letters) == expected, [(d.reason, d.message[:80]) for d in letters]
    assert not any(broker.llen(k) for lane in Lane for k in broker_keys(lane))
    # Every message acknowledged: a set-aside page message's task acks it just after it returns.
    until(lambda: broker.hlen(keys.UNACKED) == 0, what="every message acknowledged", timeout=30)

    for what, (raw, reason) in garbage.items():
        [letter] = [d for d in letters if _raw(d) == raw]
        assert reason in letter.reason, (what, letter.reason)
        assert letter.queue in (Lane.BATCH.queue, Lane.INTERACTIVE.queue) and letter.size == len(raw)
    for task_id, (what, reason) in sent.items():
        [letter] = [d for d in letters if task_id in d.message]
        assert reason in letter.reason, (what, letter.reason)
    [unknown] = [d for d in letters if "no-such-job" in d.message]
    assert unknown.reason == "no job with id no-such-job" and unknown.queue == Lane.BATCH.queue
    assert all(d.at and "\n" not in d.reason for d in letters)

    listed = cli(stack, "dead-letters", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [DeadLetter(**d) for d in json.loads(listed.stdout)] == letters
    purged = cli(stack, "dead-letters", "--purge")
    assert purged.returncode == 0 and f"{expected} dead letters purged" in purged.stderr, purged.stderr
    assert broker.llen(keys.DEAD_LETTERS) == 0
    # The worker still takes pages.
    [late] = producer.submit([99], Lane.INTERACTIVE)
    assert producer.wait([late])[late].status == "succeeded"


def _raw(letter: DeadLetter) -> bytes:
    return base64.b64decode(letter.message) if letter.encoding == "base64" else letter.message.encode()


def test_the_list_is_bounded_and_a_message_too_big_is_cut(redis_client: redis.Redis) -> None:
    client = redis_client
    letters = DeadLetters(client, keep=5)
    for i in range(8):
        assert letters.add(f"garbage {i}".encode(), reason="not JSON", queue=Lane.BATCH.queue)
    assert [d.message for d in letters.recent()] == [f"garbage {i}" for i in range(7, 2, -1)]
    assert letters.add(b"x" * 200_000, reason="too big", queue=None)
    [big] = letters.recent(limit=1)
    assert big.truncated and big.size == 200_000 and len(big.message) == 64 * 1024
    assert len(letters.purge()) == 5 and letters.recent() == []


def test_setting_aside_never_raises_with_the_broker_down() -> None:
    letters = DeadLetters(redis.Redis.from_url("redis://127.0.0.1:9/0"))
    assert letters.add(b"garbage", reason="not JSON", queue=Lane.BATCH.queue) is False


def test_what_the_producer_sends_passes_the_check(stack: Stack) -> None:
    broker = stack.broker()
    envelope = _template(make_celery(stack.settings), broker)
    assert page_job_id(json.dumps(envelope).encode()) == "template-job"
    with pytest.raises(BadMessage, match="expected one job id"):
        page_job_id(_changed(envelope, lambda e: e.__setitem__("body", base64.b64encode(b'[[], {}, null]').decode())))


def test_a_bad_message_is_told_apart_in_one_line_saying_where() -> None:
    with pytest.raises(BadMessage, match=r"^message: not JSON \(.+\)$"):
        page_job_id(b"this is not json {")
    with pytest.raises(BadMessage, match=r"^message: Input should be an object$"):
        page_job_id(b"[1, 2, 3]")
