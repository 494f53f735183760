"""Reading order of boxes by precedence, for layouts that no straight cut separates.

    precedence_order(boxes, *, slack, rtl=False) -> indices in reading order

Breuel's rules (T. M. Breuel, "High performance document layout analysis", 2003), over boxes in any
arrangement, XY-cut separable or not:

1. ``a`` comes before ``b`` when they overlap horizontally (by more than ``slack``) and ``a`` is above ``b``;
2. ``a`` comes before ``b`` when ``a`` lies wholly to the left of ``b`` (right, on a right-to-left page) and
   no box ``c`` lies between them vertically while overlapping both horizontally (a title across both
   columns: what is under it is read after what is above it, whatever the side).

The boxes are then sorted topologically, the topmost box first among those free to go next; where the
rules contradict each other (loose boxes overlapping), the topmost remaining box breaks the cycle. Cost:
O(n³) comparisons for n boxes, in numpy, in O(n²) memory; ``paperlane.regions`` calls it on the
regions no straight cut separates.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Box = tuple[float, float, float, float]


def precedence_order(boxes: Sequence[Box], *, slack: float, rtl: bool = False) -> list[int]:
    """The indices of ``boxes`` in reading order (see the module's rules)."""
    if len(boxes) < 2:
        return list(range(len(boxes)))
    before = _before(np.asarray(boxes, dtype=float), slack, rtl)
    return _topological(before, [(b[1], -b[2] if rtl else b[0]) for b in boxes])


def _before(b: np.ndarray, slack: float, rtl: bool) -> np.ndarray:
    """``before[a, c]``: whether box ``a`` must be read before box ``c``."""
    x0, y0, x1, y1 = b.T
    over = np.minimum(x1[:, None], x1[None, :]) - np.maximum(x0[:, None], x0[None, :]) > slack
    mid = (y0 + y1) / 2
    above = mid[:, None] < mid[None, :]
    side = (x1[None, :] - slack <= x0[:, None]) if rtl else (x1[:, None] - slack <= x0[None, :])
    spanned = np.zeros_like(over)
    for a in range(len(b)):  # row by row: n² memory, not n³
        candidates = over[a][None, :] & over  # [c', c]: box c overlaps both a and c'
        low, high = np.minimum(mid[a], mid), np.maximum(mid[a], mid)
        between = (mid[None, :] > low[:, None]) & (mid[None, :] < high[:, None])
        spanned[a] = (candidates & between).any(axis=1)
    rule = (over & above) | (side & ~spanned)
    np.fill_diagonal(rule, False)
    return rule


def _topological(before: np.ndarray, rank: list[tuple[float, float]]) -> list[int]:
    """Kahn's sort of the relation ``before``, choosing by ``rank`` among the boxes free to go (and to break
    a cycle, among all that are left)."""
    waiting = before.sum(axis=0)
    left = set(range(len(rank)))
    order: list[int] = []
    while left:
        free = [i for i in left if waiting[i] == 0] or list(left)
        pick = min(free, key=lambda i: rank[i])
        order.append(pick)
        left.discard(pick)
        waiting = waiting - before[pick]
        before[pick] = False
    return order
