"""CPU preprocessing: bytes of an original and a page number -> exactly what the engine's InputSpec asks for.

Runs in the worker's process pool (``workers.cpu_pool``), overlapped with inference. An original is
an image (page 1, ``workers.raster``), a multi-page TIFF (page N is frame N) or a whole PDF (page N is
rendered, ``workers.pdf_pages``). Every way a page can be unreadable becomes an ``InputError`` with a
one-line reason, decided from the header BEFORE any pixel memory is allocated where possible
(``workers.input_limits``); what OpenCV, Pillow or PDFium refuse anyway becomes one too, and running out of
memory a retryable error, so nothing unexpected leaves this module for a page's own sake.

A page is decoded once: the engine's input and a small grey preview, on which the annotated image
is drawn after inference, both come from that one decode (``workers.fit``). For an A4 300 dpi JPEG, entropy
decoding is most of the cost and cannot be cut (DCT-domain reduction saves the rest of the decode); a grey
scan stays grey for every engine (colour would only triple the pixels to resize and encode), and
the sides are rounded to ``multiple_of`` by padding, not by a resize of the whole page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np

from paperlane import filetypes
from paperlane.errors import InputError, OutOfMemory
from paperlane.models.engine import InputSpec, PreparedImage
from paperlane.schemas import Stage
from paperlane.workers.fit import engine_input, fit_to_engine, grey_preview
from paperlane.workers.input_limits import Limits, check_file_size
from paperlane.workers.pdf_pages import PdfFile, pdf_page_pixels, render_pdf_page
from paperlane.workers.previews import SpooledPreview
from paperlane.workers.raster import (
    dct_reduction,
    decode,
    decode_tiff_frame,
    opencv_reason,
    original_size,
    read_header,
)

_STAGE = Stage.PREPROCESS.value


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
    # Grey, at most preview_side px: the annotated image is drawn on it. A pool process leaves it in a file.
    preview: np.ndarray | SpooledPreview | None = None


def prepare_page(data: bytes, spec: InputSpec, limits: Limits = Limits(), *, page: int = 1,
                 preview_side: int = 0) -> PreparedPage:
    """Page ``page`` of an original -> the engine's input and, when ``preview_side``, a grey preview.

    ``page`` counts from 1: a PDF's page, a TIFF's frame; any other image has page 1 only.
    Raises InputError for pages that cannot be read or prepared (a page the original does not have
    among them), and OutOfMemory (retryable) when memory runs out.
    """
    check_file_size(data, limits)
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
        img, pad = (img, (0, 0)) if at_engine_size else fit_to_engine(img, spec)
        preview = grey_preview(img, preview_side) if preview_side else None
        image = engine_input(img, pad, spec, width, height)
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
    width, height = original_size(img.shape[1], img.shape[0], header, reduce)
    return img, width, height
