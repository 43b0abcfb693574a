"""MXFP4 quantization, dequantization and checkpoint layouts against independent oracles.

Oracles:
- ``oracle_quantize``: OCP MX v1.0 §6.3 in exact Fraction arithmetic, written here from the spec
  text (X = largest power of two <= amax divided by 4, clamped to E8M0's range; elements are
  V_i / X rounded to the E2M1 value table, saturating at +-6), with the rule / tie mode as inputs;
- ml_dtypes ``float4_e2m1fn`` x ``float8_e8m0fnu`` for dequantization;
- torchao ``to_mx`` (FLOOR / EVEN / CEIL / RCEIL) for codes, packing and scales (optional);
- compressed-tensors 0.20's own MXFP4 path (``calculate_qparams`` + ``MXFP4PackedCompressor``)
  for the ``weight_packed`` / ``weight_scale`` layout, EVEN scales and dequantization (optional);
- a hand-built gpt-oss example from the documented layout (``*_blocks`` [..., K/32, 16] with the
  even element in the low nibble, ``*_scales`` [..., K/32]) and its documented LUT + ldexp dequant.
"""

from __future__ import annotations

import warnings
from fractions import Fraction

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.errors import FormatError
from emulator.formats.mxfp4 import (
    BLOCK,
    CANONICAL,
    MxVariant,
    dequantize_mxfp4,
    dequantize_mxfp4_ct,
    dequantize_mxfp4_gptoss,
    pack_mxfp4_ct,
    pack_mxfp4_gptoss,
    quantize_mxfp4,
    unpack_mxfp4_ct,
    unpack_mxfp4_gptoss,
)
from emulator.numerics.e2m1 import E2M1NanRule
from emulator.numerics.e8m0 import MxScaleRule, NanBlockRule, ZeroBlockRule
from emulator.numerics.rounding import Rounding

ml_dtypes = pytest.importorskip("ml_dtypes")

VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
GRID = [Fraction(v) for v in VALUES[:8]]


# --------------------------------------------------------------------------- oracle

from exact_math import floor_log2 as _floor_log2, p2 as _p2  # noqa: E402


def _shared_exp(amax: Fraction, rule: MxScaleRule) -> int:
    f = _floor_log2(amax)
    if rule is MxScaleRule.FLOOR:
        return f - 2
    if rule is MxScaleRule.CEIL:
        return (f if _p2(f) == amax else f + 1) - 2
    if rule is MxScaleRule.EVEN:
        return f + (1 if amax >= Fraction(7, 4) * _p2(f) else 0) - 2
    raise NotImplementedError(rule)  # RCEIL is checked on hand-derived blocks and against torchao


def _code(q: Fraction, neg: bool, mode: Rounding) -> int:
    a = abs(q)
    if a >= 6:
        idx = 7
    else:
        hi = next(i for i, g in enumerate(GRID) if g >= a)
        lo = hi if GRID[hi] == a else hi - 1
        if lo == hi or mode is Rounding.RTZ:
            idx = lo
        elif a - GRID[lo] != GRID[hi] - a:
            idx = lo if a - GRID[lo] < GRID[hi] - a else hi
        else:
            idx = {Rounding.RNE: lo if lo % 2 == 0 else hi, Rounding.RHAZ: hi, Rounding.RHTZ: lo}[mode]
    return idx | (8 if neg else 0)


def oracle_block(block, rule=MxScaleRule.FLOOR, mode=Rounding.RNE):
    """(scale byte, 32 codes) of one block of fp32 values."""
    vals = [float(v) for v in block]
    if any(not np.isfinite(v) for v in vals):
        return 0xFF, [0] * len(vals)
    amax = max(abs(Fraction(v)) for v in vals)
    s = -127 if amax == 0 else min(max(_shared_exp(amax, rule), -127), 127)
    codes = [_code(Fraction(v) / _p2(s), bool(np.signbit(v)), mode) for v in vals]
    return s + 127, codes


