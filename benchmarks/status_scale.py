"""Status lookups with a million pages in PostgreSQL: what an operator or the API pays per question.

Loads --pages pages (--months ingests, one opened in each of --months monthly partitions, of documents of
--doc-pages pages each, one job per page, ids made as paperlane makes them (storage.timeids); 0.5% of
jobs failed with one of a few reasons, about 300 running, the rest split between succeeded and
queued) straight into a real PostgreSQL with SQL (generate_series), counts included as the
registration keeps them, then times --lookups random lookups of each kind through paperlane's own
status functions, as ``paperlane status`` calls them (no tenant) and as the API calls them (narrowed to the
caller's tenant: the ingests' join included), view built: a page, a document, an ingest. Prints the EXPLAIN
ANALYZE of a page's lookup (the partitions it reads) and, at the end, a retention run (storage.history) that drops
the first month once its work is finished.

The pages running are as many as a fleet has in flight (about 300, spread over the ingests), not a share of the
history: a document's or an ingest's lookup counts its running pages among all the running jobs (a partial
index), so its cost grows with the pages in flight fleet-wide, not with the history's size.

Last line: ``status_p99_ms=<the worst kind's p99>`` (target <= 5); each kind's p50/p99 and the retention run above it.

``--database-url URL --keep``: load into that database (created when missing) and keep it, so a later run in the
same month (without --keep: the retention run then ends it) measures the same 10M pages again on a quieter machine.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2
from common import start_services, write_config
from sqlalchemy import event, text

from paperlane.settings import load_settings
from paperlane.storage import history, ingests, status_reads, timeids, views
from paperlane.storage.db import Database

# Ids as paperlane makes them (storage.timeids): an ingest's time in its documents' and pages' ids, a job's own.
_TID = """
CREATE FUNCTION pg_temp.tid(ms bigint, name text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-' || substr(h, 13, 4) || '-' || substr(h, 17, 4) || '-'
           || substr(h, 21, 12)
    FROM (SELECT 'ffff' || lpad(to_hex(ms), 12, '0')
                 || substr(encode(sha256(convert_to(name, 'UTF8')), 'hex'), 1, 16) AS h) x $$
"""
_LOAD = """
INSERT INTO tenants (id, name, webhook_secret, created_at)
SELECT 't' || t, 'tenant ' || t, 'secret', now() FROM generate_series(0, 2) t;
INSERT INTO ingests (id, ingest_key, name, lane, task, task_options, documents_total, pages_total, pages_succeeded,
                     pages_failed, skipped, created_at, registered_at, first_done_at, last_done_at, tenant_id)
SELECT pg_temp.tid((:ms)[i + 1], 'i' || i), 'k' || i, 'ingest ' || i, 'batch', 'spotting', '{}', :docs / :ingests,
       :pages / :ingests, 0, 0, 0, now() - interval '1 hour', now() - interval '50 minutes',
       now() - interval '50 minutes', now(), 't' || (i % 3)
FROM generate_series(0, :ingests - 1) i;
INSERT INTO jobs (id, job_key, content_sha256, source, page, lane, priority, task, task_options, status, attempts,
                  error, created_at, enqueued_at, updated_at)
SELECT pg_temp.tid((:ms)[(n / :per) % :ingests + 1] + 1000, 'j' || n), md5(n::text) || md5((n + 1)::text),
       md5(n::text), 'doc' || (n / :per), n % :per + 1, 'batch', 5, 'spotting', '{}',
       CASE WHEN n % 200 = 7 THEN 'failed' WHEN n % GREATEST(:pages / 300, 1) = 11 THEN 'running'
            WHEN n % 2 = 0 THEN 'succeeded'
            ELSE 'queued' END, 1,
       CASE WHEN n % 200 = 7 THEN (ARRAY['cannot decode this image', 'engine refused the page',
                                         'file too large'])[n % 3 + 1] END,
       now(), now(), now()
FROM generate_series(0, :pages - 1) n;
INSERT INTO documents (id, ingest_id, seq, source, name, ext, pages_total, pages_succeeded, pages_failed, created_at)
SELECT pg_temp.tid((:ms)[d % :ingests + 1], 'd' || d), pg_temp.tid((:ms)[d % :ingests + 1], 'i' || (d % :ingests)),
       d / :ingests, 'doc' || d, 'doc' || d, '.pdf', :per, 0, 0, now()
FROM generate_series(0, :docs - 1) d;
INSERT INTO pages (id, document_id, ingest_id, page_no, job_id, created_at)
SELECT pg_temp.tid(ms, 'p' || n), pg_temp.tid(ms, 'd' || (n / :per)), pg_temp.tid(ms, 'i' || ((n / :per) % :ingests)),
       n % :per + 1, pg_temp.tid(ms + 1000, 'j' || n), now()
FROM (SELECT n, (:ms)[(n / :per) % :ingests + 1] AS ms FROM generate_series(0, :pages - 1) n) x;
CREATE TEMP TABLE outcome AS  -- page n's job's status, as the jobs were loaded: counted without a 2-table join
SELECT n / :per AS d, (n / :per) % :ingests AS i,
       CASE WHEN n % 200 = 7 THEN 'failed' WHEN n % GREATEST(:pages / 300, 1) = 11 THEN 'running'
            WHEN n % 2 = 0 THEN 'succeeded'
            ELSE 'queued' END AS status,
       (ARRAY['cannot decode this image', 'engine refused the page', 'file too large'])[n % 3 + 1] AS reason
FROM generate_series(0, :pages - 1) n;
UPDATE documents d SET pages_succeeded = c.s, pages_failed = c.f FROM (
    SELECT pg_temp.tid((:ms)[d % :ingests + 1], 'd' || d) AS id, count(*) FILTER (WHERE status = 'succeeded') s,
           count(*) FILTER (WHERE status = 'failed') f
    FROM outcome GROUP BY d) c WHERE d.id = c.id;
INSERT INTO ingest_failures (ingest_id, reason, pages)
SELECT pg_temp.tid((:ms)[i + 1], 'i' || i), reason, count(*) FROM outcome WHERE status = 'failed' GROUP BY i, reason;
UPDATE ingests i SET pages_succeeded = c.s, pages_failed = c.f FROM (
    SELECT ingest_id, sum(pages_succeeded) s, sum(pages_failed) f FROM documents GROUP BY ingest_id) c
WHERE i.id = c.ingest_id;
ANALYZE;
"""


class _Ids:
    """The ids the load made, as paperlane would: ingest i in month i (of ``months``), its documents and pages."""

    def __init__(self, ms: list[int], *, per: int) -> None:
        self.ms, self.per, self.ingests = ms, per, len(ms)

    def _tid(self, ms: int, name: str) -> str:
        return timeids.mint(datetime.fromtimestamp(ms / 1000, UTC), name=name)

    def ingest(self, i: int) -> str:
        return self._tid(self.ms[i], f"i{i}")

    def document(self, d: int) -> str:
        return self._tid(self.ms[d % self.ingests], f"d{d}")

    def page(self, n: int) -> str:
        return self._tid(self.ms[(n // self.per) % self.ingests], f"p{n}")


def _timed(fn: Callable[[], object], n: int) -> tuple[float, float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99) - 1]


def _lookups(db: Database, rng: random.Random, ids: _Ids, *, docs: int, pages: int,
             tenant: Callable[[int], str | None]) -> dict[str, Callable[[], object]]:
    """One status read of each kind, with its view built, as the CLI (no tenant) or the API (its tenant) reads it."""

    def page() -> object:
        n = rng.randrange(pages)
        found = status_reads.get_page(db, ids.page(n), tenant_id=tenant((n // ids.per) % ids.ingests))  # its ingest's
        return views.page_view(found.page.id, found.document.id, found.page.page_no, found.job)

    def document() -> object:
        d = rng.randrange(docs)
        return views.document_view(*status_reads.document_progress(db, ids.document(d), tenant_id=tenant(d % ids.ingests)))

    def ingest() -> object:
        i = rng.randrange(ids.ingests)
        return views.ingest_view(*status_reads.ingest_progress(db, ids.ingest(i), tenant_id=tenant(i)))

    return {"page": page, "document": document, "ingest": ingest}


def _explain_page_lookup(db: Database, page_id: str) -> str:
    """EXPLAIN ANALYZE of the statement a page's status lookup sends, as it sends it."""
    sent: list[tuple[str, object]] = []

    def keep(_conn: object, _cursor: object, statement: str, parameters: object, *_: object) -> None:
        sent.append((statement, parameters))

    event.listen(db.engine, "before_cursor_execute", keep)
    status_reads.get_page(db, page_id)
    event.remove(db.engine, "before_cursor_execute", keep)
    with db.engine.connect() as conn:
        rows = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {sent[-1][0]}",
                                    sent[-1][1])  # type: ignore[arg-type]
        return "\n".join(r[0] for r in rows)


