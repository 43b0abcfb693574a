"""Quantize-only cases (docs/conformance.md#quantize-only-cases): the judge, the reference on hand-derived
inputs, the runner end to end with planted defects, certification bundles, and the refusal of every
backend without an activation-quantization entry point.

Expected values here are derived by hand (or copied from the ONNX operator documentation), never from the
code under test.
"""

import json

import numpy as np
import pytest

from backends.base import Declared
from backends.registry import BUILTIN, create
from conformance.selftest.doubles.quantize import SPEC
from conformance.judge.quantized import decide_quantized
from conformance.run.runner import Runner
from conformance.cases.suite import CaseSpec, case_list
from emulator.quantize_only import quantize_reference
from emulator.schemes import QUANTIZE_SCHEMES, Case


def _exp():
    return {"codes": np.array([[127, -64, 1, 0]], np.int8), "scale": np.array([[0.0625]], np.float32),
            "zero_point": np.array([[3]], np.int32), "dequantized": np.zeros((1, 4), np.float32)}


# -- the judge -------------------------------------------------------------------------------------
def test_identical_tensors_pass():
    assert decide_quantized(_exp(), _exp())["verdict"] == "pass"


def test_a_wrong_code_fails_naming_the_first_differing_element():
    obs = _exp()
    obs["codes"] = obs["codes"].copy()
    obs["codes"][0, 2] = 2
    r = decide_quantized(obs, _exp())
    assert r["verdict"] == "fail"
    assert r["first_mismatch"] == {"tensor": "codes", "index": [0, 2], "observed": 2, "expected": 1, "count": 1,
                                   "size": 4}
    assert "codes[0, 2] observed 2, expected 1" in r["reason"]


def test_a_scale_one_ulp_off_fails():
    obs = _exp()
    obs["scale"] = np.array([[np.nextafter(np.float32(0.0625), np.float32(1))]], np.float32)
    r = decide_quantized(obs, _exp())
    assert r["verdict"] == "fail" and r["first_mismatch"]["tensor"] == "scale"


def test_a_nan_scale_fails_where_the_reference_is_finite():
    obs = _exp()
    obs["scale"] = np.array([[np.nan]], np.float32)
    assert decide_quantized(obs, _exp())["verdict"] == "fail"


def test_a_missing_zero_point_fails():
    obs = _exp()
    del obs["zero_point"]
    r = decide_quantized(obs, _exp())
    assert r["verdict"] == "fail" and "missing output tensor(s) zero_point" in r["reason"]


@pytest.mark.parametrize("obs, words", [
    ({}, "no tensors"),
    (dict(_exp(), extra=np.zeros(1, np.int8)), "unexpected output tensor(s) extra"),
    (dict(_exp(), codes=_exp()["codes"].astype(np.int32)), "codes: dtype int32, expected int8"),
    (dict(_exp(), scale=_exp()["scale"].reshape(1)), "scale: shape [1], expected [1, 1]"),
    (dict(_exp(), zero_point=np.array([[2]], np.int32)), "zero_point"),
])
def test_empty_extra_dtype_shape_and_value_errors_fail(obs, words):
    r = decide_quantized(obs, _exp())
    assert r["verdict"] == "fail" and words in r["reason"]


def test_constant_expected_codes_are_mistrusted_not_passed():
    e = {"codes": np.zeros((2, 4), np.int8), "scale": np.zeros((2, 1), np.float32)}
    assert decide_quantized(e, e)["verdict"] == "mistrusted"


def test_codes_of_a_nan_scale_mx_block_are_not_compared_but_its_scale_is():
    exp = {"codes": np.zeros((1, 64), np.uint8), "scale": np.array([[0xFF, 127]], np.uint8)}
    exp["codes"][0, 32:] = np.arange(32) % 16
    obs = {k: v.copy() for k, v in exp.items()}
    obs["codes"][0, :32] = 7  # unspecified: OCP MX leaves them open
    assert decide_quantized(obs, exp)["verdict"] == "pass"
    obs["scale"][0, 0] = 254
    assert decide_quantized(obs, exp)["verdict"] == "fail"


