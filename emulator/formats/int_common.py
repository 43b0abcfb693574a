"""What the integer weight formats (GPTQ, AWQ, compressed-tensors) share.

Semantics: docs/formats/gptq.md#dequantization (awq.md and
compressed-tensors.md use the same rule and the same variant names).

``dequantize_affine`` computes the rule below exactly (float64, each rounding
explicit): the specification every ``dequantize_<format>_reference`` applies after
unpacking the codes and expanding per-group zeros and scales with ``expand_groups``.
The blocked float32 fast path is ``fast_dequant.py``.

Dequantization, canonical
-------------------------
A weight element is ``w = (q - z) * s`` with ``q`` the stored integer code,
``z`` the integer zero point of its group and ``s`` the group's scale. The
emulator computes the exact real value of that product and rounds it *once*
to float32 (RNE). With float16 or bfloat16 scales the rounding never happens:
``|q - z| <= 256`` has at most 8 significant bits and the scale at most 11,
so the product has at most 19 significant bits and fits float32's 24; its
exponent stays inside float32's range (a float16 scale is at most 65504, so
``|w| < 2**24``; float16 subnormals are multiples of 2**-24 and float32
represents every multiple of 2**-149 below 2**-125 exactly). The only
exception is a bfloat16 scale above 2**128 / 256, whose product overflows to
+-Inf as IEEE float32 would. With float32 scales (compressed-tensors allows
them) the exact product can need 32 bits, and the single RNE rounding to
float32 is part of the definition.

Named variants of the operation order (the fields of ``DequantVariant``, the
``variant=`` of every ``dequantize_*`` function; emulator/declaration.py's
``dequant_variant`` builds it from the Stage.WEIGHTS axes of emulator/variants.py):

- ``DequantOrder.SUB_THEN_MUL`` (canonical): ``round_C((q - z) * s)``.
- ``DequantOrder.MUL_THEN_SUB``: ``round_C(round_C(q * s) - round_C(z * s))``;
  the order vLLM's Machete reference uses (``quantize_weights(...,
  ref_zero_points_after_scales=True)`` in
  ``vllm/model_executor/layers/quantization/utils/quant_utils.py``).
- ``DequantOrder.FLOAT_ZERO``: the zero point is turned into a *float*
  offset stored in a dtype Z before the weights are formed (tinygemm:
  torch ``_weight_int4pack_mm_for_cpu`` / CUDA ``_weight_int4pack_mm``,
  whose ``qScaleAndZeros`` hold ``scale`` and ``zero`` in the activation
  dtype). With ``m`` the format's midpoint code (``2**(bits-1)`` for the
  unsigned GPTQ/AWQ codes, 0 for compressed-tensors' signed codes) and
  ``s_C`` the scale in C:

      zero = round_Z((m - z) * s_C)          the exact product, rounded once (RNE) to Z
      w    = round_C((q - m) * s_C + zero)   the exact sum, rounded once to C (an FMA)

  ``zero_dtype`` Z defaults to C. It equals SUB_THEN_MUL exactly when
  ``(m - z) * s_C`` is representable in Z (always for symmetric weights,
  z = m, and for Z = float32 with 16-bit scales).
- ``scale_dtype``: the scales are first rounded (RNE) to this dtype, e.g.
  ``ComputeDtype.BFLOAT16`` for kernels that load float16 checkpoint scales
  into bfloat16 parameters (``SCALE_BF16``).
- ``compute_dtype`` C: every operand is converted to C and every operation's
  result is rounded to C, as a kernel that dequantizes in C does. The
  returned array is still float32 (it holds values of C exactly).
- ``compute_rounding``: the rounding of those conversions to C: RNE
  (canonical) or RTZ (vLLM's ``_C_AVX512.abi3.so``, whose FP32->BF16
  conversion without AVX512-BF16 drops the low 16 bits:
  ``csrc/cpu/cpu_types_x86.hpp``). The ``scale_dtype`` cast and the Z
  rounding of FLOAT_ZERO are load-time casts and always RNE.

With 16-bit scales and float32 compute, MUL_THEN_SUB equals SUB_THEN_MUL
bit for bit (every product and the difference are exact in float32); it
differs with a 16-bit compute dtype or with float32 scales.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np

from ..errors import FormatError, UnsupportedFormatError, require
from ..numerics.floats import BF16, FP16, FP32, FloatFormat, round_to_format
from ..numerics.rounding import Rounding, as_float64, quantize_to_int

__all__ = [
    "ZeroConvention",
    "DequantOrder",
    "ComputeDtype",
    "DequantVariant",
    "CANONICAL_DEQUANT",
    "FLOAT_DTYPE_NAMES",
    "shape_str",
    "check_dtype",
    "check_shape",
    "check_integer_range",
    "check_scales",
    "check_weights",
    "resolve_group_size",
    "default_g_idx",
    "check_g_idx",
    "expand_groups",
    "dequantize_affine",
    "check_out",
    "round_scale",
    "float_array",
    "rtn_codes",
]


class ZeroConvention(str, enum.Enum):
    """How a GPTQ checkpoint stores its zero points (``checkpoint_format``).

    V1 (``"gptq"``, AutoGPTQ): the stored field is ``z - 1`` and readers add 1,
    so a field of all ones reads as ``2**bits`` (16 for 4-bit) and ``z = 0``
    cannot be stored. V2 (``"gptq_v2"``, GPTQModel): the field is ``z``.
    """

    V1 = "gptq"
    V2 = "gptq_v2"


class DequantOrder(str, enum.Enum):
    """The order of the two arithmetic steps of ``(q - z) * s``."""

    SUB_THEN_MUL = "sub_then_mul"
    MUL_THEN_SUB = "mul_then_sub"
    FLOAT_ZERO = "float_zero"  # (q - m) * s + round_Z((m - z) * s): tinygemm's float zero point


class ComputeDtype(str, enum.Enum):
    """A floating-point dtype in which a kernel rounds its arithmetic."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"

    @property
    def fmt(self) -> FloatFormat:
        return {"float32": FP32, "float16": FP16, "bfloat16": BF16}[self.value]


