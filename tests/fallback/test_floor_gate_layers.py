"""``qconform model --check``: the per-layer floor gate checks every layer dispatched to a kernel, not only the first
of its shape class (docs/fallback.md#the-dispatcher). The measured dispatcher times a kernel on the first layer of
each shape class and keeps that choice for the class; a kernel that is right there and wrong on a later layer of
the class must not answer for that later layer."""

from __future__ import annotations

import hashlib
import sys
import types
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from backends.base import Availability, Backend, Declared, Prepared, yes  # noqa: E402
from backends.dispatch import MeasuredFastest  # noqa: E402
from backends.registry import create  # noqa: E402
from conformance.cli.main import main as qconform  # noqa: E402
from qconform_torch import op  # noqa: E402

CKPT = Path(__file__).resolve().parents[2] / "tests" / "data" / "toolkit_checkpoints" / "llmcompressor-w4a16-g128-sym"


class _RightOnFirstOfClass(Backend):
    """Declares the canonical arithmetic; answers the fast path's output exactly on the first layer of each [N, K]
    it prepares and with 1e-3 relative noise (about 60 dB, below the per-layer floor) on every later one."""

    name = "late-wrong"
    covers = "test"
    priority = 1000
    first: dict = {}  # (N, K) -> digest of the first layer's tensors

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
        h = hashlib.sha256(b"".join(np.ascontiguousarray(np.asarray(getattr(t, "data", t))).tobytes()
                                    for _, t in sorted(tensors.items()))).hexdigest()
        wrong = self.first.setdefault((case.N, case.K), h) != h
        return Prepared(case, {"emu": self.emu.prepare(case, tensors), "wrong": wrong})

    def run(self, prepared, x, **inputs):
        y = np.asarray(self.emu.run(prepared.data["emu"], x, **inputs), np.float32)
        if prepared.data["wrong"]:
            y = y * (1 + 1e-3 * np.random.default_rng(0).standard_normal(y.shape)).astype(np.float32)
        return y


@pytest.fixture
def late_wrong(monkeypatch):
    mod = types.ModuleType("qconform_floor_fakes")
    mod.LateWrong = _RightOnFirstOfClass
    _RightOnFirstOfClass.first = {}
    monkeypatch.setitem(sys.modules, "qconform_floor_fakes", mod)
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", "late-wrong=qconform_floor_fakes:LateWrong")
    op.clear_selections()
    yield
    op.clear_selections()


def test_every_layer_of_a_shape_class_meets_the_floor(late_wrong, tmp_path, capsys, monkeypatch):
    """The kernel takes every layer by priority (timing off: the choice does not depend on this host's speed,
    and no layer's output comes from a timing run), so only the per-layer gate stands between the later layers
    and its wrong answers (tests/backends/test_dispatch.py checks the same for a choice timed on the first layer
    of a class and reused by the next)."""
    monkeypatch.setattr(MeasuredFastest, "timed", False)
    rc = qconform(["model", str(CKPT), "--tokens", "1,2,3", "--check", "-o", str(tmp_path / "o.safetensors")])
    out = capsys.readouterr().out
    assert rc == 0 and "fast path re-run" not in out, out
    lines = {l.split(":", 1)[0].strip(): l for l in out.splitlines() if "ct-pack-quantized ->" in l}
    assert len(lines) == 7, out
    kernel = [n for n, l in lines.items() if "-> late-wrong [" in l]
    gated = [n for n, l in lines.items() if "-> emulator fast path" in l and "late-wrong: " in l
             and "dB against the reference on this layer's first input, below the" in l]
    # two shape classes ([128, 128]: five layers, [32, 128]: two): the first layer of each keeps the kernel,
    # every later one was run once on its own input, found below the floor and put on the fast path
    assert len(kernel) == 2 and len(gated) == 5, out
    assert set(_RightOnFirstOfClass.first) == {(128, 128), (32, 128)}
