"""The A16 exact reference's speed code, apart from its definition (emulator/linear.py ``linear_w16``): the same
``y`` bit for bit (the exact sum rounded once), from one float64 GEMM and an error bound that costs no second
GEMM.

Semantics and the proof: docs/formats/activations.md#the-a16-bound-from-row-norms. In short, for float32-valued
x [M, K] and w [N, K] (every dequantized A16 weight, every float32 / float16 / bfloat16 activation):

1. ``y64 = x @ w^T`` in float64 (any BLAS order, FMA or not): every product is exact (two 24-bit significands),
   so ``|y64 - y| <= gamma_{K-1} S`` with ``S = sum_k |x_k w_k|`` (Higham, "Accuracy and Stability of Numerical
   Algorithms", 2nd ed., section 3.1).
2. ``S <= ||x_m||_2 ||w_n||_2`` (Cauchy-Schwarz on |x|, |w|): per-row norms, M + N numbers, where the readable
   reference forms S by a second GEMM. For random rows the norms' product is about pi / 2 times S.
3. Only where that bound leaves the rounding undecided is S formed for the element itself (one dot product of
   the gathered rows), and only where that still leaves it undecided is the element decided from its exact
   value (``linear.decide_exactly``), as in the definition.

Every bound is raised for its own float64 evaluation (``slack``). ``tests/emulator/test_fast_linear_w16.py``
checks the bounds against Python rationals and the outputs against the definition on random and adversarial
layers (ties, cancellation, subnormals, huge K, NaN / Inf).
"""

from __future__ import annotations

import threading

import numpy as np

from . import linear as lin
from .errors import require
from .parallel import BLOCK_BYTES, for_row_chunks, single_threaded_blas
from .numerics.output_grid import U64, gamma, round_output, round_output_fast

__all__ = ["slack", "row_norm_bounds", "norm_product_bounds", "element_magnitudes", "float64_product",
           "linear_w16_fast"]

#: bytes of the float64 copy of weight rows one GEMM call reads at small M: widened just before the GEMM reads
#: them, they are still in the core's cache (a whole-weight float64 copy is written to memory and read back: at
#: M = 8 that took ~1.5x the blocked product's time on this project's Zen 5 host, one thread)
_CHUNK_BYTES = 512 << 10
#: from this many activation rows on, the GEMM is compute-bound: blocks of parallel.BLOCK_BYTES (2 MiB)
_LARGE_M = 32


def slack(K: int) -> float:
    """fl((1 + 2^-48) / (1 - fl(gamma_K))): the factor that raises a float64-evaluated sum of K non-negative exact
    terms (and what is formed from it below) to an upper bound of the exact value. A sum of K non-negative terms in
    any order is at least (1 - gamma_{K-1}) times the exact sum; fl(gamma_K) >= gamma_{K-1}, and this factor's own
    evaluation loses at most (1 - u)^3; the norms' bound then rounds four more times (two square roots, two
    products), the element's sum once: (1 + 2^-48)(1 - u)^7 > 1 (u = 2^-53)."""
    return (1.0 + 2.0 ** -48) / (1.0 - gamma(max(K, 1)))


