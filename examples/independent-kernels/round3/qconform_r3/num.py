"""Numerics from docs/formats.md: one rounding of a float64 value to fp32/fp16/bf16/tf32 (RNE), E2M1."""

from __future__ import annotations

import numpy as np

#: precision p (significand bits with the implicit one), smallest exponent of a normal, largest finite value
FMT = {
    "float32": (24, -126, float(np.finfo(np.float32).max)),
    "float16": (11, -14, 65504.0),
    "bfloat16": (8, -126, float.fromhex("0x1.fep127")),
    "tf32": (11, -126, float.fromhex("0x1.ffcp127")),
}


def f64(a) -> np.ndarray:
    a = np.asarray(a)
    return a if a.dtype == np.float64 else a.astype(np.float32).astype(np.float64)


def rnd(v, dtype: str | None) -> np.ndarray:
    """Round float64 values once (RNE) to ``dtype``; overflow past the rounding threshold gives +-Inf."""
    v = np.asarray(v, dtype=np.float64)
    if dtype in (None, "float64", "exact"):
        return v.copy()
    p, emin, mx = FMT[dtype]
    with np.errstate(all="ignore"):
        _, e = np.frexp(v)  # |v| in [2^(e-1), 2^e)
        quantum = np.ldexp(1.0, np.maximum(e - 1, emin) - (p - 1))
        r = np.rint(v / quantum) * quantum
        r = np.where(np.abs(r) > mx, np.copysign(np.inf, v), r)
        r = np.where(np.isfinite(v), r, v)
        r = np.where(v == 0, v, r)
    return r


E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_value(codes) -> np.ndarray:
    c = np.asarray(codes).astype(np.int64)
    mag = E2M1[c & 7]
    return np.where(c & 8, -mag, mag)


def e2m1_code(v, tie5_up: bool = False, zero_positive: bool = False) -> np.ndarray:
    """RNE to the E2M1 grid, saturating at 6, as codes (bit 3 = sign; -0 keeps its sign). NaN -> 0."""
    v = np.asarray(v, dtype=np.float64)
    a = np.minimum(np.abs(v), 6.0)
    a = np.where(np.isnan(a), 0.0, a)
    idx = np.clip(np.searchsorted(E2M1, a, side="left"), 1, 7)  # E2M1[idx-1] < a <= E2M1[idx] (a > 0)
    lo, hi = E2M1[idx - 1], E2M1[idx]
    d_lo, d_hi = a - lo, hi - a
    tie_hi = (idx % 2) == 0  # the even code wins a tie
    if tie5_up:
        tie_hi = tie_hi | (hi == 6.0)
    pick = np.where((d_hi < d_lo) | ((d_hi == d_lo) & tie_hi), idx, idx - 1)
    pick = np.where(a == 0, 0, pick)
    neg = np.signbit(v) & ~np.isnan(v)
    if zero_positive:
        neg = neg & (pick != 0)
    return (pick + 8 * neg).astype(np.uint8)
