"""What looping pages cost the engine, with the loop guard and without: decoded tokens over the ideal.

The engine is the simulated vLLM server with a real model's shape (tests/sim_engine.py, ``h200-hunyuanocr``:
per-page answer lengths of median ~500 tokens, ~20 pages/s at saturation), on which --loop-share of the pages
(8%) loop until max_tokens (4,096) unless the request asks for a repetition penalty above 1.1, and
--stubborn-share (1%) loop whatever the penalty. ``paperlane run DIR --engine vllm`` (the real pipeline on the
embedded stack) reads --pages A4 scans twice, on a fresh engine each time: with the loop guard (the shipped
defaults: stop a degenerate answer mid-stream, retry at penalty 1.15, then the RapidOCR fallback) and with
``PAPERLANE_ENGINE__GUARD__ENABLED=false`` (every answer read to its end, as before).

``decode_tokens_vs_ideal``: the tokens the engine decoded (completed and abandoned answers, retries, and what it
decoded while an abort travelled), over what the same pages cost without loops (each page's answer once, as the
engine would have written it). ``degenerate_passed``: pages whose final answer from the engine looped yet whose
result needs no review, or a fallback result that needs none: each page is matched to its engine requests by
the image the worker sent (the benchmark prepares each page as the worker does). Also printed: pages recovered
by the retry and by the fallback, false stops (answers stopped that did not loop), and the detector's false-stop
rate on the corpus' real pages and on legitimately repetitive ones (tests/answers.py).

Last line: ``decode_tokens_vs_ideal=`` (guarded; target <= 1.10), the unguarded figure on the line before.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import MAX_IN_FLIGHT, PAPERLANE, engine_image_id, stamped_scans

from paperlane.models.degeneration import DegenerationDetector
from paperlane.settings import LoopGuardSettings
from tests.answers import pieces, real_answers, repetitive_answers
from tests.corpus import corpus_root
from tests.sim_engine import start_sim_engine
from tests.sim_shape import Behaviour


@dataclass
class Run:
    name: str
    seconds: float
    stats: dict[str, Any]
    requests: list[dict[str, Any]]  # the engine's log
    results: dict[str, dict[str, Any]]  # page stem -> result JSON

    @property
    def ratio(self) -> float:
        return self.stats["decoded_tokens"] / self.stats["ideal_tokens"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, default=1000, help="A4 scans")
    p.add_argument("--dpi", type=int, default=150, help="their resolution")
    p.add_argument("--loop-share", type=float, default=0.08)
    p.add_argument("--stubborn-share", type=float, default=0.01)
    p.add_argument("--processes", type=int, default=2, help="CPU preprocessing processes")
    args = p.parse_args()
    behaviour = Behaviour(loop_share=args.loop_share, stubborn_share=args.stubborn_share)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        src = root / "scans"
        src.mkdir()
        t0 = time.perf_counter()
        images: dict[str, str] = {}  # page stem -> sha1 of the data URL the worker sends for it
        for i, data in enumerate(stamped_scans(args.pages, dpi=args.dpi)):
            (src / f"scan{i:05d}.jpg").write_bytes(data)
            images[f"scan{i:05d}"] = engine_image_id(data)
        print(f"{args.pages} A4 scans at {args.dpi} dpi written and prepared in {time.perf_counter() - t0:.0f}s "
              f"(untimed)", flush=True)
        runs = [_run(name, root, src, behaviour, args.processes, guard) for name, guard in
                (("guarded", True), ("unguarded", False))]
    for run in runs:
        _report(run, images)
    _report_false_stops()
    guarded, unguarded = runs
    print(f"degenerate_passed={_degenerate_passed(guarded, images)}")
    print(f"unguarded_decode_tokens_vs_ideal={unguarded.ratio:.3f}")
    print(f"decode_tokens_vs_ideal={guarded.ratio:.3f}")
    return 0


def _run(name: str, root: Path, src: Path, behaviour: Behaviour, processes: int, guard: bool) -> Run:
    """``paperlane run`` over the scans on a fresh engine; what the engine and the results say afterwards."""
    out, data = root / f"out-{name}", root / f"data-{name}"
    config = root / f"{name}.env"
    config.write_text(f"PAPERLANE_DATA_DIR={data}\nPAPERLANE_WORKER__PREPROCESS_PROCESSES={processes}\n"
                      f"PAPERLANE_ENGINE__MAX_IN_FLIGHT={MAX_IN_FLIGHT}\n"
                      f"PAPERLANE_ENGINE__GUARD__ENABLED={str(guard).lower()}\n")
    sim = start_sim_engine(root / f"sim-{name}", shape="h200-hunyuanocr", behaviour=behaviour,
                           scheduling_policy="priority")
    try:
        t0 = time.perf_counter()
        proc = subprocess.run([*PAPERLANE, "--config", str(config), "run", str(src), "--out", str(out), "--engine",
                               "vllm", "--engine-url", sim.url], capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - t0
        if proc.returncode not in (0, 1):
            sys.exit(f"paperlane run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        sim.wait_for(lambda s: s["running"] == 0, timeout=30)
        stats, requests = sim.stats(), sim.requests()
    finally:
        sim.stop()
    results = {p.stem: json.loads(p.read_text()) for p in out.glob("scan*.json")}
    return Run(name, seconds, stats, requests, results)


def _by_image(run: Run) -> dict[str, list[dict[str, Any]]]:
    requests: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in sorted(run.requests, key=lambda r: r["n"]):
        if record.get("image"):
            requests[record["image"]].append(record)
    return requests


def _degenerate_passed(run: Run, images: dict[str, str]) -> int:
    """Pages whose last answer from the engine looped, read from a model that is not a fallback, with a result
    that needs no review; and fallback results that need none."""
    requests = _by_image(run)
    passed = 0
    for stem, result in run.results.items():
        quality = result.get("quality") or {}
        fallback = bool((result.get("engine") or {}).get("fallback_for"))
        looped_last = bool(requests.get(images[stem])) and requests[images[stem]][-1].get("looped", False)
        if result["status"] == "succeeded" and not quality.get("needs_review") and (looped_last or fallback):
            passed += 1
    return passed


def _report(run: Run, images: dict[str, str]) -> None:
    s, results = run.stats, run.results.values()
    requests = _by_image(run)
    matched = sum(1 for stem in run.results if images[stem] in requests)
    flags: dict[str, int] = defaultdict(int)
    for result in results:
        for flag in (result.get("quality") or {}).get("flags", ()):
            flags[flag] += 1
    recovered = sum(1 for r in results if (r.get("quality") or {}).get("flags") == ["retried"])
    fallback = sum(1 for r in results if (r.get("engine") or {}).get("fallback_for"))
    false_stops = sum(1 for r in run.requests if r.get("outcome") == "abandoned" and not r.get("looped"))
    failed = sum(1 for r in results if r["status"] != "succeeded")
    print(f"{run.name}: {len(run.results)} pages ({failed} failed) in {run.seconds:.0f}s; "
          f"{matched} matched to their engine requests by image; {s['requests']} requests, "
          f"{s['loop_pages']} pages looped")
    print(f"  tokens decoded {s['decoded_tokens']:,} (completed {s['tokens']['completed']:,}, abandoned "
          f"{s['tokens']['abandoned']:,}) vs {s['ideal_tokens']:,} without loops: {run.ratio:.3f}")
    print(f"  recovered by the retry {recovered}, by the fallback {fallback}; false stops {false_stops}; "
          f"flags {dict(sorted(flags.items()))}; needs review "
          f"{sum(1 for r in results if (r.get('quality') or {}).get('needs_review'))}")


def _report_false_stops() -> None:
    cfg = LoopGuardSettings()
    sets = {"repetitive pages": repetitive_answers()}
    if corpus_root().is_dir():
        sets = {"corpus pages (4 answer formats each)": real_answers(), **sets}
    for name, answers in sets.items():
        stopped = []
        for answer in answers:
            detector = DegenerationDetector.for_image(cfg, width=answer.width, height=answer.height)
            if any(detector.feed(piece) for piece in pieces(answer.text)) or detector.finish():
                stopped.append(answer.name)
        print(f"detector false stops at the default thresholds: {len(stopped)}/{len(answers)} {name} {stopped}")


if __name__ == "__main__":
    raise SystemExit(main())
