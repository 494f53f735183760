"""Columns over layout regions where a paper's page breaks them up (paperlane.regions): a section heading in one
column, a figure the model found only its labels in, lines in no region at the foot of one column and the top of
the next, a formula standing out into the gutter. Each was seen on DocBank's develop-half papers read at 72 and
200 dpi (``benchmarks/docbank_papers.py``); the pages here are made to the same plan. So were a title page's
authors over the columns and a column going on under its neighbour's end, seen on papers in the ACL templates
(``reading_order.py --papers <folder of PDFs>``)."""

from __future__ import annotations

from paperlane.regions import Found
from paperlane.schemas import Line
from tests.test_regions import _box, _column, _names, _quad, _read


def test_a_heading_in_one_column_set_off_by_a_blank_is_read_in_that_column() -> None:
    # Both columns end a paragraph at the same height; each has a heading below it, the left one a little
    # higher, each alone in its band and further below than a paragraph's gap.
    a, b = _column("A", 100, 100, 480, 5), _column("B", 620, 100, 480, 5)
    left_head = [Line(text="Hleft", quad=_quad(100, 280, 300))]
    right_head = [Line(text="Hright", quad=_quad(620, 305, 300))]
    c, d = _column("C", 100, 345, 480, 6), _column("D", 620, 350, 480, 6)
    regions = [Found("text", _box(g, pad=2)) for g in (a, b, c, d)] + [
        Found("title", _box(left_head, pad=2)), Found("title", _box(right_head, pad=2))]

    read, _ = _read([*a, *b, *left_head, *right_head, *c, *d], regions)

    assert read == _names(a, left_head, c, b, right_head, d)


def test_a_heading_far_below_a_title_page_s_authors_starts_the_columns_under_it() -> None:
    # Two authors side by side, then (well below them) the abstract's heading over the left column.
    authors = [_column("Au", 150, 100, 400, 3), _column("Bu", 650, 100, 400, 3)]
    head = [Line(text="Abstract", quad=_quad(250, 330, 150))]
    c, d = _column("C", 100, 380, 480, 8), _column("D", 620, 375, 480, 8)
    regions = [Found("text", _box(g, pad=2)) for g in (*authors, c, d)] + [Found("title", _box(head, pad=2))]

    read, _ = _read([*authors[0], *authors[1], *head, *c, *d], regions)

    assert read == _names(*authors, head, c, d)


def test_a_figure_the_model_found_only_a_label_in_holds_its_whole_box_in_its_column() -> None:
    label = [Line(text="Label", quad=_quad(300, 200, 60))]
    caption = [Line(text="Cap", quad=_quad(100, 420, 480))]
    left = _column("L", 100, 470, 480, 10)
    r1, r2 = _column("R", 620, 60, 480, 8), _column("S", 620, 330, 480, 14)  # a paragraph's gap beside the figure
    regions = [Found("figure", (94, 60, 586, 400)), Found("figure_caption", _box(caption)),
               Found("text", _box(left)), Found("text", _box(r1)), Found("text", _box(r2))]

    read, _ = _read([*label, *caption, *left, *r1, *r2], regions)

    assert read == _names(label, caption, left, r1, r2)


def test_lines_in_no_region_at_the_foot_of_one_column_and_the_top_of_the_next_are_not_one_block() -> None:
    # The model found no region for a heading at the foot of the left column, nor for a formula's last piece at
    # the top of the right one: together they would be a block across the gutter, and the page read across.
    a, heading, c = _column("A", 100, 100, 480, 10), _column("Head", 150, 420, 200, 1), _column("C", 100, 460, 480, 6)
    b, piece, d = _column("B", 620, 100, 480, 8), _column("j", 900, 370, 20, 1), _column("D", 620, 430, 480, 8)
    regions = [Found("text", _box(g, pad=2)) for g in (a, c, b, d)]

    read, _ = _read([*a, *heading, *c, *b, *piece, *d], regions)

    assert read == _names(a, heading, c, b, piece, d)


def test_a_piece_of_a_formula_standing_out_into_the_gutter_does_not_split_the_columns() -> None:
    title = [Line(text="Title", quad=_quad(100, 40, 1000, 30))]
    a, c = _column("A", 100, 100, 480, 6), _column("C", 100, 330, 480, 6)
    formula = [Line(text="x=", quad=_quad(250, 280, 200)), Line(text="=", quad=_quad(585, 280, 25))]
    b, d = _column("B", 620, 100, 480, 4), _column("D", 620, 250, 480, 10)
    regions = ([Found("title", _box(title, pad=2)), Found("equation", _box(formula[:1], pad=2))]
               + [Found("text", _box(g, pad=2)) for g in (a, c, b, d)])

    read, _ = _read([*title, *a, *formula, *c, *b, *d], regions)

    assert read == _names(title, a, formula, c, b, d)


