"""Every value of every int8-activation axis is declarable (issue 21 item 5): kernels written from the docs.

``int8_kernel`` below is a NumPy quantizer written from the sentences of docs/formats/activations.md
(#canonical-symmetric, #canonical-asymmetric-azp, #named-variants-int8actvariant, #reference-implementations,
#kleidiai-qa8dx-schemekai_qa8dx) and the output contract of docs/conformance.md#quantize-only-cases, not from
emulator/ code: each branch cites the sentence it follows. For each value of each axis of the
``int8-activations`` stage (emulator/variants.py) the kernel, configured with that value, answers
``q-int8-token`` cases (the suite's own edge cases plus hand-built rows where the value matters) and the
suite's quantize-only judge (conformance/judge/quantized.py, bit-exact on codes, scales, zero points and
dequantized values) must

(a) pass every case under the declaration naming that value, and
(b) where the value is not canonical, fail at least one of them under the declaration without it (the
    other keys of the declaration kept: e.g. ``azp_fused`` needs ``azp_before_rounding``).

``act_dequant_scale_dtype`` only shows in a product, and ``azp_epilogue`` is the W8A8 epilogue: both are
judged as W8A8 linear kernels by the linear judge (conformance/judge/verdict.py). A value added to
variants.py without a kernel here fails ``test_every_value_has_a_literal_kernel``.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

from backends.base import Declared
from conformance.cases.generators import generate
from conformance.cases.inputs import make_inputs
from conformance.cases.suite import case_list
from conformance.judge.quantized import judge_quantized
from conformance.judge.verdict import judge, judged_against
from emulator.schemes import Case
from emulator.variants import Stage
from literal_docs import EPS, fl, missing_kernels, round_int

I32 = 2 ** 31


# -- the kernel ---------------------------------------------------------------------------------------------
DEFAULTS = dict(act_rounding="rne", reciprocal="divide", act_scale_dtype="float32", act_scale_formula="divide",
                qmin=-128, qmax=127, zero_row="zero", eps=0.0, nan_to_int="zero", uint8_zp128=False,
                act_granularity="per_token", act_scheme="minmax", azp_before_rounding=False, act_sym_divisor="qmax",
                act_range="minmax", act_arith_dtype="float32", azp_clamp=False, azp_clamp_nan="keep",
                azp_domain="int8", int32_saturation="symmetric", azp_fused=False, azp_overflow="saturate",
                act_dequant_scale_dtype="same")


def _to_int32(v, f):
    """'range of the saturating float -> int32 conversions': [-(2^31 - 1), 2^31 - 1] or [-2^31, 2^31 - 1];
    a NaN quotient: 'becomes code 0, the lowest code (-2**31, then clamped), or an error' (nan_to_int)."""
    lo = -(I32 - 1) if f["int32_saturation"] == "symmetric" else -I32
    nan = np.isnan(v)
    if nan.any() and f["nan_to_int"] == "raise":
        raise ValueError("NaN quotient")
    out = np.clip(np.where(nan, 0, v), lo, I32 - 1).astype(np.int64)
    return np.where(nan, -I32 if f["nan_to_int"] == "low" else 0, out)


def _stored_zero_point(z, f):
    """'a zero point outside int32 (or NaN) is saturated, or stored as -2**31 (x86 cvttss2si)' (azp_overflow);
    saturated: the int32 range of int32_saturation, a NaN zero point 'converted by nan_to_int' (0, or the
    lowest int32 of that range)."""
    lo = -(I32 - 1) if f["int32_saturation"] == "symmetric" else -I32
    nan = np.isnan(z)
    if nan.any() and f["nan_to_int"] == "raise" and f["azp_overflow"] == "saturate":
        raise ValueError("NaN zero point")
    bad = nan | (z < -I32) | (z > I32 - 1)
    sat = np.clip(np.where(nan, lo if f["nan_to_int"] == "low" else 0, z), lo, I32 - 1)
    return np.where(bad & (f["azp_overflow"] == "int_min"), -I32, sat).astype(np.int64)


def _rows(a, f, red):
    """per_token: one value per row; per_tensor: 'one amax (or min/max) over all M rows, the scale repeated on
    every row'."""
    if f["act_granularity"] == "per_tensor":
        return np.full((a.shape[0], 1), red(a))
    return red(a, axis=1, keepdims=True)


