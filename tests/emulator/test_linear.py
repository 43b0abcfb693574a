"""Reference linear layers: exactness claims checked with exact rational arithmetic.

The oracle is Python's fractions.Fraction (exact), independent of the float64
evaluation in emulator/linear.py; rounding to the output dtype is checked
with numpy's own float64 -> float16/float32 casts, which are correctly rounded.
"""

from fractions import Fraction

import numpy as np
import pytest

from emulator.activations.int8 import CANONICAL_ASYM, Int8ActVariant
from emulator.formats.mxfp4 import MxVariant, quantize_mxfp4
from emulator.linear import (
    exact_in_float64, gamma, linear_mxfp4_w4a4, linear_w4a8, linear_w8a8, linear_w16, lowest_bit_exponent, round_output,
)
from emulator.numerics.rounding import Rounding


def fr(a):
    return np.vectorize(Fraction, otypes=[object])(np.asarray(a, dtype=np.float64))


def exact_matmul(a, b):
    A, B = fr(a), fr(b)
    return np.array([[sum(A[m, k] * B[n, k] for k in range(A.shape[1])) for n in range(B.shape[0])]
                     for m in range(A.shape[0])], dtype=object)


def test_w16_fp32_inputs_error_within_bound():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 48)) * np.exp(rng.uniform(-20, 20, (3, 48)))).astype(np.float32)
    w = (rng.standard_normal((5, 48)) * np.exp(rng.uniform(-20, 20, (5, 48)))).astype(np.float32)
    r = linear_w16(x, w, out_dtype="float32")
    ex = exact_matmul(x, w)
    err = np.array([[abs(Fraction(float(r.y_exact[m, n])) - ex[m, n]) for n in range(5)] for m in range(3)], dtype=object)
    assert all(err[m, n] <= Fraction(float(r.y_bound[m, n])) for m in range(3) for n in range(5))
    # Non-ambiguous outputs equal the exact value rounded once (numpy casts from float64 are correctly rounded
    # when the float64 value is the exact value; check only where the float64 sum was exact or unambiguous).
    amb = r.y_ambiguous
    assert np.array_equal(r.y[~amb], r.y_exact[~amb].astype(np.float32).astype(np.float64))


def test_w16_fp16_inputs_are_exact_and_proved_so():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 64)).astype(np.float16)
    w = (rng.integers(-8, 8, (6, 64)) * np.float16(0.0137)).astype(np.float32)  # (q - z) * fp16 scale
    b = rng.standard_normal(6).astype(np.float16)
    r = linear_w16(x, w, b)
    assert not r.y_bound.any(), "fp16 x times int4-scaled weights is exact in float64 and must be proved exact"
    ex = exact_matmul(x, w) + fr(b)[None, :]
    assert all(Fraction(float(r.y_exact[m, n])) == ex[m, n] for m in range(4) for n in range(6))
    assert r.y.dtype == np.float64 and r.out_dtype == "float16"
    np.testing.assert_array_equal(r.y, r.y_exact.astype(np.float16).astype(np.float64))


def test_lowest_bit_exponent_and_exactness_proof():
    v = np.array([1.0, 0.75, 3 * 2.0 ** -30, 0.0, np.inf, -6.0])
    np.testing.assert_array_equal(lowest_bit_exponent(v), [0, -2, -30, np.inf, np.inf, 1])
    a = np.array([[2.0 ** 60, 1.0]])
    b = np.array([[1.0, 1.0]])
    mag = np.abs(a) @ np.abs(b).T
    assert not exact_in_float64(a, b, mag)[0, 0]  # 2**60 + 1 is not representable
    assert exact_in_float64(np.array([[2.0, 1.0]]), b, np.array([[3.0]]))[0, 0]


def test_ambiguous_when_bound_straddles_a_tie():
    y = np.array([[1.0 + 2.0 ** -11]])  # exact fp16 midpoint between 1 and 1 + 2**-10
    y_r, amb = round_output(y, np.array([[2.0 ** -40]]), "float16")
    assert amb[0, 0]
    y_r, amb = round_output(y, np.array([[0.0]]), "float16")
    assert not amb[0, 0] and y_r[0, 0] == 1.0  # RNE tie to even


@pytest.mark.parametrize("variant", [Int8ActVariant(), CANONICAL_ASYM, Int8ActVariant(rounding=Rounding.RHAZ)])
def test_w8a8_accumulator_and_result_exact(variant):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4, 96)) * 3).astype(np.float16)
    wq = rng.integers(-128, 128, (7, 96)).astype(np.int8)
    ws = (rng.uniform(0.001, 0.02, 7)).astype(np.float32)
    bias = rng.standard_normal(7).astype(np.float32)
    r = linear_w8a8(x, wq, ws, bias, act=variant)
    qx = r.parts["x_q"].astype(np.int64) - r.parts["x_zero_point"].astype(np.int64)
    np.testing.assert_array_equal(r.acc, qx @ wq.astype(np.int64).T)
    sx = r.parts["x_scale"][:, 0]
    for m in range(4):
        for n in range(7):
            exact = int(r.acc[m, n]) * Fraction(float(sx[m])) * Fraction(float(ws[n])) + Fraction(float(bias[n]))
            assert abs(Fraction(float(r.y_exact[m, n])) - exact) <= Fraction(float(r.y_bound[m, n]))


