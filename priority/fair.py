"""Weighted fair share within a lane: between tenants, then between a tenant's ingests, kept in Redis.

A lane's Celery queue (kombu's priority lists, ``keys.queue``) stays what workers consume, but only as a short
buffer of at most ``buffer`` messages. A page's message, when published, goes into the lane's fair-share
structure instead (``priority.transport`` does this for kombu's ``_put``):

    lane      sorted set of tenants with pages waiting, scored by pass (their virtual time)
    tenant    sorted set of its ingests with pages waiting, scored by pass within the tenant
    ingest    sorted set of its raw messages, scored by (message priority, arrival): its own order kept

and the same script refills the buffer. A refill, while the buffer holds fewer than ``buffer`` messages, picks
the tenant with the lowest pass, its ingest with the lowest pass, moves that ingest's first message onto the
buffer list of its message priority, and advances both passes by 1/weight (stride scheduling). A tenant or
ingest whose last message moved leaves its set (an idle tenant has no key); one that (re)arrives starts at the
lane's (the tenant's) virtual time, the lowest pass waiting, so it gets its share at once and no credit for the
time it was away. A tenant that leaves while ahead of that virtual time is remembered (``gone``) until the
lane catches up, so leaving and coming back cannot jump the line; nobody else waiting, everything resets.

Workers refill by one after every lane message they pop (``priority.transport``), so the buffer stays full while
pages wait; the lease keeper's sweep also refills, for a refill lost with a worker killed between its pop and
its refill. Every step is one Lua script, atomic in Redis: any number of workers on any number of machines share
one structure. One page costs one script where it is published (instead of kombu's LPUSH) and one after its
pop: O(log n) each, nothing per idle tenant, nothing per unit of time. The interactive lane has a structure of
its own, and its buffer's message priorities (0-4) still come before batch's (5-9) in every worker's pop.

The scripts touch keys they derive from the tenant and ingest (prefixes from ``priority.keys``): fine on one
Redis, as paperlane runs it; not on Redis Cluster.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis
from redis.client import Pipeline
from redis.commands.core import Script

from paperlane.priority import keys
from paperlane.priority.keyspace import prefix_of
from paperlane.priority.lanes import LEVELS_PER_LANE, Lane
from paperlane.status import EngineShare

log = logging.getLogger(__name__)

HEADER = "paperlane_share"  # the Celery message header a page's share travels in
_PRIORITY_SCALE = 1e13  # a message's score: priority * scale + its arrival number

# Shared by the scripts. KEYS: 1 tenants, 2 gone, 3 state, 4 weights, 5.. the lane's buffer lists, one per message
# priority of the lane, its first priority first; ARGV: 1 tenant-set prefix, 2 ingest-set prefix, 3 buffer size,
# 4 picks prefix, 5 lane, 6 the lane's first message priority, 7 the presence set (``priority.presence``).
# A message put with its job id waits as "<job id>\n<message>" and its job id is in the presence set until the
# message moves to the buffer: the same script takes both out, so a failover cannot split them.
_LIB = """
local TENANTS, GONE, STATE, WEIGHTS = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local TENANT_PREFIX, INGEST_PREFIX, PRESENT = ARGV[1], ARGV[2], ARGV[7]

-- A waiting member's message, its job id taken out of the presence set when ``leaving``.
local function unwrap(member, leaving)
  local nl = string.find(member, '\\n', 1, true)
  if nl == nil then return member end
  if leaving then redis.call('SREM', PRESENT, string.sub(member, 1, nl - 1)) end
  return string.sub(member, nl + 1)
end

local function num(x) return string.format('%.17g', x) end

local function first(z)
  local f = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
  if #f == 0 then return nil, nil end
  return f[1], tonumber(f[2])
end

