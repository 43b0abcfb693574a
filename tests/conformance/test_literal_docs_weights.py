"""Every value of every weights, GEMM and epilogue axis is declarable (issue 21 item 5): the registry and its gate.

``KERNELS`` maps each value of the ``weights``, ``gemm`` and ``epilogue`` stages of emulator/variants.py to a
kernel written from the docs' sentence of that value (docs/formats/gptq.md, docs/variants.md#declared-fields,
docs/formats/activations.md, docs/conformance.md#opaque-arithmetic), never from emulator/ code: the kernels of
test_declarations_literal.py (GPTQ v1 readings, scale dtypes, float zero points, the GEMM and epilogue fields),
test_declarations_weight_formation.py (weight formation, orders, 16-bit weights), test_declarations_w4a8_product.py
(the W4A8 products) and test_literal_docs_int8.py (the W8A8 epilogues), plus the ones below for the values that
had none. Each entry names the kernel, the inputs it runs on and its honest declaration; the suite's judge
(``conformance.judge.verdict.judge``, what the runner calls on every output) must

(a) give the entry's verdict (``pass``; ``pass-sqnr`` for opaque arithmetic) on every input under that
    declaration, and
(b) fail at least one input under each of the entry's mis-declarations: by default the declaration with this
    key put back to its canonical value; for a canonical value (or one that provably computes the canonical
    numbers) a declaration naming another value, or another kernel declaring this one. So no entry can be
    satisfied by a kernel or a judge that passes anything.

A value added to one of the three stages without an entry here fails ``test_every_value_has_a_literal_kernel``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import numpy as np
import pytest
import torch

from backends.base import Case, Declared
from conformance.cases.inputs import make_inputs
from conformance.judge.verdict import judge, judged_against
from emulator.variants import AXES, FIELD_AXES, Stage
from literal_docs import fl, missing_kernels
from test_declarations_literal import (G, TORCH, accumulate_16bit_kernel, act_compute_kernel,
                                       bias_after_output_rounding_kernel, canonical_kernel, canonical_weights,
                                       float_zero_kernel, gptq_v1_fields, gptq_v1_inputs, output_dtype_kernel,
                                       output_rtz_kernel, scale_bf16_kernel, zero_read_kernel)
from test_declarations_w4a8_product import KERNELS as W4A8_KERNELS
from test_declarations_w4a8_product import w4a8_inputs
from test_declarations_weight_formation import (ct_int_qs, gptq_qzs, run_float32, float32_then_round,
                                                in_weight_dtype)
from test_literal_docs_int8 import DEFAULTS as INT8_DEFAULTS
from test_literal_docs_int8 import int8_kernel, w8a8_compensation_kernel, w8a8_kernel


# -- inputs -------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def ct_int(scale_dtype: str, seed: int = 0):
    """int8 channel-wise weights (compressed-tensors), bf16 activations, a float32 output (a one-ulp weight
    difference cannot round away)."""
    return make_inputs(Case("w8a16", "ct-int-quantized", 4, 64, 256, group_size=-1, act_dtype="bfloat16",
                            out_dtype="float32", scale_dtype=scale_dtype), seed)


@functools.lru_cache(maxsize=None)
def gptq_v2_asym(seed: int = 1):
    return make_inputs(Case("w4a16", "gptq", 4, 64, 256, group_size=32, sym=False, zero_convention="v2",
                            act_dtype="bfloat16", out_dtype="float32"), seed)


@functools.lru_cache(maxsize=None)
def w8a8(sym: bool, seed: int = 0):
    """The docs' azp reproducer shape (Case(w8a8, ct-int-quantized, 16x256x256, fp32), seed 0)."""
    return make_inputs(Case("w8a8", "ct-int-quantized", 16, 256, 256, group_size=-1, sym=sym, act_dtype="float32"),
                       seed)


