"""The degeneration detector: it stops every kind of loop early and no real or legitimately repetitive page.

This is where the loop guard's default thresholds (``engine.guard``) are measured: the false-stop rate on
the development corpus' real pages (each written as a plain-text, markdown, spotting and JSON spotting
answer) and on long repetitive pages (tables of numbers, blank forms and ledgers, dotted leaders, repeated
labels) must be zero, and every loop must be stopped within a few hundred characters of its start.
The official HunyuanOCR 1.5 client's rule (a unit repeated 8 times, any length) is shown to stop
legitimate pages, so the test can fail.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from paperlane.models.degeneration import Degeneration, DegenerationDetector, Verdict, tail_repetition
from paperlane.settings import LoopGuardSettings
from tests.answers import Answer, loops, pieces, real_answers, repetitive_answers
from tests.corpus import corpus_root

DEFAULTS = LoopGuardSettings()
# Loops are stopped within this many characters of their start (~100-250 tokens): a looping page costs
# what it decoded before the loop plus this, never max_tokens.
MAX_CHARS_AFTER_LOOP_START = 1200


def stream(answer: Answer, cfg: LoopGuardSettings = DEFAULTS) -> Verdict | None:
    detector = DegenerationDetector.for_image(cfg, width=answer.width, height=answer.height)
    for piece in pieces(answer.text):
        if (verdict := detector.feed(piece)) is not None:
            return verdict
    return detector.finish()


def false_stops(answers: Iterable[Answer], cfg: LoopGuardSettings = DEFAULTS) -> dict[str, str]:
    return {a.name: str(v) for a in answers if (v := stream(a, cfg)) is not None}


@pytest.mark.skipif(not corpus_root().is_dir(), reason="corpus folder absent")
def test_no_real_page_is_stopped() -> None:
    answers = real_answers()
    assert len(answers) == 4 * 32
    assert false_stops(answers) == {}  # false-stop rate 0 / 128


def test_no_legitimately_repetitive_page_is_stopped() -> None:
    answers = repetitive_answers()
    assert all(len(a.text) >= 200 for a in answers)
    assert false_stops(answers) == {}


def test_the_official_rule_would_stop_repetitive_pages() -> None:
    # HunyuanOCR 1.5's client stops at a unit repeated 8 times (any length, no span): on these pages that
    # stops the ledgers, the blank form and the dotted leaders. The thresholds above are what avoids it.
    official = LoopGuardSettings(repeats=8, structure_repeats=8, min_span=8, long_repeats=8)
    stopped = false_stops(repetitive_answers(), official)
    assert {"ledger/html", "ledger/markdown", "blank-form", "contents"} <= set(stopped), stopped


@pytest.mark.parametrize("loop", loops(), ids=lambda loop: loop.name)
def test_every_kind_of_loop_is_stopped_early(loop) -> None:  # noqa: ANN001
    answer = Answer(loop.name, loop.text())
    detector = DegenerationDetector.for_image(DEFAULTS, width=answer.width, height=answer.height)
    fed = 0
    verdict = None
    for piece in pieces(answer.text):
        fed += len(piece)
        if (verdict := detector.feed(piece)) is not None:
            break
    assert verdict is not None and verdict.kind is not Degeneration.TOO_LONG
    # A paragraph (a unit of long_unit characters or more) is a loop at its third copy, a near-loop once its
    # line has come back line_repeats times.
    bound = max(MAX_CHARS_AFTER_LOOP_START, DEFAULTS.long_repeats * len(loop.unit) + 100)
    if verdict.kind is Degeneration.REPEATED_LINE:
        bound = len(loop.unit) + 200
    assert fed - len(loop.prefix) <= bound, (fed - len(loop.prefix), str(verdict))
    # What is kept is the answer before the loop and at most one copy of its unit (or two lines).
    assert len(loop.prefix) <= verdict.keep <= len(loop.prefix) + len(loop.unit) + 200


def test_repeated_tail_keeps_one_copy() -> None:
    text = "Invoice 12\n" + "Total 0.00\n" * 40
    verdict = tail_repetition(text, DEFAULTS)
    assert verdict is not None and verdict.kind is Degeneration.REPEATED_TAIL
    assert text[: verdict.keep] == "Invoice 12\nTotal 0.00\n"


def test_a_unit_of_markup_needs_more_copies_than_one_with_text() -> None:
    row = "<tr><td></td><td></td></tr>"
    assert tail_repetition("<table>" + row * 30, DEFAULTS) is None  # an empty ledger
    assert tail_repetition("<table>" + row * 40, DEFAULTS) is not None
    assert tail_repetition("x" + "<tr><td>0</td></tr>" * 22, DEFAULTS) is not None  # a digit: content
    # A loop that starts mid-tag is still read as markup.
    assert tail_repetition("<table><tr><t" + "d></td><tr><t" * 30, DEFAULTS) is None


def test_span_and_blank_units() -> None:
    assert tail_repetition("Signature " + "_" * 390, DEFAULTS) is None  # under min_span
    assert tail_repetition("Signature " + "_" * 410, DEFAULTS) is not None
    assert tail_repetition("end" + " " * 500, DEFAULTS) is None  # blank runs are whitespace, not a loop
    assert tail_repetition("ab" * 10, DEFAULTS) is None  # too short to tell


def test_a_line_repeated_between_others_is_a_near_loop() -> None:
    cfg = LoopGuardSettings(line_repeats=3, line_min_chars=5)
    detector = DegenerationDetector(cfg, max_chars=10_000)
    text = "Heading\nService name here\nA\nService name here\nB\nService name here\nC\n"
    verdicts = [v for piece in pieces(text, 8) if (v := detector.feed(piece)) is not None]
    verdict = verdicts[0] if verdicts else detector.finish()
    assert verdict is not None and verdict.kind is Degeneration.REPEATED_LINE
    assert text[: verdict.keep] == "Heading\nService name here\nA\n"  # up to the line's second appearance
    short = DegenerationDetector(cfg, max_chars=10_000)
    assert short.feed("0.00\n" * 50) is None and short.finish() is None  # short cells are not counted


def test_more_than_the_page_can_hold() -> None:
    cfg = LoopGuardSettings(chars_per_megapixel=1000, min_page_chars=500)
    small = DegenerationDetector.for_image(cfg, width=500, height=500)  # 0.25 MP: the floor, 500 chars
    big = DegenerationDetector.for_image(cfg, width=2000, height=2000)  # 4 MP: 4,000 chars
    text = "".join(f"word{i} " for i in range(200))  # ~1,400 chars, nothing repeated
    assert any(small.feed(p) for p in pieces(text)) and big.feed(text) is None and big.finish() is None
    verdict = DegenerationDetector(cfg, max_chars=100).feed("x" * 101)
    assert verdict is not None and verdict.kind is Degeneration.TOO_LONG and verdict.keep == 100
