"""fp32 / fp16 / bf16 conversion against numpy, ml_dtypes, torch and an exact Fraction oracle.

What each oracle is trusted for (each fact below is asserted, not assumed):
- numpy ``astype(float32)`` from float64 and ``astype(float16)`` from float32/float64:
  correctly rounded (RNE) direct conversions; numpy fp16 NaN payloads are *not* quieted
  (documented divergence, see test_nan_payloads_fp16).
- ml_dtypes ``bfloat16``: RNE from float32; from float64 it goes *through float32*
  (double rounding), so float64 -> bf16 is checked against the Fraction oracle instead.
- torch: RNE from float32; float64 -> bf16 *and* float64 -> fp16 also go through float32
  (double rounding); bf16 NaN results are canonical (payload and sign dropped).
- ``oracle_round``: exact rounding of a Fraction to a (man_bits, emin, emax) grid under each
  rule, written from the IEEE 754 definition, sharing no code with the emulator.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.numerics.floats import BF16, E2M1, FP16, FP32, FloatFormat, Overflow, decode, encode, round_to_dtype, round_to_format
from emulator.numerics.rounding import Rounding

ml_dtypes = pytest.importorskip("ml_dtypes")

MODES = list(Rounding)
IEEE = [FP32, FP16, BF16]
HALF = Fraction(1, 2)


# --------------------------------------------------------------------------- oracle

def _round_int(q: Fraction, mode: Rounding) -> int:
    """q >= 0 -> integer by the mode's rule (nearest modes differ only on exact ties)."""
    lo = q.numerator // q.denominator
    rem = q - lo
    if mode is Rounding.RTZ or rem < HALF:
        return lo
    if rem > HALF:
        return lo + 1
    return {Rounding.RNE: lo + (lo & 1), Rounding.RHAZ: lo + 1, Rounding.RHTZ: lo}[mode]


def _pow2(k: int) -> Fraction:
    return Fraction(2) ** k


def _floor_log2(a: Fraction) -> int:
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while _pow2(e) > a:
        e -= 1
    while _pow2(e + 1) <= a:
        e += 1
    return e


def oracle_round(x: float, man_bits: int, emin: int, emax: int, mode: Rounding,
                 saturate: bool = False) -> float:
    """Exact value of x rounded to the binary format, as a float (sign of zero kept).

    Overflow (IEEE 754 §7.4): a finite value whose rounded magnitude exceeds max becomes Inf
    under the nearest modes and max under RTZ; ``saturate`` makes it max under every mode.
    """
    if np.isnan(x):
        return float("nan")
    neg = np.signbit(x)
    if np.isinf(x):
        mag = float("inf")
    else:
        a = abs(Fraction(x))
        if a == 0:
            mag = 0.0
        else:
            quantum = _pow2(max(_floor_log2(a), emin) - man_bits)
            v = _round_int(a / quantum, mode) * quantum
            maxf = (_pow2(man_bits + 1) - 1) * _pow2(emax - man_bits)
            if v > maxf:
                v = maxf if (saturate or mode is Rounding.RTZ) else None
            mag = float("inf") if v is None else float(v)
    # (saturation applies to finite values that overflow; an Inf input stays Inf in IEEE formats)
    return -mag if neg else mag


_PARAMS = {"fp32": (23, -126, 127), "fp16": (10, -14, 15), "bf16": (7, -126, 127)}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as float64 values including the sign of zero and NaN positions."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan], b[~nan])
                and np.array_equal(np.signbit(a[~nan]), np.signbit(b[~nan])))


def _torch_bits(x: np.ndarray, dtype_name: str) -> np.ndarray:
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(np.ascontiguousarray(x)).to(getattr(torch, dtype_name))
    itype = {2: torch.int16, 4: torch.int32}[t.element_size()]
    utype = {2: np.uint16, 4: np.uint32}[t.element_size()]
    return t.view(itype).numpy().view(utype)


def _np_bits(x: np.ndarray, dtype) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.asarray(x).astype(dtype)
    return y.view({2: np.uint16, 4: np.uint32}[y.dtype.itemsize])


# --------------------------------------------------------------------------- input sets

RNG = np.random.default_rng(20240917)


def random_f32_bits(n: int) -> np.ndarray:
    return RNG.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def random_f64_in_range(n: int, lo: int, hi: int) -> np.ndarray:
    """float64 with random 52-bit mantissas and exponents in [lo, hi], random sign."""
    man = RNG.integers(0, 2**52, size=n, dtype=np.uint64)
    exp = RNG.integers(lo + 1023, hi + 1023 + 1, size=n).astype(np.uint64)
    sign = RNG.integers(0, 2, size=n, dtype=np.uint64)
    return ((sign << np.uint64(63)) | (exp << np.uint64(52)) | man).view(np.float64)


