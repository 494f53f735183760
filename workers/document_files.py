"""A finished document's outputs: its JSON, its markdown and a searchable PDF, from its page results.

Pure functions (no database, no storage; the caller reads the results and the original and writes
what comes back)::

    document_json(*, document_id, source, name, pages) -> bytes      # UTF-8 JSON
    document_markdown(pages) -> str                                  # the text in reading order
    searchable_pdf(pages, *, original, ext, max_pixels=...) -> bytes   # page images + invisible text

``pages`` are the document's ``PageResult``s, any order (they are put in page order). The same
pages and original always give the same bytes. A page that failed is never dropped: the JSON keeps
its result (``status``, ``error``) and lists it in ``failed_pages``; the markdown has the quoted line
``> page N failed: reason`` where its text would be; the PDF keeps the page (its image when the
original has one) and prints a small red line ``paperlane: page N failed: reason`` in its top left
corner as a viewer shows it (visible ink, and text a search finds). A page without a final result
(queued, running) is marked the same way, as ``page N has no result (queued)``.

The searchable PDF is what OCRmyPDF makes: the page images, and over each recognised line its text
in render mode 3 (invisible), word by word: each word sized to its line's height and horizontally
scaled to span the word's quad (the engine's word box, else one laid out along the line by character
widths), along the quad's top edge (a slanted line gets a rotated text matrix), followed by a space
so that text extraction keeps the words apart; selecting a word in a viewer selects that word.

- Pages: a PDF original keeps its pages and all else in it, and gets the text added. An image
  original gives one page per image (a TIFF: page N is frame N), sized by the image's dpi (300 when
  it gives none), JPEG bytes embedded as they are and other images decoded and stored losslessly
  (Flate); EXIF orientation is applied by the image's matrix, as the worker applied it to the pixels.
  With no original, or one that cannot be read, a page is blank, of the result's size at 300 dpi
  (A4 when the result has none). A result whose page the original lacks gets such a page at the end.
- Placement: a quad is in pixels of the page image the worker saw (``result.width`` x ``height``:
  the image upright; a PDF page as pdfium renders it, crop box and ``/Rotate`` applied), and goes to
  the page through pdfium's own device-to-page transform, so rotated and cropped pages get their
  text where the ink is. Lines without a usable quad (VLM tasks give none) are, when the page has
  no quad at all, laid out invisibly from the top of the page, one band a line: search finds the
  page, highlights do not match the ink. The ``fields`` and ``translate`` tasks give no text layer
  (their text is not what the page says).
- Font: a GlyphLessFont like Tesseract's and OCRmyPDF's, built here (one empty-advance glyph, a box
  from descent to ascent), embedded as a CIDFontType2 whose CIDs number the document's
  distinct characters and whose ToUnicode map gives them back. It carries any Unicode text (CJK,
  accents, astral characters) with no font file on the machine and nothing downloaded; copy and
  search go through ToUnicode, which every current reader uses. Its limits: every character is as
  wide as every other, so inside a word the characters are spread evenly rather than over their own
  glyphs (a word's highlight may sit a little off); right-to-left lines are written in logical
  order, as the text is; vertical CJK lines are laid out horizontally along their quad.
- The failure mark uses the standard Helvetica: characters outside Windows-1252 become "?".

pdfium is not thread-safe: a caller that uses it on several threads must serialise the calls.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import json
import logging
import math
import re
import struct
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache

import numpy as np
import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PIL import Image, ImageSequence

from paperlane import filetypes
from paperlane.errors import PaperlaneError
from paperlane.formats import document_bytes, page_bytes
from paperlane.formats.view import clean_text, page_problem
from paperlane.layout import estimate_words, is_rtl
from paperlane.schemas import JobStatus, OutputFormat, PageResult, Point, Task

log = logging.getLogger(__name__)

_STAGE = "store"
_ASSUMED_DPI = 300.0  # an image that states no resolution, and a blank page's pixels
_A4 = (595.0, 842.0)  # points: the blank page of a result that has no size
_MAX_SIDE_PT = 14400.0  # the largest page side PDF readers accept (200 inches)
_DESCENT, _ASCENT = 0.2, 0.8  # the glyph box spans 1 em: font size = line height
_ADVANCE = 0.5  # every glyph is half an em wide before the horizontal scaling
_UNLAYERED_TASKS = (Task.FIELDS, Task.TRANSLATE)
_MARK_RGB = (200, 0, 0)


def page_json(result: PageResult) -> bytes:
    """A page's result JSON, compact UTF-8: what is stored for it, and its ``?format=json``."""
    return result.model_dump_json().encode()


