"""The acceptance interval covers fp32 products that underflow into the subnormal range.

Finding: docs/findings.md#interval-underflow (property tier, M=1 N=1 K=27, fp32 weight scales near
2**-140). The oracle here is independent of qconform's arithmetic: a kernel that forms each product
x_k * w_k in float32 and sums them in float32 in some order, written with NumPy's float32 scalars.
"""

import numpy as np
import pytest

from backends.registry import create
from conformance.judge.acceptance import UNDERFLOW_UNIT, declared_interval
from conformance.cases.inputs import CaseInputs
from emulator.schemes import Case


def _inputs(scale_exp: int, seed: int, K: int = 27) -> CaseInputs:
    rng = np.random.default_rng(seed)
    case = Case("w8a16", "ct-int-quantized", M=1, N=1, K=K, group_size=-1, act_dtype="float32",
                scale_dtype="float32")
    q = rng.integers(-127, 128, (1, K)).astype(np.int8)
    # full-mantissa fp32 activations: every product needs bits below the smallest subnormal
    x = rng.uniform(1.0, 2.0, (1, K)).astype(np.float32) * rng.choice([-1, 1], (1, K)).astype(np.float32)
    scale = np.full((1, 1), 2.0 ** scale_exp, np.float32)
    return CaseInputs(case=case, seed=seed, tensors={"weight": q, "weight_scale": scale}, x=x)


def _fp32_kernel(inp: CaseInputs, order) -> np.float32:
    """A correct fp32 kernel: w = q * s in fp32 (exact here: s is a power of two), then fp32 products
    summed in fp32 in the given order."""
    w = inp.tensors["weight"][0].astype(np.float32) * inp.tensors["weight_scale"][0, 0]
    acc = np.float32(0)
    for k in order:
        acc = np.float32(acc + np.float32(inp.x[0, k] * w[k]))
    return acc


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("scale_exp", [-149 + 8, -140, -133])
def test_underflowing_fp32_products_are_inside_the_interval(seed, scale_exp):
    inp = _inputs(scale_exp, seed)
    d = create("emulator").declared(inp.case)
    assert d.accumulate == "float32"
    iv = declared_interval(inp, d)
    K = inp.case.K
    for order in (range(K), range(K - 1, -1, -1), np.random.default_rng(seed).permutation(K)):
        y = _fp32_kernel(inp, order)
        assert iv.lo[0, 0] <= y <= iv.hi[0, 0], (seed, scale_exp, float(y), float(iv.lo[0, 0]), float(iv.hi[0, 0]))


def test_the_underflow_term_is_small():
    """The added term is about K+1 half-subnormals, not a blanket widening: the interval spans a few
    dozen subnormal steps here, and an output 200 steps from the exact value stays outside."""
    step = 2.0 ** -149
    inp = _inputs(-140, 0)
    iv = declared_interval(inp, create("emulator").declared(inp.case))
    assert (float(iv.hi[0, 0]) - float(iv.lo[0, 0])) / step < 100
    far = np.float32(iv.y_exact[0, 0] + 200 * step)
    assert not (iv.lo[0, 0] <= far <= iv.hi[0, 0])
    assert UNDERFLOW_UNIT["float32"] == step / 2
