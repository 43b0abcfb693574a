"""compressed-tensors integer weights: ``pack-quantized`` (int4/int8) and ``int-quantized`` (int8).

Semantics: docs/formats/compressed-tensors.md.

pack-quantized (logical weight W [N, K]; b = num_bits in {4, 8};
F = 32 // b; offset = 2**(b-1); q and zp are *signed*, in [-offset, offset-1]):

=================  ===================  =============  ==========================
name               shape                dtype          content
=================  ===================  =============  ==========================
weight_packed      [N, ceil(K / F)]     int32          q + offset packed along K,
                                                       LSB first; missing fields
                                                       of the last word are 0
weight_scale       [N, K / G] (group)   fp16/bf16/fp32
                   [N, 1] (channel)
weight_zero_point  [ceil(N / F), K/G]   int32          asym only: zp + offset
                                                       packed along N
weight_shape       [2]                  int64 (int32)  (N, K)
weight_g_idx       [K]                  int32          optional (actorder "group")
=================  ===================  =============  ==========================

Canonical value: ``W[n, k] = (q[n, k] - zp[n, g]) * weight_scale[n, g]`` with
``g = g_idx[k]`` (default ``k // G``) and zp = 0 when symmetric, exact and
rounded once to float32. The +offset of both q and zp cancels, so the stored
unsigned fields give the same value: ``(Q - ZP) * s``.

int-quantized (W8A8): ``weight`` int8 [N, K], ``weight_scale`` [N, 1]
(channel) or [1] (tensor), symmetric: ``W = q * s``.

``dequantize_ct_packed_reference`` / ``dequantize_ct_int8_reference`` are the
specification to read; ``dequantize_ct_packed`` / ``dequantize_ct_int8`` the fast path.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np

from ..errors import FormatError, UnsupportedFormatError, require
from ..numerics.rounding import Rounding, quantize_to_int
from .fast_dequant import CodeRows, dequantize_affine_fast, dequantize_grouped
from .fast_unpack import sequential_fields
from .int_common import (
    CANONICAL_DEQUANT,
    DequantVariant,
    FLOAT_DTYPE_NAMES,
    check_dtype,
    check_g_idx,
    check_integer_range,
    check_scales,
    check_shape,
    check_weights,
    default_g_idx,
    dequantize_affine,
    expand_groups,
    float_array,
    round_scale,
    rtn_codes,
    shape_str,
)
from .packing import pack_int32, unpack_int32

__all__ = [
    "CtStrategy",
    "CtPackParams",
    "CtPackedTensors",
    "CtCodes",
    "quantize_ct_packed",
    "pack_ct_packed",
    "unpack_ct_packed",
    "dequantize_ct_packed",
    "dequantize_ct_packed_reference",
    "CtInt8Tensors",
    "quantize_ct_int8",
    "validate_ct_int8",
    "dequantize_ct_int8",
    "dequantize_ct_int8_reference",
]


class CtStrategy(str, enum.Enum):
    """``weights.strategy`` of a compressed-tensors scheme (the ones defined here)."""

    GROUP = "group"
    CHANNEL = "channel"


@dataclasses.dataclass(frozen=True)
class CtPackParams:
    """The ``weights`` quantization args of a pack-quantized scheme."""

    num_bits: int = 4
    strategy: CtStrategy = CtStrategy.GROUP
    group_size: int | None = 128
    symmetric: bool = True
    actorder: bool = False

    def __post_init__(self):
        object.__setattr__(self, "strategy", CtStrategy(self.strategy))
        if self.num_bits not in (4, 8):
            raise UnsupportedFormatError(f"pack-quantized num_bits must be 4 or 8 here, got {self.num_bits}")
        if self.strategy is CtStrategy.GROUP:
            if self.group_size is None or self.group_size <= 0:
                raise UnsupportedFormatError(f"strategy 'group' needs a positive group_size, got {self.group_size}")
        elif self.group_size not in (None, -1):
            raise UnsupportedFormatError(f"strategy 'channel' takes no group_size, got {self.group_size}")
        if self.actorder and self.strategy is not CtStrategy.GROUP:
            raise UnsupportedFormatError("actorder (weight_g_idx) needs strategy 'group'")

    @classmethod
    def from_config(cls, weights: dict) -> "CtPackParams":
        """From a scheme's ``weights`` dict (config_groups.*.weights)."""
        if weights.get("type", "int") != "int":
            raise UnsupportedFormatError(f"pack-quantized integer weights need type 'int', got {weights.get('type')!r}")
        actorder = weights.get("actorder")
        return cls(
            num_bits=int(weights.get("num_bits", 8)),
            strategy=CtStrategy(weights.get("strategy", "group")),
            group_size=weights.get("group_size"),
            symmetric=bool(weights.get("symmetric", True)),
            actorder=actorder in ("group", True),
        )

    @property
    def offset(self) -> int:
        return 1 << (self.num_bits - 1)

    @property
    def qmin(self) -> int:
        return -self.offset

    @property
    def qmax(self) -> int:
        return self.offset - 1

    @property
    def pack_factor(self) -> int:
        return 32 // self.num_bits