-- Queue one message behind its ingest; a tenant or ingest (re)arriving starts at the virtual time, its weight
-- as its message gives it.
local function add(message, priority, t, i, tw, iw)
  local tk, ik = TENANT_PREFIX .. t, INGEST_PREFIX .. t .. '.' .. i
  local seq = redis.call('HINCRBY', STATE, 'seq', 1)
  redis.call('ZADD', ik, string.format('%.0f', priority * SCALE + seq), message)
  redis.call('HINCRBY', STATE, 'held', 1)
  if redis.call('ZCARD', ik) > 1 then return end
  local _, tvt = first(tk)
  if tvt == nil then
    local _, vt = first(TENANTS)
    local pass = 0
    if vt == nil then
      redis.call('DEL', GONE)
    else
      pass = math.max(vt, tonumber(redis.call('ZSCORE', GONE, t) or vt))
      redis.call('ZREM', GONE, t)
    end
    redis.call('ZADD', TENANTS, num(pass), t)
    redis.call('HSET', WEIGHTS, t, tw)
    tvt = 0
  end
  redis.call('ZADD', tk, num(tvt), i)
  redis.call('HSET', WEIGHTS, t .. '.' .. i, iw)
end

-- Take the next message by fair share: {message, priority}, or nil when nothing waits. A tenant or ingest listed
-- with nothing behind it (keys removed by hand) is dropped on the way.
local function pick()
  local t, tpass = first(TENANTS)
  while t ~= nil do
    local tk = TENANT_PREFIX .. t
    local i, ipass = first(tk)
    if i == nil then
      redis.call('ZREM', TENANTS, t)
    else
      local field = t .. '.' .. i
      local ik = INGEST_PREFIX .. field
      local popped = redis.call('ZPOPMIN', ik)
      if #popped == 0 then
        redis.call('ZREM', tk, i)
      else
        redis.call('HINCRBY', STATE, 'held', -1)
        local w = redis.call('HMGET', WEIGHTS, t, field)
        if redis.call('EXISTS', ik) == 1 then
          redis.call('ZADD', tk, num(ipass + 1 / tonumber(w[2] or '1')), i)
        else
          redis.call('ZREM', tk, i)
          redis.call('HDEL', WEIGHTS, field)
        end
        local tnext = tpass + 1 / tonumber(w[1] or '1')
        if redis.call('EXISTS', tk) == 1 then
          redis.call('ZADD', TENANTS, num(tnext), t)
        else
          -- It leaves. Remembered while ahead of the virtual time (the lowest pass still waiting), so leaving and
          -- coming back gains it nothing; whoever the lane has caught up with is forgotten.
          redis.call('ZREM', TENANTS, t)
          redis.call('HDEL', WEIGHTS, t)
          local _, vt = first(TENANTS)
          if vt == nil then
            redis.call('DEL', GONE)
          else
            redis.call('ZREMRANGEBYSCORE', GONE, '-inf', num(vt))
            if tnext > vt then redis.call('ZADD', GONE, num(tnext), t) end
          end
        end
        return {unwrap(popped[1], true), math.floor(tonumber(popped[2]) / SCALE)}
      end
    end
    t, tpass = first(TENANTS)
  end
  return nil
end

-- Fill the buffer up to its size, moving at most ``most`` messages; how many moved.
local function refill(most)
  local size, base = tonumber(ARGV[3]), tonumber(ARGV[6])
  local n = 0
  for k = 5, #KEYS do n = n + redis.call('LLEN', KEYS[k]) end
  local moved = 0
  while n < size and moved < most do
    local m = pick()
    if m == nil then break end
    redis.call('LPUSH', KEYS[5 + m[2] - base], m[1])
    n = n + 1
    moved = moved + 1
  end
  if moved > 0 then
    local picks = ARGV[4] .. math.floor(tonumber(redis.call('TIME')[1]) / 60)
    if redis.call('HINCRBY', picks, ARGV[5], moved) == moved then redis.call('EXPIRE', picks, 180) end
  end
  return moved
end
""".replace("SCALE", f"{_PRIORITY_SCALE:.0f}")

# ARGV 8..: message, priority, tenant, ingest, tenant weight, ingest weight, then (optional) the message's job id:
# marked present in the same script, so a write lost at a failover loses both together.
_PUT = _LIB + """
local member = ARGV[8]
if ARGV[14] then
  member = ARGV[14] .. '\\n' .. member
  redis.call('SADD', PRESENT, ARGV[14])
