"""The fair-turn gate (issue 25): requests take turns in this process, tenant by tenant, so that one tenant's flood
waits behind itself and another tenant's request is let in at the next free turn.

A plain ASGI middleware outside the guard (``producer.api.guard``): at most ``api.concurrent_requests`` requests are
in progress in the process, at most ``api.tenant_concurrent_requests`` of one tenant. The rest wait, each tenant's
in its own first-in first-out queue, and a freed turn goes to the tenants with waiting requests in turn
(round-robin), skipping those that hold all of theirs. More than ``api.tenant_queued_requests`` waiting for one
tenant: 429 ``busy`` with Retry-After, before the key is checked (a request that would wait costs nothing).

Whose turn a request takes is known without the database (``guard.turn_of``): the tenant of a key in the key
cache; an unknown key (or one not looked up yet) waits alone under its own digest, so it cannot take another
tenant's turn; no key, its client address.

Not gated: event streams (they hold their connection for minutes: ``api.max_streams_per_key`` bounds them),
uploads (their bodies take as long as the client sends: ``api.register_threads`` bounds their work) and whatever
is outside ``/v1/`` (health, metrics, docs). A long poll is gated like any request: it holds a turn for each of its
reads and gives it back while it sleeps between them (``wait_for_change``), so ``?wait=`` lets no read past the gate. A request that waits
for a build process gives its turn back while it waits (``Builder.build``'s ``waiting``).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated

from anyio import from_thread
from fastapi import Depends, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from paperlane.producer.api.errors import error
from paperlane.producer.api.guard import turn_of
from paperlane.settings import ApiSettings

TURN = "paperlane_turn"  # the ASGI scope's entry a gated request's turn is in
_UPLOAD = ("POST", "/v1/documents")
_STREAM = re.compile(r"/v1/documents/[^/]+/events/?")  # a document's event stream (matched whole)


@dataclass
class Gate:
    """Turns of one process: ``total`` in progress, ``per_tenant`` of one tenant, ``queued`` waiting per tenant.
    Used in the event loop only (no locks)."""

    total: int
    per_tenant: int
    queued: int
    running: dict[str, int] = field(default_factory=dict)  # tenant -> its requests in progress
    waiting: dict[str, deque[asyncio.Future[None]]] = field(default_factory=dict)  # in the order they are served

    @classmethod
    def of(cls, api: ApiSettings) -> Gate:
        return cls(api.concurrent_requests, api.tenant_concurrent_requests, api.tenant_queued_requests)

    async def enter(self, tenant: str, *, bounded: bool = True) -> bool:
        """Take a turn of ``tenant``'s, waiting for it in the tenant's queue; False (at once) when the queue is full
        (``bounded``; otherwise it waits at its end). Cancelled while waiting: out of the queue (and a turn given
        meanwhile given back)."""
        queue = self.waiting.get(tenant)
        if queue is None and self._free(tenant):
            self.running[tenant] = self.running.get(tenant, 0) + 1
            return True
        if bounded and len(queue or ()) >= self.queued:
            return False
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(tenant, deque()).append(turn)
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():  # given a turn as it was cancelled
                self.leave(tenant)
            else:
                turn.cancel()
                self._forget(tenant, turn)
            raise
        return True

    def leave(self, tenant: str) -> None:
        """``tenant``'s request is done: its turn goes to the next tenant in line."""
        left = self.running[tenant] - 1
        if left:
            self.running[tenant] = left
        else:
            del self.running[tenant]
        self._serve()

    def _free(self, tenant: str) -> bool:
        return sum(self.running.values()) < self.total and self.running.get(tenant, 0) < self.per_tenant

    def _serve(self) -> None:
        """Give free turns to waiting requests: the first tenant in line that may have one more, then to the back."""
        while sum(self.running.values()) < self.total:
            tenant = next((t for t in self.waiting if self.running.get(t, 0) < self.per_tenant), None)
            if tenant is None:
                return
            queue = self.waiting.pop(tenant)
            queue.popleft().set_result(None)  # cancelled ones left their queue when they were
            self.running[tenant] = self.running.get(tenant, 0) + 1
            if queue:
                self.waiting[tenant] = queue  # to the back of the line

    def _forget(self, tenant: str, turn: asyncio.Future[None]) -> None:
        queue = self.waiting.get(tenant)
        if queue is not None and turn in queue:
            queue.remove(turn)
            if not queue:
                del self.waiting[tenant]


class Turn:
    """A request's turn, held until the request is done or gives it back."""

    def __init__(self, gate: Gate | None = None, tenant: str = "") -> None:
        self._gate, self._tenant = gate, tenant

    def give_back(self) -> None:
        """Let the next request in now (in the event loop); the request goes on without a turn. Again: nothing."""
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.leave(self._tenant)

    @contextlib.asynccontextmanager
    async def aside(self) -> AsyncIterator[None]:
        """No turn held within the block (a long poll's wait): given back, then taken again after, in line as any
        request (past the queue's limit: this one was let in already)."""
        gate = self._gate
        self.give_back()
        try:
            yield
        finally:
            if gate is not None:
                await gate.enter(self._tenant, bounded=False)
                self._gate = gate

    def give_back_from_thread(self) -> None:
        """``give_back``, from a worker thread of this request (a sync route's)."""
        if self._gate is not None:
            from_thread.run_sync(self.give_back)


async def turn(request: Request) -> Turn:
    """The request's turn (a dependency); one that holds nothing for a request the gate let by."""
    found = request.scope.get(TURN)
    return found if isinstance(found, Turn) else Turn()


TurnDep = Annotated[Turn, Depends(turn)]


class Turns:
    """The gate as ASGI middleware: a gated request waits for its turn, holds it while the app runs, gives it back."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _gated(scope):
            await self.app(scope, receive, send)
            return
        gate: Gate = scope["app"].state.turns  # the app's, made with its service
        tenant = turn_of(scope["app"].state.service, scope)
        if not await gate.enter(tenant):
            refusal = error(429, "busy", f"{gate.queued} requests of this tenant are waiting for their turn "
                            "(api.tenant_queued_requests); try again", {"Retry-After": "1"})
            await refusal(scope, receive, send)
            return
        held = scope[TURN] = Turn(gate, tenant)
        try:
            await self.app(scope, receive, send)
        finally:
            held.give_back()


def _gated(scope: Scope) -> bool:
    if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
        return False
    return not (_STREAM.fullmatch(scope["path"]) and scope["method"] in ("GET", "HEAD")
                or (scope["method"], scope["path"].rstrip("/")) == _UPLOAD)
