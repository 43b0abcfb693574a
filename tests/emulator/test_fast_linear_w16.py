"""The A16 exact reference's speed code (emulator/fast_linear_w16.py): its bounds against independent oracles, its
outputs against the rounded exact value and, as regression gates, against the code it stands for.

Oracles, independent of the code under test: Python's ``fractions.Fraction`` for exact sums of products, squared
norms (no square roots needed) and the bounded intervals' ends; rounding to the output dtype by brute force
(``oracle_round`` of test_exact_decision.py: the dtype's two neighbours of a rational, compared in rationals).

Regression gates (code compared with code): ``round_output_fast`` returns ``output_grid.round_output``'s arrays;
``linear_w16_fast`` returns the readable ``linear_w16``'s ``y`` and main's former fast path's (``linear_w16(...,
fp32_magnitudes=True)`` at 9556177, tests/emulator/linear_w16_before.py) bit for bit, on random layers and on
adversarial ones (ties, cancellation, zeros of either sign, subnormals, K = 2^17, NaN / Inf).
"""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from linear_w16_before import linear_w16 as linear_w16_before
from test_exact_decision import oracle_round

from emulator import parallel
from emulator.errors import FormatError
from emulator.fast_linear_w16 import (element_magnitudes, float64_product, linear_w16_fast, norm_product_bounds,
                                      product_error_factor, row_norm_bounds)
from emulator.linear import gamma, linear_w16
from emulator.numerics.output_grid import cell_test, overflow_threshold, round_output, round_output_fast

_NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
DTYPES = ("float32", "float16", "bfloat16")


def _F(v) -> Fraction:
    return Fraction(float(v))


def _spread(rng, shape, scale: float) -> np.ndarray:
    """float32 values over ~40 binades around ``scale`` (subnormals where scale is small), signs mixed."""
    v = rng.standard_normal(shape) * scale * np.exp2(rng.integers(-20, 21, shape).astype(np.float64))
    return v.astype(np.float32)


_SCALES = [1.0, 1e-20, 1e-30, 1e-40, 1e20, 1e30]


# --------------------------------------------------------------------------------------------- the bounds


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 200), st.sampled_from(_SCALES), st.integers(0, 2 ** 31))
def test_norm_product_bound_covers_the_exact_magnitudes(K, scale, seed):
    """``norm_product_bounds`` of the rows' ``row_norm_bounds`` is >= sum_k |x w| and its square >= the exact squared
    norms' product (rationals), also where float32 squares would underflow (1e-30, subnormals) or overflow (1e20+)."""
    rng = np.random.default_rng(seed)
    x, w = _spread(rng, (3, K), scale), _spread(rng, (4, K), 1.0 if scale < 1e-35 else scale)
    got = norm_product_bounds(row_norm_bounds(x), row_norm_bounds(w), K)
    assert np.all(np.isfinite(got))
    for m in range(3):
        sx = sum((_F(a) ** 2 for a in x[m]), Fraction(0))
        for n in range(4):
            s = sum((abs(_F(a) * _F(b)) for a, b in zip(x[m], w[n])), Fraction(0))
            g = _F(got[m, n])
            assert g >= s, (m, n)
            assert g * g >= sx * sum((_F(b) ** 2 for b in w[n]), Fraction(0)), (m, n)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.sampled_from(_SCALES), st.integers(0, 2 ** 31))
def test_element_magnitudes_cover_the_exact_magnitudes(K, scale, seed):
    """``element_magnitudes`` is >= sum_k |x w| (rationals) and within 2^-46 + 4 gamma_K of it (one looser would
    leave elements undecided for nothing)."""
    rng = np.random.default_rng(seed)
    x, w = _spread(rng, (3, K), scale), _spread(rng, (5, K), scale)
    ms, ns = rng.integers(0, 3, 12), rng.integers(0, 5, 12)
    got = element_magnitudes(x, w, ms, ns)
    for u in range(12):
        s = sum((abs(_F(a) * _F(b)) for a, b in zip(x[ms[u]], w[ns[u]])), Fraction(0))
        assert s <= _F(got[u]) <= s * (1 + Fraction(2) ** -46 + 4 * Fraction(gamma(K))) + Fraction(2) ** -1070, u


