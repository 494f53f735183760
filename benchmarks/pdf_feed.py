"""Scanned PDFs fed as fast as images: CPU per page and the engine's busy share, the same A4 scans as JPEG
files and as PDFs.

The engine is the simulated vLLM server (tests/sim_engine.py, a process of its own, fresh for each
measurement): --slots sequences at once, --latency seconds each; 16 x 0.8 s = 20 pages/s, what one
GPU does with HunyuanOCR. paperlane drives it through the production ``--engine vllm`` client.

The same --pages A4 300 dpi scans (benchmarks/common.py ``a4_scan``, distinct bytes per page) as:

- ``jpeg``: JPEG files;
- ``pdf``: PDFs of --per-pdf pages embedding those very JPEG bytes (one image per page, as scanners write);
- ``ccitt``: the same pages made bilevel, as PDFs of CCITT G4 images (fax-style archives);
- ``text``: the JPEG PDFs with an invisible text layer over each page (an earlier OCR's, as OCRmyPDF leaves).

Each set goes through ``paperlane run DIR --engine vllm`` on the embedded stack, and through a real
``paperlane worker`` (Celery on Redis, PostgreSQL, SeaweedFS S3: pages queued first, untimed), at
the default pool size. CPU per page is the whole process tree's (the run or the worker and its
pool), start-up included, over the pages. The engine's busy share is its busy slot-seconds over
slots x the window from the first request it saw to the last page stored.

Last lines: ``engine_busy_pdf=`` (``paperlane run``, the JPEG PDFs) and ``pdf_vs_jpeg_cpu=`` (the
same run: CPU per PDF page / CPU per JPEG page).
"""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pypdfium2 as pdfium
from common import (
    PAPERLANE,
    Services,
    a4_scan,
    finished_jobs,
    group_cpu,
    last_finished,
    start_services,
    start_worker,
    stop,
    with_comment,
    write_config,
)
from PIL import Image

from paperlane.priority.broker import PagePublisher, make_celery
from paperlane.priority.lanes import Lane
from paperlane.producer.input_items import Document
from paperlane.producer.submit import submit_documents
from paperlane.schemas import TaskSpec
from paperlane.settings import load_settings
from paperlane.storage.db import Database
from paperlane.storage.objects import open_store
from paperlane.workers.cpus import WORKER_OWN_CPUS, available_cpus, pool_processes
from tests.pages import WORDS, add_text, bilevel_pdf, pdf_bytes
from tests.sim_engine import SimEngine, start_sim_engine

SETS = ("jpeg", "pdf", "ccitt", "text")
DPI = 300
MAX_MODEL_LEN = 32768  # above the client's max_tokens


@dataclass
class Measured:
    """One set through one runner."""

    pages: int
    failed: int
    cpu_s: float  # the process tree's CPU, start-up included
    busy: float  # the engine's busy share over the window
    seconds: float  # the window
    pool: str  # the pool size the run chose, from its log

    @property
    def cpu_ms(self) -> float:
        return self.cpu_s * 1000 / max(1, self.pages)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, default=200, help="A4 300 dpi scans in each set")
    p.add_argument("--per-pdf", type=int, default=20, help="pages per PDF")
    p.add_argument("--slots", type=int, default=16, help="the engine's sequences at once (vLLM --max-num-seqs)")
    p.add_argument("--latency", type=float, default=0.8, help="seconds each page holds an engine slot")
    p.add_argument("--runner", choices=("both", "run", "worker"), default="both")
    p.add_argument("--sets", default=",".join(SETS), help=f"which of {','.join(SETS)}")
    p.add_argument("--keep", help="keep the logs of each measurement in this folder")
    args = p.parse_args()
    sets = [s for s in args.sets.split(",") if s]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        inputs = {name: build_set(name, args.pages, args.per_pdf) for name in sets}
        print(f"{args.pages} A4 300 dpi scans as {', '.join(sets)} in {time.perf_counter() - t0:.0f}s (untimed)")
        results: dict[tuple[str, str], Measured] = {}
        if args.runner in ("both", "run"):
            for name in sets:
                results["run", name] = through_run(args, root / f"run-{name}", inputs[name])
                report_one("run", name, results["run", name])
        if args.runner in ("both", "worker"):
            svc = start_services(root / "services")
            try:
                for name in sets:
                    results["worker", name] = through_worker(args, root / f"worker-{name}", svc, inputs[name])
                    report_one("worker", name, results["worker", name])
            finally:
                svc.stop()
        if args.keep:
            keep(root, Path(args.keep))
    return summary(results)


