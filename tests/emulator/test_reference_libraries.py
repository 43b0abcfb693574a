"""The reference quantizers of emulator/reference_quantizers.py against the libraries themselves.

For each library that installs here (compressed-tensors, onnx, torchao; vLLM's kernels only where
``vllm`` imports), on the separating inputs of conformance/cases/generators.py (``reference-int8``,
``reference-mx``) and on Gaussian rows:

(a) the emulator under the named variants equals the library bit for bit (codes, scales, zero points);
(b) the canonical emulator differs from the library on the separating inputs, so the generator
    really separates the variant from canonical.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from backends.base import Case
from conformance.cases.generators import generate
from emulator.activations.int8 import quantize_int8_per_token
from emulator.declaration import Declared, int8_variant, mx_variant
from emulator.formats.mxfp4 import MxVariant, pack_mxfp4_ct, quantize_mxfp4
from emulator.numerics.e2m1 import E2M1_VALUES
from emulator.numerics.floats import round_to_dtype
from emulator.reference_quantizers import REFERENCE_QUANTIZERS, reference_variants

torch = pytest.importorskip("torch")

NP_DTYPE = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
TORCH_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _int8_case(dtype: str, sym: bool = True, M: int = 8, K: int = 64) -> Case:
    return Case("w8a8", "ct-int-quantized", M, 32, K, group_size=-1, act_dtype=dtype, sym=sym)


def _int8_inputs(dtype: str, seed: int = 0) -> np.ndarray:
    x = generate(_int8_case(dtype), "reference-int8", seed).x
    return np.asarray(x, np.float32)


def _emulate_int8(name: str, x: np.ndarray, dtype: str, sym: bool):
    case = _int8_case(dtype, sym, *x.shape)
    return quantize_int8_per_token(x, int8_variant(Declared(variants=reference_variants(name)), case))


def _canonical_int8(x: np.ndarray, sym: bool):
    return quantize_int8_per_token(x, int8_variant(Declared(variants={}), _int8_case("float32", sym, *x.shape)))


def _same(a, q, s, zp) -> bool:
    return np.array_equal(a.q, q) and np.array_equal(a.scale, s) and np.array_equal(a.zero_point, zp)


# ----------------------------------------------------------------------------------- compressed-tensors int8
def _ct_int8(x: np.ndarray, dtype: str, sym: bool):
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils.helpers import compute_dynamic_scales_and_zp

    args = QuantizationArgs(num_bits=8, type="int", strategy="token", dynamic=True, symmetric=sym)
    # [1, M, K]: the TOKEN strategy reduces over the dimensions after the first two (a 2-D input is
    # reduced over everything: one scale per tensor, docs/findings.md)
    xt = torch.from_numpy(x).to(TORCH_DTYPE[dtype])[None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s, zp = compute_dynamic_scales_and_zp(xt, args, None)
        q = quantize(xt, s, zp, args, dtype=torch.int8)[0]
    return q.numpy().astype(np.int32), s[0].float().numpy(), zp[0].numpy().astype(np.int32)


def _ct_int8_fake(x: np.ndarray, dtype: str, sym: bool) -> np.ndarray:
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils.helpers import compute_dynamic_scales_and_zp

    args = QuantizationArgs(num_bits=8, type="int", strategy="token", dynamic=True, symmetric=sym)
    xt = torch.from_numpy(x).to(TORCH_DTYPE[dtype])[None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s, zp = compute_dynamic_scales_and_zp(xt, args, None)
        return fake_quantize(xt, s, zp, args)[0].float().numpy()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
def test_compressed_tensors_int8_equals_its_named_variants(dtype, sym):
    name = "compressed-tensors-int8-sym" if sym else "compressed-tensors-int8-asym"
    rng = np.random.default_rng(1)
    gauss = (rng.standard_normal((16, 64)) * 10.0 ** rng.uniform(-3, 3, (16, 1))).astype(np.float32)
    for x in (_int8_inputs(dtype), gauss):
        x = x.astype(NP_DTYPE[dtype]).astype(np.float32)
        q, s, zp = _ct_int8(x, dtype, sym)
        assert _same(_emulate_int8(name, x, dtype, sym), q, s, zp)
    x = _int8_inputs(dtype).astype(NP_DTYPE[dtype]).astype(np.float32)
    q, s, zp = _ct_int8(x, dtype, sym)
    assert not _same(_canonical_int8(x, sym), q, s, zp)
    # fake_quantize (quantize, then (q - zp) * scale in the scale's dtype) is the emulator's codes dequantized
    # and rounded once to the activation dtype
    a = _emulate_int8(name, x, dtype, sym)
    fq = _ct_int8_fake(x, dtype, sym)
    want = round_to_dtype((a.q.astype(np.float64) - a.zero_point) * a.scale.astype(np.float64), dtype)
    assert np.array_equal(fq, want.astype(np.float32))
    # the separating rows, one by one: the zero row (scale) and, asymmetric, the positive/negative rows
    c = _canonical_int8(x, sym)
    assert c.scale[0, 0] == 0 and s[0, 0] > 0
    if not sym:
        assert c.zero_point[1, 0] < -128 and zp[1, 0] == -128  # zero-inclusive range, clamped zero point


def test_compressed_tensors_token_strategy_on_2d_input_is_per_tensor():
    """docs/findings.md: the TOKEN strategy on a 2-D [tokens, hidden] input gives one scale for the tensor."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.utils.helpers import compute_dynamic_scales_and_zp

    x = torch.tensor([[1.0, -2.0], [100.0, 3.0]])
    args = QuantizationArgs(num_bits=8, type="int", strategy="token", dynamic=True, symmetric=True)
    s, _ = compute_dynamic_scales_and_zp(x, args, None)
    assert s.numel() == 1 and float(s) == np.float32(100) / np.float32(127.5)
    s3, _ = compute_dynamic_scales_and_zp(x[None], args, None)
    assert s3.flatten().tolist() == [np.float32(2) / np.float32(127.5), np.float32(100) / np.float32(127.5)]


