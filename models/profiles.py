"""Model profiles: how to talk to one family of OCR vision-language models, and how to read its answers.

A profile is pure data plus pure functions (no network, no torch), shared by every backend that serves
such a model (the vLLM server client, in-process vLLM): which image size it wants, the prompt and chat
messages for each task, the sampling settings, and the parser that turns the raw answer into an
``EngineOutput``.

    get_profile("hunyuanocr-1.0")   the default; Tencent HunyuanOCR 1.0, its English prompts
    get_profile("hunyuanocr-1.5")   HunyuanOCR 1.5 as its authors serve it: their locked (Chinese) prompt per
                                    task, JSON spotting, repetition penalty 1.08, doc-parse markdown normalised
    get_profile("generic")          other OCR VLMs (Qwen2-VL and kin): plain English prompts

Spotting answers are read in either wire format, whatever the profile:
``text(x1,y1),(x2,y2)...`` (HunyuanOCR) or a JSON array of ``{"box": [xmin, ymin, xmax, ymax], "text": ...}``,
both with coordinates normalised to 0..1000 of the image that was sent. Parsing a spotting answer never
raises: malformed items are skipped, coordinates clamped, swapped corners put in order.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from paperlane.errors import EngineOutputError, UsageError
from paperlane.models.engine import EngineOutput, InputSpec
from paperlane.models.hunyuan_markdown import normalise_doc_parse
from paperlane.schemas import Line, Point, Stage, Task, TaskSpec

DEFAULT_PROFILE = "hunyuanocr-1.0"
_REPEATS = 10  # a tail unit repeated this many times back to back is degenerate decoding
_NORM = 1000.0  # boxes are normalised to 0..1000


@dataclass(frozen=True)
class Prompts:
    """One prompt per task; ``{fields}`` and ``{target_language}`` are filled in from the ``TaskSpec``.

    ``translate_to``: fixed prompts for some target languages (their names, casefolded), used instead of
    the ``translate`` template.
    """

    spotting: str
    parse: str
    text: str
    fields: str
    translate: str
    table: str
    formula: str
    chart: str
    translate_to: tuple[tuple[tuple[str, ...], str], ...] = ()

    def for_task(self, spec: TaskSpec) -> str:
        """The prompt for ``spec``, with the caller's keys or target language substituted."""
        if spec.task is Task.FIELDS:
            keys = "[" + ",".join(repr(key) for key in spec.fields) + "]"
            return self.fields.replace("{fields}", keys)
        if spec.task is Task.TRANSLATE:
            language = spec.target_language.strip().casefold()
            fixed = next((prompt for names, prompt in self.translate_to if language in names), None)
            return fixed or self.translate.replace("{target_language}", spec.target_language)
        return str(getattr(self, spec.task.value))

    def templates(self) -> list[tuple[Task, str]]:
        """Every prompt this set sends, by task; templates keep their ``{fields}``/``{target_language}``."""
        found = [(task, str(getattr(self, task.value))) for task in Task]
        return found + [(Task.TRANSLATE, prompt) for _, prompt in self.translate_to]


