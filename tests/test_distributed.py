"""End to end on real services: paperlane submit -> Redis -> paperlane worker -> Postgres + S3."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from paperlane.storage.db import Database
from paperlane.storage.tables import DocumentRow, JobRow, ResultRow
from tests.conftest import Stack, cli
from tests.conftest import wait_terminal as wait_for_jobs
from tests.pages import BAD_INPUTS, render_page, sample_lines, truncated_jpeg
from tests.scoring import cer

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
        assert row.annotated_key is None  # a worker leaves it to be drawn on request (worker.annotated)
    assert not stack.keys("annotated/")

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


def _result_rows(db: Database, job_id: str) -> int:
    """Rows of the results index for the job (one, however often it was done)."""
    with db.session() as s:
        return len(s.scalars(select(ResultRow.job_id).where(ResultRow.job_id == job_id)).all())


def test_submitting_twice_is_idempotent(stack_factory, worker_factory, tmp_path: Path) -> None:
    stack = stack_factory(WORKER__ANNOTATED="stored")  # the annotated image drawn by the worker: an object too
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
    assert _result_rows(db, first[0]) == 1
    assert len(stack.keys("results/")) == 1 and len(stack.keys("annotated/")) == 1
    # Small originals are packed, one object per submit: each names the same bytes, the job keeps one.
    assert 1 <= len(stack.keys("packs/")) <= 3 and not stack.keys("originals/")
    # --force processes it again: still one result row and one object of each kind.
    forced = cli(stack, "submit", "--force", str(page))
    assert forced.stdout.split() == first
    rows = wait_terminal(stack, first)
    assert rows[first[0]].status == "succeeded"
    assert _result_rows(db, first[0]) == 1
    assert len(stack.keys("results/")) == 1 and len(stack.keys("annotated/")) == 1
    assert rows[first[0]].annotated_key == stack.keys("annotated/")[0]


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


def _wait_outputs(db: Database, document_ids: list[str], timeout: float = 120) -> dict[str, DocumentRow]:
    deadline = time.monotonic() + timeout
    while True:
        with db.session() as s:
            rows = {d.id: d for d in s.scalars(select(DocumentRow).where(DocumentRow.id.in_(document_ids)))}
        if len(rows) == len(document_ids) and all(d.json_key for d in rows.values()):
            return rows
        assert time.monotonic() < deadline, {i: (d.finished_at, d.json_key) for i, d in rows.items()}
        time.sleep(0.3)


def test_documents_get_their_outputs_from_workers_and_an_s3_prefix_ingest(stack: Stack, worker_factory,
                                                                          tmp_path: Path) -> None:
    import pypdfium2 as pdfium
    from PIL import Image

    pages = [Image.open(io.BytesIO(render_page(sample_lines(i, 3)))).convert("RGB") for i in (31, 32)]
    pdf_bytes = io.BytesIO()
    pages[0].save(pdf_bytes, format="PDF", save_all=True, append_images=pages[1:], resolution=150)
    files = {"book.pdf": pdf_bytes.getvalue(), "cover.png": render_page(sample_lines(33, 2))}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    worker_factory(stack)
    first = cli(stack, "submit", "--json", *(str(tmp_path / n) for n in files))
    assert first.returncode == 0, first.stderr
    lines = [json.loads(line) for line in first.stdout.splitlines()]
    assert len(lines) == 3 and len({line["document_id"] for line in lines}) == 2
    db = Database(stack.settings.database_url)
    wait_terminal(stack, [line["job_id"] for line in lines])
    docs = _wait_outputs(db, sorted({line["document_id"] for line in lines}))
    book = next(d for d in docs.values() if d.name == "book")
    s3 = stack.s3()
    book_json = json.loads(s3.get_object(Bucket=stack.bucket, Key=book.json_key)["Body"].read())
    assert [p["page"] for p in book_json["pages"]] == [1, 2] and book_json["counts"]["succeeded"] == 2
    pdf = pdfium.PdfDocument(s3.get_object(Bucket=stack.bucket, Key=book.pdf_key)["Body"].read())
    first_line = book_json["pages"][0]["text"].split()[0]
    assert len(pdf) == 2 and first_line in pdf[0].get_textpage().get_text_range()
    assert first_line in s3.get_object(Bucket=stack.bucket, Key=book.markdown_key)["Body"].read().decode()

    # The same files under an S3 prefix, with one new page: a second ingest whose book and cover are final at
    # registration (their outputs come from a worker all the same), and whose new page is processed from S3.
    for name, data in {**files, "new.png": render_page(sample_lines(34, 2))}.items():
        s3.put_object(Bucket=stack.bucket, Key=f"inbox/2026/{name}", Body=data)
    second = cli(stack, "submit", "--json", f"s3://{stack.bucket}/inbox/")
    assert second.returncode == 0, second.stderr
    lines2 = [json.loads(line) for line in second.stdout.splitlines()]
    assert sorted(line["source"] for line in lines2) == [f"s3://{stack.bucket}/inbox/2026/{n}"
                                                         for n in ("book.pdf", "book.pdf", "cover.png", "new.png")]
    assert {line["job_id"] for line in lines2} - {line["job_id"] for line in lines} == {
        next(line["job_id"] for line in lines2 if line["source"].endswith("new.png"))}
    wait_terminal(stack, [line["job_id"] for line in lines2])
    docs2 = _wait_outputs(db, sorted({line["document_id"] for line in lines2}))
    assert len(docs2) == 3 and not set(docs2) & set(docs)
    status = cli(stack, "status", "--json", "--ingest", lines2[0]["ingest_id"])
    progress = json.loads(status.stdout)
    assert (progress["pages"], progress["succeeded"], progress["documents"]) == (4, 4, 3), progress


def _queued_job_ids(stack: Stack) -> list[str]:
    """The job ids of every page message waiting on the batch lane, on its lists or by fair share behind them (one
    per message)."""
    import base64

    import redis

    from paperlane.priority.lanes import Lane
    from tests.conftest import lane_messages

    ids = []
    for raw in lane_messages(stack.broker(), Lane.BATCH):
        args, _, _ = json.loads(base64.b64decode(json.loads(raw)["body"]))
        ids.append(args[0])
    return ids


def _as_from_a_terminal() -> None:
    """SIGINT as a shell's command gets it: its default action, not blocked. A child inherits an ignored or blocked
    SIGINT across exec, and in full parallel runs the submit twice ran to its end through the Ctrl-C (rc 0, every
    page registered) while it stopped every time alone: what the test process's own signal state was is not this
    test's subject."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "ctrl-c"])