# ----------------------------------------------------------------------------------- ONNX DynamicQuantizeLinear
def _onnx_dql(x: np.ndarray):
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "zp"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, list(x.shape)),
                           helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
                           helper.make_tensor_value_info("zp", TensorProto.UINT8, [])])
    y, s, zp = ReferenceEvaluator(helper.make_model(g)).run(None, {"x": x})
    return y, np.float32(s), int(zp)


def test_onnx_dynamic_quantize_linear_equals_its_named_variants():
    v = int8_variant(Declared(variants=reference_variants("onnx-dynamicquantizelinear")))
    rng = np.random.default_rng(2)
    x_sep = _int8_inputs("float32")
    rows = [x_sep[i:i + 1] for i in range(len(x_sep))]  # one tensor per separating row (ONNX: one scale per tensor)
    rows += [x_sep, (rng.standard_normal((4, 64)) * 3).astype(np.float32), np.abs(rng.standard_normal((2, 8))).astype(
        np.float32)]
    separated = 0
    for x in rows:
        y, s, zp = _onnx_dql(x)
        a = quantize_int8_per_token(x, v)
        assert np.array_equal(a.stored(v), y), x
        assert (a.scale == s).all() and (a.zero_point + 128 == zp).all()
        c = quantize_int8_per_token(x, int8_variant(Declared(variants={"act_symmetric": False})))
        separated += not (np.array_equal(c.q + 128, y.astype(np.int32)) and (c.scale == s).all()
                          and (c.zero_point + 128 == zp).all())
    assert separated >= 5  # the zero, positive, negative, one-ulp and uint8-domain rows at least
    # the uint8-domain row alone: the int8-domain zero point (same range and clamp) differs
    row4 = x_sep[4:5]
    int8_domain = dict(reference_variants("onnx-dynamicquantizelinear"), azp_domain="int8")
    assert quantize_int8_per_token(row4, int8_variant(Declared(variants=int8_domain))).zero_point[0, 0] + 128 != \
        _onnx_dql(row4)[2]


