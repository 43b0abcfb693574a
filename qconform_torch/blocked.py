"""The emulator backend's fast path without a full fp32 weight.

Semantics: docs/fallback.md#memory; speed: docs/performance.md#fallback.

``fused_fast_linear`` (GPTQ, AWQ, compressed-tensors pack-quantized, MXFP4): the emulator's own
dequantizer streams cache-sized row blocks (2 MiB of fp32 a block, 512 KiB for M <= 8; one buffer per thread) into a
``RowsTimesX`` sink, which multiplies each block into its rows of y^T (one fp32 BLAS call) while it is in
cache (emulator/formats/fast_matmul.py). The emulator backend's cached path multiplies the same row
blocks of the weight it keeps, so the two return the same bits (tests/fallback/test_fused_fallback.py).
The sink here (``TorchScaledRowsTimesX``) runs the integer formats' scale step, ``w *= s`` per group,
with torch's vectorised float32 multiply: NumPy's costs ~2x as much when s is broadcast over 128-element
groups (a loop call per group); both are the IEEE float32 product, element by element
(tests/fallback/test_torch_scale.py checks the bits, special values included).

``blocked_fast_linear`` (what the op calls for a layer over its cache budget) takes the fused path, and
for a format it does not stream, blocks of output rows sliced from the packed tensors (every format stores
output rows along one axis, packed ``F`` to a word along N for some tensors), each dequantized into a
buffer of max(budget, 16 MiB) and multiplied; a block's weight equals the same rows of the whole layer's
(tested), the products are the declared fp32 accumulation. Layouts it does not slice (asymmetric
compressed-tensors zero points, act-order ct, N not a multiple of the packing) return None: the caller
then runs the whole-layer path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

import numpy as np
import torch

from emulator.declaration import declared_weight
from emulator.formats.fast_matmul import RowsTimesX
from emulator.parallel import single_threaded_blas
from emulator.numerics.fast_round import round_fast

__all__ = ["row_slicer", "blocked_fast_linear", "fused_fast_linear", "MIN_BLOCK_BYTES", "FUSED_FORMATS",
           "TorchScaledRowsTimesX", "one_torch_thread"]

#: the smallest block of fp32 weight rows on the sliced path (a transient working buffer, not a cache):
#: there, each block is dequantized on all cores and then multiplied by a multi-threaded sgemm, and many
#: small blocks measured several times slower on the 2-core host than 16 MiB ones
MIN_BLOCK_BYTES = 16 << 20


def row_slicer(case, tensors: dict):
    """(rows a block must be a multiple of, slice(n0, n1) -> tensors of rows n0:n1), or None."""
    fmt = case.weight_format
    if fmt == "gptq":
        pf = 32 // case.bits

        def s(n0, n1):
            t = dict(tensors)
            t["qweight"] = tensors["qweight"][:, n0:n1]
            t["qzeros"] = tensors["qzeros"][:, n0 // pf:n1 // pf]
            t["scales"] = tensors["scales"][:, n0:n1]
            return t
        return (pf, s) if case.N % pf == 0 else None
    if fmt == "awq":
        def s(n0, n1):
            return {**tensors, "qweight": tensors["qweight"][:, n0 // 8:n1 // 8],
                    "qzeros": tensors["qzeros"][:, n0 // 8:n1 // 8], "scales": tensors["scales"][:, n0:n1]}
        return (8, s) if case.N % 8 == 0 else None
    if fmt == "ct-pack-quantized":
        if tensors.get("weight_zero_point") is not None:
            return None

        def s(n0, n1):
            return {**tensors, "weight_packed": tensors["weight_packed"][n0:n1],
                    "weight_scale": tensors["weight_scale"][n0:n1],
                    "weight_shape": np.asarray([n1 - n0, case.K], np.asarray(tensors["weight_shape"]).dtype)}
        return (1, s)
    if fmt == "ct-mxfp4":
        def s(n0, n1):
            return {**tensors, "weight_packed": tensors["weight_packed"][n0:n1],
                    "weight_scale": tensors["weight_scale"][n0:n1]}
        return (1, s)
    return None


def blocked_fast_linear(backend, case, tensors: dict, x32: np.ndarray, bias, budget_bytes: int):
    """y (float32 holding values of the case's output dtype) by row blocks of max(``budget_bytes``,
    MIN_BLOCK_BYTES) of fp32 weight; None where the layout is not sliced here."""
    y = fused_fast_linear(backend, case, tensors, x32, bias)  # cache-sized blocks straight into BLAS
    if y is not None:
        return y
    sl = row_slicer(case, tensors)
    if sl is None:
        return None
    mult, take = sl
    rows = max(mult, (max(budget_bytes, MIN_BLOCK_BYTES) // (4 * case.K)) // mult * mult)
    rows = min(rows, case.N)
    decl = backend.computed(case)
    buf = np.empty((rows, case.K), np.float32)
    # y^T by row blocks: each block's output is a contiguous slice (NumPy's matmul leaves BLAS for a
    # strided ``out``, e.g. a column block of y)
    xt = np.ascontiguousarray(x32.T)
    yt = np.empty((case.N, x32.shape[0]), np.float32)
    for n0 in range(0, case.N, rows):
        n1 = min(case.N, n0 + rows)
        sub = dataclasses.replace(case, N=n1 - n0)
        w = declared_weight(sub, take(n0, n1), decl, out=buf[:n1 - n0])
        np.matmul(w, xt, out=yt[n0:n1])
    y = np.ascontiguousarray(yt.T)
    if bias is not None:
        y += np.asarray(bias, np.float32)
    return round_fast(y, case.output_dtype)


#: formats whose fast dequantizer streams row blocks into a ``RowSink`` (emulator/formats/fast_dequant.py)
FUSED_FORMATS = ("gptq", "awq", "ct-pack-quantized", "ct-mxfp4")


class TorchScaledRowsTimesX(RowsTimesX):
    """``RowsTimesX`` whose scale step (``RowSink.scale``: ``w *= s``, float32, s broadcast) is torch's
    multiply, run on the calling worker thread (``one_torch_thread``). Elementwise IEEE float32 products
    either way, so the bits are NumPy's (tests/fallback/test_torch_scale.py); torch's loop handles the
    broadcast scale without a call per group. Arrays torch cannot wrap without a copy or a warning
    (read-only, negative strides) take NumPy's multiply."""

    def scale(self, w: np.ndarray, s: np.ndarray) -> None:
        if not (w.flags.writeable and s.flags.writeable and w.dtype is _F32 and s.dtype is _F32
                and min(w.strides + s.strides, default=0) >= 0):
            super().scale(w, s)
            return
        _worker_single_thread()
        t = torch.from_numpy(w)
        torch.mul(t, torch.from_numpy(s), out=t)


