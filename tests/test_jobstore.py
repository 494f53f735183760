"""How a page's attempt ends in the database, on both backends: what is written, what is kept, what is replaced."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

from paperlane.retry import RetryPolicy
from paperlane.schemas import JobStatus, Line, PageResult, Task
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database, utcnow
from paperlane.storage.tables import JobRow, ResultRow

ATTEMPTS_2 = RetryPolicy(max_attempts=2)
ATTEMPTS_3 = RetryPolicy(max_attempts=3)


def new_job(db: Database) -> str:
    """A queued job row of its own (no ingest, document or page: the job store alone is under test)."""
    job_id = str(uuid.uuid4())
    with db.session() as s:
        s.add(JobRow(id=job_id, job_key=job_id.replace("-", "") * 2, content_sha256="c" * 64, source="a.png", page=1,
                     lane="batch", message_priority=5, task="spotting", task_options={}, status="queued", attempts=0,
                     upload_s=0.5, created_at=utcnow()))
    return job_id


def result(job_id: str, text: str) -> PageResult:
    return PageResult(job_id=job_id, source="a.png", status=JobStatus.SUCCEEDED, task=Task.SPOTTING, text=text,
                      lines=[Line(text=text, confidence=0.5), Line(text=text, confidence=1.0)])


def test_finish_failed_writes_the_reason_and_the_times_given_keeping_the_others(db: Database) -> None:
    job_id = new_job(db)
    started = jobstore.start_attempt(db, job_id, policy=ATTEMPTS_3)
    assert started is not None and started.queue_wait_s is not None
    jobstore.finish_failed(db, job_id, "cannot decode this image", "preprocess", {"preprocess": 0.25})
    row = jobstore.get_job(db, job_id)
    assert (row.status, row.error, row.error_stage) == ("failed", "cannot decode this image", "preprocess")
    assert row.finished_at is not None
    assert (row.upload_s, row.queue_wait_s, row.preprocess_s, row.inference_s) == (
        0.5, started.queue_wait_s, 0.25, None)


def test_finish_succeeded_twice_leaves_one_results_row_with_the_latest_values(db: Database) -> None:
    job_id = new_job(db)
    job = jobstore.start_attempt(db, job_id, policy=ATTEMPTS_3)
    assert job is not None
    timings = {"queue_wait": 0.1, "preprocess": 0.02, "inference": 1.5, "postprocess": 0.001, "store": 0.03}
    jobstore.finish_succeeded(db, job, result(job_id, "first"), engine="e1", result_key="results/1.json",
                              annotated_key="annotated/1.png", timings=timings)
    jobstore.finish_succeeded(db, job, result(job_id, "second"), engine="e2", result_key="results/1.json",
                              annotated_key="annotated/1.jpg", timings={**timings, "inference": 2.0})
    row = jobstore.get_job(db, job_id)
    assert (row.status, row.error, row.engine, row.annotated_key) == ("succeeded", None, "e2", "annotated/1.jpg")
    assert (row.upload_s, row.inference_s, row.store_s) == (0.5, 2.0, 0.03)
    with db.session() as s:
        [indexed] = s.scalars(select(ResultRow).where(ResultRow.job_id == job_id)).all()
    assert (indexed.text, indexed.engine, indexed.line_count, indexed.mean_confidence) == ("second", "e2", 2, 0.75)
    assert indexed.annotated_key == "annotated/1.jpg"


def test_a_page_that_succeeded_is_not_failed_by_a_late_attempt(db: Database) -> None:
    job_id = new_job(db)
    job = jobstore.start_attempt(db, job_id, policy=ATTEMPTS_3)
    assert job is not None
    jobstore.finish_succeeded(db, job, result(job_id, "done"), engine="e", result_key="r", annotated_key=None,
                              timings={})
    jobstore.finish_failed(db, job_id, "late", "store")
    assert jobstore.get_job(db, job_id).status == "succeeded"


def test_start_attempt_counts_attempts_and_keeps_the_first_queue_wait(db: Database) -> None:
    import time

    from paperlane.errors import JobNotFound

    job_id = new_job(db)
    time.sleep(0.05)
    first = jobstore.start_attempt(db, job_id, policy=ATTEMPTS_2)
    assert first is not None and first.status == "running" and first.attempts == 1
    assert first.queue_wait_s is not None and 0.04 < first.queue_wait_s < 30
    again = jobstore.start_attempt(db, job_id, policy=ATTEMPTS_2)  # its worker died: redelivered
    assert again is not None and again.attempts == 2 and again.queue_wait_s == first.queue_wait_s
    assert jobstore.start_attempt(db, job_id, policy=ATTEMPTS_2) is None  # it stopped two workers: given up
    row = jobstore.get_job(db, job_id)
    assert row.status == "failed" and "giving up" in (row.error or "") and row.attempts == 2
    assert jobstore.start_attempt(db, job_id, policy=None) is None  # finished: nothing to do
    with pytest.raises(JobNotFound):
        jobstore.start_attempt(db, str(uuid.uuid4()), policy=ATTEMPTS_2)
