"""CPU preprocessing: bytes of an original and a page number -> exactly what the engine's InputSpec asks for.

Runs in the worker's process pool (``workers.cpu_pool``), overlapped with inference. An original is
an image (page 1), a multi-page TIFF (page N is frame N) or a whole PDF (page N is rendered here).
Every way a page can be unreadable becomes an ``InputError`` with a one-line reason, decided from the
header BEFORE any pixel memory is allocated where possible (a 40000x40000 image declared in a 1 kB
file, or a TIFF frame or a PDF page image declaring as much, must not take 4.8 GB to refuse); what
OpenCV, Pillow or PDFium refuse anyway becomes one too, and running out of memory a retryable
error, so nothing unexpected leaves this module for a page's own sake.

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
(``open_pdf``, ``prepare_pdf_page``, ``workers.doccache``).

A page is decoded once: the engine's input and a small grey preview, on which the annotated image
is drawn after inference, both come from that one decode. For an A4 300 dpi JPEG, entropy decoding
is most of the cost and cannot be cut (DCT-domain reduction saves the rest of the decode); a grey
scan stays grey for every engine (colour would only triple the pixels to resize and encode), and
the sides are rounded to ``multiple_of`` by padding, not by a resize of the whole page.
"""

from __future__ import annotations

import ctypes
import io
import math
import mmap
import re
import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np
from PIL import Image, TiffImagePlugin, UnidentifiedImageError

from paperlane import filetypes
from paperlane import pdfium as pdfium_lock
from paperlane.errors import InputError, OutOfMemory
from paperlane.models.engine import InputSpec, PreparedImage
from paperlane.storage.reader import ObjectReader
from paperlane.workers import pdfscan

if TYPE_CHECKING:
    import pypdfium2

_STAGE = "preprocess"
_FORMATS = {"JPEG", "PNG", "TIFF", "BMP", "WEBP", "GIF", "JPEG2000", "PPM"}
_GREY_MODES = {"1", "L", "LA", "La", "I", "F"}  # and "I;16..." (Pillow's image modes without colour)
# OpenCV turns these upright by their EXIF orientation, except when it keeps their alpha channel.
_ORIENTED_UNLESS_ALPHA = {"PNG", "WEBP"}
PDF_DPI = 300  # a PDF page's original pixels: its size in points x PDF_DPI / 72 (see the module docstring)
# PDFium is not thread-safe, and a worker prepares urgent pages on two threads.
PDFIUM_LOCK = pdfium_lock.LOCK


@dataclass(frozen=True)
class Limits:
    max_pixels: int = 150_000_000
    max_bytes: int = 200 * 1024 * 1024


@dataclass(frozen=True)
class Header:
    format: str
    width: int
    height: int
    has_alpha: bool
    grey: bool = False  # no colour channels: decoding luminance only loses nothing
    orientation: int = 1  # EXIF orientation that ``decode`` applies itself (OpenCV applies the others)
    mode: str = ""  # Pillow's mode for it: "L", "RGB", "CMYK", ...


@dataclass
class PreparedPage:
    """What preprocessing hands the worker: the engine's input, and what the worker keeps for itself.

    ``image.original_width/height`` are the extent of the prepared image in original pixels, so that
    ``image.to_original`` maps exactly; when the sides were padded up to ``multiple_of``, that extent
    reaches past the page's right and bottom edges. ``width`` and ``height`` are the page's own size.
    """

    image: PreparedImage
    width: int
    height: int
    preview: np.ndarray | None = None  # grey, at most preview_side px: the annotated image is drawn on it


def _check_file_size(data: bytes, limits: Limits) -> None:
    """Refuse an empty file, or one larger than ``limits.max_bytes``."""
    if not data:
        raise InputError("empty file (0 bytes)", stage=_STAGE)
    if len(data) > limits.max_bytes:
        raise InputError(f"file too large ({len(data) / 2**20:.0f} MiB, limit {limits.max_bytes / 2**20:.0f} MiB)",
                         stage=_STAGE)


