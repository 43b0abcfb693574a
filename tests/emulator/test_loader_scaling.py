"""Loader work grows linearly and stops at documented limits (issue 22 item 8; docs/checkpoints.md#limits).

Asserted through counts (patterns compiled, budget steps spent, entries parsed), never wall time: generated
checkpoints of many tiny layers and configs of many patterns."""

import json
from pathlib import Path

import numpy as np
import pytest

import emulator.saferegex as saferegex
from emulator import detect
from emulator.checkpoint import Checkpoint
from emulator.errors import UnsupportedFormatError
from emulator.tensorfile import save_tensors


def _tiny_gptq(folder: Path, n_layers: int, qc: dict) -> Path:
    """n_layers GPTQ layers of N = 8, K = 32 (one group), sym; config ``qc`` over auto-round defaults."""
    folder.mkdir(parents=True, exist_ok=True)
    t = {}
    for i in range(n_layers):
        p = f"model.layers.{i}.mlp.proj"
        t[p + ".qweight"] = np.zeros((4, 8), np.int32)
        t[p + ".qzeros"] = np.full((1, 1), 0x77777777, np.int32)
        t[p + ".scales"] = np.full((1, 8), 0.01, np.float16)
        t[p + ".g_idx"] = np.zeros(32, np.int32)
    save_tensors(folder / "model.safetensors", t)
    cfg = {"quant_method": "auto-round", "bits": 4, "group_size": 32, "sym": True, **qc}
    (folder / "config.json").write_text(json.dumps({"quantization_config": cfg}))
    return folder


class _Spy:
    """Counts compile_safe calls and the budget each detection spends."""

    def __init__(self, monkeypatch):
        self.compiled = 0
        self.spent = []
        real_compile, real_init = saferegex.compile_safe, saferegex.Budget.__init__

        def counting_compile(pattern, **kw):
            self.compiled += 1
            return real_compile(pattern, **kw)

        def tracking_init(budget, *a, **kw):
            real_init(budget, *a, **kw)
            self.spent.append(budget)

        monkeypatch.setattr(saferegex, "compile_safe", counting_compile)
        monkeypatch.setattr(saferegex.Budget, "__init__", tracking_init)

    def used(self) -> int:
        return sum(b.limit - b.left for b in self.spent)


def test_too_many_patterns_are_refused_before_any_is_compiled(tmp_path, monkeypatch):
    extra = {f"re:.*layers\\.{i}\\.mlp\\.proj$": {"bits": 4} for i in range(saferegex.MAX_CONFIG_PATTERNS + 1)}
    ck = Checkpoint(_tiny_gptq(tmp_path / "c", 2, {"extra_config": extra}))
    spy = _Spy(monkeypatch)
    with pytest.raises(UnsupportedFormatError) as e:
        ck.layers()
    assert f"{saferegex.MAX_CONFIG_PATTERNS + 1} re: patterns" in str(e.value) and spy.compiled == 0


def test_each_pattern_is_compiled_once_whatever_the_layer_count(tmp_path, monkeypatch):
    """Before: a global cache of 4096 entries, so 5,000 patterns were recompiled for every layer."""
    patterns = {f"re:.*layers\\.{i}\\.mlp\\.proj$": {"group_size": 32} for i in range(50)}
    for n_layers in (10, 40):
        saferegex._COMPILED.clear()
        ck = Checkpoint(_tiny_gptq(tmp_path / f"c{n_layers}", n_layers, {"extra_config": patterns}))
        spy = _Spy(monkeypatch)
        assert len(ck.layers()) == n_layers
        assert spy.compiled == 50


def test_plain_config_names_cost_nothing_per_layer(tmp_path, monkeypatch):
    """extra_config / ignore keys that are plain names are looked up, not scanned: the budget a detection spends
    does not grow with their number (before: layers x keys comparisons)."""
    used = []
    for n_keys in (10, 20_000):
        extra = {f"model.layers.{i}.other": {"bits": 4} for i in range(n_keys)}
        extra["model.layers.3.mlp.proj"] = {"group_size": 32}
        extra["re:.*layers\\.5\\..*"] = {"group_size": 32}
        saferegex._COMPILED.clear()  # a warm transition cache would spend less the second time
        ck = Checkpoint(_tiny_gptq(tmp_path / f"k{n_keys}", 30, {"extra_config": extra}))
        spy = _Spy(monkeypatch)
        assert len(ck.layers()) == 30
        used.append(spy.used())
    assert used[0] == used[1] > 0