@dataclasses.dataclass(frozen=True)
class CtPackedTensors:
    weight_packed: np.ndarray
    weight_scale: np.ndarray
    weight_shape: np.ndarray
    weight_zero_point: np.ndarray | None = None
    weight_g_idx: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class CtCodes:
    """Signed codes: q [N, K] int8, scales [N, n_groups], zero_point [N, n_groups]
    int8 (None when symmetric), g_idx [K] int32 (None: ``k // G``)."""

    q: np.ndarray
    scales: np.ndarray
    zero_point: np.ndarray | None = None
    g_idx: np.ndarray | None = None


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _n_groups(k: int, params: CtPackParams, layer: str | None, tensor: str) -> int:
    if params.strategy is CtStrategy.CHANNEL:
        return 1
    require(
        k % params.group_size == 0,
        f"K = {k} is not a multiple of group_size {params.group_size}",
        layer=layer,
        tensor=tensor,
    )
    return k // params.group_size


def _group_map(g_idx, k: int, n_groups: int, params: CtPackParams, layer: str | None) -> np.ndarray:
    group = k // n_groups
    if g_idx is None:
        return default_g_idx(k, group)
    return check_g_idx(g_idx, k, n_groups, group, desc_act=params.actorder, tensor="weight_g_idx", layer=layer)


def _pack_padded(values: np.ndarray, bits: int, axis: int, tensor: str, layer: str | None) -> np.ndarray:
    """pack_int32 after padding ``axis`` with zero fields to a whole word (pack_to_int32's padding)."""
    per_word = 32 // bits
    pad = (-values.shape[axis]) % per_word
    if pad:
        widths = [(0, 0)] * values.ndim
        widths[axis] = (0, pad)
        values = np.pad(values, widths)
    return pack_int32(values, bits, axis=axis, tensor=tensor, layer=layer)


def _check_ct_scales(scale, n: int, n_groups: int, layer: str | None) -> np.ndarray:
    s = check_dtype(scale, FLOAT_DTYPE_NAMES, tensor="weight_scale", layer=layer)
    check_shape(s, (n, n_groups), "[N, K/G]" if n_groups != 1 else "[N, 1]", tensor="weight_scale", layer=layer)
    check_scales(s, tensor="weight_scale", layer=layer)
    return s


def _scale_eps(dtype: str) -> float:
    """``torch.finfo(dtype).eps``: compressed-tensors' replacement for a zero scale."""
    return {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23}[dtype]


def _ct_minmax_scales(lo, hi, bits: int, symmetric: bool, scale_dtype: str, layer: str | None):
    """compressed-tensors' ``calculate_qparams`` for int, returning (s, zp) on the stored scale."""
    offset = 1 << (bits - 1)
    bit_range = (1 << bits) - 1
    lo = np.minimum(lo, 0.0)
    hi = np.maximum(hi, 0.0)
    if symmetric:
        s = np.maximum(-lo, hi) / (bit_range / 2.0)
    else:
        s = (hi - lo) / bit_range
    s = np.where(s == 0, _scale_eps(scale_dtype), s)
    s = round_scale(s, scale_dtype, tensor="weight_scale", layer=layer)
    if symmetric:
        return s, None
    zp = quantize_to_int(-lo / s, 0, bit_range, Rounding.RNE, what="zero point") - offset
    return s, zp.astype(np.int32)


