"""FP4 E2M1: the element type of MXFP4 (OCP MX v1.0 §5.3.3).

Semantics: docs/formats.md#fp4-e2m1.

Code layout ``s e1 e0 m``: sign in bit 3, exponent bias 1, no Inf, no NaN.
Code 1 is the only positive subnormal (0.5); code 7 is the largest (6.0).

Encoding always saturates at +-6 (OCP §6.3: "clamped to the max normal,
preserving the sign"). Rounding of in-range values is a ``Rounding``:
RNE is canonical; RHAZ, RHTZ and RTZ are variants real kernels use
(see docs). NaN has no encoding, so a NaN rule must be named. The sign of
a zero is a rule too (``E2M1ZeroSign``): canonically -0 keeps its sign.
Packing puts element 2j in the low nibble of byte j (OCP users, torch,
ONNX, gpt-oss, torchao, triton, compressed-tensors).
"""

from __future__ import annotations

import enum

import numpy as np

from .floats import E2M1, Overflow, decode, encode
from .rounding import Rounding, as_float64

__all__ = [
    "E2M1_VALUES",
    "E2M1NanRule",
    "E2M1ZeroSign",
    "encode_e2m1",
    "decode_e2m1",
    "pack_e2m1",
    "unpack_e2m1",
]

#: Value of each 4-bit code, index = code (float32; every value is exact).
E2M1_VALUES: np.ndarray = decode(np.arange(16, dtype=np.uint8), E2M1).astype(np.float32)


class E2M1NanRule(str, enum.Enum):
    """What an element NaN becomes when encoded to E2M1 (OCP leaves it to implementations).

    - SATURATE: +-6 by the NaN's sign bit (triton_kernels bit path; ONNX docs float4.md)
    - SATURATE_POSITIVE: +6 whatever the NaN's sign (vllm-xpu-kernels ``mxfp4_quant.h``: the
      clamp ``fmax(-6, fmin(v, 6))`` runs before the sign test and SYCL ``fmin`` returns the
      non-NaN operand, so -NaN becomes +6 too)
    - ZERO_SIGNED: +-0 by the NaN's sign bit
    - ZERO: +0 (vllm-xpu-kernels sign test, ggml, compressed-tensors before PR #824)
    - ZERO_SIGN_FLIPPED: +NaN -> -0 (code 8), -NaN -> +0 (ml_dtypes and the ONNX reference,
      whose NaN for float4_e2m1fn is the bit pattern of -0)
    - RAISE: NaN is an error (the emulator's default where NaN means bad input)

    In an MXFP4 block any NaN also makes the block's scale 0xFF, so the element
    code only matters to bit-exact comparisons of the packed data.
    """

    SATURATE = "saturate"
    SATURATE_POSITIVE = "saturate_positive"
    ZERO_SIGNED = "zero_signed"
    ZERO = "zero"
    ZERO_SIGN_FLIPPED = "zero_sign_flipped"
    RAISE = "raise"


class E2M1ZeroSign(str, enum.Enum):
    """The code of a zero input (an input equal to +-0; values that *round* to zero are not zeros).

    - KEEP: -0 -> code 8, +0 -> code 0 (canonical; the sign bit is copied, as the bit-level
      conversions of torch and ml_dtypes do)
    - POSITIVE: -0 -> code 0: the sign bit is set iff the value is < 0 (vllm-xpu-kernels
      ``float_to_fp4_e2m1``: ``sign = (x < 0.0f) ? 0x8 : 0``; compressed-tensors 0.20's
      ``sign(x) * abs(q)``). Negative values that round to zero still get code 8.

    The two codes decode to the same value (+-0), so only comparisons of packed data see this.
    """

    KEEP = "keep"
    POSITIVE = "positive"


def _nan_codes(x64: np.ndarray, rule: E2M1NanRule) -> np.ndarray:
    neg = (x64.view(np.uint64) >> np.uint64(63)).astype(np.uint8)
    if rule is E2M1NanRule.SATURATE:
        return (neg << 3) | np.uint8(0x7)
    if rule is E2M1NanRule.SATURATE_POSITIVE:
        return np.full_like(neg, 0x7)
    if rule is E2M1NanRule.ZERO_SIGNED:
        return neg << 3
    if rule is E2M1NanRule.ZERO:
        return np.zeros_like(neg)
    if rule is E2M1NanRule.ZERO_SIGN_FLIPPED:
        return (neg ^ np.uint8(1)) << 3
    raise ValueError("NaN cannot be encoded as E2M1 (E2M1NanRule.RAISE)")


def encode_e2m1(
    x,
    mode: Rounding | str = Rounding.RNE,
    nan: E2M1NanRule | str = E2M1NanRule.RAISE,
    zero_sign: E2M1ZeroSign | str = E2M1ZeroSign.KEEP,
) -> np.ndarray:
    """Encode values to 4-bit E2M1 codes (uint8, 0..15), saturating at +-6.

    +-Inf saturate to +-6. Negative values that round to zero keep the sign
    (code 8), as the bit-level conversions of torch and ml_dtypes do; so does
    -0 unless ``zero_sign=POSITIVE``.
    """
    mode = Rounding.parse(mode)
    nan = E2M1NanRule(nan)
    zero_sign = E2M1ZeroSign(zero_sign)
    x64 = as_float64(x)
    isnan = np.isnan(x64)
    finite_or_inf = np.where(isnan, 0.0, x64)
    codes = encode(finite_or_inf, E2M1, mode, Overflow.SATURATE).astype(np.uint8)
    if zero_sign is E2M1ZeroSign.POSITIVE:
        codes = np.where(x64 == 0, np.uint8(0), codes).astype(np.uint8)
    if np.any(isnan):
        codes = np.where(isnan, _nan_codes(x64, nan), codes).astype(np.uint8)
    return codes


def decode_e2m1(codes) -> np.ndarray:
    """Value of each E2M1 code (uint8 0..15) as float32 (exact)."""
    c = np.asarray(codes)
    if c.dtype.kind not in "iu":
        raise TypeError(f"E2M1 codes must be integers, got dtype {c.dtype}")
    if np.any((c < 0) | (c > 15)):
        raise ValueError("E2M1 codes must be in 0..15")
    return E2M1_VALUES[c.astype(np.intp)]


def pack_e2m1(codes, axis: int = -1) -> np.ndarray:
    """Pack 4-bit codes two per byte along ``axis``: element 2j -> low nibble of byte j."""
    c = np.moveaxis(np.asarray(codes, dtype=np.uint8), axis, -1)
    if c.shape[-1] % 2:
        raise ValueError(f"cannot pack an odd number ({c.shape[-1]}) of 4-bit codes along axis {axis}")
    if np.any(c > 15):
        raise ValueError("4-bit codes must be in 0..15")
    packed = c[..., 0::2] | (c[..., 1::2] << np.uint8(4))
    return np.moveaxis(packed.astype(np.uint8), -1, axis)


def unpack_e2m1(packed, axis: int = -1) -> np.ndarray:
    """Inverse of ``pack_e2m1``: byte j -> elements 2j (low nibble), 2j+1 (high nibble)."""
    p = np.moveaxis(np.asarray(packed), axis, -1)
    if p.dtype != np.uint8:
        raise TypeError(f"packed E2M1 data must be uint8, got {p.dtype}")
    out = np.empty(p.shape[:-1] + (p.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = p & np.uint8(0x0F)
    out[..., 1::2] = p >> np.uint8(4)
    return np.moveaxis(out, -1, axis)
