"""What the integer weight formats (GPTQ, AWQ, compressed-tensors) share.

Semantics: docs/formats/gptq.md#dequantization (awq.md and
compressed-tensors.md use the same rule and the same variant names).

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

Named variants of the operation order (keyword-only arguments of every
``dequantize_*`` function):

- ``DequantOrder.SUB_THEN_MUL`` (canonical): ``round_C((q - z) * s)``.
- ``DequantOrder.MUL_THEN_SUB``: ``round_C(round_C(q * s) - round_C(z * s))``;
  the order vLLM's Machete reference uses (``quantize_weights(...,
  ref_zero_points_after_scales=True)`` in
  ``vllm/model_executor/layers/quantization/utils/quant_utils.py``).
- ``scale_dtype``: the scales are first rounded (RNE) to this dtype, e.g.
  ``ComputeDtype.BFLOAT16`` for kernels that load float16 checkpoint scales
  into bfloat16 parameters (``SCALE_BF16``).
- ``compute_dtype`` C: every operand is converted to C and every operation's
  result is rounded to C (RNE), as a kernel that dequantizes in C does. The
  returned array is still float32 (it holds values of C exactly).

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

import enum

import numpy as np

from ..errors import FormatError, UnsupportedFormatError, require
from ..numerics.floats import BF16, FP16, FP32, FloatFormat, round_to_format
from ..numerics.rounding import Rounding, as_float64, quantize_to_int
from ..parallel import for_row_chunks

__all__ = [
    "ZeroConvention",
    "DequantOrder",
    "ComputeDtype",
    "FLOAT_DTYPE_NAMES",
    "dtype_name",
    "shape_str",
    "check_dtype",
    "check_shape",
    "check_integer_range",
    "check_scales",
    "check_weights",
    "resolve_group_size",
    "default_g_idx",
    "check_g_idx",
    "dequantize_affine",
    "dequantize_grouped",
    "CodeRows",
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


FLOAT_DTYPE_NAMES = ("float16", "bfloat16", "float32")


def dtype_name(a) -> str:
    """numpy's name for the dtype of ``a`` ('bfloat16' for ml_dtypes bfloat16)."""
    return np.asarray(a).dtype.name


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


def dequantize_affine(
    q,
    z,
    s,
    *,
    order: DequantOrder | str = DequantOrder.SUB_THEN_MUL,
    scale_dtype: ComputeDtype | str | None = None,
    compute_dtype: ComputeDtype | str = ComputeDtype.FLOAT32,
    compute_rounding: Rounding | str = Rounding.RNE,
    zero_dtype: ComputeDtype | str | None = None,
    midpoint: int = 0,
    out: np.ndarray | None = None,
    code_range: tuple[int, int] | None = None,
) -> np.ndarray:
    """Elementwise ``(q - z) * s`` under the named order/dtype variant; float32 out.

    ``code_range`` (the format's (min, max) code, e.g. (0, 15) for GPTQ int4) is a speed
    hint only: with it, q - z is formed in int8 when it provably fits.

    ``q`` and ``z`` are integer arrays and ``s`` a float array, all already
    broadcast to the weight's shape. ``midpoint`` is the code the float zero
    of ``DequantOrder.FLOAT_ZERO`` is measured from (``2**(bits-1)`` for
    unsigned codes, 0 for signed ones); the other orders ignore it and
    ``zero_dtype``. See the module docstring for the rules.
    """
    order = DequantOrder(order)
    fmt = ComputeDtype(compute_dtype).fmt
    mode = Rounding.parse(compute_rounding)
    fast = _dequantize_sub_then_mul_f32(q, z, s, order, scale_dtype, ComputeDtype(compute_dtype), mode, out,
                                        code_range)
    if fast is not None:
        return fast
    s64 = as_float64(s)
    if scale_dtype is not None:
        s64 = round_to_format(s64, ComputeDtype(scale_dtype).fmt)
    s64 = round_to_format(s64, fmt, mode)  # operand conversion to the compute dtype
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
        zfmt = fmt if zero_dtype is None else ComputeDtype(zero_dtype).fmt
        zero = round_to_format((midpoint - zi).astype(np.float64) * s64, zfmt)
        # (q - m) * s_C is a multiple of the quantum of s_C below 2**9 |s_C|; zero
        # is a multiple of that quantum too (it is either the exact product, or a
        # rounding of a value at least |s_C| to a format no finer than C), and at
        # most 2**9 |s_C| (1 + 2**-7): the float64 sum needs at most 24 + 11 bits.
        with np.errstate(over="ignore", invalid="ignore"):
            res = round_to_format((qi - midpoint).astype(np.float64) * s64 + zero, fmt, mode)
    if out is not None:
        out[...] = res
        return out
    return res.astype(np.float32)


