"""Exact integer accumulators on torch's int8 GEMM: the W8A8 accumulator of the fallback a model calls.

Semantics: docs/performance.md#w8a8-exact-accumulator (what is computed is the exact integer
sum_k a[m, k] * w[n, k]; this module only computes it faster than NumPy can).

``torch._int_mm`` multiplies int8 [M, K] by int8 [K, N] into int32 (oneDNN's s8s8s32 GEMM on CPU, VNNI or
AMX where the host has them). Exact when no int32 partial sum overflows: with both operands in
[-128, 127] every product is at most 2**14 in magnitude, so K < 2**17 keeps every partial sum (a sum of
at most K products, in whatever order the kernel adds them) below 2**31.

Activations need not be int8 already: W8A8's asymmetric codes ``q - zp`` span up to 255 values in a
row. Each row m is shifted by an integer c[m] into [-128, 127]; then sum_k a w = sum_k (a - c) w +
c * sum_k w, the last term in int64 (exact). A row spanning more than 256 values, weights outside int8,
K >= 2**17: the engine declines and ``emulator.linear.ExactIntMatmul`` (NumPy) answers.

Operand layout: torch (2.13 here) hands oneDNN leading dimensions read from the strides, and the stride
of a size-1 dimension is arbitrary; for K = 1 the weight's transposed view [1, N] has strides (1, 1), the
call is silently rejected and the int32 output comes back uninitialised (found by this module's tests;
the same mechanism as pytorch/pytorch#195066, fix proposed in pytorch/pytorch#194682). ``_b_operand``
therefore gives the weight a row-major [1, N] copy when K = 1.

A green must mean a correct answer, so the engine proves itself before its first use in a process
(``self_check``): extreme operands (all -128, alternating signs, K tails, K = 1, M = 1, N = 1) through
the engine's own operand code, against NumPy's int64 matmul. If that fails the engine declines every
product (and says so once in the log).
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import torch

__all__ = ["TorchInt8Matmul", "torch_int8_engine", "self_check", "MAX_K"]

log = logging.getLogger("qconform.fallback")

#: K below this keeps every int32 partial sum of int8 x int8 products exact (2**14 * K < 2**31)
MAX_K = 1 << 17

_CHECK = {"done": False, "ok": False}
_CHECK_LOCK = threading.Lock()


def _as_int8_rows(w: np.ndarray) -> np.ndarray | None:
    """w as int8 where it is integer-valued and within [-128, 127], else None."""
    if w.dtype == np.int8:
        return w
    if w.size == 0:
        return None
    if w.dtype.kind in "iu":
        if int(w.min()) < -128 or int(w.max()) > 127:
            return None
        return w.astype(np.int8)
    if w.dtype.kind == "f":
        if not np.all(np.isfinite(w)) or w.min() < -128 or w.max() > 127 or not np.array_equal(w, np.rint(w)):
            return None
        return w.astype(np.int8)
    return None


def _b_operand(w8: np.ndarray) -> torch.Tensor:
    """The [K, N] operand of torch._int_mm for a weight w [N, K] int8, in a layout whose strides are its
    leading dimensions (see the module docstring: K = 1)."""
    n, k = w8.shape
    if k == 1:
        return torch.from_numpy(np.ascontiguousarray(w8.reshape(1, n)))
    return torch.from_numpy(np.ascontiguousarray(w8)).t()


def _int8_product(a8: np.ndarray, b: torch.Tensor) -> np.ndarray:
    """a8 [M, K] int8 (C-contiguous) @ b [K, N] -> int64 [M, N]."""
    return torch._int_mm(torch.from_numpy(np.ascontiguousarray(a8)), b).numpy().astype(np.int64)


class TorchInt8Matmul:
    """w [N, K] int8 prepared once; ``__call__(a)`` -> sum_k a[m, k] * w[n, k] exactly, float64 [M, N]
    (the interface of emulator.linear.ExactIntMatmul). ``fallback`` answers rows the engine cannot shift."""

    def __init__(self, w8: np.ndarray, fallback):
        self.shape = w8.shape
        self._b = _b_operand(w8)
        self._rowsum = w8.astype(np.int64).sum(axis=1)  # sum_k w[n, k], for the row shifts
        self._fallback = fallback

    def __call__(self, a) -> np.ndarray:
        a = np.asarray(a)
        N, K = self.shape
        if a.ndim != 2 or a.shape[1] != K:
            raise ValueError(f"exact int matmul: expected a [M, {K}], got {list(a.shape)}")
        if a.shape[0] == 0:
            return np.zeros((0, N))
        if a.dtype.kind not in "iuf":
            return self._fallback()(a)
        if a.dtype.kind in "iu":
            if a.dtype == np.uint64 and int(a.max()) >= 2 ** 63:
                return self._fallback()(a)
            a = a.astype(np.int64)  # spans and shifts below must not wrap in a narrow dtype
        lo, hi = a.min(axis=1), a.max(axis=1)
        if (not np.all(np.isfinite(lo)) or not np.all(np.isfinite(hi)) or np.any(hi - lo > 255)
                or np.any(lo < -(2 ** 24)) or np.any(hi > 2 ** 24)  # not np.abs: abs(int64 min) wraps
                or (a.dtype.kind == "f" and not np.array_equal(a, np.rint(a)))):
            return self._fallback()(a)
        # shift each row into [-128, 127]: c = 0 where it is there already, else lo + 128
        inside = (lo >= -128) & (hi <= 127)
        c = np.where(inside, 0, lo.astype(np.int64) + 128)
        a8 = (a.astype(np.int64) - c[:, None]).astype(np.int8) if np.any(c) else a.astype(np.int8)
        acc = _int8_product(a8, self._b)
        if np.any(c):
            acc += c[:, None] * self._rowsum[None, :]
        return acc.astype(np.float64)  # |acc| < 2**53: exact


def self_check() -> bool:
    """torch's int8 GEMM against NumPy's int64 matmul on extreme operands; cached per process."""
    with _CHECK_LOCK:
        if _CHECK["done"]:
            return _CHECK["ok"]
        ok = True
        try:
            rng = np.random.default_rng(12)
            for m, k, n in ((1, 4096, 64), (3, 1029, 17), (16, 2048, 40), (1, 1, 5), (4, 1, 1), (2, 3, 1), (1, 7, 3)):
                for w in (np.full((n, k), -128, np.int8), rng.integers(-128, 128, (n, k)).astype(np.int8)):
                    for a in (np.full((m, k), -128, np.int8), rng.integers(-128, 128, (m, k)).astype(np.int8),
                              np.where(np.arange(k) % 2 == 0, 127, -128).astype(np.int8)[None].repeat(m, 0)):
                        got = _int8_product(a, _b_operand(w))
                        if not np.array_equal(got, a.astype(np.int64) @ w.astype(np.int64).T):
                            ok = False
        except (RuntimeError, TypeError, AttributeError) as e:  # an older torch, a build without the op
            log.warning("torch int8 GEMM unavailable (%s): exact W8A8 sums use NumPy", e)
            ok = False
        else:
            if not ok:
                log.warning("torch int8 GEMM failed its exactness check: exact W8A8 sums use NumPy")
        _CHECK.update(done=True, ok=ok)
        return ok


def torch_int8_engine(w, a_max: int, w_max: int | None = None):
    """An ``emulator.linear.exact_int_engine`` factory: a TorchInt8Matmul where the operands fit it (int8
    weights, K < MAX_K, a passing self-check), else None (ExactIntMatmul answers)."""
    from emulator.linear import ExactIntMatmul

    w = np.asarray(w)
    if w.ndim != 2 or not 0 < w.shape[1] < MAX_K or w.shape[0] == 0:
        return None
    w8 = _as_int8_rows(w)
    if w8 is None or not self_check():
        return None
    box: list = []

    def fallback():
        if not box:
            box.append(ExactIntMatmul(w, a_max, w_max))
        return box[0]

    return TorchInt8Matmul(w8, fallback)
