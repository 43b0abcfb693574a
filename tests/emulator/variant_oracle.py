"""Test helper: ``(q - z) * s`` under a named variant, computed without the emulator.

An oracle for int_common.dequantize_affine (docs/formats/gptq.md#dequantization) that shares
none of its code: every intermediate value is exact in float64 (integers of at most 9
significant bits times scales of at most 24; differences of members of the compute dtype
whose exponents differ by at most 9; FLOAT_ZERO's sum, at most 24 + 11 bits), and each
rounding of the definition is a numpy / ml_dtypes cast:

- float64 -> float32 and float64 -> float16 are numpy's direct, correctly rounded (RNE) casts;
- float64 -> bfloat16: ml_dtypes casts float64 through float32 with RNE, which can round
  twice, so the oracle rounds to float32 *to odd* first (truncate, then set the last bit if
  anything was cut off) and then casts to bfloat16 with RNE: with 24 >= 8 + 2 bits the
  result is the correctly rounded one (Boldo & Melquiond, "When double rounding is odd", 2005);
- RTZ is RNE followed, where RNE moved away from zero, by one step of the raw bits toward
  zero (an overflow to Inf becomes the largest finite value, as round-toward-zero gives).

RHAZ / RHTZ are not covered here (tests/emulator/test_rounding.py covers those modes).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

_BITS = {"float32": np.uint32, "float16": np.uint16, "bfloat16": np.uint16}


def _round_to_odd_f32(x64: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounded to odd: truncated toward zero, last bit set when inexact."""
    y = x64.astype(np.float32)
    bits = y.view(np.uint32).copy()
    away = np.abs(y.astype(np.float64)) > np.abs(x64)  # RNE went up in magnitude (or overflowed)
    bits[away] -= 1
    inexact = (bits.view(np.float32).astype(np.float64) != x64) & ~np.isnan(x64)
    bits[inexact] |= 1
    return bits.view(np.float32)


def round_to(x64: np.ndarray, dtype: str, rtz: bool = False) -> np.ndarray:
    """float64 values -> the nearest members of ``dtype`` (RNE, or RTZ), as float64."""
    x64 = np.asarray(x64, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "bfloat16":
            y = _round_to_odd_f32(x64).astype(ml_dtypes.bfloat16)
        else:
            y = x64.astype(np.dtype(dtype))
    if rtz:
        away = np.abs(y.astype(np.float64)) > np.abs(x64)  # False for NaN
        bits = y.view(_BITS[dtype]).copy()
        bits[away] -= 1  # sign-magnitude: one unit less magnitude, same sign
        y = bits.view(y.dtype)
    return y.astype(np.float64)


def affine_oracle(q, z, s, *, order="sub_then_mul", scale_dtype=None, compute_dtype="float32",
                  compute_rounding="rne", zero_dtype=None, midpoint=0) -> np.ndarray:
    """float32 ``(q - z) * s`` of integer q, z and float s (any float dtype), under a named variant."""
    assert compute_rounding in ("rne", "rtz"), compute_rounding
    rtz = compute_rounding == "rtz"
    c = compute_dtype
    qi, zi = np.asarray(q).astype(np.int64), np.asarray(z).astype(np.int64)
    s64 = np.asarray(s).astype(np.float64)
    if scale_dtype is not None:
        s64 = round_to(s64, scale_dtype)  # a load-time cast: always RNE
    s_c = round_to(s64, c, rtz)  # the operand's conversion to the compute dtype
    with np.errstate(invalid="ignore"):
        if order == "sub_then_mul":
            w = round_to((qi - zi) * s_c, c, rtz)
        elif order == "mul_then_sub":
            w = round_to(round_to(qi * s_c, c, rtz) - round_to(zi * s_c, c, rtz), c, rtz)
        else:  # float_zero: zero = round_Z((m - z) * s_C), w = round_C((q - m) * s_C + zero)
            zero = round_to((midpoint - zi) * s_c, zero_dtype or c)
            w = round_to((qi - midpoint) * s_c + zero, c, rtz)
    return w.astype(np.float32)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal float32 arrays bit for bit, any NaN equal to any NaN."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != np.float32 or b.dtype != np.float32 or a.shape != b.shape:
        return False
    both_nan = np.isnan(a) & np.isnan(b)
    return bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | both_nan))
