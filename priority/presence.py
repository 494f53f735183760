"""Which queued pages have a message in Redis, asked about the pages, not by reading the queues.

Redis's queues are at-most-once at two points: a worker pops a message and then records it as un-acked (a worker
killed between the two, or Redis going down between them, loses that message), and Redis replicates writes
asynchronously (a failover to a replica loses the last ones: a page's message just published). The job stays
``queued`` with no message anywhere. Workers look for such jobs now and then (``workers.leases``).

Every message that waits by fair share behind a lane's buffer, or delayed, has its page's job id in one set,
``keys.PRESENT``, put there by the same script that puts the message (``priority.fair``, ``priority.delayed``) and
taken out by the script that moves the message onto the lane's buffer (a few messages per lane): a failover keeps or
loses both together. (With fair share off, messages wait on the lanes' lists: marked when published and when kombu
restores an un-acked one, ``priority.transport``, and unmarked when popped.) So a sweep asks about the pages it
suspects (``missing``: one SMISMEMBER per 10,000 pages), whatever the length of the queues; only for pages with no
marker does it read the lanes' buffers (``in_buffers``) and the messages delivered to workers and not yet
acknowledged (``in_flight``): as many as the pages in progress and in the buffers, never the backlog.
"""

from __future__ import annotations

import json

import redis

from paperlane.priority import keys
from paperlane.priority.lanes import Lane, broker_keys
from paperlane.priority.messages import BadMessage, PageMessage, page_job_id

_CHUNK = 10_000  # job ids per SMISMEMBER


def missing(client: redis.Redis, job_ids: list[str]) -> list[str]:
    """The ids among ``job_ids`` that have no message waiting in Redis (popped by a worker since, or lost)."""
    if not job_ids:
        return []
    with client.pipeline(transaction=False) as pipe:
        for start in range(0, len(job_ids), _CHUNK):
            pipe.smismember(keys.PRESENT, job_ids[start:start + _CHUNK])
        found = [flag for reply in pipe.execute() for flag in reply]
    return [job_id for job_id, there in zip(job_ids, found) if not there]


def in_flight(client: redis.Redis, *, since: float) -> set[str]:
    """Ids of the pages whose message a worker received at or after ``since`` (epoch seconds) and has not
    acknowledged. One received earlier and still un-acked is held by a worker that died before it started the page
    (a live one starts what it receives at once: prefetch 1): kombu gives it back only after its visibility timeout
    (an hour), so it does not count."""
    tags: list[bytes] = list(client.zrangebyscore(keys.UNACKED_INDEX, since, "+inf"))  # type: ignore[arg-type]  # redis-py types the reply loosely
    if not tags:
        return set()
    found: set[str] = set()
    for value in client.hmget(keys.UNACKED, tags):
        try:
            found.add(page_job_id(json.dumps(json.loads(value)[0]).encode()))  # type: ignore[arg-type]  # None (acked since) raises, caught
        except (ValueError, IndexError, TypeError, BadMessage):
            continue  # acknowledged in between (None), or not a page's message
    return found


def in_buffers(client: redis.Redis) -> set[str]:
    """Ids of the pages whose message is on a lane's lists: with fair share on, the lanes' short buffers (and the
    messages kombu gave back there); with it off, every waiting message (do not call it then)."""
    with client.pipeline(transaction=False) as pipe:
        for lane in Lane:
            for key in broker_keys(lane):
                pipe.lrange(key, 0, -1)
        found: set[str] = set()
        for raw in (m for reply in pipe.execute() for m in reply):
            try:
                found.add(page_job_id(raw))
            except BadMessage:
                continue
    return found
