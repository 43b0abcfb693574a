"""``auto`` in the op: the measured dispatcher on real checkpoints (docs/fallback.md#the-dispatcher).

- a layer goes to the fastest *admitted* contender, timed against the emulator's fast path, and the choice
  line says what was measured; admission is judged on the layer's own tensors (a symmetric GPTQ layer whose
  qzeros are all the midpoint may go to a kernel that ignores qzeros; the same layer with one other qzeros
  field may not);
- a second process reads the choices from this host's dispatch cache instead of timing again;
- llm-compressor's actorder "weight" without weight_g_idx (issue 22 item 11) runs under auto (its format is
  that of no act order: compressed-tensors quant_args.py ActivationOrdering), bit for bit the same reference
  as the checkpoint without actorder; a kernel that fails is named with its layer;
- with --check, logits below the model-level floor are never the answer: auto's run is redone on the fast path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from backends.base import Availability, Backend, Declared, Prepared, yes  # noqa: E402
from backends.dispatch import Dispatcher, MeasuredFastest  # noqa: E402
from backends.registry import create  # noqa: E402
from conformance.cli.main import main as qconform  # noqa: E402
from emulator.checkpoint import Checkpoint  # noqa: E402
from emulator.tensorfile import load_tensors  # noqa: E402
from qconform_torch import QuantLinear, op  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TOOLKIT = ROOT / "tests" / "data" / "toolkit_checkpoints"


@pytest.fixture(autouse=True)
def _fresh_dispatch():
    op.clear_selections()
    op.use_certifications(None)
    yield
    op.clear_selections()
    op.use_certifications(None)


def _line(m) -> str:
    return " ".join(op.selection_lines(m.spec))


def test_midpoint_qzeros_admit_kernels_that_ignore_them_and_only_then():
    if not create("torch-cpu").availability().available:
        pytest.skip("torch-cpu unavailable: no kernel here ignores qzeros")
    ck = Checkpoint(TOOLKIT / "auto-round-w4g32-sym-auto_gptq")
    info = ck.layer("model.layers.0.mlp.down_proj")
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((3, info.shape[1])).astype(np.float32))
    m = QuantLinear.from_checkpoint(ck, info.name, backend="auto")
    m(x)
    line = _line(m)
    # every field is the symmetric midpoint (auto-round wrote them so): torch-cpu was timed, not skipped
    assert "timed at M = 3: " in line and "torch-cpu " in line.split("timed at M = 3: ", 1)[1].split("]")[0], line
    assert "ignore_qzeros" not in line, line
    tensors = dict(zip(op.roles(info), m.weights()))
    qz = tensors["qzeros"].clone()
    qz[0, 0] ^= 1  # one zero point off the midpoint: ignoring qzeros now changes this layer's numbers
    odd = QuantLinear(info, dict(tensors, qzeros=qz), backend="auto")
    op.clear_selections()  # the same layer description: its lines would be kept once per chosen backend
    odd(x)
    line = _line(odd)
    assert "torch-cpu: " in line and "zero_read=ignore_qzeros" in line and "semantic deviation" in line, line
    from emulator.layers import linear_layer

    # the answer is the fast path's: within fp32 accumulation of the reference of the *odd* layer
    class Odd:
        def tensor(self, name, *, layer=None):
            t = ck.tensor(name, layer=layer)
            return type(t)(qz.numpy(), t.dtype) if name == info.tensors["qzeros"] else t

        def layer_tensors(self, i):
            return {r: self.tensor(n) for r, n in i.tensors.items()}

    ref = linear_layer(Odd(), info, x.numpy(), out_dtype="float32").y
    y = odd(x).numpy()
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()


def _model(args, env=None):
    return subprocess.run([sys.executable, "-m", "conformance.cli.main", "model", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, cwd=ROOT, timeout=600)


def test_a_second_process_reads_the_host_cache(tmp_path):
    ckpt = TOOLKIT / "llmcompressor-w4a16-g128-sym"
    env = {"QCONFORM_DISPATCH_CACHE": str(tmp_path / "cache")}
    args = [str(ckpt), "--tokens", "1,2,3", "-o", str(tmp_path / "o.safetensors")]
    first = _model(args, env)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "timed at M = 3: " in first.stdout and "dispatch cache" not in first.stdout, first.stdout
    files = list((tmp_path / "cache").glob("dispatch-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["choices"]
    second = _model(args, env)
    assert second.returncode == 0, second.stderr[-2000:]
    lines = [l for l in second.stdout.splitlines() if "ct-pack-quantized ->" in l]
    assert len(lines) == 7 and all("this host's dispatch cache: " in l for l in lines), second.stdout
    assert "timed at M" not in second.stdout


def _actorder_weight(tmp_path) -> Path:
    """llm-compressor's W4A16 checkpoint with actorder "weight" in its config (the tensors unchanged: that
    actorder orders calibration only and stores no weight_g_idx)."""
    out = tmp_path / "actorder-weight"
    shutil.copytree(TOOLKIT / "llmcompressor-w4a16-g128-sym", out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["actorder"] = "weight"
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_actorder_weight_without_g_idx_runs_under_auto(tmp_path, capsys):
    ckpt = _actorder_weight(tmp_path)
    assert Checkpoint(ckpt).layers()[0].act_order  # the config says act order: the Case must not
    o = tmp_path / "o.safetensors"
    rc = qconform(["model", str(ckpt), "--tokens", "1,2,3", "--check", "-o", str(o)])
    text = capsys.readouterr().out
    assert rc == 0 and "within the model-level rule" in text, text
    layer_lines = [l for l in text.splitlines() if "ct-pack-quantized ->" in l]
    assert len(layer_lines) == 7 and not any("act_order" in l or "-> emulator reference" in l for l in layer_lines)
    # the reference of the actorder "weight" checkpoint is that of the same tensors without actorder
    for src, name in ((ckpt, "a"), (TOOLKIT / "llmcompressor-w4a16-g128-sym", "b")):
        assert qconform(["model", str(src), "--tokens", "1,2,3", "--backend", "emulator",
                         "-o", str(tmp_path / f"{name}.safetensors")]) == 0
    a = load_tensors(tmp_path / "a.safetensors")["logits"].data
    b = load_tensors(tmp_path / "b.safetensors")["logits"].data
    assert np.array_equal(a, b)


class _Failing(Backend):
    """Declares the canonical arithmetic and raises when run, as a kernel with a bug that throws would."""

    name = "failing"
    covers = "test"
    priority = 1000

    def availability(self):
        return Availability(True, "ok", "1")

    def can_implement(self, case):
        return yes()

    def declared(self, case):
        return Declared(variants={}, output=case.output_dtype)

    def prepare(self, case, tensors):
        return Prepared(case, {})

    def run(self, prepared, x, **inputs):
        raise ValueError("kernel exploded (no layer named in this message)")


class _Noisy(Backend):
    """Declares the canonical arithmetic, answers the fast path's output with 1e-3 relative noise: about
    60 dB from the reference, far below the 80 dB model-level floor of 16-bit-activation checkpoints."""

    name = "noisy"
    covers = "test"
    priority = 1000

    def __init__(self, **params):
        super().__init__(**params)
        self.emu = create("emulator")

    def availability(self):
        return Availability(True, "ok", "1")

    def can_implement(self, case):
        return yes()

    def declared(self, case):
        return Declared(variants={}, output=case.output_dtype)

    def prepare(self, case, tensors):
        return self.emu.prepare(case, tensors)

    def run(self, prepared, x, **inputs):
        y = np.asarray(self.emu.run(prepared, x, **inputs), np.float32)
        return y * (1 + 1e-3 * np.random.default_rng(0).standard_normal(y.shape)).astype(np.float32)


@pytest.fixture
def extra(monkeypatch):
    mod = types.ModuleType("qconform_measured_fakes")
    mod.Failing, mod.Noisy = _Failing, _Noisy
    monkeypatch.setitem(sys.modules, "qconform_measured_fakes", mod)
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", "failing=qconform_measured_fakes:Failing,"
                                                  "noisy=qconform_measured_fakes:Noisy")


def test_a_failing_kernel_is_named_with_its_layer(extra, tmp_path, capsys):
    ckpt = str(TOOLKIT / "llmcompressor-w4a16-g128-sym")
    o = str(tmp_path / "o.safetensors")
    rc = qconform(["model", ckpt, "--tokens", "1,2", "--backend", "failing", "-o", o])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith("qconform model: model.layers.0.") and "kernel exploded" in err[0], err
    rc = qconform(["model", ckpt, "--tokens", "1,2", "--backend", "auto", "-o", o])
    out = capsys.readouterr().out
    lines = [l for l in out.splitlines() if "ct-pack-quantized ->" in l]
    assert rc == 0 and len(lines) == 7, out
    # timed and failed at the first layer of its shape class, then left out of that class: named either way
    assert all("failing: failed when " in l and "(ValueError: kernel exploded" in l and "-> failing" not in l
               for l in lines), out


def test_logits_below_the_floor_are_never_the_answer(extra, tmp_path, capsys, monkeypatch):
    """The noisy kernel, chosen by priority (timing and the per-layer floor gate off: it stands for a kernel
    that meets the floor on each layer's first input and not later), takes every layer; --check finds the
    logits below the floor and the run is redone on the fast path, whose logits are written and within the
    rule."""
    monkeypatch.setattr(MeasuredFastest, "timed", False)
    monkeypatch.setattr(Dispatcher, "_floor_gate", lambda self, case, choice, *a: choice)
    ckpt = str(TOOLKIT / "llmcompressor-w4a16-g128-sym")
    o = tmp_path / "o.safetensors"
    rc = qconform(["model", ckpt, "--tokens", "1,2,3", "--check", "-o", str(o)])
    out = capsys.readouterr().out
    assert rc == 0, out
    first, rerun = [l for l in out.splitlines() if l.startswith("check")]
    assert "OUTSIDE the model-level rule" in first and first.startswith("check: ")
    assert rerun.startswith("check (fast path re-run): ") and "within the model-level rule" in rerun
    lines = [l for l in out.splitlines() if "ct-pack-quantized ->" in l]
    assert len(lines) == 7 and all("-> emulator fast path" in l and "below its 80 dB floor" in l for l in lines)
    monkeypatch.setattr(MeasuredFastest, "timed", True)
    ref = tmp_path / "ref.safetensors"
    assert qconform(["model", ckpt, "--tokens", "1,2,3", "--backend", "emulator", "-o", str(ref)]) == 0
    y, r = (load_tensors(p)["logits"].data.astype(np.float64) for p in (o, ref))
    assert 10 * np.log10((r ** 2).sum() / max(((y - r) ** 2).sum(), 1e-300)) >= 80


def test_the_floor_gate_keeps_a_noisy_kernel_out_per_layer(extra, tmp_path, capsys):
    """With --check the measured dispatcher compares each contender's first output with the layer's
    reference: the noisy kernel (about 60 dB) never takes a layer, so no re-run is needed."""
    ckpt = str(TOOLKIT / "llmcompressor-w4a16-g128-sym")
    rc = qconform(["model", ckpt, "--tokens", "1,2,3", "--check", "-o", str(tmp_path / "o.safetensors")])
    out = capsys.readouterr().out
    assert rc == 0 and "fast path re-run" not in out, out
    lines = [l for l in out.splitlines() if "ct-pack-quantized ->" in l]
    assert len(lines) == 7 and all("noisy: " in l and "dB against the reference on this input, below the" in l
                                   for l in lines), out


class _Slow(_Noisy):
    """Declares the canonical arithmetic and answers the emulator's output 50 ms late: it loses every timing."""

    name = "slowcanon"

    def run(self, prepared, x, **inputs):
        import time

        time.sleep(0.05)
        return self.emu.run(prepared, x, **inputs)


def test_a_contender_that_lost_the_timing_leaves_nothing_in_the_cache(monkeypatch):
    """What the dispatcher prepared only to time a contender is dropped once another wins: its request counts
    from the timing runs would otherwise outrank the chosen path's entries when the model outgrows the budget
    (found by reading op.py: auto at T = 128 ran 1.3x the fast path in the model bench)."""
    mod = types.ModuleType("qconform_slow_fake")
    mod.Slow = _Slow
    monkeypatch.setitem(sys.modules, "qconform_slow_fake", mod)
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", "slowcanon=qconform_slow_fake:Slow")
    monkeypatch.setenv("QCONFORM_DISPATCH_CACHE", "off")
    op.set_cache_budget(op.DEFAULT_CACHE_MB)
    ck = Checkpoint(TOOLKIT / "llmcompressor-w4a16-g128-sym")
    info = ck.layer("model.layers.0.mlp.down_proj")
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((3, info.shape[1])).astype(np.float32))
    m = QuantLinear.from_checkpoint(ck, info.name, backend="auto")
    m(x)
    line = _line(m)
    assert "slowcanon" in line.split("timed at M = 3: ", 1)[1], line  # it was timed, and lost
    kept = [what for spec, what in op.cached_entries() if spec == m.spec]
    assert kept and not any("slowcanon" in w for w in kept), kept
    m(x)  # the next call of the class runs the chosen path alone: still nothing of the loser
    assert not any("slowcanon" in w for spec, w in op.cached_entries() if spec == m.spec)


