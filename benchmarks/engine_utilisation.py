"""How much of a GPU engine's capacity the whole system uses: decode capacity used, and pages/s over the engine's.

The engine is the simulated vLLM server (tests/sim_engine.py, a process of its own) with a real model's shape
by default (``h200-hunyuanocr``: 40 sequences sharing a decode ceiling of 12,000 tokens/s, each page's answer its
own length, median ~500 tokens: ~20 pages/s when saturated). paperlane drives it through the production
``--engine vllm`` client, streaming every answer through the loop guard, so base64, JSON, HTTP, server-sent
events and answer parsing are inside the measurement, as are preprocessing, post-processing, rendering and
storing. Every scan is distinct (its number stamped on it), so each gets its own answer length. ``--fixed``: the
older engine, --slots sequences at once, --latency seconds each (16 x 0.32 s = 50 pages/s).

The engine's decode capacity used is the tokens it decoded over its ceiling x time, from its first request to
the moment the last page reached it (while paperlane had pages left to give it: after that the engine only
drains, at falling occupancy, whatever the client does); the same over the whole run to the last answer is
printed beside it.

Default: a real ``paperlane worker`` (Celery on Redis, Postgres, SeaweedFS S3, its CPU pool), all
services on this machine. --pages A4 300 dpi scans are queued first (untimed); the clock runs from
the worker being ready to the last page stored. CPU is the worker's process group (the worker and
its pools) over the same window: everything spent outside the engine, from fetching the original
to the stored result (target: 40 ms per page).

--outputs-apart: the worker as deploy/k8s runs it, with ``worker.write_outputs`` false, and ``paperlane outputs``
beside it (a process group of its own) writing the documents' outputs; the worker's figures leave them out, and
the outputs service's CPU per page is printed apart, measured until the last document's outputs are written.

Where the machine's CPU went (the worker path): the window's busy time per page, split over the worker's process
group, the outputs service, the sim server, SeaweedFS, PostgreSQL, Redis, this benchmark and any other process,
from /proc: every part shares the same cores, so this says how much of them paperlane has to itself.

--embedded: the same scans in a folder, processed by ``paperlane run DIR --engine vllm`` on the
embedded stack (SQLite and a local folder, no services). The throughput clock runs from the first
request the engine sees to the last page's result written to --out: the run's start-up (imports, the
pool's processes, the database) and its exit are one-time costs that say nothing about throughput. The
window leaves out the first page's read and preprocessing (one page of pipeline fill, ~0.1 s of
a 20+ s window) and includes the last page's post-processing and writing. CPU is the run's whole
process tree from its launch to its exit, from the first byte read: start-up, reading and registering
every input, storing originals, and the document outputs included (``cpu_ms_per_page`` divides it by the
pages).

CPU per page is printed by process for both: the main process (the one that feeds the engine: a worker's from
ready to the last page stored, the run's from its launch to its last reading, 0.1 s at most before it exits), the
pools (preprocessing, a page's stored objects, document outputs: the rest of the group) and the group. The main
process counts its own CPU only: a pool process it reaped (one replaced after a limit or a crash, or stopped at the
end) counts with the pools, not in the main process's figure, as /proc's cutime would have it.

The window (the requests paperlane keeps at the server, models/window.py: it follows the server's /metrics)
is printed over time from the run's log: min, median, max and a few samples.

--window-compare: the window alone, side by side in one run: two servers of --shape (``wide-slow`` unless
given: 80 sequences of slow streams, a server that needs ~80 answers at once), each fed by the production
client with more pages than it can take (--seconds of them), one with today's fixed window of 32
(``engine.window.adaptive=false``, ``max_in_flight=32``), one with the adaptive window at the defaults.
Pages are 100 dpi scans, prepared once before the clock (no worker, no services): what differs is the window.
Prints each one's decode capacity used, from its first request to the end, and the window over time.

Last line: ``engine_utilisation=`` (``embedded_engine_utilisation=``): the decode capacity used (target >= 0.9);
with ``--fixed``, ``<system pages/s / engine pages/s>`` as before.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import threading
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import (
    ENGINE_SHAPE,
    PAPERLANE,
    a4_scan,
    cpu_by_part,
    finished_jobs,
    group_cpu,
    last_finished,
    machine_cpu,
    process_table,
    stamped_scans,
    start_paperlane,
    start_services,
    start_worker,
    stop,
    with_comment,
    write_config,
)
from sqlalchemy import func, select

from paperlane.models.engine import EngineRequest
from paperlane.models.profiles import get_profile
from paperlane.models.vllm_server import VllmServerEngine
from paperlane.priority.broker import PagePublisher, make_celery
from paperlane.priority.lanes import Lane
from paperlane.producer.input_items import Document
from paperlane.producer.submit import submit_documents
from paperlane.report import stage_report
from paperlane.schemas import TaskSpec
from paperlane.settings import EngineSettings, WindowSettings, load_settings
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.storage.objects import open_store
from paperlane.status import OutputsState
from paperlane.storage.tables import DocumentRow, JobRow
from paperlane.bounded import process_cpu_seconds
from tests.pages import prepare
from tests.sim_engine import SimEngine, start_sim_engine
from tests.sim_shape import SHAPES

# Above the max_tokens the client sends (4096) until the client reads max_model_len from /v1/models.
MAX_MODEL_LEN = 32768


@dataclass
class Probe:
    """Clocks read at one end of the window."""

    at: float  # epoch seconds
    cpu: dict[int, float]  # the paperlane process group's CPU seconds by pid (each with the children it reaped)
    main: float  # the group leader's own CPU seconds, without the children it reaped (``process_cpu_seconds``)
    engine_cpu: float
    machine: tuple[float, float]

    @classmethod
    def read(cls, pgid: int, sim: SimEngine, *, at: float | None = None) -> Probe:
        return cls(at or time.time(), group_cpu(pgid), process_cpu_seconds(pgid), process_cpu_seconds(sim.pid),
                   machine_cpu())


@dataclass
class Window:
    """What one measured run did between the two ends of its clock."""

    pages: int
    failed: int
    seconds: float
    cpu_s: float  # the paperlane process group's CPU over the window
    engine: dict[str, Any]  # the sim server's stats at the end
    engine_cpu_s: float
    machine_busy: float  # share of all cores busy over the window
    main_ms: float = 0.0  # the feeding process's CPU per page (a worker's main process)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, default=1000, help="A4 300 dpi scans (1000: ~50 s at 20 pages/s)")
    p.add_argument("--fixed", action="store_true", help="the fixed-latency engine (--slots x --latency) instead of "
                   "the real model's shape")
    p.add_argument("--slots", type=int, default=16, help="--fixed: the engine's sequences at once")
    p.add_argument("--latency", type=float, default=0.32, help="--fixed: seconds each page holds an engine slot")
    p.add_argument("--processes", type=int, default=2, help="CPU preprocessing processes")
    p.add_argument("--shape", default=ENGINE_SHAPE, choices=sorted(SHAPES), help="the engine's shape "
                   "(tests/sim_shape.py): a whole H200 by default; quarter-h200-hunyuanocr asks a quarter of it")
    p.add_argument("--stream-interval", type=int, default=None, help="tokens a streamed chunk paperlane asks of "
                   "the server (engine.stream_interval, default 16; 1: a chunk per token, as vLLM streams unasked)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a paperlane setting as in the environment without the prefix, e.g. ENGINE__MAX_IN_FLIGHT=32")
    p.add_argument("--embedded", action="store_true", help="measure `paperlane run` instead of a worker")
    p.add_argument("--feeders", default=None, help="--embedded: feeding processes to compare side by side, e.g. "
                   "1,2 (worker.feeders; each a run of its own against a fresh engine, in turn)")
    p.add_argument("--main-code", type=Path, default=None, metavar="CHECKOUT", help="also run another checkout's "
                   "code (its .venv's python -m paperlane, e.g. /work/main) in turn with this one's (worker or run)")
    p.add_argument("--rounds", type=int, default=1, help="times each run is repeated, alternating")
    p.add_argument("--outputs-apart", action="store_true", help="the worker with worker.write_outputs=false and "
                   "`paperlane outputs` beside it writing the documents' outputs (as deploy/k8s runs them); its CPU "
                   "per page is printed apart, until the last document's outputs are written")
    p.add_argument("--log", help="keep the worker's (or the run's) log here")
    p.add_argument("--window-compare", action="store_true", help="the fixed window of 32 beside the adaptive one, "
                   "against two servers of --shape (default wide-slow) fed at once")
    p.add_argument("--seconds", type=float, default=40, help="--window-compare: how long both are fed")
    args = p.parse_args()
    if args.stream_interval:
        args.set.append(f"ENGINE__STREAM_INTERVAL={args.stream_interval}")
    if args.window_compare:
        return compare_windows(args.shape if args.shape != ENGINE_SHAPE else "wide-slow", args.seconds)
    if args.embedded:
        return embedded_side_by_side(args)
    return worker_side_by_side(args)


def _checkout_command(checkout: Path) -> list[str]:
    """How to start another checkout's paperlane (--main-code): its .venv's python -m paperlane, with -P: it runs
    from this checkout's folder, and ``-m`` would otherwise put that first on its path, so that this checkout's
    ``paperlane`` package shadowed the other's (its steps, mapped by its editable install, stayed its own)."""
    return [str(checkout / ".venv/bin/python"), "-P", "-m", "paperlane"]


