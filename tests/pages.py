"""Synthetic pages with known text, and the ugly inputs every pipeline must survive."""

from __future__ import annotations

import ctypes
import io
import random
import struct
import zlib

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PIL import Image, ImageDraw, ImageFont

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