def test_onnx_zero_tensor_scale_is_one_over_255():
    """The reference evaluator replaces max == min by a range of 1 (scale 1/255); the operator's formula
    (max(0, max) - min(0, min)) / 255 would give 0 (docs/findings.md)."""
    y, s, zp = _onnx_dql(np.zeros((1, 4), np.float32))
    assert s == np.float32(1) / np.float32(255) and zp == 0 and not y.any()


# ----------------------------------------------------------------------------------- torchao to_mx (FP4)
def _mx_case(dtype: str) -> Case:
    return Case("w4a4-mxfp4", "ct-mxfp4", 6, 32, 128, group_size=32, act_dtype=dtype)


def _torchao_to_mx(x: np.ndarray, dtype: str, mode: str):
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    cfg = pytest.importorskip("torchao.prototype.mx_formats.config")
    xt = torch.from_numpy(np.ascontiguousarray(x)).to(TORCH_DTYPE[dtype])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s, d = mx.to_mx(xt, torch.float4_e2m1fn_x2, 32, getattr(cfg.ScaleCalculationMode, mode.upper()))
    return s.view(torch.uint8).numpy().reshape(x.shape[0], -1), d.view(torch.uint8).numpy()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mode", ["floor", "even", "ceil", "rceil"])
def test_torchao_to_mx_equals_its_named_variants(mode, dtype):
    x = np.asarray(generate(_mx_case(dtype), "reference-mx", 0).x, np.float32)
    ts, td = _torchao_to_mx(x, dtype, mode)
    v = mx_variant(Declared(variants=reference_variants(f"torchao-mx-{mode}")))
    codes, sb = quantize_mxfp4(x, v)
    assert np.array_equal(sb, ts) and np.array_equal(pack_mxfp4_ct(codes, sb)["weight_packed"], td)
    rule = {"rceil": "rceil"}.get(mode, mode)
    c_codes, c_sb = quantize_mxfp4(x, MxVariant(scale_rule=rule))
    assert not np.array_equal(pack_mxfp4_ct(c_codes, c_sb)["weight_packed"], td)  # row 0 block 0 (byte 0)
    assert not np.array_equal(c_codes[0, :32], codes[0, :32])
    if mode == "rceil" and dtype == "float32":
        assert c_sb[2, 0] == sb[2, 0] + 1  # the fp32-log2 block: exact RCEIL takes the next power of two


def test_torchao_rceil_log2f_on_many_blocks():
    rng = np.random.default_rng(5)
    k = rng.integers(-120, 120, 4096)
    j = rng.integers(1, 64, 4096)
    amax = (6.0 * np.ldexp(1.0 + j * 2.0 ** -23, k)).astype(np.float32)
    x = np.zeros((4096, 32), np.float32)
    x[:, 0] = amax
    x[:, 1:] = (rng.uniform(-1, 1, (4096, 31)) * amax[:, None]).astype(np.float32)
    ts, td = _torchao_to_mx(x, "float32", "rceil")
    v = mx_variant(Declared(variants=reference_variants("torchao-mx-rceil")))
    codes, sb = quantize_mxfp4(x, v)
    assert np.array_equal(sb, ts) and np.array_equal(pack_mxfp4_ct(codes, sb)["weight_packed"], td)
    assert (quantize_mxfp4(x, MxVariant(scale_rule="rceil"))[1] != ts).sum() > 100


# ----------------------------------------------------------------------------------- compressed-tensors MXFP4 acts
_E2M1 = {float(v): c for c, v in enumerate(E2M1_VALUES[:8])}  # magnitudes: codes 0..7


