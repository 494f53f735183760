"""What the simulated HunyuanOCR says: the task a prompt asks for, and its answer for a page.

Every profile's prompts (``paperlane.models.profiles``) are recognised, so an answer is in the format
paperlane asked for: ``text(x1,y1),(x2,y2)`` spotting for HunyuanOCR 1.0, a JSON array of
``{"box", "text"}`` for 1.5 and the generic profile, markdown for parse, HTML for a table, LaTeX for a
formula, Mermaid for a chart, JSON for fields, plain text otherwise. The text is a function of the page
(its seed), so the same page always reads the same. An answer is built from pieces (items, lines, rows),
which is also where a looping answer starts repeating.
"""

from __future__ import annotations

import ast
import json
import random
from dataclasses import dataclass

from paperlane.models.profiles import PROFILES
from paperlane.schemas import Task
from tests.pages import WORDS
from tests.sim_shape import PageDraw

NORM = 1000  # spotting boxes are normalised to 0..1000 of the image
CHARS_PER_TOKEN = 3  # coordinates and short English words: about 3 characters per token
EMPTY_ROW = "<tr><td></td><td></td><td></td></tr>"


@dataclass(frozen=True)
class Prompt:
    task: Task
    json_spotting: bool = False  # the 1.5 and generic profiles ask for a JSON array of boxes
    fields: tuple[str, ...] = ()


_PLACEHOLDERS = ("{fields}", "{target_language}")


def _known_prompts() -> list[tuple[str, bool, Prompt]]:
    """(text, whole prompt or prefix, what it asks) for every profile's prompts."""
    known = []
    for profile in PROFILES.values():
        json_spotting = "JSON" in profile.prompts.spotting
        for task, template in profile.prompts.templates():
            placeholder = next((p for p in _PLACEHOLDERS if p in template), None)
            text = template.split(placeholder)[0] if placeholder else template
            known.append((text, placeholder is None, Prompt(task, json_spotting and task is Task.SPOTTING)))
    return known


_PROMPTS = _known_prompts()


def read_prompt(text: str) -> Prompt:
    """The task a prompt asks for (plain text when the prompt is not one of paperlane's)."""
    for known, whole, prompt in _PROMPTS:
        if (text == known) if whole else text.startswith(known):
            if prompt.task is Task.FIELDS:
                return Prompt(Task.FIELDS, fields=_field_keys(text))
            return prompt
    return Prompt(Task.TEXT)


def _field_keys(prompt: str) -> tuple[str, ...]:
    start, end = prompt.find("["), prompt.find("]")
    try:
        keys = ast.literal_eval(prompt[start : end + 1])
    except (ValueError, SyntaxError):
        return ()
    return tuple(str(k) for k in keys) if isinstance(keys, list) else ()


def page_lines(seed: str, n: int) -> list[str]:
    """``n`` lines of invoice-like English, always the same for the same ``seed``."""
    rnd = random.Random(seed)
    lines = []
    for _ in range(n):
        words = [rnd.choice(WORDS) for _ in range(rnd.randint(4, 9))]
        number = f" {rnd.randint(1, 9999)}" if rnd.random() < 0.4 else ""
        lines.append(" ".join([words[0].capitalize(), *words[1:]]) + number)
    return lines


def answer(prompt: Prompt, seed: str, *, tokens: int | None = None) -> str:
    """HunyuanOCR's answer to ``prompt`` on the page identified by ``seed``: ~40 lines, or about ``tokens``."""
    return "".join(answer_pieces(prompt, seed, tokens=tokens))


def answer_pieces(prompt: Prompt, seed: str, *, tokens: int | None = None) -> list[str]:
    """The answer in pieces (items, lines, rows) whose concatenation is the answer."""
    rnd = random.Random(seed)
    n = rnd.randint(36, 44)
    if tokens is not None:  # scale the line count to the length wanted, once
        n = max(1, round(n * tokens * CHARS_PER_TOKEN / max(1, len("".join(_pieces(prompt, seed, n))))))
    return _pieces(prompt, seed, n)


