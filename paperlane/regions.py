"""Reading order over layout regions, then lines: what a layout model found on the page, put in the order read.

    order_regions(lines, regions, *, page_size, settings) -> (lines, blocks)

``regions`` are boxes with a kind, in the page's original pixels (``paperlane.models.layout_model``). Each
line goes to the smallest region that holds at least half of it, or half of which it holds (the inner of nested
ones), and its box is cut to that region's (give or take ``region_slack``: the detector runs a line on across
a gutter now and then); lines in no region are grouped as ``paperlane.layout`` groups them, each group a region
of its own (the lines of a "figure" that is text, grouped among themselves; never lines that the page's own
geometry reads apart, nor lines apart both across and down the page). A figure, table or formula keeps its
region's box, however few lines it holds, and one with no line in it still takes its place on the page in the
cuts below. Then:

1. Running heads (``header``) are read first and running feet and page numbers (``footer``) last, each kept
   with its kind; ``layout.margins = "omit"`` leaves them out of ``text`` (they stay in the lines and blocks).
   A head with text wholly above it, or a foot with text wholly below it, is no margin: a paragraph in place.
2. The other regions are cut recursively, XY-cut style (``paperlane.xycut``): into bands where a blank
   horizontal strip crosses the set, read top to bottom, consecutive bands joined again while each splits into
   columns and together they still do (columns run on through gaps that happen to line up), or while one
   without columns (a section heading in one column) lies between columns that go on under it, or stands
   within one column going on under its neighbour's end (a last page's conclusion under the references); a
   row of centred blocks (a title page's authors, one over each column) starts no run and is read across
   before the columns under it; a set that is one such run is cut where a
   blank vertical strip runs through every region of it into columns, read left to right (right to left on
   a right-to-left page), a strip narrower than a column (a formula's number, or a piece of one standing out
   into the gutter) going with the nearer column. So a title or a figure across the columns ends the columns
   above it and starts those below it, and a footnote under the columns is read after them. Regions overlap a
   little where the model's boxes are loose: a strip is blank when no region reaches more than
   ``region_slack`` line heights into it. A set that neither cut separates (a newspaper's headline over some
   of its columns, beside another article's) is read by precedence (``paperlane.precedence``: above before
   below where they overlap, left before right unless something across both lies between them), not by its
   regions' tops, which would read across the columns.
   Before the cuts, a region whose lines have a gutter between columns of running text (the model drew one
   box across two columns) is cut into those columns and the runs above and below them
   (``paperlane.layout.column_pieces``), so that each column is read in its place on the page; and any region
   is cut where the gutter between two regions side by side just above or below it runs on blank through its
   lines (``_at_page_gutters``: a picture the model drew over both columns, a table with a sidebar beside it).
   The pieces of a text region so cut are cut again at its paragraphs' gaps (``_stacked``), and a text region
   that is centred blocks side by side (authors, each a name over an address) is cut into them.
3. Captions stay where they stand (next to what they caption, which the cuts keep together); a table's lines
   are read in rows within its region, which is read in its place.
4. Within a region, the lines are ordered by ``paperlane.layout`` (a region the model drew across two columns
   is still read column by column) and its paragraphs become the region's blocks, each with the region's kind.

A dense page, one whose lines' own geometry has ``dense_columns`` columns of running text side by side (a
newspaper, a magazine), is read by that geometry (``paperlane.layout``) and not over the regions: the model
(trained on books and papers) draws nested, overlapping boxes across such pages' narrow columns.

Vertical CJK text is not recognised (each vertical column is read as a line, as before); a right-to-left page
reads its columns right to left.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from paperlane.gutters import cut_at
from paperlane.layout import (Box, box_quad, column_pieces, columns_side_by_side, in_row, is_rtl, line_groups,
                              one_table, order_lines, quad_box, union_box)
from paperlane.schemas import Block, BlockKind, Line
from paperlane.settings import LayoutSettings
from paperlane.xycut import PICTURE_KINDS, Cut, Part, centred

KINDS = {"text": BlockKind.PARAGRAPH, "reference": BlockKind.PARAGRAPH, "title": BlockKind.HEADING,
         "figure_caption": BlockKind.CAPTION, "table_caption": BlockKind.CAPTION, "table": BlockKind.TABLE,
         "header": BlockKind.HEADER, "footer": BlockKind.FOOTER, "figure": BlockKind.OTHER,
         "equation": BlockKind.OTHER}
_TEXT = frozenset({BlockKind.PARAGRAPH, BlockKind.HEADING, BlockKind.CAPTION})
_FIGURE_LINES = 4  # a figure holding more lines than this is read as text: its lines go by their geometry
_FIRST, _LAST = frozenset({BlockKind.HEADER}), frozenset({BlockKind.FOOTER, BlockKind.PAGE_NUMBER})
_PICTURES = frozenset({"figure", "table", "equation"})
_GUTTER_REACH = 3  # line heights: a gutter between regions this far above or below a region runs on through it
_GUTTER_WIDTH = 4  # line heights: the widest such gutter (two regions further apart have room for more between)
_COLUMN_HEIGHT = 3  # line heights: the least a region's piece beside such a gutter runs down (a formula's are less)


@dataclass(frozen=True)
class Found:
    """A region as the layout model found it: its kind (the model's label) and box in original pixels."""

    kind: str
    box: Box


def order_regions(lines: Sequence[Line], regions: Sequence[Found], *, page_size: tuple[int, int],
                  settings: LayoutSettings | None = None) -> tuple[list[Line], list[Block]]:
    """``lines`` in reading order over ``regions``, each with ``block`` set, and the blocks in reading order."""
    settings = settings or LayoutSettings()
    boxes = [quad_box(ln.quad or []) for ln in lines]
    if not lines or not regions:
        return order_lines(lines, page_height=page_size[1], settings=settings)
    unit = max(1.0, statistics.median(b[3] - b[1] for b in boxes))
    if columns_side_by_side(boxes, unit=unit, settings=settings) >= settings.dense_columns:
        return order_lines(lines, page_height=page_size[1], settings=settings)
    regions = _plausible(regions)
    pieces = _across_gutters(lines, boxes, regions, unit, settings)
    if len(pieces) != len(lines):  # a line was cut: its pieces' boxes are new
        lines, boxes = pieces, [quad_box(ln.quad or []) for ln in pieces]
    placed = _assign(boxes, regions)
    held = set(placed)  # the regions that have lines
    freed = [-1] * len(lines)  # the figure a line was taken from, as below (-1: none)
    for n, r in enumerate(regions):  # a "figure" full of lines is text the model took for a picture
        if r.kind == "figure" and _text_in_figure(r.box, [b for b, p in zip(boxes, placed) if p == n]):
            freed = [n if p == n else f for p, f in zip(placed, freed)]
            placed = [None if p == n else p for p in placed]
    boxes = [_clipped(b, regions[n].box, settings.region_slack * unit) if n is not None else b
             for b, n in zip(boxes, placed)]
    parts = [Part(KINDS.get(r.kind, BlockKind.PARAGRAPH), r.box, [i for i, p in enumerate(placed) if p == n])
             for n, r in enumerate(regions)]
    parts = [p for p in parts if p.lines] + _orphans(lines, boxes, placed, freed, page_size, settings)
    owner = {i: n for n, p in enumerate(parts) for i in p.lines}
    parts = [piece for n, p in enumerate(parts) for piece in _unmixed(p, n, boxes, owner)]
    parts = [piece for p in parts for piece in _columns_of(p, boxes, unit, settings)]
    parts = _at_page_gutters(parts, boxes, unit, settings)
    parts = [piece for p in parts for piece in _centred_blocks(p, boxes, unit)]
    _inner_margins(parts)
    for p in parts:
        if p.kind is BlockKind.FOOTER and all(lines[i].text.strip().isdigit() for i in p.lines):
            p.kind = BlockKind.PAGE_NUMBER
    rtl = is_rtl(ln.text for ln in lines)
    first = sorted((p for p in parts if p.kind in _FIRST), key=lambda p: (p.box[1], p.box[0]))
    last = sorted((p for p in parts if p.kind in _LAST), key=lambda p: (p.box[1], p.box[0]))
    body = [p for p in parts if p.kind not in _FIRST | _LAST]
    # A figure, table or formula the model found no line in still takes its place on the page: left out of the
    # cuts, captions on either side of it would be read as if nothing stood between them (a column of two captions
    # beside a column of text).
    body += [Part(KINDS[r.kind], r.box, []) for n, r in enumerate(regions)
             if n not in held and r.kind in _PICTURES]
    for p in body:
        p.centred = centred([boxes[i] for i in p.lines], unit)
    cut = Cut(settings.region_slack * unit, settings.min_column_width * unit, settings.paragraph_gap * unit, rtl)
    ordered = first + [p for p in cut.order(body) if p.lines] + last
    return _read(lines, ordered, page_size, settings)


def _unmixed(part: Part, number: int, boxes: list[Box], owner: dict[int, int]) -> list[Part]:
    """A region cut, top to bottom, wherever a line of another region lies inside the box of its lines (the
    model's boxes are loose and overlap: a region holding another's lines would be read around them); each
    piece's box is that of its lines. A figure, table or formula not cut keeps its own box too: a chart's few
    labels are narrower than the chart, which stands in its column as a whole (its labels' box, narrower than a
    column, left the column beside it read first, from the top of the page)."""
    mine = sorted(part.lines, key=lambda i: boxes[i][1])
    box = union_box([boxes[i] for i in mine])
    foreign = sorted(_centre(boxes[j])[1] for j in range(len(boxes))
                     if owner[j] != number and _inside(_centre(boxes[j]), box))
    pieces: list[list[int]] = [[]]
    for i in mine:
        if pieces[-1] and any(boxes[pieces[-1][-1]][3] <= y <= boxes[i][1] + 1 or
                              _centre(boxes[pieces[-1][-1]])[1] < y < _centre(boxes[i])[1] for y in foreign):
            pieces.append([])
        pieces[-1].append(i)
    if len(pieces) == 1 and part.kind in PICTURE_KINDS:  # a picture takes its place whole, not its labels'
        return [Part(part.kind, union_box([part.box, box]), mine)]
    return [Part(part.kind, union_box([boxes[i] for i in piece]), piece) for piece in pieces]


def _inner_margins(parts: list[Part]) -> None:
    """A running head with text wholly above it, or a running foot with text wholly below it, is no page
    margin (the model took a kicker, a section line or a caption for one): it becomes a paragraph, read in
    its place instead of first or last."""
    body = [p.box for p in parts if p.kind not in _FIRST | _LAST]
    for p in parts:
        if (p.kind in _FIRST and any(b[3] <= p.box[1] for b in body)) or (
                p.kind in _LAST and any(b[1] >= p.box[3] for b in body)):
            p.kind = BlockKind.PARAGRAPH


def _columns_of(part: Part, boxes: list[Box], unit: float, settings: LayoutSettings) -> list[Part]:
    """A region the model drew across columns (its lines have a gutter between columns of running text), cut
    into those columns (and the runs above and below them), so that each is read in its place on the page,
    and each piece at its paragraphs' gaps (``_stacked``); a table stays whole."""
    if part.kind is BlockKind.TABLE or len(part.lines) < 2 * settings.min_column_lines:
        return [part]
    pieces = column_pieces([boxes[i] for i in part.lines], unit=unit, settings=settings)
    if len(pieces) < 2:
        return [part]
    cuts = [Part(part.kind, union_box([boxes[part.lines[k]] for k in piece]), [part.lines[k] for k in piece])
            for piece in pieces]
    return [piece for cut in cuts for piece in _stacked(cut, boxes, settings.paragraph_gap * unit)]


def _centred_blocks(part: Part, boxes: list[Box], unit: float) -> list[Part]:
    """A text region that is blocks side by side, each of lines centred on an axis of its own (a title page's
    authors, a name over an affiliation and an address each, in one region), cut into those blocks, which the
    cut reads as a row (``xycut``): read whole, in rows, the names came first, then the affiliations."""
    if part.kind not in _TEXT:
        return [part]
    blocks: list[list[int]] = []
    end = -float("inf")
    for i in sorted(part.lines, key=lambda i: boxes[i][0]):
        if boxes[i][0] > end:
            blocks.append([])
        blocks[-1].append(i)
        end = max(end, boxes[i][2])
    if len(blocks) < 2 or not all(centred([boxes[i] for i in block], unit) for block in blocks):
        return [part]
    return [Part(part.kind, union_box([boxes[i] for i in block]), sorted(block, key=lambda i: boxes[i][1]))
            for block in blocks]


def _stacked(part: Part, boxes: list[Box], gap: float) -> list[Part]:
    """A region of text cut, top to bottom, at every blank across it at least ``gap`` (a paragraph's) tall: the
    model drew a region over a title page's authors and the abstract's heading under the first of them, and its
    piece in the left column stood in the way of the blank under the authors. Its pieces are read as its
    paragraphs would be anyway (``_read``)."""
    if part.kind not in _TEXT:
        return [part]
    pieces: list[list[int]] = []
    bottom = -float("inf")
    for i in sorted(part.lines, key=lambda i: boxes[i][1]):
        if not pieces or boxes[i][1] - bottom >= gap:
            pieces.append([])
        pieces[-1].append(i)
        bottom = max(bottom, boxes[i][3])
    if len(pieces) == 1:
        return [part]
    return [Part(part.kind, union_box([boxes[i] for i in piece]), piece) for piece in pieces]


def _at_page_gutters(parts: list[Part], boxes: list[Box], unit: float, settings: LayoutSettings) -> list[Part]:
    """Each region cut where a gutter of the page runs on through its lines: a blank vertical strip between its
    lines (lines on both sides) that continues the gap, at most ``_GUTTER_WIDTH`` line heights wide, between
    two other regions side by side just above or below it. The model draws a figure or a table across the
    page's columns now and then (a workbook's exercises as one picture over both columns, a report's table with
    the sidebar's foot beside it): read whole, its lines went across the gutter, or the sidebar's foot after the
    main column. Each piece runs at least ``_COLUMN_HEIGHT`` line heights down (the pieces of a line around an
    inline formula do not), and two strips that pair up row by row are one table's columns and stay whole.
    A region so cut is cut again at its paragraphs' gaps (``_stacked``)."""
    reach, gap = _GUTTER_REACH * unit, settings.paragraph_gap * unit
    strips = [(a.box[2], b.box[0], max(a.box[1], b.box[1]), min(a.box[3], b.box[3]), m, n)
              for m, a in enumerate(parts) for n, b in enumerate(parts)
              if 0 < b.box[0] - a.box[2] <= _GUTTER_WIDTH * unit
              and min(a.box[3], b.box[3]) > max(a.box[1], b.box[1])]

    def cut(part: Part, number: int) -> list[Part]:
        if len(part.lines) < 2 * settings.min_column_lines:
            return [part]
        top, bottom = part.box[1] - reach, part.box[3] + reach
        for g0, g1 in _gaps([boxes[i] for i in part.lines]):
            if not any(m != number != n and min(g1, s1) > max(g0, s0) and y1 >= top and y0 <= bottom
                       for s0, s1, y0, y1, m, n in strips):
                continue
            left = [i for i in part.lines if boxes[i][2] <= g0]
            right = [i for i in part.lines if boxes[i][2] > g0]
            if min(len(left), len(right)) < settings.min_column_lines:
                continue
            pieces = [Part(part.kind, union_box([boxes[i] for i in side]), side) for side in (left, right)]
            if all(p.box[3] - p.box[1] >= _COLUMN_HEIGHT * unit for p in pieces) and not one_table(
                    boxes, left, right, unit=unit, settings=settings):
                return [smaller for piece in pieces for stacked in _stacked(piece, boxes, gap)
                        for smaller in cut(stacked, number)]
        return [part]

    return [piece for n, p in enumerate(parts) for piece in cut(p, n)]


def _across_gutters(lines: Sequence[Line], boxes: list[Box], regions: Sequence[Found], unit: float,
                    settings: LayoutSettings) -> list[Line]:
    """``lines`` with each one that runs from one text region into another beside it cut in the gutter between
    them (``gutters.cut_at``): the recogniser read a column's line on into the next column's, through a
    gutter too narrow for its detector, and the line then belongs to neither column. A line is cut only where
    it runs at least ``min_piece`` line heights into each region, and both regions reach over its middle."""
    text = [r.box for r in regions if KINDS.get(r.kind, BlockKind.PARAGRAPH) in _TEXT]
    reach = settings.min_piece * unit
    out: list[Line] = []
    for line, (x0, y0, x1, y1) in zip(lines, boxes):
        middle = (y0 + y1) / 2
        beside = sorted((r for r in text if r[1] <= middle <= r[3]
                         and min(x1, r[2]) - max(x0, r[0]) >= reach), key=lambda r: r[0])
        gutter = next(((a[2] + b[0]) / 2 for a, b in zip(beside, beside[1:]) if a[2] <= b[0]), None)
        out += [line] if gutter is None else cut_at(line, gutter)
    return out


def _gaps(boxes: list[Box]) -> list[tuple[float, float]]:
    """The blank vertical strips between ``boxes``, left to right, widest first."""
    gaps, end = [], None
    for x0, _, x1, _ in sorted(boxes):
        if end is not None and x0 > end:
            gaps.append((end, x0))
        end = x1 if end is None else max(end, x1)
    return sorted(gaps, key=lambda g: g[0] - g[1])


def _text_in_figure(figure: Box, lines: list[Box]) -> bool:
    """Whether the lines the model found in a "figure" are text it took for a picture: more than a few, and most
    of them across at least half of it (a chart's labels and ticks are many but short)."""
    return len(lines) > _FIGURE_LINES and statistics.median(b[2] - b[0] for b in lines) >= 0.5 * (figure[2] - figure[0])


def _clipped(line: Box, region: Box, slack: float) -> Box:
    """A line's box cut to its region's, give or take ``slack``: a line the detector drew on past its column's
    edge, into the next column's lines, would leave no gutter between the two."""
    x0, y0, x1, y1 = (max(line[0], region[0] - slack), max(line[1], region[1] - slack),
                      min(line[2], region[2] + slack), min(line[3], region[3] + slack))
    return (x0, y0, x1, y1) if x0 < x1 and y0 < y1 else line


def _centre(b: Box) -> tuple[float, float]:
    return (b[0] + b[2]) / 2, (b[1] + b[3]) / 2


def _inside(point: tuple[float, float], b: Box) -> bool:
    return b[0] <= point[0] <= b[2] and b[1] <= point[1] <= b[3]


def _plausible(regions: Sequence[Found]) -> list[Found]:
    """The regions less the tables and figures drawn around a region of text, a title or a caption: the model
    took a stretch of the page for one picture, and the regions inside it are the better reading."""
    def holds(outer: Found, inner: Found) -> bool:
        return inner is not outer and _overlap(outer.box, inner.box) >= 0.8 * max(1.0, _area(inner.box))

    return [r for r in regions if not (r.kind in ("table", "figure") and any(
        holds(r, other) for other in regions if KINDS.get(other.kind) in _TEXT))]


def _assign(boxes: list[Box], regions: Sequence[Found]) -> list[int | None]:
    """Each line's region: the smallest of those holding at least half of it, or half of which it holds (a page
    number's box drawn tighter than its line's) (where the model nests a region inside a larger one, its loose
    box may hold a line's edge less than the outer one does: the inner region is the more particular reading of
    the line)."""
    placed: list[int | None] = []
    for box in boxes:
        area = max(1.0, (box[2] - box[0]) * (box[3] - box[1]))
        holding = [n for n, r in enumerate(regions) if _overlap(box, r.box) >= 0.5 * min(area, _area(r.box))]
        placed.append(min(holding, key=lambda n: _area(regions[n].box)) if holding else None)
    return placed


def _orphans(lines: Sequence[Line], boxes: list[Box], placed: list[int | None], freed: list[int],
             page_size: tuple[int, int], settings: LayoutSettings) -> list[Part]:
    """The lines in no region, grouped into blocks as ``paperlane.layout`` groups them, each block a region; the
    lines taken from a figure (``freed``: its number, else -1) are grouped among themselves, so that the labels
    of two charts side by side do not make one block across the columns. Two of them share a block only where
    the page's own geometry (all its lines) puts them in one paragraph too: a few lines alone show no columns,
    and an equation's number at the foot of one column and a line at the top of the next one made a block
    across the gutter (which then closed it, and the page was read across its columns)."""
    orphans = [i for i, p in enumerate(placed) if p is None]
    if not orphans:
        return []
    paragraph = {i: n for n, (_, group) in enumerate(line_groups(lines, settings=settings) or []) for i in group}
    out = []
    for origin in sorted({freed[i] for i in orphans}):
        idx = [i for i in orphans if freed[i] == origin]
        groups = (line_groups([lines[i] for i in idx], page_height=page_size[1], settings=settings)
                  or [(BlockKind.PARAGRAPH, list(range(len(idx))))])
        for kind, group in groups:
            apart: dict[int | None, list[int]] = {}
            for k in group:
                apart.setdefault(paragraph.get(idx[k]), []).append(idx[k])
            out += [Part(kind, union_box([boxes[i] for i in part]), part)
                    for piece in apart.values() for part in _side_by_side(piece, boxes)]
    return out


def _side_by_side(idx: list[int], boxes: list[Box]) -> list[list[int]]:
    """``idx`` cut into the sets of lines joined by overlapping horizontal extents or a row they share (one
    another's, or through others in the set); each set in the order given. Lines apart both ways (a heading at
    the foot of one column, a formula's last piece at the top of the next) are no paragraph."""
    owner = {i: i for i in idx}

    def root(i: int) -> int:
        while owner[i] != i:
            owner[i] = owner[owner[i]]
            i = owner[i]
        return i

    for a, i in enumerate(idx):
        for j in idx[a + 1:]:
            if min(boxes[i][2], boxes[j][2]) > max(boxes[i][0], boxes[j][0]) or in_row(boxes[i], boxes[j]):
                owner[root(i)] = root(j)
    sets: dict[int, list[int]] = {}
    for i in idx:
        sets.setdefault(root(i), []).append(i)
    return list(sets.values())


def _read(lines: Sequence[Line], parts: list[Part], page_size: tuple[int, int],
          settings: LayoutSettings) -> tuple[list[Line], list[Block]]:
    ordered: list[Line] = []
    blocks: list[Block] = []
    for part in parts:
        inner, sub = order_lines([lines[i] for i in part.lines], page_height=None, settings=settings)
        if not sub:
            sub = [Block(kind=part.kind, quad=box_quad(part.box))]
            inner = [ln.model_copy(update={"block": 0}) for ln in inner]
        base = len(blocks)
        blocks += [Block(kind=part.kind, quad=b.quad) for b in sub]
        ordered += [ln.model_copy(update={"block": base + (ln.block or 0)}) for ln in inner]
    return ordered, blocks


def _overlap(a: Box, b: Box) -> float:
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


def _area(b: Box) -> float:
    return (b[2] - b[0]) * (b[3] - b[1])
