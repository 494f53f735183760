"""Budgets hold across API replicas (issue 25): two ``paperlane api`` processes on one database and Redis, 50
concurrent one-page uploads of a tenant against its monthly budget, 50 against another's pages in flight, and 50
requests against a key's rate: no more is accepted than the budget, and what the tenant's usage says is what was
accepted. Each is reserved in one place, atomically: the monthly and in-flight budgets by one conditional UPDATE
(``storage.tenants.PageBudget.reserve``), the rate windows by one Lua script (``producer.api.limits``)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from paperlane.storage import tenants
from paperlane.storage.db import Database
from tests.api_server import ApiProcess
from tests.conftest import Stack
from tests.pages import tiny_page

pytestmark = pytest.mark.slow

MONTHLY, IN_FLIGHT, RATE, REQUESTS = 10, 7, 20, 50


def _together(calls: list[Callable[[], httpx.Response]]) -> list[int]:
    with ThreadPoolExecutor(len(calls)) as pool:
        return [r.status_code for r in pool.map(lambda call: call(), calls)]


def _upload(api: ApiProcess, key: str, i: int) -> Callable[[], httpx.Response]:
    return lambda: httpx.post(f"{api.url}/v1/documents", headers={"Authorization": f"Bearer {key}"},
                              files={"file": (f"p{i}.png", tiny_page(i))}, timeout=120)


def test_two_replicas_never_accept_past_a_budget(stack_factory: Callable[..., Stack],
                                                 api_factory: Callable[[Stack], ApiProcess]) -> None:
    stack = stack_factory(API__RATE_PER_MINUTE=str(RATE), API__TENANT_RATE_PER_MINUTE="100000")
    replicas = [api_factory(stack), api_factory(stack)]
    db = Database(stack.settings.database_url)
    keys = {name: tenants.create_key(db, tenant=name).key for name in ("metered", "capped", "chatty")}
    metered = tenants.set_limits(db, "metered", monthly_pages=MONTHLY)
    capped = tenants.set_limits(db, "capped", max_pages_in_flight=IN_FLIGHT)

    statuses = _together([_upload(replicas[i % 2], keys["metered"], i) for i in range(REQUESTS)])
    accepted = statuses.count(202)
    assert 0 < accepted <= MONTHLY and statuses.count(429) == REQUESTS - accepted, statuses
    budget = tenants.PageBudget(db, metered.tenant_id, default_cap=10**6)
    assert budget.month() == accepted
    reader = tenants.create_key(db, tenant="metered").key  # the first key spent its rate on the uploads
    shown = httpx.get(f"{replicas[0].url}/v1/usage", headers={"Authorization": f"Bearer {reader}"}).json()
    assert shown["budget"]["used"] == accepted and shown["budget"]["monthly_pages"] == MONTHLY, shown

    statuses = _together([_upload(replicas[i % 2], keys["capped"], 1000 + i) for i in range(REQUESTS)])
    accepted = statuses.count(202)
    assert 0 < accepted <= IN_FLIGHT and statuses.count(429) == REQUESTS - accepted, statuses
    assert tenants.PageBudget(db, capped.tenant_id, default_cap=10**6).room() == (accepted, IN_FLIGHT)

    statuses = _together([lambda api=replicas[i % 2]: httpx.get(  # type: ignore[misc]
        f"{api.url}/v1/usage", headers={"Authorization": f"Bearer {keys['chatty']}"}, timeout=60)
        for i in range(REQUESTS)])
    assert statuses.count(200) == RATE and statuses.count(429) == REQUESTS - RATE, statuses
    db.dispose()
