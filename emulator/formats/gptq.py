"""GPTQ integer weights as AutoGPTQ / GPTQModel checkpoints store them.

Semantics: docs/formats/gptq.md.

Tensors (logical weight W is [N, K] = [out_features, in_features], y = x @ W^T;
F = 32 // bits fields per int32 word; G = group size, -1 meaning G = K):

==========  =================  =======  =====================================
name        shape              dtype    content
==========  =================  =======  =====================================
qweight     [K / F, N]         int32    q[n, k] packed along K, LSB first:
                                        field k % F of word k // F
qzeros      [K / G, N / F]     int32    zero-point fields packed along N
scales      [K / G, N]         float16  (bfloat16 accepted)
g_idx       [K]                int32    group of input channel k
==========  =================  =======  =====================================

Canonical value: ``W[n, k] = (q[n, k] - z[g, n]) * scales[g, n]`` with
``g = g_idx[k]`` (act-order / desc_act: g_idx is any map into [0, K/G);
without desc_act it must be ``k // G``), computed exactly and rounded once to
float32 (int_common.dequantize_affine; ``dequantize_gptq_reference`` is the
specification to read, ``dequantize_gptq`` the fast path). The zero point z is read from qzeros
under ``GptqParams.zero_convention``:

- ``ZeroConvention.V1`` (checkpoint_format "gptq"): ``z = field + 1`` as an
  integer, so field ``2**bits - 1`` reads as ``2**bits`` (16 for 4-bit), as
  AutoGPTQ's torch/Triton paths and vLLM's exllama ``gptq_gemm``
  (``zero_offset = 1``) do. ``z = 0`` cannot be written.
- ``ZeroConvention.V2`` (checkpoint_format "gptq_v2"): ``z = field``.

Named variants of reading the zero points (``GptqZeroRead``), of writing a
v1 zero point of 0 (``GptqV1ZeroWrite``) and of the arithmetic
(``int_common.DequantVariant``: order, scale, compute and zero dtypes) are
keyword-only arguments; the docs page lists who uses each.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np

from ..errors import FormatError, UnsupportedFormatError, require
from ..numerics.rounding import Rounding, quantize_to_int
from .fast_dequant import CodeRows, dequantize_grouped
from .fast_unpack import transposed_field_rows, unpack_int32_transposed
from .int_common import (
    CANONICAL_DEQUANT,
    DequantVariant,
    ZeroConvention,
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
    resolve_group_size,
    round_scale,
    rtn_codes,
)
from .packing import pack_int32, unpack_int32

__all__ = [
    "GptqParams",
    "GptqZeroRead",
    "GptqV1ZeroWrite",
    "GptqTensors",
    "GptqCodes",
    "quantize_gptq",
    "pack_gptq",
    "unpack_gptq",
    "dequantize_gptq",
    "dequantize_gptq_reference",
    "gptq_shape",
]

SCALE_DTYPES = ("float16", "bfloat16")


@dataclasses.dataclass(frozen=True)
class GptqParams:
    """The quantize_config.json fields that decide the layout."""

    bits: int = 4
    group_size: int = 128
    sym: bool = True
    desc_act: bool = False
    zero_convention: ZeroConvention = ZeroConvention.V1

    def __post_init__(self):
        if self.bits not in (4, 8):
            raise UnsupportedFormatError(f"GPTQ bits must be 4 or 8, got {self.bits}")
        if self.group_size != -1 and self.group_size <= 0:
            raise UnsupportedFormatError(f"GPTQ group_size must be -1 or positive, got {self.group_size}")
        object.__setattr__(self, "zero_convention", ZeroConvention(self.zero_convention))

    @classmethod
    def from_config(cls, cfg: dict) -> "GptqParams":
        """From a quantize_config.json / quantization_config dict."""
        fmt = cfg.get("checkpoint_format", "gptq")
        try:
            conv = ZeroConvention(fmt)
        except ValueError:
            raise UnsupportedFormatError(f"GPTQ checkpoint_format must be 'gptq' or 'gptq_v2', got {fmt!r}") from None
        return cls(
            bits=int(cfg.get("bits", 4)),
            group_size=int(cfg.get("group_size", 128)),
            sym=bool(cfg.get("sym", True)),
            desc_act=bool(cfg.get("desc_act", False)),
            zero_convention=conv,
        )

    @property
    def pack_factor(self) -> int:
        return 32 // self.bits

    @property
    def maxq(self) -> int:
        return (1 << self.bits) - 1

    @property
    def sym_zero(self) -> int:
        return 1 << (self.bits - 1)


class GptqZeroRead(str, enum.Enum):
    """How a reader turns qzeros into zero points.

    CANONICAL: per ``zero_convention`` (V1: field + 1; V2: field).
    V1_PACKED_ADD: add 0x11111111 (4-bit) / 0x01010101 (8-bit) to each int32
        word mod 2**32, then read fields literally; a field 0xF carries into
        the next field (GPTQModel ``convert_gptq_v1_to_v2_format_module``,
        vllm-xpu-kernels ``transpose_onednn_woq_format``).
    V1_WRAP: ``(field + 1) & (2**bits - 1)``, so 0xF reads as 0 (the
        ``(zeros + 1) & maxq`` of some GPTQ-for-LLaMa Triton forks).
    IGNORE_QZEROS: z = 2**(bits-1) for every group, qzeros unread (kernels
        for sym=True: vLLM gptq_marlin's uint4b8/uint8b128, XPU oneDNN).
    V1_LITERAL: a v1 checkpoint's fields read as the zero points themselves,
        without the +1 (``z = field``, i.e. one code below the canonical
        reading): vLLM's INC/ARK glue, which instantiates auto-round's
        ``QuantLinear`` (``ZP_BIAS = 0``) for v1 checkpoints.
    """

    CANONICAL = "canonical"
    V1_PACKED_ADD = "v1_packed_add"
    V1_WRAP = "v1_wrap"
    IGNORE_QZEROS = "ignore_qzeros"
    V1_LITERAL = "v1_literal"


class GptqV1ZeroWrite(str, enum.Enum):
    """What a v1 writer does with a zero point of 0 (field z - 1 = -1).

    RAISE (canonical): FormatError.
    FIELD_ALL_ONES: write field 2**bits - 1 (a masked packer); reads back as
        2**bits, not 0.
    AUTOGPTQ_OR: AutoGPTQ's ``pack``: -1 cast to uint32 (0xFFFFFFFF on
        x86-64) shifted to the field and OR-ed into the word, so that field and
        every higher field of the word become all ones.
    PACKED_SUB: pack the literal (v2) zero points, then subtract 0x11111111 /
        0x01010101 from each word mod 2**32 (GPTQModel
        ``convert_gptq_v2_to_v1_format_module``): the -1 borrows from the next
        field. Its exact inverse is ``GptqZeroRead.V1_PACKED_ADD``.
    """

    RAISE = "raise"
    FIELD_ALL_ONES = "field_all_ones"
    AUTOGPTQ_OR = "autogptq_or"
    PACKED_SUB = "packed_sub"


@dataclasses.dataclass(frozen=True)
class GptqTensors:
    """The checkpoint tensors of one GPTQ linear layer (see module docstring)."""

    qweight: np.ndarray
    qzeros: np.ndarray
    scales: np.ndarray
    g_idx: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class GptqCodes:
    """Unpacked integers: q [N, K] uint8 codes, zeros [K/G, N] int32 *true*
    zero points (after the v1 +1), scales [K/G, N], g_idx [K] int32."""

    q: np.ndarray
    zeros: np.ndarray
    scales: np.ndarray
    g_idx: np.ndarray


def _word_constant(bits: int) -> np.uint32:
    """0x11111111 for 4-bit, 0x01010101 for 8-bit: a 1 in every field."""
    c = 0
    for i in range(32 // bits):
        c |= 1 << (bits * i)
    return np.uint32(c)


def gptq_shape(tensors: GptqTensors, params: GptqParams, *, layer: str | None = None) -> tuple:
    """(N, K) of the logical weight: N from scales, K from g_idx (else qweight)."""
    scales = np.asarray(tensors.scales)
    require(scales.ndim == 2, f"expected a 2-D [K/G, N] array, got shape {list(scales.shape)}", layer=layer, tensor="scales")
    n = scales.shape[1]
    if tensors.g_idx is not None:
        g = np.asarray(tensors.g_idx)
        require(g.ndim == 1, f"expected a 1-D [K] array, got shape {list(g.shape)}", layer=layer, tensor="g_idx")
        k = g.shape[0]
    else:
        qw = np.asarray(tensors.qweight)
        require(qw.ndim == 2, f"expected a 2-D [K/{params.pack_factor}, N] array, got shape {list(qw.shape)}", layer=layer, tensor="qweight")
        k = qw.shape[0] * params.pack_factor
    return int(n), int(k)


def _check_nk(n: int, k: int, params: GptqParams, layer: str | None) -> int:
    """Divisibility of N and K; returns the resolved group size."""
    f = params.pack_factor
    require(k % f == 0, f"K = {k} is not a multiple of {f} ({params.bits}-bit fields per int32)", layer=layer, tensor="qweight")
    require(n % f == 0, f"N = {n} is not a multiple of {f} ({params.bits}-bit fields per int32)", layer=layer, tensor="qzeros")
    return resolve_group_size(k, params.group_size, tensor="scales", layer=layer)


def _check_gptq_scales(scales, n_groups: int, n: int, layer: str | None) -> np.ndarray:
    s = check_dtype(scales, SCALE_DTYPES, tensor="scales", layer=layer)
    check_shape(s, (n_groups, n), "[K/G, N]", tensor="scales", layer=layer)
    check_scales(s, tensor="scales", layer=layer)
    return s


def _resolve_g_idx(g_idx, k: int, group: int, params: GptqParams, layer: str | None) -> np.ndarray:
    if g_idx is None:
        return default_g_idx(k, group)
    return check_g_idx(g_idx, k, k // group, group, desc_act=params.desc_act, tensor="g_idx", layer=layer)


def quantize_gptq(
    w,
    params: GptqParams,
    g_idx=None,
    *,
    scale_dtype: str = "float16",
    v1_zero_write: GptqV1ZeroWrite | str = GptqV1ZeroWrite.RAISE,
    layer: str | None = None,
) -> GptqTensors:
    """Round-to-nearest GPTQ quantization of w [N, K], to make test cases.

    Per group g (the input channels k with g_idx[k] == g) and output row n,
    with lo/hi the group's min/max widened to include 0 (GPTQ's own
    ``Quantizer.find_params``), and an all-zero group given [-1, 1] as GPTQ does:

    - asym: ``s = fmt((hi - lo) / (2**bits - 1))``, ``z = clamp(RNE(-lo / s), 0, 2**bits - 1)``;
    - sym: ``s = fmt(2 * max(|lo|, hi) / (2**bits - 1))``, ``z = 2**(bits-1)``;
    - ``q = clamp(RNE(w / s) + z, 0, 2**bits - 1)``,

    where fmt rounds the float64 quotient to ``scale_dtype`` (RNE), and z and
    q use that stored scale and the exact quotient (z added after rounding, as
    GPTQ's ``quantize`` does). Unlike GPTQ, sym always uses [-amax, amax]
    (GPTQ keeps lo = 0 for an all-non-negative group; AutoGPTQ issue #293).

    Bound: each dequantized value is a nearest grid point ``(j - z) * s``;
    ``|w - W| <= s/2`` for w in ``[(-z - 1/2) s, (2**bits - 1 - z + 1/2) s]``;
    and, the stored scale being rounded, ``|w - W| <= s * (1/2 + 2**bits * u)``
    for every element (u = 2**-11 for float16 scales, 2**-8 for bfloat16).
    """
    w64 = check_weights(w, layer=layer)
    n, k = w64.shape
    group = _check_nk(n, k, params, layer)
    n_groups = k // group
    g = _resolve_g_idx(g_idx, k, group, params, layer)
    maxq = params.maxq
    lo = np.zeros((n_groups, n))
    hi = np.zeros((n_groups, n))
    for gi in range(n_groups):
        cols = w64[:, g == gi]
        if cols.shape[1]:
            lo[gi] = np.minimum(cols.min(axis=1), 0.0)
            hi[gi] = np.maximum(cols.max(axis=1), 0.0)
    empty = (lo == 0) & (hi == 0)
    lo[empty], hi[empty] = -1.0, 1.0
    if params.sym:
        amax = np.maximum(-lo, hi)
        s = round_scale(2.0 * amax / maxq, scale_dtype, tensor="scales", layer=layer)
        z = np.full((n_groups, n), params.sym_zero, dtype=np.int32)
    else:
        s = round_scale((hi - lo) / maxq, scale_dtype, tensor="scales", layer=layer)
        z = quantize_to_int(-lo / s, 0, maxq, Rounding.RNE, what="zero point")
    q = rtn_codes(w64, expand_groups(s.T, g), expand_groups(z.T, g), 0, maxq, what="w")
    scales = float_array(s, scale_dtype)
    codes = GptqCodes(q=q.astype(np.uint8), zeros=z.astype(np.int32), scales=scales, g_idx=g)
    return pack_gptq(codes, params, v1_zero_write=v1_zero_write, layer=layer)


def pack_gptq(
    codes: GptqCodes,
    params: GptqParams,
    *,
    v1_zero_write: GptqV1ZeroWrite | str = GptqV1ZeroWrite.RAISE,
    layer: str | None = None,
) -> GptqTensors:
    """Pack integer codes into checkpoint tensors (inverse of ``unpack_gptq``)."""
    v1_zero_write = GptqV1ZeroWrite(v1_zero_write)
    q = np.asarray(codes.q)
    require(q.ndim == 2, f"expected a 2-D [N, K] array, got shape {list(q.shape)}", layer=layer, tensor="q")
    n, k = q.shape
    group = _check_nk(n, k, params, layer)
    n_groups = k // group
    check_integer_range(q, 0, params.maxq, "code", tensor="q", layer=layer)
    scales = _check_gptq_scales(codes.scales, n_groups, n, layer)
    g = _resolve_g_idx(codes.g_idx, k, group, params, layer)
    zeros = np.asarray(codes.zeros)
    check_shape(zeros, (n_groups, n), "[K/G, N]", tensor="qzeros", layer=layer)
    qweight = pack_int32(q.T, params.bits, axis=0, tensor="q", layer=layer)
    qzeros = _pack_zeros(zeros, params, v1_zero_write, layer)
    return GptqTensors(qweight=qweight, qzeros=qzeros, scales=scales, g_idx=g)


def _pack_zeros(zeros: np.ndarray, params: GptqParams, write: GptqV1ZeroWrite, layer: str | None) -> np.ndarray:
    bits, maxq = params.bits, params.maxq
    if params.zero_convention is ZeroConvention.V2:
        check_integer_range(zeros, 0, maxq, "zero point (gptq_v2 stores z)", tensor="qzeros", layer=layer)
        return pack_int32(zeros, bits, axis=1, tensor="qzeros", layer=layer)
    check_integer_range(zeros, 0, maxq + 1, "zero point (gptq v1 stores z - 1)", tensor="qzeros", layer=layer)
    zi = zeros.astype(np.int64)
    is0 = zi == 0
    if write is GptqV1ZeroWrite.PACKED_SUB:
        check_integer_range(zeros, 0, maxq, "zero point (PACKED_SUB packs z literally first)", tensor="qzeros", layer=layer)
        words = pack_int32(zi, bits, axis=1, tensor="qzeros", layer=layer).view(np.uint32)
        return (words - _word_constant(bits)).view(np.int32)  # uint32 arithmetic wraps mod 2**32
    if np.any(is0) and write is GptqV1ZeroWrite.RAISE:
        gi, ni = (int(i) for i in np.argwhere(is0)[0])
        raise FormatError(
            f"zero point 0 at [group {gi}, column {ni}] is not representable in GPTQ v1 "
            f"(checkpoint_format 'gptq' stores z - 1, and readers add 1); "
            f"{int(is0.sum())} such zero point(s). Use zero_convention=V2 ('gptq_v2') "
            "or pass v1_zero_write= a named variant",
            layer=layer,
            tensor="qzeros",
        )
    fields = np.where(is0, maxq, zi - 1)
    words = pack_int32(fields, bits, axis=1, tensor="qzeros", layer=layer)
    if write is GptqV1ZeroWrite.AUTOGPTQ_OR and np.any(is0):
        per_word = params.pack_factor
        w = words.view(np.uint32).copy()
        for slot in range(per_word):
            hit = is0[:, slot::per_word]
            smear = np.uint32((0xFFFFFFFF << (bits * slot)) & 0xFFFFFFFF)
            w = np.where(hit, w | smear, w)
        words = w.view(np.int32)
    return words


def _read_zeros(qzeros: np.ndarray, params: GptqParams, read: GptqZeroRead, layer: str | None) -> np.ndarray:
    """The zero points [K/G, N] int32 that ``read`` takes from qzeros [K/G, N/F] (docs/formats/gptq.md#zero-points-zeroconvention)."""
    if read is GptqZeroRead.IGNORE_QZEROS:
        return np.full((qzeros.shape[0], qzeros.shape[1] * params.pack_factor), params.sym_zero, dtype=np.int32)
    if read in (GptqZeroRead.V1_PACKED_ADD, GptqZeroRead.V1_WRAP, GptqZeroRead.V1_LITERAL) and params.zero_convention is not ZeroConvention.V1:
        raise UnsupportedFormatError(f"zero_read={read.value} reads v1 ('gptq') zero points, but zero_convention is {params.zero_convention.value}")
    if read is GptqZeroRead.V1_PACKED_ADD:
        words = (qzeros.view(np.uint32) + _word_constant(params.bits)).view(np.int32)
        return unpack_int32(words, params.bits, axis=1, tensor="qzeros", layer=layer).astype(np.int32)
    fields = unpack_int32(qzeros, params.bits, axis=1, tensor="qzeros", layer=layer).astype(np.int32)
    if params.zero_convention is ZeroConvention.V2 or read is GptqZeroRead.V1_LITERAL:
        return fields
    if read is GptqZeroRead.V1_WRAP:
        return (fields + 1) & params.maxq
    return fields + 1


def _validated(tensors: GptqTensors, params: GptqParams, shape, read: GptqZeroRead, layer: str | None):
    """Check every tensor; returns (n, k, qweight, zeros [G, N] read per ``read``, scales [G, N], g_idx)."""
    n, k = shape if shape is not None else gptq_shape(tensors, params, layer=layer)
    group = _check_nk(n, k, params, layer)
    n_groups = k // group
    f = params.pack_factor
    qweight = check_dtype(tensors.qweight, ("int32",), tensor="qweight", layer=layer)
    check_shape(qweight, (k // f, n), f"[K/{f}, N]", tensor="qweight", layer=layer)
    qzeros = check_dtype(tensors.qzeros, ("int32",), tensor="qzeros", layer=layer)
    check_shape(qzeros, (n_groups, n // f), f"[K/G, N/{f}]", tensor="qzeros", layer=layer)
    scales = _check_gptq_scales(tensors.scales, n_groups, n, layer)
    g = _resolve_g_idx(tensors.g_idx, k, group, params, layer)
    zeros = _read_zeros(qzeros, params, read, layer)
    return n, k, qweight, zeros, scales, g


def unpack_gptq(
    tensors: GptqTensors,
    params: GptqParams,
    *,
    shape: tuple | None = None,
    zero_read: GptqZeroRead | str = GptqZeroRead.CANONICAL,
    layer: str | None = None,
) -> GptqCodes:
    """Validate checkpoint tensors and unpack them to integer codes.

    ``shape`` is the logical (N, K); by default N comes from scales and K from
    g_idx (or qweight when g_idx is None).
    """
    _, _, qweight, zeros, scales, g = _validated(tensors, params, shape, GptqZeroRead(zero_read), layer)
    q = unpack_int32_transposed(qweight, params.bits, axis=0, tensor="qweight", layer=layer)
    return GptqCodes(q=q, zeros=zeros, scales=scales, g_idx=g)


def dequantize_gptq_reference(
    tensors: GptqTensors,
    params: GptqParams,
    *,
    shape: tuple | None = None,
    zero_read: GptqZeroRead | str = GptqZeroRead.CANONICAL,
    variant: DequantVariant = CANONICAL_DEQUANT,
    layer: str | None = None,
) -> np.ndarray:
    """The specification of ``dequantize_gptq``: same arguments, same float32 [N, K] bit for bit.

    Written to be read (docs/formats/gptq.md#reference-and-fast-path); slow on purpose.
    """
    _, _, qweight, zeros, scales, g = _validated(tensors, params, shape, GptqZeroRead(zero_read), layer)
    # 1. unpack: q[n, k] is field k % F (LSB first) of word qweight[k // F, n]
    q = unpack_int32(qweight, params.bits, axis=0).T
    # 2. expand groups: column k uses group g_idx[k] of zeros [K/G, N] (read per zero_read) and scales
    z = expand_groups(zeros.T, g)
    s = expand_groups(np.asarray(scales).T, g)
    # 3. the rule (q - z) * s in the declared order, dtypes and rounding (int_common.dequantize_affine)
    return dequantize_affine(q, z, s, variant=variant, midpoint=params.sym_zero)


def dequantize_gptq(
    tensors: GptqTensors,
    params: GptqParams,
    *,
    shape: tuple | None = None,
    zero_read: GptqZeroRead | str = GptqZeroRead.CANONICAL,
    variant: DequantVariant = CANONICAL_DEQUANT,
    layer: str | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The float32 weight [N, K]: ``(q - z[g_idx[k]]) * s[g_idx[k]]`` (see module docstring).

    The fast path (fast_dequant.py): bit-identical to ``dequantize_gptq_reference``, with the
    codes unpacked block by block inside the dequantization. ``out``: a float32 [N, K]
    C-contiguous array to write into instead of a new one.
    """
    n, k, qweight, zeros, scales, g = _validated(tensors, params, shape, GptqZeroRead(zero_read), layer)
    rows, _, align = transposed_field_rows(qweight, params.bits, axis=0, tensor="qweight", layer=layer)
    return dequantize_grouped(CodeRows((n, k), rows, align, scratch=True), zeros.T, np.asarray(scales).T, g,
                              variant=variant, midpoint=params.sym_zero, code_range=(0, params.maxq), out=out)
