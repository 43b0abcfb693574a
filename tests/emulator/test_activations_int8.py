"""Per-token int8 activation quantization against independent implementations.

Oracles: the ONNX reference evaluator's QuantizeLinear (x / scale, RNE,
saturate) and torch's own float32 arithmetic with torch.round (RNE).
"""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

from emulator.activations.int8 import (
    CANONICAL_ASYM, Int8ActVariant, Reciprocal, ZeroRowRule, quantize_int8_per_token,
)
from emulator.errors import FormatError
from emulator.numerics.rounding import Rounding

finite_f32 = st.floats(min_value=-1e4, max_value=1e4, width=32, allow_nan=False, allow_infinity=False)
act_arrays = hnp.arrays(np.float32, st.tuples(st.integers(1, 6), st.integers(1, 40)), elements=finite_f32)


def onnx_quantize_rows(x, scale):
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=0)
    graph = helper.make_graph(
        [node], "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("z", TensorProto.INT8, None)],
        [helper.make_tensor_value_info("y", TensorProto.INT8, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    (y,) = ReferenceEvaluator(model).run(None, {"x": x, "s": scale, "z": np.zeros(scale.shape, np.int8)})
    return y


@given(act_arrays)
def test_symmetric_matches_onnx_quantizelinear(x):
    a = quantize_int8_per_token(x)
    nz = a.scale[:, 0] > 0
    if not nz.any():
        return
    ref = onnx_quantize_rows(x[nz], a.scale[nz, 0])
    np.testing.assert_array_equal(a.q[nz], ref)


@given(act_arrays)
def test_symmetric_scale_and_codes_match_torch(x):
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(x)
    amax = t.abs().amax(dim=1, keepdim=True)
    scale = amax / 127.0
    q = torch.where(scale > 0, torch.round(t / scale), torch.zeros_like(t)).clamp(-128, 127)
    a = quantize_int8_per_token(x)
    np.testing.assert_array_equal(a.scale, scale.numpy())
    # rows whose scale underflows to 0 with amax > 0 follow the saturation rule (tested below), not the
    # oracle's zero-row shortcut
    ok = ((scale > 0) | (amax == 0)).squeeze(1).numpy()
    np.testing.assert_array_equal(a.q[ok], q.numpy().astype(np.int32)[ok])


@given(act_arrays)
def test_reciprocal_forms_match_torch(x):
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(x)
    amax = t.abs().amax(dim=1, keepdim=True)
    # Rows whose reciprocal overflows (subnormal amax) make torch's x * inf undefined (0 * inf = NaN
    # then an int cast): compare only rows where torch's quotients are finite.
    ok = ((amax > 0) & torch.isfinite(127.0 / amax) & torch.isfinite(1.0 / (amax / 127.0))).squeeze(1)
    a = quantize_int8_per_token(x, Int8ActVariant(reciprocal=Reciprocal.RECIP_AMAX))
    q = torch.round(t * (127.0 / amax)).clamp(-128, 127)
    np.testing.assert_array_equal(a.q[ok.numpy()], q[ok].numpy().astype(np.int32))
    b = quantize_int8_per_token(x, Int8ActVariant(reciprocal=Reciprocal.RECIP_SCALE))
    q2 = torch.round(t * (1.0 / (amax / 127.0))).clamp(-128, 127)
    np.testing.assert_array_equal(b.q[ok.numpy()], q2[ok].numpy().astype(np.int32))


def test_ties_follow_the_named_rounding():
    # amax = 127 * 2**-1 gives scale 0.5 exactly; x = k + 0.5 in units of the scale are ties.
    x = np.array([[63.5, 0.25, -0.25, 0.75, -0.75, 1.25]], dtype=np.float32)
    expect = {
        Rounding.RNE: [127, 0, 0, 2, -2, 2],
        Rounding.RHAZ: [127, 1, -1, 2, -2, 3],
        Rounding.RTZ: [127, 0, 0, 1, -1, 2],
        Rounding.RHTZ: [127, 0, 0, 1, -1, 2],
    }
    for mode, q in expect.items():
        a = quantize_int8_per_token(x, Int8ActVariant(rounding=mode))
        assert a.scale[0, 0] == np.float32(0.5)
        assert a.q[0].tolist() == q, mode
    a = quantize_int8_per_token(x)
    assert a.tie[0].tolist() == [False, True, True, True, True, True]


def test_clamp_range_variant():
    # asymmetric-looking row under symmetric quant never reaches -128; RECIP_AMAX can overshoot
    # only through rounding, so test the clamp through the asymmetric scheme instead.
    x = np.array([[-1.0, 0.0, 3.0]], dtype=np.float32)
    a = quantize_int8_per_token(x, CANONICAL_ASYM)
    assert a.q.min() == -128 and a.q.max() == 127
    b = quantize_int8_per_token(x, Int8ActVariant(symmetric=False, qmin=-127))
    assert b.q.min() == -127


def test_zero_row_rules():
    x = np.zeros((1, 8), np.float32)
    a = quantize_int8_per_token(x)
    assert a.scale[0, 0] == 0 and not a.q.any()
    e = quantize_int8_per_token(x, Int8ActVariant(zero_row=ZeroRowRule.EPS, eps=1e-10))
    assert e.scale[0, 0] == np.float32(np.float32(1e-10) / np.float32(127)) and not e.q.any()
    n = quantize_int8_per_token(x, Int8ActVariant(zero_row=ZeroRowRule.NAN))
    assert not n.q.any()  # NaN quotient -> 0 under NanToInt.ZERO


def test_scale_dtype_variant_rounds_the_scale():
    x = np.array([[1.0, 0.3]], dtype=np.float32)
    a = quantize_int8_per_token(x, Int8ActVariant(scale_dtype="bfloat16"))
    s = a.scale[0, 0]
    assert (s.view(np.uint32) & 0xFFFF) == 0  # a bf16 value
    exact = Fraction(1) / 127
    assert abs(Fraction(float(s)) - exact) <= exact * Fraction(1, 256)


def test_asymmetric_matches_exact_definition():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 33)) * 3 + 1).astype(np.float32)
    a = quantize_int8_per_token(x, CANONICAL_ASYM)
    for m in range(5):
        span = np.float32(x[m].max() - x[m].min())
        scale = np.float32(span / np.float32(255))
        assert a.scale[m, 0] == scale
        azp = np.rint(np.float32(-128) - np.float32(x[m].min() / scale))
        assert a.zero_point[m, 0] == azp
        q = np.clip(np.rint((x[m] / scale).astype(np.float32)) + azp, -128, 127)
        np.testing.assert_array_equal(a.q[m], q)


