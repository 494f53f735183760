"""benchmarks/docbank_papers.py: the other pages of DocBank's develop-half papers (or papers from elsewhere), read
from their PDFs.

The papers are PDFs written here (text in Helvetica where a two-column page would have it); DocBank's own files
are never committed.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from benchmarks import docbank_papers

WIDTH, HEIGHT = 612, 792  # points: US letter, as arXiv's papers mostly are


def _pdf(pages: list[list[tuple[float, float, str]]], figure: tuple[int, int, int, int] | None = None) -> bytes:
    """A PDF of ``pages``, each a list of (x, y from the top, text) lines in the order they are written; with
    ``figure`` (x, y from the top, width, height), a grey picture there on each page, drawn under the text."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", "",
               "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
               "<< /Type /XObject /Subtype /Image /Width 1 /Height 1 /ColorSpace /DeviceGray /BitsPerComponent 8 "
               "/Length 1 >>\nstream\n\x80\nendstream"]
    kids = []
    for lines in pages:
        x, y, w, h = figure or (0, 0, 0, 0)
        stream = f"q {w} 0 0 {h} {x} {HEIGHT - y - h} cm /Im1 Do Q\n" if figure else ""
        stream += "".join(f"BT /F1 10 Tf {x} {HEIGHT - y} Td ({text}) Tj ET\n" for x, y, text in lines)
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream}endstream")
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {WIDTH} {HEIGHT}] /Resources << /Font "
                       f"<< /F1 3 0 R >> /XObject << /Im1 4 0 R >> >> /Contents {len(objects)} 0 R >>")
        kids.append(f"{len(objects)} 0 R")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(kids)} >>"
    out, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{o:010d} 00000 n \n" for o in offsets).encode()
    return out + f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()


def _two_columns(tag: str) -> list[tuple[float, float, str]]:
    title = [(150, 60, f"{tag} A Title Across Both of the Columns Under It")]
    left = [(50, 100 + 12 * k, f"{tag} left line {k} of the first column of running text") for k in range(8)]
    right = [(320, 100 + 12 * k, f"{tag} right line {k} of the second column of running text") for k in range(8)]
    return title + left + right


def _one_column() -> list[tuple[float, float, str]]:
    return [(50, 100 + 12 * k, f"a line {k} of running text that runs across the whole page from margin to margin")
            for k in range(10)]


def _folder(tmp_path: Path) -> Path:
    root = tmp_path / "samples"
    root.mkdir()
    # "apaper" hashes to the develop half, "paper" to the measure half (public_pages.half).
    (root / "apaper_black.pdf").write_bytes(_pdf([_two_columns("p0"), _one_column(), _two_columns("p2")]))
    (root / "paper_black.pdf").write_bytes(_pdf([_two_columns("m0")]))
    (root / "apaper_2.txt").write_text("")  # page 2 is DocBank's labelled sample: scored with its labels
    return root


def test_the_develop_papers_two_column_pages_are_read_in_the_pdf_s_order(tmp_path: Path) -> None:
    pages = docbank_papers.load(_folder(tmp_path), tmp_path / "out", dpi=200)

    # The measure half's paper is not opened; the single-column page and the labelled sample are left out.
    assert [p.name for p in pages] == ["apaper_0"]
    [page] = pages
    assert (page.half, page.group, page.scale) == ("develop", "docbank-develop-papers", 1)
    with Image.open(page.image) as img:
        assert img.size == page.size == (1700, 2200)
    # The truth: the title, then the left column, then the right one, each a block, in the PDF's order.
    assert [b.text.split("\n")[0] for b in page.truth] == ["p0 A Title Across Both of the Columns Under It",
                                                           "p0 left line 0 of the first column of running text",
                                                           "p0 right line 0 of the second column of running text"]
    assert [len(b.text.split("\n")) for b in page.truth] == [1, 8, 8]
    left = page.truth[1].box
    assert left[0] < 0.3 * page.size[0] < left[2] < 0.5 * page.size[0]


def test_at_72_dpi_a_page_is_read_at_three_times_its_size(tmp_path: Path) -> None:
    [page] = docbank_papers.load(_folder(tmp_path), tmp_path / "out", dpi=72)

    assert (page.name, page.group, page.scale, page.size) == ("apaper_0-72dpi", "docbank-develop-papers-72dpi", 3,
                                                              (3 * WIDTH, 3 * HEIGHT))
    with Image.open(page.image) as img:
        assert img.size == (WIDTH, HEIGHT)
    assert page.truth[2].box[0] > 0.5 * page.size[0]  # the right column's box, in the pixels it is read at


def test_per_paper_keeps_at_most_that_many_pages_of_each(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    (root / "apaper_black.pdf").write_bytes(_pdf([_two_columns(f"p{k}") for k in range(6)]))
    (root / "apaper_2.txt").unlink()

    pages = docbank_papers.load(root, tmp_path / "out", dpi=200, per_paper=3)

    assert [p.name for p in pages] == ["apaper_0", "apaper_2", "apaper_4"]


def test_the_words_drawn_in_a_figure_are_left_out(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    chart = [(330, 240, "axis label"), (330, 260, "another label")]
    (root / "apaper_black.pdf").write_bytes(_pdf([_two_columns("p0") + chart], figure=(320, 220, 250, 80)))

    [page] = docbank_papers.load(root, tmp_path / "out", dpi=200)

    assert "axis label" not in page.text and "p0 right line 7" in page.text
    [label] = [b for b in page.blocks if b.text == "axis label"]
    assert (label.kind, label.order) == ("figure", None)  # a line read there is left out of the text scored


def test_a_folder_of_other_papers_is_all_developed_on_in_rows_named_after_it(tmp_path: Path) -> None:
    root = tmp_path / "acl"
    root.mkdir()
    # "paper" hashes to the measure half: the split is DocBank's, and papers from elsewhere are all developed on.
    (root / "paper.pdf").write_bytes(_pdf([_two_columns("q0"), _one_column()]))
    (root / "apaper.pdf").write_bytes(_pdf([_two_columns("r0")]))

    pages = docbank_papers.load(root, tmp_path / "out", dpi=72)

    assert [(p.name, p.half, p.group) for p in pages] == [("apaper_0-72dpi", "develop", "papers-acl-72dpi"),
                                                          ("paper_0-72dpi", "develop", "papers-acl-72dpi")]
    assert pages[1].truth[1].text.startswith("q0 left line 0")
