"""What the dispatcher's per-call activation judgement costs (emulator/tensor_levels.py ``activation_deviation``):
the two int8 quantizations of a call's activations by the definition (emulator/activations/int8.py) and by the
fast quantizer (emulator/activations/int8_fast.py), zentorch's declared variant against the canonical one.

Run: ``python -m benchmarks.dispatch_judgement`` (docs/fallback.md#the-dispatcher). One thread, the process's CPU
time, best of 7; both paths asserted to give the same dequantized activations first.
"""

from __future__ import annotations

import os
import time

import numpy as np

from emulator.activations import int8 as a8
from emulator.activations.int8_fast import dequantize_int8_fast, quantize_int8_fast

#: zentorch's declared quantizer (backends/zentorch.py): bf16 dequantization scale, amax clamp 127e-10
ZENTORCH = a8.Int8ActVariant(dequant_scale_dtype="bfloat16", zero_row="eps", eps=127 * 1e-10)


def _by_definition(x):
    return [a8.dequantize_int8_per_token(a8.quantize_int8_per_token(x, v)) for v in (a8.CANONICAL_SYM, ZENTORCH)]


def _fast(x):
    return [dequantize_int8_fast(quantize_int8_fast(x, v, with_tie=False)) for v in (a8.CANONICAL_SYM, ZENTORCH)]


def _best(fn, x, n=7) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.process_time()
        fn(x)
        best = min(best, time.process_time() - t0)
    return best


def main() -> None:
    rng = np.random.default_rng(0)
    for m, k in ((8, 1024), (128, 1024), (128, 2816)):
        x = rng.standard_normal((m, k)).astype(np.float32)
        assert all(np.array_equal(a, b) for a, b in zip(_by_definition(x), _fast(x)))
        d, f = _best(_by_definition, x), _best(_fast, x)
        print(f"M={m:<4d} K={k:<5d} definition {d * 1e3:7.2f} ms  fast {f * 1e3:6.2f} ms  x{d / f:.1f}  "
              f"(load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
