"""A page's pixels brought to what the engine asks (``InputSpec``): its size (``target_size``; resized, or only
padded when rounding its sides to ``multiple_of`` is all it needs), its encoding, and the small grey preview the
annotated image is drawn on.
"""

from __future__ import annotations

import base64
import math

import cv2
import numpy as np

from paperlane.errors import InputError
from paperlane.models.engine import InputSpec, PreparedImage
from paperlane.schemas import Stage

_STAGE = Stage.PREPROCESS.value


def reduction_for_scale(scale: float, spec: InputSpec) -> int:
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


def fit_to_engine(img: np.ndarray, spec: InputSpec) -> tuple[np.ndarray, tuple[int, int]]:
    """The page at the engine's scale, and the pixels (right, bottom) that round its sides up to multiple_of."""
    oh, ow = img.shape[:2]
    pad = _padding(ow, oh, spec)
    if pad is not None:
        return img, pad
    w, h = target_size(ow, oh, spec)
    if (w, h) == (ow, oh):
        return img, (0, 0)
    return resized(img, w, h), (0, 0)


def resized(img: np.ndarray, w: int, h: int) -> np.ndarray:
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


def engine_input(img: np.ndarray, pad: tuple[int, int], spec: InputSpec, width: int, height: int) -> PreparedImage:
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
    prepared.mime = f"image/{spec.encoding}"
    if spec.base64:
        prepared.data_b64 = base64.b64encode(enc.data)
    else:
        prepared.data = enc.tobytes()
    return prepared