@functools.lru_cache(maxsize=1)
def bias_cancelling():
    """A bf16 case whose bias cancels row 0's accumulator to its bf16 rounding (bias[n] = -RNE_bf16(acc[0, n])):
    there the canonical output is the small residual and a bias added after the output rounding gives 0 (the
    reproducer of docs/formats/activations.md#declared-stages-and-their-acceptance-bounds, row by row)."""
    inp = gptq_v1_inputs(bias=True, seed=4)
    acc0 = (torch.from_numpy(inp.x) @ canonical_weights(inp).T)[0]
    return dataclasses.replace(inp, bias=(-acc0.to(torch.bfloat16)).float().numpy())


def _gptq_f32():
    return [gptq_v1_inputs(out="float32")]


def _gptq_f32_acts():
    return [gptq_v1_inputs(act="float32")]


def _gptq_bf16():
    return [gptq_v1_inputs(seed=s) for s in range(2)]


def _gptq_bias():
    return [gptq_v1_inputs(bias=True, seed=s) for s in range(4)] + [bias_cancelling()]


def _ct_fp16():
    return [ct_int("float16")]


def _ct_fp32():
    return [ct_int("float32", 2)]


def _gptq_v2():
    return [gptq_v2_asym()]


def _w4a8_inputs():
    return [w4a8_inputs("float32")]


def _w8a8_asym():
    return [w8a8(False)]


def _w8a8_sym():
    return [w8a8(True, 1)]


# -- kernels for the values that had none -------------------------------------------------------------------
def float_zero_in_bf16_kernel(zdt: str):
    """docs/formats/gptq.md#float-zero-point-dequantorderfloat_zero with C = bfloat16 (``weight_dtype=bfloat16``,
    in_weight_dtype: 'the scale converted to T'): 'zero = RNE_Z((m - z) * s_C)' (``zdt``: Z, the weight dtype C
    itself for ``zero_dtype=weight``, as CUDA tinygemm's bf16 ``__hfma2``), 'w = round_C((q - m) * s_C + zero)'."""
    def kernel(inp):
        q, fields, s = gptq_v1_fields(inp)
        s_c = fl(np.repeat(s, G, axis=0).T, "bfloat16")
        z = np.repeat(fields + 1, G, axis=0).T
        zero = fl((8 - z) * s_c, zdt)  # the exact product (float64: 4 x 8 bits) rounded once to Z
        w = fl((q - 8) * s_c + zero, "bfloat16")  # the exact sum (float64: exact) rounded once to C
        y = torch.from_numpy(inp.x) @ torch.from_numpy(w.astype(np.float32)).T
        return y.to(TORCH[inp.case.output_dtype]).float().numpy()
    kernel.__name__ = f"float_zero_c_bf16_z_{zdt}"
    return kernel


def formation_kernel(formation: str, T: str, qzs=ct_int_qs, **kw):
    """One row of docs/formats/gptq.md#weight-formation (test_declarations_weight_formation.py's kernels), then
    float32 products and sums rounded once to the output dtype."""
    def kernel(inp):
        if formation == "in_scale_dtype":
            return run_float32(inp, in_scale_dtype(inp, T))
        form = in_weight_dtype if formation == "in_weight_dtype" else float32_then_round
        return run_float32(inp, form(*qzs(inp), T, **kw))
    kernel.__name__ = f"{formation}_{T}"
    return kernel


def in_scale_dtype(inp, T: str) -> torch.Tensor:
    """'arithmetic in the scale's dtype S (after weight_scale_dtype; S rounds RNE), then rounded once to T':
    the codes and zero point converted to S (exact: |q|, |z| <= 256), (q - z) * s with each torch op in S, then
    ``.to(T)`` (compressed-tensors' own ``dequantize``, the library the value is named after, is checked against
    the declaration in test_declarations_weight_formation.py; importing it here would cost seconds per run)."""
    q, z, s = ct_int_qs(inp)
    S = {np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32}.get(
        np.asarray(inp.tensors["weight_scale"]).dtype, torch.bfloat16)
    return ((q.to(S) - z.to(S)) * s.to(S)).to(TORCH[T])


