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
K >= 2**17: the engine declines and ``emulator.fast_linear.ExactIntMatmul`` (NumPy) answers.

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

import time

import numpy as np
import torch

from emulator.fast_linear import ExactIntMatmul

__all__ = ["TorchInt8Matmul", "torch_int8_engine", "b_operand", "m_class", "fastest_int_engine", "MeasuredIntMatmul", "engine_choices",
           "self_check", "MAX_K"]

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


def b_operand(w8: np.ndarray) -> torch.Tensor:
    """``_b_operand``: the [K, N] int8 operand of torch._int_mm for w [N, K] (what other engines of the op use)."""
    return _b_operand(w8)


def _int8_product(a8: np.ndarray, b: torch.Tensor) -> np.ndarray:
    """a8 [M, K] int8 (C-contiguous) @ b [K, N] -> int64 [M, N]."""
    return torch._int_mm(torch.from_numpy(np.ascontiguousarray(a8)), b).numpy().astype(np.int64)


class TorchInt8Matmul:
    """w [N, K] int8 prepared once; ``__call__(a)`` -> sum_k a[m, k] * w[n, k] exactly, float64 [M, N]
    (the interface of emulator.fast_linear.ExactIntMatmul). ``fallback`` answers rows the engine cannot shift."""

    def __init__(self, w8: np.ndarray, fallback):
        self.shape = w8.shape
        self._w8 = w8
        self._b = _b_operand(w8)
        self._rowsum = None  # sum_k w[n, k], for the row shifts: formed at the first shifted row (a pass over w)
        self._fallback = fallback

    def _rowsums(self) -> np.ndarray:
        if self._rowsum is None:
            self._rowsum = self._w8.sum(axis=1, dtype=np.int64)
        return self._rowsum

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
            acc += c[:, None] * self._rowsums()[None, :]
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
    """An engine for ``emulator.fast_linear.exact_int_matmul_for``: a TorchInt8Matmul where the operands fit it
    (int8 weights, K < MAX_K, a passing self-check), else None (ExactIntMatmul answers)."""

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


# ------------------------------------------------------------------------ the faster engine, by measurement

#: (N, K, M class) -> "torch int8 GEMM" | "float32 sgemm over K-chunks": the first call of each class times both
_CHOICE: dict[tuple[int, int, int], str] = {}
_CHOICE_LOCK = threading.Lock()
_TORCH, _NUMPY = "torch int8 GEMM", "float32 sgemm over K-chunks"


def m_class(m: int) -> int:
    """1, 8, 32, 128, 512, ...: the power-of-4 step above m (one timing per step)."""
    c = 1
    while c < m:
        c = 8 if c == 1 else c * 4
    return c


def engine_choices() -> dict[str, str]:
    """What was measured faster so far: 'N x K, M <= c' -> engine name."""
    return {f"{n}x{k}, M <= {c}": v for (n, k, c), v in sorted(_CHOICE.items())}


def _best_time(fn, a) -> float:
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        fn(a)
        best = min(best, time.perf_counter() - t0)
    return best


class MeasuredIntMatmul:
    """An exact integer GEMM that runs whichever of torch's int8 GEMM (``TorchInt8Matmul``) and NumPy's float32
    sgemm over K-chunks (``ExactIntMatmul``) measured faster for its shape: the first call at each (N, K, M
    class) in a process times both on its own operands (one warm-up, best of two) and checks that they return
    the same integers (both are exact; a difference is a kernel bug: logged, and NumPy's answer is used).
    Measured, not assumed: on the hosts of docs/performance.md torch's int8 GEMM was 4-10x faster than a
    float64 dgemm on one (AMX) and several times slower than float32 BLAS on another (AVX2)."""

    def __init__(self, torch_mm: TorchInt8Matmul, numpy_mm):
        """``numpy_mm``: an ExactIntMatmul, or a callable building one when first needed (its float32 chunks are a
        copy of the weight: not formed where every shape class seen was already measured for torch)."""
        self.shape = torch_mm.shape
        self._torch, self._numpy_mm = torch_mm, numpy_mm

    def _numpy(self, a) -> np.ndarray:
        if not isinstance(self._numpy_mm, ExactIntMatmul):
            self._numpy_mm = self._numpy_mm()
        return self._numpy_mm(a)

    def __call__(self, a) -> np.ndarray:
        a = np.asarray(a)
        N, K = self.shape
        key = (N, K, m_class(a.shape[0] if a.ndim == 2 else 1))
        choice = _CHOICE.get(key)
        if choice is None:
            y_np = self._numpy(a)
            y_t = self._torch(a)
            if not np.array_equal(y_np, y_t):
                log.warning("torch int8 GEMM disagreed with NumPy's exact sums at %dx%d (M = %d): NumPy's are used",
                            N, K, a.shape[0])
                with _CHOICE_LOCK:
                    _CHOICE[key] = _NUMPY
                return y_np
            t_np, t_t = _best_time(self._numpy, a), _best_time(self._torch, a)
            choice = _TORCH if t_t < t_np else _NUMPY
            with _CHOICE_LOCK:
                _CHOICE[key] = choice
            log.info("exact int GEMM %dx%d, M <= %d: %s (torch int8 %.2f ms, float32 K-chunks %.2f ms)",
                     N, K, key[2], choice, t_t * 1e3, t_np * 1e3)
            return y_np
        return (self._torch if choice == _TORCH else self._numpy)(a)


def fastest_int_engine(w, a_max: int, w_max: int | None = None):
    """An engine for ``emulator.fast_linear.exact_int_matmul_for``: a ``MeasuredIntMatmul`` where torch's int8
    GEMM covers the operands, else None (NumPy's ExactIntMatmul answers alone)."""
    t = torch_int8_engine(w, a_max, w_max)
    if t is None:
        return None
    return MeasuredIntMatmul(t, lambda: ExactIntMatmul(np.asarray(w), a_max, w_max))
