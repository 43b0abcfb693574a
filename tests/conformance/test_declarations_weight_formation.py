"""Every way of forming 16-bit weights is declarable (docs/formats/gptq.md#weight-formation, issue 21 item 5).

Each kernel here is written in torch from the sentence of the docs' table, not from the emulator's code:
it unpacks the checkpoint by docs/formats/gptq.md#packing, forms its weights the way the row says, multiplies
in float32 and rounds the output once. It must pass with the declaration that names its way, and its
weights must equal the declared weights bit for bit; under each other ``weight_formation`` (on inputs that
separate them) the declared weights differ and the case fails. compressed-tensors' own ``dequantize`` is
the ``in_scale_dtype`` kernel (the library the value is named after).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from backends.base import Case, Declared
from conformance.judge.acceptance import compare, declared_interval, declared_weight
from conformance.cases.inputs import make_inputs
from conformance.run.runner import rounded_interval

FORMATIONS = ("in_weight_dtype", "float32_then_round", "in_scale_dtype")
TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _t(a) -> torch.Tensor:
    """A checkpoint array as a float32 or integer torch tensor (bf16 arrays arrive as ml_dtypes)."""
    a = np.asarray(a)
    if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
        return torch.from_numpy(a.astype(np.float32))
    return torch.from_numpy(a.astype(np.int64))


def unpack_fields(packed: torch.Tensor, bits: int, axis: int) -> torch.Tensor:
    """docs/formats/gptq.md#packing: element F*j + i along ``axis`` is bits [b*i, b*(i+1)) of word j."""
    f = 32 // bits
    words = packed & 0xFFFFFFFF  # the int32's bits, non-negative in int64
    fields = torch.stack([(words >> (bits * i)) & ((1 << bits) - 1) for i in range(f)], dim=axis + 1)
    shape = list(packed.shape)
    shape[axis] *= f
    return fields.reshape(shape)


def gptq_qzs(inp):
    """(q [N, K], z [N, K], s [N, K] float32) of a GPTQ v2 checkpoint (z = field, docs/formats/gptq.md)."""
    case, t = inp.case, inp.tensors
    q = unpack_fields(_t(t["qweight"]), case.bits, 0).T  # [K, N] -> [N, K]
    g = torch.arange(case.K) // case.group
    z = unpack_fields(_t(t["qzeros"]), case.bits, 1)[g].T  # [G, N] -> per column k
    s = _t(t["scales"])[g].T
    assert case.zero_convention == "v2"
    return q, z, s


def ct_int_qs(inp):
    t = inp.tensors
    return _t(t["weight"]), torch.zeros(1, dtype=torch.int64), _t(t["weight_scale"])  # s [N, 1] broadcasts


