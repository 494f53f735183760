"""What the results index keeps of a page's lines, taken where the lines are: ``LineStats``.

A module of its own, light to import: the CPU pool's processes build results and take these figures there
(``workers.page_store``) without importing the database layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from paperlane.schemas import PageResult


@dataclass(frozen=True)
class LineStats:
    """What the results index keeps of a page's lines: how many, and their mean confidence (None: none had one).
    Taken where the lines are (a result built on a pool process), so the lines need not travel to the rows."""

    count: int
    mean_confidence: float | None

    @classmethod
    def of(cls, result: PageResult) -> LineStats:
        confidences = [ln.confidence for ln in result.lines if ln.confidence is not None]
        return cls(len(result.lines), sum(confidences) / len(confidences) if confidences else None)