def report_one(runner: str, name: str, m: Measured) -> None:
    print(f"{runner:<6} {name:<5}: {m.pages} pages ({m.failed} failed) in {m.seconds:.1f}s, "
          f"{m.pages / m.seconds:.1f} pages/s, engine busy {m.busy:.3f}, CPU {m.cpu_ms:.0f} ms/page, pool {m.pool}",
          flush=True)


def summary(results: dict[tuple[str, str], Measured]) -> int:
    print("\nrunner  set    pages/s  engine busy  CPU ms/page  vs jpeg")
    for (runner, name), m in results.items():
        base = results.get((runner, "jpeg"))
        ratio = f"{m.cpu_ms / base.cpu_ms:7.2f}" if base else "      -"
        print(f"{runner:<7} {name:<5} {m.pages / m.seconds:8.1f}  {m.busy:11.3f}  {m.cpu_ms:11.0f}  {ratio}")
    if ("worker", "pdf") in results and ("worker", "jpeg") in results:
        print(f"worker_pdf_vs_jpeg_cpu={results['worker', 'pdf'].cpu_ms / results['worker', 'jpeg'].cpu_ms:.2f}")
    if ("run", "pdf") in results:
        print(f"engine_busy_pdf={results['run', 'pdf'].busy:.3f}")
    if ("run", "pdf") in results and ("run", "jpeg") in results:
        print(f"pdf_vs_jpeg_cpu={results['run', 'pdf'].cpu_ms / results['run', 'jpeg'].cpu_ms:.2f}")
    return 1 if any(m.failed for m in results.values()) else 0


# --- The inputs ----------------------------------------------------------------------------------------------


@dataclass
class Inputs:
    files: dict[str, bytes]  # file name -> bytes
    pages: int


def build_set(name: str, pages: int, per_pdf: int) -> Inputs:
    scans = [a4_scan(i) for i in range(8)]
    jpegs = [with_comment(scans[i % 8], i) for i in range(pages)]
    if name == "jpeg":
        return Inputs({f"scan{i:05d}.jpg": data for i, data in enumerate(jpegs)}, pages)
    groups = [jpegs[i:i + per_pdf] for i in range(0, pages, per_pdf)]
    if name == "ccitt":
        bilevel = [ccitt_pdf(group) for group in groups]
        return Inputs({f"fax{i:04d}.pdf": data for i, data in enumerate(bilevel)}, pages)
    layer = name == "text"
    return Inputs({f"doc{i:04d}.pdf": jpeg_pdf(group, text_layer=layer) for i, group in enumerate(groups)}, pages)


def jpeg_pdf(jpegs: list[bytes], *, text_layer: bool = False) -> bytes:
    """A PDF with one page per JPEG, its bytes embedded as they are, over the whole page at 300 dpi."""
    pdf = pdfium.PdfDocument.new()
    for n, jpeg in enumerate(jpegs):
        with Image.open(io.BytesIO(jpeg)) as im:
            w, h = im.size[0] * 72 / DPI, im.size[1] * 72 / DPI
        page = pdf.new_page(w, h)
        image = pdfium.PdfImage.new(pdf)
        image.load_jpeg(io.BytesIO(jpeg), inline=True)
        image.set_matrix(pdfium.PdfMatrix(w, 0, 0, h, 0, 0))
        page.insert_obj(image)
        if text_layer:
            add_invisible_text(pdf, page, seed=n, height=h)
        page.gen_content()
        page.close()
    return pdf_bytes(pdf)


def add_invisible_text(pdf: pdfium.PdfDocument, page: pdfium.PdfPage, *, seed: int, height: float) -> None:
    """45 lines of text in render mode 3 (invisible), one text object each, as an OCR layer is written."""
    for i in range(45):
        words = " ".join(WORDS[(seed + i + k) % len(WORDS)] for k in range(7))
        add_text(pdf, page, words, x=36, y=height - 40 - i * 17)


def ccitt_pdf(jpegs: list[bytes]) -> bytes:
    """The scans made bilevel and stored as CCITT G4 (Pillow's PDF writer), one page each, at 300 dpi."""
    return bilevel_pdf([Image.open(io.BytesIO(jpeg)) for jpeg in jpegs], dpi=DPI)


