"""What one page costs the shared services: the figures docs/operations.md sizes a cluster from.

Private Redis, PostgreSQL (with pg_stat_statements) and SeaweedFS S3 (with its /metrics), the simulated vLLM
server (tests/sim_engine.py, a real model's shape), one real ``paperlane worker --engine vllm`` at the shipped
defaults. A first round of --warm pages is registered (Redis's memory read before and after) and goes through
untimed (the schema, the bucket, the worker's start-up and caches); then the counters are read, --pages A4 300
dpi scans are registered through the real producer (as ``paperlane submit`` and the API do) and processed, and
the counters are read again at each step. So every figure is the marginal cost of one more page, split into
registering it (producer) and processing it (worker):

- Redis commands (INFO commandstats: a Lua script's call counts, and so does every command it runs: server work)
- Redis round trips (INFO stats' total_reads_processed: the reads Redis served, a pipeline's or a script's one or
  few; the benchmark's own INFO and connection set-up left out)
- PostgreSQL statements (pg_stat_statements' calls, the benchmark's own reads left out; the most called
  statements of processing a page are listed)
- S3 requests by type (SeaweedFS_s3_request_total)
- database bytes (every table and index of the schema, pg_total_relation_size)
- the worker's CPU (its process group: the worker and its preprocessing pool) per page
- and, with the worker idle after the run, Redis commands per second: what a worker costs doing nothing;
- Redis memory per waiting page: the warm-up pages registered before any worker runs.

The last line: ``redis_cmds_per_page=``.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg2
import redis
from common import (Services, finished_jobs, group_cpu, redis_calls, stamped_scans, start_worker, stop,
                    write_config)

from paperlane.priority.broker import PagePublisher, make_celery
from paperlane.priority.lanes import Lane
from paperlane.producer.inputs import Document
from paperlane.producer.submit import submit_documents
from paperlane.schemas import TaskSpec
from paperlane.settings import Settings, load_settings
from paperlane.storage.db import Database
from paperlane.storage.objects import open_store
from tests import services
from tests.sim_engine import start_sim_engine

_OWN = re.compile(r"pg_stat_statements|pg_total_relation_size|pg_class|count\(\*\)", re.I)
_S3 = re.compile(r'^SeaweedFS_s3_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$', re.M)


@dataclass
class Reading:
    """The counters at one moment."""

    redis: Counter[str]  # calls by command
    reads: int  # the reads Redis served (total_reads_processed)
    pg: int  # statements
    statements: Counter[str]  # calls by statement (pg_stat_statements' normalised text)
    s3: Counter[str]  # requests by type
    tables: Counter[str]  # bytes of each table with its indexes and TOAST
    cpu: float  # the worker's process group, seconds
    at: float


def read(svc: Services, metrics_port: int, dsn: str, worker_pid: int | None) -> Reading:
    client = redis.Redis.from_url(svc.redis.url)
    calls = redis_calls(client)
    reads = calls.pop("reads")
    client.close()
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT query, calls FROM pg_stat_statements WHERE dbid = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database())")
        statements = Counter({" ".join(q.split()): int(n) for q, n in cur.fetchall() if not _OWN.search(q)})
        pg = sum(statements.values())
        cur.execute("SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n "
                    "ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'm')")
        tables = Counter({name: int(size) for name, size in cur.fetchall()})
    s3: Counter[str] = Counter()
    for m in _S3.finditer(httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text):
        kind = re.search(r'type="([^"]*)"', m.group("labels"))
        s3[kind.group(1) if kind else "?"] += int(float(m.group("value")))
    cpu = sum(group_cpu(worker_pid).values()) if worker_pid else 0.0
    return Reading(calls, reads, pg, statements, s3, tables, cpu, time.time())


def submit(settings: Settings, db: Database, pages: list[bytes], start: int) -> list[str]:
    docs = (Document(source=f"scan{start + i}.jpg", name=f"scan{start + i}", ext=".jpg", data=data, page_count=1)
            for i, data in enumerate(pages))
    return [s.job_id for s in submit_documents(docs, db=db, store=open_store(settings), spec=TaskSpec(),
                                               lane=Lane.BATCH, publisher=PagePublisher(make_celery(settings)))]


def wait_final(db: Database, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while finished_jobs(db) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{finished_jobs(db)} of {n} pages final after {timeout:.0f}s")
        time.sleep(0.25)


_OWN_REDIS = ("info", "client|setinfo", "hello")  # what reading the counters sends, each one read


def _own(a: Reading, b: Reading) -> int:
    return sum(b.redis[name] - a.redis[name] for name in _OWN_REDIS)


def per_page(a: Reading, b: Reading, pages: int) -> dict[str, float]:
    own = _own(a, b)
    return {"redis": (sum((b.redis - a.redis).values()) - own) / pages, "reads": (b.reads - a.reads - own) / pages,
            "pg": (b.pg - a.pg) / pages, "s3": sum((b.s3 - a.s3).values()) / pages,
            "cpu_ms": (b.cpu - a.cpu) * 1000 / pages}


def with_pg_stat_statements(pg: services.Service) -> str:
    """The server restarted with pg_stat_statements loaded; the maintenance database's DSN."""
    dsn = pg.url.replace("postgresql+psycopg2", "postgresql")
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    conn.cursor().execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    conn.close()
    pg.restart()
    return dsn


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, default=300, help="pages measured")
    p.add_argument("--warm", type=int, default=30, help="pages processed before the counters start")
    p.add_argument("--idle", type=float, default=20.0, help="seconds the idle worker's Redis traffic is counted")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        metrics_port = services.free_port()
        svc = Services(services.start_redis(root / "redis"), services.start_postgres(root / "pg"),
                       services.start_seaweedfs(root / "s3", metrics_port=metrics_port))
        sim = start_sim_engine(root / "sim", shape="h200-hunyuanocr", scheduling_policy="priority",
                               max_model_len=32768)
        try:
            with_pg_stat_statements(svc.postgres)
            config = write_config(svc, root, WORKER__PREPROCESS_PROCESSES="1")
            settings = load_settings(config)
            db = Database(settings.database_url)
            db.upgrade()
            dsn = settings.database_url.replace("postgresql+psycopg2", "postgresql")
            with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
                cur.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            scans = list(stamped_scans(args.warm + args.pages))
            memory = redis.Redis.from_url(svc.redis.url).info("memory")["used_memory"]
            submit(settings, db, scans[:args.warm], 0)  # waiting, no worker yet: Redis memory per waiting page
            queued_bytes = (redis.Redis.from_url(svc.redis.url).info("memory")["used_memory"] - memory) / args.warm
            worker = start_worker(config, root / "worker.log", sim.url)
            try:
                wait_final(db, args.warm, 300)
                time.sleep(2)  # the warm pages' document outputs and acks settle
                before = read(svc, metrics_port, dsn, worker.pid)
                submit(settings, db, scans[args.warm:], args.warm)
                registered = read(svc, metrics_port, dsn, worker.pid)
                wait_final(db, args.warm + args.pages, 60 + args.pages)
                time.sleep(2)
                done = read(svc, metrics_port, dsn, worker.pid)
                time.sleep(args.idle)
                idle = read(svc, metrics_port, dsn, worker.pid)
                failed = finished_jobs(db, "failed")
            finally:
                stop(worker)
        finally:
            sim.stop()
            svc.stop()
    report(args.pages, failed, before, registered, done, idle)
    print(f"Redis memory per waiting page: {queued_bytes:,.0f} bytes ({args.warm} pages queued)")
    return 0


