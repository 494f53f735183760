"""The data that crosses package boundaries: tasks, stages, fair-share weights, page results.

These are the public shapes: the result JSON that ``paperlane run`` writes and the worker stores
is a ``PageResult`` dumped with ``model_dump(mode="json")``.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from paperlane.errors import UsageError
from paperlane.status import JobStatus


class Task(str, Enum):
    SPOTTING = "spotting"  # lines with boxes
    PARSE = "parse"  # markdown of the whole page
    TEXT = "text"  # plain text
    FIELDS = "fields"  # caller-given keys, answered as JSON
    TRANSLATE = "translate"  # extract, then translate
    TABLE = "table"  # the page's table as HTML
    FORMULA = "formula"  # the page's formula as LaTeX
    CHART = "chart"  # the page's chart: Mermaid for flowcharts, markdown for the rest

    @property
    def reads_text(self) -> bool:
        """Whether a plain reading of the page's lines answers this task (an OCR engine's lines do)."""
        return self in (Task.SPOTTING, Task.PARSE, Task.TEXT)


class Stage(str, Enum):
    """The stages every page is timed through, in pipeline order."""

    UPLOAD = "upload"  # producer: read the input, put the original, insert the row
    QUEUE_WAIT = "queue_wait"  # row created -> a worker starts it
    PREPROCESS = "preprocess"  # fetch the original, decode, orient, resize (CPU pool)
    INFERENCE = "inference"  # the engine's share of the micro-batch
    POSTPROCESS = "postprocess"  # map boxes back, reading order, clean-up
    STORE = "store"  # draw the annotated image, write objects and rows


STAGES: tuple[Stage, ...] = tuple(Stage)


# A tenant's or an ingest's weight in its lane's fair share (1: an equal share): a finite number within these
# bounds, checked by ``Weight`` in a model and by ``check_weight`` anywhere else.
MIN_WEIGHT, MAX_WEIGHT = 0.001, 1000.0
Weight = Annotated[float, Field(ge=MIN_WEIGHT, le=MAX_WEIGHT, allow_inf_nan=False)]
_WEIGHT: TypeAdapter[float] = TypeAdapter(Weight)


def check_weight(value: float | None, *, whose: str = "a") -> float:
    """``value`` when it is a weight; raises UsageError saying the bounds when it is not (None included)."""
    try:
        return _WEIGHT.validate_python(value)
    except ValidationError:
        raise UsageError(f"{whose} weight is between {MIN_WEIGHT:g} and {MAX_WEIGHT:g}, got {value}") from None


class OutputFormat(str, Enum):
    """What a page or document can be written as."""

    JSON = "json"  # the result itself
    MD = "md"  # the text or markdown in reading order
    PDF = "pdf"  # the page images with an invisible text layer
    ALTO = "alto"  # ALTO 4.4 XML: the library standard
    PAGE = "page"  # PAGE XML 2019-07-15: OCR research and transcription tools
    HOCR = "hocr"  # hOCR 1.2 (XHTML): Tesseract's and OCRmyPDF's format
    METS = "mets"  # METS: a document's page images, ALTO and PAGE files in page order


class TaskSpec(BaseModel):
    """What to do with a page: the task and its options."""

    model_config = ConfigDict(frozen=True)

    task: Task = Task.SPOTTING
    fields: tuple[str, ...] = ()
    target_language: str = "English"

    @model_validator(mode="after")
    def _fields_need_keys(self) -> TaskSpec:
        if self.task is Task.FIELDS and not self.fields:
            raise ValueError("the fields task needs at least one key (--field NAME)")
        return self

    def cache_key(self) -> str:
        """A stable string naming the task and the options that change its output."""
        parts = [self.task.value]
        if self.task is Task.FIELDS:
            parts.append(",".join(self.fields))
        if self.task is Task.TRANSLATE:
            parts.append(self.target_language)
        return ":".join(parts)


Point = tuple[float, float]


class Word(BaseModel):
    """One word of a line (a run of text between spaces): its text, confidence and four corners.

    ``quad`` is clockwise from the top-left corner, in pixels of the ORIGINAL page image.
    ``estimated``: the engine gave the line's box only, and this one was laid out along it by
    character widths.
    """

    text: str
    quad: list[Point]
    confidence: float | None = None
    estimated: bool = False


class Line(BaseModel):
    """One recognised line: its text, the engine's confidence, its four corners.

    ``quad`` is clockwise from the top-left corner, in pixels of the ORIGINAL page image.
    Engines that give no confidence (VLMs) leave it ``None``. ``words`` are the line's words in
    order (their texts joined by single spaces give the line's text, whitespace folded); ``None``
    in results stored before words existed and for lines without a box. ``block`` is the index in
    ``PageResult.blocks`` of the block the line belongs to.
    """

    text: str
    confidence: float | None = None
    quad: list[Point] | None = None
    words: list[Word] | None = None
    block: int | None = None


class BlockKind(str, Enum):
    """What a block of lines is on its page (the PAGE XML region types of the same names)."""

    PARAGRAPH = "paragraph"
    HEADING = "heading"
    HEADER = "header"  # a running head in the page's top margin
    FOOTER = "footer"  # a running foot or page number in the bottom margin
    TABLE = "table"
    CAPTION = "caption"  # a figure's or a table's, beside it (found by a layout model)
    PAGE_NUMBER = "page-number"  # a running foot that is only a number
    OTHER = "other"  # text in a figure or a formula (found by a layout model)


class Block(BaseModel):
    """A run of lines read together (a paragraph of a column, a header, a table), in reading order.

    ``quad`` is the box around its lines, clockwise from the top-left corner, in ORIGINAL pixels.
    """

    kind: BlockKind = BlockKind.PARAGRAPH
    quad: list[Point] | None = None


class EngineInfo(BaseModel):
    name: str
    version: str
    model: str | None = None
    fallback_for: str | None = Field(None, description="this engine read the page because the named engine's "
                                     "answers kept degenerating (a fallback result: review it)")


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = Field(0, description="tokens of the answer given")
    engine_calls: int = Field(1, description="requests sent to the engine for this page (a degenerate answer "
                                             "stopped and tried again is two)")
    abandoned_tokens: int = Field(0, description="tokens the engine decoded for answers stopped as degenerate")


class QualityFlag(str, Enum):
    """Why a page's result may need a person's eyes (``Quality.flags``)."""

    LOOP_STOPPED = "loop_stopped"  # the answer given was stopped mid-stream: it degenerated (repeats, overlong)
    RETRIED = "retried"  # an answer degenerated and the page was decoded again (alone: the retry was clean)
    FALLBACK = "fallback"  # the text is the embedded engine's: the model's answers kept degenerating
    TRUNCATED = "truncated"  # the answer hit the token limit
    EMPTY = "empty"  # nothing was read
    LOW_CONFIDENCE = "low_confidence"  # confidence under engine.min_confidence
    VERTICAL_TEXT = "vertical_text"  # most lines run top to bottom (vertical CJK): their reading order is not handled


class Quality(BaseModel):
    """How far a page's result can be trusted."""

    confidence: float | None = Field(None, ge=0, le=1, description="0..1: the geometric mean probability of the "
                                     "answer's tokens (VLM engines that return log-probabilities), the line scores "
                                     "weighted by length (RapidOCR); null when the engine gives none")
    flags: list[QualityFlag] = Field(default_factory=list)
    needs_review: bool = Field(False, description="any flag but `retried`: the result is incomplete, a fallback, "
                                                  "empty or unsure")

    @classmethod
    def grade(cls, flags: set[QualityFlag], confidence: float | None) -> Quality:
        """The quality of a result with these ``flags`` and ``confidence``: ``needs_review`` follows the flags."""
        ordered = [flag for flag in QualityFlag if flag in flags]
        return cls(confidence=None if confidence is None else round(confidence, 4), flags=ordered,
                   needs_review=any(flag is not QualityFlag.RETRIED for flag in ordered))


class PageResult(BaseModel):
    """The structured result of one page, success or failure."""

    job_id: str
    source: str
    page: int = Field(1, description="1-based page number inside the source file")
    status: JobStatus
    error: str | None = None
    task: Task = Task.SPOTTING
    text: str = ""
    lines: list[Line] = Field(default_factory=list)
    blocks: list[Block] = Field(default_factory=list, description="blocks in reading order; lines point into it")
    markdown: str | None = None
    fields: dict[str, Any] | None = None
    missing_fields: list[str] = Field(default_factory=list)
    truncated: bool = Field(False, description="the engine stopped at its token limit: the output is incomplete")
    width: int | None = None
    height: int | None = None
    engine: EngineInfo | None = None
    usage: Usage | None = None
    quality: Quality | None = Field(None, description="confidence, flags and whether a person should review "
                                                      "the page (set on every succeeded page)")
    timings: dict[str, float] = Field(default_factory=dict, description="seconds per stage")
