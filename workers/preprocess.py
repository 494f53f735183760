"""CPU preprocessing: bytes of an original page -> exactly what the engine's InputSpec asks for.

Runs in the worker's process pool (``workers.cpu_pool``), overlapped with inference. Every way a
page can be unreadable becomes an ``InputError`` with a one-line reason, decided from the header
BEFORE any pixel memory is allocated where possible (a 40000x40000 image declared in a 1 kB file
must not take 4.8 GB to refuse).
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

from paperlane.errors import InputError
from paperlane.models.engine import InputSpec, PreparedImage

_STAGE = "preprocess"
_FORMATS = {"JPEG", "PNG", "TIFF", "BMP", "WEBP", "GIF", "JPEG2000", "PPM"}


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
    return Header(format=fmt, width=w, height=h, has_alpha="A" in mode or mode == "P")


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
    img = cv2.imdecode(buf, flags)
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


def target_size(width: int, height: int, spec: InputSpec) -> tuple[int, int]:
    """The (width, height) the engine wants for a width x height page, aspect ratio kept."""
    scale = min(1.0, spec.max_side / max(width, height))
    if spec.max_pixels:
        scale = min(scale, math.sqrt(spec.max_pixels / (width * height)))
    if spec.min_pixels and width * height * scale * scale < spec.min_pixels:
        scale = math.sqrt(spec.min_pixels / (width * height))
    m = max(1, spec.multiple_of)
    w = max(m, round(width * scale / m) * m)
    h = max(m, round(height * scale / m) * m)
    if spec.max_pixels and w * h > spec.max_pixels:  # rounding up may overshoot by one step
        w = max(m, math.floor(width * scale / m) * m)
        h = max(m, math.floor(height * scale / m) * m)
    return w, h


def prepare(data: bytes, spec: InputSpec, limits: Limits = Limits()) -> PreparedImage:
    """Bytes of an original page -> the engine's input. Raises InputError for unreadable pages."""
    header = read_header(data, limits)
    reduce = dct_reduction(header, spec)
    img = decode(data, header, grayscale=spec.grayscale, reduce=reduce)
    oh, ow = img.shape[:2]
    w, h = target_size(ow, oh, spec)
    if (w, h) != (ow, oh):
        # What DCT reduction left is a mild factor: bilinear is 8x cheaper than area averaging and
        # as good above 1/2; below that (PNG, TIFF: no DCT reduction) area averaging avoids aliasing.
        interp = cv2.INTER_AREA if w < ow / 2 else (cv2.INTER_LINEAR if w < ow else cv2.INTER_CUBIC)
        img = cv2.resize(img, (w, h), interpolation=interp)
    orig_w, orig_h = _original_size(ow, oh, header, reduce)
    prepared = PreparedImage(width=w, height=h, original_width=orig_w, original_height=orig_h)
    if spec.encoding == "array":
        prepared.pixels = np.ascontiguousarray(cv2.cvtColor(img, cv2.COLOR_GRAY2BGR) if img.ndim == 2 else img)
    else:
        jpeg = spec.encoding == "jpeg"
        params = [cv2.IMWRITE_JPEG_QUALITY, spec.jpeg_quality] if jpeg else []
        ok, enc = cv2.imencode(".jpg" if jpeg else ".png", img, params)
        if not ok:
            raise InputError("cannot encode the page for the engine", stage=_STAGE)
        prepared.data, prepared.mime = enc.tobytes(), f"image/{spec.encoding}"
    return prepared


def _original_size(decoded_w: int, decoded_h: int, header: Header, reduce: int) -> tuple[int, int]:
    """The page's size in original pixels, upright (EXIF rotation applied, DCT reduction undone)."""
    if reduce == 1:
        return decoded_w, decoded_h
    turned = (decoded_w > decoded_h) != (header.width > header.height)
    return (header.height, header.width) if turned else (header.width, header.height)
