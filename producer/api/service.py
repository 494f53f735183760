"""What the routes share (settings, database, object store, broker, Redis, the lanes' fair share, their threads) and
who is calling: a key's caller, found by the guard (``producer.api.guard``) before anything of the request was read,
within its rates and its tenant's monthly budget.

Work that waits on others runs on threads of its own kind, so that one kind cannot hold the others up: uploads
are registered under ``registration`` (``api.register_threads``), streams and long polls read the database under
``streams`` (``api.stream_threads``), callback hosts resolve on ``dns`` (``api.webhook_concurrency``), S3 ingests
register on ``ingests`` (``api.ingest_threads``, one per tenant at a time), archive formats are built in processes
of their own (``builder``, ``api.build_processes``), outside this interpreter; the rest (key lookups, status reads)
shares anyio's default threads. ``/healthz`` needs none.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from datetime import time as clock
from functools import cached_property, partial
from typing import Annotated, Any, TypeVar

import redis
from anyio import CapacityLimiter, to_thread
from fastapi import Depends, Request

from paperlane.errors import UsageError
from paperlane.priority.broker import PagePublisher, make_celery
from paperlane.priority.connection import open_redis
from paperlane.priority.fair import FairLanes
from paperlane.producer.api.builds import Builder, Draw
from paperlane.producer.api.errors import ApiError
from paperlane.producer.api.limits import Limits
from paperlane.settings import Settings
from paperlane.storage import usage
from paperlane.storage.db import Database, utcnow
from paperlane.storage.objects import ObjectStore, open_store
from paperlane.storage.tenants import Caller, PageBudget, authenticate, hash_key, key_active

T = TypeVar("T")

_AUTH_TTL = 5.0  # seconds a key's lookup is reused (a revoked key stops within this)
CALLER = "paperlane_caller"  # the ASGI scope's entry the guard puts the caller in


@dataclass
class Service:
    settings: Settings
    db: Database
    store: ObjectStore
    publisher: PagePublisher
    redis: redis.Redis
    limits: Limits
    registration: CapacityLimiter
    streams: CapacityLimiter
    dns: ThreadPoolExecutor
    ingests: ThreadPoolExecutor
    builder: Builder
    auth_cache: dict[str, tuple[float, Caller]] = field(default_factory=dict)  # key digest -> (until, caller)
    live_cache: dict[str, tuple[float, bool]] = field(default_factory=dict)  # key id -> (until, not revoked)
    registering: set[asyncio.Future[None]] = field(default_factory=set)  # S3 ingests being registered
    registering_tenants: set[str] = field(default_factory=set)  # ... their tenants
    stopping: threading.Event = field(default_factory=threading.Event)  # the API is stopping: so does registration
    uploads: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(16, thread_name_prefix="upload"))

    @classmethod
    def open(cls, settings: Settings, *, draw: Draw | None = None) -> Service:
        """Open what the routes share; call it in the event loop (the limiters belong to it). ``draw``: what draws
        annotated images on request (``Builder``)."""
        api = settings.api
        db = Database(settings.database_url, pool_size=settings.database.pool_size)
        client = open_redis(settings.redis)
        return cls(settings, db, open_store(settings), PagePublisher(make_celery(settings)), client, Limits(client),
                   registration=CapacityLimiter(api.register_threads), streams=CapacityLimiter(api.stream_threads),
                   dns=ThreadPoolExecutor(api.webhook_concurrency, thread_name_prefix="dns"),
                   ingests=ThreadPoolExecutor(api.ingest_threads, thread_name_prefix="ingest"),
                   builder=Builder(settings, draw=draw))

    @cached_property
    def fair(self) -> FairLanes:
        """The lanes' fair share, read for an ingest's share of the engine."""
        return FairLanes(self.redis, buffer=self.settings.fair_share.buffer)

    async def stop(self) -> None:
        """Stop registering S3 ingests (call it before ``close``, in the event loop): an ingest waiting for room in
        its tenant's budget (a task, no thread) is cancelled and closes itself with why; one registering on a
        thread sees ``stopping`` and does the same."""
        self.stopping.set()
        waiting = list(self.registering)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)

    def close(self) -> None:
        self.stopping.set()
        self.ingests.shutdown(wait=True)
        self.dns.shutdown(wait=False, cancel_futures=True)
        self.uploads.shutdown(wait=True)
        self.builder.close()
        self.db.dispose()
        self.redis.close()

    def caller(self, key: str) -> Caller | None:
        """The caller a key belongs to (looked up again every few seconds), or None. Blocks: call it in a thread.

        Only keys found are remembered, by their digest: a refused key (however long) is not kept."""
        now = time.monotonic()
        digest = hash_key(key)
        cached = self.auth_cache.get(digest)
        if cached is None or cached[0] < now:
            found = authenticate(self.db, key)
            if found is None:
                self.auth_cache.pop(digest, None)
                return None
            if len(self.auth_cache) > 10_000:
                self.auth_cache.clear()
            cached = (now + _AUTH_TTL, found)
            self.auth_cache[digest] = cached
        return cached[1]

    def cached_caller(self, key: str) -> Caller | None:
        """The caller of a key looked up before (``caller``), from the cache alone, however old: what it says of
        who holds the key (its tenant) never changes. Never the database: call it in the event loop."""
        cached = self.auth_cache.get(hash_key(key))
        return cached[1] if cached is not None else None

    def live(self, who: Caller, *, fresh: bool = False) -> bool:
        """Whether the caller's key is still not revoked: looked up again every few seconds (``fresh``: now), so
        what a revoked key opened (a stream, an ingest's registration) stops within the key cache's lifetime.
        Blocks: call it in a thread."""
        now = time.monotonic()
        cached = None if fresh else self.live_cache.get(who.key_id)
        if cached is None or cached[0] < now:
            if len(self.live_cache) > 10_000:
                self.live_cache.clear()
            cached = (now + _AUTH_TTL, key_active(self.db, who.key_id))
            self.live_cache[who.key_id] = cached
        return cached[1]

    def check_live(self, who: Caller, *, fresh: bool = False) -> None:
        """401 when the caller's key was revoked (``live``)."""
        if not self.live(who, fresh=fresh):
            raise ApiError(401, "unauthorized", "this API key was revoked", {"WWW-Authenticate": "Bearer"})

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the threads of streams and long polls."""
        return await to_thread.run_sync(partial(fn, *args), limiter=self.streams)

    async def resolving(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, which resolves a callback's host, within ``api.webhook_timeout``; 400 past it."""
        loop = asyncio.get_running_loop()
        timeout = self.settings.api.webhook_timeout
        try:
            return await asyncio.wait_for(loop.run_in_executor(self.dns, partial(fn, *args)), timeout)
        except TimeoutError:
            raise UsageError(f"callback_url's host did not resolve within {timeout:g} s") from None

    def pages(self, who: Caller) -> PageBudget:
        """The caller's tenant's budget of pages in flight."""
        return PageBudget(self.db, who.tenant_id, default_cap=self.settings.api.max_pages_in_flight)


async def service(request: Request) -> Service:
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(service)]