def test_every_variant_differs_from_canonical_somewhere():
    x2 = np.array([[63.5, 0.25, -0.25, 0.75, -0.75, 1.25, 2.5, 0.0],   # ties (scale 0.5)
                   [100.0, 0.3, -7.0, 1e-3, 55.5, 3.3, -99.0, 0.1],   # scale not bf16/fp16-exact
                   [0.0] * 8], dtype=np.float32)
    base = quantize_int8_per_token(x2)
    variants = [
        Int8ActVariant(rounding=Rounding.RHAZ), Int8ActVariant(rounding=Rounding.RTZ),
        Int8ActVariant(rounding=Rounding.RHTZ), Int8ActVariant(scale_dtype="bfloat16"),
        Int8ActVariant(scale_dtype="float16"),
    ]
    for v in variants:
        a = quantize_int8_per_token(x2, v)
        assert not (np.array_equal(a.q, base.q) and np.array_equal(a.scale, base.scale)), v
    # Reciprocal forms differ from division only next to rounding ties: search tie neighbourhoods.
    for r in (Reciprocal.RECIP_AMAX, Reciprocal.RECIP_SCALE):
        assert _find_discriminating_row(Int8ActVariant(reciprocal=r)) is not None, r
    eps = quantize_int8_per_token(x2, Int8ActVariant(zero_row=ZeroRowRule.EPS, eps=1e-3))
    assert not np.array_equal(eps.scale, base.scale)


def test_bad_input_is_named():
    with pytest.raises(FormatError, match="x: .*\\[M, K\\]"):
        quantize_int8_per_token(np.zeros(4, np.float32))
    with pytest.raises(FormatError, match="NaN"):
        quantize_int8_per_token(np.array([[1.0, np.nan]], np.float32))
    with pytest.raises(ValueError, match="clamp range"):
        Int8ActVariant(qmin=-200)


def _find_discriminating_row(variant, tries=2000):
    rng = np.random.default_rng(7)
    for _ in range(tries):
        amax = np.float32(rng.uniform(0.5, 100.0))
        scale = np.float32(amax / np.float32(127))
        k = rng.integers(1, 126)
        mid = np.float32((k + 0.5) * scale)
        cands = np.array([np.nextafter(mid, np.float32(-np.inf)), mid, np.nextafter(mid, np.float32(np.inf))],
                         dtype=np.float32)
        row = np.concatenate([[amax], cands]).astype(np.float32)[None, :]
        if not np.array_equal(quantize_int8_per_token(row, variant).q, quantize_int8_per_token(row).q):
            return row
    return None


def test_subnormal_amax_reciprocal_overflow_saturates():
    # 127 / amax overflows to +inf in fp32: x * inf saturates to 127, 0 * inf = NaN -> 0 (PTX .sat rule)
    x = np.array([[1.12407e-40, 0.0, -1.12407e-40]], dtype=np.float32)
    a = quantize_int8_per_token(x, Int8ActVariant(reciprocal=Reciprocal.RECIP_AMAX))
    assert a.q.tolist() == [[127, 0, -128]]
    # division by the (subnormal) scale is finite: canonical codes are +-127
    assert quantize_int8_per_token(x).q.tolist() == [[127, 0, -127]]


def test_scale_underflow_saturates_like_the_cuda_kernel():
    # amax = 2**-149: amax / 127 underflows to 0 in fp32; x / 0 = +-inf saturates (vLLM CUDA's
    # x * (127 / amax) = x * inf does the same), and the codes dequantize to 0 with the zero scale
    x = np.array([[1e-45, -1e-45, 0.0]], dtype=np.float32)
    a = quantize_int8_per_token(x)
    assert a.scale[0, 0] == 0 and a.q.tolist() == [[127, -128, 0]]
