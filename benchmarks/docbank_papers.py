"""More pages to develop on: every two-column page of DocBank's develop-half papers, from their whole PDFs.

DocBank's samples (``benchmarks/docbank_pages.py``) carry one labelled page of each paper and the whole paper
as ``<paper>_black.pdf``. The develop half's 14 labelled two-column pages had nothing left to teach at stop 38;
their papers' other pages are many more pages of the same kind (42 papers, about 980 pages, 144 of them
two-column and in reading order, from 15 papers), and of papers already on the develop side, so the pages only
measured on stay as they were: a measure-half paper's PDF is never opened here.

These pages have no DocBank labels, so their truth is coarser than the labelled pages': every line the PDF
holds, in its order (TeX's: column by column, a float where TeX put it, the running head first and the page
number last), blocks made as ``docbank_pages`` makes them (lines on one side of the page, each below the one
before). The text drawn inside a figure (a PDF's form objects and images: their boxes) is left out, as the
labelled pages leave it out. Equations and tables stay in: their lines are ordered like any other, and the
best order of the same lines scores them the same way. A page is kept when it is two-column (at least three
lines over 30% of the page wide in each half) and its PDF changes column at most ``MAX_SWITCHES`` times.

Each page is rendered by pdfium at 200 dpi (DocBank's own images), or at 72 dpi and read at
``hrdoc_pages.SCALE`` times its size, as HRDoc's pages are (``-72dpi`` rows). For developing only: the rows are
``docbank-develop-papers`` and ``docbank-develop-papers-72dpi``.

A folder of other papers' PDFs (``<paper>.pdf``, no DocBank files beside them) is read the same way, every paper
developed on, in rows named after the folder (``papers-<folder>``). At stop 46 this was 19 papers in the ACL
conference templates of 2019 to 2022 and 14 ACL Anthology proceedings papers of 2021 (ACL, NAACL), from public
GitHub repositories (their sources in the closing note), in the templates of HRDoc's ACL Anthology pages: more
pages of the kind the measure half's failing row is made of.
"""

from __future__ import annotations

import math
from pathlib import Path

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c

from benchmarks import hrdoc_pages, public_pages
from benchmarks.docbank_pages import MAX_SWITCHES, _blocks, _inside, _pdf_lines, _switches, _two_columns
from benchmarks.public_pages import Box, PublicPage

_FIGURES = (pdfium_c.FPDF_PAGEOBJ_FORM, pdfium_c.FPDF_PAGEOBJ_IMAGE)


def load(root: Path, out: Path, *, dpi: int, per_paper: int | None = None) -> list[PublicPage]:
    """The two-column pages of the develop half's papers in ``root`` (their sampled pages left out: they are
    scored with their labels), rendered into ``out`` at ``dpi`` (72: read at ``hrdoc_pages.SCALE`` times);
    at most ``per_paper`` of each paper's, evenly spread. A folder without DocBank's ``<paper>_black.pdf``
    is of papers from elsewhere (``<paper>.pdf``), every one developed on, in rows named after the folder."""
    docbank = any(root.glob("*_black.pdf"))
    group = "docbank-develop-papers" if docbank else f"papers-{root.name}"
    pages = []
    for pdf in sorted(root.glob("*_black.pdf" if docbank else "*.pdf")):
        paper = pdf.name.removesuffix("_black.pdf") if docbank else pdf.stem
        if docbank and public_pages.half(paper) != "develop":
            continue
        sampled = {int(t.stem.rsplit("_", 1)[1]) for t in root.glob(f"{paper}_*.txt")
                   if t.stem.rsplit("_", 1)[1].isdigit()}
        doc = pdfium.PdfDocument(pdf)
        try:
            found = [page for number in range(len(doc)) if number not in sampled
                     for page in [_page(doc[number], paper, number, out, dpi, group)] if page is not None]
        finally:
            doc.close()
        step = max(1, len(found) // per_paper) if per_paper else 1
        pages += found[::step][:per_paper]
    return pages


def _page(page: pdfium.PdfPage, paper: str, number: int, out: Path, dpi: int, group: str) -> PublicPage | None:
    scale = hrdoc_pages.SCALE if dpi < 100 else 1
    pw, ph = page.get_size()
    # The size pdfium renders at (pypdfium2 rounds up), times the scale the image is read at.
    width, height = math.ceil(pw * dpi / 72) * scale, math.ceil(ph * dpi / 72) * scale
    labelled = _labelled(page, width, height)
    body = [box for box, _, label in labelled if label == "paragraph"]
    if not _two_columns(body, width) or _switches(body, width) > MAX_SWITCHES:
        return None
    name = f"{paper}_{number}" + ("-72dpi" if scale > 1 else "")
    image = out / f"{name}.png"
    if not image.exists():
        out.mkdir(parents=True, exist_ok=True)
        page.render(scale=dpi / 72).to_pil().convert("RGB").save(image)
    return PublicPage(name, image, "english", "double_column", "docbank-papers", (width, height),
                      tuple(_blocks(labelled, width)), half="develop", group=group + ("-72dpi" if scale > 1 else ""),
                      scale=scale)


def _labelled(page: pdfium.PdfPage, width: int, height: int) -> list[tuple[Box, str, str | None]]:
    """The page's lines in the PDF's order (image pixels), each a "paragraph" or, inside a figure, a "figure"."""
    pw, ph = page.get_size()
    figures = _figures(page, width / pw, height / ph)
    return [(box, text, "figure" if _inside(box, figures) else "paragraph")
            for box, text in _pdf_lines(page, width, height)]


def _figures(page: pdfium.PdfPage, sx: float, sy: float) -> list[Box]:
    """The boxes (image pixels) of the page's form objects and images: figures drawn from other files."""
    ph = page.get_size()[1]
    boxes = []
    for obj in page.get_objects(max_depth=0):
        if obj.type in _FIGURES:
            left, bottom, right, top = obj.get_bounds()
            if (right - left) * (top - bottom) > 400:  # bigger than a glyph drawn as an image
                boxes.append((left * sx, (ph - top) * sy, right * sx, (ph - bottom) * sy))
    return boxes

