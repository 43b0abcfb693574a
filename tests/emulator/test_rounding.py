"""Rounding modes against independent exact oracles.

Oracles (written here, sharing no code with the emulator):
- ``frac_round``: exact rational rounding with ``fractions.Fraction`` (floor, remainder
  compared with 1/2, tie rule of the mode applied to the magnitude);
- ``dec_round``: Python's ``decimal`` module, whose rounding constants name the same rules
  (ROUND_HALF_EVEN = RNE, ROUND_HALF_UP = ties away from zero = RHAZ,
  ROUND_HALF_DOWN = ties toward zero = RHTZ, ROUND_DOWN = truncation = RTZ);
- ``np.rint`` for RNE on random float64 bit patterns.
"""

from __future__ import annotations

import decimal
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.numerics.rounding import (
    NanToInt,
    Rounding,
    as_float64,
    quantize_to_int,
    round_scaled_significand,
    round_to_integer,
)

MODES = list(Rounding)
HALF = Fraction(1, 2)


# --------------------------------------------------------------------------- oracles

def frac_round(q: Fraction, mode: Rounding) -> int:
    """Round the exact rational q to an integer: rule applied to |q|, sign put back."""
    neg = q < 0
    a = -q if neg else q
    lo = a.numerator // a.denominator
    rem = a - lo
    if mode is Rounding.RTZ:
        r = lo
    elif rem > HALF:
        r = lo + 1
    elif rem < HALF:
        r = lo
    elif mode is Rounding.RNE:
        r = lo if lo % 2 == 0 else lo + 1
    elif mode is Rounding.RHAZ:
        r = lo + 1
    else:  # RHTZ
        r = lo
    return -r if neg else r


_DEC_MODE = {
    Rounding.RNE: decimal.ROUND_HALF_EVEN,
    Rounding.RHAZ: decimal.ROUND_HALF_UP,  # decimal's HALF_UP is "away from zero" on ties
    Rounding.RHTZ: decimal.ROUND_HALF_DOWN,
    Rounding.RTZ: decimal.ROUND_DOWN,
}


def dec_round(x: float, mode: Rounding) -> int:
    with decimal.localcontext() as ctx:
        ctx.prec = 2000
        return int(decimal.Decimal(x).to_integral_value(rounding=_DEC_MODE[mode]))


def _f64(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint64).view(np.float64)[0])


def constructed_values() -> np.ndarray:
    """Ties k+0.5 (incl. negatives, near 2**52), their float64 neighbours, huge, subnormal."""
    vals: list[float] = []
    ks = list(range(-1500, 1500)) + [2**51 + i for i in range(-4, 5)] + [2**52 - i for i in range(1, 8)]
    ks += [-k for k in ks if k > 2**40]
    for k in ks:
        t = k + 0.5
        assert Fraction(t) == Fraction(2 * k + 1, 2)  # really a tie
        vals += [t, float(np.nextafter(t, np.inf)), float(np.nextafter(t, -np.inf))]
    vals += [0.0, 0.1, 0.3, 0.49999999999999994, 0.5000000000000001, 0.7, 0.9, 1.0, 2.0**52, 2.0**52 + 1,
             2.0**53, 2.0**53 + 2, 2.0**60 + 2.0**8, 1e300, np.finfo(np.float64).max, 2.0**1023]
    vals += [_f64(1), _f64(2), _f64(0x000FFFFFFFFFFFFF), 2.0**-1022, 2.0**-1074 * 3, 1e-310, 2.0**-60]
    vals += [-v for v in vals]
    vals += [-0.0]
    return np.array(vals, dtype=np.float64)


CONSTRUCTED = constructed_values()


# --------------------------------------------------------------------------- tests

@pytest.mark.parametrize("mode", MODES)
def test_round_to_integer_constructed_vs_fraction_and_decimal(mode):
    got = round_to_integer(CONSTRUCTED, mode)
    for x, g in zip(CONSTRUCTED.tolist(), got.tolist()):
        want = frac_round(Fraction(x), mode)
        assert g == want, (mode, x.hex(), g, want)
        assert dec_round(x, mode) == want, (mode, x.hex())
    # the sign of the input survives, -0 and values rounding to 0 included (-0.3 -> -0.0)
    assert np.array_equal(np.signbit(got), np.signbit(CONSTRUCTED))