def read_header(data: bytes, limits: Limits) -> Header:
    """Identify the image and the size of its first frame from its header alone; refuse what cannot be a page."""
    _check_file_size(data, limits)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                fmt, (w, h), mode = im.format or "?", im.size, im.mode
                has_alpha = "A" in mode or mode == "P"
                orientation = filetypes.exif_orientation(im) if has_alpha and fmt in _ORIENTED_UNLESS_ALPHA else 1
    except Image.DecompressionBombError as exc:  # Pillow's own guard, far above ours: say how large
        found = re.search(r"\((\d+) pixels\)", str(exc))
        size = f" ({int(found.group(1)) / 1e6:.0f} MP" if found else " ("
        raise InputError(f"image too large{size}, limit {limits.max_pixels / 1e6:.0f} MP)", stage=_STAGE) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        raise InputError("not a readable image (unknown or corrupt format)", stage=_STAGE) from None
    if fmt not in _FORMATS:
        raise InputError(f"unsupported image format {fmt}", stage=_STAGE)
    _check_pixels(w, h, limits, what="image")
    if fmt == "JPEG" and not _jpeg_complete(data):
        raise InputError("truncated JPEG (the file ends before the image does)", stage=_STAGE)
    return Header(format=fmt, width=w, height=h, has_alpha=has_alpha,
                  grey=mode in _GREY_MODES or mode.startswith("I;16"), orientation=orientation, mode=mode)


def _check_pixels(w: int, h: int, limits: Limits, *, what: str) -> None:
    if w < 1 or h < 1:
        raise InputError(f"{what} has no pixels ({w}x{h})", stage=_STAGE)
    if w * h > limits.max_pixels:
        raise InputError(f"{what} too large ({w}x{h} = {w * h / 1e6:.0f} MP, limit {limits.max_pixels / 1e6:.0f} MP)",
                         stage=_STAGE)


# EXIF orientation -> what turns the stored pixels upright (as Pillow's ImageOps.exif_transpose does).
_UPRIGHT: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    2: lambda img: cv2.flip(img, 1),
    3: lambda img: cv2.rotate(img, cv2.ROTATE_180),
    4: lambda img: cv2.flip(img, 0),
    5: cv2.transpose,
    6: lambda img: cv2.rotate(img, cv2.ROTATE_90_CLOCKWISE),
    7: lambda img: cv2.flip(cv2.transpose(img), -1),
    8: lambda img: cv2.rotate(img, cv2.ROTATE_90_COUNTERCLOCKWISE),
}


def _jpeg_complete(data: bytes) -> bool:
    # FF D9 (end of image) cannot occur inside entropy-coded data (FF is stuffed as FF 00), so a
    # JPEG whose tail has no EOI was cut short. Some writers pad with zeros or add a few bytes; what
    # has more after its end (a motion photo's video) is told apart by walking its segments.
    tail = data[-4096:].rstrip(b"\x00\r\n ")
    return tail.endswith(b"\xff\xd9") or b"\xff\xd9" in tail[-64:] or _jpeg_end(data) is not None


# A marker in entropy-coded data: FF followed by neither 00 (a stuffed FF) nor D0-D7 (a restart marker).
_SCAN_END = re.compile(rb"\xff[^\x00\xd0-\xd7]")


def _jpeg_end(data: bytes) -> int | None:
    """Where the JPEG's own data ends (just past its EOI marker), or None when the file ends first.

    Walks the segments by their lengths, so an EOI inside one (an EXIF thumbnail's) does not count.
    """
    pos, size = 2, len(data)
    while pos + 2 <= size:
        if data[pos] != 0xFF:  # stray bytes between segments, which decoders skip too
            found = _SCAN_END.search(data, pos)
            if found is None:
                return None
            pos = found.start()
            continue
        marker = data[pos + 1]
        if marker == 0xD9:
            return pos + 2
        if marker == 0xFF or marker == 0x01 or 0xD0 <= marker <= 0xD7:  # fill byte; markers without a length
            pos += 1 if marker == 0xFF else 2
            continue
        if pos + 4 > size:
            return None
        pos += 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
        if marker == 0xDA:  # start of scan: entropy-coded data up to the next marker
            found = _SCAN_END.search(data, pos)
            if found is None:
                return None
            pos = found.start()
    return None


