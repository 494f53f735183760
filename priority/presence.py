"""Which queued pages have a message in Redis, asked about the pages, not by reading the queues.

Redis's queues are at-most-once at two points: a worker pops a message and then records it as un-acked (a worker
killed between the two, or Redis going down between them, loses that message), and Redis replicates writes
asynchronously (a failover to a replica loses the last ones: a page's message just published). The job stays
``queued`` with no message anywhere. Workers look for such jobs now and then (``workers.leases``).

Every message that waits (on a lane's list, by fair share behind it, or delayed) has its page's job id in one set,
``keys.PRESENT``, written by the same script that puts the message (``priority.fair``, ``priority.delayed``; kombu's
restore of an un-acked message in the same transaction, ``priority.transport``) and taken out when a worker pops
it. A write lost at a failover loses the message and its marker together. So a sweep asks about the pages it
suspects (``missing``: one SMISMEMBER per 10,000 pages), whatever the length of the queues; only for pages with no
marker does it read the messages delivered to workers and not yet acknowledged (``in_flight``), which are as many
as the pages in progress, never the backlog.
"""

from __future__ import annotations

import json

import redis

from paperlane.priority import keys
from paperlane.priority.messages import BadMessage, page_job_id

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
    tags: list[bytes] = list(client.zrangebyscore(keys.UNACKED_INDEX, since, "+inf"))  # type: ignore[arg-type]
    if not tags:
        return set()
    found: set[str] = set()
    for value in client.hmget(keys.UNACKED, tags):
        try:
            found.add(page_job_id(json.dumps(json.loads(value)[0]).encode()))  # type: ignore[arg-type]
        except (ValueError, IndexError, TypeError, BadMessage):
            continue  # acknowledged in between (None), or not a page's message
    return found
