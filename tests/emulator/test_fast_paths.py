"""Fast paths equal the specification paths bit for bit (the speed work must not change semantics)."""

import numpy as np
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

from emulator.formats.mxfp4 import dequantize_mxfp4, dequantize_mxfp4_packed, dequantize_mxfp4_gptoss
from emulator.numerics.e2m1 import unpack_e2m1
from emulator.numerics.fast_round import round_fast
from emulator.numerics.floats import round_to_dtype


def test_mxfp4_packed_fast_path_every_byte_and_scale():
    # every packed byte against every scale byte (incl. 0x00 subnormal scale, 0xFE overflow, 0xFF NaN)
    p = np.tile(np.arange(256, dtype=np.uint8), (256, 1))  # [256 scales, 256 bytes = 512 elements]
    p = p.reshape(256, 256)
    sb = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 512 // 32, axis=1)
    fast = dequantize_mxfp4_packed(p, sb)
    spec = dequantize_mxfp4(unpack_e2m1(p), sb, dtype=np.float32)
    assert fast.dtype == np.float32
    same = (fast == spec) | (np.isnan(fast) & np.isnan(spec))
    assert same.all()
    assert np.array_equal(np.signbit(fast), np.signbit(spec))  # -0 kept


@given(hnp.arrays(np.uint8, st.tuples(st.integers(1, 3), st.integers(1, 3), st.just(16))),
       st.integers(0, 255))
def test_gptoss_fast_path(blocks, scale):
    scales = np.full(blocks.shape[:-1], scale, np.uint8)
    fast = dequantize_mxfp4_gptoss(blocks, scales)
    spec = dequantize_mxfp4_gptoss(blocks, scales, dtype=np.float64).astype(np.float32)
    assert ((fast == spec) | (np.isnan(fast) & np.isnan(spec))).all()


def test_float32_output_rounding_fast_path_matches_the_bit_engine():
    rng = np.random.default_rng(5)
    b = rng.integers(0, 2 ** 32, 400_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    edge = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65520, 65519.996, 3.4028235e38, 1e-45,
                     1 + 2 ** -8, 1 + 2 ** -8 + 2 ** -20, 1 + 3 * 2 ** -8], dtype=np.float32)
    b = np.concatenate([b, edge])
    for d in ("float16", "bfloat16", "float32"):
        fast = round_fast(b, d)
        spec = round_to_dtype(b, d).astype(np.float32)
        assert ((fast == spec) | (np.isnan(fast) & np.isnan(spec))).all(), d
        assert np.array_equal(np.signbit(fast[~np.isnan(fast)]), np.signbit(spec[~np.isnan(spec)])), d


def test_float64_output_rounding_fast_path_matches_the_bit_engine():
    rng = np.random.default_rng(6)
    x = np.concatenate([
        rng.standard_normal(200_000) * 10.0 ** rng.integers(-40, 40, 200_000),
        rng.integers(0, 2 ** 64, 200_000, dtype=np.uint64).view(np.float64),
        # double-rounding traps: exactly representable midpoints of the 16-bit formats +- tiny
        np.array([1 + 2 ** -8 + 2 ** -30, 1 + 2 ** -8 - 2 ** -60, 1 + 2 ** -11 + 2 ** -40, 65519.99999999, 3.5e38,
                  0.0, -0.0, np.inf, -np.inf, np.nan])])
    for d in ("float32", "float16", "bfloat16"):
        with np.errstate(invalid="ignore", over="ignore"):
            fast = round_fast(x, d)
        spec = round_to_dtype(x, d).astype(np.float32)
        assert ((fast == spec) | (np.isnan(fast) & np.isnan(spec))).all(), d