_REDUCED = {
    (False, 1): cv2.IMREAD_COLOR, (False, 2): cv2.IMREAD_REDUCED_COLOR_2,
    (False, 4): cv2.IMREAD_REDUCED_COLOR_4, (False, 8): cv2.IMREAD_REDUCED_COLOR_8,
    (True, 1): cv2.IMREAD_GRAYSCALE, (True, 2): cv2.IMREAD_REDUCED_GRAYSCALE_2,
    (True, 4): cv2.IMREAD_REDUCED_GRAYSCALE_4, (True, 8): cv2.IMREAD_REDUCED_GRAYSCALE_8,
}


def decode(data: bytes, header: Header, *, grayscale: bool = False, reduce: int = 1, exif: bool = True) -> np.ndarray:
    """Decode to uint8 pixels (BGR, or one channel when ``grayscale``), EXIF orientation applied unless
    not ``exif`` (a JPEG inside a PDF: PDF readers ignore it).

    ``reduce`` (1, 2, 4 or 8) decodes a JPEG at that fraction in the DCT domain. Alpha is
    composited on white.
    """
    buf = np.frombuffer(data, np.uint8)
    flags = cv2.IMREAD_UNCHANGED if header.has_alpha else _REDUCED[(grayscale, reduce)]
    if not exif and flags != cv2.IMREAD_UNCHANGED:
        flags |= cv2.IMREAD_IGNORE_ORIENTATION
    try:
        img = cv2.imdecode(buf, flags)
    except cv2.error as exc:  # OpenCV's own limits and assertions, beyond what the header showed us
        raise InputError(f"cannot decode this image (OpenCV: {opencv_reason(exc)})", stage=_STAGE) from exc
    if img is None:
        raise InputError(f"corrupt {header.format} image (cannot be decoded)", stage=_STAGE)
    if header.orientation in _UPRIGHT and flags == cv2.IMREAD_UNCHANGED:
        img = _UPRIGHT[header.orientation](img)
    if img.dtype != np.uint8:  # 16-bit scans
        img = cv2.convertScaleAbs(img, alpha=255.0 / np.iinfo(img.dtype.name).max)
    if img.ndim == 3 and img.shape[2] == 4:
        img = _on_white(img)
    if grayscale and img.ndim == 3:
        return cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
    if not grayscale and img.ndim == 2:
        return cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
    return img


def dct_reduction(header: Header, spec: InputSpec) -> int:
    """The largest JPEG decode reduction (1, 2, 4, 8) that still gives enough pixels for ``spec``."""
    if header.format != "JPEG" or header.has_alpha:
        return 1
    tw, _ = target_size(header.width, header.height, spec)
    return _reduction(tw / header.width, spec)


def _reduction(scale: float, spec: InputSpec) -> int:
    """The largest JPEG decode reduction that still gives ``spec.min_decode_ratio`` of a ``scale`` resize."""
    for k in (8, 4, 2):
        if 1 / k >= scale * spec.min_decode_ratio:
            return k
    return 1


def _scale(width: int, height: int, spec: InputSpec) -> float:
    """The factor that brings a width x height page to the engine's size, before rounding its sides."""
    scale = min(1.0, spec.max_side / max(width, height))
    if spec.max_pixels:
        scale = min(scale, math.sqrt(spec.max_pixels / (width * height)))
    if spec.min_pixels and width * height * scale * scale < spec.min_pixels:
        # Scaling up to min_pixels never takes the long side past max_side (a 70000x40 strip).
        scale = min(math.sqrt(spec.min_pixels / (width * height)), spec.max_side / max(width, height))
    return scale


def target_size(width: int, height: int, spec: InputSpec) -> tuple[int, int]:
    """The (width, height) the engine wants for a width x height page, aspect ratio kept."""
    scale = _scale(width, height, spec)
    m = max(1, spec.multiple_of)
    w = max(m, round(width * scale / m) * m)
    h = max(m, round(height * scale / m) * m)
    if spec.max_pixels and w * h > spec.max_pixels:  # rounding up may overshoot by one step
        w = max(m, math.floor(width * scale / m) * m)
        h = max(m, math.floor(height * scale / m) * m)
    return w, h


