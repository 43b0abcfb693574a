"""The named variants the adapter authors measured (docs/formats/*.md): each differs from canonical on
a constructed input, and each reproduces its adapter author's reproducer through the emulator alone
(no kernel needed; the kernel-side probes are in tests/backends/).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from emulator import moe as emoe
from emulator.activations import int8 as a8
from emulator.formats import awq, compressed_tensors as ct, gptq
from emulator.formats.int_common import DequantOrder, DequantVariant, dequantize_affine
from emulator.numerics.floats import round_to_dtype
from emulator.numerics.rounding import Rounding


# -- 1. float zero point (tinygemm) ---------------------------------------------------------------------
def _ct_asym(q_signed: int, zp_signed: int, scale: float, N: int = 16, K: int = 32):
    p = ct.CtPackParams(num_bits=4, strategy="group", group_size=K, symmetric=False)
    t = ct.pack_ct_packed(ct.CtCodes(q=np.full((N, K), q_signed, np.int8), scales=np.full((N, 1), scale, np.float16),
                                     zero_point=np.full((N, 1), zp_signed, np.int8)), p)
    return t, p


def test_float_zero_reproduces_int4pack_probe():
    """torch-cpu P1: q = z = 15 (signed 7, 7), s = 1 + 2**-7, T = bf16: canonical 0; the kernel's
    (q - 8) s_T + bf16((8 - z) s_T) = 7.0546875 - 7.0625 = -2**-7 (docs/backends/torch-cpu.md)."""
    t, p = _ct_asym(7, 7, 1.0078125)
    canon = ct.dequantize_ct_packed(t, p)
    tiny = ct.dequantize_ct_packed(t, p, variant=DequantVariant(order="float_zero", zero_dtype="bfloat16"))  # torch-cpu's declaration
    assert (canon == 0).all()
    assert (tiny == -2.0 ** -7).all()
    # with an fp32 zero (fp32 activations) the zero is exact: canonical
    assert (ct.dequantize_ct_packed(t, p, variant=DequantVariant(order="float_zero", zero_dtype="float32")) == 0).all()


def test_float_zero_same_value_in_every_format():
    """GPTQ/AWQ (unsigned codes, midpoint 8) and CT (signed codes, midpoint 0) give the same weights."""
    N, K = 8, 32
    q = np.full((N, K), 15, np.uint8)
    z = np.full((1, N), 15, np.int32)
    s = np.full((1, N), 1.0078125, np.float16)
    gp = gptq.GptqParams(bits=4, group_size=K, sym=False, zero_convention="gptq_v2")
    gt = gptq.pack_gptq(gptq.GptqCodes(q=q, zeros=z, scales=s, g_idx=np.zeros(K, np.int32)), gp)
    ap = awq.AwqParams(group_size=K)
    at = awq.pack_awq(awq.AwqCodes(q=q, zeros=z, scales=s), ap)
    kw = dict(order="float_zero", compute_dtype="bfloat16")  # CUDA tinygemm: zero and FMA in bf16
    wg = gptq.dequantize_gptq(gt, gp, variant=DequantVariant(**kw))
    wa = awq.dequantize_awq(at, ap, variant=DequantVariant(**kw))
    assert (wg == -2.0 ** -7).all() and (wa == -2.0 ** -7).all()
    assert (gptq.dequantize_gptq(gt, gp) == 0).all()


def test_float_zero_is_one_fused_rounding():
    """In a 16-bit compute dtype the sum (q - m) s + zero is rounded once (an FMA, as tinygemm's
    __hfma2), not product then sum: q = 1, z = 0, s = 0.58203125 (bf16)."""
    q, z, s = np.array([1]), np.array([0]), np.array([0.58203125])
    fused = dequantize_affine(q, z, s, midpoint=8, variant=DequantVariant(order="float_zero", compute_dtype="bfloat16"))
    zero = round_to_dtype((8 - 0) * s, "bfloat16")  # 4.65625: exact
    two_roundings = round_to_dtype(round_to_dtype((1 - 8) * s, "bfloat16") + zero, "bfloat16")
    assert fused[0] == 0.58203125 == round_to_dtype((1 - 8) * s + zero, "bfloat16")[0]
    assert two_roundings[0] == 0.59375


@given(st.integers(0, 2**32 - 1))
def test_float_zero_equals_canonical_when_the_zero_is_representable(seed):
    """Symmetric weights (z = m: zero 0) and fp32 zeros of 16-bit scales reproduce (q - z) s exactly."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 16, 512)
    z = rng.integers(0, 17, 512)
    s = rng.integers(0x0001, 0x7BFF, 512).astype(np.uint16).view(np.float16)  # every finite positive fp16
    canon = dequantize_affine(q, z, s)
    f32 = DequantVariant(order="float_zero", zero_dtype="float32")
    assert np.array_equal(dequantize_affine(q, z, s, variant=f32, midpoint=8), canon)
    bf16 = DequantVariant(order="float_zero", zero_dtype="bfloat16")
    assert np.array_equal(dequantize_affine(q, np.full(512, 8), s, variant=bf16, midpoint=8),
                          dequantize_affine(q, np.full(512, 8), s))


