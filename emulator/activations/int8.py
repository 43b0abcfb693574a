"""Dynamic per-token int8 activation quantization (the A8 of W8A8 and W4A8).

Semantics: docs/formats/activations.md#int8-dynamic-per-token.

Canonical symmetric scheme (vLLM's compressed-tensors W8A8 reference,
``tests/kernels/quant_utils.py::ref_dynamic_per_token_quant``, with the
quantize step by division as in its static path and the ONNX spec):

    amax  = max_k |x[m, k]|                      (x widened exactly to float32)
    scale = fl32(amax / 127)                      (an fp32 division)
    q     = sat[-128, 127]( RNE( fl32(x / scale) ) )
    amax = 0  ->  scale = 0, q = 0                (the CUDA kernel's zero-row rule)

Canonical asymmetric (azp) scheme (vLLM ``dynamic_scaled_int8_azp_quant``):

    scale = fl32((max - min) / 255),  azp = RNE(-128 - fl32(min / scale))
    q     = sat[-128, 127]( RNE(fl32(x / scale)) + azp )

Each choice that real kernels make differently is a field of ``Int8ActVariant``.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np

from ..errors import FormatError
from ..numerics.floats import round_to_dtype
from ..numerics.rounding import NanToInt, Rounding, as_float64, quantize_to_int

__all__ = [
    "Reciprocal",
    "ZeroRowRule",
    "Int8ActVariant",
    "CANONICAL_SYM",
    "CANONICAL_ASYM",
    "Int8Activations",
    "quantize_int8_per_token",
    "dequantize_int8_per_token",
]


class Reciprocal(str, enum.Enum):
    """How x is divided by the scale.

    - DIVIDE: fl32(x / scale)  (canonical; vLLM static quant, ONNX QuantizeLinear, XPU reference)
    - RECIP_AMAX: fl32(x * fl32(127 / amax))  (vLLM CUDA dynamic kernel, vLLM Triton, SGL CPU)
    - RECIP_SCALE: fl32(x * fl32(1 / scale))  (vLLM x86 oneDNN path, torchao, vLLM test reference)
    """

    DIVIDE = "divide"
    RECIP_AMAX = "recip_amax"
    RECIP_SCALE = "recip_scale"


class ZeroRowRule(str, enum.Enum):
    """What a row with amax = 0 (or max = min for azp) becomes.

    - ZERO: scale 0, codes 0 (canonical; vLLM CUDA guards 1/0)
    - EPS: amax is clamped to ``eps`` first (Triton 1e-10, XPU 1e-5, SGL CPU 1e-7, torchao eps)
    - NAN: no guard: 0/0 -> NaN codes, converted by the kernel's NaN rule (x86 oneDNN path)
    """

    ZERO = "zero"
    EPS = "eps"
    NAN = "nan"


@dataclasses.dataclass(frozen=True)
class Int8ActVariant:
    """Every choice in dynamic per-token int8 quantization. Defaults are canonical."""

    symmetric: bool = True
    rounding: Rounding = Rounding.RNE
    reciprocal: Reciprocal = Reciprocal.DIVIDE
    qmin: int = -128
    qmax: int = 127
    scale_dtype: str = "float32"  # scale rounded (RNE) to this dtype before use: float32 | bfloat16 | float16
    zero_row: ZeroRowRule = ZeroRowRule.ZERO
    eps: float = 0.0
    nan_to_int: NanToInt = NanToInt.ZERO  # what a NaN quotient becomes (only reachable with ZeroRowRule.NAN)
    uint8_zp128: bool = False  # store q + 128 as uint8 (vLLM SGL CPU W4A8 path)

    def __post_init__(self):
        object.__setattr__(self, "rounding", Rounding.parse(self.rounding))
        object.__setattr__(self, "reciprocal", Reciprocal(self.reciprocal))
        object.__setattr__(self, "zero_row", ZeroRowRule(self.zero_row))
        object.__setattr__(self, "nan_to_int", NanToInt(self.nan_to_int))
        if self.scale_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"scale_dtype must be float32, bfloat16 or float16, got {self.scale_dtype!r}")
        if not (-128 <= self.qmin < self.qmax <= 127):
            raise ValueError(f"int8 clamp range [{self.qmin}, {self.qmax}] is not inside [-128, 127]")
        if not self.symmetric and self.reciprocal is Reciprocal.RECIP_AMAX:
            raise ValueError("Reciprocal.RECIP_AMAX (127/amax) is defined for symmetric quantization only")
        if self.zero_row is ZeroRowRule.EPS and not self.eps > 0:
            raise ValueError("ZeroRowRule.EPS needs eps > 0")

    def describe(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.value if isinstance(v, enum.Enum) else v
        return out


CANONICAL_SYM = Int8ActVariant()
CANONICAL_ASYM = Int8ActVariant(symmetric=False)


@dataclasses.dataclass
class Int8Activations:
    """Result of per-token quantization of x [M, K].

    ``q`` holds the signed codes (int32 for arithmetic), ``scale`` the float32
    per-row scale [M, 1], ``zero_point`` the int32 azp [M, 1] (0 when symmetric).
    ``quotient`` is the float32 value that was rounded, and ``tie`` marks the
    elements whose quotient is exactly halfway between two integers: a kernel
    that follows a different tie rule differs from the reference exactly there.
    """

    q: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray
    quotient: np.ndarray
    tie: np.ndarray

    def stored(self, variant: Int8ActVariant) -> np.ndarray:
        """Codes as the kernel stores them: int8, or uint8 q+128 for the zp128 variant."""
        if variant.uint8_zp128:
            return (self.q + 128).astype(np.uint8)
        return self.q.astype(np.int8)


def _as_f32(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 values to ``dtype`` (RNE) and return them as float32."""
    return round_to_dtype(x, dtype).astype(np.float32)


