"""A PDF costs one download per worker and one parse per process, not one of each per page."""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pypdfium2 as pdfium
import pytest

from paperlane.errors import InputError, ObjectNotFound
from paperlane.settings import Settings, WorkerSettings
from paperlane.storage.objects import DelegatingStore, ObjectStore, open_store, original_key
from paperlane.workers.cpu_pool import CpuPool
from paperlane.workers.doccache import OpenDocuments, Spool, spooled_kind
from paperlane.workers.input_limits import Limits
from tests.test_pdfscan import jpeg_of, scan_image
from tests.test_preprocess import VLM_SPEC, pdf_pages


class CountingStore(DelegatingStore):
    """The real store, counting what it returned: reads of each key (what the spool must keep to one per PDF),
    bytes, reads of a whole object (no byte range), and size lookups."""

    def __init__(self, store: ObjectStore) -> None:
        super().__init__(store)
        self.reads: dict[str, int] = {}
        self.bytes = self.whole = self.sizes = 0
        self._lock = threading.Lock()

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        data = self.store.get(key, max_bytes=max_bytes)
        with self._lock:
            self.reads[key] = self.reads.get(key, 0) + 1
            self.bytes += len(data)
            self.whole += "#" not in key
        return data

    def size(self, key: str) -> int:
        with self._lock:
            self.sizes += 1
        return self.store.size(key)


def scanned_pdf(pages: int, *, size: tuple[int, int] = (310, 438), seed: int = 0) -> bytes:
    """A PDF of ``pages`` A4 pages, each one small JPEG scan (distinct bytes per page)."""
    return pdf_of_jpegs(jpeg_of(scan_image(size=size, seed=seed + i)) for i in range(pages))


def pdf_of_jpegs(jpegs: Iterable[bytes]) -> bytes:
    """A PDF of A4 pages, each one of ``jpegs`` covering it (as a scanner writes them)."""
    pdf = pdfium.PdfDocument.new()
    for jpeg in jpegs:
        page = pdf.new_page(595, 842)
        image = pdfium.PdfImage.new(pdf)
        image.load_jpeg(io.BytesIO(jpeg), inline=True)
        image.set_matrix(pdfium.PdfMatrix(595, 0, 0, 842, 0, 0))
        page.insert_obj(image)
        page.gen_content()
        page.close()
    buf = io.BytesIO()
    pdf.save(buf)
    pdf.close()
    return buf.getvalue()


def test_only_pdfs_stored_on_their_own_are_spooled() -> None:
    assert spooled_kind(original_key("ab" * 32, ".pdf"))
    assert spooled_kind(original_key("ab" * 32, ".PDF"))
    assert not spooled_kind(original_key("ab" * 32, ".jpg"))
    assert not spooled_kind("packs/i/p.pack#0-1000")  # small originals packed together: read by their range


def test_a_pdf_is_downloaded_once_for_all_its_pages_by_pages_at_once(tmp_path: Path) -> None:
    store = CountingStore(open_store(Settings(data_dir=tmp_path)))
    key = original_key("1" * 64, ".pdf")
    store.put(key, scanned_pdf(3))
    spool = Spool(store, budget=10 << 20, max_bytes=10 << 20)
    try:
        with ThreadPoolExecutor(8) as threads:
            paths = list(threads.map(lambda _: spool.acquire(key).path, range(8)))
        assert store.reads == {key: 1} and spool.downloads == 1
        assert len(set(paths)) == 1 and paths[0] is not None and paths[0].read_bytes() == store.get(key)
        for _ in range(8):
            spool.release(key)
        assert spool.acquire(key).path == paths[0]  # kept for later pages while within its budget
        spool.release(key)
        assert store.reads == {key: 2} and spool.downloads == 1
    finally:
        spool.close()
    assert not paths[0].exists()


def test_the_spool_keeps_its_budget_but_never_drops_a_pdf_in_use(tmp_path: Path) -> None:
    store = open_store(Settings(data_dir=tmp_path))
    keys = [original_key(str(i) * 64, ".pdf") for i in range(3)]
    for i, key in enumerate(keys):
        store.put(key, scanned_pdf(1, seed=i))
    size = len(store.get(keys[0]))
    spool = Spool(store, budget=int(size * 2.5), max_bytes=10 << 20)  # room for two
    try:
        first = spool.acquire(keys[0]).path
        second = spool.acquire(keys[1]).path
        third = spool.acquire(keys[2]).path  # over budget while all three are held: each stays
        assert first and second and third and first.exists() and second.exists() and third.exists()
        spool.release(keys[1])
        assert not second.exists()  # the least recently used one nobody holds goes
        assert first.exists() and spool.bytes <= int(size * 2.5)
        spool.release(keys[0])
        spool.release(keys[2])
        assert first.exists() and third.exists()  # within budget again: kept
    finally:
        spool.close()


def test_a_pdf_larger_than_the_budget_or_no_pdf_is_not_spooled(tmp_path: Path) -> None:
    store = open_store(Settings(data_dir=tmp_path))
    big, other = original_key("b" * 64, ".pdf"), original_key("c" * 64, ".pdf")
    store.put(big, scanned_pdf(2))
    store.put(other, b"not a pdf at all")
    spool = Spool(store, budget=1000, max_bytes=10 << 20)
    try:
        assert spool.acquire(big).path is None and spool.acquire(other).path is None
        spool.release(big)
        spool.release(other)
        assert spool.bytes == 0
    finally:
        spool.close()


