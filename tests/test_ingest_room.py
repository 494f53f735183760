"""No shared resource waits on one tenant (issue 25): four tenants whose budget of pages in flight is spent each
start an S3 ingest of several documents (one per ingest thread: ``api.ingest_threads`` is 4), and a fifth tenant
with room starts one: the fifth's ingest has its documents within a few seconds, because a registration with no
room gives its thread back (what fitted is registered; it continues once the tenant has room again), which the
test sees too: one of the four registers its next document once one of its pages is final. An ingest waiting for room
when the API stops is closed with what it registered and says why."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from paperlane.producer.api.ingests import STOPPED
from paperlane.storage import jobs as jobstore
from paperlane.storage import status_reads, tenants, views
from paperlane.storage.db import Database
from tests.api_server import ApiProcess
from tests.conftest import Stack, until
from tests.pages import tiny_page

pytestmark = pytest.mark.slow

BOUND, CAP, DOCUMENTS = 4, 2, 5


def test_a_tenant_with_room_is_not_held_up_by_four_without(stack_factory: Callable[..., Stack],
                                                           api_factory: Callable[[Stack], ApiProcess]) -> None:
    stack = stack_factory(API__INGEST_THREADS="4")
    api = api_factory(stack)
    db = Database(stack.settings.database_url)
    s3, inbox = stack.s3(), f"{stack.bucket}-inbox"
    s3.create_bucket(Bucket=inbox)
    names = [f"bound{i}" for i in range(BOUND)] + ["free"]
    keys = {name: tenants.create_key(db, tenant=name).key for name in names}
    for n, name in enumerate(names):
        tenants.grant_ingest(db, name, inbox, f"{name}/")
        for d in range(DOCUMENTS):
            s3.put_object(Bucket=inbox, Key=f"{name}/{d}.png", Body=tiny_page(100 * n + d))
        if name != "free":
            tenants.set_limits(db, name, max_pages_in_flight=CAP)

    def start(name: str) -> str:
        resp = httpx.post(f"{api.url}/v1/ingests", json={"source": f"s3://{inbox}/{name}/"},
                          headers={"Authorization": f"Bearer {keys[name]}"}, timeout=30)
        assert resp.status_code == 202, resp.text
        return str(resp.json()["ingest_id"])

    def view(name: str, ingest_id: str) -> dict[str, Any]:
        return httpx.get(f"{api.url}/v1/ingests/{ingest_id}", headers={"Authorization": f"Bearer {keys[name]}"},
                         timeout=30).json()

    bound = {name: start(name) for name in names[:BOUND]}
    for name, ingest_id in bound.items():  # each registered what fits, and holds no thread for the rest
        until(lambda n=name, i=ingest_id: view(n, i)["documents"] == CAP, what=f"{name}'s first {CAP} documents")
    started = time.monotonic()
    free = start("free")
    done = until(lambda: (v := view("free", free))["status"] != "registering" and v, what="the free tenant's ingest",
                 timeout=10)
    assert done["documents"] == DOCUMENTS and time.monotonic() - started < 10, done  # type: ignore[index]
    assert all(view(n, i)["status"] == "registering" and view(n, i)["documents"] == CAP for n, i in bound.items())

    # Room again for bound0 (one of its pages is final): its registration continues where it stopped.
    name, ingest_id = "bound0", bound["bound0"]
    first = db_pages(db, ingest_id)[0]
    jobstore.finish_failed(db, first, "engine refused the page", "inference")
    until(lambda: view(name, ingest_id)["documents"] == CAP + 1, what="bound0's next document, once it had room")
    db.dispose()


def _tight(stack: Stack, db: Database, tenant: str, *, room: int, objects: int) -> tuple[str, dict[str, str]]:
    """A tenant with room for ``room`` pages in flight, granted ``<inbox>/<tenant>/`` holding ``objects`` one-page
    images (``<d>.png``): the inbox bucket and the tenant's key's header."""
    s3, inbox = stack.s3(), f"{stack.bucket}-inbox"
    s3.create_bucket(Bucket=inbox)
    auth = {"Authorization": f"Bearer {tenants.create_key(db, tenant=tenant).key}"}
    tenants.grant_ingest(db, tenant, inbox, f"{tenant}/")
    tenants.set_limits(db, tenant, max_pages_in_flight=room)
    for d in range(objects):
        s3.put_object(Bucket=inbox, Key=f"{tenant}/{d}.png", Body=tiny_page(d))
    return inbox, auth


async def _ingest(api: httpx.AsyncClient, source: str, auth: dict[str, str]) -> str:
    """The id of a new ingest of ``source``."""
    resp = await api.post("/v1/ingests", json={"source": source}, headers=auth)
    assert resp.status_code == 202, resp.text
    return str(resp.json()["ingest_id"])


def db_pages(db: Database, ingest_id: str) -> list[str]:
    """The job ids of an ingest's pages."""
    from sqlalchemy import select

    from paperlane.storage.tables import PageRow

    with db.session() as s:
        return list(s.scalars(select(PageRow.job_id).where(PageRow.ingest_id == ingest_id)))


