"""The fast dynamic int8 activation quantizer: ``int8.quantize_int8_per_token``'s values with a few whole-array passes.

Semantics: docs/formats/activations.md#int8-dynamic-per-token (the definition is emulator/activations/int8.py,
which this module never changes). Who uses it: the dispatcher's per-call judgement of a declared quantizer
variant (emulator/tensor_levels.py ``activation_deviation``), which quantizes every call's activations twice.

What is fast, and why it is the definition's value (tests/emulator/test_int8_fast.py compares every field with
the definition on every variant of the symmetric scheme's axes):

- the per-row quantities (the amax guard, the scale, the dequantization scale) are the definition's steps on
  [M, 1] arrays, each 16-bit rounding by ``fast_round.round_fast`` (equal to ``round_to_dtype``:
  tests/emulator/test_fast_round.py), a float32 rounding by the IEEE cast;
- the quotient is one IEEE float32 operation where the arithmetic is float32: ``x / scale`` and ``x * m`` of
  float32 operands computed in float64 and rounded once to float32 (the definition) equal the correctly rounded
  float32 operation (a product of two float32 values is exact in float64; a quotient rounded to 53 bits, then
  to 24, is the correctly rounded one since 53 >= 2 * 24 + 2: innocuous double rounding); with a 16-bit
  arithmetic dtype the definition's float64 operation is kept and rounded by ``round_fast``;
- the integer rounding and saturation: ``numerics.fast_integer.quantize_to_int_fast`` (equal to
  ``quantize_to_int``).

Not sped up (the definition runs): the asymmetric and KleidiAI schemes, inputs that are not 2-D float32, empty
inputs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..numerics.fast_integer import quantize_to_int_fast
from ..numerics.fast_round import round_fast
from .int8 import (
    CANONICAL_SYM,
    Granularity,
    Int8Activations,
    Int8ActVariant,
    Int8Scheme,
    Reciprocal,
    ScaleFormula,
    SymDivisor,
    ZeroRowRule,
    quantize_int8_per_token,
)

__all__ = ["quantize_int8_fast", "dequantize_int8_fast"]


def _fast_applies(x: np.ndarray, v: Int8ActVariant) -> bool:
    return (v.symmetric and v.scheme is Int8Scheme.MINMAX and x.dtype == np.float32 and x.ndim == 2
            and x.size > 0)


def quantize_int8_fast(x, variant: Int8ActVariant = CANONICAL_SYM, *, codes_only: bool = False) -> Int8Activations:
    """``int8.quantize_int8_per_token(x, variant)``, field for field; with ``codes_only`` the ``quotient`` and
    ``tie`` fields are None (the quotient's buffer becomes the codes': one fresh [M, K] array less, whose page
    faults cost more than the arithmetic on a loaded host).

    The same errors: NaN in ``x`` raises the definition's FormatError; a NaN quotient follows ``nan_to_int``."""
    a = np.asarray(x)
    if not _fast_applies(a, variant):
        out = quantize_int8_per_token(a, variant)
        return dataclasses.replace(out, quotient=None, tie=None) if codes_only else out
    v = variant
    if v.arith_dtype == "input":  # the dtype of x as passed: float32 here
        v = dataclasses.replace(v, arith_dtype="float32")
    amax = np.maximum(a.max(axis=1, keepdims=True), -a.min(axis=1, keepdims=True)).astype(np.float64)  # exact
    if np.isnan(amax).any():  # a NaN in x (max and min propagate it): the definition's error, from the definition
        return quantize_int8_per_token(a, variant)  # (it raises)
    if v.granularity is Granularity.PER_TENSOR:
        amax = np.broadcast_to(amax.max(axis=0, keepdims=True), amax.shape)
    rng = _guarded(amax, v)
    quot_scale = _scale(rng, v)
    deq_scale = quot_scale.astype(np.float32)
    if v.dequant_scale_dtype is not None:
        deq_scale = round_fast(deq_scale, v.dequant_scale_dtype)
    quotient = _quotient(a, quot_scale, rng, v)
    if v.zero_row is ZeroRowRule.ZERO:
        quotient[(amax == 0)[:, 0]] = 0.0
    q = quantize_to_int_fast(quotient, v.qmin, v.qmax, v.rounding, nan=v.nan_to_int, what="x / scale",
                             overwrite_input=codes_only)
    zp = np.zeros((a.shape[0], 1), np.int32)
    if codes_only:
        return Int8Activations(q=q, scale=deq_scale, zero_point=zp, quotient=None, tie=None)
    with np.errstate(invalid="ignore"):
        tie = np.isfinite(quotient) & (quotient - np.floor(quotient) == 0.5)
    return Int8Activations(q=q, scale=deq_scale, zero_point=zp, quotient=quotient, tie=tie)