def test_a_failed_download_is_raised_to_its_page_and_the_next_page_tries_again(tmp_path: Path) -> None:
    store = open_store(Settings(data_dir=tmp_path))
    key = original_key("d" * 64, ".pdf")
    spool = Spool(store, budget=10 << 20, max_bytes=10 << 20)
    try:
        with pytest.raises(ObjectNotFound):
            spool.acquire(key)
        spool.release(key)
        store.put(key, scanned_pdf(1))
        assert spool.acquire(key).path is not None
        spool.release(key)
    finally:
        spool.close()


def test_an_open_pdf_is_parsed_once_for_all_its_pages(tmp_path: Path) -> None:
    path = tmp_path / "doc.pdf"
    path.write_bytes(scanned_pdf(6))
    docs = OpenDocuments(budget=10 << 20)
    try:
        for page in (1, 4, 6, 2):
            prepared = docs.prepare("k", path, VLM_SPEC, Limits(), page=page, preview_side=200)
            assert (prepared.width, prepared.height) == (2479, 3508)
        assert docs.opened == 1
        with pytest.raises(InputError, match=r"^no page 7 in this PDF \(6 pages\)$"):
            docs.prepare("k", path, VLM_SPEC, Limits(), page=7, preview_side=0)
    finally:
        docs.close()


def test_open_pdfs_keep_their_budget_and_one_larger_is_opened_for_each_page(tmp_path: Path) -> None:
    paths = []
    for i in range(2):
        paths.append(tmp_path / f"{i}.pdf")
        paths[-1].write_bytes(scanned_pdf(2, seed=10 * i))
    size = max(p.stat().st_size for p in paths)
    docs = OpenDocuments(budget=int(size * 1.5))  # room for one
    try:
        for key, path in (("a", paths[0]), ("a", paths[0]), ("b", paths[1]), ("a", paths[0])):
            docs.prepare(key, path, VLM_SPEC, Limits(), page=2, preview_side=0)
        assert docs.opened == 3  # a, b (a closed to make room), a again
    finally:
        docs.close()
    small = OpenDocuments(budget=100)
    try:
        for _ in range(3):
            small.prepare("a", paths[0], VLM_SPEC, Limits(), page=1, preview_side=0)
        assert small.opened == 3
    finally:
        small.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/io")
def test_a_page_of_an_open_pdf_reads_what_it_needs_not_the_file(tmp_path: Path) -> None:
    # The issue-17 case in small: a large PDF, one page wanted. PDFium reads the cross-reference table
    # and that page's objects from the local copy, not the whole file.
    path = tmp_path / "doc.pdf"
    path.write_bytes(scanned_pdf(40, size=(620, 877)))
    docs = OpenDocuments(budget=1 << 30)
    try:
        docs.prepare("k", path, VLM_SPEC, Limits(), page=1, preview_side=0)  # open; index the images once
        before = _bytes_read()
        docs.prepare("k", path, VLM_SPEC, Limits(), page=30, preview_side=0)
        read = _bytes_read() - before
    finally:
        docs.close()
    assert read < path.stat().st_size / 10, (read, path.stat().st_size)


def _bytes_read() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.parametrize("processes", [pytest.param(1, marks=pytest.mark.processes), 0])
def test_the_pool_prepares_every_page_of_a_pdf_from_one_download(tmp_path: Path, processes: int) -> None:
    settings = Settings(data_dir=tmp_path / "data", worker=WorkerSettings(preprocess_processes=processes))
    store = CountingStore(open_store(settings))
    key = original_key("e" * 64, ".pdf")
    store.put(key, scanned_pdf(5))
    pool = CpuPool(settings, store=store)
    try:
        first = pool.submit(key, VLM_SPEC, page=1).result()
        assert first.page is not None
        # Gone from the store: the other pages can only come from the worker's copy.
        Path(store.url(key)).unlink()
        futures = [pool.submit(key, VLM_SPEC, page=p, urgent=p == 5) for p in (2, 3, 4, 5, 3)]
        for future in futures:
            prepared = future.result()
            assert prepared.error is None and prepared.page is not None
        assert store.reads == {key: 1}
        assert pool.spool is not None and pool.spool.downloads == 1
    finally:
        pool.close()


def test_a_pdf_the_spool_cannot_fetch_fails_its_page_with_the_stores_reason(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", worker=WorkerSettings(preprocess_processes=0))
    pool = CpuPool(settings, store=open_store(settings))
    try:
        prepared = pool.submit(original_key("f" * 64, ".pdf"), VLM_SPEC, page=2).result()
        assert prepared.page is None and isinstance(prepared.error, ObjectNotFound)
        broken = original_key("0" * 64, ".pdf")
        open_store(settings).put(broken, b"%PDF-1.4 nothing else")
        prepared = pool.submit(broken, VLM_SPEC, page=1).result()
        assert isinstance(prepared.error, InputError) and str(prepared.error) == \
            "unreadable PDF (PDFium: Data format error)"
        assert pool.submit(original_key("a" * 64, ".pdf"), VLM_SPEC).result().error is not None
        open_store(settings).put(original_key("9" * 64, ".pdf"), pdf_pages((595, 842)))
        assert pool.submit(original_key("9" * 64, ".pdf"), VLM_SPEC).result().page is not None
    finally:
        pool.close()


def test_by_default_a_large_pdf_is_read_by_range_a_smaller_one_spooled_and_a_typical_one_kept_open() -> None:
    cfg = WorkerSettings()
    assert cfg.document_cache_bytes == 1 << 30 and cfg.open_document_bytes == 256 << 20
    assert cfg.ranged_pdf_bytes == 64 << 20 < cfg.max_input_bytes
    assert cfg.document_cache_bytes >= cfg.max_input_bytes  # no original a worker reads is too large to spool
    assert cfg.open_document_bytes >= cfg.max_input_bytes  # nor to keep open
