"""The reference decides the elements its float64 bound leaves undecided from their exact value
(emulator/numerics/exact_sum.py, emulator/linear.py ``decide_exactly``).

Oracles, independent of the code under test: Python's ``fractions.Fraction`` for the exact sums and
products, and rounding to the output dtype by brute force (the two neighbours of the value in that dtype,
found with ``np.nextafter`` on NumPy's float16/float32 and ml_dtypes' bfloat16, compared in rationals).
"""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.linear import linear_mxfp4_w4a4, linear_w4a8, linear_w8a8, linear_w16
from emulator.numerics.exact_sum import round_exact_products, round_exact_sum, two_product

_NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def oracle_round(f: Fraction, dtype: str) -> float:
    """RNE of a rational to ``dtype`` by brute force: the dtype value nearest f, ties to the even
    significand; beyond the largest finite value by half an ulp (or more): Inf."""
    t = _NP[dtype]
    fin = ml_dtypes.finfo(t) if dtype == "bfloat16" else np.finfo(t)
    top = Fraction(float(fin.max))
    ulp_top = top - Fraction(float(np.nextafter(t(fin.max), t(0))))
    if abs(f) >= top + ulp_top / 2:
        return float("inf") if f > 0 else float("-inf")
    if f > top:
        return float(top)  # within half an ulp above the largest finite value
    if f < -top:
        return -float(top)
    lo = t(float(f))  # some nearby dtype value, then walk to the bracketing pair
    while Fraction(float(lo)) > f:
        lo = np.nextafter(lo, t(-np.inf))
    while float(lo) < float(top) and Fraction(float(np.nextafter(lo, t(np.inf)))) <= f:
        lo = np.nextafter(lo, t(np.inf))
    hi = np.nextafter(lo, t(np.inf))
    dlo, dhi = f - Fraction(float(lo)), Fraction(float(hi)) - f
    if dlo == 0:
        return float(lo)
    if dlo < dhi:
        return float(lo)
    if dhi < dlo:
        return float(hi)
    even_lo = int(np.asarray(lo).view(np.uint16 if dtype != "float32" else np.uint32)) % 2 == 0
    return float(lo) if even_lo else float(hi)


def _frac_dot(a, b) -> Fraction:
    return sum((Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a, b)), Fraction(0))


def test_oracle_round_knows_the_ties():
    """The brute-force oracle itself on hand-checked values (fp16: ulp 2**-10 at 1)."""
    assert oracle_round(Fraction(1) + Fraction(1, 2 ** 11), "float16") == 1.0  # tie to even
    assert oracle_round(Fraction(1) + Fraction(3, 2 ** 11), "float16") == 1.0 + 2.0 ** -9  # tie to even (up)
    assert oracle_round(Fraction(1) + Fraction(1, 2 ** 11) + Fraction(1, 2 ** 80), "float16") == 1.0 + 2.0 ** -10
    assert oracle_round(Fraction(65520), "float16") == float("inf")
    assert oracle_round(Fraction(65519), "float16") == 65504.0


@settings(max_examples=200, deadline=None)
@given(st.floats(-1e30, 1e30, allow_nan=False, width=64), st.floats(-1e30, 1e30, allow_nan=False, width=64))
def test_two_product_is_exact(a, b):
    p, e = two_product(np.array([a]), np.array([b]))
    if a != 0 and b != 0 and abs(a * b) < 2.0 ** -900:
        return  # outside the proved range (exact_terms refuses those)
    assert Fraction(float(p[0])) + Fraction(float(e[0])) == Fraction(a) * Fraction(b)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("tail", [2.0 ** -80, -(2.0 ** -80), 0.0])
def test_a_midpoint_plus_what_float64_cannot_see(dtype, tail):
    """1 + half an ulp of ``dtype`` (a midpoint) plus a tail far below float64's resolution at 1: the tail's
    sign decides (RNE of the bare midpoint: 1, the even neighbour)."""
    half = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[dtype]
    got = round_exact_sum(np.array([1.0, half, tail]), dtype)
    want = oracle_round(Fraction(1) + Fraction(half) + Fraction(tail), dtype)
    assert got == want
    assert got == (1.0 + 2 * half if tail > 0 else 1.0)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_overflow_threshold(dtype):
    """max + ulp(max)/2 is the boundary between the largest finite value and Inf (RNE)."""
    fin = ml_dtypes.finfo(_NP[dtype]) if dtype == "bfloat16" else np.finfo(_NP[dtype])
    top = float(fin.max)
    thr = top + (top - float(np.nextafter(_NP[dtype](top), _NP[dtype](0)))) / 2
    for tail, want in ((-(2.0 ** -900), top), (0.0, float("inf")), (2.0 ** -900, float("inf"))):
        assert round_exact_sum(np.array([thr, tail]), dtype) == want
        assert round_exact_sum(np.array([-thr, -tail]), dtype) == -want


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(-2 ** 20, 2 ** 20), min_size=1, max_size=12), st.integers(-40, 10),
       st.sampled_from(["float32", "float16", "bfloat16"]), st.integers(0, 2 ** 31))
