"""vLLM CPU weight layouts: canonical checkpoint tensors -> what vLLM's CPU kernels take.

Pure torch (the kernel library is not needed); split from backends/vllm_cpu.py, which re-exports
every name. Mirrored from vLLM 0.32.0's ``process_weights_after_loading`` code paths (re-implemented
from reading the source, not imported); semantics and sources: docs/backends/vllm-cpu.md.
"""

from __future__ import annotations

from .torch_layout import AWQ_PACK_ORDER, AWQ_REVERSE_ORDER, import_torch, pack_fields, unpack_fields

__all__ = ["unpack_int32", "pack_int32", "awq_to_standard", "wna16_repack", "wna16_decode", "w4a8_awq_order",
           "w4a8_decode_awq_order"]


def unpack_int32(packed, dim: int):
    """4-bit fields of int32 words, LSB first, along ``dim`` (vLLM ``unpack_quantized_values_into_int32``)."""
    return unpack_fields(packed, 4, dim)


def pack_int32(values, dim: int):
    """Pack 4-bit values LSB first along ``dim`` (vLLM ``pack_quantized_values_into_int32``)."""
    return pack_fields(values, 4, dim)


def awq_to_standard(qweight, qzeros):
    """vLLM ``auto_awq._convert_awq_to_standard_format`` (its ``_REVERSE_AWQ_PACK_ORDER`` is
    ``AWQ_REVERSE_ORDER``).

    AWQ ``qweight [K, N/8]`` (AWQ slot order) -> ``[K/8, N]`` packed along K in sequential
    order; ``qzeros [G, N/8]`` -> ``[N/8, G]`` (output_dim 0, packed along N).
    """
    u = unpack_fields(qweight, 4, 1, AWQ_REVERSE_ORDER)  # [K, N] in column order
    z = unpack_fields(qzeros, 4, 1, AWQ_REVERSE_ORDER).T  # [N, G]
    return pack_fields(u, 4, 0), pack_fields(z, 4, 0)


def wna16_repack(qweight_k):
    """``CPUWNA16LinearKernel._process_gptq_weights_w4a16``: [K/8, N] (packed along K) ->
    [N/16, 2K]: repacked along N, then every 16 output channels (two int32 words) made a
    contiguous block ``view(K, N/16, 2).permute(1, 0, 2)``."""
    w = unpack_int32(qweight_k, 0)  # [K, N]
    K = w.shape[0]
    p = pack_int32(w, 1)  # [K, N/8]
    return p.view(K, -1, 2).permute(1, 0, 2).reshape(-1, K * 2).contiguous()


def wna16_decode(repacked, K: int):
    """Inverse of ``wna16_repack`` for tests: [N/16, 2K] -> codes [K, N]."""
    p = repacked.view(-1, K, 2).permute(1, 0, 2).reshape(K, -1)
    return unpack_int32(p, 1)


def w4a8_awq_order(qweight_k, zp_gn):
    """The torch half of ``_process_gptq_weights_w4a8`` (before ``convert_weight_packed_scale_zp``):
    unpack along K, permute each 8 output columns by (0,2,4,6,1,3,5,7) (AWQ order), repack
    along N -> weight [K, N/8]; zero points [G, N/8] get the same permutation."""
    torch = import_torch()
    perm = torch.tensor(AWQ_PACK_ORDER, dtype=torch.long)
    w = unpack_int32(qweight_k, 0)
    K, N = w.shape
    w = w.view(K, N // 8, 8)[:, :, perm].reshape(K, N)
    z = unpack_int32(zp_gn, 1)
    G = z.shape[0]
    z = z.view(G, N // 8, 8)[:, :, perm].reshape(G, N)
    return pack_int32(w, 1), pack_int32(z, 1)


def w4a8_decode_awq_order(packed):
    """How the kernel reads the AWQ-ordered words (``autoawq_to_int4pack``: bitshifts
    [0,4,1,5,2,6,3,7]*4): [R, N/8] -> values [R, N] in column order."""
    return unpack_fields(packed, 4, 1, AWQ_REVERSE_ORDER)