def _kai_qa8dx(x, f):
    """docs/formats/activations.md#kleidiai-qa8dx-schemekai_qa8dx, line by line (every step IEEE fp32)."""
    f32 = functools.partial(fl, dtype="float32")
    rmin = np.minimum(0.0, x.min(axis=1, keepdims=True))
    rmax = np.maximum(0.0, x.max(axis=1, keepdims=True))
    with np.errstate(divide="ignore", invalid="ignore"):  # a range below 255 * 2^-128: inv = +Inf, 0 * Inf = NaN
        inv = np.where(rmin == rmax, 1.0, f32(255.0 / f32(rmax - rmin)))
        scale = f32(1.0 / inv)
        dmin, dmax = f32(rmin * inv), f32(rmax * inv)
    zf = np.where(f32(f32(-128.0 + dmin) + f32(127.0 + dmax)) > 0, f32(-128.0 - dmin), f32(127.0 - dmax))
    zp = np.rint(np.clip(zf, -128, 127))
    with np.errstate(invalid="ignore"):  # an infinite multiplier (a range below 255 * 2^-128): nan_to_int, saturation
        q = np.clip(_to_int32(round_int(f32(x * inv), f["act_rounding"]), f) + zp, -128, 127)
    return q, scale, zp


def int8_kernel(x, act_dtype: str, f: dict) -> dict:
    """The tensors of docs/conformance.md#quantize-only-cases for ``x`` [M, K] (float32 holding act_dtype
    values) under the fields ``f`` (DEFAULTS updated with the declaration)."""
    x = np.asarray(x, np.float64)
    if f["act_scheme"] == "kai_qa8dx":
        q, scale, azp = _kai_qa8dx(x, f)
        sym = False
    else:
        q, scale, azp, sym = _minmax(x, act_dtype, f)
    out = {}
    if f["uint8_zp128"]:  # 'stored as uint8 q + 128'
        out["codes"] = (q + 128).astype(np.uint8)
    else:
        out["codes"] = q.astype(np.int8)
    out["scale"] = scale.astype(np.float32)
    if not sym:  # 'zero_point int32 [M, 1], asymmetric only' (the int8-domain azp)
        out["zero_point"] = azp.astype(np.int32)
    # 'dequantized float32 [M, K]: (q - zp) * scale rounded once (RNE) to the input dtype'
    zp = 0 if sym else azp.astype(np.float64)
    out["dequantized"] = fl((q - zp) * scale, act_dtype).astype(np.float32)
    return out