def oracle_quantize(x: np.ndarray, rule=MxScaleRule.FLOOR, mode=Rounding.RNE):
    xb = np.asarray(x, np.float32).reshape(-1, BLOCK)
    out = [oracle_block(b, rule, mode) for b in xb]
    scales = np.array([o[0] for o in out], np.uint8).reshape(x.shape[:-1] + (x.shape[-1] // BLOCK,))
    codes = np.array([o[1] for o in out], np.uint8).reshape(x.shape)
    return codes, scales


# --------------------------------------------------------------------------- inputs

def random_blocks(n: int, seed: int, lo: int = -135, hi: int = 125) -> np.ndarray:
    """fp32 blocks: per-block magnitude 2**e, mixed shapes, some exact ties and zeros."""
    rng = np.random.default_rng(seed)
    e = rng.integers(lo, hi, (n, 1))
    x = rng.standard_normal((n, BLOCK)) * np.exp2(e)
    # a third of the blocks: values on the E2M1 tie grid after FLOOR scaling (amax in [4, 8) * 2**s)
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 4.0, 6.0, 0.5, 7.0, 0.125])
    k = rng.integers(-120, 120, (n // 3, 1)).astype(float)
    t = rng.choice(ties, (n // 3, BLOCK)) * rng.choice([-1.0, 1.0], (n // 3, BLOCK))
    t[:, 0] = 5.0
    x[: n // 3] = t * np.exp2(k)
    x[n // 3: n // 3 + 3] = 0.0  # zero blocks
    x[n // 3 + 3, :] = -0.0
    with np.errstate(over="ignore", under="ignore"):
        return x.astype(np.float32)


BLOCKS = random_blocks(600, 1)


def blk(*vals) -> np.ndarray:
    x = np.zeros(BLOCK, np.float32)
    x[: len(vals)] = vals
    return x[None, :]


# --------------------------------------------------------------------------- canonical vs oracle

def test_canonical_equals_ocp_oracle_random_blocks():
    codes, scales = quantize_mxfp4(BLOCKS)
    ocodes, oscales = oracle_quantize(BLOCKS)
    assert np.array_equal(scales, oscales)
    assert np.array_equal(codes, ocodes)


@pytest.mark.parametrize("rule", [MxScaleRule.EVEN, MxScaleRule.CEIL])
@pytest.mark.parametrize("mode", list(Rounding))
def test_variants_equal_oracle_random_blocks(rule, mode):
    x = BLOCKS[::3]
    codes, scales = quantize_mxfp4(x, MxVariant(scale_rule=rule, element_rounding=mode))
    ocodes, oscales = oracle_quantize(x, rule, mode)
    assert np.array_equal(scales, oscales) and np.array_equal(codes, ocodes)


@settings(deadline=None, database=None)
@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=BLOCK, max_size=BLOCK),
       st.sampled_from([MxScaleRule.FLOOR, MxScaleRule.EVEN, MxScaleRule.CEIL]),
       st.sampled_from(list(Rounding)))
def test_quantize_hypothesis_vs_oracle(vals, rule, mode):
    x = np.array(vals, np.float32)[None, :]
    codes, scales = quantize_mxfp4(x, MxVariant(scale_rule=rule, element_rounding=mode))
    ocodes, oscales = oracle_quantize(x, rule, mode)
    assert scales.tolist() == oscales.tolist() and codes.tolist() == ocodes.tolist()


def test_half_precision_inputs_are_widened_exactly():
    x = BLOCKS[:50]
    for dt in (np.float16, ml_dtypes.bfloat16):
        with np.errstate(over="ignore", under="ignore"):
            h = x.astype(dt)
        h = np.where(np.isfinite(h.astype(np.float32)), h, np.zeros_like(h))
        c1, s1 = quantize_mxfp4(h)
        c2, s2 = oracle_quantize(h.astype(np.float32))
        assert np.array_equal(c1, c2) and np.array_equal(s1, s2)


def code(v: float) -> int:
    """E2M1 code of an exactly representable nonzero value (hand lookup in the OCP table)."""
    assert v != 0
    return VALUES.index(v)


def test_special_blocks():
    x = np.concatenate([blk(), np.full((1, BLOCK), -0.0, np.float32), blk(1.0, np.nan), blk(-np.inf, 1.0),
                        blk(np.inf), blk(-0.0, 0.3, -0.1)])
    codes, scales = quantize_mxfp4(x)
    # amax 0.3: floor(log2 0.3) = -2 -> s = -4 -> byte 123; 0.3 * 16 = 4.8 -> 4, -0.1 * 16 = -1.6 -> -1.5
    assert scales.ravel().tolist() == [0, 0, 0xFF, 0xFF, 0xFF, 123]
    assert codes[0].tolist() == [0] * 32  # all-zero block: byte 0 (2**-127), zero codes
    assert codes[1].tolist() == [8] * 32  # -0 keeps its sign
    assert codes[2].tolist() == codes[3].tolist() == codes[4].tolist() == [0] * 32  # 0xFF blocks: codes 0
    assert codes[5, :3].tolist() == [8, code(4.0), code(-1.5)]


def test_dequantize_vs_ml_dtypes_including_extreme_bytes():
    rng = np.random.default_rng(2)
    codes = rng.integers(0, 16, (8, 64)).astype(np.uint8)
    scales = rng.integers(0, 256, (8, 2)).astype(np.uint8)
    scales[0] = [0, 254]
    scales[1] = [255, 127]
    codes[0, :4] = [1, 9, 8, 0]
    codes[0, 32:34] = [7, 15]
    want64 = (codes.view(ml_dtypes.float4_e2m1fn).astype(np.float64).reshape(8, 2, 32)
              * scales.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)[..., None]).reshape(8, 64)
    got64 = dequantize_mxfp4(codes, scales, dtype=np.float64)
    assert np.array_equal(got64, want64, equal_nan=True)
    assert np.array_equal(np.signbit(got64), np.signbit(want64))
    with np.errstate(over="ignore"):
        got32 = dequantize_mxfp4(codes, scales)
        assert np.array_equal(got32, want64.astype(np.float32), equal_nan=True)
    assert got64[0, 0] == 2.0**-128 and got32[0, 0] == np.float32(2.0**-128)  # exact fp32 subnormal
    assert np.signbit(got32[0, 2]) and got32[0, 2] == 0
    assert got64[0, 32] == 6 * 2.0**127 and got32[0, 32] == np.inf and got32[0, 33] == -np.inf
    assert np.isnan(got32[1, :32]).all()


def test_round_trip_values():
    codes, scales = quantize_mxfp4(BLOCKS)
    deq = dequantize_mxfp4(codes, scales, dtype=np.float64)
    ocodes, oscales = oracle_quantize(BLOCKS)
    want = np.array([VALUES[c] for c in ocodes.ravel()]).reshape(ocodes.shape) * np.exp2(
        oscales.astype(np.int64) - 127).repeat(BLOCK, axis=-1)
    assert np.array_equal(deq, want)


def test_errors():
    with pytest.raises(FormatError, match="multiple of the MX block size"):
        quantize_mxfp4(np.zeros((2, 48), np.float32))
    with pytest.raises(FormatError, match="float32"):
        quantize_mxfp4(np.full((1, 32), 0.1))
    with pytest.raises(FormatError):
        dequantize_mxfp4(np.zeros((1, 32), np.uint8), np.zeros((1, 2), np.uint8))
    with pytest.raises(FormatError):
        dequantize_mxfp4(np.zeros((1, 32), np.uint8), np.zeros((1, 1), np.int32))


# --------------------------------------------------------------------------- every variant field

def _differs(x, variant):
    a = quantize_mxfp4(x)
    b = quantize_mxfp4(x, variant)
    return not (np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])), a, b


@pytest.mark.parametrize("rule, amax, floor_byte, rule_byte", [
    (MxScaleRule.EVEN, 1.75, 125, 126),
    (MxScaleRule.EVEN, 1.75 * 2.0**-60, 65, 66),
    (MxScaleRule.RCEIL, float(np.nextafter(np.float32(1.5), np.float32(2))), 125, 126),
    (MxScaleRule.RCEIL, 7.0, 127, 128),
    (MxScaleRule.CEIL, 1.25, 125, 126),
    (MxScaleRule.CEIL, 2.0**40 + 2.0**17, 165, 166),
])
def test_scale_rule_field(rule, amax, floor_byte, rule_byte):
    x = blk(amax, -amax / 2)
    diff, (c0, s0), (c1, s1) = _differs(x, MxVariant(scale_rule=rule))
    assert diff and s0.tolist() == [[floor_byte]] and s1.tolist() == [[rule_byte]]
    if rule is MxScaleRule.EVEN and amax == 1.75:
        # FLOOR (s = -2): 7 clamps to 6, -3.5 -> -4; EVEN (s = -1): 3.5 -> 4, -1.75 -> -2 (ties to even)
        assert c0[0, :2].tolist() == [code(6.0), code(-4.0)] and c1[0, :2].tolist() == [code(4.0), code(-2.0)]


@pytest.mark.parametrize("k", [-100, -3, 0, 1, 50, 120])
def test_scale_rules_agree_on_powers_of_two(k):
    x = blk(2.0**k, 2.0**(k - 1))
    outs = [quantize_mxfp4(x, MxVariant(scale_rule=r)) for r in MxScaleRule]
    assert all(np.array_equal(o[1], outs[0][1]) and np.array_equal(o[0], outs[0][0]) for o in outs)
    assert outs[0][1].tolist() == [[min(max(k - 2, -127), 127) + 127]]


def test_element_rounding_field():
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 2.9]
    x = blk(*ties, *[-t for t in ties])  # amax 5 -> s = 0, elements unscaled
    want = {
        Rounding.RNE: [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 3.0],
        Rounding.RHAZ: [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 3.0],
        Rounding.RHTZ: [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 3.0],
        Rounding.RTZ: [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 2.0],
    }
    for mode, w in want.items():
        codes, scales = quantize_mxfp4(x, MxVariant(element_rounding=mode))
        assert scales.tolist() == [[127]]
        vals = [VALUES[c] for c in codes[0, :16]]
        assert vals == w + [-v for v in w], mode
        if mode is not Rounding.RNE:
            assert _differs(x, MxVariant(element_rounding=mode))[0]


def test_element_nan_field():
    x = blk(1.0, np.nan, -np.nan, -3.0)
    # canonical nan_block=SCALE_NAN: the block is 0xFF and its codes are 0 whatever element_nan says
    for rule in (E2M1NanRule.SATURATE, E2M1NanRule.ZERO_SIGNED, E2M1NanRule.ZERO_SIGN_FLIPPED):
        assert not _differs(x, MxVariant(element_nan=rule))[0]
    with pytest.raises(ValueError):
        quantize_mxfp4(x, MxVariant(element_nan=E2M1NanRule.RAISE))
    # with nan_block=IGNORE the scale is finite and element_nan decides the NaN codes
    base = MxVariant(nan_block=NanBlockRule.IGNORE)
    c0, s0 = quantize_mxfp4(x, base)
    # amax 3 -> s = -1: 1 -> 2, -3 -> -6; NaN -> code 0 (element_nan ZERO)
    assert s0.tolist() == [[126]] and c0[0, :4].tolist() == [code(2.0), 0, 0, code(-6.0)]
    expected = {
        E2M1NanRule.SATURATE: [7, 15],
        E2M1NanRule.ZERO_SIGNED: [0, 8],
        E2M1NanRule.ZERO_SIGN_FLIPPED: [8, 0],
    }
    for rule, w in expected.items():
        c, s = quantize_mxfp4(x, MxVariant(nan_block=NanBlockRule.IGNORE, element_nan=rule))
        assert c[0, 1:3].tolist() == w and s.tolist() == s0.tolist()
        assert not np.array_equal(c, c0)


@pytest.mark.parametrize("zb, byte", [(ZeroBlockRule.HALF, 126), (ZeroBlockRule.EPS_FP32, 104),
                                      (ZeroBlockRule.EPS_1E10, 94)])
def test_zero_block_field(zb, byte):
    x = np.concatenate([blk(), blk(-0.0, 0.0)])
    diff, (c0, s0), (c1, s1) = _differs(x, MxVariant(zero_block=zb))
    assert diff and s0.ravel().tolist() == [0, 0] and s1.ravel().tolist() == [byte, byte]
    assert np.array_equal(c0, c1)


def test_zero_block_eps_1e10_floor_field():
    """eps_1e10_floor differs from canonical on zero blocks AND on tiny nonzero blocks (eps_1e10 only on the first)."""
    x = np.concatenate([blk(), blk(1e-12, -3e-12), blk(1.0, -0.5)])
    diff, (c0, s0), (c1, s1) = _differs(x, MxVariant(zero_block=ZeroBlockRule.EPS_1E10_FLOOR))
    assert diff and s0.ravel().tolist()[0::2] == [0, 125] and s1.ravel().tolist() == [94, 94, 125]
    # the tiny block under scale 2**-33: 1e-12 * 2**33 = 0.0086 -> 0, -3e-12 * 2**33 = -0.026 -> -0 (code 8)
    assert c1[1, :2].tolist() == [0, 8] and c0[1, :2].tolist() != [0, 8]
    _, se = quantize_mxfp4(x, MxVariant(zero_block=ZeroBlockRule.EPS_1E10))
    assert se.ravel().tolist() == [94, int(s0.ravel()[1]), 125]  # eps_1e10 leaves the tiny block alone


def test_element_zero_sign_field():
    x = blk(-0.0, 1.0, -0.01, 0.0)
    diff, (c0, _), (c1, _) = _differs(x, MxVariant(element_zero_sign="positive"))
    assert diff and c0[0, :4].tolist() == [8, code(4.0), 8, 0] and c1[0, :4].tolist() == [0, code(4.0), 8, 0]
    assert np.array_equal(dequantize_mxfp4(*quantize_mxfp4(x)), dequantize_mxfp4(*quantize_mxfp4(
        x, MxVariant(element_zero_sign="positive"))))


def test_element_nan_saturate_positive_field():
    x = blk(1.0, np.nan, -np.nan, -3.0)
    base = MxVariant(nan_block=NanBlockRule.IGNORE)
    c_sat, s_sat = quantize_mxfp4(x, dataclasses.replace(base, element_nan=E2M1NanRule.SATURATE))
    c_pos, s_pos = quantize_mxfp4(x, dataclasses.replace(base, element_nan=E2M1NanRule.SATURATE_POSITIVE))
    assert c_sat[0, 1:3].tolist() == [7, 15] and c_pos[0, 1:3].tolist() == [7, 7]
    assert s_sat.tolist() == s_pos.tolist() == [[126]]
    assert _differs(x, dataclasses.replace(base, element_nan="saturate_positive"))[0]


def test_nan_block_field():
    x = np.concatenate([blk(np.nan, 3.0, -1.0), blk(np.inf, np.nan, 1.0)])
    diff, (c0, s0), (c1, s1) = _differs(x, MxVariant(nan_block=NanBlockRule.IGNORE))
    assert diff
    assert s0.ravel().tolist() == [0xFF, 0xFF]
    assert s1.ravel().tolist() == [126, 0xFF]  # NaN skipped by the max; Inf still makes 0xFF
    # amax 3 -> s = -1: NaN -> 0 (element_nan ZERO), 3 / 2**-1 = 6, -1 / 2**-1 = -2
    assert c1[0, :3].tolist() == [0, code(6.0), code(-2.0)]


def test_variant_describe_and_parse():
    v = MxVariant(scale_rule="even", element_rounding="RHAZ", zero_block="half")
    assert v.describe() == {"scale_rule": "even", "element_rounding": "rhaz", "element_nan": "zero",
                            "zero_block": "half", "nan_block": "scale_nan", "element_zero_sign": "keep",
                            "byte0_divisor": "byte", "scale_overflow": "clamp", "quotient_dtype": "exact"}
    assert CANONICAL == MxVariant()
    with pytest.raises(ValueError):
        MxVariant(scale_rule="round")
    with pytest.raises(ValueError):
        MxVariant(quotient_dtype="float8")


# --------------------------------------------------------------------------- torchao (optional)

def _torchao(x: np.ndarray, mode_name: str):
    torch = pytest.importorskip("torch")
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    cfg = pytest.importorskip("torchao.prototype.mx_formats.config")
    mode = getattr(cfg.ScaleCalculationMode, mode_name.upper())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s, d = mx.to_mx(torch.from_numpy(np.ascontiguousarray(x)), torch.float4_e2m1fn_x2, 32, mode)
    return s.view(torch.uint8).numpy().reshape(x.shape[0], -1), d.view(torch.uint8).numpy()


@pytest.mark.parametrize("rule", ["floor", "even", "ceil", "rceil"])
def test_quantize_vs_torchao(rule):
    x = random_blocks(3000, 9, lo=-110, hi=120)  # scale bytes >= 1: away from torchao's tiny-block path
    ts, td = _torchao(x, rule)
    codes, scales = quantize_mxfp4(x, MxVariant(scale_rule=rule))
    assert np.array_equal(ts, scales)
    assert np.array_equal(td, pack_mxfp4_ct(codes, scales)["weight_packed"])


def test_torchao_documented_divergences():
    # 1. blocks with scale byte 0 (2**-127): torchao divides by 2**-126 (FLOOR/EVEN/CEIL) or by 1 (RCEIL)
    x = blk(2.0**-125, -(2.0**-127))
    codes, scales = quantize_mxfp4(x)
    assert scales.tolist() == [[0]] and codes[0, :2].tolist() == [6, 10]  # 4, -1
    ts, td = _torchao(x, "floor")
    assert ts.tolist() == [[0]] and td[0, 0] == (4 | (9 << 4))  # torchao: 2, -0.5
    ts, td = _torchao(x, "rceil")
    assert ts.tolist() == [[0]] and td[0, 0] == (0 | (8 << 4))  # torchao: unscaled -> 0, -0
    # 2. +-Inf in a block: qconform 0xFF; torchao 0.18 gives a finite byte (253, or 254 for RCEIL)
    x = blk(1.0, np.inf)
    assert quantize_mxfp4(x)[1].tolist() == [[0xFF]]
    assert _torchao(x, "floor")[0].tolist() == [[253]]
    assert _torchao(x, "rceil")[0].tolist() == [[254]]
    # 3. NaN block: same 0xFF byte, but torchao leaves element codes behind (NaN -> code 3, -2 -> -0)
    x = blk(1.0, -2.0, np.nan, -0.0)
    c, s = quantize_mxfp4(x)
    ts, td = _torchao(x, "floor")
    assert s.tolist() == ts.tolist() == [[0xFF]]
    assert pack_mxfp4_ct(c, s)["weight_packed"][0, :2].tolist() == [0x00, 0x00]
    assert td[0, :2].tolist() == [0x80, 0x83]


# --------------------------------------------------------------------------- compressed-tensors (optional)

def _ct_compress(w):
    """compressed-tensors' own MXFP4 weight path: observer-free qparams from the group min/max
    (``calculate_qparams`` -> ``generate_mx_scales``), then ``MXFP4PackedCompressor.compress``."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import MXFP4
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    args = MXFP4["weights"]
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    wt = w if isinstance(w, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(w))
    groups = wt.reshape(wt.shape[0], -1, BLOCK)
    scale, zp = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
    out = MXFP4PackedCompressor.compress({"weight": wt.clone(), "weight_scale": scale, "weight_zero_point": zp},
                                         scheme)
    return out, scheme, MXFP4PackedCompressor


def test_compressed_tensors_compress_layout_and_even_scales():
    w = random_blocks(1536, 4, lo=-100, hi=100).reshape(96, 512)
    w = np.where(np.signbit(w) & (w == 0), np.float32(0), w)  # see the -0 divergence below
    out, _, _ = _ct_compress(w)
    assert set(out) == {"weight_packed", "weight_scale"}
    assert tuple(out["weight_packed"].shape) == (96, 256) and tuple(out["weight_scale"].shape) == (96, 16)
    codes, scales = quantize_mxfp4(w, MxVariant(scale_rule=MxScaleRule.EVEN))
    ours = pack_mxfp4_ct(codes, scales)
    assert np.array_equal(out["weight_packed"].numpy(), ours["weight_packed"])
    assert np.array_equal(out["weight_scale"].numpy(), ours["weight_scale"])


def test_compressed_tensors_bf16_weights_and_ties():
    torch = pytest.importorskip("torch")
    w32 = np.zeros((4, 64), np.float32)
    w32[0, :8] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.1]
    w32[1, :2] = [1.75, -0.2]  # EVEN bumps the scale: 1.75 -> 3.5 -> 4
    w32[2, :2] = [2.0**-125, -(2.0**-127)]  # tiny block: byte 0
    w32[3] = np.linspace(-3, 7, 64)
    wb = torch.from_numpy(w32).to(torch.bfloat16)
    for w in (torch.from_numpy(w32), wb):  # bf16: compressed-tensors works in bf16, qconform widens exactly
        out, _, _ = _ct_compress(w)
        codes, scales = quantize_mxfp4(w.to(torch.float32).numpy(), MxVariant(scale_rule="even"))
        assert np.array_equal(out["weight_packed"].numpy(), pack_mxfp4_ct(codes, scales)["weight_packed"])
        assert np.array_equal(out["weight_scale"].numpy(), scales)


def test_compressed_tensors_negative_zero_divergence():
    """Documented divergence: compressed-tensors' CPU cast (sign(x) * rounded |x|) encodes an input
    -0.0 as code 0; qconform keeps the sign (code 8), as ml_dtypes/torchao/triton do. Negative values
    that round to zero keep their sign in both."""
    w = np.zeros((1, 32), np.float32)
    w[0, :4] = [4.0, -0.0, -0.1, 0.0]
    out, _, _ = _ct_compress(w)
    codes, scales = quantize_mxfp4(w, MxVariant(scale_rule="even"))
    assert codes[0, :4].tolist() == [6, 8, 8, 0]
    assert out["weight_packed"].numpy()[0, :2].tolist() == [6 | (0 << 4), 8 | (0 << 4)]


def test_compressed_tensors_non_finite_and_top_binade_divergence():
    """Documented divergence: in compressed-tensors 0.20 a group whose EVEN-rounded amax is not
    finite (NaN or Inf in the group, or amax >= 1.75 * 2**127) gets scale byte 127: the float scale
    is NaN/Inf and ``127 + floor(log2(scale)).to(int32)`` wraps to 127 in uint8. qconform: 0xFF for
    NaN/Inf (OCP), and 253 (= 2**126) for the large finite block."""
    w = np.zeros((3, 32), np.float32)
    w[0, :3] = [1.0, np.nan, -2.0]
    w[1, :3] = [1.0, np.inf, -2.0]
    w[2, :3] = [3.4e38, 1.0, -1.0]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        out, _, _ = _ct_compress(w)
    assert out["weight_scale"].numpy().ravel().tolist() == [127, 127, 127]
    assert quantize_mxfp4(w, MxVariant(scale_rule="even"))[1].ravel().tolist() == [0xFF, 0xFF, 253]


def test_compressed_tensors_decompress_and_pack_helpers():
    torch = pytest.importorskip("torch")
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8, unpack_fp4_from_uint8

    rng = np.random.default_rng(8)
    codes = rng.integers(0, 16, (16, 128)).astype(np.uint8)
    scales = rng.integers(0, 255, (16, 4)).astype(np.uint8)
    scales[0] = [0, 254, 1, 253]
    tensors = pack_mxfp4_ct(codes, scales)
    # their pack of the decoded values == our nibble packing; their unpack == our unpack
    vals = torch.tensor([VALUES[c] for c in codes.ravel()], dtype=torch.float32).reshape(16, 128)
    assert np.array_equal(pack_fp4_to_uint8(vals).numpy(), tensors["weight_packed"])
    un = unpack_fp4_from_uint8(torch.from_numpy(tensors["weight_packed"]), 16, 128, dtype=torch.float32).numpy()
    assert np.array_equal(un, np.array([VALUES[c] for c in codes.ravel()], np.float32).reshape(16, 128))
    c2, s2 = unpack_mxfp4_ct(tensors)
    assert np.array_equal(c2, codes) and np.array_equal(s2, scales)
    _, scheme, comp = _ct_compress(np.zeros((1, 32), np.float32))
    dec = comp.decompress({k: torch.from_numpy(v) for k, v in tensors.items()}, scheme)["weight"]
    assert dec.dtype == torch.bfloat16
    ours = dequantize_mxfp4_ct(tensors, dtype=ml_dtypes.bfloat16)
    with np.errstate(over="ignore"):
        assert np.array_equal(dec.view(torch.int16).numpy().view(np.uint16), ours.view(np.uint16))
    # Documented divergence: byte 0xFF decodes to NaN in qconform, to 2**128 = Inf in compressed-tensors
    t = {"weight_packed": np.full((1, 16), 0x71, np.uint8), "weight_scale": np.array([[255]], np.uint8)}
    assert np.isnan(dequantize_mxfp4_ct(t)).all()
    d = comp.decompress({k: torch.from_numpy(v) for k, v in t.items()}, scheme)["weight"].float().numpy()
    assert np.isinf(d).all()


# --------------------------------------------------------------------------- gpt-oss layout

def test_gptoss_round_trip_and_hf_shapes():
    rng = np.random.default_rng(6)
    E, H, I = 2, 64, 96  # hidden, intermediate (toy sizes, multiples of 32)
    gate_up = rng.standard_normal((E, 2 * I, H)).astype(np.float32)
    down = rng.standard_normal((E, H, I)).astype(np.float32)
    for w, name in ((gate_up, "gate_up_proj"), (down, "down_proj")):
        codes, scales = quantize_mxfp4(w)
        blocks, sc = pack_mxfp4_gptoss(codes, scales)
        assert blocks.shape == w.shape[:-1] + (w.shape[-1] // 32, 16) and blocks.dtype == np.uint8
        assert sc.shape == w.shape[:-1] + (w.shape[-1] // 32,)
        c2, s2 = unpack_mxfp4_gptoss(blocks, sc, names=(f"{name}_blocks", f"{name}_scales"))
        assert np.array_equal(c2, codes) and np.array_equal(s2, scales)
        assert np.array_equal(dequantize_mxfp4_gptoss(blocks, sc), dequantize_mxfp4(codes, scales))
        # same bytes as the compressed-tensors layout, reshaped
        ct = pack_mxfp4_ct(codes.reshape(-1, w.shape[-1]), scales.reshape(-1, w.shape[-1] // 32))
        assert np.array_equal(blocks.reshape(-1, w.shape[-1] // 2), ct["weight_packed"])


def test_gptoss_hand_built_example():
    """Build *_blocks / *_scales byte by byte from the documented layout and dequantize them the
    documented way (LUT on the low nibble -> even element, high nibble -> odd element, ldexp)."""
    rng = np.random.default_rng(10)
    N, K = 3, 96
    elems = rng.integers(0, 16, (N, K))
    scale_exp = rng.integers(-20, 20, (N, K // 32))
    blocks = np.zeros((N, K // 32, 16), np.uint8)
    for n in range(N):
        for b in range(K // 32):
            for j in range(16):
                blocks[n, b, j] = int(elems[n, 32 * b + 2 * j]) | (int(elems[n, 32 * b + 2 * j + 1]) << 4)
    scales = (scale_exp + 127).astype(np.uint8)
    want = np.zeros((N, K))
    for n in range(N):
        for b in range(K // 32):
            for j in range(16):
                byte = int(blocks[n, b, j])
                want[n, 32 * b + 2 * j] = np.ldexp(VALUES[byte & 0x0F], int(scales[n, b]) - 127)
                want[n, 32 * b + 2 * j + 1] = np.ldexp(VALUES[byte >> 4], int(scales[n, b]) - 127)
    got = dequantize_mxfp4_gptoss(blocks, scales, dtype=np.float64)
    assert np.array_equal(got, want)
    codes, sc = unpack_mxfp4_gptoss(blocks, scales)
    assert np.array_equal(codes, elems) and np.array_equal(sc, scales)
    # Documented divergence: gpt-oss' ldexp(value, 255 - 127) is finite in float64 (Inf in bf16),
    # qconform decodes byte 0xFF as NaN (OCP: the whole block is NaN).
    s255 = scales.copy()
    s255[0, 0] = 255
    assert np.isnan(dequantize_mxfp4_gptoss(blocks, s255, dtype=np.float64)[0, :32]).all()


def test_gptoss_layout_errors():
    b = np.zeros((2, 3, 16), np.uint8)
    s = np.zeros((2, 3), np.uint8)
    with pytest.raises(FormatError, match="down_proj_blocks"):
        unpack_mxfp4_gptoss(np.zeros((2, 3, 15), np.uint8), s, names=("down_proj_blocks", "down_proj_scales"))
    with pytest.raises(FormatError, match="scales"):
        unpack_mxfp4_gptoss(b, np.zeros((2, 4), np.uint8))
    with pytest.raises(FormatError):
        unpack_mxfp4_gptoss(b.astype(np.int8), s)
    with pytest.raises(FormatError, match="weight_scale"):
        unpack_mxfp4_ct({"weight_packed": np.zeros((2, 16), np.uint8), "weight_scale": np.zeros((2, 2), np.uint8)})
    with pytest.raises(FormatError, match="missing"):
        unpack_mxfp4_ct({"weight_packed": np.zeros((2, 16), np.uint8)})
