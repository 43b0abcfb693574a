"""E8M0 scales and the MX shared-scale rules.

Semantics: docs/formats.md#e8m0-and-mx-scale-rules.

E8M0 (OCP MX v1.0 §5.4.1): an unsigned 8-bit exponent, bias 127, no sign,
no zero, no Inf. Byte b in 0..254 means 2**(b-127) (byte 0 = 2**-127 is an
fp32 subnormal); byte 0xFF is NaN.

The MX scale of a block is a power of two 2**s chosen from the block's
largest magnitude ``amax`` (a float32). Real code uses four rules
(``MxScaleRule``) which differ only in how log2(amax) is rounded; they are
computed here from the float32 bits of amax, as the kernels do:

==========  ==================================  ===========================================
rule        s                                   used by
==========  ==================================  ===========================================
FLOOR       floor(log2 amax) - 2                OCP MX v1.0 §6.3, microxcaling, torchao FLOOR
EVEN        FLOOR of amax rounded to 1 mantissa AMD Quark, llm-compressor, vLLM's test
            bit (bump iff mantissa >= 1.75)     reference (reference_mxfp4.py)
RCEIL       ceil(log2(amax / 6))                triton_kernels ROUND_UP, torchao RCEIL, cuDNN
CEIL        ceil(log2 amax) - 2                 torchao CEIL, FBGEMM MX4 default
RCEIL_LOG2F ceil(fl32(log2(fl32(amax / 6))))    torchao 0.18 ``_to_mx_rceil`` eager fallback
==========  ==================================  ===========================================

RCEIL_LOG2F differs from RCEIL where amax / 6 lies just above a power of two 2**k with |k| >= 4: the fp32
log2 of 2**k * (1 + 2**-23) rounds to the integer k, so the scale is 2**k instead of 2**(k+1) and the
block's largest elements saturate at 6.

The "- 2" is emax of E2M1 (its largest power of two is 4).
"""

from __future__ import annotations

import enum

import numpy as np

__all__ = [
    "E8M0_NAN",
    "E8M0_BIAS",
    "MxScaleRule",
    "ScaleOverflow",
    "ZeroBlockRule",
    "NanBlockRule",
    "decode_e8m0",
    "mx_scale_byte",
]

E8M0_BIAS = 127
E8M0_NAN = np.uint8(0xFF)
_E2M1_EMAX = 2


class MxScaleRule(str, enum.Enum):
    """How a block's shared exponent is derived from its amax (see module table)."""

    FLOOR = "floor"
    EVEN = "even"
    RCEIL = "rceil"
    CEIL = "ceil"
    RCEIL_LOG2F = "rceil_log2f"


class ScaleOverflow(str, enum.Enum):
    """What happens when a rule's rounding of amax overflows fp32 (EVEN on amax >= 1.75 * 2**127).

    - CLAMP: the exponent is clamped to 127 like any other: EVEN gives byte 253 there (canonical)
    - NAN: the rounded amax is Inf, its log2 is Inf and the scale is 2**128, which is the E8M0 NaN byte
      0xFF: the block decodes to NaN (compressed-tensors 0.20 ``generate_mx_scales`` on dynamic MXFP4
      activations: ``round_to_power_2`` carries into the fp32 exponent field 255, ``127 + log2(Inf) - 2``
      is clamped to 255 by ``round_to_quantized_type_dtype(uint8)``, and the float scale 2**128 = Inf
      quantizes every element to 0 and fake-quantizes it to NaN)
    """

    CLAMP = "clamp"
    NAN = "nan"