def quantize_ct_packed(
    w,
    params: CtPackParams,
    *,
    g_idx=None,
    scale_dtype: str | None = None,
    layer: str | None = None,
) -> CtPackedTensors:
    """Round-to-nearest quantization of w [N, K] into pack-quantized tensors.

    compressed-tensors' min/max rule (``quantization/utils/helpers.py::calculate_qparams``):
    ``lo = min(min w, 0)``, ``hi = max(max w, 0)`` per row and group;
    sym ``s = max(-lo, hi) / ((2**b - 1) / 2)`` (amax / 7.5 for 4-bit), zp = 0;
    asym ``s = (hi - lo) / (2**b - 1)``, ``zp = clamp(RNE(-2**(b-1) - lo / s), ...)``;
    a zero scale becomes ``finfo(scale_dtype).eps``; then
    ``q = clamp(RNE(w / s + zp), -2**(b-1), 2**(b-1) - 1)`` (zp added *before*
    rounding, as the library's ``_quantize`` does; GPTQ and AWQ add it after,
    which differs on ties when zp is odd). Differences from the
    library: s is rounded to ``scale_dtype`` (default: w's dtype) before zp
    and q are computed, and the quotient is exact (the library divides in w's
    dtype). Error bound: see ``gptq.quantize_gptq``.
    """
    w64 = check_weights(w, layer=layer)
    scale_dtype = scale_dtype or np.asarray(w).dtype.name
    n, k = w64.shape
    n_groups = _n_groups(k, params, layer, "w")
    g = _group_map(g_idx, k, n_groups, params, layer)
    lo = np.zeros((n, n_groups))
    hi = np.zeros((n, n_groups))
    for gi in range(n_groups):
        cols = w64[:, g == gi]
        if cols.shape[1]:
            lo[:, gi] = cols.min(axis=1)
            hi[:, gi] = cols.max(axis=1)
    s, zp = _ct_minmax_scales(lo, hi, params.num_bits, params.symmetric, scale_dtype, layer)
    z_full = 0 if zp is None else expand_groups(zp, g)
    q = rtn_codes(w64, expand_groups(s, g), z_full, params.qmin, params.qmax, what="w", zero_before_rounding=True)
    codes = CtCodes(
        q=q.astype(np.int8),
        scales=float_array(s, scale_dtype),
        zero_point=None if zp is None else zp.astype(np.int8),
        g_idx=None if g_idx is None else g,
    )
    return pack_ct_packed(codes, params, layer=layer)


def pack_ct_packed(codes: CtCodes, params: CtPackParams, *, layer: str | None = None) -> CtPackedTensors:
    """Pack signed codes into pack-quantized tensors (inverse of ``unpack_ct_packed``)."""
    q = np.asarray(codes.q)
    require(q.ndim == 2, f"expected a 2-D [N, K] array, got shape {shape_str(q.shape)}", layer=layer, tensor="q")
    n, k = q.shape
    n_groups = _n_groups(k, params, layer, "q")
    check_integer_range(q, params.qmin, params.qmax, "code", tensor="q", layer=layer)
    scales = _check_ct_scales(codes.scales, n, n_groups, layer)
    g = None if codes.g_idx is None else _group_map(codes.g_idx, k, n_groups, params, layer)
    require(
        g is not None or not params.actorder,
        "actorder 'group' needs weight_g_idx",
        layer=layer,
        tensor="weight_g_idx",
    )
    packed = _pack_padded(q.astype(np.int64) + params.offset, params.num_bits, 1, "q", layer)
    zp_packed = None
    if params.symmetric:
        require(codes.zero_point is None, "symmetric scheme takes no zero point", layer=layer, tensor="weight_zero_point")
    else:
        require(codes.zero_point is not None, "asymmetric scheme needs zero points", layer=layer, tensor="weight_zero_point")
        zp = np.asarray(codes.zero_point)
        check_shape(zp, (n, n_groups), "[N, K/G]" if n_groups != 1 else "[N, 1]", tensor="weight_zero_point", layer=layer)
        check_integer_range(zp, params.qmin, params.qmax, "zero point", tensor="weight_zero_point", layer=layer)
        zp_packed = _pack_padded(zp.astype(np.int64) + params.offset, params.num_bits, 0, "weight_zero_point", layer)
    return CtPackedTensors(
        weight_packed=packed,
        weight_scale=scales,
        weight_shape=np.array([n, k], dtype=np.int64),
        weight_zero_point=zp_packed,
        weight_g_idx=g,
    )


def _read_shape(weight_shape, layer: str | None) -> tuple:
    ws = check_dtype(weight_shape, ("int64", "int32"), tensor="weight_shape", layer=layer)
    check_shape(ws, (2,), "[2]", tensor="weight_shape", layer=layer)
    require(bool(np.all(ws > 0)), f"expected positive (N, K), got {ws.tolist()}", layer=layer, tensor="weight_shape")
    return int(ws[0]), int(ws[1])


