"""Revocation takes effect within the key cache's lifetime (5 s) everywhere (issue 25): an open event stream ends
with a ``revoked`` event, a long poll answers 401, an upload whose body was still arriving is refused and registers
nothing, an S3 ingest waiting for room stops registering and says why. Webhooks keep their own rule: they belong
to the tenant's ingest, not to the key, so an ingest registered before the revocation is still reported to its
callback URL, signed with the tenant's secret."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from paperlane.storage import jobs as jobstore
from paperlane.storage import tenants
from paperlane.storage.db import Database
from tests.api_server import ApiProcess, Receiver, receiver_settings
from tests.conftest import Stack, until
from tests.pages import tiny_page

pytestmark = pytest.mark.slow

LIFETIME = 5.0  # the key cache's (producer.api.service._AUTH_TTL)
SLACK = 5.0  # a stream's poll, the test's own reads


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _upload(api: ApiProcess, key: str, i: int, **data: str) -> dict[str, Any]:
    resp = httpx.post(f"{api.url}/v1/documents", headers=_auth(key), files={"file": (f"p{i}.png", tiny_page(i))},
                      data=data, timeout=60)
    assert resp.status_code == 202, resp.text
    return resp.json()  # type: ignore[no-any-return]


def _revoke_later(db: Database, key: str, after: float) -> float:
    """Revoke ``key`` ``after`` seconds from now (a thread); when it will be, by the monotonic clock."""
    threading.Timer(after, tenants.revoke_key, (db, key)).start()
    return time.monotonic() + after


def test_revocation_reaches_streams_polls_uploads_and_ingests_not_webhooks(
        stack_factory: Callable[..., Stack], api_factory: Callable[[Stack], ApiProcess]) -> None:
    receiver = Receiver([200])
    stack = stack_factory(**receiver_settings(receiver))
    api = api_factory(stack)
    db = Database(stack.settings.database_url)
    keys = [tenants.create_key(db, tenant="acme").key for _ in range(5)]
    document = _upload(api, keys[0], 1, callback_url=receiver.url)

    # An open event stream: it ends with "revoked" within the cache's lifetime.
    revoked_at = _revoke_later(db, keys[1], 1.0)
    with httpx.stream("GET", f"{api.url}/v1/documents/{document['document_id']}/events", headers=_auth(keys[1]),
                      timeout=60) as stream:
        body = "".join(stream.iter_text())
    assert "event: revoked" in body and "event: done" not in body, body
    assert time.monotonic() - revoked_at < LIFETIME + SLACK

    # A long poll: 401.
    revoked_at = _revoke_later(db, keys[2], 1.0)
    resp = httpx.get(f"{api.url}/v1/documents/{document['document_id']}", params={"wait": 50},
                     headers=_auth(keys[2]), timeout=60)
    assert resp.status_code == 401 and time.monotonic() - revoked_at < LIFETIME + SLACK, resp.text

    # An upload whose body is still arriving when its key is revoked: 401, nothing registered.
    before = _ingests(db)
    resp = httpx.post(f"{api.url}/v1/documents", headers={**_auth(keys[3]), "Content-Type": _FORM},
                      content=_slow_body(db, keys[3]), timeout=60)
    assert resp.status_code == 401 and "revoked" in resp.text, resp.text
    assert _ingests(db) == before

    # Webhooks keep their rule: the first upload's key revoked, its ingest still reports to its callback.
    tenants.revoke_key(db, keys[0])
    jobstore.finish_failed(db, document["pages"][0]["job_id"], "engine refused the page", "inference")
    headers, body = receiver.wait(1)[0]
    assert "x-paperlane-signature" in headers and document["ingest_id"].encode() in body, (headers, body)
    receiver.close()
    db.dispose()


def test_a_revoked_keys_s3_ingest_stops_registering(stack_factory: Callable[..., Stack],
                                                    api_factory: Callable[[Stack], ApiProcess]) -> None:
    stack = stack_factory()
    api = api_factory(stack)
    db = Database(stack.settings.database_url)
    key = tenants.create_key(db, tenant="acme").key
    tenants.set_limits(db, "acme", max_pages_in_flight=1)
    s3, inbox = stack.s3(), f"{stack.bucket}-inbox"
    s3.create_bucket(Bucket=inbox)
    for d in range(3):
        s3.put_object(Bucket=inbox, Key=f"acme/{d}.png", Body=tiny_page(200 + d))
    tenants.grant_ingest(db, "acme", inbox, "acme/")
    resp = httpx.post(f"{api.url}/v1/ingests", json={"source": f"s3://{inbox}/acme/"}, headers=_auth(key), timeout=30)
    assert resp.status_code == 202, resp.text
    ingest_id = resp.json()["ingest_id"]
    reader = tenants.create_key(db, tenant="acme").key

    def view() -> dict[str, Any]:
        return httpx.get(f"{api.url}/v1/ingests/{ingest_id}", headers=_auth(reader), timeout=30).json()
    until(lambda: view()["documents"] == 1, what="the first document, all the budget holds")
    tenants.revoke_key(db, key)
    jobs = [p["job_id"] for p in _pages(db, ingest_id)]
    jobstore.finish_failed(db, jobs[0], "engine refused the page", "inference")  # room again: it would go on
    stopped = until(lambda: (v := view())["status"] != "registering" and v, what="the ingest closed")
    assert stopped["documents"] == 1 and "revoked" in stopped["error"], stopped  # type: ignore[index]
    db.dispose()


_BOUNDARY = "revocationtestboundary"
_FORM = f"multipart/form-data; boundary={_BOUNDARY}"


def _slow_body(db: Database, key: str) -> Iterator[bytes]:
    """A one-file form sent in two halves with the key revoked between them (and the cache's lifetime let pass)."""
    head = (f"--{_BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"p.png\"\r\n"
            "Content-Type: image/png\r\n\r\n").encode()
    data = tiny_page(77)
    yield head + data[: len(data) // 2]
    tenants.revoke_key(db, key)
    time.sleep(LIFETIME + 1)  # the body is still arriving: what it waits on is the client, not a condition
    yield data[len(data) // 2:] + f"\r\n--{_BOUNDARY}--\r\n".encode()


def _ingests(db: Database) -> int:
    from sqlalchemy import func, select

    from paperlane.storage.tables import IngestRow

    with db.session() as s:
        return int(s.scalar(select(func.count()).select_from(IngestRow)) or 0)


def _pages(db: Database, ingest_id: str) -> list[dict[str, str]]:
    from sqlalchemy import select

    from paperlane.storage.tables import PageRow

    with db.session() as s:
        return [{"job_id": j} for j in s.scalars(select(PageRow.job_id).where(PageRow.ingest_id == ingest_id))]
