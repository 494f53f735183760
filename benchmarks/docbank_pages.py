"""DocBank's sample pages with their reading order, read as public pages (``benchmarks/public_pages.py``).

DocBank (Li et al., COLING 2020; github.com/doc-analysis/DocBank, Apache-2.0; the papers are arXiv's) labels
every token of 500,000 arXiv pages made from their LaTeX sources. Its repository carries 100 of them in
``DocBank_samples/DocBank_samples/``: each page a ``<paper>_<p>_ori.jpg`` (the page at 200 dpi), a
``<paper>_<p>.txt`` (one token a line: text, box on a 0-1000 grid of the page, colour, font, label) and the whole
paper as ``<paper>_black.pdf``. For evaluation only; nothing of it is committed. Extract the three kinds of
file outside the repository (the snapshot lacks a few PDFs, and ``git archive`` stops at a missing file)::

    G=DocBank/.git; mkdir -p /tmp/docbank && cd /tmp/docbank
    git --git-dir=$G ls-tree -r HEAD DocBank_samples | while read m t h p; do case "$p" in
      *_ori.jpg|*.txt|*_black.pdf) mkdir -p "$(dirname "$p")"; git --git-dir=$G cat-file blob $h > "$p" ;; esac
    done

and pass the folder that holds the pages (:func:`is_docbank`).

DocBank's token files are in rows across the page, not in reading order. The order here is the PDF's own: the
order of its characters (pdfium's text page, lines as pdfium breaks them and where the text steps back, jumps
a gutter or steps down: pdfium runs two columns' lines on one baseline into one), which for a LaTeX paper is the order
TeX set them in: column by column, each float where TeX put it. Each line takes the label most of the
tokens inside it have. The truth is the running text in that order: title, authors, date, abstract, section
headings, paragraphs, lists, references and captions; equations, figures, tables and page feet are left out
(as HRDoc's and OmniDocBench's are), and so are lines no token lies in. The words drawn in a figure are
labelled as paragraphs: a line whose centre lies in a figure's box is of the figure. A block is a run of lines of
one label, each line below the one before it and on the same side of the page: the left column, the right one or
across both (a caption over both columns and the paragraph under it in one column are two blocks). A page whose
PDF order is not column by column is skipped: where its paragraph lines change column more than
:data:`MAX_SWITCHES` times, the PDF was not written in reading order and is no truth of it (9 of the samples; each
one's name is printed). 28 two-column pages remain, 14 in each half. Only two-column pages are kept (at least
three paragraph lines in each half of the page, each over 30% of the page wide): the single-column ones have no
order to get wrong that HRDoc's do not already test.

A copy of the folder with the images shrunk to 72 dpi (HRDoc's resolution: narrow gutters, lines the
recogniser runs on through them) is read at ``hrdoc_pages.SCALE`` times its size, as HRDoc's pages are, and
summed up in rows of its own (``-72dpi``).

The pages are split in two by a hash of the paper's name (``public_pages.half``); every sample is of its own
paper. Made a develop set at stop 38, when HRDoc's two-column develop pages had nothing left to learn from:
its develop half is what rules are worked out on; its measure half joins HRDoc's as pages only measured on.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pypdfium2 as pdfium
from PIL import Image

from benchmarks import hrdoc_pages, public_pages
from benchmarks.public_pages import Box, PublicPage, TruthBlock
from paperlane.layout import union_box

KINDS = {"title": "title", "section": "title", "author": "text_block", "date": "text_block",
         "abstract": "text_block", "paragraph": "text_block", "list": "text_block", "reference": "reference",
         "caption": "figure_caption", "equation": "equation_isolated", "figure": "figure", "table": "table",
         "footer": "footer"}
MAX_SWITCHES = 6
SMALL = 1000  # px wide: a page image this small (72 dpi, as HRDoc's) is read at hrdoc_pages.SCALE times its size
_HYPHENS = {"\ufffe": "-", "\x02": "-"}  # pdfium's marks for a word broken at a line's end
_NAME = re.compile(r"(?P<paper>.+)_(?P<page>\d+)\.txt$")


def is_docbank(root: Path) -> bool:
    """Whether ``root`` holds DocBank sample pages: ``<paper>_<p>.txt`` beside ``<paper>_<p>_ori.jpg``."""
    return any(_image(txt).exists() for txt in root.glob("*.txt") if _NAME.match(txt.name))


def load(root: Path) -> list[PublicPage]:
    """The two-column DocBank pages in ``root`` whose PDF is there and in reading order, sorted by name."""
    pages = []
    for txt in sorted(root.glob("*.txt")):
        m = _NAME.match(txt.name)
        pdf = root / f"{m['paper']}_black.pdf" if m else None
        if m is None or pdf is None or not pdf.exists() or not _image(txt).exists():
            continue
        page = _page(txt, pdf, int(m["page"]), m["paper"])
        if page is not None:
            pages.append(page)
    return pages


def _image(txt: Path) -> Path:
    return txt.with_name(txt.stem + "_ori.jpg")


def _page(txt: Path, pdf: Path, number: int, paper: str) -> PublicPage | None:
    with Image.open(_image(txt)) as img:
        scale = hrdoc_pages.SCALE if img.size[0] < SMALL else 1
        width, height = img.size[0] * scale, img.size[1] * scale
    doc = pdfium.PdfDocument(pdf)
    try:
        lines = _pdf_lines(doc[number], width, height)
    finally:
        doc.close()
    tokens, figures = _tokens(txt, width, height)
    labelled = [(box, text, "figure" if _inside(box, figures) else _label(box, tokens)) for box, text in lines]
    body = [box for box, _, label in labelled if label == "paragraph"]
    if not _two_columns(body, width):
        return None
    if _switches(body, width) > MAX_SWITCHES:
        print(f"docbank: {txt.stem} skipped: its PDF is not in reading order")
        return None
    half = public_pages.half(paper)
    group = f"docbank-{half}-two-column" + ("-72dpi" if scale > 1 else "")
    return PublicPage(txt.stem, _image(txt), "english", "double_column", "docbank", (width, height),
                      tuple(_blocks(labelled, width)), half=half, group=group, scale=scale)


def _pdf_lines(page: pdfium.PdfPage, width: int, height: int) -> list[tuple[Box, str]]:
    """The page's lines in the PDF's order: their boxes in image pixels and their text."""
    pw, ph = page.get_size()
    sx, sy = width / pw, height / ph
    text = page.get_textpage()
    out: list[tuple[Box, str]] = []
    chars: list[str] = []
    boxes: list[Box] = []

    def flush() -> None:
        if boxes and "".join(chars).strip():
            out.append((union_box(boxes), "".join(chars).strip()))
        chars.clear()
        boxes.clear()

    for i in range(text.count_chars()):
        ch = text.get_text_range(i, 1)
        if ch in ("\r", "\n"):
            flush()
            continue
        if not ch.isspace():
            left, bottom, right, top = text.get_charbox(i)
            box = (left * sx, (ph - top) * sy, right * sx, (ph - bottom) * sy)
            if boxes and _apart(boxes[-1], box):
                flush()
            boxes.append(box)
        chars.append(_HYPHENS.get(ch, ch))
    flush()
    return out


def _apart(before: Box, box: Box) -> bool:
    """Whether a character starts a new line after ``before``: pdfium runs two columns' lines on one baseline
    into one line; a step back, a gap of over two line heights or a step down breaks it."""
    height = max(before[3] - before[1], box[3] - box[1], 1.0)
    middle, before_middle = (box[1] + box[3]) / 2, (before[1] + before[3]) / 2
    return box[0] < before[0] - height or box[0] > before[2] + 2 * height or abs(middle - before_middle) > height


def _tokens(txt: Path, width: int, height: int) -> tuple[list[tuple[float, float, str]], list[Box]]:
    """DocBank's tokens (their centres in image pixels and their labels), and its figures' boxes: a figure is
    one token (``##LTFigure##``) over its area, and the words drawn in it are labelled as paragraphs."""
    tokens, figures = [], []
    for row in txt.read_text(encoding="utf-8", errors="replace").splitlines():
        cells = row.split("\t")
        if len(cells) >= 10:
            x0, y0, x1, y1 = (int(c) for c in cells[1:5])
            if cells[9] == "figure":
                figures.append((x0 / 1000 * width, y0 / 1000 * height, x1 / 1000 * width, y1 / 1000 * height))
            else:
                tokens.append(((x0 + x1) / 2000 * width, (y0 + y1) / 2000 * height, cells[9]))
    return tokens, figures


def _inside(box: Box, areas: list[Box]) -> bool:
    x, y = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    return any(a[0] <= x <= a[2] and a[1] <= y <= a[3] for a in areas)


def _label(box: Box, tokens: list[tuple[float, float, str]]) -> str | None:
    """The label most tokens with their centre in ``box`` have, if any token lies there."""
    votes = Counter(label for x, y, label in tokens if box[0] <= x <= box[2] and box[1] <= y <= box[3])
    return votes.most_common(1)[0][0] if votes else None


def _two_columns(body: list[Box], width: int) -> bool:
    """At least three lines of a column's width (over 30% of the page's) in each half of the page: pieces of a
    line broken around inline formulas are no column."""
    sides = Counter(_side(b, width) for b in body if b[2] - b[0] >= 0.3 * width)
    return sides["left"] >= 3 and sides["right"] >= 3


def _switches(body: list[Box], width: int) -> int:
    """How often the paragraph lines, in the PDF's order, go from one half of the page to the other."""
    sides = [side for side in (_side(b, width) for b in body) if side != "across"]
    return sum(a != b for a, b in zip(sides, sides[1:]))


def _blocks(labelled: list[tuple[Box, str, str | None]], width: int) -> list[TruthBlock]:
    """Runs of lines of one kept label, each below the one before it and on the same side of the page (left
    column, right column or across both), in order; then the left-out lines, one block each and in no order
    (lines of no label are in neither)."""
    runs: list[list[tuple[Box, str, str]]] = []
    left_out = []
    for box, text, label in labelled:
        if label is None or label not in KINDS:
            continue
        kind = KINDS[label]
        if kind not in public_pages.TEXT_KINDS:
            left_out.append(TruthBlock(kind, box, None, text))
        elif runs and runs[-1][-1][2] == label and _continues(box, runs[-1][-1][0], width):
            runs[-1].append((box, text, label))
        else:
            runs.append([(box, text, label)])
    ordered = [TruthBlock(KINDS[run[0][2]], union_box([b for b, _, _ in run]), k, "\n".join(t for _, t, _ in run))
               for k, run in enumerate(runs)]
    return ordered + left_out


def _continues(box: Box, before: Box, width: int) -> bool:
    return box[1] > before[1] and _side(box, width) == _side(before, width)


def _side(box: Box, width: int) -> str:
    return "left" if box[2] <= 0.52 * width else "right" if box[0] >= 0.48 * width else "across"
