"""Which jobs have a message in Redis: on a lane's queue, un-acked by a worker, or delayed.

Redis's queues are at-most-once at one point: a worker pops a message and then records it as un-acked;
a worker killed between the two, or Redis going down between them, loses that message. The job stays
``queued`` with no message anywhere. Workers look for such jobs now and then (``workers.leases``):
this module says which jobs Redis does hold, read in one pass while the queues are small enough to read.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from paperlane.priority import keys
from paperlane.priority.delayed import DelayedPage
from paperlane.priority.lanes import Lane, broker_keys
from paperlane.priority.messages import BadMessage, page_job_id


def jobs_in_redis(client: redis.Redis, *, limit: int) -> set[str] | None:
    """Ids of the jobs with a message in Redis, or None when it holds more than ``limit`` (too many to read;
    a queue that long is being worked through anyway)."""
    lanes = [key for lane in Lane for key in broker_keys(lane)]
    with client.pipeline(transaction=False) as pipe:
        for key in lanes:
            pipe.llen(key)
        pipe.hlen(keys.UNACKED)
        pipe.zcard(keys.DELAYED)
        pipe.zcard(keys.RELEASING)
        sizes = pipe.execute()
    if sum(sizes) > limit:
        return None
    with client.pipeline(transaction=True) as pipe:  # one snapshot: a message moving is seen once
        for key in lanes:
            pipe.lrange(key, 0, -1)
        pipe.hvals(keys.UNACKED)
        pipe.zrange(keys.DELAYED, 0, -1)
        pipe.zrange(keys.RELEASING, 0, -1)
        *queued, unacked, delayed, releasing = pipe.execute()
    found: set[str] = set()
    for raw in (m for messages in queued for m in messages):
        _add(found, raw)
    for value in unacked:
        try:
            _add(found, json.dumps(json.loads(value)[0]).encode())
        except (ValueError, IndexError, TypeError):
            continue
    for member in (*delayed, *releasing):
        try:
            found.add(DelayedPage.parse(member).job_id)
        except ValueError:
            continue
    return found


def _add(found: set[str], raw: Any) -> None:
    try:
        found.add(page_job_id(raw))
    except BadMessage:
        pass