class ZeroBlockRule(str, enum.Enum):
    """Scale byte of a block whose amax is 0.

    - MIN: byte 0 (2**-127): canonical; microxcaling, torchao, vLLM reference, Quark EVEN,
      triton_kernels (which also quantises with scale 0; elements are 0 either way)
    - HALF: scale 2**-1 (byte 126): auto-round ``quant_mx`` (log2 of 0 replaced by 1)
    - EPS_FP32: scale 2**-23 (byte 104): Quark FLOOR/CEIL observer (0 -> fp32 eps)
    - EPS_1E10: scale 2**ceil(log2 1e-10) = 2**-33 (byte 94)
    - EPS_1E10_FLOOR: every block's scale is at least 2**-33 (byte 94), not only the all-zero
      block's: byte = max(rule byte, 94). vllm-xpu-kernels ``mxfp4_quant.h`` (called by vLLM with
      eps = 1e-10) starts its amax reduction at eps and floors the descale amax / 6 at eps
      (``exp2(ceil(log2(fmax(|amax / 6|, eps))))``), so under its RCEIL rule every block with
      amax < 6e-10 gets 2**-33. (Flooring amax alone at 1e-10 would give RCEIL 2**-35, byte 92.)

    The byte is per rule, not per scale rule: EPS_1E10_FLOOR applies ``max(byte, 94)`` after any
    ``MxScaleRule``; the others only replace the byte of amax == 0.
    """

    MIN = "min"
    HALF = "half"
    EPS_FP32 = "eps_fp32"
    EPS_1E10 = "eps_1e10"
    EPS_1E10_FLOOR = "eps_1e10_floor"


#: the smallest scale byte under ZeroBlockRule.EPS_1E10_FLOOR: 2**ceil(log2(fp32(1e-10))) = 2**-33
EPS_1E10_BYTE = E8M0_BIAS - 33

_ZERO_BLOCK_BYTE = {
    ZeroBlockRule.MIN: 0,
    ZeroBlockRule.HALF: E8M0_BIAS - 1,
    ZeroBlockRule.EPS_FP32: E8M0_BIAS - 23,
    ZeroBlockRule.EPS_1E10: EPS_1E10_BYTE,
    ZeroBlockRule.EPS_1E10_FLOOR: EPS_1E10_BYTE,
}


class NanBlockRule(str, enum.Enum):
    """What a NaN or Inf inside a block does to its scale.

    - SCALE_NAN: the scale byte is 0xFF, the whole block decodes to NaN (canonical;
      torchao, triton_kernels, microxcaling)
    - IGNORE: NaN is skipped by the amax reduction (fmax semantics; vllm-xpu-kernels
      sycl::fmax, llama.cpp); +-Inf still gives 0xFF
    """

    SCALE_NAN = "scale_nan"
    IGNORE = "ignore"


def decode_e8m0(scale_bytes, *, allow_nan: bool = True) -> np.ndarray:
    """Value of each E8M0 byte as float64: 2**(b-127); 0xFF -> NaN (or ValueError)."""
    b = np.asarray(scale_bytes)
    if b.dtype != np.uint8:
        raise TypeError(f"E8M0 scales must be uint8 bytes, got dtype {b.dtype}")
    isnan = b == E8M0_NAN
    if not allow_nan and np.any(isnan):
        raise ValueError(f"E8M0 byte 0xFF (NaN) where a finite scale is required ({int(isnan.sum())} occurrence(s))")
    val = np.ldexp(1.0, b.astype(np.int64) - E8M0_BIAS)
    return np.where(isnan, np.nan, val)


