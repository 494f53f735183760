"""The annotated image: the page with every recognised line outlined and numbered.

It is drawn on the small grey preview that preprocessing cut from its one decode of the page, so no
image is decoded again for it, and it is JPEG by default: the image is for a person checking where
the lines are, and JPEG costs a fifteenth of PNG's CPU (lossless) and a twenty-fifth of WebP's
(smallest), both still available through ``worker.annotated_format``. OpenCV releases the GIL
while it draws and encodes, so the worker renders on a small thread pool beside the task threads.
"""

from __future__ import annotations

__all__ = ["annotate", "build_page", "format_of"]

import cv2
import numpy as np

from paperlane.errors import PaperlaneError, UsageError
from paperlane.formats.content import Content
from paperlane.formats.registry import Format, format_of
from paperlane.schemas import Line, Point
from paperlane.settings import ImageFormat

_GREEN = (40, 170, 40)
_RED = (30, 30, 220)
_LOW_CONFIDENCE = 0.5

_ENCODER_PARAMS: dict[ImageFormat, list[int]] = {
    ImageFormat.JPEG: [cv2.IMWRITE_JPEG_QUALITY, 80],
    ImageFormat.WEBP: [cv2.IMWRITE_WEBP_QUALITY, 80],
    ImageFormat.PNG: [cv2.IMWRITE_PNG_COMPRESSION, 1],
}


def annotate(preview: np.ndarray, lines: list[Line], *, page_width: int, page_height: int,
             fmt: ImageFormat = ImageFormat.JPEG) -> bytes:
    """``preview`` (the page, grey or BGR, at any scale) with ``lines`` (quads in pixels of the
    ``page_width`` x ``page_height`` page) outlined and numbered, encoded as ``fmt``.

    Lines of low confidence are red. Raises PaperlaneError when OpenCV cannot draw or encode it.
    """
    try:
        canvas = cv2.cvtColor(preview, cv2.COLOR_GRAY2BGR) if preview.ndim == 2 else preview.copy()
        _draw(canvas, lines, (canvas.shape[1] / page_width, canvas.shape[0] / page_height))
        ok, data = cv2.imencode(f".{fmt.suffix}", canvas, _ENCODER_PARAMS[fmt])
    except cv2.error as exc:
        raise PaperlaneError("cannot draw the annotated image", stage="store") from exc
    if not ok:
        raise PaperlaneError(f"cannot encode the annotated image as {fmt.value}", stage="store")
    return data.tobytes()


def _draw(canvas: np.ndarray, lines: list[Line], scale: tuple[float, float]) -> None:
    thickness = max(1, round(max(canvas.shape[:2]) / 800))
    numbered = [(i, ln) for i, ln in enumerate(lines, 1) if ln.quad]
    quads = _canvas_pixels([ln.quad or [] for _, ln in numbered], scale)
    low = [ln.confidence is not None and ln.confidence < _LOW_CONFIDENCE for _, ln in numbered]
    for colour, want in ((_GREEN, False), (_RED, True)):
        group = [q for q, is_low in zip(quads, low) if is_low is want]
        if group:  # one call per colour: the loop over lines runs in C, without the GIL
            cv2.polylines(canvas, group, isClosed=True, color=colour, thickness=thickness)
    for (i, _), quad in zip(numbered, quads):
        x, y = quad[0].tolist()
        cv2.putText(canvas, str(i), (x, max(10, y - 2)), cv2.FONT_HERSHEY_SIMPLEX, 0.35 * thickness, _RED, 1,
                    cv2.LINE_AA)


def _canvas_pixels(quads: list[list[Point]], scale: tuple[float, float]) -> list[np.ndarray]:
    """Integer canvas points per quad. Coordinates come from an engine: NaN or huge ones must not raise."""
    with np.errstate(invalid="ignore", over="ignore"):
        if len({len(q) for q in quads}) == 1:  # the usual case: one array operation for every line
            return list(_ints(np.array(quads, np.float64) * scale))
        return [_ints(np.asarray(q, np.float64) * scale) for q in quads]


def _ints(points: np.ndarray) -> np.ndarray:
    ints: np.ndarray = np.rint(np.nan_to_num(points).clip(-1e6, 1e6)).astype(np.int32)
    return ints


def build_page(content: Content, number: int, spec: Format) -> bytes:
    """Page ``number`` annotated on ``content.preview``, in the encoding ``spec`` registers (one format each)."""
    result = content.result(number)
    if content.preview is None or not isinstance(spec.key, ImageFormat):
        raise UsageError("the annotated image is drawn on a page's preview, which only the worker has")
    height, width = content.preview.shape[:2]
    return annotate(content.preview, result.lines, page_width=result.width or width,
                    page_height=result.height or height, fmt=spec.key)
