"""``emulator.numerics.fast_round.round_fast``, the one fast rounding to float32 / float16 / bfloat16.

Oracles, none of them the code under test:
- the grids themselves, enumerated from ml_dtypes' bfloat16 and NumPy's float16 bit patterns (every one of
  the 2**16), and float32's by ``np.nextafter``: the RNE / RTZ answer of any float64 x is decided by exact
  float64 comparisons with its two grid neighbours and their midpoint (hand-derived rule, ``grid_oracle``);
- library casts: ml_dtypes float32 -> bfloat16, NumPy float32 -> float16, NumPy float64 -> float32 (RNE);
- literal bit patterns for NaN payloads.
Inputs: every 16-bit grid value, every midpoint between neighbours and the float64 / float32 values next to
them (the narrow side exhaustively), the overflow thresholds, subnormals, +-0, +-Inf, NaNs, and a million
random float64 and float32 bit patterns.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from emulator.numerics.fast_round import round_fast
from emulator.numerics.floats import round_to_dtype

import fast_round_before as before

MODES = ("rne", "rtz")
DTYPES = ("float32", "float16", "bfloat16")


def _positive_grid(dtype: str) -> np.ndarray:
    """Every finite non-negative value of a 16-bit dtype, ascending (its bit patterns 0 .. max in order)."""
    bits = np.arange(0, 0x8000, dtype=np.uint16)
    with np.errstate(invalid="ignore"):  # the NaN patterns
        v = (bits.view(ml_dtypes.bfloat16) if dtype == "bfloat16" else bits.view(np.float16)).astype(np.float64)
    v = v[np.isfinite(v)]
    assert (np.diff(v) > 0).all()
    return v


GRIDS = {d: _positive_grid(d) for d in ("float16", "bfloat16")}
MAX = {"float32": float(np.finfo(np.float32).max), "float16": 65504.0, "bfloat16": float.fromhex("0x1.fep127")}


def _bracket(m: np.ndarray, dtype: str):
    """For |x| = m (finite, >= 0): the grid values a <= m < b (b: the notional next power of two beyond max)
    and whether a's bit pattern is even."""
    if dtype == "float32":
        with np.errstate(over="ignore"):
            f = m.astype(np.float32)  # either neighbour; step down where it is above m
        with np.errstate(over="ignore"):
            a = np.where(f.astype(np.float64) > m, np.nextafter(f, np.float32(0)), f).astype(np.float32)
        a = np.where(np.isinf(a), np.float32(MAX["float32"]), a)
        with np.errstate(over="ignore"):
            b = np.nextafter(a, np.float32(np.inf)).astype(np.float64)
        a_even = (a.view(np.uint32) & 1) == 0
        a = a.astype(np.float64)
        b = np.where(np.isinf(b), 2.0 ** 128, b)
        return a, b, a_even
    g = GRIDS[dtype]
    idx = np.searchsorted(g, m, side="right") - 1
    top = 2.0 ** (np.frexp(g[-1])[1])  # the power of two a float with more exponent range would hold next
    b = np.where(idx + 1 < g.size, g[np.minimum(idx + 1, g.size - 1)], top)
    return g[idx], b, idx % 2 == 0  # the positive patterns are 0, 1, 2, ...: the index is the pattern


def grid_oracle(x: np.ndarray, dtype: str, mode: str) -> np.ndarray:
    """Hand-derived rounding of finite-or-infinite float64 x (no NaN): float64 out."""
    m = np.abs(x)
    fin = np.isfinite(m)
    a, b, a_even = _bracket(np.where(fin, m, 0.0), dtype)
    if mode == "rtz":
        r = a  # |x| >= max gives max (a is max there)
    else:
        mid = (a + b) / 2  # exact in float64: a and b have at most 24 significand bits
        r = np.where(m < mid, a, np.where(m > mid, b, np.where(a_even, a, b)))
        r = np.where(r > MAX[dtype], np.inf, r)  # the notional b beyond max is Inf
    r = np.where(fin, r, m)
    return np.where(np.signbit(x), -r, r)


def _exhaustive_16(dtype: str) -> np.ndarray:
    """Every grid value, every midpoint and the float64 and float32 values either side of both, both signs."""
    g = GRIDS[dtype]
    nxt = np.append(g[1:], 2.0 ** (np.frexp(g[-1])[1]))
    mid = (g + nxt) / 2
    parts = [g, mid]
    for p in (g, mid):
        parts += [np.nextafter(p, np.inf), np.nextafter(p, -np.inf)]
        p32 = p.astype(np.float32)  # exact: every value here has <= 12 significand bits
        with np.errstate(over="ignore"):
            parts += [np.nextafter(p32, np.float32(np.inf)).astype(np.float64),
                      np.nextafter(p32, np.float32(0)).astype(np.float64)]
    v = np.concatenate(parts)
    return np.concatenate([v, -v])


