"""Raster originals (JPEG, PNG, TIFF, BMP, WebP, GIF, JPEG 2000, PPM): the header read before any pixel,
decoding (at a DCT reduction for JPEG, upright by EXIF, alpha on white) and a multi-page TIFF's frames.

Every way such a file can be unreadable becomes an ``InputError`` with a one-line reason, decided from the
header where possible; what OpenCV or Pillow refuse anyway becomes one too.
"""

from __future__ import annotations

import io
import re
import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np
from PIL import Image, TiffImagePlugin, UnidentifiedImageError

from paperlane import filetypes
from paperlane.errors import InputError
from paperlane.models.engine import InputSpec
from paperlane.schemas import Stage
from paperlane.workers.fit import reduction_for_scale, target_size
from paperlane.workers.input_limits import Limits, check_file_size, check_pixels

_STAGE = Stage.PREPROCESS.value


_FORMATS = {"JPEG", "PNG", "TIFF", "BMP", "WEBP", "GIF", "JPEG2000", "PPM"}
_GREY_MODES = {"1", "L", "LA", "La", "I", "F"}  # and "I;16..." (Pillow's image modes without colour)
# OpenCV turns these upright by their EXIF orientation, except when it keeps their alpha channel.
_ORIENTED_UNLESS_ALPHA = {"PNG", "WEBP"}


@dataclass(frozen=True)
class Header:
    format: str
    width: int
    height: int
    has_alpha: bool
    grey: bool = False  # no colour channels: decoding luminance only loses nothing
    orientation: int = 1  # EXIF orientation that ``decode`` applies itself (OpenCV applies the others)
    mode: str = ""  # Pillow's mode for it: "L", "RGB", "CMYK", ...


def read_header(data: bytes, limits: Limits) -> Header:
    """Identify the image and the size of its first frame from its header alone; refuse what cannot be a page."""
    check_file_size(data, limits)
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
    check_pixels(w, h, limits, what="image")
    if fmt == "JPEG" and not _jpeg_complete(data):
        raise InputError("truncated JPEG (the file ends before the image does)", stage=_STAGE)
    return Header(format=fmt, width=w, height=h, has_alpha=has_alpha,
                  grey=mode in _GREY_MODES or mode.startswith("I;16"), orientation=orientation, mode=mode)


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
    return reduction_for_scale(tw / header.width, spec)


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
            check_pixels(*im.size, limits, what=f"TIFF page {page}")
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


def opencv_reason(exc: cv2.error) -> str:
    """OpenCV's own short account of what failed, on one line (its full message names C++ sources)."""
    text = getattr(exc, "err", None) or str(exc).strip().splitlines()[-1]
    return " ".join(str(text).split())[:120]


def original_size(decoded_w: int, decoded_h: int, header: Header, reduce: int) -> tuple[int, int]:
    """The page's size in original pixels, upright (EXIF rotation applied, DCT reduction undone)."""
    if reduce == 1:
        return decoded_w, decoded_h
    turned = (decoded_w > decoded_h) != (header.width > header.height)
    return (header.height, header.width) if turned else (header.width, header.height)
