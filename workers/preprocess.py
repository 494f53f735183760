"""CPU preprocessing: bytes of an original page -> exactly what the engine's InputSpec asks for.

Runs in the worker's process pool (``workers.cpu_pool``), overlapped with inference. Every way a
page can be unreadable becomes an ``InputError`` with a one-line reason, decided from the header
BEFORE any pixel memory is allocated where possible (a 40000x40000 image declared in a 1 kB file
must not take 4.8 GB to refuse); what OpenCV refuses anyway becomes one too, and running out of
memory a retryable error, so nothing unexpected leaves this module for a page's own sake.

A page is decoded once: the engine's input and a small grey preview, on which the annotated image
is drawn after inference, both come from that one decode. For an A4 300 dpi JPEG, entropy decoding
is most of the cost and cannot be cut (DCT-domain reduction saves the rest of the decode); a grey
scan stays grey for every engine (colour would only triple the pixels to resize and encode), and
the sides are rounded to ``multiple_of`` by padding, not by a resize of the whole page.
"""

from __future__ import annotations

import io
import math
import re
import warnings
from dataclasses import dataclass

import cv2
import numpy as np
from PIL import Image, UnidentifiedImageError

from paperlane.errors import InputError, PaperlaneError
from paperlane.models.engine import InputSpec, PreparedImage

_STAGE = "preprocess"
_FORMATS = {"JPEG", "PNG", "TIFF", "BMP", "WEBP", "GIF", "JPEG2000", "PPM"}
_GREY_MODES = {"1", "L", "LA", "La", "I", "F"}  # and "I;16..." (Pillow's image modes without colour)


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


def read_header(data: bytes, limits: Limits) -> Header:
    """Identify the image and its size from its header alone; refuse what cannot be a page."""
    if not data:
        raise InputError("empty file (0 bytes)", stage=_STAGE)
    if len(data) > limits.max_bytes:
        raise InputError(f"file too large ({len(data) / 2**20:.0f} MiB, limit {limits.max_bytes / 2**20:.0f} MiB)",
                         stage=_STAGE)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                fmt, (w, h), mode = im.format or "?", im.size, im.mode
    except Image.DecompressionBombError as exc:  # Pillow's own guard, far above ours: say how large
        found = re.search(r"\((\d+) pixels\)", str(exc))
        size = f" ({int(found.group(1)) / 1e6:.0f} MP" if found else " ("
        raise InputError(f"image too large{size}, limit {limits.max_pixels / 1e6:.0f} MP)", stage=_STAGE) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        raise InputError("not a readable image (unknown or corrupt format)", stage=_STAGE) from None
    if fmt not in _FORMATS:
        raise InputError(f"unsupported image format {fmt}", stage=_STAGE)
    if w < 1 or h < 1:
        raise InputError(f"image has no pixels ({w}x{h})", stage=_STAGE)
    if w * h > limits.max_pixels:
        raise InputError(f"image too large ({w}x{h} = {w * h / 1e6:.0f} MP, limit {limits.max_pixels / 1e6:.0f} MP)",
                         stage=_STAGE)
    if fmt == "JPEG" and not _jpeg_complete(data):
        raise InputError("truncated JPEG (the file ends before the image does)", stage=_STAGE)
    return Header(format=fmt, width=w, height=h, has_alpha="A" in mode or mode == "P",
                  grey=mode in _GREY_MODES or mode.startswith("I;16"))


def _jpeg_complete(data: bytes) -> bool:
    # FF D9 (end of image) cannot occur inside entropy-coded data (FF is stuffed as FF 00), so a
    # JPEG whose tail has no EOI was cut short. Some writers pad with zeros or add a few bytes.
    tail = data[-4096:].rstrip(b"\x00\r\n ")
    return tail.endswith(b"\xff\xd9") or b"\xff\xd9" in tail[-64:]


_REDUCED = {
    (False, 1): cv2.IMREAD_COLOR, (False, 2): cv2.IMREAD_REDUCED_COLOR_2,
    (False, 4): cv2.IMREAD_REDUCED_COLOR_4, (False, 8): cv2.IMREAD_REDUCED_COLOR_8,
    (True, 1): cv2.IMREAD_GRAYSCALE, (True, 2): cv2.IMREAD_REDUCED_GRAYSCALE_2,
    (True, 4): cv2.IMREAD_REDUCED_GRAYSCALE_4, (True, 8): cv2.IMREAD_REDUCED_GRAYSCALE_8,
}


