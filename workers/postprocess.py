"""Post-processing: engine output in prepared-image pixels -> the page result in original pixels."""

from __future__ import annotations

import math

from paperlane.metrics import PAGE_FLAGS, PAGES_GRADED
from paperlane.models.engine import EngineOutput, PreparedImage
from paperlane.models.quality import grade
from paperlane.schemas import EngineInfo, JobStatus, Line, PageResult, Quality, TaskSpec


def to_original(lines: list[Line], image: PreparedImage, size: tuple[int, int] | None = None) -> list[Line]:
    """The same lines with their quads in original-page pixels, inside a page of ``size`` when given.

    A prepared image may reach past the page (its sides padded to a multiple): an engine's box that
    strays into that margin is clipped to the page.
    """
    sx, sy = image.original_width / image.width, image.original_height / image.height
    w, h = size or (math.inf, math.inf)
    return [ln.model_copy(update={"quad": [(round(min(max(x * sx, 0.0), w), 1), round(min(max(y * sy, 0.0), h), 1))
                                           for x, y in ln.quad]}) if ln.quad else ln
            for ln in lines]


def reading_order(lines: list[Line]) -> list[Line]:
    """Sort lines top to bottom, and left to right within a row.

    A line joins the current row when its vertical span overlaps the row's FIRST line by more
    than half of the smaller height. Comparing with the first line only (not the row's growing
    span) keeps a tall box, such as a handwritten note in the margin, from swallowing several
    printed rows.
    """
    if any(not ln.quad for ln in lines):  # lines without boxes keep the engine's order
        return lines

    def span(ln: Line) -> tuple[float, float]:
        ys = [p[1] for p in ln.quad or ()]
        return min(ys), max(ys)

    rows: list[list[Line]] = []
    for ln in sorted(lines, key=lambda ln: span(ln)[0]):
        top, bottom = span(ln)
        if rows:
            rt, rb = span(rows[-1][0])
            if min(bottom, rb) - max(top, rt) > 0.5 * min(bottom - top, rb - rt):
                rows[-1].append(ln)
                continue
        rows.append([ln])
    return [ln for row in rows for ln in sorted(row, key=lambda ln: min(p[0] for p in ln.quad or ()))]


def build_result(*, job_id: str, source: str, page: int, spec: TaskSpec, output: EngineOutput,
                 image: PreparedImage, size: tuple[int, int], engine: EngineInfo) -> PageResult:
    """The succeeded page result for a page of ``size`` (width, height) original pixels; ``text``
    follows the reading order when the engine gave lines. ``engine`` is the worker's, unless another one
    read the page (a fallback); the quality is the engine's grade (an output without one is graded on
    what it shows), counted in the ``paperlane_page_flags`` and ``paperlane_pages_graded`` metrics."""
    lines = reading_order(to_original(output.lines, image, size))
    text = "\n".join(ln.text for ln in lines) if lines and _text_is_lines(output) else output.text
    quality = output.quality or grade(output, confidence=None, min_confidence=0.0)
    _count(quality)
    return PageResult(
        job_id=job_id, source=source, page=page, status=JobStatus.SUCCEEDED, task=spec.task,
        text=text, lines=lines, markdown=output.markdown, fields=output.fields,
        missing_fields=output.missing_fields, truncated=output.truncated,
        width=size[0], height=size[1], engine=output.engine or engine, usage=output.usage, quality=quality,
    )


def _count(quality: Quality) -> None:
    for flag in quality.flags:
        PAGE_FLAGS.labels(flag.value).inc()
    PAGES_GRADED.labels(str(quality.needs_review).lower()).inc()


def _text_is_lines(output: EngineOutput) -> bool:
    return output.text == "\n".join(ln.text for ln in output.lines)
