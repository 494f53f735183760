"""Which jobs have a message in Redis: on a lane's queue, waiting by fair share behind it, un-acked by a worker, or
delayed.

Redis's queues are at-most-once at one point: a worker pops a message and then records it as un-acked;
a worker killed between the two, or Redis going down between them, loses that message. The job stays
``queued`` with no message anywhere. Workers look for such jobs now and then (``workers.leases``):
this module says which jobs Redis does hold, read in one pass (one script: a message moving from one place to
another is seen once) while the queues are small enough to read.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from paperlane.priority import fair, keys
from paperlane.priority.keyspace import prefix_of
from paperlane.priority.lanes import Lane, broker_keys
from paperlane.priority.messages import BadMessage, PageMessage, page_job_id

# KEYS: unacked, unacked index, delayed, releasing, then each lane's tenants set; ARGV: the earliest delivery time
# of an un-acked message that counts, the lists, then per lane its tenant and ingest prefixes. Returns {lane
# messages (queued and waiting by fair share), un-acked values delivered since then, delayed, releasing}.
_SNAPSHOT = fair.WAITING_LUA + """
local lanes = #KEYS - 4
local queued = {}
for k = 2, #ARGV - 2 * lanes do
  for _, m in ipairs(redis.call('LRANGE', ARGV[k], 0, -1)) do queued[#queued + 1] = m end
end
for l = 1, lanes do
  waiting(KEYS[4 + l], ARGV[#ARGV - 2 * lanes + 2 * l - 1], ARGV[#ARGV - 2 * lanes + 2 * l], queued)
end
local unacked = {}
for _, tag in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[1], '+inf')) do
  local value = redis.call('HGET', KEYS[1], tag)
  if value then unacked[#unacked + 1] = value end
end
return {queued, unacked, redis.call('ZRANGE', KEYS[3], 0, -1), redis.call('ZRANGE', KEYS[4], 0, -1)}
"""


def jobs_in_redis(client: redis.Redis, *, limit: int, unacked_since: float = 0.0) -> set[str] | None:
    """Ids of the jobs with a message in Redis, or None when it holds more than ``limit`` (too many to read;
    a queue that long is being worked through anyway). An un-acked message counts only if it was delivered at
    or after ``unacked_since`` (epoch seconds): one delivered to a worker killed before it started the page
    stays un-acked until kombu's visibility timeout (an hour) gives it back."""
    lists = [key for lane in Lane for key in broker_keys(lane)]
    with client.pipeline(transaction=False) as pipe:
        for key in lists:
            pipe.llen(key)
        pipe.hlen(keys.UNACKED)
        pipe.zcard(keys.DELAYED)
        pipe.zcard(keys.RELEASING)
        for lane in Lane:
            fair.held(pipe, lane)
        sizes = pipe.execute()
    if sum(fair.count(n) for n in sizes) > limit:
        return None
    prefix = prefix_of(client)  # the lists and set prefixes below are script arguments, not keys
    structures = [fair.structure_keys(lane, prefix) for lane in Lane]
    queued, unacked, delayed, releasing = client.eval(
        _SNAPSHOT, 4 + len(structures), keys.UNACKED, keys.UNACKED_INDEX, keys.DELAYED, keys.RELEASING,
        *(s[0] for s in structures), repr(unacked_since), *(prefix + key for key in lists), *(prefix for s in structures for prefix in s[1:]))
    found: set[str] = set()
    for raw in queued:
        _add(found, raw)
    for value in unacked:
        try:
            _add(found, json.dumps(json.loads(value)[0]).encode())
        except (ValueError, IndexError, TypeError):
            continue
    for member in (*delayed, *releasing):
        try:
            found.add(PageMessage.parse(member).job_id)
        except ValueError:
            continue
    return found


def _add(found: set[str], raw: Any) -> None:
    try:
        found.add(page_job_id(raw))
    except BadMessage:
        pass
