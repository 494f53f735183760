"""The annotated image: the page with every recognised line outlined and numbered."""

from __future__ import annotations

import cv2
import numpy as np

from paperlane.errors import InputError
from paperlane.models.engine import PreparedImage
from paperlane.schemas import Line

_GREEN = (40, 170, 40)
_RED = (30, 30, 220)


def page_pixels(image: PreparedImage) -> np.ndarray:
    """The prepared page as BGR pixels (decoded again when the engine was given bytes)."""
    if image.pixels is not None:
        return image.pixels
    assert image.data is not None
    img = cv2.imdecode(np.frombuffer(image.data, np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise InputError("cannot decode the prepared page for rendering", stage="store")
    return img


# An annotated image is for a person checking the result: 1600 px on the long side is plenty, and
# PNG-encoding the engine's full-size input would cost several times more CPU and storage.
MAX_SIDE = 1600


def annotate(image: PreparedImage, lines: list[Line]) -> bytes:
    """A PNG of the page with ``lines`` (original-pixel quads) drawn on it, at most MAX_SIDE px."""
    canvas = page_pixels(image)
    fit = min(1.0, MAX_SIDE / max(image.width, image.height))
    if fit < 1.0:
        canvas = cv2.resize(canvas, (round(image.width * fit), round(image.height * fit)), interpolation=cv2.INTER_AREA)
    else:
        canvas = canvas.copy()
    if canvas.ndim == 2:
        canvas = cv2.cvtColor(canvas, cv2.COLOR_GRAY2BGR)
    sx = canvas.shape[1] / image.original_width
    sy = canvas.shape[0] / image.original_height
    thickness = max(1, round(max(canvas.shape[:2]) / 800))
    for i, ln in enumerate(lines, 1):
        if not ln.quad:
            continue
        pts = np.array([[x * sx, y * sy] for x, y in ln.quad], np.int32)
        low = ln.confidence is not None and ln.confidence < 0.5
        cv2.polylines(canvas, [pts], isClosed=True, color=_RED if low else _GREEN, thickness=thickness)
        x, y = pts[0]
        cv2.putText(canvas, str(i), (int(x), max(10, int(y) - 2)), cv2.FONT_HERSHEY_SIMPLEX,
                    0.35 * thickness, _RED, 1, cv2.LINE_AA)
    ok, png = cv2.imencode(".png", canvas, [cv2.IMWRITE_PNG_COMPRESSION, 1])
    if not ok:
        raise InputError("cannot encode the annotated image", stage="store")
    return png.tobytes()