def _edges() -> np.ndarray:
    f32max = MAX["float32"]
    thr32 = f32max + 2.0 ** 103  # max + ulp(max)/2: RNE's overflow threshold
    return np.array([0.0, -0.0, np.inf, -np.inf, f32max, -f32max, thr32, -thr32, np.nextafter(thr32, 0), 3.5e38,
                     1e300, -1e300, 2.0 ** -149, 2.0 ** -150, np.nextafter(2.0 ** -150, 1), 2.0 ** -151, 5e-324,
                     -5e-324, 2.0 ** -126, np.nextafter(2.0 ** -126, 0), 65504.0, 65520.0, np.nextafter(65520.0, 0),
                     2.0 ** -24, 2.0 ** -25, np.nextafter(2.0 ** -25, 1), 1 + 2 ** -8, 1 + 2 ** -8 + 2 ** -30,
                     1 + 2 ** -8 - 2 ** -60, 1 + 2 ** -11 + 2 ** -40, 1 + 3 * 2 ** -8])


def _random(n: int = 1_000_000, seed: int = 23) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    f64 = rng.integers(0, 2 ** 64, n, dtype=np.uint64).view(np.float64)
    f64 = np.concatenate([f64, rng.standard_normal(n // 4) * 10.0 ** rng.integers(-45, 40, n // 4)])
    f32 = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return f64, f32


def _inputs(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    f64, f32 = _random()
    grid = _exhaustive_16(dtype) if dtype != "float32" else np.empty(0)
    x64 = np.concatenate([grid, _edges(), f64])
    with np.errstate(over="ignore"):
        x32 = np.concatenate([grid.astype(np.float32), _edges().astype(np.float32), f32])
    return x64, x32


def _same_bits(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Equal values with equal signs (so -0 != +0); NaN only against NaN."""
    return ((got == want) & (np.signbit(got) == np.signbit(want))) | (np.isnan(got) & np.isnan(want))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_round_fast_equals_the_grid_rule(dtype, mode):
    """Exhaustive over the 16-bit grids (values, midpoints, their neighbours), random bit patterns beyond."""
    for x in _inputs(dtype):
        x = x[~np.isnan(x)]
        got = round_fast(x, dtype, mode)
        assert got.dtype == np.float32
        want = grid_oracle(x.astype(np.float64), dtype, mode)
        bad = ~_same_bits(got.astype(np.float64), want)
        assert not bad.any(), (dtype, mode, x.dtype, x[bad][:5], got[bad][:5], want[bad][:5])


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_fast_rne_equals_the_library_casts(dtype):
    """RNE from float32: ml_dtypes' bfloat16 cast, NumPy's float16 cast; from float64 to float32: NumPy's."""
    x64, x32 = _inputs(dtype)
    x32 = x32[~np.isnan(x32)]
    with np.errstate(over="ignore", invalid="ignore"):
        lib = {"bfloat16": lambda a: a.astype(ml_dtypes.bfloat16), "float16": lambda a: a.astype(np.float16),
               "float32": lambda a: a.astype(np.float32)}[dtype]
        want = lib(x32).astype(np.float64)
    assert _same_bits(round_fast(x32, dtype, as_float64=True), want).all()
    if dtype == "float32":
        x64 = x64[~np.isnan(x64)]
        with np.errstate(over="ignore"):
            assert _same_bits(round_fast(x64, dtype, as_float64=True), x64.astype(np.float32).astype(np.float64)).all()


def test_round_fast_overflow_and_zero_by_hand():
    f32max = MAX["float32"]
    cases = {  # (value, dtype, mode): expected, from the formats' definitions
        (65519.99, "float16", "rne"): 65504.0, (65520.0, "float16", "rne"): np.inf, (1e6, "float16", "rtz"): 65504.0,
        (-1e6, "float16", "rtz"): -65504.0, (np.inf, "float16", "rtz"): np.inf, (-np.inf, "bfloat16", "rtz"): -np.inf,
        (float.fromhex("0x1.ffp127"), "bfloat16", "rne"): np.inf,  # bf16 max + ulp/2: the tie goes to Inf
        (np.nextafter(float.fromhex("0x1.ffp127"), 0), "bfloat16", "rne"): MAX["bfloat16"],
        (1e39, "bfloat16", "rtz"): MAX["bfloat16"], (1e39, "float32", "rtz"): f32max, (1e39, "float32", "rne"): np.inf,
        (2.0 ** -25, "float16", "rne"): 0.0, (np.nextafter(2.0 ** -25, 1), "float16", "rne"): 2.0 ** -24,
        (-2.0 ** -150, "float32", "rne"): -0.0, (-(2.0 ** -150) * 1.5, "float32", "rne"): -(2.0 ** -149),
        (1 + 2 ** -8, "bfloat16", "rne"): 1.0, (1 + 3 * 2 ** -8, "bfloat16", "rne"): 1 + 2 ** -6,
        (1 + 2 ** -8 + 2 ** -40, "bfloat16", "rne"): 1 + 2 ** -7, (-(1 + 2 ** -7 - 2 ** -30), "bfloat16", "rtz"): -1.0,
    }
    for (v, dtype, mode), want in cases.items():
        got = float(round_fast(np.array([v]), dtype, mode)[0])
        assert got == want and np.signbit(got) == np.signbit(want), (v, dtype, mode, got, want)


NAN_CASES = [  # (float32 input bits, dtype, float32 bits of the result): quiet bit set, sign and top payload kept
    (0x7FC00000, "bfloat16", 0x7FC00000), (0xFFC00001, "bfloat16", 0xFFC00000),
    (0x7F800001, "bfloat16", 0x7FC00000),  # signalling, payload only below bfloat16's bits: quiet NaN
    (0x7FA12345, "bfloat16", 0x7FE10000), (0x7FA12345, "float16", 0x7FE12000), (0x7FA12345, "float32", 0x7FE12345),
    (0xFF800001, "float16", 0xFFC00000), (0x7FBFFFFF, "float16", 0x7FFFE000),
]


@pytest.mark.parametrize("bits,dtype,want", NAN_CASES)
@pytest.mark.parametrize("mode", MODES)
def test_round_fast_nan_payloads_by_hand(bits, dtype, want, mode):
    x32 = np.array([bits], dtype=np.uint32).view(np.float32)
    got32 = round_fast(x32, dtype, mode).view(np.uint32)
    assert int(got32[0]) == want, hex(int(got32[0]))
    with np.errstate(invalid="ignore"):
        x64 = x32.astype(np.float64)  # the float64 NaN with the same sign and top payload (quiet)
    assert int(round_fast(x64, dtype, mode).view(np.uint32)[0]) == want


def test_round_fast_keeps_shape_and_input():
    x = np.arange(12, dtype=np.float32).reshape(3, 4) + np.float32(0.1)
    x[1, 1] = np.nan
    keep = x.copy()
    for d in DTYPES:
        y = round_fast(x, d)
        assert y.shape == (3, 4) and np.isnan(y[1, 1])
    assert _same_bits(x, keep).all()  # the NaN fix-up never writes into the caller's array
    assert round_fast(np.float64(1 + 2 ** -9), "bfloat16").shape == ()
    with pytest.raises(ValueError, match="unknown dtype"):
        round_fast(x, "e2m1")


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_fast_other_modes_equal_the_definition(dtype):
    x64, _ = _inputs(dtype)
    x64 = x64[~np.isnan(x64)]
    for mode in ("rhaz", "rhtz"):
        want = round_to_dtype(x64, dtype, mode)
        assert _same_bits(round_fast(x64, dtype, mode, as_float64=True), want).all(), mode


@pytest.mark.parametrize("dtype", DTYPES)
def test_regression_gate_every_former_copy_equals_round_fast(dtype):
    """Regression gate (code against code): the five fast roundings the tree had before they became one
    (tests/emulator/fast_round_before.py, main at 03fbf79) give round_fast's values bit for bit on every input
    set above, NaN lanes NaN in both (their payloads were not one rule before: see that module)."""
    x64, x32 = _inputs(dtype)
    new = {m: round_fast(x64, dtype, m, as_float64=True) for m in MODES}
    with np.errstate(over="ignore", invalid="ignore"):
        assert _same_bits(before.round_float64_array(x64, dtype).astype(np.float64), new["rne"]).all()
        assert _same_bits(before.output_grid_rne(x64, dtype), new["rne"]).all()
        assert _same_bits(before.acceptance_round_to(x64, dtype, "rne"), new["rne"]).all()
        assert _same_bits(before.acceptance_round_to(x64, dtype, "rtz"), new["rtz"]).all()
        assert _same_bits(before.acceptance_rtz32(x64, dtype).astype(np.float64), new["rtz"]).all()
        assert _same_bits(before.round_float32_array(x32, dtype), round_fast(x32, dtype)).all()
