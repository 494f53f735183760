"""CPU cost of writing a page's archive formats (ALTO, PAGE XML, hOCR), beside dumping its result JSON.

    python benchmarks/formats.py [--pages N] [--lines N]

Builds realistic page results without OCR (``--lines`` lines of 5-9 words each, every word with its own
box and confidence, blocks in two columns, as RapidOCR's results are), then times, on this process's
CPU clock, side by side in one run: the result JSON dump (what every page costs today), the page's view
(its text and boxes as the formats read them, made once per page), each format from that view, and all
three together from the result as a worker or ``paperlane run`` writes them (``document_files``: one view,
three files). Last line: formats_ms_per_page=<ALTO + PAGE XML + hOCR from the result, ms of CPU per page>.
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from paperlane.formats import Content, build, document_files, page_bytes
from paperlane.formats.view import PageView, page_view
from paperlane.layout import order_lines
from paperlane.schemas import EngineInfo, JobStatus, Line, OutputFormat, PageResult, Word

WORDS = ("invoice total amount paid customer account number date order shipping address payment balance "
         "receipt quantity price tax discount reference delivery company limited street 12.00 2024").split()


def page(seed: int, lines: int) -> PageResult:
    rnd = random.Random(seed)
    made = []
    for k in range(lines):
        x, y = (100 if k % 2 == 0 else 1300), 200 + (k // 2) * 60
        words, at = [], float(x)
        for _ in range(rnd.randint(5, 9)):
            text = rnd.choice(WORDS)
            width = 22.0 * len(text)
            words.append(Word(text=text, quad=[(at, y), (at + width, y), (at + width, y + 40), (at, y + 40)],
                              confidence=round(rnd.uniform(0.8, 1.0), 4)))
            at += width + 15
        made.append(Line(text=" ".join(w.text for w in words), confidence=round(rnd.uniform(0.85, 1.0), 4),
                         quad=[(x, y), (at, y), (at, y + 40), (x, y + 40)], words=words))
    ordered, blocks = order_lines(made, page_height=3508)
    return PageResult(job_id=f"job-{seed}", source="bench", page=1, status=JobStatus.SUCCEEDED,
                      text="\n".join(ln.text for ln in ordered), lines=ordered, blocks=blocks, width=2480,
                      height=3508, engine=EngineInfo(name="rapidocr", version="3.4.0", model="PP-OCR (bundled)"))


def _json(result: PageResult) -> bytes:  # what every page costs today (the result JSON the pipeline stores)
    return build(OutputFormat.JSON, Content([result]), page=result.page)


def _cpu_ms(work: Callable[[Any], object], pages: list[Any]) -> float:
    for p in pages[:3]:
        work(p)  # warm: imports
    t0 = time.process_time()
    for p in pages:
        work(p)
    return (time.process_time() - t0) * 1000 / len(pages)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--lines", type=int, default=40)
    args = parser.parse_args(argv)
    pages = [page(seed, args.lines) for seed in range(args.pages)]
    created = datetime(2026, 12, 1, tzinfo=UTC)
    json_ms = _cpu_ms(_json, pages)
    words = sum(len(ln.words or []) for ln in pages[0].lines)
    print(f"pages={args.pages} lines_per_page={args.lines} words_per_page={words}")
    print(f"json_ms_per_page={json_ms:.3f}")
    views: list[PageView] = [page_view(p) for p in pages]
    view_ms = _cpu_ms(page_view, pages)
    print(f"view_ms_per_page={view_ms:.3f} (made once per page, shared by the formats)")
    formats = (OutputFormat.ALTO, OutputFormat.PAGE, OutputFormat.HOCR)
    for fmt in formats:
        ms = _cpu_ms(functools.partial(page_bytes, fmt, name="scan", ext=".jpg", created=created), views)
        print(f"{fmt.value}_ms_per_page={ms:.3f} from the view ({ms / json_ms:.1f}x the JSON)")
    times = {1: created}
    total = _cpu_ms(lambda p: document_files(formats, Content([p], document_id="doc", name="scan", ext=".jpg",
                                                               created=times)), pages)
    print(f"all three from the result: {total / json_ms:.1f}x the JSON")
    print(f"formats_ms_per_page={total:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