def test_an_ingest_waiting_for_room_when_the_api_stops_says_why(stack_factory: Callable[..., Stack]) -> None:
    asyncio.run(_stopped_while_parked(stack_factory()))


async def _stopped_while_parked(stack: Stack) -> None:
    """The API stops while an ingest waits for room (a task holding no thread): the ingest is closed with what it
    registered and says why, instead of staying ``registering`` for ever."""
    from tests.test_edge import _api

    db = Database(stack.settings.database_url)
    inbox, auth = _tight(stack, db, "parked", room=1, objects=3)
    async with _api(stack) as api:
        ingest_id = await _ingest(api, f"s3://{inbox}/parked/", auth)
        service = api._transport.app.state.service  # type: ignore[attr-defined]
        deadline = time.monotonic() + 20
        while (await api.get(f"/v1/ingests/{ingest_id}", headers=auth)).json()["documents"] < 1:
            assert time.monotonic() < deadline, "the ingest's first document"
            await asyncio.sleep(0.1)
        # Its thread gives it back within ms of registering what fitted; parked or not yet, it must say why.
        await asyncio.sleep(0.5)
        assert service.registering, "the ingest waits for room"
    row, progress, failures = status_reads.ingest_progress(db, ingest_id)
    view = views.ingest_view(row, progress, failures)
    assert view["status"] != "registering" and view["documents"] == 1, view
    assert view["error"] == f"registration stopped after 1 documents: {STOPPED}", view
    db.dispose()


class _Counting:
    """A boto3 S3 client, counting the keys its listings return (what a continuation lists again)."""

    def __init__(self, client: Any) -> None:
        self.client, self.listed = client, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def get_paginator(self, name: str) -> Any:
        paginator, owner = self.client.get_paginator(name), self

        class Counted:
            def paginate(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
                for page in paginator.paginate(**kwargs):
                    owner.listed += len(page.get("Contents", []))
                    yield page
        return Counted()


def test_a_continued_ingest_lists_its_prefix_from_where_it_stopped(stack_factory: Callable[..., Stack]) -> None:
    """An ingest that stopped for room after 4 of 10 objects goes on listing after the last object it took whole:
    6 keys listed again, not 10; its 4th object (not taken whole when it stopped) is read again."""
    from paperlane.producer import inputs
    from paperlane.settings import IngestSettings

    stack = stack_factory()
    s3, inbox = stack.s3(), f"{stack.bucket}-inbox"
    s3.create_bucket(Bucket=inbox)
    for d in range(10):
        s3.put_object(Bucket=inbox, Key=f"in/{d:02}.png", Body=tiny_page(d))
    url, listed, client = f"s3://{inbox}/in/", dict[str, str](), _Counting(s3)
    first = inputs.expand([url], IngestSettings(), s3=client, listed=listed)
    taken = [next(first).source for _ in range(4)]  # type: ignore[union-attr]
    first.close()  # stopped: no room for the 4th
    assert taken == [f"s3://{inbox}/in/{d:02}.png" for d in range(4)] and listed == {url: "in/02.png"}
    client.listed = 0
    rest = [item.source for item in inputs.expand([url], IngestSettings(), s3=client, listed=listed)]
    assert rest == [f"s3://{inbox}/in/{d:02}.png" for d in range(3, 10)]
    assert client.listed == 7, client.listed  # from in/03.png on, not the whole prefix again
    assert listed == {url: "in/09.png"}


def test_an_ingest_going_on_from_where_it_stopped_registers_each_object_once(
        stack_factory: Callable[..., Stack]) -> None:
    asyncio.run(_each_once(stack_factory()))


async def _each_once(stack: Stack) -> None:
    """An ingest of 7 objects by a tenant with room for 2 pages stops and goes on 3 times or more (its pages made
    final in between): every object registered, each once."""
    from sqlalchemy import select

    from paperlane.storage.tables import DocumentRow
    from tests.test_edge import _api

    db = Database(stack.settings.database_url)
    inbox, auth = _tight(stack, db, "slow", room=2, objects=7)
    async with _api(stack) as api:
        ingest_id = await _ingest(api, f"s3://{inbox}/slow/", auth)
        deadline, failed = time.monotonic() + 60, set[str]()
        while (view := (await api.get(f"/v1/ingests/{ingest_id}", headers=auth)).json())["status"] == "registering":
            assert time.monotonic() < deadline, view
            for job_id in set(db_pages(db, ingest_id)) - failed:  # room again: its pages final
                jobstore.finish_failed(db, job_id, "engine refused the page", "inference")
                failed.add(job_id)
            await asyncio.sleep(0.2)
    with db.session() as s:
        sources = list(s.scalars(select(DocumentRow.source).where(DocumentRow.ingest_id == ingest_id)))
    assert sorted(sources) == [f"s3://{inbox}/slow/{d}.png" for d in range(7)], (sources, view)
    assert len(db_pages(db, ingest_id)) == 7
    db.dispose()
