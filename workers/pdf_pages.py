"""PDF pages at the engine's size: opened once (``open_pdf``), each page rendered or, when it is a scan, its
image placed; every page and image checked against the limits before PDFium draws it.

A PDF page is rendered once, straight at the engine's size and never at a fixed resolution first:
its scale comes from its size in points, so a 200 x 200 inch page costs what an A4 one does. It is
treated as a ``PDF_DPI`` (300 dpi) scan of itself: its size in original pixels (``PreparedPage.width``
and ``height``, the pixels result quads are in) is its size in points x 300 / 72, rounded; it is
rendered like such a scan is resized for the engine (never above 300 dpi unless the engine's
``min_pixels`` asks for more). "Its size in points" is the page as a viewer shows it, crop box and
``/Rotate`` applied (``pypdfium2.PdfPage.get_size()``), so a quad point (x, y) in original pixels is
(x * width_pt / width, y * height_pt / height) points from the page's top-left corner.

A scanned page (what it shows is one image, ``workers.pdfscan``) is not rendered: its image is
taken from its own bytes (a grey or RGB JPEG decoded here at reduced scale as a JPEG file is, any
other by PDFium at its own size) and placed as the render would place it, at the same size, so the
engine sees the same picture for a third of the CPU. A worker keeps its PDFs open between pages
(``open_pdf``, ``preprocess.prepare_pdf_page``, ``workers.doccache``).
"""

from __future__ import annotations

import ctypes
import math
import mmap
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np

from paperlane import pdfium as our_pdfium  # pypdfium2 is imported as pdfium where it is called
from paperlane.errors import InputError
from paperlane.models.engine import InputSpec
from paperlane.schemas import Stage
from paperlane.storage.reader import ObjectReader
from paperlane.workers import pdfscan
from paperlane.workers.fit import reduction_for_scale, resized, target_size
from paperlane.workers.input_limits import Limits
from paperlane.workers.raster import decode, read_header

if TYPE_CHECKING:
    import pypdfium2

_STAGE = Stage.PREPROCESS.value


PDF_DPI = 300  # a PDF page's original pixels: its size in points x PDF_DPI / 72 (see the module docstring)
# PDFium is not thread-safe, and a worker prepares urgent pages on two threads.
PDFIUM_LOCK = our_pdfium.LOCK


@dataclass
class PdfFile:
    """A PDF opened by PDFium, and the index of its image dictionaries (``workers.pdfscan.ImageDicts``);
    ``reader``: the file object it is read through when it is read by range from the store.

    Use it holding ``PDFIUM_LOCK``; ``close`` it when done.
    """

    pdf: pypdfium2.PdfDocument
    image_dicts: pdfscan.ImageDicts
    reader: ObjectReader | None = None

    def close(self) -> None:
        with PDFIUM_LOCK:
            self.pdf.close()
        if self.reader is not None:
            self.reader.close()


def open_pdf(source: bytes | str | ObjectReader, *,
             contents: Callable[[], bytes | mmap.mmap | list[bytes | mmap.mmap]] | None = None) -> PdfFile:
    """Open a PDF from its bytes, a file path or an ``ObjectReader`` (PDFium then reads what each page
    needs, when it needs it).

    ``contents``: the file's bytes for the image dictionary index, read when it is first needed
    (default: ``source`` itself when it is bytes); a list of pieces of it (what a reader has read so
    far) is looked at anew for each page. Raises InputError for an unreadable or encrypted PDF.
    """
    with PDFIUM_LOCK:
        pdf = our_pdfium.open_document(source, stage=_STAGE)
    if contents is None:
        if not isinstance(source, bytes):
            raise TypeError("open_pdf: a path or a reader needs its contents")
        data = source
        contents = lambda: data  # noqa: E731
    return PdfFile(pdf=pdf, image_dicts=pdfscan.ImageDicts(contents),
                   reader=source if isinstance(source, ObjectReader) else None)


def render_pdf_page(data: bytes, page: int, spec: InputSpec, limits: Limits) -> tuple[np.ndarray, int, int]:
    """Page ``page`` (from 1) of a PDF at the engine's size (grey when ``spec.grayscale`` or when it is one
    grey image, else BGR), and the page's size in original pixels (at ``PDF_DPI``, see the module docstring).

    A scanned page (one image, see ``workers.pdfscan``) is its image decoded and placed as a render
    would show it; any other page is rendered by PDFium. Raises InputError for an unreadable or
    encrypted PDF, a page it does not have, and, before decoding or rendering, a page whose
    engine-sized render or one of whose images would exceed ``limits.max_pixels``.
    """
    pdf = open_pdf(data)
    try:
        return pdf_page_pixels(pdf, page, spec, limits)
    finally:
        pdf.close()


