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
    Used from one event loop only.
    """

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    @contextlib.asynccontextmanager
    async def slot(self, priority: int, *, urgent: bool = False) -> AsyncIterator[None]:
        if urgent:
            self._free -= 1  # at once, if need be over the limit (below 0: owed back)
        else:
            await self._acquire(priority)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, priority: int) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._seq), fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # the place was handed over just as we were cancelled
                self._release()
            raise  # a cancelled waiter left in the heap is skipped by _release

    def _release(self) -> None:
        if self._free < 0:  # a place an urgent holder borrowed: paid back, nobody gets in
            self._free += 1
            return
        while self._waiters:
            _, _, fut = heapq.heappop(self._waiters)
            if not fut.done():
                fut.set_result(None)  # the place passes straight to the most urgent waiter
                return
        self._free += 1