def _check_input(x) -> np.ndarray:
    x64 = as_float64(x)
    if x64.ndim != 2:
        raise FormatError(f"expected activations [M, K], got shape {list(x64.shape)}", tensor="x")
    x32 = x64.astype(np.float32)
    fin = np.isfinite(x64)
    if not np.array_equal(x32[fin].astype(np.float64), x64[fin]):
        raise FormatError("activations must be exactly representable in float32 (fp32, fp16 or bf16 values)", tensor="x")
    return x32


def _divide(x32: np.ndarray, scale32: np.ndarray, amax32: np.ndarray, v: Int8ActVariant) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if v.reciprocal is Reciprocal.DIVIDE:
            return (x32 / scale32).astype(np.float32)
        if v.reciprocal is Reciprocal.RECIP_AMAX:
            inv = (np.float32(127.0) / amax32).astype(np.float32)
            return (x32 * inv).astype(np.float32)
        inv = (np.float32(1.0) / scale32).astype(np.float32)
        return (x32 * inv).astype(np.float32)


def quantize_int8_per_token(x, variant: Int8ActVariant = CANONICAL_SYM) -> Int8Activations:
    """Quantize each row of x [M, K] to int8 with its own scale (see module docstring)."""
    x32 = _check_input(x)
    if np.any(np.isnan(x32)):
        raise FormatError("NaN in activations: per-token int8 quantization is undefined for NaN input", tensor="x")
    if variant.symmetric:
        return _quantize_sym(x32, variant)
    return _quantize_asym(x32, variant)


def _quantize_sym(x32: np.ndarray, v: Int8ActVariant) -> Int8Activations:
    amax = np.abs(x32).max(axis=1, keepdims=True).astype(np.float32)
    if v.zero_row is ZeroRowRule.EPS:
        amax = np.maximum(amax, np.float32(v.eps)).astype(np.float32)
    with np.errstate(over="ignore"):
        scale = (amax / np.float32(127.0)).astype(np.float32)
    scale = _as_f32(scale.astype(np.float64), v.scale_dtype)
    quotient = _divide(x32, scale, amax, v)
    zero_rows = (amax == 0)[:, 0]
    if v.zero_row is ZeroRowRule.ZERO:
        quotient[zero_rows] = 0.0
    q = quantize_to_int(quotient, v.qmin, v.qmax, v.rounding, nan=v.nan_to_int, what="x / scale")
    tie = _is_tie(quotient)
    zp = np.zeros((x32.shape[0], 1), dtype=np.int32)
    return Int8Activations(q=q, scale=scale, zero_point=zp, quotient=quotient, tie=tie)


def _quantize_asym(x32: np.ndarray, v: Int8ActVariant) -> Int8Activations:
    xmax = x32.max(axis=1, keepdims=True)
    xmin = x32.min(axis=1, keepdims=True)
    with np.errstate(over="ignore"):
        span = (xmax - xmin).astype(np.float32)
    if v.zero_row is ZeroRowRule.EPS:
        span = np.maximum(span, np.float32(v.eps)).astype(np.float32)
    scale = (span / np.float32(255.0)).astype(np.float32)
    scale = _as_f32(scale.astype(np.float64), v.scale_dtype)
    degenerate = (scale == 0)[:, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        min_q = (xmin / scale).astype(np.float32)
    azp_real = (np.float32(-128.0) - min_q).astype(np.float32)
    if v.zero_row is ZeroRowRule.ZERO:
        azp_real[degenerate] = 0.0
    azp = quantize_to_int(azp_real, -(2**31) + 1, 2**31 - 1, Rounding.RNE, nan=v.nan_to_int, what="azp")
    quotient = _divide(x32, scale, xmax, v)
    if v.zero_row is ZeroRowRule.ZERO:
        # max == min: every element equals min; the canonical codes are -128 + 0 with scale 0.
        quotient[degenerate] = 0.0
    r = quantize_to_int(quotient, -(2**31) + 1, 2**31 - 1, v.rounding, nan=v.nan_to_int, what="x / scale")
    q = np.clip(r.astype(np.int64) + azp, v.qmin, v.qmax).astype(np.int32)
    return Int8Activations(q=q, scale=scale, zero_point=azp.astype(np.int32), quotient=quotient, tie=_is_tie(quotient))


def _is_tie(quotient: np.ndarray) -> np.ndarray:
    f = quotient.astype(np.float64)
    with np.errstate(invalid="ignore"):
        return np.isfinite(f) & (f - np.floor(f) == 0.5)


def dequantize_int8_per_token(acts: Int8Activations) -> np.ndarray:
    """x_hat = (q - zp) * scale, exact in float64 [M, K]."""
    return (acts.q.astype(np.float64) - acts.zero_point) * acts.scale.astype(np.float64)
