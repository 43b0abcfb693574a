"""The reference linear layers' speed code, apart from their definitions (emulator/linear.py): exact integer
GEMMs on float32 BLAS, and the lowest set bits of float32 rows read in float32 on all cores.

Semantics: docs/formats/activations.md#reference-linear; why each is exact:
docs/performance.md#w8a8-exact-accumulator. Every function here returns exactly what its definition in
plain NumPy would (tests/emulator/test_exact_int_matmul.py, tests/emulator/test_fast_paths.py).
"""

from __future__ import annotations

import numpy as np

from .errors import require

__all__ = ["FP32_EXACT_INT", "int_max", "ExactIntMatmul", "exact_int_matmul_for", "exact_int_matmul",
           "row_min_lowest_bit", "lowest_bit_exponent"]


def lowest_bit_exponent(v: np.ndarray) -> np.ndarray:
    """For each float64, the exponent e of its lowest set significand bit (v is a multiple of 2**e).

    Zeros, NaN and Inf give +inf (they impose no quantum).
    """
    from .numerics.rounding import decompose

    v = np.asarray(v, dtype=np.float64)
    ok = np.isfinite(v) & (v != 0)
    _, sig, exp = decompose(np.where(ok, v, 1.0))
    low = sig & (~sig + np.uint64(1))  # isolate the lowest set bit
    _, e = np.frexp(low.astype(np.float64))
    return np.where(ok, exp + e.astype(np.int64) - 1, np.inf)


_NO_BIT = np.int32(1 << 20)  # above every float32 exponent: a lane with no set bit


def _lowest_bit_f32(v32: np.ndarray) -> np.ndarray:
    """``lowest_bit_exponent`` of float32 values as int32 (``_NO_BIT`` for zeros, NaN and Inf), in uint32
    arithmetic: the significand with its implicit bit, its lowest set bit isolated (s & -s), that power
    of two's exponent read from its own float32 encoding (exact: it is at most 2**23)."""
    bits = v32.view(np.uint32)
    e = (bits >> np.uint32(23)) & np.uint32(0xFF)
    sig = bits & np.uint32(0x7FFFFF)
    normal = e > 0
    sig |= normal.astype(np.uint32) << np.uint32(23)
    low = sig & (~sig + np.uint32(1))
    lg = (low.astype(np.float32).view(np.uint32) >> np.uint32(23)).astype(np.int32) - 127
    res = np.maximum(e, np.uint32(1)).astype(np.int32) - 150 + lg
    return np.where((sig != 0) & (e < 255), res, _NO_BIT)


def row_min_lowest_bit(v: np.ndarray) -> np.ndarray:
    """``lowest_bit_exponent(v).min(axis=1)`` (float64 out), in cache-sized row blocks on all cores, in
    float32 arithmetic when ``v`` is a float32 array (speed only: the same values)."""
    from .parallel import for_row_chunks

    n = v.shape[0]
    if v.size == 0:
        return np.zeros(n)
    out = np.empty(n, dtype=np.float64)
    f32 = v.dtype == np.float32

    def rows(r0, r1):
        if f32:
            m = _lowest_bit_f32(v[r0:r1]).min(axis=1)
            out[r0:r1] = np.where(m == _NO_BIT, np.inf, m)
        else:
            out[r0:r1] = lowest_bit_exponent(v[r0:r1]).min(axis=1)

    for_row_chunks(n, v.size, rows, row_bytes=v.itemsize * v.shape[1])
    return out


#: every integer of magnitude <= 2**24 is a float32 (24-bit significand); 2**24 + 1 is the first that is not
FP32_EXACT_INT = 1 << 24


def int_max(a: np.ndarray) -> int:
    """max |a| of an integer-valued array (0 for an empty one), as a Python int."""
    if a.size == 0:
        return 0
    return int(max(abs(int(a.min())), abs(int(a.max()))))