# --- paperlane run -------------------------------------------------------------------------------------------


def through_run(args: argparse.Namespace, root: Path, inputs: Inputs) -> Measured:
    """``paperlane run`` over the set's folder; CPU from its rusage at exit (its pool reaped)."""
    src, out = root / "in", root / "out"
    src.mkdir(parents=True)
    for name, data in inputs.files.items():
        (src / name).write_bytes(data)
    sim = new_sim(args, root)
    config = root / "embedded.env"
    config.write_text(f"PAPERLANE_DATA_DIR={root / 'data'}\n")
    log = root / "paperlane.log"
    try:
        proc = subprocess.Popen([*PAPERLANE, "--config", str(config), "run", str(src), "--out", str(out),
                                 "--engine", "vllm", "--engine-url", sim.url], stdout=log.open("wb"),
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        finally:
            stop(proc)
        pages = [p for p in out.glob("*.json") if re.search(r"-p\d+\.json$|^scan\d+\.json$", p.name)]
        failed = sum('"status":"failed"' in p.read_text() for p in pages)
        end = max(p.stat().st_mtime for p in out.iterdir())
        return measured(len(pages), failed, usage.ru_utime + usage.ru_stime, sim, end, log)
    finally:
        sim.stop()


# --- a worker ------------------------------------------------------------------------------------------------


def through_worker(args: argparse.Namespace, root: Path, svc: Services, inputs: Inputs) -> Measured:
    """Queue the set's pages, start a worker; its process group's CPU from its start to the last page stored."""
    root.mkdir(parents=True)
    config = write_config(svc, root)
    settings = load_settings(config)
    db = Database(settings.database_url)
    db.upgrade()
    documents = (Document(source=name, name=Path(name).stem, ext=Path(name).suffix, data=data,
                          page_count=pdf_pages(data) if name.endswith(".pdf") else 1)
                 for name, data in inputs.files.items())
    ids = [s.job_id for s in submit_documents(documents, db=db, store=open_store(settings), spec=TaskSpec(),
                                              lane=Lane.BATCH, publisher=PagePublisher(make_celery(settings)))]
    sim = new_sim(args, root)
    log = root / "paperlane.log"
    try:
        worker = start_worker(config, log, sim.url)
        try:
            wait_until(lambda: finished_jobs(db) >= len(ids))
            cpu = sum(group_cpu(worker.pid).values())  # cumulative: start-up included
            end = last_finished(db)
        finally:
            stop(worker)
        return measured(len(ids), finished_jobs(db, "failed"), cpu, sim, end, log)
    finally:
        sim.stop()
        db.dispose()


def pdf_pages(data: bytes) -> int:
    pdf = pdfium.PdfDocument(data)
    try:
        return len(pdf)
    finally:
        pdf.close()


def wait_until(condition: Callable[[], bool], *, timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("pages not done in time")
        time.sleep(0.2)


# --- both ----------------------------------------------------------------------------------------------------


def new_sim(args: argparse.Namespace, root: Path) -> SimEngine:
    # Served as docs/engines.md's `vllm serve` command: priority scheduling, so the client's priorities are accepted.
    return start_sim_engine(root / "sim", slots=args.slots, latency=args.latency, scheduling_policy="priority",
                            max_model_len=MAX_MODEL_LEN)


def measured(pages: int, failed: int, cpu_s: float, sim: SimEngine, end: float, log: Path) -> Measured:
    stats = sim.stats(per_image=False)
    window = end - (stats["first_start"] or end)
    busy = stats["busy_slot_seconds"] / (sim.slots * window) if window > 0 else 0.0
    # A worker logs its pool's size; `paperlane run` logs at WARNING only, and its pool is sized by the same rule.
    found = re.search(r"preprocessing pool: (\d+) processes \(([^)]*)\)", log.read_text(errors="replace"))
    pool = f"{found.group(1)} ({found.group(2)})" if found else \
        f"{pool_processes(None)} ({available_cpus():g} CPUs usable, less {WORKER_OWN_CPUS} for the run itself)"
    return Measured(pages, failed, cpu_s, busy, window, pool)


def keep(root: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for log in root.glob("*/paperlane.log"):
        (dest / f"{log.parent.name}.log").write_bytes(log.read_bytes())


if __name__ == "__main__":
    raise SystemExit(main())
