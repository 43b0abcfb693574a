"""``qconform model``: whole-model forward passes (docs/fallback.md#run-a-model).

- dense Llama checkpoints written by auto-round, GPTQModel and llm-compressor, a tiny Mixtral with GPTQ
  experts (tests/fallback/make_moe_checkpoint.py) and a tiny gpt-oss with stacked MXFP4 experts
  (tests/fallback/make_gptoss_checkpoint.py) run end to end;
- with --backend emulator every quantized layer's output equals ``qconform linear`` on the same input
  bit for bit (a gpt-oss expert, which ``qconform linear`` does not take: the exactly rounded product of
  x and ``qconform dequant``'s weight, computed here with exact sums), and the logits agree with a float64 dense forward built from ``qconform dequant``'s
  weights within the bound docs/fallback.md states;
- with --backend auto the logits meet the documented model-level rule (SQNR floor);
- bad input is one line and exit 2.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conformance.cli.main import main as qconform  # noqa: E402
from emulator.checkpoint import Checkpoint  # noqa: E402
from emulator.tensorfile import load_tensors, save_tensors  # noqa: E402
from qconform_torch.model import dense_reference_model, forward_logits  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"
TOOLKIT = DATA / "toolkit_checkpoints"
MOE = DATA / "fallback" / "mixtral-gptq-w4g32-sym"
GPTOSS = DATA / "fallback" / "gptoss-mxfp4"
TOKENS = [1, 5, 9, 33, 100, 7, 8, 64]

#: dense checkpoints (one per toolkit and layer format) + the MoE one; act = declared activations
MODELS = {
    "auto-round-w4g32-sym-auto_gptq": ("a16", TOOLKIT / "auto-round-w4g32-sym-auto_gptq"),
    "auto-round-w4g128-asym-auto_awq": ("a16", TOOLKIT / "auto-round-w4g128-asym-auto_awq"),
    "gptqmodel-gptq-w4g32-sym-desc_act-gptq": ("a16", TOOLKIT / "gptqmodel-gptq-w4g32-sym-desc_act-gptq"),
    "gptqmodel-rtn-w4g32-asym-gptq": ("a16", TOOLKIT / "gptqmodel-rtn-w4g32-asym-gptq"),
    "llmcompressor-w4a16_asym-g32": ("a16", TOOLKIT / "llmcompressor-w4a16_asym-g32"),
    "llmcompressor-mxfp4a16": ("a16", TOOLKIT / "llmcompressor-mxfp4a16"),
    "llmcompressor-w8a8-int8": ("int8", TOOLKIT / "llmcompressor-w8a8-int8"),
    "quark-int4-g32-sym-reorder": ("a16", TOOLKIT / "quark" / "quark-int4-g32-sym-reorder"),
    "quark-uint4-g32-asym-order": ("a16", TOOLKIT / "quark" / "quark-uint4-g32-asym-order"),
    "quark-mxfp4-w4a4": ("mxfp4", TOOLKIT / "quark" / "quark-mxfp4-w4a4"),
    "mixtral-gptq-w4g32-sym": ("a16", MOE),
    "gptoss-mxfp4": ("a16", GPTOSS),
}

#: docs/fallback.md#comparing-logits: emulator logits vs the float64 dense forward (A16 checkpoints)
REL_BOUND_F64 = 2.0 ** -16
#: docs/fallback.md#comparing-logits: model-level SQNR floors (dB), stated there (not read from the code)
SQNR_FLOOR = {"a16": 80.0, "int8": 30.0, "mxfp4": 30.0}
#: docs/fallback.md#comparing-logits: emulator logits of an activation-quantizing checkpoint vs the float64
#: dense forward (which quantizes no activations): the activation quantization's own noise, a sanity floor
DENSE_SQNR_FLOOR = {"int8": 30.0, "mxfp4": 15.0}


def sqnr_db(y: np.ndarray, ref: np.ndarray) -> float:
    err = float(((y.astype(np.float64) - ref) ** 2).sum())
    return float("inf") if err == 0 else 10 * np.log10(float((ref.astype(np.float64) ** 2).sum()) / err)


def exact_fp32_linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w^T rounded once (RNE) to float32, from exact sums: every product of two float32 values is exact
    in float64 (48 significant bits), ``math.fsum`` rounds their exact sum once to float64, and where that
    float64 value is a float32 midpoint (where a second rounding could differ) the exact sum decides."""
    import math
    from fractions import Fraction

    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    for m in range(x.shape[0]):
        for n in range(w.shape[0]):
            prods = x64[m] * w64[n]
            v = math.fsum(prods)
            f = np.float32(v)
            if float(f) != v:
                lo, hi = sorted((f, np.nextafter(f, np.float32(np.inf if float(f) < v else -np.inf))))
                mid = (Fraction(float(lo)) + Fraction(float(hi))) / 2
                if Fraction(v) == mid:  # the double sits on a midpoint: the exact sum decides
                    exact = sum(Fraction(float(p)) for p in prods)
                    f = lo if exact < mid else hi if exact > mid else f  # an exact tie: RNE, as np.float32 did
            y[m, n] = f
    return y


