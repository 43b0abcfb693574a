"""Every variant of the vocabulary reaches `qconform linear --variant` (docs/variants.md): the test enumerates
the keys and values from their definition (emulator/variants.py) and runs each on a real toolkit layer it
applies to; a variant that does not apply is refused by name, never silently unused."""

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from conformance.cli.checkpoint_cmds import LINEAR_FIELDS
from conformance.cli.main import main
from emulator.tensorfile import Tensor, load_tensors, save_tensors
from emulator.variants import AXES

CKPTS = Path(__file__).resolve().parents[2] / "tests" / "data" / "toolkit_checkpoints"
LAYER = "model.layers.0.mlp.down_proj"
#: where each stage runs: (checkpoint folder, --act)
WHERE = {"weights": ("auto-round-w4g32-asym-auto_gptq", "a16"), "gemm": ("auto-round-w4g32-asym-auto_gptq", "a16"),
         "epilogue": ("auto-round-w4g32-asym-auto_gptq", "a16"),
         "int8-activations": ("llmcompressor-w8a8-int8", "int8"), "mx-activations": ("llmcompressor-mxfp4a16", "mxfp4")}
#: values only defined together with another
COMPANION = {("azp_before_rounding", "true"): ["act_symmetric=false"], ("zero_row", "eps"): ["eps=1e-7"]}


def _values(a):
    if a.values:
        return [str(v) for v in a.values]
    if a.kind == "int":
        return [str(a.bounds[0]), str(a.bounds[1])]
    return {"bool": ["true", "false"], "float": ["1e-07"]}[a.kind]


KEYS = [k for k, a in AXES.items() if not a.field or k in LINEAR_FIELDS]
CASES = [(k, v) for k in KEYS for v in _values(AXES[k])]


@pytest.fixture(scope="module")
def x_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("x") / "x.safetensors"
    x = np.random.default_rng(3).standard_normal((3, 128)).astype(ml_dtypes.bfloat16).astype(np.float32)
    save_tensors(p, {"x": Tensor(x, "BF16")})
    return p


def _run(capsys, tmp_path, x_file, ckpt, act, variants):
    out = tmp_path / "y.safetensors"
    argv = ["linear", str(CKPTS / ckpt), "--layer", LAYER, "-i", str(x_file), "-o", str(out), "--act", act]
    for v in variants:
        argv += ["--variant", v]
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err, out


@pytest.mark.parametrize("key,value", CASES, ids=[f"{k}={v}" for k, v in CASES])
def test_every_variant_reaches_linear(capsys, tmp_path, x_file, key, value):
    a = AXES[key]
    variants = [f"{key}={value}"] + COMPANION.get((key, value), [])
    if a.stage.value == "moe":  # no dense layer is a MoE block: refused by name
        rc, out, err, y = _run(capsys, tmp_path, x_file, *WHERE["weights"], variants)
        assert rc == 2 and "applies to w4a16-moe" in err and not y.exists()
        return
    ckpt, act = WHERE[a.stage.value]
    if key == "azp_epilogue":
        ckpt, act = WHERE["int8-activations"]
    if key == "w4a8_product":  # int4 weights under int8 activations: the layer is W4A8
        ckpt, act = WHERE["weights"][0], "int8"
    rc, out, err, y = _run(capsys, tmp_path, x_file, ckpt, act, variants)
    assert rc == 0, err
    assert f"activations: {act}" in out
    shown = out.split("variants: ", 1)[1]
    canonical = str(a.canonical).lower() == value.lower()
    assert (f"{key}=" in shown) or canonical, out  # a canonical field value may be left unnamed
    assert load_tensors(y)["y"].data.shape == (3, 128)


def test_case_path_with_canonical_values_equals_the_direct_path(capsys, tmp_path, x_file):
    """The two reference paths — the checkpoint layer (emulator/layers.py) and the layer as a Case
    (emulator/declaration.py) — give the same bits when the named values are the canonical ones."""
    ckpt, act = WHERE["weights"]
    rc, _, err, y1 = _run(capsys, tmp_path, x_file, ckpt, act, [])
    direct = load_tensors(y1)["y"].data.copy()
    rc2, out, err2, y2 = _run(capsys, tmp_path, x_file, ckpt, act, ["dequant_order=sub_then_mul"])
    assert rc == rc2 == 0, (err, err2)
    assert "the layer as a Case" in out
    case_path = load_tensors(y2)["y"].data
    assert np.array_equal(direct.view(np.uint32), case_path.view(np.uint32))
    rc3, _, _, y3 = _run(capsys, tmp_path, x_file, ckpt, act, ["zero_read=v1_literal"])
    assert rc3 == 0 and not np.array_equal(direct, load_tensors(y3)["y"].data)  # the variant is applied


def test_activation_variant_on_other_activations_is_refused(capsys, tmp_path, x_file):
    rc, out, err, y = _run(capsys, tmp_path, x_file, *WHERE["weights"], ["act_rounding=rhaz"])
    assert rc == 2 and "use --act int8" in err and not y.exists()
