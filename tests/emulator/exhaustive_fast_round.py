"""Every float32 bit pattern (2**32) through ``round_fast`` to float16 and bfloat16 under RNE and RTZ.

Oracles: RNE is ml_dtypes' bfloat16 cast and NumPy's float16 cast (bit for bit, so -0 != +0); RTZ is that
library result stepped one code toward zero (its uint16 magnitude - 1) where it lies beyond x; NaN patterns
give the quiet NaN with the sign and top payload bits kept (docs/formats.md#floating-point-formats).

Too long for the test suite (about an hour on one loaded core); run by hand, optionally for some of the
combinations: ``PYTHONPATH=. python tests/emulator/exhaustive_fast_round.py [bfloat16:rne float16:rtz ...]``.
Prints progress every 2**29 patterns and the mismatch counts; exits 1 on any mismatch.
"""

from __future__ import annotations

import sys
import time

import ml_dtypes
import numpy as np

from emulator.numerics.fast_round import round_fast

CHUNK = 1 << 24
KEEP = {"float16": np.uint32(0xFFFFE000), "bfloat16": np.uint32(0xFFFF0000)}
ALL = ("bfloat16:rne", "bfloat16:rtz", "float16:rne", "float16:rtz")


def _widen(b16: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (b16.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return b16.view(np.float16).astype(np.float32)


def main(combos) -> int:
    bad = {tuple(c.split(":")): 0 for c in combos}
    t = time.time()
    for i, s in enumerate(range(0, 1 << 32, CHUNK)):
        bits = np.arange(s, s + CHUNK, dtype=np.uint32)
        x = bits.view(np.float32)
        nan = np.isnan(x)
        for dtype in sorted({d for d, _ in bad}):
            with np.errstate(over="ignore", invalid="ignore"):
                rb = x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16).view(np.uint16)
                rne = _widen(rb, dtype)
                beyond = np.abs(rne) > np.abs(x)
            want = {"rne": rne, "rtz": _widen(rb - beyond.astype(np.uint16), dtype)}
            nan_bits = (bits | np.uint32(0x00400000)) & KEEP[dtype]
            for mode in ("rne", "rtz"):
                if (dtype, mode) in bad:
                    got = round_fast(x, dtype, mode).view(np.uint32)
                    ok = np.where(nan, got == nan_bits, got == want[mode].view(np.uint32))
                    bad[(dtype, mode)] += int((~ok).sum())
        if i % 32 == 31:
            print(f"{(i + 1) * CHUNK} float32 patterns, mismatches {bad}, {time.time() - t:.0f} s", flush=True)
    print("done:", ", ".join(f"{d} {m}: {n} mismatches of 2**32" for (d, m), n in bad.items()), flush=True)
    return 1 if any(bad.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ALL))
