"""The searchable PDF of a document: its page images with an invisible text layer, from its page results.

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

The text layer and its font are drawn by ``paperlane.formats.pdf_text``. The same pages and original always give
the same bytes. A failed page keeps its place (its image when the original has one) with a small red line
``paperlane: page N failed: reason`` in its top left corner (visible ink, and text a search finds); a page
without a final result is marked ``page N has no result (queued)``. Every call into pdfium holds
``paperlane.pdfium.LOCK`` (pdfium is not thread-safe).
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
import struct
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PIL import Image, ImageSequence

from paperlane import filetypes
from paperlane.errors import PaperlaneError
from paperlane.formats.content import Content
from paperlane.formats.registry import Format
from paperlane.formats.pdf_text import Affine, Font, Layer, draw_layer
from paperlane.pdfium import LOCK
from paperlane.schemas import PageResult, Point

log = logging.getLogger(__name__)

_STAGE = "store"
_ASSUMED_DPI = 300.0  # an image that states no resolution, and a blank page's pixels
_A4 = (595.0, 842.0)  # points: the blank page of a result that has no size
_MAX_SIDE_PT = 14400.0  # the largest page side PDF readers accept (200 inches)


def searchable_pdf(pages: Sequence[PageResult], *, original: bytes | None, ext: str,
                   max_pixels: int = 150_000_000) -> bytes:
    """The searchable PDF (see the module docstring): a page for each result, in page order (a PDF
    original's pages that have no result stay as they are).

    ``original`` is the document's original file (None: unavailable), ``ext`` its extension; an
    image frame of more than ``max_pixels`` is not decoded (its page is blank). An unreadable
    original gives blank pages, not an error. Raises PaperlaneError when pdfium cannot build or
    save the PDF.
    """
    ordered = sorted(pages, key=lambda p: p.page)
    pdf = _base_document(original, ext, max_pixels=max_pixels)
    try:
        return _with_layers(pdf, ordered)
    except pdfium.PdfiumError as exc:
        raise PaperlaneError(f"cannot write the searchable PDF ({exc})", stage=_STAGE) from exc
    finally:
        pdf.close()


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


def _image_matrix(orientation: int, width: float, height: float) -> Affine:
    """Image space (the unit square, stored row 0 at the top) -> the upright image filling the page."""
    turn = _UPRIGHT.get(orientation, _UPRIGHT[1])

    def to_page(s: float, t: float) -> Point:
        x, y = turn(s, 1 - t)
        return x * width, (1 - y) * height

    return Affine.through(to_page(0, 0), to_page(1, 0), to_page(0, 1))


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



def _with_layers(pdf: pdfium.PdfDocument, ordered: list[PageResult]) -> bytes:
    layers = [Layer.of(result) for result in ordered]
    font = Font.load(pdf, set().union(*(layer.chars() for layer in layers)))
    used: set[int] = set()  # original pages already given to a result
    base_pages = len(pdf)
    try:
        for result, layer in zip(ordered, layers):
            page = _page_for(pdf, result, base_pages=base_pages, used=used)
            try:
                draw_layer(pdf, page, layer, result, font)
                page.gen_content()
            finally:
                page.close()
    finally:
        if font is not None:
            pdfium_c.FPDFFont_Close(font.handle)
    out = io.BytesIO()
    pdf.save(out)
    return _stable(out.getvalue())


_FILE_ID = re.compile(rb"/ID\s*\[\s*<([0-9A-Fa-f]*)>\s*<([0-9A-Fa-f]{32})>\s*\]")
# The creation time PDFium writes into a document it makes (an image original's): as long as what replaces it.
_PDFIUM_DATE = re.compile(rb"/CreationDate\(D:\d{14}([+-]\d\d'\d\d'|Z)?\)(/Creator\(PDFium\))")


def _stable(data: bytes) -> bytes:
    """The PDF made reproducible: the same inputs give the same bytes at any time. The creation time PDFium gave a
    document it made is set to the epoch, and the file identifiers it drew at random (the second one always, the
    first when the original had none) are replaced by a hash of the content (that hash taken with them zeroed). Each
    replacement is as long as what it replaces, so the cross-reference offsets stay right.

    The file is hashed piece by piece and copied once (a searchable PDF carries its page images: a megabyte or more
    a page, where every copy costs page faults as well as the copying)."""
    edits: list[tuple[int, int, bytes | None]] = []  # (start, end, replacement; None: the hash)
    if (date := _PDFIUM_DATE.search(data)) is not None:
        edits.append((date.start(), date.end(),
                      b"/CreationDate(D:19700101000000" + (date.group(1) or b"") + b")" + date.group(2)))
    found = list(_FILE_ID.finditer(data, max(0, len(data) - 4096)))  # the trailer is at the end
    if len(found) == 1:
        match = found[0]
        drawn = [2] if match.group(1) != match.group(2) else [1, 2]
        edits += [(match.start(group), match.end(group), None) for group in drawn]
    if not edits:
        return data
    view, pieces, at = memoryview(data), [], 0
    for start, end, replacement in sorted(edits):
        pieces += [view[at:start], replacement]
        at = end
    pieces.append(view[at:])
    if any(piece is None for piece in pieces):
        # The identifier is 16 bytes of any hash (the PDF standard suggests MD5): SHA-256's, which the CPU's SHA
        # instructions take at 0.6 ms a megabyte where MD5 takes 1.5.
        sha = hashlib.sha256()
        for piece in pieces:
            sha.update(b"0" * 32 if piece is None else piece)
        digest = sha.hexdigest()[:32].upper().encode()
        pieces = [digest if piece is None else piece for piece in pieces]
    return b"".join(pieces)  # type: ignore[arg-type]


def build_page(content: Content, number: int, _spec: Format) -> bytes:
    with LOCK:
        return searchable_pdf([content.result(number)], original=content.original(), ext=content.ext,
                              max_pixels=content.max_pixels)


def build_document(content: Content, _spec: Format) -> bytes:
    with LOCK:
        return searchable_pdf(content.results, original=content.original(), ext=content.ext,
                              max_pixels=content.max_pixels)