class ExactIntMatmul:
    """w [N, K] (integer-valued) prepared once for exact products a @ w^T with integer-valued a, |a| <= a_max.

    Speed: float32 BLAS over chunks of K, each chunk's result added exactly in float64.
    Why every chunk is exact (docs/performance.md#w8a8-exact-accumulator): with |a| <= A, |w| <= W and a
    chunk of L <= 2**24 // (A * W) products, every product is an integer of magnitude <= A * W and every
    partial sum the BLAS can form, in *any* order or blocking (a sum of a subset of the chunk's products,
    with or without FMA), is an integer of magnitude <= L * A * W <= 2**24. Such integers are exactly
    representable in float32, so no product, sum or FMA rounds: each chunk result is the exact integer.
    For int8 x int8 (A = W = 128) that is L = 1024. The chunk results are then added in float64: every
    partial sum of them is an integer of magnitude <= K * A * W < 2**53, exact in any order.
    Operands too wide for float32 chunks take float64 (exact while K * A * W < 2**53), else int64.
    """

    __slots__ = ("shape", "a_max", "w_max", "chunk", "_w32", "_w")

    def __init__(self, w, a_max: int, w_max: int | None = None):
        w = np.asarray(w)
        require(w.ndim == 2, f"exact int matmul: expected w [N, K], got shape {list(w.shape)}")
        self.shape = w.shape
        N, K = w.shape
        self.a_max = int(a_max)
        self.w_max = int_max(w) if w_max is None else int(w_max)
        prod = max(1, self.a_max * self.w_max)
        self.chunk = FP32_EXACT_INT // prod
        self._w32 = self._w = None
        if self.chunk >= 1:
            self.chunk = max(1, min(K, self.chunk))
            # each chunk its own contiguous float32 [N, L] (int codes: exact, |w| <= 2**24 here); a strided
            # view of one [N, K] array measured ~10x slower in OpenBLAS's GEMV here
            self._w32 = [np.ascontiguousarray(w[:, k0:k0 + self.chunk], dtype=np.float32)
                         for k0 in range(0, K, self.chunk)]
        elif K * prod < 2 ** 53:
            self._w = w.astype(np.float64)
        else:
            require(K * prod < 2 ** 63, "exact int matmul: the integer sums may overflow int64")
            self._w = w.astype(np.int64)

    def __call__(self, a) -> np.ndarray:
        """sum_k a[m, k] * w[n, k] exactly, as float64 [M, N]; ``a`` [M, K] with |a| <= a_max."""
        a = np.asarray(a)
        N, K = self.shape
        require(a.ndim == 2 and a.shape[1] == K, f"exact int matmul: expected a [M, {K}], got {list(a.shape)}")
        M = a.shape[0]
        if self._w32 is None:
            return np.matmul(a.astype(self._w.dtype), self._w.T).astype(np.float64)
        L = self.chunk
        C = -(-K // L)
        # a fresh [K, M] array (exact: |a| <= a_max <= 2**24): np.ascontiguousarray(a.T) of a [1, K] a keeps a
        # K-stride on its unit axis, and NumPy's matmul then leaves BLAS
        at = np.empty((K, M), dtype=np.float32)
        at[...] = a.T
        if C == 1:
            return np.ascontiguousarray((self._w32[0] @ at).T, dtype=np.float64)
        # y^T = w @ a^T by chunks (this operand order measured faster in OpenBLAS here: docs/performance.md)
        acc = np.zeros((N, M), dtype=np.float64)
        part = np.empty((N, M), dtype=np.float32)
        for c, wc in enumerate(self._w32):
            np.matmul(wc, at[c * L:c * L + wc.shape[1]], out=part)
            np.add(acc, part, out=acc)  # float64 += exact float32 integer: exact
        return np.ascontiguousarray(acc.T)


def exact_int_matmul_for(w, a_max: int, w_max: int | None = None, *, engine=None):
    """A prepared exact product a @ w^T: ``engine(w, a_max, w_max)`` where an engine is given and covers these
    operands (a callable like ``ExactIntMatmul``; None where it does not), else ``ExactIntMatmul``.

    Speed only: the accumulator is an exact integer, so every correct engine returns the same numbers.
    qconform_torch passes torch's int8 GEMM this way (qconform_torch/int_kernels.py, which proves its engine
    against an int64 oracle before first use and keeps whichever of the two measures faster)."""
    if engine is not None:
        mm = engine(w, a_max, w_max)
        if mm is not None:
            return mm
    return ExactIntMatmul(w, a_max, w_max)


def exact_int_matmul(a, w, *, a_max: int | None = None, w_max: int | None = None, engine=None) -> np.ndarray:
    """sum_k a[m, k] * w[n, k] exactly, as float64 [M, N], for integer-valued a [M, K] and w [N, K]
    (``exact_int_matmul_for``; ``a_max`` / ``w_max`` bound |a| / |w|, computed from the data when omitted)."""
    a = np.asarray(a)
    w = np.asarray(w)
    require(a.ndim == 2 and w.ndim == 2 and a.shape[1] == w.shape[1],
            f"exact int matmul: expected a [M, K] and w [N, K], got {list(a.shape)} and {list(w.shape)}")
    return exact_int_matmul_for(w, int_max(a) if a_max is None else a_max, w_max, engine=engine)(a)
