"""Originals kept for a worker's own outputs (``workers.originals``): a document's searchable PDF is built from the
copy its page's preprocessing left, not from a second read of the object store."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from paperlane.errors import ObjectNotFound
from paperlane.priority.messages import PageMessage
from paperlane.producer.submit import submit_documents
from paperlane.retry import Action, RetryPolicy
from paperlane.schemas import OutputFormat, TaskSpec
from paperlane.storage import jobs as jobstore
from paperlane.storage.localfs import LocalStore
from paperlane.storage.objects import document_key, split_range
from paperlane.storage.s3 import S3Store
from paperlane.workers.attempts import AttemptRunner
from paperlane.workers.originals import KeptFirst, KeptOriginals
from paperlane.workers.pipeline import Runtime
from tests.conftest import Stack
from tests.test_outputs import _state
from tests.test_retry_path import FlakyEngine, pages


def _copies(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def test_a_kept_original_is_read_once_then_the_store_answers(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.put("originals/a.jpg", b"stored")
    kept = KeptOriginals(tmp_path / "kept")
    kept.folder.mkdir()
    reader = KeptFirst(store, kept)
    kept.keep("originals/a.jpg", b"stored")
    assert reader.get("originals/a.jpg") == b"stored" and _copies(kept.folder) == []  # taken: gone
    store.put("originals/a.jpg", b"from the store")  # (never so: keys are content-addressed; here, to tell them)
    assert reader.get("originals/a.jpg") == b"from the store"
    kept.keep("originals/b.jpg", b"x" * 100)
    with pytest.raises(ObjectNotFound):  # a copy larger than asked for is left to the store, which says why
        reader.get("originals/b.jpg", max_bytes=10)


def test_copies_nobody_takes_are_bounded(tmp_path: Path) -> None:
    kept = KeptOriginals(tmp_path, max_files=5)
    for i in range(40):
        kept.keep(f"originals/{i}.jpg", b"page")
    kept.trim()
    left = _copies(tmp_path)
    assert len(left) == 5
    assert kept.take("originals/39.jpg") == b"page"  # the newest stay
    assert kept.take("originals/0.jpg") is None


def test_a_copy_that_cannot_be_written_is_skipped(tmp_path: Path) -> None:
    kept = KeptOriginals(tmp_path / "no-such-folder")
    kept.keep("originals/a.jpg", b"page")  # no exception: the outputs read the store instead
    assert kept.take("originals/a.jpg") is None


class _Forgetting(FlakyEngine):
    """Answers like ``FlakyEngine``, after calling ``forget`` while the pages are at the engine."""

    def __init__(self) -> None:
        super().__init__()
        self.forget: Callable[[], None] = lambda: None

    def infer(self, requests: Sequence[object]) -> list:  # type: ignore[override]
        self.forget()
        return super().infer(requests)  # type: ignore[arg-type]


@pytest.mark.parametrize("processes", ["1", "0"])  # pool processes, or threads of the worker
def test_a_worker_builds_a_documents_pdf_from_the_original_its_preprocessing_read(
        stack_factory: Callable[..., Stack], processes: str) -> None:
    stack = stack_factory(WORKER__PREPROCESS_PROCESSES=processes, WORKER__OUTPUT_PROCESSES=processes)
    engine = _Forgetting()
    rt = Runtime.start(stack.settings, engine=engine)
    try:
        assert rt.kept is not None and isinstance(rt.store, S3Store)
        [page] = submit_documents(pages(1), db=rt.db, store=rt.store, spec=TaskSpec())
        [job] = jobstore.get_jobs(rt.db, [page.job_id])
        assert job.original_key is not None
        s3, where = rt.store.client, rt.store.prefix + split_range(job.original_key)[0]
        # Gone from the store once the page was read: only the copy preprocessing kept can make the PDF.
        engine.forget = lambda: s3.delete_object(Bucket=rt.store.bucket, Key=where)  # type: ignore[attr-defined]
        attempt = AttemptRunner(rt, RetryPolicy.of(rt.settings.worker), worker="w1", lease=30,
                                outputs=rt.outputs).run(PageMessage(job_id=page.job_id, lane=page.lane,
                                                                     message_priority=page.lane.base_priority))
        rt.outputs.drain()
        assert attempt is not None and attempt.decision.action is Action.DONE
        assert not rt.store.exists(split_range(job.original_key)[0])
        assert _state(rt.db, page.document_id)["state"] == "written"
        assert rt.store.get(document_key(page.document_id, OutputFormat.PDF)).startswith(b"%PDF")
        assert _copies(rt.kept.path) == []  # taken by the outputs
    finally:
        rt.close()
    assert rt.kept is not None and not rt.kept.path.exists()


@pytest.mark.parametrize("settings", [{"WORKER__WRITE_OUTPUTS": "false"},  # another service writes them
                                      {"WORKER__OUTPUT_FORMATS": '["json","md","alto"]'}])  # none reads the original
def test_no_copy_is_kept_where_no_output_of_this_worker_reads_it(stack_factory: Callable[..., Stack],
                                                                 settings: dict[str, str]) -> None:
    rt = Runtime.start(stack_factory(**settings).settings, engine=FlakyEngine())
    try:
        assert rt.kept is None
    finally:
        rt.close()


def test_concurrent_keeps_and_takes_never_give_a_partial_copy(tmp_path: Path) -> None:
    kept = KeptOriginals(tmp_path)
    data = bytes(range(256)) * 4096  # 1 MiB
    seen: list[bytes | None] = []

    def keep() -> None:
        for _ in range(20):
            kept.keep("originals/a.jpg", data)

    writer = threading.Thread(target=keep)
    writer.start()
    while writer.is_alive():
        seen.append(kept.take("originals/a.jpg"))
    writer.join()
    assert all(copy in (None, data) for copy in seen)
