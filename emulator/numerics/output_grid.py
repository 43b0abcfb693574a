"""The output grid of the reference linear layers: RNE to float32 / float16 / bfloat16, error bounds of
float64 sums, which elements a bound leaves undecided, and the boundary between two output neighbours.

Semantics: docs/formats/activations.md#reference-linear.
"""

from __future__ import annotations

import numpy as np

from ..parallel import Scratch, fresh
from .fast_round import FAST_DTYPES, round_fast

__all__ = ["OUT_DTYPES", "U64", "gamma", "rne", "round_output", "cell_test", "round_output_fast", "next_up", "overflow_threshold",
           "boundary_between"]

#: float64's unit roundoff
U64 = 2.0 ** -53
OUT_DTYPES = FAST_DTYPES
_MAX = {"float32": float(np.finfo(np.float32).max), "float16": 65504.0, "bfloat16": float.fromhex("0x1.fep127")}


def gamma(n: int, u: float = U64) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative bound of an n-term float sum."""
    nu = n * u
    if nu >= 1:
        raise ValueError(f"gamma undefined for n={n}, u={u}")
    return nu / (1.0 - nu)


def rne(v: np.ndarray, out_dtype: str) -> np.ndarray:
    """RNE to ``out_dtype``, float64 out (``fast_round.round_fast``)."""
    return round_fast(v, out_dtype, as_float64=True)


def _ends(y_exact: np.ndarray, y_bound: np.ndarray):
    """[lo, hi]: y -+ b, each rounded outward by one float64 step (a bound below half a float64 ulp of y makes
    ``y + b == y``; where y is itself a midpoint the element would otherwise look decided)."""
    pos = y_bound > 0
    with np.errstate(invalid="ignore", over="ignore"):
        lo = np.where(pos, np.nextafter(y_exact - y_bound, -np.inf), y_exact)
        hi = np.where(pos, np.nextafter(y_exact + y_bound, np.inf), y_exact)
    return lo, hi


def round_output(y_exact: np.ndarray, y_bound: np.ndarray, out_dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """RNE-round to ``out_dtype``; mark elements whose rounding the bound leaves undecided (the two ends of
    the bounded interval round to different output values, a -0 and a +0 included: a result that rounds to zero
    is a zero of the exact value's sign)."""
    y = rne(y_exact, out_dtype)
    if not np.any(y_bound):
        return y, np.zeros(y.shape, dtype=bool)
    lo, hi = _ends(y_exact, y_bound)
    rlo, rhi = rne(lo, out_dtype), rne(hi, out_dtype)
    amb = ((rlo != rhi) | (np.signbit(rlo) != np.signbit(rhi))) & np.isfinite(y_exact)
    return y, amb


#: significand bits (with the implicit one) of each output dtype
_PRECISION = {"float32": 24, "float16": 11, "bfloat16": 8}


#: one step of the magnitude of a value of each output dtype in the bits of the float32 holding it (float16 values
#: have 13 zero bits below their 10 stored ones, bfloat16 16 below their 7; for float16's subnormals, held by normal
#: float32s, the step is smaller than the true one: the test below is then only more cautious)
_STEP_BITS = {"float32": np.uint32(1), "float16": np.uint32(1 << 13), "bfloat16": np.uint32(1 << 16)}
#: the test's share of the gap below |r|: half of it, less 2^-25 of it for the outward-rounded ends and the
#: test's own roundings (``round_output_fast``); an exact float64 constant
_HALF_GAP = 0.5 - 2.0 ** -25


def cell_test(y: np.ndarray, bound: np.ndarray, out_dtype: str, *, scratch: Scratch | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(r32, r, test): r = RNE(y) to ``out_dtype`` (as float32 and as float64) and the elements whose interval
    y +- bound a cheap test does not show inside r's rounding cell (``round_output_fast``: only those need
    ``round_output``'s own test).

    The test (docs/formats/activations.md#the-a16-bound-from-row-norms, step 5): with r finite and nonzero and r'
    its output neighbour toward zero, g = |r| - |r'| (exact) is the smaller of the gaps on r's two sides (gaps never
    shrink away from zero; the overflow threshold lies g / 2 above +-max), so every real strictly within g / 2 of
    r rounds to r. Where fl(fl(|y - r|) + b) < fl(g (1/2 - 2^-25)), ``round_output``'s ends (fl(y -+ b) stepped out
    one float64 ulp: within 2^-51 |r| <= 2^-27 g of y -+ b there) both lie within g / 2 of r, the test's three
    roundings included: not ambiguous there. Every other element (r = 0, r or y not finite, a NaN bound) is
    marked for the full test. ``scratch`` (speed only): the arrays returned are its buffers (emulator/parallel.py
    ``Scratch``), valid until its next use."""
    take = fresh if scratch is None else scratch.take
    shape = np.shape(y)
    r32 = round_fast(y, out_dtype, out=take("r32", shape, np.float32))
    r = take("r", shape, np.float64)
    np.copyto(r, r32)
    below = take("below", shape, np.uint32)
    np.bitwise_and(r32.view(np.uint32), np.uint32(0x7FFFFFFF), out=below)
    below -= _STEP_BITS[out_dtype]  # |r'| (r = 0 wraps to a NaN's bits: tested)
    room, d = take("room", shape, np.float64), take("d", shape, np.float64)
    test = take("test", shape, np.bool_)
    with np.errstate(invalid="ignore", over="ignore"):
        np.copyto(d, below.view(np.float32))
        np.abs(r, out=room)
        room -= d
        room *= _HALF_GAP
        np.subtract(y, r, out=d)
        np.abs(d, out=d)
        d += bound
        np.less(d, room, out=test)
        np.logical_not(test, out=test)  # True for r = 0, r = +-Inf and every NaN
    return r32, r, test


def round_output_fast(y: np.ndarray, bound: np.ndarray, out_dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """``output_grid.round_output(y, bound, out_dtype)``, the same arrays, with its outward-rounded ends formed only
    where ``cell_test`` does not already show them inside one rounding cell."""
    _, r, test = cell_test(y, bound, out_dtype)
    amb = np.zeros(r.shape, dtype=bool)
    if test.any():
        _, amb[test] = round_output(y[test], bound[test], out_dtype)
    return r, amb


def next_up(v: np.ndarray, out_dtype: str) -> np.ndarray:
    """The next larger ``out_dtype`` value after each float64 ``v`` holding an ``out_dtype`` value (float64 out;
    the largest finite value goes to +Inf)."""
    v = np.asarray(v, dtype=np.float64)
    if out_dtype in ("float32", "float16"):
        t = np.dtype(out_dtype).type
        return np.nextafter(v.astype(t), t(np.inf)).astype(np.float64)
    # bfloat16: the upper 16 bits of a float32; one step of the magnitude is 0x10000 in its bits
    v32 = v.astype(np.float32)
    bits = v32.view(np.uint32).astype(np.int64)
    up = np.where(v32 > 0, bits + 0x10000, np.where(v32 < 0, bits - 0x10000, 0x10000))
    return up.astype(np.uint32).view(np.float32).astype(np.float64)


def overflow_threshold(out_dtype: str) -> float:
    """max + ulp(max) / 2: reals at or beyond it round to Inf (RNE), those below it to max."""
    top = _MAX[out_dtype]
    return top + (2.0 ** np.frexp(top)[1] - top) / 2


def boundary_between(y_exact: np.ndarray, y_bound: np.ndarray, out_dtype: str):
    """For elements whose bounded interval straddles a rounding boundary: (lo, hi, mu, ok). lo < hi are the
    output values the interval's ends round to; where ``ok``, they are adjacent on the output grid and mu is
    the one rounding boundary between them (their midpoint, exact in float64: two adjacent values of at most
    24 significand bits; or +-the overflow threshold beside an infinity), so the exact value v in the interval
    rounds to lo if v < mu, to hi if v > mu, and to rne(mu) (the even one) if v == mu."""
    a, b = _ends(y_exact, y_bound)
    lo, hi = rne(a, out_dtype), rne(b, out_dtype)
    thr = overflow_threshold(out_dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        mu = np.where(hi == np.inf, thr, np.where(lo == -np.inf, -thr, (lo + hi) / 2))
        finite_pair = np.isfinite(lo) & np.isfinite(hi)
        adjacent = np.where(finite_pair, next_up(np.where(finite_pair, lo, 0.0), out_dtype) == hi,
                            ((hi == np.inf) & (lo == _MAX[out_dtype])) | ((lo == -np.inf) & (hi == -_MAX[out_dtype])))
    ok = adjacent & (lo < hi) & np.isfinite(mu)
    return lo, hi, mu, ok