end
add(member, tonumber(ARGV[9]), ARGV[10], ARGV[11], ARGV[12], ARGV[13])
return refill(tonumber(ARGV[3]))
"""

# ARGV 8: the most messages to move.
_REFILL = _LIB + "return refill(tonumber(ARGV[8]))"

# Lua: append every message waiting in a lane's structure to ``out`` (tenants set, tenant prefix, ingest prefix).
WAITING_LUA = """
local function waiting(tenants, tenant_prefix, ingest_prefix, out)
  for _, t in ipairs(redis.call('ZRANGE', tenants, 0, -1)) do
    for _, i in ipairs(redis.call('ZRANGE', tenant_prefix .. t, 0, -1)) do
      for _, m in ipairs(redis.call('ZRANGE', ingest_prefix .. t .. '.' .. i, 0, -1)) do
        local nl = string.find(m, '\\n', 1, true)
        out[#out + 1] = nl and string.sub(m, nl + 1) or m
      end
    end
  end
  return out
end
"""

_WAITING = WAITING_LUA + "return waiting(KEYS[1], ARGV[1], ARGV[2], {})"

# KEYS: tenants, gone, state, weights; ARGV: tenant prefix, ingest prefix, presence set. Empties the lane's
# structure (its pages no longer present); how many messages it held.
_PURGE = """
local n = 0
for _, t in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  for _, i in ipairs(redis.call('ZRANGE', ARGV[1] .. t, 0, -1)) do
    local ik = ARGV[2] .. t .. '.' .. i
    for _, m in ipairs(redis.call('ZRANGE', ik, 0, -1)) do
      local nl = string.find(m, '\\n', 1, true)
      if nl then redis.call('SREM', ARGV[3], string.sub(m, 1, nl - 1)) end
    end
    n = n + redis.call('ZCARD', ik)
    redis.call('DEL', ik)
  end
  redis.call('DEL', ARGV[1] .. t)
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[4])
redis.call('HSET', KEYS[3], 'held', 0)
return n
"""

# KEYS: tenants, weights, the tenant's ingests set; ARGV: tenant, ingest, picks prefix, lane.
# Returns {waiting (0/1), tenant weight, sum of tenants' weights, ingest weight, sum of the tenant's ingests'
# weights, this lane's picks, all lanes' picks (this minute and the last), seconds those picks span}.
_SHARE = """
local function weight(field) return tonumber(redis.call('HGET', KEYS[2], field) or '1') end
local t, i = ARGV[1], ARGV[2]
local waiting = redis.call('ZSCORE', KEYS[3], i) and 1 or 0
local tsum, isum = 0, 0
for _, other in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do tsum = tsum + weight(other) end
for _, other in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do isum = isum + weight(t .. '.' .. other) end
local now = redis.call('TIME')
local minute = math.floor(tonumber(now[1]) / 60)
local lane, all = 0, 0
for m = minute - 1, minute do
  local counts = redis.call('HGETALL', ARGV[3] .. m)
  for k = 1, #counts, 2 do
    all = all + tonumber(counts[k + 1])
    if counts[k] == ARGV[4] then lane = lane + tonumber(counts[k + 1]) end
  end
end
local span = 60 + tonumber(now[1]) % 60 + tonumber(now[2]) / 1e6
return {waiting, tostring(weight(t)), tostring(tsum), tostring(weight(t .. '.' .. i)), tostring(isum),
        lane, all, tostring(span)}
