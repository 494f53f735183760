"""Telling a degenerate answer from a long one, while it streams.

OCR vision-language models fall into loops under greedy decoding: a line, a table row, a phrase or a
single character repeated until ``max_tokens``. Pages repeat legitimately too (a blank form's rows, a
column of zeros, a dotted leader), but only as far as the page goes. ``DegenerationDetector`` is fed
an answer piece by piece and says, as soon as it can, that the answer has degenerated:

- ``REPEATED_TAIL``: the answer ends in one unit (1 to ``max_unit`` characters, not blank) repeated
  back to back, ``repeats`` times or more (``structure_repeats`` for a unit of markup and punctuation
  only, such as an empty table row) and covering ``min_span`` characters or more; or, for a unit of
  ``long_unit`` characters or more (a paragraph), ``long_repeats`` times;
- ``REPEATED_LINE``: one line (``line_min_chars`` or longer, with a letter or digit) has appeared
  ``line_repeats`` times anywhere in the answer: near-loops alternate a few lines, or vary one slightly
  in between;
- ``TOO_LONG``: more characters than the page can hold (``chars_per_megapixel`` of the image the model
  read, at least ``min_page_chars``).

The settings are ``engine.guard`` (``paperlane.settings.LoopGuardSettings``); how the defaults were
chosen, and the false-stop rate they give on real and on repetitive pages, is measured by
``tests/test_degeneration.py``. Cost: a check every ``_CHECK_EVERY`` characters, each a few
``str.rfind`` and slice comparisons over the last ``max_unit`` characters or the repeated run.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from enum import Enum

from paperlane.settings import LoopGuardSettings

_CHECK_EVERY = 32  # characters fed between two checks: a loop is seen within a few tokens of the threshold
_PROBE = 16  # the answer's last characters, looked for again earlier to find the repeated unit's length
_CANDIDATES = 16  # earlier occurrences of the probe tried as the unit's length
_TAG = re.compile(r"<[^<>]*>")


class Degeneration(str, Enum):
    REPEATED_TAIL = "repeated_tail"
    REPEATED_LINE = "repeated_line"
    TOO_LONG = "too_long"


@dataclass(frozen=True)
class Verdict:
    """Why an answer is degenerate, and how much of it is worth keeping."""

    kind: Degeneration
    keep: int  # characters of the answer before the degeneration (plus one copy of a repeated unit)
    detail: str  # the repeated unit or line, shortened, for logs

    def __str__(self) -> str:
        return f"{self.kind.value} ({self.detail!r})"


class DegenerationDetector:
    """Fed one answer's text as it streams; ``feed`` returns a ``Verdict`` once the text has degenerated."""

    def __init__(self, cfg: LoopGuardSettings, *, max_chars: int) -> None:
        self._cfg = cfg
        self._max_chars = max_chars
        self.text = ""
        self._checked = 0  # length of the text at the last check
        self._lines: Counter[str] = Counter()
        self._first_seen: dict[str, int] = {}
        self._line_start = 0  # offset of the line not yet complete

    @classmethod
    def for_image(cls, cfg: LoopGuardSettings, *, width: int, height: int) -> DegenerationDetector:
        """A detector for an answer about an image of ``width`` x ``height`` pixels (what it can hold)."""
        capacity = round(cfg.chars_per_megapixel * width * height / 1e6)
        return cls(cfg, max_chars=max(cfg.min_page_chars, capacity))

    def feed(self, piece: str) -> Verdict | None:
        """Add ``piece`` to the answer; the verdict when the answer has degenerated, else None."""
        self.text += piece
        if len(self.text) - self._checked < _CHECK_EVERY:
            return None
        return self._check()

    def finish(self) -> Verdict | None:
        """The verdict on the whole answer once it has ended (its last line counts now)."""
        verdict = self._check()
        if verdict is None and self._line_start < len(self.text):
            verdict = self._count_line(self._line_start, len(self.text))
        return verdict

    def _check(self) -> Verdict | None:
        self._checked = len(self.text)
        if len(self.text) > self._max_chars:
            return Verdict(Degeneration.TOO_LONG, self._max_chars, f"{len(self.text)} > {self._max_chars} chars")
        return self._new_lines() or tail_repetition(self.text, self._cfg)

    def _new_lines(self) -> Verdict | None:
        text = self.text
        while (end := text.find("\n", self._line_start)) >= 0:
            verdict = self._count_line(self._line_start, end)
            self._line_start = end + 1
            if verdict is not None:
                return verdict
        return None

    def _count_line(self, start: int, end: int) -> Verdict | None:
        line = " ".join(self.text[start:end].split())
        if len(line) < self._cfg.line_min_chars or not _has_content(line):
            return None
        self._lines[line] += 1
        count = self._lines[line]
        if count == 2:
            self._first_seen[line] = start  # where the repetition begins
        if count >= self._cfg.line_repeats:
            return Verdict(Degeneration.REPEATED_LINE, self._first_seen[line], f"{line[:40]} x{count}")
        return None


