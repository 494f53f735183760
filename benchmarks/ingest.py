"""Bulk ingest speed and memory: ``paperlane submit`` into real Redis, PostgreSQL and SeaweedFS S3.

Part 1 (speed): a folder of --pages small receipt-sized JPEGs (distinct bytes each) is submitted by a
real ``paperlane submit`` process; the clock runs from its start to its exit (imports, migrations
check and connecting included). Every page must end registered as a job with a published message:
the benchmark counts the rows and the Redis messages afterwards. The database is migrated before the clock
starts (the time is printed), as a bulk ingest finds it: migrating an empty one is the first command's, once
(``--fresh-database``: the submit migrates it inside the clock, as this benchmark's figures before 2026-12-07 were
measured).

Part 2 (memory, --tar-mb N): a tar of N MB made of A4-sized members (random bytes behind a JPEG
header: the producer stores originals, it does not decode them) is submitted the same way, and the
peak RSS of the submit process is printed beside the archive's size.

Round trips: the submit's SQL statements per page, from ``pg_stat_statements`` (loaded into the private PostgreSQL
before the run: an execution of a multi-row statement is one), and its Redis commands per page, from Redis's
``INFO commandstats`` before and after (a script is one EVALSHA; the commands it runs inside are counted too, apart),
and its round trips to Redis per page (``total_reads_processed``: the reads Redis served, a pipeline's one or few).

Last lines: ``ingest_pages_per_s=`` (target >= 1000) and, with --tar-mb, ``ingest_tar_peak_rss_mb=``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tarfile
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import psycopg2.extensions
import redis as redis_lib
from common import PAPERLANE, Services, redis_calls, small_page, start_services, with_comment, write_config
from sqlalchemy import func, select

from paperlane.priority import fair
from paperlane.priority.keyspace import with_prefix
from paperlane.priority.lanes import Lane, broker_keys
from paperlane.settings import Settings, load_settings
from paperlane.storage.db import Database
from paperlane.storage.tables import JobRow, PageRow


def _folder(root: Path, pages: int) -> Path:
    folder = root / "pages"
    folder.mkdir()
    base = small_page(0)
    for i in range(pages):
        sub = folder / f"{i // 1000:03d}"
        sub.mkdir(exist_ok=True)
        (sub / f"r{i:06d}.jpg").write_bytes(with_comment(base, i))
    return folder


def _tar(root: Path, mb: int) -> Path:
    path = root / "big.tar"
    member = 8 << 20
    with tarfile.open(path, "w") as tar:
        for i in range(max(1, (mb << 20) // member)):
            data = b"\xff\xd8\xff\xe0" + os.urandom(member - 6) + b"\xff\xd9"
            info = tarfile.TarInfo(f"scans/s{i:05d}.jpg")
            info.size = len(data)
            tar.addfile(info, fileobj=_Bytes(data))
    return path


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.pos + n
        out, self.pos = self.data[self.pos:end], min(end, len(self.data))
        return out


# Runs the command and prints its peak RSS (kB) and its CPU seconds (user + system) last on stderr: a process of its
# own, so that the figures are that command's and not those of every child this benchmark started.
_PEAK = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
         "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
         "print(u.ru_maxrss, u.ru_utime + u.ru_stime, file=sys.stderr); sys.exit(rc)")


@dataclass
class Run:
    seconds: float  # wall clock, from its start to its exit
    cpu_s: float  # CPU time of the submit process (user + system): less at the mercy of the machine's load
    rss_kb: int  # peak RSS
    said: str  # its stderr


def _submit(config: Path, path: Path, *, profile: Path | None = None) -> Run:
    """One ``paperlane submit`` process (``profile``: recorded by py-spy there, its raw format, which slows it)."""
    spy = [str(Path(PAPERLANE[0]).with_name("py-spy")), "record", "-f", "raw", "-o", str(profile), "--"] if profile else []
    t0 = time.perf_counter()
    proc = subprocess.run([PAPERLANE[0], "-c", _PEAK, *spy, *PAPERLANE, "--config", str(config), "submit", str(path)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"submit failed:\n{proc.stderr[-3000:]}")
    said, _, last = proc.stderr.strip().rpartition("\n")
    peak, cpu = last.split()
    return Run(seconds, float(cpu), int(peak), said)


def _statements(svc: Services) -> psycopg2.extensions.connection:
    """PostgreSQL with ``pg_stat_statements`` loaded (a restart), and a connection that reads it."""
    admin = _admin(svc)
    admin.cursor().execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    admin.close()
    svc.postgres.restart()
    admin = _admin(svc)
    admin.cursor().execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return admin


def _admin(svc: Services) -> psycopg2.extensions.connection:
    conn = psycopg2.connect(svc.postgres.url.replace("postgresql+psycopg2", "postgresql"))
    conn.autocommit = True
    return conn


def _sql_calls(admin: psycopg2.extensions.connection, database: str) -> Counter[str]:
    """Executions of each statement in ``database`` since the last reset, by the statement's first words."""
    cur = admin.cursor()
    cur.execute("SELECT query, calls FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
                "WHERE d.datname = %s", (database,))
    calls: Counter[str] = Counter()
    for query, n in cur.fetchall():
        calls[" ".join(query.split()[:4])[:60]] += n
    return calls