@dataclasses.dataclass(frozen=True)
class DequantVariant:
    """How a kernel forms ``(q - z) * s``: the arithmetic of the weights (module docstring). Defaults are canonical.

    ``order`` (axis ``dequant_order``), ``scale_dtype`` (``weight_scale_dtype``; None: the checkpoint's),
    ``compute_dtype`` C and ``compute_rounding`` (``weight_formation`` with ``weight_dtype`` and
    ``weight_rounding``), ``zero_dtype`` Z of ``FLOAT_ZERO`` (``zero_dtype``; None: C). Strings are accepted
    and stored as the enums.
    """

    order: DequantOrder = DequantOrder.SUB_THEN_MUL
    scale_dtype: ComputeDtype | None = None
    compute_dtype: ComputeDtype = ComputeDtype.FLOAT32
    compute_rounding: Rounding = Rounding.RNE
    zero_dtype: ComputeDtype | None = None

    def __post_init__(self):
        def dtype(v):
            return None if v is None else ComputeDtype(v)

        object.__setattr__(self, "order", DequantOrder(self.order))
        object.__setattr__(self, "scale_dtype", dtype(self.scale_dtype))
        object.__setattr__(self, "compute_dtype", ComputeDtype(self.compute_dtype))
        object.__setattr__(self, "compute_rounding", Rounding.parse(self.compute_rounding))
        object.__setattr__(self, "zero_dtype", dtype(self.zero_dtype))


#: the canonical arithmetic: SUB_THEN_MUL, the checkpoint's scales, float32, RNE
CANONICAL_DEQUANT = DequantVariant()

FLOAT_DTYPE_NAMES = ("float16", "bfloat16", "float32")


def shape_str(shape) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def check_dtype(a, allowed, *, tensor: str, layer: str | None = None) -> np.ndarray:
    """Return ``a`` as an ndarray; FormatError unless its dtype name is in ``allowed``."""
    arr = np.asarray(a)
    name = arr.dtype.name
    if name not in allowed:
        want = " or ".join(allowed)
        raise FormatError(f"expected dtype {want}, got {name}", layer=layer, tensor=tensor)
    return arr