def _ct_mxfp4_act(x: np.ndarray, dtype: str):
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.quant_scheme import MXFP4
    from compressed_tensors.quantization.utils.helpers import compute_dynamic_scales_and_zp

    args = MXFP4["input_activations"]
    xt = torch.from_numpy(x).to(TORCH_DTYPE[dtype])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s, zp = compute_dynamic_scales_and_zp(xt, args, None)
        vals = quantize(xt, s, zp, args).float().numpy().reshape(x.shape)
    sf = s.float().numpy().reshape(x.shape[0], -1)
    # the float scale 2**(byte - 127) back to its byte; 2**128 = Inf is byte 255
    with np.errstate(divide="ignore"):
        sb = np.where(np.isinf(sf), 255, np.log2(sf) + 127).astype(np.uint8)
    codes = np.array([_E2M1[abs(v)] | (8 if np.signbit(v) else 0) for v in vals.ravel()], np.uint8).reshape(x.shape)
    return codes, sb


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compressed_tensors_mxfp4_activations_equal_their_named_variants(dtype):
    x = np.asarray(generate(_mx_case(dtype), "reference-mx", 0).x, np.float32)
    codes, sb = _ct_mxfp4_act(x, dtype)
    v = mx_variant(Declared(variants=reference_variants("compressed-tensors-mxfp4-act")))
    ec, es = quantize_mxfp4(x, v)
    assert np.array_equal(es, sb) and np.array_equal(ec, codes)
    assert sb[1, 0] == 0xFF  # the top-binade block: a NaN block in compressed-tensors
    canonical_even = quantize_mxfp4(x, MxVariant(scale_rule="even", element_zero_sign="positive"))
    assert canonical_even[1][1, 0] == 253 and not np.array_equal(canonical_even[1], sb)
    assert not np.array_equal(quantize_mxfp4(x)[1], sb)  # and the canonical FLOOR


# ----------------------------------------------------------------------------------- vLLM int8 azp kernels
def test_vllm_cpu_int8_azp_kernel_equals_its_named_variants():
    """vLLM's x86 azp kernel (csrc/cpu/dnnl_kernels.cpp), loaded the way backends/vllm_cpu.py loads it."""
    from backends.vllm_cpu import VllmCpuBackend

    b = VllmCpuBackend()
    av = b.availability()
    if not av.available:
        pytest.skip(f"vllm-cpu unavailable: {av.reason}")
    ops = torch.ops._C
    rng = np.random.default_rng(4)
    gauss = (rng.standard_normal((16, 64)) * 10.0 ** rng.uniform(-3, 3, (16, 1))).astype(np.float32)
    for dtype in ("float32", "bfloat16"):
        for x in (_int8_inputs(dtype), gauss.astype(NP_DTYPE[dtype]).astype(np.float32)):
            M, K = x.shape
            xq = torch.empty((M, K), dtype=torch.int8)
            xs = torch.empty((M, 1), dtype=torch.float32)
            xzp = torch.empty((M, 1), dtype=torch.int32)
            ops.dynamic_scaled_int8_quant(xq, torch.from_numpy(x).to(TORCH_DTYPE[dtype]), xs, xzp)
            q, s, zp = xq.numpy().astype(np.int32), xs.numpy(), xzp.numpy().astype(np.int32)
            assert _same(_emulate_int8("vllm-cpu-int8-azp", x, dtype, False), q, s, zp), dtype
    x = _int8_inputs("float32")
    M, K = x.shape
    xq = torch.empty((M, K), dtype=torch.int8)
    xs = torch.empty((M, 1), dtype=torch.float32)
    xzp = torch.empty((M, 1), dtype=torch.int32)
    ops.dynamic_scaled_int8_quant(xq, torch.from_numpy(x), xs, xzp)
    q, s, zp = xq.numpy().astype(np.int32), xs.numpy(), xzp.numpy().astype(np.int32)
    assert not _same(_canonical_int8(x, False), q, s, zp)
    assert zp[0, 0] == zp[3, 0] == -(2**31)  # zero row (0/0) and one-ulp row (overflow): stored as INT32_MIN
    unfused = dict(reference_variants("vllm-cpu-int8-azp"), azp_fused=False)
    assert not np.array_equal(quantize_int8_per_token(x, int8_variant(Declared(variants=unfused),
                                                                      _int8_case("float32", False))).q[3], q[3])


def test_every_reference_quantizer_is_checked_here():
    """Each named reference quantizer has a library test above, except vLLM's CUDA azp kernel: no CUDA build
    of vLLM runs here, so its entry rests on reading int8_quant_kernels.cu (docs/formats/activations.md)."""
    checked = {"compressed-tensors-int8-sym", "compressed-tensors-int8-asym", "onnx-dynamicquantizelinear",
               "vllm-cpu-int8-azp", "torchao-mx-floor", "torchao-mx-even", "torchao-mx-ceil",
               "torchao-mx-rceil", "compressed-tensors-mxfp4-act"}
    source_only = {"vllm-cuda-int8-azp"}
    assert set(REFERENCE_QUANTIZERS) == checked | source_only


