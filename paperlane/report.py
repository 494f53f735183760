"""Where the time goes: per-stage p50, p95 and share of the total, over a set of pages."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from paperlane.schemas import STAGES


@dataclass(frozen=True)
class StageRow:
    stage: str
    pages: int
    p50: float
    p95: float
    total: float
    share: float


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def stage_report(timings: Iterable[Mapping[str, float]]) -> list[StageRow]:
    """One row per stage, in pipeline order, over every page's timings (seconds)."""
    per_stage: dict[str, list[float]] = {s.value: [] for s in STAGES}
    for page in timings:
        for stage, seconds in page.items():
            if stage in per_stage and seconds is not None:
                per_stage[stage].append(seconds)
    grand = sum(sum(v) for v in per_stage.values()) or 1.0
    return [StageRow(stage, len(v), percentile(v, 50), percentile(v, 95), sum(v), sum(v) / grand)
            for stage, v in per_stage.items() if v]
