"""Every value of every MX-activation axis is declarable (issue 21 item 5): a quantizer written from the docs.

``mx_kernel`` is a NumPy MXFP4 activation quantizer written from the sentences of docs/formats/mxfp4.md
(#canonical-quantization, #variants-mxvariant, #reference-implementations, #dequantization) and
docs/formats.md (#fp4-e2m1: the code table, the tie rules, the NaN and signed-zero rules; #e8m0-and-mx-scale-rules:
the scale rules), with the output contract of docs/conformance.md#quantize-only-cases; not from emulator/
code. For each value of each axis of the ``mx-activations`` stage (emulator/variants.py) the kernel, set to
that value, answers ``q-mxfp4`` cases (the smoke profile's edge cases and hand-built blocks from the docs'
own examples) and the quantize-only judge (conformance/judge/quantized.py: bit-exact codes, scale bytes and
dequantized values; the codes of a 0xFF block are not compared) must pass every case under the declaration
naming the value and, where the value is not canonical, fail at least one under the declaration without it
(the other keys kept: e.g. ``e2m1_nan`` needs ``mx_nan_block=ignore`` to show). A value added to
variants.py without a kernel here fails ``test_every_value_has_a_literal_kernel``.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from backends.base import Declared
from conformance.cases.generators import generate
from conformance.cases.suite import case_list
from conformance.judge.quantized import judge_quantized
from emulator.schemes import Case
from emulator.variants import Stage
from literal_docs import fl, missing_kernels

#: docs/formats.md#fp4-e2m1: code -> value, codes 0..7 (8..15 the same, negative)
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)
#: zero_block: 'min (byte 0), half (126), eps_fp32 (104), eps_1e10 (94), eps_1e10_floor (every block >= 94)'
ZERO_BLOCK_BYTE = {"min": 0, "half": 126, "eps_fp32": 104, "eps_1e10": 94, "eps_1e10_floor": 94}
DEFAULTS = dict(mx_scale_rule="floor", mx_byte0_divisor="byte", mx_scale_overflow="clamp", mx_quotient_dtype="exact",
                e2m1_rounding="rne", e2m1_nan="zero", e2m1_zero_sign="keep", mx_zero_block="min",
                mx_nan_block="scale_nan")


def _floor_log2(a):
    """floor(log2 a), exactly (frexp: a = m 2^e, m in [0.5, 1)); -inf for 0."""
    m, e = np.frexp(a)
    return np.where(a == 0, -np.inf, e - 1.0)


def _ceil_log2(a):
    m, e = np.frexp(a)
    return np.where(a == 0, -np.inf, np.where(m == 0.5, e - 1.0, e * 1.0))


def _scale_exponent(amax32, rule):
    """docs/formats.md#e8m0-and-mx-scale-rules, the 's' column (before the clamp to [-127, 127])."""
    a = amax32.astype(np.float64)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if rule == "floor":  # 'floor(log2 amax) - 2'
            return _floor_log2(a) - 2
        if rule == "ceil":  # 'ceil(log2 amax) - 2'
            return _ceil_log2(a) - 2
        if rule == "even":  # 'floor(log2 round1(amax)) - 2', round1 = '(bits + 2^21) & 0xFF800000'
            bits = (amax32.view(np.uint32).astype(np.uint64) + 2 ** 21) & 0xFF800000
            r = bits.astype(np.uint32).view(np.float32).astype(np.float64)
            # exponent field 255 is the value 2^128 ('the EVEN rounding of amax >= 1.75 * 2^127 gives 2^128')
            return np.where(np.isinf(r), 128.0, _floor_log2(r)) - 2
        d = fl(a / 6, "float32")  # 'fl32(amax / 6)'
        if rule == "rceil":  # 'ceil(log2(fl32(amax / 6)))'
            return _ceil_log2(d)
        if rule == "rceil_log2f":  # 'ceil(fl32(log2(fl32(amax / 6))))' (float64 log2 rounded once)
            return np.ceil(fl(np.log2(d), "float32"))
    raise ValueError(rule)