def prepare_page(data: bytes, spec: InputSpec, limits: Limits = Limits(), *, page: int = 1,
                 preview_side: int = 0) -> PreparedPage:
    """Page ``page`` of an original -> the engine's input and, when ``preview_side``, a grey preview.

    ``page`` counts from 1: a PDF's page, a TIFF's frame; any other image has page 1 only.
    Raises InputError for pages that cannot be read or prepared (a page the original does not have
    among them), and OutOfMemory (retryable) when memory runs out.
    """
    _check_file_size(data, limits)
    if filetypes.is_pdf(data):
        return _prepared(lambda: render_pdf_page(data, page, spec, limits), spec, page=page,
                         preview_side=preview_side, at_engine_size=True)
    return _prepared(lambda: _decoded(data, page, spec, limits), spec, page=page, preview_side=preview_side,
                     at_engine_size=False)


def prepare_pdf_page(pdf: PdfFile, spec: InputSpec, limits: Limits = Limits(), *, page: int = 1,
                     preview_side: int = 0) -> PreparedPage:
    """Page ``page`` of a PDF already open (``open_pdf``): as ``prepare_page`` does it from the PDF's bytes."""
    return _prepared(lambda: pdf_page_pixels(pdf, page, spec, limits), spec, page=page, preview_side=preview_side,
                     at_engine_size=True)


def _prepared(pixels: Callable[[], tuple[np.ndarray, int, int]], spec: InputSpec, *, page: int, preview_side: int,
              at_engine_size: bool) -> PreparedPage:
    """The page ``pixels()`` gives (its pixels, its width and height in original pixels), prepared for
    ``spec``; ``at_engine_size``: they are at the engine's size already (a PDF page)."""
    if page < 1:
        raise InputError(f"no page {page} (pages are numbered from 1)", stage=_STAGE)
    try:
        img, width, height = pixels()
        img, pad = (img, (0, 0)) if at_engine_size else _fit(img, spec)
        preview = grey_preview(img, preview_side) if preview_side else None
        image = _engine_input(img, pad, spec, width, height)
    except cv2.error as exc:
        raise InputError(f"cannot prepare this image (OpenCV: {opencv_reason(exc)})", stage=_STAGE) from exc
    except MemoryError:
        raise OutOfMemory("not enough memory to prepare this page", stage=_STAGE) from None
    return PreparedPage(image=image, width=width, height=height, preview=preview)


def _decoded(data: bytes, page: int, spec: InputSpec, limits: Limits) -> tuple[np.ndarray, int, int]:
    """An image's page decoded for ``spec`` (upright; grey when it or the engine has no colour), and its
    size in original pixels. Page 1 of any image, a multi-page TIFF's first included, takes OpenCV's
    fast path (DCT reduction for JPEG)."""
    if page > 1:
        return decode_tiff_frame(data, page, limits, grayscale=spec.grayscale)
    header = read_header(data, limits)
    reduce = dct_reduction(header, spec)
    img = decode(data, header, grayscale=spec.grayscale or header.grey, reduce=reduce)
    width, height = _original_size(img.shape[1], img.shape[0], header, reduce)
    return img, width, height


# What Pillow's TIFF reader raises for a corrupt file: it has no error of its own, and a fuzzed
# frame header gets KeyError or TypeError out of it besides the usual ones.
_PILLOW_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, KeyError, TypeError)


def decode_tiff_frame(data: bytes, page: int, limits: Limits, *,
                      grayscale: bool = False) -> tuple[np.ndarray, int, int]:
    """Frame ``page`` (from 1) of a multi-page TIFF: its pixels (upright; grey when it has no colour or
    ``grayscale``, else BGR) and its size.

    The frame's own header is checked against ``limits`` before its pixels are decoded (Pillow's guard,
    not ours anyway, looks at the first frame only). Raises InputError for an image that is no TIFF.
    """
    if not filetypes.is_tiff(data):
        fmt = read_header(data, limits).format
        raise InputError(f"no page {page} in a {fmt} image (it has one page)", stage=_STAGE)
    try:
        # Built directly, not by Image.open: its bomb guard would refuse every page for a huge first frame.
        with TiffImagePlugin.TiffImageFile(io.BytesIO(data)) as im:
            try:
                im.seek(page - 1)
            except EOFError:
                # Counted anew: a seek past the end leaves Pillow's count at the frame it was asked for.
                count = TiffImagePlugin.TiffImageFile(io.BytesIO(data)).n_frames
                raise InputError(f"no page {page} in this TIFF ({count} page{'s' * (count != 1)})",
                                 stage=_STAGE) from None
            _check_pixels(*im.size, limits, what=f"TIFF page {page}")
            frame, orientation = _eight_bit(im), filetypes.exif_orientation(im)
    except _PILLOW_ERRORS:
        raise InputError(f"corrupt TIFF page {page} (cannot be decoded)", stage=_STAGE) from None
    img = _frame_pixels(frame, grayscale=grayscale)
    if orientation in _UPRIGHT:
        img = _UPRIGHT[orientation](img)
    return img, img.shape[1], img.shape[0]