def _minmax(x, act_dtype, f):
    A = act_dtype if f["act_arith_dtype"] == "input" else f["act_arith_dtype"]  # 'dtype of every step'
    fA = functools.partial(fl, dtype=A)
    sym = f["act_symmetric"]
    if sym:
        R = _rows(np.abs(x), f, np.max)  # 'amax = max_k |x[m, k]|' (a maximum: no rounding step)
        D = 127.0 if f["act_sym_divisor"] == "qmax" else 127.5  # 'amax / 127, or amax / ((qmax - qmin) / 2)'
    else:
        mn, mx = _rows(x, f, np.min), _rows(x, f, np.max)
        if f["act_range"] == "zero_inclusive":  # 'from min(min, 0) and max(max, 0)'
            mn, mx = np.minimum(mn, 0.0), np.maximum(mx, 0.0)
        R = fA(mx - mn)  # 'scale = fl32((max - min) / 255)'
        D = 255.0
    zero = R == 0
    if f["zero_row"] == "eps":  # 'amax clamped to eps'
        R = np.maximum(R, fA(f["eps"]))
    elif f["zero_row"] == "unit_range":  # 'a range of exactly 0 becomes 1: scale 1/255'
        R = np.where(zero, 1.0, R)
    if f["act_scale_formula"] == "divide":  # 'divide fl32(R / D); recip_mul fl32(R * fl32(1 / D))'
        scale = fA(R / D)
    else:
        scale = fA(R * fA(1.0 / D))
    if f["act_scale_dtype"] != "float32":  # 'scale rounded RNE before use'
        scale = fl(scale, f["act_scale_dtype"])
    if not sym:  # 'scale == 0 (max == min, or a range whose scale underflows) -> scale = 0, azp = 0, q = 0'
        zero = scale == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        if f["reciprocal"] == "divide":  # 'divide x / scale; recip_amax x * fl32(127/amax); recip_scale x * fl32(1/scale)'
            inv = None
            quot = fA(x / scale)
        elif f["reciprocal"] == "recip_amax":
            inv = fA(127.0 / R)
            quot = fA(x * inv)
        else:
            inv = fA(1.0 / scale)
            quot = fA(x * inv)
        azp = np.zeros_like(scale)
        if not sym:
            m = fA(mn / scale)  # 'm = fl(min / scale)'
            if f["azp_domain"] == "int8":
                zr, lo, hi, off = fA(-128.0 - m), f["qmin"], f["qmax"], 0  # 'azp = RNE(fl(-128 - m))'
            else:
                zr, lo, hi, off = -m, 0, 255, -128  # 'zp = RNE(-m) in [0, 255] and azp = zp - 128'
            if f["azp_clamp"]:  # 'clamped to [qmin, qmax] (its domain's range) before it is rounded'
                nan = np.isnan(zr)
                zr = np.clip(zr, lo, hi)
                if f["azp_clamp_nan"] == "high":  # 'becomes the upper bound'
                    zr = np.where(nan, hi, zr)
            zfloat = np.rint(zr) + off  # 'RNE'; 'azp = zp - 128'
            azp = _stored_zero_point(zfloat, f).astype(np.float64)  # the stored int32 azp
    if f["zero_row"] == "dtype_eps":  # 'a zero scale becomes ... machine epsilon, after the zero point was formed'
        scale = np.where(scale == 0, EPS[A], scale)
        with np.errstate(divide="ignore", invalid="ignore"):
            quot = fA(x / scale) if inv is None else fA(x * fA(1.0 / scale))
    rnd = f["act_rounding"]
    with np.errstate(invalid="ignore"):
        if sym or not f["azp_before_rounding"]:  # 'q = sat[-128, 127](RNE(fl32(x / scale)) + azp)'
            q = _to_int32(round_int(quot, rnd), f) + azp.astype(np.int64)
        # vLLM CPU: 'The codes use the float zero point nearbyint(-128 - min / scale); the stored int32 is its
        # implicit conversion'
        elif f["azp_fused"]:  # 'fl32(x * inv + azp) rounded once'
            q = _to_int32(round_int(fA(x * inv + zfloat), rnd), f)
        else:  # 'q = sat(round(fl32(fl32(x / scale) + azp)))'
            q = _to_int32(round_int(fA(quot + zfloat), rnd), f)
    q = np.clip(q, f["qmin"], f["qmax"])
    if f["zero_row"] == "zero":  # 'amax == 0 -> scale = 0 and q = 0'; asym: 'scale = 0, azp = 0, q = 0'
        q, scale, azp = np.where(zero, 0, q), np.where(zero, 0.0, scale), np.where(zero, 0.0, azp)
    if f["act_granularity"] == "per_tensor":
        scale = np.broadcast_to(scale, (x.shape[0], 1))
    return q, scale, azp, sym


# -- the cases ----------------------------------------------------------------------------------------------
def _case(M, K, sym, dt):
    return Case("q-int8-token", "none", M, 0, K, group_size=-1, sym=sym, act_dtype=dt)


def _row(vals, K=32, fill=0.0):
    r = np.full(K, fill, np.float64)
    r[:len(vals)] = vals
    return r


