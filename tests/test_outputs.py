"""A document's outputs are a recorded unit of work: due from the transaction that finishes the document, retried
by the retry policy when a try fails, never marked written by a writer that lost its claim; on both backends."""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path

import cv2
import numpy as np
import pytest
from lxml import etree

from paperlane.formats.result_json import page_json
from paperlane.producer.submit import SubmittedPage
from paperlane.retry import RetryPolicy
from paperlane.settings import Settings, WorkerSettings
from paperlane.schemas import EngineInfo, JobStatus, Line, OutputFormat, PageResult
from paperlane.status import OutputsState
from paperlane.storage import ingests, status_reads, views
from paperlane.storage import jobs as jobstore
from paperlane.storage import outputs as recorded
from paperlane.storage.db import Database, utcnow
from paperlane.storage.localfs import LocalStore
from paperlane.storage.objects import DelegatingStore, document_key, open_store, result_key
from paperlane.workers.outputs import Writer, build_outputs
from paperlane.workers.outputs_pool import OutputsPool, writer_of
from tests.pages import tiny_page
from tests.test_cpu_pool import _minor_faults, _pool_processes
from tests.test_ingests import doc, succeed
from tests.test_tenants import _submit


def _state(db: Database, document_id: str) -> dict[str, object]:
    return views.document_view(*status_reads.document_progress(db, document_id))["outputs"]


def _finished_document(db: Database, store: LocalStore) -> str:
    [page] = _submit(db, store, [doc("a", tiny_page(1))], ingests.Owner())
    assert _state(db, page.document_id)["state"] is None  # not finished: nothing is due
    assert succeed(db, page.job_id) == [page.document_id]  # the transaction that finishes it makes them due
    return page.document_id


def test_outputs_are_due_when_the_document_finishes_and_written_once(db: Database, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "objects")
    document_id = _finished_document(db, store)
    assert _state(db, document_id) == {"state": "pending", "json": False, "markdown": False, "pdf": False,
                                       "formats": [], "error": None}
    writer = Writer(db, store, RetryPolicy(), hold=30)
    assert writer.write(document_id) is not None
    assert _state(db, document_id)["state"] == OutputsState.WRITTEN.value and _state(db, document_id)["json"]
    assert store.exists(f"documents/{document_id}.json") and store.exists(f"documents/{document_id}.md")
    assert writer.write(document_id) is None and writer.write_due() == 0  # written: nothing is due any more


def test_the_transaction_that_finishes_a_document_can_claim_its_outputs_for_the_finisher(db: Database,
                                                                                         tmp_path: Path) -> None:
    # A worker that writes the outputs of the documents it finishes claims them as it finishes them: one statement
    # fewer a document on the process that feeds the engine, and nobody else takes them meanwhile.
    store = LocalStore(tmp_path / "objects")
    [first, second] = _submit(db, store, [doc("pair", tiny_page(3), pages=2)], ingests.Owner())
    writer = Writer(db, store, RetryPolicy(), hold=30)
    until = utcnow() + timedelta(seconds=30)
    done = []
    for page in (first, second):
        job = jobstore.start_attempt(db, page.job_id, policy=RetryPolicy())
        assert job is not None
        result = PageResult(job_id=page.job_id, source="pair.png", status=JobStatus.SUCCEEDED, text="seen",
                            width=360, height=64, engine=EngineInfo(name="stub", version="0"))
        store.put(result_key(page.job_id), result.model_dump_json().encode())
        done.append(jobstore.finish_succeeded(db, job, result, engine="stub", result_key=result_key(page.job_id),
                                              annotated_key=None, timings={}, claim_until=until))
        if page is first:  # not finished: neither due nor claimed
            assert done == [[]] and _state(db, first.document_id)["state"] is None
    assert done[1] == [first.document_id] and _state(db, first.document_id)["state"] == "pending"
    assert writer.claim(first.document_id) is None and writer.claim_due() == []  # held by the finisher
    held = recorded.Claim(first.document_id, until, 0)
    assert writer.write_held(held) is not None and _state(db, first.document_id)["state"] == "written"


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
    job_id = status_reads.document_pages(db, document_id)[0][1].id
    jobstore.requeue(db, job_id)
    assert _state(db, document_id)["state"] is None  # not finished again: nothing due
    succeed(db, job_id)
    assert _state(db, document_id) == {"state": "pending", "json": False, "markdown": False, "pdf": False,
                                       "formats": [], "error": None}
    assert Writer(db, store, RetryPolicy(), hold=30).write_due() == 1 and _state(db, document_id)["state"] == "written"


