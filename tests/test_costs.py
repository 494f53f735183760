"""Cost-based limits (issue 25): an archive format built on request is built once per version of the document and
read back from storage after; building costs the tenant its pages from ``api.build_pages_per_minute`` (429 past
it, another tenant unaffected); the request metrics' labels come from route templates and fixed sets of methods
and statuses (made-up methods and paths add no series); refused credentials are not kept. Builds run in the API's
build processes, not in its interpreter: one stuck past its limit or killed answers 503 ``build_failed``."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

import pytest

from prometheus_client import REGISTRY, generate_latest

from paperlane.storage.db import Database
from paperlane.storage.tenants import create_key
from tests.conftest import Stack
from tests.pages import tiny_page
from tests.test_edge import _api, succeed


def test_built_formats_are_kept_and_builds_are_limited_by_cost(stack_factory: Callable[..., Stack]) -> None:
    asyncio.run(_builds(stack_factory(API__BUILD_PAGES_PER_MINUTE="3")))


async def _builds(stack: Stack) -> None:
    db = Database(stack.settings.database_url)
    async with _api(stack) as api:
        acme = {"Authorization": f"Bearer {create_key(db, tenant='acme').key}"}
        globex = {"Authorization": f"Bearer {create_key(db, tenant='globex').key}"}
        docs = {}
        for n, auth in enumerate((acme, acme, globex)):
            body = (await api.post("/v1/documents", headers=auth, files={"file": (f"p{n}.png", tiny_page(n))})).json()
            succeed(stack, db, body["pages"][0]["job_id"], f"page {n}")
            docs[n] = body["document_id"]

        def alto(n: int, fmt: str = "alto") -> str:
            return f"/v1/documents/{docs[n]}/result?format={fmt}"
        first = await api.get(alto(0), headers=acme)
        assert first.status_code == 200, first.text
        kept = stack.keys("documents/built/")
        assert len(kept) == 1 and docs[0] in kept[0], kept
        for _ in range(20):  # read back, free: never refused, nothing built again
            again = await api.get(alto(0), headers=acme)
            assert again.status_code == 200 and again.content == first.content
        assert stack.keys("documents/built/") == kept
        assert (await api.get(alto(0, "hocr"), headers=acme)).status_code == 200  # a second page of acme's 3
        assert (await api.get(alto(1), headers=acme)).status_code == 200  # its third
        refused = await api.get(alto(1, "mets"), headers=acme)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "build_limited", refused.text
        assert int(refused.headers["Retry-After"]) >= 1
        assert (await api.get(alto(0), headers=acme)).status_code == 200  # what was built is still read back
        assert (await api.get(alto(2), headers=globex)).status_code == 200  # another tenant's budget is its own
    db.dispose()


@pytest.mark.processes
@pytest.mark.serial  # a build's limit is wall-clock seconds (api.build_timeout x 3)
def test_builds_run_in_processes_of_their_own_and_a_stuck_or_killed_one_answers_503(
        stack_factory: Callable[..., Stack]) -> None:
    asyncio.run(_outside(stack_factory(API__BUILD_TIMEOUT="2")))


async def _outside(stack: Stack) -> None:
    db = Database(stack.settings.database_url)
    async with _api(stack) as api:
        auth = {"Authorization": f"Bearer {create_key(db, tenant='acme').key}"}
        body = (await api.post("/v1/documents", headers=auth, files={"file": ("p.png", tiny_page(1))})).json()
        succeed(stack, db, body["pages"][0]["job_id"], "page one")
        doc = body["document_id"]
        builder = api._transport.app.state.service.builder  # type: ignore[attr-defined]
        assert builder.pids == []  # started by the first build, not before
        assert (await api.get(f"/v1/documents/{doc}/result?format=alto", headers=auth)).status_code == 200
        [stuck] = builder.pids
        assert stuck != os.getpid()
        os.kill(stuck, signal.SIGSTOP)  # the build process holds still: a build waits on it, reads do not
        build = asyncio.create_task(api.get(f"/v1/documents/{doc}/result?format=hocr", headers=auth))
        for _ in range(5):
            assert (await api.get(f"/v1/documents/{doc}", headers=auth)).status_code == 200
        assert not build.done()
        answer = await build  # its process killed past 3 x 2 s of wall-clock time, and replaced
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "build_failed" and "longer than 6 s" in answer.text
        assert int(answer.headers["Retry-After"]) >= 1
        assert not stack.keys("documents/built/") or all("hocr" not in k for k in stack.keys("documents/built/"))
        hocr = await api.get(f"/v1/documents/{doc}/result?format=hocr", headers=auth)
        assert hocr.status_code == 200 and b">one<" in hocr.content
        [fresh] = builder.pids
        assert fresh != stuck
        os.kill(fresh, signal.SIGKILL)  # a build process that dies: the build it held answers 503, saying so
        killed = await api.get(f"/v1/documents/{doc}/result?format=mets", headers=auth)
        assert killed.status_code == 503 and "SIGKILL" in killed.json()["error"]["message"], killed.text
        assert (await api.get(f"/v1/documents/{doc}/result?format=mets", headers=auth)).status_code == 200
    db.dispose()


def test_metric_labels_ignore_made_up_methods_and_paths_and_refused_keys_are_not_kept(
        stack_factory: Callable[..., Stack]) -> None:
    asyncio.run(_labels(stack_factory(API__AUTH_FAILURES_PER_MINUTE="100000")))


def _series() -> int:
    return sum(len(m.samples) for m in REGISTRY.collect() if m.name.startswith("paperlane_api_request"))


async def _labels(stack: Stack) -> None:
    async with _api(stack) as api:
        async def odd(i: int) -> None:
            await api.request(f"M{i}X", f"/made/up/{i}?q={i}")
            await api.request(f"BREW{i}", f"/v1/documents/{i}/x/{i}")
        for i in range(5):
            await odd(i)
        settled, size = _series(), len(generate_latest())
        for i in range(5, 300):
            await odd(i)
        assert _series() == settled and len(generate_latest()) < size + 2000  # counts grow, not series

        service = api._transport.app.state.service  # type: ignore[attr-defined]
        for i in range(100):
            resp = await api.get("/v1/usage", headers={"Authorization": f"Bearer pl_{i:03d}" + "x" * 120_000})
            assert resp.status_code == 401
        assert not service.auth_cache, "a refused key was kept"
        key = create_key(Database(stack.settings.database_url), tenant="acme").key
        assert (await api.get("/v1/usage", headers={"Authorization": f"Bearer {key}"})).status_code == 200
        assert list(service.auth_cache) and all(len(k) == 64 and key not in k for k in service.auth_cache)
