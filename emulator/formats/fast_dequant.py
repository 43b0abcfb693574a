"""The fast dequantization path: blocked, threaded, float32 arithmetic (speed only).

The specification is ``int_common.dequantize_affine`` (the rule, exact in float64) applied
by each format's ``dequantize_<format>_reference`` (gptq.py, awq.py, compressed_tensors.py,
mxfp4.py). The public ``dequantize_*`` functions, which the emulator fallback backend,
acceptance and the benchmarks call, use the code here; every result is bit-identical to the
reference for every variant (tests/emulator/test_reference_vs_fast.py), because:

- integer formats, ``SUB_THEN_MUL`` with RNE and fp16/bf16/fp32 scales (``_FastPlan``,
  ``_sub_then_mul_f32``): the scale after its load-time and compute-dtype RNE conversions is
  a float32; ``q - z`` (``|q - z| <= 256``) is exact in int8 when the codes' declared range
  and the zeros allow, else in float32; the float32 product is the correctly rounded exact
  product, and for a 16-bit compute dtype it is exact (<= 9 + 11 significant bits) and
  rounded once afterwards. Every other variant is computed by the rule itself;
- MXFP4 (``dequantize_mxfp4_packed``): one table lookup per packed byte, indexed by the byte and
  its block's E8M0 scale byte, of both E2M1 values times the scale: the table holds the float32
  products the rule's multiply gives (exact unless they overflow to Inf, as RNE does; NaN for
  scale byte 0xFF).

Work is split into cache-sized row blocks on all cores (emulator/parallel.py); the codes of
a block are unpacked inside it (``CodeRows``, fed by fast_unpack.py).
"""

from __future__ import annotations

import functools

import numpy as np

from ..numerics.e2m1 import decode_e2m1
from ..numerics.e8m0 import decode_e8m0
from ..numerics.fast_round import round_fast
from ..numerics.rounding import Rounding, as_float64
from ..parallel import for_row_chunks
from .fast_matmul import RowSink
from .int_common import (
    CANONICAL_DEQUANT,
    ComputeDtype,
    DequantOrder,
    DequantVariant,
    check_out,
    default_g_idx,
    dequantize_affine,
    expand_groups,
)

__all__ = ["CodeRows", "dequantize_affine_fast", "dequantize_grouped", "dequantize_mxfp4_packed"]


def dequantize_affine_fast(q, z, s, *, variant: DequantVariant = CANONICAL_DEQUANT, midpoint: int = 0,
                           out: np.ndarray | None = None, code_range=None) -> np.ndarray:
    """``int_common.dequantize_affine`` with the same arguments and result, in float32 where that
    is exact. ``code_range`` (the format's (min, max) code, e.g. (0, 15) for GPTQ int4) lets
    q - z be formed in int8 when it provably fits."""
    fast = _sub_then_mul_f32(q, z, s, variant, out, code_range)
    if fast is not None:
        return fast
    return dequantize_affine(q, z, s, variant=variant, midpoint=midpoint, out=out)


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