def _eight_bit(im: Image.Image) -> Image.Image:
    """The current frame decoded, as a new image in mode "L", "RGB", "RGBA" or (kept for scaling) "I;16..."."""
    im.load()
    if im.mode.startswith("I;16"):
        return im.copy()
    if "A" in im.getbands() or "transparency" in im.info:
        return im.convert("RGBA")
    return im.convert("L" if im.mode in _GREY_MODES else "RGB")


def _frame_pixels(im: Image.Image, *, grayscale: bool) -> np.ndarray:
    """What ``_eight_bit`` gave as OpenCV pixels: grey when it has no colour or ``grayscale``, else BGR;
    alpha composited on white, 16 bits scaled to 8."""
    pixels = np.asarray(im)
    if im.mode == "L":
        return pixels
    if im.mode.startswith("I;16"):
        return cv2.convertScaleAbs(pixels.astype(np.uint16), alpha=255.0 / 65535)
    rgb = _on_white(pixels) if im.mode == "RGBA" else pixels
    return cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY if grayscale else cv2.COLOR_RGB2BGR)


def _on_white(img: np.ndarray) -> np.ndarray:
    """Four-channel pixels (colour channels, then alpha) composited on white: three channels, same order."""
    alpha = img[:, :, 3:4].astype(np.float32) / 255.0
    return (img[:, :, :3] * alpha + 255.0 * (1.0 - alpha)).astype(np.uint8)


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
    import pypdfium2 as pdfium

    with PDFIUM_LOCK:
        try:
            pdf = pdfium.PdfDocument(source)
        except pdfium.PdfiumError as exc:
            raise _pdf_error(exc) from None
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
            raise InputError(f"unreadable PDF page {page} ({_pdfium_reason(exc)})", stage=_STAGE) from None


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
        reduce = _reduction(image.placement.scale(image.width, image.height), spec)
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
        return _resized(img, tw, th)
    if (x1 - x0) * (y1 - y0) > 4 * tw * th:
        return None
    page = np.full((th, tw, *img.shape[2:]), 255, np.uint8)
    left, top, right, bottom = max(0, x0), max(0, y0), min(tw, x1), min(th, y1)
    if right > left and bottom > top:
        scaled = _resized(img, x1 - x0, y1 - y0)
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
    page is prepared in (``workers.bounded``). PDFium's raw calls, not pypdfium2's object wrappers: a
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


def _pdf_error(exc: Exception) -> InputError:
    """What PDFium's refusal to open a document means for its owner."""
    import pypdfium2.raw as pdfium_c

    code = getattr(exc, "err_code", None)
    if code == pdfium_c.FPDF_ERR_PASSWORD:
        return InputError("encrypted PDF (it opens only with its password)", stage=_STAGE)
    if code == pdfium_c.FPDF_ERR_SECURITY:
        return InputError("encrypted PDF (unsupported security handler)", stage=_STAGE)
    return InputError(f"unreadable PDF ({_pdfium_reason(exc)})", stage=_STAGE)


def _pdfium_reason(exc: Exception) -> str:
    """PDFium's own short account, on one line ("PDFium: Data format error")."""
    found = re.search(r"PDFium: [^)]*", str(exc))
    return found.group(0) if found else " ".join(str(exc).split())[:120].rstrip(".")


def _fit(img: np.ndarray, spec: InputSpec) -> tuple[np.ndarray, tuple[int, int]]:
    """The page at the engine's scale, and the pixels (right, bottom) that round its sides up to multiple_of."""
    oh, ow = img.shape[:2]
    pad = _padding(ow, oh, spec)
    if pad is not None:
        return img, pad
    w, h = target_size(ow, oh, spec)
    if (w, h) == (ow, oh):
        return img, (0, 0)
    return _resized(img, w, h), (0, 0)