_TORCH_LOCK = threading.Lock()
_F32 = np.dtype(np.float32)


def _worker_single_thread() -> None:
    # torch's intra-op thread count is an OpenMP setting, which a thread may hold for itself: the row-block
    # workers each run their own blocks, so each makes sure its torch calls run on one thread
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@contextlib.contextmanager
def one_torch_thread():
    """Within the block torch runs each op on its calling thread; the caller's thread count is restored."""
    with _TORCH_LOCK:
        saved = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            yield
        finally:
            torch.set_num_threads(saved)


def fused_fast_linear(backend, case, tensors: dict, x32: np.ndarray, bias):
    """y without any fp32 weight beyond one cache-sized block per thread, or None where the format is
    not streamed: each row block is dequantized and multiplied into its rows of y^T by the worker thread
    that formed it, while it is in cache (emulator/formats/fast_matmul.py). Equal bit for bit to the
    emulator backend's cached path, which multiplies the same row blocks of its kept fp32 weight."""
    decl = backend.computed(case)
    if case.weight_format not in FUSED_FORMATS or (case.weight_format == "ct-mxfp4" and decl.weight_dtype != "exact"):
        return None
    sink = TorchScaledRowsTimesX(x32, case.N)
    with single_threaded_blas(), one_torch_thread():  # each worker thread runs its own blocks' BLAS and torch calls
        got = declared_weight(case, tensors, decl, out=sink)
    if got is not sink:
        raise AssertionError(f"fused fallback: the dequantizer of {case.describe()} did not stream its rows")
    y = sink.result()
    if bias is not None:
        y += np.asarray(bias, np.float32)
    return round_fast(y, case.output_dtype)