def _round_e2m1(a, mode):
    """|quotient| < 6 to the E2M1 grid by 'RNE (to the code with mantissa bit 0)', RHAZ, RHTZ or RTZ: code 0..7."""
    lo = np.clip(np.searchsorted(E2M1, a, side="right") - 1, 0, 6)
    mid = (E2M1[lo] + E2M1[lo + 1]) / 2
    if mode == "rne":
        up = (a > mid) | ((a == mid) & (lo % 2 == 1))
    elif mode == "rhaz":
        up = a >= mid
    elif mode == "rhtz":
        up = a > mid
    else:  # rtz
        up = a >= E2M1[lo + 1]
    return lo + up


def _encode(v, f):
    """One E2M1 code per quotient v: '|x| >= 6 (and +-Inf) saturates to +-6'; the sign by e2m1_zero_sign: keep
    'copies the sign bit', positive 'sets the sign bit only for values < 0'; NaN by the e2m1_nan table."""
    a = np.abs(v)
    with np.errstate(invalid="ignore"):
        mag = np.where(a >= 6, 7, _round_e2m1(np.where(np.isnan(a), 0, a), f["e2m1_rounding"]))
        neg = np.signbit(v) if f["e2m1_zero_sign"] == "keep" else (v < 0)
    code = mag + 8 * neg
    nan = np.isnan(v)
    if nan.any():
        rule = f["e2m1_nan"]
        if rule == "raise":
            raise ValueError("NaN element")
        sneg = np.signbit(v)
        nan_code = {"zero": np.zeros_like(code), "saturate": 7 + 8 * sneg, "saturate_positive": np.full_like(code, 7),
                    "zero_signed": 8 * sneg, "zero_sign_flipped": 8 * ~sneg}[rule]  # +NaN -> -0, -NaN -> 0
        code = np.where(nan, nan_code, code)
    return code.astype(np.uint8)


