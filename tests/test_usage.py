"""Metering (``storage.usage``) on SQLite and PostgreSQL: a page counts once whatever happens to its job, its
engine work counts as spent; budgets and the usage reads; then the API's 429, /v1/usage and the CLI."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, date, datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from paperlane.producer.submit import SubmittedPage, Submitter
from paperlane.retry import RetryPolicy
from paperlane.schemas import JobStatus, PageResult, Quality, QualityFlag, TaskSpec, Usage
from paperlane.storage import ingests, tenants, usage
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database, utcnow
from paperlane.storage.localfs import LocalStore
from tests.conftest import Stack, cli
from tests.pages import tiny_page
from tests.test_ingests import doc

POLICY = RetryPolicy(max_attempts=3)


def _submit(db: Database, store: LocalStore, docs: list, tenant_id: str | None) -> list[SubmittedPage]:
    sub = Submitter(db=db, store=store, spec=TaskSpec(), owner=ingests.Owner(tenant_id))
    return [p for p in sub.submit(docs, name="n", sources=[]) if isinstance(p, SubmittedPage)]


def _succeed(db: Database, job_id: str, *, tokens: int = 100, again: bool = False) -> None:
    job = jobstore.get_job(db, job_id) if again else jobstore.start_attempt(db, job_id, policy=POLICY)
    assert job is not None
    result = PageResult(job_id=job_id, source=job.source, status=JobStatus.SUCCEEDED,
                        usage=Usage(prompt_tokens=tokens, completion_tokens=tokens // 10))
    jobstore.finish_succeeded(db, job, result, engine="stub", result_key=f"results/{job_id}.json",
                              annotated_key=None, timings={"inference": 0.5})


def _total(db: Database, tenant_id: str) -> dict:
    return usage.totals(usage.days(db, since=date(2000, 1, 1), tenant_id=tenant_id))


def test_a_page_counts_once_across_retries_redeliveries_and_a_late_duplicate(db: Database, tmp_path: Path) -> None:
    acme = tenants.create_key(db, tenant="acme").tenant_id
    store = LocalStore(tmp_path)
    # Two documents with the same page: one job, two pages; and a page of its own.
    pages = _submit(db, store, [doc("a", tiny_page(1)), doc("b", tiny_page(1)), doc("c", tiny_page(2))], acme)
    shared, single = pages[0].job_id, pages[2].job_id
    assert pages[1].job_id == shared
    # The shared job: an attempt that fails and is retried, then a success, then a redelivered message that
    # finds it final, then a late duplicate from a worker that held it too: its pages count once each.
    assert jobstore.start_attempt(db, shared, policy=POLICY) is not None
    jobstore.record_retry(db, shared, "engine unreachable", "inference")
    _succeed(db, shared)
    assert jobstore.start_attempt(db, shared, policy=POLICY) is None  # redelivered: final already, nothing runs
    _succeed(db, shared, again=True)
    # The other page: its final attempt failed after the engine answered (its work was spent).
    assert jobstore.start_attempt(db, single, policy=POLICY) is not None
    spent = usage.EngineWork(prompt_tokens=70, completion_tokens=7, seconds=0.25)
    jobstore.finish_failed(db, single, "object store unreachable", "store", work=spent)
    jobstore.finish_failed(db, single, "object store unreachable", "store", work=spent)  # again: nothing moves
    total = _total(db, acme)
    assert (total["pages_succeeded"], total["pages_failed"]) == (2, 1), total
    assert (total["prompt_tokens"], total["completion_tokens"]) == (100 + 70, 10 + 7), total
    assert total["engine_seconds"] == pytest.approx(0.75)
    # The failed page submitted again: it leaves the count while queued, and counts once more when final.
    jobstore.requeue(db, single)
    assert _total(db, acme)["pages_failed"] == 0
    _succeed(db, single, tokens=50)
    total = _total(db, acme)
    assert (total["pages"], total["pages_succeeded"], total["prompt_tokens"]) == (3, 3, 220), total
    # A new ingest asking for a page whose job is done counts that page (no engine work), under its tenant.
    _submit(db, store, [doc("d", tiny_page(2))], acme)
    assert _total(db, acme)["pages_succeeded"] == 4 and _total(db, acme)["prompt_tokens"] == 220
    # The command line's pages count under the tenant "".
    [mine] = _submit(db, store, [doc("e", tiny_page(3))], None)
    _succeed(db, mine.job_id)
    assert _total(db, usage.NO_TENANT)["pages_succeeded"] == 1 and _total(db, acme)["pages"] == 4


def test_needs_review_is_counted_where_results_say_so(db: Database, tmp_path: Path) -> None:
    acme = tenants.create_key(db, tenant="acme").tenant_id
    pages = _submit(db, LocalStore(tmp_path), [doc("a", tiny_page(1)), doc("b", tiny_page(2))], acme)
    for page, flags in zip(pages, ({QualityFlag.EMPTY}, {QualityFlag.RETRIED}), strict=True):
        job = jobstore.start_attempt(db, page.job_id, policy=POLICY)
        assert job is not None
        result = PageResult(job_id=job.id, source=job.source, status=JobStatus.SUCCEEDED,
                            quality=Quality.grade(flags, None))
        jobstore.finish_succeeded(db, job, result, engine="stub", result_key="r", annotated_key=None, timings={})
    # the empty page needs review; the one read again cleanly does not
    assert (_total(db, acme)["pages_succeeded"], _total(db, acme)["pages_review"]) == (2, 1)


def test_the_monthly_budget_counts_final_and_unfinished_pages(db: Database, tmp_path: Path) -> None:
    tenants.create_key(db, tenant="acme")
    acme = tenants.set_limits(db, "acme", monthly_pages=3, weight=2.0)
    assert (acme.monthly_pages, acme.weight, acme.max_pages_in_flight) == (3, 2.0, None)
    now = datetime(2026, 12, 14, 10, tzinfo=UTC)
    assert usage.budget(db, acme.tenant_id, now=now).resets == date(2027, 1, 1)
    pages = _submit(db, LocalStore(tmp_path), [doc("a", tiny_page(1)), doc("b", tiny_page(2))], acme.tenant_id)
    assert not usage.budget(db, acme.tenant_id).exhausted  # 2 in flight of 3
    for p in pages:
        _succeed(db, p.job_id)
    _submit(db, LocalStore(tmp_path), [doc("c", tiny_page(3))], acme.tenant_id)
    found = usage.budget(db, acme.tenant_id)
    assert (found.used, found.limit, found.exhausted) == (3, 3, True)
    assert usage.budget(db, acme.tenant_id, now=datetime(2099, 1, 2, tzinfo=UTC)).used == 1  # a new month: c only
    tenants.set_limits(db, "acme", monthly_pages=None)
    assert not usage.budget(db, acme.tenant_id).exhausted
    with pytest.raises(Exception, match="weight"):
        tenants.set_limits(db, "acme", weight=0.0)


def test_per_tenant_series_name_the_top_tenants_and_count_the_rest_as_other(db: Database) -> None:
    from prometheus_client import REGISTRY

    from paperlane.workers.exporter import OTHER, TenantSeries

    ids = {n: tenants.create_key(db, tenant=f"series-{n}").tenant_id for n in ("big", "mid", "small")}
    with db.session() as s:
        for name, pages in (("big", 100), ("mid", 50), ("small", 1)):
            usage.add(s, ids[name], utcnow(), pages_succeeded=pages)
    series = TenantSeries(db, labels=2)
    assert series.label(ids["small"]) == OTHER
    assert (series.label(ids["big"]), series.label(ids["mid"]), series.label(None)) == ("series-big", "series-mid", "-")

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = sample("paperlane_tenant_pages_total", tenant="series-big", outcome="succeeded")
    tokens = sample("paperlane_tenant_engine_tokens_total", tenant=OTHER, kind="prompt")
    series.count(ids["big"], "succeeded", usage.EngineWork(prompt_tokens=10, completion_tokens=2, seconds=0.5))
    series.count(ids["small"], "failed", usage.EngineWork(prompt_tokens=7))
    assert sample("paperlane_tenant_pages_total", tenant="series-big", outcome="succeeded") == before + 1
    assert sample("paperlane_tenant_engine_seconds_total", tenant="series-big") >= 0.5
    assert sample("paperlane_tenant_engine_tokens_total", tenant=OTHER, kind="prompt") == tokens + 7
    with db.session() as s:  # small overtakes them all: the two labels are taken for good, the set stays bounded
        usage.add(s, ids["small"], utcnow(), pages_succeeded=1000)
    assert TenantSeries(db, labels=2).label(ids["small"]) == "series-small"  # a new process names the top two
    assert series.label(ids["small"]) == OTHER


def test_quota_usage_endpoint_and_cli(stack_factory: Callable[..., Stack]) -> None:
    # No worker runs: with a buffer of one, only acme's first page is on the lane's list, the rest wait by share.
    stack = stack_factory(FAIR_SHARE__BUFFER="1")
    key, other = _key(stack, "acme"), _key(stack, "globex")
    assert cli(stack, "keys", "grant", "--tenant", "acme", "s3://scans/2026/").returncode == 0  # 429, not 403
    res = cli(stack, "tenants", "set", "acme", "--monthly-pages", "2", "--in-flight", "50", "--weight", "3")
    assert res.returncode == 0 and "acme" in res.stdout and "3" in res.stdout, res.stdout + res.stderr
    assert cli(stack, "tenants", "set", "nobody", "--weight", "2").returncode != 0
    assert cli(stack, "tenants", "set", "acme", "--monthly-pages", "lots").returncode == 2
    accepted, ingest_id = asyncio.run(_through_the_api(stack, key, other))
    status = cli(stack, "status", "--ingest", ingest_id, "--json")  # the CLI shows the same share
    assert json.loads(status.stdout)["share"] == 0.75, status.stdout + status.stderr
    assert "75.0% of the engine now" in cli(stack, "status", "--ingest", ingest_id).stdout
    db = Database(stack.settings.database_url)
    _succeed(db, accepted)
    shown = cli(stack, "usage", "--tenant", "acme", "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["total"]["pages_succeeded"] == 1 and data["days"][0]["tenant"] == "acme"
    table = cli(stack, "usage")
    assert table.returncode == 0 and "acme" in table.stdout and "total" in table.stdout
    with db.session() as s:  # the operators' view
        assert s.execute(text("SELECT tenant, pages FROM tenant_usage")).all() == [("acme", 1)]


async def _through_the_api(stack: Stack, key: str, other: str) -> tuple[str, str]:
    """Two uploads within acme's budget of 2, a third refused, an ingest refused, globex unaffected, /v1/usage;
    the job id and ingest id of the last page accepted."""
    from paperlane.producer.api.app import create_app

    app = create_app(stack.settings, webhooks=False)
    auth = {"Authorization": f"Bearer {key}"}
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                                                   base_url="http://api") as api:
        for i in (1, 2):
            resp = await api.post("/v1/documents", headers=auth, files={"file": (f"p{i}.png", tiny_page(i))},
                                  data={"weight": "2"})
            assert resp.status_code == 202, resp.text
        refused = await api.post("/v1/documents", headers=auth, files={"file": ("p3.png", tiny_page(3))})
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "monthly_budget_used" and "2 of its 2 pages" in error["message"]
        assert usage.next_month(datetime.now(UTC)).isoformat() in error["message"]
        assert int(refused.headers["Retry-After"]) > 0
        refused = await api.post("/v1/ingests", headers=auth, json={"source": "s3://scans/2026/"})
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "monthly_budget_used"
        # Another tenant is not held back by acme's budget.
        theirs = await api.post("/v1/documents", headers={"Authorization": f"Bearer {other}"},
                                files={"file": ("p.png", tiny_page(9))})
        assert theirs.status_code == 202
        body = (await api.get("/v1/usage", headers=auth)).json()
        assert body["tenant"] == "acme" and body["budget"]["monthly_pages"] == 2 and body["budget"]["used"] == 2
        assert body["total"]["pages"] == 0 and body["days"] == []  # registered, none final yet
        ingest = (await api.get(f"/v1/ingests/{resp.json()['ingest_id']}", headers=auth)).json()
        assert ingest["share"] == 0.75, ingest  # acme (weight 3) beside globex (1), the lane's only starts
        assert (await api.get("/v1/usage", params={"since": "not-a-date"}, headers=auth)).status_code == 422
    return str(resp.json()["pages"][0]["job_id"]), str(resp.json()["ingest_id"])


def _key(stack: Stack, tenant: str) -> str:
    res = cli(stack, "keys", "create", "--tenant", tenant)
    assert res.returncode == 0, res.stderr
    return res.stdout.split()[-1]
