"""Delayed retries: pages due later, put back on their lane when due. One interface, two places to keep them.

``Delayed`` is what a runner needs: ``add`` a page due after some seconds, ``claim_due`` the pages that are
due and how long until the next one is, ``released`` once the claimed pages are back on their lanes. The
retry policy (``paperlane.retry``) says how long; this module only keeps pages until then.

- ``DelayedPages``: in Redis, for workers. A page that failed in a way a later try may fix waits out its
  backoff here: a sorted set scored by the time it is due (Redis server time, so workers' clocks may differ).
  Its lane, message priority and fair share travel with it, so when it is due it goes back onto the same lane
  queue, at the same priority, behind the same tenant and ingest, as a fresh message. Nothing is held in a
  worker's memory (no Celery countdown/ETA message, which a worker keeps reserved outside the lanes, beyond the
  prefetch limit, and takes down with it): a worker that dies leaves its delayed pages to the others. Every
  worker runs a ``RetryClock`` (``paperlane.workers.retry_clock``): it sleeps until the earliest due time it
  knows of and wakes when a worker adds a page (a PUBLISH on ``keys.DELAYED_CHANNEL``). Claiming is atomic: a
  due page moves into a "releasing" set in the same script that takes it, is published, then dropped from that
  set; one whose releaser died half-way is put back after ``STALE_S``. The cost is a few commands per delayed
  page, nothing per unit of time.
- ``InMemoryDelayed``: in the process, for ``paperlane run``, whose pages live and die with it.
"""

from __future__ import annotations

import heapq
import itertools
import time
from typing import Generic, Protocol, TypeVar

import redis

from paperlane.errors import StorageUnavailable
from paperlane.priority import keys
from paperlane.priority.messages import PageMessage

T = TypeVar("T")


class Delayed(Protocol[T]):
    def add(self, page: T, delay: float) -> None:
        """Keep ``page`` until ``delay`` seconds from now. Raises StorageUnavailable."""
        ...

    def claim_due(self, *, limit: int = 100) -> tuple[list[T], float | None]:
        """Take the pages that are due (each claimed by one caller only), and the seconds until the next one is
        (None: nothing is delayed). Claimed pages must be ``released`` once they are back on their lanes."""
        ...

    def released(self, pages: list[T]) -> None:
        """The claimed ``pages`` are back on their lanes."""
        ...

    def pending(self) -> int:
        """Pages delayed or being released."""
        ...


STALE_S = 30.0  # a page claimed this long ago and still not released: its releaser died

# KEYS: delayed, presence set; ARGV: member, delay seconds, job id. Due = Redis server time + delay. The page is
# marked present (``priority.presence``) in the same script.
_SCHEDULE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('SADD', KEYS[2], ARGV[3])
return tostring(now + tonumber(ARGV[2]))
"""

# KEYS: delayed, releasing; ARGV: max pages, stale seconds. Returns {seconds to next due or -1, members...}.
_CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[2]))
for _, m in ipairs(stale) do
  redis.call('ZREM', KEYS[2], m)
  redis.call('ZADD', KEYS[1], now, m)
end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, m in ipairs(due) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('ZADD', KEYS[2], now, m)
end
local wait = -1
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #nxt > 0 then wait = math.max(0, tonumber(nxt[2]) - now) end
local held = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if #held > 0 then
  local w = math.max(0, tonumber(held[2]) + tonumber(ARGV[2]) - now)
  if wait < 0 or w < wait then wait = w end
end
local out = {tostring(wait)}
for _, m in ipairs(due) do table.insert(out, m) end
return out
"""


class DelayedPages:
    """The delayed set in Redis: add pages due later, claim and release those that are due."""

    def __init__(self, client: redis.Redis, *, stale_s: float = STALE_S) -> None:
        self._redis = client
        self._stale_s = stale_s
        self._schedule = client.register_script(_SCHEDULE)
        self._claim = client.register_script(_CLAIM)

    def add(self, page: PageMessage, delay: float) -> None:
        """Put ``page`` back on its lane after ``delay`` seconds. Raises StorageUnavailable."""
        try:
            self._schedule(keys=[keys.DELAYED, keys.PRESENT], args=[page.member(), max(0.0, delay), page.job_id])
            self._redis.publish(keys.DELAYED_CHANNEL, b"1")
        except redis.RedisError as exc:
            raise StorageUnavailable(f"broker unreachable: {exc}", stage="inference") from exc

    def claim_due(self, *, limit: int = 100) -> tuple[list[PageMessage], float | None]:
        wait, *members = self._claim(keys=[keys.DELAYED, keys.RELEASING], args=[limit, self._stale_s])
        seconds = float(wait)
        return [PageMessage.parse(m) for m in members], (None if seconds < 0 else seconds)

    def released(self, pages: list[PageMessage]) -> None:
        if pages:
            self._redis.zrem(keys.RELEASING, *(p.member() for p in pages))

    def pending(self) -> int:
        return int(self._redis.zcard(keys.DELAYED)) + int(self._redis.zcard(keys.RELEASING))


class InMemoryDelayed(Generic[T]):
    """Delayed pages held in this process (``paperlane run``): a heap by due time. Not thread-safe: one
    scheduler thread adds and claims."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, T]] = []
        self._seq = itertools.count()

    def add(self, page: T, delay: float) -> None:
        heapq.heappush(self._heap, (time.monotonic() + max(0.0, delay), next(self._seq), page))

    def claim_due(self, *, limit: int = 100) -> tuple[list[T], float | None]:
        now, due = time.monotonic(), list[T]()
        while self._heap and self._heap[0][0] <= now and len(due) < limit:
            due.append(heapq.heappop(self._heap)[2])
        return due, (max(0.0, self._heap[0][0] - now) if self._heap else None)

    def released(self, pages: list[T]) -> None:
        pass  # claimed pages leave the heap at once: nobody else could claim them

    def pending(self) -> int:
        return len(self._heap)
