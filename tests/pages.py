"""Synthetic pages with known text, and the ugly inputs every pipeline must survive."""

from __future__ import annotations

import ctypes
import io
import random
import struct
import zlib
from typing import TYPE_CHECKING

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PIL import Image, ImageDraw, ImageFont

if TYPE_CHECKING:
    from paperlane.models.engine import InputSpec, PreparedImage
    from paperlane.workers.input_limits import Limits

WORDS = ("invoice total amount paid customer account number date order shipping address payment "
         "balance receipt quantity price tax discount reference delivery company limited street").split()


def sample_lines(seed: int, n: int = 6) -> list[str]:
    rnd = random.Random(seed)
    lines = []
    for _ in range(n):
        words = [rnd.choice(WORDS).capitalize() if i == 0 else rnd.choice(WORDS) for i in range(rnd.randint(3, 5))]
        lines.append(" ".join(words) + f" {rnd.randint(10, 9999)}")
    return lines


def render_page(lines: list[str], *, fmt: str = "PNG", width: int = 1240, font_size: int = 36,
                exif_rotate: bool = False) -> bytes:
    """A white page with ``lines`` in black. ``exif_rotate`` stores it rotated with an EXIF tag
    (orientation 6) that says how to turn it back upright."""
    font = ImageFont.load_default(size=font_size)
    height = 120 + len(lines) * font_size * 2
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    for i, text in enumerate(lines):
        draw.text((70, 60 + i * font_size * 2), text, fill="black", font=font)
    buf = io.BytesIO()
    if exif_rotate:
        exif = Image.Exif()
        exif[0x0112] = 6  # the viewer must rotate 90 degrees clockwise
        img.rotate(90, expand=True).save(buf, format="JPEG", quality=92, exif=exif)
    else:
        img.save(buf, format=fmt, **({"quality": 92} if fmt == "JPEG" else {}))
    return buf.getvalue()


