"""The dispatcher never picks a wrong answer (docs/backends.md#dispatcher): it skips semantic deviations and
known kernel defects, runs every case of the ci profile on this host inside the chosen backend's declared
interval, and `qconform linear --backend auto|NAME` says which backend ran and why the others were skipped."""

import json
import logging
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from backends.base import Availability, Backend, Case, Declared, Prepared, yes
from backends.registry import select
from conformance.cases.inputs import make_inputs
from conformance.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CKPTS = ROOT / "tests" / "data" / "toolkit_checkpoints"


def _fake(name, prio, declared: Declared, defect=None):
    class B(Backend):
        covers = "test"

        def availability(self):
            return Availability(True, "ok")

        def can_implement(self, case):
            return yes()

        def declared(self, case):
            return declared

        def prepare(self, case, tensors):
            return Prepared(case, {})

        def run(self, prepared, x, **inputs):
            return x

        def known_defect(self, case):
            return defect

    B.name, B.priority = name, prio
    return B


@pytest.fixture
def fakes(monkeypatch):
    mod = types.ModuleType("qconform_dispatch_fakes")
    mod.PerTensor = _fake("per-tensor", 99, Declared(variants={"act_granularity": "per_tensor"}, output="bfloat16"))
    mod.Defect = _fake("defect", 98, Declared(variants={}, output="bfloat16"), defect="reads past the row")
    mod.Literal = _fake("literal", 97, Declared(variants={"zero_read": "v1_literal"}, output="bfloat16"))
    mod.Rounding = _fake("rounding", 50, Declared(variants={"act_rounding": "rhaz"}, output="bfloat16"))
    monkeypatch.setitem(sys.modules, "qconform_dispatch_fakes", mod)
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", ",".join(
        f"{n}=qconform_dispatch_fakes:{c}" for n, c in (("per-tensor", "PerTensor"), ("defect", "Defect"),
                                                          ("literal", "Literal"), ("rounding", "Rounding"))))
    return mod


def test_semantic_deviations_and_known_defects_are_skipped(fakes, caplog):
    caplog.set_level(logging.INFO, logger="qconform.dispatch")
    w8a8 = Case("w8a8", "ct-int-quantized", 4, 64, 128, group_size=-1)
    sel = select(w8a8, ["per-tensor", "defect", "rounding", "emulator"])
    assert sel.backend.name == "rounding"  # a rounding-level variant is acceptable
    why = dict(sel.skipped)
    assert "act_granularity=per_tensor" in why["per-tensor"] and "semantic deviation" in why["per-tensor"]
    assert "reads past the row" in why["defect"]
    # zero_read reads GPTQ qzeros only: on a W8A8 case it changes nothing, so the higher priority wins
    assert select(w8a8, ["literal", "rounding", "emulator"]).backend.name == "literal"
    asym_v1 = Case("w4a16", "gptq", 1, 64, 128, group_size=32, sym=False, zero_convention="v1")
    sel = select(asym_v1, ["literal", "emulator"])
    assert sel.backend.name == "emulator" and "zero_read=v1_literal" in dict(sel.skipped)["literal"]
    # a symmetric checkpoint: exact only where every qzeros field is the midpoint, so only with the tensors
    sym_v1 = Case("w4a16", "gptq", 1, 64, 128, group_size=32, sym=True, zero_convention="v1")
    assert select(sym_v1, ["literal", "emulator"]).backend.name == "emulator"
    mid = make_inputs(sym_v1, 0).tensors
    assert select(sym_v1, ["literal", "emulator"], tensors=mid).backend.name == "literal"
    odd = dict(mid, qzeros=mid["qzeros"] ^ np.int32(1))
    assert select(sym_v1, ["literal", "emulator"], tensors=odd).backend.name == "emulator"
    assert any("skipped per-tensor" in r.message for r in caplog.records)


