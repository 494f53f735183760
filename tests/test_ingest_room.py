"""No shared resource waits on one tenant (issue 25): four tenants whose budget of pages in flight is spent each
start an S3 ingest of several documents (one per ingest thread: ``api.ingest_threads`` is 4), and a fifth tenant
with room starts one: the fifth's ingest has its documents within a few seconds, because a registration with no
room gives its thread back (what fitted is registered; it continues once the tenant has room again), which the
test sees too: one of the four registers its next document once one of its pages is final."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from paperlane.storage import jobs as jobstore
from paperlane.storage import tenants
from paperlane.storage.db import Database
from paperlane.storage.tables import IngestRow
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


def db_pages(db: Database, ingest_id: str) -> list[str]:
    """The job ids of an ingest's pages."""
    from sqlalchemy import select

    from paperlane.storage.tables import PageRow

    with db.session() as s:
        return list(s.scalars(select(PageRow.job_id).where(PageRow.ingest_id == ingest_id)))


def test_an_ingest_parked_for_room_when_the_api_stops_is_closed_with_why(
        stack_factory: Callable[..., Stack], api_factory: Callable[[Stack], ApiProcess]) -> None:
    """Parked (its tenant has no room; no thread holds it), then the API stops: the ingest does not stay
    "registering" with no reason, it is closed saying the API stopped (docs/security.md)."""
    stack = stack_factory()
    api = api_factory(stack)
    db = Database(stack.settings.database_url)
    s3, inbox = stack.s3(), f"{stack.bucket}-inbox"
    s3.create_bucket(Bucket=inbox)
    key = tenants.create_key(db, tenant="parked").key
    tenants.grant_ingest(db, "parked", inbox, "parked/")
    tenants.set_limits(db, "parked", max_pages_in_flight=CAP)
    for d in range(DOCUMENTS):
        s3.put_object(Bucket=inbox, Key=f"parked/{d}.png", Body=tiny_page(900 + d))
    resp = httpx.post(f"{api.url}/v1/ingests", json={"source": f"s3://{inbox}/parked/"},
                      headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert resp.status_code == 202, resp.text
    ingest_id = resp.json()["ingest_id"]
    until(lambda: len(db_pages(db, ingest_id)) == CAP, what="the documents that fit")
    api.stop()
    with db.session() as session:
        row = session.get(IngestRow, ingest_id)
    assert row is not None
    assert row.registered_at is not None and row.error is not None, api.output()
    assert row.error.endswith("the API stopped while it was being registered") and f"after {CAP} documents" in row.error
    db.dispose()
