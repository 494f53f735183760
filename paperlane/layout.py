"""Blocks and reading order from line geometry, and word boxes laid out along a line.

    order_lines(lines, *, page_height, settings) -> (lines, blocks)   # lines in reading order, each with its block
    estimate_words(text, quad, *, confidence=None, rtl=False) -> list[Word]
    is_rtl(texts) -> bool

Reading order is a recursive XY-cut over the lines' boxes (original pixels), with distances measured in
the page's median line height:

1. The lines are cut into horizontal bands wherever no line spans the gap, and consecutive bands are
   merged into *runs* while a blank vertical strip (a *gutter*, at least ``min_gutter`` wide) still
   runs through all of them. A full-width title, a footnote or a paragraph across the columns breaks a
   run, so it is read where it stands, before or after the columns, never in the middle of a column;
   so does a band without a gutter of its own that starts a paragraph gap below the end of every column
   (a footnote narrower than a column). The price: a column that runs on below its neighbour's end and
   starts a new paragraph down there is read after its neighbour. A newspaper's headline (a line at least
   1.5 line heights tall) alone in its band ends the run above it when it closes one of its gutters, and
   starts a run of the columns below it even when it is shorter than they are wide; and a gutter beside
   such a headline, between its column and one that starts right under it, is no gutter (the article's
   columns stay together under their headline). Several runs: each is ordered again from step 1, top to
   bottom.
2. One run splits at its gutters into columns, read left to right (right to left on a right-to-left
   page), when every column is *running text* and no two neighbours are one table:
   - a column is at least ``min_column_width`` wide and has ``min_column_lines`` lines, and once it is
     cut into its own runs and columns (steps 1-2 again), most of its lines are in parts whose median
     line spans ``column_fill`` of the part's width. A narrower strip (a receipt's prices) or a part
     holding a form's labels and values side by side is no column: those lines stay in row order with
     their neighbours, as a reader reads a table row;
   - two neighbouring strips are one table (a form's labels and their values) when their lines pair up
     row by row (``table_pairs`` of the shorter strip's lines share a row with the other's) and both
     strips' rows are at least ``table_pitch`` apart: columns of running text, even with their lines
     on the same baselines, are denser.
   Each column is ordered again from step 1.
3. A single column's lines are read in rows (top to bottom; left to right within a row, or right to
   left) and cut into blocks where a blank gap is at least ``paragraph_gap`` tall.

A first block of one or two lines no taller than the page's usual lines that lies in the top
``margin_band`` of the page, above all else, is a header; a last one in the bottom band, a footer.
Vertical (top-to-bottom) CJK columns are not recognised: each is read as a line.

Words: engines that give only lines get their words laid out along the line's quad in proportion to
their characters' widths (wide CJK characters count double), marked ``estimated``.
"""

from __future__ import annotations

import functools
import re
import statistics
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from paperlane.schemas import Block, BlockKind, Line, Point, Word
from paperlane.settings import LayoutSettings

Box = tuple[float, float, float, float]  # x0, y0, x1, y1
HEADLINE = 1.5  # a line this many median line heights tall is a headline, not running text (also paperlane.gutters)


def order_lines(lines: Sequence[Line], *, page_height: float | None = None,
                settings: LayoutSettings | None = None) -> tuple[list[Line], list[Block]]:
    """``lines`` in reading order, each with ``block`` set, and the blocks in reading order.

    Lines without a usable quad leave the page as it came (the engine's order, no blocks).
    """
    groups = line_groups(lines, page_height=page_height, settings=settings)
    if groups is None:
        return list(lines), []
    boxes = [quad_box(ln.quad or []) for ln in lines]
    ordered: list[Line] = []
    blocks: list[Block] = []
    for number, (kind, group) in enumerate(groups):
        blocks.append(Block(kind=kind, quad=box_quad(union_box([boxes[i] for i in group]))))
        ordered += [lines[i].model_copy(update={"block": number}) for i in group]
    return ordered, blocks


