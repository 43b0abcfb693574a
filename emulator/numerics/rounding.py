"""Rounding modes as first-class names, and rounding of real values to integer grids.

Semantics: docs/formats.md#rounding-modes.

Every function here takes float64 inputs (any float input is first widened
exactly) and does its rounding on the integer significand of the float64
bit pattern, so no rounding is inherited from the host's FPU mode.

The four modes are the ones real quantization kernels use:

======  ===================================  =====================================
name    rule                                 seen in
======  ===================================  =====================================
RNE     nearest, ties to even                torch.round, np.rint, PTX cvt.rni
RHAZ    nearest, ties away from zero         std::round, libdevice.round (Triton)
RTZ     toward zero (truncate)               C cast, ARM vcvtq_s32_f32
RHTZ    nearest, ties toward zero            llama.cpp best_index_mxfp4, XPU fp4
======  ===================================  =====================================

All four are symmetric in sign (they act on the magnitude), which is why
sign-magnitude formats (E2M1, IEEE floats) can use them directly.
"""

from __future__ import annotations

import enum

import numpy as np

__all__ = [
    "Rounding",
    "NanToInt",
    "as_float64",
    "round_scaled_significand",
    "round_to_integer",
    "quantize_to_int",
]


class Rounding(str, enum.Enum):
    """A rounding mode for converting a real value to a coarser grid."""

    RNE = "rne"
    RHAZ = "rhaz"
    RTZ = "rtz"
    RHTZ = "rhtz"

    @classmethod
    def parse(cls, value: "Rounding | str") -> "Rounding":
        if isinstance(value, Rounding):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            names = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown rounding mode {value!r}; expected one of: {names}") from None


class NanToInt(str, enum.Enum):
    """What a saturating float -> integer conversion does with NaN.

    ZERO is the behaviour of PTX ``cvt.rni.sat.s8.f32`` (NaN -> 0) and of the
    AVX-512 path after a clamp; LOW gives the lowest code of the range (a NumPy or C cast of NaN to int32
    yields INT32_MIN on x86 before the clamp: the ONNX reference evaluator's QuantizeLinear,
    ``np.rint(x).astype(np.int32)`` then ``np.clip``); RAISE makes NaN an error (the emulator's
    choice where a NaN can only come from malformed input).
    """

    ZERO = "zero"
    LOW = "low"
    RAISE = "raise"


_F64_FRAC_BITS = 52
_F64_EXP_BIAS = 1023


def as_float64(x) -> np.ndarray:
    """Widen a float array to float64 exactly.

    bfloat16 arrays (ml_dtypes) are accepted without importing ml_dtypes:
    their bits are the upper half of a float32.
    """
    a = np.asarray(x)
    if a.dtype.name == "bfloat16" and a.dtype.itemsize == 2:
        bits = a.view(np.uint16).astype(np.uint32) << np.uint32(16)
        return bits.view(np.float32).astype(np.float64)
    if a.dtype.kind == "V":
        # Other extension floats (float8/float4/e8m0 of ml_dtypes) have other bit layouts:
        # reading them as bfloat16 bit pairs would be silently wrong.
        raise TypeError(f"unsupported extension dtype {a.dtype}; decode its bits with the format's own decoder")
    if a.dtype.kind in "iub":
        return a.astype(np.float64)
    if a.dtype.kind != "f":
        raise TypeError(f"expected a float array, got dtype {a.dtype}")
    if a.dtype.itemsize > 8:
        raise TypeError(f"{a.dtype} is wider than float64")
    with np.errstate(invalid="ignore"):  # widening a signalling NaN is exact (it comes back quiet)
        return a.astype(np.float64)


def decompose(x64: np.ndarray):
    """float64 -> (sign bool, significand uint64, exponent int64) with |x| = sig * 2**exp.

    Only meaningful for finite x; zero gives sig == 0.
    """
    bits = x64.view(np.uint64)
    sign = (bits >> np.uint64(63)).astype(bool)
    biased = ((bits >> np.uint64(_F64_FRAC_BITS)) & np.uint64(0x7FF)).astype(np.int64)
    frac = bits & np.uint64((1 << _F64_FRAC_BITS) - 1)
    normal = biased > 0
    sig = np.where(normal, frac | np.uint64(1 << _F64_FRAC_BITS), frac)
    exp = np.where(normal, biased, 1) - (_F64_EXP_BIAS + _F64_FRAC_BITS)
    return sign, sig, exp