# -- the reference on hand-derived inputs ------------------------------------------------------------
def test_int8_token_symmetric_by_hand():
    # amax 127/16: scale exactly 1/16, quotients 127, -63.5 (a tie: RNE -> -64), 1, 0
    x = np.array([[127 / 16, -63.5 / 16, 1 / 16, 0.0]], np.float32)
    r = quantize_reference(Case("q-int8-token", "none", 1, 0, 4, group_size=-1, act_dtype="float32"), x,
                           Declared(variants={}))
    assert r["codes"].tolist() == [[127, -64, 1, 0]] and r["codes"].dtype == np.int8
    assert r["scale"].tolist() == [[0.0625]] and "zero_point" not in r
    assert r["dequantized"].tolist() == [[127 / 16, -4.0, 1 / 16, 0.0]]


def test_uint8_tensor_is_the_onnx_documentation_example():
    # onnx/docs/Operators.md, DynamicQuantizeLinear example: y_scale 0.0196078438, y_zero_point 153
    x = np.array([[0, 2, -3, -2.5, 1.34, 0.5]], np.float32)
    r = quantize_reference(Case("q-uint8-tensor", "none", 1, 0, 6, group_size=-1, sym=False, act_dtype="float32"), x,
                           Declared(variants={}))
    assert r["codes"].tolist() == [[153, 255, 0, 26, 221, 179]]
    assert r["zero_point"].tolist() == [153] and r["zero_point"].dtype == np.uint8
    assert r["scale"].astype(np.float64).tolist() == pytest.approx([0.0196078438], rel=1e-8)


def test_mxfp4_block_of_e2m1_values_is_the_identity():
    vals = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6] * 4, np.float32)  # amax 6: scale 2**0 (byte 127)
    x = np.stack([vals, -vals / 4])  # second row: amax 1.5 -> scale 2**-2 (byte 125)
    r = quantize_reference(Case("q-mxfp4", "none", 2, 0, 32, group_size=32, act_dtype="float32"), x,
                           Declared(variants={}))
    assert r["scale"].tolist() == [[127], [125]]
    assert r["codes"][0].tolist() == list(range(8)) * 4
    assert r["codes"][1].tolist() == [8] + list(range(9, 16)) + ([8] + list(range(9, 16))) * 3  # -0 keeps its sign


# -- backends without a quantize entry point -----------------------------------------------------------
@pytest.mark.parametrize("name", sorted(set(BUILTIN) - {"emulator", "auto", "torchao", "compressed-tensors",
                                                        "onnx-reference"}))
def test_every_kernel_backend_refuses_quantize_only_cases_by_name(name):
    b = create(name)
    for scheme in QUANTIZE_SCHEMES:
        sup = b.can_implement(Case(scheme, "none", 2, 0, 64, group_size=32, sym=True, act_dtype="float32"))
        assert not sup.ok and "activation quantization entry point" in sup.reason


# -- the runner end to end -----------------------------------------------------------------------------
def _specs():
    return [s for s in case_list(schemes=list(QUANTIZE_SCHEMES), tiers=("edge",), profile="smoke")
            if s.case.M == 5 and (s.case.scheme != "q-int8-token" or not s.case.sym)][:12]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    import os

    # the doubles are registered for this fixture only: the environment is restored, so no other test (the
    # dispatcher's, in the same xdist worker) ever sees them
    old = os.environ.get("QCONFORM_EXTRA_BACKENDS")
    os.environ["QCONFORM_EXTRA_BACKENDS"] = SPEC
    try:
        r = Runner(tmp_path_factory.mktemp("q"), progress=False, worker_env=dict(os.environ))
        names = ["emulator", "qd-nozp", "qd-code", "qd-scale", "qd-nanscale", "qd-int32", "qd-empty"]
        out = {}
        for rec in r.run(names, _specs()):
            out.setdefault(rec["backend"], []).append(rec)
    finally:
        if old is None:
            os.environ.pop("QCONFORM_EXTRA_BACKENDS", None)
        else:
            os.environ["QCONFORM_EXTRA_BACKENDS"] = old
    return out


def test_the_emulator_passes_its_own_quantize_only_cases(planted):
    recs = planted["emulator"]
    assert recs and all(r["verdict"] == "pass" for r in recs), [r["reason"] for r in recs]


@pytest.mark.parametrize("name, words", [("qd-code", "first: codes["), ("qd-scale", "first: scale["),
                                         ("qd-nanscale", "first: scale["), ("qd-int32", "codes: dtype int32"),
                                         ("qd-empty", "malformed output")])
