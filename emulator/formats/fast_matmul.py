"""y = x @ W^T with W delivered in row blocks: the fallback's fp32 product, cached or not (speed only).

Semantics: docs/fallback.md#memory and docs/performance.md#fallback.

The emulator backend's fast path declares fp32 accumulation of the exactly dequantized weights
(backends/emulator.py). Both of its ways to get W go through ``RowsTimesX``, so they return the same
bits: the cached path hands it row blocks of the fp32 weight it keeps (``matmul_rows``); the uncached
path (qconform_torch/blocked.py) passes it as the ``out`` of a dequantizer, which writes each
cache-sized row block into a per-thread buffer and hands it over while it is still in cache, so no
full fp32 weight is formed. Either way each block is one BLAS call ``W[r0:r1] @ x^T`` into rows
r0:r1 of y^T, on the same row blocks (``RowSink.step``), so every output element is the same fp32
sum over the whole of K.
"""

from __future__ import annotations

import threading

import numpy as np

from ..parallel import block_rows, for_row_chunks, single_threaded_blas

__all__ = ["RowSink", "RowsTimesX", "matmul_rows", "ROW_ALIGN", "THIN_M", "THIN_SPLIT"]

#: every block but the last starts at a multiple of this (AWQ unpacks 8 rows per word): the same
#: blocks for every format and for the cached weight
ROW_ALIGN = 8
#: a product with at most this many activation rows is "thin": its blocks are THIN_SPLIT times smaller
#: (512 KiB of fp32 instead of 2 MiB: 32 rows of K = 4096). There a block's dequantization costs far more
#: than its BLAS call, and with its unpacked codes and temporaries it then stays in a core's L2: the
#: uncached fallback's CPU time at M = 1 measured 10-25 % lower (cached: unchanged), while from M = 32 on
#: the larger blocks were faster for both (benchmarks/fallback_steps.py --heights, docs/performance.md#fallback)
THIN_M = 8
THIN_SPLIT = 4


class RowSink:
    """An ``out`` that receives the weight [N, K] block by block instead of holding it (a fused consumer).

    The dequantizers that take one (``fast_dequant.dequantize_grouped`` and
    ``dequantize_mxfp4_packed``, hence ``dequantize_gptq/awq/ct_packed/mxfp4_ct`` and
    ``declaration.declared_weight``) walk the rows in blocks of ``step`` rows, write each block
    into ``buffer`` (a per-thread scratch array) and hand it to ``deliver`` in the same worker thread;
    they then return the sink itself. ``covered`` counts the rows delivered, so a caller can check
    that every row arrived.
    """

    def __init__(self, shape: tuple, consume, step: int | None = None):
        self.shape = (int(shape[0]), int(shape[1]))
        self.consume = consume
        self.step = step or block_rows(4 * self.shape[1], ROW_ALIGN)
        self.covered = 0
        self._local = threading.local()
        self._lock = threading.Lock()

    def buffer(self, rows: int) -> np.ndarray:
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.shape[0] < rows:
            buf = self._local.buf = np.empty((max(rows, self.step), self.shape[1]), dtype=np.float32)
        return buf[:rows]

    def scale(self, w: np.ndarray, s: np.ndarray) -> None:
        """``w *= s`` in place: float32 ``w``, float32 ``s`` broadcast against it, each element the IEEE
        float32 product (the dequantizers' scale step, fast_dequant._FastPlan). A sink may run it with
        another vectorised multiply of the same IEEE semantics (qconform_torch/blocked.py), tested
        bit-identical to this one. Overflow to Inf and NaN products are the rule's results: no warning."""
        with np.errstate(over="ignore", invalid="ignore"):
            np.multiply(w, s, out=w)

    def deliver(self, r0: int, r1: int, block: np.ndarray) -> None:
        self.consume(r0, r1, block)
        with self._lock:
            self.covered += r1 - r0


class RowsTimesX(RowSink):
    """A sink computing y^T[r0:r1] = W[r0:r1] @ x^T per block (fp32 BLAS); ``result()`` -> y [M, N] float32."""

    def __init__(self, x32: np.ndarray, n: int):
        """Blocks of ``block_rows`` rows for the weight's row width, THIN_SPLIT times fewer for a thin
        product (M <= THIN_M): a function of (K, M) only, so the cached path (``matmul_rows``) and the
        uncached one (qconform_torch/blocked.py), which both build this sink, use the same blocks."""
        x32 = np.asarray(x32, dtype=np.float32)
        # a fresh [K, M] array: np.ascontiguousarray(x.T) of a [1, K] x keeps the stride K*4 on its unit
        # axis (it is "contiguous" already), and NumPy's matmul then skips BLAS (8 ms instead of 20 us
        # for a 128 x 4096 block)
        self._xt = np.empty((x32.shape[1], x32.shape[0]), np.float32)
        self._xt[...] = x32.T
        self._yt = np.empty((n, x32.shape[0]), np.float32)
        k = x32.shape[1]
        step = block_rows(4 * k * (THIN_SPLIT if x32.shape[0] <= THIN_M else 1), ROW_ALIGN)
        super().__init__((n, k), self._mul, step)

    def _mul(self, r0, r1, w):
        np.matmul(w, self._xt, out=self._yt[r0:r1])

    def result(self) -> np.ndarray:
        if self.covered != self.shape[0]:  # every row exactly once, or the answer is not y
            raise AssertionError(f"row blocks delivered {self.covered} of {self.shape[0]} rows")
        return np.ascontiguousarray(self._yt.T)


def matmul_rows(x32: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w^T (fp32) for a weight w [N, K] in memory, by the same row blocks and BLAS calls as the
    uncached path: the cached fallback (backends/emulator.py)."""
    n, k = w.shape
    sink = RowsTimesX(x32, n)
    with single_threaded_blas():
        for_row_chunks(n, n * k, lambda r0, r1: sink.deliver(r0, r1, w[r0:r1]), step=sink.step)
    return sink.result()