@dataclass(frozen=True)
class Profile:
    """How to prompt one model family and how to read its answers."""

    name: str
    prompts: Prompts
    image: InputSpec
    repetition_penalty: float
    clean_min_chars: int  # the repetition clean-up only looks at answers at least this long
    system_message: bool = True  # HunyuanOCR needs an empty system message
    lines_from_text: bool = False  # spotting without boxes: one box-less line per text line
    top_k: int = 1  # greedy: 1, or -1 (off) where the model's authors send that with temperature 0
    top_p: float | None = None
    skip_special_tokens: bool = False  # sent explicitly (vLLM's default is True anyway)
    normalise_markdown: bool = False  # parse answers get the official doc-parse normalisation

    def input_spec(self) -> InputSpec:
        """The size and encoding the model wants its pages in."""
        return self.image

    def prompt(self, spec: TaskSpec) -> str:
        """The text prompt for ``spec``'s task."""
        return self.prompts.for_task(spec)

    def messages(self, spec: TaskSpec, image_url: str | None = None) -> list[dict[str, Any]]:
        """Chat messages asking for ``spec`` on the image at ``image_url`` (often a data URL).

        Without ``image_url`` the image part is a bare ``{"type": "image"}`` placeholder, as the
        model's own chat template expects when the image is passed beside the prompt (in-process
        vLLM, transformers).
        """
        image = {"type": "image_url", "image_url": {"url": image_url}} if image_url else {"type": "image"}
        user = {"role": "user", "content": [image, {"type": "text", "text": self.prompt(spec)}]}
        return [{"role": "system", "content": ""}, user] if self.system_message else [user]

    def sampling(self, spec: TaskSpec, *, max_tokens: int, repetition_penalty: float | None = None,
                 temperature: float = 0.0) -> dict[str, float | int | bool]:
        """Decoding settings, usable as vLLM ``SamplingParams(**d)`` or an OpenAI request's body: greedy, with
        the profile's repetition penalty, unless a retry asks for a stronger penalty or a temperature
        (which also lifts ``top_k``)."""
        out: dict[str, float | int | bool] = {
            "temperature": temperature,
            "top_k": self.top_k if temperature == 0 else -1,
            "repetition_penalty": self.repetition_penalty if repetition_penalty is None else repetition_penalty,
            "max_tokens": max_tokens,
        }
        if self.top_p is not None:
            out["top_p"] = self.top_p
        if self.skip_special_tokens:
            out["skip_special_tokens"] = True
        return out

    def parse(
        self,
        raw: str,
        spec: TaskSpec,
        *,
        image_width: int,
        image_height: int,
        finish_reason: str | None,
    ) -> EngineOutput:
        """Read the model's answer to ``spec`` on an image of ``image_width`` x ``image_height`` pixels.

        Quads are in pixels of that image. ``truncated`` is set when the model hit its token limit.
        Raises ``EngineOutputError`` only for a fields answer that holds no JSON object.
        """
        truncated = finish_reason == "length"
        answer = clean_repetition(raw, min_chars=self.clean_min_chars)
        if spec.task is Task.SPOTTING:
            lines = parse_spotting(answer, width=image_width, height=image_height)
            if not lines and self.lines_from_text:
                lines = [Line(text=t.strip()) for t in strip_fence(answer).splitlines() if t.strip()]
            out = EngineOutput(text="\n".join(line.text for line in lines), lines=lines)
        elif spec.task is Task.PARSE:
            markdown = strip_fence(answer)
            markdown = normalise_doc_parse(markdown) if self.normalise_markdown else markdown
            out = EngineOutput(text=markdown_to_text(markdown), markdown=markdown)
        elif spec.task is Task.TABLE:
            table = strip_fence(answer)
            out = EngineOutput(text=markdown_to_text(table), markdown=table)
        elif spec.task is Task.FORMULA:
            latex = formula_latex(answer)
            out = EngineOutput(text=latex, markdown=f"$$\n{latex}\n$$" if latex else "")
        elif spec.task is Task.CHART:
            chart = answer.strip()  # a Mermaid flowchart keeps its ```mermaid fence: that is its markdown
            out = EngineOutput(text=markdown_to_text(strip_fence(chart)), markdown=chart)
        elif spec.task is Task.FIELDS:
            fields, missing = parse_fields(answer, spec.fields, truncated=truncated)
            out = EngineOutput(fields=fields, missing_fields=missing)
        else:
            out = EngineOutput(text=strip_fence(answer))
        out.truncated = truncated
        out.raw = raw
        return out


# --- clean-up --------------------------------------------------------------------------------