"""

# KEYS: weights, tenants; ARGV: tenant, weight. A tenant's new weight, applied at once while it has pages waiting.
_SET_WEIGHT = """
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) return 1 end
return 0
"""


@dataclass(frozen=True)
class Share:
    """Whose page a message is, for fair share: its tenant and ingest and their weights."""

    tenant: str = keys.NO_TENANT
    ingest: str = keys.NO_TENANT
    tenant_weight: float = 1.0
    ingest_weight: float = 1.0

    @classmethod
    def of(cls, tenant: str | None, ingest: str | None, tenant_weight: float | None = None,
           ingest_weight: float | None = None) -> Share:
        """A share from database values: no tenant (the command line) and no weight are the defaults."""
        return cls(tenant or keys.NO_TENANT, ingest or keys.NO_TENANT, _weight(tenant_weight),
                   _weight(ingest_weight))

    def header(self) -> dict[str, Any]:
        """The message header's value (``priority.messages`` checks it)."""
        return {"tenant": self.tenant, "ingest": self.ingest, "tenant_weight": self.tenant_weight,
                "ingest_weight": self.ingest_weight}

    def words(self) -> list[str]:
        """Four words without spaces (ids are checked to have none), for the delayed set's members."""
        return [self.tenant, self.ingest, repr(self.tenant_weight), repr(self.ingest_weight)]

    @classmethod
    def of_words(cls, words: list[str]) -> Share:
        tenant, ingest, tw, iw = words
        return cls(tenant, ingest, float(tw), float(iw))


def _weight(value: float | None) -> float:
    return 1.0 if value is None else float(value)


class FairLanes:
    """The fair-share scripts, registered once per process and run on any client of the same Redis."""

    def __init__(self, client: redis.Redis, *, buffer: int = 4) -> None:
        if buffer < 1:
            raise ValueError("the fair-share buffer holds at least one message")
        self._redis = client
        self._prefix = prefix_of(client)  # key names the scripts build from ARGV need it (priority.keyspace)
        self.buffer = buffer
        self._put = Script(client, _PUT)
        self._refill = Script(client, _REFILL)
        self._purge = Script(client, _PURGE)
        self._waiting = Script(client, _WAITING)
        self._share = Script(client, _SHARE)
        self._set_weight = Script(client, _SET_WEIGHT)

    def put(self, lane: Lane, message: bytes | str, priority: int, share: Share, *,
            client: redis.Redis | None = None, job_id: str | None = None) -> int:
        """Queue ``message`` (a page's, at message ``priority``, one of the lane's) behind its tenant and ingest in
        ``lane``, and refill the lane's buffer; how many messages moved to the buffer. ``job_id``: the page's, marked
        present (``priority.presence``) with it."""
        return int(self._put(keys=_keys(lane), args=self._put_args(lane, message, priority, share, job_id),
                             client=client or self._redis))

    def put_command(self, pipe: Pipeline, lane: Lane, message: bytes | str, priority: int, share: Share, *,
                    job_id: str | None = None) -> tuple[Any, ...]:
        """``put`` as the arguments of one ``execute_command`` for ``pipe`` (a pipeline of a client of the same Redis
        and key prefix), whose script this registers with it (loaded, if Redis lost it, before the pipeline runs).
        The command's reply is ``put``'s."""
        pipe.scripts.add(self._put)
        keys_ = _keys(lane)
        return ("EVALSHA", self._put.sha, len(keys_), *keys_, *self._put_args(lane, message, priority, share, job_id))

    def _put_args(self, lane: Lane, message: bytes | str, priority: int, share: Share,
                  job_id: str | None) -> list[Any]:
        if priority not in lane_priorities(lane):
            raise ValueError(f"message priority {priority} is not one of lane {lane.value}'s")
        return [*_args(lane, self.buffer, self._prefix), message, priority, share.tenant, share.ingest,
                share.tenant_weight, share.ingest_weight, *([job_id] if job_id else [])]

    def refill(self, lane: Lane, *, client: redis.Redis | None = None) -> int:
        """Move messages into ``lane``'s buffer until it holds ``buffer`` (or nothing waits); how many moved."""
        return int(self._refill(keys=_keys(lane), args=[*_args(lane, self.buffer, self._prefix), self.buffer],
                                client=client or self._redis))

    def drain(self, lane: Lane, *, chunk: int = 1000) -> int:
        """Move every message waiting in ``lane``'s structure onto its lists, ``chunk`` per script (Redis serves
        others in between), in fair-share order: what fair share turned off leaves behind. How many moved."""
        total = 0
        while True:
            moved = int(self._refill(keys=_keys(lane), args=[*_args(lane, 1 << 60, self._prefix), chunk]))
            total += moved
            if moved < chunk:
                return total

    def purge(self, lane: Lane, *, client: redis.Redis | None = None) -> int:
        """Drop every message waiting in ``lane``'s structure (not its buffer); how many there were."""
        return int(self._purge(keys=_keys(lane)[:4], args=[*_args(lane, self.buffer, self._prefix)[:2],
                                                            self._prefix + keys.PRESENT],
                               client=client or self._redis))

    def waiting(self, lane: Lane) -> list[bytes]:
        """Every message waiting in ``lane``'s structure (not its buffer), read in one script: for operators and
        tests, O(messages)."""
        k = keys.fair(lane.value)
        return list(self._waiting(keys=[k.tenants], args=[self._prefix + k.tenant_prefix, self._prefix + k.ingest_prefix]))

    def share(self, lane: Lane, tenant: str | None, ingest: str) -> EngineShare | None:
        """The ingest's share of the engine now, or None when none of its pages waits in ``lane``'s structure
        (all started, or fair share is off)."""
        t = tenant or keys.NO_TENANT
        waiting, tw, tsum, iw, isum, lane_picks, all_picks, span = self._share(
            keys=[(k := keys.fair(lane.value)).tenants, k.weights, k.tenant_prefix + t],
            args=[t, ingest, self._prefix + keys.FAIR_PICKS, lane.value])
        if not int(waiting):
            return None
        within = float(tw) / float(tsum) * float(iw) / float(isum)
        lane_part = int(lane_picks) / int(all_picks) if int(all_picks) else 1.0
        return EngineShare(within * lane_part, int(all_picks) / float(span) if int(all_picks) else None)

    def share_or_none(self, lane: str, tenant: str | None, ingest: str) -> EngineShare | None:
        """``share``, or None also when Redis cannot say (a status read never fails for it)."""
        try:
            return self.share(Lane(lane), tenant, ingest)
        except (redis.RedisError, ValueError) as exc:
            log.warning("fair share of ingest %s unknown: %s", ingest, exc)
            return None

    def set_weight(self, tenant: str, weight: float) -> int:
        """Apply a tenant's new weight to the pages it has waiting now (new messages carry it anyway); in how
        many lanes it had some."""
        return sum(int(self._set_weight(keys=[keys.fair(lane.value).weights, keys.fair(lane.value).tenants],
                                        args=[tenant, weight])) for lane in Lane)


