"""``emulator.numerics.sqnr.sqnr_db``: hand-derived values for every convention its docstring names."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from emulator.numerics.sqnr import sqnr_db


def test_hand_derived_values():
    # signal 3^2 + 4^2 = 25, noise 0.5^2 = 0.25: 10 log10(100) = 20 dB
    assert sqnr_db(np.array([3.0, 4.5]), np.array([3.0, 4.0])) == pytest.approx(20.0, abs=1e-12)
    # signal 100, noise 2 * 0.125^2 = 1/32: 10 log10(3200) = 35.0515 dB
    assert sqnr_db(np.array([10.125, -0.125]), np.array([10.0, 0.0])) == pytest.approx(10 * math.log10(3200), abs=1e-12)
    # argument order: y first, the reference second (swapping changes the signal)
    assert sqnr_db(np.array([3.0, 4.0]), np.array([3.0, 4.5])) == pytest.approx(10 * math.log10(29.25 / 0.25), abs=1e-12)


def test_equal_and_empty_are_plus_infinity():
    assert sqnr_db(np.array([1.0, -2.0]), np.array([1.0, -2.0])) == math.inf
    assert sqnr_db(np.zeros(3), np.zeros(3)) == math.inf  # no signal and no noise
    assert sqnr_db(np.empty(0), np.empty(0)) == math.inf  # nothing compared


def test_zero_reference_with_noise_is_minus_infinity():
    assert sqnr_db(np.array([0.0, 1e-30]), np.zeros(2)) == -math.inf


def test_non_finite_output_is_minus_infinity():
    """A NaN or Inf output where the reference is finite is infinite noise: never above any floor."""
    ref = np.array([3.0, 4.0])
    assert sqnr_db(np.array([3.0, np.nan]), ref) == -math.inf
    assert sqnr_db(np.array([np.inf, 4.0]), ref) == -math.inf
    assert sqnr_db(np.array([-np.inf, 4.0]), ref) == -math.inf


def test_non_finite_reference_elements_are_not_compared():
    # the NaN / Inf reference elements drop out: 20 dB as in test_hand_derived_values
    y = np.array([3.0, 7.0, 4.5, 1.0])
    ref = np.array([3.0, np.nan, 4.0, np.inf])
    assert sqnr_db(y, ref) == pytest.approx(20.0, abs=1e-12)


def test_where_selects_the_compared_elements():
    y, ref = np.array([3.0, 100.0, 4.5]), np.array([3.0, 0.0, 4.0])
    assert sqnr_db(y, ref, where=np.array([True, False, True])) == pytest.approx(20.0, abs=1e-12)
    # a NaN output outside ``where`` is not compared either
    assert sqnr_db(np.array([3.0, np.nan, 4.5]), ref, where=np.array([True, False, True])) == pytest.approx(20.0)


def test_float64_accumulation_of_narrow_inputs():
    """float32 / bfloat16 inputs are widened exactly and summed in float64."""
    ref = np.array([2.0 ** 66], np.float32)  # 7.4e19: its square overflows float32
    y = (ref.astype(np.float64) * (1 + 2.0 ** -10)).astype(np.float32)  # one relative error of exactly 2^-10
    assert sqnr_db(y, ref) == pytest.approx(20 * math.log10(2.0 ** 10), abs=1e-9)  # 60.206 dB
    rb = np.array([3.0, 4.0]).astype(ml_dtypes.bfloat16)
    yb = np.array([3.0, 4.5]).astype(ml_dtypes.bfloat16)
    assert sqnr_db(yb, rb) == pytest.approx(20.0, abs=1e-12)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shape"):
        sqnr_db(np.zeros(3), np.zeros(4))
