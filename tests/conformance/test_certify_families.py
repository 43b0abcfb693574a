"""`qconform certify --for-model CKPT` (profile ``families``, docs/certification.md#families): the case families a
checkpoint's layers need, certified on this host, re-derivable from the bundle, and what certified dispatch
(`qconform model --certified`) then trusts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.certify import verify_bundle
from conformance.certify.dispatch import checkpoint_families, family_key
from conformance.cli.main import main as qconform
from conformance.cases.suite import case_list, family_cases

CKPTS = Path(__file__).resolve().parents[1] / "data" / "toolkit_checkpoints"
W8A8 = CKPTS / "llmcompressor-w8a8-int8"


def test_checkpoint_families_are_its_layers_cases_without_shape():
    fams, reference_only = checkpoint_families(W8A8, "float32")
    assert len(fams) == 1 and reference_only == []  # seven layers, one family
    (fam,) = fams
    assert fam["scheme"] == "w8a8" and fam["weight_format"] == "ct-int-quantized" and fam["act_dtype"] == "float32"
    assert not {"M", "N", "K"} & set(fam)
    gptq, _ = checkpoint_families(CKPTS / "gptqmodel-rtn-w4g32-asym-gptq_v2", "bfloat16")
    assert {(f["weight_format"], f["group_size"], f["sym"], f["zero_convention"]) for f in gptq} == {
        ("gptq", 32, False, "v2")}


def test_family_cases_widen_k_to_the_group_and_keep_the_family():
    fam = {"scheme": "w4a16", "weight_format": "gptq", "group_size": 128, "sym": False, "act_order": False,
           "zero_convention": "v2", "act_dtype": "bfloat16", "out_dtype": None, "bias": False, "E": 0, "top_k": 0,
           "bits": 4, "scale_dtype": "float16"}
    cases = family_cases([fam], [(1, 64, 128), (5, 96, 200)])
    assert [(c.M, c.N, c.K) for c in cases] == [(1, 64, 256), (5, 96, 256)]  # two groups; a multiple of 128
    assert all(family_key(c.to_json()) == family_key(fam) for c in cases)


def test_family_cases_add_the_checkpoints_own_k():
    fam = {"scheme": "w8a8", "weight_format": "ct-int-quantized", "group_size": -1, "sym": True, "act_order": False,
           "zero_convention": None, "act_dtype": "float32", "out_dtype": None, "bias": False, "E": 0, "top_k": 0,
           "bits": 8, "scale_dtype": "bfloat16", "K_max": 14336}
    cases = family_cases([fam], [(1, 64, 128)])
    assert [(c.M, c.N, c.K) for c in cases] == [(1, 64, 128), (1, 64, 14336), (5, 64, 14336)]
    assert family_key(cases[1].to_json()) == family_key(fam)  # K_max is not part of the family


def test_the_families_profile_needs_families_and_nothing_else_takes_them():
    with pytest.raises(ValueError, match="takes the case families"):
        case_list(profile="families")
    with pytest.raises(ValueError, match="belong to profile 'families'"):
        case_list(profile="smoke", families=[{"scheme": "w8a8"}])
    with pytest.raises(ValueError, match="no case family"):
        case_list(profile="families", families=[])
    with pytest.raises(ValueError, match="without M, N and K"):
        case_list(profile="families", families=[{"scheme": "w8a8", "M": 1}])


def test_certify_for_model_then_certified_model_run(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from backends.registry import create

    if not create("torch-cpu").availability().available:
        pytest.skip("torch-cpu unavailable")
    del torch
    out = tmp_path / "cert"
    rc = qconform(["certify", "--backend", "torch-cpu", "--for-model", str(W8A8), "--out", str(out), "-j", "2",
                   "--no-progress"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "--for-model" in text and "1 case family at float32" in text
    assert "\n  torch-cpu: " in text and " pass" in text.split("\n  torch-cpu: ", 1)[1].splitlines()[0]  # per backend
    meta = json.loads((out / "bundle.json").read_text())
    assert meta["profile"] == "families" and meta["families"] == checkpoint_families(W8A8, "float32")[0]
    v = verify_bundle(out, deep=True)  # the case list re-derived from the recorded families
    assert v.ok, v.problems
    rc = qconform(["model", str(W8A8), "--tokens", "1,2,3", "--certified", str(out), "--check",
                   "-o", str(tmp_path / "o.safetensors")])
    text = capsys.readouterr().out
    assert rc == 0, text
    layers = [l for l in text.splitlines() if "ct-int-quantized ->" in l]
    # the bundle admits torch-cpu for every layer (a timed contender beside the fast path); the faster of the two runs
    assert len(layers) == 7, text
    for line in layers:
        chosen = line.split(" -> ", 1)[1]
        assert chosen.startswith(("torch-cpu [fastest certified on this host", "emulator fast path")), line
        assert "torch-cpu " in line.split("timed at", 1)[1], line  # certified: timed, not skipped
        assert "torch-cpu: no certification" not in line


def test_for_model_refuses_another_profile_and_dtype_alone(tmp_path, capsys):
    rc = qconform(["certify", "--backend", "emulator", "--for-model", str(W8A8), "--profile", "smoke",
                   "--out", str(tmp_path / "x")])
    assert rc == 2 and "profile 'families'" in capsys.readouterr().err
    rc = qconform(["certify", "--backend", "emulator", "--dtype", "bfloat16", "--out", str(tmp_path / "y")])
    assert rc == 2 and "--dtype goes with --for-model" in capsys.readouterr().err
