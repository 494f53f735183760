"""Redis clients for paperlane's own keys, opened here only (``open_redis``): one per process, handed to its parts.

A worker's lane gate, delayed set, retry clock, engine answers, lease keeper, dead letters and metrics, the API's
rate limits: each takes this client instead of opening its own. Celery's broker connection (kombu) is Celery's
own and stays apart (``priority.broker`` gives it the same Sentinel settings).

With a ``sentinel://`` URL the client is redis-py's Sentinel form (``Sentinel(...).master_for(...)``): each new
connection asks the Sentinels where the master is now. After a failover a command can meet the old master's
socket closed (``ConnectionError``) or, where the old master came back as a replica, ``READONLY`` (redis-py's
Sentinel connection turns that into a ``ConnectionError`` too); either way the command is retried on a fresh
connection, to the new master, a few times with backoff, instead of failing its caller (celery#7946's
``ReadOnlyError`` after failover, for paperlane's own keys). Lua scripts are redis-py ``Script`` objects: a new
master without them in its cache answers ``NOSCRIPT`` and they are loaded again, once.

Every key goes under ``redis.key_prefix`` (``priority.keyspace``), in either form.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, ReadOnlyError, TimeoutError
from redis.retry import Retry
from redis.sentinel import Sentinel

from paperlane.priority.keyspace import with_prefix
from paperlane.settings import RedisSettings

# Seconds a command may take before the caller hears the broker is unreachable. A blocking read (the retry clock's
# subscription) waits with its own, shorter timeout, never on this one.
SOCKET_TIMEOUT = 5.0
# A failover takes Sentinel's down-after time (5 s or more) and an election: ten tries spread over about 13 s.
FAILOVER_RETRIES = 10
FAILOVER_ERRORS = (ConnectionError, TimeoutError, ReadOnlyError)


def open_redis(cfg: RedisSettings) -> redis.Redis:
    """A client with a connection pool of its own, for one process; close it when the process stops."""
    options: dict[str, Any] = {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": SOCKET_TIMEOUT,
                               "socket_keepalive": True}
    if not cfg.sentinels:
        return with_prefix(redis.Redis.from_url(cfg.url, **options), cfg.key_prefix)
    first = urlsplit(cfg.url.split(";")[0])
    db = int(first.path.strip("/") or 0)
    sentinel_password = cfg.sentinel_password.get_secret_value() if cfg.sentinel_password else None
    sentinels = Sentinel(cfg.sentinels, sentinel_kwargs={**options, "password": sentinel_password}, **options)
    retry = Retry(ExponentialBackoff(cap=2.0, base=0.1), FAILOVER_RETRIES)
    client = sentinels.master_for(cfg.master_name, db=db, password=unquote(first.password) if first.password else None,
                                  retry=retry, retry_on_error=list(FAILOVER_ERRORS))
    return with_prefix(client, cfg.key_prefix)  # every key under redis.key_prefix (priority.keyspace)
