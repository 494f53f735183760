"""benchmarks/hrdoc_pages.py: an HRDoc folder read into the public pages' truth, and scored like OmniDocBench's.

The folder is made here (a paper of two pages, 100 by 80 pixels); HRDoc's own pages are never committed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from benchmarks import hrdoc_pages
from benchmarks.public_pages import PublicPage
from benchmarks.reading_order_public import load, score
from paperlane.regions import Found
from paperlane.schemas import Line


def _line(text: str, box: list[int], cls: str, parent: int, relation: str, page: int = 0) -> dict[str, Any]:
    return {"text": text, "box": box, "class": cls, "page": page, "is_meta": relation == "meta",
            "parent_id": parent, "relation": relation}


# Page 0: a title over two columns; the left column is a paragraph broken by an equation and ends at the
# foot of the column, the right column carries it on and then has a figure, its two-line caption, a footnote
# of two lines and the page number. Page 1: one single-column paragraph.
LINES = [
    _line("A Title", [20, 2, 80, 6], "title", -1, "meta"),  # 0
    _line("the first line", [5, 10, 45, 13], "fstline", -1, "contain"),  # 1
    _line("goes on here", [5, 14, 45, 17], "para", 1, "connect"),  # 2
    _line("x = y + 1", [15, 18, 35, 21], "equ", 2, "connect"),  # 3
    _line("where x is odd", [5, 22, 45, 25], "para", 3, "connect"),  # 4
    _line("and at the foot", [5, 26, 45, 29], "para", 4, "connect"),  # 5
    _line("still the same one", [55, 10, 95, 13], "para", 5, "connect"),  # 6
    _line("which ends", [55, 14, 95, 17], "para", 6, "connect"),  # 7
    _line("a new paragraph", [55, 18, 95, 21], "fstline", 1, "equality"),  # 8
    _line("more of it", [55, 22, 95, 25], "para", 8, "connect"),  # 9
    _line("plot", [55, 40, 95, 59], "fig", -1, "contain"),  # 10: HRDS draws it round its caption
    _line("Figure 1: a plot", [55, 56, 95, 59], "figcap", 10, "contain"),  # 11
    _line("of things", [55, 60, 95, 63], "opara", 11, "connect"),  # 12
    _line("1 a footnote", [5, 66, 45, 69], "fnote", -1, "meta"),  # 13
    _line("that goes on", [5, 70, 45, 73], "opara", 13, "connect"),  # 14
    _line("7", [48, 75, 52, 78], "foot", -1, "meta"),  # 15
    _line("page two reads", [10, 10, 90, 13], "fstline", 8, "equality", page=1),  # 16
    _line("across the page", [10, 14, 90, 17], "para", 16, "connect", page=1),  # 17
]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    paper = tmp_path / "HRDS" / "paper"
    paper.mkdir(parents=True)
    (tmp_path / "HRDS" / "paper.json").write_text(json.dumps(LINES))
    for page in (0, 1):  # HRDS's names: <doc>_<p>.jpg, PNG data
        Image.new("RGB", (100, 80), "white").save(paper / f"paper_{page}.jpg", format="PNG")
    return tmp_path


def _page(folder: Path, name: str) -> PublicPage:
    [page] = [p for p in load(folder) if p.name == name]
    return page


def test_the_folder_is_told_from_its_files(folder: Path, tmp_path: Path) -> None:
    assert hrdoc_pages.is_hrdoc(folder) and hrdoc_pages.is_hrdoc(folder / "HRDS")
    (tmp_path / "omni").mkdir()
    (tmp_path / "omni" / "OmniDocBench_demo.json").write_text("[]")
    assert not hrdoc_pages.is_hrdoc(tmp_path / "omni")


def test_a_page_is_its_running_text_in_blocks_scaled(folder: Path) -> None:
    assert [p.name for p in load(folder)] == ["paper_0", "paper_1"]
    page = _page(folder, "paper_0")
    assert (page.size, page.scale, page.half, page.layout) == ((300, 240), 3, "measure", "double_column")
    # The half is the paper's ("paper" hashes to the measure half), the row its half and the page's layout.
    assert page.group == "hrdoc-measure-two-column" and _page(folder, "paper_1").group == "hrdoc-measure-single-column"
    # The equation breaks the paragraph, and so does the column break; the caption keeps its second line,
    # the footnote and the page number are left out.
    assert [b.text.split("\n") for b in page.truth] == [
        ["A Title"], ["the first line", "goes on here"], ["where x is odd", "and at the foot"],
        ["still the same one", "which ends"], ["a new paragraph", "more of it"], ["Figure 1: a plot", "of things"]]
    assert [b.kind for b in page.truth] == ["title", *["text_block"] * 4, "figure_caption"]
    assert page.truth[1].box == (15, 30, 135, 51)
    for x, y in ((25, 19.5), (75, 47), (25, 71), (50, 76)):  # equation, figure, footnote, page number
        assert page.excluded((3 * x, 3 * y))
    assert not page.excluded((3 * 75, 3 * 57))  # the caption, inside the figure's box here


def test_the_image_is_read_at_its_scale(folder: Path) -> None:
    page = _page(folder, "paper_0")
    png = page.image_bytes()
    assert png.startswith(b"\x89PNG")
    from io import BytesIO
    with Image.open(BytesIO(png)) as img:
        assert img.size == (300, 240)


def test_an_unknown_class_is_refused(folder: Path) -> None:
    (folder / "HRDS" / "paper.json").write_text(json.dumps([_line("?", [1, 1, 9, 9], "sidebar", -1, "meta")]))
    with pytest.raises(ValueError, match="sidebar"):
        load(folder)


def test_lines_read_out_of_order_score_worse(folder: Path) -> None:
    page = _page(folder, "paper_0")
    # What an engine would read: the truth's lines (and the equation, left out as a line in it) where they lie.
    read = [Line(text=ln["text"], quad=[[3 * ln["box"][0], 3 * ln["box"][1]], [3 * ln["box"][2], 3 * ln["box"][1]],
                                        [3 * ln["box"][2], 3 * ln["box"][3]], [3 * ln["box"][0], 3 * ln["box"][3]]])
            for ln in LINES if ln["page"] == 0]

    def columns_swapped(lines: list[Line], regions: list[Found], page: PublicPage) -> list[Line]:
        return sorted(lines, key=lambda ln: ln.quad[0][0] < 150 if ln.quad else False)

    given: list[str] = []

    def recorded(lines: list[Line], regions: list[Found], page: PublicPage) -> list[Line]:
        given.extend(ln.text for ln in lines)
        return lines

    right = score(page, read, [], recorded, split=False)
    wrong = score(page, read, [], columns_swapped, split=False)
    # The order is given every line read, as the pipeline's is; those the truth leaves out are dropped after it.
    assert "x = y + 1" in given and "1 a footnote" in given
    assert right.cer == 0 and right.best == 0 and right.regions == 0 and right.chars == 1
    assert wrong.cer > 0.2 and wrong.best == 0 and wrong.regions > 0 and wrong.chars == 1


def test_the_halves_go_by_paper(folder: Path) -> None:
    other = folder / "HRDS" / "ACL_2020.acl-main.5"  # a name that hashes to the develop half
    other.mkdir()
    (folder / "HRDS" / "ACL_2020.acl-main.5.json").write_text(json.dumps(LINES))
    for page in (0, 1):
        Image.new("RGB", (100, 80), "white").save(other / f"ACL_2020.acl-main.5_{page}.jpg", format="PNG")

    halves = {(p.name.rsplit("_", 1)[0], p.half, p.group) for p in load(folder)}

    assert halves == {("paper", "measure", "hrdoc-measure-two-column"),
                      ("paper", "measure", "hrdoc-measure-single-column"),
                      ("ACL_2020.acl-main.5", "develop", "hrdoc-develop-two-column"),
                      ("ACL_2020.acl-main.5", "develop", "hrdoc-develop-single-column")}
