"""Row-blocked evaluation of elementwise steps on all cores (speed only; results are identical).

NumPy ufuncs release the GIL, so independent row blocks of an elementwise computation run in
parallel threads. Rows are split into one contiguous span per thread, and each thread walks
its span in *cache-sized blocks*: a block's temporaries (unpacked codes, differences, the
float32 output rows while they are scaled) stay in the core's L2 cache, so a fused
"unpack, subtract, cast, scale" sequence reads and writes main memory about once instead of
once per step. Used only for large arrays (below ``MIN_ELEMENTS`` the plain call is faster);
every caller's result equals the single-call result element for element, because the steps
are elementwise along rows.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .numerics.fpu_state import require_gradual_underflow

MIN_ELEMENTS = 1 << 20
#: Bytes of float32 output a block aims at. Smaller blocks fit L2 (1-2 MiB a core) but each
#: block costs ~20 NumPy calls of Python overhead taken under the GIL, which the threads then
#: wait for; 2 MiB blocks (held in L3) measured fastest on the 2-core Zen 5 host
#: (docs/performance.md).
BLOCK_BYTES = 2 * 1024 * 1024
ROWS_PER_CHUNK = 256  # block height when the caller gives no row width
_POOL: ThreadPoolExecutor | None = None
_IN_WORKER = threading.local()  # a block that itself calls for_row_chunks runs that call serially


def row_threads() -> int:
    """Threads ``for_row_chunks`` spreads row blocks over: the CPUs this process may run on (tests and
    benchmarks replace it to force a count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=row_threads(), thread_name_prefix="qconform-rows")
    return _POOL


def block_rows(row_bytes: int, align: int = 1) -> int:
    """Rows per cache-sized block for rows of ``row_bytes`` output bytes (a multiple of ``align``)."""
    rows = max(1, BLOCK_BYTES // max(1, row_bytes))
    return max(align, rows // align * align)


def for_row_chunks(n_rows: int, n_elements: int, fn, *, row_bytes: int | None = None, align: int = 1,
                   step: int | None = None) -> None:
    """Call ``fn(r0, r1)`` over [0, n_rows) in row blocks, in parallel for large work.

    ``row_bytes`` (the output bytes of one row) sizes the blocks to the cache; ``align``
    makes every block boundary but the last a multiple of it (for layouts that pack rows);
    ``step`` (a multiple of ``align``) fixes the block height instead. Blocks start at multiples of
    the step whatever the number of threads.
    """
    if step is None:
        step = block_rows(row_bytes, align) if row_bytes else max(align, ROWS_PER_CHUNK // align * align)
    threads = row_threads()
    if n_elements < MIN_ELEMENTS or threads == 1 or n_rows <= step or getattr(_IN_WORKER, "on", False):
        for r0 in range(0, n_rows, step):
            fn(r0, min(n_rows, r0 + step))
        return
    # one contiguous span per thread (whole blocks), each walked block by block
    n_blocks = -(-n_rows // step)
    per = -(-n_blocks // threads)
    spans = [(b * step, min(n_rows, (b + per) * step)) for b in range(0, n_blocks, per)]

    def walk(span):
        require_gradual_underflow()  # a worker thread created while the caller flushed subnormals inherits it
        _IN_WORKER.on = True
        try:
            for r0 in range(span[0], span[1], step):
                fn(r0, min(span[1], r0 + step))
        finally:
            _IN_WORKER.on = False

    list(_pool().map(walk, spans))


# --- BLAS threads while row blocks call BLAS themselves -------------------------------------------
#
# A fused consumer (qconform_torch/blocked.py) multiplies each dequantized block inside the worker
# thread that formed it. OpenBLAS would then start its own threads for every block's sgemv while the
# other worker needs the core, and its idle threads spin for a while after each call: on a 2-core host
# that measured slower than one BLAS thread per worker. Speed only: OpenBLAS splits a GEMM / GEMV
# between threads by output rows and columns, never along K (the summed axis), so each output element
# is the same sum either way (the fused path is tested equal to the cached one bit for bit).

_BLAS_LOCK = threading.Lock()
_BLAS_DEPTH = 0
_BLAS_SAVED = None
_BLAS_FNS = None


def _blas_thread_fns():
    """(get, set) of the OpenBLAS bundled with NumPy's wheel, or None (another BLAS, another platform)."""
    global _BLAS_FNS
    if _BLAS_FNS is None:
        fns = ()
        root = os.path.dirname(os.path.dirname(np.__file__))
        for path in sorted(glob.glob(os.path.join(root, "numpy.libs", "libscipy_openblas*.so*"))):
            try:
                lib = ctypes.CDLL(path)
                get, put = lib.scipy_openblas_get_num_threads64_, lib.scipy_openblas_set_num_threads64_
            except (OSError, AttributeError):
                continue
            get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
            fns = (get, put)
            break
        _BLAS_FNS = fns
    return _BLAS_FNS or None


def blas_threads() -> int | None:
    """The thread count NumPy's bundled OpenBLAS would use now (None where unknown: another BLAS or platform)."""
    fns = _blas_thread_fns()
    return None if fns is None else int(fns[0]())


@contextlib.contextmanager
def single_threaded_blas():
    """Within the block: NumPy's OpenBLAS runs each call on the calling thread (no-op where unknown)."""
    global _BLAS_DEPTH, _BLAS_SAVED
    fns = _blas_thread_fns() if row_threads() > 1 else None
    if fns is None:
        yield
        return
    with _BLAS_LOCK:
        if _BLAS_DEPTH == 0:
            _BLAS_SAVED = fns[0]()
            fns[1](1)
        _BLAS_DEPTH += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _BLAS_DEPTH -= 1
            if _BLAS_DEPTH == 0:
                fns[1](_BLAS_SAVED)


class Scratch:
    """Named buffers one thread reuses from row block to row block (speed only). A fresh NumPy temporary above
    glibc's mmap threshold comes back as new pages, and a block's few hundred KiB of temporaries then cost more in
    page faults than in arithmetic (measured ~2x a cell test's time on the 2-core EPYC host); a block's steps write
    into these instead. ``take(name, shape, dtype)`` returns a view of ``name``'s buffer (grown when too small):
    valid until the next ``take`` of that name, by this thread only."""

    def __init__(self):
        self._bufs: dict[str, np.ndarray] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        n = int(np.prod(shape))
        buf = self._bufs.get(name)
        if buf is None or buf.dtype != dtype or buf.size < n:
            buf = self._bufs[name] = np.empty(n, dtype=dtype)
        return buf[:n].reshape(shape)


def fresh(name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
    """``Scratch.take``'s signature without reuse: a new array."""
    return np.empty(shape, dtype=dtype)
