"""Lines the engine ran across a column gutter, cut there.

    split_at_gutters(lines, *, settings) -> lines

A text detector joins words across a narrow gutter (newspapers: columns a word space or two apart, justified
so that every line reaches the gutter), and one "line" then holds a line of each column; no reading order of
such lines can be right. A line is cut between two of its words where the gap between them is a *gutter*:

- the gap is at least ``gutter_gap`` line heights wide (the page's median line height);
- a strip of it at least that wide stays blank in the lines whose middle lies within ``gutter_reach`` line
  heights above or below (no word of theirs enters it), and at least ``gutter_lines`` of those lines (this
  one included) have text beside it on the left, and as many on the right: words spanning at least
  ``min_piece`` line heights, reaching within ``min_piece`` of the strip. A blank strip running down between
  the text of several lines is a gutter; a word space in one line is not, nor (mostly) a river of spaces
  through justified text, nor the gap between a receipt's items and their prices (too short to flank it).
  A line of running text whose word enters the strip makes it a word space; a taller line (at least 1.5
  line heights: a headline across the columns) is passed over.

Only lines with the engine's own word boxes are cut (``Word.estimated`` is false; a Chinese line with no spaces
is one word, and is never cut); each piece keeps its words, its text is theirs joined by spaces, its quad runs
from its first word's to its last word's. A line not cut keeps its text, and its quad is cut back to its
words likewise: a detector's box runs on a few pixels past them, enough to close a narrow gutter.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence

from paperlane.layout import HEADLINE, box_quad, quad_box
from paperlane.schemas import Line, Word
from paperlane.settings import LayoutSettings

Span = tuple[float, float]


def split_at_gutters(lines: Sequence[Line], *, settings: LayoutSettings | None = None) -> list[Line]:
    """``lines`` with each one that crosses a gutter cut there, the pieces in its place, left to right."""
    settings = settings or LayoutSettings()
    spans = [_word_spans(ln) for ln in lines]
    heights = [_height(ln) if ln.quad else 0.0 for ln in lines]
    if not any(len(s) > 1 for s in spans):
        return list(lines)
    unit = max(1.0, statistics.median(h for ln, h in zip(lines, heights) if ln.quad))
    middles = [_middle(ln) for ln in lines]
    by_middle = sorted(range(len(lines)), key=lambda i: middles[i])
    keys = [middles[i] for i in by_middle]
    out: list[Line] = []
    for i, ln in enumerate(lines):
        if len(spans[i]) < 2:
            out.append(ln)
            continue
        reach = settings.gutter_reach * unit
        near = by_middle[bisect.bisect_left(keys, middles[i] - reach):bisect.bisect_right(keys, middles[i] + reach)]
        cuts = [k for k in range(1, len(spans[i])) if _gutter(i, k, spans, heights, near, unit, settings)]
        out += _pieces(ln, cuts) if cuts else [_trimmed(ln)]
    return out


def _trimmed(line: Line) -> Line:
    """The line with its quad cut back to its words (a detector's box that runs on past them, into a
    gutter, would hide the gutter from the reading order); its text as it was."""
    return line.model_copy(update={"quad": _piece(line, line.words or []).quad})


def _gutter(i: int, k: int, spans: list[list[Span]], heights: list[float], near: list[int], unit: float,
            settings: LayoutSettings) -> bool:
    """Whether the gap before word ``k`` of line ``i`` is a gutter (see the module's rules)."""
    own = spans[i]
    strip = (own[k - 1][1], own[k][0])
    wide = settings.gutter_gap * unit
    if strip[1] - strip[0] < wide:
        return False
    piece = settings.min_piece * unit
    left = right = 0
    for j in near:
        narrowed = _narrowed(strip, spans[j])
        if narrowed[1] - narrowed[0] < wide:
            if heights[j] <= HEADLINE * unit:
                return False  # a word of the running text where the gap is: a word space
            continue  # a headline across the columns
        strip = narrowed
        left += _flank([s for s in spans[j] if s[1] <= strip[0]], strip[0], piece)
        right += _flank([s for s in spans[j] if s[0] >= strip[1]], strip[1], piece)
    return min(left, right) >= settings.gutter_lines


def _flank(words: list[Span], edge: float, piece: float) -> bool:
    """Whether ``words`` (on one side of a strip) reach within ``piece`` of its ``edge`` and span at least
    ``piece``: the text of the column beside the gutter, not a price, nor a column further away."""
    if not words:
        return False
    x0, x1 = words[0][0], words[-1][1]
    return min(abs(edge - x0), abs(edge - x1)) <= piece and x1 - x0 >= piece


def _narrowed(strip: Span, words: list[Span]) -> Span:
    """The widest part of ``strip`` that none of ``words`` (sorted, apart) enters."""
    for x0, x1 in words:
        if x1 <= strip[0] or x0 >= strip[1]:
            continue
        left, right = (strip[0], x0), (x1, strip[1])
        strip = left if left[1] - left[0] >= right[1] - right[0] else right
    return strip


def cut_at(line: Line, x: float) -> list[Line]:
    """``line`` cut in two at ``x`` (a gutter the layout model's regions show): its words left of ``x`` and those
    right of it, a word across ``x`` (the recogniser read on across the gutter) cut between its characters in
    proportion to its width. The line whole where either piece would be empty or it has no words."""
    left: list[Word] = []
    right: list[Word] = []
    for w in line.words or []:
        x0, x1 = min(p[0] for p in w.quad), max(p[0] for p in w.quad)
        if x1 <= x:
            left.append(w)
        elif x0 >= x:
            right.append(w)
        else:
            k = round(len(w.text) * (x - x0) / max(x1 - x0, 1e-6))
            if k > 0:
                left.append(_word_part(w, w.text[:k], x0, x))
            if k < len(w.text):
                right.append(_word_part(w, w.text[k:], x, x1))
    if not left or not right:
        return [line]
    return [_piece(line, left), _piece(line, right)]


def _word_part(word: Word, text: str, x0: float, x1: float) -> Word:
    y0, y1 = min(p[1] for p in word.quad), max(p[1] for p in word.quad)
    return word.model_copy(update={"text": text, "quad": box_quad((x0, y0, x1, y1))})


def _pieces(line: Line, cuts: list[int]) -> list[Line]:
    words = line.words or []
    bounds = [0, *cuts, len(words)]
    return [_piece(line, words[a:b]) for a, b in zip(bounds, bounds[1:])]


def _piece(line: Line, words: list[Word]) -> Line:
    first, last = words[0].quad, words[-1].quad
    quad = [first[0], last[1], last[2], first[3]]
    return line.model_copy(update={"text": " ".join(w.text for w in words), "quad": quad, "words": words})


def _word_spans(line: Line) -> list[Span]:
    """The horizontal extents of the line's words, left to right; none when the engine did not box them."""
    words = line.words or []
    if not words or any(w.estimated or len(w.quad) != 4 for w in words):
        return []
    spans = [(min(p[0] for p in w.quad), max(p[0] for p in w.quad)) for w in words]
    return spans if all(a[1] <= b[0] for a, b in zip(spans, spans[1:])) else []


def _height(line: Line) -> float:
    _, y0, _, y1 = quad_box(line.quad or [])
    return y1 - y0


def _middle(line: Line) -> float:
    if not line.quad:
        return 0.0
    _, y0, _, y1 = quad_box(line.quad)
    return (y0 + y1) / 2
