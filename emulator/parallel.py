"""Row-chunked evaluation of elementwise steps on all cores (speed only; results are identical).

NumPy ufuncs release the GIL, so independent row blocks of an elementwise computation run in
parallel threads, each block small enough for its temporaries to stay in cache. Used only for
large arrays (below ``MIN_ELEMENTS`` the plain call is faster); every caller's result equals
the single-call result element for element, because the steps are elementwise.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

MIN_ELEMENTS = 1 << 20
ROWS_PER_CHUNK = 256
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1), thread_name_prefix="qconform-rows")
    return _POOL


def for_row_chunks(n_rows: int, n_elements: int, fn) -> None:
    """Call ``fn(r0, r1)`` over [0, n_rows) in row blocks, in parallel for large work."""
    if n_elements < MIN_ELEMENTS or (os.cpu_count() or 1) == 1:
        fn(0, n_rows)
        return
    starts = range(0, n_rows, ROWS_PER_CHUNK)
    list(_pool().map(lambda r0: fn(r0, min(n_rows, r0 + ROWS_PER_CHUNK)), starts))