def test_matching_work_is_counted_and_bounded(tmp_path, monkeypatch):
    """Every match is charged at least the characters it may read: patterns x layers x name length adds up to
    the budget and stops there with the named error (the 100k-pattern config of issue 22 took 68 s)."""
    extra = {f"re:.*layers\\.{i}\\.mlp\\.proj$": {"group_size": 32} for i in range(400)}
    ck = Checkpoint(_tiny_gptq(tmp_path / "c", 300, {"extra_config": extra}))
    monkeypatch.setattr(detect, "Budget", lambda where: saferegex.Budget(limit=2_000_000, where=where))
    with pytest.raises(UnsupportedFormatError) as e:
        ck.layers()  # 400 patterns x 300 names x 25 characters = 3,000,000 steps > 2,000,000
    assert "NFA steps" in str(e.value)


def test_later_extra_config_key_still_wins(tmp_path):
    """The lookup keeps the config's order: of two keys that apply, the later overrides the earlier."""
    extra = {"re:.*proj": {"group_size": 32, "sym": False}, "model.layers.0.mlp.proj": {"sym": True}}
    ck = Checkpoint(_tiny_gptq(tmp_path / "a", 2, {"extra_config": extra}))
    assert [l.sym for l in ck.layers()] == [True, False]
    extra = {"model.layers.0.mlp.proj": {"sym": True}, "re:.*proj": {"group_size": 32, "sym": False}}
    ck = Checkpoint(_tiny_gptq(tmp_path / "b", 2, {"extra_config": extra}))
    assert [l.sym for l in ck.layers()] == [False, False]


def _dense_header(path: Path, n: int) -> int:
    """A safetensors file of n one-byte tensors with short names (about 72 header bytes an entry, the density
    of issue 22's 99 MB / 1.5 M-entry header); returns the header length."""
    import struct

    hdr = {f"m.x{i:07d}.w": {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i in range(n)}
    h = json.dumps(hdr, separators=(",", ":")).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + bytes(n))
    return len(h)


def test_header_parse_memory_per_entry_is_bounded(tmp_path):
    """Regression gate on a measured bound (docs/checkpoints.md#limits): parsing keeps each entry as a compact
    tuple, so the parse's peak allocation stays under 700 bytes an entry and 10 bytes a header byte (before:
    830 bytes an entry, which made a 99 MB header cost 1.18 GB)."""
    import tracemalloc

    from emulator.tensorfile import read_header

    n = 20_000
    nbytes = _dense_header(tmp_path / "h.safetensors", n)
    tracemalloc.start()
    try:
        header, _ = read_header(tmp_path / "h.safetensors")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(header) == n
    assert peak / n < 700 and peak / nbytes < 10, (peak / n, peak / nbytes)
    assert header["m.x0000007.w"]["data_offsets"] == [7, 8] and header["m.x0000007.w"]["shape"] == [1]


def test_inspect_reads_each_tensor_once(tmp_path, monkeypatch):
    """The values check of inspect is linear in the layers: each tensor is read exactly once."""
    from emulator import tensorfile
    from emulator.layers import dequantize_layer

    reads = []
    real_get = tensorfile.TensorFile.get
    monkeypatch.setattr(tensorfile.TensorFile, "get", lambda self, name: reads.append(name) or real_get(self, name))
    for n_layers in (10, 30):
        reads.clear()
        ck = Checkpoint(_tiny_gptq(tmp_path / f"i{n_layers}", n_layers, {}))
        for info in ck.layers():
            dequantize_layer(ck, info)
        assert len(reads) == len(set(reads)) == 4 * n_layers