def test_auto_on_the_fast_path_skips_the_dispatcher_only_while_its_choice_stands(monkeypatch):
    """Where auto's choice for a layer's shape class is the fast path, later calls of the class take the fast
    path's lane without asking the dispatcher again (no kernel to judge); a policy change, another shape class
    or an in-place write to the weights asks again, and every answer is the fast path's own."""
    monkeypatch.setenv("QCONFORM_DISPATCH_CACHE", "off")
    asked = []
    real = Dispatcher.choose
    monkeypatch.setattr(Dispatcher, "choose", lambda self, case, **kw: asked.append(case.M) or real(self, case, **kw))
    op.set_cache_budget(op.DEFAULT_CACHE_MB)
    op.use_fast_path_only("test: the fast path for every layer")
    try:
        ck = Checkpoint(TOOLKIT / "llmcompressor-w4a16-g128-sym")
        info = ck.layer("model.layers.0.mlp.down_proj")
        rng = np.random.default_rng(0)
        x = torch.from_numpy(rng.standard_normal((3, info.shape[1])).astype(np.float32))
        m = QuantLinear.from_checkpoint(ck, info.name, backend="auto")
        fast = QuantLinear.from_checkpoint(ck, info.name, backend="emulator:path=fast")
        want = fast(x).numpy()
        for _ in range(3):
            assert np.array_equal(m(x).numpy(), want)
        assert asked == [3]  # asked once (a measured policy's first call keeps no lane: its answer is the timing's)
        x9 = torch.from_numpy(rng.standard_normal((9, info.shape[1])).astype(np.float32))
        assert np.array_equal(m(x9).numpy(), fast(x9).numpy()) and asked[-1] == 9  # another class: asked
        op.use_fast_path_only("test: a new policy")  # a new policy: every choice is made again
        asked.clear()
        m(x)
        assert asked == [3]
        with torch.no_grad():  # an in-place write: the weights' version changes, the lane no longer matches
            for w in m.weights():
                if w.dtype == torch.int32:
                    w.bitwise_xor_(1)
                    break
        asked.clear()
        y = m(x).numpy()
        assert asked == [3] and not np.array_equal(y, want)
    finally:
        op.use_fast_path_only(None)