def _centred(name: str, centre: float, y: float, widths: tuple[float, ...]) -> list[Line]:
    """Lines of ``widths`` one under another, each centred on ``centre``: an author's name, affiliation, address."""
    return [Line(text=f"{name}{k}", quad=_quad(centre - w / 2, y + 24 * k, w)) for k, w in enumerate(widths)]


def _title_page() -> tuple[list[Line], list[list[Line]], list[Line], list[Line], list[Line]]:
    """A title, two authors centred one over each column, the abstract's heading over the left column (a little
    more than a paragraph's gap under them, level with the right column's top), the two columns."""
    title = [Line(text="Title", quad=_quad(200, 40, 800, 30))]
    authors = [_centred("Au", 340, 100, (160, 320, 240)), _centred("Bu", 860, 100, (200, 300, 260))]
    head = [Line(text="Abstract", quad=_quad(290, 220, 100))]
    left, right = _column("L", 100, 260, 480, 12), _column("R", 620, 220, 480, 14)
    return title, authors, head, left, right


def test_authors_side_by_side_over_the_columns_are_read_across_before_them() -> None:
    # ACL's templates set two authors as two centred blocks, one over each column: they are no columns' tops.
    title, authors, head, left, right = _title_page()
    regions = [Found("title", _box(title, pad=2)), Found("title", _box(head, pad=2))] + [
        Found("text", _box(g, pad=2)) for g in (*authors, left, right)]

    read, _ = _read([*title, *authors[0], *authors[1], *head, *left, *right], regions)

    assert read == _names(title, *authors, head, left, right)


def test_a_region_drawn_over_the_authors_and_the_abstract_s_heading_is_cut_under_the_authors() -> None:
    # The model drew one region over both authors and the heading under the first: cut at the page's gutter,
    # its left piece (first author and heading) stood in the way of the blank under the authors.
    title, authors, head, left, right = _title_page()
    regions = [Found("title", _box(title, pad=2)), Found("text", _box([*authors[0], *authors[1], *head], pad=2)),
               Found("text", _box(left, pad=2)), Found("text", _box(right, pad=2))]

    read, _ = _read([*title, *authors[0], *authors[1], *head, *left, *right], regions)

    assert read == _names(title, *authors, head, left, right)


def test_a_column_going_on_under_its_neighbour_s_end_is_read_before_that_neighbour() -> None:
    # The last page: the right column ends with the references; the left one goes on under their end, a
    # heading's gap further down, with the conclusion.
    a, b = _column("A", 100, 100, 480, 20), _column("B", 620, 100, 480, 14)
    head = [Line(text="Conclusion", quad=_quad(100, 740, 150))]
    c = _column("C", 100, 790, 480, 6)
    regions = [Found("text", _box(g, pad=2)) for g in (a, b, c)] + [Found("title", _box(head, pad=2))]

    read, _ = _read([*a, *b, *head, *c], regions)

    assert read == _names(a, head, c, b)


def test_a_footnote_under_columns_that_end_together_is_read_after_them_all() -> None:
    # Short, and under the left column only, as the conclusion above; but neither column ran on alone.
    a, b = _column("A", 100, 100, 480, 20), _column("B", 620, 100, 480, 20)
    note = [Line(text="Note", quad=_quad(100, 740, 300))]
    regions = [Found("text", _box(g, pad=2)) for g in (a, b, note)]

    read, _ = _read([*a, *b, *note], regions)

    assert read == _names(a, b, note)


def test_authors_in_one_region_are_read_author_by_author() -> None:
    # Four authors in a row, each a name over an address, centred, narrower than a column; the model drew one
    # region over them all. Read whole, in rows: the names first, then the addresses.
    title = [Line(text="Title", quad=_quad(200, 40, 800, 30))]
    authors = [_centred(name, centre, 100, (150, 100)) for name, centre in
               (("Au", 200), ("Bu", 470), ("Cu", 740), ("Du", 1010))]
    left, right = _column("L", 100, 220, 480, 12), _column("R", 620, 220, 480, 12)
    regions = [Found("title", _box(title, pad=2)), Found("text", _box([ln for a in authors for ln in a], pad=2)),
               Found("text", _box(left, pad=2)), Found("text", _box(right, pad=2))]

    read, _ = _read([*title, *(ln for a in authors for ln in a), *left, *right], regions)

    assert read == _names(title, *authors, left, right)


def test_a_column_s_last_references_under_its_neighbour_s_end_are_read_in_that_column() -> None:
    # Both columns run nearly to the same height; then the left one goes on with three more references, each a
    # region of its own a paragraph's gap under the one before: together as tall as a column's piece, no footnote.
    a, b = _column("A", 100, 100, 480, 20), _column("B", 620, 100, 480, 19)
    refs = [_column(name, 100, 720 + 100 * k, 480, 3) for k, name in enumerate(("P", "Q", "S"))]
    regions = [Found("text", _box(g, pad=2)) for g in (a, b, *refs)]

    read, _ = _read([*a, *b, *(ln for r in refs for ln in r)], regions)

    assert read == _names(a, *refs, b)
