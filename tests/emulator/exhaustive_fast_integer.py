"""Every float32 bit pattern (2**32) through ``round_to_integer_fast`` in every mode, against the definition.

Oracle: ``rounding.round_to_integer`` (bit for bit, -0 != +0, NaN == NaN). Too long for the test suite (the
definition runs ~175 ns a value here: about 50 minutes for the four modes on one core); run by hand, optionally
for some modes: ``PYTHONPATH=. python tests/emulator/exhaustive_fast_integer.py [rne rhaz rtz rhtz]``. Prints
progress every 2**29 patterns and the mismatch counts; exits 1 on any mismatch.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from emulator.numerics.fast_integer import round_to_integer_fast
from emulator.numerics.rounding import round_to_integer

CHUNK = 1 << 24


def main(modes) -> int:
    bad = dict.fromkeys(modes, 0)
    t = time.time()
    for i, s in enumerate(range(0, 1 << 32, CHUNK)):
        x = np.arange(s, s + CHUNK, dtype=np.uint64).astype(np.uint32).view(np.float32)
        for mode in modes:
            with np.errstate(invalid="ignore"):
                want = round_to_integer(x, mode)
                got = round_to_integer_fast(x, mode).astype(np.float64)
            same = (want.view(np.uint64) == got.view(np.uint64)) | (np.isnan(want) & np.isnan(got))
            bad[mode] += int((~same).sum())
        if (i + 1) % 32 == 0:
            print(f"{(i + 1) * CHUNK:#x} patterns, {time.time() - t:.0f} s, mismatches {bad}", flush=True)
    print(f"done: mismatches {bad}")
    return 1 if any(bad.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["rne", "rhaz", "rtz", "rhtz"]))