def test_w4a8_matches_exact_group_definition():
    rng = np.random.default_rng(6)
    N, K, G = 5, 64, 16
    x = rng.standard_normal((3, K)).astype(np.float16)
    w_int = rng.integers(-15, 16, (N, K)).astype(np.int32)
    scales = rng.uniform(0.001, 0.05, (K // G, N)).astype(np.float16)
    r = linear_w4a8(x, w_int, scales, G)
    qx = r.parts["x_q"]
    sx = r.parts["x_scale"][:, 0]
    for m in range(3):
        for n in range(N):
            tot = sum(Fraction(float(scales[g, n])) * int(np.dot(qx[m, g * G:(g + 1) * G].astype(np.int64),
                                                                  w_int[n, g * G:(g + 1) * G]))
                      for g in range(K // G))
            exact = Fraction(float(sx[m])) * tot
            assert abs(Fraction(float(r.y_exact[m, n])) - exact) <= Fraction(float(r.y_bound[m, n]))
            assert r.acc[m, :, n].tolist() == [int(np.dot(qx[m, g * G:(g + 1) * G].astype(np.int64),
                                                          w_int[n, g * G:(g + 1) * G])) for g in range(K // G)]


def test_w4a8_act_order_uses_g_idx():
    rng = np.random.default_rng(7)
    N, K, G = 4, 32, 8
    x = rng.standard_normal((2, K)).astype(np.float16)
    w_int = rng.integers(-8, 8, (N, K)).astype(np.int32)
    scales = rng.uniform(0.01, 0.05, (K // G, N)).astype(np.float16)
    perm = rng.permutation(K)
    g_idx = (np.arange(K) // G)[perm]
    r = linear_w4a8(x, w_int, scales, G, g_idx=g_idx)
    # equivalent dense weight
    w = w_int * scales[g_idx, :].T.astype(np.float64)
    xd = r.parts["x_q"] * r.parts["x_scale"].astype(np.float64)
    np.testing.assert_allclose(r.y_exact, xd @ w.T, rtol=1e-12)
    r2 = linear_w4a8(x, w_int, scales, G)
    assert not np.array_equal(r.y_exact, r2.y_exact)


def test_w4a4_matches_ml_dtypes_decoding():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    w = rng.standard_normal((4, 64)).astype(np.float32)
    wc, ws = quantize_mxfp4(w)
    r = linear_mxfp4_w4a4(x, wc, ws, out_dtype="float32")

    def decode(codes, sb):
        v = codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
        s = sb.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
        return (v.reshape(*sb.shape, 32) * s[..., None]).reshape(codes.shape)

    xd = decode(r.parts["x_codes"], r.parts["x_scale"])
    wd = decode(wc, ws)
    ex = exact_matmul(xd, wd)
    assert all(Fraction(float(r.y_exact[m, n])) == ex[m, n] or r.y_bound[m, n] > 0 for m in range(3) for n in range(4))
    np.testing.assert_array_equal(r.y[~r.y_ambiguous], r.y_exact[~r.y_ambiguous].astype(np.float32))


def test_w4a4_nan_scale_gives_nan_output_row():
    w = np.ones((2, 32), np.float32)
    wc, ws = quantize_mxfp4(w)
    ws = ws.copy()
    ws[1, 0] = 0xFF
    r = linear_mxfp4_w4a4(np.ones((1, 32), np.float32), wc, ws)
    assert np.isfinite(r.y[0, 0]) and np.isnan(r.y[0, 1])


def test_w4a4_activation_variant_changes_result():
    x = np.array([[7.0, 5, 2.5, 1.25, 0.3, -3.5, -0.75, 0] + [0.1] * 24], dtype=np.float32)
    w = np.ones((1, 32), np.float32)
    wc, ws = quantize_mxfp4(w)
    a = linear_mxfp4_w4a4(x, wc, ws)
    b = linear_mxfp4_w4a4(x, wc, ws, act=MxVariant(scale_rule="even"))
    assert a.y_exact[0, 0] != b.y_exact[0, 0]


def test_gamma():
    u = 2.0 ** -53
    assert gamma(1) == pytest.approx(u / (1 - u))
    with pytest.raises(ValueError):
        gamma(2 ** 53)


def test_shape_errors_name_the_tensor():
    from emulator.errors import FormatError

    with pytest.raises(FormatError, match="x: activations have K=3"):
        linear_w16(np.ones((1, 3), np.float32), np.ones((2, 4), np.float32))
    with pytest.raises(FormatError, match="bias"):
        linear_w16(np.ones((1, 4), np.float32), np.ones((2, 4), np.float32), np.ones(3, np.float32))
    with pytest.raises(FormatError, match="weight_scale"):
        linear_w8a8(np.ones((1, 4), np.float32), np.ones((2, 4), np.int8), np.ones(3, np.float32))