def mx_kernel(x, act_dtype: str, f: dict) -> dict:
    """codes uint8 [M, K], scale uint8 [M, K/32], dequantized float32 [M, K] (docs/conformance.md)."""
    x = np.asarray(x, np.float32)
    M, K = x.shape
    blocks = x.reshape(M, K // 32, 32)
    with np.errstate(invalid="ignore"):
        if f["mx_nan_block"] == "scale_nan":  # 'amax = max |x_i| over the block; a NaN anywhere -> NaN'
            amax = np.max(np.abs(blocks), axis=2)
        else:  # 'ignore': 'fmax skips NaN; +-Inf still gives 0xFF'
            amax = np.nanmax(np.where(np.isnan(blocks), 0, np.abs(blocks)), axis=2).astype(np.float32)
    s = np.clip(_scale_exponent(amax, f["mx_scale_rule"]), -127, 127)
    byte = (s + 127).astype(np.int64)
    zero = amax == 0
    byte = np.where(zero, ZERO_BLOCK_BYTE[f["mx_zero_block"]], byte)  # 'amax == 0 -> ...' (zero_block)
    if f["mx_zero_block"] == "eps_1e10_floor":  # 'byte = max(rule byte, 94)'
        byte = np.maximum(byte, 94)
    nonfinite = ~np.isfinite(amax)  # 'amax is NaN or +-Inf -> scale byte 0xFF'
    if f["mx_scale_overflow"] == "nan" and f["mx_scale_rule"] == "even":
        # 'the scale 2^128 = byte 0xFF' where the EVEN rounding of amax overflows fp32
        with np.errstate(invalid="ignore"):
            nonfinite |= amax >= np.float32(1.75 * 2.0 ** 127)
    byte = np.where(nonfinite, 0xFF, byte)
    # byte0_divisor: 'what the elements of a block whose scale byte is 0 are divided by': 2^-127, 2^-126 or 1
    div = np.where(byte == 0, {"byte": 2.0 ** -127, "min_normal": 2.0 ** -126, "one": 1.0}[f["mx_byte0_divisor"]],
                   2.0 ** (np.minimum(byte, 254) - 127.0))
    with np.errstate(invalid="ignore", over="ignore"):
        q = blocks.astype(np.float64) / div[:, :, None]  # 'x_i / 2^s is exact'
    qdt = f["mx_quotient_dtype"]
    if qdt != "exact":  # 'the dtype x / 2^s is rounded to before the E2M1 rounding (input: the activation's dtype)'
        q = fl(q, act_dtype if qdt == "input" else qdt)
    if f["e2m1_nan"] == "raise" and np.isnan(blocks).any():
        raise ValueError("NaN element")  # 'raise still raises'
    codes = _encode(q, f)
    codes = np.where(nonfinite[:, :, None], 0, codes)  # '-> scale byte 0xFF, every element code 0'
    # 'value_i = E2M1[code_i] * 2^(byte - 127) exact; byte == 0xFF -> NaN for the whole block', rounded once
    val = E2M1[codes & 7] * np.where(codes & 8, -1.0, 1.0) * 2.0 ** (byte[:, :, None] - 127.0)
    val = np.where(byte[:, :, None] == 0xFF, np.nan, val)
    return {"codes": codes.reshape(M, K).astype(np.uint8), "scale": byte.astype(np.uint8),
            "dequantized": fl(val.reshape(M, K), act_dtype).astype(np.float32)}


# -- the cases ----------------------------------------------------------------------------------------------
def _case(M, dt, K=32):
    return Case("q-mxfp4", "none", M, 0, K, group_size=32, act_dtype=dt)


def _block(vals, fill=0.0):
    r = np.full(32, fill, np.float64)
    r[:len(vals)] = vals
    return r


def _hand_cases():
    """Blocks from the docs' own examples (docs/formats/mxfp4.md, docs/formats.md), by hand."""
    nan, u = np.nan, 2.0 ** -23  # one ulp of 1.5
    out = {
        # 'Block [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 2.9] (amax 5, s = 0)': every tie rule differs
        "ties": (_case(2, "float32"), [_block([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 2.9]),
                                       _block([-0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5, -2.9])]),
        # 'amax 1.75: FLOOR s = -2, EVEN s = -1'; 'amax 1.5 + 1 ulp: FLOOR 125, RCEIL 126'; 'amax 1.25: CEIL 126';
        # 'amax = 6 * 2^10 * (1 + 2^-22): fp32 log2 = 10, byte 137; RCEIL: byte 138'
        "rules": (_case(4, "float32"), [_block([1.75, -0.875]), _block([1.5 + u, 1.0]),
                                        _block([1.25, 0.3]), _block([6 * 2.0 ** 10 * (1 + 2 * u), 5.0])]),
        # '[NaN, 3, -1] with nan_block=ignore: byte 126'; '[-NaN, 1, -0.0] -> byte 125 (RCEIL)'; a block with +NaN
        "nan": (_case(3, "float32"), [_block([nan, 3, -1]), _block([-nan, 1, -0.0]), _block([0.5, nan, 2])]),
        # -0 and negative values that round to 0
        "zero_sign": (_case(2, "bfloat16"), [_block([-0.0, 4, -0.0, -0.01, 0.0]), _block([-0.0, -0.0])]),
        # an all-zero block, a block whose only nonzero is 1e-12 ('byte 94, code 0'), a byte-0 block
        # ('[2^-125, -2^-127]': codes [4, -1]; min_normal [2, -0.5]; one [0, -0])
        "tiny": (_case(3, "float32"), [_block([]), _block([1e-12]), _block([2.0 ** -125, -(2.0 ** -127)])]),
        # 'a top-binade block (amax 1.875 * 2^127)': EVEN gives the scale 2^128
        "top": (_case(1, "float32"), [_block([1.875 * 2.0 ** 127, 1.0, -3.0 * 2.0 ** 125])]),
        # quotients that underflow: in float32 (amax 2^100, -2^-60 -> -2^-158) and float16 (amax 1, -2^-30)
        "underflow": (_case(2, "float32"), [_block([2.0 ** 100, -(2.0 ** -60), 2.0 ** -60]),
                                            _block([1.0, -(2.0 ** -30), -(2.0 ** -20)])]),
        "underflow16": (_case(1, "float16"), [_block([1.0, -(2.0 ** -24), -0.25])]),
    }
    return {k: (c, np.array(rows, np.float32)) for k, (c, rows) in out.items()}


@functools.lru_cache(maxsize=1)
def _pool():
    out = [(f"{s.generator}/{s.case.M}x{s.case.K}/{s.case.act_dtype}", s.case, generate(s.case, s.generator, s.seed).x)
           for s in case_list(schemes=["q-mxfp4"], tiers=("edge",), profile="smoke")]
    return out + [(name, c, x) for name, (c, x) in _hand_cases().items()]


def _verdict(case, x, kernel_variants: dict, declared_variants: dict) -> str:
    """The quantize-only judge's verdict on the kernel set to ``kernel_variants`` declaring
    ``declared_variants``; 'raise-agreed' where the kernel raises and the reference is undefined too."""
    f = dict(DEFAULTS, **kernel_variants)
    d = Declared(variants=declared_variants)
    try:
        with np.errstate(all="ignore"):
            out = mx_kernel(x, case.act_dtype, f)
    except ValueError:
        rec, _ = judge_quantized(case, x, d, {})
        return "raise-agreed" if rec["verdict"] == "crash" else "fail: raised"
    rec, _ = judge_quantized(case, x, d, out)
    return rec["verdict"] if rec["verdict"] != "fail" else f"fail: {rec['reason']}"


IGNORE = {"mx_nan_block": "ignore"}
POSITIVE = {"e2m1_zero_sign": "positive"}
#: key -> {value: the other keys the kernel needs to show it}
KERNELS: dict = {
    "mx_scale_rule": {v: {} for v in ("floor", "even", "rceil", "ceil", "rceil_log2f")},
    "mx_byte0_divisor": {v: {} for v in ("byte", "min_normal", "one")},
    "mx_scale_overflow": {v: {"mx_scale_rule": "even"} for v in ("clamp", "nan")},
    # only a quotient that underflows changes, to +-0: shown by the zero-sign rule 'positive'
    "mx_quotient_dtype": {v: POSITIVE for v in ("exact", "input", "float32", "bfloat16", "float16")},
    "e2m1_rounding": {v: {} for v in ("rne", "rhaz", "rtz", "rhtz")},
    # the field decides the NaN codes under nan_block=ignore ('raise' raises under both)
    "e2m1_nan": dict({v: IGNORE for v in ("zero", "saturate", "saturate_positive", "zero_signed",
                                          "zero_sign_flipped")}, raise_={}),
    "e2m1_zero_sign": {v: {} for v in ("keep", "positive")},
    "mx_zero_block": {v: {} for v in ("min", "half", "eps_fp32", "eps_1e10", "eps_1e10_floor")},
    "mx_nan_block": {v: {} for v in ("scale_nan", "ignore")},
}
KERNELS["e2m1_nan"]["raise"] = KERNELS["e2m1_nan"].pop("raise_")
PARAMS = [(k, v) for k, vals in KERNELS.items() for v in vals]
PASSING = ("pass", "mistrusted", "raise-agreed")


def test_every_value_has_a_literal_kernel():
    """Completeness: a value added to an MX-activation axis of emulator/variants.py needs a kernel here."""
    assert not missing_kernels(Stage.MX_ACTIVATIONS, KERNELS)


@pytest.mark.parametrize("key, value", PARAMS, ids=[f"{k}={v}" for k, v in PARAMS])
def test_literal_kernel_passes_its_declaration_and_fails_the_canonical_one(key, value):
    req = KERNELS[key][value]
    mine = dict(req, **{key: value})
    bad, fails_canonical = {}, []
    pool = _pool()
    for name, case, x in pool:
        v = _verdict(case, x, mine, mine)
        if v not in PASSING:
            bad[name] = v
        if _verdict(case, x, mine, req) not in PASSING:
            fails_canonical.append(name)
    assert not bad, f"{key}={value}: the kernel written from the docs fails its own declaration: {bad}"
    assert any(_verdict(c, x, mine, mine) == "pass" for _, c, x in pool), "only agreement that proves nothing"
    if value != DEFAULTS[key]:
        assert fails_canonical, f"{key}={value}: no case tells the kernel from the canonical declaration"