def check_shape(a: np.ndarray, expected, what: str, *, tensor: str, layer: str | None = None) -> None:
    """FormatError unless ``a.shape == expected``; ``what`` spells the shape symbolically."""
    expected = tuple(int(d) for d in expected)
    require(
        tuple(a.shape) == expected,
        f"expected shape {what} = {shape_str(expected)}, got {shape_str(a.shape)}",
        layer=layer,
        tensor=tensor,
    )


def _first_index(mask: np.ndarray) -> tuple:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def check_integer_range(a: np.ndarray, lo: int, hi: int, what: str, *, tensor: str, layer: str | None = None) -> None:
    """FormatError naming the first element of integer array ``a`` outside [lo, hi]."""
    arr = np.asarray(a)
    require(arr.dtype.kind in "iu", f"expected an integer array, got dtype {arr.dtype.name}", layer=layer, tensor=tensor)
    bad = (arr.astype(np.int64) < lo) | (arr.astype(np.int64) > hi)
    if np.any(bad):
        idx = _first_index(bad)
        raise FormatError(
            f"{what} {int(arr[idx])} at index {list(idx)} is out of range [{lo}, {hi}] "
            f"({int(bad.sum())} element(s) out of range)",
            layer=layer,
            tensor=tensor,
        )


def check_scales(s: np.ndarray, *, tensor: str, layer: str | None = None) -> np.ndarray:
    """Scales must be finite; returns them widened to float64.

    NaN and +-Inf are errors (a NaN scale cannot come from any quantizer and
    would silently poison a whole group). Negative scales are *valid*: auto-round's
    symmetric quantizer maps the largest-magnitude weight to code -8 and so writes
    a negative scale whenever that weight is positive (about half of all groups in
    tests/data/toolkit_checkpoints/auto-round-w4g32-sym-*), and its own dequant
    uses them as stored. A zero scale is allowed: it dequantizes its group to
    +-0 (the sign follows IEEE multiplication).
    """
    s64 = as_float64(s)
    bad = ~np.isfinite(s64)
    if np.any(bad):
        idx = _first_index(bad)
        raise FormatError(
            f"scale {float(s64[idx])} at index {list(idx)} is not finite ({int(bad.sum())} NaN/Inf scale(s)); "
            "NaN and Inf scales are errors",
            layer=layer,
            tensor=tensor,
        )
    return s64


def check_weights(w, *, tensor: str = "w", layer: str | None = None) -> np.ndarray:
    """A float weight matrix [N, K] to quantize; returns it widened to float64.

    Only float16/bfloat16/float32 are accepted: with at most 24-bit
    significands for both weight and scale, the float64 quotient ``w / s``
    never lands on the wrong side of a rounding tie (docs/formats/gptq.md#quantize-rtn-for-making-test-cases),
    so the RTN codes are those of the exact quotient.
    """
    arr = check_dtype(w, FLOAT_DTYPE_NAMES, tensor=tensor, layer=layer)
    require(arr.ndim == 2, f"expected a 2-D weight [N, K], got shape {shape_str(arr.shape)}", layer=layer, tensor=tensor)
    w64 = as_float64(arr)
    bad = ~np.isfinite(w64)
    if np.any(bad):
        idx = _first_index(bad)
        raise FormatError(
            f"weight {float(w64[idx])} at index {list(idx)} is not finite; NaN/Inf weights cannot be quantized",
            layer=layer,
            tensor=tensor,
        )
    return w64


def resolve_group_size(k: int, group_size: int, *, tensor: str, layer: str | None = None) -> int:
    """The group size in elements along K: ``-1`` means one group of all K."""
    if group_size == -1:
        return int(k)
    if group_size <= 0:
        raise UnsupportedFormatError(f"group_size must be -1 or positive, got {group_size}")
    require(
        k % group_size == 0,
        f"K = {k} is not a multiple of group_size {group_size}",
        layer=layer,
        tensor=tensor,
    )
    return int(group_size)