def pdf_page_pixels(pdf: PdfFile, page: int, spec: InputSpec, limits: Limits) -> tuple[np.ndarray, int, int]:
    """``render_pdf_page`` for a PDF already open."""
    import pypdfium2 as pdfium

    with PDFIUM_LOCK:
        try:
            count = len(pdf.pdf)
            if not 1 <= page <= count:
                raise InputError(f"no page {page} in this PDF ({count} page{'s' * (count != 1)})", stage=_STAGE)
            pdf_page = pdf.pdf[page - 1]
            try:
                return _render(pdf_page, page, spec, limits, pdf.image_dicts)
            finally:
                pdf_page.close()
        except pdfium.PdfiumError as exc:
            raise InputError(f"unreadable PDF page {page} ({our_pdfium.reason(exc)})", stage=_STAGE) from None


def _render(pdf_page: pypdfium2.PdfPage, page: int, spec: InputSpec, limits: Limits,
            image_dicts: pdfscan.ImageDicts) -> tuple[np.ndarray, int, int]:
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    w_pt, h_pt = pdf_page.get_size()
    if not (0 < w_pt < math.inf and 0 < h_pt < math.inf):
        raise InputError(f"PDF page {page} has no area ({w_pt:g} x {h_pt:g} pt)", stage=_STAGE)
    width, height = max(1, round(w_pt * PDF_DPI / 72)), max(1, round(h_pt * PDF_DPI / 72))
    tw, th = target_size(width, height, spec)
    if tw * th > limits.max_pixels:
        raise InputError(f"PDF page {page} too large to render ({tw}x{th} = {tw * th / 1e6:.0f} MP at the engine's "
                         f"size, limit {limits.max_pixels / 1e6:.0f} MP)", stage=_STAGE)
    _check_page_images(pdf_page, page, limits, image_dicts)
    scanned = scanned_pixels(pdf_page, (tw, th), spec, limits, image_dicts)
    if scanned is not None:
        return scanned, width, height
    grey = spec.grayscale
    bitmap = pdfium.PdfBitmap.new_native(tw, th, format=pdfium_c.FPDFBitmap_Gray if grey else pdfium_c.FPDFBitmap_BGR)
    try:
        bitmap.fill_rect((255, 255, 255, 255), 0, 0, tw, th)
        # Drawn into exactly tw x th: rounding the sides to multiple_of stretches the drawing by a few
        # pixels at most, as the resize of a scan does, and the page needs no resize or padding after.
        flags = pdfium_c.FPDF_ANNOT | (pdfium_c.FPDF_GRAYSCALE if grey else 0)
        pdfium_c.FPDF_RenderPageBitmap(bitmap, pdf_page, 0, 0, tw, th, 0, flags)
        img: np.ndarray = bitmap.to_numpy()  # a view of the buffer Python allocated: it outlives the bitmap
    finally:
        bitmap.close()
    return img, width, height


def scanned_pixels(pdf_page: pypdfium2.PdfPage, size: tuple[int, int], spec: InputSpec, limits: Limits,
                   image_dicts: pdfscan.ImageDicts) -> np.ndarray | None:
    """The page's one image placed as a render of ``size`` shows it (see ``workers.pdfscan``): a JPEG
    decoded here at reduced scale, any other image by PDFium at its own size. None: render the page."""
    image = pdfscan.lone_image(pdf_page, size)
    if image is None or image_dicts.hidden(image):
        return None
    # A grey or RGB JPEG that is the picture as it is (its colour transform left to the JPEG, for colour):
    # decoded here, reduced; any other image (CMYK, a palette, CCITT, JBIG2, JPEG 2000, Flate) by PDFium.
    ours = image.filters == ("DCTDecode",) and (image.components == 1 or image.components == 3
                                                and not image_dicts.colour_transform(image))
    img = _stored_jpeg(image, spec, limits) if ours else pdfscan.image_bitmap(image)
    if img is None:
        return None
    if spec.grayscale and img.ndim == 3:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
    return _placed(img, image.placement, size)


def _stored_jpeg(image: pdfscan.LoneImage, spec: InputSpec, limits: Limits) -> np.ndarray | None:
    """A PDF's JPEG image decoded as the JPEG path decodes a file (DCT reduction for its placed scale),
    EXIF orientation ignored as PDF readers do; None when it is not the plain grey or RGB JPEG its
    dictionary says, or OpenCV cannot decode it (PDFium may still draw what it can)."""
    try:
        header = read_header(image.raw, limits)
        if (header.format != "JPEG" or header.mode != ("L" if image.components == 1 else "RGB")
                or (header.width, header.height) != (image.width, image.height)):
            return None
        reduce = reduction_for_scale(image.placement.scale(image.width, image.height), spec)
        return decode(image.raw, header, grayscale=spec.grayscale or header.grey, reduce=reduce, exif=False)
    except InputError:
        return None