def all_positive_finite(fmt_bits: int, fmt: FloatFormat) -> np.ndarray:
    codes = np.arange(2 ** (fmt_bits - 1), dtype=np.uint32)
    vals = decode(codes, fmt)
    return vals[np.isfinite(vals)]


def midpoints_and_neighbours(fmt: FloatFormat) -> np.ndarray:
    """Every tie between consecutive positive values (incl. max -> 2**(emax+1)) and +-1 fp32 ulp."""
    v = all_positive_finite(fmt.bits, fmt)
    v = np.append(v, 2.0 ** (fmt.emax + 1))  # the overflow threshold is the midpoint max..2**(emax+1)
    mids = (v[:-1] + v[1:]) / 2
    m32 = mids.astype(np.float32)
    assert np.array_equal(m32.astype(np.float64), mids)  # ties of fp16/bf16 are exact in fp32
    up = np.nextafter(m32, np.float32(np.inf))
    dn = np.nextafter(m32, np.float32(0))
    with np.errstate(over="ignore"):
        out = np.concatenate([m32, up, dn, v.astype(np.float32)])  # 2**(emax+1) is Inf in fp32 for bf16
    return np.concatenate([out, -out])


def boundary_values(fmt: FloatFormat) -> np.ndarray:
    mx = fmt.max_finite
    half_ulp = 2.0 ** (fmt.emax - fmt.man_bits - 1)
    t = mx + half_ulp
    d = fmt.smallest_subnormal
    vals = [mx, t, np.nextafter(t, 0), np.nextafter(t, np.inf), 2.0 ** (fmt.emax + 1),
            d, d / 2, np.nextafter(d / 2, 0), np.nextafter(d / 2, 1), 1.5 * d, 2.5 * d,
            2.0 ** fmt.emin, 2.0 ** fmt.emin - d / 2, 0.0, -0.0, np.inf]
    vals = [float(v) for v in vals]
    return np.array(vals + [-v for v in vals])


# --------------------------------------------------------------------------- decode

def test_decode_all_fp16_patterns_vs_numpy():
    b = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    assert _same(decode(b, FP16), b.view(np.float16).astype(np.float64))


def test_decode_all_bf16_patterns_vs_ml_dtypes_and_torch():
    b = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = decode(b, BF16)
    with np.errstate(invalid="ignore"):
        assert _same(got, b.view(ml_dtypes.bfloat16).astype(np.float64))
    torch = pytest.importorskip("torch")
    tv = torch.from_numpy(b.view(np.int16).copy()).view(torch.bfloat16).to(torch.float64).numpy()
    assert _same(got, tv)


def test_decode_fp32_random_patterns_vs_numpy():
    x = random_f32_bits(200_000)
    with np.errstate(invalid="ignore"):
        assert _same(decode(x.view(np.uint32), FP32), x.astype(np.float64))


@pytest.mark.parametrize("fmt", [FP16, BF16])
def test_encode_decode_round_trip_every_non_nan_pattern(fmt):
    b = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    v = decode(b, fmt)
    keep = ~np.isnan(v)
    assert np.array_equal(encode(v[keep], fmt), b[keep])
    assert keep.sum() == 65536 - 2 * (2 ** fmt.man_bits - 1)


def test_encode_decode_round_trip_fp32_random():
    x = random_f32_bits(300_000)
    x = x[~np.isnan(x)]
    assert np.array_equal(encode(decode(x.view(np.uint32), FP32), FP32), x.view(np.uint32))


def test_decode_rejects_out_of_range_patterns():
    with pytest.raises(ValueError):
        decode(np.array([65536], np.uint32), FP16)


# --------------------------------------------------------------------------- fp32

def test_fp32_from_float64_vs_numpy_and_torch_bit_exact():
    x = np.concatenate([
        RNG.integers(0, 2**64, size=100_000, dtype=np.uint64).view(np.float64),  # incl. NaN payloads
        random_f64_in_range(200_000, -160, 130),
        boundary_values(FP32),
    ])
    got = encode(x, FP32)
    assert np.array_equal(got, _np_bits(x, np.float32))
    assert np.array_equal(got, _torch_bits(x, "float32"))


# --------------------------------------------------------------------------- fp16