def clean_repetition(text: str, *, min_chars: int, min_repeats: int = _REPEATS) -> str:
    """``text`` with a tail unit repeated ``min_repeats``+ times back to back cut to one copy.

    The official HunyuanOCR clean-up: only answers of at least ``min_chars`` characters are touched,
    and the shortest repeating unit (2 characters or more) wins.
    """
    n = len(text)
    if n < min_chars:
        return text
    for size in range(2, n // min_repeats + 1):
        unit = text[-size:]
        start, count = n - size, 1  # start of the earliest copy found so far
        while start >= size and text[start - size : start] == unit:
            start, count = start - size, count + 1
        if count >= min_repeats:
            return text[: start + size]
    return text


def strip_fence(text: str) -> str:
    """``text`` stripped, unwrapped when it is one fenced code block (```lang ... ```)."""
    match = _FENCE.fullmatch(text.strip())
    return (match.group(1) if match else text).strip()


_FENCE = re.compile(r"```[\w-]*[ \t]*\n(.*?)\n?```", re.DOTALL)


_MATH_DELIMITERS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))


def formula_latex(answer: str) -> str:
    """The LaTeX of a formula answer: unfenced, without its outer math delimiters (``$$``, ``\\[``, ``$``)."""
    latex = strip_fence(answer)
    for start, end in _MATH_DELIMITERS:
        if latex.startswith(start) and latex.endswith(end) and len(latex) >= len(start) + len(end):
            return latex[len(start) : len(latex) - len(end)].strip()
    return latex


# --- spotting --------------------------------------------------------------------------------

_NUM = r"\s*(-?\d+(?:\.\d+)?)\s*"
_HUNYUAN_BOX = re.compile(rf"\({_NUM},{_NUM}\)\s*,\s*\({_NUM},{_NUM}\)")
_HAS_TEXT = re.compile(r"[^\s(),]")
_OBJECT_START = re.compile(r"\{")
_DECODER = json.JSONDecoder()


def parse_spotting(answer: str, *, width: int, height: int) -> list[Line]:
    """Lines with quads in pixels of a ``width`` x ``height`` image, from either spotting format.

    The JSON format wins when the answer holds at least one valid JSON item. Never raises.
    """
    items = _json_spotting(answer) or _hunyuan_spotting(answer)
    lines = []
    for text, box in items:
        quad = box_to_quad(box, width=width, height=height)
        if text and quad is not None:
            lines.append(Line(text=text, quad=quad))
    return lines


def box_to_quad(box: Sequence[float], *, width: int, height: int) -> list[Point] | None:
    """The four corners, clockwise from top-left, in pixels, of a 0..1000 box; ``None`` if not finite.

    Coordinates are clamped to 0..1000 and swapped corners are put in order.
    """
    if len(box) != 4 or not all(math.isfinite(v) for v in box):
        return None
    x1, y1, x2, y2 = (min(max(v, 0.0), _NORM) for v in box)
    left, right = (round(v * width / _NORM, 1) for v in sorted((x1, x2)))
    top, bottom = (round(v * height / _NORM, 1) for v in sorted((y1, y2)))
    return [(left, top), (right, top), (right, bottom), (left, bottom)]


def _hunyuan_spotting(answer: str) -> list[tuple[str, list[float]]]:
    """``text(x1,y1),(x2,y2)`` items; each text runs back to the end of the previous box."""
    items = []
    last = 0
    for match in _HUNYUAN_BOX.finditer(answer):
        text, last = answer[last : match.start()].strip(), match.end()
        if _HAS_TEXT.search(text):  # a gap of bare punctuation is a stray extra box, not an item
            items.append((text, [float(g) for g in match.groups()]))
    return items