def scale_dtype_kernel(sdt: str):
    """'scales are first rounded (RNE) to this dtype', then (q - z) * s in float32 (float32 checkpoint scales)."""
    def kernel(inp):
        return run_float32(inp, float32_then_round(*ct_int_qs(inp), "float32", scale_dtype=sdt))
    kernel.__name__ = f"weight_scale_{sdt}"
    return kernel


def exact_sum_kernel(inp):
    """``accumulate=exact``: 'sums exactly': each product exact in float64 (bf16 x float32 weights: 8 + 24 bits),
    their sum by math.fsum (correctly rounded), rounded once to the output dtype."""
    x = np.asarray(inp.x, np.float64)
    w = canonical_weights(inp).double().numpy()
    y = np.array([[math.fsum(x[m] * w[n]) for n in range(w.shape[0])] for m in range(x.shape[0])])
    return fl(y, inp.case.output_dtype).astype(np.float32)


def float64_sum_kernel(inp):
    """``accumulate=float64``: 'in float64 (2^-53)': the float32 weights and activations summed in float64."""
    y = torch.from_numpy(inp.x).double() @ canonical_weights(inp).double().T
    return y.to(TORCH[inp.case.output_dtype]).float().numpy()


def tf32_sum_kernel(inp):
    """``accumulate=tf32``: 'sums in that dtype, any order (2^-11; tf32 keeps float32's exponent range)': each
    product rounded to tf32 and added, one at a time in a shuffled order, to a tf32 accumulator."""
    x = np.asarray(inp.x, np.float64)
    w = canonical_weights(inp).double().numpy()
    acc = np.zeros((x.shape[0], w.shape[0]))
    for k in np.random.default_rng(0).permutation(x.shape[1]):
        acc = fl(acc + fl(x[:, k, None] * w[None, :, k], "tfloat32"), "tfloat32")
    return fl(acc, inp.case.output_dtype).astype(np.float32)


def w8a8_int32_kernel(inp):
    """``accumulate=int32`` on W8A8 (docs/formats/activations.md#w8a8-int8-weights-int8-dynamic-activations):
    'acc = sum_k (qx - azp) qw exact integer' in int32 (|acc| < 2^31 here), then 'y = acc * sx * sw + bias' in
    float32, each step one fp32 rounding."""
    case = inp.case
    q = int8_kernel(inp.x, case.act_dtype, dict(INT8_DEFAULTS, act_symmetric=case.act_symmetric))
    qx = q["codes"].astype(np.int64) - (q["zero_point"].astype(np.int64) if "zero_point" in q else 0)
    acc = qx @ np.asarray(inp.tensors["weight"]).astype(np.int64).T
    assert np.abs(acc).max() < 2 ** 31
    sw = np.asarray(inp.tensors["weight_scale"]).astype(np.float64).reshape(1, -1)
    y = fl(fl(acc * q["scale"].astype(np.float64), "float32") * sw, "float32")
    if inp.bias is not None:
        y = fl(y + inp.bias, "float32")
    return y.astype(np.float32)


OPAQUE_BLOCK = 32


def per_block_int8_kernel(inp):
    """``arithmetic=opaque``: docs/conformance.md#opaque-arithmetic's example, 'ARK's int8 cores quantize
    activations per K-block': each row's blocks of 32 activations quantized to int8 with their own symmetric
    scale (amax / 127, RNE), the dequantized activations times the float32 weights, one rounding. No declaration
    names a per-block activation quantizer of a W4A16 case: only an SQNR floor can judge it."""
    x = torch.from_numpy(inp.x).reshape(inp.x.shape[0], -1, OPAQUE_BLOCK)
    amax = x.abs().amax(dim=-1, keepdim=True)
    s = amax / 127.0
    q = torch.where(amax == 0, torch.zeros_like(x), torch.round(x / s)).clamp(-127, 127)
    y = (q * s).reshape(inp.x.shape) @ canonical_weights(inp).T
    return y.to(TORCH[inp.case.output_dtype]).float().numpy()


