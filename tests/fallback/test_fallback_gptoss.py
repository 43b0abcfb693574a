"""gpt-oss stacked MXFP4 experts in whole-model runs (docs/fallback.md#gpt-oss-experts).

The checkpoint (tests/data/fallback/gptoss-mxfp4, tests/fallback/make_gptoss_checkpoint.py) is checked
against transformers' own reader; the emulator run's expert semantics against transformers' own float64
forward (a mismatch in routing, interleave, clamp or bias order would exceed the stated bound); the
run's layer outputs and logits are checked in test_fallback_model.py (MODELS["gptoss-mxfp4"]).
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
from emulator.layers import dequantize_layer  # noqa: E402
from emulator.tensorfile import load_tensors, save_tensors  # noqa: E402
from qconform_torch.model import dense_reference_model, forward_logits, load_quantized_model  # noqa: E402

GPTOSS = Path(__file__).resolve().parents[1] / "data" / "fallback" / "gptoss-mxfp4"
TOKENS = [1, 5, 9, 33, 100, 7, 8, 64]
#: docs/fallback.md#comparing-logits (the A16 bound, stated there)
REL_BOUND_F64 = 2.0 ** -16
LIMIT = 7.0  # gpt-oss's swiglu_limit (config default, GptOssConfig)


def _transformers_model(dtype):
    """The checkpoint as transformers 5.24.0 reads it itself (its MXFP4 quantizer, dequantizing on CPU)."""
    from transformers import AutoModelForCausalLM, Mxfp4Config

    m = AutoModelForCausalLM.from_pretrained(str(GPTOSS), quantization_config=Mxfp4Config(dequantize=True),
                                             dtype=dtype)
    m.config._attn_implementation = "eager"
    m.config._experts_implementation = "eager"
    return m.eval()


def test_checkpoint_is_what_transformers_reads():
    """transformers' own loader dequantizes every expert to qconform's weight bit for bit (its W^T layout),
    and its float64 forward is the float64 dense reference built from `qconform dequant`'s weights."""
    assert (GPTOSS / "model.safetensors").stat().st_size < 1 << 20
    m = _transformers_model(torch.float64)
    ck = Checkpoint(GPTOSS)
    layers = ck.layers()
    assert len(layers) == 4 and all(l.format == "gptoss-mxfp4" for l in layers)
    for info in layers:
        parent, proj = info.name.rsplit(".", 1)
        theirs = getattr(m.get_submodule(parent), proj).detach().numpy()
        np.testing.assert_array_equal(theirs, dequantize_layer(ck, info).astype(np.float64).transpose(0, 2, 1),
                                      err_msg=info.name)
    a, _ = forward_logits(m, TOKENS)
    b, _ = forward_logits(dense_reference_model(GPTOSS), TOKENS)
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_emulator_run_vs_transformers_float32_and_float64():
    """The emulator run is within the stated bound of transformers' float64 forward of the same checkpoint,
    and as close to it as transformers' own float32 forward is (same order of error)."""
    model, _ = load_quantized_model(GPTOSS, backend="emulator")
    ours, _ = forward_logits(model, TOKENS)
    ref = forward_logits(_transformers_model(torch.float64), TOKENS)[0].double().numpy()
    tf32 = forward_logits(_transformers_model(torch.float32), TOKENS)[0].double().numpy()
    scale = np.abs(ref).max()
    err_ours = np.abs(ours.double().numpy() - ref).max()
    err_tf32 = np.abs(tf32 - ref).max()
    assert err_ours <= REL_BOUND_F64 * scale
    assert err_ours <= 8 * err_tf32 + 1e-12 * scale, (err_ours, err_tf32)


def test_clamps_are_reached_and_matter(tmp_path):
    """The tokens drive gate and up pre-activations beyond +-limit (so the comparison above covers the
    clamped SwiGLU), and removing the clamp moves the logits far outside the bound (the check can fail)."""
    out = tmp_path / "o.safetensors"
    assert qconform(["model", str(GPTOSS), "--tokens", ",".join(map(str, TOKENS)), "--backend", "emulator",
                     "--layers", "-o", str(out)]) == 0
    t = {k: v.data for k, v in load_tensors(out).items()}
    bias = {k: v.data for k, v in load_tensors(GPTOSS / "model.safetensors").items() if k.endswith("gate_up_proj_bias")}
    gate_hi = up_out = 0
    for key, y in t.items():
        if key.startswith("y.") and ".gate_up_proj[" in key:
            layer, e = key[2:-1].split("[")
            h = y + bias[layer + "_bias"][int(e)].astype(np.float32)
            gate_hi += int((h[:, 0::2] > LIMIT).sum())
            up_out += int((np.abs(h[:, 1::2]) > LIMIT).sum())
    assert gate_hi > 0 and up_out > 0, (gate_hi, up_out)

    model, _ = load_quantized_model(GPTOSS, backend="emulator")
    a, _ = forward_logits(model, TOKENS)
    for layer in model.model.layers:
        layer.mlp.experts.limit = float("inf")
    b, _ = forward_logits(model, TOKENS)
    assert np.abs((a - b).double().numpy()).max() > 100 * REL_BOUND_F64 * float(a.abs().max())


def test_auto_equals_the_reference_and_logs_why():
    """No kernel takes stacked experts: --backend auto runs the reference, and says so once per layer."""
    from qconform_torch import op

    model, _ = load_quantized_model(GPTOSS, backend="auto")
    a, _ = forward_logits(model, TOKENS)
    b, _ = forward_logits(load_quantized_model(GPTOSS, backend="emulator")[0], TOKENS)
    assert torch.equal(a, b)
    lines = op.selections()["model.layers.0.mlp.experts.gate_up_proj"]
    assert len(lines) == 1 and "emulator reference" in lines[0]  # once per layer, not once per expert


def test_bad_gptoss_checkpoints_exit_2(tmp_path, capsys):
    out = tmp_path / "o.safetensors"
    bad = tmp_path / "bad"
    shutil.copytree(GPTOSS, bad)
    t = load_tensors(bad / "model.safetensors")
    # an expert bias the checkpoint lacks: one line naming it, never a random weight
    save_tensors(bad / "model.safetensors", {k: v for k, v in t.items() if k != "model.layers.1.mlp.experts.down_proj_bias"})
    assert qconform(["model", str(bad), "--tokens", "1,2", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "model.layers.1.mlp.experts.down_proj_bias" in err and len(err.strip().splitlines()) == 1
    # a block with gate_up_proj but no down_proj
    save_tensors(bad / "model.safetensors", {k: v for k, v in t.items() if ".1.mlp.experts.down_proj_" not in k})
    assert qconform(["model", str(bad), "--tokens", "1,2", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "model.layers.1.mlp.experts" in err and "down_proj" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
