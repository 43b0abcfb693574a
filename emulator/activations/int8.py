"""Dynamic int8 activation quantization (the A8 of W8A8 and W4A8).

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

Each choice that real kernels make differently is a field of ``Int8ActVariant``:
the tie rule, the form of the quotient, the scale formula, the clamp range,
the scale's dtype, the zero-row rule, per-token or per-tensor granularity,
where the azp is added, and one whole other scheme, KleidiAI's ``qa8dx``
(``Int8Scheme.KAI_QA8DX``, below).
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
    "ScaleFormula",
    "Granularity",
    "Int8Scheme",
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


class ScaleFormula(str, enum.Enum):
    """How the scale is formed from the row's range R (amax, or max - min) and the divisor D
    (127 symmetric, 255 asymmetric).

    - DIVIDE: fl32(R / D)  (canonical; one IEEE fp32 division)
    - RECIP_MUL: fl32(R * fl32(1 / D))  (ARK ``woqgemm_s8``: ``DnnlWrapper::dyn_quant_s8`` multiplies amax by
      the fp32 constant 1/127); differs from DIVIDE for about 4.5 % of bf16/fp16 amax values
    """

    DIVIDE = "divide"
    RECIP_MUL = "recip_mul"


class Granularity(str, enum.Enum):
    """Which elements share one scale (and zero point).

    - PER_TOKEN: each row of x [M, K] (canonical)
    - PER_TENSOR: the whole tensor, one amax (or min/max) over all M rows (ARK ``woqgemm_s8``); equal to
      PER_TOKEN when M = 1
    """

    PER_TOKEN = "per_token"
    PER_TENSOR = "per_tensor"


class Int8Scheme(str, enum.Enum):
    """The quantization scheme as a whole.

    - MINMAX (canonical): the symmetric (amax / 127) or azp (min/max, 255 levels) scheme above,
      chosen by ``Int8ActVariant.symmetric`` and modified by the other fields.
    - KAI_QA8DX: KleidiAI's asymmetric per-row "qa8dx" LHS quantization, as pytorch's
      ``_dyn_quant_matmul_4bit`` runs it (KleidiAI ``kai_lhs_quant_pack_qai8dxp_f32`` on Arm; on x86 the
      reference fallback ``ref_dyn_quant_matmul_4bit_{channelwise,groupwise}_kernel`` in
      ``aten/src/ATen/native/cpu/int4mm_kernel.cpp``), every step in fp32::

          rmin = min(0, min_k x),  rmax = max(0, max_k x)            (the range always includes 0)
          inv  = 1 if rmin == rmax else fl32(255 / fl32(rmax - rmin))  (the quantization multiplier)
          scale = fl32(1 / inv)                                        (the dequantization scale)
          dmin = fl32(rmin * inv),  dmax = fl32(rmax * inv)
          zf   = fl32(-128 - dmin) if fl32(fl32(-128 + dmin) + fl32(127 + dmax)) > 0 else fl32(127 - dmax)
          zp   = RNE(clamp(zf, -128, 127))                             ("nudged" zero point; lrintf)
          q    = sat[-128, 127]( round(fl32(x * inv)) + zp )           (round = ``rounding``)

      A zero row has inv = 1, scale = 1, zp = 127 and every code equal to zp. The C sources round the
      codes with ``std::round`` / ``roundf`` (RHAZ): declare ``rounding=rhaz``. The scheme fixes the
      range, the multiplier, the scale and the zero point, so ``symmetric`` is ignored and the fields
      that would change them (``reciprocal``, ``scale_formula``, ``granularity``, ``zero_row``,
      ``qmin``/``qmax``, ``scale_dtype``, ``azp_before_rounding``) must keep their defaults.
    """

    MINMAX = "minmax"
    KAI_QA8DX = "kai_qa8dx"


@dataclasses.dataclass(frozen=True)
class Int8ActVariant:
    """Every choice in dynamic int8 activation quantization. Defaults are canonical.

    ``dequant_scale_dtype``: the scale that multiplies the integer accumulator is the quantization scale
    rounded (RNE) to this dtype, while the quotient uses the unrounded (``scale_dtype``) scale; None
    (canonical): one scale for both. ZenDNN's dynamic quantization in zentorch
    (``zentorch_dynamic_qlinear``: fp32 scale for ``x / s``, the scale cast to the bf16 weight-scale dtype
    for the epilogue; measured, backends/zentorch.py ``zendnn_dynamic_quant``).

    ``azp_before_rounding`` (asymmetric MINMAX only): the zero point is added to the fp32 quotient
    *before* the integer rounding, ``q = sat(round(fl32(fl32(x / scale) + azp)))`` (vLLM's x86 oneDNN
    path, ``csrc/cpu/dnnl_kernels.cpp::dynamic_scaled_int8_quant_impl`` with azp), instead of the
    canonical ``sat(round(fl32(x / scale)) + azp)``. The two differ where the quotient is a tie and azp
    is odd, and where the fp32 addition itself rounds.
    """

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
    scale_formula: ScaleFormula = ScaleFormula.DIVIDE
    granularity: Granularity = Granularity.PER_TOKEN
    azp_before_rounding: bool = False
    scheme: Int8Scheme = Int8Scheme.MINMAX
    dequant_scale_dtype: str | None = None  # the scale that dequantizes is rounded (RNE) to this dtype; the quotient keeps the scale_dtype one

    def __post_init__(self):
        object.__setattr__(self, "rounding", Rounding.parse(self.rounding))
        object.__setattr__(self, "reciprocal", Reciprocal(self.reciprocal))
        object.__setattr__(self, "zero_row", ZeroRowRule(self.zero_row))
        object.__setattr__(self, "nan_to_int", NanToInt(self.nan_to_int))
        object.__setattr__(self, "scale_formula", ScaleFormula(self.scale_formula))
        object.__setattr__(self, "granularity", Granularity(self.granularity))
        object.__setattr__(self, "scheme", Int8Scheme(self.scheme))
        if self.scale_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"scale_dtype must be float32, bfloat16 or float16, got {self.scale_dtype!r}")
        if self.dequant_scale_dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(f"dequant_scale_dtype must be None, float32, bfloat16 or float16, "
                             f"got {self.dequant_scale_dtype!r}")
        if not (-128 <= self.qmin < self.qmax <= 127):
            raise ValueError(f"int8 clamp range [{self.qmin}, {self.qmax}] is not inside [-128, 127]")
        if self.zero_row is ZeroRowRule.EPS and not self.eps > 0:
            raise ValueError("ZeroRowRule.EPS needs eps > 0")
        if self.scheme is Int8Scheme.KAI_QA8DX:
            fixed = {"reciprocal": Reciprocal.DIVIDE, "scale_formula": ScaleFormula.DIVIDE,
                     "granularity": Granularity.PER_TOKEN, "zero_row": ZeroRowRule.ZERO, "qmin": -128, "qmax": 127,
                     "scale_dtype": "float32", "azp_before_rounding": False, "dequant_scale_dtype": None}
            bad = [k for k, val in fixed.items() if getattr(self, k) != val]
            if bad:
                raise ValueError(f"scheme kai_qa8dx fixes its range, multiplier, scale and zero point; "
                                 f"{', '.join(bad)} cannot be changed")
            return
        if not self.symmetric and self.reciprocal is Reciprocal.RECIP_AMAX:
            raise ValueError("Reciprocal.RECIP_AMAX (127/amax) is defined for symmetric quantization only")
        if self.azp_before_rounding and self.symmetric:
            raise ValueError("azp_before_rounding is defined for the asymmetric (azp) scheme only")

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
    """Quantize x [M, K] to int8, one scale per row (or per tensor: ``variant.granularity``).

    See the module docstring; ``scale`` and ``zero_point`` are always [M, 1] (a per-tensor scale is
    repeated on every row).
    """
    x32 = _check_input(x)
    if np.any(np.isnan(x32)):
        raise FormatError("NaN in activations: per-token int8 quantization is undefined for NaN input", tensor="x")
    if variant.scheme is Int8Scheme.KAI_QA8DX:
        return _quantize_kai_qa8dx(x32, variant)
    if variant.symmetric:
        return _quantize_sym(x32, variant)
    return _quantize_asym(x32, variant)


def _reduce(v: np.ndarray, fn, variant: Int8ActVariant) -> np.ndarray:
    """Row-wise (or tensor-wise, repeated on every row) reduction of x [M, K] to [M, 1]."""
    r = fn(v, axis=1, keepdims=True)
    if variant.granularity is Granularity.PER_TENSOR:
        r = np.broadcast_to(fn(r, axis=0, keepdims=True), r.shape).copy()
    return r.astype(np.float32)


def _scale(rng32: np.ndarray, divisor: float, v: Int8ActVariant) -> np.ndarray:
    """scale = fl32(R / D) (DIVIDE) or fl32(R * fl32(1 / D)) (RECIP_MUL), then rounded to ``scale_dtype``."""
    with np.errstate(over="ignore"):
        if v.scale_formula is ScaleFormula.DIVIDE:
            scale = (rng32 / np.float32(divisor)).astype(np.float32)
        else:
            scale = (rng32 * (np.float32(1.0) / np.float32(divisor)).astype(np.float32)).astype(np.float32)
    return _as_f32(scale.astype(np.float64), v.scale_dtype)


def _dequant_scale(scale: np.ndarray, v: Int8ActVariant) -> np.ndarray:
    return scale if v.dequant_scale_dtype is None else _as_f32(scale.astype(np.float64), v.dequant_scale_dtype)


def _quantize_sym(x32: np.ndarray, v: Int8ActVariant) -> Int8Activations:
    amax = _reduce(np.abs(x32), np.max, v)
    if v.zero_row is ZeroRowRule.EPS:
        amax = np.maximum(amax, np.float32(v.eps)).astype(np.float32)
    scale = _scale(amax, 127.0, v)
    quotient = _divide(x32, scale, amax, v)
    zero_rows = (amax == 0)[:, 0]
    if v.zero_row is ZeroRowRule.ZERO:
        quotient[zero_rows] = 0.0
    q = quantize_to_int(quotient, v.qmin, v.qmax, v.rounding, nan=v.nan_to_int, what="x / scale")
    tie = _is_tie(quotient)
    zp = np.zeros((x32.shape[0], 1), dtype=np.int32)
    return Int8Activations(q=q, scale=_dequant_scale(scale, v), zero_point=zp, quotient=quotient, tie=tie)


def _quantize_asym(x32: np.ndarray, v: Int8ActVariant) -> Int8Activations:
    xmax = _reduce(x32, np.max, v)
    xmin = _reduce(x32, np.min, v)
    with np.errstate(over="ignore"):
        span = (xmax - xmin).astype(np.float32)
    if v.zero_row is ZeroRowRule.EPS:
        span = np.maximum(span, np.float32(v.eps)).astype(np.float32)
    scale = _scale(span, 255.0, v)
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
    if v.azp_before_rounding:
        # the fp32 sum fl32(x / scale + azp) is what gets rounded (azp is an integer below 2**24: exact)
        with np.errstate(invalid="ignore", over="ignore"):
            shifted = (quotient + azp.astype(np.float32)).astype(np.float32)
        r = quantize_to_int(shifted, -(2**31) + 1, 2**31 - 1, v.rounding, nan=v.nan_to_int, what="x / scale + azp")
        q = np.clip(r.astype(np.int64), v.qmin, v.qmax).astype(np.int32)
        return Int8Activations(q=q, scale=_dequant_scale(scale, v), zero_point=azp.astype(np.int32),
                               quotient=shifted, tie=_is_tie(shifted))
    r = quantize_to_int(quotient, -(2**31) + 1, 2**31 - 1, v.rounding, nan=v.nan_to_int, what="x / scale")
    q = np.clip(r.astype(np.int64) + azp, v.qmin, v.qmax).astype(np.int32)
    return Int8Activations(q=q, scale=_dequant_scale(scale, v), zero_point=azp.astype(np.int32), quotient=quotient,
                           tie=_is_tie(quotient))


def _quantize_kai_qa8dx(x32: np.ndarray, v: Int8ActVariant) -> Int8Activations:
    """KleidiAI qa8dx (see ``Int8Scheme.KAI_QA8DX``): every operation an IEEE fp32 one."""
    f = np.float32
    rmin = np.minimum(f(0), x32.min(axis=1, keepdims=True)).astype(f)
    rmax = np.maximum(f(0), x32.max(axis=1, keepdims=True)).astype(f)
    same = rmin == rmax
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        span = (rmax - rmin).astype(f)
        inv = np.where(same, f(1), (f(255) / np.where(same, f(1), span)).astype(f)).astype(f)
        scale = np.where(inv == 0, f(0), (f(1) / inv).astype(f)).astype(f)  # the source guards 1/0 with 0
        dmin = (rmin * inv).astype(f)
        dmax = (rmax * inv).astype(f)
        err = ((f(-128) + dmin).astype(f) + (f(127) + dmax).astype(f)).astype(f)
        zf = np.where(err > 0, (f(-128) - dmin).astype(f), (f(127) - dmax).astype(f)).astype(f)
        zf = np.clip(zf, f(-128), f(127))
        quotient = (x32 * inv).astype(f)
    zp = quantize_to_int(zf, -128, 127, Rounding.RNE, nan=NanToInt.RAISE, what="qa8dx zero point")
    r = quantize_to_int(quotient, -(2**31) + 1, 2**31 - 1, v.rounding, nan=v.nan_to_int, what="x * inv")
    q = np.clip(r.astype(np.int64) + zp, -128, 127).astype(np.int32)
    return Int8Activations(q=q, scale=scale, zero_point=zp.astype(np.int32), quotient=quotient,
                           tie=_is_tie(quotient))


def _is_tie(quotient: np.ndarray) -> np.ndarray:
    f = quotient.astype(np.float64)
    with np.errstate(invalid="ignore"):
        return np.isfinite(f) & (f - np.floor(f) == 0.5)


def dequantize_int8_per_token(acts: Int8Activations) -> np.ndarray:  # noqa: D401
    """x_hat = (q - zp) * scale, exact in float64 [M, K]."""
    return (acts.q.astype(np.float64) - acts.zero_point) * acts.scale.astype(np.float64)