def ct_dequantize(t, dtype):
    """compressed-tensors' ``dequantize`` of an int8 weight with one scale per row (lifecycle/forward.py), as one
    group of K: its group path casts the result ``.to(dtype)`` (0.20's channel path returns the scale's dtype)."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    args = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="group",
                            group_size=int(np.asarray(t["weight"]).shape[1]))
    return dequantize(torch.from_numpy(np.asarray(t["weight"])), torch.from_numpy(np.asarray(t["weight_scale"])),
                      args=args, dtype=dtype)


def run_float32(inp, w: torch.Tensor) -> np.ndarray:
    """float32 products and sums, one RNE rounding to the output dtype (the kernel's GEMM)."""
    x = torch.from_numpy(np.asarray(inp.x, np.float32))
    y = x @ w.to(torch.float32).T
    return y.to(TORCH[inp.case.output_dtype]).to(torch.float32).numpy()


# -- the kernels, one per row of the table ---------------------------------------------------------------
def in_weight_dtype(q, z, s, T, scale_dtype=None, order="sub_then_mul"):
    """'arithmetic in T: the scale converted to T and every step of order rounded to T'."""
    s = s.to(TORCH[scale_dtype]) if scale_dtype else s
    sT, qT, zT = s.to(TORCH[T]), q.to(TORCH[T]), z.to(TORCH[T])  # |q|, |z| <= 256: exact in T
    if order == "mul_then_sub":
        return qT * sT - zT * sT  # each torch op in T rounds once
    return (qT - zT) * sT


def float32_then_round(q, z, s, T, scale_dtype=None, order="sub_then_mul", truncate=False):
    """'arithmetic in float32 (the canonical weights), then rounded once to T (R)'."""
    s = (s.to(TORCH[scale_dtype]) if scale_dtype else s).to(torch.float32)
    w = q.float() * s - z.float() * s if order == "mul_then_sub" else (q - z).float() * s
    if truncate:  # R = rtz: drop the low 16 bits of the float32 weight (bf16 only)
        return (w.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    return w.to(TORCH[T])


def _declared(T, formation, **variants):
    return Declared(variants=dict(variants, weight_formation=formation), weight_dtype=T, accumulate="float32",
                    output="float32")  # the fixtures' output dtype


def _check(inp, w_kernel, T, right, **variants):
    """The kernel passes with ``right`` and its weights are its declared weights; every other formation whose
    declared weights differ from the kernel's fails the case."""
    wk = w_kernel.to(torch.float32).numpy()
    d = _declared(T, right, **variants)
    assert np.array_equal(declared_weight(inp.case, inp.tensors, d), wk, equal_nan=True)
    assert compare(run_float32(inp, w_kernel), rounded_interval(declared_interval(inp, d), d)).ok
    separated = 0
    for other in FORMATIONS:
        if other == right:
            continue
        od = _declared(T, other, **variants)
        if np.array_equal(declared_weight(inp.case, inp.tensors, od), wk):
            continue  # this input does not separate the two
        separated += 1
        assert not compare(run_float32(inp, w_kernel), rounded_interval(declared_interval(inp, od), od)).ok, other
    return separated


@pytest.fixture(scope="module")
def ct_int_fp16():
    """int8 weights with float16 scales, bf16 activations, float32 output (an output dtype finer than the
    weights, so a one-ulp weight difference cannot round away)."""
    case = Case("w8a16", "ct-int-quantized", 4, 64, 256, group_size=-1, act_dtype="bfloat16", out_dtype="float32",
                scale_dtype="float16")
    return make_inputs(case, 0)


@pytest.fixture(scope="module")
def gptq_asym():
    case = Case("w4a16", "gptq", 4, 64, 256, group_size=32, sym=False, zero_convention="v2", act_dtype="bfloat16",
                out_dtype="float32")
    return make_inputs(case, 1)


def test_fp32_dequant_rounded_once_to_bf16_is_declarable(ct_int_fp16):
    """The issue's kernel: dequantize exactly in fp32 (float16 scales: exact), round each weight once to bf16."""
    q, z, s = ct_int_qs(ct_int_fp16)
    w = float32_then_round(q, z, s, "bfloat16")
    assert _check(ct_int_fp16, w, "bfloat16", "float32_then_round") == 2


def test_bf16_arithmetic_with_the_scale_cast_to_bf16_is_declarable(ct_int_fp16):
    q, z, s = ct_int_qs(ct_int_fp16)
    assert _check(ct_int_fp16, in_weight_dtype(q, z, s, "bfloat16"), "bfloat16", "in_weight_dtype") == 2


def test_compressed_tensors_dequantize_is_in_scale_dtype(ct_int_fp16):
    """compressed-tensors' own ``dequantize`` (arithmetic in the float16 scale's dtype, then ``.to(bf16)``)."""
    w = ct_dequantize(ct_int_fp16.tensors, torch.bfloat16)
    assert w.dtype == torch.bfloat16
    assert _check(ct_int_fp16, w, "bfloat16", "in_scale_dtype") == 2


def test_compressed_tensors_dequantize_with_float32_scales_is_float32_then_round():
    case = Case("w8a16", "ct-int-quantized", 4, 64, 256, group_size=-1, act_dtype="bfloat16", out_dtype="float32",
                scale_dtype="float32")
    inp = make_inputs(case, 2)
    t = inp.tensors
    w = ct_dequantize(t, torch.bfloat16)
    d = _declared("bfloat16", "float32_then_round")
    assert np.array_equal(declared_weight(case, t, d), w.float().numpy())
    assert compare(run_float32(inp, w), rounded_interval(declared_interval(inp, d), d)).ok
    # float32 scales: arithmetic in the scale's dtype is float32 arithmetic, the same weights
    assert np.array_equal(declared_weight(case, t, _declared("bfloat16", "in_scale_dtype")), w.float().numpy())


@pytest.mark.parametrize("order", ["sub_then_mul", "mul_then_sub"])
def test_gptq_asym_orders_in_each_formation(gptq_asym, order):
    """Zero points and both orders: each kernel equals its declaration; the orders' intermediate roundings
    happen in T under in_weight_dtype and in float32 under float32_then_round."""
    q, z, s = gptq_qzs(gptq_asym)
    for T in ("bfloat16", "float16"):
        # float16 weights from float16 scales under sub_then_mul: one rounding of the exact product either way
        least = 0 if (T, order) == ("float16", "sub_then_mul") else 1
        assert _check(gptq_asym, in_weight_dtype(q, z, s, T, order=order), T, "in_weight_dtype",
                      dequant_order=order) >= least
        assert _check(gptq_asym, float32_then_round(q, z, s, T, order=order), T, "float32_then_round",
                      dequant_order=order) >= least


def test_truncating_final_conversion(ct_int_fp16):
    """float32_then_round with R = rtz (vLLM _C_AVX512 without AVX512-BF16 truncates fp32 -> bf16)."""
    q, z, s = ct_int_qs(ct_int_fp16)
    w = float32_then_round(q, z, s, "bfloat16", truncate=True)
    d = _declared("bfloat16", "float32_then_round", weight_rounding="rtz")
    assert np.array_equal(declared_weight(ct_int_fp16.case, ct_int_fp16.tensors, d), w.float().numpy())
    d0 = _declared("bfloat16", "float32_then_round")
    assert compare(run_float32(ct_int_fp16, w), rounded_interval(declared_interval(ct_int_fp16, d), d)).ok
    assert not compare(run_float32(ct_int_fp16, w), rounded_interval(declared_interval(ct_int_fp16, d0), d0)).ok


def test_scale_already_in_T_makes_the_formations_coincide(ct_int_fp16):
    """With weight_scale_dtype = T under sub_then_mul, every formation is one rounding of the exact product."""
    q, z, s = ct_int_qs(ct_int_fp16)
    ws = [declared_weight(ct_int_fp16.case, ct_int_fp16.tensors,
                          _declared("bfloat16", f, weight_scale_dtype="bfloat16")) for f in FORMATIONS]
    assert all(np.array_equal(ws[0], w) for w in ws[1:])
    assert np.array_equal(ws[0], in_weight_dtype(q, z, s, "bfloat16", scale_dtype="bfloat16").float().numpy())


def test_mxfp4_float16_in_weight_dtype_converts_the_scale_first():
    """MXFP4: E2M1 values are exact in float16, but 2**-26 is not (it underflows to 0 on conversion): an fp16
    kernel gives 0 where rounding the exact product 6 * 2**-26 once gives 2**-23."""
    case = Case("w4a16-mxfp4", "ct-mxfp4", 2, 8, 64, group_size=32, act_dtype="float16", out_dtype="float32")
    inp = make_inputs(case, 0)
    codes = np.full((8, 64), 7, np.uint8)  # E2M1 code 7 = +6
    sb = np.full((8, 2), 127 - 26, np.uint8)
    t = {"weight_packed": (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8), "weight_scale": sb}
    inp = dataclasses.replace(inp, tensors=t)
    six = torch.full((8, 64), 6.0)
    scale = torch.full((8, 64), 2.0 ** -26)
    w16 = six.to(torch.float16) * scale.to(torch.float16)  # 'the scale converted to T, the product in T'
    w_once = (six * scale).to(torch.float16)  # 'float32 arithmetic, then rounded once to T'
    assert float(w16.abs().max()) == 0.0 and float(w_once[0, 0]) == 2.0 ** -23
    for w, right in ((w16, "in_weight_dtype"), (w_once, "float32_then_round")):
        d = Declared(variants={"weight_formation": right}, weight_dtype="float16", output="float32")
        assert np.array_equal(declared_weight(case, t, d), w.float().numpy())
        assert compare(run_float32(inp, w), rounded_interval(declared_interval(inp, d), d)).ok


def test_weight_formation_level_and_where_it_applies():
    c16 = Case("w4a16", "gptq", 1, 64, 128)
    assert Declared(variants={"weight_formation": "float32_then_round"}, weight_dtype="float32").level(c16).label \
        == "canonical"
    assert Declared(variants={"weight_formation": "float32_then_round"}, weight_dtype="bfloat16").level(c16).label \
        == "rounding"
    # in_scale_dtype with float32 weights still rounds in the (float16) scale's dtype
    assert Declared(variants={"weight_formation": "in_scale_dtype"}, weight_dtype="exact").level(c16).label \
        == "rounding"
    # W8A8 multiplies the codes: weight formation does not apply there
    c8 = Case("w8a8", "ct-int-quantized", 1, 64, 128, group_size=-1)
    assert Declared(variants={"weight_formation": "in_scale_dtype"}, weight_dtype="bfloat16").level(c8).label \
        == "canonical"