def test_every_ci_case_dispatched_on_this_host_is_inside_its_interval(tmp_path, capsys):
    """The dispatcher on this host, every case of the ci profile, each judged in an isolated worker."""
    out = tmp_path / "auto"
    rc = main(["run", "--backend", "auto", "--profile", "ci", "--out", str(out), "-j", "2", "--no-progress"])
    text = capsys.readouterr().out
    s = json.loads((out / "summary.json").read_text())
    assert s["n_bad"] == 0 and rc == 0, text[-3000:]
    assert s["n_judged"] == s["n_results"] > 1000  # nothing left unjudged: the emulator is the fallback
    assert not s["semantic_deviations"] and s["level"] in ("canonical", "rounding")
    recs = [json.loads(l) for l in (out / "results.jsonl").read_text().splitlines()]
    recs = [r for r in recs if r.get("kind") == "result"]
    chosen = {r["declared"]["notes"].split(" (")[0] for r in recs}
    assert "dispatched to emulator" in chosen
    mistrusted = [r for r in recs if r["verdict"] == "mistrusted"]
    # Known gap (docs/findings.md, "auto and zentorch's eps clamp"): on the coverage design's extreme-scale W8A8 case
    # auto takes zentorch, whose declared eps clamp (a rounding-level variant) makes the declared reference all
    # zero: the case is mistrusted (never counted as passed) and the summary names it. Nothing else may be.
    assert len(mistrusted) <= 1 and s["totals"].get("mistrusted", 0) == len(mistrusted)
    for r in mistrusted:
        assert "vc-scale-extreme" in r["case_id"] and "zentorch" in r["declared"]["notes"].split(" (")[0], r["case_id"]
        assert r["reason"] == "reference output is all zero, constant or non-finite"
    for r in recs:
        if r in mistrusted:
            continue
        assert r["verdict"] in ("pass", "pass-with-tie-flips", "quality-warning"), r["case_id"]
        assert r["level"] != "semantic"
        # a canonical declaration passing its interval is inside the canonical interval itself
        if r["level"] == "canonical":
            assert "canonical_distance" not in r


def _x(path: Path, K: int, M: int = 3):
    import ml_dtypes

    from emulator.tensorfile import Tensor, save_tensors

    x = np.random.default_rng(1).standard_normal((M, K)).astype(ml_dtypes.bfloat16).astype(np.float32)
    save_tensors(path, {"x": Tensor(x, "BF16")})


@pytest.mark.parametrize("ckpt", ["auto-round-w4g32-asym-auto_gptq", "llmcompressor-w8a8-int8",
                                  "llmcompressor-w4a16-g128-sym"])
def test_linear_through_the_dispatcher_names_the_backend(tmp_path, capsys, ckpt):
    layer = "model.layers.0.mlp.down_proj"
    _x(tmp_path / "x.safetensors", 128)
    rc = main(["linear", str(CKPTS / ckpt), "--layer", layer, "-i", str(tmp_path / "x.safetensors"),
               "-o", str(tmp_path / "y.safetensors"), "--backend", "auto"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "backend: " in out and "(dispatched for " in out and "inside its declared interval: yes" in out
    assert "level: " in out
    for line in out.splitlines():
        if line.startswith("level: "):
            assert not line.startswith("level: semantic")
    assert (tmp_path / "y.safetensors").exists()


def test_linear_backend_usage_errors(tmp_path, capsys):
    _x(tmp_path / "x.safetensors", 128)
    base = ["linear", str(CKPTS / "llmcompressor-w8a8-int8"), "--layer", "model.layers.0.mlp.down_proj",
            "-i", str(tmp_path / "x.safetensors"), "-o", str(tmp_path / "y.safetensors")]
    assert main(base + ["--backend", "nosuch"]) == 2
    assert "nosuch" in capsys.readouterr().err
    assert main(base + ["--backend", "auto", "--variant", "act_rounding=rhaz"]) == 2
    assert "--variant" in capsys.readouterr().err
    assert not (tmp_path / "y.safetensors").exists()
    # a GPTQModel packed-add v1 layer has no Case: refused by name, not run under another meaning
    rc = main(["linear", str(CKPTS / "gptqmodel-rtn-w4g32-asym-gptq"), "--layer", "model.layers.0.mlp.down_proj",
               "-i", str(tmp_path / "x.safetensors"), "-o", str(tmp_path / "y.safetensors"), "--backend", "auto"])
    assert rc == 2 and "packed-add" in capsys.readouterr().err
