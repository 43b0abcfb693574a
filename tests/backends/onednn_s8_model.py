"""Independent model of oneDNN's non-VNNI s8s8 matmul (gemm:jit), for ARK's ``woqgemm_s8`` on hosts without
a VNNI int8 matmul (AVX2-only, AVX-512 without VNNI), and the reader of ONEDNN_VERBOSE's implementation name.

Source of the model: oneDNN's "Nuances of int8 Computations" (dev_guide_int8_computations: without VNNI the
u8 x s8 products go through vpmaddubsw, whose int16 pair sums saturate; s8 sources are shifted to u8 by +128
and compensated) and Intel's SDM entry for PMADDUBSW (adjacent byte pairs, signed-saturated to int16).
Measured on this project's hosts: docs/backends/ark.md#woqgemm_s8-by-isa. Imported by test_ark.py and by the
subprocess it runs woqgemm_s8 in.
"""

from __future__ import annotations

import numpy as np

#: the K up to which oneDNN's gemm:jit keeps one K block (pairs start at even k); measured: above it the K loop
#: is split into blocks whose pairs start at each block's first element (K = 258: two blocks of 129)
ONE_K_BLOCK_MAX = 256


def saturating_s8_accumulator(xq: np.ndarray, w: np.ndarray) -> np.ndarray:
    """int32 accumulator [M, N] of x [M, K] (s8 codes) times w [N, K] (s8) as gemm:jit computes it: the
    activations shifted to u8, adjacent pairs of (x+128)*w summed and saturated to int16 (vpmaddubsw), the
    pair sums added in int32, minus the compensation 128 * sum_k w."""
    xq = np.asarray(xq, np.int64)
    w = np.asarray(w, np.int64)
    if xq.shape[1] > ONE_K_BLOCK_MAX:
        raise ValueError(f"the pairing model holds for K <= {ONE_K_BLOCK_MAX} (one K block), got K = {xq.shape[1]}")
    K = xq.shape[1]
    pad = K % 2
    u = np.pad(xq + 128, ((0, 0), (0, pad)))
    wp = np.pad(w, ((0, 0), (0, pad)))
    prod = u[:, None, :] * wp[None, :, :]
    pairs = np.clip(prod.reshape(prod.shape[0], prod.shape[1], -1, 2).sum(-1), -32768, 32767)
    return pairs.sum(-1) - 128 * w.sum(-1)[None, :]


_PRECISION = {"float32": 24, "bfloat16": 8, "float16": 11}


def distance_to_model(y, acc, x_scale: float, w_scale, bias, out_dtype: str) -> float:
    """max |y - model| / tolerance over the outputs, model = acc * x_scale * w_scale[n] + bias in float64;
    tolerance: 2 units in the last place of ``out_dtype`` at the model's magnitude plus the float32 roundings
    of the scaling (2^-22 of the terms). <= 1: ``y`` is the saturating accumulator's answer."""
    acc = np.asarray(acc, np.float64)
    scaled = acc * float(x_scale) * np.asarray(w_scale, np.float64).reshape(1, -1)
    b = np.zeros(scaled.shape[1]) if bias is None else np.asarray(bias, np.float64).reshape(1, -1)
    model = scaled + b
    p = _PRECISION[out_dtype]
    tol = 2.0 ** (1 - p) * np.abs(model) + 2.0 ** -22 * (np.abs(scaled) + np.abs(b)) + 2.0 ** -24
    return float(np.max(np.abs(np.asarray(y, np.float64) - model) / tol))


def verbose_matmul_impl(verbose: str) -> str | None:
    """The implementation name of the last matmul in ONEDNN_VERBOSE=1 output (e.g. ``brg_matmul:avx512_core_vnni``,
    ``gemm:jit``), or None when no matmul executed."""
    impl = None
    for line in verbose.splitlines():
        f = line.split(",")
        if len(f) > 6 and f[0] == "onednn_verbose" and f[3] == "exec" and f[5] == "matmul":
            impl = f[6]
    return impl


def impl_path(impl: str | None) -> str:
    """ARK's ``s8_matmul_path`` vocabulary for an implementation name: amx, avx512_vnni, avx2_vnni, no_vnni,
    or unknown (a path this project has not classified: a new behaviour to examine)."""
    if not impl:
        return "unknown"
    if "amx" in impl:
        return "amx"
    if impl.startswith("brg_matmul:avx512_core_vnni") or impl.startswith("brg_matmul:avx512_core_bf16"):
        return "avx512_vnni"
    if impl.startswith("brg_matmul:avx2_vnni"):
        return "avx2_vnni"
    if impl.startswith("gemm:jit") or impl in ("brg_matmul:avx512_core", "brg_matmul:avx2"):
        return "no_vnni"  # vpmaddubsw: ONEDNN_MAX_CPU_ISA=AVX512_CORE gives brg_matmul:avx512_core, AVX2 gemm:jit
    return "unknown"
