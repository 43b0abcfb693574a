"""Numerics of the kernels: rounding a float64 value once to fp32/fp16/bf16 (RNE or RTZ), the E2M1 grid."""

from __future__ import annotations

import numpy as np

#: (significand bits incl. the implicit one, exponent of the smallest subnormal, overflow threshold exponent)
_FMT = {"float32": (24, -149, 128), "float16": (11, -24, 16), "bfloat16": (8, -133, 128)}


def round_to(v, dtype: str, mode: str = "rne") -> np.ndarray:
    """Round float64 values once to ``dtype`` (returned as float64 holding its values)."""
    v = np.asarray(v, dtype=np.float64)
    if dtype in (None, "float64", "exact"):
        return v.copy()
    p, emin_sub, emax = _FMT[dtype]
    with np.errstate(all="ignore"):
        _, e = np.frexp(v)  # v = m 2^e, 0.5 <= |m| < 1
        q = np.ldexp(1.0, np.maximum(e - p, emin_sub))
        t = v / q
        r = (np.rint(t) if mode == "rne" else np.trunc(t)) * q
        big = np.abs(r) >= np.ldexp(1.0, emax)
        if mode == "rne":
            r = np.where(big, np.copysign(np.inf, v), r)
        else:
            maxv = (2.0 - np.ldexp(1.0, 1 - p)) * np.ldexp(1.0, emax - 1)
            r = np.where(big & np.isfinite(v), np.copysign(maxv, v), r)
        r = np.where(np.isfinite(v), r, v)
        r = np.where(v == 0, v, r)  # keep the sign of zero
    return r


def as_f64(a) -> np.ndarray:
    """Any NumPy / ml_dtypes array to float64 (exact for fp32/fp16/bf16)."""
    a = np.asarray(a)
    if a.dtype == np.float64:
        return a
    return a.astype(np.float32).astype(np.float64)


E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_decode(codes: np.ndarray, lut=E2M1) -> np.ndarray:
    c = np.asarray(codes).astype(np.int64)
    mag = np.asarray(lut)[c & 7]
    return np.where(c & 8, -mag, mag)


def e2m1_round(v: np.ndarray, mode: str = "rne") -> np.ndarray:
    """Round float64 values to the E2M1 grid (values, saturating at +-6); NaN stays NaN."""
    a = np.abs(v)
    a6 = np.minimum(a, 6.0)
    idx = np.searchsorted(E2M1, a6)  # E2M1[idx-1] < a6 <= E2M1[idx]
    idx = np.clip(idx, 1, 7)
    lo, hi = E2M1[idx - 1], E2M1[idx]
    dlo, dhi = a6 - lo, hi - a6
    if mode == "rne":
        tie_pick_hi = (idx % 2) == 0  # code idx even -> hi is the even code
    else:  # "rhaz": ties away from zero
        tie_pick_hi = np.ones_like(idx, dtype=bool)
    pick_hi = (dhi < dlo) | ((dhi == dlo) & tie_pick_hi)
    r = np.where(pick_hi, hi, lo)
    r = np.where(a6 == 0, 0.0, r)
    r = np.where(np.isnan(v), np.nan, r)
    return np.copysign(r, v)
