"""Webhook deliveries retry through the one retry policy (``paperlane.retry.RetryPolicy``): each failed try is due
again after the policy's delay for it, and the delivery is given up once the policy's attempts are exhausted."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from paperlane.producer.submit import SubmittedPage, Submitter
from paperlane.retry import RetryPolicy
from paperlane.schemas import TaskSpec
from paperlane.storage import ingests, tenants, webhooks
from paperlane.storage.db import Database, utcnow
from paperlane.storage.localfs import LocalStore
from tests.pages import tiny_page
from tests.test_ingests import doc, succeed


def test_a_failing_webhook_waits_the_policys_delays_and_is_given_up_when_they_run_out(db: Database,
                                                                                    tmp_path: Path) -> None:
    key = tenants.create_key(db, tenant="hooked")
    sub = Submitter(db=db, store=LocalStore(tmp_path), spec=TaskSpec(),
                    owner=ingests.Owner(key.tenant_id, key.key_id, "http://hook/x"))
    [page] = [p for p in sub.submit([doc("x", tiny_page(3))], name="one", sources=[]) if isinstance(p, SubmittedPage)]
    succeed(db, page.job_id)
    policy = RetryPolicy(max_attempts=3, backoff=5)
    now = utcnow()
    outcomes = []
    for attempt in range(1, policy.max_attempts + 1):
        [delivery] = webhooks.claim_due(db, now=now, lease=1)
        assert delivery.attempt == attempt
        outcomes.append(webhooks.record(db, delivery, status=503, error=None, seconds=0.01, now=now, policy=policy))
        if outcomes[-1] == "retry":  # not due a moment before the policy's delay, due right after it
            assert webhooks.claim_due(db, now=now + timedelta(seconds=policy.delay(attempt) - 0.5), lease=1) == []
            now += timedelta(seconds=policy.delay(attempt) + 0.5)
    assert outcomes == ["retry", "retry", "given up"]
    assert webhooks.claim_due(db, now=now + timedelta(days=1), lease=1) == []
    [(row, tries)] = webhooks.deliveries(db, page.ingest_id)
    assert row.given_up_at is not None and [t.status for t in tries] == [503, 503, 503]
