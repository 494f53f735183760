"""HunyuanOCR 1.5's normalisation of document-parse markdown, as its official client applies it.

The 1.5 client (Tencent-Hunyuan/HunyuanOCR ``inference/utils/output_utils.py``,
``normalize_doc_parse_markdown``) rewrites a ``doc_parse`` answer towards OmniDocBench's ground-truth
conventions with ten conservative rewrites, for that task only. The same ten, in the same order, written
here from their description and behaviour:

  U  layout coordinates ``(x1,y1),(x2,y2)`` at the end of a text line are dropped (a line of nothing
     else goes), never inside a table line or a formula;
  T  a table's ``<caption>`` moves out, before the table;
  E  a display formula that is one ``array{l}`` of paragraphs (rows apart by ``\\ \\``) becomes one display
     formula per paragraph;
  C  a display formula that is one ``aligned``/``align``/``split``/``cases``/``gather`` environment of
     independent rows (no ``&``, no row continuing the one before with ``=`` or an operator) becomes one
     ``\\[ \\]`` per row;
  C2 a display ``array`` whose ``&``-cells are all separate little equations (a worksheet) becomes one
     ``\\[ \\]`` per cell;
  D  unbalanced ``\\left``/``\\right`` in a display formula get ``\\right.``/``\\left.`` added;
  A  an inline formula alone on its line, 15 characters or longer or with a "real" command (``\\frac``,
     ``\\sum``, ...), becomes a display formula;
  W  a bare arithmetic line (digits and ``×÷+-=``, with ``=`` and an operator) becomes display formulas,
     one per drill when drills are apart by two spaces, ``×``/``÷`` as ``\\times``/``\\div``;
  F  equation numbers (``\\tag{}``, ``\\quad (1)``, a trailing `` (2.1)``) leave display formulas;
  V  a display formula loses a leading bare ``&`` and ``}`` it closes without opening.

Differences from the official client: none in what is rewritten. The answer reaches this function after
paperlane's own steps: the stream's degenerate tail was cut by the loop guard, the official repeated-tail
clean-up ran (``profiles.clean_repetition``, 1.5's thresholds), and one fenced code block around the whole
answer was unwrapped; the statistics the official function returns are not kept.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# Display formulas, in the order the official client visits them: $$..$$ first, then \[..\].
_DISPLAY = (re.compile(r"\$\$([\s\S]*?)\$\$"), re.compile(r"\\\[([\s\S]*?)\\\]"))
_DELIMS = (("$$", "$$"), ("\\[", "\\]"))


def normalise_doc_parse(text: str) -> str:
    """``text`` (a document-parse answer in markdown) with the ten rewrites applied, U T E C C2 D A W F V."""
    for rewrite in (_coords, _captions, _array_paragraphs, _independent_rows, _worksheet_cells, _left_right,
                    _inline_to_display, _bare_arithmetic, _equation_numbers, _repair_display):
        text = rewrite(text)
    return text


def _on_display(text: str, block: Callable[[str, int], str | None]) -> str:
    """Each display formula replaced by ``block(inner, kind)`` (kind 0: ``$$``, 1: ``\\[``), kept where None."""
    for kind, pattern in enumerate(_DISPLAY):
        text = pattern.sub(_keeping(block, kind), text)
    return text


def _keeping(block: Callable[[str, int], str | None], kind: int) -> Callable[[re.Match[str]], str]:
    def replace(m: re.Match[str]) -> str:
        new = block(m.group(1), kind)
        return m.group(0) if new is None else new

    return replace


def _on_inner(text: str, fix: Callable[[str], str]) -> str:
    """Each display formula's inside replaced by ``fix(inside)``, its delimiters kept."""
    return _on_display(text, lambda inner, kind: _DELIMS[kind][0] + fix(inner) + _DELIMS[kind][1])


def _blocks(parts: list[str], kind: int | None) -> str:
    """Parts as display formulas of ``kind`` (None: ``\\[ \\]``), a blank line around each."""
    if kind == 0:
        return "\n\n" + "\n\n".join(f"$$ {p} $$" for p in parts) + "\n\n"
    return "\n\n" + "\n\n".join(f"\\[ {p} \\]" for p in parts) + "\n\n"


# --- U: layout coordinates ------------------------------------------------------------------------------------

_COORD_PAIR = re.compile(r"\(\d{1,4},\d{1,4}\),\(\d{1,4},\d{1,4}\)")
_TRAILING_COORDS = re.compile(r"(?:[ \t,，]*\(\d{1,4},\d{1,4}\),\(\d{1,4},\d{1,4}\))+[ \t]*$")
_MATH_SPAN = re.compile(r"\$\$[\s\S]*?\$\$|\$[^$\n]+\$|\\\[[\s\S]*?\\\]")
_MASK = re.compile(r"\x00U(\d+)\x00")
_TABLE_TOKENS = ("<table", "<tr", "<td", "</td")


def _coords(text: str) -> str:
    spans: list[str] = []

    def mask(m: re.Match[str]) -> str:
        spans.append(m.group(0))
        return f"\x00U{len(spans) - 1}\x00"

    lines = []
    for line in _MATH_SPAN.sub(mask, text).split("\n"):
        kept = line
        if not any(token in line.lower() for token in _TABLE_TOKENS) and _COORD_PAIR.search(line):
            kept = _TRAILING_COORDS.sub("", line)
            if kept != line:
                kept = kept.rstrip()
                if not kept.strip():
                    continue  # a bare figure box: the line goes
        lines.append(kept)
    return _MASK.sub(lambda m: spans[int(m.group(1))], "\n".join(lines))


# --- T: table captions --------------------------------------------------------------------------------------

_CAPTIONED = re.compile(r"<table([^>]*)>\s*<caption[^>]*>([\s\S]*?)</caption>\s*([\s\S]*?)</table>", re.IGNORECASE)
_STRAY_CELL = re.compile(r"^<td>\s*(?=<tr>)", re.IGNORECASE)


def _captions(text: str) -> str:
    def move(m: re.Match[str]) -> str:
        caption = m.group(2).strip()
        if not caption:
            return m.group(0)
        body = _STRAY_CELL.sub("", m.group(3).strip())
        return f"{caption}\n\n<table{m.group(1) or ''}>{body}</table>"

    return _CAPTIONED.sub(move, text)


# --- E: array{l} of paragraphs ------------------------------------------------------------------------------

_ARRAY_L = re.compile(r"\\begin\{array\}\{l\}([\s\S]*?)\\end\{array\}")
_PARAGRAPH_BREAK = re.compile(r"\\\\\s*\\\\")


def _array_paragraphs(text: str) -> str:
    def split(inner: str, kind: int) -> str | None:
        m = _ARRAY_L.fullmatch(inner.strip())
        if not m or not _PARAGRAPH_BREAK.search(m.group(1)):
            return None
        parts = [p for p in (_unbrace(re.sub(r"\\\\$", "", p.strip()).strip())
                             for p in _PARAGRAPH_BREAK.split(m.group(1))) if p]
        return _blocks(parts, kind) if len(parts) >= 2 else None

    return _on_display(text, split)


def _unbrace(part: str) -> str:
    """``part`` without one pair of braces around all of it, when they are that pair."""
    if not (part.startswith("{") and part.endswith("}")):
        return part
    depth = 0
    for ch in part[1:-1]:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            return part
    return part[1:-1].strip() if depth == 0 else part


# --- C: environments of independent rows --------------------------------------------------------------------

_ROW_ENV = re.compile(r"\\begin\{(aligned|align\*|align|split|cases|gather|gathered)\}([\s\S]*?)\\end\{\1\}")
_ROW_BREAK = re.compile(r"\\\\(?:\s*\[[^\]]*\])?")
_CONTINUES = re.compile(r"^(&|=|\\approx|\+|-|\\geq|\\leq|\\le|\\ge|<|>|\\times|\\cdot|\\pm|\\mp|\\Rightarrow"
                        r"|\\rightarrow|\\to|\\equiv)")


def _independent_rows(text: str) -> str:
    def split(inner: str, kind: int) -> str | None:
        m = _ROW_ENV.fullmatch(inner.strip())
        if not m:
            return None
        rows = [r.strip() for r in _ROW_BREAK.split(m.group(2)) if r.strip()]
        if len(rows) < 2 or any("&" in r for r in rows) or any(_CONTINUES.match(r) for r in rows[1:]):
            return None  # one formula over several aligned lines: kept whole
        return _blocks(rows, None)

    return _on_display(text, split)


# --- C2: worksheet arrays of separate equations ------------------------------------------------------------

_ANY_ARRAY = re.compile(r"\\begin\{array\}\{[lrc|]+\}([\s\S]*?)\\end\{array\}")
_CELL_CONTINUES = re.compile(r"^(=|\\approx|\+|-|\\times|\\div|\\leq|\\geq|\\le|\\ge|<|>|\\cdot)")


def _worksheet_cells(text: str) -> str:
    def split(inner: str, kind: int) -> str | None:
        m = _ANY_ARRAY.fullmatch(inner.strip())
        if not m:
            return None
        rows = [r for r in _ROW_BREAK.split(m.group(1)) if r.strip()]
        if len(rows) < 2 or sum("&" in r for r in rows) < 2:
            return None
        cells = []
        for row in rows:
            own = [c.strip() for c in row.split("&") if c.strip()]
            if not own or not all(_separate_equation(c) for c in own):
                return None  # real alignment, or a row that is not equations
            cells += own
        return _blocks(cells, None) if len(cells) >= 2 else None

    return _on_display(text, split)


def _separate_equation(cell: str) -> bool:
    return not _CELL_CONTINUES.match(cell) and ("=" in cell or "\\approx" in cell)


# --- D: \left / \right balance ----------------------------------------------------------------------------

_LEFT = re.compile(r"\\left(?![a-zA-Z@])")
_RIGHT = re.compile(r"\\right(?![a-zA-Z@])")


def _left_right(text: str) -> str:
    return _on_inner(text, _balance)


def _balance(inner: str) -> str:
    missing = len(_LEFT.findall(inner)) - len(_RIGHT.findall(inner))
    if missing > 0:
        ends = list(re.finditer(r"\\end\{[^}]+\}", inner))
        if ends:
            at = ends[-1].start()
            return inner[:at] + "\\right." * missing + " " + inner[at:]
        return inner.rstrip() + " " + "\\right." * missing
    if missing < 0:
        begin = re.search(r"\\begin\{[^}]+\}", inner)
        if begin:
            return inner[: begin.end()] + " " + "\\left." * -missing + inner[begin.end() :]
        return " " + "\\left." * -missing + inner
    return inner


# --- A: inline formula alone on a line -> display ---------------------------------------------------------

_INLINE_LINE = re.compile(r"(?m)^[ \t]*\$([^$\n]+?)\$[ \t]*$")
_RICH = re.compile(r"\\(?:frac|sum|int|prod|therefore|because|forall|exists|begin|left|right|sqrt|partial|nabla|"
                   r"infty|cdot|times|div|leq|geq|neq|approx|equiv|to|rightarrow|leftarrow|leftrightarrow|cap|"
                   r"cup|in|notin|subset|supseteq|cong|sim)\b")


def _inline_to_display(text: str) -> str:
    def promote(m: re.Match[str]) -> str:
        inner = m.group(1).strip()
        return f"\n\n$$ {inner} $$\n\n" if len(inner) >= 15 or _RICH.search(inner) else m.group(0)

    return _INLINE_LINE.sub(promote, text)


# --- W: bare arithmetic lines -> display -------------------------------------------------------------------

_ARITHMETIC = re.compile(r"^[\d\s×÷+\-=.,()（）]+$")
_DRILL_GAP = re.compile(r"\s{2,}")
_DIV, _TIMES = "\\div ", "\\times "


def _bare_arithmetic(text: str) -> str:
    out = []
    for line in text.split("\n"):
        drill = line.strip()
        if not (3 <= len(drill) <= 80 and "=" in drill and _ARITHMETIC.match(drill)
                and ("÷" in drill or "×" in drill or re.search(r"\d\s*[+\-]\s*\d", drill))):
            out.append(line)
            continue
        parts = [p.strip() for p in _DRILL_GAP.split(drill) if p.strip()]
        drills = parts if len(parts) >= 2 and all("=" in p for p in parts) else [drill]
        out += [f"$$ {d.replace('÷', _DIV).replace('×', _TIMES)} $$" for d in drills]
    return "\n".join(out)


# --- F: equation numbers ------------------------------------------------------------------------------------

_NUMBERS = (re.compile(r"\\tag\s*\{[^}]*\}\s*"), re.compile(r"\\q?quad\s*\{?\s*\((\d[\d.\-]*)\)\s*\}?\s*$"),
            re.compile(r"(?:\\cdots){2,}\s*\((\d[\d.\-]*)\)\s*$"))
_TRAILING_NUMBER = re.compile(r"\s+\((\d[\d.\-]+)\)\s*$")


def _equation_numbers(text: str) -> str:
    return _on_inner(text, _strip_numbers)


def _strip_numbers(inner: str) -> str:
    for pattern in _NUMBERS:
        while (m := pattern.search(inner)) is not None:
            inner = inner[: m.start()] + inner[m.end() :]
    m = _TRAILING_NUMBER.search(inner)
    if m and m.start() > 5:  # not "(i,t)=" at the start of a formula
        inner = inner[: m.start()].rstrip()
    return inner


# --- V: display formula repair ------------------------------------------------------------------------------


def _repair_display(text: str) -> str:
    return _on_inner(text, _repair)


def _repair(inner: str) -> str:
    inner = re.sub(r"^(\s*)&", r"\1", inner, count=1)  # an alignment tab cannot open a display formula
    surplus = -_brace_depth(inner)
    while surplus > 0:
        m = re.search(r"\}\s*$", inner)
        if not m or _escaped(inner, m.start()):
            break
        inner = inner[: m.start()] + inner[m.start() + 1 :]
        surplus -= 1
    return inner


def _brace_depth(s: str) -> int:
    """Braces opened minus closed, skipping escaped characters."""
    depth, i = 0, 0
    while i < len(s):
        if s[i] == "\\":
            i += 2
            continue
        depth += {"{": 1, "}": -1}.get(s[i], 0)
        i += 1
    return depth


def _escaped(s: str, at: int) -> bool:
    """Whether the character at ``at`` follows an odd number of backslashes."""
    count = 0
    while at - count - 1 >= 0 and s[at - count - 1] == "\\":
        count += 1
    return count % 2 == 1
