"""Named variants of public reference quantizers (issue 13, part 3): hand-derived values.

What each variant does is derived here by hand from its definition (docs/formats/activations.md#reference-
implementations, docs/formats/mxfp4.md#reference-implementations); the libraries themselves are the oracles of
tests/emulator/test_reference_libraries.py.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from emulator.activations.int8 import Int8ActVariant, quantize_int8_per_token
from emulator.formats.mxfp4 import MxVariant, quantize_mxfp4
from emulator.numerics.e8m0 import mx_scale_byte

F = np.float32


def test_half_range_divisor_gives_scale_amax_over_127_5():
    x = np.array([[127.5, 1.0, -0.5]], F)
    a = quantize_int8_per_token(x, Int8ActVariant(sym_divisor="half_range"))
    assert a.scale.tolist() == [[1.0]]  # 127.5 / 127.5
    assert a.q.tolist() == [[127, 1, 0]]  # 127.5 saturates, -0.5 is a tie to even (0)
    c = quantize_int8_per_token(x)
    assert c.scale[0, 0] == F(127.5) / F(127) and c.q.tolist() == [[127, 1, 0]]


def test_dtype_eps_replaces_a_zero_scale_by_the_arithmetic_dtypes_epsilon():
    x = np.zeros((1, 4), F)
    for dtype, eps in (("float32", 2.0**-23), ("bfloat16", 2.0**-7), ("float16", 2.0**-10)):
        for sym in (True, False):
            a = quantize_int8_per_token(x, Int8ActVariant(symmetric=sym, zero_row="dtype_eps", arith_dtype=dtype))
            assert a.scale.tolist() == [[eps]] and a.q.tolist() == [[0, 0, 0, 0]] and a.zero_point.tolist() == [[0]]
    assert quantize_int8_per_token(x).scale.tolist() == [[0.0]]


def test_input_arith_dtype_follows_the_array():
    x = np.array([[1.0, 0.3]], ml_dtypes.bfloat16)  # 0.3 -> 0.30078125 in bf16
    a = quantize_int8_per_token(x, Int8ActVariant(arith_dtype="input"))
    b = quantize_int8_per_token(x.astype(F), Int8ActVariant(arith_dtype="bfloat16"))
    assert np.array_equal(a.scale, b.scale) and np.array_equal(a.q, b.q)
    # bf16 scale: 1/127 = 0.0078740... rounds to 0.00787353515625 (8 significant bits)
    assert a.scale.tolist() == [[0.00787353515625]]
    assert quantize_int8_per_token(x).scale[0, 0] == F(1) / F(127)


def test_zero_inclusive_range_and_clamped_zero_point():
    x = np.array([[1.0, 2.0, 3.0, 4.0]], F)  # all positive: the range becomes [0, 4]
    v = Int8ActVariant(symmetric=False, range_rule="zero_inclusive", azp_clamp=True)
    a = quantize_int8_per_token(x, v)
    assert a.scale[0, 0] == F(4) / F(255) and a.zero_point.tolist() == [[-128]]
    c = quantize_int8_per_token(x, Int8ActVariant(symmetric=False))  # canonical: range [1, 4]
    assert c.scale[0, 0] == F(3) / F(255) and c.zero_point[0, 0] < -128  # -128 - 85: an int32 zero point


def test_unit_range_gives_scale_one_over_255_on_a_constant_row():
    x = np.zeros((1, 3), F)
    a = quantize_int8_per_token(x, Int8ActVariant(symmetric=False, range_rule="zero_inclusive", zero_row="unit_range",
                                                  azp_clamp=True, azp_domain="uint8", uint8_zp128=True))
    assert a.scale[0, 0] == F(1) / F(255) and a.zero_point.tolist() == [[-128]] and a.q.tolist() == [[-128] * 3]
    assert a.stored(Int8ActVariant(uint8_zp128=True)).tolist() == [[0, 0, 0]]


def test_uint8_zero_point_domain_differs_where_subtracting_128_rounds():
    """int8 domain: azp = round(fl32(-128 - m)); uint8 domain: zp = round(-m), azp = zp - 128 (m = fl32(min / s),
    round = Python's round-half-even). They part where fl32(-128 - m) rounds onto or off a tie."""
    rng = np.random.default_rng(3)
    # min / scale near -(k + 0.5): rows [min, max] with max chosen so that 255 * |min| / (max - min) ~ k + 0.5
    k = rng.integers(0, 120, 4000)
    t = (k + 0.5 + rng.integers(-40, 41, 4000) * 2.0**-21) / 255.0
    xmin = -(F(1) * t).astype(F)
    x = np.stack([xmin, (F(1) + xmin).astype(F)], axis=1)  # max = 1 + min > 0 (|min| < 0.5): span ~ 1
    base = dict(symmetric=False, range_rule="zero_inclusive", azp_clamp=True)
    i8 = quantize_int8_per_token(x, Int8ActVariant(**base))
    u8 = quantize_int8_per_token(x, Int8ActVariant(**base, azp_domain="uint8"))
    differ = 0
    for r in range(len(x)):
        s_ = F(i8.scale[r, 0])
        m = F(F(min(x[r].min(), 0)) / s_)
        want_i8 = round(float(min(max(float(F(F(-128) - m)), -128.0), 127.0)))
        want_u8 = round(float(min(max(-float(m), 0.0), 255.0))) - 128
        assert (i8.zero_point[r, 0], u8.zero_point[r, 0]) == (want_i8, want_u8), r
        differ += want_i8 != want_u8
    assert differ > 0  # the two domains really part on these rows


def test_full_int32_saturation_and_int_min_zero_point_on_a_one_ulp_row():
    # fp32 row [-2, -2 + 2**-23]: scale = 2**-23 / 255, -min / scale = 255 * 2**24 overflows int32
    x = np.array([[-2.0, -2.0 + 2.0**-23]], F)
    canon = quantize_int8_per_token(x, Int8ActVariant(symmetric=False))
    assert canon.zero_point.tolist() == [[2**31 - 1]] and canon.q.tolist() == [[0, 0]]  # -(2**31 - 1) + (2**31 - 1)
    full = quantize_int8_per_token(x, Int8ActVariant(symmetric=False, int32_saturation="full"))
    assert full.zero_point.tolist() == [[2**31 - 1]] and full.q.tolist() == [[-1, -1]]  # -2**31 + (2**31 - 1)
    x86 = quantize_int8_per_token(x, Int8ActVariant(symmetric=False, azp_overflow="int_min"))
    assert x86.zero_point.tolist() == [[-(2**31)]]


def _block(*vals):
    b = np.zeros((1, 32), F)
    b[0, :len(vals)] = vals
    return b


def test_byte0_divisor():
    x = _block(2.0**-125, -(2.0**-127))  # FLOOR: floor(log2 2**-125) - 2 = -127 -> byte 0
    codes = {d: quantize_mxfp4(x, MxVariant(byte0_divisor=d)) for d in ("byte", "min_normal", "one")}
    assert all(s.tolist() == [[0]] for _, s in codes.values())
    assert codes["byte"][0][0, :2].tolist() == [6, 10]  # 4, -1
    assert codes["min_normal"][0][0, :2].tolist() == [4, 9]  # 2, -0.5
    assert codes["one"][0][0, :2].tolist() == [0, 8]  # +0, -0
    y = _block(1.0, -2.0)  # byte 125: unaffected
    assert all(np.array_equal(quantize_mxfp4(y, MxVariant(byte0_divisor=d))[0], quantize_mxfp4(y)[0])
               for d in ("min_normal", "one"))


def test_rceil_log2f_under_rounds_just_above_a_power_of_two():
    amax = F(6144.0 * (1 + 2.0**-22))  # amax / 6 = 2**10 * (1 + 2**-22) exactly
    assert F(amax / F(6)) == F(1024.0 * (1 + 2.0**-22))
    # exact: ceil(log2) = 11 -> byte 138; fp32 log2 = 10 + 3.4e-7 rounds to 10 (half an ulp of 10 is 4.8e-7)
    assert mx_scale_byte(np.array([amax], F), "rceil").tolist() == [138]
    assert mx_scale_byte(np.array([amax], F), "rceil_log2f").tolist() == [137]
    # powers of two and values away from them agree
    a = np.array([6.0, 12.0, 1.0, 7.0, 3e-30], F)
    assert np.array_equal(mx_scale_byte(a, "rceil"), mx_scale_byte(a, "rceil_log2f"))


@pytest.mark.parametrize("amax,canonical", [(3.4e38, 253), (F(1.75 * 2.0**127), 253), (F(1.7499999 * 2.0**127), 252)])
def test_scale_overflow_nan_at_the_top_of_the_exponent_range(amax, canonical):
    x = _block(amax, 1.0)
    c, s = quantize_mxfp4(x, MxVariant(scale_rule="even"))
    assert s.tolist() == [[canonical]]
    c2, s2 = quantize_mxfp4(x, MxVariant(scale_rule="even", scale_overflow="nan"))
    if amax >= 1.75 * 2.0**127:
        assert s2.tolist() == [[0xFF]] and not c2.any()
    else:
        assert s2.tolist() == s.tolist() and np.array_equal(c2, c)
