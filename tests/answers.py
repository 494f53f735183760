"""Model answers for testing the loop guard: real pages written in each answer format, legitimately
repetitive pages, and the loops OCR models fall into.

``real_answers`` writes the development corpus' ground truth (tests/corpus.py) the way HunyuanOCR
answers each task; ``repetitive_answers`` are pages that repeat as real documents do (tables of
numbers, blank forms and ledgers, dotted leaders, forms with repeated labels); ``loops`` are answers
that fall into a loop after a normal start, one per kind of loop seen in OCR models' issues (a line, a
phrase, one character, an empty table row, a spotting item, a paragraph, two lines alternating).
Benchmarks and tests feed them through ``paperlane.models.degeneration`` and count the stops.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from tests.corpus import TruthPage, corpus_root, funsd_pages, sroie_pages
from tests.pages import WORDS

A4_PREPARED = (1448, 2048)  # an A4 page as the HunyuanOCR profiles prepare it


@dataclass(frozen=True)
class Answer:
    name: str
    text: str
    width: int = A4_PREPARED[0]  # the image the model read: what the page can hold
    height: int = A4_PREPARED[1]


def pieces(text: str, size: int = 48) -> Iterator[str]:
    """``text`` in stream-sized pieces."""
    for i in range(0, len(text), size):
        yield text[i : i + size]


# --- real pages ------------------------------------------------------------------------------------------


def real_answers(root: Path | None = None) -> list[Answer]:
    """Every corpus page's ground truth as a plain-text, markdown, HunyuanOCR spotting and JSON spotting answer."""
    root = corpus_root(root)
    pages = sroie_pages(root) + funsd_pages(root)
    return [answer for page in pages for answer in _formats(page)]


def _formats(page: TruthPage) -> list[Answer]:
    with Image.open(page.image) as img:
        width, height = img.size
    # The model reads it as the HunyuanOCR profiles prepare it: at most 2048 x 2048 pixels.
    scale = min(1.0, (A4_PREPARED[1] ** 2 / (width * height)) ** 0.5)
    width, height = round(width * scale), round(height * scale)
    boxes = [[round(v * scale * 1000 / side) for v, side in zip(line.box, (width, height, width, height))]
             for line in page.lines]
    texts = [line.text for line in page.lines]
    spotting = "".join(f"{t}({x1},{y1}),({x2},{y2})" for t, (x1, y1, x2, y2) in zip(texts, boxes))
    items = json.dumps([{"box": box, "text": t} for t, box in zip(texts, boxes)], ensure_ascii=False)
    markdown = "\n\n".join(texts)
    return [Answer(f"{page.name}/{kind}", text, width, height)
            for kind, text in (("text", page.text), ("markdown", markdown), ("spotting", spotting), ("json", items))]


# --- legitimately repetitive pages --------------------------------------------------------------------------


