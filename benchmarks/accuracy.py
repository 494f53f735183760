"""Accuracy of ``paperlane run`` (default engine) on the real scans of the development corpus.

    python benchmarks/accuracy.py [--corpus DIR] [--limit N] [--pages] [--keep DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.corpus, tests.scoring

from tests.corpus import SETS, PageScore, corpus_root, run_paperlane, score_page


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=(
            "Run `paperlane run` over the SROIE receipts and FUNSD forms of the corpus and print, per set: "
            "pages, failed pages, mean CER and whitespace-insensitive CER (NFKC, case-folded, whitespace "
            "folded; truth lines in reading order), line-detection precision/recall at IoU 0.5 (boxes pooled "
            "over pages) and, for SROIE, how often the `total` field appears in the text. "
            "The last line is corpus_cer=<mean CER over all pages>."))
    p.add_argument("--corpus", type=Path, default=None,
                   help="corpus folder (default: env PAPERLANE_CORPUS, else ../shared/corpus from the repo)")
    p.add_argument("--limit", type=int, default=None, help="at most N pages per set")
    p.add_argument("--sets", nargs="+", choices=sorted(SETS), default=sorted(SETS, reverse=True))
    p.add_argument("--pages", action="store_true", help="also print one line per page")
    p.add_argument("--keep", type=Path, default=None,
                   help="run in DIR/<set> and keep the page JSON there (a rerun into the same DIR resumes)")
    return p


def _summary(name: str, scores: list[PageScore]) -> str:
    pred, truth, hit = (sum(getattr(s, k) for s in scores) for k in ("predicted", "truth", "matched"))
    parts = [f"{name}: pages={len(scores)}", f"failed={sum(not s.ok for s in scores)}",
             f"cer={mean(s.cer for s in scores):.4f}",
             f"cer_nospace={mean(s.cer_nospace for s in scores):.4f}",
             f"det_p={hit / pred if pred else 0:.3f}", f"det_r={hit / truth if truth else 0:.3f}"]
    totals = [s.total_found for s in scores if s.total_found is not None]
    if totals:
        parts.append(f"total_found={sum(totals)}/{len(totals)} ({sum(totals) / len(totals):.3f})")
    return "  ".join(parts)


def _run_set(name: str, root: Path, workdir: Path, *, limit: int | None, pages: bool) -> list[PageScore]:
    truth = SETS[name](root, limit=limit)
    if not truth:
        raise SystemExit(f"no {name} pages under {root}")
    workdir.mkdir(parents=True, exist_ok=True)
    results = run_paperlane([t.image for t in truth], workdir)
    scores = [score_page(t, results[t.image.stem]) for t in truth]
    for s in scores if pages else ():
        err = "" if s.ok else f"  error={results[s.name].get('error')!r}"
        print(f"  {name}/{s.name}: cer={s.cer:.4f} cer_nospace={s.cer_nospace:.4f} "
              f"lines={s.predicted}/{s.truth} matched={s.matched} total_found={s.total_found}{err}",
              flush=True)
    print(_summary(name, scores), flush=True)
    return scores


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    root = corpus_root(args.corpus)
    if not root.is_dir():
        print(f"corpus folder not found: {root}", file=sys.stderr)
        return 2
    every: list[PageScore] = []
    with tempfile.TemporaryDirectory(prefix="paperlane-accuracy-") as tmp:
        base = args.keep or Path(tmp)
        for name in args.sets:
            every += _run_set(name, root, base / name, limit=args.limit, pages=args.pages)
    print(f"corpus_cer={mean(s.cer for s in every):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
