"""A page as the archive formats write it: blocks of lines of words, every one with a box, in reading order.

``page_view(result)`` is the one place that decides what a page's text and geometry are, so ALTO,
PAGE XML and hOCR carry the same text in the same order; it is made once per page and handed to each format
(every builder takes a result or its view), with each box in whole pixels worked out once:

- A page that did not succeed has no blocks and a ``note`` (``page 3 failed: reason``); the formats
  write an empty page carrying that note, never drop it.
- The ``fields`` and ``translate`` tasks give no page text (their text is not what the page says): an
  empty page.
- Lines that all have boxes keep them: the result's blocks and reading order (worked out now for a
  result stored before blocks existed), each line's words (laid out along the line when the engine gave
  none, ``estimated``).
- Otherwise (VLM ``parse``, ``text``, box-less spotting) the text has no geometry: markdown becomes
  blocks (headings, paragraphs, HTML tables as a table block whose lines are its cells in row order),
  plain text becomes paragraphs at blank lines, and the lines are stacked from the top left of the page,
  one band a line, as the searchable PDF lays them out; every box of such a page is ``estimated``.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from paperlane.layout import box_quad, estimate_words, is_rtl, order_lines, quad_box
from paperlane.models.profiles import markdown_to_text
from paperlane.schemas import BlockKind, EngineInfo, PageResult, Point, Task, Word
from paperlane.status import JobStatus

_UNTEXTED_TASKS = (Task.FIELDS, Task.TRANSLATE)
_NOTE_CHARS = 300  # a failure's reason is cut to this
_A4_PX = (2480, 3508)  # a page of no known size, at 300 dpi (what the searchable PDF assumes too)

Box = tuple[int, int, int, int]  # left, top, right, bottom: whole pixels, never negative


@dataclass(frozen=True, slots=True)
class WordView:
    text: str
    quad: Sequence[Point]
    box: Box
    confidence: float | None  # the word's own, else its line's (RapidOCR's words have none of their own)
    estimated: bool  # laid out along its line by paperlane, not read from the page


@dataclass(frozen=True, slots=True)
class LineView:
    text: str
    quad: Sequence[Point]
    box: Box
    confidence: float | None
    words: list[WordView]
    estimated: bool  # the line's box was laid out by paperlane, not read from the page


@dataclass(frozen=True, slots=True)
class BlockView:
    kind: BlockKind
    quad: Sequence[Point]
    box: Box
    lines: list[LineView]


@dataclass(frozen=True)
class PageView:
    number: int
    width: int | None  # pixels of the page image the boxes are in (None: unknown, the page failed early)
    height: int | None
    blocks: list[BlockView]
    rtl: bool
    note: str | None = None  # why the page has no text (it did not succeed)
    confidence: float | None = None  # the page's confidence (its quality grade's, else its lines' mean)
    needs_review: bool | None = None  # from the quality grade, when the result has one
    flags: tuple[str, ...] = ()
    engine: EngineInfo | None = None  # what read the page
    estimated: bool = False  # some box of the page was laid out by paperlane

    @property
    def lines(self) -> list[LineView]:
        return [line for block in self.blocks for line in block.lines]

    @property
    def text(self) -> str:
        """The page's text in reading order, a line a line."""
        return "\n".join(line.text for line in self.lines)


def page_view(result: PageResult) -> PageView:
    """What the archive formats write for ``result`` (see the module docstring)."""
    base: dict[str, Any] = {"number": result.page, "width": result.width, "height": result.height,
                            "engine": result.engine, **_quality(result)}
    if result.status is not JobStatus.SUCCEEDED:
        return PageView(blocks=[], rtl=False, note=page_problem(result), **base)
    if result.task in _UNTEXTED_TASKS:
        return PageView(blocks=[], rtl=False, **base)
    rtl = is_rtl(ln.text for ln in result.lines) if result.lines else is_rtl([result.text])
    if result.lines and all(_usable(ln.quad, result) for ln in result.lines):
        blocks = _measured(result, rtl)
    else:
        blocks = _stacked(_text_blocks(result), result, rtl)
    estimated = any(ln.estimated or any(w.estimated for w in ln.words) for b in blocks for ln in b.lines)
    return PageView(blocks=blocks, rtl=rtl, estimated=estimated, **base)


def as_view(page: PageResult | PageView) -> PageView:
    """``page`` itself when it is a view already, else its view: callers that write several formats of a page
    make its view once and pass it to each."""
    return page if isinstance(page, PageView) else page_view(page)


