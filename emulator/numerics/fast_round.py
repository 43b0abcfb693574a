"""The one fast rounding of float64 / float32 arrays to the float32, float16 and bfloat16 grids.

Semantics: docs/formats.md#floating-point-formats. ``floats.round_to_dtype`` is the readable definition
(guard/sticky rounding of the float64 significand, every format and mode); ``round_fast`` returns the same
values by IEEE casts and float32 bit arithmetic, for the output and compute dtypes the reference forms
(tests/emulator/test_fast_round.py proves it against ml_dtypes, NumPy's float16 cast and hand-derived grid
midpoints; why each step is exact is in the comments of ``_rne`` and ``_rtz``).

Named modes (``rounding.Rounding``, as SoftFloat names them): RNE (roundingMode_near_even) and RTZ
(roundingMode_minMag) take the fast paths; RHAZ and RHTZ, which no output stage of a real kernel uses here,
are delegated to ``round_to_dtype``.

Conventions (one for every mode and dtype):
- the result is float32 (every value of the three grids is a float32), or float64 with ``as_float64=True``;
- subnormals are produced, -0 is kept, a value rounding to zero keeps its sign;
- overflow: RNE gives +-Inf at and beyond max + ulp(max)/2; RTZ gives +-max for every finite value beyond
  max (IEEE 754-2019 §7.4); +-Inf stays +-Inf;
- NaN gives the target's quiet NaN with the sign and the top payload bits kept (``floats.encode``'s rule,
  the x86/ARM hardware convention), as the float32 that holds it.
"""

from __future__ import annotations

import numpy as np

from .rounding import Rounding, as_float64

__all__ = ["FAST_DTYPES", "round_fast"]

#: the dtypes ``round_fast`` rounds to (float32 holds each of their values exactly)
FAST_DTYPES = ("float32", "float16", "bfloat16")

#: float32 bits kept by each target: a float16 value has 10 stored significand bits (float32: 23), a
#: bfloat16 value 7
_KEEP = {"float32": np.uint32(0xFFFFFFFF), "float16": np.uint32(0xFFFFE000), "bfloat16": np.uint32(0xFFFF0000)}
_QUIET = np.uint32(0x00400000)  # float32's quiet bit; float16's and bfloat16's sit on it when widened