def _hand_cases():
    """Rows where one value matters, each from the docs' own reproducer or derived by hand."""
    u = 2.0 ** -23
    out = {
        # scale exactly 1: quotients 0.5, 1.5, 2.5 are ties; 3.7 shows RTZ against RHTZ
        "ties": (_case(2, 32, True, "float32"), [_row([127, 0.5, 1.5, 2.5, -0.5, -2.5, 3.7, -3.7]),
                                                 _row([-127, 63.5, -63.5, 126.5, 1.25])]),
        # docs: 'amax = 1.1171875, x = amax/2: 63.5 becomes 63 with the divided scale and 64 with the multiplied one'
        "recip_mul": (_case(1, 32, True, "bfloat16"), [_row([1.1171875, 1.1171875 / 2])]),
        # docs' per_tensor reproducer
        "per_tensor": (_case(2, 32, True, "float32"), [_row([127]), _row([1, 0.5, 1.5, 2.5, -2.5])]),
        # docs' azp_before_rounding reproducer (scale 1, azp 1)
        "azp_ties": (_case(1, 32, False, "bfloat16"), [_row([-129, 126, 0.5, 1.5, 2.5, -0.5, -1.5, 3.5])]),
        # one-ulp rows: -min / scale is about 255 * 2^24, beyond int32; a constant row; a range that
        # underflows the fp32 scale (255 * 2^-150 > 2^-149); an all-zero row
        "one_ulp": (_case(5, 32, False, "float32"), [
            _row([-2, -2 + u] * 16), _row([2 - 2 * u, 2 - u] * 16), _row([3.0] * 32), _row([0, 2.0 ** -149]),
            _row([])]),
        # fl32(-128 - m) with m = fl32(min / scale) just below -0.5 rounds onto the tie -127.5 (-> -128); -m does
        # not (-> zp 1, azp -127): where the int8 and uint8 domains part (found by this kernel, fp32 only)
        "domain_tie": (_case(1, 32, False, "float32"), [_row([-0.5 - 2.0 ** -24, 254.5, 1.0, -0.25, 100.0])]),
        "constant_sym": (_case(3, 32, True, "bfloat16"), [_row([-0.75] * 32), _row([]), _row([1, -3, 2.5])]),
    }
    return {k: (c, np.array(rows, np.float32)) for k, (c, rows) in out.items()}


@functools.lru_cache(maxsize=1)
def _pool():
    """(name, case, x): the smoke profile's q-int8-token edge cases (int8 ties, reciprocal quotients, zero rows,
    saturation, one-signed rows, the reference-int8 rows) and the hand-built rows."""
    out = [(f"{s.generator}/{s.case.M}x{s.case.K}/{'sym' if s.case.sym else 'asym'}/{s.case.act_dtype}", s.case,
            generate(s.case, s.generator, s.seed).x)
           for s in case_list(schemes=["q-int8-token"], tiers=("edge",), profile="smoke")]
    return out + [(name, c, x) for name, (c, x) in _hand_cases().items()]


# -- judging ------------------------------------------------------------------------------------------------
def _verdict(case, x, kernel_variants: dict, declared_variants: dict) -> str:
    """The quantize-only judge's verdict on the literal kernel configured with ``kernel_variants`` when the
    kernel declares ``declared_variants``. Where the kernel raises (nan_to_int=raise) it is 'raise-agreed'
    only if the reference raises too (the judge's crash: the reference is undefined for the input)."""
    f = dict(DEFAULTS, act_symmetric=case.act_symmetric)
    f.update(kernel_variants)
    d = Declared(variants=declared_variants)
    try:
        out = int8_kernel(x, case.act_dtype, f)
    except ValueError:
        rec, _ = judge_quantized(case, x, d, {})
        return "raise-agreed" if rec["verdict"] == "crash" else "fail"
    rec, _ = judge_quantized(case, x, d, out)
    return rec["verdict"] if rec["verdict"] != "fail" else f"fail: {rec['reason']}"


def _sym(c):
    return c.act_symmetric


def _asym(c):
    return not c.act_symmetric


def _fp32_asym(c):
    return not c.act_symmetric and c.act_dtype == "float32"


