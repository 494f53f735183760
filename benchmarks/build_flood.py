"""One tenant's flood of archive-format builds against another tenant's reads, side by side (issue 25).

A real ``paperlane api`` process on private Redis, PostgreSQL and SeaweedFS S3, at the shipped defaults (``--budget``
changes api.build_pages_per_minute): past its key's rate (api.rate_per_minute) the flood is refused by count too. Tenant ``flood`` owns ``--documents``
documents of ``--pages`` pages whose results are stored (45 lines a page, as a dense scan reads); tenant
``reader`` owns one. The reader's status reads (GET /v1/documents/{id}, one at a time) are timed idle, then while
``--threads`` clients of the flood ask for every document in ALTO, hOCR and METS over and over: each format of a
version of a document is built once (its pages spent from api.build_pages_per_minute) and read back after, and
past the budget a build is refused with 429. The clock starts at the request's first byte; setting up the
documents is left out. As a control, the reads are also timed under a flood of as many clients of a third tenant
reading one of its documents' status over and over: what a flood of the cheapest requests costs the reader (held
by the per-key and per-tenant request rates, not by the build budget).

The flood's clients run in a process of their own (threads in it), so that the reader's client shares no
interpreter with them: what is timed is the API. Each phase prints the API process's own CPU and the flood's
clients' (seconds of CPU per second; the API's build processes are in neither): on a small host the clients take
CPU from the API too.

Last line: ``... flood_over_idle=<p50 under the build flood / p50 idle>`` (target <= 2).

``--compare`` runs it twice, each on an API process, database and bucket of its own on the same services: the
fair-turn gate (``producer.api.turns``) wide open (its limits huge: every request in at once, as before it) and at
its defaults, one after the other (``--gate-first`` swaps the order; ``--rounds N`` runs N pairs, the order swapped
each round), and prints each run's table and both ratios per run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from common import start_services, write_config

from paperlane.bounded import process_cpu_seconds
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
_HUGE = str(1_000_000)
WIDE_OPEN = {"API__CONCURRENT_REQUESTS": _HUGE, "API__TENANT_CONCURRENT_REQUESTS": _HUGE,
             "API__TENANT_QUEUED_REQUESTS": _HUGE}  # --compare: every request let in at once, as before the gate


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


def _flood(url: str, key: str, documents: list[str], stop_at: Any, seen: Counter[int], *, builds: bool) -> None:
    """One client of the flood: every document in every format (``builds``), or its status, over and over."""
    paths = ([(f"/v1/documents/{d}/result", {"format": fmt}) for d in documents for fmt in FORMATS] if builds
             else [(f"/v1/documents/{d}", {}) for d in documents])
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client:
        while not stop_at.is_set():
            for path, params in paths:
                seen[client.get(path, params=params).status_code] += 1
                if stop_at.is_set():
                    return


def _flood_process(url: str, key: str, documents: list[str], threads: int, builds: bool, started: Any,
                   stop_at: Any, answers: Any) -> None:
    """The flood's clients, on threads of this process; their answers' statuses go back on ``answers``."""
    seen = Counter[int]()
    clients = [threading.Thread(target=_flood, args=(url, key, documents, stop_at, seen), kwargs={"builds": builds})
               for _ in range(threads)]
    for t in clients:
        t.start()
    started.set()
    for t in clients:
        t.join()
    answers.put(dict(seen))


def _under_flood(server: ApiProcess, reader: tuple[str, str], flood: tuple[str, list[str]], *, threads: int,
                 samples: int, builds: bool) -> tuple[list[float], dict[int, int], float, float]:
    """The reader's read times while a flood runs in a process of its own, the flood's answers, and the API's and
    the flood's clients' CPU (seconds a second) meanwhile."""
    ctx = multiprocessing.get_context("fork")
    started, stop_at, answers = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_flood_process, args=(server.url, *flood, threads, builds, started, stop_at, answers))
    proc.start()
    started.wait(60)
    time.sleep(0.5)  # the flood under way before the first timed read
    assert proc.pid is not None
    cpu0, client0, t0 = process_cpu_seconds(server.proc.pid), process_cpu_seconds(proc.pid), time.monotonic()
    busy = _reads(server.url, *reader, samples)
    took = time.monotonic() - t0
    cpu, client = process_cpu_seconds(server.proc.pid) - cpu0, process_cpu_seconds(proc.pid) - client0
    stop_at.set()
    seen = answers.get(timeout=300)
    proc.join()
    return busy, seen, cpu / took, client / took


@dataclass
class Run:
    """One API's phases: the reader's read times (ms) idle, under the status-read flood and under the build flood,
    the API's and the flood clients' CPU (seconds a second) in each, and the floods' answers by status."""

    idle: list[float]
    reads: list[float]
    busy: list[float]
    cpu: tuple[float, float, float]
    clients: tuple[float, float]
    read_seen: dict[int, int]
    seen: dict[int, int]


