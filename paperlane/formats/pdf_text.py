"""The searchable PDF's text layer: each word invisible (render mode 3) over its quad, in a font built here.

See ``paperlane.formats.pdf`` for what the layer holds and where it goes. The font is a GlyphLessFont like
Tesseract's and OCRmyPDF's (one empty-advance glyph, a box from descent to ascent), embedded as a CIDFontType2
whose CIDs number the document's distinct characters and whose ToUnicode map gives them back. The failure mark
uses the standard Helvetica: characters outside Windows-1252 become "?".
"""

from __future__ import annotations

import ctypes
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c

from paperlane.formats.view import clean_text, page_problem
from paperlane.layout import estimate_words, is_rtl
from paperlane.schemas import PageResult, Point, Task
from paperlane.status import JobStatus

_DESCENT, _ASCENT = 0.2, 0.8  # the glyph box spans 1 em: font size = line height
_ADVANCE = 0.5  # every glyph is half an em wide before the horizontal scaling
_UNLAYERED_TASKS = (Task.FIELDS, Task.TRANSLATE)
_MARK_RGB = (200, 0, 0)


@dataclass(frozen=True)
class Affine:
    """x' = a x + c y + e, y' = b x + d y + f (PDF's matrix order)."""

    a: float
    b: float
    c: float
    d: float
    e: float
    f: float

    @classmethod
    def through(cls, origin: Point, x_end: Point, y_end: Point, *, sx: float = 1.0, sy: float = 1.0) -> Affine:
        """The map taking (0, 0), (sx, 0) and (0, sy) to ``origin``, ``x_end`` and ``y_end``."""
        (e, f), (ax, ay), (cx, cy) = origin, x_end, y_end
        return cls((ax - e) / sx, (ay - f) / sx, (cx - e) / sy, (cy - f) / sy, e, f)

    @property
    def coefficients(self) -> tuple[float, float, float, float, float, float]:
        return self.a, self.b, self.c, self.d, self.e, self.f

    def __call__(self, point: Point) -> Point:
        x, y = point
        return self.a * x + self.c * y + self.e, self.b * x + self.d * y + self.f


@dataclass(frozen=True)
class _Placement:
    """A line's baseline start and unit direction in page space, its length and height in points."""

    origin: Point
    direction: Point
    width: float
    height: float

    @classmethod
    def of(cls, corners: Sequence[Point]) -> _Placement | None:
        """From a quad in page space (clockwise from top-left as the page shows); None if degenerate."""
        (x0, y0), (x1, y1), (x2, y2), (x3, y3) = corners
        ux, uy = (x1 - x0 + x2 - x3) / 2, (y1 - y0 + y2 - y3) / 2
        width = math.hypot(ux, uy)
        if not width > 0.01:
            return None
        ex, ey = ux / width, uy / width
        nx, ny = -ey, ex  # "up" for text running along (ex, ey) in PDF's y-up space
        rise = ((x0 - x3 + x1 - x2) * nx + (y0 - y3 + y1 - y2) * ny) / 2
        height = abs(rise)
        if not height > 0.01:
            return None
        bx, by = (x3, y3) if rise > 0 else (x0, y0)  # the lower edge's start
        return cls((bx + nx * _DESCENT * height, by + ny * _DESCENT * height), (ex, ey), width, height)

    def put(self, obj: pdfium_c.FPDF_PAGEOBJECT, *, hscale: float = 1.0) -> None:
        (ox, oy), (ex, ey) = self.origin, self.direction
        pdfium_c.FPDFPageObj_Transform(obj, hscale * ex, hscale * ey, -ey, ex, ox, oy)