def decode(data: bytes, header: Header, *, grayscale: bool = False, reduce: int = 1) -> np.ndarray:
    """Decode to uint8 pixels (BGR, or one channel when ``grayscale``), EXIF orientation applied.

    ``reduce`` (1, 2, 4 or 8) decodes a JPEG at that fraction in the DCT domain. Alpha is
    composited on white.
    """
    buf = np.frombuffer(data, np.uint8)
    flags = cv2.IMREAD_UNCHANGED if header.has_alpha else _REDUCED[(grayscale, reduce)]
    try:
        img = cv2.imdecode(buf, flags)
    except cv2.error as exc:  # OpenCV's own limits and assertions, beyond what the header showed us
        raise InputError(f"cannot decode this image (OpenCV: {opencv_reason(exc)})", stage=_STAGE) from exc
    if img is None:
        raise InputError(f"corrupt {header.format} image (cannot be decoded)", stage=_STAGE)
    if img.dtype != np.uint8:  # 16-bit scans
        img = cv2.convertScaleAbs(img, alpha=255.0 / np.iinfo(img.dtype.name).max)
    if img.ndim == 3 and img.shape[2] == 4:
        alpha = img[:, :, 3:4].astype(np.float32) / 255.0
        img = (img[:, :, :3] * alpha + 255.0 * (1.0 - alpha)).astype(np.uint8)
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
    scale = tw / header.width
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


def prepare(data: bytes, spec: InputSpec, limits: Limits = Limits()) -> PreparedImage:
    """Bytes of an original page -> the engine's input. Raises InputError for unreadable pages."""
    return prepare_page(data, spec, limits).image


def prepare_page(data: bytes, spec: InputSpec, limits: Limits = Limits(), *, preview_side: int = 0) -> PreparedPage:
    """Bytes of an original page -> the engine's input and, when ``preview_side``, a grey preview.

    Raises InputError for pages that cannot be read or prepared, and a retryable PaperlaneError when
    memory runs out.
    """
    header = read_header(data, limits)
    try:
        reduce = dct_reduction(header, spec)
        img = decode(data, header, grayscale=spec.grayscale or header.grey, reduce=reduce)
        width, height = _original_size(img.shape[1], img.shape[0], header, reduce)
        img, pad = _fit(img, spec)
        preview = grey_preview(img, preview_side) if preview_side else None
        image = _engine_input(img, pad, spec, width, height)
    except cv2.error as exc:
        raise InputError(f"cannot prepare this image (OpenCV: {opencv_reason(exc)})", stage=_STAGE) from exc
    except MemoryError:
        raise PaperlaneError(f"not enough memory to prepare this page ({header.width}x{header.height})",
                             stage=_STAGE, retryable=True) from None
    return PreparedPage(image=image, width=width, height=height, preview=preview)


def _fit(img: np.ndarray, spec: InputSpec) -> tuple[np.ndarray, tuple[int, int]]:
    """The page at the engine's scale, and the pixels (right, bottom) that round its sides up to multiple_of."""
    oh, ow = img.shape[:2]
    pad = _padding(ow, oh, spec)
    if pad is not None:
        return img, pad
    w, h = target_size(ow, oh, spec)
    if (w, h) == (ow, oh):
        return img, (0, 0)
    # What DCT reduction left is a mild factor: bilinear is 8x cheaper than area averaging and
    # as good above 1/2; below that (PNG, TIFF: no DCT reduction) area averaging avoids aliasing.
    interp = cv2.INTER_AREA if w < ow / 2 else (cv2.INTER_LINEAR if w < ow else cv2.INTER_CUBIC)
    return cv2.resize(img, (w, h), interpolation=interp), (0, 0)


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
    if fit < 1.0:
        # Bilinear at 1/2 or more averages like area averaging, at a fraction of its cost.
        interp = cv2.INTER_LINEAR if fit >= 0.5 else cv2.INTER_AREA
        img = cv2.resize(img, (max(1, round(w * fit)), max(1, round(h * fit))), interpolation=interp)
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
