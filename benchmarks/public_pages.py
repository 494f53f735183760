"""Public pages with their reading order: OmniDocBench's layout annotations, read and scored.

OmniDocBench (opendatalab, Apache-2.0 code; its pages "for research purposes only") annotates each page
with blocks (``layout_dets``): a category, a polygon, the block's text and its place in the reading order
(``order``; running heads, page numbers, footnotes and discarded areas have none). Its demo folder
(``demo_data/omnidocbench_demo``: ``OmniDocBench_demo.json`` and ``images/``, 18 pages: books, papers,
slides, newspapers, notes, textbooks; Chinese and English) is what ``benchmarks/reading_order.py`` reads;
the full set (1,651 pages) has the same layout. Nothing here is committed: pass the folder (where
``opendatalab/OmniDocBench`` cannot be fetched, its fork ``pichiu/OmniDocBench`` holds the same demo folder,
at ``demo_data/omnidocbench_demo``). HRDoc's pages
are read into the same structures by ``benchmarks/hrdoc_pages.py``.

The truth of a page is the text of its ordered blocks of running text (titles, paragraphs, captions,
footnotes of tables and figures) in their order; tables, figures, formulas, running heads and feet, page
numbers and discarded areas are left out, and so are the recognised lines whose centre lies in one of
those areas (what a line there reads is not a reading-order question).

The split into pages to develop on and pages only measured on is fixed by the page's name
(:func:`half`), so it cannot drift towards whichever pages a method happens to do well on. A page's
``group`` is the row it is summed up in: its half here.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from tests.scoring import levenshtein, normalise

Box = tuple[float, float, float, float]

TEXT_KINDS = frozenset({"title", "text_block", "figure_caption", "table_caption", "table_footnote",
                        "figure_footnote", "equation_caption", "code_txt", "reference"})


@dataclass(frozen=True)
class TruthBlock:
    kind: str
    box: Box
    order: int | None
    text: str

    @property
    def ordered_text(self) -> bool:
        return self.order is not None and self.kind in TEXT_KINDS


@dataclass(frozen=True)
class PublicPage:
    name: str
    image: Path
    language: str
    layout: str
    source: str
    size: tuple[int, int]  # width, height: the image's (the JSON's page_info swaps them on some pages)
    blocks: tuple[TruthBlock, ...]
    half: str  # "develop" or "measure"
    group: str  # the row the page is summed up in
    scale: int = 1  # the image is read this many times its size; sizes and boxes here are already scaled

    def image_bytes(self) -> bytes:
        """The page's image file, or a PNG of it :attr:`scale` times the size."""
        if self.scale == 1:
            return self.image.read_bytes()
        with Image.open(self.image) as img:
            big = img.convert("RGB").resize(self.size, Image.Resampling.BICUBIC)
        out = io.BytesIO()
        big.save(out, format="PNG")
        return out.getvalue()

    @property
    def truth(self) -> list[TruthBlock]:
        """The blocks of running text, in reading order."""
        return sorted((b for b in self.blocks if b.ordered_text), key=lambda b: b.order or 0)

    @property
    def text(self) -> str:
        return "\n".join(b.text for b in self.truth)

    def excluded(self, point: tuple[float, float]) -> bool:
        """Whether a point lies in an area left out of the truth (and in no block of running text)."""
        inside = [b for b in self.blocks if _contains(b.box, point)]
        return bool(inside) and not any(b.ordered_text for b in inside)

    def block_of(self, box: Box) -> int | None:
        """The index in :attr:`truth` of the block of running text the box overlaps most, if any."""
        best, where = 0.0, None
        for i, b in enumerate(self.truth):
            area = _overlap(b.box, box)
            if area > best:
                best, where = area, i
        return where


def half(name: str) -> str:
    """``develop`` or ``measure``: a page's half, from a hash of its name (about one page in two each)."""
    return "develop" if hashlib.sha1(name.encode()).digest()[0] % 2 == 0 else "measure"


def load(root: Path) -> list[PublicPage]:
    """The pages of an OmniDocBench folder (its JSON file beside ``images/``), sorted by name."""
    found = sorted(root.glob("*.json"))
    if not found:
        raise FileNotFoundError(f"no OmniDocBench JSON file in {root}")
    pages = []
    for entry in json.loads(found[0].read_text()):
        info = entry["page_info"]
        attrs = info.get("page_attribute", {})
        blocks = tuple(TruthBlock(d["category_type"], _poly_box(d["poly"]), d.get("order"), d.get("text") or "")
                       for d in entry["layout_dets"] if not d.get("ignore"))
        name = Path(info["image_path"]).name
        image = root / "images" / name
        pages.append(PublicPage(name, image, attrs.get("language", ""), attrs.get("layout", ""),
                                attrs.get("data_source", ""), _size(image, info), blocks, half(name), half(name)))
    return sorted(pages, key=lambda p: p.name)


def _size(image: Path, info: dict[str, Any]) -> tuple[int, int]:
    """The page's width and height: its image's, where the image is there (the demo JSON has them swapped on
    half its pages, which moved the margin bands ``paperlane.layout`` finds running heads and feet in)."""
    if image.exists():
        with Image.open(image) as img:
            return img.size
    return int(info["width"]), int(info["height"])


def region_order_distance(visits: Sequence[int], blocks: int) -> float:
    """Normalised edit distance between the order a reading visits the truth's blocks and their true order.

    ``visits``: the truth block of each line read, in the order read; a block counts where it is first
    visited. Blocks never visited are missing from the reading; 0.0 is the true order, 1.0 none of it.
    """
    seen: list[int] = []
    for v in visits:
        if v not in seen:
            seen.append(v)
    if not blocks:
        return 0.0
    got = "".join(chr(0x4E00 + v) for v in seen)
    want = "".join(chr(0x4E00 + v) for v in range(blocks))
    return levenshtein(got, want) / max(len(got), len(want))


def f1(pred: Counter[str], truth: Counter[str]) -> float:
    hit = sum((pred & truth).values())
    if not hit:
        return 0.0 if pred or truth else 1.0
    p, r = hit / sum(pred.values()), hit / sum(truth.values())
    return 2 * p * r / (p + r)


def char_f1(pred: str, truth: str) -> float:
    """Order-free: the F1 of the two texts' characters as multisets (whitespace left out)."""
    return f1(Counter(normalise(pred).replace(" ", "")), Counter(normalise(truth).replace(" ", "")))


def word_f1(pred: str, truth: str) -> float:
    """Order-free: the F1 of the two texts' words as multisets (CJK characters count as words)."""
    return f1(Counter(_words(pred)), Counter(_words(truth)))


def _words(text: str) -> list[str]:
    out: list[str] = []
    for token in normalise(text).split():
        run = ""
        for ch in token:
            if "\u3000" <= ch <= "\u9fff" or "\uf900" <= ch <= "\ufaff":
                out += [run] if run else []
                out.append(ch)
                run = ""
            else:
                run += ch
        out += [run] if run else []
    return out


def _poly_box(poly: Sequence[float]) -> Box:
    xs, ys = poly[0::2], poly[1::2]
    return min(xs), min(ys), max(xs), max(ys)


def _contains(box: Box, point: tuple[float, float]) -> bool:
    return box[0] <= point[0] <= box[2] and box[1] <= point[1] <= box[3]


def _overlap(a: Box, b: Box) -> float:
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