@pytest.mark.parametrize("K", [2, 3, 64, 1000])
def test_the_bound_covers_the_float64_products_error(K):
    """gamma_K times either magnitude bound covers |fl64(x . w) - x . w| of ``float64_product`` (rationals), on rows
    built to cancel: pairs +a, -a of wide exponents with small tails, in orders that make float64 drop the tails."""
    rng = np.random.default_rng(K)
    M, N = 3, 6
    x = _spread(rng, (M, K), 1.0)
    w = _spread(rng, (N, K), 1.0)
    w[:, 1::2] = (-(x[0, 0::2][: K // 2] * w[:, 0::2][:, : K // 2]) / np.where(x[0, 1::2] == 0, 1, x[0, 1::2])
                  ).astype(np.float32)[:, : w[:, 1::2].shape[1]]  # near-cancelling pairs in row 0 of x
    y = float64_product(x.astype(np.float64), w)
    cs = gamma(K) * norm_product_bounds(row_norm_bounds(x), row_norm_bounds(w), K)
    for m in range(M):
        for n in range(N):
            exact = sum((_F(a) * _F(b) for a, b in zip(x[m], w[n])), Fraction(0))
            err = abs(_F(y[m, n]) - exact)
            assert err <= _F(cs[m, n]), (m, n)
            mag = element_magnitudes(x, w, np.array([m]), np.array([n]))[0]
            assert err <= _F(gamma(K) * mag), (m, n)


@pytest.mark.parametrize("K,chunk", [(2, 1), (7, 3), (300, 256), (1000, 256), (1030, 128), (513, 512)])
def test_the_chunked_product_error_is_within_its_factor(K, chunk):
    """``float64_product`` summed in K-chunks (as ``linear_w16_fast`` runs it from 32 activation rows on) is within
    ``product_error_factor(K, chunk)`` times sum_k |x w| of the exact value (rationals), on rows built to cancel
    within and across chunks; the factor is at least its defining sum gamma_{k-1} + gamma_{J-1}(1 + gamma_{k-1})
    (rationals) and no looser than one chunk's gamma_K."""
    rng = np.random.default_rng(K * 7 + chunk)
    M, N = 3, 5
    x = _spread(rng, (M, K), 1.0)
    w = _spread(rng, (N, K), 1.0)
    w[:, 1::2] = (-(x[0, 0::2][: K // 2] * w[:, 0::2][:, : K // 2]) / np.where(x[0, 1::2] == 0, 1, x[0, 1::2])
                  ).astype(np.float32)[:, : w[:, 1::2].shape[1]]  # near-cancelling pairs in row 0 of x
    G = product_error_factor(K, chunk)
    k, J = min(chunk, K), -(-K // min(chunk, K))
    u = Fraction(1, 2 ** 53)

    def gam(n):
        return n * u / (1 - n * u)

    assert Fraction(G) >= gam(k - 1) + gam(J - 1) * (1 + gam(k - 1))
    assert G <= gamma(K) * (1 + 2.0 ** -39)
    y = float64_product(x.astype(np.float64), w, chunk=chunk)
    for m in range(M):
        for n in range(N):
            exact = sum((_F(a) * _F(b) for a, b in zip(x[m], w[n])), Fraction(0))
            mag = sum((abs(_F(a) * _F(b)) for a, b in zip(x[m], w[n])), Fraction(0))
            assert abs(_F(y[m, n]) - exact) <= Fraction(G) * mag, (m, n)


def test_scratch_buffers_do_not_leak_between_calls():
    """``cell_test`` writing into reused ``parallel.Scratch`` buffers gives what fresh arrays give, across calls of
    other shapes and dtypes in between (a buffer grown, then viewed smaller)."""
    rng = np.random.default_rng(3)
    scratch = parallel.Scratch()
    calls = [(rng.standard_normal(s) * 10.0 ** rng.integers(-5, 5, s), d)
             for s, d in [((7, 300), "float32"), ((40, 1000), "bfloat16"), ((3, 5), "float16"), ((7, 300), "float32")]]
    for y, dtype in calls:
        b = np.abs(y) * 2.0 ** -30
        got = [a.copy() for a in cell_test(y, b, dtype, scratch=scratch)]
        want = cell_test(y, b, dtype)
        for g, e in zip(got, want):
            assert g.shape == e.shape and np.array_equal(g.view(np.uint8), np.ascontiguousarray(e).view(np.uint8))


# --------------------------------------------------------------------------------------------- the rounding test


def _grid_cases(dtype: str, rng) -> tuple[np.ndarray, np.ndarray]:
    """y near output values, midpoints, the subnormal range, zero, the overflow threshold, Inf and NaN, with bounds
    from 0 to wide."""
    t = _NP[dtype]
    fin = ml_dtypes.finfo(t) if dtype == "bfloat16" else np.finfo(t)
    tiny_sub = float(np.nextafter(t(0), t(1)))
    vals = np.concatenate([rng.standard_normal(200) * 10.0 ** rng.integers(-8, 8, 200),
                           np.array([tiny_sub, 2 * tiny_sub, float(fin.tiny), float(fin.max), 1.0, 2.0, 0.0])])
    r = vals.astype(np.float32).astype(t).astype(np.float64)
    nxt = np.nextafter(r.astype(t), t(np.inf)).astype(np.float64)
    mids = (r + nxt) / 2
    near = np.concatenate([r, mids] + [mids + k * np.spacing(mids) for k in (-3, -1, 1, 3)]
                          + [r + k * np.spacing(r) for k in (-2, 2)])
    thr = overflow_threshold(dtype)
    specials = np.array([0.0, -0.0, thr, -thr, np.nextafter(thr, 0), np.inf, -np.inf, np.nan, 2.0 ** -200,
                         -(2.0 ** -200), tiny_sub / 2, -tiny_sub / 2])
    y = np.concatenate([near, -near, specials])
    rel = np.array([0.0, 2.0 ** -80, 2.0 ** -56, 2.0 ** -40, 2.0 ** -(_P[dtype] + 2), 2.0 ** -(_P[dtype]), 0.5])
    b = np.abs(y) * rel[rng.integers(0, rel.size, y.size)]
    b[rng.integers(0, y.size, 20)] = 2.0 ** -160  # absolute bounds near zero
    b[-3:] = [np.inf, np.nan, 1e300]
    return y, b


_P = {"float32": 24, "float16": 11, "bfloat16": 8}


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_output_fast_is_round_output(dtype):
    """Regression gate: ``round_output_fast`` returns ``output_grid.round_output``'s rounded values (bits) and
    undecided mask on values at, next to and between output values, zeros, subnormals, the overflow threshold,
    Inf and NaN, with bounds from 0 to wide."""
    y, b = _grid_cases(dtype, np.random.default_rng(7))
    with np.errstate(invalid="ignore", over="ignore"):
        want_y, want_amb = round_output(y, b, dtype)
    got_y, got_amb = round_output_fast(y, b, dtype)
    assert np.array_equal(got_y.view(np.uint64), want_y.view(np.uint64))
    assert np.array_equal(got_amb, want_amb)
    assert 0 < got_amb.sum() < y.size - 100  # the cases hold both kinds


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_output_fast_decides_only_what_the_interval_decides(dtype):
    """Oracle: where ``round_output_fast`` says decided (finite y), both ends of [y - b, y + b] round (brute force, in
    rationals) to its value (undecided may be said of a little more: the ends are rounded outward first)."""
    y, b = _grid_cases(dtype, np.random.default_rng(11))
    yr, amb = round_output_fast(y, b, dtype)
    checked = 0
    for i in np.nonzero(np.isfinite(y) & np.isfinite(b) & ~amb)[0][::2]:
        lo, hi = oracle_round(_F(y[i]) - _F(b[i]), dtype), oracle_round(_F(y[i]) + _F(b[i]), dtype)
        assert lo == hi == yr[i], (y[i], b[i], lo, hi, yr[i])
        checked += 1
    assert checked > 300


# --------------------------------------------------------------------------------------------- the outputs


def _exact(x, w, bias, m, n) -> Fraction:
    v = sum((_F(a) * _F(c) for a, c in zip(x[m], w[n])), Fraction(0))
    return v + (_F(bias[n]) if bias is not None else 0)


def _adversarial(dtype: str):
    """(name, x, w, bias) float32 layers whose exact values sit on or next to output midpoints (h: half an output ulp
    at 1), cancel, or round to zeros of either sign, in orders that make float64 lose the deciding tail."""
    t = _NP[dtype]
    h = (float(np.nextafter(t(1), t(2))) - 1.0) / 2  # 1 + h is the output midpoint above 1
    hs = float(np.nextafter(t(0), t(1))) / 2  # half the smallest subnormal: the midpoint above zero
    tails = (0.0, 2.0 ** -80, -(2.0 ** -80))
    w = [[tl, 1.0, h, 0.0] for tl in tails] + [[tl, 4.0, -3.0, h] for tl in tails] + [[1.0, tl, 0.0, h] for tl in tails]
    ones = np.ones((2, 4), np.float32)
    ones[1] = [1.0, 1.0, -1.0, -1.0]  # the negative side: -(1 + h), 1 - h ...
    yield "ties", ones, np.array(w, np.float32), None
    wb = np.array([[tl, 1.0, 0.0, 0.0] for tl in tails], np.float32)
    yield "ties-bias", ones, wb, np.array([h, -h, h], np.float32)
    x = np.array([[2.0 ** -75, 2.0 ** -100, 2.0 ** -100]], np.float32)
    a = hs * 2.0 ** 75  # 2^-75 * a = hs
    w = [[a, 0.0, 0.0], [a, 2.0 ** -100, 0.0], [a, -(2.0 ** -100), 0.0], [-a, 2.0 ** -100, 0.0],
         [-a, -(2.0 ** -100), 0.0], [0.0, 2.0 ** -100, -(2.0 ** -100)]]
    yield "half-subnormal", x, np.array(w, np.float32), None
    x = np.array([[2.0 ** -100, 1.0, 1.0]], np.float32)
    w = [[-(2.0 ** -100), 2.0 ** -100, -(2.0 ** -100)], [2.0 ** -100, 2.0 ** -100, -(2.0 ** -100)],
         [2.0 ** -100, -(2.0 ** -100), 2.0 ** -100], [0.0, 2.0 ** -100, -(2.0 ** -100)]]
    yield "zero-signs", x, np.array(w, np.float32), None


@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_reference_is_the_exact_value_rounded_once(dtype):
    """Oracle: on the adversarial layers every output is the exact value (rationals) rounded once by brute force,
    a zero's sign included (sign of the exact value; +0 for an exact zero)."""
    for name, x, w, bias in _adversarial(dtype):
        r = linear_w16_fast(x, w, bias, out_dtype=dtype)
        for m in range(x.shape[0]):
            for n in range(w.shape[0]):
                v = _exact(x, w, bias, m, n)
                want = oracle_round(v, dtype)
                got = r.y[m, n]
                assert got == want, (name, m, n, got, want)
                if want == 0:
                    assert np.signbit(got) == (v < 0), (name, m, n, got, v)


def _bits(y: np.ndarray) -> np.ndarray:
    return np.asarray(y, np.float64).view(np.uint64)


def _random_layer(seed, M, N, K, scale=1.0, bias=False):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((M, K)) * scale).astype(np.float32)
    w = (rng.standard_normal((N, K)) * (1.0 / np.sqrt(K))).astype(np.float32)
    b = (rng.standard_normal(N) * 0.1).astype(np.float32) if bias else None
    return x, w, b


def _gate_layers():
    for M, K in ((1, 1), (8, 7), (8, 1024), (64, 1024), (3, 4096), (40, 700)):
        for bias in (False, True):
            yield f"random-{M}x{K}-{'bias' if bias else 'nobias'}", *_random_layer(M * K, M, 96, K, bias=bias)
    x, w, _ = _random_layer(5, 2, 3, 1 << 17)
    w[:, 1::2] = -w[:, 0::2]  # huge K, nearly cancelling
    w[:, 7] = 1.0
    yield "huge-K-cancelling", x, w, None
    x, w, _ = _random_layer(6, 4, 64, 256, scale=1e-38)  # float32 subnormal activations: subnormal outputs
    x[0, :] = 0.0
    w[3, :] = 0.0
    yield "subnormal-and-zero-rows", x, w, None
    x, w, b = _random_layer(8, 5, 48, 512, bias=True)
    x[0, 3], x[1, 7], x[2, 9] = np.nan, np.inf, -np.inf
    w[:5, 7] = 0.0  # Inf * 0: NaN in those columns
    yield "nan-inf", x, w, b
    for dtype in DTYPES:
        for name, x, w, bias in _adversarial(dtype):
            yield f"adversarial-{name}-{dtype}", x.astype(np.float32), w, bias


_GATE = list(_gate_layers())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,x,w,bias", _GATE, ids=[g[0] for g in _GATE])
def test_fast_reference_gives_the_former_fast_paths_and_the_definitions_bits(name, x, w, bias, dtype):
    """Regression gate: the same y, bit for bit (NaN payloads and zeros' signs included), as main's former fast path
    (tests/emulator/linear_w16_before.py) and as the readable ``linear_w16``."""
    got = linear_w16_fast(x, w, bias, out_dtype=dtype)
    before = linear_w16_before(x, w, bias, out_dtype=dtype, fp32_magnitudes=True)
    readable = linear_w16(x, w, bias, out_dtype=dtype)
    assert np.array_equal(_bits(got.y), _bits(before.y)), f"{name}: differs from main's fast path"
    assert np.array_equal(_bits(got.y), _bits(readable.y)), f"{name}: differs from linear_w16"


def test_row_blocks_on_two_threads_give_the_same_bits(monkeypatch):
    """Regression gate: the float64 product's row blocks spread over two threads (forced here, with blocks of a few
    rows) give the one-thread output bit for bit."""
    layers = [_random_layer(3, 8, 700, 640, bias=True), _random_layer(4, 40, 700, 640, bias=True)]  # 40: large-M blocks
    one = [linear_w16_fast(x, w, b) for x, w, b in layers]
    monkeypatch.setattr(parallel, "row_threads", lambda: 2)
    monkeypatch.setattr(parallel, "MIN_ELEMENTS", 1)
    for (x, w, b), o in zip(layers, one):
        two = linear_w16_fast(x, w, b)
        assert np.array_equal(_bits(o.y), _bits(two.y))
        assert np.array_equal(_bits(o.y), _bits(linear_w16(x, w, b).y))


def test_kept_norms_are_the_norms_and_a_wrong_shape_is_refused():
    x, w, _ = _random_layer(4, 4, 32, 64)
    kept = linear_w16_fast(x, w, w_norms=row_norm_bounds(w))
    assert np.array_equal(_bits(kept.y), _bits(linear_w16_fast(x, w).y))
    with pytest.raises(FormatError, match="w_norms"):
        linear_w16_fast(x, w, w_norms=row_norm_bounds(w)[:-1])


def test_the_cheap_bound_leaves_few_elements_to_the_exact_sums():
    """What the speed rests on (not a timing): on a random layer the norms' product decides all but a small fraction
    of the elements, and the element's own magnitudes all but those the readable reference leaves undecided too."""
    x, w, _ = _random_layer(9, 64, 1024, 1024)
    y64 = float64_product(x.astype(np.float64), w)
    cs = gamma(1024) * norm_product_bounds(row_norm_bounds(x), row_norm_bounds(w), 1024)
    _, amb_cs = round_output(y64 + 0.0, cs, "float32")
    fast, readable = linear_w16_fast(x, w), linear_w16(x, w)
    assert amb_cs.mean() < 1e-2
    assert fast.y_ambiguous.sum() <= amb_cs.sum()
    assert fast.y_ambiguous.sum() <= 2 * readable.y_ambiguous.sum() + 5
