"""E8M0 decode and the MX shared-scale rules against independent oracles.

Oracles:
- ml_dtypes ``float8_e8m0fnu`` and torch ``float8_e8m0fnu`` for the value of every byte;
- ``oracle_byte``: each rule re-derived in exact ``Fraction`` arithmetic from its definition
  (floor/ceil of log2 by integer comparisons, the EVEN pre-rounding as a comparison with
  1.75 * 2**floor(log2 amax), RCEIL's fp32 division by an RNE-to-fp32 oracle written here);
- the research-notes §8.3 boundary table, kept as a literal and re-derived by ``oracle_byte``;
- torchao ``to_mx`` (prototype mx_formats, eager CPU) for FLOOR / EVEN / CEIL / RCEIL scale bytes
  (optional: skipped when torchao does not import);
- the ONNX reference ``Cast(to=FLOAT8E8M0, round_mode="up")`` for RCEIL's round-up step.
"""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.numerics.e8m0 import E8M0_NAN, MxScaleRule, ZeroBlockRule, decode_e8m0, mx_scale_byte

# RCEIL_LOG2F rounds log2 to fp32 on purpose: torchao's eager fallback is its oracle
# (tests/emulator/test_reference_variants.py), not exact arithmetic
RULES = [r for r in MxScaleRule if r is not MxScaleRule.RCEIL_LOG2F]
F32_MAX = float(np.finfo(np.float32).max)


# --------------------------------------------------------------------------- exact oracle

from exact_math import floor_log2, p2 as _p2  # noqa: E402


def ceil_log2(a: Fraction) -> int:
    f = floor_log2(a)
    return f if _p2(f) == a else f + 1


def fl32(q: Fraction) -> Fraction:
    """Round a non-negative rational to fp32 (RNE, subnormals kept; no overflow in use here)."""
    if q == 0:
        return q
    quantum = _p2(max(floor_log2(q), -126) - 23)
    n = q / quantum
    lo = n.numerator // n.denominator
    rem = n - lo
    r = lo + 1 if (rem > Fraction(1, 2) or (rem == Fraction(1, 2) and lo % 2 == 1)) else lo
    return r * quantum


def rule_exponent(amax: float, rule: MxScaleRule) -> int:
    a = Fraction(amax)
    if rule is MxScaleRule.FLOOR:
        return floor_log2(a) - 2
    if rule is MxScaleRule.CEIL:
        return ceil_log2(a) - 2
    if rule is MxScaleRule.EVEN:
        f = floor_log2(a)
        return f + (1 if a >= Fraction(7, 4) * _p2(f) else 0) - 2
    d = fl32(a / 6)  # RCEIL: descale = fp32(amax / 6), then the next power of two >= descale
    return ceil_log2(d) if d > 0 else -127


def oracle_byte(amax: float, rule: MxScaleRule, zero_byte: int = 0) -> int:
    if not np.isfinite(amax):
        return 0xFF
    if amax == 0:
        return zero_byte
    return min(max(rule_exponent(amax, rule), -127), 127) + 127


# --------------------------------------------------------------------------- inputs

def boundary_amax() -> np.ndarray:
    f32 = np.float32
    vals = []
    for k in range(-149, 128):
        p = np.ldexp(f32(1), k)
        vals += [p, np.nextafter(p, f32(0)), np.nextafter(p, f32(np.inf))]
        if -126 <= k <= 126:
            for m in (1.25, 1.5, 1.75):
                b = np.ldexp(f32(m), k)
                vals += [b, np.nextafter(b, f32(0)), np.nextafter(b, f32(np.inf))]
        if -124 <= k <= 125:
            b = np.ldexp(f32(6), k)  # RCEIL boundaries 6 * 2**k
            vals += [b, np.nextafter(b, f32(0)), np.nextafter(b, f32(np.inf))]
    vals += [f32(F32_MAX), f32(1e-45), f32(1e-40), f32(6 * 2.0**-127), f32(6 * 2.0**-128)]
    a = np.array(vals, dtype=np.float32)
    return a[np.isfinite(a) & (a > 0)]


BOUNDARY = boundary_amax()
RANDOM = np.abs(np.random.default_rng(11).integers(1, 0x7F800000, 20_000, dtype=np.uint32).view(np.float32))


# --------------------------------------------------------------------------- decode