def _resized(img: np.ndarray, w: int, h: int) -> np.ndarray:
    """``img`` resized to w x h."""
    ow = img.shape[1]
    # What DCT reduction left is a mild factor, down or (a PDF page drawn at its render size) up:
    # bilinear is 8x cheaper than area averaging and as good above 1/2, and as good as bicubic below
    # 5/4; beyond those (PNG, TIFF: no DCT reduction; a small image) area averaging avoids aliasing
    # and bicubic keeps edges.
    interp = cv2.INTER_AREA if w < ow / 2 else (cv2.INTER_LINEAR if w < ow * 1.25 else cv2.INTER_CUBIC)
    return cv2.resize(img, (w, h), interpolation=interp)


def _padding(width: int, height: int, spec: InputSpec) -> tuple[int, int] | None:
    """(right, bottom) pixels that make the sides multiples of ``multiple_of`` when that is all the page
    needs (unscaled, it fits the spec, padded too); None when it must be resized."""
    if _scale(width, height, spec) != 1.0:
        return None
    m = max(1, spec.multiple_of)
    pw, ph = width + -width % m, height + -height % m
    if max(pw, ph) > spec.max_side or (spec.max_pixels and pw * ph > spec.max_pixels):
        return None
    return pw - width, ph - height


def grey_preview(img: np.ndarray, side: int) -> np.ndarray:
    """A grey copy of ``img`` at most ``side`` px on its longer side: what the annotated image is drawn on."""
    h, w = img.shape[:2]
    fit = side / max(w, h)
    while fit < 0.5 and min(w, h) >= 2:
        # Halved by area averaging, which OpenCV does 12x faster at a whole factor than at any other
        # (a 2048-px PDF page to a 1000-px preview: 0.6 ms, not 7.5); an odd last row or column is dropped.
        h, w, fit = h // 2, w // 2, fit * 2
        img = cv2.resize(img[: 2 * h, : 2 * w], (w, h), interpolation=cv2.INTER_AREA)
    if fit < 1.0:
        # Bilinear at 1/2 or more averages like area averaging, at a fraction of its cost.
        img = cv2.resize(img, (max(1, round(w * fit)), max(1, round(h * fit))), interpolation=cv2.INTER_LINEAR)
    return cv2.cvtColor(img, cv2.COLOR_BGR2GRAY) if img.ndim == 3 else img


def _engine_input(img: np.ndarray, pad: tuple[int, int], spec: InputSpec, width: int, height: int) -> PreparedImage:
    """``img`` padded and encoded as ``spec`` asks, mapped onto a ``width`` x ``height`` page."""
    ch, cw = img.shape[:2]
    if any(pad):
        # Edge pixels repeated, not white: a grey scan's paper stays paper, a dark border stays dark.
        img = cv2.copyMakeBorder(img, 0, pad[1], 0, pad[0], cv2.BORDER_REPLICATE)
    h, w = img.shape[:2]
    prepared = PreparedImage(width=w, height=h, original_width=round(width * w / cw),
                             original_height=round(height * h / ch))
    if spec.encoding == "array":
        prepared.pixels = np.ascontiguousarray(cv2.cvtColor(img, cv2.COLOR_GRAY2BGR) if img.ndim == 2 else img)
        return prepared
    jpeg = spec.encoding == "jpeg"
    params = [cv2.IMWRITE_JPEG_QUALITY, spec.jpeg_quality] if jpeg else []
    ok, enc = cv2.imencode(".jpg" if jpeg else ".png", img, params)
    if not ok:
        raise InputError("cannot encode the page for the engine", stage=_STAGE)
    prepared.data, prepared.mime = enc.tobytes(), f"image/{spec.encoding}"
    return prepared


def opencv_reason(exc: cv2.error) -> str:
    """OpenCV's own short account of what failed, on one line (its full message names C++ sources)."""
    text = getattr(exc, "err", None) or str(exc).strip().splitlines()[-1]
    return " ".join(str(text).split())[:120]


def _original_size(decoded_w: int, decoded_h: int, header: Header, reduce: int) -> tuple[int, int]:
    """The page's size in original pixels, upright (EXIF rotation applied, DCT reduction undone)."""
    if reduce == 1:
        return decoded_w, decoded_h
    turned = (decoded_w > decoded_h) != (header.width > header.height)
    return (header.height, header.width) if turned else (header.width, header.height)