def test_every_planted_defect_fails_every_case(planted, name, words):
    recs = planted[name]
    assert recs and all(r["verdict"] == "fail" for r in recs)
    assert all(words in r["reason"] or (name == "qd-empty" and "no tensors" in r["reason"]) for r in recs), \
        [r["reason"] for r in recs]


def test_a_missing_zero_point_fails_where_the_scheme_has_one(planted):
    with_zp = [r for r in planted["qd-nozp"] if r["scheme"] in ("q-int8-token", "q-uint8-tensor")]
    assert with_zp and all(r["verdict"] == "fail" and "zero_point" in r["reason"] for r in with_zp)


# -- certification bundles -----------------------------------------------------------------------------
def test_certification_bundle_recomputes_quantize_verdicts_and_catches_an_edited_code(tmp_path, monkeypatch):
    from conformance.certify import certify, verify_bundle
    from conformance.certify.write import seal
    from emulator.tensorfile import TensorFile, save_tensors

    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", SPEC)
    res = certify(["emulator", "qd-code"], tmp_path / "b", profile="smoke", schemes=["q-uint8-tensor"],
                  tiers=("exact", "edge"), log=lambda *a: None)
    assert res.n_results and not res.ok  # qd-code fails
    v = verify_bundle(tmp_path / "b", deep=True)
    assert v.ok, v.problems
    # a forger turns a failing code into the expected one: the recorded fail no longer follows
    out = next((tmp_path / "b" / "outputs").glob("qd-code*.safetensors"))
    tf = TensorFile(out)
    t = {k: tf.get(k).data for k in tf.keys()}
    key = next(k for k in t if k.endswith(".obs.codes"))
    t[key] = t[key.replace(".obs.", ".exp.")]
    save_tensors(out, t, metadata=tf.metadata)
    (tmp_path / "b" / "MANIFEST.json").unlink()
    seal(tmp_path / "b")
    v2 = verify_bundle(tmp_path / "b")
    assert not v2.ok and any("recorded verdict fail" in p for p in v2.problems), v2.problems


def test_case_ids_and_specs_round_trip():
    for s in case_list(schemes=list(QUANTIZE_SCHEMES), profile="smoke"):
        assert CaseSpec.from_json(json.loads(json.dumps(s.to_json()))).case_id == s.case_id


# -- fingerprint -------------------------------------------------------------------------------------------
def test_fingerprint_of_a_wrong_declaration_names_the_real_value():
    from conformance.fingerprint.decide import fingerprint

    res = fingerprint("emulator:act_rounding=rhaz,declare=canonical", schemes=["q-int8-token"],
                      axes=["act_rounding", "reciprocal"])
    rows = {a["axis"]: a for a in res["schemes"]["q-int8-token"]["axes"]}
    assert rows["act_rounding"]["consistent"] == ["rhaz"]
    assert "rne" in rows["act_rounding"]["excluded"]
    assert any("act_rounding" in c and "declares act_rounding=rne" in c for c in res["contradictions"])
    assert rows["reciprocal"]["consistent"] == ["divide"] and "contradiction" not in rows["reciprocal"]


def test_fingerprint_of_the_emulator_agrees_with_its_declaration_on_every_quantize_scheme():
    from conformance.fingerprint.decide import fingerprint

    res = fingerprint("emulator", schemes=list(QUANTIZE_SCHEMES))
    assert res["contradictions"] == []
    rows = [a for s in res["schemes"].values() for a in s["axes"]]
    assert rows and all(a["declared"] in a.get("consistent", []) for a in rows if a["status"] == "ok")


# -- property tier ---------------------------------------------------------------------------------------------
def test_property_tier_searches_quantize_schemes_and_shrinks_a_planted_rounding(tmp_path):
    pytest.importorskip("hypothesis", reason="the property tier needs Hypothesis")
    from conformance.run.property_search import run_property

    r = Runner(tmp_path, progress=False)
    recs = run_property(r, ["emulator", "emulator:e2m1_rounding=rhaz,declare=canonical"], profile="smoke",
                        schemes=["q-mxfp4"])
    by = {x["backend"]: x for x in recs}
    assert by["emulator"]["verdict"] == "pass"
    bad = by["emulator:declare=canonical,e2m1_rounding=rhaz"]
    assert bad["verdict"] == "fail" and "first: codes[" in bad["reason"]
