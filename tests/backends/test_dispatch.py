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
from backends.registry import create, select
from conformance.cases.inputs import CaseInputs, make_inputs
from emulator.tensor_levels import activation_deviation
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
    # zentorch's weight scales (backends/zentorch.py): the checkpoint's float32 scales copied into bfloat16
    mod.Bf16Scale = _fake("bf16-scale", 60, Declared(variants={"weight_scale_dtype": "bfloat16"}, output="float32"))
    # zentorch's activation quantizer (backends/zentorch.py ACT_AMAX_EPS): amax clamped to 127e-10 first
    mod.EpsClamp = _fake("eps-clamp", 60, Declared(variants={"zero_row": "eps", "eps": EPS}, output="bfloat16"))
    # torch-cpu's W4A16 (backends/torch_cpu.py, tinygemm): a float zero point (m - z) * s kept in float16
    mod.Fp16Zero = _fake("fp16-zero", 60, Declared(variants={"dequant_order": "float_zero", "zero_dtype": "float16"},
                                                   output="float16"))
    monkeypatch.setitem(sys.modules, "qconform_dispatch_fakes", mod)
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", ",".join(
        f"{n}=qconform_dispatch_fakes:{c}" for n, c in (("per-tensor", "PerTensor"), ("defect", "Defect"),
                                                          ("literal", "Literal"), ("rounding", "Rounding"),
                                                          ("eps-clamp", "EpsClamp"), ("bf16-scale", "Bf16Scale"),
                                                          ("fp16-zero", "Fp16Zero"))))
    return mod


EPS = 1.27e-8


def test_an_amax_clamp_is_judged_on_the_activations(fakes):
    """The eps clamp is rounding level on ordinary activations and more on activations whose row range lies below
    it; the dispatcher decides on the input it is given, never on the Case alone."""
    case = Case("w8a8", "ct-int-quantized", 3, 64, 16, group_size=-1, act_dtype="float32")
    rng = np.random.default_rng(0)
    ordinary = rng.standard_normal((3, 16)).astype(np.float32)
    tiny = (ordinary * np.float32(2.0 ** -60)).astype(np.float32)
    # hand-derived: under the clamp the scale is fp32(EPS)/127, and every tiny activation is under half a step of
    # it (the codes are all 0), where the canonical scale amax/127 gives codes up to 127 in magnitude
    clamp_step = np.float64(np.float32(EPS)) / 127
    assert np.all(np.abs(tiny / clamp_step) < 0.5) and np.abs(ordinary).max() > EPS
    # a row just below the clamp: its codes move by under one step (127 * (1 - 0.999) < 0.13): still rounding
    near = (ordinary / np.abs(ordinary).max(axis=1, keepdims=True) * np.float32(0.999 * EPS)).astype(np.float32)
    # a zero row: 0 under either rule
    zero_row = np.vstack([ordinary[:2], np.zeros((1, 16), np.float32)])
    for x in (ordinary, near, zero_row, None):
        assert select(case, ["eps-clamp", "emulator"], activations=x).backend.name == "eps-clamp"
    sel = select(case, ["eps-clamp", "emulator"], activations=tiny)
    why = dict(sel.skipped)["eps-clamp"]
    assert sel.backend.name == "emulator" and "zero_row=eps" in why and "more than 2 quantization steps" in why, why
    assert "of 48 dequantized activations (3 of 3 rows)" in why, why  # every row: each has codes far from 0
    # one tiny row among ordinary ones is enough: that row's answer would not be the checkpoint's
    mixed = np.vstack([ordinary[:2], tiny[2:]])
    assert select(case, ["eps-clamp", "emulator"], activations=mixed).backend.name == "emulator"
    # the MoE block's GEMM inputs are not x, and 16-bit activations are not quantized: nothing to judge
    a16 = Case("w4a16", "ct-pack-quantized", 3, 64, 32, group_size=32)
    assert activation_deviation(Declared(variants={"zero_row": "eps", "eps": EPS}), a16, tiny[:, :1]) is None


def test_a_bfloat16_weight_scale_is_judged_on_the_layer_scales(fakes):
    """A bfloat16 copy of float32 scales is rounding level where bfloat16 holds them to within 2^-8 of themselves
    (its normal range), and more where it flushes them: subnormal bfloat16 keeps fewer bits, and below 2^-133
    nothing. The oracle is ml_dtypes' own float32 -> bfloat16 conversion."""
    import ml_dtypes

    case = Case("w8a16", "ct-int-quantized", 2, 8, 32, group_size=-1, act_dtype="float32", scale_dtype="float32")
    tensors = make_inputs(case, 0).tensors
    ordinary = tensors["weight_scale"]
    tiny = (ordinary * np.float32(2.0 ** -120)).astype(np.float32)  # ~2^-140: bfloat16 subnormal or zero
    for s, held in ((ordinary, True), (tiny, False)):
        bf = s.astype(ml_dtypes.bfloat16).astype(np.float64)
        assert bool(np.all(np.abs(bf - s) <= 2.0 ** -8 * np.abs(s))) is held  # the oracle agrees with the premise
        sel = select(case, ["bf16-scale", "emulator"], tensors=dict(tensors, weight_scale=s))
        assert (sel.backend.name == "bf16-scale") is held, sel.skipped
    why = dict(select(case, ["bf16-scale", "emulator"], tensors=dict(tensors, weight_scale=tiny)).skipped)["bf16-scale"]
    assert "weight_scale_dtype=bfloat16" in why and "bfloat16 does not hold" in why and "scales" in why, why
    # without the tensors the general level (rounding) stands: only tensors can show the flush
    assert select(case, ["bf16-scale", "emulator"]).backend.name == "bf16-scale"


