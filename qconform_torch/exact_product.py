"""The A16 exact reference's float64 product on torch's intra-op threads, for the fallback a model calls (speed only).

Semantics: docs/formats/activations.md#the-a16-bound-from-row-norms. The contract is that of
``emulator.fast_linear_w16.float64_product``: each output element a float64 sum of K exact products (float32
values: two 24-bit significands), with ``chunk`` the sums of K-chunks of that many products, each in the BLAS's
order (FMA or not), added in order; ``product_error_factor(K, chunk)`` bounds its error, whatever the order.

Why torch: in a model forward the reference runs between torch operations, and torch's OpenMP workers spin for
a while after each of them. NumPy's row workers (emulator/parallel.py) then shared the two cores with a spinning
thread: the product took ~1.7x its standalone time inside a forward (docs/performance.md#model-level). Here the
same blocks, widenings, chunk GEMMs and additions are torch operations, so the threads that would spin do the
work. torch's float64 GEMM is IEEE float64 (its float32 precision settings concern float32 only); ``self_check``
proves the contract once per process on operands whose sums float64 must not round differently than the bound
allows (cancelling rows over 40 binades, K tails), against Python's exactly rounded ``math.fsum``; where it fails,
``float64_product_for`` returns NumPy's product and says so once in the log.
"""

from __future__ import annotations

import logging
import math
import threading

import numpy as np
import torch

from emulator.fast_linear_w16 import float64_product, product_error_factor

__all__ = ["torch_float64_product", "float64_product_for", "self_check", "reset_self_check", "BLOCK_BYTES"]

log = logging.getLogger("qconform.fallback")

#: bytes of widened weight rows per block: the float64 copy of a block is formed just before its GEMMs read it
#: (a whole-layer float64 copy is 2x the layer's float32 weight; measured no faster on the 2-core EPYC host)
BLOCK_BYTES = 4 << 20
_CHECK = {"done": False, "ok": False}
_LOCK = threading.Lock()


def torch_float64_product(x64: np.ndarray, w32: np.ndarray, *, chunk: int | None = None,
                          out: np.ndarray | None = None) -> np.ndarray:
    """x @ w^T as ``float64_product`` forms it (the same contract, not the same bits: the BLAS's order differs),
    on torch's GEMM and threads."""
    M, K = x64.shape
    N = w32.shape[0]
    y = np.empty((M, N), dtype=np.float64) if out is None else out
    k = K if not chunk or chunk >= K else int(chunk)
    xt = torch.from_numpy(np.ascontiguousarray(x64))
    wt = torch.from_numpy(np.ascontiguousarray(w32))
    yt = torch.from_numpy(y)
    rows = max(1, min(N, BLOCK_BYTES // (8 * max(K, 1))))
    buf = torch.empty((rows, K), dtype=torch.float64)
    acc = torch.empty((M, rows), dtype=torch.float64)
    part = torch.empty((M, rows), dtype=torch.float64) if k < K else None
    for n0 in range(0, N, rows):
        n1 = min(N, n0 + rows)
        b = buf[:n1 - n0]
        b.copy_(wt[n0:n1])  # exact: float32 values
        a = acc[:, :n1 - n0]
        torch.mm(xt[:, :k], b[:, :k].t(), out=a)
        for k0 in range(k, K, max(k, 1)):  # the chunk sums, added in order (K = 0: none; k = 0 only there)
            p = part[:, :n1 - n0]
            torch.mm(xt[:, k0:k0 + k], b[:, k0:k0 + k].t(), out=p)
            a.add_(p)
        yt[:, n0:n1].copy_(a)
    return y


def _check_operands():
    """Rows that cancel across 40 binades, K tails around the chunk, every sign: float64 sums the bound must cover."""
    rng = np.random.default_rng(20261128)
    cases = []
    for M, N, K, chunk in ((3, 5, 1, None), (2, 7, 300, 256), (40, 9, 1030, 256), (5, 3, 700, None)):
        x = (rng.standard_normal((M, K)) * np.exp2(rng.integers(-20, 21, (M, K)))).astype(np.float32)
        w = (rng.standard_normal((N, K)) * np.exp2(rng.integers(-20, 21, (N, K)))).astype(np.float32)
        if K > 1:
            h = K // 2
            w[:, 1:2 * h:2] = (-(x[0, 0:2 * h:2] * w[:, 0:2 * h:2]) / np.where(x[0, 1:2 * h:2] == 0, 1, x[0, 1:2 * h:2])
                               ).astype(np.float32)
        cases.append((x, w, chunk))
    return cases


def self_check() -> bool:
    """Whether torch's float64 product meets ``float64_product``'s contract here (once per process): every element of
    the check operands within ``product_error_factor(K, chunk)`` times sum |x w| of the exact sum (``math.fsum`` of
    the exact float64 products: the correctly rounded sum, so one rounding's room, u sum |x w|, is added)."""
    with _LOCK:
        if not _CHECK["done"]:
            ok = True
            try:
                for x, w, chunk in _check_operands():
                    y = torch_float64_product(x.astype(np.float64), w, chunk=chunk)
                    G = product_error_factor(x.shape[1], chunk)
                    for m in range(x.shape[0]):
                        for n in range(w.shape[0]):
                            p = [float(a) * float(c) for a, c in zip(x[m], w[n])]
                            exact = math.fsum(p)
                            mag = math.fsum(abs(v) for v in p)
                            if not abs(float(y[m, n]) - exact) <= G * mag * (1 + 2.0 ** -50) + 2.0 ** -52 * mag:
                                ok = False
            except Exception as e:  # a torch that cannot run it: NumPy's product
                log.warning("torch float64 product unavailable (%s): the exact reference uses NumPy's", e)
                ok = False
            else:
                if not ok:
                    log.warning("torch's float64 product is outside its error bound on this host: the exact "
                                "reference uses NumPy's")
            _CHECK.update(done=True, ok=ok)
        return _CHECK["ok"]


def reset_self_check() -> None:
    with _LOCK:
        _CHECK.update(done=False, ok=False)


def float64_product_for():
    """The product the exact reference should use in this process: torch's where ``self_check`` passed, else
    NumPy's (emulator/fast_linear_w16.py)."""
    return torch_float64_product if self_check() else float64_product