def _start_sim(args: argparse.Namespace, root: Path) -> SimEngine:
    if args.fixed:
        return start_sim_engine(root / "sim", slots=args.slots, latency=args.latency, scheduling_policy="priority",
                                max_model_len=MAX_MODEL_LEN)
    return start_sim_engine(root / "sim", shape=args.shape, scheduling_policy="priority", max_model_len=MAX_MODEL_LEN)


def _scan_pages(args: argparse.Namespace) -> Iterator[bytes]:
    if args.fixed:  # every page alike: distinct bytes are enough
        scans = [a4_scan(i) for i in range(8)]
        return (with_comment(scans[i % 8], i) for i in range(args.pages))
    return iter(list(stamped_scans(args.pages)))  # drawn before any clock starts


@dataclass
class _Turn:
    """One arm's run in one round: its own folder and a fresh engine of the shape asked for."""

    args: argparse.Namespace
    root: Path
    arm: int
    label: str
    round: int  # from 1
    last: bool  # the only run of all (its log is kept at --log itself)

    def measure(self, run: Callable[[Path, SimEngine], Window]) -> tuple[Window, SimEngine, str]:
        """``run(root, sim)`` against a fresh engine, stopped after; its window, the engine and the run's log (kept
        at --log)."""
        sim = _start_sim(self.args, self.root)
        try:
            window = run(self.root, sim)
        finally:
            sim.stop()
        log = (self.root / "paperlane.log").read_text(errors="replace")
        if self.args.log:
            Path(self.args.log if self.last else f"{self.args.log}.{self.round - 1}-{self.arm}").write_text(log)
        return window, sim, log