_FINISH_FIRST_MONTH = """
UPDATE jobs SET status = 'succeeded' WHERE id >= :lo AND id < :hi AND status IN ('queued', 'running');
UPDATE ingests SET finished_at = now() WHERE id >= :lo AND id < :hi
"""


def _retention_run(db: Database, ms: list[int]) -> None:
    """The first month's work finished, then a retention of a year run a year and a month later: that month goes."""
    first = history.month_start(datetime.fromtimestamp(ms[0] / 1000, UTC))
    bounds = {"lo": timeids.floor(first), "hi": timeids.floor(history.add_months(first, 1))}
    with db.engine.begin() as conn:
        for stmt in _FINISH_FIRST_MONTH.split(";"):
            conn.execute(text(stmt), bounds)
    t0 = time.perf_counter()
    report = history.retain(db, keep_days=365, now=history.add_months(first, 13), ahead=0)
    for line in report.lines():
        if not line.startswith("created"):
            print(f"retention: {line}")
    print(f"retention run: {time.perf_counter() - t0:.1f}s")


def _loaded(db: Database, *, pages: int, months: int) -> bool:
    """Whether the database already holds this load (a kept one, --keep): as many jobs and ingests as asked."""
    with db.engine.connect() as conn:
        jobs = conn.execute(text("SELECT count(*) FROM jobs")).scalar_one()
        opened = conn.execute(text("SELECT count(*) FROM ingests")).scalar_one()
    return (jobs, opened) == (pages, months)