def _placed(img: np.ndarray, placement: pdfscan.Placement, size: tuple[int, int]) -> np.ndarray | None:
    """``img`` turned and scaled into ``placement.rect`` of a white page of ``size``, as PDFium draws it;
    None when it is four times the page or more (a crop box on a detail: rendering costs less)."""
    if placement.transpose:
        img = cv2.transpose(img)
    if placement.flip_x or placement.flip_y:
        img = cv2.flip(img, -1 if placement.flip_x and placement.flip_y else 1 if placement.flip_x else 0)
    tw, th = size
    x0, y0, x1, y1 = (round(v) for v in placement.rect)
    if (x0, y0, x1, y1) == (0, 0, tw, th):  # the usual scan: the image is the page
        return resized(img, tw, th)
    if (x1 - x0) * (y1 - y0) > 4 * tw * th:
        return None
    page = np.full((th, tw, *img.shape[2:]), 255, np.uint8)
    left, top, right, bottom = max(0, x0), max(0, y0), min(tw, x1), min(th, y1)
    if right > left and bottom > top:
        scaled = resized(img, x1 - x0, y1 - y0)
        page[top:bottom, left:right] = scaled[top - y0:bottom - y0, left - x0:right - x0]
    return page


def _check_page_images(pdf_page: pypdfium2.PdfPage, page: int, limits: Limits,
                       image_dicts: pdfscan.ImageDicts) -> None:
    """Refuse a page holding an image that declares more than ``limits.max_pixels``: PDFium decodes an
    image whole however small the render (400 MP in a 390 kB PDF took 420 MB to render at 1/8).

    The page's objects and its annotations' appearances count, with the images inside their form
    XObjects to the depth pypdfium2 goes (15); then every image dictionary of the file, which is
    where images drawn by patterns, Type 3 glyphs and soft masks are declared (PDFium's API does not
    reach them; ``pdfscan.ImageDicts.largest``). What no declared size shows (sizes given indirectly,
    inline images in compressed streams, a page that draws for minutes) is bounded by the process the
    page is prepared in (``paperlane.bounded``). PDFium's raw calls, not pypdfium2's object wrappers: a
    dense text page has thousands of objects (3,000 took 11 ms, now 3).
    """
    import pypdfium2.raw as pdfium_c

    _check_objects(pdfium_c.FPDFPage_CountObjects(pdf_page), pdfium_c.FPDFPage_GetObject, pdf_page.raw,
                   page, limits)
    for i in range(pdfium_c.FPDFPage_GetAnnotCount(pdf_page)):
        annot = pdfium_c.FPDFPage_GetAnnot(pdf_page, i)
        if not annot:
            continue
        try:
            _check_objects(pdfium_c.FPDFAnnot_GetObjectCount(annot), pdfium_c.FPDFAnnot_GetObject, annot, page, limits,
                           where=" in an annotation")
        finally:
            pdfium_c.FPDFPage_CloseAnnot(annot)
    w, h = image_dicts.largest()
    if w * h > limits.max_pixels:
        raise InputError(f"PDF page {page}: the file holds an image too large to draw ({w}x{h} = {w * h / 1e6:.0f} MP, "
                         f"limit {limits.max_pixels / 1e6:.0f} MP)", stage=_STAGE)


def _check_objects(count: int, get: Callable[[Any, int], Any], holder: Any, page: int, limits: Limits, *,
                   where: str = "") -> None:
    """Refuse ``holder``'s objects (``count`` of them, ``get(holder, i)``) if an image among them, or in their
    forms, declares more than ``limits.max_pixels``."""
    import pypdfium2.raw as pdfium_c

    get_type, image, form = pdfium_c.FPDFPageObj_GetType, pdfium_c.FPDF_PAGEOBJ_IMAGE, pdfium_c.FPDF_PAGEOBJ_FORM
    w, h = ctypes.c_uint(), ctypes.c_uint()
    pending = [(count, get, holder, 0)]
    while pending:
        count, get, holder, depth = pending.pop()
        for i in range(count):
            obj = get(holder, i)
            kind = get_type(obj)
            if kind == image and pdfium_c.FPDFImageObj_GetImagePixelSize(obj, w, h):
                if w.value * h.value > limits.max_pixels:
                    raise InputError(f"PDF page {page} holds an image too large{where} ({w.value}x{h.value} = "
                                     f"{w.value * h.value / 1e6:.0f} MP, limit {limits.max_pixels / 1e6:.0f} MP)",
                                     stage=_STAGE)
            elif kind == form and depth < 15:
                pending.append((pdfium_c.FPDFFormObj_CountObjects(obj), pdfium_c.FPDFFormObj_GetObject, obj,
                                depth + 1))