@pytest.mark.parametrize(
    "x, rne, rhaz, rtz, rhtz",
    [
        (0.5, 0, 1, 0, 0), (1.5, 2, 2, 1, 1), (2.5, 2, 3, 2, 2), (-0.5, 0, -1, 0, 0),
        (-1.5, -2, -2, -1, -1), (-2.5, -2, -3, -2, -2), (126.5, 126, 127, 126, 126),
        (127.5, 128, 128, 127, 127), (-0.7, -1, -1, 0, -1), (0.5000000000000001, 1, 1, 0, 1),
    ],
)
def test_tie_table(x, rne, rhaz, rtz, rhtz):
    # hand-written table of the four rules (README of microxcaling, torch.round docs, POSIX rint)
    for mode, want in zip([Rounding.RNE, Rounding.RHAZ, Rounding.RTZ, Rounding.RHTZ], [rne, rhaz, rtz, rhtz]):
        assert round_to_integer(np.array([x]), mode)[0] == want


@pytest.mark.parametrize("mode", MODES)
def test_non_finite_pass_through(mode):
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0])
    got = round_to_integer(x, mode)
    assert np.isnan(got[:2]).all()
    assert got[2] == np.inf and got[3] == -np.inf
    assert np.signbit(got[4]) and not np.signbit(got[5]) and got[4] == 0


def test_rne_matches_np_rint_on_random_float64_bits():
    rng = np.random.default_rng(1234)
    bits = rng.integers(0, 2**64, size=200_000, dtype=np.uint64)
    x = bits.view(np.float64)
    # plus values in the interesting range (|x| < 2**53) with random fractions
    y = rng.standard_normal(100_000) * np.exp2(rng.integers(-30, 54, 100_000))
    for arr in (x, y):
        got = round_to_integer(arr, Rounding.RNE)
        with np.errstate(invalid="ignore"):
            want = np.rint(arr)
        fin = np.isfinite(arr)
        assert np.array_equal(got[fin].view(np.uint64), want[fin].view(np.uint64))
        assert np.array_equal(np.isnan(got), np.isnan(arr))


@settings(deadline=None, database=None)
@given(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(MODES))
def test_round_to_integer_hypothesis(x, mode):
    got = round_to_integer(np.array([x]), mode)[0]
    assert got == frac_round(Fraction(x), mode)
    assert np.signbit(got) == np.signbit(x)


@settings(deadline=None, database=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False), st.sampled_from(MODES))
def test_round_to_integer_float32_input_is_widened_exactly(x, mode):
    got = round_to_integer(np.array([x], dtype=np.float32), mode)
    assert got.dtype == np.float64
    assert got[0] == frac_round(Fraction(x), mode)


@settings(deadline=None, database=None)
@given(st.integers(0, 2**60 - 1), st.integers(0, 200), st.sampled_from(MODES))
def test_round_scaled_significand_vs_fraction(sig, shift, mode):
    got = int(round_scaled_significand(np.array([sig], dtype=np.uint64), np.array([shift]), mode)[0])
    assert got == frac_round(Fraction(sig, 2**shift), mode)


def test_round_scaled_significand_guard_and_sticky_edges():
    # sig = 0b1011, shift 2 -> 10.11b = 2.75; shift 1 -> 101.1b = 5.5 (tie, odd kept part)
    for sig, shift, want in [(0b1011, 2, {"rne": 3, "rhaz": 3, "rtz": 2, "rhtz": 3}),
                             (0b1011, 1, {"rne": 6, "rhaz": 6, "rtz": 5, "rhtz": 5}),
                             (0b1010, 2, {"rne": 2, "rhaz": 3, "rtz": 2, "rhtz": 2}),
                             (2**59 + 1, 61, {"rne": 0, "rhaz": 0, "rtz": 0, "rhtz": 0}),
                             (2**59 + 1, 60, {"rne": 1, "rhaz": 1, "rtz": 0, "rhtz": 1}),
                             (2**59, 60, {"rne": 0, "rhaz": 1, "rtz": 0, "rhtz": 0}),
                             (2**59 + 1, 500, {"rne": 0, "rhaz": 0, "rtz": 0, "rhtz": 0})]:
        for mode, w in want.items():
            assert int(round_scaled_significand(np.array([sig], np.uint64), np.array([shift]), mode)[0]) == w
            assert frac_round(Fraction(sig, 2**shift), Rounding(mode)) == w
    with pytest.raises(ValueError):
        round_scaled_significand(np.array([1], np.uint64), np.array([-1]), "rne")
    with pytest.raises(ValueError):
        round_scaled_significand(np.array([2**60], np.uint64), np.array([1]), "rne")