async def caller(request: Request) -> Caller:
    """The caller the guard found for this request (401 on a route it did not guard: none should exist)."""
    found = request.scope.get(CALLER)
    if not isinstance(found, Caller):
        raise ApiError(401, "unauthorized", "an API key is needed: Authorization: Bearer KEY",
                       {"WWW-Authenticate": "Bearer"})
    return found


CallerDep = Annotated[Caller, Depends(caller)]


def check_room(svc: Service, who: Caller) -> None:
    """429 when the caller's tenant has as many pages in flight as it may."""
    in_flight, cap = svc.pages(who).room()
    if in_flight >= cap:
        raise ApiError(429, "too_many_pages", f"this tenant has {in_flight:,} pages in flight (at most {cap:,})",
                       {"Retry-After": "10"})


def check_budget(svc: Service, who: Caller) -> None:
    """429 when the tenant's monthly page budget is used up (pages final this month and pages not final yet);
    pages registered before go on. The answer says when the budget starts again. A quick refusal only: the budget
    is held by the reservation of each document's pages (``PageBudget.reserve``, ``monthly_refusal``)."""
    found = usage.budget(svc.db, who.tenant_id)
    if found.exhausted and found.limit is not None:
        raise monthly_refusal(who, used=found.used, limit=found.limit)


def monthly_refusal(who: Caller, *, used: int, limit: int) -> ApiError:
    """The 429 of a tenant whose monthly page budget is used up, saying when it starts again."""
    now = utcnow()
    resets = usage.next_month(now)
    starts = datetime.combine(resets, clock(), tzinfo=now.tzinfo)
    return ApiError(429, "monthly_budget_used", f"tenant {who.tenant} has used {used} of its {limit} pages "
                    f"this month; new uploads and ingests are refused until {resets.isoformat()} (UTC)",
                    {"Retry-After": str(max(1, int((starts - now).total_seconds())))})