def test_fp16_from_float32_random_bits_vs_numpy_and_torch():
    x = np.concatenate([random_f32_bits(200_000),
                        random_f64_in_range(100_000, -30, 17).astype(np.float32)])
    got = encode(x, FP16)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], _np_bits(x[~nan], np.float16))
    # torch keeps the NaN convention too (quiet bit, sign, top payload bits): all bits equal
    assert np.array_equal(got, _torch_bits(x, "float16"))


def test_fp16_ties_at_every_exponent_vs_numpy_and_torch():
    x = midpoints_and_neighbours(FP16)
    got = encode(x, FP16)
    assert np.array_equal(got, _np_bits(x, np.float16))
    assert np.array_equal(got, _torch_bits(x, "float16"))


def test_fp16_from_float64_vs_numpy_direct_rounding():
    x = np.concatenate([random_f64_in_range(200_000, -30, 17), boundary_values(FP16),
                        midpoints_and_neighbours(FP16).astype(np.float64)])
    # float64 neighbours of the fp16 ties: exercise sticky bits below fp32 precision
    t = midpoints_and_neighbours(FP16).astype(np.float64)
    x = np.concatenate([x, np.nextafter(t, np.inf), np.nextafter(t, -np.inf)])
    assert np.array_equal(encode(x, FP16), _np_bits(x, np.float16))


def test_torch_fp16_from_float64_double_rounds_through_fp32():
    """Documented divergence: torch float64 -> float16 rounds to float32 first."""
    x = np.array([1 + 2.0**-11 + 2.0**-40, -(1 + 2.0**-11 + 2.0**-40)])
    assert encode(x, FP16).tolist() == [0x3C01, 0xBC01]          # qconform: direct RNE (above the tie)
    assert _np_bits(x, np.float16).tolist() == [0x3C01, 0xBC01]  # numpy agrees
    assert _torch_bits(x, "float16").tolist() == [0x3C00, 0xBC00]  # torch: 1+2^-11 is a tie in fp32 -> even
    y = random_f64_in_range(100_000, -30, 17)
    assert np.array_equal(_torch_bits(y, "float16"), encode(y.astype(np.float32), FP16))


# --------------------------------------------------------------------------- bf16

def test_bf16_from_float32_random_bits_vs_ml_dtypes_and_torch():
    with np.errstate(over="ignore"):
        x = np.concatenate([random_f32_bits(300_000), boundary_values(BF16).astype(np.float32)])
    got = encode(x, BF16)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], _np_bits(x[~nan], ml_dtypes.bfloat16))
    assert np.array_equal(got[~nan], _torch_bits(x[~nan], "bfloat16"))


def test_bf16_ties_at_every_exponent_vs_ml_dtypes_and_torch():
    x = midpoints_and_neighbours(BF16)
    got = encode(x, BF16)
    assert np.array_equal(got, _np_bits(x, ml_dtypes.bfloat16))
    assert np.array_equal(got, _torch_bits(x, "bfloat16"))


def test_bf16_from_float64_vs_fraction_oracle():
    """qconform rounds float64 -> bf16 directly; checked against the exact oracle."""
    t = midpoints_and_neighbours(BF16).astype(np.float64)
    full = RNG.integers(0, 2**64, size=500, dtype=np.uint64).view(np.float64)
    x = np.concatenate([random_f64_in_range(3000, -140, 128), boundary_values(BF16), full[~np.isnan(full)],
                        RNG.choice(t, 1000), np.nextafter(RNG.choice(t, 1000), np.inf),
                        np.nextafter(RNG.choice(t, 1000), -np.inf)])
    got = round_to_format(x, BF16)
    want = np.array([oracle_round(v, *_PARAMS["bf16"], Rounding.RNE) for v in x.tolist()])
    assert _same(got, want)


def test_ml_dtypes_and_torch_bf16_from_float64_double_round():
    """Documented divergence: ml_dtypes and torch convert float64 -> bf16 through float32."""
    x = np.array([1 + 2.0**-8 + 2.0**-30, -(1 + 2.0**-8 + 2.0**-30)])
    assert encode(x, BF16).tolist() == [0x3F81, 0xBF81]  # exact: just above the tie -> up
    assert _np_bits(x, ml_dtypes.bfloat16).tolist() == [0x3F80, 0xBF80]
    assert _torch_bits(x, "bfloat16").tolist() == [0x3F80, 0xBF80]
    # on arbitrary float64 both equal qconform applied after an fp32 RNE step
    # random values, plus values just above a bf16 tie that float32 rounds onto it (in random data such
    # values are about 1 in 2**16, so 100,000 draws may hold none: the crafted ones make the check certain)
    y = np.concatenate([random_f64_in_range(100_000, -140, 127), x, x * 2.0 ** -100, x * 2.0 ** 100])
    model = encode(y.astype(np.float32), BF16)
    assert np.array_equal(_np_bits(y, ml_dtypes.bfloat16), model)
    assert np.array_equal(_torch_bits(y, "bfloat16"), model)
    assert not np.array_equal(encode(y, BF16), model)  # the double rounding is observable