def _messages(settings: Settings) -> int:
    """Batch messages in Redis: on the lane's buffer lists and waiting by fair share behind them."""
    client = with_prefix(redis_lib.Redis.from_url(settings.redis.url), settings.redis.key_prefix)
    with client.pipeline(transaction=False) as pipe:
        for key in broker_keys(Lane.BATCH):
            pipe.llen(key)
        fair.held(pipe, Lane.BATCH)
        return sum(fair.count(n) for n in pipe.execute())


def _per_page(what: str, calls: Counter[str], pages: int) -> None:
    top = ", ".join(f"{name} {n}" for name, n in calls.most_common(6))
    print(f"{what} per page {sum(calls.values()) / pages:.3f} ({sum(calls.values())} in all; most: {top})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=10_000)
    ap.add_argument("--profile", type=Path, help="record the submit with py-spy into this file (raw format)")
    ap.add_argument("--tar-mb", type=int, default=0, help="also submit a tar of this many MB and report peak RSS")
    ap.add_argument("--fresh-database", action="store_true",
                    help="leave the database empty: the submit migrates it inside the clock")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        svc = start_services(root)
        try:
            config = write_config(svc, root)
            settings = load_settings(config)
            db = Database(settings.database_url)
            if not args.fresh_database:
                t0 = time.perf_counter()
                db.upgrade()
                print(f"database migrated before the clock in {time.perf_counter() - t0:.2f}s")
            folder = _folder(root, args.pages)
            admin = _statements(svc)
            database = settings.database_url.rsplit("/", 1)[1]
            r = redis_lib.Redis.from_url(settings.redis.url)
            admin.cursor().execute("SELECT pg_stat_statements_reset()")
            redis_before = redis_calls(r)
            run = _submit(config, folder, profile=args.profile)
            sql, rcmds = _sql_calls(admin, database), redis_calls(r) - redis_before
            with db.session() as s:
                jobs = s.scalar(select(func.count()).select_from(JobRow).where(JobRow.enqueued_at.is_not(None)))
                pages = s.scalar(select(func.count()).select_from(PageRow))
            messages = _messages(settings)
            print(run.said.splitlines()[-1])
            print(f"{args.pages} pages in {run.seconds:.1f}s: {pages} pages and {jobs} published jobs in PostgreSQL, "
                  f"{messages} messages in Redis; peak RSS {run.rss_kb / 1024:.0f} MB; submit CPU "
                  f"{run.cpu_s:.1f}s, {run.cpu_s * 1000 / args.pages:.2f} ms a page")
            _per_page("SQL statements", sql, args.pages)
            reads = rcmds.pop("reads", 0)
            _per_page("Redis commands", rcmds, args.pages)
            print(f"Redis round trips per page {reads / args.pages:.3f} ({reads} reads served, INFO stats)")
            if not (pages == jobs == messages == args.pages):
                raise SystemExit("not every page was registered and published")
            if args.tar_mb:
                tar = _tar(root, args.tar_mb)
                t_run = _submit(config, tar)
                print(t_run.said.splitlines()[-1])
                print(f"tar of {tar.stat().st_size >> 20} MB in {t_run.seconds:.1f}s, peak RSS {t_run.rss_kb / 1024:.0f} MB")
            print(f"ingest_pages_per_s={args.pages / run.seconds:.0f}")
            if args.tar_mb:
                print(f"ingest_tar_peak_rss_mb={t_run.rss_kb / 1024:.0f}")
        finally:
            svc.stop()


if __name__ == "__main__":
    main()
