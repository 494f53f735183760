"""Interactive latency with 10,000 batch pages queued, divided by interactive latency on an idle system.

A real worker process (Celery on Redis, Postgres, SeaweedFS S3, CPU pool, micro-batcher, lane
governor) runs with a simulated GPU engine standing in for a vLLM server with continuous batching
(benchmarks/common.py: a fixed latency per micro-batch, several batches in flight, no CPU use).
Interactive pages are submitted one at a time through the real producer; latency is from the page
being queued to its result stored (the job row's enqueued_at -> finished_at). First on an idle
worker, then with --backlog batch pages queued ahead of them and the worker busy on that backlog.

Last line: ``interactive_latency_ratio=<median loaded / median idle>`` (target <= 1.5).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import small_page, start_services, start_sim_worker, stop, with_comment, write_config
from sqlalchemy import func, select

from paperlane.priority.broker import make_celery
from paperlane.priority.lanes import Lane
from paperlane.producer.inputs import PageInput
from paperlane.producer.submit import CeleryPublisher, submit_pages
from paperlane.schemas import TaskSpec
from paperlane.settings import load_settings
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.storage.objects import open_store
from paperlane.storage.tables import JobRow


class Submitter:
    def __init__(self, config: Path) -> None:
        settings = load_settings(config)
        self.db = Database(settings.database_url)
        self.db.upgrade()
        self.store = open_store(settings)
        self.publisher = CeleryPublisher(make_celery(settings))
        self.page = small_page(0)
        self.n = 0
        self.rows: list[JobRow] = []

    def submit(self, count: int, lane: Lane) -> list[str]:
        pages = []
        for _ in range(count):
            self.n += 1
            pages.append(PageInput(source=f"p{self.n}.jpg", name=f"p{self.n}", page=1,
                                   data=with_comment(self.page, self.n), ext=".jpg"))
        return [s.job.id for s in submit_pages(pages, db=self.db, store=self.store, spec=TaskSpec(), lane=lane,
                                               publisher=self.publisher, publish_every=500)]

    def latency(self, timeout: float = 60) -> float:
        """Submit one interactive page, wait for it; seconds from queued to stored (stages kept)."""
        [job_id] = self.submit(1, Lane.INTERACTIVE)
        deadline = time.monotonic() + timeout
        while (row := jobstore.get_job(self.db, job_id)).status not in ("succeeded", "failed"):
            if time.monotonic() > deadline:
                raise RuntimeError("interactive page not done in time")
            time.sleep(0.005)
        assert row.status == "succeeded", row.error
        self.rows.append(row)
        return (row.finished_at - row.enqueued_at).total_seconds()

    def stages(self) -> str:
        """Median seconds per stage over the pages measured since the last call."""
        rows, self.rows = self.rows, []
        per = {"fetch": statistics.median((r.started_at - r.enqueued_at).total_seconds() for r in rows)}
        per |= {k: statistics.median(jobstore.job_timings(r).get(k, 0.0) for r in rows)
                for k in ("queue_wait", "preprocess", "inference", "postprocess", "store")}
        return "  ".join(f"{k}={v * 1000:.0f}" for k, v in per.items()) + " (ms, median)"

    def queued(self) -> int:
        with self.db.session() as s:
            return int(s.scalar(select(func.count()).select_from(JobRow).where(JobRow.status == "queued")) or 0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backlog", type=int, default=10_000, help="batch pages queued ahead")
    p.add_argument("--samples", type=int, default=15, help="interactive pages per measurement")
    p.add_argument("--latency", type=float, default=0.5, help="simulated seconds per micro-batch")
    args = p.parse_args()
    engine = {"latency": args.latency, "batch_size": 8, "batches_in_flight": 4}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        svc = start_services(root)
        try:
            config = write_config(svc, root)
            sub = Submitter(config)
            worker = start_sim_worker(config, root / "idle.log", **engine)
            try:
                sub.latency()  # warm
                sub.rows.clear()
                idle = [sub.latency() for _ in range(args.samples)]
                idle_stages = sub.stages()
            finally:
                stop(worker)
            t0 = time.perf_counter()
            for _ in range(args.backlog // 500):
                sub.submit(500, Lane.BATCH)
            print(f"queued {args.backlog} batch pages in {time.perf_counter() - t0:.0f}s")
            worker = start_sim_worker(config, root / "loaded.log", **engine)
            try:
                time.sleep(3)  # the worker is deep in the backlog
                loaded = []
                for _ in range(args.samples):
                    loaded.append(sub.latency())
                    time.sleep(0.3)
                left = sub.queued()
                loaded_stages = sub.stages()
            finally:
                stop(worker)
        finally:
            svc.stop()
    mi, ml = statistics.median(idle), statistics.median(loaded)
    print(f"idle:   median {mi * 1000:.0f} ms, max {max(idle) * 1000:.0f} ms over {len(idle)} pages; {idle_stages}")
    print(f"loaded: median {ml * 1000:.0f} ms, max {max(loaded) * 1000:.0f} ms; {loaded_stages}; "
          f"{left} batch pages still queued after")
    print(f"interactive_latency_ratio={ml / mi:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