# -- the registry -------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LiteralKernel:
    """A kernel, the inputs it runs on, its honest declaration (``Declared`` keyword arguments; ``output``
    defaults to the case's dtype) and the verdict that declaration must get on every input. ``wrong``: pairs
    (kernel, declaration) that must fail at least one input (kernel None: this one); empty means this kernel
    under its declaration with the key put back to canonical. ``also``: declarations this kernel must pass too
    (a value that provably computes the canonical numbers, docs/variants.md#levels)."""

    kernel: Callable
    inputs: Callable
    declared: dict
    wrong: tuple = ()
    also: tuple = ()
    verdict: str = "pass"


def _v(**variants):
    return {"variants": variants}


F32 = {"output": "float32"}
W4A8_DECL = dict(weight_dtype="exact", accumulate="float64", output="float32")


def _w4a8(product):
    return dict(W4A8_DECL, variants={"w4a8_product": product})


def _formation(T, formation, **variants):
    return dict(weight_dtype=T, accumulate="float32", output="float32",
                variants=dict(variants, weight_formation=formation))


def _fz(zdt):
    return dict(weight_dtype="bfloat16", variants={"dequant_order": "float_zero", "zero_dtype": zdt})


def _ww(weight_dtype):
    return dict(weight_dtype=weight_dtype, output="float32")


OPAQUE = dict(arithmetic="opaque", sqnr_floor_db=30.0)

