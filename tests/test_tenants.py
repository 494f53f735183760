"""Tenants, API keys and the webhook outbox, on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, select, text

from paperlane.errors import OverBudget, StorageUnavailable, UsageError
from paperlane.producer.input_items import Document
from paperlane.producer.submit import RESERVE_AHEAD, SubmittedPage, Submitter
from paperlane.retry import RetryPolicy
from paperlane.schemas import TaskSpec
from paperlane.storage import ingests, tenants, webhooks
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database, head_revision, utcnow
from paperlane.storage.localfs import LocalStore
from paperlane.storage.tables import Base, JobRow
from tests.pages import tiny_page
from tests.test_ingests import doc, succeed


def test_the_migrations_build_exactly_the_declared_schema_and_step_down_and_up(db: Database) -> None:
    from alembic.script import ScriptDirectory

    from paperlane.storage.db import _MIGRATIONS

    assert head_revision() == ScriptDirectory(str(_MIGRATIONS)).get_current_head()  # what upgrade() compares with
    db.migrate("0002", down=True)  # this stop's migrations back, and again, with their views in place
    db.migrate("head")
    with db.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


@pytest.mark.processes
def test_a_command_on_a_migrated_database_starts_without_alembic(db: Database) -> None:
    # Every command's start upgrades the database; one at the newest migration is told so by a query, not by
    # importing Alembic and reading every migration (half a second of a submit's CPU).
    code = ("import sys; from paperlane.storage.db import Database; Database(sys.argv[1]).upgrade(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic')[:1])")
    upgrade = [sys.executable, "-c", code, db.url]
    assert subprocess.run(upgrade, capture_output=True, text=True, check=True).stdout.strip() == "[]"
    db.migrate("-1", down=True)  # one migration behind: Alembic runs, and brings it to the newest
    assert subprocess.run(upgrade, capture_output=True, text=True, check=True).stdout.strip() == "['alembic']"
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == head_revision()


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
    state = webhooks.record(db, delivery, status=500, error=None, seconds=0.01, now=utcnow(),
                            policy=RetryPolicy(max_attempts=3, backoff=10))
    assert state == "retry" and webhooks.claim_due(db, now=utcnow(), lease=30) == []
    [again] = webhooks.claim_due(db, now=utcnow() + timedelta(seconds=11), lease=30)
    assert again.attempt == 2
    assert webhooks.record(db, again, status=204, error=None, seconds=0.01, now=utcnow(),
                           policy=RetryPolicy(max_attempts=3, backoff=10)) == "delivered"
    [(row, tries)] = webhooks.deliveries(db, ingest_id)
    assert row.delivered_at is not None and [t.status for t in tries] == [500, 204]
    # Its failed page redone (--force): the ingest is open again, then finishes again, and says so again.
    jobstore.requeue(db, pa[1].job_id)
    assert webhooks.claim_due(db, now=utcnow(), lease=30) == []
    succeed(db, pa[1].job_id)
    assert len(webhooks.deliveries(db, ingest_id)) == 2


def _budget(db: Database, tenant_id: str, cap: int) -> tenants.PageBudget:
    return tenants.PageBudget(db, tenant_id, default_cap=cap)


def test_pages_in_flight_are_reserved_atomically_and_released_as_pages_finish(db: Database, tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    made = tenants.create_key(db, tenant="acme")
    owner = ingests.Owner(made.tenant_id, made.key_id, None)
    budget = _budget(db, made.tenant_id, 6)

    def submit(docs: list[Document]) -> list[SubmittedPage]:
        sub = Submitter(db=db, store=store, spec=TaskSpec(), owner=owner, pages=budget)
        return [p for p in sub.submit(docs, name=f"upload {len(docs)} {docs[0].name}", sources=[])
                if isinstance(p, SubmittedPage)]

    pages = submit([doc("a", tiny_page(1), pages=2)])
    assert budget.room() == (2, 6)
    # Eight reservations at once against 4 pages of room: exactly 4 pass, whatever the interleaving.
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda _: _try(budget.reserve, 1), range(8)))
    assert outcomes.count(None) == 4 and all(isinstance(o, OverBudget) and o.retryable for o in outcomes if o)
    budget.release(4)

    succeed(db, pages[0].job_id)  # a page final: out of flight
    assert budget.room() == (1, 6)
    jobstore.requeue(db, pages[0].job_id)  # redone: in flight again
    assert budget.room() == (2, 6)
    succeed(db, pages[0].job_id)
    jobstore.finish_failed(db, pages[1].job_id, "engine refused", "inference")
    assert budget.room() == (0, 6)
    # The same bytes again: what was reserved for the page whose job succeeded is given back at once; the failed
    # one is queued again, with the first ingest's page of it: two pages in flight.
    again = submit([doc("a2", tiny_page(1), pages=2)])
    assert {p.job_id for p in again} == {p.job_id for p in pages} and budget.room() == (2, 6)
    jobstore.finish_failed(db, pages[1].job_id, "engine refused", "inference")
    assert budget.room() == (0, 6)
    # More pages than the whole budget: that document is refused (its one failed page, final at once).
    [refused] = submit([doc("huge", tiny_page(2), pages=7)])
    assert refused.error == "7 pages are more than this tenant may have in flight (6)" and budget.room() == (0, 6)
    # Past the budget now: the submit stops and gives back what it had reserved; nothing is registered.
    submit([doc("five", tiny_page(3), pages=5)])
    with pytest.raises(OverBudget) as raised:
        submit([doc("b", tiny_page(4)), doc("c", tiny_page(5), pages=3)])
    assert raised.value.retryable and budget.room() == (5, 6)


class _Counted:
    """A tenant's real budget, its reservations counted (the UPDATEs registration costs)."""

    def __init__(self, budget: tenants.PageBudget) -> None:
        self.budget, self.reservations = budget, 0

    def reserve(self, pages: int) -> None:
        self.reservations += 1
        self.budget.reserve(pages)

    def release(self, pages: int) -> None:
        self.budget.release(pages)