# --------------------------------------------------------------------------- NaN payloads

_NAN32 = np.array([0x7F800001, 0xFF800001, 0x7FA00000, 0xFFD00000, 0x7FC00001, 0x7F802000, 0x7FFFFFFF],
                  dtype=np.uint32)
_NAN64 = np.array([0x7FF0000000000001, 0xFFF0000000000001, 0x7FF4000000000000, 0xFFFA000000000000,
                   0x7FF8000000000000, 0x7FFFFFFFFFFFFFFF], dtype=np.uint64)


def test_nan_payloads_fp32_match_numpy_and_torch():
    x = _NAN64.view(np.float64)
    got = encode(x, FP32)
    assert [hex(v) for v in got] == ["0x7fc00000", "0xffc00000", "0x7fe00000", "0xffd00000", "0x7fc00000",
                                     "0x7fffffff"]
    assert np.array_equal(got, _np_bits(x, np.float32))
    assert np.array_equal(got, _torch_bits(x, "float32"))


def test_nan_payloads_fp16():
    x = _NAN32.view(np.float32)
    got = encode(x, FP16)
    # qconform: sign, top 9 payload bits, quiet bit set
    assert [hex(v) for v in got] == ["0x7e00", "0xfe00", "0x7f00", "0xfe80", "0x7e00", "0x7e01", "0x7fff"]
    assert np.array_equal(got, _torch_bits(x, "float16"))  # torch: identical
    assert np.array_equal(encode(_NAN64.view(np.float64), FP16), _torch_bits(_NAN64.view(np.float64), "float16"))
    # Documented divergence: numpy keeps the payload without setting the quiet bit, and keeps an
    # sNaN a NaN by setting the lowest payload bit when the kept payload would be zero.
    assert [hex(v) for v in _np_bits(x, np.float16)] == ["0x7c01", "0xfc01", "0x7d00", "0xfe80", "0x7e00",
                                                         "0x7c01", "0x7fff"]


def test_nan_payloads_bf16():
    x = _NAN32.view(np.float32)
    got = encode(x, BF16)
    assert [hex(v) for v in got] == ["0x7fc0", "0xffc0", "0x7fe0", "0xffd0", "0x7fc0", "0x7fc0", "0x7fff"]
    # Documented divergence: ml_dtypes keeps only the sign (payload canonical 0x7FC0)
    assert [hex(v) for v in _np_bits(x, ml_dtypes.bfloat16)] == ["0x7fc0", "0xffc0", "0x7fc0", "0xffc0", "0x7fc0",
                                                                 "0x7fc0", "0x7fc0"]
    # Documented divergence: torch returns one canonical NaN whatever the input's sign and payload;
    # which one depends on the kernel path (vectorised fp32 -> bf16 gives 0xFFFF, scalar 0x7FC0).
    tb = _torch_bits(x, "bfloat16")
    assert len(set(tb.tolist())) == 1 and int(tb[0]) in (0x7FC0, 0xFFFF)
    t64 = _torch_bits(_NAN64.view(np.float64), "bfloat16")
    assert len(set(t64.tolist())) == 1 and int(t64[0]) in (0x7FC0, 0xFFFF)


# --------------------------------------------------------------------------- boundaries, all modes

@pytest.mark.parametrize("fmt", [FP16, BF16])
def test_overflow_and_subnormal_boundaries_rne(fmt):
    mx = fmt.max_finite
    t = mx + 2.0 ** (fmt.emax - fmt.man_bits - 1)
    d = fmt.smallest_subnormal
    got = round_to_format(np.array([t, np.nextafter(t, 0), np.nextafter(t, np.inf), d / 2,
                                    np.nextafter(d / 2, 1), 1.5 * d, -t, -d / 2]), fmt)
    assert got[0] == np.inf and got[1] == mx and got[2] == np.inf
    assert got[3] == 0 and got[4] == d and got[5] == 2 * d
    assert got[6] == -np.inf and got[7] == 0 and np.signbit(got[7])
    lib = np.float16 if fmt is FP16 else ml_dtypes.bfloat16
    x32 = np.array([t, np.nextafter(np.float32(t), np.float32(0)), np.nextafter(np.float32(t), np.float32(np.inf)),
                    d / 2, 1.5 * d], dtype=np.float32)
    assert np.array_equal(encode(x32, fmt), _np_bits(x32, lib))