def test_decode_every_byte_vs_ml_dtypes_and_torch():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    b = np.arange(256, dtype=np.uint16).astype(np.uint8)
    got = decode_e8m0(b)
    want = np.array([2.0 ** (i - 127) for i in range(255)] + [np.nan])
    assert np.array_equal(got, want, equal_nan=True)
    assert got[0] == 2.0**-127 and got[254] == 2.0**127 and np.isnan(got[255])
    assert np.array_equal(got, b.view(ml_dtypes.float8_e8m0fnu).astype(np.float64), equal_nan=True)
    torch = pytest.importorskip("torch")
    tv = torch.from_numpy(b.copy()).view(torch.float8_e8m0fnu).to(torch.float64).numpy()
    assert np.array_equal(got, tv, equal_nan=True)


def test_decode_rejects_nan_when_asked_and_non_bytes():
    with pytest.raises(ValueError, match="0xFF"):
        decode_e8m0(np.array([1, 255], np.uint8), allow_nan=False)
    with pytest.raises(TypeError):
        decode_e8m0(np.array([1, 2], np.int32))


# --------------------------------------------------------------------------- scale rules

# research notes §8.3 (FLOOR, EVEN, CEIL, RCEIL); every row is re-derived by oracle_byte below
TABLE_8_3 = [
    (0.0, 0, 0, 0, 0),
    (1e-40, 0, 0, 0, 0),  # fp32 subnormal
    (1.0, 125, 125, 125, 125),
    (1.25, 125, 125, 126, 125),
    (1.5, 125, 125, 126, 125),
    (1.5000001, 125, 125, 126, 126),
    (1.6, 125, 125, 126, 126),
    (1.75, 125, 126, 126, 126),
    (2.0, 126, 126, 126, 126),
    (3.0, 126, 126, 127, 126),
    (6.0, 127, 127, 128, 127),
    (6.0000005, 127, 127, 128, 128),
    (7.0, 127, 128, 128, 128),
    (448.0, 133, 134, 134, 134),
    (3.4e38, 252, 253, 253, 253),
]
TABLE_RULES = [MxScaleRule.FLOOR, MxScaleRule.EVEN, MxScaleRule.CEIL, MxScaleRule.RCEIL]


@pytest.mark.parametrize("row", TABLE_8_3, ids=lambda r: repr(r[0]))
def test_research_table_rederived(row):
    amax = float(np.float32(row[0]))
    for rule, want in zip(TABLE_RULES, row[1:]):
        assert oracle_byte(amax, rule) == want, (rule, amax)
        assert int(mx_scale_byte(np.array([amax], np.float32), rule)[0]) == want, (rule, amax)


@pytest.mark.parametrize("rule", RULES)
def test_rules_on_boundaries_vs_oracle(rule):
    got = mx_scale_byte(BOUNDARY, rule)
    want = [oracle_byte(a, rule) for a in BOUNDARY.tolist()]
    assert got.tolist() == want


@pytest.mark.parametrize("rule", RULES)
def test_rules_on_random_amax_vs_oracle(rule):
    x = RANDOM[:4000]
    assert mx_scale_byte(x, rule).tolist() == [oracle_byte(a, rule) for a in x.tolist()]


@settings(deadline=None, database=None)
@given(st.floats(min_value=0, width=32, allow_nan=False), st.sampled_from(RULES))
def test_rules_hypothesis(amax, rule):
    assert int(mx_scale_byte(np.array([amax], np.float32), rule)[0]) == oracle_byte(amax, rule)


def test_rceil_fp32_division_vs_exact_log2():
    """RCEIL = ceil(log2(fp32(amax/6))). For a normal descale this equals the exact
    ceil(log2(amax/6)); they part only when amax/6 is an fp32 subnormal (amax < 2**-123.4)."""
    for a in np.concatenate([BOUNDARY, RANDOM[:3000]]).tolist():
        exact = min(max(ceil_log2(Fraction(a) / 6), -127), 127) + 127
        descale = fl32(Fraction(a) / 6)
        if descale >= _p2(-126):
            assert oracle_byte(a, MxScaleRule.RCEIL) == exact, a
    # the documented corner: amax = 2**-125 * (1.5 + 2**-23): amax/6 is just above 2**-127 but
    # its fp32 quotient rounds down to exactly 2**-127 (subnormal) -> byte 0, exact math -> byte 1
    a = float(np.float32(2.0**-125 * (1.5 + 2.0**-23)))
    assert int(mx_scale_byte(np.array([a], np.float32), "rceil")[0]) == 0
    assert ceil_log2(Fraction(a) / 6) + 127 == 1


