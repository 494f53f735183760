"""A small job behind a huge one: how long tenant B's 300 pages take with fair share, beside today's order (FIFO).

Two real ``paperlane worker --engine vllm`` processes share one simulated vLLM server (tests/sim_engine.py: --slots
sequences at once, --latency seconds each, a waiting queue; 16 x 0.32 s = 50 pages/s), with Redis, PostgreSQL and
SeaweedFS S3. Tenant A's --pages batch pages (receipt-sized JPEGs) are queued first (untimed); the clock starts when
both workers are ready. 10 s later tenant B queues 300 batch pages, then A starts a second ingest of 300. The run
goes on until both small ingests are done, then A alone for another 10 s.

The same run twice: with fair share (the default), then with it off (``PAPERLANE_FAIR_SHARE__ENABLED=false``: the
pages of a lane in the order they were queued), from a fresh database and Redis each time. Workers write only the
JSON of each finished document (``WORKER__OUTPUT_FORMATS=json``: every page here is a document of its own, and the
markdown and PDF would triple the workers' CPU without touching the scheduling measured).

- ``small_job_slowdown``: B's completion time (its first page queued -> its last page stored) over the time its 300
  pages take on half the system: 300 / (A-alone pages/s / 2). A alone is measured in the same run (from 3 s after
  the clock starts until B arrives, and the 10 s after the small ingests are done). Target: at most 1.5.
- ``work_conserving``: all pages/s from B's arrival until both small ingests are done, over A-alone pages/s. Target:
  at least 0.95.
- beside them, B's completion time with fair share off (FIFO), and A's second ingest's in both runs.

Last line: ``small_job_slowdown=<B's completion / 300 pages on half the system>``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import redis
from common import Producer, Services, small_page, start_services, start_worker, stop, write_config
from sqlalchemy import func, select

from paperlane.producer.input_items import Document
from paperlane.producer.submit import SubmittedPage, Submitter
from paperlane.schemas import TaskSpec
from paperlane.status import JobStatus
from paperlane.storage import ingests, status_reads, tenants
from paperlane.storage.tables import JobRow, PageRow
from tests.sim_engine import SimEngine, start_sim_engine

MAX_MODEL_LEN = 32768  # above the max_tokens the client sends until it reads max_model_len from /v1/models
SMALL = 300
ARRIVAL_S = 10.0  # B arrives this long after the clock starts
WARMUP_S = 3.0  # the first seconds of A alone, left out of its rate
TAIL_S = 10.0  # A alone again after the small ingests are done


@dataclass
class Run:
    fair: bool
    b_s: float  # B's first page queued -> its last page stored
    a2_s: float  # A's second ingest, likewise
    alone_rate: float  # pages/s while A ran alone
    during_rate: float  # pages/s from B's arrival until both small ingests were done
    queued_ahead: int  # A's pages not started when B arrived


class Tenants:
    """Submits pages as a tenant's ingests through the real producer, untimed or on the clock."""

    def __init__(self, config: Path) -> None:
        producer = Producer.open(config)
        self.db, self.store, self.publisher = producer.db, producer.store, producer.publisher
        self.ids = {name: tenants.create_key(self.db, tenant=name).tenant_id for name in ("A", "B")}
        self.n = 0

    def submit(self, tenant: str, pages: int, name: str) -> str:
        """Queue ``pages`` new pages as one ingest of ``tenant``; its id."""
        sub = Submitter(db=self.db, store=self.store, spec=TaskSpec(), publisher=self.publisher,
                        owner=ingests.Owner(self.ids[tenant]))
        for item in sub.submit(self._docs(pages), name=name, sources=[name]):
            assert isinstance(item, SubmittedPage)
        return sub.summary.ingest_id

    def _docs(self, pages: int) -> Iterator[Document]:
        for _ in range(pages):
            self.n += 1
            yield Document(source=f"p{self.n}.jpg", name=f"p{self.n}", ext=".jpg", data=small_page(self.n),
                           page_count=1)

    def finished(self, ingest_id: str) -> bool:
        _, progress, _ = status_reads.ingest_progress(self.db, ingest_id)
        return progress.done

    def last_done(self, ingest_id: str) -> float:
        """When the ingest's last page was stored (epoch seconds)."""
        with self.db.session() as s:
            at = s.scalar(select(func.max(JobRow.finished_at)).join(PageRow, PageRow.job_id == JobRow.id)
                          .where(PageRow.ingest_id == ingest_id))
        return _epoch(at)

    def done_between(self, start: float, end: float) -> int:
        """Pages stored in [start, end] (epoch seconds), every tenant's."""
        with self.db.session() as s:
            return int(s.scalar(select(func.count()).select_from(JobRow).where(
                JobRow.finished_at >= _at(start), JobRow.finished_at <= _at(end),
                JobRow.status == JobStatus.SUCCEEDED.value)) or 0)

    def not_started(self) -> int:
        with self.db.session() as s:
            return int(s.scalar(select(func.count()).select_from(JobRow).where(JobRow.started_at.is_(None))) or 0)


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def _epoch(at: datetime | None) -> float:
    assert at is not None
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def run(args: argparse.Namespace, svc: Services, sim: SimEngine, root: Path, *, fair: bool) -> Run:
    redis.Redis.from_url(svc.redis.url).flushall()
    config = write_config(svc, root, FAIR_SHARE__ENABLED=str(fair).lower(), WORKER__OUTPUT_FORMATS="json",
                          WORKER__PREPROCESS_PROCESSES=str(args.processes))
    who = Tenants(config)
    t = time.perf_counter()
    who.submit("A", args.pages, "archive")
    mode = "fair share" if fair else "FIFO"
    print(f"{mode}: queued A's {args.pages} pages in {time.perf_counter() - t:.0f}s (untimed)", flush=True)
    workers = []
    try:
        for i in range(2):
            workers.append(start_worker(config, root / f"worker{i}-{'fair' if fair else 'fifo'}.log", sim.url))
        t0 = time.time()
        time.sleep(max(0.0, t0 + ARRIVAL_S - time.time()))
        arrived, ahead = time.time(), who.not_started()
        b = who.submit("B", SMALL, "small")
        a2_at = time.time()
        a2 = who.submit("A", SMALL, "nightly")
        deadline = time.monotonic() + args.timeout
        while not (who.finished(b) and who.finished(a2)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{mode}: the small ingests were not done in {args.timeout:.0f}s")
            time.sleep(0.5)
        b_done, a2_done = who.last_done(b), who.last_done(a2)
        both = max(b_done, a2_done)
        # A alone again (with fair share only: in arrival order, A's backlog went first and is gone by now).
        tail_end = both + TAIL_S if fair else both
        time.sleep(max(0.0, tail_end - time.time()))
    finally:
        for w in workers:
            stop(w)
    alone_s = (arrived - t0 - WARMUP_S) + (tail_end - both)
    alone = who.done_between(t0 + WARMUP_S, arrived) + who.done_between(both, tail_end)
    return Run(fair, b_done - arrived, a2_done - a2_at, alone / alone_s,
               who.done_between(arrived, both) / (both - arrived), ahead)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, default=20_000, help="tenant A's first ingest (queued before the clock)")
    p.add_argument("--slots", type=int, default=16, help="the engine's sequences at once (vLLM --max-num-seqs)")
    p.add_argument("--latency", type=float, default=0.32, help="seconds each page holds an engine slot")
    p.add_argument("--processes", type=int, default=1, help="each worker's CPU preprocessing processes")
    p.add_argument("--timeout", type=float, default=3600, help="seconds the small ingests may take in one run")
    p.add_argument("--skip-fifo", action="store_true", help="only the fair-share run")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        svc = start_services(root)
        sim = start_sim_engine(root / "sim", slots=args.slots, latency=args.latency, scheduling_policy="priority",
                               max_model_len=MAX_MODEL_LEN)
        try:
            fair = run(args, svc, sim, root, fair=True)
            fifo = None if args.skip_fifo else run(args, svc, sim, root, fair=False)
        finally:
            sim.stop()
            svc.stop()
    report(fair, fifo, engine=args.slots / args.latency)
    return 0


def report(fair: Run, fifo: Run | None, *, engine: float) -> None:
    ideal = SMALL / (fair.alone_rate / 2)
    print(f"engine {engine:.0f} pages/s (simulated); the system with A alone {fair.alone_rate:.1f} pages/s; "
          f"{SMALL} pages on half of that take {ideal:.1f}s")
    for r in (fair, fifo):
        if r is not None:
            mode = "fair share" if r.fair else "FIFO      "
            print(f"{mode}: B's {SMALL} pages done in {r.b_s:.1f}s, A's second ingest in {r.a2_s:.1f}s "
                  f"({r.queued_ahead} of A's pages not started when B arrived); {r.during_rate:.1f} pages/s meanwhile, "
                  f"A alone {r.alone_rate:.1f} pages/s")
    if fifo is not None:
        print(f"small_job_fifo_s={fifo.b_s:.1f}")
    print(f"small_job_fair_s={fair.b_s:.1f}")
    print(f"work_conserving={fair.during_rate / fair.alone_rate:.2f}")
    print(f"small_job_slowdown={fair.b_s / ideal:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