def test_an_interrupted_submit_resumes_without_registering_anything_twice(stack: Stack, tmp_path: Path,
                                                                          sig: int) -> None:
    from sqlalchemy import func

    from paperlane.storage.tables import IngestRow, PageRow
    from tests.conftest import PAPERLANE
    from tests.pages import tiny_page

    scans = tmp_path / "scans"
    scans.mkdir()
    n = 1600
    for i in range(n):
        (scans / f"p{i:05d}.png").write_bytes(tiny_page(i))
    proc = subprocess.Popen([*PAPERLANE, "--config", str(stack.config), "submit", "--json", str(scans)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=stack.env(),
                            cwd=stack.root, preexec_fn=_as_from_a_terminal)
    assert proc.stdout is not None
    printed = [proc.stdout.readline() for _ in range(600)]  # the first chunk (500 pages) and part of the next
    proc.send_signal(sig)
    rest = proc.stdout.read()  # not communicate(): it would skip what readline() buffered
    err = proc.stderr.read() if proc.stderr else ""
    proc.wait(timeout=60)
    assert proc.returncode != 0, err
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "the same command again resumes it" in err, err
    first = [json.loads(line) for line in printed + rest.splitlines() if line.strip()]
    assert 500 <= len(first) < n, len(first)

    again = cli(stack, "submit", "--json", str(scans))
    assert again.returncode == 0 and "resumed" in again.stderr, again.stderr
    second = [json.loads(line) for line in again.stdout.splitlines()]
    # Registered documents are skipped (the first run may have registered more than it printed).
    assert not {p["document_id"] for p in first} & {p["document_id"] for p in second}
    assert 0 < len(second) <= n - 500
    assert {p["ingest_id"] for p in first + second} == {first[0]["ingest_id"]}
    db = Database(stack.settings.database_url)
    with db.session() as s:
        counts = [s.scalar(select(func.count()).select_from(t)) for t in (IngestRow, DocumentRow, PageRow, JobRow)]
        ingest = s.scalars(select(IngestRow)).one()
        unpublished = s.scalar(select(func.count()).select_from(JobRow).where(JobRow.enqueued_at.is_(None)))
    assert counts == [1, n, n, n]
    assert (ingest.documents_total, ingest.pages_total, unpublished) == (n, n, 0)
    assert ingest.registered_at is not None
    queued = _queued_job_ids(stack)
    with db.session() as s:
        assert set(queued) == set(s.scalars(select(JobRow.id)))
    # A message published just before the signal, whose job was not yet marked enqueued, goes out again on
    # resume: a duplicate is harmless (its worker finds the job final) and bounded by one chunk.
    assert len(queued) - n <= 500