def document_json(*, document_id: str, source: str, name: str, pages: Sequence[PageResult]) -> bytes:
    """The document JSON, UTF-8: its ids, ``page_count``, ``counts`` by status (every status a key),
    ``failed_pages`` (page numbers) and ``pages``: every page's full result in page order.

    Indented two spaces; the pages are serialised by pydantic (json's indenting encoder is pure Python, and
    took 8 ms for one page of 45 kB) and spliced in at their depth."""
    ordered = _in_order(pages)
    counts = Counter(p.status for p in ordered)
    doc = {
        "document_id": document_id, "source": source, "name": name, "page_count": len(ordered),
        "counts": {status.value: counts[status] for status in JobStatus},
        "failed_pages": [p.page for p in ordered if p.status is JobStatus.FAILED],
    }
    head = json.dumps(doc, ensure_ascii=False, indent=2)[:-2]  # without its closing "\n}"
    if not ordered:
        return (head + ',\n  "pages": []\n}\n').encode()
    body = ",\n    ".join(p.model_dump_json(indent=2).replace("\n", "\n    ") for p in ordered)
    return (head + ',\n  "pages": [\n    ' + body + "\n  ]\n}\n").encode()


def document_markdown(pages: Sequence[PageResult]) -> str:
    """The document's text in reading order, page after page, pages apart by a rule (``---``).

    Each page opens with ``<!-- page N -->``, then its markdown (``parse``), its text (the other
    tasks) or its fields as a fenced JSON block (``fields``). A failed page has the quoted line
    ``> page N failed: reason`` instead (one not final, ``> page N has no result (queued)``); missing
    fields and a truncated answer get a quoted note.
    """
    return "\n\n---\n\n".join(_page_markdown(p) for p in _in_order(pages)) + "\n"


def searchable_pdf(pages: Sequence[PageResult], *, original: bytes | None, ext: str,
                   max_pixels: int = 150_000_000) -> bytes:
    """The searchable PDF (see the module docstring): a page for each result, in page order (a PDF
    original's pages that have no result stay as they are).

    ``original`` is the document's original file (None: unavailable), ``ext`` its extension; an
    image frame of more than ``max_pixels`` is not decoded (its page is blank). An unreadable
    original gives blank pages, not an error. Raises PaperlaneError when pdfium cannot build or
    save the PDF.
    """
    ordered = _in_order(pages)
    pdf = _base_document(original, ext, max_pixels=max_pixels)
    try:
        return _with_layers(pdf, ordered)
    except pdfium.PdfiumError as exc:
        raise PaperlaneError(f"cannot write the searchable PDF ({exc})", stage=_STAGE) from exc
    finally:
        pdf.close()


def _in_order(pages: Sequence[PageResult]) -> list[PageResult]:
    return sorted(pages, key=lambda p: p.page)


# -- markdown ------------------------------------------------------------------------------------------

def _page_markdown(result: PageResult) -> str:
    parts = [f"<!-- page {result.page} -->"]
    if result.status is not JobStatus.SUCCEEDED:
        return "\n\n".join([*parts, f"> {page_problem(result)}"])
    if result.task is Task.FIELDS:
        parts.append(_fenced(json.dumps(result.fields or {}, ensure_ascii=False, indent=2), "json"))
    else:
        parts.append((result.markdown if result.markdown is not None else result.text).strip())
    if result.missing_fields:
        parts.append(f"> page {result.page}: not found on the page: {', '.join(result.missing_fields)}")
    if result.truncated:
        parts.append(f"> page {result.page}: the engine stopped at its token limit; this page is incomplete")
    return "\n\n".join(part for part in parts if part)


def _fenced(body: str, lang: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)  # a fence the body cannot close
    return f"{fence}{lang}\n{body}\n{fence}"


# -- the searchable PDF: pages -------------------------------------------------------------------------