def test_zero_block_rules():
    z = np.array([0.0, -0.0], np.float32)
    derived = {
        ZeroBlockRule.MIN: 0,  # 2**-127: the smallest E8M0 value
        ZeroBlockRule.HALF: 127 + floor_log2(Fraction(1, 2)),
        ZeroBlockRule.EPS_FP32: 127 + floor_log2(Fraction(float(np.finfo(np.float32).eps))),
        ZeroBlockRule.EPS_1E10: 127 + ceil_log2(Fraction(1e-10)),
    }
    assert derived == {ZeroBlockRule.MIN: 0, ZeroBlockRule.HALF: 126, ZeroBlockRule.EPS_FP32: 104,
                       ZeroBlockRule.EPS_1E10: 94}
    for rule in RULES:
        for zb, want in derived.items():
            assert mx_scale_byte(z, rule, zero_block=zb).tolist() == [want, want]
            assert mx_scale_byte(np.array([1.0], np.float32), rule, zero_block=zb).tolist() == [125]


@pytest.mark.parametrize("rule", RULES)
def test_eps_1e10_floor_floors_every_block(rule):
    """EPS_1E10_FLOOR (vllm-xpu-kernels mxfp4_quant.h with eps = 1e-10): byte = max(rule byte, 94) for
    every finite block, where EPS_1E10 only changes amax = 0."""
    assert 127 + ceil_log2(Fraction(float(np.float32(1e-10)))) == 94
    a = np.array([0.0, 1e-12, 2.0**-40, 1e-10, 5.9e-10, 2.0**-20, 1.0, np.nan, np.inf], np.float32)
    plain = mx_scale_byte(a, rule, zero_block=ZeroBlockRule.EPS_1E10)
    floored = mx_scale_byte(a, rule, zero_block="eps_1e10_floor")
    assert floored.tolist() == [94 if b < 94 else b for b in plain[:7].tolist()] + [0xFF, 0xFF]
    assert plain[0] == floored[0] == 94
    assert plain[1] < 94 and floored[1] == 94  # a tiny nonzero block: the rules differ
    assert floored[5:7].tolist() == plain[5:7].tolist() == mx_scale_byte(a[5:7], rule).tolist()


@pytest.mark.parametrize("rule", RULES)
def test_nan_and_inf_amax_give_0xff(rule):
    x = np.array([np.nan, np.inf, 1.0], np.float32)
    assert mx_scale_byte(x, rule).tolist() == [0xFF, 0xFF, 125]
    assert E8M0_NAN == 0xFF


def test_input_validation():
    with pytest.raises(ValueError, match="non-negative"):
        mx_scale_byte(np.array([-1.0], np.float32))
    with pytest.raises(TypeError):
        mx_scale_byte(np.array([1], np.int32))
    with pytest.raises(ValueError, match="float32"):
        mx_scale_byte(np.array([0.1]))  # float64 0.1 is not an fp32 value
    assert mx_scale_byte(np.array([0.5, 6.0])).tolist() == [124, 127]  # exact float64 inputs accepted
    with pytest.raises(ValueError):
        mx_scale_byte(np.array([1.0], np.float32), "round")


# --------------------------------------------------------------------------- ONNX reference

