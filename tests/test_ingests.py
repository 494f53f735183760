"""Ingests, documents, pages and the counts that roll up, on SQLite and PostgreSQL.

Registration goes through the real ``Submitter`` into a local object folder; jobs are finished
through the same storage calls a worker makes.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import sqlalchemy as sa

from paperlane.producer.input_items import Document
from paperlane.producer.submit import SubmittedPage, Submitter, submit_documents
from paperlane.retry import RetryPolicy
from paperlane.schemas import JobStatus, PageResult, TaskSpec
from paperlane.storage import jobs as jobstore
from paperlane.storage import status_reads
from paperlane.storage.db import Database
from paperlane.storage.localfs import LocalStore
from tests.pages import tiny_page

ATTEMPTS_3 = RetryPolicy(max_attempts=3)


def doc(name: str, data: bytes, pages: int = 1) -> Document:
    return Document(source=f"{name}.png", name=name, ext=".png", data=data, page_count=pages)


def succeed(db: Database, job_id: str, *, again: bool = False) -> list[str]:
    job = jobstore.get_job(db, job_id) if again else jobstore.start_attempt(db, job_id, policy=ATTEMPTS_3)
    assert job is not None
    result = PageResult(job_id=job_id, source=job.source, status=JobStatus.SUCCEEDED)
    return jobstore.finish_succeeded(db, job, result, engine="stub", result_key=f"results/{job_id}.json",
                                     annotated_key=None, timings={})


def test_a_page_in_two_documents_is_one_job_and_two_tracked_pages(db: Database, tmp_path: Path) -> None:
    blank, other = tiny_page(0), tiny_page(1)
    pages = submit_documents([doc("a", blank), doc("b", blank), doc("c", other)], db=db,
                             store=LocalStore(tmp_path), spec=TaskSpec())
    assert len(pages) == 3 and len({p.job_id for p in pages}) == 2
    assert [p.action for p in pages] == ["queued", "queued", "queued"]
    ingest_id = pages[0].ingest_id
    finished = succeed(db, pages[0].job_id)
    assert sorted(finished) == sorted([pages[0].document_id, pages[1].document_id])
    _, progress, _ = status_reads.ingest_progress(db, ingest_id)
    assert (progress.total, progress.succeeded, progress.failed, progress.unpublished) == (3, 2, 0, 1)  # no broker
    assert succeed(db, pages[0].job_id, again=True) == []  # a late duplicate rewrites, counts nothing
    jobstore.finish_failed(db, pages[2].job_id, "cannot decode this image", "preprocess")
    _, progress, failures = status_reads.ingest_progress(db, ingest_id)
    assert (progress.succeeded, progress.failed, progress.done) == (2, 1, True)
    assert failures == [("cannot decode this image", 1)]


def test_a_page_registered_after_its_job_finished_counts_as_final(db: Database, tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    [first] = submit_documents([doc("a", tiny_page(0))], db=db, store=store, spec=TaskSpec())
    succeed(db, first.job_id)
    [again] = submit_documents([doc("a-copy", tiny_page(0))], db=db, store=store, spec=TaskSpec())
    assert (again.job_id, again.action, again.status) == (first.job_id, "exists", JobStatus.SUCCEEDED)
    row, progress, _ = status_reads.ingest_progress(db, again.ingest_id)
    assert progress.done and progress.succeeded == 1 and row.registered_at is not None
    assert status_reads.get_document(db, again.document_id).finished_at is not None


def test_a_multi_page_document_finishes_with_its_last_page(db: Database, tmp_path: Path) -> None:
    pages = submit_documents([doc("book", tiny_page(3), pages=3)], db=db, store=LocalStore(tmp_path),
                             spec=TaskSpec())
    assert [p.page_no for p in pages] == [1, 2, 3] and len({p.job_id for p in pages}) == 3
    assert succeed(db, pages[0].job_id) == []
    jobstore.finish_failed(db, pages[1].job_id, "engine refused", "inference")
    assert succeed(db, pages[2].job_id) == [pages[0].document_id]
    _, progress, _ = status_reads.document_progress(db, pages[0].document_id)
    assert (progress.succeeded, progress.failed) == (2, 1)


def test_a_refused_document_is_one_failed_page_with_its_reason(db: Database, tmp_path: Path) -> None:
    from paperlane.errors import InputError

    bad = Document(source="x.zip!secret.pdf", name="secret", ext=".pdf", data=b"", page_count=1,
                   error=InputError("encrypted PDF (password required)", stage="upload"))
    [page] = submit_documents([bad], db=db, store=LocalStore(tmp_path), spec=TaskSpec())
    assert (page.action, page.status, page.error) == ("failed", JobStatus.FAILED, "encrypted PDF (password required)")
    _, progress, failures = status_reads.ingest_progress(db, page.ingest_id)
    assert progress.done and failures == [("encrypted PDF (password required)", 1)]


def test_an_interrupted_ingest_resumes_without_registering_anything_twice(db: Database, tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    docs = [doc(f"d{i}", tiny_page(i)) for i in range(6)]
    first = Submitter(db=db, store=store, spec=TaskSpec(), chunk_pages=2)
    stream = first.submit(iter(docs), name="archive", sources=["/archive"])
    got = [next(stream) for _ in range(2)]
    stream.close()  # interrupted after its first chunk (the second was registering then): the ingest is never closed
    assert all(isinstance(p, SubmittedPage) for p in got)
    with db.session() as s:
        registered = s.scalar(sa.text("SELECT count(*) FROM documents"))
    assert registered == 4  # the chunk yielded, and the one registering when the submit stopped: waited for
    second = Submitter(db=db, store=store, spec=TaskSpec())
    rest = list(second.submit(iter(docs), name="archive", sources=["/archive"]))
    assert second.summary.resumed and second.summary.ingest_id == got[0].ingest_id  # type: ignore[union-attr]
    assert second.summary.skipped_before == 4 and len(rest) == 2
    row, progress, _ = status_reads.ingest_progress(db, second.summary.ingest_id)
    assert (row.documents_total, progress.total) == (6, 6)
    with db.session() as s:
        assert s.scalar(sa.text("SELECT count(*) FROM jobs")) == 6


def test_the_migration_carries_todays_jobs_into_one_ingest(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'old.db'}")
    db.migrate("0001")
    with db.engine.begin() as conn:
        for i, (source, page, status) in enumerate([("a.pdf", 1, "succeeded"), ("a.pdf", 2, "failed"),
                                                    ("b.png", 1, "queued")]):
            conn.execute(sa.text(
                "INSERT INTO jobs (id, job_key, content_sha256, source, page, lane, priority, task, task_options,"
                " status, attempts) VALUES (:id, :key, 'c', :source, :page, 'batch', 5, 'spotting', '{}', :status, 0)"),
                dict(id=str(uuid.uuid4()), key=f"k{i}", source=source, page=page, status=status))
    db.upgrade()
    with db.session() as s:
        ingest = s.execute(sa.text("SELECT * FROM ingest_status")).mappings().one()
        docs = s.execute(sa.text("SELECT * FROM document_status ORDER BY source")).mappings().all()
        pages = s.execute(sa.text("SELECT status FROM page_status ORDER BY source, page_no")).scalars().all()
    assert (ingest["documents_total"], ingest["pages_total"], ingest["pages_succeeded"], ingest["pages_failed"]) == (
        2, 3, 1, 1)
    assert [(d["source"], d["status"]) for d in docs] == [("a.pdf", "partial"), ("b.png", "queued")]
    assert pages == ["succeeded", "failed", "unpublished"]