KERNELS: dict = {
    # -- weights ----------------------------------------------------------------------------------------------
    "zero_read": dict(
        {v: LiteralKernel(zero_read_kernel(v), _gptq_f32, _v(zero_read=v)) for v in
         ("v1_packed_add", "v1_wrap", "ignore_qzeros", "v1_literal")},
        canonical=LiteralKernel(zero_read_kernel("canonical"), _gptq_f32, _v(),
                          wrong=((None, _v(zero_read="v1_literal")), (None, _v(zero_read="v1_wrap"))))),
    "dequant_order": {
        "sub_then_mul": LiteralKernel(formation_kernel("in_weight_dtype", "bfloat16", gptq_qzs), _gptq_v2,
                                _formation("bfloat16", "in_weight_dtype"),
                                wrong=((None, _formation("bfloat16", "in_weight_dtype", dequant_order="mul_then_sub")),)),
        "mul_then_sub": LiteralKernel(formation_kernel("in_weight_dtype", "bfloat16", gptq_qzs, order="mul_then_sub"),
                                _gptq_v2, _formation("bfloat16", "in_weight_dtype", dequant_order="mul_then_sub")),
        # a bf16 zero point (Z) with float32 weights (C): torch's CPU int4pack path
        "float_zero": LiteralKernel(float_zero_kernel("bfloat16"), _gptq_f32,
                              dict(weight_dtype="float32", variants={"dequant_order": "float_zero",
                                                                     "zero_dtype": "bfloat16"}),
                              wrong=((None, dict(weight_dtype="float32", variants={"zero_dtype": "bfloat16"})),)),
    },
    "weight_scale_dtype": {
        "checkpoint": LiteralKernel(canonical_kernel, _gptq_f32, _v(), wrong=((None, _v(weight_scale_dtype="bfloat16")),)),
        "float32": LiteralKernel(scale_dtype_kernel("float32"), _ct_fp32, dict(_v(weight_scale_dtype="float32"), **F32),
                           wrong=((None, dict(_v(weight_scale_dtype="float16"), **F32)),), also=(F32,)),
        "float16": LiteralKernel(scale_dtype_kernel("float16"), _ct_fp32, dict(_v(weight_scale_dtype="float16"), **F32)),
        "bfloat16": LiteralKernel(scale_bf16_kernel, _gptq_f32, _v(weight_scale_dtype="bfloat16")),
    },
    "zero_dtype": {
        "weight": LiteralKernel(float_zero_in_bf16_kernel("bfloat16"), _gptq_f32, _fz("weight"),
                          wrong=((None, _fz("float32")),)),
        "float32": LiteralKernel(float_zero_in_bf16_kernel("float32"), _gptq_f32, _fz("float32")),
        "float16": LiteralKernel(float_zero_kernel("float16"), _gptq_f32,
                           dict(weight_dtype="float32", variants={"dequant_order": "float_zero", "zero_dtype": "float16"})),
        "bfloat16": LiteralKernel(float_zero_kernel("bfloat16"), _gptq_f32,
                            dict(weight_dtype="float32", variants={"dequant_order": "float_zero", "zero_dtype": "bfloat16"})),
    },
    "weight_rounding": {
        "rne": LiteralKernel(formation_kernel("float32_then_round", "bfloat16"), _ct_fp16,
                       _formation("bfloat16", "float32_then_round"),
                       wrong=((None, _formation("bfloat16", "float32_then_round", weight_rounding="rtz")),)),
        # vLLM _C_AVX512 without AVX512-BF16 truncates fp32 -> bf16
        "rtz": LiteralKernel(formation_kernel("float32_then_round", "bfloat16", truncate=True), _ct_fp16,
                       _formation("bfloat16", "float32_then_round", weight_rounding="rtz")),
    },
    "weight_dtype": {
        "exact": LiteralKernel(formation_kernel("float32_then_round", "float32"), _ct_fp16, _ww("exact"),
                         wrong=((None, _ww("bfloat16")), (None, _ww("float16")))),
        "float32": LiteralKernel(formation_kernel("float32_then_round", "float32"), _ct_fp16, _ww("float32"),
                           wrong=((None, _ww("bfloat16")),), also=(_ww("exact"),)),
        "float16": LiteralKernel(formation_kernel("in_weight_dtype", "float16"), _ct_fp16, _ww("float16")),
        "bfloat16": LiteralKernel(formation_kernel("in_weight_dtype", "bfloat16"), _ct_fp16, _ww("bfloat16")),
    },
    "weight_formation": {
        "in_weight_dtype": LiteralKernel(formation_kernel("in_weight_dtype", "bfloat16"), _ct_fp16,
                                   _formation("bfloat16", "in_weight_dtype"),
                                   wrong=((None, _formation("bfloat16", "float32_then_round")),
                                          (None, _formation("bfloat16", "in_scale_dtype")))),
        "float32_then_round": LiteralKernel(formation_kernel("float32_then_round", "bfloat16"), _ct_fp16,
                                      _formation("bfloat16", "float32_then_round")),
        "in_scale_dtype": LiteralKernel(formation_kernel("in_scale_dtype", "bfloat16"), _ct_fp16,
                                  _formation("bfloat16", "in_scale_dtype")),
    },
    # -- GEMM -------------------------------------------------------------------------------------------------
    "w4a8_product": {
        "group_int": LiteralKernel(W4A8_KERNELS["group_int"], _w4a8_inputs, _w4a8("group_int"),
                             wrong=((None, _w4a8("float32_weights")),)),
        "float32_weights": LiteralKernel(W4A8_KERNELS["float32_weights"], _w4a8_inputs, _w4a8("float32_weights")),
    },
    "act_compute_dtype": {
        "none": LiteralKernel(canonical_kernel, _gptq_f32_acts, {}, wrong=((None, {"act_compute_dtype": "bfloat16"}),)),
        # float32 holds every 16- and 32-bit activation: canonical everywhere
        "float32": LiteralKernel(act_compute_kernel("float32"), _gptq_f32_acts, {"act_compute_dtype": "float32"},
                           wrong=((None, {"act_compute_dtype": "float16"}),), also=({},)),
        "float16": LiteralKernel(act_compute_kernel("float16"), _gptq_f32_acts, {"act_compute_dtype": "float16"}),
        "bfloat16": LiteralKernel(act_compute_kernel("bfloat16"), _gptq_f32_acts, {"act_compute_dtype": "bfloat16"}),
    },
    "accumulate": {
        "float32": LiteralKernel(canonical_kernel, _gptq_f32, {}, wrong=((None, {"accumulate": "exact"}),
                                                                    (None, {"accumulate": "float64"}))),
        # the exact sums are inside the float32 bound: canonical, and a float32 sum fails under them
        "exact": LiteralKernel(exact_sum_kernel, _gptq_f32, {"accumulate": "exact"},
                         wrong=((canonical_kernel, {"accumulate": "exact"}),), also=({},)),
        "float64": LiteralKernel(float64_sum_kernel, _gptq_f32, {"accumulate": "float64"},
                           wrong=((canonical_kernel, {"accumulate": "float64"}),), also=({},)),
        "int32": LiteralKernel(w8a8_int32_kernel, _w8a8_sym, dict(accumulate="int32", **F32),
                         wrong=((None, dict(accumulate="exact", **F32)),), also=(F32,)),
        "tf32": LiteralKernel(tf32_sum_kernel, _gptq_f32, {"accumulate": "tf32"}),
        "float16": LiteralKernel(accumulate_16bit_kernel("float16"), _gptq_f32, {"accumulate": "float16"}),
        "bfloat16": LiteralKernel(accumulate_16bit_kernel("bfloat16"), _gptq_f32, {"accumulate": "bfloat16"}),
    },
    "arithmetic": {
        "declared": LiteralKernel(canonical_kernel, _gptq_f32, {}, wrong=((per_block_int8_kernel, {}),)),
        "opaque": LiteralKernel(per_block_int8_kernel, _gptq_f32, OPAQUE, verdict="pass-sqnr",
                          wrong=((None, dict(OPAQUE, sqnr_floor_db=80.0)),)),
    },
    # -- epilogue ---------------------------------------------------------------------------------------------
    "output_rounding": {
        "rne": LiteralKernel(canonical_kernel, _gptq_bf16, {}, wrong=((None, {"output_rounding": "rtz"}),)),
        "rtz": LiteralKernel(output_rtz_kernel, _gptq_bf16, {"output_rounding": "rtz"}),
    },
    "output": {
        "case": LiteralKernel(canonical_kernel, _gptq_bf16, {}, wrong=((None, {"output": "float32"}),
                                                                 (None, {"output": "float16"}))),
        "float32": LiteralKernel(output_dtype_kernel("float32"), _gptq_bf16, {"output": "float32"}),
        "float16": LiteralKernel(output_dtype_kernel("float16"), _gptq_bf16, {"output": "float16"}),
        "bfloat16": LiteralKernel(output_dtype_kernel("bfloat16"), _gptq_f32_acts, {"output": "bfloat16"}),
    },
    "bias_stage": {
        "accumulator": LiteralKernel(canonical_kernel, _gptq_bias, {},
                               wrong=((None, _v(bias_stage="after_output_rounding")),)),
        "after_output_rounding": LiteralKernel(bias_after_output_rounding_kernel, _gptq_bias,
                                         _v(bias_stage="after_output_rounding")),
    },
    "azp_epilogue": {
        "exact": LiteralKernel(lambda inp: w8a8_kernel(inp, "same"), _w8a8_asym, F32,
                         wrong=((w8a8_compensation_kernel, F32),), also=(dict(_v(azp_epilogue="compensation"), **F32),)),
        "compensation": LiteralKernel(w8a8_compensation_kernel, _w8a8_asym, dict(_v(azp_epilogue="compensation"), **F32)),
    },
}