def _base_document(original: bytes | None, ext: str, *, max_pixels: int) -> pdfium.PdfDocument:
    """The original's pages as a PDF: the PDF itself, a page per image frame, or no pages."""
    if original is None:
        return pdfium.PdfDocument.new()
    if ext.lower() == ".pdf" or filetypes.is_pdf(original):
        try:
            return pdfium.PdfDocument(original)
        except pdfium.PdfiumError as exc:
            log.warning("original PDF unreadable (%s): blank pages in the searchable PDF", exc)
            return pdfium.PdfDocument.new()
    pdf = pdfium.PdfDocument.new()
    try:
        with Image.open(io.BytesIO(original)) as im:
            jpeg = original if im.format in ("JPEG", "MPO") else None
            frames: Iterable[Image.Image] = ImageSequence.Iterator(im) if im.format == "TIFF" else [im]
            for frame in frames:  # the worker's pages: a TIFF's frames, another image's first
                _add_image_page(pdf, frame, jpeg, max_pixels=max_pixels)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        log.warning("original image unreadable after %d pages (%s): blank pages for the rest", len(pdf), exc)
    return pdf


def _add_image_page(pdf: pdfium.PdfDocument, frame: Image.Image, jpeg: bytes | None, *, max_pixels: int) -> None:
    orientation = filetypes.exif_orientation(frame)
    (w, h), (dpi_x, dpi_y) = frame.size, _dpi(frame)
    if orientation >= 5:  # stored on its side: upright, its width is the stored height
        w, h, dpi_x, dpi_y = h, w, dpi_y, dpi_x
    width, height = _page_size(w * 72 / dpi_x, h * 72 / dpi_y)
    page = pdf.new_page(width, height)
    try:
        image = _image_object(pdf, frame, jpeg, max_pixels=max_pixels)
        if image is not None:
            image.set_matrix(pdfium.PdfMatrix(*_image_matrix(orientation, width, height).coefficients))
            page.insert_obj(image)
            page.gen_content()
    finally:
        page.close()


def _image_object(pdf: pdfium.PdfDocument, frame: Image.Image, jpeg: bytes | None, *,
                  max_pixels: int) -> pdfium.PdfImage | None:
    """The frame as an image object: the JPEG's own bytes when it is one, else its decoded pixels."""
    image = pdfium.PdfImage.new(pdf)
    if jpeg is not None:
        try:
            image.load_jpeg(io.BytesIO(jpeg), inline=True)
            return image
        except pdfium.PdfiumError as exc:  # a JPEG pdfium cannot embed as it is: decode it instead
            log.debug("JPEG not embeddable as it is (%s): decoded", exc)
    if frame.width * frame.height > max_pixels:
        log.warning("image %dx%d over %d pixels: its page is blank in the searchable PDF",
                    frame.width, frame.height, max_pixels)
        image.close()
        return None
    image.set_bitmap(pdfium.PdfBitmap.from_pil(_pixels(frame)))
    return image


def _pixels(frame: Image.Image) -> Image.Image:
    """The frame as 8-bit grey or RGB, transparency flattened on white (as the worker sees it)."""
    mode = frame.mode
    if mode in ("L", "RGB"):
        return frame
    if mode.startswith("I") or mode == "F":  # 16-bit and integer scans
        values = np.asarray(frame, dtype=np.float32)
        top = 65535.0 if values.size and values.max() > 255 else 255.0
        return Image.fromarray(np.clip(values * (255.0 / top), 0, 255).astype(np.uint8))
    if mode == "1":
        return frame.convert("L")
    if mode in ("LA", "La", "PA", "RGBA", "RGBa") or "transparency" in frame.info:
        rgba = frame.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba).convert("RGB")
    return frame.convert("RGB")


def _dpi(frame: Image.Image) -> tuple[float, float]:
    """The resolution the image states, or _ASSUMED_DPI."""
    try:
        x, y = _jpeg_dpi(frame) if frame.format in ("JPEG", "MPO") else frame.info["dpi"]
        x, y = float(x), float(y)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, SyntaxError, OSError, struct.error):
        return _ASSUMED_DPI, _ASSUMED_DPI
    plausible = 10 <= x <= 10_000 and 10 <= y <= 10_000
    return (x, y) if plausible else (_ASSUMED_DPI, _ASSUMED_DPI)


def _jpeg_dpi(frame: Image.Image) -> tuple[float, float]:
    """A JPEG's JFIF density, else its EXIF resolution; raises KeyError when it states neither.
    (Pillow's ``info["dpi"]`` says 72 for a JPEG whose EXIF has no resolution.)"""
    per_cm = {1: 1.0, 2: 2.54}  # JFIF units: 0 is an aspect ratio only
    if (unit := frame.info.get("jfif_unit")) in per_cm:
        x, y = frame.info["jfif_density"]
        return x * per_cm[unit], y * per_cm[unit]
    exif = frame.getexif()
    factor = {2: 1.0, 3: 2.54}[exif.get(0x0128, 2)]  # EXIF ResolutionUnit: inch or cm
    return float(exif[0x011A]) * factor, float(exif[0x011B]) * factor


