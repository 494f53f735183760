"""What one page of a large PDF costs a worker in bytes read from S3 and in time: the whole original
downloaded for the page (what every page did before issue 20, and what a PDF too large for the spool
still did) vs read by byte range (#17 item 4), side by side in one run, against a real S3 (SeaweedFS).

The PDF is built here: ``--pages`` A4 pages, each one noisy JPEG of ~100 kB (noise does not
compress), ~74 MB for 520 pages, with a flat page tree (every page dictionary under the root, as
img2pdf, qpdf and pypdfium2 write them: the worst case for reading by range, since PDFium reads the
dictionary of every page before the one it opens). Pages are sampled across the document. For each
page the clock starts before the first byte is asked for and stops when the page is prepared for
HunyuanOCR (rendered or decoded, encoded, preview); bytes are those the store returned.

- ``whole``: the page's process downloads the original and PDFium parses it from memory;
- ``ranged, cold``: a process that has not opened the PDF yet (its first page of it): the trailer, the
  cross-reference table, the page tree down to the page, and the page's objects;
- ``ranged, open``: the next pages in a process that keeps the PDF open (``workers.doccache``).

A cold open costs one request per page dictionary before the page (scattered 4 KiB reads: ~1.4 s for
page ~260 on a local SeaweedFS, against ~0.3 s to download 70 MB from it); a worker's processes each pay
it once per PDF, as they keep it open, and a balanced page tree or object streams make it a few requests.

Last line: ``page_reads_bytes_per_page=<ranged open median> whole=<whole median>``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from common import HUNYUAN_SPEC

from paperlane.settings import StorageBackend, StorageSettings
from paperlane.storage.objects import original_key
from paperlane.storage.s3 import S3Store
from paperlane.workers.doccache import OpenDocuments
from paperlane.workers.input_limits import Limits
from paperlane.workers.preprocess import prepare_page
from tests import services
from tests.test_doccache import CountingStore
from tests.test_ranged_reads import large_pdf

LIMITS = Limits()


def _timed(store: CountingStore, fn: Callable[[], object]) -> tuple[int, float]:
    before = store.bytes
    t0 = time.perf_counter()
    fn()
    return store.bytes - before, time.perf_counter() - t0


def _row(name: str, samples: list[tuple[int, float]], size: int) -> str:
    bytes_ = statistics.median(b for b, _ in samples)
    ms = statistics.median(t for _, t in samples) * 1000
    return (f"{name:<14} {bytes_ / 2**20:9.2f} MiB  {100 * bytes_ / size:6.2f}% of the file  {ms:8.1f} ms"
            f"   (n={len(samples)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=520)
    parser.add_argument("--samples", type=int, default=8, help="pages measured per way")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        s3 = services.start_seaweedfs(Path(tmp) / "s3")
        try:
            raw = S3Store.from_settings(StorageSettings(
                backend=StorageBackend.S3, endpoint_url=s3.url, bucket=f"bench-{uuid.uuid4().hex[:8]}",
                access_key_id=services.S3_KEY, secret_access_key=services.S3_SECRET))  # type: ignore[arg-type]
            data = large_pdf(args.pages)
            key = original_key(uuid.uuid4().hex * 2, ".pdf")
            raw.put(key, data)
            store = CountingStore(raw)
            size = store.size(key)
            step = max(1, args.pages // args.samples)
            pages = [min(args.pages, 1 + i * step + step // 2) for i in range(args.samples)]
            whole = [_timed(store, lambda p=p: prepare_page(store.get(key), HUNYUAN_SPEC, LIMITS, page=p,
                                                            preview_side=1000)) for p in pages]
            cold, opened = [], []
            for p in pages:
                docs = OpenDocuments(budget=1 << 30)
                try:
                    cold.append(_timed(store, lambda p=p, d=docs: d.prepare_ranged(  # type: ignore[misc]
                        key, store, size, HUNYUAN_SPEC, LIMITS, page=p, preview_side=1000)))
                finally:
                    docs.close()
            docs = OpenDocuments(budget=1 << 30)
            try:
                docs.prepare_ranged(key, store, size, HUNYUAN_SPEC, LIMITS, page=args.pages, preview_side=1000)
                for p in reversed(pages):
                    opened.append(_timed(store, lambda p=p: docs.prepare_ranged(
                        key, store, size, HUNYUAN_SPEC, LIMITS, page=p, preview_side=1000)))
            finally:
                docs.close()
        finally:
            s3.stop()
    print(f"one PDF of {args.pages} pages, {size / 2**20:.1f} MiB, in S3 (SeaweedFS); medians per page")
    print(_row("whole", whole, size))
    print(_row("ranged, cold", cold, size))
    print(_row("ranged, open", opened, size))
    print(f"page_reads_bytes_per_page={statistics.median(b for b, _ in opened):.0f} "
          f"whole={statistics.median(b for b, _ in whole):.0f}")


if __name__ == "__main__":
    main()
