"""The reference-library backends of the quantize-only schemes against the real libraries (torchao,
compressed-tensors, onnx), each test skipping with the reason where its library is not installed.

Hand-derived expectations first (scale bytes of the four torchao scale modes on blocks whose amax sits on
a rule boundary, compressed-tensors' 127.5 divisor, the ONNX documentation's DynamicQuantizeLinear
example), then the suite's own smoke cases through the isolated runner: every judged case must pass
against the backend's declared variants (docs/backends/torchao.md, compressed-tensors.md, onnx-reference.md).
"""

import numpy as np
import pytest

from backends.registry import create
from conformance.run.runner import Runner
from conformance.cases.suite import case_list
from emulator.schemes import Case

MX = Case("q-mxfp4", "none", 1, 0, 96, group_size=32, act_dtype="float32")


def _need(module: str):
    pytest.importorskip(module, reason=f"{module} is not installed here")


def _run(spec: str, schemes, tmp_path, skip_generators=()):
    # the exact and edge tiers of the smoke profile's larger shape: every generator, few cases
    specs = [s for s in case_list(schemes=schemes, profile="smoke", tiers=("exact", "edge"))
             if s.generator not in skip_generators and s.case.M == 5]
    recs = Runner(tmp_path, progress=False).run([spec], specs)
    judged = [r for r in recs if r["verdict"] != "unsupported"]
    assert judged, "no case judged"
    return recs, judged


# -- torchao ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode, want", [("floor", [125, 125, 125]), ("even", [126, 125, 125]),
                                        ("rceil", [126, 126, 125]), ("ceil", [126, 126, 126])])
def test_torchao_scale_bytes_on_rule_boundaries(mode, want):
    _need("torchao.prototype.mx_formats")
    # block amax 1.875, 1.625, 1.375 (times 2**0): FLOOR takes 2**(0 - 2) for all three (byte 125); EVEN
    # rounds 1.875 up to 2 (byte 126); RCEIL takes ceil(log2(amax / 6)): 1.875 and 1.625 -> 2**-1, 1.375
    # -> 2**-2 (1.375 / 6 <= 0.25); CEIL bumps every non-power-of-two amax
    x = np.zeros((1, 96), np.float32)
    x[0, 0], x[0, 32], x[0, 64] = 1.875, 1.625, 1.375
    b = create(f"torchao:scale_mode={mode}")
    out = b.quantize(b.prepare(MX, {}), x)
    assert out["scale"].tolist() == [want]
    assert out["codes"].dtype == np.uint8 and out["codes"].shape == (1, 96)


def test_torchao_refuses_float16_and_unknown_modes():
    _need("torchao.prototype.mx_formats")
    sup = create("torchao").can_implement(Case("q-mxfp4", "none", 1, 0, 32, group_size=32, act_dtype="float16"))
    assert not sup.ok and "float16" in sup.reason
    with pytest.raises(ValueError, match="scale_mode"):
        create("torchao:scale_mode=nearest")


@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_torchao_passes_the_smoke_cases_except_inf_blocks(mode, tmp_path):
    _need("torchao.prototype.mx_formats")
    # nonfinite-acts: torchao gives an Inf block a finite scale (docs/backends/torchao.md): judged apart below
    _recs, judged = _run(f"torchao:scale_mode={mode}", ["q-mxfp4"], tmp_path, skip_generators=("nonfinite-acts",))
    assert all(r["verdict"] == "pass" for r in judged), [r["reason"] for r in judged if r["verdict"] != "pass"]


def test_torchao_inf_block_fails_naming_its_scale(tmp_path):
    _need("torchao.prototype.mx_formats")
    specs = [s for s in case_list(schemes=["q-mxfp4"], profile="smoke") if s.generator == "nonfinite-acts"]
    recs = Runner(tmp_path, progress=False).run(["torchao"], specs)
    assert recs and all(r["verdict"] == "fail" and "first: scale[" in r["reason"] for r in recs)


# -- compressed-tensors -----------------------------------------------------------------------------------
def test_compressed_tensors_symmetric_divisor_is_127_5():
    _need("compressed_tensors")
    x = np.zeros((1, 4), np.float32)
    x[0, :3] = [127.5, -1.0, 0.5]  # amax / 127.5 = 1 exactly; 127.5 rounds (half to even) to 128, saturates to 127
    case = Case("q-int8-token", "none", 1, 0, 4, group_size=-1, sym=True, act_dtype="float32")
    b = create("compressed-tensors")
    out = b.quantize(b.prepare(case, {}), x)
    assert out["scale"].tolist() == [[1.0]]
    assert out["codes"].tolist() == [[127, -1, 0, 0]] and "zero_point" not in out


def test_compressed_tensors_passes_the_smoke_cases_with_its_declared_variants(tmp_path):
    _need("compressed_tensors")
    _recs, judged = _run("compressed-tensors", ["q-int8-token"], tmp_path)
    assert all(r["verdict"] == "pass" for r in judged), [r["reason"] for r in judged if r["verdict"] != "pass"]
    assert any(r["level"] == "rounding" for r in judged)  # its variants are declared, never canonical


# -- onnx reference --------------------------------------------------------------------------------------
def test_onnx_dynamic_quantize_linear_documentation_example():
    _need("onnx.reference")
    # onnx/docs/Operators.md, DynamicQuantizeLinear: y = [153, 255, 0, 26, 221, 179], y_zero_point = 153
    x = np.array([[0, 2, -3, -2.5, 1.34, 0.5]], np.float32)
    case = Case("q-uint8-tensor", "none", 1, 0, 6, group_size=-1, sym=False, act_dtype="float32")
    b = create("onnx-reference")
    out = b.quantize(b.prepare(case, {}), x)
    assert out["codes"].tolist() == [[153, 255, 0, 26, 221, 179]]
    assert out["zero_point"].tolist() == [153]


def test_onnx_passes_the_smoke_cases_and_refuses_asymmetric_per_token(tmp_path):
    _need("onnx.reference")
    recs, judged = _run("onnx-reference", ["q-uint8-tensor", "q-int8-token"], tmp_path)
    assert all(r["verdict"] == "pass" for r in judged), [r["reason"] for r in judged if r["verdict"] != "pass"]
    refused = [r for r in recs if r["verdict"] == "unsupported"]
    assert refused and all("asymmetric" in r["reason"] for r in refused)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compressed_tensors_mxfp4_quotient_underflow_is_declared(dtype):
    """A negative element whose quotient x / scale underflows in x's dtype: the library gives code 0 (+0), which
    its declaration names (mx_quotient_dtype=input), so the backend's output equals its declared reference."""
    _need("compressed_tensors")
    from emulator.numerics.floats import round_to_dtype
    from emulator.quantize_only import quantize_reference

    case = Case("q-mxfp4", "none", 2, 0, 64, group_size=32, act_dtype=dtype)
    x = -np.abs(np.random.default_rng(1).standard_normal((2, 64))) * (2.0 ** -21 if dtype == "bfloat16" else 2.0 ** -40)
    x[:, ::32] = 2.0 ** 120
    x = round_to_dtype(x, dtype).astype(np.float32)
    b = create("compressed-tensors")
    d = b.declared(case)
    assert d.variants["mx_quotient_dtype"] == "input"
    out = b.quantize(b.prepare(case, {}), x)
    ref = quantize_reference(case, x, d)
    assert np.array_equal(out["codes"], ref["codes"]) and np.array_equal(out["scale"], ref["scale"])
    assert (out["codes"][:, 1:32] == 0).all()
