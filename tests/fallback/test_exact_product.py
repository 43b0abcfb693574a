"""The exact reference's float64 product on torch's threads (qconform_torch/exact_product.py).

Checks: (1) oracle: every element is within ``product_error_factor(K, chunk)`` times sum |x w| of the exact sum
(Python rationals), on rows built to cancel within and across K-chunks, with and without chunks, at block edges;
(2) the A16 reference through it gives the readable definition's outputs bit for bit (``linear_w16``: its float64
GEMM and element bounds; a regression gate of code against code, on random, adversarial and chunked layers);
(3) its self-check refuses a product that accumulates in float32, and the op then takes NumPy's product;
(4) the op's exact reference (``--backend emulator``) runs through it where the check passed.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from emulator.fast_linear_w16 import float64_product, linear_w16_fast, product_error_factor  # noqa: E402
from emulator.linear import linear_w16  # noqa: E402
from qconform_torch import exact_product  # noqa: E402


def _cancelling(rng, M, N, K):
    x = (rng.standard_normal((M, K)) * np.exp2(rng.integers(-20, 21, (M, K)))).astype(np.float32)
    w = (rng.standard_normal((N, K)) * np.exp2(rng.integers(-20, 21, (N, K)))).astype(np.float32)
    h = K // 2
    if h:
        w[:, 1:2 * h:2] = (-(x[0, 0:2 * h:2] * w[:, 0:2 * h:2]) / np.where(x[0, 1:2 * h:2] == 0, 1, x[0, 1:2 * h:2])
                           ).astype(np.float32)
    return x, w


@pytest.mark.parametrize("M,N,K,chunk,block_bytes", [(3, 5, 1, None, 4 << 20), (2, 7, 300, 256, 4 << 20),
                                                     (33, 9, 1030, 256, 8 * 1030 * 4), (4, 6, 513, 128, 8 * 513 * 5)])
def test_every_element_is_within_the_chunked_bound(M, N, K, chunk, block_bytes, monkeypatch):
    """Oracle (rationals): |y - v| <= product_error_factor(K, chunk) * sum_k |x w| for every element, also where the
    weight's rows are split into blocks of 4 and 5 rows (the last one shorter)."""
    monkeypatch.setattr(exact_product, "BLOCK_BYTES", block_bytes)
    x, w = _cancelling(np.random.default_rng(K + M), M, N, K)
    y = exact_product.torch_float64_product(x.astype(np.float64), w, chunk=chunk)
    G = Fraction(product_error_factor(K, chunk))
    for m in range(M):
        for n in range(N):
            terms = [Fraction(float(a)) * Fraction(float(b)) for a, b in zip(x[m], w[n])]
            exact, mag = sum(terms, Fraction(0)), sum((abs(t) for t in terms), Fraction(0))
            assert abs(Fraction(float(y[m, n])) - exact) <= G * mag, (m, n)


def _layers():
    rng = np.random.default_rng(5)
    for M, N, K, bias in ((1, 3, 1, False), (8, 96, 1024, True), (40, 70, 700, True), (64, 96, 1024, False)):
        x = rng.standard_normal((M, K)).astype(np.float32)
        w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
        yield f"random-{M}x{N}x{K}", x, w, ((rng.standard_normal(N) * 0.1).astype(np.float32) if bias else None)
    x, w = _cancelling(rng, 36, 20, 600)
    yield "cancelling-36x600", x, w, None
    h = float(np.nextafter(np.float32(1), np.float32(2))) / 2 - 0.5  # half an ulp at 1: 1 + h is a midpoint
    x = np.ones((33, 4), np.float32)
    w = np.array([[t, 1.0, h, 0.0] for t in (0.0, 2.0 ** -80, -(2.0 ** -80))], np.float32)
    yield "ties-33-rows", x, w, None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name,x,w,bias", list(_layers()), ids=[c[0] for c in _layers()])
def test_the_reference_through_it_is_the_definition(name, x, w, bias, dtype):
    """Regression gate: ``linear_w16_fast`` with torch's product gives the readable ``linear_w16``'s y bit for bit."""
    got = linear_w16_fast(x, w, bias, out_dtype=dtype, product=exact_product.torch_float64_product)
    want = linear_w16(x, w, bias, out_dtype=dtype)
    assert np.array_equal(np.asarray(got.y, np.float64).view(np.uint64), np.asarray(want.y, np.float64).view(np.uint64))


def test_self_check_refuses_float32_accumulation(monkeypatch):
    real = exact_product.torch_float64_product

    def float32_sums(x64, w32, *, chunk=None, out=None):  # a GEMM that rounds its sums to float32
        y = real(x64, w32, chunk=chunk, out=out)
        y[...] = y.astype(np.float32)
        return y

    try:
        exact_product.reset_self_check()
        assert exact_product.self_check() is True  # this host's torch: float64
        assert exact_product.float64_product_for() is exact_product.torch_float64_product
        exact_product.reset_self_check()
        monkeypatch.setattr(exact_product, "torch_float64_product", float32_sums)
        assert exact_product.self_check() is False
        assert exact_product.float64_product_for() is float64_product
    finally:
        monkeypatch.undo()
        exact_product.reset_self_check()


def test_the_op_reference_runs_on_it(synthetic, monkeypatch):
    """The op's exact reference of an A16 layer calls torch's product (where the check passed), and its output is
    ``qconform linear``'s."""
    from emulator.checkpoint import Checkpoint
    from emulator.layers import linear_layer
    from qconform_torch.exact_blocks import exact_by_rows

    calls = []
    real = exact_product.torch_float64_product

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(exact_product, "torch_float64_product", counted)
    ck = Checkpoint(synthetic / "ct-w4a16-g32-asym")
    info = ck.layers()[0]
    x = np.random.default_rng(2).standard_normal((40, info.shape[-1])).astype(np.float32)
    y, _ = exact_by_rows(ck, info, x, "float32", 256 << 20)
    assert calls
    want = linear_layer(ck, info, x, out_dtype="float32").y
    assert np.array_equal(np.asarray(y, np.float64).view(np.uint64), np.asarray(want, np.float64).view(np.uint64))