def _json_spotting(answer: str) -> list[tuple[str, list[float]]]:
    """``{"box": [...], "text": ...}`` items (``bbox`` accepted too), wherever they stand in the answer."""
    items = []
    for _, obj in _json_objects(answer):
        box, text = obj.get("box", obj.get("bbox")), obj.get("text")
        if isinstance(box, list) and len(box) == 4 and all(_is_number(v) for v in box) and text is not None:
            items.append((str(text).strip(), [float(v) for v in box]))
    return items


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _json_objects(text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Every complete JSON object in ``text`` with its offset, left to right, skipping broken ones."""
    pos = 0
    while (match := _OBJECT_START.search(text, pos)) is not None:
        try:
            obj, end = _DECODER.raw_decode(text, match.start())
        except (ValueError, RecursionError):  # ValueError covers JSONDecodeError and huge integers
            pos = match.start() + 1
            continue
        if isinstance(obj, dict):
            yield match.start(), obj
        pos = end


# --- fields ----------------------------------------------------------------------------------


def parse_fields(
    answer: str, keys: Sequence[str], *, truncated: bool = False
) -> tuple[dict[str, object], list[str]]:
    """The answer's JSON object, and the requested ``keys`` it leaves absent or null.

    The object is the one at the answer's first brace or, past prose that holds braces, the first
    one with a requested key (never an inner object of a broken one). Keys that differ from a
    requested one only by case or surrounding spaces take the requested spelling. Raises
    ``EngineOutputError`` when there is no such object.
    """
    first = answer.find("{")
    for start, obj in _json_objects(answer):
        fields = _align_keys(obj, keys)
        if start == first or any(key in fields for key in keys):
            return fields, [key for key in keys if fields.get(key) is None]
    reason = "was cut off at the token limit before its JSON closed" if truncated else "holds no JSON object"
    raise EngineOutputError(f"the model's fields answer {reason}", stage=Stage.INFERENCE.value)


def _align_keys(found: dict[str, Any], keys: Sequence[str]) -> dict[str, object]:
    wanted = {key.strip().casefold(): key for key in keys}
    fields: dict[str, object] = {}
    for key, value in found.items():
        fields[key if key in keys else wanted.get(key.strip().casefold(), key)] = value
    return fields


# --- parse -----------------------------------------------------------------------------------

_CELL_END = re.compile(r"[ \t]*</t[dh]>[ \t]*", re.IGNORECASE)
_ROW_END = re.compile(r"\s*</tr>\s*|<br\s*/?>", re.IGNORECASE)
_TAG = re.compile(r"<[^<>\n]+>")
_HEADING = re.compile(r"^#{1,6}[ \t]+", re.MULTILINE)
_BLANK_LINES = re.compile(r"\n{3,}")


def markdown_to_text(markdown: str) -> str:
    """Plain text of a parsed page: HTML tables as tab-separated rows, tags and heading marks dropped."""
    text = _ROW_END.sub("\n", _CELL_END.sub("\t", markdown))
    text = html.unescape(_HEADING.sub("", _TAG.sub("", text)))
    text = "\n".join(line.rstrip() for line in text.splitlines())
    return _BLANK_LINES.sub("\n\n", text).strip()


# --- the profiles ----------------------------------------------------------------------------

_HUNYUAN_PROMPTS = Prompts(
    spotting="Detect and recognize text in the image, and output the text coordinates in a formatted manner.",
    parse=(
        "Extract all information from the main body of the document image and represent it in markdown format, "
        "ignoring headers and footers. Tables should be expressed in HTML format, formulas in the document "
        "should be represented using LaTeX format, and the parsing should be organized according to the "
        "reading order."
    ),
    text="Extract the text in the image.",
    fields="Extract the content of the fields: {fields} from the image and return it in JSON format.",
    translate=(
        "First extract the text, then translate the text content into {target_language}. If it is a document, "
        "ignore the header and footer. Formulas should be represented in LaTeX format, and tables should be "
        "represented in HTML format."
    ),
    table="Parse the table in the image into HTML.",
    formula="Identify the formula in the image and represent it using LaTeX format.",
    chart="Parse the chart in the image; use Mermaid format for flowcharts and Markdown for other charts.",
)

# HunyuanOCR 1.5's official prompts, one per task type, locked by its authors (hand-edited instructions were
# seen to degrade quality silently). Exact strings from Tencent-Hunyuan/HunyuanOCR inference/utils/tasks.py
# (TASK_PROMPTS): doc_parse, spotting_json, structured_parse, table, formula, chart_parse, trans_other2en,
# trans_other2zh. 1.5 has no information-extraction prompt: fields use 1.0's Chinese one (the repository
# README's "Information Extraction" row), and translating into another language 1.0's English template.
_HUNYUAN_15_PROMPTS = Prompts(
    spotting=(
        "检测并识别图中所有的文字行，请按从上到下、从左到右的阅读顺序进行识别。 "
        "输出格式为 JSON 数组，每个元素必须包含："
        '"box": [xmin, ymin, xmax, ymax]（坐标需归一化到 [0, 1000] 范围内）；'
        '"text": "识别出的文字内容"。 '
        "注意：请直接输出 JSON 数组，不要包含任何多余的描述性文字。"
    ),
    parse=(
        "提取文档图片中正文的所有信息用markdown格式表示，其中页眉、页脚部分忽略，表格用html格式表达，"
        "文档中公式用latex格式表示，按照阅读顺序组织进行解析。"
    ),
    text="提取图中的文字。",
    fields="提取图片中的: {fields} 的字段内容，并按照 JSON 格式返回。",
    translate=_HUNYUAN_PROMPTS.translate,
    table="把图中的表格解析为HTML。",
    formula="识别图片中的公式，用LaTeX格式表示。",
    chart="解析图中的图表，对于流程图使用Mermaid格式表示，其他图表使用Markdown格式表示。",
    translate_to=(
        (("english", "en"),
         "按照阅读顺序，提取图中文字，公式用latex格式表示，表格用markdown格式表示，再将文字内容翻译为英文。"),
        (("chinese", "zh", "中文", "simplified chinese"),
         "按照阅读顺序，提取图中文字，公式用latex格式表示，表格用markdown格式表示，再将文字内容翻译为中文。"),
    ),
)

_GENERIC_PROMPTS = Prompts(
    spotting=(
        "Detect and recognize every line of text in the image, in reading order. Output only a JSON array; "
        'each element is {"box": [xmin, ymin, xmax, ymax], "text": "the line\'s text"}, with the box '
        "coordinates normalised to the range 0 to 1000 of the image width and height."
    ),
    parse=(
        "Convert the document image to markdown in reading order, ignoring page headers and footers. "
        "Write tables in HTML and formulas in LaTeX. Output only the markdown."
    ),
    text="Extract all the text in the image in reading order. Output only the text.",
    fields=(
        "Extract the values of the fields {fields} from the image. Output only one JSON object whose keys "
        "are exactly these field names; use null for a field that is not in the image."
    ),
    translate=(
        "Extract the text in the image, then translate it into {target_language}. "
        "Output only the translation."
    ),
    table="Convert the table in the image to an HTML table. Output only the HTML.",
    formula="Write the formula in the image in LaTeX. Output only the LaTeX.",
    chart=(
        "Transcribe the chart in the image: a flowchart as a Mermaid diagram, any other chart as a markdown "
        "table of its data. Output only that."
    ),
)

_HUNYUAN_IMAGE = InputSpec(
    encoding="jpeg", max_side=2048, max_pixels=2048 * 2048, min_pixels=512 * 512, multiple_of=32
)

PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        Profile(
            "hunyuanocr-1.0", _HUNYUAN_PROMPTS, _HUNYUAN_IMAGE, repetition_penalty=1.0, clean_min_chars=8000
        ),
        # As the official 1.5 client sends it (inference/vLLM/infer_vllm_client.py): temperature 0, top_p 1,
        # top_k -1, repetition_penalty 1.08, skip_special_tokens; its output clean-up from 2,000 characters.
        Profile(
            "hunyuanocr-1.5", _HUNYUAN_15_PROMPTS, _HUNYUAN_IMAGE, repetition_penalty=1.08, clean_min_chars=2000,
            top_k=-1, top_p=1.0, skip_special_tokens=True, normalise_markdown=True,
        ),
        Profile(
            "generic",
            _GENERIC_PROMPTS,
            InputSpec(encoding="jpeg", max_side=1600, multiple_of=28),
            repetition_penalty=1.05,
            clean_min_chars=2000,
            system_message=False,
            lines_from_text=True,
        ),
    )
}


def get_profile(name: str = DEFAULT_PROFILE) -> Profile:
    """The profile called ``name`` (case-insensitive). Raises ``UsageError`` naming the known ones."""
    profile = PROFILES.get(name.strip().lower())
    if profile is None:
        raise UsageError(f"unknown model profile {name!r}; known profiles: {', '.join(PROFILES)}")
    return profile
