"""The fast rounding of float32 / float64 arrays to integers, and the saturating conversion to int32.

Semantics: docs/formats.md#rounding-modes. ``rounding.round_to_integer`` and ``rounding.quantize_to_int`` are the
readable definitions (guard/sticky rounding of the float64 significand); ``round_to_integer_fast`` and
``quantize_to_int_fast`` return the same values with a few whole-array passes, in the input's own dtype
(tests/emulator/test_fast_integer.py proves them equal to the definitions on every float32 bit pattern of the
quantizers' range and on random, tie, half, signed-zero, NaN, Inf and saturating inputs, in every mode).

RNE is NumPy's ``rint`` (IEEE 754 roundToIntegralTiesToEven under the default round-to-nearest mode, which every
NumPy operation of the fast paths assumes; the tests check it on this host). RTZ is ``trunc``; RHAZ and RHTZ are
built from it, and why each of their steps is exact (no other rounding is used):
- ``t = trunc(x)`` is exact for every float (an integer of at most the input's significand bits);
- ``d = |x - t|`` is exact: where x is not an integer, |x| < 2^p (p = 24 float32, 53 float64), x and t share
  the binade or t = 0, so the difference is representable (Sterbenz for |t| >= |x| / 2, trivially for t = 0);
  where x is an integer d = 0; for +-Inf and NaN d is NaN, every comparison below is false and t (= x) is kept;
- ``t +- 1`` is exact: it happens only where x is not an integer, i.e. |t| < 2^(p-1), so |t| + 1 <= 2^(p-1);
- the sign of zero: ``t + copysign(step, x)`` with step 0 keeps t's sign (trunc(-0.3) = -0.0 and -0.0 + -0.0 =
  -0.0), as the definition does.
"""

from __future__ import annotations

import numpy as np

from .rounding import NanToInt, Rounding, round_to_integer

__all__ = ["round_to_integer_fast", "quantize_to_int_fast"]


def round_to_integer_fast(x, mode: "Rounding | str" = Rounding.RNE, *, out: np.ndarray | None = None) -> np.ndarray:
    """``rounding.round_to_integer(x, mode)`` for a float32 or float64 ``x``, in ``x``'s dtype (every integer the
    definition returns for a float32 input is a float32; widen the result to compare). NaN stays NaN, +-Inf stays
    +-Inf, the sign of zero is kept. Other dtypes go to the definition (float64 out). ``out``: an array of ``x``'s
    shape and dtype (``x`` itself allowed) that receives the result (a fresh large array costs its page faults
    on every call)."""
    mode = Rounding.parse(mode)
    a = np.asarray(x)
    if a.dtype not in (np.float32, np.float64):
        return round_to_integer(a, mode)
    with np.errstate(invalid="ignore"):  # a signalling NaN comes back quiet, as the definition's does
        if mode is Rounding.RNE:  # IEEE roundToIntegralTiesToEven (nearbyint: one pass)
            return np.rint(a, out=out)
        if mode is Rounding.RTZ:
            return np.trunc(a, out=out)
        t = np.trunc(a)
        d = np.abs(a - t)
        up = d >= 0.5 if mode is Rounding.RHAZ else d > 0.5  # RHTZ: strictly above the half
    return np.add(t, np.copysign(up.astype(a.dtype), a), out=out)


def quantize_to_int_fast(x, lo: int, hi: int, mode: "Rounding | str" = Rounding.RNE,
                         nan: "NanToInt | str" = NanToInt.RAISE, what: str = "value", *,
                         overwrite_input: bool = False) -> np.ndarray:
    """``rounding.quantize_to_int``: round under ``mode``, saturate to [lo, hi] (+Inf to hi, -Inf to lo), NaN by
    ``nan`` (ZERO: 0, LOW: lo, RAISE: ValueError naming ``what``); int32 out.

    The clamp runs in the input's dtype where it holds lo and hi exactly (float32: |bound| <= 2^24), else in
    float64, as the definition's; a float32 integer outside [lo, hi] is clamped to the bound either way.
    ``overwrite_input``: ``x`` (a writable float32 / float64 array) may be used as the scratch buffer."""
    nan = NanToInt(nan)
    a = np.asarray(x)
    scratch = a if overwrite_input and a.dtype in (np.float32, np.float64) and a.flags.writeable else None
    r = round_to_integer_fast(a, mode, out=scratch)  # a fresh array, or x's own buffer where allowed
    if r.size and np.isnan(r.min()):  # min propagates NaN: no [M, K] mask unless there is one
        isnan = np.isnan(r)
        if nan is NanToInt.RAISE:
            raise ValueError(f"{what}: NaN cannot be quantized to an integer ({int(isnan.sum())} NaN element(s))")
        r = np.where(isnan, r.dtype.type(lo if nan is NanToInt.LOW else 0), r)
    if r.dtype == np.float32 and max(abs(lo), abs(hi)) > 2 ** 24:
        r = r.astype(np.float64)
    if r.dtype not in (np.float32, np.float64):  # another dtype: the definition's float64 result, a fresh array
        r = np.asarray(r, np.float64)
    return np.clip(r, lo, hi, out=r).astype(np.int32)