STAGES = (Stage.WEIGHTS, Stage.GEMM, Stage.EPILOGUE)
PARAMS = [(k, v) for k, vals in KERNELS.items() for v in vals]


def _declared(d: dict) -> Declared:
    kw = dict(d)
    kw.setdefault("output", None)  # the case's own output dtype (output=case)
    return Declared(variants=dict(kw.pop("variants", {})), **kw)


def _canonical_for(d: dict, key: str) -> dict:
    """``d`` with ``key`` put back to its canonical value."""
    out = {k: (dict(v) if k == "variants" else v) for k, v in d.items()}
    if key in FIELD_AXES:
        out.pop(key, None)
        if key == "arithmetic":
            out.pop("sqnr_floor_db", None)
    else:
        out.get("variants", {}).pop(key, None)
    return out


def _verdict(inp, y, d: dict) -> str:
    decl = _declared(d)
    return judge(inp, judged_against(inp, decl), np.asarray(y, np.float32), decl).verdict.value


@pytest.mark.parametrize("stage", STAGES, ids=[s.value for s in STAGES])
def test_every_value_has_a_literal_kernel(stage):
    """Completeness: a value added to a weights, GEMM or epilogue axis of emulator/variants.py needs an entry."""
    assert not missing_kernels(stage, KERNELS)


