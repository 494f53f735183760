"""Model profiles: how to talk to one family of OCR vision-language models, and how to read its answers.

A profile is pure data plus pure functions (no network, no torch), shared by every backend that serves
such a model (the vLLM server client, in-process vLLM): which image size it wants, the prompt and chat
messages for each task, the sampling settings, and the parser that turns the raw answer into an
``EngineOutput``.

    get_profile("hunyuanocr-1.0")   the default; Tencent HunyuanOCR 1.0
    get_profile("hunyuanocr-1.5")   HunyuanOCR 1.5: stronger repetition penalty and clean-up
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
from paperlane.schemas import Line, Point, Stage, Task, TaskSpec

DEFAULT_PROFILE = "hunyuanocr-1.0"
_REPEATS = 10  # a tail unit repeated this many times back to back is degenerate decoding
_NORM = 1000.0  # boxes are normalised to 0..1000


@dataclass(frozen=True)
class Prompts:
    """One prompt per task; ``{fields}`` and ``{target_language}`` are filled in from the ``TaskSpec``."""

    spotting: str
    parse: str
    text: str
    fields: str
    translate: str

    def for_task(self, spec: TaskSpec) -> str:
        """The prompt for ``spec``, with the caller's keys or target language substituted."""
        if spec.task is Task.FIELDS:
            keys = "[" + ",".join(repr(key) for key in spec.fields) + "]"
            return self.fields.replace("{fields}", keys)
        if spec.task is Task.TRANSLATE:
            return self.translate.replace("{target_language}", spec.target_language)
        return str(getattr(self, spec.task.value))


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

    def sampling(self, spec: TaskSpec, *, max_tokens: int) -> dict[str, float | int]:
        """Greedy decoding settings, usable as vLLM ``SamplingParams(**d)`` or an OpenAI request's body."""
        return {
            "temperature": 0.0,
            "top_k": 1,
            "repetition_penalty": self.repetition_penalty,
            "max_tokens": max_tokens,
        }

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
            out = EngineOutput(text=markdown_to_text(markdown), markdown=markdown)
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
        Profile(
            "hunyuanocr-1.5", _HUNYUAN_PROMPTS, _HUNYUAN_IMAGE, repetition_penalty=1.08, clean_min_chars=2000
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