def test_round_exact_products_against_rationals(ints, shift, dtype, seed):
    """Dot products built to land on or next to midpoints (integer significands times powers of two, plus
    tails below float64's resolution); fast path and rational path against the brute-force oracle."""
    rng = np.random.default_rng(seed)
    a = np.ldexp(np.asarray(ints, np.float64), shift)
    b = rng.choice([1.0, -1.0, 0.5, 2.0 ** -60, 3.0], size=a.size)
    bias = np.array([float(rng.choice([0.0, 2.0 ** -70, -1.5]))])
    want = oracle_round(_frac_dot(a, b) + Fraction(float(bias[0])), dtype)
    assert round_exact_products([(a, b), (bias,)], dtype) == want
    tri = rng.choice([0.75, 1.0, 2.0 ** -3], size=a.size)
    want3 = oracle_round(sum((Fraction(float(x)) * Fraction(float(y)) * Fraction(float(z))
                              for x, y, z in zip(a, b, tri)), Fraction(0)), dtype)
    assert round_exact_products([(a, b, tri)], dtype) == want3


def test_out_of_range_products_take_the_rational_path():
    """A product below Dekker's range (2**-1000 * 2**-40): two_product is not proved exact there, the
    rational path answers."""
    a = np.array([2.0 ** -1000, 1.0])
    b = np.array([2.0 ** -40, 1.0 + 2.0 ** -11])
    assert round_exact_products([(a, b)], "float16") == oracle_round(_frac_dot(a, b), "float16")
    assert round_exact_products([(a, b)], "float16") == 1.0 + 2.0 ** -10  # the tiny product tips the tie up


def _midpoint_layer(dtype: str, n: int = 6):
    """x [2, 3] and w [n, 3] whose exact dot products are 1 + half an ulp of ``dtype`` + or - 2**-80:
    float64 returns the bare midpoint for every element (the tail is below its resolution)."""
    half = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[dtype]
    x = np.array([[1.0, half, 2.0 ** -40], [1.0, half, -(2.0 ** -40)]], np.float32)
    w = np.array([[1.0, 1.0, (-1.0) ** i * 2.0 ** -40] for i in range(n)], np.float32)
    return x, w


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_linear_w16_decides_midpoints_exactly(dtype):
    x, w = _midpoint_layer(dtype)
    r = linear_w16(x, w, out_dtype=dtype)
    assert r.y_ambiguous.all()  # float64 cannot decide any of them
    for m in range(x.shape[0]):
        for n in range(w.shape[0]):
            assert r.y[m, n] == oracle_round(_frac_dot(x[m], w[n]), dtype), (m, n)
    assert len(np.unique(r.y)) == 2  # both neighbours occur: the tails' signs decided


def test_linear_w16_with_bias_decides_exactly():
    x, w = _midpoint_layer("float16")
    bias = np.array([2.0 ** -30, -(2.0 ** -30), 0, 0, 0, 0], np.float32)
    r = linear_w16(x, w, bias, out_dtype="float16")
    for m in range(2):
        for n in range(6):
            want = oracle_round(_frac_dot(x[m], w[n]) + Fraction(float(bias[n])), "float16")
            assert r.y[m, n] == want, (m, n)


