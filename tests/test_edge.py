"""Odd bytes at the API's edge (issue 25): a NUL byte or another control character in an id, a path segment, a
cursor or a query answers 4xx with a clear error on every route that takes one, never 500; a file name and engine
text with characters XML 1.0 forbids still give well-formed ALTO, PAGE XML, hOCR and METS through the API."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
from lxml import etree

from paperlane.formats.xmlchars import FORBIDDEN
from paperlane.retry import RetryPolicy
from paperlane.schemas import JobStatus, Line, PageResult
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.storage.objects import open_store
from paperlane.storage.tenants import create_key
from tests.conftest import Stack
from tests.pages import tiny_page

ODD_IDS = ["a%00b", "%01", "x%7Fy", "%EF%BF%BF", "%ED%A0%80"]  # NUL, SOH, DEL, U+FFFF, a lone surrogate's bytes
ROUTES = ["/v1/documents/{}", "/v1/documents/{}/result", "/v1/documents/{}/events", "/v1/pages/{}",
          "/v1/pages/{}/annotated", "/v1/ingests/{}", "/v1/ingests/{}/review"]


@asynccontextmanager
async def _api(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    from paperlane.producer.api.app import create_app

    app = create_app(stack.settings, webhooks=False)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                                                   base_url="http://api") as client:
        yield client


def _cursor(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode()


def test_odd_bytes_in_ids_cursors_and_queries_answer_4xx(stack_factory: Callable[..., Stack]) -> None:
    asyncio.run(_odd_bytes(stack_factory()))


async def _odd_bytes(stack: Stack) -> None:
    async with _api(stack) as api:  # its start migrates the database
        auth = {"Authorization": f"Bearer {create_key(Database(stack.settings.database_url), tenant='acme').key}"}
        uploaded = (await api.post("/v1/documents", headers=auth, files={"file": ("p.png", tiny_page(1))})).json()
        for route in ROUTES:
            for odd in ODD_IDS:
                resp = await api.get(route.format(odd), headers=auth)
                assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found", (route, odd, resp.text)
        review = f"/v1/ingests/{uploaded['ingest_id']}/review"
        for raw in ('["a", NaN]', '["a", Infinity]', '["a", 1e400]', '["a\\u0000", 1]', '["a", 1.5]', '["a", true]',
                    '{"a": 1}', '"x"'):
            resp = await api.get(review, params={"cursor": _cursor(raw)}, headers=auth)
            assert resp.status_code == 422 and "cursor" in resp.json()["error"]["message"], (raw, resp.text)
        for query in ({"cursor": "a\x00b"}, {"wait": "\x00"}, {"format": "alto\x00"}):
            resp = await api.get(review, params=query, headers=auth)
            assert resp.status_code == 400 and "query parameter" in resp.json()["error"]["message"], resp.text
        for since in ("1.58e-105", "0", "2026-02-30", "nan"):
            resp = await api.get("/v1/usage", params={"since": since}, headers=auth)
            assert resp.status_code == 422, (since, resp.text)
        for wait in ("nan", "inf", "-1"):
            resp = await api.get(f"/v1/documents/{uploaded['document_id']}", params={"wait": wait}, headers=auth)
            assert resp.status_code in (200, 422), resp.text  # inf is held to api.max_wait; nan and -1 refused
        refused = await api.request("TRACE", "/v1/usage", headers=auth)
        assert refused.status_code == 405 and refused.headers["Allow"] == "GET", refused.headers
        assert (await api.post("/v1/ingests", headers=auth, json={})).status_code == 422


def test_forbidden_characters_in_names_and_text_give_well_formed_formats(
        stack_factory: Callable[..., Stack]) -> None:
    asyncio.run(_forbidden_characters(stack_factory()))


async def _forbidden_characters(stack: Stack) -> None:
    db = Database(stack.settings.database_url)
    async with _api(stack) as api:
        auth = {"Authorization": f"Bearer {create_key(db, tenant='acme').key}"}
        resp = await api.post("/v1/documents", headers=auth, files={"file": ("scan\uffff\ud7ff\x01.png", tiny_page(1))},
                              data={"name": "name\ufffe"})
        assert resp.status_code in (202, 422), resp.text
        resp = await api.post("/v1/documents", headers=auth, files={"file": ("scan\uffff\ufffe.png", tiny_page(1))})
        assert resp.status_code == 202, resp.text
        body = resp.json()
        page_id = body["pages"][0]["page_id"]
        succeed(stack, db, body["pages"][0]["job_id"], "a\uffff b\x07")
        urls = [f"/v1/documents/{body['document_id']}/result?format={f}" for f in ("alto", "hocr", "mets", "page")]
        urls += [f"/v1/pages/{page_id}?format={f}" for f in ("alto", "hocr", "page")]
        for url in urls:
            made = await api.get(url, headers=auth)
            assert made.status_code == 200, (url, made.text)
            assert not FORBIDDEN.search(made.content.decode()), url
            etree.fromstring(made.content)  # well-formed, or this raises
            assert "\ufffd" in made.content.decode() or "mets" not in url, url  # the name's U+FFFF, replaced


def succeed(stack: Stack, db: Database, job_id: str, text: str) -> None:
    """The job succeeded with one line of ``text``: its result stored, then the worker's final-state write."""
    job = jobstore.start_attempt(db, job_id, policy=RetryPolicy(max_attempts=3))
    assert job is not None
    result = PageResult(job_id=job_id, source=job.source, status=JobStatus.SUCCEEDED, text=text, width=100,
                        height=100, lines=[Line(text=text, quad=[(1, 1), (90, 1), (90, 20), (1, 20)])])
    open_store(stack.settings).put(f"results/{job_id}.json", result.model_dump_json().encode())
    jobstore.finish_succeeded(db, job, result, engine="stub", result_key=f"results/{job_id}.json",
                              annotated_key=None, timings={})
