"""Tenants, API keys and the webhook outbox, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from paperlane.errors import UsageError
from paperlane.producer.inputs import Document
from paperlane.producer.submit import SubmittedPage, Submitter
from paperlane.schemas import TaskSpec
from paperlane.storage import ingests, tenants, webhooks
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database, utcnow
from paperlane.storage.localfs import LocalStore
from paperlane.storage.tables import Base
from tests.pages import tiny_page
from tests.test_ingests import doc, succeed


def test_the_migrations_build_exactly_the_declared_schema_and_step_down_and_up(db: Database) -> None:
    from alembic import command
    from alembic.config import Config

    from paperlane.storage.db import _MIGRATIONS

    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    with db.engine.begin() as conn:  # this stop's migrations back, and again, with their views in place
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0002")
        command.upgrade(cfg, "head")
    with db.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


def test_a_key_is_shown_once_kept_as_a_hash_and_can_be_revoked(db: Database) -> None:
    made = tenants.create_key(db, tenant="acme", interactive=True)
    other = tenants.create_key(db, tenant="acme")
    assert made.tenant_created and not other.tenant_created and made.tenant_id == other.tenant_id
    assert made.key.startswith("pl_") and len(made.key) > 40
    caller = tenants.authenticate(db, made.key)
    assert caller is not None and (caller.tenant, caller.interactive) == ("acme", True)
    assert tenants.authenticate(db, other.key).interactive is False  # type: ignore[union-attr]
    assert tenants.authenticate(db, made.key[:-1] + "x") is None and tenants.authenticate(db, "") is None
    keys = tenants.list_keys(db, "acme")
    assert len(keys) == 2 and all(made.key not in (k.key_hash, k.prefix) or k.prefix == made.key[:10]
                                  for k, _ in keys)
    with pytest.raises(UsageError):
        tenants.revoke_key(db, "pl_")
    assert tenants.revoke_key(db, made.key[:10]) == 1
    assert tenants.authenticate(db, made.key) is None and tenants.authenticate(db, other.key) is not None


def _submit(db: Database, store: LocalStore, docs: list[Document], owner: ingests.Owner) -> list[SubmittedPage]:
    sub = Submitter(db=db, store=store, spec=TaskSpec(), owner=owner)
    return [p for p in sub.submit(docs, name=f"upload {owner.tenant_id} {len(docs)}", sources=[])
            if isinstance(p, SubmittedPage)]


def test_tenants_never_share_work_and_a_finished_ingest_queues_one_webhook(db: Database, tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    a = tenants.create_key(db, tenant="a")
    b = tenants.create_key(db, tenant="b")
    page = tiny_page(5)
    pa = _submit(db, store, [doc("x", page, pages=2)], ingests.Owner(a.tenant_id, a.key_id, "http://hook/a"))
    pb = _submit(db, store, [doc("x", page, pages=2)], ingests.Owner(b.tenant_id, b.key_id, None))
    assert not {p.job_id for p in pa} & {p.job_id for p in pb}  # same bytes, two tenants: two jobs
    ingest_id = pa[0].ingest_id
    succeed(db, pa[0].job_id)
    now = utcnow()
    assert webhooks.claim_due(db, now=now, lease=30) == []  # one page of two: not finished
    jobstore.finish_failed(db, pa[1].job_id, "engine refused", "inference")
    [delivery] = webhooks.claim_due(db, now=utcnow(), lease=30)
    assert (delivery.ingest_id, delivery.url, delivery.event, delivery.attempt) == (
        ingest_id, "http://hook/a", "ingest.finished", 1)
    assert webhooks.claim_due(db, now=utcnow(), lease=30) == []  # held by its lease
    body = webhooks.payload(db, delivery)
    assert (body["status"], body["succeeded"], body["failed"]) == ("partial", 1, 1)
    assert [d["pages"] for d in body["documents"]] == [2]
    state = webhooks.record(db, delivery, status=500, error=None, seconds=0.01, now=utcnow(), max_attempts=3,
                            backoff=10)
    assert state == "retry" and webhooks.claim_due(db, now=utcnow(), lease=30) == []
    [again] = webhooks.claim_due(db, now=utcnow() + timedelta(seconds=11), lease=30)
    assert again.attempt == 2
    assert webhooks.record(db, again, status=204, error=None, seconds=0.01, now=utcnow(), max_attempts=3,
                           backoff=10) == "delivered"
    [(row, tries)] = webhooks.deliveries(db, ingest_id)
    assert row.delivered_at is not None and [t.status for t in tries] == [500, 204]
    # Its failed page redone (--force): the ingest is open again, then finishes again, and says so again.
    jobstore.requeue(db, pa[1].job_id)
    assert webhooks.claim_due(db, now=utcnow(), lease=30) == []
    succeed(db, pa[1].job_id)
    assert len(webhooks.deliveries(db, ingest_id)) == 2
