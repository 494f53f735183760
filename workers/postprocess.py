"""Post-processing: engine output in prepared-image pixels -> the page result in original pixels."""

from __future__ import annotations

import math

from paperlane.gutters import split_at_gutters
from paperlane.layout import estimate_words, is_rtl, order_lines, quad_box
from paperlane.regions import Found, order_regions
from paperlane.models.engine import EngineOutput, PreparedImage
from paperlane.models.quality import grade
from paperlane.schemas import (Block, BlockKind, EngineInfo, JobStatus, Line, PageResult, Point, Quality, QualityFlag,
                               Task, TaskSpec)
from paperlane.settings import LayoutSettings


def regions_to_original(regions: list[Found], image: PreparedImage, size: tuple[int, int]) -> list[Found]:
    """Layout regions with their boxes in original-page pixels, clipped to the page."""
    sx, sy = image.original_width / image.width, image.original_height / image.height
    w, h = size
    return [Found(r.kind, (min(r.box[0] * sx, w), min(r.box[1] * sy, h), min(r.box[2] * sx, w),
                           min(r.box[3] * sy, h))) for r in regions]


def to_original(lines: list[Line], image: PreparedImage, size: tuple[int, int] | None = None) -> list[Line]:
    """The same lines (and their words) with their quads in original-page pixels, inside a page of
    ``size`` when given.

    A prepared image may reach past the page (its sides padded to a multiple): an engine's box that
    strays into that margin is clipped to the page.
    """
    sx, sy = image.original_width / image.width, image.original_height / image.height
    w, h = size or (math.inf, math.inf)

    def mapped(quad: list[Point]) -> list[Point]:
        return [(round(min(max(x * sx, 0.0), w), 1), round(min(max(y * sy, 0.0), h), 1)) for x, y in quad]

    out = []
    for ln in lines:
        update: dict[str, object] = {"quad": mapped(ln.quad)} if ln.quad else {}
        if ln.words:
            update["words"] = [wd.model_copy(update={"quad": mapped(wd.quad)}) for wd in ln.words]
        out.append(ln.model_copy(update=update) if update else ln)
    return out


def with_words(lines: list[Line]) -> list[Line]:
    """Lines with a quad and no words from the engine get theirs laid out along the quad (``estimated``)."""
    rtl = is_rtl(ln.text for ln in lines)
    return [ln.model_copy(update={"words": estimate_words(ln.text, ln.quad, confidence=ln.confidence, rtl=rtl)})
            if ln.quad and ln.words is None else ln for ln in lines]


def build_result(*, job_id: str, source: str, page: int, spec: TaskSpec, output: EngineOutput,
                 image: PreparedImage, size: tuple[int, int], engine: EngineInfo,
                 layout: LayoutSettings | None = None) -> PageResult:
    """The succeeded page result for a page of ``size`` (width, height) original pixels.

    Lines with boxes are grouped into blocks and put in reading order (``paperlane.layout``),
    each with its words; ``text`` (and, for ``parse``, the markdown, a paragraph a block) follows that
    order when the engine's text was its lines. ``engine`` is the worker's, unless another one read the
    page (a fallback); the quality is the engine's grade (an output without one is graded on what it
    shows; the process that records the page counts it: ``pipeline.count_grade``).
    """
    lines = split_at_gutters(with_words(to_original(output.lines, image, size)), settings=layout)
    if output.regions:
        lines, blocks = order_regions(lines, regions_to_original(output.regions, image, size), page_size=size,
                                      settings=layout)
    else:
        lines, blocks = order_lines(lines, page_height=size[1], settings=layout)
    from_lines = bool(lines) and _text_is_lines(output)
    read = _read(lines, blocks, layout or LayoutSettings())
    text = "\n".join(ln.text for ln in read) if from_lines else output.text
    markdown = output.markdown
    if from_lines and spec.task is Task.PARSE and markdown == output.text:
        markdown = _paragraphs(read, blocks)
    quality = output.quality or grade(output, confidence=None, min_confidence=0.0)
    if from_lines and _vertical(lines):
        quality = Quality.grade({*quality.flags, QualityFlag.VERTICAL_TEXT}, quality.confidence)
    return PageResult(
        job_id=job_id, source=source, page=page, status=JobStatus.SUCCEEDED, task=spec.task,
        text=text, lines=lines, blocks=blocks, markdown=markdown, fields=output.fields,
        missing_fields=output.missing_fields, truncated=output.truncated,
        width=size[0], height=size[1], engine=output.engine or engine, usage=output.usage, quality=quality,
    )


def _vertical(lines: list[Line]) -> bool:
    """Whether most lines of more than one character stand upright (three times taller than wide): vertical
    text, whose columns paperlane reads as lines and does not order right to left."""
    boxes = [quad_box(ln.quad) for ln in lines if ln.quad and len(ln.text.strip()) > 1]
    upright = sum(b[3] - b[1] > 3 * (b[2] - b[0]) for b in boxes)
    return bool(boxes) and 2 * upright > len(boxes)


_MARGINS = frozenset({BlockKind.HEADER, BlockKind.FOOTER, BlockKind.PAGE_NUMBER})


def _read(lines: list[Line], blocks: list[Block], layout: LayoutSettings) -> list[Line]:
    """The lines that ``text`` and markdown hold: all of them, or (``layout.margins = "omit"``) all but the
    running heads, feet and page numbers, which stay in ``lines`` with their blocks' kinds."""
    if layout.margins == "first_last" or not blocks:
        return lines
    return [ln for ln in lines if blocks[ln.block or 0].kind not in _MARGINS]


def _paragraphs(lines: list[Line], blocks: list[Block]) -> str:
    """The lines as markdown: a paragraph a block, in reading order; a heading's block a markdown heading, a
    caption's in italics."""
    if not blocks:
        return "\n".join(ln.text for ln in lines)
    parts: list[list[str]] = [[] for _ in blocks]
    for ln in lines:
        parts[ln.block or 0].append(ln.text)
    return "\n\n".join(_markdown(blocks[n].kind, part) for n, part in enumerate(parts) if part)


def _markdown(kind: BlockKind, texts: list[str]) -> str:
    if kind is BlockKind.HEADING:
        return "## " + " ".join(texts)
    if kind is BlockKind.CAPTION:
        return "*" + " ".join(texts) + "*"
    return "\n".join(texts)


def _text_is_lines(output: EngineOutput) -> bool:
    return output.text == "\n".join(ln.text for ln in output.lines)
