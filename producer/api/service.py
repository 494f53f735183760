"""What the routes share (settings, database, object store, broker, Redis) and who is calling: a key's caller,
within its rate."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Annotated

import redis
from fastapi import Depends, Request

from paperlane.errors import StorageUnavailable
from paperlane.priority import keys
from paperlane.priority.broker import make_celery
from paperlane.priority.connection import open_redis
from paperlane.producer.api.errors import ApiError
from paperlane.producer.submit import CeleryPublisher
from paperlane.settings import Settings
from paperlane.storage import ingests
from paperlane.storage.db import Database
from paperlane.storage.objects import ObjectStore, open_store
from paperlane.storage.tenants import Caller, authenticate

_AUTH_TTL = 5.0  # seconds a key's lookup is reused (a revoked key stops within this)


@dataclass
class Service:
    settings: Settings
    db: Database
    store: ObjectStore
    publisher: CeleryPublisher
    redis: redis.Redis
    auth_cache: dict[str, tuple[float, Caller | None]] = field(default_factory=dict)
    registering: set[asyncio.Future[None]] = field(default_factory=set)  # S3 ingests being registered
    uploads: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(16, thread_name_prefix="upload"))

    @classmethod
    def open(cls, settings: Settings) -> Service:
        db = Database(settings.database_url, pool_size=settings.database.pool_size)
        return cls(settings, db, open_store(settings), CeleryPublisher(make_celery(settings)),
                   open_redis(settings.redis))

    def close(self) -> None:
        self.uploads.shutdown(wait=True)
        self.db.dispose()
        self.redis.close()


def service(request: Request) -> Service:
    return request.app.state.service  # type: ignore[no-any-return]


ServiceDep = Annotated[Service, Depends(service)]


def caller(request: Request) -> Caller:
    """The key's caller, rate limited; 401 without a valid key, 429 past the key's rate."""
    svc = service(request)
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(401, "unauthorized", "an API key is needed: Authorization: Bearer KEY",
                       {"WWW-Authenticate": "Bearer"})
    key = key.strip()
    now = time.monotonic()
    cached = svc.auth_cache.get(key)
    if cached is None or cached[0] < now:
        if len(svc.auth_cache) > 10_000:
            svc.auth_cache.clear()
        cached = (now + _AUTH_TTL, authenticate(svc.db, key))
        svc.auth_cache[key] = cached
    found = cached[1]
    if found is None:
        raise ApiError(401, "unauthorized", "unknown or revoked API key", {"WWW-Authenticate": "Bearer"})
    _rate_limit(svc, found)
    return found


CallerDep = Annotated[Caller, Depends(caller)]


def _rate_limit(svc: Service, who: Caller) -> None:
    """A fixed one-minute window per key, counted in Redis (shared by every replica)."""
    window = int(time.time() // 60)
    name = keys.rate(who.key_id, window)
    try:
        with svc.redis.pipeline(transaction=False) as pipe:
            pipe.incr(name)
            pipe.expire(name, 120)
            count, _ = pipe.execute()
    except redis.RedisError as exc:
        raise StorageUnavailable(f"redis: {exc}") from exc
    if int(count) > svc.settings.api.rate_per_minute:
        retry = 60 - int(time.time()) % 60
        raise ApiError(429, "rate_limited", f"more than {svc.settings.api.rate_per_minute} requests a minute "
                       "with this key", {"Retry-After": str(retry)})


def check_room(svc: Service, who: Caller) -> None:
    """429 when the key has ``api.max_pages_in_flight`` pages or more not final yet."""
    in_flight = ingests.pages_in_flight(svc.db, api_key_id=who.key_id)
    cap = svc.settings.api.max_pages_in_flight
    if in_flight >= cap:
        raise ApiError(429, "too_many_pages", f"{in_flight} pages of this key are not finished (at most {cap})",
                       {"Retry-After": "10"})