def test_rounding_parse():
    assert Rounding.parse("RNE") is Rounding.RNE
    assert Rounding.parse(Rounding.RHTZ) is Rounding.RHTZ
    assert Rounding.parse("rhaz") is Rounding.RHAZ
    with pytest.raises(ValueError, match="unknown rounding mode"):
        Rounding.parse("nearest")


# --------------------------------------------------------------------------- quantize_to_int

def _oracle_q(x: float, lo: int, hi: int, mode: Rounding) -> int:
    if math.isinf(x):
        return hi if x > 0 else lo
    return min(max(frac_round(Fraction(x), mode), lo), hi)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("lo,hi", [(-128, 127), (-8, 7), (0, 15), (0, 255), (-(2**31), 2**31 - 1)])
def test_quantize_to_int_saturation(mode, lo, hi):
    edge = [lo - 0.5, lo - 0.25, lo + 0.5, hi + 0.5, hi - 0.5, hi + 0.49, lo - 0.51, 1e300, -1e300, np.inf, -np.inf]
    x = np.concatenate([CONSTRUCTED, np.array(edge, dtype=np.float64)])
    got = quantize_to_int(x, lo, hi, mode)
    assert got.dtype == np.int32
    want = [_oracle_q(v, lo, hi, mode) for v in x.tolist()]
    assert got.tolist() == want


def test_quantize_to_int_boundary_ties():
    x = np.array([127.5, -128.5, 126.5, -127.5])
    assert quantize_to_int(x, -128, 127, "rne").tolist() == [127, -128, 126, -128]
    assert quantize_to_int(x, -128, 127, "rhaz").tolist() == [127, -128, 127, -128]
    assert quantize_to_int(x, -128, 127, "rhtz").tolist() == [127, -128, 126, -127]
    assert quantize_to_int(x, -128, 127, "rtz").tolist() == [127, -128, 126, -127]


def test_quantize_to_int_nan_rules():
    x = np.array([1.5, np.nan, -np.nan, 2.5])
    assert quantize_to_int(x, -8, 7, "rne", nan=NanToInt.ZERO).tolist() == [2, 0, 0, 2]
    assert quantize_to_int(x, -8, 7, "rne", nan="zero").tolist() == [2, 0, 0, 2]
    with pytest.raises(ValueError, match=r"layer0\.weight: NaN.*2 NaN"):
        quantize_to_int(x, -8, 7, "rne", what="layer0.weight")
    with pytest.raises(ValueError):
        quantize_to_int(x, -8, 7, "rne", nan="ignore")


@settings(deadline=None, database=None)
@given(st.floats(allow_nan=False), st.sampled_from(MODES), st.sampled_from([(-128, 127), (-8, 7), (0, 15)]))
def test_quantize_to_int_hypothesis(x, mode, rng):
    lo, hi = rng
    assert quantize_to_int(np.array([x]), lo, hi, mode)[0] == _oracle_q(x, lo, hi, mode)


def test_as_float64_widening():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    b = np.array([1.5, -0.0, 3.0e38, 1e-40], dtype=np.float32).astype(ml_dtypes.bfloat16)
    got = as_float64(b)
    assert np.array_equal(got, b.astype(np.float64))
    assert np.signbit(got[1])
    assert np.array_equal(as_float64(np.array([1, -2], np.int8)), [1.0, -2.0])
    with pytest.raises(TypeError):
        as_float64(np.array(["a"]))
    # other 1-byte ml_dtypes floats must not be misread as bfloat16 bit pairs
    with pytest.raises(TypeError):
        as_float64(np.array([1.0, 2.0], dtype=ml_dtypes.float4_e2m1fn))
    with pytest.raises(TypeError):
        as_float64(np.array([1.0, 2.0], dtype=ml_dtypes.float8_e4m3fn))
