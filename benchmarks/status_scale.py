"""Status lookups with a million pages in PostgreSQL: what an operator or the API pays per question.

Loads --pages pages (10 ingests of documents of --doc-pages pages each, one job per page; 0.5% of
jobs failed with one of a few reasons, a few hundred running, the rest split between succeeded and
queued) straight into a real PostgreSQL with SQL (generate_series), counts included as the
registration keeps them, then times --lookups random lookups of each kind through paperlane's own
status functions, as ``paperlane status`` calls them (no tenant) and as the API calls them (narrowed to the
caller's tenant: the ingests' join included), view built: a page, a document, an ingest.

Last line: ``status_p99_ms=<the worst kind's p99>`` (target <= 5); each kind's p50/p99 above it.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from common import start_services, write_config
from sqlalchemy import text

from paperlane.settings import load_settings
from paperlane.storage import status_reads, views
from paperlane.storage.db import Database

_LOAD = """
INSERT INTO tenants (id, name, webhook_secret, created_at)
SELECT 't' || t, 'tenant ' || t, 'secret', now() FROM generate_series(0, 2) t;
INSERT INTO ingests (id, ingest_key, name, lane, task, task_options, documents_total, pages_total, pages_succeeded,
                     pages_failed, skipped, created_at, registered_at, first_done_at, last_done_at, tenant_id)
SELECT 'i' || i, 'k' || i, 'ingest ' || i, 'batch', 'spotting', '{}', :docs / 10, :pages / 10, 0, 0, 0,
       now() - interval '1 hour', now() - interval '50 minutes', now() - interval '50 minutes', now(), 't' || (i % 3)
FROM generate_series(0, 9) i;
INSERT INTO jobs (id, job_key, content_sha256, source, page, lane, priority, task, task_options, status, attempts,
                  error, created_at, enqueued_at, updated_at)
SELECT 'j' || n, md5(n::text) || md5((n + 1)::text), md5(n::text), 'doc' || (n / :per), n % :per + 1, 'batch', 5,
       'spotting', '{}',
       CASE WHEN n % 200 = 7 THEN 'failed' WHEN n % 3000 = 11 THEN 'running' WHEN n % 2 = 0 THEN 'succeeded'
            ELSE 'queued' END, 1,
       CASE WHEN n % 200 = 7 THEN (ARRAY['cannot decode this image', 'engine refused the page',
                                         'file too large'])[n % 3 + 1] END,
       now(), now(), now()
FROM generate_series(0, :pages - 1) n;
INSERT INTO documents (id, ingest_id, seq, source, name, ext, pages_total, pages_succeeded, pages_failed, created_at)
SELECT 'd' || d, 'i' || (d % 10), d / 10, 'doc' || d, 'doc' || d, '.pdf', :per, 0, 0, now()
FROM generate_series(0, :docs - 1) d;
INSERT INTO pages (id, document_id, ingest_id, page_no, job_id, created_at)
SELECT 'p' || n, 'd' || (n / :per), 'i' || ((n / :per) % 10), n % :per + 1, 'j' || n, now()
FROM generate_series(0, :pages - 1) n;
UPDATE documents d SET pages_succeeded = c.s, pages_failed = c.f FROM (
    SELECT p.document_id, count(*) FILTER (WHERE j.status = 'succeeded') s,
           count(*) FILTER (WHERE j.status = 'failed') f
    FROM pages p JOIN jobs j ON j.id = p.job_id GROUP BY p.document_id) c WHERE d.id = c.document_id;
INSERT INTO ingest_failures (ingest_id, reason, pages)
SELECT p.ingest_id, j.error, count(*) FROM pages p JOIN jobs j ON j.id = p.job_id WHERE j.status = 'failed'
GROUP BY p.ingest_id, j.error;
UPDATE ingests i SET pages_succeeded = c.s, pages_failed = c.f FROM (
    SELECT ingest_id, sum(pages_succeeded) s, sum(pages_failed) f FROM documents GROUP BY ingest_id) c
WHERE i.id = c.ingest_id;
ANALYZE;
"""


def _timed(fn: Callable[[], object], n: int) -> tuple[float, float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99) - 1]


def _lookups(db: Database, rng: random.Random, *, docs: int, pages: int,
             tenant: Callable[[int], str | None]) -> dict[str, Callable[[], object]]:
    """One status read of each kind, with its view built, as the CLI (no tenant) or the API (its tenant) reads it."""

    def page() -> object:
        n = rng.randrange(pages)
        # the tenant of its document's ingest
        found = status_reads.get_page(db, f"p{n}", tenant_id=tenant((n // (pages // docs)) % 10))
        return views.page_view(found.page.id, found.document.id, found.page.page_no, found.job)

    def document() -> object:
        d = rng.randrange(docs)
        return views.document_view(*status_reads.document_progress(db, f"d{d}", tenant_id=tenant(d % 10)))

    def ingest() -> object:
        i = rng.randrange(10)
        return views.ingest_view(*status_reads.ingest_progress(db, f"i{i}", tenant_id=tenant(i)))

    return {"page": page, "document": document, "ingest": ingest}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=1_000_000)
    ap.add_argument("--doc-pages", type=int, default=10)
    ap.add_argument("--lookups", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        svc = start_services(root)
        try:
            db = Database(load_settings(write_config(svc, root)).database_url)
            db.upgrade()
            t0 = time.perf_counter()
            with db.engine.begin() as conn:
                for stmt in filter(str.strip, _LOAD.split(";")):
                    conn.execute(text(stmt), {"pages": args.pages, "per": args.doc_pages,
                                              "docs": args.pages // args.doc_pages})
            print(f"loaded {args.pages} pages in {time.perf_counter() - t0:.0f}s")
            rng = random.Random(1)
            docs = args.pages // args.doc_pages
            worst = 0.0
            for who, tenant in (("cli", lambda i: None), ("api", lambda i: f"t{i % 3}")):
                for kind, fn in _lookups(db, rng, docs=docs, pages=args.pages, tenant=tenant).items():
                    _timed(fn, 50)  # warm the pool and the caches
                    p50, p99 = _timed(fn, args.lookups)
                    worst = max(worst, p99)
                    print(f"{who} {kind:<9} p50 {p50:.2f} ms  p99 {p99:.2f} ms")
            print(f"status_p99_ms={worst:.2f}")
        finally:
            svc.stop()


if __name__ == "__main__":
    main()
