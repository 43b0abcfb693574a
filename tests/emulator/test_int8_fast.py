"""``int8_fast.quantize_int8_fast`` against the definition ``int8.quantize_int8_per_token``, field for field.

Regression gate: the fast quantizer is compared with the definition (which tests/emulator/test_activations_int8.py
checks against the ONNX reference evaluator and torch), on every value of every Int8ActVariant axis the symmetric
scheme has (each alone, every pair of the axes that interact in the quotient, and a seeded sample of whole
variants), on inputs built to reach each regime: ordinary rows, exact ties of the quotient (x = (k + 1/2) * scale),
zero rows, rows below an amax clamp, subnormal and huge values, +-Inf, -0; bit for bit (q, scale, zero point, the
quotient with NaN == NaN, ties), and the same error where the definition raises (NaN input, a NaN quotient under
``nan_to_int=raise``). Asymmetric and KleidiAI variants go to the definition (checked equal too).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from emulator.activations.int8 import (
    Granularity, Int8ActVariant, Int8Scheme, Reciprocal, ScaleFormula, SymDivisor, ZeroRowRule, dequantize_int8_per_token,
    quantize_int8_per_token,
)
from emulator.activations.int8_fast import dequantize_int8_fast, quantize_int8_fast
from emulator.numerics.rounding import NanToInt, Rounding

#: every value of each axis of the symmetric scheme (Int8ActVariant fields; the declaration's INT8_ACTIVATIONS axes)
AXES = {
    "rounding": list(Rounding),
    "reciprocal": list(Reciprocal),
    "scale_dtype": ["float32", "bfloat16", "float16"],
    "dequant_scale_dtype": [None, "float32", "bfloat16", "float16"],
    "scale_formula": list(ScaleFormula),
    "zero_row": list(ZeroRowRule),
    "nan_to_int": list(NanToInt),
    "granularity": list(Granularity),
    "sym_divisor": list(SymDivisor),
    "arith_dtype": ["float32", "bfloat16", "float16", "input"],
    "uint8_zp128": [False, True],
    "qmin": [-128, -127, 0],
    "qmax": [127, 100],
}


def _variant(**kw) -> Int8ActVariant:
    if kw.get("zero_row") is ZeroRowRule.EPS or kw.get("zero_row") == "eps":
        kw.setdefault("eps", 1e-7)
    return Int8ActVariant(**kw)


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    ordinary = (rng.standard_normal((6, 48)) * rng.uniform(1e-3, 1e3, (6, 1))).astype(np.float32)
    # exact ties: amax 127 * s with s a power of two gives scale s, quotients k + 1/2 (and odd / even k)
    ties = np.concatenate([np.full((4, 1), 127.0), (np.arange(-20, 20) + 0.5)[None, :].repeat(4, 0)], 1)
    ties = (ties * np.array([[1.0], [0.25], [2.0 ** -20], [8.0]])).astype(np.float32)
    special = np.zeros((7, 48), np.float32)
    special[1] = 1e-12 * np.linspace(-1, 1, 48)  # below zentorch's and every eps clamp
    special[2] = np.float32(1e-40) * np.arange(48)  # subnormal
    special[3, :5] = [3e38, -3e38, 1.0, -0.0, 2.0]  # huge
    special[4, :3] = [np.inf, 1.0, -2.0]
    special[5, :3] = [-np.inf, np.inf, 0.5]
    special[6] = -0.0
    return {"ordinary": ordinary, "ties": ties, "special": special, "one row": ordinary[:1].copy()}


def _check(x: np.ndarray, v: Int8ActVariant) -> None:
    try:
        want = quantize_int8_per_token(x, v)
    except Exception as e:  # noqa: BLE001 - the same error, from the fast one
        with pytest.raises(type(e)) as got:
            quantize_int8_fast(x, v)
        assert str(got.value) == str(e)
        return
    got = quantize_int8_fast(x, v)
    for field in ("q", "scale", "zero_point", "tie"):
        a, b = getattr(want, field), getattr(got, field)
        assert a.dtype == b.dtype and a.shape == b.shape, (field, v)
        assert np.array_equal(a, b), (field, v)
    wq, gq = want.quotient.astype(np.float64), got.quotient.astype(np.float64)
    assert ((wq.view(np.uint64) == gq.view(np.uint64)) | (np.isnan(wq) & np.isnan(gq))).all(), ("quotient", v)
    a, b = dequantize_int8_per_token(want), dequantize_int8_fast(got)
    assert ((a == b) | (np.isnan(a) & np.isnan(b))).all(), ("dequantized", v)
    assert got.stored(v).dtype == want.stored(v).dtype and np.array_equal(got.stored(v), want.stored(v))


def _feasible(kw: dict) -> bool:
    return kw.get("qmin", -128) < kw.get("qmax", 127)


@pytest.mark.parametrize("name", list(_inputs()))
@pytest.mark.parametrize("axis", list(AXES))
def test_every_value_of_each_axis(axis, name):
    x = _inputs()[name]
    for value in AXES[axis]:
        _check(x, _variant(**{axis: value}))


#: the axes that meet in the quotient and the scale: every pair of their values
_PAIRED = ("rounding", "reciprocal", "scale_dtype", "dequant_scale_dtype", "zero_row", "arith_dtype", "sym_divisor",
           "scale_formula")


@pytest.mark.parametrize("pair", list(itertools.combinations(_PAIRED, 2)), ids="-".join)
def test_every_pair_of_quotient_axes(pair):
    a, b = pair
    for name in ("ties", "special"):
        x = _inputs()[name]
        for va, vb in itertools.product(AXES[a], AXES[b]):
            _check(x, _variant(**{a: va, b: vb}))


def test_a_seeded_sample_of_whole_variants():
    rng = np.random.default_rng(25)
    xs = _inputs()
    n = 0
    while n < 150:
        kw = {k: vals[rng.integers(len(vals))] for k, vals in AXES.items()}
        if not _feasible(kw):
            continue
        kw["eps"] = float(rng.choice([1e-10, 1.27e-8, 1e-5]))
        v = Int8ActVariant(**kw) if kw["zero_row"] is ZeroRowRule.EPS else _variant(**{k: w for k, w in kw.items()
                                                                                           if k != "eps"})
        for x in xs.values():
            _check(x, v)
        n += 1


@settings(max_examples=150, deadline=None)
@given(hnp.arrays(np.float32, st.tuples(st.integers(1, 5), st.integers(1, 30)),
                  elements=st.floats(width=32, allow_nan=False)),
       st.sampled_from(AXES["rounding"]), st.sampled_from(AXES["reciprocal"]), st.sampled_from(AXES["zero_row"]),
       st.sampled_from(AXES["arith_dtype"]), st.sampled_from(AXES["dequant_scale_dtype"]))
def test_random_inputs(x, rounding, reciprocal, zero_row, arith, deq):
    _check(x, _variant(rounding=rounding, reciprocal=reciprocal, zero_row=zero_row, arith_dtype=arith,
                       dequant_scale_dtype=deq))


def test_nan_input_raises_the_definitions_error():
    x = _inputs()["ordinary"].copy()
    x[2, 3] = np.nan
    for v in (Int8ActVariant(), _variant(zero_row="eps", dequant_scale_dtype="bfloat16")):
        _check(x, v)


def test_a_nan_quotient_under_raise_raises_as_the_definition_does():
    x = _inputs()["special"]  # the zero row under zero_row=nan gives 0 / 0
    with pytest.raises(ValueError, match="x / scale: NaN cannot be quantized"):
        quantize_int8_fast(x, Int8ActVariant(zero_row="nan", nan_to_int="raise"))
    _check(x, Int8ActVariant(zero_row="nan", nan_to_int="raise"))


@pytest.mark.parametrize("v", [Int8ActVariant(symmetric=False), Int8ActVariant(symmetric=False, azp_before_rounding=True),
                               Int8ActVariant(scheme=Int8Scheme.KAI_QA8DX, rounding="rhaz")],
                         ids=["asym", "asym-azp-before", "kai"])
def test_other_schemes_are_the_definitions(v):
    for x in _inputs().values():
        _check(x, v)


def test_other_input_dtypes_are_the_definitions():
    x = _inputs()["ordinary"]
    _check(x.astype(np.float16), Int8ActVariant(arith_dtype="input"))
    _check(x.astype(np.float64), Int8ActVariant())


def test_codes_only_leaves_out_the_quotient_and_ties_only():
    x = _inputs()["ties"]
    for v in (Int8ActVariant(), Int8ActVariant(rounding="rhaz", zero_row="eps", eps=1e-7),
              Int8ActVariant(symmetric=False)):
        a, b = quantize_int8_fast(x, v), quantize_int8_fast(x, v, codes_only=True)
        assert b.quotient is None and b.tie is None
        assert np.array_equal(a.q, b.q) and np.array_equal(a.scale, b.scale) and np.array_equal(a.zero_point,
                                                                                                  b.zero_point)