class CodeRows:
    """Integer codes of an [N, K] weight, delivered in row blocks: ``rows(r0, r1)`` -> [r1 - r0, K].

    Lets ``dequantize_grouped`` unpack each block inside its cache-sized block instead of
    materialising all codes first (speed only: the codes are the same). ``align``: every
    block but the last starts at a multiple of it (AWQ unpacks 8 rows per word).
    """

    __slots__ = ("shape", "rows", "align", "scratch")

    def __init__(self, shape: tuple, rows, align: int = 1, scratch: bool = False):
        self.shape = (int(shape[0]), int(shape[1]))
        self.rows = rows
        self.align = int(align)
        self.scratch = scratch  # each block is a new array the consumer may overwrite

    @classmethod
    def of(cls, q) -> "CodeRows":
        """The row source of an array of codes that is already in memory."""
        q = np.asarray(q)
        return cls(q.shape, lambda r0, r1: q[r0:r1])


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


def dequantize_grouped(q, zeros, scales, g_idx, *, out: np.ndarray | None = None, **kw) -> np.ndarray:
    """``dequantize_affine`` for q [N, K] with per-group zeros/scales [N, G] (zeros may be 0).

    Group g of column k is ``g_idx[k]``. ``q`` is an integer array or a ``CodeRows``; the
    weight is formed in cache-sized row blocks on all cores (emulator/parallel.py), each
    block unpacking its own codes. The default grouping (k // (K / G)) broadcasts [N, G, 1]
    against the block viewed as [N, G, K / G]; any other ``g_idx`` gathers the block's
    scales and zeros. Same values either way: the rule is elementwise. ``out`` (float32
    [N, K], C-contiguous) receives the result instead of a new array.
    """
    src = q if isinstance(q, CodeRows) else CodeRows.of(q)
    s = np.asarray(scales)
    n, k = src.shape
    n_groups = s.shape[1]
    out = np.empty((n, k), dtype=np.float32) if out is None else check_out(out, (n, k))
    scalar_zero = np.isscalar(zeros)
    za = zeros if scalar_zero else np.asarray(zeros)
    default = g_idx is None or np.array_equal(g_idx, default_g_idx(k, k // n_groups))
    gs = k // n_groups
    g = None if default else np.asarray(g_idx)
    # the common case's operands are prepared once for the whole layer, not per block
    plan = _FastPlan.make(za, s, kw)

    def rows(r0, r1):  # elementwise, so row blocks can run on all cores (emulator/parallel.py)
        qb = src.rows(r0, r1)
        if plan is not None:
            plan.block(qb, r0, r1, out[r0:r1], gs, g, scratch=src.scratch)
        elif default:
            zb = za if scalar_zero else za[r0:r1, :, None]
            dequantize_affine(qb.reshape(r1 - r0, n_groups, gs), zb, s[r0:r1, :, None],
                              out=out[r0:r1].reshape(r1 - r0, n_groups, gs), **kw)
        else:
            zb = za if scalar_zero else za[r0:r1][:, g]
            dequantize_affine(qb, zb, s[r0:r1][:, g], out=out[r0:r1], **kw)

    for_row_chunks(n, n * k, rows, row_bytes=4 * k, align=src.align)
    return out


class _FastPlan:
    """Operands of ``_dequantize_sub_then_mul_f32`` for a whole [N, G] grouping, computed once.

    ``s32`` [N, G] float32 are the scales after the load-time and compute-dtype conversions;
    ``z8`` [N, G] int8 (or None: the zero is 0) are the zeros when every q - z provably fits
    int8. ``block`` then forms one row block with three array passes: q - z in int8, the
    cast to float32 and the multiply (the rounding to a 16-bit compute dtype, if any, last).
    """

    __slots__ = ("s32", "z8", "compute")

    def __init__(self, s32, z8, compute):
        self.s32, self.z8, self.compute = s32, z8, compute

    @classmethod
    def make(cls, za, s, kw: dict):
        order = DequantOrder(kw.get("order", DequantOrder.SUB_THEN_MUL))
        mode = Rounding.parse(kw.get("compute_rounding", Rounding.RNE))
        if order is not DequantOrder.SUB_THEN_MUL or mode is not Rounding.RNE or kw.get("code_range") is None:
            return None
        s32 = _fast_scales(s, kw.get("scale_dtype"), ComputeDtype(kw.get("compute_dtype", ComputeDtype.FLOAT32)))
        if s32 is None:
            return None
        za = np.asarray(za)
        if za.ndim == 0 and za.dtype.kind in "iu" and za == 0:
            z8 = None
        elif _difference_fits_int8(za, kw["code_range"]):
            z8 = np.broadcast_to(za.astype(np.int8), s32.shape) if za.ndim == 0 else za.astype(np.int8)
        else:
            return None
        return cls(s32, z8, ComputeDtype(kw.get("compute_dtype", ComputeDtype.FLOAT32)))

    def block(self, qb: np.ndarray, r0: int, r1: int, out: np.ndarray, gs: int, g, scratch: bool = False) -> None:
        """Rows [r0, r1): codes ``qb`` [R, K] (uint8/int8 in the declared code range) -> ``out``.

        ``scratch``: ``qb`` is a temporary the block may overwrite (q - z in place)."""
        if qb.dtype not in (np.uint8, np.int8):
            qb, scratch = qb.astype(np.int16), True
        r = r1 - r0
        s = self.s32[r0:r1]
        z = None if self.z8 is None else self.z8[r0:r1]
        if g is None:
            q3, o3 = qb.reshape(r, -1, gs), out.reshape(r, -1, gs)
            s, z = s[:, :, None], None if z is None else z[:, :, None]
        else:
            q3, o3 = qb, out
            s, z = s[:, g], None if z is None else z[:, g]
        if z is None:
            o3[...] = q3
        else:
            q3 = q3 if qb.dtype == np.int16 else q3.view(np.int8)
            # exact: the plan checked that every q - z fits int8
            o3[...] = np.subtract(q3, z, out=q3 if scratch else None)
        with np.errstate(over="ignore", invalid="ignore"):
            np.multiply(o3, s, out=o3)
        if self.compute is not ComputeDtype.FLOAT32:
            from ..numerics.floats import round_float32_array

            out[...] = round_float32_array(out, self.compute.value)


def _fast_scales(s, scale_dtype, compute: "ComputeDtype"):
    """Scales as float32 after the scale_dtype and compute-dtype RNE conversions, or None when the
    stored dtype is not fp16/bf16/fp32 (then the float64 rule applies)."""
    sa = np.asarray(s)
    if sa.dtype.name not in ("float16", "bfloat16", "float32"):
        return None
    from ..numerics.floats import round_float32_array

    s32 = sa.astype(np.float32) if sa.dtype.name != "bfloat16" else as_float64(sa).astype(np.float32)
    if scale_dtype is not None:
        s32 = round_float32_array(s32, ComputeDtype(scale_dtype).value)
    return round_float32_array(s32, compute.value)


def _dequantize_sub_then_mul_f32(q, z, s, order, scale_dtype, compute: ComputeDtype, mode: Rounding, out=None,
                                 code_range=None):
    """The common case computed with IEEE float32 arithmetic, bit-identical to the rule above.

    Applies to SUB_THEN_MUL with RNE and scales stored as fp16/bf16/fp32: the scale is
    exact in float32, each operand conversion is an RNE rounding of a float32 (done by
    ``round_float32_array``), q - z (|q - z| <= 256) is exact in float32, and the float32
    product is the correctly rounded exact product — for a 16-bit compute dtype it is exact
    (<= 9 + 11 significant bits) and then rounded once. Returns None when it does not apply.
    """
    if order is not DequantOrder.SUB_THEN_MUL or mode is not Rounding.RNE:
        return None
    s32 = _fast_scales(s, scale_dtype, compute)
    if s32 is None:
        return None
    from ..numerics.floats import round_float32_array

    qa, za = np.asarray(q), np.asarray(z)
    if out is None:
        out = np.empty(np.broadcast_shapes(qa.shape, za.shape, s32.shape), dtype=np.float32)
    if za.ndim == 0 and za == 0 and qa.dtype.kind in "iu" and qa.dtype.itemsize <= 2:
        out[...] = qa  # q - 0: the codes themselves (exact in float32)
    elif (d8 := _difference_int8(qa, za, code_range)) is not None:
        out[...] = d8  # q - z, exact in int8 and in float32
    else:
        # integers below 2**24 are exact in float32, so q - z computed in float32 is exact
        # (a plain cast then a same-type subtract is much faster than a mixed-type ufunc)
        out[...] = qa
        if za.ndim or za != 0:
            np.subtract(out, za.astype(np.float32), out=out)
    with np.errstate(over="ignore", invalid="ignore"):
        np.multiply(out, s32, out=out)
    if compute is not ComputeDtype.FLOAT32:
        out[...] = round_float32_array(out, compute.value)
    return out


def _difference_fits_int8(za: np.ndarray, code_range) -> bool:
    """Whether the codes' declared range and the zeros' actual range guarantee that every
    operand and every difference q - z fits int8."""
    if code_range is None or za.dtype.kind not in "iu":
        return False
    lo, hi = code_range
    zlo, zhi = (int(za.min()), int(za.max())) if za.size else (0, 0)
    return (-128 <= lo and hi <= 127 and -128 <= zlo and zhi <= 127 and -128 <= lo - zhi and hi - zlo <= 127)


def _difference_int8(qa: np.ndarray, za: np.ndarray, code_range) -> np.ndarray | None:
    """q - z as int8 (one byte per element: a quarter of the float32 traffic) when it fits."""
    if qa.dtype not in (np.uint8, np.int8) or not _difference_fits_int8(za, code_range):
        return None
    return np.subtract(qa.view(np.int8), za.astype(np.int8))


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
