"""Both W4A8 products are declarable (docs/formats/activations.md#w4a8-int4-weights-int8-dynamic-activations,
issue 21 item 5).

Each kernel is torch code written from one sentence of the docs, not from the emulator: per-token int8
activations as docs/formats/activations.md#canonical-symmetric says, weights unpacked by
docs/formats/compressed_tensors.md (int4 fields, low nibble first along K, symmetric: code - 8), then

- ``group_int`` (canonical): exact integer group sums ``acc_g``, ``y = sx * sum_g sw * acc_g`` (float64);
- ``float32_weights``: the weights dequantized to float32 first, ``fl32((q - z) * sw)``, times the
  dequantized activations (float64).

With float32 scales the two differ by the weight rounding: each kernel passes under its own value and fails
under the other's. With float16 scales ``(q - z) * sw`` is exact in float32 and both values accept both.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backends.base import Case, Declared
from conformance.judge.acceptance import compare, declared_interval
from conformance.cases.inputs import make_inputs
from conformance.run.runner import rounded_interval

PRODUCTS = ("group_int", "float32_weights")


def _codes_and_scales(inp):
    """(q - z) int64 [N, K] and scales float64 [N, G] of a symmetric compressed-tensors pack-quantized int4
    checkpoint: eight 4-bit fields per int32 word, field i at bits [4i, 4i + 4), stored as code + 8."""
    t = inp.tensors
    words = torch.from_numpy(np.asarray(t["weight_packed"]).astype(np.int64)) & 0xFFFFFFFF
    fields = torch.stack([(words >> (4 * i)) & 0xF for i in range(8)], dim=2)  # [N, K/8, 8]
    q = fields.reshape(words.shape[0], -1) - 8
    return q, torch.from_numpy(np.asarray(t["weight_scale"]).astype(np.float64))


def _int8_per_token(x):
    """Canonical symmetric: sx = fl32(amax / 127), qx = sat(RNE(fl32(x / sx))); a zero row has codes 0."""
    x32 = torch.from_numpy(np.asarray(x, np.float32))
    amax = x32.abs().amax(dim=1, keepdim=True)
    sx = amax / torch.tensor(127.0, dtype=torch.float32)
    qx = torch.where(amax == 0, torch.zeros_like(x32), torch.round(x32 / sx)).clamp(-128, 127)  # round: RNE
    return qx.to(torch.int64), sx.to(torch.float64)


def group_int(inp):
    """'acc_g = sum_{k in g} qx * (q - z) exact integer per group; y = sx * sum_g sw * acc_g'."""
    q, s = _codes_and_scales(inp)
    qx, sx = _int8_per_token(inp.x)
    G = inp.case.group
    y = torch.zeros(qx.shape[0], q.shape[0], dtype=torch.float64)
    for g in range(q.shape[1] // G):
        acc = qx[:, g * G:(g + 1) * G] @ q[:, g * G:(g + 1) * G].T  # int64: exact
        y += acc.to(torch.float64) * s[:, g][None, :]
    return (y * sx).to(torch.float32).numpy()


def float32_weights(inp):
    """'the weights dequantized to float32 first, fl32((q - z) * sw), then the product'."""
    q, s = _codes_and_scales(inp)
    qx, sx = _int8_per_token(inp.x)
    G = inp.case.group
    w = q.to(torch.float32) * s.to(torch.float32).repeat_interleave(G, dim=1)  # one float32 rounding each
    return ((qx.to(torch.float64) * sx) @ w.to(torch.float64).T).to(torch.float32).numpy()


KERNELS = {"group_int": group_int, "float32_weights": float32_weights}


def _declared(product):
    return Declared(variants={"w4a8_product": product}, weight_dtype="exact", accumulate="float64",
                    output="float32")


def _ok(inp, y, product) -> bool:
    d = _declared(product)
    return compare(y, rounded_interval(declared_interval(inp, d), d)).ok


def w4a8_inputs(scale_dtype, seed=0):
    case = Case("w4a8", "ct-pack-quantized", 8, 64, 256, group_size=32, sym=True, act_dtype="float32",
                out_dtype="float32", scale_dtype=scale_dtype)
    return make_inputs(case, seed)


@pytest.mark.parametrize("right", PRODUCTS)
def test_each_product_passes_with_its_value_and_fails_with_the_other(right):
    inp = w4a8_inputs("float32")
    y = KERNELS[right](inp)
    other = next(p for p in PRODUCTS if p != right)
    assert not np.array_equal(y, KERNELS[other](inp)), "the fixture must separate the two products"
    assert _ok(inp, y, right)
    assert not _ok(inp, y, other)


def test_canonical_declaration_is_group_int():
    """A kernel declaring nothing is judged by the docs' formula (group_int), not by float32 weights."""
    inp = w4a8_inputs("float32")
    d = Declared(variants={}, weight_dtype="exact", accumulate="float64", output="float32")
    iv = rounded_interval(declared_interval(inp, d), d)
    assert compare(group_int(inp), iv).ok
    assert not compare(float32_weights(inp), iv).ok


def test_float16_scales_make_the_products_coincide():
    """(q - z) * sw with a float16 scale has at most 4 + 11 significant bits: exact in float32."""
    inp = w4a8_inputs("float16")
    for name, kernel in KERNELS.items():
        y = kernel(inp)
        assert all(_ok(inp, y, p) for p in PRODUCTS), name