def truncated_jpeg(lines: list[str]) -> bytes:
    data = render_page(lines, fmt="JPEG")
    return data[: len(data) // 2]


def huge_declared_png(width: int = 40000, height: int = 40000) -> bytes:
    """A tiny PNG whose header declares width x height pixels (a decompression bomb's shape)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


BAD_INPUTS: dict[str, bytes] = {
    "empty.jpg": b"",
    "text-named.png": b"this is a text file, not an image\n",
    "huge-declared.png": huge_declared_png(),
}


def tiny_page(i: int) -> bytes:
    """A small one-line page, unique per ``i``: cheap to OCR, for scheduling tests with backlogs."""
    font = ImageFont.load_default(size=28)
    img = Image.new("L", (360, 64), 255)
    ImageDraw.Draw(img).text((12, 14), f"Item {i} paid", fill=0, font=font)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def prepare(data: bytes, spec: InputSpec, limits: Limits | None = None) -> PreparedImage:
    """A page's engine input, as preprocessing hands it to the engine (page 1, no preview)."""
    from paperlane.workers.input_limits import Limits
    from paperlane.workers.preprocess import prepare_page  # OpenCV: only for the tests that prepare pages

    return prepare_page(data, spec, limits or Limits()).image


def render_columns(columns: int, *, seed: int = 0, width: int = 1700, font: ImageFont.FreeTypeFont | None = None,
                   words: list[str] | None = None, joiner: str = " ", rows: int = 14) -> tuple[bytes, str]:
    """A page of ``columns`` columns of running text under a full-width title, with a full-width footnote
    below them (PNG), and its text in reading order (title, each column top to bottom, footnote). The
    columns' lines sit on one baseline grid, so reading in rows across the page mixes the columns; each
    column has a paragraph break. ``words`` and ``joiner``: the vocabulary and what joins it (Chinese: "")."""
    rnd = random.Random(seed)
    vocab = words or WORDS
    if font is None:
        default = ImageFont.load_default(size=30)
        assert isinstance(default, ImageFont.FreeTypeFont)  # Pillow's own scalable font
        font = default
    small = font.font_variant(size=int(font.size * 0.8))
    big = font.font_variant(size=int(font.size * 1.5))
    margin, gutter, lead = 80, 70, int(font.size * 1.6)
    col_w = (width - 2 * margin - (columns - 1) * gutter) // columns
    height = 260 + (rows + 1) * lead + 200
    img = Image.new("L", (width, height), 255)
    draw = ImageDraw.Draw(img)
    title = joiner.join(rnd.choice(vocab) for _ in range(5)).capitalize()
    draw.text((margin, 80), title, fill=0, font=big)
    truth = [title]
    for c in range(columns):
        x = margin + c * (col_w + gutter)
        for r in range(rows):
            if r == rows // 2:
                continue  # the paragraph break
            line = _fill(rnd, vocab, joiner, col_w, font, draw, last=r in (rows // 2 - 1, rows - 1))
            draw.text((x, 220 + r * lead), line, fill=0, font=font)
            truth.append(line)
    note = joiner.join(rnd.choice(vocab) for _ in range(9))
    draw.text((margin, 240 + rows * lead + 40), note, fill=0, font=small)
    truth.append(note)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue(), "\n".join(truth)


def _fill(rnd: random.Random, vocab: list[str], joiner: str, width: int, font: ImageFont.FreeTypeFont,
          draw: ImageDraw.ImageDraw, *, last: bool) -> str:
    """Words up to the column's width (60% of it on a paragraph's last line)."""
    limit, line = width * (0.6 if last else 1.0), rnd.choice(vocab)
    while True:
        longer = line + joiner + rnd.choice(vocab)
        if draw.textlength(longer, font=font) > limit:
            return line
        line = longer


# --- Scanned PDFs, as scanners and OCR tools write them ---------------------------------------------------------


def pdf_bytes(pdf: pdfium.PdfDocument) -> bytes:
    """``pdf`` saved, and closed."""
    buf = io.BytesIO()
    pdf.save(buf)
    pdf.close()
    return buf.getvalue()


def add_text(pdf: pdfium.PdfDocument, page: pdfium.PdfPage, text: str, *, x: float, y: float, size: float = 10,
             mode: int = pdfium_c.FPDF_TEXTRENDERMODE_INVISIBLE) -> None:
    """A line of Helvetica at (x, y) points; invisible by default (render mode 3), as an OCR layer is written."""
    obj = pdfium_c.FPDFPageObj_NewTextObj(pdf, b"Helvetica", ctypes.c_float(size))
    encoded = (text + "\x00").encode("utf-16-le")
    pdfium_c.FPDFText_SetText(obj, ctypes.cast(ctypes.c_char_p(encoded), ctypes.POINTER(ctypes.c_ushort)))
    pdfium_c.FPDFTextObj_SetTextRenderMode(obj, mode)
    pdfium_c.FPDFPageObj_Transform(obj, 1, 0, 0, 1, x, y)
    pdfium_c.FPDFPage_InsertObject(page, obj)


def bilevel_pdf(images: list[Image.Image], *, dpi: int) -> bytes:
    """``images`` made bilevel, one page each, stored as CCITT G4 by Pillow's PDF writer (/BlackIs1 true)."""
    frames = [im.convert("L").point(lambda v: 255 if v > 128 else 0).convert("1") for im in images]
    buf = io.BytesIO()
    frames[0].save(buf, format="PDF", resolution=dpi, save_all=True, append_images=frames[1:])
    return buf.getvalue()


def render_news(columns: int, *, seed: int = 0, size: int = 22, gutter_em: float = 1.0,
                width: int = 2400) -> tuple[bytes, list[tuple[str, tuple[int, int, int, int]]]]:
    """A made newspaper page (PNG) of ``columns`` narrow justified columns ``gutter_em`` ems apart: a masthead;
    one article down the left columns beside another under a headline across the right ones, with a third
    article under it over all but the last column; a last article across the page. Its lines in reading order
    (masthead, then each article: headline, each of its columns top to bottom), each with its box."""
    rnd = random.Random(seed)
    page = _News(rnd, ImageFont.load_default(size=size), columns=columns, gutter=int(size * gutter_em), width=width)
    page.line("The Daily Record", 60, 40, page.font.font_variant(size=int(size * 3.5)))
    top = 40 + size * 5
    split = rnd.choice([2, 3]) if columns >= 5 else 1
    left = page.article(0, split - 1, top, rnd.randint(40, 48))
    right = page.article(split, columns - 1, top, rnd.randint(14, 20))
    right = page.article(split, max(split, columns - 2), right, rnd.randint(12, 18))
    bottom = page.article(0, columns - 1, max(left, right) + 20, rnd.randint(10, 14))
    buf = io.BytesIO()
    page.img.crop((0, 0, width, bottom + 60)).save(buf, format="PNG")
    return buf.getvalue(), page.truth


class _News:
    """The drawing state of ``render_news``: its page, its column grid and the lines drawn so far."""

    def __init__(self, rnd: random.Random, font: ImageFont.FreeTypeFont, *, columns: int, gutter: int,
                 width: int) -> None:
        self.rnd, self.font, self.margin, self.gutter = rnd, font, 60, gutter
        self.lead = int(font.size * 1.3)
        self.col_w = (width - 2 * self.margin - (columns - 1) * gutter) // columns
        self.img = Image.new("L", (width, 3400), 255)
        self.draw = ImageDraw.Draw(self.img)
        self.truth: list[tuple[str, tuple[int, int, int, int]]] = []

    def x(self, column: int) -> int:
        return self.margin + column * (self.col_w + self.gutter)

    def line(self, text: str, x: float, y: float, font: ImageFont.FreeTypeFont) -> None:
        self.draw.text((x, y), text, fill=0, font=font)
        box = self.draw.textbbox((x, y), text, font=font)
        self.truth.append((text, (int(box[0]), int(box[1]), int(box[2]), int(box[3]))))

    def article(self, first: int, last: int, top: int, rows: int) -> int:
        """A headline across columns ``first``..``last`` and ``rows`` justified lines in each (a paragraph
        break every seventh); the y where the next article may start."""
        head = self.font.font_variant(size=self.font.size * 2)
        words = [self.rnd.choice(WORDS) for _ in range(self.rnd.randint(3, 6))]
        room = self.x(last) + self.col_w - self.x(first)
        while len(words) > 1 and self.draw.textlength(" ".join(words), font=head) > room:
            words.pop()
        self.line(" ".join(words).capitalize(), self.x(first), top, head)
        body = top + self.font.size * 3
        for column in range(first, last + 1):
            for k in range(rows):
                end = k % 7 == 6 or k == rows - 1
                y = body + k * self.lead + (self.lead // 2) * (k // 7)
                self._justified(_fill(self.rnd, WORDS, " ", int(self.col_w * (0.5 if end else 1.0)), self.font,
                                      self.draw, last=False).split(), self.x(column), y, last=end)
        return body + rows * self.lead + (self.lead // 2) * (rows // 7) + self.font.size * 3 // 2

    def _justified(self, words: list[str], x: int, y: int, *, last: bool) -> None:
        """``words`` set across the column (the last line of a paragraph flush left), kept as one line."""
        text = " ".join(words)
        if last or len(words) < 2:
            self.line(text, x, y, self.font)
            return
        gap = (self.col_w - sum(self.draw.textlength(w, font=self.font) for w in words)) / (len(words) - 1)
        at = float(x)
        for w in words:
            self.draw.text((at, y), w, fill=0, font=self.font)
            at += self.draw.textlength(w, font=self.font) + gap
        _, top, _, bottom = self.draw.textbbox((x, y), text, font=self.font)
        self.truth.append((text, (x, int(top), x + self.col_w, int(bottom))))