@dataclass
class Layer:
    """What goes on one page: lines at quads (result pixels), lines without, or a problem to mark."""

    placed: list[tuple[str, list[Point]]]  # a word and its quad; all but a line's last end in a space
    unplaced: list[str]
    problem: str | None = None

    @classmethod
    def of(cls, result: PageResult) -> Layer:
        if result.status is not JobStatus.SUCCEEDED:
            return cls([], [], page_problem(result))
        if result.task in _UNLAYERED_TASKS:
            return cls([], [])
        size = (result.width or 0, result.height or 0)
        rtl = is_rtl(ln.text for ln in result.lines)
        placed: list[tuple[str, list[Point]]] = []
        for ln in result.lines:
            if not clean_text(ln.text) or not _usable(ln.quad, size):
                continue
            words = ln.words or estimate_words(ln.text, ln.quad or [], rtl=rtl)
            kept = [(text, list(w.quad)) for w in words if (text := clean_text(w.text)) and _usable(w.quad, size)]
            placed += [(text + (" " if k < len(kept) - 1 else ""), quad) for k, (text, quad) in enumerate(kept)]
        if placed:
            return cls(placed, [])
        return cls([], [text for row in result.text.splitlines() if (text := clean_text(row))])

    def chars(self) -> set[str]:
        return {ch for text in [*(t for t, _ in self.placed), *self.unplaced] for ch in text}


def _usable(quad: list[Point] | None, size: tuple[int, int]) -> bool:
    """Four finite corners near a page of ``size`` pixels: engines' coordinates can be anything."""
    reach = 2 * max(size)
    return bool(quad) and len(quad or ()) == 4 and reach > 0 and all(
        math.isfinite(v) and abs(v) <= reach for point in quad or () for v in point)



def draw_layer(pdf: pdfium.PdfDocument, page: pdfium.PdfPage, layer: Layer, result: PageResult,
                font: Font | None) -> None:
    if layer.problem is not None:
        _mark(pdf, page, f"paperlane: {layer.problem}")
    if font is None:
        return
    if layer.placed:
        to_page = _device_to_page(page, result.width or 1, result.height or 1)
        for text, quad in layer.placed:
            _invisible_line(pdf, page, font, text, [to_page(p) for p in quad])
    for text, corners in _bands(page, layer.unplaced):
        _invisible_line(pdf, page, font, text, corners)


def _bands(page: pdfium.PdfPage, rows: list[str]) -> list[tuple[str, list[Point]]]:
    """Lines without quads, stacked from the page's top left (as it shows), each at most a page wide."""
    if not rows:
        return []
    width, height = page.get_size()
    margin = min(36.0, width / 20, height / 20)
    size = max(0.5, min(12.0, (height - 2 * margin) / len(rows)))
    to_page = _display_to_page(page)
    bands = []
    for i, text in enumerate(rows):
        x0, y0 = margin, margin + i * size
        x1 = x0 + min(len(text) * _ADVANCE * size, width - 2 * margin)
        bands.append((text, [to_page(p) for p in ((x0, y0), (x1, y0), (x1, y0 + size), (x0, y0 + size))]))
    return bands


def _invisible_line(pdf: pdfium.PdfDocument, page: pdfium.PdfPage, font: Font, text: str,
                    corners: list[Point]) -> None:
    placement = _Placement.of(corners)
    codes = font.codes(text)
    if placement is None or not codes:
        return
    spanning = len(font.codes(text.rstrip(" "))) or len(codes)  # a word's trailing space runs past its quad
    obj = pdfium_c.FPDFPageObj_CreateTextObj(pdf.raw, font.handle, placement.height)
    if not obj:
        raise pdfium.PdfiumError("cannot create a text object")
    pdfium_c.FPDFPage_InsertObject(page.raw, obj)  # the page owns it from here
    if not pdfium_c.FPDFText_SetCharcodes(obj, (ctypes.c_uint * len(codes))(*codes), len(codes)):
        raise pdfium.PdfiumError("cannot set a text object's characters")
    pdfium_c.FPDFTextObj_SetTextRenderMode(obj, pdfium_c.FPDF_TEXTRENDERMODE_INVISIBLE)
    placement.put(obj, hscale=placement.width / (spanning * _ADVANCE * placement.height))


