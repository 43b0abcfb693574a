"""``qconform quantize`` and the CLI presets against the libraries the presets are named after.

The activations go in as a safetensors file, the codes, scales and zero points come back as one; each is
compared bit for bit with the library itself run on the same input (ONNX's reference evaluator,
compressed-tensors, torchao), on the separating inputs of conformance/cases/generators.py plus rows whose scale or
quotient underflows. The canonical quantizer (no preset) differs from each library there, so agreement is
the preset's doing.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from backends.base import Case
from conformance.cli.main import main
from conformance.cases.generators import generate
from emulator.numerics.floats import round_to_dtype
from emulator.tensorfile import Tensor, load_tensors, save_tensors

torch = pytest.importorskip("torch")
TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _quantize(capsys, tmp_path, x: np.ndarray, dtype: str, *args) -> tuple[int, dict, str]:
    xin = tmp_path / "x.safetensors"
    out = tmp_path / "q.safetensors"
    if out.exists():
        out.unlink()
    data = {"float32": x.astype(np.float32), "float16": x.astype(np.float16)}.get(dtype)
    save_tensors(xin, {"x": data if data is not None else Tensor(x.astype(np.float32), "BF16")})
    rc = main(["quantize", "-i", str(xin), "-o", str(out), *args])
    captured = capsys.readouterr()
    tensors = {k: t.data for k, t in load_tensors(out).items()} if rc == 0 else {}
    return rc, tensors, captured.out + captured.err


# -- ONNX DynamicQuantizeLinear ------------------------------------------------------------------------------
def _onnx_dql(x: np.ndarray):
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "zp"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, list(x.shape)),
                           helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
                           helper.make_tensor_value_info("zp", TensorProto.UINT8, [])])
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        y, s, zp = ReferenceEvaluator(helper.make_model(g)).run(None, {"x": x})
    return y, np.float32(s), int(zp)


def _onnx_dequantize(codes: np.ndarray, scale, zero_point) -> np.ndarray:
    """ONNX DequantizeLinear (reference evaluator) of uint8 codes with a scalar float32 scale and uint8 zero point."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node("DequantizeLinear", ["y", "s", "zp"], ["x"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("y", TensorProto.UINT8, list(codes.shape)),
                                        helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
                                        helper.make_tensor_value_info("zp", TensorProto.UINT8, [])],
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(codes.shape))])
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        (x,) = ReferenceEvaluator(helper.make_model(g)).run(
            None, {"y": np.asarray(codes, np.uint8), "s": np.float32(scale), "zp": np.uint8(zero_point)})
    return np.asarray(x, np.float32)


_TINY = 2.0 ** -149
_ONNX_ROWS = [[_TINY, 0, 0, 0], [-_TINY, _TINY, 3 * _TINY, 0], [2.0 ** -140, -2.0 ** -141, 0, 0],
              [1.0, -0.5, 0.25, 3.0], [0, 0, 0, 0], [5.0, 5.0, 5.0, 5.0]]


@pytest.mark.parametrize("how", [("--preset", "onnx-dynamicquantizelinear"),
                                 ("--variant", "preset=onnx-dynamicquantizelinear"),
                                 ("--scheme", "q-uint8-tensor")])
def test_quantize_equals_onnx_dynamic_quantize_linear(capsys, tmp_path, how):
    sep = np.asarray(generate(Case("w8a8", "ct-int-quantized", 8, 32, 64, group_size=-1, act_dtype="float32",
                                   sym=False), "reference-int8", 0).x, np.float32)
    tensors = [np.array([r], np.float32) for r in _ONNX_ROWS] + [sep[i:i + 1] for i in range(len(sep))] + [sep]
    canonical_differs = 0
    for x in tensors:
        y, s, zp = _onnx_dql(x)
        rc, q, text = _quantize(capsys, tmp_path, x, "float32", *how)
        assert rc == 0, text
        assert q["codes"].dtype == np.uint8 and np.array_equal(q["codes"], y), x
        assert (q["scale"] == s).all()
        # the zero point in the stored codes' domain, as ONNX stores it: uint8, the same value (the preset's
        # per-token layout repeats the one per-tensor value on every row)
        assert q["zero_point"].dtype == np.uint8 and (q["zero_point"] == zp).all(), (x, q["zero_point"], zp)
        # what a consumer does with the file: ONNX's own DequantizeLinear of the stored codes, scale and zero
        # point gives ONNX's dequantization of its own outputs, bit for bit, and the file's `dequantized`
        ours = _onnx_dequantize(q["codes"], q["scale"].reshape(-1)[0], q["zero_point"].reshape(-1)[0])
        theirs = _onnx_dequantize(y, s, zp)
        assert ours.tobytes() == theirs.tobytes() and q["dequantized"].tobytes() == theirs.tobytes(), x
        rc, c, _ = _quantize(capsys, tmp_path, x, "float32", "--scheme", "q-int8-token", "--variant",
                             "act_symmetric=false")
        canonical_differs += not (np.array_equal(c["codes"].astype(np.int64) + 128, y) and (c["scale"] == s).all())
    assert canonical_differs >= 3


