"""The HTTP API on real services: a real ``paperlane api`` process and a real worker, driven with httpx."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import cv2
import httpx
import numpy as np
import pypdfium2 as pdfium
import pytest
from PIL import Image

from paperlane.producer.webhooks import verify
from paperlane.retry import RetryPolicy
from paperlane.storage import outputs, webhooks
from paperlane.storage.db import Database, utcnow
from tests.api_server import HOOKS, ApiProcess, Receiver, create_key, receiver_settings, sse_events
from tests.conftest import Stack, cli, until
from tests.pages import render_page, sample_lines
from tests.scoring import cer
from tests.test_ingests import succeed

pytestmark = pytest.mark.slow

API_SETTINGS = {"API__WEBHOOK_PRIVATE": "true", "API__WEBHOOK_BACKOFF": "0.3", "API__MAX_UPLOAD_BYTES": "3000000"}


def _pdf(seeds: list[int]) -> bytes:
    pages = [Image.open(io.BytesIO(render_page(sample_lines(i, 3)))).convert("RGB") for i in seeds]
    buf = io.BytesIO()
    pages[0].save(buf, format="PDF", save_all=True, append_images=pages[1:], resolution=150)
    return buf.getvalue()


def _upload(api: ApiProcess, key: str | None, data: bytes, filename: str = "scan.png", **fields: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{api.url}/v1/documents", headers=headers, files={"file": (filename, data)}, data=fields,
                      timeout=60)


def _error(resp: httpx.Response, status: int, code: str) -> str:
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    assert "Traceback" not in resp.text and "sqlalchemy" not in resp.text.lower()
    return str(body["error"]["message"])


def _drawn_on_request(api: ApiProcess, key: str, stack: Stack, page_view: dict, image: bytes, lines: int) -> None:
    """The worker drew no annotated image (worker.annotated unset: on request): the API drew ``image`` from the
    page's original, its lines outlined in green, and kept it, so the next request reads it; a failed page has none."""
    assert not stack.keys(f"annotated/{page_view['job_id']}")  # the worker's own key: none
    drawn = cv2.imdecode(np.frombuffer(image, np.uint8), cv2.IMREAD_COLOR).astype(int)
    b, g, r = drawn[..., 0], drawn[..., 1], drawn[..., 2]
    green = (g > r + 30) & (g > b + 30)
    assert (green.sum(axis=1) > 100).sum() >= 2 * lines  # each line's outline: a long top and bottom edge
    assert max(drawn.shape[:2]) <= 1000  # worker.annotated_max_side
    [kept] = stack.keys("annotated/")
    assert kept.startswith("annotated/drawn/") and kept.endswith(f"/{page_view['job_id']}.jpg")
    stack.s3().put_object(Bucket=stack.bucket, Key=kept, Body=b"\xff\xd8\xff kept")  # type: ignore[attr-defined]
    again = httpx.get(f"{api.url}{page_view['annotated_url']}", headers={"Authorization": f"Bearer {key}"})
    assert again.status_code == 200 and again.content == b"\xff\xd8\xff kept"  # read back, not drawn again

    auth = {"Authorization": f"Bearer {key}"}
    broken = _upload(api, key, render_page(["broken"])[:300], "broken.png", lane="interactive").json()
    assert _wait_document(api, key, broken["document_id"])["status"] == "failed"
    view = httpx.get(f"{api.url}/v1/pages/{broken['pages'][0]['page_id']}", headers=auth).json()
    assert view["status"] == "failed" and view["annotated_url"] is None
    _error(httpx.get(f"{api.url}/v1/pages/{broken['pages'][0]['page_id']}/annotated", headers=auth), 404, "not_found")


