"""Pages needing review, on both backends: counted on their documents and ingests with the writes that finish
them, uncounted when they are redone, listed with why, in the review_queue view, and for their tenant only."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from paperlane.errors import IngestNotFound
from paperlane.schemas import PageResult, Quality, QualityFlag
from paperlane.status import JobStatus
from paperlane.storage import ingests, status_reads, views
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.storage.localfs import LocalStore
from tests.conftest import Stack
from tests.pages import tiny_page
from tests.test_ingests import ATTEMPTS_3, doc
from tests.test_tenants import _submit

LOOPED = Quality.grade({QualityFlag.RETRIED, QualityFlag.FALLBACK}, 0.62)
CLEAN = Quality.grade({QualityFlag.RETRIED}, 0.97)


def _finish(db: Database, job_id: str, quality: Quality) -> None:
    job = jobstore.get_job(db, job_id)
    if job.status != JobStatus.SUCCEEDED.value:
        job = jobstore.start_attempt(db, job_id, policy=ATTEMPTS_3)
    assert job is not None
    result = PageResult(job_id=job_id, source=job.source, status=JobStatus.SUCCEEDED, quality=quality)
    jobstore.finish_succeeded(db, job, result, engine="rapidocr 3 fallback for vllm", result_key="r",
                              annotated_key=None, timings={})


def _counts(db: Database, ingest_id: str, document_id: str) -> tuple[int, int]:
    ingest = views.ingest_view(*status_reads.ingest_progress(db, ingest_id))
    document = views.document_view(*status_reads.document_progress(db, document_id))
    return ingest["needs_review"], document["needs_review"]


def test_pages_needing_review_are_counted_listed_and_uncounted(db: Database, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "objects")
    pages = _submit(db, store, [doc("a", tiny_page(1)), doc("b", tiny_page(2))], ingests.Owner())
    ingest_id, (a, b) = pages[0].ingest_id, pages
    _finish(db, a.job_id, LOOPED)
    _finish(db, b.job_id, CLEAN)  # retried and clean: nothing to review
    assert _counts(db, ingest_id, a.document_id) == (1, 1) and _counts(db, ingest_id, b.document_id)[1] == 0
    [listed] = status_reads.review_pages(db, ingest_id)
    assert (listed.page_id, listed.source, listed.page_no, listed.flags, listed.confidence) == (
        a.page_id, "a.png", 1, ["retried", "fallback"], 0.62)
    with db.session() as s:
        assert s.execute(sa.text("SELECT page_id, flags FROM review_queue")).all() == [(a.page_id, "retried,fallback")]
        assert s.execute(sa.text("SELECT pages_review FROM ingest_status")).scalar_one() == 1
    # Done again with a clean answer (a rewrite of a succeeded job): no longer needs review, anywhere.
    _finish(db, a.job_id, CLEAN)
    assert _counts(db, ingest_id, a.document_id) == (0, 0) and status_reads.review_pages(db, ingest_id) == []
    # Needing review again, then redone from scratch (submit --force): it leaves the count with its result.
    _finish(db, a.job_id, LOOPED)
    assert _counts(db, ingest_id, a.document_id) == (1, 1)
    jobstore.requeue(db, a.job_id)
    assert _counts(db, ingest_id, a.document_id) == (0, 0)


def test_a_page_registered_after_its_job_needed_review_is_counted_at_once(db: Database, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "objects")
    [first] = _submit(db, store, [doc("a", tiny_page(1))], ingests.Owner())
    _finish(db, first.job_id, LOOPED)
    [again] = _submit(db, store, [doc("copy-of-a", tiny_page(1))], ingests.Owner())  # the same bytes: the same job
    assert again.job_id == first.job_id and again.ingest_id != first.ingest_id
    assert _counts(db, again.ingest_id, again.document_id) == (1, 1)
    assert [p.source for p in status_reads.review_pages(db, again.ingest_id)] == ["copy-of-a.png"]


def test_another_tenants_review_is_not_found(db: Database, tmp_path: Path) -> None:
    from paperlane.storage import tenants

    acme, globex = (tenants.create_key(db, tenant=name) for name in ("acme", "globex"))
    [page] = _submit(db, LocalStore(tmp_path / "objects"), [doc("a", tiny_page(1))],
                     ingests.Owner(acme.tenant_id, acme.key_id))
    _finish(db, page.job_id, LOOPED)
    assert len(status_reads.review_pages(db, page.ingest_id, tenant_id=acme.tenant_id)) == 1
    with pytest.raises(IngestNotFound):
        status_reads.review_pages(db, page.ingest_id, tenant_id=globex.tenant_id)


def test_the_api_lists_its_tenants_pages_needing_review(stack: Stack) -> None:
    from fastapi.testclient import TestClient

    from paperlane.producer.api.app import create_app
    from paperlane.storage import tenants
    from paperlane.storage.objects import open_store

    db = Database(stack.settings.database_url)
    db.upgrade()
    acme, globex = (tenants.create_key(db, tenant=name) for name in ("acme", "globex"))
    pages = _submit(db, open_store(stack.settings), [doc(f"p{i}", tiny_page(i)) for i in range(3)],
                    ingests.Owner(acme.tenant_id, acme.key_id))
    for page in pages:
        _finish(db, page.job_id, LOOPED)
    ingest_id = pages[0].ingest_id
    with TestClient(create_app(stack.settings, webhooks=False)) as client:
        def review(key: str, **params: object) -> httpx.Response:
            return client.get(f"/v1/ingests/{ingest_id}/review", params=params,
                              headers={"Authorization": f"Bearer {key}"})
        first = review(acme.key, limit=2).json()
        assert [p["source"] for p in first["pages"]] == ["p0.png", "p1.png"] and first["next"]
        rest = review(acme.key, limit=2, cursor=first["next"]).json()
        assert [p["source"] for p in rest["pages"]] == ["p2.png"] and rest["next"] is None
        assert rest["pages"][0]["flags"] == ["retried", "fallback"] and rest["pages"][0]["confidence"] == 0.62
        assert client.get(f"/v1/ingests/{ingest_id}", headers={"Authorization": f"Bearer {acme.key}"}
                          ).json()["needs_review"] == 3
        assert review(globex.key).status_code == 404  # another tenant's ingest, as an unknown one
        assert review(acme.key, cursor="not a cursor").status_code == 422
    db.dispose()