def _as_float32_or_64(v) -> np.ndarray:
    """``v`` as a float32 array where that is exact (float32, float16, bfloat16 input), else float64."""
    a = np.asarray(v)
    if a.dtype == np.float32:
        return a
    if a.dtype == np.float16:
        return a.astype(np.float32)
    if a.dtype.name == "bfloat16" and a.dtype.itemsize == 2:
        return (a.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    if a.dtype == np.float64:
        return a  # read only: every step below writes to new arrays
    return as_float64(a)


def _odd_float32(y: np.ndarray) -> np.ndarray:
    """float64 -> float32 by round-to-odd, as uint32 bits: truncate toward zero, then set the last bit
    where anything was dropped. Round-to-odd to a format with at least two more significand bits than the
    target (float32: 24 against 11 and 8, and 16 more in the subnormal range) makes a following RNE equal to
    one direct RNE (Boldo & Melquiond, "When double rounding is odd", 2005)."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = y.astype(np.float32)
        fin = np.isfinite(y)
        over = fin & (np.abs(f.astype(np.float64)) > np.abs(y))  # the RNE cast went away from zero: step back
    bits = f.view(np.uint32).copy()
    # |f| > 0 where over, so the magnitude decrement stays in range (Inf -> max); the masks as 0/1 integers
    # (a boolean-indexed update costs ~10x an elementwise pass)
    bits -= over.view(np.uint8)
    with np.errstate(invalid="ignore"):
        inexact = fin & (bits.view(np.float32).astype(np.float64) != y)
    bits |= inexact.view(np.uint8)
    return bits


def _rne(a: np.ndarray, dtype: str) -> np.ndarray:
    """RNE of float32 or float64 ``a`` to ``dtype``, as float32."""
    if dtype == "float32":
        if a.dtype == np.float32:
            return a
        with np.errstate(over="ignore", invalid="ignore"):
            return a.astype(np.float32)  # IEEE RNE cast
    bits = a.view(np.uint32) if a.dtype == np.float32 else _odd_float32(a)
    if dtype == "float16":
        with np.errstate(over="ignore", invalid="ignore"):  # the IEEE RNE cast (subnormals, overflow to Inf)
            return bits.view(np.float32).astype(np.float16).astype(np.float32)
    # bfloat16: the classic integer RNE on the upper 16 bits (a carry out of the significand steps the
    # exponent, and max rounds up to Inf exactly at and beyond the overflow threshold)
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    return ((bits + np.uint32(0x7FFF) + lsb) & _KEEP["bfloat16"]).view(np.float32)


def _rtz(a: np.ndarray, dtype: str) -> np.ndarray:
    """RTZ of float32 or float64 ``a`` to ``dtype``, as float32. The grids nest (bfloat16 and float16 values
    are float32 values), so RTZ to them is RTZ of RTZ to float32."""
    if a.dtype == np.float32:
        f = a
    else:  # the IEEE RNE cast, stepped back one float32 ulp where it went away from zero (Inf -> max)
        with np.errstate(over="ignore", invalid="ignore"):
            f = a.astype(np.float32)
            over = np.abs(f.astype(np.float64)) > np.abs(a)
        b = f.view(np.uint32).copy()
        b -= over.view(np.uint8)
        f = b.view(np.float32)
    if dtype == "float32":
        return f
    if dtype == "bfloat16":  # drop the low 16 bits (Inf keeps its all-zero low half)
        return (f.view(np.uint32) & _KEEP["bfloat16"]).view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # float16: the RNE cast, stepped back the same way
        h = f.astype(np.float16)
        over = np.abs(h.astype(np.float32)) > np.abs(f)
    hb = h.view(np.uint16).copy()
    hb -= over.view(np.uint8)
    return hb.view(np.float16).astype(np.float32)


def round_fast(v, dtype: str, mode: "Rounding | str" = Rounding.RNE, *, as_float64: bool = False,
               out: np.ndarray | None = None) -> np.ndarray:
    """Round each value of ``v`` to ``dtype`` ('float32' | 'float16' | 'bfloat16') under ``mode``.

    Equal to ``floats.round_to_dtype(v, dtype, mode)`` on every non-NaN input (NaN: the module docstring's
    rule); float32 out, float64 with ``as_float64``. Any float input is taken exactly (float32, float16 and
    bfloat16 without widening to float64). ``out``: a float32 array of v's shape the result is written to
    (not with ``as_float64``)."""
    mode = Rounding.parse(mode)
    if dtype not in FAST_DTYPES:
        raise ValueError(f"round_fast: unknown dtype {dtype!r}; expected one of {', '.join(FAST_DTYPES)}")
    a = _as_float32_or_64(v)
    dest = out
    if dest is not None and (as_float64 or dest.dtype != np.float32 or dest.shape != a.shape):
        raise ValueError("round_fast: out must be a float32 array of the input's shape (and not with as_float64)")
    if dest is not None and dtype == "float32" and mode is Rounding.RNE and a.dtype == np.float64:
        np.copyto(dest, a, casting="same_kind")  # the IEEE RNE cast of _rne, into dest
        return dest
    if mode is Rounding.RNE:
        out = _rne(a, dtype)
    elif mode is Rounding.RTZ:
        out = _rtz(a, dtype)
    else:
        from .floats import round_to_dtype  # the definition: RHAZ / RHTZ have no fast path

        with np.errstate(over="ignore", invalid="ignore"):
            out = round_to_dtype(a.reshape(-1), dtype, mode).astype(np.float32).reshape(a.shape)
    # float64 to float32: the IEEE cast (RNE; RTZ then leaves a NaN's bits alone) already gives the quiet NaN with
    # its sign and top payload bits, so the rule below would change nothing there: skipped (two passes)
    if not (dtype == "float32" and a.dtype == np.float64 and mode in (Rounding.RNE, Rounding.RTZ)):
        nan = np.isnan(a)
        if nan.any():
            with np.errstate(invalid="ignore"):
                nb = a[nan].astype(np.float32).view(np.uint32)  # float64 -> float32 keeps sign and top payload
            out = np.array(out, dtype=np.float32, copy=True) if out is a or not out.flags.writeable else out
            out[nan] = ((nb | _QUIET) & _KEEP[dtype]).view(np.float32)
    if as_float64:
        return out.astype(np.float64)
    if dest is not None:
        np.copyto(dest, out)
        return dest
    return out