ANY = None
CLAMP_NAN = {"azp_clamp": True, "zero_row": "unit_range"}
ZERO_NAN = {"zero_row": "nan"}
FUSED = {"azp_before_rounding": True, "reciprocal": "recip_scale"}

#: key -> {value: (the other keys the kernel needs, which cases exercise it)}: one literal kernel per value
KERNELS: dict = {
    "act_rounding": {v: ({}, ANY) for v in ("rne", "rhaz", "rtz", "rhtz")},
    # 'x * fl32(127/amax)': amax, the symmetric range (the reference refuses it for asymmetric rows)
    "reciprocal": {"divide": ({}, ANY), "recip_amax": ({}, _sym), "recip_scale": ({}, ANY)},
    "act_scale_dtype": {v: ({}, ANY) for v in ("float32", "float16", "bfloat16")},
    "act_scale_formula": {v: ({}, ANY) for v in ("divide", "recip_mul")},
    "qmin": {-128: ({}, ANY), -127: ({}, _asym)},
    "qmax": {127: ({}, ANY), 100: ({}, ANY)},
    "zero_row": dict({v: ({}, ANY) for v in ("zero", "nan", "dtype_eps", "unit_range")}, eps=({"eps": 1e-7}, ANY)),
    "eps": {0.0: ({}, ANY), 1e-7: ({"zero_row": "eps"}, ANY)},
    "nan_to_int": {v: (ZERO_NAN, ANY) for v in ("zero", "low", "raise")},
    "act_symmetric": {True: ({}, _asym), False: ({}, _sym)},
    "uint8_zp128": {v: ({}, ANY) for v in (True, False)},
    "act_granularity": {v: ({}, ANY) for v in ("per_token", "per_tensor")},
    "act_scheme": {v: ({}, ANY) for v in ("minmax", "kai_qa8dx")},
    "azp_before_rounding": {v: ({}, _asym) for v in (True, False)},
    "act_sym_divisor": {v: ({}, _sym) for v in ("qmax", "half_range")},
    "act_range": {v: ({}, _asym) for v in ("minmax", "zero_inclusive")},
    "act_arith_dtype": {v: ({}, ANY) for v in ("float32", "input", "bfloat16", "float16")},
    "azp_clamp": {v: ({}, _asym) for v in (True, False)},
    # a NaN real zero point needs a scale that underflowed to 0 outside the canonical zero-row guard (ONNX's rule)
    "azp_clamp_nan": {v: (CLAMP_NAN, _asym) for v in ("keep", "high")},
    "azp_domain": {v: ({}, _asym) for v in ("int8", "uint8")},
    "int32_saturation": {v: ({}, _asym) for v in ("symmetric", "full")},
    "azp_fused": {v: (FUSED, _asym) for v in (True, False)},
    "azp_overflow": {v: ({}, _asym) for v in ("saturate", "int_min")},
    "act_dequant_scale_dtype": {v: ("linear", None) for v in ("same", "float32", "float16", "bfloat16")},
    # the W8A8 epilogue (stage epilogue; its int8 zero point makes it this file's): test_azp_epilogue_kernels
    "azp_epilogue": {v: ("linear", None) for v in ("exact", "compensation")},
}

QUANTIZE_PARAMS = [(k, v) for k, vals in KERNELS.items() for v, (req, _) in vals.items() if req != "linear"]


def test_every_value_has_a_literal_kernel():
    """Completeness: a value added to an int8-activation axis of emulator/variants.py needs a kernel here."""
    assert not missing_kernels(Stage.INT8_ACTIVATIONS, KERNELS)


