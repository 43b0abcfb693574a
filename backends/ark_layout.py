"""ARK (auto-round-lib) weight layouts: canonical checkpoint tensors -> what ``repack_quantized_weight`` takes.

Pure torch (the library is not needed); split from backends/ark.py, which re-exports every name.
The transforms reproduce vLLM's ``INCARKLinearMethod`` / ``INCXPULinearBase`` preparation
(``vllm/model_executor/layers/quantization/inc/schemes/inc_wna16_linear.py``) and auto-round's
``QuantLinear*.post_init``; semantics and sources: docs/backends/ark.md#layouts-and-transforms.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .base import Case
from .torch_layout import AWQ_REVERSE_ORDER, import_torch, pack_fields, to_torch, torch_dtype, unpack_fields

__all__ = [
    "AWQ_REVERSE_ORDER",
    "ArkLayout",
    "params_scales",
    "unpack_gptq_qweight",
    "unpack_gptq_qzeros",
    "awq_qweight_to_gptq",
    "unpack_awq",
    "gptq_layout",
    "awq_layout",
    "ct_pack_layout",
    "ct_int8_layout",
    "scales32",
]



@dataclasses.dataclass
class ArkLayout:
    """What ``repack_quantized_weight`` receives: signed int8 codes, fp32 scales, int8 zeros."""

    intweight: object  # torch.int8 [K, N]: code - 2**(bits-1) (ARK's signed weight)
    scales: object  # torch.float32 [K/G, N]
    zeros: object  # torch.int8 [K/G, N] (zero - 2**(bits-1)); empty when sym
    group: int
    bits: int
    asym: bool

    @property
    def wdt(self) -> str:
        return {2: "int2", 4: "int4", 8: "int8"}[self.bits]

    def dequantize(self):
        """(intweight - zeros) * scales as float64 [N, K] (to check a layout against the emulator)."""
        torch = import_torch()
        w = self.intweight.to(torch.float64)
        s = self.scales.to(torch.float64).repeat_interleave(self.group, 0)
        z = self.zeros.to(torch.float64).repeat_interleave(self.group, 0) if self.asym else 0.0
        return ((w - z) * s).T.contiguous()


def unpack_gptq_qweight(qweight, bits: int):
    """GPTQ qweight [K/F, N] -> ARK intweight int8 [K, N] = field - 2**(bits-1) (QuantLinear.post_init)."""
    torch = import_torch()
    return (unpack_fields(qweight, bits, 0) - (1 << (bits - 1))).to(torch.int8)


def unpack_gptq_qzeros(qzeros, bits: int, zp_bias: int):
    """GPTQ qzeros [K/G, N/F] -> ARK zeros int8 [K/G, N] = (field + zp_bias) - 2**(bits-1).

    ``zp_bias`` is QuantLinear's ``ZP_BIAS``: 0 for the ``ark_gptq_nozp`` class vLLM
    instantiates (v1 fields read literally), 1 for auto-round's ``QuantLinearGPTQ``. For
    8-bit the field + bias wraps in uint8 as QuantLinear's ``zeros.to(torch.uint8) += bias``.
    """
    torch = import_torch()
    f = unpack_fields(qzeros, bits, 1) + zp_bias
    if bits == 8:
        f = f & 0xFF
    return (f - (1 << (bits - 1))).to(torch.int8)


def awq_qweight_to_gptq(qweight):
    """vLLM ``INCXPULinearBase._convert_awq_qweight_to_gptq``: AWQ [K, N/8] -> GPTQ [K/8, N], lossless."""
    vals = unpack_fields(qweight, 4, 1, AWQ_REVERSE_ORDER)  # [K, N] by column
    return pack_fields(vals, 4, 0)


def unpack_awq(qweight, qzeros):
    """auto-round ``QuantLinearAWQ.post_init``: both tensors unpacked along N with the AWQ
    reverse order, minus 8 -> (intweight int8 [K, N], zeros int8 [K/G, N])."""
    torch = import_torch()
    q = unpack_fields(qweight, 4, 1, AWQ_REVERSE_ORDER)
    z = unpack_fields(qzeros, 4, 1, AWQ_REVERSE_ORDER)
    return (q - 8).to(torch.int8), (z - 8).to(torch.int8)


def scales32(s):
    """A float32 torch copy of checkpoint scales."""
    return to_torch(s, np.float32).contiguous()


def params_scales(scales, engine: str, act_dtype: str):
    """Scales as the engine holds them before ``post_init``'s ``.to(float32)``.

    vllm: ``GroupQuantScaleParameter(dtype=params_dtype)`` and ``QuantLinear(weight_dtype=
    layer.params_dtype)``: the checkpoint's scales are cast (RNE) to the model dtype, which is
    the activation dtype. auto-round: kept as stored (QuantLinear built with the scales' dtype).
    """
    torch = import_torch()
    s = scales32(scales)
    if engine == "vllm":
        s = s.to(torch_dtype(act_dtype)).to(torch.float32)
    return s.contiguous()


def gptq_layout(case: Case, tensors: dict, engine: str = "vllm") -> ArkLayout:
    """Canonical GPTQ tensors -> ARK layout, as QuantLinear (engine vllm) / QuantLinearGPTQ (auto-round)."""
    torch = import_torch()
    bits = case.bits
    iw = unpack_gptq_qweight(tensors["qweight"], bits)
    zp_bias = 1 if (engine == "auto-round" and case.zero_convention != "v2") else 0
    if case.sym:
        zeros = torch.empty(0, dtype=torch.int8)
    else:
        zeros = unpack_gptq_qzeros(tensors["qzeros"], bits, zp_bias)
    return ArkLayout(iw.contiguous(), params_scales(tensors["scales"], engine, case.act_dtype), zeros.contiguous(),
                     case.group, bits, not case.sym)


def awq_layout(case: Case, tensors: dict, engine: str = "vllm") -> ArkLayout:
    """Canonical AWQ tensors -> ARK layout.

    vllm: qweight through ``_convert_awq_qweight_to_gptq`` then QuantLinear's GPTQ unpack;
    qzeros copied as they are (AWQ nibble order) and unpacked in GPTQ order.
    auto-round: ``QuantLinearAWQ`` (qzeros reordered like qweight).
    """
    if engine == "auto-round":
        iw, zeros = unpack_awq(tensors["qweight"], tensors["qzeros"])
    else:
        iw = unpack_gptq_qweight(awq_qweight_to_gptq(tensors["qweight"]), 4)
        zeros = unpack_gptq_qzeros(tensors["qzeros"], 4, 0)
    return ArkLayout(iw.contiguous(), params_scales(tensors["scales"], engine, case.act_dtype), zeros.contiguous(),
                     case.group, 4, True)


def ct_pack_layout(case: Case, tensors: dict) -> ArkLayout:
    """compressed-tensors pack-quantized -> ARK layout (no engine routes CT to ARK; direct transform).

    weight_packed [N, K/F] holds q + 2**(b-1) along K: unpack, subtract the offset, transpose
    to [K, N]; weight_scale [N, K/G] -> [K/G, N]; weight_zero_point [N/F, K/G] (packed along N,
    also offset) -> [K/G, N] signed.
    """
    torch = import_torch()
    bits = case.bits
    n, k = (int(v) for v in np.asarray(tensors["weight_shape"]).reshape(-1))
    off = 1 << (bits - 1)
    q = unpack_fields(tensors["weight_packed"], bits, 1)[:, :k] - off  # [N, K]
    iw = q.T.to(torch.int8).contiguous()
    scales = scales32(np.asarray(tensors["weight_scale"], dtype=np.float32).T)
    if case.sym:
        zeros = torch.empty(0, dtype=torch.int8)
    else:
        zp = unpack_fields(tensors["weight_zero_point"], bits, 0)[:n, :] - off  # [N, K/G]
        zeros = zp.T.to(torch.int8).contiguous()
    return ArkLayout(iw, scales, zeros, case.group, bits, not case.sym)


def ct_int8_layout(case: Case, tensors: dict) -> ArkLayout:
    """compressed-tensors int-quantized int8 [N, K], scale [N, 1] -> ARK layout with one K-block."""
    torch = import_torch()
    w = to_torch(tensors["weight"], np.int8)
    n, k = w.shape
    s = np.broadcast_to(np.asarray(tensors["weight_scale"], dtype=np.float32).reshape(-1, 1), (n, 1))
    return ArkLayout(w.T.contiguous(), scales32(s.T), torch.empty(0, dtype=torch.int8), k, 8, False)