def test_a_writer_whose_claim_lapsed_does_not_mark_them_written(db: Database, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "objects")
    document_id = _finished_document(db, store)
    t0 = utcnow()  # the clock is the caller's: the claim lapses at t0 + 0.05 s however slow the machine
    stale = recorded.claim(db, document_id, now=t0, hold=0.05)
    assert stale is not None
    assert recorded.claim(db, document_id, now=t0 + timedelta(seconds=0.01), hold=30) is None  # held: nobody else
    [fresh] = recorded.claim_due(db, now=t0 + timedelta(seconds=0.1), hold=30)  # lapsed: another writer takes them
    assert fresh.document_id == document_id
    assert not recorded.written(db, stale, formats=[OutputFormat.JSON])
    assert recorded.written(db, fresh, formats=[OutputFormat.JSON])
    assert _state(db, document_id)["state"] == "written"


def test_a_worker_writes_the_formats_it_is_set_to_and_a_failed_page_keeps_its_place(db: Database,
                                                                                   tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "objects")
    [first, second, third] = _submit(db, store, [doc("book", tiny_page(7), pages=3)], ingests.Owner())
    document_id = first.document_id
    for page, text in ((first, "Item 7 paid"), (third, "Total 12.00")):
        job = jobstore.start_attempt(db, page.job_id, policy=RetryPolicy())
        assert job is not None
        result = PageResult(job_id=page.job_id, source="book.png", status=JobStatus.SUCCEEDED, text=text,
                            lines=[Line(text=text, confidence=0.9, quad=[(10, 10), (300, 10), (300, 40), (10, 40)])],
                            width=360, height=64, engine=EngineInfo(name="stub", version="0"))
        store.put(result_key(page.job_id), result.model_dump_json().encode())
        jobstore.finish_succeeded(db, job, result, engine="stub", result_key=result_key(page.job_id),
                                  annotated_key=None, timings={})
    assert jobstore.start_attempt(db, second.job_id, policy=RetryPolicy()) is not None
    assert jobstore.finish_failed(db, second.job_id, "engine timed out", "inference") == [document_id]

    formats = (OutputFormat.JSON, OutputFormat.ALTO, OutputFormat.PAGE, OutputFormat.HOCR, OutputFormat.METS)
    puts: list[str] = []
    counting = _Counting(store, puts)
    assert Writer(db, counting, RetryPolicy(), hold=30, formats=formats).write(document_id) is not None

    state = _state(db, document_id)
    assert (state["state"], state["formats"], state["markdown"], state["pdf"]) == (
        "written", ["json", "alto", "page", "hocr", "mets"], False, False)
    expected = [document_key(document_id, fmt) for fmt in (OutputFormat.JSON, OutputFormat.ALTO, OutputFormat.HOCR,
                                                           OutputFormat.METS)]
    expected += [document_key(document_id, fmt, n, 3) for n in (1, 2, 3) for fmt in (OutputFormat.ALTO,
                                                                                      OutputFormat.PAGE)]
    assert sorted(puts) == sorted(expected)  # each file once, nothing else (no markdown, no PDF)
    alto = etree.fromstring(store.get(document_key(document_id, OutputFormat.ALTO)))
    pages = alto.findall(".//{http://www.loc.gov/standards/alto/ns-v4#}Page")
    assert [p.get("ID") for p in pages] == ["P1", "P2", "P3"]
    assert pages[1].get("QUALITY_DETAIL") == "page 2 failed: engine timed out"
    strings = [[s.get("CONTENT") for s in p.iter("{http://www.loc.gov/standards/alto/ns-v4#}String")] for p in pages]
    assert strings == [["Item", "7", "paid"], [], ["Total", "12.00"]]
    page2 = store.get(document_key(document_id, OutputFormat.PAGE, 2, 3)).decode()
    assert "page 2 failed: engine timed out" in page2
    mets = store.get(document_key(document_id, OutputFormat.METS)).decode()
    assert f'xlink:href="{document_id}-p2.page.xml"' in mets and 'LABEL="page 2 failed: engine timed out"' in mets


