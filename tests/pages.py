"""Synthetic pages with known text, and the ugly inputs every pipeline must survive."""

from __future__ import annotations

import io
import random
import struct
import zlib
from typing import TYPE_CHECKING

from PIL import Image, ImageDraw, ImageFont

if TYPE_CHECKING:
    from paperlane.models.engine import InputSpec, PreparedImage
    from paperlane.workers.preprocess import Limits

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
    from paperlane.workers.preprocess import Limits, prepare_page  # OpenCV: only for the tests that prepare pages

    return prepare_page(data, spec, limits or Limits()).image