def _run(tmp_path, ckpt, backend, *extra) -> dict:
    out = tmp_path / f"out-{backend}.safetensors"
    rc = qconform(["model", str(ckpt), "--tokens", ",".join(map(str, TOKENS)), "--backend", backend,
                   "-o", str(out), *extra])
    assert rc == 0
    return {k: t.data for k, t in load_tensors(out).items()}


@pytest.fixture(scope="module")
def emulator_runs(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = _run(tmp_path_factory.mktemp(name), MODELS[name][1], "emulator", "--layers")
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(MODELS))
def test_emulator_layers_equal_qconform_linear(name, emulator_runs, tmp_path):
    out = emulator_runs(name)
    ckpt = MODELS[name][1]
    logits = out["logits"]
    assert logits.dtype == np.float32 and logits.shape == (len(TOKENS), 128)
    ck = Checkpoint(ckpt)
    layers = [l.name for l in ck.layers()]
    seen = {k[2:].split("#")[0] for k in out if k.startswith("y.")}
    if name.startswith("mixtral"):  # every expert is routed some token for these ids (top-2 of 4, 8 tokens)
        assert seen == set(layers)
    elif name.startswith("gptoss"):  # every expert of every stacked layer, as NAME[e]
        assert seen == {f"{l}[{e}]" for l in layers for e in range(4)} and len(layers) == 4
    else:
        assert seen == set(layers) and len(layers) >= 6  # Quark's int4 export leaves one linear unquantized
    dequant = {}
    for key in sorted(k for k in out if k.startswith("x.")):
        tag = key[2:]
        layer = tag.split("#")[0]
        if layer.endswith("]"):  # a stacked expert: exact oracle on `qconform dequant`'s [E, N, K] weight
            layer, e = layer[:-1].split("[")
            if layer not in dequant:
                wout = tmp_path / "w.safetensors"
                assert qconform(["dequant", str(ckpt), "--layer", layer, "-o", str(wout)]) == 0
                dequant[layer] = load_tensors(wout)["weight"].data
            np.testing.assert_array_equal(out["y." + tag], exact_fp32_linear(out[key], dequant[layer][int(e)]),
                                          err_msg=f"{name} {tag}")
            continue
        xin, yout = tmp_path / "x.safetensors", tmp_path / "y.safetensors"
        save_tensors(xin, {"x": out[key]})
        assert qconform(["linear", str(ckpt), "--layer", layer, "-i", str(xin), "-o", str(yout)]) == 0
        np.testing.assert_array_equal(out["y." + tag], load_tensors(yout)["y"].data, err_msg=f"{name} {tag}")


@pytest.mark.parametrize("name", list(MODELS))
def test_emulator_logits_vs_float64_dense_forward(name, emulator_runs):
    act, ckpt = MODELS[name]
    logits = emulator_runs(name)["logits"].astype(np.float64)
    ref64, _ = forward_logits(dense_reference_model(ckpt, dtype=torch.float64), TOKENS)
    ref64 = ref64.double().numpy()
    if act == "a16":
        err = np.abs(logits - ref64).max()
        assert err <= REL_BOUND_F64 * np.abs(ref64).max(), (name, err)
    else:  # int8 / MXFP4 activations: the dense float64 forward has none; only the SQNR floor applies
        assert sqnr_db(logits, ref64) >= DENSE_SQNR_FLOOR[act], name
        assert np.abs(logits - ref64).max() > 0  # the activation quantization is really applied


