"""emulator.linear.exact_int_matmul (float32 BLAS over K-chunks) against an independent integer oracle.

The oracle is NumPy's int64 matmul (integer arithmetic, no floating point); every case must agree
exactly, including extreme int8 codes (-128 / 127 everywhere, the largest products), K not a multiple
of the chunk (tails) and K above one chunk (several chunks summed).
"""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from emulator.fast_linear import FP32_EXACT_INT, ExactIntMatmul, exact_int_matmul
from emulator.linear import linear_w8a8


def _oracle(a, w):
    return np.asarray(a).astype(np.int64) @ np.asarray(w).astype(np.int64).T


def test_chunk_bound_is_the_fp32_integer_limit():
    # the proof's premise: 2**24 is a float32 integer, 2**24 + 1 is not
    assert float(np.float32(FP32_EXACT_INT)) == FP32_EXACT_INT
    assert int(np.float32(FP32_EXACT_INT + 1)) != FP32_EXACT_INT + 1


@pytest.mark.parametrize("K", [1, 1023, 1024, 1025, 3000, 4096, 5000])
@pytest.mark.parametrize("sign", [(-128, -128), (-128, 127), (127, 127)])
def test_extreme_codes_every_product_maximal(K, sign):
    """All products 2**14 (or -128*127): a single fp32 sum over K > 1024 of them would round."""
    a = np.full((3, K), sign[0], dtype=np.int8)
    w = np.full((5, K), sign[1], dtype=np.int8)
    got = exact_int_matmul(a, w, a_max=128, w_max=128)
    np.testing.assert_array_equal(got, _oracle(a, w).astype(np.float64))


def test_plain_fp32_rounds_where_the_chunks_do_not():
    """An odd sum above 2**24 is no float32: one fp32 dot product over all of K cannot return it."""
    K = 4096
    a = np.full((1, K), 127, dtype=np.int8)
    w = np.full((1, K), 127, dtype=np.int8)
    a[0, 2048:] = 1
    w[0, 2048:] = 1
    w[0, -1] = 0
    exact = _oracle(a, w)
    assert int(exact[0, 0]) == 2048 * 127 * 127 + 2047 and int(exact[0, 0]) % 2 == 1 and exact[0, 0] > 2 ** 24
    plain = (a.astype(np.float32) @ w.astype(np.float32).T).astype(np.float64)
    assert plain[0, 0] != exact[0, 0]
    np.testing.assert_array_equal(exact_int_matmul(a, w), exact.astype(np.float64))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 7), st.integers(1, 2600), st.data())
def test_random_int8_against_int64_oracle(M, N, K, data):
    codes = st.one_of(st.integers(-128, 127), st.sampled_from([-128, 127, -127, 0]))
    a = data.draw(hnp.arrays(np.int8, (M, K), elements=codes))
    w = data.draw(hnp.arrays(np.int8, (N, K), elements=codes))
    np.testing.assert_array_equal(exact_int_matmul(a, w), _oracle(a, w).astype(np.float64))
    np.testing.assert_array_equal(exact_int_matmul(a, w, a_max=128, w_max=128), _oracle(a, w).astype(np.float64))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 2200), st.integers(-128, 127), st.data())
def test_asymmetric_activation_codes_against_int64_oracle(M, N, K, zp, data):
    """(q - zero point) reaches 255 in magnitude: the chunks shrink to keep every partial sum exact."""
    q = data.draw(hnp.arrays(np.int16, (M, K), elements=st.sampled_from([-128, 127, 0, 5, -77])))
    a = (q - zp).astype(np.float64)
    w = data.draw(hnp.arrays(np.int8, (N, K), elements=st.sampled_from([-128, 127, 1, -3])))
    np.testing.assert_array_equal(exact_int_matmul(a, w), _oracle(a.astype(np.int64), w).astype(np.float64))


def test_wide_operands_fall_back_to_exact_paths():
    rng = np.random.default_rng(0)
    a = rng.integers(-(2 ** 20), 2 ** 20, (3, 700))
    w = rng.integers(-(2 ** 20), 2 ** 20, (4, 700))
    np.testing.assert_array_equal(exact_int_matmul(a, w), _oracle(a, w).astype(np.float64))
    assert exact_int_matmul(np.zeros((2, 0)), np.zeros((3, 0))).shape == (2, 3)


