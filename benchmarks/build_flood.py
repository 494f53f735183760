"""One tenant's flood of archive-format builds against another tenant's reads, side by side (issue 25).

A real ``paperlane api`` process on private Redis, PostgreSQL and SeaweedFS S3, at the shipped defaults (``--budget``
changes api.build_pages_per_minute): past its key's rate (api.rate_per_minute) the flood is refused by count too. Tenant ``flood`` owns ``--documents``
documents of ``--pages`` pages whose results are stored (45 lines a page, as a dense scan reads); tenant
``reader`` owns one. The reader's status reads (GET /v1/documents/{id}, one at a time) are timed idle, then while
``--threads`` clients of the flood ask for every document in ALTO, hOCR and METS over and over: each format of a
version of a document is built once (its pages spent from api.build_pages_per_minute) and read back after, and
past the budget a build is refused with 429. The clock starts at the request's first byte; setting up the
documents is left out.

Last line: ``flood_over_idle=<p50 under flood / p50 idle>`` (target <= 2).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
from common import start_services, write_config

from paperlane.producer.inputs import Document
from paperlane.producer.submit import Submitter
from paperlane.retry import RetryPolicy
from paperlane.schemas import JobStatus, Line, PageResult, TaskSpec
from paperlane.settings import load_settings
from paperlane.storage import ingests, tenants
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.storage.objects import open_store, result_key
from tests.api_server import ApiProcess

FORMATS = ("alto", "hocr", "mets")


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def _documents(config: Path, tenant: str, *, count: int, pages: int) -> list[str]:
    """``count`` finished documents of ``pages`` pages of ``tenant`` (the same pages: one job each, done once)."""
    settings = load_settings(config)
    db, store = Database(settings.database_url), open_store(settings)
    owner = ingests.Owner(tenants.create_key(db, tenant=tenant).tenant_id)
    ids: list[str] = []
    for n in range(count):
        sub = Submitter(db=db, store=store, spec=TaskSpec(), owner=owner)
        doc = Document(f"bench/{tenant}-{n}.pdf", f"{tenant}-{n}", ".pdf", b"%PDF-1.7 bench " + tenant.encode(), pages)
        registered = [p for p in sub.submit([doc], name=f"{tenant}-{n}", sources=[f"{tenant}-{n}"])
                      if hasattr(p, "job_id")]
        if n == 0:
            for page in registered:
                _finish(db, store, page.job_id, page.page_no)  # type: ignore[attr-defined]
        ids.append(registered[0].document_id)  # type: ignore[attr-defined]
    db.dispose()
    return ids


def _finish(db: Database, store: object, job_id: str, page_no: int) -> None:
    job = jobstore.start_attempt(db, job_id, policy=RetryPolicy(max_attempts=3))
    assert job is not None
    lines = [Line(text=f"line {i} of page {page_no}: the quick brown fox jumps over the lazy dog", confidence=0.9,
                  quad=[(50, 60 * i + 40), (1200, 60 * i + 40), (1200, 60 * i + 90), (50, 60 * i + 90)])
             for i in range(45)]
    result = PageResult(job_id=job_id, source=job.source, page=page_no, status=JobStatus.SUCCEEDED,
                        text="\n".join(ln.text for ln in lines), lines=lines, width=1240, height=3000)
    store.put(result_key(job_id), result.model_dump_json().encode())  # type: ignore[attr-defined]
    jobstore.finish_succeeded(db, job, result, engine="bench", result_key=result_key(job_id), annotated_key=None,
                              timings={})


def _reads(url: str, key: str, document_id: str, samples: int) -> list[float]:
    took: list[float] = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        for _ in range(samples):
            started = time.perf_counter()
            assert client.get(f"/v1/documents/{document_id}").status_code == 200
            took.append((time.perf_counter() - started) * 1000)
    return took


def _flood(url: str, key: str, documents: list[str], stop_at: threading.Event, seen: Counter[int]) -> None:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client:
        while not stop_at.is_set():
            for document_id in documents:
                for fmt in FORMATS:
                    seen[client.get(f"/v1/documents/{document_id}/result", params={"format": fmt}).status_code] += 1
                    if stop_at.is_set():
                        return


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--documents", type=int, default=8)
    p.add_argument("--pages", type=int, default=200)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--budget", type=int, default=None, help="api.build_pages_per_minute (default: the setting's)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        svc = start_services(root)
        budget = {"API__BUILD_PAGES_PER_MINUTE": str(args.budget)} if args.budget else {}
        config = write_config(svc, root, **budget)
        Database(load_settings(config).database_url).upgrade()
        server = ApiProcess(config, root / "api.log").wait_ready()
        try:
            flood_docs = _documents(config, "flood", count=args.documents, pages=args.pages)
            reader_doc = _documents(config, "reader", count=1, pages=1)[0]
            db = Database(load_settings(config).database_url)
            flood_key = tenants.create_key(db, tenant="flood").key
            reader_key = tenants.create_key(db, tenant="reader").key
            _reads(server.url, reader_key, reader_doc, 20)  # warm up
            idle = _reads(server.url, reader_key, reader_doc, args.samples)
            stop_at, seen = threading.Event(), Counter[int]()
            floods = [threading.Thread(target=_flood, args=(server.url, flood_key, flood_docs, stop_at, seen))
                      for _ in range(args.threads)]
            for t in floods:
                t.start()
            time.sleep(0.5)  # the flood under way before the first timed read
            busy = _reads(server.url, reader_key, reader_doc, args.samples)
            stop_at.set()
            for t in floods:
                t.join()
        finally:
            server.stop()
            svc.stop()
    print(f"{'reader GET /v1/documents/{id}':32} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
    for label, took in (("idle", idle), (f"flood of {args.threads} builders", busy)):
        print(f"{label:32} {statistics.median(took):8.1f} {pct(took, 0.95):8.1f} {max(took):8.1f}")
    print(f"flood answers: {dict(sorted(seen.items()))} ({args.documents} documents of {args.pages} pages x "
          f"{len(FORMATS)} formats; api.build_pages_per_minute={args.budget or 'default'})")
    print(f"flood_over_idle={statistics.median(busy) / statistics.median(idle):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
