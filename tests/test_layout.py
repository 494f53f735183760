"""Reading order from line boxes (recursive XY-cut): columns, full-width titles and footnotes, tables
that must stay in rows, headers and footers, right-to-left pages; words laid out along a line."""

from __future__ import annotations

import random

import pytest

from paperlane.layout import estimate_words, order_lines
from paperlane.schemas import BlockKind, Line, Point
from paperlane.settings import LayoutSettings

LINE_H, GAP = 20.0, 10.0  # a line's box height and the blank between two lines of a paragraph


def _quad(x: float, y: float, w: float, h: float = LINE_H) -> list[Point]:
    return [(x, y), (x + w, y), (x + w, y + h), (x, y + h)]


def _column(name: str, x: float, y: float, width: float, count: int, *, break_after: int | None = None) -> list[Line]:
    """``count`` lines of one column; a paragraph break (a blank line) after line ``break_after``."""
    lines = []
    for k in range(count):
        extra = LINE_H + GAP if break_after is not None and k > break_after else 0.0
        # ragged right: the last line of a paragraph is shorter
        w = width * (0.6 if k in (break_after, count - 1) else 1.0)
        lines.append(Line(text=f"{name}{k}", quad=_quad(x, y + k * (LINE_H + GAP) + extra, w)))
    return lines


def _read(lines: list[Line], *, height: float = 1400, seed: int = 7,
          settings: LayoutSettings | None = None) -> list[str]:
    shuffled = list(lines)
    random.Random(seed).shuffle(shuffled)  # the engine's order must not matter
    ordered, _ = order_lines(shuffled, page_height=height, settings=settings)
    return [ln.text for ln in ordered]


def _names(*columns: list[Line]) -> list[str]:
    return [ln.text for column in columns for ln in column]


def _rows(lines: list[Line]) -> list[str]:
    """What reading top to bottom, left to right in rows gives (paperlane's order before blocks)."""
    return [ln.text for ln in sorted(lines, key=lambda ln: (ln.quad[0][1], ln.quad[0][0]))]  # type: ignore[index]


@pytest.mark.parametrize("footnote_width", [800, 300], ids=["full-width", "narrower-than-a-column"])
def test_two_columns_under_a_full_width_title_with_a_footnote_read_column_by_column(footnote_width: int) -> None:
    title = [Line(text="Title", quad=_quad(100, 60, 900, 40))]
    left = _column("L", 100, 140, 420, 12, break_after=5)
    right = _column("R", 580, 140, 420, 12, break_after=5)  # rows and paragraph breaks aligned with the left's
    footnote = [Line(text="Footnote", quad=_quad(100, 560, footnote_width, 16))]

    read = _read([*title, *left, *right, *footnote])

    assert read == _names(title, left, right, footnote)
    assert _rows([*title, *left, *right, *footnote]) != read  # the old row order reads across the columns


def test_three_columns_and_their_paragraph_blocks() -> None:
    columns = [_column(name, x, 100, 250, 10, break_after=4) for name, x in (("A", 100), ("B", 400), ("C", 700))]
    lines = [ln for column in columns for ln in column]

    ordered, blocks = order_lines(lines, page_height=1400)

    assert [ln.text for ln in ordered] == _names(*columns)
    assert len(blocks) == 6 and {b.kind for b in blocks} == {BlockKind.PARAGRAPH}
    assert [ln.block for ln in ordered] == [b for b in range(6) for _ in range(5)]
    x0, y0 = blocks[1].quad[0]  # type: ignore[index]
    assert (x0, y0) == (100, 100 + 5 * (LINE_H + GAP) + LINE_H + GAP)  # the second paragraph of column A


@pytest.mark.parametrize(("columns", "seed", "pad"), [(6, 0, 0), (6, 1, 0), (4, 1, 0), (6, 2, 5)])
def test_newspaper_articles_under_headlines_shorter_than_their_columns_read_article_by_article(
        columns: int, seed: int, pad: int) -> None:
    """``pad``: the boxes run that many pixels past the text on every side, as a detector's do (into gutters
    one em wide)."""
    from tests.pages import render_news

    _, truth = render_news(columns, seed=seed, gutter_em=1.0 if columns == 6 else 1.6)
    lines = [Line(text=text, quad=_quad(x0 - pad, y0 - pad, x1 - x0 + 2 * pad, y1 - y0 + 2 * pad))
             for text, (x0, y0, x1, y1) in truth]

    assert _read(lines, height=3400) == [text for text, _ in truth]


def test_a_receipt_with_a_price_column_stays_in_rows() -> None:
    items = []
    for k in range(8):
        y = 100 + k * (LINE_H + GAP)
        items.append(Line(text=f"item{k}", quad=_quad(50, y, 180)))
        items.append(Line(text=f"price{k}", quad=_quad(330, y, 60)))  # a narrow column: no running text
    total = [Line(text="TOTAL 12.00", quad=_quad(50, 360, 340))]

    assert _read([*items, *total], height=800) == _rows([*items, *total])


