"""The fair-turn gate (issue 25, ``producer.api.turns``): a tenant past its requests in progress waits behind
itself while another tenant is served at once; past its queue it is answered 429 busy before its key is checked;
event streams, uploads and health are not gated; a long poll cannot slip past the gate with a tiny ``?wait=`` and
holds no turn while it waits.

A request holds its turn while its body comes in, so a body sent in two halves (the second when the test says)
holds a turn as long as the test wants: the real gate, the real guard and routes, on the real services."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx

from paperlane.priority import keys
from paperlane.producer.api.turns import Gate
from paperlane.storage.db import Database
from paperlane.storage.tenants import NewKey, create_key
from tests.conftest import Stack
from tests.pages import tiny_page
from tests.test_edge import _api

UNKNOWN = "00000000-0000-4000-8000-000000000000"


async def _until(check: Callable[[], object], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} not met in {timeout:g}s"
        await asyncio.sleep(0.02)


class Held:
    """Requests whose bodies come in two halves, the second once ``release`` is called: each holds its turn."""

    def __init__(self, api: httpx.AsyncClient) -> None:
        self.api, self.go, self.tasks = api, asyncio.Event(), list[asyncio.Task[httpx.Response]]()

    async def _body(self) -> AsyncIterator[bytes]:
        yield b'{"sources": '
        await self.go.wait()
        yield b'"not a list"}'

    def start(self, key: NewKey, n: int) -> None:
        self.tasks += [asyncio.create_task(self.api.post("/v1/ingests", content=self._body(), headers=_auth(key)))
                       for _ in range(n)]

    async def release(self) -> None:
        self.go.set()
        for answer in await asyncio.gather(*self.tasks):
            assert answer.status_code == 422, answer.text  # read whole, then refused by the route: it got in


def _auth(key: NewKey | str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key if isinstance(key, str) else key.key}"}


async def _known(api: httpx.AsyncClient, *keys: NewKey) -> tuple[NewKey, ...]:
    """The keys, used once: in the key cache, so their tenants are known at the gate."""
    for key in keys:
        assert (await api.get(f"/v1/documents/{UNKNOWN}", headers=_auth(key))).status_code == 404
    return keys


def _gate(api: httpx.AsyncClient) -> Gate:
    return api._transport.app.state.turns  # type: ignore[attr-defined,no-any-return]


def _running(gate: Gate, key: NewKey) -> int:
    return gate.running.get(f"tenant.{key.tenant_id}", 0)


def _waiting(gate: Gate, key: NewKey) -> int:
    return len(gate.waiting.get(f"tenant.{key.tenant_id}", ()))


def test_a_tenant_past_its_turns_waits_while_another_is_served_at_once(stack_factory: Callable[..., Stack]) -> None:
    asyncio.run(_fair(stack_factory(API__TENANT_CONCURRENT_REQUESTS="2", API__TENANT_QUEUED_REQUESTS="2")))


@dataclass
class Crowd:
    """An API in which tenant acme holds two turns (bodies held) and globex holds none."""

    api: httpx.AsyncClient
    gate: Gate
    held: Held
    acme: NewKey
    globex: NewKey


@contextlib.asynccontextmanager
async def _crowd(stack: Stack) -> AsyncIterator[Crowd]:
    db = Database(stack.settings.database_url)
    async with _api(stack) as api:
        acme, globex = await _known(api, create_key(db, tenant="acme"), create_key(db, tenant="globex"))
        gate, held = _gate(api), Held(api)
        held.start(acme, 2)
        await _until(lambda: _running(gate, acme) == 2, "acme holding two turns")
        yield Crowd(api, gate, held, acme, globex)
    db.dispose()


async def _fair(stack: Stack) -> None:
    async with _crowd(stack) as crowd:  # acme's two turns: api.tenant_concurrent_requests=2
        api, gate, held, acme, globex = crowd.api, crowd.gate, crowd.held, crowd.acme, crowd.globex
        third = asyncio.create_task(api.get(f"/v1/documents/{UNKNOWN}", headers=_auth(acme)))
        await _until(lambda: _waiting(gate, acme) == 1, "acme's third request waiting")
        for _ in range(3):  # globex's requests go in at once, past acme's waiting one
            answer = await asyncio.wait_for(api.get(f"/v1/documents/{UNKNOWN}", headers=_auth(globex)), 10)
            assert answer.status_code == 404, answer.text
        # A tiny ?wait= (a long poll that never waits) waits its turn like any request.
        poll = asyncio.create_task(api.get(f"/v1/documents/{UNKNOWN}?wait=0.001", headers=_auth(acme)))
        await _until(lambda: _waiting(gate, acme) == 2, "acme's long poll waiting")
        # Past api.tenant_queued_requests: 429 busy at once, and the key was not looked at (its rate not spent).
        rate = stack.broker()
        counted = rate.zcard(keys.rate(f"key.{acme.key_id}"))
        busy = await asyncio.wait_for(api.get(f"/v1/documents/{UNKNOWN}", headers=_auth(acme)), 10)
        assert busy.status_code == 429 and busy.json()["error"]["code"] == "busy", busy.text
        assert busy.headers["Retry-After"] == "1"
        assert rate.zcard(keys.rate(f"key.{acme.key_id}")) == counted
        # An unknown key is nobody's tenant: it waits alone (refused by the guard at once), not behind acme.
        stranger = await asyncio.wait_for(api.get(f"/v1/documents/{UNKNOWN}", headers=_auth("pl_nope")), 10)
        assert stranger.status_code == 401
        assert not third.done() and not poll.done()
        await held.release()
        assert (await third).status_code == 404 and (await poll).status_code == 404
        assert gate.running == {} and gate.waiting == {}


def test_streams_uploads_and_health_are_not_gated(stack_factory: Callable[..., Stack]) -> None:
    asyncio.run(_not_gated(stack_factory(API__CONCURRENT_REQUESTS="2", API__TENANT_CONCURRENT_REQUESTS="2")))


async def _not_gated(stack: Stack) -> None:
    async with _crowd(stack) as crowd:  # acme's two turns: every turn of the process (api.concurrent_requests)
        api, gate, held, globex = crowd.api, crowd.gate, crowd.held, crowd.globex
        read = asyncio.create_task(api.get(f"/v1/documents/{UNKNOWN}", headers=_auth(globex)))
        await _until(lambda: gate.waiting, "globex's read waiting")
        assert (await asyncio.wait_for(api.get("/healthz"), 10)).status_code == 200
        upload = await asyncio.wait_for(api.post("/v1/documents", headers=_auth(globex),
                                                 files={"file": ("p.png", tiny_page(1))}), 30)
        assert upload.status_code == 202, upload.text
        stream = await asyncio.wait_for(api.get(f"/v1/documents/{UNKNOWN}/events", headers=_auth(globex)), 10)
        assert stream.status_code == 404  # the route answered it: it went past the gate
        assert not read.done()
        await held.release()
        assert (await read).status_code == 404


def test_a_long_poll_gives_its_turn_back_while_it_waits(stack_factory: Callable[..., Stack]) -> None:
    asyncio.run(_long_poll(stack_factory(API__TENANT_CONCURRENT_REQUESTS="1")))


async def _long_poll(stack: Stack) -> None:
    db = Database(stack.settings.database_url)
    async with _api(stack) as api:
        acme = create_key(db, tenant="acme")
        body = (await api.post("/v1/documents", headers=_auth(acme), files={"file": ("p.png", tiny_page(1))})).json()
        gate, path = _gate(api), f"/v1/documents/{body['document_id']}"
        poll = asyncio.create_task(api.get(f"{path}?wait=30", headers=_auth(acme)))
        streams = stack.broker()
        await _until(lambda: streams.zcard(keys.streams(acme.key_id)) == 1, "the long poll waiting")
        await _until(lambda: gate.running == {}, "the long poll without a turn", timeout=10)
        for _ in range(3):  # acme's one turn is free for its other requests meanwhile
            answer = await asyncio.wait_for(api.get(path, headers=_auth(acme)), 10)
            assert answer.status_code == 200, answer.text
        assert not poll.done()
        poll.cancel()
        await asyncio.gather(poll, return_exceptions=True)
    db.dispose()
