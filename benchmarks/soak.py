"""Fault-injection soak: 1,000 pages through two workers while a chaos loop breaks things.

Private Redis (with its append-only file, as production runs it), PostgreSQL and SeaweedFS S3, the simulated
vLLM server (tests/sim_engine.py: slots, latency, its own request log), two real ``paperlane worker --engine
vllm`` processes at the shipped defaults (lease, attempts, backoff, visibility timeout: none is changed). The
pages are distinct receipts registered through the real producer. While they are processed, the chaos loop
kill -9s a worker (and starts a new one in its place) --kills times, restarts Redis once, PostgreSQL once and
the S3 server once, at spread-out moments, and stops as soon as every page is final. Then it waits for every
page to be final, up to --deadline seconds from the start.

It prints ``lost=`` (pages not final by the deadline), ``duplicated=`` (engine calls answered beyond one per
page, from the simulated engine's own request log, pages being distinct images; requests cut off when
their worker was killed are printed apart, and each duplicate is put down to what came between its two
answers), and ``final=`` (the share of pages succeeded, or failed with a reason: a failed page without one
counts as not final). What happened on the way is counted from data (the jobs' rows, the engine's log, Redis),
never from log lines. Target: lost=0, final=1.0, duplicated at most 2% of the pages.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common import PAPERLANE, REPO, Services, small_page, stop, write_config
from sqlalchemy import func, select

from paperlane.priority.broker import PagePublisher, make_celery
from paperlane.priority.lanes import Lane
from paperlane.producer.input_items import Document
from paperlane.producer.submit import submit_documents
from paperlane.schemas import TaskSpec
from paperlane.settings import load_settings
from paperlane.storage.db import Database
from paperlane.storage.objects import open_store
from paperlane.storage.tables import JobRow
from tests import services
from tests.sim_engine import start_sim_engine


def start_worker(config: Path, log: Path, engine_url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*PAPERLANE, "--config", str(config), "worker", "--engine", "vllm", "--engine-url",
                             engine_url], cwd=REPO, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def counts(db: Database) -> Counter[str]:
    """Jobs by status, and failed ones without a reason."""
    try:
        with db.session() as s:
            found = Counter(dict(s.execute(select(JobRow.status, func.count()).group_by(JobRow.status)).all()))
            found["failed without a reason"] = int(s.scalar(select(func.count()).where(
                JobRow.status == "failed", func.coalesce(JobRow.error, "") == "")) or 0)
            return found
    except Exception:  # the database is being restarted
        return Counter()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, default=1000)
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--latency", type=float, default=0.3, help="seconds per page in the simulated engine")
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--deadline", type=float, default=900, help="seconds from the start for every page to be final")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        svc = Services(services.start_redis(root / "redis", durable=True), services.start_postgres(root / "pg"),
                       services.start_seaweedfs(root / "s3"))
        sim = start_sim_engine(root / "sim", slots=args.slots, latency=args.latency, scheduling_policy="priority",
                               max_model_len=32768)
        workers: list[subprocess.Popen[bytes]] = []
        events: list[tuple[float, str]] = []  # (epoch seconds, what the chaos loop did)
        try:
            config = write_config(svc, root)
            settings = load_settings(config)
            db = Database(settings.database_url)
            db.upgrade()
            # Distinct pixels: the simulated engine counts its calls per image.
            docs = [Document(source=f"r{i}.jpg", name=f"r{i}", ext=".jpg", data=small_page(i), page_count=1)
                    for i in range(args.pages)]
            submit_documents(docs, db=db, store=open_store(settings), spec=TaskSpec(), lane=Lane.BATCH,
                             publisher=PagePublisher(make_celery(settings)))
            t0 = time.monotonic()
            workers = [start_worker(config, root / f"w{i}.log", sim.url) for i in range(2)]
            svc = chaos(svc, workers, config, root, sim.url, db, args, rng, t0, events)
            shown = time.monotonic()
            while time.monotonic() - t0 < args.deadline and final_count(db) < args.pages:
                if time.monotonic() - shown > 30:
                    shown = time.monotonic()
                    print(f"t={shown - t0:5.1f}s  {dict(counts(db))}", flush=True)
                time.sleep(1)
            took = time.monotonic() - t0
            if final_count(db) < args.pages:
                diagnose(db, settings.redis.url)
            with db.session() as s:
                rows = s.execute(select(JobRow.status, JobRow.error, JobRow.attempts)).all()
            calls = sim.requests()
        finally:
            for w in workers:
                stop(w)
            sim.stop()
            svc.stop()
    report(args, rows, calls, events, took)
    return 0


def final_count(db: Database) -> int:
    """Pages final for good: succeeded, or failed with a reason."""
    c = counts(db)
    return c["succeeded"] + c["failed"] - c["failed without a reason"]


def report(args: argparse.Namespace, rows: list[Any], calls: list[dict[str, Any]], events: list[tuple[float, str]],
           took: float) -> None:
    status = Counter(r.status for r in rows)
    reasonless = sum(1 for r in rows if r.status == "failed" and not r.error)
    done = status["succeeded"] + status["failed"] - reasonless
    reasons = Counter(r.error for r in rows if r.status == "failed" and r.error)
    attempts = Counter(min(r.attempts, 3) for r in rows)
    # An engine call is one the engine answered; a request cut off by its worker's death is counted apart
    # (started: it had a slot; waiting: it never ran). Pages are distinct images.
    answered: dict[str, list[dict[str, Any]]] = {}
    for c in calls:
        if c["status"] == 200:
            answered.setdefault(c["image"], []).append(c)
    cut_running = sum(1 for c in calls if c["status"] == 499 and c["start"] is not None)
    cut_waiting = sum(1 for c in calls if c["status"] == 499 and c["start"] is None)
    duplicated = sum(len(a) - 1 for a in answered.values())
    print(f"{args.pages} pages, {sum(e == 'kill' for _, e in events)} worker kills, "
          f"{', '.join(e for _, e in events if e != 'kill') or 'no service'} restarted: {status['succeeded']} "
          f"succeeded, {status['failed']} failed ({reasonless} without a reason), {args.pages - done} not final, "
          f"in {took:.0f}s")
    for reason, n in reasons.most_common(5):
        print(f"  failed: {n} x {reason}")
    print("pages by attempts: " + ", ".join(f"{n} {'3 or more' if a == 3 else a}" for a, n in sorted(attempts.items())))
    print(f"engine calls answered: {sum(map(len, answered.values()))} for {len(answered)} distinct pages; cut off "
          f"by worker kills: {cut_running} while running, {cut_waiting} while waiting for a slot")
    causes = Counter(_cause(a, events) for a in answered.values() if len(a) > 1 for _ in a[1:])
    for cause, n in causes.most_common():
        print(f"  duplicated: {n} x {cause}")
    print(f"lost={args.pages - done}")
    print(f"duplicated={duplicated} ({duplicated / args.pages:.1%})")
    print(f"final={done / args.pages:.3f}")


def _cause(answers: list[dict[str, Any]], events: list[tuple[float, str]]) -> str:
    """What came between a page's first answer and the request for its second: the chaos events in between."""
    first, second = sorted(answers, key=lambda c: c["end"])[:2]
    between = sorted({e for at, e in events if first["end"] - 0.5 <= at <= second["arrival"]})
    return (" and ".join(between) + " between the two answers") if between else "nothing the chaos did in between"