def page_problem(result: PageResult) -> str:
    """Why a page has no text, in one line: ``page 3 failed: reason`` or ``page 3 has no result (queued)``."""
    if result.status is JobStatus.FAILED:
        reason = clean_text(result.error or "") or "no reason given"
        return f"page {result.page} failed: {reason[:_NOTE_CHARS]}"
    return f"page {result.page} has no result ({result.status.value})"


def clean_text(text: str) -> str:
    """One line of text: whitespace runs become one space; control characters, lone surrogates and
    what XML cannot hold go."""
    return " ".join(_UNFIT.sub("", text).split())


# Control characters that are not whitespace, lone surrogates, and the two non-characters XML refuses.
_UNFIT = re.compile("[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]")


def _quality(result: PageResult) -> dict[str, Any]:
    """The page's confidence and review marks: from ``result.quality`` when the result has a grade
    (its ``confidence``, ``needs_review`` and ``flags``), else the mean of its lines' confidences."""
    quality = getattr(result, "quality", None)
    if quality is not None:
        flags = getattr(quality, "flags", None) or ()
        return {"confidence": getattr(quality, "confidence", None),
                "needs_review": getattr(quality, "needs_review", None),
                "flags": tuple(str(getattr(flag, "value", flag)) for flag in flags)}
    scores = [ln.confidence for ln in result.lines if ln.confidence is not None]
    return {"confidence": round(statistics.fmean(scores), 4) if scores else None}


def _usable(quad: list[Point] | None, result: PageResult) -> bool:
    reach = 2 * max(result.width or 0, result.height or 0, 1)
    return bool(quad) and len(quad or ()) == 4 and all(
        v == v and abs(v) <= reach for point in quad or () for v in point)


def _measured(result: PageResult, rtl: bool) -> list[BlockView]:
    lines, blocks = result.lines, result.blocks
    if not blocks or any(ln.block is None or not 0 <= ln.block < len(blocks) for ln in lines):
        lines, blocks = order_lines(lines, page_height=result.height)  # a result from before blocks
    grouped: list[list[LineView]] = [[] for _ in blocks]
    for ln in lines:
        quad, confidence = ln.quad or [], ln.confidence
        words = [_word(w, confidence) for w in
                 ln.words or estimate_words(ln.text, quad, confidence=confidence, rtl=rtl)]
        kept = [w for w in words if w.text]
        if kept:
            grouped[ln.block or 0].append(LineView(" ".join(w.text for w in kept), quad, pixel_box(quad), confidence,
                                                   kept, estimated=False))
    views = []
    for block, group in zip(blocks, grouped):
        if group:
            quad = block.quad or _around([ln.quad for ln in group])
            views.append(BlockView(block.kind, quad, pixel_box(quad), group))
    return views


def _word(word: Word, line_confidence: float | None) -> WordView:
    text = word.text
    if not text.isprintable() or " " in text:  # printable and spaceless: nothing for clean_text to do
        text = clean_text(text)
    confidence = word.confidence if word.confidence is not None else line_confidence
    return WordView(text, word.quad, pixel_box(word.quad), confidence, word.estimated)


def _around(quads: Sequence[Sequence[Point]]) -> list[Point]:
    boxes = [quad_box(q) for q in quads]
    return box_quad((min(b[0] for b in boxes), min(b[1] for b in boxes),
                     max(b[2] for b in boxes), max(b[3] for b in boxes)))


# -- text without geometry -------------------------------------------------------------------------------

_TABLE = re.compile(r"<table\b.*?</table\s*>", re.IGNORECASE | re.DOTALL)
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s")


def _text_blocks(result: PageResult) -> list[tuple[BlockKind, list[str]]]:
    """The page's text as blocks of lines: from its markdown (parse), its box-less lines, or its text."""
    if result.markdown is not None and result.task is Task.PARSE:
        return _markdown_blocks(result.markdown)
    if result.lines:
        return [(BlockKind.PARAGRAPH, [t for ln in result.lines if (t := clean_text(ln.text))])]
    return _plain_blocks(result.text)


def _markdown_blocks(markdown: str) -> list[tuple[BlockKind, list[str]]]:
    blocks: list[tuple[BlockKind, list[str]]] = []
    at = 0
    for table in _TABLE.finditer(markdown):
        blocks += _prose_blocks(markdown[at:table.start()])
        cells = [text for row in markdown_to_text(table.group(0)).splitlines() for c in row.split("\t")
                 if (text := clean_text(c))]
        if cells:
            blocks.append((BlockKind.TABLE, cells))
        at = table.end()
    return blocks + _prose_blocks(markdown[at:])


