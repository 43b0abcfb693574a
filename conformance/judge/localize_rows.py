"""Failure localization, output rows: a wrong output row of every kernel call (an M tail, a row tile) told
from wrong weights before the one-hot weight readback is read as weights.

Semantics: docs/conformance.md#failure-localization. The readback (conformance/judge/localize.py) runs
one-hot rows in calls of M rows, so probe row i sits at row position i mod M of its call: a kernel that
leaves output rows m >= 8 floor(M / 8) unwritten shows wrong *columns* k (those whose one-hot row landed
there), which read like wrong weights. A second readback with the same rows shifted by s positions tells the
two apart: a weight bug follows the column k, an output-row bug follows the position. ``row_pattern`` takes
both readbacks and claims the output-row pattern only where it explains at least 90 % of the probe rows of
both (the claim rule of the other localizers); the rows outside it are returned for the weight diff.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["RowReadback", "shift_for", "row_pattern", "MIN_SHARE"]

#: the share of probe rows (of both readbacks) the position pattern must explain
MIN_SHARE = 0.9
#: the row tiles a kernel's M loop is tried against
TILES = (2, 4, 8, 16, 32, 64)


@dataclasses.dataclass(frozen=True)
class RowReadback:
    """One readback: ``bad`` [rows, N] outside the interval, ``obs`` [rows, N] the outputs, ``pos`` [rows] each
    probe row's position inside its kernel call of ``step`` rows."""

    bad: np.ndarray
    obs: np.ndarray
    pos: np.ndarray
    step: int


def shift_for(failing_positions: np.ndarray, step: int) -> int:
    """The shift s (1 <= s < step) that moves the most failing positions onto passing ones (0: none helps)."""
    P = set(int(p) for p in failing_positions)
    best, best_s = len(P), 0
    for s in range(1, step):
        overlap = len(P & {(p + s) % step for p in P})
        if overlap < best:
            best, best_s = overlap, s
    return best_s


def _positions_text(P: np.ndarray, step: int) -> str:
    """Name a set of row positions of a call of ``step`` rows: an M tail of a row tile, or the list."""
    P = np.sort(P)
    for T in TILES:
        start = T * (step // T)
        if step % T and np.array_equal(P, np.arange(start, step)):
            return (f"output rows m >= {T} * floor(M / {T}) = {start} of every call of M = {step} rows "
                    f"(the last M mod {T} = {step % T}): output rows past the last full tile of {T} rows")
    shown = ", ".join(map(str, P[:8])) + (f", ... ({P.size} in all)" if P.size > 8 else "")
    return f"output rows {shown} of every call of M = {step} rows"


def row_pattern(first: RowReadback, second: RowReadback) -> "tuple[dict, np.ndarray] | None":
    """The output-row finding ({"where", "pattern", "n", "rows"}) and the mask of probe rows of ``first`` it
    explains, or None when the failing rows follow the input column (weights), not the row position.

    Claimed when the failing positions P of the first readback are a proper subset of the positions, the
    second readback (the same probe rows at other positions) fails exactly at P too on at least MIN_SHARE of
    its rows, and the shift moved at least one failing row onto a passing position where it passes."""
    if first.step < 2 or first.step != second.step:
        return None
    rb1, rb2 = first.bad.any(axis=1), second.bad.any(axis=1)
    if not rb1.any():
        return None
    P = np.unique(first.pos[rb1])
    if P.size >= first.step:
        return None
    in1, in2 = np.isin(first.pos, P), np.isin(second.pos, P)
    agree = (np.sum(rb1 == in1) + np.sum(rb2 == in2)) / float(rb1.size + rb2.size)
    moved = rb1 & ~in2 & ~rb2  # failed at a failing position, passes at a passing one: not its weights
    if agree < MIN_SHARE or not moved.any():
        return None
    hit = rb1 & in1
    bad_vals = np.concatenate([first.obs[hit][first.bad[hit]], second.obs[rb2 & in2][second.bad[rb2 & in2]]])
    zero = bad_vals.size and np.all(bad_vals == 0)
    how = "left at zero (not written)" if zero else "wrong"
    text = _positions_text(P, first.step)
    pattern = (f"{text}, {how} for every column, whatever the input; the same one-hot rows shifted by "
               f"{int((second.pos[0] - first.pos[0]) % first.step)} row(s) fail at the same positions "
               "(an output-row / M-tiling bug, not the weights)")
    return ({"where": "output rows", "pattern": pattern, "n": int(first.bad[hit].sum()), "rows": P.tolist(),
             "not_weights": True}, hit)
