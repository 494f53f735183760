"""Interactive latency with 10,000 batch pages queued, divided by interactive latency on an idle system.

The engine is the simulated vLLM server (tests/sim_engine.py, a process of its own) with a real model's
shape by default (``h200-hunyuanocr``: 40 sequences sharing 12,000 tokens/s, ~20 pages/s, each page's answer
its own length, median ~500 tokens, a tail to ~2,000), a waiting queue served by the request's ``priority``
(``--scheduling-policy priority``); ``--fixed``: 16 slots x 0.32 s, every page alike. A real ``paperlane
worker --engine vllm`` (Celery on Redis, Postgres, SeaweedFS S3, its CPU pool) drives it through the
production client, keeping 80 pages at the engine. Interactive pages are submitted one at a time through the
real producer; latency is from the page being queued to its result stored (the job row's enqueued_at ->
finished_at). First on an idle system, then with --backlog batch pages queued ahead of them and a fresh worker
keeping the engine saturated on that backlog (measured: the engine's decode capacity used, or busy share,
while the interactive pages ran is printed). Every page is distinct, so each batch page gets its own answer
length. The interactive pages measured are pages whose answers are within 10% of the median length (~500
tokens), alternately idle and loaded, so that the two medians compare pages of the same length: a page of
2,000 tokens takes four times as long as one of 500 on any engine.

Last line: ``interactive_latency_ratio=<median loaded / median idle>`` (target <= 1.5).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    ENGINE_SHAPE,
    MAX_IN_FLIGHT,
    engine_image_id,
    small_page,
    start_services,
    start_worker,
    stop,
    write_config,
)
from sqlalchemy import func, select

from paperlane.priority.broker import PagePublisher, make_celery
from paperlane.priority.lanes import Lane
from paperlane.producer.input_items import Document
from paperlane.producer.submit import submit_documents
from paperlane.schemas import TaskSpec
from paperlane.settings import load_settings
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.storage.objects import open_store
from paperlane.storage.tables import JobRow
from tests.sim_engine import SimEngine, start_sim_engine
from tests.sim_shape import SHAPES, Behaviour, PageDraw

# Above the max_tokens the client sends (4096) until the client reads max_model_len from /v1/models.
MAX_MODEL_LEN = 32768


class Submitter:
    """Submits pages through the real producer, and times interactive ones to their stored result."""

    def __init__(self, config: Path) -> None:
        settings = load_settings(config)
        self.db = Database(settings.database_url)
        self.db.upgrade()
        self.store = open_store(settings)
        self.publisher = PagePublisher(make_celery(settings))
        self.n = 0
        self.rows: list[JobRow] = []

    def submit(self, count: int, lane: Lane) -> list[str]:
        numbers = range(self.n + 1, self.n + count + 1)
        self.n += count
        return self.submit_pages(numbers, lane)

    def submit_pages(self, numbers: range | list[int], lane: Lane) -> list[str]:
        pages = [Document(source=f"p{n}.jpg", name=f"p{n}", ext=".jpg", data=small_page(n), page_count=1)
                 for n in numbers]
        return [s.job_id for s in submit_documents(pages, db=self.db, store=self.store, spec=TaskSpec(), lane=lane,
                                                   publisher=self.publisher)]

    def latency(self, page: int, timeout: float = 60) -> float:
        """Submit interactive page number ``page``, wait for it; seconds from queued to stored (stages kept)."""
        [job_id] = self.submit_pages([page], Lane.INTERACTIVE)
        deadline = time.monotonic() + timeout
        while (row := jobstore.get_job(self.db, job_id)).status not in ("succeeded", "failed"):
            if time.monotonic() > deadline:
                raise RuntimeError("interactive page not done in time")
            time.sleep(0.005)
        assert row.status == "succeeded", row.error
        self.rows.append(row)
        return (row.finished_at - row.enqueued_at).total_seconds()

    def stages(self) -> str:
        """Median milliseconds per stage over the pages measured since the last call."""
        rows, self.rows = self.rows, []
        per = {"fetch": statistics.median((r.started_at - r.enqueued_at).total_seconds() for r in rows)}
        per |= {k: statistics.median(jobstore.job_timings(r).get(k, 0.0) for r in rows)
                for k in ("queue_wait", "preprocess", "inference", "postprocess", "store")}
        return "  ".join(f"{k}={v * 1000:.0f}" for k, v in per.items()) + " (ms, median)"

    def queued(self) -> int:
        with self.db.session() as s:
            return int(s.scalar(select(func.count()).select_from(JobRow).where(JobRow.status == "queued")) or 0)


def engine_busy(before: dict[str, Any], after: dict[str, Any]) -> str:
    """The engine's use between two stats snapshots (decode capacity, or slot-seconds for the fixed engine),
    and what it had waiting."""
    seconds = after["now"] - before["now"]
    if "decoded_tokens" in after:
        share = (after["decoded_tokens"] - before["decoded_tokens"]) / (after["decode_tokens_per_s"] * seconds)
        what = "decode capacity"
    else:
        share = (after["busy_slot_seconds"] - before["busy_slot_seconds"]) / (after["slots"] * seconds)
        what = "slot-seconds"
    note = "" if share >= 0.9 else " (NOT saturated: the backlog did not keep the engine full)"
    return (f"engine used {share:.2f} of its {what}{note}, {after['completed'] - before['completed']} pages "
            f"done, peak {after['peak_waiting']} requests waiting at the server")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backlog", type=int, default=10_000, help="batch pages queued ahead")
    p.add_argument("--samples", type=int, default=15, help="interactive pages per measurement")
    p.add_argument("--fixed", action="store_true", help="the fixed-latency engine (--slots x --latency)")
    p.add_argument("--slots", type=int, default=16, help="--fixed: the engine's sequences at once")
    p.add_argument("--latency", type=float, default=0.32, help="--fixed: seconds each page holds an engine slot")
    p.add_argument("--shape", default=ENGINE_SHAPE, choices=sorted(SHAPES),
                   help="the engine's shape (tests/sim_shape.py); quarter-h200-hunyuanocr where the CPU side cannot "
                        "keep a whole H200's 40 sequences busy (2 cores)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        svc = start_services(root)
        if args.fixed:
            sim = start_sim_engine(root / "sim", slots=args.slots, latency=args.latency, scheduling_policy="priority",
                                   max_model_len=MAX_MODEL_LEN)
        else:
            sim = start_sim_engine(root / "sim", shape=args.shape, scheduling_policy="priority",
                                   max_model_len=MAX_MODEL_LEN)
        try:
            config = write_config(svc, root, **({} if args.fixed else {"ENGINE__MAX_IN_FLIGHT": str(MAX_IN_FLIGHT)}))
            sub = Submitter(config)
            pages = interactive_pages(2 * (args.samples + 1), fixed=args.fixed, shape_name=args.shape)
            idle, idle_stages = measure_idle(sub, config, sim, root, pages[0::2])
            t0 = time.perf_counter()
            for _ in range(args.backlog // 500):
                sub.submit(500, Lane.BATCH)
            print(f"queued {args.backlog} batch pages in {time.perf_counter() - t0:.0f}s")
            loaded, loaded_stages, busy = measure_loaded(sub, config, sim, root, pages[1::2])
            left = sub.queued()
        finally:
            sim.stop()
            svc.stop()
    mi, ml = statistics.median(idle), statistics.median(loaded)
    print(f"idle:   median {mi * 1000:.0f} ms, max {max(idle) * 1000:.0f} ms over {len(idle)} pages; {idle_stages}")
    print(f"loaded: median {ml * 1000:.0f} ms, max {max(loaded) * 1000:.0f} ms; {loaded_stages}; "
          f"{left} batch pages still queued after")
    print(f"loaded: {busy}")
    print(f"interactive_latency_ratio={ml / mi:.2f}")
    return 0


def interactive_pages(count: int, *, fixed: bool, shape_name: str = ENGINE_SHAPE) -> list[int]:
    """Numbers of ``count`` pages for the interactive lane whose answers on the shaped engine are within 10%
    of its median length (any pages on the fixed engine: every page alike there)."""
    first = 1_000_000  # far from the backlog's numbers
    if fixed:
        return list(range(first, first + count))
    shape = SHAPES[shape_name]
    found: list[int] = []
    for n in range(first, first + 50 * count):
        tokens = PageDraw.of(engine_image_id(small_page(n)), TaskSpec().task, shape, Behaviour()).tokens
        if abs(tokens / shape.median_tokens - 1) <= 0.1:
            found.append(n)
            if len(found) == count:
                return found
    raise RuntimeError(f"only {len(found)} pages of median length among {50 * count}")


def measure_idle(sub: Submitter, config: Path, sim: SimEngine, root: Path,
                 pages: list[int]) -> tuple[list[float], str]:
    worker = start_worker(config, root / "idle.log", sim.url)
    try:
        sub.latency(pages[0])  # warm
        sub.rows.clear()
        idle = [sub.latency(page) for page in pages[1:]]
        return idle, sub.stages()
    finally:
        stop(worker)


def measure_loaded(sub: Submitter, config: Path, sim: SimEngine, root: Path,
                   pages: list[int]) -> tuple[list[float], str, str]:
    done = sim.stats(per_image=False)["completed"]
    worker = start_worker(config, root / "loaded.log", sim.url)
    try:
        # Deep in the backlog: every slot busy, and a few rounds of pages through the engine already.
        before = sim.wait_for(lambda s: s["running"] >= s["slots"] and s["completed"] >= done + 3 * s["slots"],
                              timeout=120)
        loaded = []
        for page in pages[1:]:
            loaded.append(sub.latency(page))
            time.sleep(0.3)  # pacing: one interactive page at a time, the backlog runs in between
        busy = engine_busy(before, sim.stats(per_image=False))
        return loaded, sub.stages(), busy
    finally:
        stop(worker)


if __name__ == "__main__":
    raise SystemExit(main())