def _mark(pdf: pdfium.PdfDocument, page: pdfium.PdfPage, message: str) -> None:
    """``message`` in small red Helvetica at the page's top left as it shows, cut to the page's width."""
    width, height = page.get_size()
    size = min(14.0, max(6.0, width / 50))
    margin = min(18.0, width / 30, height / 30)
    fits = max(8, int((width - 2 * margin) / (0.55 * size)))
    text = message if len(message) <= fits else message[: fits - 1] + "\u2026"
    text = text.encode("cp1252", "replace").decode("cp1252")  # what the standard font's encoding has
    to_page = _display_to_page(page)
    placement = _Placement.of([to_page(p) for p in ((margin, margin), (margin + 1, margin),
                                                     (margin + 1, margin + size), (margin, margin + size))])
    obj = pdfium_c.FPDFPageObj_NewTextObj(pdf.raw, b"Helvetica", size)
    if placement is None or not obj:
        raise pdfium.PdfiumError("cannot create the failure mark")
    pdfium_c.FPDFPage_InsertObject(page.raw, obj)
    wide = ctypes.create_string_buffer(text.encode("utf-16-le") + b"\0\0")
    pdfium_c.FPDFText_SetText(obj, ctypes.cast(wide, ctypes.POINTER(ctypes.c_ushort)))
    pdfium_c.FPDFPageObj_SetFillColor(obj, *_MARK_RGB, 255)
    placement.put(obj)


def _device_to_page(page: pdfium.PdfPage, width: int, height: int) -> Affine:
    """Pixels of the page rendered at ``width`` x ``height`` as pdfium renders it -> page space."""

    def corner(x: int, y: int) -> Point:
        px, py = ctypes.c_double(), ctypes.c_double()
        if not pdfium_c.FPDF_DeviceToPage(page.raw, 0, 0, width, height, 0, x, y, px, py):
            raise pdfium.PdfiumError("cannot map device to page coordinates")
        return px.value, py.value

    return Affine.through(corner(0, 0), corner(width, 0), corner(0, height), sx=width, sy=height)


def _display_to_page(page: pdfium.PdfPage) -> Affine:
    """Points from the top left of the page as a viewer shows it -> page space."""
    width, height = page.get_size()
    w, h = max(1, round(width)), max(1, round(height))
    pixels = _device_to_page(page, w, h)
    return Affine(pixels.a * w / width, pixels.b * w / width, pixels.c * h / height, pixels.d * h / height,
                   pixels.e, pixels.f)


# -- the searchable PDF: the font ----------------------------------------------------------------------

@dataclass(frozen=True)
class Font:
    """The document's GlyphLessFont: CID n (from 1) is the n-th of its distinct characters."""

    handle: pdfium_c.FPDF_FONT
    cids: dict[str, int]

    @classmethod
    def load(cls, pdf: pdfium.PdfDocument, chars: set[str]) -> Font | None:
        """The font for ``chars`` in ``pdf`` (None when there is no text); raises PdfiumError."""
        if not chars:
            return None
        ordered = sorted(chars)[:0xFFFE]  # two-byte CIDs; 0 is .notdef
        ttf = _glyphless_ttf()
        cid_to_gid = b"\0\0" + b"\0\1" * len(ordered)  # every CID draws glyph 1
        handle = pdfium_c.FPDFText_LoadCidType2Font(
            pdf.raw, (ctypes.c_uint8 * len(ttf)).from_buffer_copy(ttf), len(ttf), _to_unicode(ordered),
            (ctypes.c_uint8 * len(cid_to_gid)).from_buffer_copy(cid_to_gid), len(cid_to_gid))
        if not handle:
            raise pdfium.PdfiumError("cannot load the text layer's font")
        return cls(handle, {ch: cid for cid, ch in enumerate(ordered, 1)})

    def codes(self, text: str) -> list[int]:
        return [cid for ch in text if (cid := self.cids.get(ch))]


def _to_unicode(chars: list[str]) -> bytes:
    """The ToUnicode CMap: CID n (from 1) -> chars[n - 1], in UTF-16BE as the format wants."""
    entries = [f"<{cid:04X}> <{ch.encode('utf-16-be').hex().upper()}>" for cid, ch in enumerate(chars, 1)]
    blocks = [entries[i:i + 100] for i in range(0, len(entries), 100)]  # at most 100 a block
    return "\n".join([
        "/CIDInit /ProcSet findresource begin", "12 dict begin", "begincmap",
        "/CIDSystemInfo << /Registry (Adobe) /Ordering (UCS) /Supplement 0 >> def",
        "/CMapName /Adobe-Identity-UCS def", "/CMapType 2 def",
        "1 begincodespacerange", "<0000> <FFFF>", "endcodespacerange",
        *(f"{len(block)} beginbfchar\n" + "\n".join(block) + "\nendbfchar" for block in blocks),
        "endcmap", "CMapName currentdict /CMap defineresource pop", "end", "end", "",
    ]).encode("ascii")