def _onnx_cast_e8m0_up(x: np.ndarray) -> np.ndarray:
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E8M0, round_mode="up", saturate=1)
    graph = helper.make_graph([node], "cast_e8m0",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT8E8M0, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        y = ReferenceEvaluator(model).run(None, {"x": x.astype(np.float32)})[0]
    return np.asarray(y).view(np.uint8)


def test_rceil_round_up_step_vs_onnx_cast_up():
    amax = np.concatenate([BOUNDARY, RANDOM])
    descale = (amax / np.float32(6)).astype(np.float32)
    normal = descale >= np.float32(2.0**-126)
    got = mx_scale_byte(amax[normal], "rceil")
    assert np.array_equal(got, _onnx_cast_e8m0_up(descale[normal]))


def test_onnx_cast_up_subnormal_divergence():
    """Documented divergence: the ONNX reference rounds *every* nonzero fp32 subnormal up to
    byte 1 (2**-126), including 2**-127 itself, which E8M0 represents exactly as byte 0."""
    x = np.array([2.0**-127, 1e-39], np.float32)
    assert _onnx_cast_e8m0_up(x).tolist() == [1, 1]
    amax = (x.astype(np.float64) * 6).astype(np.float32)  # 6 * 2**-127 is exact; the other is near
    got = mx_scale_byte(amax, "rceil").tolist()
    assert got == [oracle_byte(a, MxScaleRule.RCEIL) for a in amax.tolist()] == [0, 0]


# --------------------------------------------------------------------------- naive casts (facts)

def test_naive_e8m0_casts_are_not_an_mx_rule():
    """torch / ml_dtypes ``.to(float8_e8m0fnu)`` round to nearest in the linear domain (ties up);
    applied to amax/6 that is neither RCEIL nor OCP FLOOR (e.g. amax 7 -> byte 127 clips 7 to 6)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    torch = pytest.importorskip("torch")
    x = np.array([0.0, 1.0, 1.5, 1.4999, 3.0, 0.75, 5.0, -1.0, 2.0**-127, 1.5 * 2.0**-127, 2.0**127,
                  1.5 * 2.0**127, np.inf, np.nan], np.float32)
    tb = torch.from_numpy(x).to(torch.float8_e8m0fnu).view(torch.uint8).numpy().tolist()
    assert tb == [0, 127, 128, 127, 129, 127, 129, 127, 0, 1, 254, 255, 255, 255]
    with np.errstate(all="ignore"):
        mb = x.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8).tolist()
    assert mb == [255, 127, 128, 127, 129, 127, 129, 255, 0, 1, 254, 255, 255, 255]
    seven = np.array([7.0 / 6.0], np.float32)
    assert torch.from_numpy(seven).to(torch.float8_e8m0fnu).view(torch.uint8).item() == 127
    assert int(mx_scale_byte(np.array([7.0], np.float32), "rceil")[0]) == 128


# --------------------------------------------------------------------------- torchao to_mx (optional)

def _torchao_scales(x: np.ndarray, mode_name: str) -> np.ndarray:
    torch = pytest.importorskip("torch")
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    cfg = pytest.importorskip("torchao.prototype.mx_formats.config")
    mode = getattr(cfg.ScaleCalculationMode, mode_name.upper())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s, _ = mx.to_mx(torch.from_numpy(np.ascontiguousarray(x)), torch.float4_e2m1fn_x2, 32, mode)
    return s.view(torch.uint8).numpy().reshape(x.shape[0])


def _blocks_with_amax(amax: np.ndarray) -> np.ndarray:
    x = np.zeros((len(amax), 32), np.float32)
    x[:, 0] = amax
    x[:, 5] = -amax / np.float32(3)
    return x


@pytest.mark.parametrize("rule", ["floor", "even", "ceil"])
def test_scale_bytes_vs_torchao(rule):
    amax = np.concatenate([BOUNDARY, RANDOM[:5000]])
    got = mx_scale_byte(amax, rule)
    assert np.array_equal(_torchao_scales(_blocks_with_amax(amax), rule), got)


def test_rceil_scale_bytes_vs_torchao():
    # random amax: identical
    amax = RANDOM[:5000]
    assert np.array_equal(_torchao_scales(_blocks_with_amax(amax), "rceil"), mx_scale_byte(amax, "rceil"))
    # boundaries: torchao's eager fallback computes ceil(torch.log2(descale)) in fp32, and log2 of a
    # descale one ulp above 2**k rounds to exactly k, so it picks one step too low there.
    amax = BOUNDARY
    ta = _torchao_scales(_blocks_with_amax(amax), "rceil")
    q = mx_scale_byte(amax, "rceil")
    bad = np.nonzero(ta != q)[0]
    assert len(bad) > 0  # the divergence is real in torchao 0.18 eager mode
    for i in bad:
        assert ta[i] == q[i] - 1 and q[i] == oracle_byte(float(amax[i]), MxScaleRule.RCEIL), float(amax[i])
    example = np.array([np.nextafter(np.float32(1.5 * 2.0**20), np.float32(np.inf))])
    assert mx_scale_byte(example, "rceil").tolist() == [127 + 19]
    assert _torchao_scales(_blocks_with_amax(example), "rceil").tolist() == [127 + 18]
