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
]

#: AWQ stores column c of each 8-column block in nibble slot AWQ_PACK_ORDER.index(c)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)
_TORCH_DT = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def _torch():
    import torch

    return torch


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
        torch = _torch()
        w = self.intweight.to(torch.float64)
        s = self.scales.to(torch.float64).repeat_interleave(self.group, 0)
        z = self.zeros.to(torch.float64).repeat_interleave(self.group, 0) if self.asym else 0.0
        return ((w - z) * s).T.contiguous()


def _fields(words, bits: int, axis: int):
    """Unpack int32 words LSB-first along ``axis`` into int32 fields (0 .. 2**bits - 1)."""
    torch = _torch()
    per = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    w = words.to(torch.int32)
    mask = (1 << bits) - 1
    if axis == 0:  # [R, C] -> [R * per, C]
        f = (w.unsqueeze(1) >> shifts.view(1, per, 1)) & mask
        return f.reshape(w.shape[0] * per, w.shape[1])
    f = (w.unsqueeze(2) >> shifts.view(1, 1, per)) & mask  # [R, C] -> [R, C * per]
    return f.reshape(w.shape[0], w.shape[1] * per)


def unpack_gptq_qweight(qweight, bits: int):
    """GPTQ qweight [K/F, N] -> ARK intweight int8 [K, N] = field - 2**(bits-1) (QuantLinear.post_init)."""
    torch = _torch()
    return (_fields(_t(qweight), bits, 0) - (1 << (bits - 1))).to(torch.int8)


def unpack_gptq_qzeros(qzeros, bits: int, zp_bias: int):
    """GPTQ qzeros [K/G, N/F] -> ARK zeros int8 [K/G, N] = (field + zp_bias) - 2**(bits-1).

    ``zp_bias`` is QuantLinear's ``ZP_BIAS``: 0 for the ``ark_gptq_nozp`` class vLLM
    instantiates (v1 fields read literally), 1 for auto-round's ``QuantLinearGPTQ``. For
    8-bit the field + bias wraps in uint8 as QuantLinear's ``zeros.to(torch.uint8) += bias``.
    """
    torch = _torch()
    f = _fields(_t(qzeros), bits, 1) + zp_bias
    if bits == 8:
        f = f & 0xFF
    return (f - (1 << (bits - 1))).to(torch.int8)


def awq_qweight_to_gptq(qweight):
    """vLLM ``INCXPULinearBase._convert_awq_qweight_to_gptq``: AWQ [K, N/8] -> GPTQ [K/8, N], lossless."""
    torch = _torch()
    qw = _t(qweight).to(torch.int32)
    k = qw.shape[0]
    vals = _fields(qw, 4, 1).reshape(k, -1, 8)[:, :, list(AWQ_REVERSE_ORDER)].reshape(k, -1)  # [K, N] by column
    v = vals.reshape(k // 8, 8, -1).to(torch.int64)
    shifts = torch.arange(0, 32, 4, dtype=torch.int64).view(1, 8, 1)
    words = (v << shifts).sum(dim=1)
    return ((words + 2**31) % 2**32 - 2**31).to(torch.int32)


def unpack_awq(qweight, qzeros):
    """auto-round ``QuantLinearAWQ.post_init``: both tensors unpacked along N with the AWQ
    reverse order, minus 8 -> (intweight int8 [K, N], zeros int8 [K/G, N])."""
    torch = _torch()

    def cols(t):
        t = _t(t).to(torch.int32)
        return _fields(t, 4, 1).reshape(t.shape[0], -1, 8)[:, :, list(AWQ_REVERSE_ORDER)].reshape(t.shape[0], -1)

    return (cols(qweight) - 8).to(torch.int8), (cols(qzeros) - 8).to(torch.int8)


def _t(a, dtype=None):
    """A torch tensor owning a copy of ``a`` (checkpoint arrays may be read-only views)."""
    torch = _torch()
    if isinstance(a, torch.Tensor):
        return a.clone()
    return torch.from_numpy(np.array(a, dtype=dtype, copy=True))


def _scales32(s):
    return _t(s, np.float32).contiguous()


def _group(case: Case) -> int:
    return case.K if case.group_size in (-1, 0) else case.group_size


def params_scales(scales, engine: str, act_dtype: str):
    """Scales as the engine holds them before ``post_init``'s ``.to(float32)``.

    vllm: ``GroupQuantScaleParameter(dtype=params_dtype)`` and ``QuantLinear(weight_dtype=
    layer.params_dtype)``: the checkpoint's scales are cast (RNE) to the model dtype, which is
    the activation dtype. auto-round: kept as stored (QuantLinear built with the scales' dtype).
    """
    torch = _torch()
    s = _scales32(scales)
    if engine == "vllm":
        s = s.to(getattr(torch, _TORCH_DT[act_dtype])).to(torch.float32)
    return s.contiguous()


def gptq_layout(case: Case, tensors: dict, engine: str = "vllm") -> ArkLayout:
    """Canonical GPTQ tensors -> ARK layout, as QuantLinear (engine vllm) / QuantLinearGPTQ (auto-round)."""
    torch = _torch()
    bits = case.bits
    iw = unpack_gptq_qweight(tensors["qweight"], bits)
    zp_bias = 1 if (engine == "auto-round" and case.zero_convention != "v2") else 0
    if case.sym:
        zeros = torch.empty(0, dtype=torch.int8)
    else:
        zeros = unpack_gptq_qzeros(tensors["qzeros"], bits, zp_bias)
    return ArkLayout(iw.contiguous(), params_scales(tensors["scales"], engine, case.act_dtype), zeros.contiguous(),
                     _group(case), bits, not case.sym)


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
                     _group(case), 4, True)


def ct_pack_layout(case: Case, tensors: dict) -> ArkLayout:
    """compressed-tensors pack-quantized -> ARK layout (no engine routes CT to ARK; direct transform).

    weight_packed [N, K/F] holds q + 2**(b-1) along K: unpack, subtract the offset, transpose
    to [K, N]; weight_scale [N, K/G] -> [K/G, N]; weight_zero_point [N/F, K/G] (packed along N,
    also offset) -> [K/G, N] signed.
    """
    torch = _torch()
    bits = case.bits
    n, k = (int(v) for v in np.asarray(tensors["weight_shape"]).reshape(-1))
    off = 1 << (bits - 1)
    q = _fields(_t(tensors["weight_packed"]), bits, 1)[:, :k] - off  # [N, K]
    iw = q.T.to(torch.int8).contiguous()
    scales = _scales32(np.asarray(tensors["weight_scale"], dtype=np.float32).T)
    if case.sym:
        zeros = torch.empty(0, dtype=torch.int8)
    else:
        zp = _fields(_t(tensors["weight_zero_point"]), bits, 0)[:n, :] - off  # [N, K/G]
        zeros = zp.T.to(torch.int8).contiguous()
    return ArkLayout(iw, scales, zeros, _group(case), bits, not case.sym)


def ct_int8_layout(case: Case, tensors: dict) -> ArkLayout:
    """compressed-tensors int-quantized int8 [N, K], scale [N, 1] -> ARK layout with one K-block."""
    torch = _torch()
    w = _t(tensors["weight"], np.int8)
    n, k = w.shape
    s = np.broadcast_to(np.asarray(tensors["weight_scale"], dtype=np.float32).reshape(-1, 1), (n, 1))
    return ArkLayout(w.T.contiguous(), _scales32(s.T), torch.empty(0, dtype=torch.int8), k, 8, False)
