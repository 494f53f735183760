"""The one Redis client of a process: every part that reads or writes paperlane's own keys shares its pool.

A worker's lane gate, delayed set, retry clock, engine answers, lease keeper, dead letters and metrics, the API's
rate limits: each takes this client instead of opening its own. Celery's broker connection (kombu) is Celery's
own and stays apart.
"""

from __future__ import annotations

import redis

from paperlane.priority.keyspace import with_prefix
from paperlane.settings import RedisSettings

# Seconds a command may take before the caller hears the broker is unreachable. A blocking read (the retry clock's
# subscription) waits with its own, shorter timeout, never on this one.
SOCKET_TIMEOUT = 5.0


def open_redis(cfg: RedisSettings) -> redis.Redis:
    """A client with a connection pool of its own, for one process; close it when the process stops."""
    client = redis.Redis.from_url(cfg.url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT,
                                  socket_keepalive=True)
    return with_prefix(client, cfg.key_prefix)  # every key under redis.key_prefix (priority.keyspace)