def _validated(tensors: CtPackedTensors, params: CtPackParams, layer: str | None):
    """Check every tensor; returns (n, k, packed, scales [N, G], zero_point int8 [N, G] or None, g_idx)."""
    n, k = _read_shape(tensors.weight_shape, layer)
    f = params.pack_factor
    n_groups = _n_groups(k, params, layer, "weight_shape")
    packed = check_dtype(tensors.weight_packed, ("int32",), tensor="weight_packed", layer=layer)
    check_shape(packed, (n, _ceil_div(k, f)), f"[N, ceil(K/{f})]", tensor="weight_packed", layer=layer)
    scales = _check_ct_scales(tensors.weight_scale, n, n_groups, layer)
    zp = None
    if params.symmetric:
        require(
            tensors.weight_zero_point is None,
            "present, but the scheme is symmetric (compressed-tensors drops the zero point of symmetric weights)",
            layer=layer,
            tensor="weight_zero_point",
        )
    else:
        require(tensors.weight_zero_point is not None, "missing: an asymmetric scheme needs it", layer=layer, tensor="weight_zero_point")
        zpp = check_dtype(tensors.weight_zero_point, ("int32",), tensor="weight_zero_point", layer=layer)
        check_shape(zpp, (_ceil_div(n, f), n_groups), f"[ceil(N/{f}), K/G]", tensor="weight_zero_point", layer=layer)
        zu = unpack_int32(zpp, params.num_bits, axis=0, tensor="weight_zero_point", layer=layer)[:n, :]
        zp = (zu.astype(np.int16) - params.offset).astype(np.int8)
    g = None
    if tensors.weight_g_idx is not None:
        g = _group_map(tensors.weight_g_idx, k, n_groups, params, layer)
    elif params.actorder:
        raise FormatError("missing: actorder 'group' needs weight_g_idx", layer=layer, tensor="weight_g_idx")
    return n, k, packed, scales, zp, g


def _signed(fields: np.ndarray, params: CtPackParams) -> np.ndarray:
    """Stored unsigned fields minus the offset, as int8, in one pass: 4-bit fields (< 16) are the
    same bytes as int8; for 8-bit, v - 128 is v with its top bit flipped, read as int8."""
    if params.offset < 128:
        return np.subtract(fields.view(np.int8), np.int8(params.offset))
    return (fields ^ np.uint8(0x80)).view(np.int8)


def unpack_ct_packed(tensors: CtPackedTensors, params: CtPackParams, *, layer: str | None = None) -> CtCodes:
    """Validate pack-quantized tensors and unpack them to signed codes."""
    n, k, packed, scales, zp, g = _validated(tensors, params, layer)
    q = np.ascontiguousarray(sequential_fields(packed, params.num_bits)[:, :k])
    return CtCodes(q=_signed(q, params), scales=scales, zero_point=zp, g_idx=g)