# ----------------------------------------------------------------------------------- scales that underflow
#: rows whose fp32 scale (max(0, max) - min(0, min)) / 255 underflows to 0, or lands in the subnormals
_TINY = np.float32(2.0 ** -149)
_UNDERFLOW_ROWS = [[_TINY, 0, 0, 0], [-_TINY, 0, 0, 0], [_TINY, -_TINY, 0, 0], [3 * _TINY, -2 * _TINY, _TINY, 0],
                   [-_TINY, _TINY, 3 * _TINY, 0], [2.0 ** -140, -2.0 ** -141, 0, 0], [-2.0 ** -130, 0, 0, 0],
                   [1e-38, -1e-38, 0, 0]]


def test_onnx_zero_point_when_the_scale_underflows():
    """ONNX DynamicQuantizeLinear where the fp32 scale underflows to 0: the reference's clamp
    max(0, min(255, NaN or +Inf)) gives zp 255, and 0 / 0 codes convert to 0. The named preset and the
    q-uint8-tensor scheme (emulator/activations/uint8_tensor.py) equal the reference evaluator bit for bit;
    the preset without the two named behaviours does not."""
    from emulator.activations.uint8_tensor import quantize_uint8_per_tensor

    v = int8_variant(Declared(variants=reference_variants("onnx-dynamicquantizelinear")))
    loose = dict(reference_variants("onnx-dynamicquantizelinear"))
    del loose["azp_clamp_nan"], loose["nan_to_int"]
    v_loose = int8_variant(Declared(variants=loose))
    differs = 0
    for r in _UNDERFLOW_ROWS:
        x = np.array([r], np.float32)
        y, s, zp = _onnx_dql(x)
        a = quantize_int8_per_token(x, v)
        assert np.array_equal(a.stored(v), y) and a.scale[0, 0] == s and int(a.zero_point[0, 0]) + 128 == zp, r
        u = quantize_uint8_per_tensor(x)
        assert np.array_equal(u.q, y) and u.scale[0] == s and int(u.zero_point[0]) == zp, r
        b = quantize_int8_per_token(x, v_loose)
        differs += not (np.array_equal(b.stored(v_loose), y) and int(b.zero_point[0, 0]) + 128 == zp)
    assert _onnx_dql(np.array([[_TINY, 0, 0, 0]], np.float32))[1:] == (0.0, 255)  # the case itself: scale 0, zp 255
    assert differs >= 4


def test_compressed_tensors_mxfp4_quotient_that_underflows_in_the_activation_dtype_is_positive_zero():
    """compressed-tensors divides x / scale in x's dtype: a negative element whose quotient underflows there is
    -0, whose code its rule makes +0 (code 0); the exact quotient is a tiny negative whose E2M1 rounding keeps
    the sign (code 8). The preset names it (mx_quotient_dtype=input) and equals the library bit for bit."""
    rng = np.random.default_rng(5)
    for dtype, big in (("bfloat16", 2.0 ** 120), ("float32", 2.0 ** 120)):
        r = -np.abs(rng.standard_normal((2, 32))) * (2.0 ** -21 if dtype == "bfloat16" else 2.0 ** -40)
        r[:, 0] = big
        x = round_to_dtype(r, dtype).astype(np.float32)
        codes, sb = _ct_mxfp4_act(x, dtype)
        case = _mx_case(dtype)
        v = mx_variant(Declared(variants=reference_variants("compressed-tensors-mxfp4-act")), case)
        ec, es = quantize_mxfp4(x, v)
        assert np.array_equal(es, sb) and np.array_equal(ec, codes), dtype
        assert (codes[:, 1:] == 0).all()  # +0 everywhere the quotient underflowed
        exact = dict(reference_variants("compressed-tensors-mxfp4-act"), mx_quotient_dtype="exact")
        assert (quantize_mxfp4(x, mx_variant(Declared(variants=exact), case))[0][:, 1:] == 8).all()