def _turns(args: argparse.Namespace, tmp: Path, labels: list[str], kind: str) -> Iterator[_Turn]:
    """Every arm in turn, for --rounds: the order side-by-side runs take, so that drift on the machine falls on all."""
    for r in range(args.rounds):
        for k, label in enumerate(labels):
            root = tmp / f"r{r}-{k}"
            root.mkdir()
            print(f"\n=== {kind}{label}, round {r + 1} (load average {os.getloadavg()[0]:.2f}) ===")
            yield _Turn(args, root, k, label, r + 1, last=len(labels) == 1 and args.rounds == 1)


def embedded_side_by_side(args: argparse.Namespace) -> int:
    """``paperlane run`` once per --feeders value (and --main-code's code), in turn for --rounds, each against a fresh
    engine of the same shape, on the same scans; each one's report, then a table of all."""
    arms: list[tuple[str, list[str], dict[str, str]]] = []
    if args.main_code is not None:
        arms.append((f"code of {args.main_code}", _checkout_command(args.main_code), {}))
    for n in (args.feeders.split(",") if args.feeders else []):
        arms.append((f"feeders={n}", PAPERLANE, {"WORKER__FEEDERS": n.strip()}))
    if not args.feeders:  # this code at its defaults, beside --main-code's when given
        arms.insert(0, ("this code", PAPERLANE, {}))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "scans"
        src.mkdir()
        for i, data in enumerate(_scan_pages(args)):
            (src / f"scan{i:05d}.jpg").write_bytes(data)
        for turn in _turns(args, Path(tmp), [label for label, _, _ in arms], ""):
            _, command, extra = arms[turn.arm]
            window, sim, log = turn.measure(lambda root, sim: run_embedded(args, root, src, sim, command, extra))
            rows.append((turn.label, turn.round, report(window, sim, prefix="embedded_")))
            for name, sizes in _window_sizes_by_process(log).items():
                print_window(name, sizes)
    print(f"\n{'run':<28} round  pages/s  capacity used  cpu ms/page")
    for label, r, (rate, used, cpu_ms) in rows:
        print(f"{label:<28} {r:5d}  {rate:7.2f}  {used:13.3f}  {cpu_ms:11.1f}")
    print(f"load average now: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


def worker_side_by_side(args: argparse.Namespace) -> int:
    """``paperlane worker`` of this checkout and of --main-code's, in turn for --rounds, each against a fresh engine
    and fresh services, on the same scans; each one's report, then a table of all with CPU per page by process."""
    arms = [("this code", PAPERLANE)]
    if args.main_code is not None:
        arms.append((f"code of {args.main_code}", _checkout_command(args.main_code)))
    scans = list(_scan_pages(args))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for turn in _turns(args, Path(tmp), [label for label, _ in arms], "worker, "):
            command = arms[turn.arm][1]
            window, sim, log = turn.measure(lambda root, sim: run_worker(args, root, iter(scans), sim, command=command))
            rate, used, group_ms = report(window, sim, prefix="")
            rows.append((turn.label, turn.round, rate, used, window.main_ms, group_ms))
            print_window("paperlane", _window_sizes(log))
    if len(rows) == 1:  # its report ends with its figure
        return 0
    print(f"\n{'worker':<28} round  pages/s  capacity used  main ms/page  group ms/page")
    for label, r, rate, used, main_ms, group_ms in rows:
        print(f"{label:<28} {r:5d}  {rate:7.2f}  {used:13.3f}  {main_ms:12.1f}  {group_ms:13.1f}")
    print(f"load average now: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


def run_worker(args: argparse.Namespace, root: Path, pages: Iterator[bytes], sim: SimEngine, *,
               command: list[str] | None = None) -> Window:
    """Queue the pages, start a worker (``command``: another checkout's paperlane), time it from ready to the last
    page stored."""
    svc = start_services(root)
    try:
        apart = {"WORKER__WRITE_OUTPUTS": "false"} if args.outputs_apart else {}
        config = write_config(svc, root, WORKER__PREPROCESS_PROCESSES=str(args.processes), **apart,
                              **dict(kv.split("=", 1) for kv in args.set))
        settings = load_settings(config)
        db = Database(settings.database_url)
        db.upgrade()
        t0 = time.perf_counter()
        inputs = (Document(source=f"scan{i}.jpg", name=f"scan{i}", ext=".jpg", data=data, page_count=1)
                  for i, data in enumerate(pages))
        ids = [s.job_id for s in submit_documents(inputs, db=db, store=open_store(settings), spec=TaskSpec(),
                                                  lane=Lane.BATCH, publisher=PagePublisher(make_celery(settings)))]
        print(f"queued {len(ids)} A4 scans in {time.perf_counter() - t0:.1f}s (untimed)")
        outputs = _start_outputs(config, root, command) if args.outputs_apart else None
        worker = start_worker(config, root / "paperlane.log", sim.url, command=command)
        try:
            start, table = Probe.read(worker.pid, sim), process_table()
            outputs_start = sum(group_cpu(outputs.pid).values()) if outputs else 0.0
            while finished_jobs(db) < len(ids):
                time.sleep(0.5)
            end = Probe.read(worker.pid, sim, at=last_finished(db))
            _print_machine_parts(table, process_table(), start, end, len(ids), worker=worker.pid,
                                 outputs=outputs.pid if outputs else None, sim=sim.pid)
            if outputs is not None:
                while outputs_written(db) < len(ids):
                    time.sleep(0.2)
                lag = time.time() - end.at
                outputs_s = sum(group_cpu(outputs.pid).values()) - outputs_start
                print(f"outputs apart (`paperlane outputs`): {outputs_s * 1000 / len(ids):.1f} ms CPU per page; the "
                      f"last document's written {lag:.1f}s after the last page was stored")
        finally:
            stop(worker)
            if outputs is not None:
                stop(outputs)
        _print_stages(db)
        failed = finished_jobs(db, "failed")
    finally:
        svc.stop()
    # The worker's own CPU: a pool process it replaced and reaped (one killed past a limit, or died) counts in its
    # cutime, which is the pools' work, not the feeding process's.
    main_s = end.main - start.main
    total_s = sum(end.cpu.values()) - sum(start.cpu.values())
    _print_cpu_by_process("worker", main_s, total_s, len(ids))
    window = _window(len(ids), failed, start, end, sim)
    window.main_ms = main_s * 1000 / len(ids)
    return window


def _print_machine_parts(start: dict[int, tuple[str, int, float]], end: dict[int, tuple[str, int, float]],
                         probe0: Probe, probe1: Probe, pages: int, *, worker: int, outputs: int | None,
                         sim: int) -> None:
    """Where the machine's CPU went over the window, per page: paperlane's process groups, the simulated engine,
    the services (all on these cores), this benchmark's own process, every other process, and what no live
    process accounts for (processes that ended in the window, such as replaced pool processes, and interrupts)."""
    groups = {worker: "worker group"} | ({outputs: "outputs"} if outputs else {})
    parts = cpu_by_part(start, end, processes={sim: "sim server", os.getpid(): "benchmark"}, groups=groups)
    busy = probe1.machine[0] - probe0.machine[0]
    shown = [*groups.values(), "sim server", "SeaweedFS", "PostgreSQL", "Redis", "benchmark", "other"]
    cells = [f"{name} {parts.get(name, 0.0) * 1000 / pages:.1f}" for name in shown]
    print(f"machine CPU per page: {busy * 1000 / pages:.1f} ms in all = {', '.join(cells)}, no live process "
          f"{(busy - sum(parts.values())) * 1000 / pages:.1f} (ms; from /proc, over the same window)")


def _start_outputs(config: Path, root: Path, command: list[str] | None) -> subprocess.Popen[bytes]:
    """``paperlane outputs`` in a session of its own (its process group: it and its processes), once it serves."""
    return start_paperlane(config, ["outputs"], root / "outputs.log", ready="writing due document outputs",
                           command=command)


def outputs_written(db: Database) -> int:
    with db.session() as s:
        return int(s.scalar(select(func.count()).select_from(DocumentRow).where(
            DocumentRow.outputs == OutputsState.WRITTEN.value)) or 0)


def run_embedded(args: argparse.Namespace, root: Path, src: Path, sim: SimEngine, command: list[str],
                 extra: dict[str, str]) -> Window:
    """``command`` (``python -m paperlane``) ``-v run`` the folder ``src`` with the settings of --set and ``extra``;
    time from the first request to the last page written."""
    out = root / "out"
    values = {"DATA_DIR": str(root / "data"), "WORKER__PREPROCESS_PROCESSES": str(args.processes),
              **dict(kv.split("=", 1) for kv in args.set), **extra}
    config = root / "embedded.env"
    config.write_text("".join(f"PAPERLANE_{k}={v}\n" for k, v in values.items()))
    t0 = time.time()
    # -v: the window's changes are logged; the working folder is not a checkout, whose folders python -m would
    # import before the installed package.
    proc = subprocess.Popen([*command, "--config", str(config), "-v", "run", str(src), "--out", str(out), "--engine",
                             "vllm", "--engine-url", sim.url], stdout=(root / "paperlane.log").open("wb"),
                            stderr=subprocess.STDOUT, start_new_session=True, cwd=root)
    try:
        while sim.stats(per_image=False)["first_start"] is None:  # a page took an engine slot
            if proc.poll() is not None:
                raise RuntimeError(f"paperlane run exited early:\n{(root / 'paperlane.log').read_text()[-3000:]}")
            time.sleep(0.05)
        start = Probe.read(proc.pid, sim)
        main_s, status, usage = _wait_reading_own_cpu(proc.pid)
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        stop(proc)
    results = [json.loads(p.read_text()) for p in out.glob("*.json")]
    first = sim.stats(per_image=False)["first_start"]
    print(f"paperlane run exited {proc.returncode}; start-up {first - t0:.1f}s before the first page reached "
          f"the engine")
    _print_timings([r["timings"] for r in results])
    end = Probe(max(p.stat().st_mtime for p in out.iterdir()), {proc.pid: usage.ru_utime + usage.ru_stime},
                main_s, process_cpu_seconds(sim.pid), machine_cpu())
    start.at = first
    start.cpu = {}  # the run's CPU counts from its launch: wait4's rusage is its whole tree's since then
    _print_cpu_by_process("paperlane run", main_s, end.cpu[proc.pid], len(results))
    return _window(len(results), sum(r["status"] == "failed" for r in results), start, end, sim)


def _wait_reading_own_cpu(pid: int) -> tuple[float, int, Any]:
    """Wait for the run to exit; its main process's own CPU seconds (read from /proc every 0.1 s until it exits:
    the last reading, at most 0.1 s before its exit), its wait status and rusage. wait4, not wait: the rusage of the
    run process includes its pools' processes, which it reaped at exit."""
    own = 0.0
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return own, status, usage
        try:
            own = process_cpu_seconds(pid)
        except OSError:
            pass
        time.sleep(0.1)


def _print_cpu_by_process(path: str, main_s: float, group_s: float, pages: int) -> None:
    """CPU per page by process: the one that feeds the engine (main), the rest of its process group (the pools:
    preprocessing, storing objects, document outputs), and the group."""
    print(f"{path} CPU per page: main process {main_s * 1000 / pages:.1f} ms, pools {(group_s - main_s) * 1000 / pages:.1f}"
          f" ms, group {group_s * 1000 / pages:.1f} ms")


def _window(pages: int, failed: int, start: Probe, end: Probe, sim: SimEngine) -> Window:
    busy = end.machine[0] - start.machine[0], end.machine[1] - start.machine[1]
    return Window(pages, failed, end.at - start.at, sum(end.cpu.values()) - sum(start.cpu.values()),
                  sim.stats(per_image=False), end.engine_cpu - start.engine_cpu, busy[0] / busy[1])


def report(w: Window, sim: SimEngine, *, prefix: str) -> tuple[float, float, float]:
    """Print the run's figures; its pages/s, decode capacity used (pages/s over the engine's, fixed engine) and CPU
    per page."""
    e = w.engine
    rate = w.pages / w.seconds
    engine = (f"{sim.shape.name}: {sim.slots} sequences, {sim.shape.decode_tokens_per_s:,.0f} tokens/s" if sim.shape
              else f"{sim.slots} slots x {sim.latency:.2f}s")
    print(f"engine alone: {sim.rate:.2f} pages/s ({engine})")
    print(f"system:       {rate:.2f} pages/s ({w.pages} pages in {w.seconds:.1f}s, {w.failed} failed)")
    print(f"engine busy:  {e['busy_slot_seconds'] / (sim.slots * w.seconds):.3f} of its slot-seconds; "
          f"{e['requests']} requests, peak {e['peak_running']} running and {e['peak_waiting']} waiting")
    print(f"machine CPU:  {w.machine_busy:.0%} of {os.cpu_count()} cores busy over the window; the sim server "
          f"{w.engine_cpu_s * 1000 / max(1, e['requests']):.1f} ms per request")
    print(f"cpu_ms_per_page={w.cpu_s * 1000 / w.pages:.1f}")
    if sim.shape is None:
        print(f"{prefix}engine_utilisation={rate / sim.rate:.3f}")
        return rate, rate / sim.rate, w.cpu_s * 1000 / w.pages
    ceiling, first = e["decode_tokens_per_s"], e["first_start"]
    fed = e["decoded_at_last_arrival"] / (ceiling * (e["last_arrival"] - first))
    whole = e["decoded_tokens"] / (ceiling * (e["last_end"] - first))
    print(f"decode:       {e['decoded_tokens']:,} tokens; capacity used {fed:.3f} while pages kept coming "
          f"({e['last_arrival'] - first:.1f}s), {whole:.3f} to the last answer ({e['last_end'] - first:.1f}s, "
          f"the drain included); pages/s over the engine's nominal {rate / sim.rate:.3f}")
    chunks = e["chunks"]
    print(f"streamed:     {chunks:,} chunks, {e['decoded_tokens'] / max(1, chunks):.1f} tokens a chunk, "
          f"{chunks / max(1, e['requests']):.0f} a request")
    print(f"{prefix}engine_utilisation={fed:.3f}")
    return rate, fed, w.cpu_s * 1000 / w.pages


def _print_stages(db: Database) -> None:
    with db.session() as s:
        rows = s.scalars(select(JobRow).where(JobRow.finished_at.is_not(None))).all()
    _print_timings([jobstore.job_timings(r) for r in rows])


def _print_timings(timings: list[dict[str, float]]) -> None:
    """Per-stage wall time, as ``paperlane report`` prints it."""
    print("stage         p50 ms   p95 ms  share")
    for r in stage_report(timings):
        print(f"{r.stage:<12} {r.p50 * 1000:7.0f}  {r.p95 * 1000:7.0f}  {r.share:5.1%}")


# --- the window ------------------------------------------------------------------------------------------------

_WINDOW_LINE = re.compile(r"vllm window \d+ -> (\d+) ")


def _window_sizes(log: str) -> list[int]:
    """The window after each change (none: it stayed at its start), from the log's ``vllm window A -> B`` lines (models/window.py)."""
    return [int(m.group(1)) for m in _WINDOW_LINE.finditer(log)]


_PROCESS_WINDOW_LINE = re.compile(r"^\S+ \S+ \w+ (?:(run-feeder-\d+) )?paperlane\.models\.window: vllm window \d+ -> "
                                  r"(\d+) ", re.MULTILINE)
_FEEDER_READY = re.compile(r"(run-feeder-\d+) \(pid \d+\) ready")


def _window_sizes_by_process(log: str) -> dict[str, list[int]]:
    """The window after each change, by the process that logged it (a feeding process names itself on every line;
    a one-process run does not); every feeding process that started has its line, changed or not."""
    feeders = sorted(set(_FEEDER_READY.findall(log)))
    sizes: dict[str, list[int]] = {name: [] for name in feeders} or {"the run's process": []}
    for m in _PROCESS_WINDOW_LINE.finditer(log):
        sizes.setdefault(m.group(1) or "the run's process", []).append(int(m.group(2)))
    return {f"{name}{'' if got else ' (no change logged)'}": got for name, got in sizes.items()}


def print_window(name: str, sizes: list[int], *, start: int = 32) -> None:
    sizes = sizes or [start]
    picks = [sizes[round(i * (len(sizes) - 1) / 7)] for i in range(8)] if len(sizes) > 8 else sizes
    print(f"window ({name}): min {min(sizes)}, median {statistics.median(sizes):g}, max {max(sizes)}, last "
          f"{sizes[-1]} over {len(sizes)} values; samples {' '.join(map(str, picks))}")


def compare_windows(shape: str, seconds: float) -> int:
    """Today's fixed window of 32 beside the adaptive one, two servers of ``shape`` fed at once."""
    images = [prepare(data, get_profile(EngineSettings().profile).input_spec())
              for data in stamped_scans(120, dpi=100)]
    fixed = EngineSettings(kind="vllm", url="http://unset/v1", max_in_flight=32,
                           window=WindowSettings(adaptive=False))
    with tempfile.TemporaryDirectory() as tmp:
        runs = {name: _Fed.start(Path(tmp) / name, shape, cfg, images, seconds)
                for name, cfg in (("fixed 32", fixed), ("adaptive", EngineSettings(kind="vllm", url="http://unset/v1")))}
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.5)
            for run in runs.values():
                run.sample()
        for run in runs.values():
            run.measure()
        for run in runs.values():
            run.stop()
    for name, run in runs.items():
        print(f"{name:9} decode capacity used {run.used:.3f} over {run.span:.1f}s from its first request, "
              f"{run.steady:.3f} after the first 10 s; "
              f"{run.completed} answers; server peak {run.peak_running} running, {run.peak_waiting} waiting, "
              f"max {max(run.waiting, default=0)} waiting when sampled")
        print_window(name, run.windows)
    print(f"window_compare_fixed={runs['fixed 32'].used:.3f} window_compare_adaptive={runs['adaptive'].used:.3f}")
    return 0


@dataclass
class _Fed:
    """One server and the production client feeding it more pages than it can take."""

    sim: SimEngine
    engine: VllmServerEngine
    feeder: threading.Thread
    windows: list[int]
    waiting: list[int]
    decoded: list[tuple[float, float]] = field(default_factory=list)  # (time, tokens decoded) at each sample
    used: float = 0.0
    steady: float = 0.0
    span: float = 0.0
    completed: int = 0
    peak_running: int = 0
    peak_waiting: int = 0

    @classmethod
    def start(cls, root: Path, shape: str, cfg: EngineSettings, images: list[Any], seconds: float) -> _Fed:
        sim = start_sim_engine(root, shape=shape, scheduling_policy="priority", max_model_len=MAX_MODEL_LEN)
        engine = VllmServerEngine(cfg.model_copy(update={"url": sim.url}))
        engine.start()
        pages = round(SHAPES[shape].pages_per_s * seconds * 1.5)  # more than it can take in the time
        requests = [EngineRequest(image=images[i % len(images)], priority=5) for i in range(pages)]
        feeder = threading.Thread(target=engine.infer, args=(requests,), daemon=True)
        feeder.start()
        return cls(sim, engine, feeder, [engine.window], [])

    def sample(self) -> None:
        self.windows.append(self.engine.window)
        e = self.sim.stats(per_image=False)
        self.waiting.append(e["waiting"])
        self.decoded.append((e["now"], e["decoded_tokens"]))

    def measure(self) -> None:
        e = self.sim.stats(per_image=False)
        self.span = e["now"] - e["first_start"]
        self.used, self.completed = e["capacity_used"], e["completed"]
        self.peak_running, self.peak_waiting = e["peak_running"], e["peak_waiting"]
        t0, d0 = next((t, d) for t, d in self.decoded if t >= e["first_start"] + 10) if self.span > 12 else (0, 0)
        if t0:
            self.steady = (e["decoded_tokens"] - d0) / (e["decode_tokens_per_s"] * (e["now"] - t0))

    def stop(self) -> None:
        self.sim.stop()  # the pages still out fail at once, so the client's call returns
        self.feeder.join(timeout=120)
        self.engine.close()


if __name__ == "__main__":
    raise SystemExit(main())
