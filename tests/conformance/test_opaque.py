"""Opaque arithmetic (docs/conformance.md#opaque-arithmetic): a backend that cannot declare its arithmetic
exactly is judged by SQNR against the reference of its declared semantics, under its own verdict
(`pass-sqnr`) and level (`opaque`), never called CONFORMANT, and the dispatcher skips it unless opted in."""

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest

import opaque_doubles
from backends.base import Case, Declared
from backends.registry import create, select
from conformance.judge.acceptance import declared_interval
from conformance.cases.inputs import make_inputs
from conformance.cli.main import main
from conformance.judge.verdict import decide_opaque
from emulator.numerics.sqnr import sqnr_db
from emulator.variants import VariantError

HERE = Path(__file__).resolve().parent
SMALL = ["--profile", "smoke", "--no-progress", "-j", "1", "--scheme", "w8a8"]


@pytest.fixture
def doubles(monkeypatch):
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", opaque_doubles.SPEC)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p))


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_opaque_needs_a_floor():
    with pytest.raises(VariantError, match="sqnr_floor_db"):
        Declared(variants={}, arithmetic="opaque")
    with pytest.raises(VariantError, match="opaque only"):
        Declared(variants={}, sqnr_floor_db=30)
    case = Case("w8a8", "ct-int-quantized", 2, 32, 64, group_size=-1)
    assert Declared(variants={}, arithmetic="opaque", sqnr_floor_db=30, output="bfloat16").level(case).label == "opaque"


def test_decide_opaque_against_an_independent_sqnr():
    case = Case("w4a16", "gptq", 4, 64, 128, group_size=32)
    inp = make_inputs(case, 1)
    iv = declared_interval(inp, Declared(variants={}, output=case.output_dtype))
    ref = iv.y_ref
    noise = np.random.default_rng(5).standard_normal(ref.shape)
    noise *= np.sqrt(np.sum(ref ** 2) / np.sum(noise ** 2)) * 10 ** (-45 / 20)  # 45 dB, by construction
    y = ref + noise
    assert abs(sqnr_db(y, ref) - 45) < 1e-9
    assert decide_opaque(y, iv, iv, 40).verdict == "pass-sqnr"
    r = decide_opaque(y, iv, iv, 50).record()
    assert r["verdict"] == "fail" and "below the declared floor 50" in r["reason"]
    assert decide_opaque(y[:, :-1], iv, iv, 40).verdict == "fail"  # wrong shape
    y_nan = y.copy()
    y_nan[0, 0] = np.nan
    assert decide_opaque(y_nan, iv, iv, 40).verdict == "fail"  # NaN where the reference is finite


def test_opaque_backend_passing_its_floor_is_accurate_not_conformant(doubles, tmp_path, capsys):
    out = tmp_path / "ok"
    rc = main(["run", "--backend", "noisy-opaque:snr_db=60", "--out", str(out), *SMALL])
    text = capsys.readouterr().out
    s = _summary(out)
    assert rc == 0, text
    assert s["status"] == "accurate" and "CONFORMANT" not in s["headline"] and not s["ok"]
    assert s["totals"].get("pass-sqnr", 0) > 0 and not s["totals"].get("pass")
    assert s["level"] == "opaque"
    assert "0 passed" in text and "pass-sqnr" in text  # never counted as passed


def test_opaque_backend_below_its_floor_fails(doubles, tmp_path, capsys):
    out = tmp_path / "bad"
    rc = main(["run", "--backend", "noisy-opaque:snr_db=20", "--out", str(out), *SMALL])
    text = capsys.readouterr().out
    s = _summary(out)
    assert rc == 1 and s["status"] == "not-conformant"
    assert any("below the declared floor 40" in f["reason"] for f in s["failures"]), text[-2000:]


def test_dispatcher_skips_opaque_unless_opted_in(doubles):
    case = Case("w8a8", "ct-int-quantized", 4, 64, 128, group_size=-1)
    sel = select(case, ["noisy-opaque", "emulator"])
    why = {name.split(":")[0]: r for name, r in sel.skipped}
    assert sel.backend.name == "emulator" and "opaque arithmetic" in why["noisy-opaque"]
    assert select(case, ["noisy-opaque", "emulator"], allow_opaque=True).backend.name == "noisy-opaque"
    assert create("auto:only=noisy-opaque,opaque=allow").select(case).backend.name == "noisy-opaque"
    assert create("auto:only=noisy-opaque").select(case).backend.name == "emulator"
    with pytest.raises(ValueError, match="opaque must be"):
        create("auto:opaque=maybe")


def test_opaque_certification_bundle_verifies(doubles, tmp_path, capsys):
    out = tmp_path / "cert"
    rc = main(["certify", "--backend", "noisy-opaque:snr_db=60", "--out", str(out), "--profile", "smoke",
               "--scheme", "w8a8", "-j", "1"])
    text = capsys.readouterr().out
    assert (out / "MANIFEST.json").exists(), rc
    assert rc == 0 and "ACCURATE TO DECLARED SQNR FLOORS" in text and "level opaque" in text, text
    assert main(["verify-bundle", str(out)]) == 0, capsys.readouterr()


def test_a_nonfinite_reference_mismatch_names_its_first_element():
    """An infinite activation makes reference rows non-finite; a kernel returning finite numbers there fails,
    and the reason names the first such element (the record's worst_element is the worst finite one)."""
    case = Case("w4a16", "gptq", 3, 64, 128, group_size=32)
    inp = make_inputs(case, 2)
    x = np.array(inp.x, np.float32)
    x[1, 5] = np.inf
    inp = dataclasses.replace(inp, x=x)
    iv = declared_interval(inp, Declared(variants={}, output=case.output_dtype))
    ref = iv.y_ref
    assert not np.isfinite(ref[1]).any() and np.isfinite(ref[0]).all()
    y = np.where(np.isfinite(ref), ref, 1.0)
    r = decide_opaque(y, iv, iv, 30).record()
    assert r["verdict"] == "fail"
    assert "where the canonical reference is NaN or infinite differ from it (first [1, 0]: observed 1.0" in r["reason"]
