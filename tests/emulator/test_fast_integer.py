"""``fast_integer.round_to_integer_fast`` / ``quantize_to_int_fast`` against the definitions in numerics/rounding.py.

Regression gate: the fast functions are compared with the readable definitions (``round_to_integer``,
``quantize_to_int``: guard/sticky rounding of the float64 significand, themselves checked against Fractions and
hand-derived values in tests/emulator/test_rounding.py), bit for bit (so -0 != +0), in every mode. Exhaustive
over every float16 value (all 2^16 patterns, widened to float32 and float64: every tie, subnormal, NaN, Inf),
every float32 pattern whose low 16 bits are an edge value (every exponent, sign and upper significand), and every
float32 of the int8 saturation neighbourhoods [126, 129] and [-129, -126]; random float32 / float64 with ties
and halves by Hypothesis. All 2^32 float32 patterns: tests/emulator/exhaustive_fast_integer.py (by hand).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from emulator.numerics.fast_integer import quantize_to_int_fast, round_to_integer_fast
from emulator.numerics.rounding import NanToInt, Rounding, quantize_to_int, round_to_integer

MODES = list(Rounding)


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Where the float64 bit patterns agree, NaN == NaN of any payload."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a64.view(np.uint64) == b64.view(np.uint64)) | (np.isnan(a64) & np.isnan(b64))


def _check_rounding(x: np.ndarray, mode: Rounding) -> None:
    want = round_to_integer(x, mode)
    got = round_to_integer_fast(x, mode)
    assert got.dtype == x.dtype
    ok = _same_bits(want, got)
    if not ok.all():
        i = int(np.flatnonzero(~ok.reshape(-1))[0])
        v = x.reshape(-1)[i]
        pytest.fail(f"{mode.value}: {v!r} (bits {np.asarray(v).view(np.uint32 if x.dtype == np.float32 else np.uint64)!r})"
                    f" -> {got.reshape(-1)[i]!r}, the definition gives {want.reshape(-1)[i]!r}")


def _every_float16() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


def _float32_edges() -> np.ndarray:
    hi = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    return (hi[:, None] | lows[None, :]).reshape(-1).view(np.float32)


def _float32_between(lo: float, hi: float) -> np.ndarray:
    """Every float32 in [lo, hi] (0 < lo < hi), both signs."""
    a, b = np.array([lo, hi], np.float32).view(np.uint32)
    pos = np.arange(a, b + 1, dtype=np.uint32).view(np.float32)
    return np.concatenate([pos, -pos])


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_every_float16_value_in_float32_and_float64(mode):
    h = _every_float16()
    _check_rounding(h.astype(np.float32), mode)
    _check_rounding(h.astype(np.float64), mode)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_every_float32_exponent_and_upper_significand(mode):
    _check_rounding(_float32_edges(), mode)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_every_float32_near_int8_saturation(mode):
    _check_rounding(_float32_between(126.0, 129.0), mode)


def test_hand_derived_values():
    """Independent of the definition: the four modes' tables (docs/formats.md#rounding-modes)."""
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, -0.3, 2.0 ** 23 - 0.5, 126.5, -127.5], np.float32)
    want = {Rounding.RNE: [0, 2, 2, -0.0, -2, -2, 0, -0.0, 2.0 ** 23, 126, -128],
            Rounding.RHAZ: [1, 2, 3, -1, -2, -3, 0, -0.0, 2.0 ** 23, 127, -128],
            Rounding.RTZ: [0, 1, 2, -0.0, -1, -2, 0, -0.0, 2.0 ** 23 - 1, 126, -127],
            Rounding.RHTZ: [0, 1, 2, -0.0, -1, -2, 0, -0.0, 2.0 ** 23 - 1, 126, -127]}
    for mode, w in want.items():
        got = round_to_integer_fast(x, mode)
        assert np.array_equal(np.asarray(w, np.float32).view(np.uint32), got.view(np.uint32)), mode


_ties = st.integers(-(2 ** 23), 2 ** 23).map(lambda k: k + 0.5)
_f64 = st.one_of(st.floats(allow_nan=True, allow_infinity=True), _ties,
                 st.floats(min_value=-2.0 ** 54, max_value=2.0 ** 54), st.floats(-4.0, 4.0))
_f32 = st.one_of(st.floats(width=32), _ties.filter(lambda v: abs(v) < 2 ** 22), st.floats(-300.0, 300.0, width=32))


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float64, st.integers(1, 64), elements=_f64), st.sampled_from(MODES))
def test_random_float64(x, mode):
    _check_rounding(x, mode)


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 64), elements=_f32), st.sampled_from(MODES))
def test_random_float32(x, mode):
    _check_rounding(x, mode)


_bounds = st.sampled_from([(-128, 127), (-127, 127), (0, 255), (-(2 ** 31) + 1, 2 ** 31 - 1), (-(2 ** 31), 2 ** 31 - 1),
                           (-5, 3)])
_wide = st.one_of(st.floats(width=32), st.sampled_from([2.0 ** 31, -(2.0 ** 31), 2.0 ** 31 - 128, 3e38, -3e38, 127.5,
                                                        -128.5, 255.5]))


@settings(max_examples=400, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 48), elements=_wide), _bounds, st.sampled_from(MODES),
       st.sampled_from([NanToInt.ZERO, NanToInt.LOW, NanToInt.RAISE]), st.booleans())
def test_quantize_to_int_saturates_and_maps_nan_as_defined(x, bounds, mode, nan, wide):
    """Saturation to int8 and int32 ranges (float32 values at and beyond 2^31, +-Inf), NaN by each rule."""
    x = x.astype(np.float64) if wide else x
    lo, hi = bounds
    try:
        want = quantize_to_int(x, lo, hi, mode, nan=nan, what="q")
    except ValueError as e:
        with pytest.raises(ValueError, match="NaN cannot be quantized") as got:
            quantize_to_int_fast(x, lo, hi, mode, nan=nan, what="q")
        assert str(got.value) == str(e)
        return
    got = quantize_to_int_fast(x, lo, hi, mode, nan=nan, what="q")
    assert got.dtype == np.int32 and np.array_equal(got, want)


def test_other_dtypes_go_to_the_definition():
    h = _every_float16()
    got = round_to_integer_fast(h, Rounding.RHAZ)
    assert got.dtype == np.float64 and _same_bits(got, round_to_integer(h, Rounding.RHAZ)).all()


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_the_input_is_kept_unless_it_may_be_overwritten(mode):
    x = _float32_between(126.0, 126.01)
    x[3] = np.nan
    keep = x.copy()
    want = quantize_to_int_fast(x, -128, 127, mode, nan=NanToInt.ZERO)
    assert np.array_equal(x.view(np.uint32), keep.view(np.uint32))
    got = quantize_to_int_fast(x, -128, 127, mode, nan=NanToInt.ZERO, overwrite_input=True)
    assert np.array_equal(got, want) and np.array_equal(want, quantize_to_int(keep, -128, 127, mode, nan=NanToInt.ZERO))
