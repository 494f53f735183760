"""Reading order: ordered CER beside the order-free CER, with paperlane's old row order and its block order.

    python benchmarks/reading_order.py [--corpus DIR] [--limit N] [--seeds N]
    python benchmarks/reading_order.py --public DIR [--public DIR] [--cache DIR] [--pages] [--half HALF]

``--public``: pages nobody tuned for, from a public set with its reading order: OmniDocBench's layout
annotations (``benchmarks/public_pages.py`` says where to get them and what is scored) or HRDoc's examples
(``benchmarks/hrdoc_pages.py``), the folder's format told from its files. OmniDocBench's pages are split by
name into a half to develop on and a half only measured on, HRDoc's by paper, each half in a row per layout
(two-column, single-column). Every line the engine found is ordered, as in the pipeline, and the lines in areas
the truth leaves out are dropped afterwards. Every row has the ordered CER of ``text``, the same lines' best-order CER
(each line placed by the true block it overlaps most), the order-free character and word F1, the
region-order edit distance, and the ordering step's CPU ms per page.

The embedded engine (RapidOCR) reads each page once; its lines are then put in order two ways: the old
order (rows top to bottom, left to right within a row, as paperlane did before blocks) and the new one
(``build_result``: blocks by recursive XY-cut). Pages: multi-column pages made here with known text
(two and three columns under a full-width title, a footnote below; Latin, and Chinese when a CJK font
is installed, e.g. Debian's fonts-wqy-microhei) and the real scans of ../shared/corpus (SROIE receipts,
FUNSD forms: their truth is in row order, so the old order is right by construction there).
"""

from __future__ import annotations

import argparse
import glob
import sys
from collections import Counter
from pathlib import Path
from statistics import mean

import cv2
import numpy as np
from PIL import ImageFont

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.*

from paperlane.models.engine import EngineOutput, EngineRequest, PreparedImage  # noqa: E402
from paperlane.models.rapid import RapidEngine  # noqa: E402
from paperlane.schemas import Line, TaskSpec  # noqa: E402
from paperlane.workers.postprocess import build_result  # noqa: E402
from tests.corpus import SETS, corpus_root  # noqa: E402
from tests.pages import render_columns  # noqa: E402
from tests.scoring import cer_nospace, normalise  # noqa: E402

CHINESE = ("文档 扫描 识别 文字 图像 页面 表格 段落 标题 作者 日期 研究 方法 结果 数据 系统 模型 分析 中国 北京 上海 "
           "发票 金额 合计 银行 学校 时间 问题 发展 经济").split()
CJK_FONTS = ("/usr/share/fonts/truetype/wqy/wqy-microhei.ttc", "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + (
        ". Prints, per set, the mean whitespace-insensitive CER of the text in the old order and in the new order, "
        "and the order-free CER (max of characters missing and extra as multisets / truth length: the lowest "
        "CER any order of these lines could reach). Last line: multicolumn_cer_new=<mean over the made pages>."))
    p.add_argument("--corpus", type=Path, default=None, help="default: env PAPERLANE_CORPUS, else ../shared/corpus")
    p.add_argument("--limit", type=int, default=None, help="at most N corpus pages per set")
    p.add_argument("--seeds", type=int, default=2, help="made pages per layout and script")
    p.add_argument("--public", type=Path, action="append", default=None,
                   help="an OmniDocBench folder (its JSON and images/) or an HRDoc one (<doc>.json beside <doc>/, "
                        "or HRDS/ and HRDH/ holding them): score those pages instead; may be given again")
    p.add_argument("--cache", type=Path, default=None, help="keep the engine's lines of the public pages here")
    p.add_argument("--pages", action="store_true", help="print each public page's figures")
    p.add_argument("--papers", type=Path, action="append", default=None,
                   help="DocBank's sample folder: also score every two-column page of its develop-half papers' "
                        "PDFs, unlabelled (benchmarks/docbank_papers.py); or a folder of other papers' PDFs "
                        "(<paper>.pdf, all developed on, rows papers-<folder>); develop half only; may be given again")
    p.add_argument("--papers-dpi", type=int, action="append", default=None,
                   help="render --papers pages at this dpi (72: read at 3x, as HRDoc's); may be given again; "
                        "default 200 and 72")
    p.add_argument("--per-paper", type=int, default=None, help="at most N --papers pages of each paper")
    p.add_argument("--half", choices=("develop", "measure", "both"), default="both",
                   help="the public half (halves) to score: develop while working, measure rarely")
    return p