class _Counting(DelegatingStore):
    """The local store, counting the keys written: a file written twice or one not asked for shows."""

    def __init__(self, store: LocalStore, puts: list[str]) -> None:
        super().__init__(store)
        self.puts = puts

    def put(self, key: str, data: bytes, *, content_type: str = "application/octet-stream") -> None:
        self.puts.append(key)
        self.store.put(key, data, content_type=content_type)


def test_the_finishing_worker_builds_from_what_it_stored_the_same_files_as_a_reader_of_the_store(
        db: Database, tmp_path: Path) -> None:
    # The worker that finishes a document passes the result it just stored (``known``) instead of reading it
    # back: the files must be those that anyone reading the store builds.
    store = LocalStore(tmp_path / "objects")
    [page] = _submit(db, store, [doc("a", tiny_page(1))], ingests.Owner())
    job = jobstore.start_attempt(db, page.job_id, policy=RetryPolicy())
    assert job is not None
    line = Line(text="Ünïcode 1.5", confidence=0.937, quad=[(1.5, 2), (90, 2), (90, 14), (1.5, 14)])
    result = PageResult(job_id=job.id, source=job.source, page=1, status=JobStatus.SUCCEEDED, text=line.text,
                        lines=[line], width=100, height=40, engine=EngineInfo(name="stub", version="1"))
    store.put(result_key(job.id), page_json(result))
    jobstore.finish_succeeded(db, job, result, engine="stub", result_key=result_key(job.id), annotated_key=None,
                              timings={})
    formats = tuple(OutputFormat)
    known = build_outputs(db, store, page.document_id, formats=formats, known={job.id: result})
    read = build_outputs(db, store, page.document_id, formats=formats)
    assert known.files.keys() == read.files.keys() and len(read.files) >= len(formats)
    assert all(known.files[key] == data for key, data in read.files.items())
    store.put(result_key(job.id), b"not json")  # known: the store is not read for it
    assert build_outputs(db, store, page.document_id, formats=formats, known={job.id: result}).files == known.files


def _noisy_a4(seed: int) -> bytes:
    """An A4 300 dpi grey scan with a scanner's noise: ~1 MB of JPEG, as most scans are."""
    noise = np.random.default_rng(seed).normal(245, 2, (3508, 2480))
    ok, enc = cv2.imencode(".jpg", np.clip(noise, 0, 255).astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 85])
    assert ok
    return enc.tobytes()


@pytest.mark.processes
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_an_outputs_process_reuses_its_document_buffers(tmp_path: Path) -> None:
    # A scan's outputs read its original (~1 MB) and build a searchable PDF that carries it (~1 MB, copied while it
    # is made reproducible). Without keep_freed_memory each document faulted those buffers in again: ~1,250 page
    # faults a document in engine_utilisation's runs.
    settings = Settings(data_dir=tmp_path / "data", worker=WorkerSettings(output_processes=1))
    db = Database(settings.database_url)
    db.upgrade()
    store = open_store(settings)
    pages = []
    for i in range(6):
        [page] = _submit(db, store, [doc(f"scan{i}", _noisy_a4(i))], ingests.Owner())  # type: ignore[arg-type]
        succeed(db, page.job_id)
        pages.append(page)
    before = _pool_processes()
    pool = OutputsPool(settings, writer_of(settings, db, store))
    try:
        [child] = _pool_processes() - before

        def write(page: SubmittedPage) -> None:
            known = {page.job_id: PageResult(job_id=page.job_id, source="scan", status=JobStatus.SUCCEEDED,
                                             width=2480, height=3508)}
            assert pool.write(page.document_id, known=known).result(timeout=120)

        for page in pages[:3]:  # warm: the first documents size the heap
            write(page)
        faults = _minor_faults(child)
        for page in pages[3:]:
            write(page)
        assert (_minor_faults(child) - faults) / 3 < 200
    finally:
        pool.close()
        db.dispose()