def _wait_document(api: ApiProcess, key: str, document_id: str) -> dict:
    def final() -> dict | None:
        view = httpx.get(f"{api.url}/v1/documents/{document_id}", params={"wait": 5},
                         headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
        return view if view["status"] in ("succeeded", "failed", "partial") and view["outputs"]["json"] else None
    return until(final, what="document finished", timeout=120, every=0.2)  # type: ignore[return-value]


def test_upload_wait_result_pages_and_tenants(stack_factory, worker_factory, api_factory, tmp_path: Path) -> None:
    stack = stack_factory(**API_SETTINGS, WORKER__OUTPUT_FORMATS="json,md,pdf,alto,mets")
    worker_factory(stack)
    api = api_factory(stack)
    key, _ = create_key(stack, "acme", interactive=True)
    other, _ = create_key(stack, "globex", interactive=True)
    auth = {"Authorization": f"Bearer {key}"}

    assert httpx.get(f"{api.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{api.url}/readyz").json()
    assert ready["checks"] == {"database": "ok", "redis": "ok", "objects": "ok"}
    assert "/v1/documents" in httpx.get(f"{api.url}/openapi.json").json()["paths"]
    assert httpx.get(f"{api.url}/docs").status_code == 200

    lines = sample_lines(41)
    resp = _upload(api, key, render_page(lines), "../../etc/receipt.png", lane="interactive")
    assert resp.status_code == 202, resp.text
    body = resp.json()
    document_id, [page] = body["document_id"], body["pages"]
    assert body["documents"][0]["source"] == "upload/receipt.png" and body["documents"][0]["name"] == "receipt"
    view = _wait_document(api, key, document_id)
    assert (view["status"], view["pages"], view["succeeded"]) == ("succeeded", 1, 1)

    result = httpx.get(f"{api.url}/v1/documents/{document_id}/result", headers=auth).json()
    assert [p["page"] for p in result["pages"]] == [1]
    assert cer(result["pages"][0]["text"], "\n".join(lines)) < 0.05
    md = httpx.get(f"{api.url}/v1/documents/{document_id}/result", params={"format": "md"}, headers=auth)
    assert md.headers["content-type"].startswith("text/markdown") and lines[0].split()[0] in md.text
    pdf = httpx.get(f"{api.url}/v1/documents/{document_id}/result", params={"format": "pdf"}, headers=auth)
    assert lines[0].split()[0] in pdfium.PdfDocument(pdf.content)[0].get_textpage().get_text_range()
    page_view = httpx.get(f"{api.url}/v1/pages/{page['page_id']}", headers=auth).json()
    assert page_view["status"] == "succeeded" and page_view["result"]["source"] == "upload/receipt.png"
    image = httpx.get(f"{api.url}{page_view['annotated_url']}", headers=auth)
    assert image.headers["content-type"] == "image/jpeg" and image.content[:3] == b"\xff\xd8\xff"
    _drawn_on_request(api, key, stack, page_view, image.content, len(lines))
    _archive_formats(api, auth, document_id, page["page_id"], stack, first_word=lines[0].split()[0])

    # Another tenant's ids are unknown ids; so are made-up ones.
    theirs = {"Authorization": f"Bearer {other}"}
    for path in (f"/v1/documents/{document_id}", f"/v1/documents/{document_id}/result",
                 f"/v1/documents/{document_id}/events", f"/v1/pages/{page['page_id']}",
                 f"/v1/pages/{page['page_id']}/annotated", f"/v1/ingests/{body['ingest_id']}",
                 "/v1/documents/no-such-id"):
        _error(httpx.get(f"{api.url}{path}", headers=theirs), 404, "not_found")
    # The same bytes from the other tenant are its own work, not a shared job.
    again = _upload(api, other, render_page(lines), "receipt.png", lane="interactive").json()
    assert again["pages"][0]["job_id"] != page["job_id"]

    metrics = httpx.get(f"{api.url}/metrics").text
    assert 'paperlane_api_requests_total{method="POST",route="/v1/documents",status="202"}' in metrics


def _archive_formats(api: ApiProcess, auth: dict[str, str], document_id: str, page_id: str, stack: Stack, *,
                     first_word: str) -> None:
    """The formats the workers wrote (ALTO, METS: with it the page's ALTO and PAGE XML) come from the store; hOCR,
    which they did not write, is built on request, as is each format of the page alone: the same bytes."""
    suffixes = (".json", ".md", ".pdf", ".alto.xml", ".page.xml", ".mets.xml")
    assert stack.keys(f"documents/{document_id}") == sorted(f"documents/{document_id}{s}" for s in suffixes)
    view = httpx.get(f"{api.url}/v1/documents/{document_id}", headers=auth).json()
    assert view["outputs"]["formats"] == ["json", "md", "pdf", "alto", "mets"]

    def get(path: str, **params: str | int) -> httpx.Response:
        return httpx.get(f"{api.url}{path}", params=params, headers=auth, timeout=30)

    result = f"/v1/documents/{document_id}/result"
    for fmt in ("alto", "page", "hocr"):
        stored_or_built, alone = get(result, format=fmt), get(f"/v1/pages/{page_id}", format=fmt)
        assert stored_or_built.status_code == 200 and stored_or_built.content == alone.content, fmt
        assert first_word in stored_or_built.text
    assert get(result, format="alto").headers["content-disposition"] == 'inline; filename="receipt.alto.xml"'
    assert get(result, format="hocr").headers["content-type"].startswith("application/xhtml+xml")
    assert f'xlink:href="{document_id}.alto.xml"' in get(result, format="mets").text
    _error(get(result, format="page", page=2), 404, "not_found")  # it has one page
    _error(get(result, format="alto", page=1), 422, "invalid_request")
    _error(get(result, format="docx"), 422, "invalid_request")
    _error(get(f"/v1/pages/{page_id}", format="mets"), 422, "invalid_request")

    # An API that builds nothing on request still serves what the workers wrote.
    strict = ApiProcess(stack.config, stack.root / "api-strict.log",
                        env={**stack.env(), "PAPERLANE_API__MAX_BUILD_PAGES": "0"}).wait_ready()
    try:
        assert httpx.get(f"{strict.url}{result}", params={"format": "alto"}, headers=auth).status_code == 200
        message = _error(httpx.get(f"{strict.url}{result}", params={"format": "hocr"}, headers=auth), 404,
                         "not_written")
        assert "api.max_build_pages" in message
    finally:
        strict.stop()


def test_requests_refused_under_attack(stack_factory, api_factory, tmp_path: Path) -> None:
    stack = stack_factory(**API_SETTINGS, API__RATE_PER_MINUTE="8")
    api = api_factory(stack)
    batch_key, _ = create_key(stack, "acme")
    page = render_page(sample_lines(42))

    _error(_upload(api, None, page), 401, "unauthorized")
    _error(_upload(api, "pl_not-a-real-key", page), 401, "unauthorized")
    _error(httpx.get(f"{api.url}/v1/documents/x", headers={"Authorization": "Basic abc"}), 401, "unauthorized")
    assert "interactive" in _error(_upload(api, batch_key, page, lane="interactive"), 403, "lane_forbidden")
    _error(_upload(api, batch_key, b"#!/bin/sh\nrm -rf /\n", "receipt.png"), 415, "unsupported_media_type")
    _error(_upload(api, batch_key, page, lane="express"), 422, "invalid_request")
    # Oversized: refused from its declared length, and while reading one that declares none.
    _error(_upload(api, batch_key, b"\xff\xd8\xff" + b"\0" * 3_100_000, "big.jpg"), 413, "too_large")

    def chunked() -> Iterator[bytes]:
        boundary = b"--b0undary"
        yield boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="big.jpg"\r\n\r\n\xff\xd8\xff'
        for _ in range(40):
            yield b"\0" * 100_000
        yield b"\r\n" + boundary + b"--\r\n"
    resp = httpx.post(f"{api.url}/v1/documents", content=chunked(), timeout=30,
                      headers={"Authorization": f"Bearer {batch_key}",
                               "Content-Type": "multipart/form-data; boundary=b0undary"})
    _error(resp, 413, "too_large")
    _error(httpx.post(f"{api.url}/v1/ingests", json={"source": "s3://someone-elses-bucket/"},
                      headers={"Authorization": f"Bearer {batch_key}"}), 403, "bucket_forbidden")
    _error(_upload(api, batch_key, page, callback_url="file:///etc/passwd"), 400, "invalid_request")

    # A burst past the rate: 429 with Retry-After (a fixed one-minute window: at most 2 x 8 + 1 tries).
    for _ in range(17):
        resp = httpx.get(f"{api.url}/v1/documents/x", headers={"Authorization": f"Bearer {batch_key}"})
        if resp.status_code == 429:
            break
    _error(resp, 429, "rate_limited")
    assert 1 <= int(resp.headers["Retry-After"]) <= 60
    assert "/v1/documents" not in api.output() or "Traceback" not in api.output()


def test_events_stream_a_pdf_and_the_webhook_is_signed_and_retried(stack_factory, worker_factory, api_factory,
                                                                   tmp_path: Path) -> None:
    receiver = Receiver([500])  # the first try fails: it is retried
    stack = stack_factory(**{**API_SETTINGS, **receiver_settings(receiver)})
    worker_factory(stack)
    try:
        key, secret = create_key(stack, "acme", interactive=True)
        assert secret
        api = api_factory(stack)
        resp = _upload(api, key, _pdf([43, 44, 45]), "book.pdf", lane="interactive", callback_url=receiver.url)
        assert resp.status_code == 202, resp.text
        document_id = resp.json()["document_id"]
        with httpx.stream("GET", f"{api.url}/v1/documents/{document_id}/events", timeout=120,
                          headers={"Authorization": f"Bearer {key}"}) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            events = sse_events("".join(stream.iter_text()))
        kinds = [e for e, _ in events]
        assert kinds == ["page", "page", "page", "done"], kinds
        assert sorted(d["page_no"] for e, d in events if e == "page") == [1, 2, 3]
        assert all(d["status"] == "succeeded" and d["result"]["text"] for e, d in events if e == "page")
        assert events[-1][1]["status"] == "succeeded" and events[-1][1]["outputs"]["pdf"]

        [(_, first), (headers, body)] = receiver.wait(2)
        assert first == body and headers["host"] == f"{HOOKS}:{receiver.port}"  # pinned: by name, to its address
        assert verify(secret, body, headers["x-paperlane-signature"])
        assert not verify(secret, body + b" ", headers["x-paperlane-signature"])
        payload = json.loads(body)
        assert (payload["event"], payload["status"], payload["pages"]) == ("ingest.finished", "succeeded", 3)
        assert payload["documents"][0]["document_id"] == document_id
        db = Database(stack.settings.database_url)
        [(delivery, tries)] = webhooks.deliveries(db, resp.json()["ingest_id"])
        assert delivery.delivered_at is not None and [t.status for t in tries] == [500, 200]
    finally:
        receiver.close()


def test_an_s3_prefix_ingest_through_the_api(stack_factory, worker_factory, api_factory) -> None:
    stack = stack_factory(**API_SETTINGS)
    worker_factory(stack)
    api = api_factory(stack)
    key, _ = create_key(stack, "acme")
    s3 = stack.s3()
    inbox = f"{stack.bucket}-inbox"
    s3.create_bucket(Bucket=inbox)
    for i in range(3):
        s3.put_object(Bucket=inbox, Key=f"acme/{i}.png", Body=render_page(sample_lines(50 + i, 2)))
    assert cli(stack, "keys", "grant", "--tenant", "acme", f"s3://{inbox}/acme").returncode == 0
    auth = {"Authorization": f"Bearer {key}"}
    resp = httpx.post(f"{api.url}/v1/ingests", json={"source": f"s3://{inbox}/acme/"}, headers=auth)
    assert resp.status_code == 202, resp.text
    ingest_id = resp.json()["ingest_id"]

    def done() -> dict | None:
        view = httpx.get(f"{api.url}/v1/ingests/{ingest_id}", params={"wait": 5}, headers=auth, timeout=30).json()
        return view if view["status"] == "succeeded" else None
    view = until(done, what="ingest finished", timeout=120, every=0.2)
    assert (view["documents"], view["pages"], view["succeeded"]) == (3, 3, 3)  # type: ignore[index]


def test_a_succeeded_document_says_its_outputs_are_pending_or_failed(stack_factory, api_factory) -> None:
    """No worker runs here: the page is finished by the worker's own final-state write, and the outputs are left to
    the writer. A client that sees `succeeded` reads `outputs.state` and gets 409 `outputs_pending` with Retry-After
    from `/result` until they are written, or 404 `outputs_failed` with the (redacted) reason once given up."""
    stack = stack_factory(**API_SETTINGS)
    api = api_factory(stack)
    key, _ = create_key(stack, "acme")
    auth = {"Authorization": f"Bearer {key}"}
    resp = _upload(api, key, render_page(sample_lines(5, 2)), "one.png")
    assert resp.status_code == 202, resp.text
    [page] = resp.json()["pages"]
    document_id = resp.json()["document_id"]
    db = Database(stack.settings.database_url)
    try:
        result = f"{api.url}/v1/documents/{document_id}/result"
        _error(httpx.get(result, headers=auth), 409, "not_ready")  # its page is not final yet
        assert succeed(db, page["job_id"]) == [document_id]
        view = httpx.get(f"{api.url}/v1/documents/{document_id}", headers=auth).json()
        assert view["status"] == "succeeded" and view["outputs"]["state"] == "pending"
        pending = httpx.get(result, headers=auth)
        _error(pending, 409, "outputs_pending")
        assert pending.headers["Retry-After"] == "1"

        held = outputs.claim(db, document_id, now=utcnow(), hold=30)
        assert held is not None
        error = ValueError('cannot write to host "objects.internal:8333": [SQL: UPDATE documents]')
        assert outputs.failed_try(db, held, error, policy=RetryPolicy(), now=utcnow()).value == "failed"
        view = httpx.get(f"{api.url}/v1/documents/{document_id}", headers=auth).json()
        assert view["status"] == "succeeded" and view["outputs"]["state"] == "failed"
        message = _error(httpx.get(result, headers=auth), 404, "outputs_failed")
        assert "objects.internal" not in message and "UPDATE" not in message
    finally:
        db.dispose()
