"""The output grid of the reference linear layers: RNE to float32 / float16 / bfloat16, error bounds of
float64 sums, which elements a bound leaves undecided, and the boundary between two output neighbours.

Semantics: docs/formats/activations.md#reference-linear.
"""

from __future__ import annotations

import numpy as np

from .fast_round import FAST_DTYPES, round_fast

__all__ = ["OUT_DTYPES", "U64", "gamma", "rne", "round_output", "round_output_fast", "next_up", "overflow_threshold",
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


def round_output_fast(y: np.ndarray, bound: np.ndarray, out_dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """``output_grid.round_output(y, bound, out_dtype)``, the same arrays, with its outward-rounded ends formed only
    where a cheap test does not already show them inside one rounding cell.

    The test (docs/formats/activations.md#the-a16-bound-from-row-norms, step 5): with r = RNE(y) finite and nonzero, every
    real strictly within |r| 2^-(p+1) of r rounds to r (p the output's significand bits; for |r| in [2^e, 2^(e+1))
    the half-gaps to r's neighbours are 2^(e-p), 2^(e-p-1) below a power of two; fixed among subnormals; up to
    the overflow threshold above +-max). Where d = (|y - r| + b)(1 + 2^-50) + |y| 2^-50 < |r| 2^-(p+1), ``round_output``'s
    ends (fl(y -+ b) stepped out one float64 ulp: within 3 * 2^-52 |y| of y -+ b, as b < |y| there) both round to
    r: not ambiguous there either; d's three roundings lose less than its 2^-50 terms add. Every other finite
    element is tested by ``round_output`` itself, so both arrays are ``round_output``'s."""
    yr = rne(y, out_dtype)
    p = _PRECISION[out_dtype]
    with np.errstate(invalid="ignore", over="ignore"):
        d = (np.abs(y - yr) + bound) * (1.0 + 2.0 ** -50) + np.abs(y) * 2.0 ** -50
        inside = d < np.abs(yr) * 2.0 ** -(p + 1)  # False for r = 0, r = +-Inf, NaN
    test = ~inside & np.isfinite(y)
    amb = np.zeros(y.shape, dtype=bool)
    if test.any():
        _, amb[test] = round_output(y[test], bound[test], out_dtype)
    return yr, amb


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