@pytest.mark.parametrize("key, value", QUANTIZE_PARAMS, ids=[f"{k}={v}" for k, v in QUANTIZE_PARAMS])
def test_literal_kernel_passes_its_declaration_and_fails_the_canonical_one(key, value):
    req, which = KERNELS[key][value]
    mine = dict(req, **{key: value})
    pool = [(n, c, x) for n, c, x in _pool() if which is None or which(c)]
    bad = {}
    fails_canonical = []
    for name, case, x in pool:
        v = _verdict(case, x, mine, mine)
        if v not in ("pass", "mistrusted", "raise-agreed"):
            bad[name] = v
        if _verdict(case, x, mine, req) not in ("pass", "mistrusted", "raise-agreed"):
            fails_canonical.append(name)
    assert not bad, f"{key}={value}: the kernel written from the docs fails its own declaration: {bad}"
    assert any(_verdict(c, x, mine, mine) == "pass" for _, c, x in pool), "only agreement that proves nothing"
    canonical = DEFAULTS.get(key, None)
    if value != canonical and not (key == "act_symmetric"):
        assert fails_canonical, f"{key}={value}: no case tells the kernel from the canonical declaration"
    if key == "act_symmetric":
        assert fails_canonical


# -- the product: act_dequant_scale_dtype (W8A8) ------------------------------------------------------------
def _w8a8_inputs(sym: bool, seed: int):
    case = Case("w8a8", "ct-int-quantized", 8, 32, 128, group_size=-1, sym=sym, act_dtype="bfloat16",
                out_dtype="float32", bias=True)
    return make_inputs(case, seed)


def w8a8_kernel(inp, dequant_scale_dtype: str) -> np.ndarray:
    """docs/formats/activations.md#w8a8-int8-weights-int8-dynamic-activations: 'acc = sum_k (qx - azp) qw exact
    integer; y = acc * sx * sw + bias', with dequant_scale_dtype: 'the quotient uses the fp32 (scale_dtype)
    scale, the accumulator is multiplied by the scale rounded (RNE) to this dtype'. float64 epilogue."""
    case = inp.case
    q = int8_kernel(inp.x, case.act_dtype, dict(DEFAULTS, act_symmetric=case.act_symmetric))
    qx = q["codes"].astype(np.int64) - (q["zero_point"].astype(np.int64) if "zero_point" in q else 0)
    qw = np.asarray(inp.tensors["weight"]).astype(np.int64)  # int8 [N, K] (docs: compressed-tensors int-quantized)
    sw = np.asarray(inp.tensors["weight_scale"]).astype(np.float64).reshape(1, -1)  # [N, 1] per channel
    sx = q["scale"].astype(np.float64)
    if dequant_scale_dtype != "same":
        sx = fl(sx, dequant_scale_dtype)
    bias = 0.0 if inp.bias is None else np.asarray(inp.bias, np.float64)
    y = (qx @ qw.T).astype(np.float64) * sx * sw + bias
    return y.astype(np.float32)


def _linear_verdict(inp, y, variants, accumulate="float64") -> str:
    d = Declared(variants=variants, accumulate=accumulate, output="float32")
    return judge(inp, judged_against(inp, d), y, d).verdict.value


LINEAR_PARAMS = list(KERNELS["act_dequant_scale_dtype"])


@pytest.mark.parametrize("value", LINEAR_PARAMS)
def test_dequant_scale_dtype_kernel_passes_its_declaration_and_fails_the_canonical_one(value):
    ok, fails = [], []
    for sym in (True, False):
        for seed in range(2):
            inp = _w8a8_inputs(sym, seed)
            y = w8a8_kernel(inp, value)
            ok.append(_linear_verdict(inp, y, {"act_dequant_scale_dtype": value}))
            fails.append(_linear_verdict(inp, y, {}))
    assert all(v == "pass" for v in ok), ok
    if value in ("float16", "bfloat16"):  # 'same' is canonical; a float32 scale is the scale itself
        assert "fail" in fails, fails