# -- 2. compute (weight) rounding -----------------------------------------------------------------------
def test_rtz_weight_rounding_reproduces_avx512_truncation():
    """vLLM _C_AVX512: (q - z) s formed in fp32 and truncated to bf16. 3 * (1 + 2**-7) = 3.0234375 is a
    bf16 tie: RNE gives 3.03125, RTZ 3.015625."""
    q, z, s = np.array([11]), np.array([8]), np.array([1.0078125])
    rne = dequantize_affine(q, z, s, variant=DequantVariant(compute_dtype="bfloat16"))
    rtz = dequantize_affine(q, z, s, variant=DequantVariant(compute_dtype="bfloat16", compute_rounding="rtz"))
    assert rne[0] == 3.03125 and rtz[0] == 3.015625
    # the same value as the hardware's bit truncation of the fp32 product
    bits = np.array([3.0234375], np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    assert rtz[0] == bits.view(np.float32)[0]


@given(st.integers(0, 2**32 - 1))
def test_rtz_weights_are_truncated_fp32_weights(seed):
    rng = np.random.default_rng(seed)
    q, z = rng.integers(0, 16, 256), rng.integers(0, 16, 256)
    s = round_to_dtype(rng.random(256) * 0.1, "bfloat16")  # vLLM holds the scales in bf16 already
    w32 = dequantize_affine(q, z, s)  # exact in fp32 for 16-bit scales
    trunc = (w32.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    rtz = DequantVariant(compute_dtype="bfloat16", compute_rounding="rtz")
    assert np.array_equal(dequantize_affine(q, z, s, variant=rtz), trunc)


def test_a_variant_is_typed_and_refuses_unknown_names():
    """DequantVariant stores the enums whatever spelling it is given (so two spellings of one variant are one
    variant), its defaults are the canonical arithmetic, and a misspelt value fails when built, naming it."""
    from emulator.formats.int_common import CANONICAL_DEQUANT, ComputeDtype

    v = DequantVariant(order="float_zero", scale_dtype="bfloat16", compute_dtype="float16", compute_rounding="RTZ",
                       zero_dtype="float32")
    assert (v.order, v.scale_dtype, v.compute_dtype, v.compute_rounding, v.zero_dtype) == (
        DequantOrder.FLOAT_ZERO, ComputeDtype.BFLOAT16, ComputeDtype.FLOAT16, Rounding.RTZ, ComputeDtype.FLOAT32)
    assert type(v.order) is DequantOrder and type(v.compute_rounding) is Rounding
    assert v == DequantVariant(DequantOrder.FLOAT_ZERO, ComputeDtype.BFLOAT16, ComputeDtype.FLOAT16, Rounding.RTZ,
                               ComputeDtype.FLOAT32)
    assert CANONICAL_DEQUANT == DequantVariant(order="sub_then_mul", compute_dtype="float32", compute_rounding="rne")
    assert CANONICAL_DEQUANT.scale_dtype is None and CANONICAL_DEQUANT.zero_dtype is None
    for bad in (dict(order="mul_before_sub"), dict(compute_dtype="fp16"), dict(compute_rounding="nearest"),
                dict(scale_dtype="float8")):
        with pytest.raises(ValueError, match=repr(next(iter(bad.values())))):
            DequantVariant(**bad)


# -- 5. int8 activation axes ----------------------------------------------------------------------------
def test_recip_mul_scale_reproduces_woqgemm_s8():
    """ARK woqgemm_s8: scale = fl32(amax * fl32(1/127)). amax = 1.1171875, x = amax / 2: the exact
    quotient is 63.5; the divide scale rounds it to 63, the recip_mul scale to 64."""
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 1] = 1.1171875, 1.1171875 / 2
    div = a8.quantize_int8_per_token(x, a8.Int8ActVariant(reciprocal="recip_scale"))
    mul = a8.quantize_int8_per_token(x, a8.Int8ActVariant(reciprocal="recip_scale", scale_formula="recip_mul"))
    assert div.scale[0, 0] != mul.scale[0, 0]
    assert mul.scale[0, 0] == np.float32(np.float32(1.1171875) * (np.float32(1) / np.float32(127)))
    assert (div.q[0, 1], mul.q[0, 1]) == (63, 64)


def test_recip_mul_differs_for_some_bf16_amax():
    """About 4.5 % of bf16 amax values get a different scale (docs/backends/ark.md)."""
    amax = (np.arange(0x3F80, 0x4000, dtype=np.uint32) << 16).view(np.float32)  # every bf16 in [1, 2)
    div = (amax / np.float32(127)).astype(np.float32)
    mul = (amax * (np.float32(1) / np.float32(127))).astype(np.float32)
    frac = float(np.mean(div != mul))
    assert 0.02 < frac < 0.08


def test_per_tensor_granularity_reproduces_woqgemm_s8():
    """ARK: rows [127, 0, ...] and [1, 0.5, 1.5, 2.5, -2.5]: one amax 127 -> scale 1 for both rows."""
    x = np.zeros((2, 32), np.float32)
    x[0, 0], x[1, 0] = 127.0, 1.0
    x[1, 1:5] = [0.5, 1.5, 2.5, -2.5]
    v = a8.Int8ActVariant(reciprocal="recip_scale", granularity="per_tensor", scale_formula="recip_mul")
    t = a8.quantize_int8_per_token(x, v)
    assert (t.scale == 1.0).all() and t.q[1, :5].tolist() == [1, 0, 2, 2, -2]
    tok = a8.quantize_int8_per_token(x, a8.Int8ActVariant(reciprocal="recip_scale", scale_formula="recip_mul"))
    assert tok.q[1, 0] == 51 and not np.array_equal(tok.q, t.q)
    # one row: per tensor is per token
    assert np.array_equal(a8.quantize_int8_per_token(x[1:], v).q, tok.q[1:])


def test_per_tensor_asymmetric_uses_tensor_min_max():
    x = np.array([[0.0, 1.0], [-3.0, 0.5]], np.float32)
    t = a8.quantize_int8_per_token(x, a8.Int8ActVariant(symmetric=False, granularity="per_tensor"))
    assert t.scale[0, 0] == t.scale[1, 0] == np.float32(np.float32(4.0) / np.float32(255))
    assert t.zero_point[0, 0] == t.zero_point[1, 0]


def test_azp_before_rounding_reproduces_onednn_codes():
    """vLLM x86 oneDNN azp: row [-129, 126, 0.5, 1.5, 2.5, -0.5, -1.5, 3.5] has scale 1, azp 1; the
    kernel's codes RNE(x + 1) are [-128, 127, 2, 2, 4, 0, 0, 4]; canonical RNE(x) + 1 gives 1, 3, 3, 1, -1, 5."""
    x = np.zeros((1, 32), np.float32)
    x[0, :8] = [-129.0, 126.0, 0.5, 1.5, 2.5, -0.5, -1.5, 3.5]
    kern = a8.quantize_int8_per_token(x, a8.Int8ActVariant(symmetric=False, reciprocal="recip_scale",
                                                           azp_before_rounding=True))
    canon = a8.quantize_int8_per_token(x, a8.Int8ActVariant(symmetric=False, reciprocal="recip_scale"))
    assert kern.scale[0, 0] == 1.0 and kern.zero_point[0, 0] == 1
    assert kern.q[0, :8].tolist() == [-128, 127, 2, 2, 4, 0, 0, 4]
    assert canon.q[0, 2:8].tolist() == [1, 3, 3, 1, -1, 5]
    assert np.array_equal(kern.q != canon.q, canon.tie & (kern.q != canon.q))  # only at ties
    assert kern.tie[0, 2:8].all()  # the rounded value x + azp is the tie now


def test_kai_qa8dx_reproduces_adapter_rows():
    """torch-cpu P3: [127.5, 0.25, 0.75] (all >= 0): range [0, 127.5], inv 2, zp -128, codes rounded half
    away from zero; zero row -> inv 1, codes = zp; mixed row: nudged zero point."""
    x = np.zeros((3, 8), np.float32)
    x[0, :3] = [127.5, 0.25, 0.75]
    x[2] = np.linspace(-1.0, 3.0, 8, dtype=np.float32)
    a = a8.quantize_int8_per_token(x, a8.Int8ActVariant(scheme="kai_qa8dx", rounding="rhaz"))
    assert a.scale[0, 0] == 0.5 and a.zero_point[0, 0] == -128
    assert (a.q[0, :3] - a.zero_point[0, 0]).tolist() == [255, 1, 2]
    assert a.scale[1, 0] == 1.0 and a.zero_point[1, 0] == 127 and (a.q[1] == 127).all()
    assert a.zero_point[2, 0] == -64 and a.scale[2, 0] == np.float32(1) / np.float32(np.float32(255) / np.float32(4))
    # RNE ties instead: 0.5 -> 0
    rne = a8.quantize_int8_per_token(x, a8.Int8ActVariant(scheme="kai_qa8dx"))
    assert (rne.q[0, :3] - rne.zero_point[0, 0]).tolist() == [255, 0, 2]


def test_kai_qa8dx_differs_from_canonical_asym():
    """All-positive row: qa8dx keeps 0 in the range (scale max / 255), canonical asym uses (max - min) / 255."""
    x = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    k = a8.quantize_int8_per_token(x, a8.Int8ActVariant(scheme="kai_qa8dx", rounding="rhaz"))
    c = a8.quantize_int8_per_token(x, a8.CANONICAL_ASYM)
    assert k.scale[0, 0] == np.float32(1) / np.float32(np.float32(255) / np.float32(4))
    assert c.scale[0, 0] == np.float32(np.float32(3) / np.float32(255))
    assert not np.allclose(a8.dequantize_int8_per_token(k), a8.dequantize_int8_per_token(c))


def test_dequant_scale_dtype_reproduces_zendnn_rule():
    """zentorch: the quotient uses the fp32 scale, the accumulator is scaled by bf16(scale)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    v = a8.Int8ActVariant(dequant_scale_dtype="bfloat16")
    a = a8.quantize_int8_per_token(x, v)
    ref = a8.quantize_int8_per_token(x)
    assert np.array_equal(a.q, ref.q)
    assert np.array_equal(a.scale, round_to_dtype(ref.scale, "bfloat16").astype(np.float32))
    both = a8.quantize_int8_per_token(x, a8.Int8ActVariant(scale_dtype="bfloat16"))  # bf16 everywhere
    assert not np.array_equal(both.q, a.q)


@pytest.mark.parametrize("kw", [
    dict(scheme="kai_qa8dx", reciprocal="recip_scale"), dict(scheme="kai_qa8dx", granularity="per_tensor"),
    dict(azp_before_rounding=True), dict(scale_formula="fancy"), dict(granularity="per_block"),
    dict(dequant_scale_dtype="int8"),
])
def test_invalid_int8_variants(kw):
    with pytest.raises(ValueError):
        a8.Int8ActVariant(**kw)


# -- 6. GPTQ v1_literal ---------------------------------------------------------------------------------
def test_v1_literal_worked_example():
    """Word 0xF000003F (fields F, 3, 0, 0, 0, 0, 0, F): canonical 16, 4, 1, ..., 16; literal 15, 3, 0, ..., 15."""
    p = gptq.GptqParams(bits=4, group_size=8, sym=False)
    qz = np.array([[np.uint32(0xF000003F).view(np.int32)]], np.int32)
    t = gptq.GptqTensors(qweight=np.zeros((1, 8), np.int32), qzeros=qz, scales=np.ones((1, 8), np.float16))
    assert gptq.unpack_gptq(t, p).zeros[0].tolist() == [16, 4, 1, 1, 1, 1, 1, 16]
    assert gptq.unpack_gptq(t, p, zero_read="v1_literal").zeros[0].tolist() == [15, 3, 0, 0, 0, 0, 0, 15]
    with pytest.raises(Exception):
        gptq.unpack_gptq(t, gptq.GptqParams(bits=4, group_size=8, sym=False, zero_convention="gptq_v2"),
                         zero_read="v1_literal")


def test_v1_literal_reproduces_ark_vllm_reading():
    """ARK reproducer: vLLM's QuantLinear on a v1 asym checkpoint = the same tensors read as gptq_v2."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((96, 256)) * 0.02).astype(np.float16)
    p1 = gptq.GptqParams(bits=4, group_size=32, sym=False)
    t = gptq.quantize_gptq(w, p1, v1_zero_write="packed_sub")
    lit = gptq.dequantize_gptq(t, p1, zero_read="v1_literal")
    v2 = gptq.dequantize_gptq(t, gptq.GptqParams(bits=4, group_size=32, sym=False, zero_convention="gptq_v2"))
    assert np.array_equal(lit, v2)
    assert not np.array_equal(lit, gptq.dequantize_gptq(t, p1))


# -- 7. MoE with int8 GEMM inputs -----------------------------------------------------------------------
def _moe_setup(seed=0, M=5, E=4, I=32, K=64):
    rng = np.random.default_rng(seed)
    x = round_to_dtype(rng.standard_normal((M, K)), "bfloat16").astype(np.float32)
    w13 = rng.standard_normal((E, 2 * I, K)) * 0.05
    w2 = rng.standard_normal((E, K, I)) * 0.05
    logits = rng.standard_normal((M, E)).astype(np.float32)
    return x, logits, w13, w2


AQ = dict(reciprocal="recip_amax", zero_row="eps", eps=1e-7, uint8_zp128=True)


def test_moe_act_quant_is_quantize_dequantize_of_both_gemm_inputs():
    x, logits, w13, w2 = _moe_setup()
    v = emoe.MoeVariant(act_quant=AQ, intermediate_dtype="bfloat16")
    r = emoe.moe_w16(x, logits, w13, w2, 2, variant=v, out_dtype="bfloat16")
    ids, wts = emoe.route(logits, 2)
    aq = a8.Int8ActVariant(**AQ)
    xq = a8.dequantize_int8_per_token(a8.quantize_int8_per_token(x, aq))
    y = np.zeros((x.shape[0], x.shape[1]))
    for m in range(x.shape[0]):
        for j in range(2):
            e = ids[m, j]
            h = xq[m] @ w13[e].T
            a = round_to_dtype(h[:32] / (1 + np.exp(-h[:32])) * h[32:], "bfloat16")
            a_in = a8.dequantize_int8_per_token(a8.quantize_int8_per_token(a[None].astype(np.float32), aq))[0]
            y[m] += wts[m, j] * (a_in @ w2[e].T)
    np.testing.assert_allclose(r.y_exact, y, rtol=1e-12, atol=1e-15)
    canon = emoe.moe_w16(x, logits, w13, w2, 2, variant=emoe.MoeVariant(intermediate_dtype="bfloat16"),
                         out_dtype="bfloat16")
    assert not np.allclose(canon.y_exact, r.y_exact, rtol=1e-3, atol=0)
    assert np.allclose(canon.y_exact, r.y_exact, rtol=0.1, atol=0.05)  # the same layer, quantized


def test_moe_gate_up_dtype_rounds_the_first_gemm():
    x, logits, w13, w2 = _moe_setup(1)
    r = emoe.moe_w16(x, logits, w13, w2, 2, variant=emoe.MoeVariant(gate_up_dtype="bfloat16"))
    h = r.parts["h"]
    assert np.array_equal(h, round_to_dtype(h, "bfloat16"))
    assert not np.array_equal(emoe.moe_w16(x, logits, w13, w2, 2).parts["h"], h)
    assert emoe.MoeVariant(act_quant=AQ).describe()["act_quant"]["reciprocal"] == "recip_amax"


def test_rounding_parse_covers_output_roundings():
    assert Rounding.parse("rtz") is Rounding.RTZ and Rounding.parse("RNE") is Rounding.RNE


def test_dequant_order_enum_names():
    assert DequantOrder("float_zero") is DequantOrder.FLOAT_ZERO