def _page_size(width: float, height: float) -> tuple[float, float]:
    shrink = min(1.0, _MAX_SIDE_PT / max(width, height))
    return max(3.0, width * shrink), max(3.0, height * shrink)


# EXIF orientation -> where a stored point (u, v) (0..1, v down) is on the upright image (0..1, y down),
# as Pillow's ImageOps.exif_transpose turns it.
_UPRIGHT: dict[int, Callable[[float, float], Point]] = {
    1: lambda u, v: (u, v), 2: lambda u, v: (1 - u, v), 3: lambda u, v: (1 - u, 1 - v),
    4: lambda u, v: (u, 1 - v), 5: lambda u, v: (v, u), 6: lambda u, v: (1 - v, u),
    7: lambda u, v: (1 - v, 1 - u), 8: lambda u, v: (v, 1 - u),
}


def _image_matrix(orientation: int, width: float, height: float) -> _Affine:
    """Image space (the unit square, stored row 0 at the top) -> the upright image filling the page."""
    turn = _UPRIGHT.get(orientation, _UPRIGHT[1])

    def to_page(s: float, t: float) -> Point:
        x, y = turn(s, 1 - t)
        return x * width, (1 - y) * height

    return _Affine.through(to_page(0, 0), to_page(1, 0), to_page(0, 1))


def _page_for(pdf: pdfium.PdfDocument, result: PageResult, *, base_pages: int, used: set[int]) -> pdfium.PdfPage:
    """The original's page of this result, or a blank page at the end when it has none (or gave it)."""
    index = result.page - 1
    if 0 <= index < base_pages and index not in used:
        used.add(index)
        return pdf[index]
    if result.width and result.height:
        width, height = _page_size(result.width * 72 / _ASSUMED_DPI, result.height * 72 / _ASSUMED_DPI)
    else:
        width, height = _A4
    return pdf.new_page(width, height)


# -- the searchable PDF: text --------------------------------------------------------------------------

@dataclass(frozen=True)
class _Affine:
    """x' = a x + c y + e, y' = b x + d y + f (PDF's matrix order)."""

    a: float
    b: float
    c: float
    d: float
    e: float
    f: float

    @classmethod
    def through(cls, origin: Point, x_end: Point, y_end: Point, *, sx: float = 1.0, sy: float = 1.0) -> _Affine:
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
class _Layer:
    """What goes on one page: lines at quads (result pixels), lines without, or a problem to mark."""

    placed: list[tuple[str, list[Point]]]  # a word and its quad; all but a line's last end in a space
    unplaced: list[str]
    problem: str | None = None

    @classmethod
    def of(cls, result: PageResult) -> _Layer:
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


def _with_layers(pdf: pdfium.PdfDocument, ordered: list[PageResult]) -> bytes:
    layers = [_Layer.of(result) for result in ordered]
    font = _Font.load(pdf, set().union(*(layer.chars() for layer in layers)))
    used: set[int] = set()  # original pages already given to a result
    base_pages = len(pdf)
    try:
        for result, layer in zip(ordered, layers):
            page = _page_for(pdf, result, base_pages=base_pages, used=used)
            try:
                _draw_layer(pdf, page, layer, result, font)
                page.gen_content()
            finally:
                page.close()
    finally:
        if font is not None:
            pdfium_c.FPDFFont_Close(font.handle)
    out = io.BytesIO()
    pdf.save(out)
    return _stable_id(_stable_date(out.getvalue()))


_FILE_ID = re.compile(rb"/ID\s*\[\s*<([0-9A-Fa-f]*)>\s*<([0-9A-Fa-f]{32})>\s*\]")
# The creation time PDFium writes into a document it makes (an image original's): as long as what replaces it.
_PDFIUM_DATE = re.compile(rb"/CreationDate\(D:\d{14}([+-]\d\d'\d\d'|Z)?\)(/Creator\(PDFium\))")


