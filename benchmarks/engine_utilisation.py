"""How much of a GPU engine's speed the whole system delivers: throughput / the engine's own throughput.

A real worker process (Celery on Redis, Postgres, SeaweedFS S3, the CPU preprocessing pool, the
micro-batcher, annotated images, result JSON) runs with a simulated GPU engine (benchmarks/common.py:
a fixed latency per micro-batch and no CPU use), so everything measured is what paperlane adds
around the model. N A4 300 dpi scans are queued first; the clock runs from the worker being ready
to the last page stored. The engine alone would do batch_size / latency pages per second; the
seed deployment delivered 450 of every 650 ms per page (0.69).

Last line: ``engine_utilisation=<system pages/s / engine pages/s>``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import a4_scan, start_services, start_sim_worker, stop, with_comment, write_config
from sqlalchemy import func, select

from paperlane.priority.broker import make_celery
from paperlane.priority.lanes import Lane
from paperlane.producer.inputs import PageInput
from paperlane.producer.submit import CeleryPublisher, submit_pages
from paperlane.schemas import TaskSpec
from paperlane.settings import load_settings
from paperlane.storage.db import Database
from paperlane.storage.objects import open_store
from paperlane.storage.tables import JobRow


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=160)
    p.add_argument("--batch", type=int, default=8, help="pages per micro-batch")
    p.add_argument("--latency", type=float, default=1.6, help="simulated seconds per micro-batch")
    p.add_argument("--processes", type=int, default=2, help="CPU preprocessing processes")
    p.add_argument("--log", help="keep the worker's log here")
    args = p.parse_args()
    engine_rate = args.batch / args.latency
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        svc = start_services(root)
        try:
            config = write_config(svc, root, WORKER__PREPROCESS_PROCESSES=str(args.processes))
            settings = load_settings(config)
            db = Database(settings.database_url)
            db.upgrade()
            scans = [a4_scan(i) for i in range(8)]
            pages = (PageInput(source=f"scan{i}.jpg", name=f"scan{i}", page=1, data=with_comment(scans[i % 8], i),
                               ext=".jpg") for i in range(args.pages))
            t_sub = time.perf_counter()
            ids = [s.job.id for s in submit_pages(pages, db=db, store=open_store(settings), spec=TaskSpec(),
                                                  lane=Lane.BATCH, publisher=CeleryPublisher(make_celery(settings)))]
            print(f"queued {len(ids)} A4 scans in {time.perf_counter() - t_sub:.1f}s")
            worker = start_sim_worker(config, root / "worker.log", latency=args.latency, batch_size=args.batch)
            (root / "keep").write_text(str(root))
            t0 = time.perf_counter()
            t_ready = time.time()
            try:
                while _finished(db) < len(ids):
                    time.sleep(0.2)
                wall = time.perf_counter() - t0
            finally:
                stop(worker)
            failed = _finished(db, status="failed")
            print(*[ln for ln in (root / "worker.log").read_text().splitlines() if "engine ran" in ln], sep="\n")
            if args.log:
                Path(args.log).write_text((root / "worker.log").read_text())
            first, last = _span(db)
            print(f"first page stored after {first - t_ready:.2f}s")
        finally:
            svc.stop()
    rate = len(ids) / wall
    print(f"engine alone: {engine_rate:.2f} pages/s ({args.batch} pages per {args.latency:.2f}s batch)")
    print(f"system:       {rate:.2f} pages/s ({len(ids)} pages in {wall:.1f}s, {failed} failed)")
    print(f"engine_utilisation={rate / engine_rate:.3f}")
    return 0


def _span(db: Database) -> tuple[float, float]:
    with db.session() as s:
        lo, hi = s.execute(select(func.min(JobRow.finished_at), func.max(JobRow.finished_at))).one()
    return lo.timestamp(), hi.timestamp()


def _finished(db: Database, status: str | None = None) -> int:
    with db.session() as s:
        q = select(func.count()).select_from(JobRow)
        q = q.where(JobRow.status == status) if status else q.where(JobRow.status.in_(("succeeded", "failed")))
        return int(s.scalar(q) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