def _run(svc: Any, root: Path, args: argparse.Namespace, overrides: dict[str, str]) -> Run:
    """The three phases against an API of its own (its own database, bucket, tenants and documents: nothing built
    by another run is read back here) under the settings ``overrides``."""
    budget = {"API__BUILD_PAGES_PER_MINUTE": str(args.budget)} if args.budget else {}
    config = write_config(svc, root, **budget, **overrides)
    Database(load_settings(config).database_url).upgrade()
    server = ApiProcess(config, root / f"api-{config.stem}.log").wait_ready()
    try:
        flood_docs = _documents(config, "flood", count=args.documents, pages=args.pages)
        reader_doc = _documents(config, "reader", count=1, pages=1)[0]
        db = Database(load_settings(config).database_url)
        flood_key = tenants.create_key(db, tenant="flood").key
        reader_key = tenants.create_key(db, tenant="reader").key
        _reads(server.url, reader_key, reader_doc, 20)  # warm up
        cpu0, t0 = process_cpu_seconds(server.proc.pid), time.monotonic()
        idle = _reads(server.url, reader_key, reader_doc, args.samples)
        idle_cpu = (process_cpu_seconds(server.proc.pid) - cpu0) / (time.monotonic() - t0)

        def reader() -> tuple[str, str]:  # a key of its own each phase: within api.rate_per_minute
            return tenants.create_key(db, tenant="reader").key, reader_doc
        crowd = (tenants.create_key(db, tenant="crowd").key, _documents(config, "crowd", count=1, pages=1))
        reads, read_seen, reads_cpu, reads_clients = _under_flood(server, reader(), crowd, threads=args.threads,
                                                                  samples=args.samples, builds=False)
        busy, seen, busy_cpu, busy_clients = _under_flood(server, reader(), (flood_key, flood_docs),
                                                          threads=args.threads, samples=args.samples, builds=True)
        db.dispose()
    finally:
        server.stop()
    return Run(idle, reads, busy, (idle_cpu, reads_cpu, busy_cpu), (reads_clients, busy_clients), read_seen, seen)


def _report(label: str, run: Run, args: argparse.Namespace) -> None:
    print(f"{label + ': reader GET /v1/documents/{id}':44} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} "
          f"{'API CPU/s':>10} {'flood clients CPU/s':>20}")
    for phase, took, cpu, clients in (
            ("idle", run.idle, run.cpu[0], 0.0),
            (f"flood of {args.threads} status readers", run.reads, run.cpu[1], run.clients[0]),
            (f"flood of {args.threads} builders", run.busy, run.cpu[2], run.clients[1])):
        print(f"  {phase:42} {statistics.median(took):8.1f} {pct(took, 0.95):8.1f} {max(took):8.1f} {cpu:10.2f} "
              f"{clients:20.2f}")
    print(f"  status-read flood answers: {dict(sorted(run.read_seen.items()))}")
    print(f"  build flood answers: {dict(sorted(run.seen.items()))} ({args.documents} documents of {args.pages} "
          f"pages x {len(FORMATS)} formats; api.build_pages_per_minute={args.budget or 'default'})")


def _ratios(run: Run) -> str:
    idle = statistics.median(run.idle)
    return (f"reads_flood_over_idle={statistics.median(run.reads) / idle:.2f} "
            f"flood_over_idle={statistics.median(run.busy) / idle:.2f}")  # flood_over_idle last: the headline


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--documents", type=int, default=8)
    p.add_argument("--pages", type=int, default=200)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--budget", type=int, default=None, help="api.build_pages_per_minute (default: the setting's)")
    p.add_argument("--compare", action="store_true", help="the fair-turn gate wide open and at its defaults, side "
                   "by side (an API each, one after the other)")
    p.add_argument("--gate-first", action="store_true", help="--compare: the gate at its defaults first")
    p.add_argument("--rounds", type=int, default=1, help="--compare: pairs of runs, the order swapped each round")
    p.add_argument("--set", action="append", default=[], metavar="SECTION__NAME=VALUE",
                   help="a setting for the gated run instead of its default, e.g. API__TENANT_CONCURRENT_REQUESTS=1 "
                        "(repeatable)")
    args = p.parse_args()
    gated = dict(item.split("=", 1) for item in args.set)
    label = "gate at " + (", ".join(f"{k.lower()}={v}" for k, v in gated.items()) if gated else "defaults")
    variants = [("gate wide open", WIDE_OPEN), (label, gated)] if args.compare else [(label, gated)]
    if args.gate_first:
        variants.reverse()
    runs: list[tuple[str, Run]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        svc = start_services(root)
        try:
            for n in range(args.rounds if args.compare else 1):
                for label, overrides in (variants if n % 2 == 0 else variants[::-1]):
                    runs.append((f"{label} (round {n + 1})" if args.compare else label,
                                 _run(svc, root, args, overrides)))
        finally:
            svc.stop()
    for label, run in runs:
        _report(label, run, args)
    for label, run in runs:
        print(f"{label + ': ' if args.compare else ''}{_ratios(run)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