def test_a_float16_float_zero_point_is_judged_on_the_layer_scales(fakes):
    """dequant_order=float_zero keeps (m - z) * s in zero_dtype (docs/formats/gptq.md): rounding level where
    float16 holds it, and more where it overflows: with a scale of 2^13 and a zero point 8 away from the midpoint
    m = 8 (z = 0), (m - z) * s = 2^16 > 65504, float16's largest finite value, so the weight becomes -Inf where
    the canonical (q - z) * s is finite. (The coverage design's extreme-scale AWQ case reached exactly this through
    torch-cpu, judged mistrusted before.)"""
    case = Case("w4a16", "gptq", 2, 8, 64, group_size=32, sym=False, act_dtype="float16", scale_dtype="float16",
                zero_convention="v2")
    tensors = make_inputs(case, 0).tensors
    zero = np.zeros_like(tensors["qzeros"])  # every packed zero point field 0: z = 0, 8 from the midpoint
    for s, held in ((np.float16(1.0), True), (np.float16(2.0 ** 13), False)):
        ts = dict(tensors, qzeros=zero, scales=np.full_like(tensors["scales"], s))
        sel = select(case, ["fp16-zero", "emulator"], tensors=ts)
        assert (sel.backend.name == "fp16-zero") is held, sel.skipped
    why = dict(select(case, ["fp16-zero", "emulator"], tensors=dict(
        tensors, qzeros=zero, scales=np.full_like(tensors["scales"], np.float16(2.0 ** 13)))).skipped)["fp16-zero"]
    assert "float16 float zero points overflow" in why and "non-finite" in why, why


def test_auto_plans_on_the_case_activations_and_refuses_others(fakes):
    """``auto`` (the suite's dispatcher) chooses on the inputs ``plan_on`` gives it; activations it did not judge
    are refused when run (a crash naming why), never answered by a kernel whose clamp bites on them."""
    case = Case("w8a8", "ct-int-quantized", 3, 64, 16, group_size=-1, act_dtype="float32")
    inp = make_inputs(case, 0)
    tiny = CaseInputs(case, 0, inp.tensors, (inp.x * np.float32(2.0 ** -60)).astype(np.float32), None)
    auto = create("auto:only=eps-clamp")
    auto.plan_on(tiny)
    assert "dispatched to emulator" in auto.declared(case).notes
    assert "zero_row=eps" in auto.declared(case).notes
    auto = create("auto:only=eps-clamp")
    auto.plan_on(inp)
    assert auto.declared(case).notes.startswith("dispatched to eps-clamp")
    prepared = auto.prepare(case, inp.tensors)
    with pytest.raises(RuntimeError, match="without these activations.*zero_row=eps"):
        auto.run(prepared, tiny.x)
    # the checkpoint tensors too: the choice was judged on the planned ones
    with pytest.raises(RuntimeError, match="other checkpoint tensors"):
        auto.prepare(case, dict(inp.tensors, weight=inp.tensors["weight"] ^ np.int8(1)))


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
    # nothing mistrusted: the extreme-scale W8A8 case whose activations lie below zentorch's declared eps clamp
    # (docs/findings.md, "auto and zentorch's eps clamp") is judged on its own activations and goes elsewhere
    assert s["totals"].get("mistrusted", 0) == 0
    for r in recs:
        assert r["verdict"] in ("pass", "pass-with-tie-flips", "quality-warning"), (r["case_id"], r["verdict"])
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


def test_the_floor_gate_checks_every_layer_of_a_shape_class(fakes, tmp_path):
    """The timed choice is kept per shape class, so a later layer of the class reuses it untimed: the floor gate
    must still run the kernel on that layer's own first input. Here the kernel is exact on the first layer and
    40 dB off on the second (rounding: 1.01 x the reference); with a 45 dB floor the second layer runs on the
    fast path, the first keeps the kernel, and a second process that reads the choice from the host cache checks
    its layers the same way."""
    from backends.dispatch import MeasuredFastest
    from backends.dispatch_cache import HostChoiceCache
    from backends.registry import dispatcher

    w8a8 = Case("w8a8", "ct-int-quantized", 4, 64, 128, group_size=-1)
    ref = {"first": np.ones(4), "second": np.full(4, 2.0)}

    def timer_for(layer):
        def timer(b, bound):
            y = ref[layer] * (1.01 if b.name == "rounding" and layer == "second" else 1.0)
            return (1e-4 if b.name == "rounding" else 1e-3), y
        return timer

    for attempt in ("timed here", "read from the host cache"):
        d = dispatcher(MeasuredFastest(HostChoiceCache(tmp_path)), candidates=["rounding", "emulator"], floor_db=45.0)
        chosen = {}
        for layer in ("first", "second", "first"):
            c = d.choose(w8a8, layer=layer, timer=timer_for(layer), reference=lambda layer=layer: ref[layer])
            chosen.setdefault(layer, []).append(c)
        assert all(c.backend.name == "rounding" and not c.fallback for c in chosen["first"]), attempt
        second = chosen["second"][0]
        assert second.fallback and second.backend.name == "emulator", attempt
        why = dict(second.skipped)["rounding"]
        assert "40.0 dB against the reference on this layer's first input, below the 45 dB floor" in why, why
        # the second layer again: its answer is kept per layer and kernel (not run again)
        c = d.choose(w8a8, layer="second", timer=lambda b, bound: pytest.fail("second layer run again"),
                     reference=lambda: ref["second"])
        assert c.fallback