def _pieces(prompt: Prompt, seed: str, n: int) -> list[str]:
    rnd = random.Random(seed + ":pieces")
    lines = page_lines(seed, n)
    task = prompt.task
    if task is Task.SPOTTING:
        return _spotting(lines, rnd, json_format=prompt.json_spotting)
    if task is Task.PARSE:
        table = "".join(f"<tr><td>{ln.split()[0]}</td><td>{rnd.randint(1, 999)}.{rnd.randint(0, 99):02d}</td></tr>"
                        for ln in lines[:5])
        body = [" ".join(lines[i : i + 4]) + "\n\n" for i in range(5, len(lines), 4)]
        return [f"# {lines[0]}\n\n", *body, f"<table>{table}</table>"]
    if task is Task.TABLE:
        rows = [f"<tr><td>{ln.split()[0]}</td><td>{rnd.randint(1, 999)}.{rnd.randint(0, 99):02d}</td>"
                f"<td>{rnd.randint(1, 99)}</td></tr>" for ln in lines]
        return ["<table>", *rows, "</table>"]
    if task is Task.FORMULA:
        terms = [f"\\frac{{a_{{{i}}}}}{{{rnd.randint(2, 9)}}}" for i in range(max(1, n // 4))]
        return ["$$\n", " + ".join(terms), " = 1\n$$"]
    if task is Task.CHART:
        steps = [f"    S{i}[{ln.split()[0]}] --> S{i + 1}[{ln.split()[-1]}]\n" for i, ln in enumerate(lines)]
        return ["```mermaid\ngraph TD\n", *steps, "```"]
    if task is Task.FIELDS:
        values = {key: lines[i % len(lines)].split(" ", 2)[-1] for i, key in enumerate(prompt.fields)}
        return ["```json\n", json.dumps(values, ensure_ascii=False), "\n```"]
    return [line + "\n" for line in lines[:-1]] + lines[-1:]


def _spotting(lines: list[str], rnd: random.Random, *, json_format: bool) -> list[str]:
    step = max(3, (NORM - 80) // len(lines))
    items = []
    for i, text in enumerate(lines):
        x1, y1 = 55 + rnd.randint(0, 15), min(NORM - 20, 40 + i * step)
        box = (x1, y1, min(NORM - 30, x1 + 14 * len(text) + rnd.randint(0, 20)), min(NORM, y1 + step * 2 // 3))
        items.append((text, box))
    if json_format:
        objs = [json.dumps({"box": list(box), "text": text}, ensure_ascii=False) for text, box in items]
        return ["[", *[o + ", " for o in objs[:-1]], objs[-1] + "]"]
    return [f"{text}({x1},{y1}),({x2},{y2})" for text, (x1, y1, x2, y2) in items]


def loop_answer(prompt: Prompt, pieces: list[str], draw: PageDraw, *, chars: int) -> tuple[str, int]:
    """The answer of a model that falls into a loop part-way through ``pieces``, ``chars`` long; and where
    the loop starts (characters). What repeats depends on the task and the draw: the last item or line
    (most loops), an empty table row (markup), a phrase, or a number inside a field's value."""
    task, kind = prompt.task, draw.loop_kind
    first = 2 if task is Task.SPOTTING and prompt.json_spotting else 1  # past the JSON array's "["
    k = max(first, min(len(pieces) - 1, int(draw.loop_at * len(pieces))))
    prefix, last = "".join(pieces[:k]), pieces[k - 1]
    if task is Task.FIELDS:
        key = prompt.fields[0] if prompt.fields else "value"
        prefix, unit = '```json\n{"' + key + '": "', "0.00 "
    elif task in (Task.PARSE, Task.TABLE) and kind >= 2:
        prefix, unit = prefix + "<table><tr><th>Item</th><th>Price</th><th>Qty</th></tr>", EMPTY_ROW
    elif task in (Task.TEXT, Task.TRANSLATE) and kind == 3:
        unit = "the customer account "
    elif task is Task.SPOTTING and prompt.json_spotting:
        unit = last if last.endswith(", ") else last.rstrip("]") + ", "
    else:
        unit = last if task is not Task.PARSE else last.rstrip("\n") + "\n\n"
    body = prefix + unit * (1 + max(0, chars - len(prefix)) // max(1, len(unit)))
    return body[:chars], len(prefix)
