"""Every float32 bit pattern (2**32) through ``round_fast`` to float16 and bfloat16 under RNE and RTZ,
against the hand-derived grid rule of test_fast_round.py (``grid_oracle``) and, for RNE, ml_dtypes' bfloat16
and NumPy's float16 casts; NaN patterns against the NaN rule (quiet, sign and top payload kept).

Too long for the test suite (about 4 * 2**32 elements); run by hand:
``PYTHONPATH=. python tests/emulator/exhaustive_fast_round.py [processes] [dtype...]``. Prints one line per
(dtype, mode) with the number of patterns checked and of mismatches, and exits 1 on any mismatch.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from test_fast_round import grid_oracle  # noqa: E402

from emulator.numerics.fast_round import round_fast  # noqa: E402

CHUNK = 1 << 24
KEEP = {"float16": 0xFFFFE000, "bfloat16": 0xFFFF0000}


def _check(args) -> tuple:
    start, dtype, mode = args
    bits = np.arange(start, start + CHUNK, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    got = round_fast(x, dtype, mode)
    nan = np.isnan(x)
    bad = 0
    fin = ~nan
    want = grid_oracle(x[fin].astype(np.float64), dtype, mode)
    g = got[fin].astype(np.float64)
    bad += int((~((g == want) & (np.signbit(g) == np.signbit(want)))).sum())
    if mode == "rne":
        with np.errstate(over="ignore", invalid="ignore"):
            lib = (x[fin].astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else x[fin].astype(np.float16))
        lib = lib.astype(np.float64)
        bad += int((~((g == lib) & (np.signbit(g) == np.signbit(lib)))).sum())
    nan_want = (bits[nan] | np.uint32(0x00400000)) & np.uint32(KEEP[dtype])
    bad += int((got[nan].view(np.uint32) != nan_want).sum())
    return int(CHUNK), bad


def main() -> int:
    procs = int(sys.argv[1]) if len(sys.argv) > 1 else os.cpu_count()
    dtypes = sys.argv[2:] or ["bfloat16", "float16"]
    failed = False
    with mp.Pool(procs) as pool:
        for dtype in dtypes:
            for mode in ("rne", "rtz"):
                res = pool.map(_check, [(s, dtype, mode) for s in range(0, 1 << 32, CHUNK)])
                n, bad = sum(r[0] for r in res), sum(r[1] for r in res)
                print(f"{dtype} {mode}: {n} float32 patterns, {bad} mismatches", flush=True)
                failed |= bad != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
