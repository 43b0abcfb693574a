"""Triton W4A16 GEMM reading GPTQ-layout int4 weights directly (no repacking).

y[M, N] = x[M, K] @ W^T, W[n, k] = (q[k, n] - z[g, n]) * s[g, n], g = g_idx[k]:

- ``qweight`` int32 [K/8, N]: q[k, n] is bits 4 (k % 8) .. 4 (k % 8) + 3 of word [k // 8, n];
- ``qzeros``  int32 [G, N/8]: field n % 8 of word [g, n // 8]; z = field + ``zero_offset``
  (1 for checkpoint_format "gptq" (v1), 0 for "gptq_v2");
- ``scales`` [G, N] in the activation dtype T (bf16 or fp16; the adapter converts them);
- ``g_idx``  int32 [K] (act order; k // group_size without it).

Per K tile, in registers: w = T((q - z) * s) -- the product of a small integer and a T value is
exact in fp32 and is rounded once, to nearest even (Triton's default fp downcast), to T; then
``tl.dot(x_tile, w_tile)`` on the tensor cores with an fp32 accumulator; the bias (T values) is
added to the fp32 accumulator, which is rounded once (RTNE) to T.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def w4a16_gptq_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, g_ptr, b_ptr, y_ptr, M, N, K, zero_offset,
                      stride_xm, stride_xk, stride_qk, stride_qn, stride_zg, stride_zn, stride_sg, stride_sn,
                      stride_ym, stride_yn, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        a = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        mask_kn = mask_k[:, None] & mask_n[None, :]
        words = tl.load(qw_ptr + (offs_k[:, None] // 8) * stride_qk + offs_n[None, :] * stride_qn,
                        mask=mask_kn, other=0)
        q = (words >> ((offs_k[:, None] % 8) * 4)) & 0xF
        g = tl.load(g_ptr + offs_k, mask=mask_k, other=0)
        zw = tl.load(qz_ptr + g[:, None] * stride_zg + (offs_n[None, :] // 8) * stride_zn, mask=mask_kn, other=0)
        z = ((zw >> ((offs_n[None, :] % 8) * 4)) & 0xF) + zero_offset
        s = tl.load(s_ptr + g[:, None] * stride_sg + offs_n[None, :] * stride_sn, mask=mask_kn, other=0.0)
        w = ((q - z).to(tl.float32) * s.to(tl.float32)).to(a.dtype)
        acc += tl.dot(a, w)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y = acc.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn, y,
             mask=mask_m[:, None] & mask_n[None, :])


def w4a16_gptq(x, qweight, qzeros, scales, g_idx, bias=None, *, zero_offset: int = 1,
               block_m: int = 16, block_n: int = 64, block_k: int = 32):
    """x [M, K] (bf16/fp16, CUDA) -> y [M, N] in x's dtype."""
    import torch

    M, K = x.shape
    N = qweight.shape[1]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    b = bias if bias is not None else y  # never read without HAS_BIAS
    w4a16_gptq_kernel[grid](x, qweight, qzeros, scales, g_idx, b, y, M, N, K, zero_offset,
                            x.stride(0), x.stride(1), qweight.stride(0), qweight.stride(1),
                            qzeros.stride(0), qzeros.stride(1), scales.stride(0), scales.stride(1),
                            y.stride(0), y.stride(1), HAS_BIAS=bias is not None,
                            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return y
