"""End to end on real services: paperlane submit -> Redis -> paperlane worker -> Postgres + S3."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from sqlalchemy import select

from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.storage.tables import JobRow
from tests.conftest import Stack, cli
from tests.conftest import wait_terminal as wait_for_jobs
from tests.metrics import cer
from tests.pages import BAD_INPUTS, render_page, sample_lines, truncated_jpeg

pytestmark = pytest.mark.slow


def wait_terminal(stack: Stack, job_ids: list[str], timeout: float = 180) -> dict[str, JobRow]:
    db = Database(stack.settings.database_url)
    try:
        return wait_for_jobs(db, job_ids, timeout)
    finally:
        db.dispose()


def submit(stack: Stack, *paths: Path, lane: str = "batch") -> list[str]:
    res = cli(stack, "submit", *map(str, paths), "--lane", lane)
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def test_submit_worker_result_in_postgres_and_s3(stack: Stack, worker_factory, tmp_path: Path) -> None:
    truths = {}
    for i, fmt in enumerate(("PNG", "JPEG")):
        lines = sample_lines(i)
        path = tmp_path / f"page{i}.{fmt.lower()}"
        path.write_bytes(render_page(lines, fmt=fmt))
        truths[path] = "\n".join(lines)
    worker = worker_factory(stack)
    ids = submit(stack, *truths, lane="interactive")
    assert len(ids) == 2
    rows = wait_terminal(stack, ids)

    for job_id, truth in zip(ids, truths.values()):
        row = rows[job_id]
        assert row.status == "succeeded", row.error
        assert row.attempts == 1 and row.lane == "interactive"
        for column in ("upload_s", "queue_wait_s", "preprocess_s", "inference_s", "postprocess_s", "store_s"):
            assert getattr(row, column) is not None and getattr(row, column) >= 0, column
        result = json.loads(stack.s3().get_object(Bucket=stack.bucket, Key=row.result_key)["Body"].read())
        assert result["status"] == "succeeded" and result["error"] is None
        assert result["engine"]["name"] == "rapidocr"
        assert cer(result["text"], truth) < 0.02, (result["text"], truth)
        assert all(len(line["quad"]) == 4 for line in result["lines"])
        assert row.annotated_key.endswith(".jpg")
        image = stack.s3().get_object(Bucket=stack.bucket, Key=row.annotated_key)["Body"].read()
        assert cv2.imdecode(np.frombuffer(image, np.uint8), cv2.IMREAD_COLOR) is not None

    status = cli(stack, "status", "--json", *ids)
    assert status.returncode == 0, status.stderr
    views = json.loads(status.stdout)
    assert [v["status"] for v in views] == ["succeeded", "succeeded"]
    assert views[0]["result"].startswith(f"s3://{stack.bucket}/results/")
    assert set(views[0]["timings"]) == {"upload", "queue_wait", "preprocess", "inference", "postprocess", "store"}
    assert worker.alive()


def test_bad_input_fails_its_job_and_the_worker_goes_on(stack: Stack, worker_factory, tmp_path: Path) -> None:
    paths = []
    for name, data in {**BAD_INPUTS, "truncated.jpg": truncated_jpeg(sample_lines(7))}.items():
        (tmp_path / name).write_bytes(data)
        paths.append(tmp_path / name)
    good = tmp_path / "good.png"
    good.write_bytes(render_page(sample_lines(8)))
    worker = worker_factory(stack)
    ids = submit(stack, *paths, good)
    rows = wait_terminal(stack, ids)

    reasons = {p.name: rows[i].error for p, i in zip(paths, ids)}
    assert all(rows[i].status == "failed" for i in ids[:-1])
    # Refused while reading the inputs (a failed page of their own), or by the worker.
    assert reasons["empty.jpg"] == "empty file"
    assert "not a readable image" in reasons["text-named.png"]
    assert reasons["huge-declared.png"] == "image too large (1600 MP, limit 150 MP)"
    assert "truncated" in reasons["truncated.jpg"]
    assert all("\n" not in r and len(r) < 200 for r in reasons.values())
    assert rows[ids[-1]].status == "succeeded"
    assert worker.alive()
    status = cli(stack, "status", ids[0])
    assert status.returncode == 1 and "empty file" in status.stdout


def test_submitting_twice_is_idempotent(stack: Stack, worker_factory, tmp_path: Path) -> None:
    page = tmp_path / "same.png"
    page.write_bytes(render_page(sample_lines(3)))
    worker_factory(stack)
    first = submit(stack, page)
    wait_terminal(stack, first)
    second = submit(stack, page)
    copy = tmp_path / "copy-of-same.png"
    copy.write_bytes(page.read_bytes())
    third = submit(stack, copy)
    assert first == second == third
    db = Database(stack.settings.database_url)
    assert jobstore.count_results(db, first[0]) == 1
    assert len(stack.keys("results/")) == 1 and len(stack.keys("annotated/")) == 1
    # Small originals are packed, one object per submit: each names the same bytes, the job keeps one.
    assert 1 <= len(stack.keys("packs/")) <= 3 and not stack.keys("originals/")
    # --force processes it again: still one result row and one object of each kind.
    forced = cli(stack, "submit", "--force", str(page))
    assert forced.stdout.split() == first
    rows = wait_terminal(stack, first)
    assert rows[first[0]].status == "succeeded"
    assert jobstore.count_results(db, first[0]) == 1
    assert len(stack.keys("results/")) == 1


def test_submit_with_the_broker_down_is_published_by_the_next_submit(stack: Stack, worker_factory,
                                                                     tmp_path: Path) -> None:
    page = tmp_path / "page.png"
    page.write_bytes(render_page(sample_lines(11)))
    down = tmp_path / "broker-down.env"
    down.write_text(stack.config.read_text().replace(stack.settings.redis.url, "redis://127.0.0.1:9/0"))
    failed = cli(Stack(down, stack.settings, stack.bucket, stack.root), "submit", str(page), timeout=120)
    assert failed.returncode == 1 and "broker unreachable" in failed.stderr
    worker_factory(stack)
    # The same submit again resumes the interrupted ingest: the document is registered already, and its
    # job, whose message never left, is published now.
    again = cli(stack, "submit", "--json", str(page))
    assert again.returncode == 0 and "resumed" in again.stderr, again.stderr
    db = Database(stack.settings.database_url)
    with db.session() as s:
        ids = list(s.scalars(select(JobRow.id)))
    assert len(ids) == 1 and wait_terminal(stack, ids)[ids[0]].status == "succeeded"