def dequantize_grouped(q, zeros, scales, g_idx, *, variant: DequantVariant = CANONICAL_DEQUANT, midpoint: int = 0,
                       code_range=None, out: np.ndarray | None = None) -> np.ndarray:
    """``dequantize_affine_fast`` for q [N, K] with per-group zeros/scales [N, G] (zeros may be 0).

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
    sink = out if isinstance(out, RowSink) else None
    if sink is not None:
        if sink.shape != (n, k):
            raise ValueError(f"out: a row sink of shape {list(sink.shape)} for a weight of shape {[n, k]}")
    else:
        out = np.empty((n, k), dtype=np.float32) if out is None else check_out(out, (n, k))
    scalar_zero = np.isscalar(zeros)
    za = zeros if scalar_zero else np.asarray(zeros)
    default = g_idx is None or np.array_equal(g_idx, default_g_idx(k, k // n_groups))
    gs = k // n_groups
    g = None if default else np.asarray(g_idx)
    # the common case's operands are prepared once for the whole layer, not per block
    plan = _FastPlan.make(za, s, variant, code_range) or _FloatZeroPlan.make(za, s, variant, midpoint)
    kw = dict(variant=variant, midpoint=midpoint, code_range=code_range)

    def rows(r0, r1):  # elementwise, so row blocks can run on all cores (emulator/parallel.py)
        qb = src.rows(r0, r1)
        dst = out[r0:r1] if sink is None else sink.buffer(r1 - r0)
        if plan is not None:
            plan.block(qb, r0, r1, dst, gs, g, scratch=src.scratch, scale=None if sink is None else sink.scale)
        elif default:
            zb = za if scalar_zero else za[r0:r1, :, None]
            dequantize_affine_fast(qb.reshape(r1 - r0, n_groups, gs), zb, s[r0:r1, :, None],
                                   out=dst.reshape(r1 - r0, n_groups, gs), **kw)
        else:
            zb = za if scalar_zero else expand_groups(za[r0:r1], g)
            dequantize_affine_fast(qb, zb, expand_groups(s[r0:r1], g), out=dst, **kw)
        if sink is not None:
            sink.deliver(r0, r1, dst)

    if sink is not None:  # the sink's blocks (a multiple of every format's row alignment)
        if sink.step % src.align:
            raise ValueError(f"out: row sink blocks of {sink.step} rows; these codes come {src.align} rows at a time")
        for_row_chunks(n, n * k, rows, step=sink.step)
        return sink
    for_row_chunks(n, n * k, rows, row_bytes=4 * k, align=src.align)
    return out


class _FastPlan:
    """Operands of ``_sub_then_mul_f32`` for a whole [N, G] grouping, computed once.

    ``s32`` [N, G] float32 are the scales after the load-time and compute-dtype conversions;
    ``z8`` [N, G] int8 (an int8 scalar where every zero is the same, e.g. symmetric GPTQ; None
    where it is 0) are the zeros when every q - z provably fits int8. ``block`` then forms one row block with three array passes: q - z in int8, the
    cast to float32 and the multiply (the rounding to a 16-bit compute dtype, if any, last).
    The multiply is a row sink's ``scale`` when the block streams into one (fast_matmul.RowSink:
    NumPy's by default; qconform_torch's runs torch's, which needs no loop call per group).
    """

    __slots__ = ("s32", "z8", "compute")

    def __init__(self, s32, z8, compute):
        self.s32, self.z8, self.compute = s32, z8, compute

    @classmethod
    def make(cls, za, s, variant: DequantVariant, code_range):
        if (variant.order is not DequantOrder.SUB_THEN_MUL or variant.compute_rounding is not Rounding.RNE
                or code_range is None):
            return None
        s32 = _fast_scales(s, variant.scale_dtype, variant.compute_dtype)
        if s32 is None:
            return None
        za = np.asarray(za)
        if za.ndim == 0 and za.dtype.kind in "iu" and za == 0:
            z8 = None
        elif _difference_fits_int8(za, code_range):
            z8 = za.astype(np.int8)
            if z8.size and z8.min() == z8.max():  # one zero for all: a scalar subtract, no per-group loop
                z8 = None if z8.flat[0] == 0 else np.int8(z8.flat[0])
            elif z8.ndim == 0:
                z8 = np.broadcast_to(z8, s32.shape)
        else:
            return None
        return cls(s32, z8, variant.compute_dtype)

    def block(self, qb: np.ndarray, r0: int, r1: int, out: np.ndarray, gs: int, g, scratch: bool = False,
              scale=None) -> None:
        """Rows [r0, r1): codes ``qb`` [R, K] (uint8/int8 in the declared code range) -> ``out``.

        ``scratch``: ``qb`` is a temporary the block may overwrite (q - z in place). ``scale(w, s)``: the
        in-place float32 multiply ``w *= s`` (s broadcast) to use, a row sink's (``RowSink.scale``)."""
        if qb.dtype not in (np.uint8, np.int8):
            qb, scratch = qb.astype(np.int16), True
        r = r1 - r0
        s = self.s32[r0:r1]
        z = self.z8[r0:r1] if isinstance(self.z8, np.ndarray) else self.z8
        per_group = isinstance(z, np.ndarray)
        if g is None:
            q3, o3 = qb.reshape(r, -1, gs), out.reshape(r, -1, gs)
            s, z = s[:, :, None], z[:, :, None] if per_group else z
        else:
            q3, o3 = qb, out
            s, z = expand_groups(s, g), expand_groups(z, g) if per_group else z
        if z is None:
            o3[...] = q3
        else:
            q3 = q3 if qb.dtype == np.int16 else q3.view(np.int8)
            # exact: the plan checked that every q - z fits int8
            o3[...] = np.subtract(q3, z, out=q3 if scratch else None)
        if scale is None:
            with np.errstate(over="ignore", invalid="ignore"):
                np.multiply(o3, s, out=o3)
        else:
            scale(o3, s)  # the sink's own multiply (RowSink.scale) keeps Inf/NaN products silent
        if self.compute is not ComputeDtype.FLOAT32:
            out[...] = round_fast(out, self.compute.value)


