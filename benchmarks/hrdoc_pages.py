"""HRDoc's example pages with their reading order, read as public pages (``benchmarks/public_pages.py``).

HRDoc (Ma et al., AAAI 2023; github.com/jfma-USTC/HRDoc, no licence file) annotates every text line of a
paper: its text, its box in image pixels, its page, its class and its parent line with the relation to it;
the list order is the reading order. Its ``examples/`` are what ``benchmarks/reading_order.py --public`` reads:
``HRDS/`` (6 ACL, NAACL and EMNLP papers, 58 pages; ACL Anthology, CC BY 4.0 for 2020/21, CC BY-NC-SA 3.0 for
2011) and ``HRDH/`` (4 arXiv papers, 78 pages), each paper a ``<doc>.json`` beside a ``<doc>/`` folder of page
images (``<doc>_<p>.jpg`` or ``<p>.png``, PNG data either way, 72 dpi). For evaluation only; nothing of
them is committed. Extract them outside the repository, e.g. from a clone or mirror of the repository::

    mkdir -p /tmp/hrdoc && git --git-dir=HRDoc/.git archive HEAD examples/HRDS examples/HRDH \\
        | tar -x -C /tmp/hrdoc --strip-components=1

and pass ``/tmp/hrdoc`` (or one of its two folders). A folder is taken for HRDoc when it holds a
``<doc>.json`` beside a ``<doc>/`` folder, itself or one level down (:func:`is_hrdoc`).

The truth of a page is its lines of running text in list order: title, authors, affiliations, mail,
section headings, paragraphs and captions. Figures, tables and equations (``fig``, ``tab``, ``equ``),
running heads, page feet and numbers (``header``, ``foot``) and footnotes (``fnote``) are left out, as
OmniDocBench leaves out its figures, formulas, margins and page footnotes, and so are the recognised lines
whose centre lies in one of them. A continuation line (``opara``) is of its first line's class, so a
footnote's second line is left out with it. Consecutive lines make one block while a line continues the one
before it (relation ``connect`` to it, or the same class of front matter) and lies below it: a column or
page break, an equation or a figure in between starts a new block, so that a block is one rectangle as
OmniDocBench's are, and best-order CER and region-order edit distance mean the same on both sets.

The pages are 72 dpi, text 8 to 11 pixels high, too small for RapidOCR's detector: :func:`load` gives each
page :data:`SCALE` (3, about 216 dpi), and the truth's boxes are scaled with it. The papers are split in two
by a hash of each paper's name (``public_pages.half``; a paper's pages share its template, so they stay on one
side): three ACL Anthology papers and three arXiv papers to develop on, three ACL Anthology papers and one arXiv
paper only measured on. Until stop 36 every page was only measured on. The split was made before any page was
looked at or any rule changed for one (one run had printed the figures of every ACL Anthology page). Each half's
rows are the pages' layouts: two-column where at least three lines of running text lie in each half of the page,
single-column otherwise (a page that is one figure and its caption counts here).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from PIL import Image

from benchmarks import public_pages
from benchmarks.public_pages import TEXT_KINDS, Box, PublicPage, TruthBlock
from paperlane.layout import union_box

SCALE = 3
# HRDoc's classes as OmniDocBench's block kinds (public_pages.TEXT_KINDS are the ones in the truth).
KINDS = {"title": "title", "sec1": "title", "sec2": "title", "sec3": "title", "author": "text_block",
         "affili": "text_block", "mail": "text_block", "fstline": "text_block", "para": "text_block",
         "figcap": "figure_caption", "tabcap": "table_caption", "fig": "figure", "tab": "table",
         "equ": "equation_isolated", "header": "header", "foot": "footer", "fnote": "page_footnote"}
BODY = frozenset({"para", "fstline"})


def is_hrdoc(root: Path) -> bool:
    """Whether ``root`` (or a folder in it) holds an HRDoc paper: a ``<doc>.json`` beside a ``<doc>/`` folder."""
    return bool(_papers(root))


def load(root: Path, *, scale: int = SCALE) -> list[PublicPage]:
    """The pages of the HRDoc papers in ``root`` (and in its folders, one level down), sorted by name."""
    papers = _papers(root)
    if not papers:
        raise FileNotFoundError(f"no HRDoc paper (<doc>.json beside <doc>/) in {root}")
    pages = []
    for path in papers:
        lines: list[dict[str, Any]] = json.loads(path.read_text())
        images = _images(path.with_suffix(""))
        for number, image in sorted(images.items()):
            pages.append(_page(path, number, image, lines, scale))
    return sorted(pages, key=lambda p: p.name)


def _papers(root: Path) -> list[Path]:
    found = [*root.glob("*.json"), *root.glob("*/*.json")]
    return sorted(p for p in found if p.with_suffix("").is_dir())


def _images(folder: Path) -> dict[int, Path]:
    """The page images of a paper by page number (``<doc>_<p>.jpg`` or ``<p>.png``)."""
    out = {}
    for image in folder.iterdir():
        number = image.stem.rsplit("_", 1)[-1]
        if image.suffix.lower() in (".jpg", ".jpeg", ".png") and number.isdigit():
            out[int(number)] = image
    return out


def _page(path: Path, number: int, image: Path, lines: list[dict[str, Any]], scale: int) -> PublicPage:
    with Image.open(image) as img:
        width, height = img.size
    blocks = tuple(_blocks(lines, number, scale))
    layout = "double_column" if _two_columns(lines, number, width) else "single_column"
    half = public_pages.half(path.stem)  # by paper: a paper's pages share its template
    group = f"hrdoc-{half}-{'two' if layout == 'double_column' else 'single'}-column"
    return PublicPage(f"{path.stem}_{number}", image, "english", layout, f"hrdoc-{path.parent.name}",
                      (width * scale, height * scale), blocks, half=half, group=group, scale=scale)


def _kind(lines: list[dict[str, Any]], i: int) -> str:
    """A line's kind (:data:`KINDS`); a continuation line (``opara``) has its first line's."""
    seen = set()
    while lines[i]["class"] == "opara" and 0 <= lines[i]["parent_id"] < len(lines) and i not in seen:
        seen.add(i)
        i = lines[i]["parent_id"]
    if lines[i]["class"] not in KINDS:
        raise ValueError(f"HRDoc class {lines[i]['class']!r} (line {i}) is neither kept nor left out")
    return KINDS[lines[i]["class"]]


def _blocks(lines: list[dict[str, Any]], number: int, scale: int) -> list[TruthBlock]:
    """The page's blocks: runs of kept lines, each line continuing the one before it, in order; then the
    left-out lines, one block each and in no order."""
    runs: list[list[int]] = []
    left_out = []
    for i, line in enumerate(lines):
        if line["page"] != number:
            continue
        kind = _kind(lines, i)
        if kind not in TEXT_KINDS:
            left_out.append(TruthBlock(kind, _box(line, scale), None, line["text"]))
        elif runs and runs[-1][-1] == i - 1 and _continues(lines, i):
            runs[-1].append(i)
        else:
            runs.append([i])
    ordered = [TruthBlock(_kind(lines, run[0]), union_box([_box(lines[i], scale) for i in run]), k,
                          "\n".join(lines[i]["text"] for i in run)) for k, run in enumerate(runs)]
    return ordered + left_out


def _continues(lines: list[dict[str, Any]], i: int) -> bool:
    """Whether line ``i`` continues the block of line ``i - 1``: joined to it and below it in the same column."""
    line, before = lines[i], lines[i - 1]
    joined = ((line["relation"] == "connect" and line["parent_id"] == i - 1)
              or (line["relation"] == before["relation"] == "meta" and line["class"] == before["class"]))
    (x0, y0, x1, _), (bx0, by0, bx1, _) = line["box"], before["box"]
    return joined and y0 > by0 and min(x1, bx1) > max(x0, bx0)


def _two_columns(lines: list[dict[str, Any]], number: int, width: int) -> bool:
    body = [ln["box"] for ln in lines if ln["page"] == number and ln["class"] in BODY]
    left = sum(b[2] <= 0.52 * width for b in body)
    right = sum(b[0] >= 0.48 * width for b in body)
    return left >= 3 and right >= 3


def _box(line: dict[str, Any], scale: int) -> Box:
    x0, y0, x1, y1 = line["box"]
    return x0 * scale, y0 * scale, x1 * scale, y1 * scale