def diagnose(db: Database, redis_url: str) -> None:
    """Where each page that is not final stands: its row, and any trace of it in Redis."""
    import redis

    client = redis.Redis.from_url(redis_url)
    blobs = [(key.decode(), v) for key in client.scan_iter("*") for v in _values(client, key)]
    with db.session() as s:
        rows = s.scalars(select(JobRow).where(JobRow.status.not_in(["succeeded", "failed"]))).all()
    for r in rows[:10]:
        where = sorted({key for key, v in blobs if r.id.encode() in v})
        print(f"  not final: {r.id} status={r.status} attempts={r.attempts} enqueued_at={r.enqueued_at} "
              f"worker={r.worker} lease_until={r.lease_until} error={r.error!r} redis={where}")


def _values(client: Any, key: bytes) -> list[bytes]:
    kind = client.type(key)
    if kind == b"list":
        return list(client.lrange(key, 0, -1))
    if kind == b"hash":
        return [k + b" " + v for k, v in client.hgetall(key).items()]
    if kind == b"zset":
        return list(client.zrange(key, 0, -1))
    if kind == b"set":
        return list(client.smembers(key))
    if kind == b"string":
        return [client.get(key) or b""]
    return []


def chaos(svc: Services, workers: list[subprocess.Popen[bytes]], config: Path, root: Path, engine_url: str,
          db: Database, args: argparse.Namespace, rng: random.Random, t0: float,
          done: list[tuple[float, str]]) -> Services:
    """Kill a worker ``args.kills`` times and restart each service once, while pages remain; the services now.
    What it did, and when, goes into ``done``."""
    events = ["kill"] * args.kills + ["redis", "postgres", "s3"]
    rng.shuffle(events)
    for n, event in enumerate(events):
        time.sleep(rng.uniform(1.0, 3.0))
        left = args.pages - final_count(db)
        if left <= 0:
            print(f"t={time.monotonic() - t0:5.1f}s  every page is final: chaos stops after {n} of {len(events)}")
            break
        print(f"t={time.monotonic() - t0:5.1f}s  {left:4d} pages left  chaos {n + 1}/{len(events)}: {event}",
              flush=True)
        done.append((time.time(), event))
        if event == "kill":
            i = rng.randrange(len(workers))
            os.killpg(workers[i].pid, signal.SIGKILL)
            workers[i].wait()
            workers[i] = start_worker(config, root / f"w{i}.log", engine_url)
        elif event == "redis":
            svc.redis.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]  # saves its append-only file
            svc.redis.proc.wait(timeout=30)  # type: ignore[union-attr]
            time.sleep(1)
            svc = Services(services.start_redis(root / "redis", durable=True, ports_from=svc.redis), svc.postgres,
                           svc.s3)
        elif event == "postgres":
            svc.postgres.restart()
        else:
            svc.s3.stop()  # SIGTERM, then SIGKILL if it lingers; its data stays
            time.sleep(1)
            svc = Services(svc.redis, svc.postgres, services.start_seaweedfs(root / "s3", ports_from=svc.s3))
    return svc


if __name__ == "__main__":
    raise SystemExit(main())