def held(pipe: Any, lane: Lane) -> None:
    """Queue, on ``pipe``, the read of how many messages wait in ``lane``'s structure (the reply: bytes or None)."""
    pipe.hget(keys.fair(lane.value).state, "held")


def count(reply: Any) -> int:
    """A ``held`` reply as a number."""
    return max(0, int(reply or 0))


def structure_keys(lane: Lane, prefix: str = "") -> list[str]:
    """The lane's tenants set (a key) and the prefixes of its tenant and ingest sets (under the client's key
    ``prefix``, as script arguments): what ``WAITING_LUA`` takes."""
    k = keys.fair(lane.value)
    return [k.tenants, prefix + k.tenant_prefix, prefix + k.ingest_prefix]


def lane_priorities(lane: Lane) -> range:
    """The message priorities of ``lane``'s pages (``lanes.message_priority``)."""
    return range(lane.base_priority, lane.base_priority + LEVELS_PER_LANE)


def _keys(lane: Lane) -> list[str]:
    k = keys.fair(lane.value)
    return [k.tenants, k.gone, k.state, k.weights, *keys.priority_lists(lane.queue, lane_priorities(lane))]


def _args(lane: Lane, buffer: int, prefix: str) -> list[Any]:
    k = keys.fair(lane.value)
    return [prefix + k.tenant_prefix, prefix + k.ingest_prefix, buffer, prefix + keys.FAIR_PICKS,
            lane.value, lane.base_priority, prefix + keys.PRESENT]