def row_norm_bounds(a: np.ndarray) -> np.ndarray:
    """fl(sqrt(fl(sum_k a[r, k]^2))) per row of float32-valued ``a`` (float64 [rows]): ``norm_product_bounds`` of two
    of them bounds the product of the exact 2-norms from above. The squares are exact in float64 (48 significand
    bits, at least 2^-298, at most 2^256: no underflow, no overflow); a NaN / Inf row gives NaN / Inf."""
    a = np.asarray(a)
    out = np.empty(a.shape[0], dtype=np.float64)
    rows = max(1, _CHUNK_BYTES // (8 * max(a.shape[1], 1)))
    with np.errstate(invalid="ignore", over="ignore"):
        for r0 in range(0, a.shape[0], rows):
            c = a[r0:r0 + rows].astype(np.float64)
            np.einsum("ij,ij->i", c, c, out=out[r0:r0 + rows])
        return np.sqrt(out)


def float64_product(x64: np.ndarray, w32: np.ndarray) -> np.ndarray:
    """x @ w^T (float64 [M, N]), w's float32 values widened to float64 block by block of its rows, each block's
    GEMM on one BLAS thread, the blocks on all cores (emulator/parallel.py). Each element a float64 sum of K exact
    products in some order (the order is the BLAS's business: the bound holds for every order, FMA or not)."""
    M, K = x64.shape
    N = w32.shape[0]
    y = np.empty((M, N), dtype=np.float64)
    step = max(8, (_CHUNK_BYTES if M < _LARGE_M else BLOCK_BYTES) // (8 * max(K, 1)))
    local = threading.local()

    def rows(r0: int, r1: int) -> None:
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = np.empty((step, K), dtype=np.float64)
        b = buf[:r1 - r0]
        np.copyto(b, w32[r0:r1])
        np.matmul(x64, b.T, out=y[:, r0:r1])

    with np.errstate(invalid="ignore", over="ignore"), single_threaded_blas():
        for_row_chunks(N, N * K, rows, step=step)
    return y


def norm_product_bounds(x_norms: np.ndarray, w_norms: np.ndarray, K: int) -> np.ndarray:
    """[M, N] upper bounds of sum_k |x[m, k] w[n, k]| <= ||x_m||_2 ||w_n||_2 (Cauchy-Schwarz on |x|, |w|) from
    ``row_norm_bounds`` of x and of w (``slack``)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.multiply.outer(x_norms * slack(K), w_norms)


def element_magnitudes(x32: np.ndarray, w32: np.ndarray, ms: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """Upper bounds of sum_k |x[m, k] w[n, k]| for the elements (ms[u], ns[u]) (float64 [U]): the float64 sum of the
    exact products in some order, times ``slack(K)``; in chunks of gathered rows."""
    K = x32.shape[1]
    out = np.empty(ms.shape[0], dtype=np.float64)
    step = max(1, lin.DECIDE_BYTES // (16 * max(K, 1)))
    with np.errstate(invalid="ignore", over="ignore"):
        for u0 in range(0, ms.shape[0], step):
            a = np.abs(x32[ms[u0:u0 + step]]).astype(np.float64)
            b = np.abs(w32[ns[u0:u0 + step]]).astype(np.float64)
            np.einsum("ij,ij->i", a, b, out=out[u0:u0 + step])
        return out * slack(K)


def linear_w16_fast(x, w, bias=None, *, out_dtype: str | None = None, w_norms: np.ndarray | None = None
                    ) -> lin.LinearResult:
    """``linear_w16(x, w, bias)``'s ``y`` bit for bit, for a float32 dequantized weight ``w`` [N, K] (any other
    weight dtype runs ``linear_w16`` itself). ``w_norms``: ``row_norm_bounds(w)`` where the caller keeps it per
    layer (speed only).

    ``y_bound`` is the bound that decided each element (the norms' product, or the element's own sum of
    magnitudes where that one did not decide it), ``y_ambiguous`` the elements neither decided (these were
    decided from their exact value), ``mag`` an upper bound of sum_k |x w| (not the readable reference's)."""
    out_dtype = out_dtype or lin.dtype_name(x)
    w32 = np.asarray(w)
    if w32.dtype != np.float32:
        return lin.linear_w16(x, w, bias, out_dtype=out_dtype)
    require(w32.ndim == 2, f"expected weight [N, K], got shape {list(w32.shape)}", tensor="weight")
    N, K = w32.shape
    x64 = lin.activations_float64(x, K)
    x32 = x64.astype(np.float32)  # exact: x is float32 / float16 / bfloat16 (dtype_name)
    b = lin.bias_float64(bias, N)
    if w_norms is None:
        w_norms = row_norm_bounds(w32)
    require(w_norms.shape == (N,), "w_norms must be row_norm_bounds(w)", tensor="weight")
    y = float64_product(x64, w32)
    g = gamma(K)
    with np.errstate(invalid="ignore", over="ignore"):
        # fl(gamma_K) fl(mag) >= gamma_{K-1} S: gamma_K >= gamma_{K-1} (1 + 1/K) covers their roundings (docs)
        mag = norm_product_bounds(row_norm_bounds(x32), w_norms, K)
        bound = g * mag
        if bias is None:
            y += 0.0  # what adding the zero bias does (-0 becomes +0)
            extra = None
        else:  # the bias addition's own rounding, exact by TwoSum (as linear.add_bias)
            s = y + b
            bb = s - y
            err = (y - (s - bb)) + (b - bb)
            extra = np.where(np.isfinite(err), np.abs(err), 0.0)
            y = s
            bound += extra
            bound *= 1.0 + 4 * U64  # the addition's rounding, with room
    yr, amb = round_output_fast(y, bound, out_dtype)
    if amb.any():  # the element's own sum of magnitudes, where the norms' product did not decide it
        ms, ns = np.nonzero(amb)
        with np.errstate(invalid="ignore", over="ignore"):
            m2 = element_magnitudes(x32, w32, ms, ns)
            b2 = g * m2
            if extra is not None:
                b2 = (b2 + extra[ms, ns]) * (1.0 + 4 * U64)
        _, amb[ms, ns] = round_output(y[ms, ns], b2, out_dtype)
        mag[ms, ns] = m2
        bound[ms, ns] = b2
    res = lin.LinearResult(y=yr, y_exact=y, y_bound=bound, y_ambiguous=amb, out_dtype=out_dtype, mag=mag)
    return lin.decide_exactly(res, lambda ms, ns: [(x32[ms], w32[ns])] + lin.bias_terms(bias, b, ns))
