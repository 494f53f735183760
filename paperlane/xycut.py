"""The cut that reads a page's regions in order (``paperlane.regions``): XY-cut style, bands top to bottom,
a band's columns left to right, with the rules by which a paper's columns run on through the blanks that cross
them. ``Cut.order`` takes the regions as ``Part``s (kind, box, line numbers) and gives them back in order."""

from __future__ import annotations

from dataclasses import dataclass

from paperlane.layout import Box
from paperlane.precedence import precedence_order
from paperlane.schemas import BlockKind

PICTURE_KINDS = frozenset({BlockKind.TABLE, BlockKind.OTHER})  # a layout model's tables, figures and formulas
RESUME_GAP = 3  # paragraph gaps: a heading further below a run of columns (a title page's authors) starts a run
GOES_ON = 6  # paragraph gaps: text this tall under one column is that column going on (a footnote is less)


@dataclass
class Part:
    """A region (or a piece of one) as the cut sees it: its kind, box and the numbers of its lines."""

    kind: BlockKind
    box: Box
    lines: list[int]
    centred: bool = False  # lines of unlike widths, each centred under the one above (``centred``)


@dataclass
class Cut:
    slack: float
    min_width: float  # a column is at least this wide
    paragraph_gap: float  # a blank at least this tall starts a new paragraph
    rtl: bool

    def order(self, parts: list[Part]) -> list[Part]:
        if len(parts) <= 1:
            return parts
        runs = self._runs(self._split(parts, axis=1))
        if len(runs) > 1:
            return [p for run in runs for p in self.order(run)]
        columns = self._columns(parts)
        if columns:
            return [p for col in columns for p in self.order(col)]
        return [parts[i] for i in precedence_order([p.box for p in parts], slack=self.slack, rtl=self.rtl)]

    def _columns(self, parts: list[Part]) -> list[list[Part]] | None:
        """``parts`` cut at blank vertical strips into columns each at least ``min_width`` wide, in reading
        order; None when there is no such cut."""
        columns = self._absorbed(self._split(parts, axis=0))
        if len(columns) < 2 or any(_width(col) < self.min_width for col in columns):
            return None
        return columns[::-1] if self.rtl else columns

    def _absorbed(self, columns: list[list[Part]]) -> list[list[Part]]:
        """``columns`` (left to right) with each strip narrower than a column joined to the nearer of the columns
        beside it, when there are at least two: a piece of a formula, or what the recogniser read of one,
        standing out into the gutter, or a formula's number beside it, is of its column and no third column."""
        wide = [k for k, col in enumerate(columns) if _width(col) >= self.min_width]
        if len(wide) < 2 or len(wide) == len(columns):
            return columns
        joined = {k: list(columns[k]) for k in wide}
        for k, col in enumerate(columns):
            if k not in joined:
                beside = [w for w in (max((w for w in wide if w < k), default=None),
                                      min((w for w in wide if w > k), default=None)) if w is not None]
                joined[min(beside, key=lambda w: _apart(columns[w], col))] += col
        return [joined[k] for k in wide]

    def _runs(self, bands: list[list[Part]]) -> list[list[Part]]:
        """Consecutive bands joined while together they still split into columns: the columns below a title
        across them run on through every gap where they happen to end a paragraph at the same height. A band
        that does not split into columns itself joins only when it is less than a paragraph gap below the run
        (a column going on alone) or below a run of floats (tables, figures and their captions, one over each
        column: a heading at the top of one column under them, further down than a paragraph gap, left the
        floats read as a row before both columns); one further down a run of text (a footnote, a closing
        paragraph under the columns, the abstract under a title page's authors) or two bands of one region each,
        side by side only by chance, stay apart, unless columns that go on the run's follow it within
        ``RESUME_GAP`` paragraph gaps (``_resumed``: a section heading in one column). A row of centred blocks
        (``_row``: a title page's authors side by side, one over each column) starts no run: it is read across,
        before the columns under it. The price, as in ``paperlane.layout``: a column that runs on alone below its
        neighbour's end after a paragraph gap is read after its neighbour."""
        runs: list[list[Part]] = []
        for k, band in enumerate(bands):
            if runs and self._columns(runs[-1] + band) and not _row(runs[-1]):
                above = self._columns(runs[-1])
                rest = bands[k + 1:]
                if (above and self._columns(band)) or self._near(runs[-1], band) or _floats(above) or (
                        above and (self._resumed(runs[-1], band, rest) or self._goes_on(above, band, rest))):
                    runs[-1] = runs[-1] + band
                    continue
            runs.append(band)
        return runs

    def _resumed(self, run: list[Part], band: list[Part], below: list[list[Part]]) -> bool:
        """Whether ``band`` (no columns of its own), less than ``RESUME_GAP`` paragraph gaps below a ``run`` of
        columns, is followed by columns that go on the run's, with only bands like it in between: a section
        heading in one column between two paragraphs of it, set off by more than a paragraph's gap (and the next
        column's heading a little lower)."""
        if _gap(run, band) >= RESUME_GAP * self.paragraph_gap:
            return False
        joined = run + band
        for nxt in below:
            joined = joined + nxt
            if not self._columns(joined):
                return False
            if self._columns(nxt):
                return True
        return False

    def _goes_on(self, columns: list[list[Part]], band: list[Part], below: list[list[Part]]) -> bool:
        """Whether ``band`` (no columns of its own), less than ``RESUME_GAP`` paragraph gaps below a run of
        ``columns``, stands within one of them and is that column going on under its neighbour's end (the last
        page's conclusion under the right column's references, the left column's last references): the column
        already ran on alone, more than ``RESUME_GAP`` paragraph gaps below every other column's foot, or the
        band and those ``below`` it in the same column, each less than ``RESUME_GAP`` paragraph gaps under the
        one before, run at least ``GOES_ON`` paragraph gaps down. It is read before the column after it. A
        footnote, a line or two under columns that end together, stays after them all."""
        reach = RESUME_GAP * self.paragraph_gap
        if _gap([p for col in columns for p in col], band) >= reach:
            return False
        feet = [max(p.box[3] for p in col) for col in columns]
        for k, col in enumerate(columns):
            if not self._within(band, col):
                continue
            last = band
            for b in below:
                if not self._within(b, col) or _gap(last, b) >= reach:
                    break
                last = b
            tall = max(p.box[3] for p in last) - min(p.box[1] for p in band) >= GOES_ON * self.paragraph_gap
            if tall or all(feet[k] - other > reach for other in feet[:k] + feet[k + 1:]):
                return True
        return False

    def _within(self, band: list[Part], column: list[Part]) -> bool:
        """Whether ``band`` stands within the width of ``column`` (give or take the slack)."""
        return (min(p.box[0] for p in column) - self.slack <= min(p.box[0] for p in band)
                and max(p.box[2] for p in band) <= max(p.box[2] for p in column) + self.slack)

    def _near(self, run: list[Part], band: list[Part]) -> bool:
        return _gap(run, band) < self.paragraph_gap

    def _split(self, parts: list[Part], *, axis: int) -> list[list[Part]]:
        """``parts`` cut at blank strips along ``axis`` (0: vertical strips, into columns; 1: into bands)."""
        spans = sorted((p.box[axis] + self.slack, max(p.box[axis] + self.slack, p.box[axis + 2] - self.slack), n)
                       for n, p in enumerate(parts))
        groups: list[list[Part]] = []
        end = -float("inf")
        for start, stop, n in spans:
            if not groups or start > end:
                groups.append([])
            groups[-1].append(parts[n])
            end = max(end, stop)
        return groups