@pytest.mark.parametrize("fmt", IEEE)
@pytest.mark.parametrize("mode", MODES)
def test_all_modes_vs_fraction_oracle(fmt, mode):
    man, emin, emax = _PARAMS[fmt.name]
    x = np.concatenate([
        boundary_values(fmt),
        random_f64_in_range(1500, emin - man - 3, emax + 1),
        np.array([1.0 + 2.0 ** -(man + 1), 1.0 + 3 * 2.0 ** -(man + 1), -(1.0 + 2.0 ** -(man + 1))]),
    ])
    if fmt is not FP32:
        x = np.concatenate([x, RNG.choice(midpoints_and_neighbours(fmt).astype(np.float64), 1500)])
    else:  # fp32 ties: a random fp32 value plus exactly half its ulp (normal and subnormal binades)
        base = np.concatenate([random_f64_in_range(700, -126, 127), random_f64_in_range(300, -149, -127)])
        base = base.astype(np.float32).astype(np.float64)
        half_ulp = (np.abs(np.nextafter(base.astype(np.float32), np.float32(np.inf)).astype(np.float64)) - np.abs(base)) / 2
        ties = base + np.copysign(np.abs(half_ulp), base)
        x = np.concatenate([x, ties, np.nextafter(ties, 0), np.nextafter(ties, np.inf)])
    got = round_to_format(x, fmt, mode)
    want = np.array([oracle_round(v, man, emin, emax, mode) for v in x.tolist()])
    assert _same(got, want)
    sat = round_to_format(x, fmt, mode, Overflow.SATURATE)
    want_sat = np.array([oracle_round(v, man, emin, emax, mode, saturate=True) for v in x.tolist()])
    assert _same(sat, want_sat)


@settings(deadline=None, database=None)
@given(st.floats(allow_nan=False), st.sampled_from(IEEE), st.sampled_from(MODES))
def test_round_to_format_hypothesis(x, fmt, mode):
    got = round_to_format(np.array([x]), fmt, mode)
    assert _same(got, np.array([oracle_round(x, *_PARAMS[fmt.name], mode)]))


@settings(deadline=None, database=None)
@given(st.floats(width=32))
def test_bf16_fp16_from_float32_hypothesis(x):
    a = np.array([x], dtype=np.float32)
    if np.isnan(a[0]):
        return
    assert np.array_equal(encode(a, BF16), _np_bits(a, ml_dtypes.bfloat16))
    assert np.array_equal(encode(a, FP16), _np_bits(a, np.float16))


def test_rtz_overflow_saturates_and_ieee_infinities():
    x = np.array([1e6, -1e6, np.inf, -np.inf])
    assert round_to_format(x, FP16, "rtz").tolist() == [65504.0, -65504.0, np.inf, -np.inf]
    assert round_to_format(x, FP16, "rne").tolist() == [np.inf, -np.inf, np.inf, -np.inf]
    assert round_to_format(x, FP16, "rne", "saturate").tolist() == [65504.0, -65504.0, np.inf, -np.inf]
    assert encode(np.array([np.inf, -np.inf, -0.0]), FP16).tolist() == [0x7C00, 0xFC00, 0x8000]


def test_e2m1_grid_and_round_to_dtype_aliases():
    # E2M1 has no Inf: overflow and Inf saturate at +-6
    assert round_to_format(np.array([7.0, np.inf, -np.inf, 1e300]), E2M1).tolist() == [6.0, 6.0, -6.0, 6.0]
    assert E2M1.max_finite == 6.0 and E2M1.smallest_subnormal == 0.5 and E2M1.emax == 2
    assert FP16.max_finite == 65504.0 and BF16.max_finite == float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    assert BF16.smallest_subnormal == float(ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_subnormal)
    x = random_f64_in_range(1000, -20, 10)
    for name, fmt in [("float32", FP32), ("float16", FP16), ("bfloat16", BF16), ("half", FP16)]:
        assert _same(round_to_dtype(x, name), round_to_format(x, fmt))
    with pytest.raises(ValueError):
        round_to_dtype(x, "float8")
    with pytest.raises(ValueError, match="no NaN encoding"):
        encode(np.array([np.nan]), E2M1)