def _fields(amax32: np.ndarray):
    bits = amax32.view(np.uint32)
    biased = ((bits >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int64)
    mant = (bits & np.uint32(0x7FFFFF)).astype(np.int64)
    return biased, mant


def _rule_exponent(amax32: np.ndarray, rule: MxScaleRule) -> np.ndarray:
    """Unclamped shared exponent s for finite, non-negative float32 amax > 0."""
    biased, mant = _fields(amax32)
    floor_log2 = biased - E8M0_BIAS  # fp32 subnormals read as -127 (their exponent field is 0)
    if rule is MxScaleRule.FLOOR:
        return floor_log2 - _E2M1_EMAX
    if rule is MxScaleRule.CEIL:
        return floor_log2 + (mant != 0) - _E2M1_EMAX
    if rule is MxScaleRule.EVEN:
        # Round amax to 1 mantissa bit, half up, on its bits: add half an ulp of
        # the 1-bit mantissa (bit 21) and keep sign+exponent. Carry bumps the exponent.
        bumped = (amax32.view(np.uint32).astype(np.uint64) + np.uint64(1 << 21)) & np.uint64(0xFF800000)
        return (bumped >> np.uint64(23)).astype(np.int64) - E8M0_BIAS - _E2M1_EMAX
    if rule is MxScaleRule.RCEIL:
        # descale = fl32(amax / 6) (a true fp32 division, as triton_kernels does),
        # then round up to a power of two: exponent + 1 unless the mantissa is 0.
        descale = (amax32 / np.float32(6.0)).astype(np.float32)
        db, dm = _fields(descale)
        normal = db > 0
        up_normal = db + (dm != 0)
        # fp32 subnormal descale: byte 0 is 2**-127 = mantissa 0x400000; only values above it round to 1.
        up_sub = (dm > 0x400000).astype(np.int64)
        return np.where(normal, up_normal, up_sub) - E8M0_BIAS
    if rule is MxScaleRule.RCEIL_LOG2F:
        # torchao: ceil(log2(descale)) with torch.log2 on fp32; a correctly rounded fp32 log2 (float64 log2 rounded
        # once) gives the same ceiling on every fp32 input tested against torch (tests/emulator/test_reference_variants.py)
        descale = (amax32 / np.float32(6.0)).astype(np.float32)
        with np.errstate(divide="ignore"):
            log2 = np.log2(descale.astype(np.float64)).astype(np.float32).astype(np.float64)
        s = np.ceil(log2)
        return np.where(np.isfinite(s), s, -(2 * E8M0_BIAS)).astype(np.int64)  # descale 0: log2 -Inf, clamped below
    raise ValueError(f"unknown MX scale rule {rule!r}")


def _rounded_amax_overflows(amax32: np.ndarray, rule: MxScaleRule) -> np.ndarray:
    """Whether the rule rounds the (finite) amax to Inf: only EVEN can, for amax >= 1.75 * 2**127."""
    if rule is not MxScaleRule.EVEN:
        return np.zeros(amax32.shape, bool)
    bumped = (amax32.view(np.uint32).astype(np.uint64) + np.uint64(1 << 21)) & np.uint64(0x7F800000)
    return bumped == np.uint64(0x7F800000)


def mx_scale_byte(
    amax,
    rule: MxScaleRule | str = MxScaleRule.FLOOR,
    *,
    zero_block: ZeroBlockRule | str = ZeroBlockRule.MIN,
    overflow: ScaleOverflow | str = ScaleOverflow.CLAMP,
) -> np.ndarray:
    """E8M0 scale byte for each block amax (float32 magnitudes; NaN/Inf -> 0xFF).

    The exponent is clamped to [-127, 127] (byte 0..254): OCP and microxcaling
    clamp below; for E2M1 and finite fp32 inputs the upper clamp is never live.
    """
    rule = MxScaleRule(rule)
    zero_block = ZeroBlockRule(zero_block)
    a = np.asarray(amax)
    if a.dtype != np.float32:
        if a.dtype.kind != "f":
            raise TypeError(f"amax must be float32, got {a.dtype}")
        a32 = a.astype(np.float32)
        if not np.array_equal(a32.astype(a.dtype), a, equal_nan=True):
            raise ValueError("amax must be exactly representable in float32")
        a = a32
    if np.any(np.signbit(a) & (a != 0)):
        raise ValueError("amax must be non-negative (a magnitude)")
    a = np.abs(a)  # -0 -> +0
    finite = np.isfinite(a)
    safe = np.where(finite & (a > 0), a, np.float32(1.0)).astype(np.float32)
    s = _rule_exponent(safe, rule)
    byte = np.clip(s, -E8M0_BIAS, E8M0_BIAS) + E8M0_BIAS
    byte = np.where(a == 0, _ZERO_BLOCK_BYTE[zero_block], byte)
    if zero_block is ZeroBlockRule.EPS_1E10_FLOOR:
        byte = np.maximum(byte, EPS_1E10_BYTE)
    if ScaleOverflow(overflow) is ScaleOverflow.NAN:
        byte = np.where(_rounded_amax_overflows(safe, rule), 0xFF, byte)
    byte = np.where(finite, byte, 0xFF)
    return byte.astype(np.uint8)
