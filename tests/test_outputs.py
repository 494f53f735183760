"""A document's outputs are a recorded unit of work: due from the transaction that finishes the document, retried
by the retry policy when a try fails, never marked written by a writer that lost its claim; on both backends."""

from __future__ import annotations

import time
from pathlib import Path

from paperlane.retry import RetryPolicy
from paperlane.status import OutputsState
from paperlane.storage import ingests, views
from paperlane.storage import jobs as jobstore
from paperlane.storage import outputs as recorded
from paperlane.storage.db import Database, utcnow
from paperlane.storage.localfs import LocalStore
from paperlane.workers.outputs import Writer
from tests.pages import tiny_page
from tests.test_ingests import doc, succeed
from tests.test_tenants import _submit


def _state(db: Database, document_id: str) -> dict[str, object]:
    return views.document_view(*ingests.document_progress(db, document_id))["outputs"]


def _finished_document(db: Database, store: LocalStore) -> str:
    [page] = _submit(db, store, [doc("a", tiny_page(1))], ingests.Owner())
    assert _state(db, page.document_id)["state"] is None  # not finished: nothing is due
    assert succeed(db, page.job_id) == [page.document_id]  # the transaction that finishes it makes them due
    return page.document_id


def test_outputs_are_due_when_the_document_finishes_and_written_once(db: Database, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "objects")
    document_id = _finished_document(db, store)
    assert _state(db, document_id) == {"state": "pending", "json": False, "markdown": False, "pdf": False,
                                       "error": None}
    writer = Writer(db, store, RetryPolicy(), hold=30)
    assert writer.write(document_id) is not None
    assert _state(db, document_id)["state"] == OutputsState.WRITTEN.value and _state(db, document_id)["json"]
    assert store.exists(f"documents/{document_id}.json") and store.exists(f"documents/{document_id}.md")
    assert writer.write(document_id) is None and writer.write_due() == 0  # written: nothing is due any more


def test_a_failed_try_is_retried_after_its_backoff_then_given_up(db: Database, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "objects")
    document_id = _finished_document(db, store)
    (tmp_path / "not-a-folder").write_text("the store's root is a file: every write fails")
    broken = LocalStore(tmp_path / "not-a-folder")
    failing = Writer(db, broken, RetryPolicy(max_attempts=2, backoff=0.3), hold=30)
    assert failing.write(document_id) is None
    state = _state(db, document_id)
    assert state["state"] == "pending" and "cannot write" in str(state["error"])  # due again after its backoff
    assert failing.write_due() == 0  # not yet
    time.sleep(0.35)
    assert failing.write_due() == 0  # the second try fails too: the attempts are used up
    state = _state(db, document_id)
    assert state["state"] == OutputsState.FAILED.value and "cannot write" in str(state["error"])
    # Its page redone (``submit --force``) makes them due again, tries counted anew; a working store writes them.
    job_id = ingests.document_pages(db, document_id)[0][1].id
    jobstore.requeue(db, job_id)
    assert _state(db, document_id)["state"] is None  # not finished again: nothing due
    succeed(db, job_id)
    assert _state(db, document_id) == {"state": "pending", "json": False, "markdown": False, "pdf": False,
                                       "error": None}
    assert Writer(db, store, RetryPolicy(), hold=30).write_due() == 1 and _state(db, document_id)["state"] == "written"


def test_a_writer_whose_claim_lapsed_does_not_mark_them_written(db: Database, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "objects")
    document_id = _finished_document(db, store)
    stale = recorded.claim(db, document_id, now=utcnow(), hold=0.05)
    assert stale is not None
    assert recorded.claim(db, document_id, now=utcnow(), hold=30) is None  # held: nobody else claims it
    time.sleep(0.1)
    [fresh] = recorded.claim_due(db, now=utcnow(), hold=30)  # the claim lapsed: another writer takes them
    assert fresh.document_id == document_id
    assert not recorded.written(db, stale, json_key="a", markdown_key="b", pdf_key=None)
    assert recorded.written(db, fresh, json_key="a", markdown_key="b", pdf_key=None)
    assert _state(db, document_id)["state"] == "written"
