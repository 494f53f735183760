"""A page costs its page, not its document: a page of a large PDF in S3 reads its own objects and the
cross-reference table by byte range; a TIFF is downloaded once per worker; an original larger than a
worker takes is refused from its size, before a byte of it is read.

Real S3 (SeaweedFS) and the real store; the bytes counted are those the store returned.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from PIL import Image

from paperlane.errors import InputError, ObjectNotFound
from paperlane.settings import IngestSettings, Settings, StorageBackend, StorageSettings, WorkerSettings
from paperlane.storage.objects import open_store, original_key, ranged
from paperlane.storage.reader import ObjectReader
from paperlane.storage.s3 import S3Store
from paperlane.workers.cpu_pool import CpuPool
from paperlane.workers.doccache import OpenDocuments, Spool, read_whole
from paperlane.workers.input_limits import Limits
from tests.services import S3_KEY, S3_SECRET, Service
from tests.test_doccache import CountingStore, pdf_of_jpegs, scanned_pdf
from tests.test_preprocess import VLM_SPEC

PAGES = 520


def large_pdf(pages: int = PAGES, *, side: tuple[int, int] = (420, 594)) -> bytes:
    """``pages`` A4 pages, each one noisy grey JPEG of ~100 kB (noise does not compress): ~50 MB."""
    rng = np.random.default_rng(7)

    def jpegs() -> Iterator[bytes]:
        for i in range(pages):
            pixels = rng.integers(0, 256, (side[1], side[0]), dtype=np.uint8)
            cv2.putText(pixels, f"page {i + 1}", (20, 60), cv2.FONT_HERSHEY_SIMPLEX, 1.5, 0, 3)
            yield cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_QUALITY, 75])[1].tobytes()

    return pdf_of_jpegs(jpegs())


@pytest.fixture(scope="module")
def big_pdf() -> bytes:
    return large_pdf()


@pytest.fixture
def s3_store(s3_service: Service) -> S3Store:
    return S3Store.from_settings(StorageSettings(
        backend=StorageBackend.S3, endpoint_url=s3_service.url, bucket=f"ranged-{uuid.uuid4().hex[:12]}",
        access_key_id=S3_KEY, secret_access_key=S3_SECRET))  # type: ignore[arg-type]


def test_a_pages_objects_go_up_in_one_round_trip_and_a_large_body_asks_to_continue_first(s3_store: S3Store) -> None:
    # botocore sends "Expect: 100-continue" before every PutObject body (a round trip more each); the store keeps it
    # for bodies of 2 MiB and more only. The headers are those botocore sends, seen through its own event.
    expects: list[str | None] = []
    client: Any = s3_store.client
    client.meta.events.register("before-send.s3.PutObject", lambda request, **_: expects.append(
        request.headers.get("Expect")))
    s3_store.ensure_bucket()
    small, large = b"j" * 200_000, np.random.default_rng(0).bytes(3 << 20)
    s3_store.put("page.json", small)
    s3_store.put("original.tif", large)
    assert [e.decode() if isinstance(e, bytes) else e for e in expects] == [None, "100-continue"]
    assert s3_store.get("page.json") == small and s3_store.get("original.tif") == large


def test_one_page_of_a_large_pdf_in_s3_reads_a_small_fraction_of_it(s3_store: S3Store, big_pdf: bytes) -> None:
    key = original_key("a" * 64, ".pdf")
    s3_store.put(key, big_pdf)
    store = CountingStore(s3_store)
    size = store.size(key)
    assert size == len(big_pdf) > 40 << 20
    docs = OpenDocuments(budget=1 << 30)
    try:
        prepared = docs.prepare_ranged(key, store, size, VLM_SPEC, Limits(), page=400, preview_side=200)
        assert (prepared.width, prepared.height) == (2479, 3508)
        first = store.bytes
        assert store.whole == 0
        # The cross-reference table, the page tree down to page 400 (a flat tree: a dictionary of every page
        # before it), and page 400's objects.
        assert first < size / 25, (first, size)
        docs.prepare_ranged(key, store, size, VLM_SPEC, Limits(), page=7, preview_side=0)
        assert store.bytes - first < size / 200, (store.bytes - first, size)  # the table is read once
        assert docs.opened == 1
    finally:
        docs.close()


def test_the_pool_reads_every_page_of_a_large_pdf_by_range_and_never_whole(tmp_path: Path, s3_store: S3Store,
                                                                           big_pdf: bytes) -> None:
    key = original_key("b" * 64, ".pdf")
    s3_store.put(key, big_pdf)
    store = CountingStore(s3_store)
    settings = Settings(data_dir=tmp_path / "data", worker=WorkerSettings(preprocess_processes=0))
    pool = CpuPool(settings, store=store)
    try:
        pages = (1, 260, PAGES, 3)
        for page in pages:
            prepared = pool.submit(key, VLM_SPEC, page=page).result()
            assert prepared.error is None and prepared.page is not None
        assert store.whole == 0 and store.sizes == 1  # one HEAD for the document, then ranges
        assert store.bytes < len(big_pdf) * 0.05, (store.bytes, len(big_pdf))
        assert pool.spool is not None and pool.spool.downloads == 0
    finally:
        pool.close()


def test_the_pages_of_a_pdf_read_by_range_are_those_of_the_file(tmp_path: Path) -> None:
    # The scanned-page fast path looks for each image's dictionary in what the reader has read.
    data = scanned_pdf(4)
    store = open_store(Settings(data_dir=tmp_path))
    key = original_key("c" * 64, ".pdf")
    store.put(key, data)
    path = tmp_path / "copy.pdf"
    path.write_bytes(data)
    ranged, local = OpenDocuments(budget=1 << 30), OpenDocuments(budget=1 << 30)
    try:
        for page in (3, 1):
            a = ranged.prepare_ranged(key, store, len(data), VLM_SPEC, Limits(), page=page, preview_side=0)
            b = local.prepare(key, path, VLM_SPEC, Limits(), page=page, preview_side=0)
            assert a.image.data == b.image.data
    finally:
        ranged.close()
        local.close()


def test_a_read_that_fails_says_why_not_unreadable_pdf(tmp_path: Path) -> None:
    data = large_pdf(3)
    store = open_store(Settings(data_dir=tmp_path))
    key = original_key("d" * 64, ".pdf")
    store.put(key, data)
    docs = OpenDocuments(budget=1 << 30)
    try:
        docs.prepare_ranged(key, store, len(data), VLM_SPEC, Limits(), page=1, preview_side=0)
        Path(store.url(key)).unlink()
        with pytest.raises(ObjectNotFound):
            docs.prepare_ranged(key, store, len(data), VLM_SPEC, Limits(), page=3, preview_side=0)
        with pytest.raises(ObjectNotFound):  # opened afresh: the store's reason again, not PDFium's
            docs.prepare_ranged(key, store, len(data), VLM_SPEC, Limits(), page=2, preview_side=0)
    finally:
        docs.close()


def test_an_object_reader_reads_what_the_object_holds_and_keeps_few_blocks(tmp_path: Path) -> None:
    data = np.random.default_rng(1).integers(0, 256, 1_000_003, dtype=np.uint8).tobytes()
    store = CountingStore(open_store(Settings(data_dir=tmp_path)))
    store.put("originals/x.bin", data)
    reader = ObjectReader(store, "originals/x.bin", block_size=4096, cache_blocks=8)
    rng = np.random.default_rng(2)
    for _ in range(200):
        start = int(rng.integers(0, len(data)))
        n = int(rng.integers(0, 20000))
        reader.seek(start)
        assert reader.read(n) == data[start:start + n]
    assert len(reader.runs()) <= 8 and sum(map(len, reader.runs())) <= 8 * 4096
    reader.seek(0)
    assert reader.read(10) == data[:10] and reader.seek(0, io.SEEK_END) == len(data)
    assert ObjectReader(store, "originals/x.bin#100-200").read() == data[100:200]


def test_an_original_larger_than_a_worker_takes_is_refused_before_it_is_read(tmp_path: Path) -> None:
    store = CountingStore(open_store(Settings(data_dir=tmp_path)))
    key = original_key("e" * 64, ".tif")
    store.put(key, bytes(3 << 20))
    spool = Spool(store, budget=1 << 30, max_bytes=2 << 20, ranged_above=1 << 20)
    try:
        with pytest.raises(InputError, match=r"^file too large \(3 MiB, limit 2 MiB\)$"):
            spool.acquire(key)
        spool.release(key)
        assert store.reads == {} and store.sizes == 1
    finally:
        spool.close()


def _tiff(frames: int) -> bytes:
    images = [Image.new("L", (400, 560), 255 - 20 * i) for i in range(frames)]
    buf = io.BytesIO()
    images[0].save(buf, format="TIFF", save_all=True, append_images=images[1:])
    return buf.getvalue()


@pytest.mark.parametrize("processes", [pytest.param(1, marks=pytest.mark.processes), 0])
def test_a_tiff_is_downloaded_once_for_all_its_pages(tmp_path: Path, processes: int) -> None:
    settings = Settings(data_dir=tmp_path / "data", worker=WorkerSettings(preprocess_processes=processes))
    store = CountingStore(open_store(settings))
    key = original_key("f" * 64, ".tif")
    store.put(key, _tiff(4))
    pool = CpuPool(settings, store=store)
    try:
        for page in (1, 2, 3, 4, 2):
            prepared = pool.submit(key, VLM_SPEC, page=page, urgent=page == 3).result()
            assert prepared.error is None and prepared.page is not None
        assert store.reads == {key: 1} and store.whole == 1
        missing = pool.submit(key, VLM_SPEC, page=5).result()
        assert isinstance(missing.error, InputError)
    finally:
        pool.close()


def test_a_page_that_would_cost_more_requests_than_allowed_fetches_the_rest_whole_once(tmp_path: Path,
                                                                                       big_pdf: bytes) -> None:
    # Page 520 of a flat page tree: a request for each page dictionary before it, past the reader's allowance.
    store = CountingStore(open_store(Settings(data_dir=tmp_path)))
    key = original_key("7" * 64, ".pdf")
    store.put(key, big_pdf)
    docs = OpenDocuments(budget=1 << 30, max_requests=100)
    try:
        prepared = docs.prepare_ranged(key, store, len(big_pdf), VLM_SPEC, Limits(), page=PAGES, preview_side=0)
        assert (prepared.width, prepared.height) == (2479, 3508)
        reads = sum(store.reads.values())
        assert reads == 101 and store.whole == 0  # 100 ranges, then all of it in one
        assert len(big_pdf) < store.bytes < len(big_pdf) + (2 << 20)  # what the 100 read, and the file
        before = store.bytes
        for page in (2, 300):  # from the local copy now
            docs.prepare_ranged(key, store, len(big_pdf), VLM_SPEC, Limits(), page=page, preview_side=0)
        assert store.bytes == before
    finally:
        docs.close()


@pytest.mark.parametrize("ext", [".jpg", ".pdf", ".tif"])
def test_the_pool_refuses_an_original_too_large_for_a_worker_without_reading_it(tmp_path: Path, ext: str) -> None:
    settings = Settings(data_dir=tmp_path / "data", ingest=IngestSettings(max_document_bytes=1 << 20),
                        worker=WorkerSettings(preprocess_processes=0, max_input_bytes=1 << 20))
    store = CountingStore(open_store(settings))
    key = original_key("8" * 64, ext)
    store.put(key, bytes(3 << 20))
    pool = CpuPool(settings, store=store)
    try:
        prepared = pool.submit(key, VLM_SPEC).result()
        assert isinstance(prepared.error, InputError) and str(prepared.error) == "file too large (3 MiB, limit 1 MiB)"
        assert store.reads == {}
    finally:
        pool.close()


def test_an_original_stored_on_its_own_is_read_in_one_request_and_one_too_large_refused_by_that_request(
        s3_store: S3Store) -> None:
    # Counted at the boto3 boundary of the real store, against the real S3 server: no size lookup (HEAD) before
    # the GET; the size comes with the GET's answer, and an original past the limit is refused before its body.
    key, data = original_key("9" * 64, ".jpg"), bytes(range(256)) * 4096  # 1 MiB
    s3_store.put(key, data)
    calls: list[str] = []
    s3_store.client.meta.events.register(  # type: ignore[attr-defined]
        "before-call.s3", lambda model, **_: calls.append(model.name))
    assert read_whole(s3_store, key, 2 << 20) == data
    assert calls == ["GetObject"]
    with pytest.raises(InputError, match=r"^file too large \(1 MiB, limit 0 MiB\)$"):
        read_whole(s3_store, key, 1000)
    assert calls == ["GetObject", "GetObject"]
    assert read_whole(s3_store, ranged(key, 10, 20), 1000) == data[10:20]  # a byte range: its own size
    with pytest.raises(InputError, match="file too large"):
        read_whole(s3_store, ranged(key, 0, 2000), 1000)
    assert calls == ["GetObject"] * 3  # a range past the limit is refused from its key alone