def _stable_date(data: bytes) -> bytes:
    """The PDF with the creation time PDFium gave a document it made set to the epoch (of the same length, so the
    cross-reference offsets stay right): the same inputs give the same bytes at any time."""
    def epoch(match: re.Match[bytes]) -> bytes:
        return b"/CreationDate(D:19700101000000" + (match.group(1) or b"") + b")" + match.group(2)
    return _PDFIUM_DATE.sub(epoch, data, count=1)


def _stable_id(data: bytes) -> bytes:
    """The PDF with the file identifiers pdfium drew at random (the second one always, the first when
    the original had none) replaced by a hash of its content, so the same inputs give the same bytes.
    The hash is as long as what it replaces: the cross-reference offsets stay right."""
    found = list(_FILE_ID.finditer(data, max(0, len(data) - 4096)))  # the trailer is at the end
    if len(found) != 1:
        return data
    match = found[0]
    drawn = [match.span(2)] if match.group(1) != match.group(2) else [match.span(1), match.span(2)]
    out = bytearray(data)
    for start, end in drawn:
        out[start:end] = b"0" * 32
    digest = hashlib.md5(out, usedforsecurity=False).hexdigest().upper().encode()
    for start, end in drawn:
        out[start:end] = digest
    return bytes(out)


def _draw_layer(pdf: pdfium.PdfDocument, page: pdfium.PdfPage, layer: _Layer, result: PageResult,
                font: _Font | None) -> None:
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


def _invisible_line(pdf: pdfium.PdfDocument, page: pdfium.PdfPage, font: _Font, text: str,
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


def _device_to_page(page: pdfium.PdfPage, width: int, height: int) -> _Affine:
    """Pixels of the page rendered at ``width`` x ``height`` as pdfium renders it -> page space."""

    def corner(x: int, y: int) -> Point:
        px, py = ctypes.c_double(), ctypes.c_double()
        if not pdfium_c.FPDF_DeviceToPage(page.raw, 0, 0, width, height, 0, x, y, px, py):
            raise pdfium.PdfiumError("cannot map device to page coordinates")
        return px.value, py.value

    return _Affine.through(corner(0, 0), corner(width, 0), corner(0, height), sx=width, sy=height)


def _display_to_page(page: pdfium.PdfPage) -> _Affine:
    """Points from the top left of the page as a viewer shows it -> page space."""
    width, height = page.get_size()
    w, h = max(1, round(width)), max(1, round(height))
    pixels = _device_to_page(page, w, h)
    return _Affine(pixels.a * w / width, pixels.b * w / width, pixels.c * h / height, pixels.d * h / height,
                   pixels.e, pixels.f)


# -- the searchable PDF: the font ----------------------------------------------------------------------

@dataclass(frozen=True)
class _Font:
    """The document's GlyphLessFont: CID n (from 1) is the n-th of its distinct characters."""

    handle: pdfium_c.FPDF_FONT
    cids: dict[str, int]

    @classmethod
    def load(cls, pdf: pdfium.PdfDocument, chars: set[str]) -> _Font | None:
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


# -- every output format, by name ------------------------------------------------------------------------------
# One page or a whole document in any of the seven formats. Both raise UsageError for a form a format lacks
# (``FORMATS[fmt].page`` / ``.document`` say which forms each has).

def page_output(fmt: OutputFormat, result: PageResult, *, name: str, page_count: int = 1,
                original: bytes | None = None, ext: str = "", created: datetime | None = None) -> bytes:
    """One page in ``fmt``; ``original`` (the document's file, for the PDF) and ``ext`` name its image."""
    if fmt is OutputFormat.JSON:
        return page_json(result)
    if fmt is OutputFormat.MD:
        return document_markdown([result]).encode()
    if fmt is OutputFormat.PDF:
        return searchable_pdf([result], original=original, ext=ext)
    return page_bytes(fmt, result, name=name, page_count=page_count, ext=ext, created=created)


def document_output(fmt: OutputFormat, pages: Sequence[PageResult], *, document_id: str, source: str, name: str,
                    original: bytes | None = None, ext: str = "") -> bytes:
    """A whole document in ``fmt`` (its pages in page order, failed ones marked)."""
    if fmt is OutputFormat.JSON:
        return document_json(document_id=document_id, source=source, name=name, pages=pages)
    if fmt is OutputFormat.MD:
        return document_markdown(pages).encode()
    if fmt is OutputFormat.PDF:
        return searchable_pdf(pages, original=original, ext=ext)
    return document_bytes(fmt, pages, document_id=document_id, name=name, ext=ext)