def report(pages: int, failed: int, before: Reading, registered: Reading, done: Reading, idle: Reading) -> None:
    reg, work = per_page(before, registered, pages), per_page(registered, done, pages)
    print(f"{pages} A4 300 dpi scans ({failed} failed), processed in {done.at - registered.at:.1f}s by one worker")
    print(f"{'per page':<28}{'register':>10}{'process':>10}{'total':>10}")
    for key, name in (("redis", "Redis commands"), ("reads", "Redis round trips"), ("pg", "PostgreSQL statements"),
                      ("s3", "S3 requests"), ("cpu_ms", "worker CPU ms")):
        print(f"{name:<28}{reg[key]:>10.1f}{work[key]:>10.1f}{reg[key] + work[key]:>10.1f}")
    print(f"S3 requests by type: {dict((done.s3 - before.s3).most_common())}")
    print("PostgreSQL statements processing a page, most called (per page):")
    for query, n in (done.statements - registered.statements).most_common(12):
        print(f"  {n / pages:5.2f}  {query[:110]}")
    top = (done.redis - before.redis).most_common(8)
    print(f"Redis commands, most called: {', '.join(f'{k} {v / pages:.1f}' for k, v in top)} (per page)")
    grown = done.tables - before.tables
    print(f"database bytes per page: {sum(grown.values()) / pages:,.0f} (before vacuum; "
          f"{', '.join(f'{k} {v / pages:,.0f}' for k, v in grown.most_common(5))})")
    seconds = idle.at - done.at
    quiet = per_page(done, idle, 1)  # the idle interval's totals, the benchmark's own reads left out
    print(f"idle worker: {quiet['redis'] / seconds:.1f} Redis commands/s ({quiet['reads'] / seconds:.1f} round "
          f"trips/s), {quiet['pg'] / seconds:.2f} PostgreSQL statements/s over {seconds:.0f}s")
    print(f"redis_cmds_per_page={reg['redis'] + work['redis']:.1f}")


if __name__ == "__main__":
    raise SystemExit(main())