def test_a_form_whose_halves_mix_labels_and_values_reads_in_rows() -> None:
    # Two halves apart by a wide gutter, each wider than a column and holding a label and its value per row (as
    # FUNSD's forms): the halves are no columns of running text (their lines fill less than half their width).
    lefts = [(70, 160), (110, 120), (90, 190), (60, 140), (120, 180), (80, 150)]  # (label width, value width)
    rights = [(100, 90), (60, 130), (130, 110), (90, 70), (70, 150), (110, 120)]
    rows = []
    for k, ((lw, vw), (rw, ww)) in enumerate(zip(lefts, rights)):
        y = 100 + k * 1.5 * LINE_H
        rows += [Line(text=f"L-label{k}", quad=_quad(50, y, lw)), Line(text=f"L-value{k}", quad=_quad(200, y, vw)),
                 Line(text=f"R-label{k}", quad=_quad(560, y, rw)), Line(text=f"R-value{k}", quad=_quad(720, y, ww))]

    assert _read(rows) == _rows(rows)
    # Were lines that fill a tenth of a column running text, the halves would be read one after the other.
    assert _read(rows, settings=LayoutSettings(column_fill=0.1))[:3] == ["L-label0", "L-value0", "L-label1"]


def test_label_and_value_strips_that_pair_up_row_by_row_are_one_table_read_in_rows() -> None:
    rows = []
    for k in range(6):
        y = 100 + k * 3 * LINE_H  # sparse rows
        rows.append(Line(text=f"label{k}", quad=_quad(50, y, 200 + 10 * (k % 3))))  # strips wide enough for columns
        rows.append(Line(text=f"value{k}", quad=_quad(330, y, 220 - 15 * (k % 2))))
    assert _read(rows) == _rows(rows)
    # The same strips read as two columns when rows this far apart still count as running text: the pitch decides.
    loose = LayoutSettings(table_pitch=5)
    assert _read(rows, settings=loose) == [f"label{k}" for k in range(6)] + [f"value{k}" for k in range(6)]
    # ... and when the strips' lines do not share rows (each value half a row below a label): the pairing decides.
    shifted = [ln.model_copy(update={"quad": _quad(330, ln.quad[0][1] + 1.5 * LINE_H, 200)})  # type: ignore[index]
               if ln.text.startswith("value") else ln for ln in rows]
    assert _read(shifted) == [f"label{k}" for k in range(6)] + [f"value{k}" for k in range(6)]


def test_header_and_footer_are_marked_and_a_title_is_not_a_header() -> None:
    header = [Line(text="Journal 3", quad=_quad(100, 30, 300, 18))]
    body = _column("B", 100, 200, 800, 6)
    footer = [Line(text="17", quad=_quad(480, 1350, 30, 18))]

    ordered, blocks = order_lines([*footer, *body, *header], page_height=1400)
    assert [ln.text for ln in ordered] == _names(header, body, footer)
    assert [b.kind for b in blocks] == [BlockKind.HEADER, BlockKind.PARAGRAPH, BlockKind.FOOTER]

    big_title = [Line(text="Big title", quad=_quad(100, 30, 600, 60))]  # taller than the page's lines
    _, blocks = order_lines([*big_title, *body], page_height=1400)
    assert blocks[0].kind is BlockKind.PARAGRAPH


def test_a_right_to_left_page_reads_its_right_column_first_and_rows_from_the_right() -> None:
    right = [Line(text=f"שורה ימין {k}", quad=_quad(580, 100 + k * 30, 420)) for k in range(6)]
    left = [Line(text=f"שורה שמאל {k}", quad=_quad(100, 100 + k * 30, 420)) for k in range(6)]
    assert _read([*left, *right]) == _names(right, left)

    row = [Line(text="שמאל", quad=_quad(100, 100, 100)), Line(text="ימין", quad=_quad(400, 100, 100))]
    assert _read(row) == ["ימין", "שמאל"]


def test_lines_without_boxes_keep_the_engine_order_and_get_no_blocks() -> None:
    lines = [Line(text="b"), Line(text="a", quad=_quad(0, 0, 10))]
    assert order_lines(lines) == (lines, [])


@pytest.mark.parametrize("rtl", [False, True])
def test_estimated_words_share_the_line_by_character_widths(rtl: bool) -> None:
    quad = [(100.0, 100.0), (500.0, 60.0), (504.0, 100.0), (104.0, 140.0)]  # slanted
    words = estimate_words("WIDE 東京都 ii", quad, confidence=0.9, rtl=rtl)

    assert [w.text for w in words] == ["WIDE", "東京都", "ii"]
    assert all(w.estimated and w.confidence == 0.9 for w in words)
    spans = [(w.quad[0][0], w.quad[1][0]) for w in words]
    widths = [b - a for a, b in spans]
    assert widths[1] > widths[0] > widths[2]  # three wide characters, four capitals, two narrow ones
    lefts = [a for a, _ in spans]
    assert lefts == (sorted(lefts, reverse=True) if rtl else sorted(lefts))  # the first word at the start
    first, last = (words[-1], words[0]) if rtl else (words[0], words[-1])
    assert first.quad[0] == pytest.approx(quad[0], abs=0.1) and last.quad[2] == pytest.approx(quad[2], abs=0.1)
    for w in words:  # on the slanted line: each word's top edge lies on the line's top edge
        (ax, ay), (bx, by) = w.quad[0], w.quad[1]
        assert ay == pytest.approx(100 - 40 * (ax - 100) / 400, abs=0.2)
        assert by == pytest.approx(100 - 40 * (bx - 100) / 400, abs=0.2)