def _load(db: Database, args: argparse.Namespace, ms: list[int]) -> None:
    if _loaded(db, pages=args.pages, months=args.months):
        print(f"reusing the {args.pages} pages over {args.months} monthly partitions loaded before (--keep)")
        return
    t0 = time.perf_counter()
    with db.engine.begin() as conn:
        conn.execute(text(_TID))
        for stmt in filter(str.strip, _LOAD.split(";")):
            conn.execute(text(stmt), {"pages": args.pages, "per": args.doc_pages, "docs": args.pages // args.doc_pages,
                                      "ingests": args.months, "ms": ms})
    print(f"loaded {args.pages} pages over {args.months} monthly partitions in {time.perf_counter() - t0:.0f}s")


def _measure(db: Database, args: argparse.Namespace, month: datetime) -> None:
    ms = [int((history.add_months(month, k) + timedelta(hours=1)).timestamp() * 1000) for k in range(args.months)]
    ids = _Ids(ms, per=args.doc_pages)
    _load(db, args, ms)
    print(_explain_page_lookup(db, ids.page(args.pages // 2)))
    rng = random.Random(1)
    worst = 0.0
    for who, tenant in (("cli", lambda i: None), ("api", lambda i: f"t{i % 3}")):
        for kind, fn in _lookups(db, rng, ids, docs=args.pages // args.doc_pages, pages=args.pages,
                                 tenant=tenant).items():
            _timed(fn, 50)  # warm the pool and the caches
            p50, p99 = _timed(fn, args.lookups)
            worst = max(worst, p99)
            print(f"{who} {kind:<9} p50 {p50:.2f} ms  p99 {p99:.2f} ms")
    if args.keep:
        print("retention run: skipped (--keep: the load stays as it is for the next run)")
    else:
        _retention_run(db, ms)
    print(f"status_p99_ms={worst:.2f}")


def _migrated(db: Database, months: int) -> Database:
    """``db`` at the newest schema, with the load's ``months`` monthly partitions made from this month on."""
    db.upgrade()
    history.retain(db, keep_days=None, ahead=months - 1)
    return db


def _kept_database(url: str) -> Database:
    """The PostgreSQL database at ``url``, created when it is not there yet."""
    base, name = url.rsplit("/", 1)
    admin = psycopg2.connect(base.replace("postgresql+psycopg2", "postgresql") + "/postgres")
    admin.autocommit = True
    cur = admin.cursor()
    cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
    if cur.fetchone() is None:
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    return Database(url)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=1_000_000)
    ap.add_argument("--doc-pages", type=int, default=10)
    ap.add_argument("--months", type=int, default=12, help="monthly partitions the pages are spread over")
    ap.add_argument("--lookups", type=int, default=1000)
    ap.add_argument("--database-url", help="load into this PostgreSQL database (created if missing) instead of a "
                    "private server; with --keep a later run reuses its load (10M pages take long to load)")
    ap.add_argument("--keep", action="store_true", help="leave the load as it is: no retention run at the end")
    args = ap.parse_args()
    month = history.month_start(datetime.now(UTC))  # ids are made from it: reuse a kept load within its month
    if args.database_url:
        _measure(_migrated(_kept_database(args.database_url), args.months), args, month)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        svc = start_services(root)
        try:
            db = Database(load_settings(write_config(svc, root)).database_url)
            _measure(_migrated(db, args.months), args, month)
        finally:
            svc.stop()


if __name__ == "__main__":
    main()