def line_groups(lines: Sequence[Line], *, page_height: float | None = None,
                settings: LayoutSettings | None = None) -> list[tuple[BlockKind, list[int]]] | None:
    """What ``order_lines`` orders, as indices: the blocks in reading order, each its kind and the indices in
    ``lines`` of its lines in reading order; None when a line has no usable quad (or there are none)."""
    if not lines or not all(_usable(ln.quad) for ln in lines):
        return None
    settings = settings or LayoutSettings()
    boxes = [quad_box(ln.quad or []) for ln in lines]
    unit = max(1.0, statistics.median(b[3] - b[1] for b in boxes))
    groups = _Cutter(boxes, unit, settings, rtl=is_rtl(ln.text for ln in lines)).order(list(range(len(lines))))
    return list(zip(_margin_kinds(groups, boxes, unit, page_height, settings), groups))


def column_pieces(boxes: Sequence[Box], *, unit: float, settings: LayoutSettings | None = None,
                  rtl: bool = False) -> list[list[int]]:
    """The indices of ``boxes`` cut as ``order_lines`` cuts them at the top: into runs, top to bottom, and each
    run into its columns of running text. One piece, all of them, when no run has columns."""
    cutter = _Cutter(list(boxes), unit, settings or LayoutSettings(), rtl)
    runs = cutter._runs(list(range(len(boxes))))
    split = [cutter._columns(run) if len(run) > 1 else None for run in runs]
    if not any(split):
        return [list(range(len(boxes)))]
    return [piece for run, columns in zip(runs, split) for piece in (columns or [run])]


def one_table(boxes: Sequence[Box], a: list[int], b: list[int], *, unit: float,
              settings: LayoutSettings | None = None) -> bool:
    """Whether the strips ``a`` and ``b`` of ``boxes``, side by side, are one table read in rows (their lines pair
    up row by row, as ``order_lines`` tells a table from columns)."""
    return _Cutter(list(boxes), unit, settings or LayoutSettings(), rtl=False)._table_rows(a, b)


def columns_side_by_side(boxes: Sequence[Box], *, unit: float, settings: LayoutSettings | None = None) -> int:
    """The most columns of running text ``order_lines`` finds side by side at one height of the page: its parts
    read in rows, of at least ``min_column_lines`` lines, whose vertical extents hold the middle of one of them."""
    settings = settings or LayoutSettings()
    cutter = _Cutter(list(boxes), unit, settings, rtl=False)
    leaves = [leaf for leaf in cutter._leaves(list(range(len(boxes)))) if len(leaf) >= settings.min_column_lines]
    spans = [(cutter._top(leaf), cutter._bottom(leaf)) for leaf in leaves]
    return max((sum(top <= (a + b) / 2 <= bottom for top, bottom in spans) for a, b in spans), default=0)


def quad_box(quad: Sequence[Point]) -> Box:
    xs, ys = [p[0] for p in quad], [p[1] for p in quad]
    return min(xs), min(ys), max(xs), max(ys)


def box_quad(box: Box) -> list[Point]:
    x0, y0, x1, y1 = (round(v, 1) for v in box)
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


def is_rtl(texts: Iterable[str]) -> bool:
    """Whether most strongly directional characters of ``texts`` are right-to-left (Hebrew, Arabic)."""
    rtl = ltr = 0
    for text in texts:
        if text.isascii():  # no right-to-left character; its left-to-right ones are its letters
            ltr += len(_ASCII_LETTERS.findall(text))
            continue
        for ch in text:
            kind = unicodedata.bidirectional(ch)
            rtl += kind in ("R", "AL")
            ltr += kind == "L"
    return rtl > ltr


_ASCII_LETTERS = re.compile("[A-Za-z]")


def _usable(quad: Sequence[Point] | None) -> bool:
    return bool(quad) and len(quad or ()) == 4 and all(v == v and abs(v) < 1e7 for p in quad or () for v in p)


def in_row(a: Box, b: Box) -> bool:
    """Whether two lines share a row: they overlap vertically by more than half the smaller height."""
    return min(a[3], b[3]) - max(a[1], b[1]) > 0.5 * min(a[3] - a[1], b[3] - b[1])


def union_box(boxes: Sequence[Box]) -> Box:
    return min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes)


