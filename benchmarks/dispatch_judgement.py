"""What the dispatcher's per-call activation judgement costs: zentorch's declared quantizer against the canonical
one on a call's activations. "definition": the two quantizations and dequantizations by the definition
(emulator/activations/int8.py), what the judgement ran before; "judgement": emulator/tensor_levels.py
``activation_deviation`` now (the fast quantizer, emulator/activations/int8_fast.py, and the codes-and-scales
bound before any dequantization).

Run: ``python -m benchmarks.dispatch_judgement`` (docs/fallback.md#the-dispatcher). One thread, the process's CPU
time, best of 7; both paths asserted to give the same dequantized activations first.
"""

from __future__ import annotations

import os
import time

import numpy as np

from emulator.activations import int8 as a8
from emulator.activations.int8_fast import dequantize_int8_fast, quantize_int8_fast
from emulator.declaration import Declared
from emulator.schemes import Case
from emulator.tensor_levels import activation_deviation

#: zentorch's declared quantizer (backends/zentorch.py): bf16 dequantization scale, amax clamp 127e-10
ZENTORCH = a8.Int8ActVariant(dequant_scale_dtype="bfloat16", zero_row="eps", eps=127 * 1e-10)


def _by_definition(x):
    return [a8.dequantize_int8_per_token(a8.quantize_int8_per_token(x, v)) for v in (a8.CANONICAL_SYM, ZENTORCH)]


def _fast(x):
    return [dequantize_int8_fast(quantize_int8_fast(x, v)) for v in (a8.CANONICAL_SYM, ZENTORCH)]


def _best(fn, x, n=7) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.process_time()
        fn(x)
        best = min(best, time.process_time() - t0)
    return best


def main() -> None:
    from backends.registry import create

    rng = np.random.default_rng(0)
    for m, k in ((8, 1024), (128, 1024), (128, 2816)):
        x = rng.standard_normal((m, k)).astype(np.float32)
        assert all(np.array_equal(a, b) for a, b in zip(_by_definition(x), _fast(x)))
        case = Case("w8a8", "ct-int-quantized", m, 1024, k, group_size=-1, act_dtype="float32")
        declared: Declared = create("zentorch").declared(case)
        assert activation_deviation(declared, case, x) is None
        d, f = _best(_by_definition, x), _best(lambda x: activation_deviation(declared, case, x), x)
        print(f"M={m:<4d} K={k:<5d} definition {d * 1e3:7.2f} ms  judgement {f * 1e3:6.2f} ms  x{d / f:.0f}  "
              f"(load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
