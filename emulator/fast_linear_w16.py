"""The A16 exact reference's speed code, apart from its definition (emulator/linear.py ``linear_w16``): the same
``y`` bit for bit (the exact sum rounded once), from one float64 product and an error bound that costs no second
GEMM.

Semantics and the proof: docs/formats/activations.md#the-a16-bound-from-row-norms. In short, for float32-valued
x [M, K] and w [N, K] (every dequantized A16 weight, every float32 / float16 / bfloat16 activation):

1. ``y64 = x @ w^T`` in float64 (any BLAS order, FMA or not): every product is exact (two 24-bit significands),
   so ``|y64 - y| <= gamma_{K-1} S`` with ``S = sum_k |x_k w_k|`` (Higham, "Accuracy and Stability of Numerical
   Algorithms", 2nd ed., section 3.1); summed in K-chunks of 256 whose sums are added in order, so
   ``|y64 - y| <= G S`` with G about (256 + K / 256) u (``product_error_factor``).
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

import dataclasses
import threading

import numpy as np

from . import linear as lin
from .errors import require
from . import parallel
from .parallel import Scratch, for_row_chunks, single_threaded_blas
from .numerics.output_grid import U64, cell_test, gamma, round_output

__all__ = ["slack", "row_norm_bounds", "norm_product_bounds", "element_magnitudes", "product_error_factor",
           "float64_product", "K_CHUNK", "linear_w16_fast"]

#: bytes of the float64 copy of weight rows one GEMM call reads at small M, widened just before the GEMM reads them
#: (a whole-weight float64 copy is written to memory and read back: at M = 8 that took ~1.5x the blocked product's
#: time on the Zen 5 host, one thread); 2 MiB measured fastest at M = 8 on the 2-core EPYC host (512 KiB: 1.1-1.8x
#: its time, the blocks' per-call costs showing at K = 2816; 8 MiB and more: 1.2-1.4x)
_CHUNK_BYTES = 2 << 20
#: from this many activation rows on, the GEMM is compute-bound: a few large blocks per core (``_block_rows``)
_LARGE_M = 32
#: the most bytes of widened weight rows one block holds from _LARGE_M rows on: each K-chunk is then one BLAS call
#: and one addition over many output columns (with blocks of 2 MiB the chunks' small calls cost ~20 % more GEMM
#: time on the 2-core EPYC host)
_LARGE_BLOCK_BYTES = 8 << 20
#: K-chunk length of ``linear_w16_fast``'s product: its error bound falls from ~K u S to ~(256 + K / 256) u S, so
#: ~K / (256 + K / 256) times fewer elements are left to the exact decision (O(K) NumPy work each), for a few more
#: BLAS calls (on torch's product, qconform_torch/exact_product.py, no slower at M = 8 in a model forward)
K_CHUNK = 256
#: output elements one finishing step (bound, rounding, cell test) takes at a time: its dozen temporaries stay in
#: the core's cache (measured fastest on the 2-core EPYC host: ~60-90 K; one thread: the steps are memory-bound,
#: and a second thread did not make them faster there)
_FINISH_ELEMENTS = 1 << 16
#: each thread's reusable buffers (parallel.Scratch): the widened weight rows, the chunk sums, the finishing
#: step's temporaries
_SCRATCH = threading.local()


def _scratch() -> Scratch:
    s = getattr(_SCRATCH, "s", None)
    if s is None:
        s = _SCRATCH.s = Scratch()
    return s


def _block_rows(M: int, N: int, K: int, threads: int) -> int:
    """Weight rows per block of ``float64_product``: cache-sized at small M; from _LARGE_M rows on, as few blocks
    as _LARGE_BLOCK_BYTES allows, a multiple of ``threads`` of them (the spans stay balanced)."""
    if M < _LARGE_M:
        return max(8, _CHUNK_BYTES // (8 * max(K, 1)))
    per_thread = -(-N // max(threads, 1))
    blocks = -(-per_thread * 8 * max(K, 1) // _LARGE_BLOCK_BYTES)
    return max(8, -(-per_thread // blocks))


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


def product_error_factor(K: int, chunk: int | None = None) -> float:
    """G with |y64 - v| <= G S for ``float64_product``'s y64 summed in K chunks of ``chunk`` terms (None: one
    chunk), S = sum_k |x_k w_k|: a chunk of k exact products summed by the BLAS in any order is within
    gamma_{k-1} S_j of its exact value, the J = ceil(K / k) chunk sums added in order are within gamma_{J-1}
    sum_j |c_j| <= gamma_{J-1} (1 + gamma_{k-1}) S of their exact sum (Higham, 2nd ed., 3.1 and 4.2). Raised by
    1 + 2^-40: G's own evaluation and the bound formed from it round at most a dozen times, each a factor of at
    least 1 - 2^-53. One chunk gives ~gamma_K; chunks of 256 give ~(256 + K / 256) u instead of K u."""
    K = max(int(K), 1)
    k = K if not chunk else min(int(chunk), K)
    J = -(-K // k)
    gk, gJ = gamma(k - 1) if k > 1 else 0.0, gamma(J - 1) if J > 1 else 0.0
    return (gk + gJ * (1.0 + gk)) * (1.0 + 2.0 ** -40)


def float64_product(x64: np.ndarray, w32: np.ndarray, *, chunk: int | None = None, out: np.ndarray | None = None
                    ) -> np.ndarray:
    """x @ w^T (float64 [M, N]), w's float32 values widened to float64 block by block of its rows, each block's
    GEMM on one BLAS thread, the blocks on all cores (emulator/parallel.py). Each element a float64 sum of K exact
    products: with ``chunk``, the sums of K-chunks of that many products (each in the BLAS's order, FMA or not)
    added in order, which ``product_error_factor(K, chunk)`` bounds."""
    M, K = x64.shape
    N = w32.shape[0]
    y = np.empty((M, N), dtype=np.float64) if out is None else out
    step = _block_rows(M, N, K, parallel.row_threads())
    k = K if not chunk or chunk >= K else int(chunk)

    def rows(r0: int, r1: int) -> None:
        scratch = _scratch()
        b = scratch.take("w64", (r1 - r0, K), np.float64)
        np.copyto(b, w32[r0:r1])
        acc = y[:, r0:r1]
        np.matmul(x64[:, :k], b[:, :k].T, out=acc)
        if k < K:
            part = scratch.take("chunk sum", (M, r1 - r0), np.float64)
            for k0 in range(k, K, k):  # the chunk sums, added in order
                np.matmul(x64[:, k0:k0 + k], b[:, k0:k0 + k].T, out=part)
                acc += part

    # the blocks on all cores, one BLAS thread each, never the BLAS's own threads: OpenBLAS's idle threads spin for
    # a while after each call and then slow what the model runs next (torch's norms and attention measured 2-3x
    # slower beside them). A block is K M multiply-adds per row: worth a thread from far fewer rows than the
    # elementwise steps parallel.MIN_ELEMENTS is about, hence the work given as N K M.
    with np.errstate(invalid="ignore", over="ignore"), single_threaded_blas():
        for_row_chunks(N, N * K * max(M, 1), rows, step=step)
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


@dataclasses.dataclass
class _Outputs:
    """``linear_w16_fast``'s [M, N] arrays (or rows of them): the float64 sums, their bounds, the rounded values and,
    with a bias, the bias addition's exact rounding error."""

    y: np.ndarray
    bound: np.ndarray
    y32: np.ndarray
    extra: np.ndarray | None

    def rows(self, m0: int, m1: int) -> "_Outputs":
        return _Outputs(self.y[m0:m1], self.bound[m0:m1], self.y32[m0:m1],
                        None if self.extra is None else self.extra[m0:m1])


def _finish(o: _Outputs, xs, wn, b, out_dtype: str, scratch: Scratch | None = None) -> np.ndarray:
    """Rows of ``linear_w16_fast``'s outputs, in place: the norms' bound, the bias (its TwoSum error into
    ``o.extra`` and the bound), the rounding into ``o.y32``; returns the flat indices (in these rows) of the elements
    ``cell_test`` leaves to ``round_output``."""
    y, bound = o.y, o.bound
    with np.errstate(invalid="ignore", over="ignore"):
        np.multiply.outer(xs, wn, out=bound)
        if b is None:
            y += 0.0  # what adding the zero bias does (-0 becomes +0)
        else:  # the bias addition's own rounding, exact by TwoSum (as linear.add_bias)
            y[...], o.extra[...] = lin.bias_sum(y, b)
            bound += o.extra
            bound *= 1.0 + 4 * U64  # the addition's rounding, with room
    r32, _, test = cell_test(y, bound, out_dtype, scratch=scratch)
    o.y32[...] = r32
    return np.flatnonzero(test)


def linear_w16_fast(x, w, bias=None, *, out_dtype: str | None = None, w_norms: np.ndarray | None = None,
                    product=None) -> lin.LinearResult:
    """``linear_w16(x, w, bias)``'s ``y`` bit for bit (as float32 values), for a float32 dequantized weight ``w``
    [N, K] (any other weight dtype runs ``linear_w16`` itself). ``w_norms``: ``row_norm_bounds(w)`` where the caller
    keeps it per layer (speed only). ``product`` (speed only): ``float64_product``'s stand-in, with its signature and
    its contract (each element the in-order sum of K-chunk sums of exact products, each chunk in any order;
    qconform_torch/exact_product.py runs it on torch's threads).

    ``y_bound`` is the bound that decided each element (the norms' product, or the element's own sum of
    magnitudes where that one did not decide it), ``y_ambiguous`` the elements neither decided (these were
    decided from their exact value); ``mag`` is not formed (None)."""
    out_dtype = out_dtype or lin.dtype_name(x)
    w32 = np.asarray(w)
    if w32.dtype != np.float32:
        return lin.linear_w16(x, w, bias, out_dtype=out_dtype)
    require(w32.ndim == 2, f"expected weight [N, K], got shape {list(w32.shape)}", tensor="weight")
    N, K = w32.shape
    x64 = lin.activations_float64(x, K)
    x32 = x64.astype(np.float32)  # exact: x is float32 / float16 / bfloat16 (dtype_name)
    M = x64.shape[0]
    b = None if bias is None else lin.bias_float64(bias, N)
    if w_norms is None:
        w_norms = row_norm_bounds(w32)
    require(w_norms.shape == (N,), "w_norms must be row_norm_bounds(w)", tensor="weight")
    chunk = K_CHUNK
    G = product_error_factor(K, chunk)
    with np.errstate(invalid="ignore", over="ignore"):
        # fl(fl(nx c) G) nw >= G ||x|| ||w|| >= G S: G's 1 + 2^-40 covers the extra rounding (docs)
        xs = row_norm_bounds(x32) * slack(K) * G
    y, bound = np.empty((M, N), dtype=np.float64), np.empty((M, N), dtype=np.float64)
    y32 = np.empty((M, N), dtype=np.float32)
    extra = None if b is None else np.empty((M, N), dtype=np.float64)
    outs = _Outputs(y, bound, y32, extra)
    tested: list = []
    (product or float64_product)(x64, w32, chunk=chunk, out=y)
    scratch = _scratch()
    slab = max(1, _FINISH_ELEMENTS // max(N, 1))
    for m0 in range(0, M, slab):  # by slabs of rows: the finishing step's temporaries stay in the cache
        m1 = min(M, m0 + slab)
        idx = _finish(outs.rows(m0, m1), xs[m0:m1], w_norms, b, out_dtype, scratch)
        if idx.size:
            tested.append((idx // N + m0, idx % N))
    ms, ns = (np.concatenate(v) for v in zip(*tested)) if tested else (np.zeros(0, np.intp),) * 2
    if ms.size:  # round_output's own test, where the cheap one did not decide
        _, amb = round_output(y[ms, ns], bound[ms, ns], out_dtype)
        ms, ns = ms[amb], ns[amb]
    if ms.size:  # the element's own sum of magnitudes, where the norms' product did not decide it
        with np.errstate(invalid="ignore", over="ignore"):
            b2 = G * element_magnitudes(x32, w32, ms, ns)
            if extra is not None:
                b2 = (b2 + extra[ms, ns]) * (1.0 + 4 * U64)
        _, amb = round_output(y[ms, ns], b2, out_dtype)
        bound[ms, ns] = b2
        ms, ns = ms[amb], ns[amb]
    undecided = np.zeros((M, N), dtype=bool)
    undecided[ms, ns] = True
    res = lin.LinearResult(y=y32, y_exact=y, y_bound=bound, y_ambiguous=undecided, out_dtype=out_dtype)
    return lin.decide_exactly(res, lambda ms, ns: [(x32[ms], w32[ns])] + lin.bias_terms(bias, b, ns), at=(ms, ns))