def default_g_idx(k: int, group: int) -> np.ndarray:
    """The identity group map ``g_idx[k] = k // group`` (int32)."""
    return (np.arange(k, dtype=np.int64) // group).astype(np.int32)


def check_g_idx(g_idx, k: int, n_groups: int, group: int, *, desc_act: bool, tensor: str, layer: str | None = None) -> np.ndarray:
    """Validate a group map: int32 [K], values in [0, n_groups).

    Without act-order (``desc_act=False``) the map must be the identity
    ``k // group``: kernels then ignore g_idx, so any other map would make the
    canonical reading (which honours g_idx) disagree with every backend.
    """
    g = check_dtype(g_idx, ("int32",), tensor=tensor, layer=layer)
    check_shape(g, (k,), "[K]", tensor=tensor, layer=layer)
    check_integer_range(g, 0, n_groups - 1, "group index", tensor=tensor, layer=layer)
    if not desc_act:
        expect = default_g_idx(k, group)
        bad = g != expect
        if np.any(bad):
            i = int(np.argmax(bad))
            raise FormatError(
                f"desc_act=False requires g_idx[k] == k // group_size ({group}); "
                f"g_idx[{i}] = {int(g[i])}, expected {int(expect[i])}",
                layer=layer,
                tensor=tensor,
            )
    return g


def expand_groups(per_group, g_idx) -> np.ndarray:
    """Per-group values [..., G] -> per-column values [..., K]: column k gets group ``g_idx[k]``.

    The one group expansion of every format: GPTQ/AWQ/compressed-tensors zeros and scales
    (with act-order, ``g_idx`` is any map; without, ``k // group_size``; channel-wise is
    ``G = 1``) and MXFP4's block scales (``g_idx[k] = k // 32``).
    """
    return np.take(np.asarray(per_group), np.asarray(g_idx, dtype=np.intp), axis=-1)


def dequantize_affine(
    q,
    z,
    s,
    *,
    variant: DequantVariant = CANONICAL_DEQUANT,
    midpoint: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Elementwise ``(q - z) * s`` under the named order/dtype ``variant``; float32 out.

    This is the rule itself, computed exactly in float64 with each rounding of the
    definition done explicitly (``round_to_format``): the specification that the
    ``*_reference`` dequantizers apply and that ``fast_dequant.dequantize_affine_fast``
    equals bit for bit.

    ``q`` and ``z`` are integer arrays and ``s`` a float array, all already
    broadcast to the weight's shape. ``midpoint`` is the code the float zero
    of ``DequantOrder.FLOAT_ZERO`` is measured from (``2**(bits-1)`` for
    unsigned codes, 0 for signed ones); the other orders ignore it and
    ``variant.zero_dtype``. See the module docstring for the rules.
    """
    order, fmt, mode = variant.order, variant.compute_dtype.fmt, variant.compute_rounding
    s64 = as_float64(s)
    if variant.scale_dtype is not None:
        s64 = round_to_format(s64, variant.scale_dtype.fmt)
    s64 = round_to_format(s64, fmt, mode)  # operand conversion to the compute dtype
    # Inf and NaN are defined results (IEEE): a scale that overflows the compute dtype, Inf - Inf
    with np.errstate(over="ignore", invalid="ignore"):
        qi = np.asarray(q).astype(np.int64)
        zi = np.asarray(z).astype(np.int64)
        # Integers with |v| <= 256 have at most 8 significant bits, so they are
        # exact in every compute dtype (bfloat16 has 8), and each float64 product
        # below has at most 9 + 24 significant bits: exact.
        if order is DequantOrder.SUB_THEN_MUL:
            res = round_to_format((qi - zi).astype(np.float64) * s64, fmt, mode)
        elif order is DequantOrder.MUL_THEN_SUB:
            a = round_to_format(qi.astype(np.float64) * s64, fmt, mode)
            b = round_to_format(zi.astype(np.float64) * s64, fmt, mode)
            # a and b are members of fmt (<= 24 significant bits) whose exponents
            # differ by at most 9, so their float64 difference is exact before
            # the one rounding.
            res = round_to_format(a - b, fmt, mode)
        else:
            zfmt = fmt if variant.zero_dtype is None else variant.zero_dtype.fmt
            zero = round_to_format((midpoint - zi).astype(np.float64) * s64, zfmt)
            # (q - m) * s_C is a multiple of the quantum of s_C below 2**9 |s_C|; zero
            # is a multiple of that quantum too (it is either the exact product, or a
            # rounding of a value at least |s_C| to a format no finer than C), and at
            # most 2**9 |s_C| (1 + 2**-7): the float64 sum needs at most 24 + 11 bits.
            res = round_to_format((qi - midpoint).astype(np.float64) * s64 + zero, fmt, mode)
    if out is not None:
        out[...] = res
        return out
    return res.astype(np.float32)


def check_out(out, shape: tuple, *, what: str = "out") -> np.ndarray:
    """A caller's output buffer: float32, C-contiguous, writeable, of ``shape`` (else ValueError)."""
    if not isinstance(out, np.ndarray):
        raise ValueError(f"{what}: expected a numpy.ndarray, got {type(out).__name__}")
    problems = []
    if out.dtype != np.float32:
        problems.append(f"dtype {out.dtype.name} (expected float32)")
    if tuple(out.shape) != tuple(shape):
        problems.append(f"shape {list(out.shape)} (expected {list(shape)})")
    if not out.flags.c_contiguous:
        problems.append("not C-contiguous")
    if not out.flags.writeable:
        problems.append("read-only")
    if problems:
        raise ValueError(f"{what}: " + ", ".join(problems))
    return out


def round_scale(s64: np.ndarray, dtype: str, *, tensor: str, layer: str | None = None) -> np.ndarray:
    """Round quantizer scales to their storage dtype (RNE); float64 values out.

    A scale that rounds to 0 or overflows to Inf cannot be stored: FormatError.
    """
    fmt = ComputeDtype(dtype).fmt
    r = round_to_format(s64, fmt)
    bad = (r == 0) | ~np.isfinite(r)
    if np.any(bad):
        idx = _first_index(bad)
        raise FormatError(
            f"scale {float(s64[idx])!r} at index {list(idx)} is not representable as a positive finite "
            f"{ComputeDtype(dtype).value} (rounds to {float(r[idx])!r}); the weights' range is too small "
            "or too large for scales of that dtype",
            layer=layer,
            tensor=tensor,
        )
    return r


def float_array(values64: np.ndarray, dtype: str) -> np.ndarray:
    """An array of ``dtype`` holding ``values64``, which must be members of it.

    bfloat16 needs numpy's bfloat16 dtype from ml_dtypes, imported only here
    and only when asked for (the rest of the emulator reads bfloat16 arrays
    by their bits, without importing it).
    """
    dtype = ComputeDtype(dtype)
    v32 = np.asarray(values64, dtype=np.float64).astype(np.float32)
    if dtype is ComputeDtype.BFLOAT16:
        import ml_dtypes  # noqa: PLC0415

        return v32.astype(ml_dtypes.bfloat16)
    return v32.astype(np.dtype(dtype.value))


def rtn_codes(
    w64: np.ndarray,
    s64: np.ndarray,
    z,
    lo: int,
    hi: int,
    *,
    what: str,
    zero_before_rounding: bool = False,
) -> np.ndarray:
    """Round-to-nearest-even integer codes, clamped to [lo, hi]; int32 out.

    ``zero_before_rounding=False``: ``clamp(RNE(w / s) + z, lo, hi)`` (GPTQ's
    ``quantize``, AutoAWQ, vLLM's ``quantize_weights``, ONNX QuantizeLinear).
    ``True``: ``clamp(RNE(w / s + z), lo, hi)`` (compressed-tensors'
    ``_quantize``). The two differ exactly when ``w / s`` is a tie and z is odd.

    The quotient is computed in float64 and rounded with
    ``rounding.quantize_to_int``. For weights and scales with at most 24-bit
    significands a non-tie quotient is at least 2**-26 away from the nearest
    half-integer (in absolute terms, for |w / s| <= 2**9) while the float64
    error is below 2**-43, so neither the division nor the integer addition
    can move it across a rounding boundary: the codes are those of the exact
    quotient.
    """
    zi = np.asarray(z).astype(np.int64)
    if zero_before_rounding:
        r = quantize_to_int(w64 / s64 + zi, lo, hi, Rounding.RNE, what=what)
        return r.astype(np.int32)
    r = quantize_to_int(w64 / s64, lo - zi, hi - zi, Rounding.RNE, what=what)
    return (r.astype(np.int64) + zi).astype(np.int32)