def test_registry_names_only_axes_of_its_stages():
    assert all(AXES[k].stage in STAGES for k in KERNELS)


@pytest.mark.parametrize("key, value", PARAMS, ids=[f"{k}={v}" for k, v in PARAMS])
def test_literal_kernel_passes_its_declaration_and_fails_a_wrong_one(key, value):
    e: LiteralKernel = KERNELS[key][value]
    declared = _declared(e.declared)
    got = declared.value(key)
    assert (got if got is not None else "case") == value, f"the entry for {key}={value} declares {key}={got}"
    inputs = e.inputs()
    outputs = [e.kernel(inp) for inp in inputs]
    verdicts = [_verdict(inp, y, e.declared) for inp, y in zip(inputs, outputs)]
    assert all(v == e.verdict for v in verdicts), (
        f"{key}={value}: the kernel written from the docs gets {verdicts} under its own declaration")
    for d in e.also:
        also = [_verdict(inp, y, d) for inp, y in zip(inputs, outputs)]
        assert all(v == "pass" for v in also), f"{key}={value} under {d}: {also}"
    wrong = e.wrong
    if not wrong:
        assert value != AXES[key].canonical, f"{key}={value} is canonical: its entry must name a wrong declaration"
        wrong = ((None, _canonical_for(e.declared, key)),)
    for kernel, d in wrong:
        ys = outputs if kernel is None else [kernel(inp) for inp in inputs]
        got = [_verdict(inp, y, d) for inp, y in zip(inputs, ys)]
        who = "the kernel" if kernel is None else kernel.__name__
        assert "fail" in got, f"{key}={value}: {who} declaring {d} is not failed on any input ({got})"


def test_each_zero_read_kernel_fails_every_other_reading():
    """The checkpoint holds every qzeros field 0..15, so the five readings give five different zero points
    (docs/formats/gptq.md#reading-v1-zero-points-gptqzeroread, worked example): each reading's kernel fails the
    declaration of each other reading. A registry entry pointing at another reading's kernel cannot pass."""
    inp = gptq_v1_inputs(out="float32")
    values = AXES["zero_read"].values
    for mine in values:
        y = KERNELS["zero_read"][mine].kernel(inp)
        got = {other: _verdict(inp, y, _v(zero_read=other)) for other in values if other != mine}
        assert all(v == "fail" for v in got.values()), (mine, got)


def test_opaque_floor_is_what_separates_the_per_block_kernel():
    """The per-block int8 kernel's SQNR sits between the entry's floor and its mis-declared one: the floor, not
    the kernel's failure to run, decides its two verdicts (docs/conformance.md#opaque-arithmetic)."""
    inp = _gptq_f32()[0]
    decl = _declared(OPAQUE)
    j = judge(inp, judged_against(inp, decl), per_block_int8_kernel(inp), decl)
    assert OPAQUE["sqnr_floor_db"] <= j.metrics["sqnr_db"] < 80.0, j.metrics["sqnr_db"]
