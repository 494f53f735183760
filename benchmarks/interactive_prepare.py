"""Interactive pages' preparation latency: in the worker's own process (before #17 item 6) vs in a bounded
process of their own (now), side by side in one run.

Each interactive page is submitted to the CPU pool with ``urgent=True`` and timed from the submit to
its ``Prepared`` (fetch from the local store, decode or render, encode, preview), the way the worker
waits for it. "in-process" is the pool with ``worker.preprocess_processes=0`` (a thread of the calling
process, no limits: what interactive pages had before); "bounded" is the pool as a worker builds it
(interactive pages in ``worker.urgent_processes`` processes under the memory and time limits, the
result pickled back through a pipe). Each is measured idle and behind a backlog of batch pages kept
in flight in the pool. Pages alternate between an A4 300 dpi JPEG scan and a text PDF page.

Last line: ``interactive_prepare_ms=<bounded idle median> in_process_ms=<in-process idle median>``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from common import HUNYUAN_SPEC, a4_scan

from paperlane.settings import Settings, WorkerSettings
from paperlane.storage.objects import open_store
from paperlane.workers.cpu_pool import CpuPool
from tests.test_preprocess import pdf_pages


def _latencies(pool: CpuPool, keys: list[str], rounds: int) -> list[float]:
    out = []
    for i in range(rounds):
        t0 = time.perf_counter()
        prepared = pool.submit(keys[i % len(keys)], HUNYUAN_SPEC, urgent=True).result()
        out.append((time.perf_counter() - t0) * 1000)
        assert prepared.page is not None, prepared.error
    return out


def _backlog(pool: CpuPool, keys: list[str], stop: threading.Event, depth: int) -> None:
    """Keep ``depth`` batch pages in flight in the pool until ``stop``."""
    pending = [pool.submit(keys[i % len(keys)], HUNYUAN_SPEC) for i in range(depth)]
    i = depth
    while not stop.is_set():
        pending.pop(0).result()
        pending.append(pool.submit(keys[i % len(keys)], HUNYUAN_SPEC))
        i += 1
    for fut in pending:
        fut.result()


def _measure(urgent: CpuPool, backlog: CpuPool, keys: list[str], rounds: int,
             depth: int) -> tuple[list[float], list[float]]:
    """Interactive latencies through ``urgent``, idle and while ``backlog`` prepares batch pages."""
    _latencies(urgent, keys, len(keys) * 2)  # warm: every process has opened and sized its buffers
    idle = _latencies(urgent, keys, rounds)
    stop = threading.Event()
    feeder = threading.Thread(target=_backlog, args=(backlog, keys, stop, depth))
    feeder.start()
    try:
        busy = _latencies(urgent, keys, rounds)
    finally:
        stop.set()
        feeder.join()
    return idle, busy


def _row(name: str, values: list[float]) -> str:
    values = sorted(values)
    return (f"{name:<22} median {statistics.median(values):7.1f} ms   p90 {values[int(len(values) * 0.9)]:7.1f} ms"
            f"   max {values[-1]:7.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--processes", type=int, default=1, help="batch pool processes (the backlog's)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        settings = Settings(data_dir=data)
        store = open_store(settings)
        keys = []
        for i in range(3):
            keys.append(f"originals/scan{i}.jpg")
            store.put(keys[-1], a4_scan(i))
            keys.append(f"originals/text{i}.pdf")
            store.put(keys[-1], pdf_pages((595, 842), box=(1, 50, 50, 300, 20)))
        # Before: interactive pages on a thread of the worker itself (a pool of 0 processes), the backlog in
        # the process pool. Now: both in the one pool, interactive pages in processes of their own.
        pool = CpuPool(Settings(data_dir=data, worker=WorkerSettings(preprocess_processes=args.processes)),
                       store=store)
        in_process = CpuPool(Settings(data_dir=data, worker=WorkerSettings(preprocess_processes=0)), store=store)
        try:
            depth = 2 * args.processes
            results = {"in-process": _measure(in_process, pool, keys, args.rounds, depth),
                       "bounded": _measure(pool, pool, keys, args.rounds, depth)}
        finally:
            in_process.close()
            pool.close()
        for name, (idle, busy) in results.items():
            print(_row(f"{name} idle", idle))
            print(_row(f"{name} behind backlog", busy))
        print(f"interactive_prepare_ms={statistics.median(results['bounded'][0]):.1f} "
              f"in_process_ms={statistics.median(results['in-process'][0]):.1f}")


if __name__ == "__main__":
    main()
