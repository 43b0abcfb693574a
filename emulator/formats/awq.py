"""AWQ integer weights as AutoAWQ's GEMM layout (``version: "gemm"``) stores them.

Semantics: docs/formats/awq.md.

Tensors (logical weight W is [N, K] = [out_features, in_features]; 4-bit only,
8 fields per int32; G = group size, -1 meaning G = K):

==========  =============  =======  =======================================
name        shape          dtype    content
==========  =============  =======  =======================================
qweight     [K, N / 8]     int32    q[n, k] packed along N; slot s of word
                                    j holds column 8*j + AWQ_PACK_ORDER[s]
qzeros      [K / G, N / 8] int32    literal zero points, same packing
scales      [K / G, N]     float16  (bfloat16 accepted)
==========  =============  =======  =======================================

``AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)``; reading inverts it with
``AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)`` (column c sits in slot
``AWQ_REVERSE_ORDER[c]``). There is no g_idx: group of input channel k is
``k // G``.

Canonical value: ``W[n, k] = (q[n, k] - z[k // G, n]) * scales[k // G, n]``,
exact, rounded once to float32 (int_common.dequantize_affine; the zero point
is literal, no +1). ``dequantize_awq_reference`` is the specification to read,
``dequantize_awq`` the fast path.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import UnsupportedFormatError, require
from ..numerics.rounding import Rounding, quantize_to_int
from .fast_dequant import CodeRows, dequantize_grouped
from .fast_unpack import transposed_field_rows, unpack_int32_transposed
from .int_common import (
    CANONICAL_DEQUANT,
    DequantVariant,
    check_dtype,
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
from .packing import inverse_order, pack_int32, unpack_int32

__all__ = [
    "AWQ_PACK_ORDER",
    "AWQ_REVERSE_ORDER",
    "AwqParams",
    "AwqTensors",
    "AwqCodes",
    "quantize_awq",
    "pack_awq",
    "unpack_awq",
    "dequantize_awq",
    "dequantize_awq_reference",
    "awq_shape",
]

AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = inverse_order(AWQ_PACK_ORDER)  # (0, 4, 1, 5, 2, 6, 3, 7)
SCALE_DTYPES = ("float16", "bfloat16")
PACK = 8


@dataclasses.dataclass(frozen=True)
class AwqParams:
    """The quant_config fields that decide the layout (AutoAWQ GEMM: zero_point=True)."""

    bits: int = 4
    group_size: int = 128

    def __post_init__(self):
        if self.bits != 4:
            raise UnsupportedFormatError(f"AutoAWQ GEMM supports only 4-bit weights, got w_bit={self.bits}")
        if self.group_size != -1 and self.group_size <= 0:
            raise UnsupportedFormatError(f"AWQ group_size must be -1 or positive, got {self.group_size}")

    @classmethod
    def from_config(cls, cfg: dict) -> "AwqParams":
        """From a quant_config dict (``w_bit``/``bits``, ``q_group_size``/``group_size``, ``version``)."""
        version = str(cfg.get("version", "gemm")).lower()
        if version != "gemm":
            raise UnsupportedFormatError(f"only AWQ version 'gemm' is defined, got {version!r}")
        if not cfg.get("zero_point", True):
            raise UnsupportedFormatError("AWQ GEMM requires zero_point=True")
        return cls(
            bits=int(cfg.get("w_bit", cfg.get("bits", 4))),
            group_size=int(cfg.get("q_group_size", cfg.get("group_size", 128))),
        )

    @property
    def maxq(self) -> int:
        return (1 << self.bits) - 1


@dataclasses.dataclass(frozen=True)
class AwqTensors:
    qweight: np.ndarray
    qzeros: np.ndarray
    scales: np.ndarray


@dataclasses.dataclass(frozen=True)
class AwqCodes:
    """q [N, K] uint8 codes, zeros [K/G, N] int32 literal zero points, scales [K/G, N]."""

    q: np.ndarray
    zeros: np.ndarray
    scales: np.ndarray


def awq_shape(tensors: AwqTensors) -> tuple:
    """(N, K): N from scales, K from qweight."""
    scales, qweight = np.asarray(tensors.scales), np.asarray(tensors.qweight)
    require(scales.ndim == 2, f"expected a 2-D [K/G, N] array, got shape {list(scales.shape)}", tensor="scales")
    require(qweight.ndim == 2, f"expected a 2-D [K, N/8] array, got shape {list(qweight.shape)}", tensor="qweight")
    return int(scales.shape[1]), int(qweight.shape[0])


def _check_nk(n: int, k: int, params: AwqParams, layer: str | None) -> int:
    require(n % PACK == 0, f"N = {n} is not a multiple of {PACK} (4-bit fields per int32)", layer=layer, tensor="qweight")
    return resolve_group_size(k, params.group_size, tensor="scales", layer=layer)


def _check_awq_scales(scales, n_groups: int, n: int, layer: str | None) -> np.ndarray:
    s = check_dtype(scales, SCALE_DTYPES, tensor="scales", layer=layer)
    check_shape(s, (n_groups, n), "[K/G, N]", tensor="scales", layer=layer)
    check_scales(s, tensor="scales", layer=layer)
    return s


def quantize_awq(w, params: AwqParams, *, scale_dtype: str = "float16", layer: str | None = None) -> AwqTensors:
    """Round-to-nearest asymmetric quantization of w [N, K], to make test cases.

    AutoAWQ's min/max rule (``awq/quantize/quantizer.py::pseudo_quantize_tensor``)
    with the range widened to include 0 (as GPTQ and compressed-tensors do):
    per group and output row, ``lo = min(min w, 0)``, ``hi = max(max w, 0)``,
    ``s = fmt(max(hi - lo, 1e-5) / 15)``, ``z = clamp(RNE(-lo / s), 0, 15)``,
    ``q = clamp(RNE(w / s) + z, 0, 15)`` (fmt = RNE to ``scale_dtype``; z and q
    from the stored scale and the exact quotient). Error bound: see
    ``gptq.quantize_gptq``.
    """
    w64 = check_weights(w, layer=layer)
    n, k = w64.shape
    group = _check_nk(n, k, params, layer)
    n_groups = k // group
    grouped = w64.reshape(n, n_groups, group)
    lo = np.minimum(grouped.min(axis=2), 0.0).T  # [n_groups, N]
    hi = np.maximum(grouped.max(axis=2), 0.0).T
    s = round_scale(np.maximum(hi - lo, 1e-5) / params.maxq, scale_dtype, tensor="scales", layer=layer)
    z = quantize_to_int(-lo / s, 0, params.maxq, Rounding.RNE, what="zero point")
    g = default_g_idx(k, group)
    q = rtn_codes(w64, expand_groups(s.T, g), expand_groups(z.T, g), 0, params.maxq, what="w")
    codes = AwqCodes(q=q.astype(np.uint8), zeros=z.astype(np.int32), scales=float_array(s, scale_dtype))
    return pack_awq(codes, params, layer=layer)


def pack_awq(codes: AwqCodes, params: AwqParams, *, layer: str | None = None) -> AwqTensors:
    """Pack integer codes into AutoAWQ GEMM tensors (inverse of ``unpack_awq``)."""
    q = np.asarray(codes.q)
    require(q.ndim == 2, f"expected a 2-D [N, K] array, got shape {list(q.shape)}", layer=layer, tensor="q")
    n, k = q.shape
    group = _check_nk(n, k, params, layer)
    n_groups = k // group
    check_integer_range(q, 0, params.maxq, "code", tensor="q", layer=layer)
    zeros = np.asarray(codes.zeros)
    check_shape(zeros, (n_groups, n), "[K/G, N]", tensor="qzeros", layer=layer)
    check_integer_range(zeros, 0, params.maxq, "zero point", tensor="qzeros", layer=layer)
    scales = _check_awq_scales(codes.scales, n_groups, n, layer)
    qweight = pack_int32(q.T, params.bits, axis=1, order=AWQ_PACK_ORDER, tensor="q", layer=layer)
    qzeros = pack_int32(zeros, params.bits, axis=1, order=AWQ_PACK_ORDER, tensor="qzeros", layer=layer)
    return AwqTensors(qweight=qweight, qzeros=qzeros, scales=scales)


def _validated(tensors: AwqTensors, params: AwqParams, shape, layer: str | None):
    """Check every tensor; returns (n, k, qweight, zeros [G, N], scales [G, N])."""
    n, k = shape if shape is not None else awq_shape(tensors)
    group = _check_nk(n, k, params, layer)
    n_groups = k // group
    qweight = check_dtype(tensors.qweight, ("int32",), tensor="qweight", layer=layer)
    check_shape(qweight, (k, n // PACK), "[K, N/8]", tensor="qweight", layer=layer)
    qzeros = check_dtype(tensors.qzeros, ("int32",), tensor="qzeros", layer=layer)
    check_shape(qzeros, (n_groups, n // PACK), "[K/G, N/8]", tensor="qzeros", layer=layer)
    scales = _check_awq_scales(tensors.scales, n_groups, n, layer)
    zeros = unpack_int32(qzeros, params.bits, axis=1, order=AWQ_PACK_ORDER, tensor="qzeros", layer=layer)
    return n, k, qweight, zeros.astype(np.int32), scales


def unpack_awq(tensors: AwqTensors, params: AwqParams, *, shape: tuple | None = None, layer: str | None = None) -> AwqCodes:
    """Validate AutoAWQ GEMM tensors and unpack them to integer codes.

    ``shape`` is the logical (N, K); by default N comes from scales, K from qweight.
    """
    _, _, qweight, zeros, scales = _validated(tensors, params, shape, layer)
    q = unpack_int32_transposed(qweight, params.bits, axis=1, order=AWQ_PACK_ORDER, tensor="qweight", layer=layer)
    return AwqCodes(q=q, zeros=zeros, scales=scales)


def dequantize_awq_reference(
    tensors: AwqTensors,
    params: AwqParams,
    *,
    shape: tuple | None = None,
    variant: DequantVariant = CANONICAL_DEQUANT,
    layer: str | None = None,
) -> np.ndarray:
    """The specification of ``dequantize_awq``: same arguments, same float32 [N, K] bit for bit.

    Written to be read (docs/formats/awq.md#reference-and-fast-path); slow on purpose.
    """
    _, k, qweight, _, scales = _validated(tensors, params, shape, layer)
    # 1. unpack: q[n, k] is slot AWQ_REVERSE_ORDER[n % 8] of word qweight[k, n // 8]; zeros the same
    q = unpack_int32(qweight, params.bits, axis=1, order=AWQ_PACK_ORDER).T
    zeros = unpack_int32(tensors.qzeros, params.bits, axis=1, order=AWQ_PACK_ORDER)  # [K/G, N], literal
    # 2. expand groups: column k uses group k // G (AWQ has no g_idx)
    g = default_g_idx(k, k // zeros.shape[0])
    z, s = expand_groups(zeros.T, g), expand_groups(np.asarray(scales).T, g)
    # 3. the rule (q - z) * s in the declared order, dtypes and rounding (int_common.dequantize_affine)
    return dequantize_affine(q, z, s, variant=variant, midpoint=1 << (params.bits - 1))


def dequantize_awq(
    tensors: AwqTensors,
    params: AwqParams,
    *,
    shape: tuple | None = None,
    variant: DequantVariant = CANONICAL_DEQUANT,
    layer: str | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The float32 weight [N, K]: ``(q - z[k // G]) * s[k // G]`` (see module docstring).

    The fast path (fast_dequant.py): bit-identical to ``dequantize_awq_reference``, with the
    codes unpacked block by block inside the dequantization. ``out``: a float32 [N, K]
    C-contiguous array to write into.
    """
    n, k, qweight, zeros, scales = _validated(tensors, params, shape, layer)
    rows, _, align = transposed_field_rows(qweight, params.bits, axis=1, order=AWQ_PACK_ORDER, tensor="qweight",
                                           layer=layer)
    return dequantize_grouped(CodeRows((n, k), rows, align, scratch=True), zeros.T, np.asarray(scales).T, None,
                              variant=variant, midpoint=1 << (params.bits - 1), code_range=(0, params.maxq), out=out)