def order_free_cer(pred: str, truth: str) -> float:
    p, t = Counter(normalise(pred).replace(" ", "")), Counter(normalise(truth).replace(" ", ""))
    total = sum(t.values())
    return max(sum((t - p).values()), sum((p - t).values())) / total if total else 0.0


def old_order(lines: list[Line]) -> list[Line]:
    """paperlane's order before blocks: rows top to bottom (overlap with a row's first line), left to right."""
    def span(ln: Line) -> tuple[float, float]:
        ys = [q[1] for q in ln.quad or ()]
        return min(ys), max(ys)

    rows: list[list[Line]] = []
    for ln in sorted(lines, key=lambda ln: span(ln)[0]):
        top, bottom = span(ln)
        if rows:
            rt, rb = span(rows[-1][0])
            if min(bottom, rb) - max(top, rt) > 0.5 * min(bottom - top, rb - rt):
                rows[-1].append(ln)
                continue
        rows.append([ln])
    return [ln for row in rows for ln in sorted(row, key=lambda ln: min(q[0] for q in ln.quad or ()))]


def _read(engine: RapidEngine, image: np.ndarray) -> tuple[str, str]:
    """The page's text in the old order and in the new one."""
    h, w = image.shape[:2]
    prepared = PreparedImage(w, h, w, h, pixels=image)
    [out] = engine.infer([EngineRequest(image=prepared, spec=TaskSpec())])
    assert isinstance(out, EngineOutput), out
    result = build_result(job_id="bench", source="bench", page=1, spec=TaskSpec(), output=out, image=prepared,
                          size=(w, h), engine=engine.info)
    return "\n".join(ln.text for ln in old_order(out.lines)), result.text


def _score(name: str, pages: list[tuple[np.ndarray, str]], engine: RapidEngine) -> tuple[list[float], list[float]]:
    old, new, free = [], [], []
    for image, truth in pages:
        before, after = _read(engine, image)
        old.append(cer_nospace(before, truth))
        new.append(cer_nospace(after, truth))
        free.append(order_free_cer(after, truth))
    print(f"{name}: pages={len(pages)} cer_old_order={mean(old):.4f} cer_new_order={mean(new):.4f} "
          f"cer_order_free={mean(free):.4f}", flush=True)
    return old, new


def _made_pages(seeds: int) -> dict[str, list[tuple[np.ndarray, str]]]:
    sets: dict[str, list[tuple[np.ndarray, str]]] = {}
    cjk = (next((f for f in CJK_FONTS if Path(f).exists()), None)
           or next(iter(glob.glob("/usr/share/fonts/**/*wqy*", recursive=True)), None))
    scripts: list[tuple[str, ImageFont.FreeTypeFont | None, list[str] | None, str]] = [("latin", None, None, " ")]
    if cjk:
        scripts.append(("chinese", ImageFont.truetype(cjk, 30), CHINESE, ""))
    else:
        print("chinese: skipped (no CJK font: apt-get install fonts-wqy-microhei)", flush=True)
    for script, font, words, joiner in scripts:
        for columns in (2, 3):
            sets[f"{script}-{columns}col"] = [
                _decoded(*render_columns(columns, seed=seed, font=font, words=words, joiner=joiner))
                for seed in range(seeds)]
    return sets


def _decoded(png: bytes, truth: str) -> tuple[np.ndarray, str]:
    return np.asarray(cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)), truth


def _halves(choice: str) -> tuple[str, ...]:
    return ("develop", "measure") if choice == "both" else (choice,)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.public is not None or args.papers is not None:
        from benchmarks.reading_order_public import run
        run(args.public or [], cache=args.cache, per_page=args.pages, halves=_halves(args.half),
            papers=args.papers or (), papers_dpi=args.papers_dpi or (200, 72), per_paper=args.per_paper)
        return 0
    engine = RapidEngine()
    engine.start()
    made_old: list[float] = []
    made: list[float] = []
    for name, pages in _made_pages(args.seeds).items():
        old, new = _score(name, pages, engine)
        made_old += old
        made += new
    root = corpus_root(args.corpus)
    if root.is_dir():
        for name, load in SETS.items():
            truth = load(root, limit=args.limit)
            scans = [(np.asarray(cv2.imread(str(t.image), cv2.IMREAD_COLOR)), t.text) for t in truth]
            _score(f"corpus-{name}", scans, engine)
    else:
        print(f"corpus: skipped (not found at {root})", flush=True)
    print(f"multicolumn_cer_old={mean(made_old):.4f}")
    print(f"multicolumn_cer_new={mean(made):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