class _FloatZeroPlan:
    """``DequantOrder.FLOAT_ZERO`` with RNE (torch's ``_weight_int4pack_mm`` declaration): per row block
    ``RNE_C((q - m) s_C + zero)`` with ``zero = RNE_Z((m - z) s_C)`` formed once per [N, G] group by the rule
    itself. ``(q - m) s_C + zero`` is exact in float64 (``int_common.dequantize_affine`` says why: at most
    24 + 11 significant bits), so one float64 pass and one correctly rounded conversion to C (the IEEE
    cast for float32, ``round_fast`` for a 16-bit C) equal the rule bit for bit."""

    __slots__ = ("s64", "zero", "midpoint", "compute")

    def __init__(self, s64, zero, midpoint, compute):
        self.s64, self.zero, self.midpoint, self.compute = s64, zero, midpoint, compute

    @classmethod
    def make(cls, za, s, variant: DequantVariant, midpoint: int):
        from ..numerics.floats import round_to_format

        if variant.order is not DequantOrder.FLOAT_ZERO or variant.compute_rounding is not Rounding.RNE:
            return None
        compute = variant.compute_dtype
        s32 = _fast_scales(s, variant.scale_dtype, compute)
        za = np.asarray(za)
        if s32 is None or za.dtype.kind not in "iu" or np.ndim(s32) != 2:
            return None
        s64 = s32.astype(np.float64)
        midpoint = int(midpoint)
        zfmt = compute.fmt if variant.zero_dtype is None else variant.zero_dtype.fmt
        with np.errstate(over="ignore", invalid="ignore"):
            zero = round_to_format((midpoint - np.broadcast_to(za, s64.shape).astype(np.int64)).astype(np.float64) * s64,
                                   zfmt)
        return cls(s64, zero, midpoint, compute)

    def block(self, qb: np.ndarray, r0: int, r1: int, out: np.ndarray, gs: int, g, scratch: bool = False,
              scale=None) -> None:
        """As ``_FastPlan.block``; ``scale`` is unused (this rule scales in float64)."""

        r = r1 - r0
        s, zero = self.s64[r0:r1], self.zero[r0:r1]
        if g is None:
            q3 = qb.reshape(r, -1, gs)
            s, zero = s[:, :, None], zero[:, :, None]
        else:
            q3 = qb
            s, zero = expand_groups(s, g), expand_groups(zero, g)
        with np.errstate(over="ignore", invalid="ignore"):
            v = (q3.astype(np.float64) - self.midpoint) * s + zero  # exact (see the class docstring)
            o = v.astype(np.float32) if self.compute is ComputeDtype.FLOAT32 else round_fast(v, self.compute.value)
        out[...] = o.reshape(out.shape)


def _fast_scales(s, scale_dtype: "ComputeDtype | None", compute: "ComputeDtype"):
    """Scales as float32 after the scale_dtype and compute-dtype RNE conversions, or None when the
    stored dtype is not fp16/bf16/fp32 (then the float64 rule applies)."""
    sa = np.asarray(s)
    if sa.dtype.name not in ("float16", "bfloat16", "float32"):
        return None
    s32 = sa.astype(np.float32) if sa.dtype.name != "bfloat16" else as_float64(sa).astype(np.float32)
    if scale_dtype is not None:
        s32 = round_fast(s32, scale_dtype.value)
    return round_fast(s32, compute.value)


def _sub_then_mul_f32(q, z, s, variant: DequantVariant, out=None, code_range=None):
    """The common case computed with IEEE float32 arithmetic, bit-identical to the rule.

    Applies to SUB_THEN_MUL with RNE and scales stored as fp16/bf16/fp32: the scale is
    exact in float32, each operand conversion is an RNE rounding of a float32 (done by
    ``round_fast``), q - z (|q - z| <= 256) is exact in float32, and the float32
    product is the correctly rounded exact product — for a 16-bit compute dtype it is exact
    (<= 9 + 11 significant bits) and then rounded once. Returns None when it does not apply.
    """
    if variant.order is not DequantOrder.SUB_THEN_MUL or variant.compute_rounding is not Rounding.RNE:
        return None
    compute = variant.compute_dtype
    s32 = _fast_scales(s, variant.scale_dtype, compute)
    if s32 is None:
        return None
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
        out[...] = round_fast(out, compute.value)
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


# --- MXFP4 -------------------------------------------------------------------------------


