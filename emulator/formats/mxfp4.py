"""MXFP4: blocks of 32 E2M1 elements sharing one E8M0 scale (OCP MX v1.0).

Semantics: docs/formats/mxfp4.md.

Canonical conversion (OCP MX v1.0 §6.3 with RNE elements; equal to torchao 0.18
``to_mx(..., ScaleCalculationMode.FLOOR)`` on finite blocks whose scale byte is
not 0 — torchao divides byte-0 blocks by 2**-126 instead of 2**-127):

1. amax = max |x_i| over the 32-element block, in float32;
2. scale byte by ``MxScaleRule.FLOOR`` (s = floor(log2 amax) - 2, clamped to
   [-127, 127]); amax = 0 gives byte 0 (2**-127); NaN/Inf anywhere gives 0xFF;
3. element code = RNE-to-E2M1(x_i / 2**s), saturating at +-6 (x_i / 2**s is
   exact: a power-of-two division of a float32 in float64);
4. dequantized value = E2M1[code] * 2**(byte - 127); byte 0xFF -> NaN.

Every step that real kernels do differently is a field of ``MxVariant``.

Two checkpoint layouts carry the same codes and bytes:

- compressed-tensors ``mxfp4-pack-quantized``: ``weight_packed`` uint8 [N, K/2]
  (element 2j in the low nibble), ``weight_scale`` uint8 [N, K/32];
- gpt-oss: ``*_blocks`` uint8 [..., N, K/32, 16], ``*_scales`` uint8 [..., N, K/32].

``dequantize_mxfp4_ct_reference`` / ``dequantize_mxfp4_gptoss_reference`` (unpack, then
``dequantize_mxfp4``) are the specification to read; ``dequantize_mxfp4_ct`` /
``dequantize_mxfp4_gptoss`` the fast path (fast_dequant.dequantize_mxfp4_packed).
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np

from ..errors import FormatError, require
from ..numerics.e2m1 import (
    E2M1NanRule,
    E2M1ZeroSign,
    decode_e2m1,
    encode_e2m1,
    pack_e2m1,
    unpack_e2m1,
)
from ..numerics.e8m0 import (
    E8M0_NAN,
    MxScaleRule,
    NanBlockRule,
    ScaleOverflow,
    ZeroBlockRule,
    decode_e8m0,
    mx_scale_byte,
)
from ..numerics.rounding import Rounding, as_float64
from .fast_dequant import dequantize_mxfp4_packed
from .int_common import default_g_idx, expand_groups

__all__ = [
    "BLOCK",
    "MxVariant",
    "Byte0Divisor",
    "CANONICAL",
    "block_amax",
    "quantize_mxfp4",
    "dequantize_mxfp4",
    "pack_mxfp4_ct",
    "unpack_mxfp4_ct",
    "pack_mxfp4_gptoss",
    "unpack_mxfp4_gptoss",
    "dequantize_mxfp4_ct",
    "dequantize_mxfp4_gptoss",
    "dequantize_mxfp4_ct_reference",
    "dequantize_mxfp4_gptoss_reference",
]

BLOCK = 32


class Byte0Divisor(str, enum.Enum):
    """What the elements of a block whose scale byte is 0 are divided by (the byte stays 0 = 2**-127).

    - BYTE: 2**-127, the value of the byte (canonical: the codes decode with the byte they are stored with)
    - MIN_NORMAL: 2**-126 (torchao 0.18 ``to_mx`` FLOOR / EVEN / CEIL: ``torch.clamp(scale_fp32,
      min=F32_MIN_NORMAL)`` after the byte was formed), so the codes hold half the values the byte says
    - ONE: 1 (torchao 0.18 ``_to_mx_rceil``: the reciprocal is 1.0 where the exponent is 0), so every
      element of such a block rounds to +-0
    """

    BYTE = "byte"
    MIN_NORMAL = "min_normal"
    ONE = "one"


_BYTE0_EXPONENT = {Byte0Divisor.BYTE: -127, Byte0Divisor.MIN_NORMAL: -126, Byte0Divisor.ONE: 0}


@dataclasses.dataclass(frozen=True)
class MxVariant:
    """Every choice in MXFP4 quantization that real implementations make differently.

    Defaults are the canonical semantics (OCP §6.3 + RNE).
    """

    scale_rule: MxScaleRule = MxScaleRule.FLOOR
    element_rounding: Rounding = Rounding.RNE
    element_nan: E2M1NanRule = E2M1NanRule.ZERO
    zero_block: ZeroBlockRule = ZeroBlockRule.MIN
    nan_block: NanBlockRule = NanBlockRule.SCALE_NAN
    element_zero_sign: E2M1ZeroSign = E2M1ZeroSign.KEEP
    byte0_divisor: Byte0Divisor = Byte0Divisor.BYTE
    scale_overflow: ScaleOverflow = ScaleOverflow.CLAMP
    #: dtype the quotient x / 2**s is rounded to (RNE) before the E2M1 rounding: "exact" (canonical),
    #: float32 | float16 | bfloat16, or "input" (the dtype of x as passed: float16 and ml_dtypes bfloat16
    #: arrays, float32 otherwise). Only quotients below that dtype's normal range change: they lose bits or
    #: become +-0 (whose code ``element_zero_sign`` decides): compressed-tensors divides in x's dtype
    quotient_dtype: str = "exact"

    def __post_init__(self):
        if self.quotient_dtype not in ("exact", "input", "float32", "float16", "bfloat16"):
            raise ValueError(f"quotient_dtype must be exact, input, float32, float16 or bfloat16, "
                             f"got {self.quotient_dtype!r}")
        object.__setattr__(self, "scale_rule", MxScaleRule(self.scale_rule))
        object.__setattr__(self, "element_rounding", Rounding.parse(self.element_rounding))
        object.__setattr__(self, "element_nan", E2M1NanRule(self.element_nan))
        object.__setattr__(self, "zero_block", ZeroBlockRule(self.zero_block))
        object.__setattr__(self, "nan_block", NanBlockRule(self.nan_block))
        object.__setattr__(self, "element_zero_sign", E2M1ZeroSign(self.element_zero_sign))
        object.__setattr__(self, "byte0_divisor", Byte0Divisor(self.byte0_divisor))
        object.__setattr__(self, "scale_overflow", ScaleOverflow(self.scale_overflow))

    def describe(self) -> dict:
        return {f.name: getattr(getattr(self, f.name), "value", getattr(self, f.name)) for f in dataclasses.fields(self)}


CANONICAL = MxVariant()


def _as_float32_exact(x, what: str) -> np.ndarray:
    x64 = as_float64(x)
    x32 = x64.astype(np.float32)
    finite = np.isfinite(x64)
    if not np.array_equal(x32.astype(np.float64)[finite], x64[finite]):
        raise FormatError("MXFP4 input must be exactly representable in float32 (fp32, fp16 or bf16 values)", tensor=what)
    return x32


def _blocks(x: np.ndarray, what: str) -> np.ndarray:
    K = x.shape[-1]
    require(K % BLOCK == 0, f"last dimension K={K} must be a multiple of the MX block size {BLOCK}", tensor=what)
    return x.reshape(x.shape[:-1] + (K // BLOCK, BLOCK))


def block_amax(xb: np.ndarray, nan_block: NanBlockRule = NanBlockRule.SCALE_NAN) -> np.ndarray:
    """amax of each 32-block of float32 values (last axis of ``xb``)."""
    mag = np.abs(xb)
    if NanBlockRule(nan_block) is NanBlockRule.IGNORE:
        mag = np.where(np.isnan(mag), np.float32(0), mag)
        return mag.max(axis=-1)
    # np.max propagates NaN, matching the NaN-propagating reductions of torchao/microxcaling.
    return mag.max(axis=-1)


def quantize_mxfp4(x, variant: MxVariant = CANONICAL, *, what: str = "x") -> tuple[np.ndarray, np.ndarray]:
    """Quantize along the last axis (K % 32 == 0) -> (codes uint8 [..., K], scale bytes uint8 [..., K/32])."""
    x32 = _as_float32_exact(x, what)
    xb = _blocks(x32, what)
    amax = block_amax(xb, variant.nan_block)
    scale = mx_scale_byte(amax, variant.scale_rule, zero_block=variant.zero_block, overflow=variant.scale_overflow)
    # x / 2**s is exact in float64 (power-of-two scaling, far from float64's limits).
    s = np.where(scale == E8M0_NAN, 0, scale.astype(np.int64) - 127)
    s = np.where(scale == 0, _BYTE0_EXPONENT[variant.byte0_divisor], s)
    y = np.ldexp(xb.astype(np.float64), -s[..., None])
    qd = variant.quotient_dtype
    if qd == "input":
        qd = np.asarray(x).dtype.name if np.asarray(x).dtype.name in ("float16", "bfloat16") else "float32"
    if qd != "exact":
        from ..numerics.floats import round_to_dtype

        with np.errstate(over="ignore", invalid="ignore"):
            y = round_to_dtype(y, qd)
    codes = encode_e2m1(y, variant.element_rounding, variant.element_nan, variant.element_zero_sign)
    # A 0xFF block decodes to NaN whatever its elements hold: canonically they are code 0
    # (OCP leaves them unspecified), so a comparison of packed data is deterministic.
    codes = np.where((scale == E8M0_NAN)[..., None], np.uint8(0), codes)
    codes = codes.reshape(x32.shape)
    return codes.astype(np.uint8), scale


def dequantize_mxfp4(codes, scale_bytes, *, dtype=np.float32, what: str = "weight") -> np.ndarray:
    """E2M1[code] * 2**(byte - 127) along the last axis; byte 0xFF -> NaN.

    The product is exact in float64; ``dtype=np.float32`` rounds it with RNE
    (only 6 * 2**127 and similar overflow to Inf; 0.5 * 2**-127 is an exact fp32 subnormal).
    """
    c = np.asarray(codes)
    sb = np.asarray(scale_bytes)
    require(sb.dtype == np.uint8, f"E8M0 scales must be uint8, got {sb.dtype}", tensor=what)
    require(c.shape[:-1] == sb.shape[:-1] and c.shape[-1] == sb.shape[-1] * BLOCK,
            f"codes shape {tuple(c.shape)} does not match scales shape {tuple(sb.shape)} with block {BLOCK}", tensor=what)
    values = decode_e2m1(c).astype(np.float64)  # 1. each code's E2M1 value
    scales = expand_groups(decode_e8m0(sb), default_g_idx(c.shape[-1], BLOCK))  # 2. element k: block k // 32
    with np.errstate(over="ignore"):  # 6 * 2**127 rounds to Inf in float32, as RNE of the exact value does
        return (values * scales).astype(dtype)  # 3. exact in float64, rounded once to dtype


def pack_mxfp4_ct(codes: np.ndarray, scale_bytes: np.ndarray) -> dict[str, np.ndarray]:
    """compressed-tensors layout: weight_packed uint8 [N, K/2], weight_scale uint8 [N, K/32]."""
    require(codes.ndim == 2, f"expected codes [N, K], got shape {codes.shape}", tensor="weight_packed")
    return {"weight_packed": pack_e2m1(codes, axis=-1), "weight_scale": np.ascontiguousarray(scale_bytes, dtype=np.uint8)}


def unpack_mxfp4_ct(tensors: dict, *, layer: str | None = None, validate_only: bool = False):
    """compressed-tensors MXFP4 -> (codes [N, K], scale bytes [N, K/32]), validating the layout."""
    for name in ("weight_packed", "weight_scale"):
        require(name in tensors, "missing tensor", layer=layer, tensor=name)
    packed = np.asarray(tensors["weight_packed"])
    scale = np.asarray(tensors["weight_scale"])
    require(packed.dtype == np.uint8, f"expected uint8, got {packed.dtype}", layer=layer, tensor="weight_packed")
    require(scale.dtype == np.uint8, f"expected uint8 (E8M0 bytes), got {scale.dtype}", layer=layer, tensor="weight_scale")
    require(packed.ndim == 2, f"expected 2-D [N, K/2], got shape {list(packed.shape)}", layer=layer, tensor="weight_packed")
    N, half_k = packed.shape
    K = 2 * half_k
    require(K % BLOCK == 0, f"K={K} is not a multiple of {BLOCK}", layer=layer, tensor="weight_packed")
    require(scale.shape == (N, K // BLOCK), f"expected shape [N, K/32] = {[N, K // BLOCK]}, got {list(scale.shape)}",
            layer=layer, tensor="weight_scale")
    if validate_only:
        return None
    return unpack_e2m1(packed, axis=-1), scale


def pack_mxfp4_gptoss(codes: np.ndarray, scale_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """gpt-oss layout: blocks uint8 [..., K/32, 16], scales uint8 [..., K/32]."""
    packed = pack_e2m1(codes, axis=-1)
    blocks = packed.reshape(packed.shape[:-1] + (packed.shape[-1] // 16, 16))
    return blocks, np.ascontiguousarray(scale_bytes, dtype=np.uint8)


def unpack_mxfp4_gptoss(blocks, scales, *, layer: str | None = None,
                        names: tuple[str, str] = ("blocks", "scales")) -> tuple[np.ndarray, np.ndarray]:
    """gpt-oss ``*_blocks`` [..., K/32, 16] + ``*_scales`` [..., K/32] -> (codes [..., K], scale bytes)."""
    b = np.asarray(blocks)
    s = np.asarray(scales)
    require(b.dtype == np.uint8, f"expected uint8, got {b.dtype}", layer=layer, tensor=names[0])
    require(s.dtype == np.uint8, f"expected uint8 (E8M0 bytes), got {s.dtype}", layer=layer, tensor=names[1])
    require(b.ndim >= 2 and b.shape[-1] == 16, f"expected [..., K/32, 16], got shape {list(b.shape)}",
            layer=layer, tensor=names[0])
    require(s.shape == b.shape[:-1], f"expected shape {list(b.shape[:-1])} to match blocks, got {list(s.shape)}",
            layer=layer, tensor=names[1])
    packed = b.reshape(b.shape[:-2] + (b.shape[-2] * 16,))
    return unpack_e2m1(packed, axis=-1), s


def dequantize_mxfp4_ct_reference(tensors: dict, *, layer: str | None = None, dtype=np.float32) -> np.ndarray:
    """The specification of ``dequantize_mxfp4_ct``: same result bit for bit (docs/formats/mxfp4.md)."""
    codes, scale_bytes = unpack_mxfp4_ct(tensors, layer=layer)  # byte j of a row: elements 2j (low nibble), 2j+1
    return dequantize_mxfp4(codes, scale_bytes, dtype=dtype, what=f"{layer or ''}.weight_packed".lstrip("."))


def dequantize_mxfp4_gptoss_reference(blocks, scales, *, layer: str | None = None, dtype=np.float32,
                                      names: tuple[str, str] = ("blocks", "scales")) -> np.ndarray:
    """The specification of ``dequantize_mxfp4_gptoss``: same result bit for bit (docs/formats/mxfp4.md)."""
    codes, scale_bytes = unpack_mxfp4_gptoss(blocks, scales, layer=layer, names=names)  # [..., K/32, 16] -> [..., K]
    return dequantize_mxfp4(codes, scale_bytes, dtype=dtype)


def dequantize_mxfp4_ct(tensors: dict, *, layer: str | None = None, dtype=np.float32,
                        out: np.ndarray | None = None) -> np.ndarray:
    """compressed-tensors MXFP4 weight -> [N, K] (NaN where a scale byte is 0xFF).

    float32: the fast path (fast_dequant.dequantize_mxfp4_packed), bit-identical to
    ``dequantize_mxfp4_ct_reference``; other dtypes: the reference itself. ``out``
    (float32 only): a float32 [N, K] C-contiguous array to write into.
    """
    if dtype in (np.float32, "float32"):
        unpack_mxfp4_ct(tensors, layer=layer, validate_only=True)
        return dequantize_mxfp4_packed(tensors["weight_packed"], tensors["weight_scale"], out=out)
    if out is not None:
        raise ValueError("out: only float32 results can be written into a caller's array")
    return dequantize_mxfp4_ct_reference(tensors, layer=layer, dtype=dtype)


def dequantize_mxfp4_gptoss(blocks, scales, *, layer: str | None = None, dtype=np.float32,
                            names: tuple[str, str] = ("blocks", "scales"), out: np.ndarray | None = None) -> np.ndarray:
    """gpt-oss MXFP4 blocks/scales -> [..., N, K]. ``out``: as for ``dequantize_mxfp4_ct``."""
    if dtype in (np.float32, "float32"):
        unpack_mxfp4_gptoss(blocks, scales, layer=layer, names=names)  # validates
        b = np.asarray(blocks)
        return dequantize_mxfp4_packed(b.reshape(b.shape[:-2] + (b.shape[-2] * 16,)), scales, out=out)
    if out is not None:
        raise ValueError("out: only float32 results can be written into a caller's array")
    return dequantize_mxfp4_gptoss_reference(blocks, scales, layer=layer, dtype=dtype, names=names)