def tail_repetition(text: str, cfg: LoopGuardSettings) -> Verdict | None:
    """A verdict when ``text`` ends in a unit repeated back to back past the thresholds of ``cfg``.

    The unit's length is where the answer's last characters (the probe) occurred before. When the
    text there repeats with a shorter period than the unit (a run of underscores inside a repeated
    line), the probe is stretched back over that run, so that only the longer period still matches.
    """
    n = len(text)
    if n < max(min(cfg.min_span, cfg.long_unit * cfg.long_repeats), 2 * _PROBE):
        return None
    probe = _PROBE
    found = text.rfind(text[n - probe :], max(0, n - probe - cfg.max_unit), n - 1)
    for _ in range(_CANDIDATES):
        if found < 0:
            return None
        period = n - probe - found
        verdict, run_start = _periodic_run(text, period, cfg)
        if verdict is not None:
            return verdict
        if run_start < n - period:  # a shorter period repeats here: take the run in, and one character more
            probe = n - run_start + 1
            if run_start == 0 or probe + period > cfg.max_unit + _PROBE:
                return None
            found = text.rfind(text[n - probe :], max(0, n - probe - cfg.max_unit), n - probe)
        else:
            found = text.rfind(text[n - probe :], max(0, n - probe - cfg.max_unit), found + probe - 1)
    return None


def _periodic_run(text: str, period: int, cfg: LoopGuardSettings) -> tuple[Verdict | None, int]:
    """Whether ``text`` ends in copies of its last ``period`` characters past the thresholds: the verdict,
    and where the periodic run begins."""
    n = len(text)
    unit = text[n - period :]
    copies = 1
    while copies * period + period <= n and text[n - (copies + 1) * period : n - copies * period] == unit:
        copies += 1
    start = n - copies * period
    if unit.strip() and copies >= _needed(unit, cfg):
        return Verdict(Degeneration.REPEATED_TAIL, start + period, f"{unit[:40]} x{copies}"), start
    while start > 0 and text[start - 1] == text[start - 1 + period]:  # a part of a unit before the copies
        start -= 1
    return None, start


def _needed(unit: str, cfg: LoopGuardSettings) -> int:
    """Copies of ``unit`` that make a loop: few of a long unit; of a short one, enough to cover ``min_span``
    and ``repeats`` (``structure_repeats`` when it is markup and punctuation only)."""
    if len(unit) >= cfg.long_unit:
        return cfg.long_repeats
    copies = cfg.repeats if _has_content(_from_tag(unit)) else cfg.structure_repeats
    return max(copies, -(-cfg.min_span // len(unit)))


def _from_tag(unit: str) -> str:
    """``unit`` rotated to begin at its first tag, so that its tags read whole (a loop may start mid-tag)."""
    at = unit.find("<")
    return unit[at:] + unit[:at] if at > 0 else unit


def _has_content(text: str) -> bool:
    """Whether ``text`` holds a letter or digit outside HTML tags (CJK characters count as letters)."""
    return any(ch.isalnum() for ch in _TAG.sub("", text))