def _row(run: list[Part]) -> bool:
    """Whether ``run`` is a row of centred blocks of text side by side (authors, each with an affiliation and an
    address, under a title): at least two, and nothing else but single lines."""
    return sum(p.centred for p in run) >= 2 and all(
        p.centred or (len(p.lines) == 1 and p.kind not in PICTURE_KINDS) for p in run)


def centred(boxes: list[Box], unit: float) -> bool:
    """Whether lines of unlike widths (their left ends at least half a line height apart) are each centred on the
    same axis (within half a line height): an author's name, affiliation and address, not a paragraph's lines."""
    if len(boxes) < 2:
        return False
    centres = [(b[0] + b[2]) / 2 for b in boxes]
    lefts = [b[0] for b in boxes]
    return max(centres) - min(centres) <= unit / 2 and max(lefts) - min(lefts) >= unit / 2


def _floats(columns: list[list[Part]] | None) -> bool:
    """Whether a run's ``columns`` are floats over columns: each holds a table, a figure or a formula (with what
    else stands there: its caption, which the model may also call text)."""
    return columns is not None and all(any(p.kind in PICTURE_KINDS for p in col) for col in columns)


def _gap(run: list[Part], band: list[Part]) -> float:
    """The blank between the foot of ``run`` and the top of ``band`` below it."""
    return min(p.box[1] for p in band) - max(p.box[3] for p in run)


def _apart(a: list[Part], b: list[Part]) -> float:
    """The blank between two sets of regions side by side, either way round."""
    return max(min(p.box[0] for p in b) - max(p.box[2] for p in a), min(p.box[0] for p in a) - max(p.box[2] for p in b))


def _width(parts: list[Part]) -> float:
    return max(p.box[2] for p in parts) - min(p.box[0] for p in parts)