# -- the pieces the kernels stand on --------------------------------------------------------------------------
def test_fl_rounds_once_as_the_ieee_casts_do():
    """``fl`` against NumPy's float16/float32 casts and ml_dtypes' bfloat16 on float32 inputs (where ml_dtypes
    rounds once), and on the float64 value where rounding through float32 first goes wrong."""
    import ml_dtypes

    rng = np.random.default_rng(0)
    x = (rng.standard_normal(20000) * np.exp(rng.uniform(-90, 90, 20000))).astype(np.float32).astype(np.float64)
    x = np.concatenate([x, [65504.0, 65520.0, 65519.99, 2.0 ** -149, 1.5 * 2.0 ** -133, 2.0 ** -25, -0.0]])
    with np.errstate(over="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's own cast of 65520 to float16 overflows (to Inf)
        for dt, t in (("float32", np.float32), ("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)):
            assert np.array_equal(fl(x, dt), x.astype(t).astype(np.float64)), dt
    assert fl(np.array([1 + 2.0 ** -8 + 2.0 ** -30]), "bfloat16")[0] == 1 + 2.0 ** -7


def test_uint8_domain_zero_point_beyond_int32_saturates_instead_of_wrapping():
    """Row [2 - 2^-22, 2 - 2^-23]: scale = fl32(2^-23 / 255), m = min / scale ~ 255 * 2^24; azp = RNE(-m) - 128
    is below int32, so it saturates to -(2^31 - 1) (int32_saturation=symmetric). The emulator subtracted 128
    after saturating and wrapped to 2^31 - 129 (fixed with this test)."""
    case = _case(1, 32, False, "float32")
    x = np.array([_row([2 - 2.0 ** -22, 2 - 2.0 ** -23] * 16)], np.float32)
    rec, exp = judge_quantized(case, x, Declared(variants={"azp_domain": "uint8"}), {})
    assert exp["zero_point"][0, 0] == -(2 ** 31 - 1)


# -- the W8A8 epilogue: azp_epilogue ----------------------------------------------------------------------------
def w8a8_compensation_kernel(inp) -> np.ndarray:
    """docs/formats/activations.md#w8a8-int8-weights-int8-dynamic-activations: 'the GEMM sees the stored codes,
    then y = fl(fl(A - B) + b) with A = fl(fl(sw S1) sx), S1 = sum_k qx qw, and
    B = fl(fl(fl(sum_k qw) sw) fl(sx azp))', every fl an fp32 rounding."""
    case = inp.case
    q = int8_kernel(inp.x, case.act_dtype, dict(DEFAULTS, act_symmetric=case.act_symmetric))
    f32 = functools.partial(fl, dtype="float32")
    qx = q["codes"].astype(np.int64)
    azp = q["zero_point"].astype(np.float64) if "zero_point" in q else np.zeros((case.M, 1))
    qw = np.asarray(inp.tensors["weight"]).astype(np.int64)
    sw = np.asarray(inp.tensors["weight_scale"]).astype(np.float64).reshape(1, -1)
    sx = q["scale"].astype(np.float64)
    S1 = (qx @ qw.T).astype(np.float64)  # exact integers, below 2^24 here: fp32-exact
    A = f32(f32(sw * S1) * sx)
    B = f32(f32(f32(qw.sum(axis=1)[None, :] * sw) * f32(sx * azp)))
    b = np.zeros(case.N) if inp.bias is None else np.asarray(inp.bias, np.float64)
    return f32(f32(A - B) + b).astype(np.float32)


@pytest.mark.parametrize("value", ["exact", "compensation"])
def test_azp_epilogue_kernels(value):
    """The docs' reproducer: Case(w8a8, ct-int-quantized, 16x256x256, asym, fp32), seed 0: the compensation
    kernel passes under azp_epilogue=compensation and fails under the canonical exact epilogue; the exact
    kernel (w8a8_kernel: integer acc of (qx - azp) qw) passes under both."""
    assert value in KERNELS["azp_epilogue"]
    case = Case("w8a8", "ct-int-quantized", 16, 256, 256, group_size=-1, sym=False, act_dtype="float32")
    inp = make_inputs(case, 0)
    d = {"azp_epilogue": value} if value != "exact" else {}
    if value == "compensation":
        y = w8a8_compensation_kernel(inp)
        assert _linear_verdict(inp, y, d, accumulate="float32") == "pass"
        assert _linear_verdict(inp, y, {}, accumulate="float32") == "fail"
    else:
        y = w8a8_kernel(inp, "same")
        assert _linear_verdict(inp, y, {}, accumulate="float32") == "pass"
        assert _linear_verdict(inp, y, {"azp_epilogue": "compensation"}, accumulate="float32") == "pass"
