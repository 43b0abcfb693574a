"""The emulator backend's fast path: one cached dequantized layer, whose buffer the next layer reuses.

Oracles: a fresh backend (nothing cached), the independent dequantizer of conformance/judge/oracles.py
(shift-and-mask loops, not the emulator's packers) and the declared acceptance interval around the
exact result (conformance.judge.acceptance).
"""

import numpy as np
import pytest

from backends.base import Case
from backends.registry import create
from conformance.judge.acceptance import compare, declared_interval
from conformance.cases.inputs import CaseInputs, weight_tensors
from conformance.judge.oracles import independent_weight
from emulator.numerics.fast_round import round_fast


def _layer(case: Case, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return weight_tensors(case, (rng.standard_normal((case.N, case.K)) * 0.05).astype(np.float16), seed)


@pytest.mark.parametrize("fmt,extra", [("gptq", {"zero_convention": "v2"}), ("awq", {}), ("ct-pack-quantized", {})])
def test_next_layer_reuses_the_buffer_and_never_sees_stale_values(fmt, extra):
    case = Case("w4a16", fmt, 3, 64, 256, group_size=32, sym=False, **extra)
    layers = [_layer(case, s) for s in (1, 2)]
    x = np.random.default_rng(9).standard_normal((3, 256)).astype(np.float32)
    b = create("emulator")
    outs, bufs = [], []
    for t in (layers[0], layers[1], layers[0]):
        outs.append(b.run(b.prepare(case, t), x))
        cached = list(b._cache.values())
        assert len(cached) == 1  # at most one dequantized copy is held
        bufs.append(cached[0])
    assert bufs[1] is bufs[0] and bufs[2] is bufs[0]  # same-shape layers write into the held buffer
    for t, y in zip((layers[0], layers[1], layers[0]), outs):
        fresh = create("emulator")  # nothing cached: a fresh dequantization into a new array
        assert np.array_equal(y, fresh.run(fresh.prepare(case, t), x))
        # the held buffer is the exact weight: a float32 GEMM on the independently dequantized
        # weights, rounded (RNE) once to the output dtype, gives the same bits
        w = independent_weight(case, t).astype(np.float32)
        assert np.array_equal(y, round_fast(x @ w.T, case.output_dtype))
        assert compare(y, declared_interval(CaseInputs(case, 0, t, x, None), b.declared(case))).ok
    assert not np.array_equal(outs[0], outs[1])


def test_a_layer_of_another_shape_gets_its_own_buffer():
    b = create("emulator")
    small = Case("w4a16", "gptq", 2, 64, 256, group_size=32, sym=True)
    big = Case("w4a16", "gptq", 2, 128, 256, group_size=32, sym=True)
    x = np.ones((2, 256), np.float32)
    b.run(b.prepare(small, _layer(small, 1)), x)
    first = next(iter(b._cache.values()))
    y = b.run(b.prepare(big, _layer(big, 2)), x)
    second = next(iter(b._cache.values()))
    assert second is not first and second.shape == (128, 256) and y.shape == (2, 128)