@cache
def _glyphless_ttf() -> bytes:
    """A TrueType font of one glyph: no ink (drawn in render mode 3 anyway), a box half an em wide
    from the descent to the ascent, so a reader's selection covers the line; 1000 units an em."""
    em, adv, asc, desc = 1000, round(_ADVANCE * 1000), round(_ASCENT * 1000), -round(_DESCENT * 1000)
    names = [(1, "GlyphLessFont"), (2, "Regular"), (4, "GlyphLessFont"), (6, "GlyphLessFont")]
    strings = [s.encode("utf-16-be") for _, s in names]
    offsets = [sum(map(len, strings[:i])) for i in range(len(strings))]
    name = struct.pack(">HHH", 0, len(names), 6 + 12 * len(names)) + b"".join(
        struct.pack(">6H", 3, 1, 0x409, nid, len(s), off) for (nid, _), s, off in zip(names, strings, offsets)
    ) + b"".join(strings)
    # One contour, four on-curve points clockwise from the bottom left; coordinates as 16-bit deltas.
    box = struct.pack(">5hHH4B4h4h", 1, 0, desc, adv, asc, 3, 0, 1, 1, 1, 1,
                      0, 0, adv, 0, desc, asc - desc, 0, desc - asc)
    tables = {
        b"OS/2": struct.pack(">HhHHHhhhhhhhhhhh10s4I4sHHHhhhHHIIhhHHH", 4, adv, 400, 5, 0, *[0] * 8, 50, 250, 0,
                             bytes(10), 0, 0, 0, 0, b"PPLN", 0x40, 0x20, 0xFFFF, asc, desc, 0, asc, -desc, 1, 0,
                             500, 700, 0, 32, 1),
        b"cmap": struct.pack(">HHHHI7H5H", 0, 1, 3, 1, 12, 4, 24, 0, 2, 2, 0, 0, 0xFFFF, 0, 0xFFFF, 1, 0),
        b"glyf": box,
        b"head": struct.pack(">IIIIHHqqhhhhHHhhh", 0x10000, 0x10000, 0, 0x5F0F3CF5, 0x000B, em, 0, 0,
                             0, desc, adv, asc, 0, 8, 2, 0, 0),
        b"hhea": struct.pack(">IhhhHhhhhhhhhhhhH", 0x10000, asc, desc, 0, adv, 0, 0, adv, 1, *[0] * 7, 2),
        b"hmtx": struct.pack(">HhHh", adv, 0, adv, 0),
        b"loca": struct.pack(">HHH", 0, 0, len(box) // 2),
        b"maxp": struct.pack(">IHHHHHHHHHHHHHH", 0x10000, 2, 4, 1, 0, 0, 1, *[0] * 8),
        b"name": name,
        b"post": struct.pack(">IihhIIIII", 0x30000, 0, -100, 50, 0, 0, 0, 0, 0),
    }
    return _sfnt(tables)


def _sfnt(tables: dict[bytes, bytes]) -> bytes:
    """The font file of ``tables`` (tags in sorted order), with its checksums."""
    count = len(tables)
    shift = count.bit_length() - 1
    header = struct.pack(">IHHHH", 0x10000, count, 16 << shift, shift, count * 16 - (16 << shift))
    records, body, head_at = b"", b"", 0
    start = 12 + 16 * count
    for tag, data in tables.items():
        if tag == b"head":
            head_at = start + len(body)
        records += struct.pack(">4sIII", tag, _checksum(data), start + len(body), len(data))
        body += data + bytes(-len(data) % 4)
    font = bytearray(header + records + body)
    struct.pack_into(">I", font, head_at + 8, (0xB1B0AFBA - _checksum(bytes(font))) & 0xFFFFFFFF)
    return bytes(font)


def _checksum(data: bytes) -> int:
    data += bytes(-len(data) % 4)
    return sum(int(word) for word in struct.unpack(f">{len(data) // 4}I", data)) & 0xFFFFFFFF