def repetitive_answers(seed: int = 7) -> list[Answer]:
    """Long pages that repeat the way real documents do, in the formats models answer in."""
    rnd = random.Random(seed)
    rows = _number_rows(rnd, 60)
    out = [
        Answer("numbers/html", "<table>" + "".join(_html_row(r) for r in rows) + "</table>"),
        Answer("numbers/html-lines", "<table>\n" + "\n".join(_html_row(r) for r in rows) + "\n</table>"),
        Answer("numbers/markdown", "| a | b | c | d | e | f |\n|---|---|---|---|---|---|\n"
               + "\n".join("| " + " | ".join(r) + " |" for r in rows)),
        Answer("numbers/text", "\n".join(" ".join(r) for r in rows)),
        Answer("numbers/cells", "\n".join(cell for r in rows for cell in r)),  # column-wise, one cell a line
        Answer("ledger/html", "<table><tr><th>Date</th><th>Item</th><th>In</th><th>Out</th></tr>"
               + "<tr><td></td><td></td><td></td><td></td></tr>" * 30 + "</table>"),
        Answer("ledger/markdown", "| Date | Item | In | Out |\n|---|---|---|---|\n" + "|  |  |  |  |\n" * 30),
        Answer("ledger/underlines", "Attendance\n" + "__________________________________________\n" * 30),
        Answer("blank-form", "Sign-up sheet\n" + "Name: ____________ Date: ________\n" * 12 + "Thank you"),
        Answer("blank-form/spotting", "".join(f"Name: ____ Date: ____({60},{80 + 30 * i}),({900},{100 + 30 * i})"
                                              for i in range(14))),
        Answer("labels", "\n".join(f"Name: {' '.join(rnd.sample(WORDS, 2))}\nAccount number: {rnd.randint(1, 99999)}\n"
                                   f"Amount paid: {rnd.randint(1, 999)}.00\nSignature: ____________"
                                   for _ in range(30))),
        Answer("receipt", "STORE 12\n" + "1 x PLASTIC BAG 0.20\n" * 10 + "TOTAL 2.00"),
        Answer("contents", "\n".join(f"Chapter {i} {rnd.choice(WORDS)} " + "." * 100 + f" {i * 7}"
                                      for i in range(1, 25))),
        Answer("zeros", "\n".join(["0.00 0.00 0.00 0.00 0.00 0.00"] * 8 + [" ".join(r) for r in rows[:20]])),
        Answer("dense", " ".join(rnd.choice(WORDS) for _ in range(1100))),  # ~7,000 characters on one page
    ]
    return out


def _number_rows(rnd: random.Random, n: int) -> list[list[str]]:
    rows = []
    for i in range(n):
        zero_block = 20 <= i < 28  # eight all-zero rows in a row, as sparse ledgers have
        rows.append(["0.00"] * 6 if zero_block else
                    [str(i + 1), f"{rnd.randint(0, 9999)}.{rnd.randint(0, 99):02d}", "0.00",
                     f"{rnd.randint(0, 99)}", "-", f"{rnd.random() * 100:.1f}%"])
    return rows


def _html_row(cells: list[str]) -> str:
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


# --- loops ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Loop:
    name: str
    prefix: str  # the normal start of the answer
    unit: str  # what repeats (for the near-loop: one period of it)

    def text(self, chars: int = 12_000) -> str:
        """The answer as a model looping until ``chars`` characters (about 4,000 tokens) writes it."""
        body = self.prefix
        while len(body) < chars:
            body += self.unit
        return body[:chars]


def loops(seed: int = 3) -> list[Loop]:
    rnd = random.Random(seed)
    start = "\n".join(" ".join(rnd.choice(WORDS) for _ in range(7)) for _ in range(20)) + "\n"
    spot = "".join(f"{w}({60},{40 + 30 * i}),({400},{60 + 30 * i})" for i, w in enumerate(rnd.sample(WORDS, 10)))
    paragraph = " ".join(rnd.choice(WORDS) for _ in range(90)) + "\n\n"
    return [
        Loop("line", start, "Total amount due 0.00\n"),
        Loop("phrase", start, "the customer account "),
        Loop("character", start + "Reference 5", "!"),
        Loop("cjk", start, "的"),
        Loop("table-row", start + "<table><tr><td>Item</td><td>Price</td></tr>", "<tr><td></td><td></td></tr>"),
        Loop("spotting", spot, "Total(100,900),(300,920)"),
        Loop("json-spotting", "[" + json.dumps({"box": [1, 2, 3, 4], "text": "Invoice"}) + ", ",
             json.dumps({"box": [100, 900, 300, 920], "text": "Total 0.00"}) + ", "),
        Loop("paragraph", start, paragraph),
        # A near-loop: one line comes back between lines that vary (a model misreading the same word).
        Loop("near-loop", start, "".join(f"Service: project name\n\nStatus: {rnd.choice(('approved', 'done'))}"
                                         f" {rnd.choice(WORDS)}\n\n" for _ in range(40))),
    ]