@dataclass
class _Cutter:
    boxes: list[Box]
    unit: float  # the median line height: every distance is a multiple of it
    settings: LayoutSettings
    rtl: bool
    _leaves_of: dict[tuple[int, ...], list[list[int]]] = field(default_factory=dict)  # each set's cut, once

    def order(self, idx: list[int]) -> list[list[int]]:
        """The blocks of ``idx`` in reading order, each its lines in reading order."""
        return [block for leaf in self._leaves(idx) for block in self._paragraphs(leaf)]

    def _leaves(self, idx: list[int]) -> list[list[int]]:
        """``idx`` cut into runs and columns, again and again, down to the parts read in rows; in reading order.
        Deciding whether a part is a column cuts it too, so each set of lines is cut once and remembered."""
        key = tuple(sorted(idx))
        if key not in self._leaves_of:
            runs = self._runs(idx)
            columns = self._columns(idx) if len(runs) == 1 else runs
            self._leaves_of[key] = ([idx] if columns is None
                                    else [leaf for part in columns for leaf in self._leaves(part)])
        return self._leaves_of[key]

    def _gutters(self, idx: Sequence[int]) -> list[float]:
        """Where blank vertical strips at least ``min_gutter`` wide run through all of ``idx`` (their middles)."""
        cover = self._cover([(self.boxes[i][0], self.boxes[i][2]) for i in idx])
        return [(a[1] + b[0]) / 2 for a, b in zip(cover, cover[1:])]

    def _cover(self, spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
        """The horizontal extents of ``spans`` joined where they are less than a gutter apart, left to right."""
        gap = self.settings.min_gutter * self.unit
        cover: list[tuple[float, float]] = []
        for x0, x1 in sorted(spans):
            if cover and x0 - cover[-1][1] < gap:
                cover[-1] = (cover[-1][0], max(cover[-1][1], x1))
            else:
                cover.append((x0, x1))
        return cover

    def _columns(self, idx: list[int]) -> list[list[int]] | None:
        """``idx`` cut at its gutters into columns of running text in reading order, or None."""
        cuts = self._headed(idx, self._gutters(idx)) if len(idx) > 1 else []
        for chosen in (cuts, self._widest(idx, cuts)):
            if not chosen:
                continue
            parts = self._split_at(idx, chosen)
            if all(self._is_column(part) for part in parts) and not any(
                    self._table_rows(a, b) for a, b in zip(parts, parts[1:])):
                return parts[::-1] if self.rtl else parts
        return None

    def _split_at(self, idx: list[int], cuts: list[float]) -> list[list[int]]:
        parts: list[list[int]] = [[] for _ in range(len(cuts) + 1)]
        for i in idx:
            parts[sum(self.boxes[i][0] > cut for cut in cuts)].append(i)
        return parts

    def _headed(self, idx: list[int], cuts: list[float]) -> list[float]:
        """``cuts`` less those between a part that starts with a headline and the next part in reading order
        when that one starts right under the headline: a headline shorter than its article's columns leaves a
        gutter beside it, but the column that starts under it is its article's."""
        parts = self._split_at(idx, cuts)
        pairs = [(parts[k + 1], parts[k]) if self.rtl else (parts[k], parts[k + 1]) for k in range(len(cuts))]
        return [cut for cut, (first, then) in zip(cuts, pairs) if not self._under_headline(first, then)]

    def _under_headline(self, first: list[int], then: list[int]) -> bool:
        if not first or not then:
            return False
        top = min(first, key=lambda i: self.boxes[i][1])
        bottom = self.boxes[top][3]
        return self._headline([top]) and bottom <= self._top(then) <= bottom + 2 * self.unit

    def _widest(self, idx: list[int], cuts: list[float]) -> list[float]:
        """The one gutter with the most room, when there are several (the others may split a table)."""
        if len(cuts) < 2:
            return []

        def room(cut: float) -> float:
            return min(abs(self.boxes[i][0 if self.boxes[i][0] > cut else 2] - cut) for i in idx)

        return [max(cuts, key=room)]

    def _is_column(self, part: list[int]) -> bool:
        """Whether ``part`` is a column of running text: wide enough, lines enough, and most of its lines in
        parts (once it is cut into its own runs and columns) that read as running text."""
        x0, _, x1, _ = union_box([self.boxes[i] for i in part])
        if len(part) < self.settings.min_column_lines or x1 - x0 < self.settings.min_column_width * self.unit:
            return False
        running = sum(len(leaf) for leaf in self._leaves(part) if self._running(leaf))
        return 2 * running > len(part)

    def _running(self, leaf: list[int]) -> bool:
        """Whether the lines of a part read in rows are running text: their median line spans at least
        ``column_fill`` of the part's width (a strip of a form's labels and values side by side does not)."""
        if len(leaf) < 2:
            return True
        x0, _, x1, _ = union_box([self.boxes[i] for i in leaf])
        widths = [self.boxes[i][2] - self.boxes[i][0] for i in leaf]
        return statistics.median(widths) >= self.settings.column_fill * (x1 - x0)

    def _table_rows(self, a: list[int], b: list[int]) -> bool:
        """Whether two neighbouring strips are one table read in rows: their lines pair up row by row (at least
        ``table_pairs`` of the shorter strip's lines share a row with a line of the other), and both strips'
        rows are at least ``table_pitch`` apart (running text in columns, even row-aligned, is denser)."""
        pitch = self.settings.table_pitch * self.unit
        if self._pitch(a) < pitch or self._pitch(b) < pitch:
            return False
        side = {i: 0 for i in a} | {i: 1 for i in b}
        paired = [0, 0]
        for row in self._rows(a + b):
            sides = {side[i] for i in row}
            if len(sides) == 2:
                for i in row:
                    paired[side[i]] += 1
        shorter = 0 if len(a) <= len(b) else 1
        return paired[shorter] >= self.settings.table_pairs * min(len(a), len(b))

    def _pitch(self, part: list[int]) -> float:
        """The median distance between the tops of consecutive rows of ``part`` (infinite for one row)."""
        tops = [min(self.boxes[i][1] for i in row) for row in self._rows(part)]
        if len(tops) < 2:
            return float("inf")
        return statistics.median(b - a for a, b in zip(tops, tops[1:]))

    def _bands(self, idx: list[int]) -> list[list[int]]:
        """``idx`` cut wherever no line spans a horizontal gap, top to bottom."""
        bands: list[list[int]] = []
        bottom = -float("inf")
        for i in sorted(idx, key=lambda i: self.boxes[i][1]):
            if not bands or self.boxes[i][1] >= bottom:
                bands.append([])
                bottom = self.boxes[i][3]
            bands[-1].append(i)
            bottom = max(bottom, self.boxes[i][3])
        return bands

    def _runs(self, idx: list[int]) -> list[list[int]]:
        """Consecutive bands merged while a gutter runs through them all (or while none has one)."""
        runs: list[list[int]] = []
        cover: list[tuple[float, float]] = []  # the current run's extents: several when it has a gutter
        for band in self._bands(idx):
            own = self._cover([(self.boxes[i][0], self.boxes[i][2]) for i in band])
            merged = self._cover(cover + own)
            if runs and not self._starts_run(runs[-1], band, cover=cover, own=own, merged=merged):
                runs[-1], cover = runs[-1] + band, merged
                continue
            runs.append(band)
            cover = own
        return runs

    def _starts_run(self, run: list[int], band: list[int], *, cover: list[tuple[float, float]],
                    own: list[tuple[float, float]], merged: list[tuple[float, float]]) -> bool:
        """Whether ``band`` (its extents ``own``) starts a new run below ``run`` (its extents ``cover``): when
        no gutter runs through both (unless neither has one); when it starts a paragraph's gap below the end
        of every column and has no gutter (a footnote or a closing paragraph under the columns, no column's
        continuation); when it is a headline alone that closes a gutter of the run (an article under it
        starts over some of the run's columns), or the run is a headline alone and the band has columns
        (the headline is over all of them, even when it is shorter than they are wide)."""
        split, gutter = len(cover) > 1, len(own) > 1
        if not (len(merged) > 1 or (not split and not gutter)):
            return True
        if split and not gutter:
            gap = self._top(band) - self._bottom(run)
            return gap >= self.settings.paragraph_gap * self.unit or (
                len(merged) < len(cover) and self._headline(band))
        return gutter and not split and self._headline(run)

    def _headline(self, idx: list[int]) -> bool:
        """Whether every line of ``idx`` is at least ``HEADLINE`` line heights tall."""
        return all(self.boxes[i][3] - self.boxes[i][1] >= HEADLINE * self.unit for i in idx)

    def _top(self, idx: list[int]) -> float:
        return min(self.boxes[i][1] for i in idx)

    def _bottom(self, idx: list[int]) -> float:
        return max(self.boxes[i][3] for i in idx)

    def _paragraphs(self, idx: list[int]) -> list[list[int]]:
        """One column's lines in rows, cut into blocks at tall blank gaps."""
        blocks: list[list[int]] = []
        bottom = -float("inf")
        for row in self._rows(idx):
            top = min(self.boxes[i][1] for i in row)
            if not blocks or top - bottom >= self.settings.paragraph_gap * self.unit:
                blocks.append([])
            blocks[-1] += row
            bottom = max(bottom, *(self.boxes[i][3] for i in row))
        return blocks

    def _rows(self, idx: list[int]) -> list[list[int]]:
        """Lines top to bottom, in rows: a line joins a row when it overlaps the row's FIRST line by more
        than half the smaller height (the first only: a tall margin note must not swallow several rows)."""
        rows: list[list[int]] = []
        for i in sorted(idx, key=lambda i: self.boxes[i][1]):
            if rows and in_row(self.boxes[i], self.boxes[rows[-1][0]]):
                rows[-1].append(i)
            else:
                rows.append([i])
        sign = -1 if self.rtl else 1
        return [sorted(row, key=lambda i: sign * self.boxes[i][0 if sign > 0 else 2]) for row in rows]


def _margin_kinds(groups: list[list[int]], boxes: list[Box], unit: float, page_height: float | None,
                  settings: LayoutSettings) -> list[BlockKind]:
    kinds = [BlockKind.PARAGRAPH] * len(groups)
    if not page_height or len(groups) < 2:
        return kinds
    band = settings.margin_band * page_height
    extents = [union_box([boxes[i] for i in group]) for group in groups]

    def small(group: list[int]) -> bool:
        return len(group) <= 2 and all(boxes[i][3] - boxes[i][1] <= 1.3 * unit for i in group)

    if small(groups[0]) and extents[0][3] <= band and all(e[1] >= extents[0][3] for e in extents[1:]):
        kinds[0] = BlockKind.HEADER
    if (small(groups[-1]) and extents[-1][1] >= page_height - band
            and all(e[3] <= extents[-1][1] for e in extents[:-1])):
        kinds[-1] = BlockKind.FOOTER
    return kinds


# -- words along a line ----------------------------------------------------------------------------------

_SPACE = 0.3  # the width of a space, in ems
_NARROW = frozenset(".,:;'!|`\"()[]{}ilIjft1")


@functools.lru_cache(maxsize=8192)
def _width(ch: str) -> float:
    """A character's rough advance in ems: what a proportional font of the script gives on average."""
    if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
        return 0.0
    if unicodedata.east_asian_width(ch) in ("W", "F"):
        return 1.0
    if ch in _NARROW:
        return 0.3
    return 0.7 if ch.isupper() or ch in "mwMW" else 0.55


def estimate_words(text: str, quad: Sequence[Point], *, confidence: float | None = None,
                   rtl: bool = False) -> list[Word]:
    """The words of ``text`` (split at whitespace) laid out along ``quad`` by their characters' widths,
    each marked ``estimated``; a right-to-left line's first word at its right end."""
    tokens = text.split()
    if not tokens or len(quad) != 4:
        return []
    # Every word's start and end as fractions of the line, then the points there on its top and bottom edges. Plain
    # floats: a line has a few words, where numpy's per-call cost was most of this (a page has hundreds of words:
    # this runs once for each line, on the CPU pool).
    widths = [sum(map(_width, token)) or 0.5 for token in tokens]
    length = sum(widths) + _SPACE * (len(widths) - 1)
    (x0, y0), (x1, y1), (x2, y2), (x3, y3) = quad

    # The points a fraction t along the top edge and along the bottom edge, to a tenth of a pixel (rounded as numpy
    # rounded them before: half to even, of the value x10).
    def at(t: float) -> tuple[Point, Point]:
        if rtl:
            t = 1.0 - t
        return ((round((x0 + (x1 - x0) * t) * 10) / 10, round((y0 + (y1 - y0) * t) * 10) / 10),
                (round((x3 + (x2 - x3) * t) * 10) / 10, round((y3 + (y2 - y3) * t) * 10) / 10))

    words, start = [], 0.0
    for token, width in zip(tokens, widths):
        (top_a, bottom_a), (top_b, bottom_b) = at(start / length), at((start + width) / length)
        if rtl:  # clockwise from the top-left corner: a right-to-left word's end is its left
            top_a, bottom_a, top_b, bottom_b = top_b, bottom_b, top_a, bottom_a
        words.append(Word(text=token, quad=[top_a, top_b, bottom_b, bottom_a], confidence=confidence, estimated=True))
        start += width + _SPACE
    return words
