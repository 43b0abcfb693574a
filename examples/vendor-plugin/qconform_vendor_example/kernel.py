"""A small int4 W4A16 kernel for GPTQ-layout weights, in NumPy (the "vendor kernel").

Arithmetic (what backend.py declares):

1. weights: ``w = bf16((q - z) * bf16(s))`` -- the scale is converted to bfloat16, the product of
   the integer (q - z) and the bf16 scale is exact in fp32 (at most 5 + 8 significant bits) and is
   rounded once, ties to even, to bfloat16;
2. products and sums in float32: ``acc = x @ w`` per group with ``np.matmul`` on float32 arrays
   (BLAS sgemm: fp32 accumulation, any order), groups summed in fp32, plus the bias in fp32;
3. output: the fp32 accumulator rounded once, ties to even, to the activation dtype.

Layout: GPTQ ``qweight`` int32 [K/8, N] (nibble k % 8 of word k // 8, LSB first), ``qzeros`` int32
[G, N/8] (v1: stored z - 1; v2: z), ``scales`` fp16 [G, N]. ``prepare`` unpacks them once into the
kernel's own layout: uint8 codes [G, group, N], int16 zeros [G, 1, N], bf16-valued fp32 scales.
"""

from __future__ import annotations

import numpy as np


def to_bfloat16(a: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 (ties to even), returned as float32 holding bf16 values."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = a.view(np.uint32)
    r = ((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)).view(np.float32)
    return np.where(np.isnan(a), a, r)


def unpack_int32(words: np.ndarray, axis: int) -> np.ndarray:
    """Eight 4-bit fields per int32 along ``axis`` (field j = bits 4j..4j+3) -> uint8 codes."""
    w = np.asarray(words).view(np.uint32)
    shifts = np.arange(8, dtype=np.uint32) * np.uint32(4)
    w = np.moveaxis(w, axis, -1)
    f = (w[..., None] >> shifts) & np.uint32(0xF)
    f = f.reshape(w.shape[:-1] + (w.shape[-1] * 8,))
    return np.moveaxis(f, -1, axis).astype(np.uint8)


def prepare_gptq(qweight, qzeros, scales, *, group_size: int, zero_offset: int) -> dict:
    """Unpack GPTQ tensors into the kernel layout. ``zero_offset``: 1 for v1 ('gptq'), 0 for v2."""
    q = unpack_int32(qweight, axis=0)  # [K, N]
    K, N = q.shape
    G = K // group_size
    z = unpack_int32(qzeros, axis=1)[:, :N].astype(np.int16) + zero_offset  # [G, N]
    s = to_bfloat16(np.asarray(scales, dtype=np.float32))  # [G, N]
    return {"q": q.reshape(G, group_size, N), "z": z[:, None, :], "s": s[:, None, :], "K": K, "N": N}


def w4a16_matmul(x: np.ndarray, p: dict, bias: np.ndarray | None, out_dtype: str) -> np.ndarray:
    """y = x @ W^T for x float32 [M, K] holding the activation dtype's values."""
    G, gs, N = p["q"].shape
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(x.shape[0], G, gs)
    acc = np.zeros((x.shape[0], N), dtype=np.float32)
    for g in range(G):
        w = to_bfloat16((p["q"][g].astype(np.float32) - p["z"][g]) * p["s"][g])  # [gs, N]
        acc += x[:, g, :] @ w
    if bias is not None:
        acc += np.asarray(bias, dtype=np.float32)
    if out_dtype == "bfloat16":
        return to_bfloat16(acc)
    if out_dtype == "float16":
        return acc.astype(np.float16).astype(np.float32)
    return acc