@pytest.mark.parametrize("name", list(MODELS))
def test_auto_within_model_level_rule(name, emulator_runs, tmp_path):
    act, ckpt = MODELS[name]
    ref = emulator_runs(name)["logits"]
    auto = _run(tmp_path, ckpt, "auto")["logits"]
    assert sqnr_db(auto, ref) >= SQNR_FLOOR[act], (name, sqnr_db(auto, ref))
    assert np.array_equal(np.argmax(auto, axis=1), np.argmax(ref, axis=1)) or act != "a16"


def test_check_flag_applies_the_rule(tmp_path, capsys, monkeypatch):
    out = tmp_path / "o.safetensors"
    assert qconform(["model", str(MOE), "--tokens", "1,5,9", "--check", "-o", str(out)]) == 0
    assert "within the model-level rule" in capsys.readouterr().out
    # a backend whose numbers are off must fail the check: raise the floor above any finite SQNR
    from qconform_torch import cli as model_cli

    monkeypatch.setitem(model_cli.SQNR_FLOOR_DB, "a16", 1e9)
    assert qconform(["model", str(MOE), "--tokens", "1,5,9", "--check", "-o", str(out)]) == 1
    assert "OUTSIDE the model-level rule" in capsys.readouterr().out


def test_refused_activation_scheme_is_one_line_exit_2(tmp_path, capsys):
    """Quark's dynamic int8 activations (scale amax / 127.5) are not a defined scheme: `qconform linear`
    refuses them without --act, and so does a whole-model run, naming the layer (never a silent other scheme)."""
    out = tmp_path / "o.safetensors"
    assert qconform(["model", str(TOOLKIT / "quark" / "quark-int8-w8a8"), "--tokens", "1,2", "--backend", "emulator",
                     "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Quark dynamic int8" in err and "self_attn" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_dense_reference_is_not_the_module_path():
    """The float64 comparison is meaningful only if the dense model really holds the dequantized
    weights: a zeroed quantized weight must change its logits (a check the bound test relies on)."""
    m = dense_reference_model(MOE)
    a, _ = forward_logits(m, TOKENS)
    with torch.no_grad():
        m.model.layers[0].self_attn.o_proj.weight.zero_()
    b, _ = forward_logits(m, TOKENS)
    assert not torch.equal(a, b)


def test_bad_tokens_and_missing_tensor_exit_2(tmp_path, capsys):
    out = tmp_path / "o.safetensors"
    assert qconform(["model", str(MOE), "--tokens", "1,500", "-o", str(out)]) == 2
    assert "outside the vocabulary" in capsys.readouterr().err
    assert qconform(["model", str(MOE), "--tokens", "1,x", "-o", str(out)]) == 2
    assert qconform(["model", str(MOE), "--tokens", "1", "--backend", "nosuch", "-o", str(out)]) == 2
    # a checkpoint without its final norm: an error naming the tensor, never a random weight
    bad = tmp_path / "bad"
    shutil.copytree(MOE, bad)
    t = {k: v for k, v in load_tensors(bad / "model.safetensors").items() if k != "model.norm.weight"}
    save_tensors(bad / "model.safetensors", t)
    capsys.readouterr()
    assert qconform(["model", str(bad), "--tokens", "1,2", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "model.norm.weight" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_a_skip_list_shared_by_every_layer_is_printed_once(capsys):
    from qconform_torch.cli import print_choices

    skip = " (skipped: ark, zentorch: no certification bundle given for it)"
    print_choices({"a": ["w8a8 ct -> torch-cpu [timed]" + skip], "b": ["w8a8 ct -> emulator fast path [timed]" + skip]})
    out = capsys.readouterr().out.splitlines()
    assert out == ["  every layer skipped: ark, zentorch: no certification bundle given for it",
                   "  a: w8a8 ct -> torch-cpu [timed]", "  b: w8a8 ct -> emulator fast path [timed]"]
    print_choices({"a": ["x -> y" + skip], "b": ["x -> z (skipped: ark: cannot implement it)"]})
    out = capsys.readouterr().out.splitlines()  # different reasons: each line keeps its own
    assert out == ["  a: x -> y" + skip, "  b: x -> z (skipped: ark: cannot implement it)"]