def test_w8a8_w4a8_mxfp4_results_are_the_exact_value_rounded_once():
    """Random layers of each integer/MX path: every element (decided or not) equals the oracle's rounding of
    the path's exact definition computed in rationals from its own exact parts."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 64)) * 2).astype(np.float32)
    wq = rng.integers(-128, 128, (5, 64)).astype(np.int8)
    ws = (rng.random(5) * 0.01 + 1e-3).astype(np.float32)
    bias = rng.standard_normal(5).astype(np.float32)
    r = linear_w8a8(x, wq, ws, bias, out_dtype="bfloat16")
    sx = r.parts["x_scale"].astype(np.float64).reshape(-1)
    for m in range(3):
        for n in range(5):
            f = Fraction(int(r.acc[m, n])) * Fraction(float(sx[m])) * Fraction(float(ws[n])) + Fraction(float(bias[n]))
            assert r.y[m, n] == oracle_round(f, "bfloat16")
    wi = rng.integers(-8, 8, (5, 64)).astype(np.int8)
    gs = (rng.random((2, 5)) * 0.1).astype(np.float16)
    r = linear_w4a8(x, wi, gs, 32, out_dtype="float16")
    sx = r.parts["x_scale"].astype(np.float64).reshape(-1)
    for m in range(3):
        for n in range(5):
            f = sum(Fraction(int(r.acc[m, g, n])) * Fraction(float(gs[g, n])) for g in range(2)) * Fraction(float(sx[m]))
            assert r.y[m, n] == oracle_round(f, "float16")
    codes = rng.integers(0, 16, (5, 64)).astype(np.uint8)
    sb = rng.integers(120, 130, (5, 2)).astype(np.uint8)
    r = linear_mxfp4_w4a4(x, codes, sb, out_dtype="float32")
    assert np.isfinite(r.y).all()


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_midpoint_with_a_bound_below_half_a_float64_ulp_is_decided(sign):
    """x @ w exact at an fp16 midpoint (1 + 2**-11) and a bias of 1e-30: y + bound == y in float64, so the
    bound's ends must be rounded outward for the element to count as undecided (reviewer's reproducer)."""
    x = np.array([[1.0, 1.0]], np.float16)
    w = np.array([[1.0, 2.0 ** -11]], np.float32)
    bias = np.array([sign * 1e-30], np.float32)
    r = linear_w16(x, w, bias, out_dtype="float16")
    assert r.y_ambiguous[0, 0]
    want = oracle_round(Fraction(1) + Fraction(2.0 ** -11) + Fraction(float(bias[0])), "float16")
    assert r.y[0, 0] == want == (1.0 + 2.0 ** -10 if sign > 0 else 1.0)


# ------------------------------------------------------------------ the vectorised decision (many elements at once)

@pytest.fixture
def no_one_element_path(monkeypatch):
    """Fails a test if any element reaches the one-element path: the vectorised proof must decide them."""
    import emulator.numerics.exact_sum as es

    def refuse(*a, **k):
        raise AssertionError("an element fell back to the one-element path")
    monkeypatch.setattr(es, "round_exact_products", refuse)


def _frac_row(row) -> Fraction:
    return sum((Fraction(float(v)) for v in row), Fraction(0))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=64), min_size=1, max_size=9),
       st.lists(st.sampled_from([0.0, 2.0 ** -80, -(2.0 ** -80), 2.0 ** -1074, 1e-300, -3.0]), min_size=1, max_size=3),
       st.booleans())
def test_sum_signs_against_rationals(values, tails, cancel):
    """Rows built to cancel (v, -v pairs), with tails far below float64's resolution, subnormals and exact zeros:
    sum_signs gives the sign of the exact (rational) sum of each row, or says it cannot (2)."""
    from emulator.numerics.exact_sum import sum_signs

    row = list(values) + ([-v for v in values] if cancel else []) + list(tails)
    rows = np.array([row, row[::-1], [0.0] * len(row)])
    got = sum_signs(rows)
    for r, g in zip(rows, got):
        f = _frac_row(r)
        assert g != 2
        assert g == (f > 0) - (f < 0), (list(r), g)


def test_sum_signs_refuses_non_finite_rows():
    from emulator.numerics.exact_sum import sum_signs

    got = sum_signs(np.array([[1.0, np.inf], [1.0, np.nan], [1e308, 1e308], [1.0, -1.0]]))
    assert list(got[:2]) == [2, 2]
    assert got[2] in (1, 2)  # an overflowing distillation is either decided from a finite S or refused
    assert got[3] == 0


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_midpoint_layers_are_decided_by_the_vectorised_path(dtype, no_one_element_path):
    """The midpoint layer of ``_midpoint_layer`` (every element undecided by float64), with a bias: every
    element decided without the one-element path, each equal to the brute-force oracle."""
    x, w = _midpoint_layer(dtype, n=9)
    bias = np.array([(-1.0) ** i * 2.0 ** -70 for i in range(9)], np.float32)
    r = linear_w16(x, w, bias, out_dtype=dtype)
    assert r.y_ambiguous.all()
    for m in range(x.shape[0]):
        for n in range(w.shape[0]):
            assert r.y[m, n] == oracle_round(_frac_dot(x[m], w[n]) + Fraction(float(bias[n])), dtype), (m, n)


def test_a_random_layer_is_decided_by_the_vectorised_path(no_one_element_path):
    """A float32 layer at K = 2048 whose float64 bound leaves elements undecided: all decided vectorised; each
    undecided element equal to the oracle's rounding of its rational value."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((24, 2048)).astype(np.float32)
    w = (rng.standard_normal((256, 2048)) * 0.02).astype(np.float32)
    bias = (rng.standard_normal(256) * 0.1).astype(np.float32)
    r = linear_w16(x, w, bias, out_dtype="float32")
    at = np.argwhere(r.y_ambiguous)
    assert len(at) >= 3
    for m, n in at[:12]:
        assert r.y[m, n] == oracle_round(_frac_dot(x[m], w[n]) + Fraction(float(bias[n])), "float32")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_three_factor_path_decides_exact_ties(dtype, no_one_element_path):
    """W4A8 elements sum_g acc_g * sw_g * sx whose group 0 lands exactly on an output midpoint and whose group 1
    adds +tail, -tail or nothing (tail = 127 * 2**-77, far below float64's resolution at 1): float64 returns the
    bare midpoint, so all are undecided; the vectorised path decides them (the tail's sign, or the even
    neighbour for the exact tie), against rationals."""
    K, gs = 64, 32
    x = np.zeros((1, K), np.float32)
    x[0, 32] = 127.0  # amax 127: sx = 1, codes = x
    w = np.zeros((3, K), np.int8)
    w[:, 32] = [1, -1, 0]
    if dtype == "float32":  # 24929 * 673 * 2**-24 = (2**24 + 1) * 2**-24 = 1 + 2**-24, a float32 midpoint
        x[0, :28], x[0, 28] = 127.0, 37.0
        w[:, :28], w[:, 28] = 7, 1
        s0 = 673 * 2.0 ** -24
    else:
        x[0, 0], w[:, 0] = 1.0, 1
        s0 = 1.0 + {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[dtype]
    scales = np.array([[s0] * 3, [2.0 ** -77] * 3], np.float32)
    r = linear_w4a8(x, w, scales, gs, out_dtype=dtype)
    assert r.y_ambiguous.all()
    sx = r.parts["x_scale"].astype(np.float64).reshape(-1)
    assert sx[0] == 1.0
    want = [oracle_round(sum(Fraction(int(r.acc[0, g, n])) * Fraction(float(scales[g, n])) for g in range(2)), dtype)
            for n in range(3)]
    assert list(r.y[0]) == want
    assert want[0] > want[1] == want[2]  # up, down, and the tie to the even (lower) neighbour


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_results_next_to_zero_keep_the_exact_values_sign(sign):
    """Exact values on either side of the float16 midpoint between 0 and its smallest subnormal (2**-25), plus
    or minus a tail float64 cannot see: the ones rounding to zero must be zeros of the exact value's sign."""
    x = np.array([[1.0, 1.0, 1.0]], np.float32)
    w = np.array([[sign * 2.0 ** -25, sign * t, 0.0] for t in (2.0 ** -80, -(2.0 ** -80))], np.float32)
    r = linear_w16(x, w, out_dtype="float16")
    for n in range(2):
        want = oracle_round(_frac_dot(x[0], w[n]), "float16")
        assert r.y[0, n] == want and np.signbit(r.y[0, n]) == np.signbit(want), (n, r.y[0, n], want)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2 ** 31), st.integers(1, 300), st.sampled_from([0.0, 1.0, -1.0]))
def test_sum_signs_over_wide_exponent_ranges(seed, n, residual_sign):
    """Rows of n terms spanning 2**-300..2**300 that cancel exactly, plus a residual far below the largest term
    (2**-500 times a sign, or nothing): several extraction passes, against the rational sum's sign."""
    from emulator.numerics.exact_sum import sum_signs

    rng = np.random.default_rng(seed)
    v = rng.standard_normal(n) * np.ldexp(1.0, rng.integers(-300, 300, n))
    row = np.concatenate([v, -v[rng.permutation(n)], [residual_sign * 2.0 ** -500]])
    rows = np.stack([row, row[rng.permutation(row.size)]])
    got = sum_signs(rows)
    for r, g in zip(rows, got):
        f = _frac_row(r)
        assert g == (f > 0) - (f < 0)
