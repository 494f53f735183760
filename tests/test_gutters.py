"""Lines the engine ran across a column gutter are cut there (paperlane.gutters); other lines stay whole."""

from __future__ import annotations

from paperlane.gutters import split_at_gutters
from paperlane.layout import order_lines
from paperlane.schemas import Line, Word

HEIGHT, PITCH, CHAR = 20.0, 28.0, 10.0


def _line(row: int, *runs: tuple[float, list[str]], size: float = 1.0) -> Line:
    """A line of boxed words at ``row``: each run starts at its x, words a space (one character) apart; ``size``
    scales its characters (a headline's are larger)."""
    y, h = 100 + row * PITCH, HEIGHT * size
    words = []
    for x, texts in runs:
        for text in texts:
            w = len(text) * CHAR * size
            words.append(Word(text=text, quad=[(x, y), (x + w, y), (x + w, y + h), (x, y + h)]))
            x += w + CHAR * size
    quad = [words[0].quad[0], words[-1].quad[1], words[-1].quad[2], words[0].quad[3]]
    return Line(text=" ".join(w.text for w in words), quad=quad, words=words)


def _words(name: str, r: int) -> list[str]:
    """Four words whose lengths vary from row to row (word spaces do not line up down a column), at most 230 px."""
    return [f"{name}{r}" + "x" * (r % 3), "w" * (1 + r * 7 % 5), "v" * (2 + r * 3 % 4), "u" * (3 + r * 5 % 4)]


def _texts(lines: list[Line]) -> list[str]:
    return [ln.text for ln in lines]


def test_lines_run_across_narrow_gutters_are_cut_into_each_column_s_line() -> None:
    # Three columns at least 12 px apart (0.6 line heights): the detector joined each row into one line.
    rows = [_line(r, (100, _words("a", r)), (342, _words("b", r)), (584, _words("c", r))) for r in range(8)]

    cut = split_at_gutters(rows)

    assert _texts(cut)[:3] == [" ".join(_words(name, 0)) for name in "abc"]
    assert len(cut) == 24
    ordered = _texts(order_lines(cut)[0])
    assert ordered == [" ".join(_words(name, r)) for name in "abc" for r in range(8)]


def test_a_wide_word_space_in_one_line_and_a_receipt_s_prices_stay_one_line() -> None:
    paragraph = [_line(r, (100, ["some", "running", "text", "here"][r:] + ["and", "more"][:r])) for r in range(3)]
    paragraph.append(_line(3, (100, ["spaced"]), (300, ["out"])))  # a lone gap: nothing runs down through it
    receipt = [_line(6 + r, (100, [f"item{r}", "name"]), (400, ["3.50"])) for r in range(6)]

    cut = split_at_gutters(paragraph + receipt)

    assert _texts(cut) == _texts(paragraph + receipt)


def test_a_headline_across_the_columns_does_not_hide_their_gutter() -> None:
    headline = _line(-1, (100, ["a", "longheadlineword", "across"]), size=2.0)  # a word of it over the gutter
    rows = [_line(1 + r, (100, _words("a", r)), (342, _words("b", r))) for r in range(6)]

    cut = split_at_gutters([headline, *rows])

    assert _texts(cut)[0] == headline.text
    assert _texts(cut)[1:3] == [" ".join(_words("a", 0)), " ".join(_words("b", 0))]
