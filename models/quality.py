"""A page's quality grade: what an engine's output says about itself, with what happened to get it.

Every engine grades its outputs with ``grade``: the flags it knows of (a loop stopped, a retry, a
fallback) plus those any output shows (``truncated``, ``empty``, ``low_confidence`` under
``engine.min_confidence``), and a confidence: the geometric mean probability of the answer's tokens
for a VLM (``confidence_of``), the line scores weighted by length for RapidOCR (``line_confidence``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from paperlane.models.engine import EngineOutput
from paperlane.schemas import Line, Quality, QualityFlag


def grade(out: EngineOutput, *, flags: Iterable[QualityFlag] = (), confidence: float | None,
          min_confidence: float) -> Quality:
    """``out``'s quality: ``flags``, with ``truncated``, ``empty`` and ``low_confidence`` where they apply."""
    found = set(flags)
    if out.truncated:
        found.add(QualityFlag.TRUNCATED)
    if is_empty(out):
        found.add(QualityFlag.EMPTY)
    if confidence is not None and confidence < min_confidence:
        found.add(QualityFlag.LOW_CONFIDENCE)
    return Quality.grade(found, confidence)


def is_empty(out: EngineOutput) -> bool:
    """Whether nothing was read: no text, no lines, no markdown and no field with a value."""
    if out.fields is not None:
        return not any(value not in (None, "") for value in out.fields.values())
    return not (out.text.strip() or out.lines or (out.markdown or "").strip())


def confidence_of(logprob_sum: float, tokens: int) -> float | None:
    """The geometric mean probability of ``tokens`` tokens whose log-probabilities sum to ``logprob_sum``."""
    return math.exp(logprob_sum / tokens) if tokens else None


def line_confidence(lines: Iterable[Line]) -> float | None:
    """The lines' scores, each weighted by its length; None when no line has a score."""
    scored = [(line.confidence, max(1, len(line.text))) for line in lines if line.confidence is not None]
    total = sum(weight for _, weight in scored)
    return sum(score * weight for score, weight in scored) / total if total else None
