"""qconform reproduces the dequantized weights that real quantization toolkits compute.

The checkpoints under tests/data/toolkit_checkpoints/ were written by auto-round
0.16.1, llm-compressor 0.14.0.1 (compressed-tensors 0.19.0) and GPTQModel 7.7.0
on a tiny random Llama with planted degenerate groups, and each folder's
``toolkit_dequant.safetensors`` holds the toolkit's *own* dequantized weight of
every layer (its own unpack/dequant code; see provenance.json and the README
there). The toolkits round ``(q - z) * s`` once to a narrower dtype before
widening to fp32 (README: fp16 for auto-round int and GPTQModel, bf16 for
compressed-tensors int, none for MXFP4), so the contract is: qconform's exact
dequantized weight, rounded once with RNE to that dtype, equals the toolkit's
weight element for element (toolkits wrote -0 as +0, so values are compared).
"""

import json
from pathlib import Path

import numpy as np
import pytest

from emulator.checkpoint import Checkpoint
from emulator.layers import dequantize_layer
from emulator.numerics.floats import round_to_dtype
from emulator.tensorfile import load_tensors

ROOT = Path(__file__).resolve().parents[1] / "data" / "toolkit_checkpoints"
FOLDERS = sorted(p for p in ROOT.iterdir() if (p / "config.json").exists()) if ROOT.exists() else []

# The one rounding each toolkit's dequant applies (from each toolkit's dequant code, recorded in the README).
TOOLKIT_ROUNDING = {
    ("auto-round", "gptq"): "float16",
    ("auto-round", "awq"): "float16",
    ("gptqmodel", "gptq"): "float16",
    ("llmcompressor", "ct-pack-quantized"): "bfloat16",
    ("llmcompressor", "ct-int-quantized"): "bfloat16",
    ("auto-round", "ct-mxfp4"): None,
    ("llmcompressor", "ct-mxfp4"): None,
}

# What each folder must be detected as, from its provenance (toolkit, export format, scheme).
EXPECTED_FORMAT = {
    "auto-round-mxfp4-auto_round": ("ct-mxfp4", None),
    "auto-round-mxfp4-llm_compressor": ("ct-mxfp4", None),
    "auto-round-w4g128-asym-auto_awq": ("awq", "literal"),
    "auto-round-w4g32-asym-auto_gptq": ("gptq", "v1"),
    "auto-round-w4g32-asym-auto_round": ("awq", "literal"),
    "auto-round-w4g32-sym-auto_gptq": ("gptq", "v1"),
    "auto-round-w4g32-sym-auto_round": ("gptq", "v1"),
    "gptqmodel-gptq-w4g32-sym-desc_act-gptq": ("gptq", "v1-packed"),
    "gptqmodel-rtn-w4g32-asym-gptq": ("gptq", "v1-packed"),
    "gptqmodel-rtn-w4g32-asym-gptq_v2": ("gptq", "v2"),
    "llmcompressor-mxfp4a16": ("ct-mxfp4", None),
    "llmcompressor-w4a16-g128-sym": ("ct-pack-quantized", "offset"),
    "llmcompressor-w4a16_asym-g32": ("ct-pack-quantized", "offset"),
    "llmcompressor-w8a8-int8": ("ct-int-quantized", None),
}


def _toolkit(folder: Path) -> str:
    return json.loads((folder / "provenance.json").read_text())["toolkit"]


def test_fixture_present():
    assert len(FOLDERS) >= 10, f"toolkit checkpoints missing under {ROOT}"
    assert {_toolkit(f) for f in FOLDERS} >= {"auto-round", "llmcompressor", "gptqmodel"}


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_detection_matches_provenance(folder):
    ck = Checkpoint(folder)
    fmt, conv = EXPECTED_FORMAT[folder.name]
    layers = ck.layers()
    assert len(layers) == 7  # q, k, v, o, gate, up, down of the one decoder layer
    for info in layers:
        assert (info.format, info.zero_convention) == (fmt, conv), info.name
    scheme = json.loads((folder / "provenance.json").read_text()).get("scheme", {})
    if "group_size" in scheme and fmt != "ct-mxfp4":
        assert {l.group_size for l in layers} == {scheme["group_size"]}
    if "sym" in scheme:
        assert {l.sym for l in layers} == {scheme["sym"]}


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_dequant_reproduces_toolkit_bit_exactly(folder):
    ck = Checkpoint(folder)
    ref = load_tensors(folder / "toolkit_dequant.safetensors")
    toolkit = _toolkit(folder)
    checked = 0
    for info in ck.layers():
        ours = dequantize_layer(ck, info)
        theirs = ref[info.name + ".weight"].data
        rounding = TOOLKIT_ROUNDING[(toolkit, info.format)]
        expect = ours if rounding is None else round_to_dtype(ours, rounding).astype(np.float32)
        bad = expect != theirs
        assert not bad.any(), (
            f"{info.name}: {int(bad.sum())} element(s) differ; first at {np.argwhere(bad)[0].tolist()}: "
            f"qconform {expect[bad][0]!r} vs {toolkit} {theirs[bad][0]!r}")
        checked += 1
    assert checked == 7


def test_gptqmodel_v1_needs_the_packed_add_reading():
    """GPTQModel's v1 files hold borrowed nibbles where a zero point is 0: the canonical per-field
    v1 reading disagrees with GPTQModel's own dequant there, the packed reading agrees."""
    from emulator.formats import gptq

    folder = ROOT / "gptqmodel-rtn-w4g32-asym-gptq"
    ck = Checkpoint(folder)
    ref = load_tensors(folder / "toolkit_dequant.safetensors")
    differs = 0
    for info in ck.layers():
        t = ck.layer_tensors(info)
        p = gptq.GptqParams(bits=4, group_size=info.group_size, sym=False, zero_convention="gptq")
        tens = gptq.GptqTensors(t["qweight"].data, t["qzeros"].data, t["scales"].data, t["g_idx"].data)
        canon = round_to_dtype(gptq.dequantize_gptq(tens, p, shape=info.shape), "float16")
        differs += int((canon != ref[info.name + ".weight"].data).sum())
    assert differs > 0


def test_v2_and_v1_exports_of_gptqmodel_agree():
    a = Checkpoint(ROOT / "gptqmodel-rtn-w4g32-asym-gptq")
    b = Checkpoint(ROOT / "gptqmodel-rtn-w4g32-asym-gptq_v2")
    for info in a.layers():
        np.testing.assert_array_equal(dequantize_layer(a, info), dequantize_layer(b, b.layer(info.name)))
