"""Accuracy metrics for OCR output: text normalisation, edit distance, CER, box IoU and detection P/R.

Generic on purpose: used by the corpus benchmark and by tests that render synthetic pages.
A *box* is ``(x0, y0, x1, y1)``; a *quad* is four ``[x, y]`` corners (any order).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

import numpy as np

Box = tuple[float, float, float, float]
Quad = Sequence[Sequence[float]]


def normalise(text: str) -> str:
    """NFKC, case-folded, every run of whitespace folded to one space, trimmed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _codes(s: str) -> np.ndarray:
    return np.frombuffer(s.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insert, delete, substitute all cost 1), one DP row at a time.

    Within a row the insertion chain ``cur[j] = min(cur[j], cur[j-1] + 1)`` is a running minimum of
    ``cur[k] - k`` plus ``j``, so each row is a few numpy operations: 5k x 5k chars takes under a second.
    """
    if len(a) < len(b):
        a, b = b, a  # loop over the shorter string, vectorise over the longer one
    if not b:
        return len(a)
    cols = _codes(a)
    idx = np.arange(len(a) + 1, dtype=np.int64)
    prev = idx.copy()
    cur = np.empty_like(prev)
    for i, ch in enumerate(_codes(b), start=1):
        cur[0] = i
        np.minimum(prev[:-1] + (cols != ch), prev[1:] + 1, out=cur[1:])
        prev = np.minimum.accumulate(cur - idx) + idx
    return int(prev[-1])


def cer(pred: str, truth: str) -> float:
    """Character error rate: ``levenshtein / len(truth)`` after :func:`normalise`.

    An empty truth gives 0.0 for an empty prediction and 1.0 otherwise. May exceed 1.0.
    """
    p, t = normalise(pred), normalise(truth)
    if not t:
        return 0.0 if not p else 1.0
    return levenshtein(p, t) / len(t)


def cer_nospace(pred: str, truth: str) -> float:
    """Like :func:`cer` but blind to whitespace (word splits in the ground truth are unreliable)."""
    return cer("".join(pred.split()), "".join(truth.split()))


def quad_to_box(quad: Quad) -> Box:
    """The axis-aligned bounding box of a quad (or of any list of points)."""
    xs = [float(p[0]) for p in quad]
    ys = [float(p[1]) for p in quad]
    return min(xs), min(ys), max(xs), max(ys)


def box_iou(a: Box, b: Box) -> float:
    """Intersection over union of two axis-aligned boxes; 0.0 when disjoint or degenerate."""
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def detection_matches(pred: Sequence[Box], truth: Sequence[Box], *, iou: float = 0.5) -> int:
    """How many one-to-one pairs (greedy, highest IoU first) reach ``iou``."""
    pairs = sorted(((box_iou(p, t), i, j) for i, p in enumerate(pred) for j, t in enumerate(truth)),
                   reverse=True)
    used_p: set[int] = set()
    used_t: set[int] = set()
    for score, i, j in pairs:
        if score < iou:
            break
        if i not in used_p and j not in used_t:
            used_p.add(i)
            used_t.add(j)
    return len(used_p)


def detection_pr(pred_quads: Sequence[Quad], truth_quads: Sequence[Quad],
                 iou: float = 0.5) -> tuple[float, float]:
    """(precision, recall) of predicted line quads against truth quads, compared as bounding boxes.

    Empty predictions give precision 1.0; empty truth gives recall 1.0.
    """
    pred = [quad_to_box(q) for q in pred_quads]
    truth = [quad_to_box(q) for q in truth_quads]
    hits = detection_matches(pred, truth, iou=iou)
    return (hits / len(pred) if pred else 1.0), (hits / len(truth) if truth else 1.0)


def reading_order(boxes: Sequence[Box], *, overlap: float = 0.5) -> list[int]:
    """Indices of ``boxes`` sorted top to bottom, then left to right within a row.

    A box joins the row opened by the topmost remaining box when their vertical overlap is at least
    ``overlap`` of the shorter height, so a pixel of skew does not swap two segments of one printed line.
    """
    order = sorted(range(len(boxes)), key=lambda k: (boxes[k][1], boxes[k][0]))
    rows: list[list[int]] = []
    for k in order:
        if rows:
            head = boxes[rows[-1][0]]
            box = boxes[k]
            inter = min(head[3], box[3]) - max(head[1], box[1])
            if inter >= overlap * max(min(head[3] - head[1], box[3] - box[1]), 1e-9):
                rows[-1].append(k)
                continue
        rows.append([k])
    return [k for row in rows for k in sorted(row, key=lambda k: boxes[k][0])]
