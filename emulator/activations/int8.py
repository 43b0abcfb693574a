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
from ..numerics.rounding import NanToInt, Rounding, as_float64, quantize_to_int, round_to_integer

__all__ = [
    "Reciprocal",
    "ZeroRowRule",
    "AzpClampNan",
    "ScaleFormula",
    "Granularity",
    "Int8Scheme",
    "SymDivisor",
    "RangeRule",
    "AzpDomain",
    "Int32Saturation",
    "AzpOverflow",
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
    - DTYPE_EPS: a scale that comes out 0 is replaced by the machine epsilon of the dtype it is computed
      in (2**-23 fp32, 2**-7 bf16, 2**-10 fp16) *after* the zero point was formed from the zero scale
      (compressed-tensors ``calculate_qparams``: ``torch.where(scales == 0, eps, scales)``; its zero
      point of an all-zero row is then NaN, stored as 0)
    - UNIT_RANGE: a range (amax, or max - min) of exactly 0 is replaced by 1 before the division
      (ONNX reference ``DynamicQuantizeLinear``: scale 1/255 when max == min)
    """

    ZERO = "zero"
    EPS = "eps"
    NAN = "nan"
    DTYPE_EPS = "dtype_eps"
    UNIT_RANGE = "unit_range"


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


class SymDivisor(str, enum.Enum):
    """The divisor D of the symmetric scale ``amax / D``.

    - QMAX: 127, the largest code (canonical; vLLM, ONNX's symmetric use, torchao)
    - HALF_RANGE: (qmax - qmin) / 2 = 127.5 (compressed-tensors ``calculate_qparams``: the scale is
      ``max(|min|, |max|) / (bit_range / 2)`` with bit_range = 255), so the largest quotient is 127.5
      and saturates to 127
    """

    QMAX = "qmax"
    HALF_RANGE = "half_range"


class RangeRule(str, enum.Enum):
    """Which range the asymmetric scale and zero point are formed from.

    - MINMAX: the row's own min and max (canonical; vLLM ``dynamic_scaled_int8_azp_quant``)
    - ZERO_INCLUSIVE: min(min, 0) and max(max, 0), so 0 is always exactly representable
      (compressed-tensors ``calculate_qparams``, ONNX ``DynamicQuantizeLinear``, KleidiAI qa8dx)
    """

    MINMAX = "minmax"
    ZERO_INCLUSIVE = "zero_inclusive"


class AzpDomain(str, enum.Enum):
    """In which integer domain the asymmetric zero point is formed.

    - INT8: azp = RNE(fl(-128 - fl(min / scale))) (canonical; vLLM, compressed-tensors)
    - UINT8: zp = RNE(-fl(min / scale)) in [0, 255], azp = zp - 128 (ONNX ``DynamicQuantizeLinear``);
      differs from INT8 where the subtraction of 128 rounds (|min / scale| not a multiple of the
      spacing of fp32 numbers near 128) onto or off a tie
    """

    INT8 = "int8"
    UINT8 = "uint8"


class AzpClampNan(str, enum.Enum):
    """What ``azp_clamp`` does with a NaN real zero point (min / scale = 0 / 0: a scale that underflowed to 0).

    - KEEP: the clamp keeps NaN (canonical; ``torch.clamp``, ``std::clamp``)
    - HIGH: NaN becomes the upper bound (ONNX reference ``DynamicQuantizeLinear``: Python's
      ``max(qmin, min(qmax, v))`` returns ``qmax`` for NaN, since ``NaN < qmax`` is false)
    """

    KEEP = "keep"
    HIGH = "high"


class Int32Saturation(str, enum.Enum):
    """The range a saturating float -> int32 conversion clamps to (the quotient, and the zero point).

    - SYMMETRIC: [-(2**31 - 1), 2**31 - 1] (canonical)
    - FULL: [-2**31, 2**31 - 1], the whole int32 range (vLLM CUDA ``float_to_int32_rn``:
      ``cvt.rni.sat.s32.f32``; its ROCm branch saturates to ``numeric_limits<int32_t>::min()``)
    """

    SYMMETRIC = "symmetric"
    FULL = "full"


class AzpOverflow(str, enum.Enum):
    """What an asymmetric zero point outside int32 (or NaN) is stored as.

    - SATURATE: clamped to the ``Int32Saturation`` range, NaN by ``nan_to_int`` (canonical; CUDA
      float -> int conversions saturate)
    - INT_MIN: -2**31 for every out-of-range or NaN value, the x86 "integer indefinite" of
      ``cvttss2si`` (vLLM CPU ``dnnl_kernels.cpp``: ``azp[i] = azp_val`` converts the float implicitly).
      The codes are unaffected: that kernel adds the float zero point before rounding.
    """

    SATURATE = "saturate"
    INT_MIN = "int_min"


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

    ``azp_fused`` (with ``azp_before_rounding`` and ``reciprocal=recip_scale``; no effect otherwise): the
    product and the zero point are rounded once, ``fl32(x * inv + azp)``, as a fused multiply-add does
    (measured on vLLM 0.32 CPU ``dynamic_scaled_int8_quant``: the compiled ``x * inv_scale + azp`` is
    contracted; tests/emulator/test_reference_libraries.py).

    The fields after ``dequant_scale_dtype`` name what public reference quantizers do
    (emulator/reference_quantizers.py, docs/formats/activations.md#reference-implementations).
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
    sym_divisor: SymDivisor = SymDivisor.QMAX
    range_rule: RangeRule = RangeRule.MINMAX
    arith_dtype: str = "float32"  # float32 | bfloat16 | float16 | input (the dtype of x as passed)
    azp_clamp: bool = False  # the real zero point is clamped to [qmin, qmax] (of its domain) before rounding
    azp_domain: AzpDomain = AzpDomain.INT8
    int32_saturation: Int32Saturation = Int32Saturation.SYMMETRIC
    azp_overflow: AzpOverflow = AzpOverflow.SATURATE
    azp_fused: bool = False  # azp_before_rounding with a reciprocal: fl(x * inv + azp) rounded once (an FMA)
    azp_clamp_nan: AzpClampNan = AzpClampNan.KEEP  # what azp_clamp makes of a NaN real zero point

    def __post_init__(self):
        object.__setattr__(self, "rounding", Rounding.parse(self.rounding))
        object.__setattr__(self, "reciprocal", Reciprocal(self.reciprocal))
        object.__setattr__(self, "zero_row", ZeroRowRule(self.zero_row))
        object.__setattr__(self, "nan_to_int", NanToInt(self.nan_to_int))
        object.__setattr__(self, "scale_formula", ScaleFormula(self.scale_formula))
        object.__setattr__(self, "granularity", Granularity(self.granularity))
        object.__setattr__(self, "scheme", Int8Scheme(self.scheme))
        object.__setattr__(self, "sym_divisor", SymDivisor(self.sym_divisor))
        object.__setattr__(self, "range_rule", RangeRule(self.range_rule))
        object.__setattr__(self, "azp_domain", AzpDomain(self.azp_domain))
        object.__setattr__(self, "int32_saturation", Int32Saturation(self.int32_saturation))
        object.__setattr__(self, "azp_overflow", AzpOverflow(self.azp_overflow))
        object.__setattr__(self, "azp_clamp_nan", AzpClampNan(self.azp_clamp_nan))
        if self.arith_dtype not in ("float32", "bfloat16", "float16", "input"):
            raise ValueError(f"arith_dtype must be float32, bfloat16, float16 or input, got {self.arith_dtype!r}")
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
                     "scale_dtype": "float32", "azp_before_rounding": False, "dequant_scale_dtype": None,
                     "sym_divisor": SymDivisor.QMAX, "range_rule": RangeRule.MINMAX, "arith_dtype": "float32",
                     "azp_clamp": False, "azp_domain": AzpDomain.INT8, "int32_saturation": Int32Saturation.SYMMETRIC,
                     "azp_overflow": AzpOverflow.SATURATE, "azp_fused": False}
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


_EPS = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}
_INT32_MAX = 2**31 - 1


def _rounder(dtype: str):
    """``rnd(a)``: float64 values rounded (RNE) to ``dtype``, as float64. An operation computed exactly (or in
    float64) and rounded once is the correctly rounded ``dtype`` operation: float64 keeps 53 >= 2p + 2 bits
    for p = 24, 11, 8, so the double rounding is innocuous (torch's CPU 16-bit arithmetic, which computes in
    fp32 and rounds to the 16-bit dtype, gives the same values for the same reason)."""
    if dtype == "float32":
        return lambda a: np.asarray(a, np.float64).astype(np.float32).astype(np.float64)
    return lambda a: round_to_dtype(np.asarray(a, np.float64), dtype)


def _arith_dtype(x, v: Int8ActVariant) -> str:
    if v.arith_dtype != "input":
        return v.arith_dtype
    name = np.asarray(x).dtype.name
    return name if name in ("float16", "bfloat16") else "float32"


def _divide(x: np.ndarray, scale: np.ndarray, rng: np.ndarray, divisor: float, v: Int8ActVariant, rnd) -> np.ndarray:
    """The quotient x / scale in the arithmetic dtype, in the form ``v.reciprocal`` names (float64 values)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if v.reciprocal is Reciprocal.DIVIDE:
            return rnd(x / scale)
        if v.reciprocal is Reciprocal.RECIP_AMAX:
            return rnd(x * rnd(divisor / rng))
        return rnd(x * rnd(1.0 / scale))


def _to_int32(a: np.ndarray, v: Int8ActVariant, what: str) -> np.ndarray:
    """Round (``v.rounding``) and convert to int32 by the declared saturation and overflow rules; int64 out."""
    lo = -(2**31) if v.int32_saturation is Int32Saturation.FULL else -_INT32_MAX
    return quantize_to_int(a, lo, _INT32_MAX, v.rounding, nan=v.nan_to_int, what=what).astype(np.int64)


def quantize_int8_per_token(x, variant: Int8ActVariant = CANONICAL_SYM) -> Int8Activations:
    """Quantize x [M, K] to int8, one scale per row (or per tensor: ``variant.granularity``).

    See the module docstring; ``scale`` and ``zero_point`` are always [M, 1] (a per-tensor scale is
    repeated on every row). ``arith_dtype="input"`` computes in the dtype of ``x`` (float16 or
    ml_dtypes bfloat16 arrays; any other dtype counts as float32).
    """
    x32 = _check_input(x)
    if np.any(np.isnan(x32)):
        raise FormatError("NaN in activations: per-token int8 quantization is undefined for NaN input", tensor="x")
    if variant.scheme is Int8Scheme.KAI_QA8DX:
        return _quantize_kai_qa8dx(x32, variant)
    if variant.arith_dtype == "input":
        variant = dataclasses.replace(variant, arith_dtype=_arith_dtype(x, variant))
    if variant.symmetric:
        return _quantize_sym(x32, variant)
    return _quantize_asym(x32, variant)


def _reduce(v: np.ndarray, fn, variant: Int8ActVariant) -> np.ndarray:
    """Row-wise (or tensor-wise, repeated on every row) reduction of x [M, K] to [M, 1]."""
    r = fn(v, axis=1, keepdims=True)
    if variant.granularity is Granularity.PER_TENSOR:
        r = np.broadcast_to(fn(r, axis=0, keepdims=True), r.shape).copy()
    return r.astype(np.float32)


def _scale(rng: np.ndarray, divisor: float, v: Int8ActVariant, rnd) -> np.ndarray:
    """scale = fl(R / D) (DIVIDE) or fl(R * fl(1 / D)) (RECIP_MUL) in the arithmetic dtype, then rounded to
    ``scale_dtype``; float64 values."""
    with np.errstate(over="ignore", invalid="ignore"):
        if v.scale_formula is ScaleFormula.DIVIDE:
            scale = rnd(rng / divisor)
        else:
            scale = rnd(rng * rnd(1.0 / divisor))
    return _as_f32(scale, v.scale_dtype).astype(np.float64)


def _guard_range(rng: np.ndarray, v: Int8ActVariant) -> np.ndarray:
    if v.zero_row is ZeroRowRule.EPS:
        rng = np.maximum(rng, np.float64(np.float32(v.eps)))
    elif v.zero_row is ZeroRowRule.UNIT_RANGE:
        rng = np.where(rng == 0, 1.0, rng)
    return rng


def _eps_scale(scale: np.ndarray, v: Int8ActVariant) -> np.ndarray:
    """ZeroRowRule.DTYPE_EPS: a zero scale becomes the arithmetic dtype's machine epsilon."""
    if v.zero_row is ZeroRowRule.DTYPE_EPS:
        return np.where(scale == 0, _EPS[v.arith_dtype], scale)
    return scale


def _dequant_scale(scale: np.ndarray, v: Int8ActVariant) -> np.ndarray:
    scale = scale.astype(np.float32)
    return scale if v.dequant_scale_dtype is None else _as_f32(scale.astype(np.float64), v.dequant_scale_dtype)


def _quantize_sym(x32: np.ndarray, v: Int8ActVariant) -> Int8Activations:
    rnd = _rounder(v.arith_dtype)
    x = x32.astype(np.float64)
    amax = _guard_range(_reduce(np.abs(x32), np.max, v).astype(np.float64), v)
    divisor = 127.0 if v.sym_divisor is SymDivisor.QMAX else (v.qmax - v.qmin) / 2.0
    scale = _eps_scale(_scale(amax, divisor, v, rnd), v)
    quotient = _divide(x, scale, amax, divisor, v, rnd).astype(np.float32)
    zero_rows = (amax == 0)[:, 0]
    if v.zero_row is ZeroRowRule.ZERO:
        quotient[zero_rows] = 0.0
    q = quantize_to_int(quotient, v.qmin, v.qmax, v.rounding, nan=v.nan_to_int, what="x / scale")
    tie = _is_tie(quotient)
    zp = np.zeros((x32.shape[0], 1), dtype=np.int32)
    return Int8Activations(q=q, scale=_dequant_scale(scale, v), zero_point=zp, quotient=quotient, tie=tie)


def _zero_point(xmin: np.ndarray, scale: np.ndarray, v: Int8ActVariant, rnd) -> tuple[np.ndarray, np.ndarray]:
    """(the rounded real zero point, float64; the stored int32 zero point, int64), int8 domain."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        min_q = rnd(xmin / scale)
        if v.azp_domain is AzpDomain.UINT8:
            real, lo, hi, shift = -min_q, 0.0, 255.0, 128
        else:
            real, lo, hi, shift = rnd(-128.0 - min_q), float(v.qmin), float(v.qmax), 0
    if v.azp_clamp:
        real = np.where(np.isnan(real), real, np.clip(real, lo, hi))  # a clamp keeps NaN (torch.clamp, std::clamp)
        if v.azp_clamp_nan is AzpClampNan.HIGH:
            real = np.where(np.isnan(real), hi, real)
    if v.zero_row is ZeroRowRule.ZERO:
        real = np.where(scale == 0, float(shift), real)  # max == min: the canonical zero point is 0
    # nearbyint / torch.round / np.rint; the int8-domain azp (uint8: zp - 128) is what is stored as int32, so the
    # saturation applies after the shift (saturating zp first and subtracting 128 wrapped below int32's range)
    rounded = round_to_integer(real, Rounding.RNE) - shift
    stored = _to_int32(rounded, dataclasses.replace(v, rounding=Rounding.RNE), "azp")
    if v.azp_overflow is AzpOverflow.INT_MIN:
        with np.errstate(invalid="ignore"):
            outside = ~((rounded >= -(2.0**31)) & (rounded <= _INT32_MAX))  # NaN too
        stored = np.where(outside, -(2**31), stored)
    return rounded, stored


def _quantize_asym(x32: np.ndarray, v: Int8ActVariant) -> Int8Activations:
    rnd = _rounder(v.arith_dtype)
    x = x32.astype(np.float64)
    xmax = _reduce(x32, np.max, v).astype(np.float64)
    xmin = _reduce(x32, np.min, v).astype(np.float64)
    if v.range_rule is RangeRule.ZERO_INCLUSIVE:
        xmax, xmin = np.maximum(xmax, 0.0), np.minimum(xmin, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        span = _guard_range(rnd(xmax - xmin), v)
    scale = _scale(span, 255.0, v, rnd)
    degenerate = (scale == 0)[:, 0]
    azp_float, azp = _zero_point(xmin, scale, v, rnd)
    scale = _eps_scale(scale, v)
    quotient = _divide(x, scale, xmax, 255.0, v, rnd)
    if v.zero_row is ZeroRowRule.ZERO:
        # max == min: every element equals min; the canonical codes are 0 + 0 with scale 0.
        quotient[degenerate] = 0.0
    if v.azp_before_rounding:
        # the sum fl(x / scale + azp) is what gets rounded; the kernels add the zero point as a float, before
        # its conversion to the stored int32 (the same number wherever it fits)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            if v.azp_fused and v.reciprocal is Reciprocal.RECIP_SCALE:
                # one rounding of x * inv + azp: the product of two fp32 values is exact in float64 and so is
                # its sum with an integer below 2**33 (49 significant bits at most)
                inv = rnd(1.0 / scale)
                shifted = rnd(x * inv + azp_float).astype(np.float32)
                if v.zero_row is ZeroRowRule.ZERO:
                    shifted[degenerate] = azp_float[degenerate].astype(np.float32)  # quotient 0, as below
            else:
                shifted = rnd(quotient + azp_float).astype(np.float32)
        r = _to_int32(shifted, v, "x / scale + azp")
        q = np.clip(r, v.qmin, v.qmax).astype(np.int32)
        return Int8Activations(q=q, scale=_dequant_scale(scale, v), zero_point=azp.astype(np.int32),
                               quotient=shifted, tie=_is_tie(shifted))
    quotient = quotient.astype(np.float32)
    r = _to_int32(quotient, v, "x / scale")
    q = np.clip(r + azp, v.qmin, v.qmax).astype(np.int32)
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
