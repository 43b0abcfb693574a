"""Binary floating-point formats and correctly rounded conversion into them.

Semantics: docs/formats.md#floating-point-formats.

One engine serves every format qconform needs (fp32, fp16, bf16 and the
4-bit E2M1 element of MXFP4): a value is split into an integer significand
and a power of two from its float64 bits, the significand is shifted to the
target's quantum with guard/sticky rounding (``rounding.round_scaled_significand``),
and the result is rebuilt exactly. Rounding modes are the names of
``rounding.Rounding``; IEEE formats default to RNE.

Conventions (IEEE 754-2019 §4.3, §7.4 for overflow):
- subnormals are produced (no flush-to-zero), -0 is kept;
- overflow under RNE/RHAZ/RHTZ gives +-Inf for formats with Inf, and +-max
  under RTZ or where the caller asks to saturate;
- NaN inputs give a quiet NaN with the sign and the top payload bits kept
  (the x86 / ARM hardware convention). numpy float64->float32 and torch
  ->float16 give the same bits; ml_dtypes ->bfloat16 keeps only the sign,
  torch ->bfloat16 returns one canonical NaN, numpy ->float16 does not set
  the quiet bit (docs/formats.md#floating-point-formats);
- float64 inputs are rounded once, directly. ml_dtypes (->bf16, ->e2m1) and
  torch (->bf16, ->fp16) round float64 through float32 first (double rounding).
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np

from .rounding import Rounding, as_float64, round_scaled_significand, decompose

__all__ = [
    "FloatFormat",
    "Overflow",
    "FP32",
    "FP16",
    "BF16",
    "E2M1",
    "FORMATS",
    "round_to_format",
    "encode",
    "decode",
    "round_to_dtype",
]


class Overflow(str, enum.Enum):
    """What a finite value beyond the largest finite number becomes."""

    IEEE = "ieee"  # +-Inf, except RTZ which gives +-max (IEEE 754 §7.4)
    SATURATE = "saturate"  # +-max (OCP MX §6.3 for element conversion)


@dataclasses.dataclass(frozen=True)
class FloatFormat:
    """A sign/exponent/mantissa binary format.

    ``has_inf_nan`` is the IEEE convention (all-ones exponent reserved);
    E2M1 has neither Inf nor NaN (OCP MX v1.0 §5.3.3), so its all-ones
    exponent holds normal numbers.
    """

    name: str
    exp_bits: int
    man_bits: int
    bias: int
    has_inf_nan: bool

    @property
    def bits(self) -> int:
        return 1 + self.exp_bits + self.man_bits

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        top = (1 << self.exp_bits) - (2 if self.has_inf_nan else 1)
        return top - self.bias

    @property
    def max_finite(self) -> float:
        return float(np.ldexp(2.0 - 2.0 ** -self.man_bits, self.emax))

    @property
    def smallest_subnormal(self) -> float:
        return float(np.ldexp(1.0, self.emin - self.man_bits))

    @property
    def storage_dtype(self):
        return {4: np.uint8, 8: np.uint8, 16: np.uint16, 32: np.uint32}[self.bits]


FP32 = FloatFormat("fp32", 8, 23, 127, True)
FP16 = FloatFormat("fp16", 5, 10, 15, True)
BF16 = FloatFormat("bf16", 8, 7, 127, True)
E2M1 = FloatFormat("e2m1", 2, 1, 1, False)

FORMATS = {f.name: f for f in (FP32, FP16, BF16, E2M1)}
_DTYPE_ALIASES = {"float32": FP32, "float16": FP16, "bfloat16": BF16, "half": FP16, "float": FP32}


def format_of(name: "str | FloatFormat") -> FloatFormat:
    if isinstance(name, FloatFormat):
        return name
    key = str(name).lower()
    fmt = FORMATS.get(key) or _DTYPE_ALIASES.get(key)
    if fmt is None:
        raise ValueError(f"unknown float format {name!r}; expected one of {sorted(FORMATS) + sorted(_DTYPE_ALIASES)}")
    return fmt


def _floor_log2(sig: np.ndarray, exp: np.ndarray) -> np.ndarray:
    """floor(log2(sig * 2**exp)) for sig > 0, exactly (sig < 2**53)."""
    _, bitlen = np.frexp(sig.astype(np.float64))
    return exp + bitlen.astype(np.int64) - 1


def round_to_format(
    x,
    fmt: "FloatFormat | str",
    mode: Rounding | str = Rounding.RNE,
    overflow: Overflow | str = Overflow.IEEE,
) -> np.ndarray:
    """Round each value to the nearest member of ``fmt`` under ``mode``; float64 out.

    The result is a float64 holding exactly a value of ``fmt`` (or +-Inf/NaN).
    For formats without Inf (E2M1) overflow always saturates, and +-Inf input
    becomes +-max; NaN input stays NaN here (the format-specific encoders
    decide which code NaN becomes).
    """
    fmt = format_of(fmt)
    mode = Rounding.parse(mode)
    overflow = Overflow(overflow)
    if not fmt.has_inf_nan:
        overflow = Overflow.SATURATE
    x64 = as_float64(x)
    out = np.array(x64, dtype=np.float64, copy=True)

    finite = np.isfinite(x64)
    xf = np.where(finite, x64, 0.0)
    sign, sig, exp = decompose(xf)
    nonzero = sig != 0
    safe_sig = np.where(nonzero, sig, np.uint64(1))
    e = _floor_log2(safe_sig, exp)
    quantum = np.maximum(e, fmt.emin) - fmt.man_bits
    shift = quantum - exp
    on_grid = shift <= 0
    mag = round_scaled_significand(safe_sig, np.where(on_grid, 0, shift), mode)
    with np.errstate(over="ignore"):  # lanes already on the grid are not taken from ldexp
        val = np.where(on_grid, np.abs(xf), np.ldexp(mag.astype(np.float64), quantum))
    val = np.where(nonzero, val, 0.0)

    too_big = val > fmt.max_finite
    if overflow is Overflow.SATURATE or mode is Rounding.RTZ:
        val = np.where(too_big, fmt.max_finite, val)
    else:
        val = np.where(too_big, np.inf, val)
    val = np.where(sign, -val, val)
    out[finite] = val[finite]

    if not fmt.has_inf_nan:
        inf = np.isinf(x64)
        out[inf] = np.copysign(fmt.max_finite, x64[inf])
    return out


def encode(
    x,
    fmt: "FloatFormat | str",
    mode: Rounding | str = Rounding.RNE,
    overflow: Overflow | str = Overflow.IEEE,
) -> np.ndarray:
    """Round to ``fmt`` and return the bit patterns (uint8/uint16/uint32).

    NaN handling for IEEE formats: quiet NaN, sign kept, the top
    ``man_bits - 1`` payload bits of the float64 NaN kept. For formats without
    NaN (E2M1) a NaN input is an error here: ``e2m1.encode_e2m1`` names the
    NaN rule to apply.
    """
    fmt = format_of(fmt)
    x64 = as_float64(x)
    if not fmt.has_inf_nan and np.any(np.isnan(x64)):
        raise ValueError(f"{fmt.name} has no NaN encoding; choose a NaN rule (see emulator.numerics.e2m1)")
    v = round_to_format(x64, fmt, mode, overflow)
    sign = np.signbit(v).astype(np.uint64)
    a = np.abs(v)
    nonzero_finite = np.isfinite(a) & (a != 0)
    safe = np.where(nonzero_finite, a, 1.0)
    _, fe = np.frexp(safe)
    e = fe.astype(np.int64) - 1
    normal = e >= fmt.emin
    # significand on the format's integer grid: exact since v is a member of fmt
    man_normal = np.ldexp(safe, fmt.man_bits - e) - 2.0 ** fmt.man_bits
    man_sub = np.ldexp(safe, fmt.man_bits - fmt.emin)
    biased = np.where(normal, e + fmt.bias, 0)
    man = np.where(normal, man_normal, man_sub).astype(np.uint64)
    body = (biased.astype(np.uint64) << np.uint64(fmt.man_bits)) | man
    body = np.where(nonzero_finite, body, np.uint64(0))

    if fmt.has_inf_nan:
        exp_all = np.uint64(((1 << fmt.exp_bits) - 1) << fmt.man_bits)
        body = np.where(np.isinf(v), exp_all, body)
        isnan = np.isnan(v)
        if np.any(isnan):
            payload = (x64.view(np.uint64) & np.uint64((1 << 52) - 1)) >> np.uint64(52 - fmt.man_bits)
            quiet = np.uint64(1 << (fmt.man_bits - 1))
            nan_body = exp_all | payload | quiet
            body = np.where(isnan, nan_body, body)
            sign = np.where(isnan, (x64.view(np.uint64) >> np.uint64(63)), sign)
    bits = (sign << np.uint64(fmt.bits - 1)) | body
    return bits.astype(fmt.storage_dtype)


def decode(bits, fmt: "FloatFormat | str") -> np.ndarray:
    """Exact value of each bit pattern of ``fmt``, as float64."""
    fmt = format_of(fmt)
    b = np.asarray(bits).astype(np.uint64)
    if np.any(b >> np.uint64(fmt.bits)):
        raise ValueError(f"{fmt.name} bit pattern out of range (>= 2**{fmt.bits})")
    sign = (b >> np.uint64(fmt.bits - 1)) & np.uint64(1)
    biased = ((b >> np.uint64(fmt.man_bits)) & np.uint64((1 << fmt.exp_bits) - 1)).astype(np.int64)
    man = (b & np.uint64((1 << fmt.man_bits) - 1)).astype(np.float64)
    normal = biased > 0
    val = np.where(
        normal,
        np.ldexp(1.0 + man / 2.0 ** fmt.man_bits, biased - fmt.bias),
        np.ldexp(man, fmt.emin - fmt.man_bits),
    )
    if fmt.has_inf_nan:
        top = biased == (1 << fmt.exp_bits) - 1
        val = np.where(top & (man == 0), np.inf, val)
        val = np.where(top & (man != 0), np.nan, val)
    return np.where(sign == 1, -val, val)


def round_to_dtype(x, dtype: str, mode: Rounding | str = Rounding.RNE) -> np.ndarray:
    """Round to ``'float32' | 'float16' | 'bfloat16'`` (IEEE overflow); float64 out.

    The definition; ``fast_round.round_fast`` is its fast path (same values, one NaN rule)."""
    return round_to_format(x, format_of(dtype), mode, Overflow.IEEE)