def test_linear_w8a8_accumulator_matches_integer_oracle():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 2500)) * 3).astype(np.float32)
    x[0, :] = 1.0  # every code 127
    w = rng.integers(-128, 128, (6, 2500)).astype(np.int8)
    w[0, :] = -128
    res = linear_w8a8(x, w, np.ones(6, np.float32), out_dtype="float32")
    np.testing.assert_array_equal(res.acc, _oracle(res.parts["x_q"], w))


def test_prepared_weight_declared_bounds_and_one_product_chunks():
    """ExactIntMatmul sizes its chunks from the declared bounds: 2**12 x 2**12 products allow L = 1."""
    rng = np.random.default_rng(5)
    a = rng.integers(-(2 ** 12), 2 ** 12 + 1, (2, 9))
    w = rng.integers(-(2 ** 12), 2 ** 12 + 1, (3, 9))
    w[0, 0], a[0, 0] = 2 ** 12, -(2 ** 12)
    mm = ExactIntMatmul(w, a_max=2 ** 12)
    assert mm.chunk == 1
    np.testing.assert_array_equal(mm(a), _oracle(a, w).astype(np.float64))
    mm8 = ExactIntMatmul(np.full((2, 3000), -128, np.int8), a_max=128)
    assert mm8.chunk == 1024
    np.testing.assert_array_equal(mm8(np.full((1, 3000), -128.0, np.float32)), [[3000.0 * 2 ** 14] * 2])


def test_fallback_backend_w8a8_equals_the_reference_above_one_chunk():
    """The emulator backend's W8A8 fast path (chunked fp32 accumulator) gives the exact reference's y
    on K > 1024 with extreme codes (the reference's accumulator is checked against int64 above)."""
    from backends.base import Case
    from backends.registry import create
    from conformance.cases.inputs import make_inputs

    case = Case("w8a8", "ct-int-quantized", 5, 24, 2176, group_size=-1, act_dtype="float32", scale_dtype="float32")
    inp = make_inputs(case, 0)
    t = dict(inp.tensors)
    w = np.array(t["weight"])
    w[:3] = -128
    w[3, ::2] = 127
    w[4] = 127
    w[4, -1] = 126  # with codes 127: 127 * (2175 * 127 + 126), an odd sum above 2**24 (no float32)
    t["weight"] = w
    x = np.array(inp.x, np.float32)
    x[0] = -1.0  # every activation code -127 (per-token scale amax / 127)
    x[1, :] = 1.0
    emu = create("emulator")
    y = emu.run(emu.prepare(case, t), x)
    ref = linear_w8a8(x, w, t["weight_scale"], out_dtype="float32")
    assert emu.uses_fast_w8a8(case)
    assert ref.acc[1, 4] == 127 * (2175 * 127 + 126) and ref.acc[1, 4] % 2 == 1
    np.testing.assert_array_equal(y, ref.y)


def test_one_row_activations_stay_on_blas(monkeypatch):
    """M = 1: the chunks' activation slices must be unit-stride [L, 1] arrays (else NumPy's matmul
    leaves BLAS: tens of ms instead of tens of us); checked on the array ExactIntMatmul builds."""
    seen = []
    real = np.matmul

    def spy(a, b, *args, **kw):
        seen.append(b.strides)
        return real(a, b, *args, **kw)

    mm = ExactIntMatmul(np.full((4, 2500), -128, np.int8), a_max=128)  # K not a multiple of L=1024: per-chunk calls
    monkeypatch.setattr(np, "matmul", spy)
    mm(np.ones((1, 2500), np.float32))
    assert len(seen) == 3 and all(st == (4, 4) for st in seen)


@pytest.mark.parametrize("M", [1, 3, 4, 5, 17])
def test_whole_chunks_against_the_oracle(M):
    """K = 3 chunks exactly, extreme codes so every chunk sum is near 2**24."""
    rng = np.random.default_rng(M)
    K = 3072
    a = rng.choice(np.array([-128, 127, -127], np.int16), (M, K))
    w = rng.choice(np.array([-128, 127, 1], np.int16), (6, K)).astype(np.int8)
    np.testing.assert_array_equal(ExactIntMatmul(w, a_max=128)(a.astype(np.float32)), _oracle(a, w).astype(np.float64))
