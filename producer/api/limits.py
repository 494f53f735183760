"""The API's limits kept in Redis, shared by every replica: sliding windows of requests (per key, per tenant, and
failed authentications per client address), a tenant's budget of costly work (a token bucket, refilled evenly:
pages of archive formats built on request), and a key's open streams.

A window is a log of the last minute's requests (a sorted set scored by time): a request is let in while every log
it counts in holds fewer than its limit, so no burst at a minute's edge doubles the rate, as a fixed window allows.
A refused request is not logged: a client that keeps knocking gets in again as its old requests age out. Each
check is one script, atomic in Redis, so replicas cannot let in more than the limit between them.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass

import redis

from paperlane.errors import StorageUnavailable
from paperlane.priority import keys

WINDOW = 60.0  # seconds of a sliding window: the limits are "per minute"

# KEYS: the logs; ARGV: now (ms), window (ms), this request's member, whether to log it ("1"), then one limit per
# log. Returns 0 when let in (and logged), otherwise the ms until the oldest entry of a full log ages out.
_WINDOW = """
local now, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local wait = 0
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  if redis.call('ZCARD', key) >= tonumber(ARGV[4 + i]) then
    local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    wait = math.max(wait, tonumber(oldest[2]) + window - now, 1)
  end
end
if wait > 0 then return wait end
if ARGV[4] == '1' then
  for _, key in ipairs(KEYS) do
    redis.call('ZADD', key, now, ARGV[3])
    redis.call('PEXPIRE', key, window)
  end
end
return 0
"""

# KEYS[1]: a key's streams (stream -> when it lapses, ms); ARGV: now, lapse, stream, cap. Adds the stream unless
# the key has ``cap`` live ones already: 1 when added, 0 when refused.
_OPEN = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
return 1
"""


# KEYS[1]: a bucket (a hash: its level and when it was last filled); ARGV: now (ms), capacity, refill per ms, cost.
# Takes ``cost`` (at most the whole bucket) when the bucket holds it: 0; otherwise the ms until it will.
_COST = """
local now, cap, rate = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local cost = math.min(tonumber(ARGV[4]), cap)
local held = redis.call('HMGET', KEYS[1], 't', 'v')
local level = tonumber(held[2]) or cap
level = math.min(cap, level + (now - (tonumber(held[1]) or now)) * rate)
if level < cost then return math.max(1, math.ceil((cost - level) / rate)) end
redis.call('HSET', KEYS[1], 't', now, 'v', level - cost)
redis.call('PEXPIRE', KEYS[1], math.ceil(cap / rate) + 1000)
return 0
"""


@dataclass
class Limits:
    """The scripts, loaded once per process on the process's Redis client."""

    redis: redis.Redis

    def __post_init__(self) -> None:
        self._window = self.redis.register_script(_WINDOW)
        self._open = self.redis.register_script(_OPEN)
        self._cost = self.redis.register_script(_COST)

    def spend(self, subject: str, cost: int, *, per_minute: int) -> float:
        """Take ``cost`` from ``subject``'s budget of ``per_minute`` (refilled evenly; a cost over the whole of it
        takes the whole of it); 0 when taken, else the seconds until it could be. Raises StorageUnavailable."""
        try:
            wait = self._cost(keys=[keys.rate(f"cost.{subject}")],
                              args=[_ms(), per_minute, per_minute / (WINDOW * 1000), cost])
        except redis.RedisError as exc:
            raise StorageUnavailable(f"redis: {exc}") from exc
        return int(wait) / 1000

    def admit(self, limits: dict[str, int], *, log: bool = True) -> float:
        """Let one request in if every subject (``"key.<id>"``, ...) has had fewer than its limit in the last
        minute, and log it (``log``); 0 when let in, else the seconds to wait. Raises StorageUnavailable."""
        now = _ms()
        names = [keys.rate(subject) for subject in limits]
        member = f"{now}.{uuid.uuid4().hex[:8]}"
        try:
            wait = self._window(keys=names, args=[now, int(WINDOW * 1000), member, int(log), *limits.values()])
        except redis.RedisError as exc:
            raise StorageUnavailable(f"redis: {exc}") from exc
        return int(wait) / 1000

    def count(self, subject: str) -> None:
        """Log one more request of ``subject`` (a failed authentication), whatever its count."""
        self.admit({subject: 2**31}, log=True)

    def open_stream(self, key_id: str, stream: str, *, cap: int, lapse: float) -> bool:
        """Count ``stream`` among the key's open streams for ``lapse`` seconds, unless it holds ``cap`` already."""
        now = _ms()
        try:
            return bool(self._open(keys=[keys.streams(key_id)], args=[now, now + int(lapse * 1000), stream, cap]))
        except redis.RedisError as exc:
            raise StorageUnavailable(f"redis: {exc}") from exc

    def renew_stream(self, key_id: str, stream: str, *, lapse: float) -> None:
        """The stream is still open: keep it counted ``lapse`` seconds more."""
        until = _ms() + int(lapse * 1000)
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(keys.streams(key_id), {stream: until}, xx=True)
            pipe.pexpireat(keys.streams(key_id), until)
            pipe.execute()

    def close_stream(self, key_id: str, stream: str) -> None:
        self.redis.zrem(keys.streams(key_id), stream)


def retry_after(seconds: float) -> str:
    """A Retry-After header's value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))


def _ms() -> int:
    return int(time.time() * 1000)
