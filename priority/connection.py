"""Redis clients for paperlane's own keys, opened here only (``open_redis``): one per process, handed to its parts.

The worker (``workers.worker.Worker.open``) and the API (``producer.api.service.Service.open``) each open one
and hand it to their parts: a worker's lane gate, delayed set, retry clock, engine answers, lease keeper, dead
letters and metrics, the API's rate limits and fair-share reads; a command of the CLI opens one for itself.
Celery's broker connection (kombu) keeps pools of its own, and not only for the lane lists: the transport
(``priority.transport``) writes the fair-share structures and the dead letters through them when it publishes
and pops. So a worker or an API process holds this client's pool and kombu's.
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