# -- compressed-tensors int8 (per token) ----------------------------------------------------------------------
def _ct_int8(x: np.ndarray, dtype: str, sym: bool):
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils.helpers import compute_dynamic_scales_and_zp

    args = QuantizationArgs(num_bits=8, type="int", strategy="token", dynamic=True, symmetric=sym)
    xt = torch.from_numpy(x).to(TORCH[dtype])[None]  # [1, M, K]: one scale per token
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s, zp = compute_dynamic_scales_and_zp(xt, args, None)
        q = quantize(xt, s, zp, args, dtype=torch.int8)[0]
    return q.numpy(), s[0].float().numpy(), zp[0].numpy().astype(np.int32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
def test_quantize_equals_compressed_tensors_int8(capsys, tmp_path, dtype, sym):
    x = np.asarray(generate(Case("w8a8", "ct-int-quantized", 8, 32, 64, group_size=-1, act_dtype=dtype, sym=sym),
                            "reference-int8", 0).x, np.float32)
    q, s, zp = _ct_int8(x, dtype, sym)
    name = f"compressed-tensors-int8-{'sym' if sym else 'asym'}"
    rc, out, text = _quantize(capsys, tmp_path, x, dtype, "--preset", name)
    assert rc == 0, text
    assert np.array_equal(out["codes"], q) and np.array_equal(out["scale"], s.reshape(-1, 1))
    if not sym:
        assert np.array_equal(out["zero_point"], zp.reshape(-1, 1))
    rc, c, _ = _quantize(capsys, tmp_path, x, dtype, "--scheme", "q-int8-token", "--variant",
                         f"act_symmetric={str(sym).lower()}")
    assert not (np.array_equal(c["codes"], q) and np.array_equal(c["scale"], s.reshape(-1, 1)))


# -- torchao to_mx --------------------------------------------------------------------------------------------
def _torchao_to_mx(x: np.ndarray, dtype: str, mode: str):
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    cfg = pytest.importorskip("torchao.prototype.mx_formats.config")
    xt = torch.from_numpy(np.ascontiguousarray(x)).to(TORCH[dtype])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s, d = mx.to_mx(xt, torch.float4_e2m1fn_x2, 32, getattr(cfg.ScaleCalculationMode, mode.upper()))
    return s.view(torch.uint8).numpy().reshape(x.shape[0], -1), d.view(torch.uint8).numpy()


def _packed(codes: np.ndarray) -> np.ndarray:
    """Two E2M1 codes per byte, element 2j in the low nibble (torchao's float4_e2m1fn_x2)."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


@pytest.mark.parametrize("mode", ["floor", "even", "ceil", "rceil"])
def test_quantize_equals_torchao_to_mx(capsys, tmp_path, mode):
    x = np.asarray(generate(Case("w4a4-mxfp4", "ct-mxfp4", 6, 32, 128, group_size=32, act_dtype="float32"),
                            "reference-mx", 0).x, np.float32)
    ts, td = _torchao_to_mx(x, "float32", mode)
    rc, out, text = _quantize(capsys, tmp_path, x, "float32", "--variant", f"preset=torchao-mx-{mode}")
    assert rc == 0, text
    assert np.array_equal(out["scale"], ts) and np.array_equal(_packed(out["codes"]), td)
    rc, c, _ = _quantize(capsys, tmp_path, x, "float32", "--scheme", "q-mxfp4")
    assert not np.array_equal(_packed(c["codes"]), td)


# -- compressed-tensors MXFP4 activations -----------------------------------------------------------------------
_E2M1 = {0.0: 0, 0.5: 1, 1.0: 2, 1.5: 3, 2.0: 4, 3.0: 5, 4.0: 6, 6.0: 7}


def _ct_mxfp4(x: np.ndarray, dtype: str):
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.quant_scheme import MXFP4
    from compressed_tensors.quantization.utils.helpers import compute_dynamic_scales_and_zp

    args = MXFP4["input_activations"]
    xt = torch.from_numpy(x).to(TORCH[dtype])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s, zp = compute_dynamic_scales_and_zp(xt, args, None)
        vals = quantize(xt, s, zp, args).float().numpy().reshape(x.shape)
    sf = s.float().numpy().reshape(x.shape[0], -1)
    with np.errstate(divide="ignore"):
        sb = np.where(np.isinf(sf), 255, np.log2(sf) + 127).astype(np.uint8)
    codes = np.array([_E2M1[abs(float(v))] | (8 if np.signbit(v) else 0) for v in vals.ravel()],
                     np.uint8).reshape(x.shape)
    return codes, sb


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_quantize_equals_compressed_tensors_mxfp4_activations(capsys, tmp_path, dtype):
    sep = np.asarray(generate(Case("w4a4-mxfp4", "ct-mxfp4", 6, 32, 128, group_size=32, act_dtype=dtype),
                              "reference-mx", 0).x, np.float32)
    # rows whose negative elements' quotient underflows in x's dtype (-0 there: the library's +0 code)
    tiny = -np.abs(np.random.default_rng(3).standard_normal((2, 128))) * (2.0 ** -21 if dtype == "bfloat16"
                                                                         else 2.0 ** -40)
    tiny[:, ::32] = 2.0 ** 120
    x = np.concatenate([sep, round_to_dtype(tiny, dtype).astype(np.float32)])
    codes, sb = _ct_mxfp4(x, dtype)
    rc, out, text = _quantize(capsys, tmp_path, x, dtype, "--preset", "compressed-tensors-mxfp4-act")
    assert rc == 0, text
    assert np.array_equal(out["scale"], sb) and np.array_equal(out["codes"], codes)
    assert (codes[-2:, 1:32] == 0).all()
    rc, c, _ = _quantize(capsys, tmp_path, x, dtype, "--preset", "compressed-tensors-mxfp4-act", "--variant",
                         "mx_quotient_dtype=exact")
    assert (c["codes"][-2:, 1:32] == 8).all()  # without the named quotient dtype: the sign survives


# -- errors ----------------------------------------------------------------------------------------------------
def test_quantize_refuses_what_it_does_not_take(capsys, tmp_path):
    x = np.ones((2, 32), np.float32)
    rc, _, text = _quantize(capsys, tmp_path, x, "float32", "--variant", "zero_read=v1_wrap")
    assert rc == 2 and "not a key quantize takes" in text and "zero_read" not in text.split("takes:")[1]
    assert "accumulate" not in text.split("takes:")[1] and "mx_scale_rule" in text
    rc, _, text = _quantize(capsys, tmp_path, x, "float32", "--preset", "no-such")
    assert rc == 2 and "unknown preset 'no-such'" in text and "torchao-mx-floor" in text
    rc, _, text = _quantize(capsys, tmp_path, x, "float32", "--scheme", "q-mxfp4", "--preset",
                            "compressed-tensors-int8-sym")
    assert rc == 2 and "takes none of" in text
    rc, _, text = _quantize(capsys, tmp_path, x, "float32")
    assert rc == 2 and "--scheme" in text
    rc, _, text = _quantize(capsys, tmp_path, np.ones((2, 33), np.float32), "float32", "--scheme", "q-mxfp4")
    assert rc == 2 and "multiple of the MX block" in text
    assert len(text.strip().splitlines()) == 1


def test_variant_options_expand_presets_and_refuse_other_keys():
    """Regression gate of the shared option parser: a preset's variants, a later --variant overriding one, and an
    unknown key refused with the accepted keys only."""
    from conformance.cli.quantize_cmd import parse_variant_options

    v, f = parse_variant_options(["preset=torchao-mx-floor"], None, ["mx_scale_rule"], "quantize")
    assert v == {"mx_scale_rule": "floor", "mx_byte0_divisor": "min_normal"} and f == {}
    assert parse_variant_options(["mx_scale_rule=even"], "torchao-mx-floor", ["mx_scale_rule"],
                                 "quantize")[0]["mx_scale_rule"] == "even"
    with pytest.raises(ValueError) as e:
        parse_variant_options(["qmin=-127"], None, ["mx_scale_rule"], "quantize")
    assert str(e.value).endswith("it takes: preset, mx_scale_rule (docs/variants.md)")