def _prose_blocks(markdown: str) -> list[tuple[BlockKind, list[str]]]:
    """Paragraphs at blank lines; a heading line is a block of its own."""
    blocks: list[tuple[BlockKind, list[str]]] = []
    for chunk in _PARAGRAPH_BREAK.split(markdown):
        paragraph: list[str] = []
        for source in chunk.splitlines():
            text = clean_text(markdown_to_text(source))
            if text and _HEADING.match(source):
                blocks += [(BlockKind.PARAGRAPH, paragraph)] if paragraph else []
                blocks.append((BlockKind.HEADING, [text]))
                paragraph = []
            elif text:
                paragraph.append(text)
        blocks += [(BlockKind.PARAGRAPH, paragraph)] if paragraph else []
    return blocks


def _plain_blocks(text: str) -> list[tuple[BlockKind, list[str]]]:
    return [(BlockKind.PARAGRAPH, lines) for chunk in _PARAGRAPH_BREAK.split(text)
            if (lines := [t for row in chunk.splitlines() if (t := clean_text(row))])]


def _stacked(blocks: list[tuple[BlockKind, list[str]]], result: PageResult, rtl: bool) -> list[BlockView]:
    """Blocks of box-less lines, stacked from the page's top, one band a line (all boxes estimated)."""
    count = sum(len(lines) for _, lines in blocks)
    width, height = (result.width or _A4_PX[0], result.height or _A4_PX[1])
    margin = min(width, height) / 20
    size = max(1.0, min((height - 2 * margin) / max(count, 1), height / 70))
    views, row = [], 0
    for kind, texts in blocks:
        lines = []
        for text in texts:
            x0, y0 = margin, margin + row * size
            x1 = x0 + min(len(text) * 0.5 * size, width - 2 * margin)
            quad = [(round(x0, 1), round(y0, 1)), (round(x1, 1), round(y0, 1)),
                    (round(x1, 1), round(y0 + size, 1)), (round(x0, 1), round(y0 + size, 1))]
            words = [_word(w, None) for w in estimate_words(text, quad, rtl=rtl)]
            lines.append(LineView(text, quad, pixel_box(quad), None, words, estimated=True))
            row += 1
        quad = _around([ln.quad for ln in lines])
        views.append(BlockView(kind, quad, pixel_box(quad), lines))
    return views


def pixel_box(quad: Sequence[Point]) -> Box:
    """The whole-pixel box around ``quad``: left, top, right, bottom (never negative, never inside out)."""
    if len(quad) == 4:
        (ax, ay), (bx, by), (cx, cy), (dx, dy) = quad
        x0, x1, y0, y1 = min(ax, bx, cx, dx), max(ax, bx, cx, dx), min(ay, by, cy, dy), max(ay, by, cy, dy)
    else:
        xs, ys = [p[0] for p in quad] or [0.0], [p[1] for p in quad] or [0.0]
        x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    left, top = max(0, int(x0)), max(0, int(y0))
    return left, top, max(left, round(x1)), max(top, round(y1))


@lru_cache(maxsize=4096)
def confidence_text(value: float) -> str:
    """A confidence (0-1) as ALTO's ``WC`` and ``PC`` and PAGE's ``conf`` take it; remembered: a line's words
    share theirs."""
    return f"{min(max(value, 0.0), 1.0):.4g}"


_POINTS4 = "%.0f,%.0f %.0f,%.0f %.0f,%.0f %.0f,%.0f"


def points(quad: Sequence[Point]) -> str:
    """``x,y x,y ...`` in whole non-negative pixels (what PAGE XML's and ALTO's polygons take)."""
    if len(quad) == 4:
        (ax, ay), (bx, by), (cx, cy), (dx, dy) = quad
        flat = (ax, ay, bx, by, cx, cy, dx, dy)
        if min(flat) >= 0:  # the usual quad: "%.0f" rounds half to even as round() does, in one call
            return _POINTS4 % flat
    return " ".join(f"{max(0, round(x))},{max(0, round(y))}" for x, y in quad)


def producer(engines: Sequence[Any]) -> str:
    """``paperlane 0.1.0 (engine rapidocr 3.4.0, model PP-OCR (bundled))``: who made the text."""
    from paperlane import __version__

    described = sorted({f"engine {e.name} {e.version}" + (f", model {e.model}" if e.model else "")
                        for e in engines if e is not None})
    return f"paperlane {__version__}" + (f" ({'; '.join(described)})" if described else "")