def _guarded(amax: np.ndarray, v: Int8ActVariant) -> np.ndarray:
    """The range the scale is formed from: amax, clamped to ``eps`` (EPS) or 1 where 0 (UNIT_RANGE)."""
    if v.zero_row is ZeroRowRule.EPS:
        return np.maximum(amax, np.float64(np.float32(v.eps)))
    if v.zero_row is ZeroRowRule.UNIT_RANGE:
        return np.where(amax == 0, 1.0, amax)
    return amax


#: ZeroRowRule.DTYPE_EPS: a zero scale becomes the arithmetic dtype's machine epsilon (the definition's values)
_DTYPE_EPS = {"float32": 2.0 ** -23, "bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}


def _divisor(v: Int8ActVariant) -> float:
    return 127.0 if v.sym_divisor is SymDivisor.QMAX else (v.qmax - v.qmin) / 2.0


def _scale(rng: np.ndarray, v: Int8ActVariant) -> np.ndarray:
    """The quotient's scale [M, 1], float64: fl(R / D) or fl(R * fl(1 / D)) in the arithmetic dtype, rounded to
    ``scale_dtype``, a zero one replaced under DTYPE_EPS."""
    with np.errstate(over="ignore", invalid="ignore"):
        if v.scale_formula is ScaleFormula.DIVIDE:
            scale = _rounded(rng / _divisor(v), v.arith_dtype)
        else:
            scale = _rounded(rng * _rounded(np.float64(1.0 / _divisor(v)), v.arith_dtype), v.arith_dtype)
    scale = round_fast(scale, v.scale_dtype, as_float64=True)
    if v.zero_row is ZeroRowRule.DTYPE_EPS:
        scale = np.where(scale == 0, _DTYPE_EPS[v.arith_dtype], scale)
    return scale


def _quotient(x: np.ndarray, scale: np.ndarray, rng: np.ndarray, v: Int8ActVariant) -> np.ndarray:
    """The float32 quotient in the form ``v.reciprocal`` names (module docstring); a fresh writable array."""
    if v.reciprocal is Reciprocal.RECIP_AMAX:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            mult = _rounded(_divisor(v) / rng, v.arith_dtype)
    elif v.reciprocal is Reciprocal.RECIP_SCALE:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            mult = _rounded(1.0 / scale, v.arith_dtype)
    else:
        mult = None
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if v.arith_dtype == "float32":
            if mult is None:
                return np.divide(x, scale.astype(np.float32), dtype=np.float32)  # scale: float32 values
            return np.multiply(x, mult.astype(np.float32), dtype=np.float32)
        x64 = x.astype(np.float64)  # 16-bit arithmetic: the definition's float64 operation, rounded once
        op = x64 / scale if mult is None else x64 * mult
        return round_fast(op, v.arith_dtype)


def _rounded(a: np.ndarray, dtype: str) -> np.ndarray:
    """float64 ``a`` rounded (RNE) to the arithmetic dtype, as float64."""
    if dtype == "float32":
        with np.errstate(over="ignore", invalid="ignore"):
            return a.astype(np.float32).astype(np.float64)
    return round_fast(a, dtype, as_float64=True)


def dequantize_int8_fast(acts: Int8Activations) -> np.ndarray:
    """``int8.dequantize_int8_per_token``: (q - zp) * scale in float64 (exact: an int8 code times a float32)."""
    q = acts.q.astype(np.float64)
    if acts.zero_point.any():
        q -= acts.zero_point
    with np.errstate(invalid="ignore"):  # 0 * Inf: NaN, as the definition's
        return q * acts.scale.astype(np.float64)