def round_scaled_significand(sig: np.ndarray, shift: np.ndarray, mode: Rounding) -> np.ndarray:
    """Round the magnitude ``sig / 2**shift`` to an integer under ``mode``.

    ``sig`` is a uint64 integer, ``shift`` a non-negative int64 right shift.
    Uses guard (the first dropped bit) and sticky (any dropped bit below it),
    exactly as hardware does.
    """
    mode = Rounding.parse(mode)
    sig = np.asarray(sig, dtype=np.uint64)
    shift = np.asarray(shift, dtype=np.int64)
    if np.any(shift < 0):
        raise ValueError("shift must be non-negative")
    if np.any(sig >> np.uint64(60)):
        raise ValueError("significand must be below 2**60")
    # sig < 2**60, so any shift >= 61 drops every bit into the sticky bit:
    # clamping the shift to 61 is exact and keeps numpy shifts in range.
    s = np.minimum(shift, 61).astype(np.uint64)
    one = np.uint64(1)
    kept = sig >> s
    dropped = sig & ((one << s) - one)
    has_guard = s >= one
    gpos = np.where(has_guard, s - one, np.uint64(0))
    guard = has_guard & (((dropped >> gpos) & one) == one)
    sticky = has_guard & ((dropped & ((one << gpos) - one)) != 0)
    lsb = (kept & np.uint64(1)).astype(bool)
    if mode is Rounding.RNE:
        up = guard & (sticky | lsb)
    elif mode is Rounding.RHAZ:
        up = guard
    elif mode is Rounding.RHTZ:
        up = guard & sticky
    else:  # RTZ
        up = np.zeros_like(guard)
    return kept + up.astype(np.uint64)


def round_to_integer(x, mode: Rounding | str = Rounding.RNE) -> np.ndarray:
    """Round each value to an integer under ``mode``; returns float64.

    NaN stays NaN and +-Inf stays +-Inf (the saturating step, not the rounding
    step, decides what they become). The sign of zero is kept: -0.3 -> -0.0.
    """
    mode = Rounding.parse(mode)
    x64 = as_float64(x)
    out = np.array(x64, dtype=np.float64, copy=True)
    finite = np.isfinite(x64)
    if not np.any(finite):
        return out
    xf = np.where(finite, x64, 0.0)
    sign, sig, exp = decompose(xf)
    # Values with exp >= 0 are already integers.
    shift = np.where(exp < 0, -exp, 0)
    mag = round_scaled_significand(sig, shift, mode)
    rounded = np.where(exp < 0, mag.astype(np.float64), np.abs(xf))
    rounded = np.where(sign, -rounded, rounded)
    out[finite] = rounded[finite]
    return out


def quantize_to_int(
    x,
    lo: int,
    hi: int,
    mode: Rounding | str = Rounding.RNE,
    nan: NanToInt | str = NanToInt.RAISE,
    what: str = "value",
) -> np.ndarray:
    """Round to an integer under ``mode`` then saturate to ``[lo, hi]``; returns int32.

    +Inf saturates to ``hi`` and -Inf to ``lo`` (as saturating hardware
    conversions do). NaN follows ``nan``: ZERO gives 0, RAISE raises
    ValueError naming ``what``.
    """
    nan = NanToInt(nan)
    r = round_to_integer(x, mode)
    isnan = np.isnan(r)
    if np.any(isnan):
        if nan is NanToInt.RAISE:
            raise ValueError(f"{what}: NaN cannot be quantized to an integer ({int(isnan.sum())} NaN element(s))")
        r = np.where(isnan, float(lo) if nan is NanToInt.LOW else 0.0, r)
    r = np.clip(r, lo, hi)
    return r.astype(np.int32)