def test_an_ingest_reserves_its_budget_a_block_at_a_time_and_keeps_only_what_it_registers(db: Database,
                                                                                           tmp_path: Path) -> None:
    made = tenants.create_key(db, tenant="bulk")
    owner = ingests.Owner(made.tenant_id, made.key_id, None)
    docs = [doc(f"p{i}", tiny_page(i)) for i in range(150)]

    def submit(budget: _Counted, name: str) -> list[SubmittedPage]:
        sub = Submitter(db=db, store=LocalStore(tmp_path), spec=TaskSpec(), owner=owner, pages=budget, chunk_pages=50)
        return [p for p in sub.submit(docs, name=name, sources=[]) if isinstance(p, SubmittedPage)]

    roomy = _Counted(_budget(db, made.tenant_id, 1000))
    assert len(submit(roomy, "all")) == 150
    # A page a document: 150 reservations before, one a block now; the blocks' rest given back.
    assert roomy.reservations <= -(-150 // RESERVE_AHEAD) + 1
    assert roomy.budget.room() == (150, 1000) and roomy.budget.month() == 150
    # 100 pages of room left under a cap of 250: two chunks of 50 are registered, then the submit stops. A block asked
    # for when it does not fit gives way to the one page missing; nothing past the cap is ever reserved.
    tight = _Counted(_budget(db, made.tenant_id, 250))
    with pytest.raises(OverBudget) as raised:
        submit(tight, "again")
    assert raised.value.retryable and tight.budget.room() == (250, 250) and tight.budget.month() == 250


def test_a_submit_whose_originals_cannot_be_stored_gives_back_every_page_it_reserved(db: Database,
                                                                                      tmp_path: Path) -> None:
    """A chunk is registered on the registrar thread while the next is read: its error (here its originals' upload:
    the store's folder is a file) stops the submit from the main thread, and what both chunks reserved is given
    back, counted once."""
    made = tenants.create_key(db, tenant="unlucky")
    owner = ingests.Owner(made.tenant_id, made.key_id, None)
    budget = _budget(db, made.tenant_id, 100)
    (tmp_path / "store").write_bytes(b"not a folder")
    sub = Submitter(db=db, store=LocalStore(tmp_path / "store"), spec=TaskSpec(), owner=owner, pages=budget,
                    chunk_pages=2)
    with pytest.raises(StorageUnavailable, match="cannot write"):
        list(sub.submit([doc(f"u{i}", tiny_page(i)) for i in range(7)], name="unlucky", sources=[]))
    assert budget.room() == (0, 100)
    with db.session() as s:
        assert s.scalar(select(func.count()).select_from(JobRow)) == 0


def _try(fn: Callable[[int], None], n: int) -> Exception | None:
    try:
        fn(n)
    except Exception as exc:
        return exc
    return None


def test_a_key_prefix_is_matched_literally_and_a_whole_key_exactly(db: Database) -> None:
    first = tenants.create_key(db, tenant="acme")
    second = tenants.create_key(db, tenant="acme")
    assert tenants.revoke_key(db, "pl______") == 0  # LIKE would read every _ as any character: every key
    assert tenants.revoke_key(db, "pl_%%%%%") == 0
    assert tenants.revoke_key(db, first.key) == 1
    assert tenants.authenticate(db, first.key) is None and tenants.authenticate(db, second.key) is not None


def test_ingest_grants_are_per_tenant_and_compared_as_folders(db: Database) -> None:
    tenants.create_key(db, tenant="a")
    b = tenants.create_key(db, tenant="b")
    assert tenants.grant_ingest(db, "a", "inbox", "a") == "a/"
    tenants.grant_ingest(db, "b", "inbox", "b/")
    tenants.grant_ingest(db, "b", "shared", "")
    a_id = tenants.authenticate(db, tenants.create_key(db, tenant="a").key).tenant_id  # type: ignore[union-attr]
    assert tenants.may_ingest(db, a_id, "inbox", "a/") and tenants.may_ingest(db, a_id, "inbox", "a")
    assert tenants.may_ingest(db, a_id, "inbox", "a/2026/x.jpg")
    for bucket, prefix in [("inbox", "b/"), ("inbox", ""), ("inbox", "a2/"), ("inbox", "ab"), ("shared", "a/"),
                           ("inbox", "a%"), ("inbox", "_/")]:
        assert not tenants.may_ingest(db, a_id, bucket, prefix), (bucket, prefix)
    assert tenants.may_ingest(db, b.tenant_id, "shared", "anything/at/all")
    assert tenants.list_grants(db, "b") == [("b", "inbox", "b/"), ("b", "shared", "")]
    assert tenants.revoke_grant(db, "b", "inbox", "b") == 1 and not tenants.may_ingest(db, b.tenant_id, "inbox", "b/")
    with pytest.raises(UsageError):
        tenants.grant_ingest(db, "nobody", "inbox", "")


def test_a_webhook_secret_can_be_rotated(db: Database) -> None:
    made = tenants.create_key(db, tenant="acme")
    new = tenants.rotate_webhook_secret(db, "acme")
    assert new != made.webhook_secret and tenants.webhook_secret(db, made.tenant_id) == new
    with pytest.raises(UsageError):
        tenants.rotate_webhook_secret(db, "nobody")