def dequantize_ct_packed_reference(
    tensors: CtPackedTensors,
    params: CtPackParams,
    *,
    variant: DequantVariant = CANONICAL_DEQUANT,
    layer: str | None = None,
) -> np.ndarray:
    """The specification of ``dequantize_ct_packed``: same arguments, same float32 [N, K] bit for bit.

    Written to be read (docs/formats/compressed-tensors.md#reference-and-fast-path); slow on purpose.
    """
    n, k, packed, scales, _, g_idx = _validated(tensors, params, layer)
    b, offset = params.num_bits, params.offset
    # 1. unpack: field k % F (LSB first) of word [n, k // F] holds q + offset; the last word's padding is dropped
    q = unpack_int32(packed, b, axis=1)[:, :k].astype(np.int16) - offset
    # 2. expand groups: column k uses group g_idx[k] (default k // G; channel-wise: one group)
    g = default_g_idx(k, k // scales.shape[1]) if g_idx is None else g_idx
    s = expand_groups(scales, g)
    if params.symmetric:
        z = 0
    else:  # field n % F of word [n // F, g] holds zp + offset
        z = expand_groups(unpack_int32(tensors.weight_zero_point, b, axis=0)[:n].astype(np.int16) - offset, g)
    # 3. the rule (q - z) * s in the declared order, dtypes and rounding (int_common.dequantize_affine);
    #    the +offset of q and zp cancels, so signed codes are used, and FLOAT_ZERO's midpoint is 0
    return dequantize_affine(q, z, s, variant=variant, midpoint=0)


def dequantize_ct_packed(
    tensors: CtPackedTensors,
    params: CtPackParams,
    *,
    variant: DequantVariant = CANONICAL_DEQUANT,
    layer: str | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The float32 weight [N, K]: ``(q - zp[n, g]) * s[n, g]``, g = g_idx[k] (see module docstring).

    The fast path (fast_dequant.py): bit-identical to ``dequantize_ct_packed_reference``, with
    the codes unpacked block by block inside the dequantization. ``out``: a float32 [N, K]
    C-contiguous array to write into.
    """
    n, k, packed, scales, zp, g = _validated(tensors, params, layer)

    def rows(r0, r1):
        fields = sequential_fields(packed[r0:r1], params.num_bits)
        return _signed(fields if fields.shape[1] == k else np.ascontiguousarray(fields[:, :k]), params)

    z = 0 if zp is None else zp
    return dequantize_grouped(CodeRows((n, k), rows), z, scales, g, variant=variant, midpoint=0,
                              code_range=(params.qmin, params.qmax), out=out)


# --- int-quantized (W8A8 int8 weights) -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CtInt8Tensors:
    """int-quantized weights: ``weight`` int8 [N, K], ``weight_scale`` [N, 1] or [1]."""

    weight: np.ndarray
    weight_scale: np.ndarray


def validate_ct_int8(tensors: CtInt8Tensors, *, layer: str | None = None) -> tuple:
    """Check dtypes/shapes/scales; returns (q int8 [N, K], scale broadcastable to [N, K])."""
    q = check_dtype(tensors.weight, ("int8",), tensor="weight", layer=layer)
    require(q.ndim == 2, f"expected a 2-D [N, K] array, got shape {shape_str(q.shape)}", layer=layer, tensor="weight")
    n = q.shape[0]
    s = check_dtype(tensors.weight_scale, FLOAT_DTYPE_NAMES, tensor="weight_scale", layer=layer)
    if tuple(s.shape) not in ((n, 1), (1,)):
        raise FormatError(
            f"expected shape [N, 1] = [{n}, 1] (channel) or [1] (tensor), got {shape_str(s.shape)}",
            layer=layer,
            tensor="weight_scale",
        )
    check_scales(s, tensor="weight_scale", layer=layer)
    return q, s.reshape(-1, 1) if s.shape == (n, 1) else s.reshape(1, 1)


def quantize_ct_int8(w, *, scale_dtype: str | None = None, layer: str | None = None) -> CtInt8Tensors:
    """Per-channel symmetric int8, compressed-tensors' rule: ``s = amax / 127.5``
    (``(2**8 - 1) / 2``), zero scale -> eps, ``q = clamp(RNE(w / s), -128, 127)``."""
    w64 = check_weights(w, layer=layer)
    scale_dtype = scale_dtype or np.asarray(w).dtype.name
    s, _ = _ct_minmax_scales(w64.min(axis=1, keepdims=True), w64.max(axis=1, keepdims=True), 8, True, scale_dtype, layer)
    q = rtn_codes(w64, s, 0, -128, 127, what="w")
    return CtInt8Tensors(weight=q.astype(np.int8), weight_scale=float_array(s, scale_dtype))


def dequantize_ct_int8_reference(
    tensors: CtInt8Tensors,
    *,
    variant: DequantVariant = CANONICAL_DEQUANT,
    layer: str | None = None,
) -> np.ndarray:
    """The specification of ``dequantize_ct_int8``: same arguments, same float32 [N, K] bit for bit."""
    q, s = validate_ct_int8(tensors, layer=layer)  # q int8 [N, K]; s [N, 1] (channel) or [1, 1] (tensor)
    s = expand_groups(s, np.zeros(q.shape[1], dtype=np.intp))  # one group: every column k uses it
    return dequantize_affine(q, 0, s, variant=variant, midpoint=0)


def dequantize_ct_int8(
    tensors: CtInt8Tensors,
    *,
    variant: DequantVariant = CANONICAL_DEQUANT,
    layer: str | None = None,
) -> np.ndarray:
    """The float32 weight [N, K] = ``q * s`` (exact, rounded once; zero point 0, so every
    ``order`` gives the same value up to the compute dtype's roundings). The fast path:
    bit-identical to ``dequantize_ct_int8_reference``."""
    q, s = validate_ct_int8(tensors, layer=layer)
    s_full = np.broadcast_to(np.asarray(s), q.shape)
    return dequantize_affine_fast(q, 0, s_full, variant=variant, midpoint=0)
