"""A private event loop on a background thread, for engines whose clients are asyncio-native.

The worker's task slots are threads; each calls ``run`` with a coroutine and blocks on its result,
while all of them share one loop (one HTTP connection pool, one vLLM engine client).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import threading
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (its exception is raised here)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)


class PriorityLimiter:
    """At most ``limit`` holders at once; waiters get in lowest priority number first, then in arrival order.

    The client-side twin of vLLM's priority scheduling: when a worker has more pages ready than it
    may have at the server, an interactive page takes the next free place ahead of the batch pages
    already waiting (an ``asyncio.Semaphore`` would serve them first come, first served). An ``urgent``
    holder (an interactive page) does not wait at all: it takes a place over the limit if none is free,
    and the places it borrowed are paid back before any waiter gets in (interactive pages are few: the
    worker's lane scheduler bounds them; the server's priority queue puts them first there too).
    ``limit`` may be changed while holders and waiters are there (``set_limit``: the window controller
    of models/window.py): a higher one lets waiters in at once, a lower one lets nobody in until the
    holders are fewer than it. Used from one event loop only.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self.held = 0  # holders now, urgent ones included
        self._waiting = 0  # waiters now (cancelled ones left in the heap are not counted)
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._blocked = False  # a waiter had to wait since ``take_blocked`` was last called

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def waiting(self) -> int:
        """Holders-to-be waiting for a place now."""
        return self._waiting

    def set_limit(self, limit: int) -> None:
        """Let at most ``limit`` (at least 1) hold places from now on; waiters get in at once if it rose."""
        self._limit = max(1, limit)
        self._admit()

    def take_blocked(self) -> bool:
        """Whether any waiter had to wait (the limit held someone back) since the last call; resets it."""
        blocked, self._blocked = self._blocked or self._waiting > 0, False
        return blocked

    @contextlib.asynccontextmanager
    async def slot(self, priority: int, *, urgent: bool = False) -> AsyncIterator[None]:
        if urgent:
            self.held += 1  # at once, if need be over the limit (paid back before any waiter gets in)
        else:
            await self._acquire(priority)
        try:
            yield
        finally:
            self.held -= 1
            self._admit()

    async def _acquire(self, priority: int) -> None:
        if self.held < self._limit and not self._waiting:
            self.held += 1
            return
        self._blocked = True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._seq), fut))
        self._waiting += 1
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # the place was handed over just as we were cancelled
                self.held -= 1
                self._admit()
            else:
                fut.cancel()  # skipped by _admit
                self._waiting -= 1
            raise

    def _admit(self) -> None:
        while self.held < self._limit and self._waiters:
            _, _, fut = heapq.heappop(self._waiters)
            if fut.done():  # cancelled while waiting
                continue
            self._waiting -= 1
            self.held += 1
            fut.set_result(None)  # the place passes straight to the most urgent waiter