def byte_pairs_f32() -> np.ndarray:
    """[256, 2] float32: the two E2M1 values of each packed byte (low nibble first)."""
    b = np.arange(256)
    e2m1 = decode_e2m1(np.arange(16, dtype=np.uint8)).astype(np.float32)
    return np.stack([e2m1[b & 0xF], e2m1[b >> 4]], axis=1).astype(np.float32)


#: E8M0 byte -> float32 scale (byte 0 = 2**-127 is an exact fp32 subnormal; 0xFF -> NaN)
E8M0_F32 = decode_e8m0(np.arange(256, dtype=np.uint8)).astype(np.float32)
MX_BLOCK = 32
#: a byte times this is the byte in the high half of each of a uint64's four uint16 lanes (either endianness)
_HIGH_BYTE_LANES = np.uint64(0x0100_0100_0100_0100)


@functools.cache
def scaled_pairs_u64() -> np.ndarray:
    """[65536] uint64: entry ``scale_byte << 8 | packed_byte`` holds the byte's two E2M1 values (low nibble
    first) each times the E8M0 scale, as the two float32 products of one IEEE multiply (512 KiB, built
    once). A product of an E2M1 value (<= 6, 2 significant bits) and a power of two is exact in float32
    unless it overflows (6 * 2**127 -> Inf, as RNE of the exact value gives); byte 0's 2**-127 gives exact
    subnormals, 0xFF NaN, code 8 -0.0 (tests/emulator/test_fast_paths.py checks all 65536 entries)."""
    with np.errstate(over="ignore", invalid="ignore"):
        t = byte_pairs_f32()[None, :, :] * E8M0_F32[:, None, None]
    return np.ascontiguousarray(t, dtype=np.float32).view(np.uint64).reshape(256 * 256)


def dequantize_mxfp4_packed(packed: np.ndarray, scale_bytes: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """Float32 MXFP4 weight straight from packed bytes [..., K/2] and scale bytes [..., K/32].

    Equal to ``mxfp4.dequantize_mxfp4(unpack_e2m1(packed), scale_bytes, dtype=np.float32)``: each
    packed byte becomes its two values times its block's scale by one lookup in a table indexed by
    (scale byte, packed byte) (``scaled_pairs_u64``, the products the rule gives), so a row block is
    one index pass and one gather. ``out``: a float32 C-contiguous array of the result's shape to
    write into instead of a new one.
    """
    p = np.asarray(packed)
    sb = np.asarray(scale_bytes)
    lead = p.shape[:-1]
    p2 = p.reshape(-1, p.shape[-1])
    sb2 = sb.reshape(-1, sb.shape[-1])
    shape2 = (p2.shape[0], p2.shape[1] * 2)
    sink = out if isinstance(out, RowSink) else None
    if sink is not None:
        if sink.shape != shape2 or len(lead) != 1:
            raise ValueError(f"out: a row sink of shape {list(sink.shape)} for a weight of shape "
                             f"{list(lead + (p.shape[-1] * 2,))}")
    elif out is None:
        out2 = np.empty(shape2, dtype=np.float32)
    else:
        out2 = check_out(out, lead + (p.shape[-1] * 2,)).reshape(shape2)
    table = scaled_pairs_u64()
    per_scale = MX_BLOCK // 2  # packed bytes per scale byte

    def rows(r0, r1):  # cache-sized row blocks on all cores (emulator/parallel.py); elementwise
        v = out2[r0:r1] if sink is None else sink.buffer(r1 - r0)
        # index = scale byte << 8 | packed byte, as uint16: each scale byte, shifted into the high byte
        # of four uint16 lanes of a uint64, repeated over its 16 packed bytes (a repeat is a plain copy
        # loop; a broadcast over 16-element groups costs several times more), then the bytes ORed in
        lanes = np.multiply(sb2[r0:r1], _HIGH_BYTE_LANES, dtype=np.uint64)
        idx = np.repeat(lanes, per_scale // 4, axis=1).view(np.uint16)
        np.bitwise_or(idx, p2[r0:r1], out=idx)
        # mode="wrap" never wraps (a uint16 indexes a 65536-entry table); it only skips the
        # per-element bounds check of the default mode, which costs ten times the gather
        np.take(table, idx, out=v.view(np.uint64), mode="wrap")
        if sink is not None:
            sink.deliver(r0, r1, v)

    if sink is not None:
        for_row_chunks(shape2[0], shape2[0] * shape2[1], rows, step=sink.step)
        return sink
    for_row_chunks(p2.shape[0], out2.size, rows, row_bytes=4 * shape2[1])
    return out2.reshape(lead + (p.shape[-1] * 2,)) if out is None else out
