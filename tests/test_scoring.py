"""The accuracy helpers in tests/scoring.py."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.scoring import (
    box_iou,
    cer,
    cer_nospace,
    detection_pr,
    levenshtein,
    normalise,
    quad_to_box,
    reading_order,
)


def _naive(a: str, b: str) -> int:
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return d[-1][-1]


@pytest.mark.parametrize(("a", "b", "dist"), [
    ("", "", 0), ("abc", "", 3), ("", "abc", 3), ("kitten", "sitting", 3), ("flaw", "lawn", 2),
    ("intention", "execution", 5), ("same", "same", 0), ("ab", "ba", 2), ("日本語", "日本", 1),
    ("🙂x", "x", 1),
])
def test_levenshtein_known_values(a: str, b: str, dist: int) -> None:
    assert levenshtein(a, b) == dist
    assert levenshtein(b, a) == dist


@given(st.text(alphabet="abc ", max_size=12), st.text(alphabet="abc ", max_size=12))
def test_levenshtein_matches_textbook_dp(a: str, b: str) -> None:
    assert levenshtein(a, b) == _naive(a, b)


def test_levenshtein_is_fast_on_pages() -> None:
    rng = random.Random(7)
    a = "".join(rng.choice("abcdefgh \n") for _ in range(5000))
    b = "".join(c if rng.random() > 0.05 else "x" for c in a)
    start = time.perf_counter()
    dist = levenshtein(a, b)
    assert time.perf_counter() - start < 5
    hamming = sum(x != y for x, y in zip(a, b, strict=True))
    assert 200 < dist <= hamming


def test_normalise_folds_case_width_and_whitespace() -> None:
    assert normalise("  \uff34otal\tAMT\r\n  ﬁve  ") == "total amt five"
    assert normalise("STRASSE") == normalise("straße")


def test_cer() -> None:
    assert cer("kitten", "sitting") == pytest.approx(3 / 7)
    assert cer("TOTAL  60.30\n", "total 60.30") == 0.0
    assert cer("", "") == 0.0 and cer("x", "") == 1.0 and cer("", "abcd") == 1.0
    assert cer("(336) 335-7392", "(336) 335- 7392") == pytest.approx(1 / 15)
    assert cer_nospace("(336) 335-7392", "(336) 335- 7392") == 0.0
    assert cer_nospace("a b c", "abd") == pytest.approx(1 / 3)


def test_box_iou() -> None:
    assert box_iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert box_iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(50 / 150)
    assert box_iou((0, 0, 10, 10), (10, 0, 20, 10)) == 0.0
    assert box_iou((0, 0, 0, 0), (0, 0, 0, 0)) == 0.0
    assert quad_to_box([[3, 1], [9, 2], [8, 7], [2, 6]]) == (2, 1, 9, 7)


def test_detection_pr_is_one_to_one() -> None:
    truth = [[[0, 0], [100, 0], [100, 20], [0, 20]], [[0, 30], [100, 30], [100, 50], [0, 50]]]
    assert detection_pr(truth, truth) == (1.0, 1.0)
    # two predictions on the same truth line: only one counts
    dup = [truth[0], [[1, 0], [100, 0], [100, 20], [1, 20]]]
    assert detection_pr(dup, truth) == (0.5, 0.5)
    # a prediction merging both lines overlaps each by < 0.5
    merged = [[[0, 0], [100, 0], [100, 50], [0, 50]]]
    assert detection_pr(merged, truth) == (0.0, 0.0)
    assert detection_pr([], truth) == (1.0, 0.0)
    assert detection_pr(truth, [], iou=0.3) == (0.0, 1.0)


def test_reading_order_tolerates_skew() -> None:
    boxes = [(200, 101, 260, 121), (10, 100, 80, 120), (10, 130, 90, 150), (300, 99, 350, 119)]
    assert reading_order(boxes) == [1, 0, 3, 2]
    assert reading_order([]) == []
