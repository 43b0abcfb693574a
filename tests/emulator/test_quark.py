"""AMD Quark checkpoints (quant_method "quark"): detection, bit-exact dequant, linear, refusals.

The folders under tests/data/toolkit_checkpoints/quark/ were written by amd-quark 0.13 itself
(make_quark_checkpoints.py there) on the tiny random Llama with planted degenerate groups that
the other toolkit checkpoints use. Each holds ``toolkit_dequant.safetensors``: Quark's own
import-side dequantization (StaticScaledRealQuantizer.forward: pack_method.unpack +
quark.torch.kernel.dequantize) of the SAVED tensors, float32 (Quark dequantizes in float32 and
does not round again), -0.0 written as +0.0, so values are compared. CI needs no Quark.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from conformance.cli.main import main
from emulator.checkpoint import Checkpoint
from emulator.errors import QconformError
from emulator.quark import glob_match
from emulator.tensorfile import Tensor, load_tensors, save_tensors

ROOT = Path(__file__).resolve().parents[1] / "data" / "toolkit_checkpoints" / "quark"
FOLDERS = sorted(p for p in ROOT.iterdir() if (p / "config.json").exists()) if ROOT.exists() else []
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _name(short: str) -> str:
    return f"model.layers.0.{'mlp' if short in ('gate_proj', 'up_proj', 'down_proj') else 'self_attn'}.{short}"


# What make_quark_checkpoints.py asked Quark for (its SCHEMES), layer by layer:
# (format, bits, group_size, sym, zero_convention, activation type or None)
EXPECTED = {
    "quark-int4-g32-sym-reorder": {
        **{s: ("quark-int", 4, 32, True, "int4-reorder", None) for s in ALL if s != "k_proj"},
        "down_proj": ("quark-int", 4, 128, True, "int4-reorder", None),  # layer_quant_config "*down_proj"
    },  # k_proj: exclude "*k_proj"
    "quark-uint4-g32-asym-order": {
        **{s: ("quark-int", 4, 32, False, "uint4-order", None) for s in ALL},
        "o_proj": ("quark-int", 4, 32, False, "int4-order", None),  # layer_quant_config: int4 asym
    },
    "quark-mxfp4-w4a4": {
        **{s: ("quark-mxfp4", 4, 32, True, None, "float") for s in ALL},
        "v_proj": ("quark-mxfp4", 4, 32, True, None, None),  # weight-only override
    },
    "quark-int8-w8a8": {s: ("quark-int", 8, -1, True, "int8", "int") for s in ALL},
}


def cli(capsys, *args):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def one_line_error(rc, err, cmd, *needles):
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith(f"qconform {cmd}: error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def test_fixture_present():
    assert [f.name for f in FOLDERS] == sorted(EXPECTED), FOLDERS
    for f in FOLDERS:
        prov = json.loads((f / "provenance.json").read_text())
        assert prov["toolkit"] == "amd-quark" and prov["quantization_config"]["version"] == "0.13"
        assert prov["degenerate_groups"]["entries"], f.name


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_inspect_lists_the_layers_quark_quantized(capsys, folder):
    rc, out, err = cli(capsys, "inspect", folder, "--json")
    assert rc == 0, err
    got = {l["name"]: l for l in json.loads(out)["layers"]}
    want = {_name(s): v for s, v in EXPECTED[folder.name].items()}
    assert sorted(got) == sorted(want)
    for name, (fmt, bits, gs, sym, conv, act) in want.items():
        l = got[name]
        assert (l["format"], l["bits"], l["group_size"], l["sym"], l["zero_convention"]) == (fmt, bits, gs, sym, conv), name
        assert (l["activation"] or {}).get("type") == act, name
        n_out = 32 if name.endswith(("k_proj", "v_proj")) else 128
        assert l["shape"] == [n_out, 128], name


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_qconform_dequant_equals_quarks_own_dequant(capsys, tmp_path, folder):
    """``qconform dequant`` of every layer equals Quark's import-side dequantization bit for bit."""
    ref = load_tensors(folder / "toolkit_dequant.safetensors")
    names = sorted(_name(s) for s in EXPECTED[folder.name])
    assert sorted(k[: -len(".weight")] for k in ref) == names
    for name in names:
        out = tmp_path / f"{name}.safetensors"
        rc, _, err = cli(capsys, "dequant", folder, "--layer", name, "-o", out)
        assert rc == 0, err
        ours = load_tensors(out)["weight"].data
        theirs = ref[name + ".weight"].data
        assert ours.dtype == np.float32 and ours.shape == theirs.shape
        bad = ours != theirs
        assert not bad.any(), (f"{name}: {int(bad.sum())} element(s) differ; first at "
                               f"{np.argwhere(bad)[0].tolist()}: qconform {ours[bad][0]!r} vs Quark {theirs[bad][0]!r}")


def test_degenerate_groups_are_in_the_checked_layers():
    """The planted degenerate spans (all-zero rows, constant, tiny) reach the compared weights."""
    for f in FOLDERS:
        ref = load_tensors(f / "toolkit_dequant.safetensors")
        q = ref["model.layers.0.self_attn.q_proj.weight"].data
        assert np.all(q[2] == 0), f.name  # row 2: all_zero
        assert len(np.unique(q[3])) == 1 and q[3, 0] != 0, f.name  # row 3: constant_pos stays constant


def _x(path: Path, k: int = 128) -> np.ndarray:
    x = np.random.default_rng(3).standard_normal((4, k)).astype(ml_dtypes.bfloat16).astype(np.float32)
    save_tensors(path, {"x": Tensor(x, "BF16")})
    return x


@pytest.mark.parametrize("folder,act", [("quark-int4-g32-sym-reorder", None), ("quark-uint4-g32-asym-order", None),
                                        ("quark-int8-w8a8", "a16"), ("quark-mxfp4-w4a4", "a16")])
def test_linear_a16_is_x_times_quarks_weight(capsys, tmp_path, folder, act):
    """y_exact = x @ W^T with W Quark's own dequantized weight (float64 reference, not qconform's)."""
    x = _x(tmp_path / "x.safetensors")
    name = "model.layers.0.mlp.down_proj"
    extra = ["--act", act] if act else []
    rc, out, err = cli(capsys, "linear", ROOT / folder, "--layer", name, "-i", tmp_path / "x.safetensors",
                       "-o", tmp_path / "y.safetensors", *extra)
    assert rc == 0, err
    y = load_tensors(tmp_path / "y.safetensors")
    w = load_tensors(ROOT / folder / "toolkit_dequant.safetensors")[name + ".weight"].data.astype(np.float64)
    ref = x.astype(np.float64) @ w.T
    np.testing.assert_allclose(y["y_exact"].data, ref, rtol=1e-12, atol=1e-300)
    assert "activations: a16" in out


def test_linear_mxfp4_w4a4_uses_quarks_declared_activation_quantizer(capsys, tmp_path):
    """The checkpoint declares scale_calculation_mode "even": its linear uses the EVEN scale rule
    (amax rounded to one mantissa bit, Quark quantization/utils.py even_round), and that rule
    changes the answer on this input compared with OCP's floor rule."""
    from emulator.formats import mxfp4
    from emulator.layers import linear_layer

    ck = Checkpoint(ROOT / "quark-mxfp4-w4a4")
    info = ck.layer("model.layers.0.mlp.down_proj")
    # amax of the first block 1.75 * 2^k: EVEN rounds it up to 2^(k+1), FLOOR keeps 2^k
    x = np.full((1, 128), 0.25, dtype=np.float32)
    x[0, 0] = 1.75
    declared = linear_layer(ck, info, x, out_dtype="float32")
    even = linear_layer(ck, info, x, act="mxfp4", mx_variant=mxfp4.MxVariant(scale_rule="even"), out_dtype="float32")
    floor = linear_layer(ck, info, x, act="mxfp4", mx_variant=mxfp4.MxVariant(scale_rule="floor"),
                         out_dtype="float32")
    np.testing.assert_array_equal(declared.y_exact, even.y_exact)
    assert not np.array_equal(declared.y_exact, floor.y_exact)
    rc, out, err = cli(capsys, "linear", ROOT / "quark-mxfp4-w4a4", "--layer", info.name, "-i",
                       _x_path(tmp_path), "-o", tmp_path / "y.safetensors")
    assert rc == 0 and "activations: mxfp4" in out, err


def _x_path(tmp_path: Path) -> Path:
    _x(tmp_path / "x.safetensors")
    return tmp_path / "x.safetensors"


def test_linear_int8_declared_activation_is_refused_by_name(capsys, tmp_path):
    """Quark's dynamic int8 scale is amax / 127.5: no emulator variant, so the declared scheme is refused."""
    args = ["linear", ROOT / "quark-int8-w8a8", "--layer", "model.layers.0.mlp.down_proj", "-i", _x_path(tmp_path),
            "-o", tmp_path / "y.safetensors"]
    rc, _, err = cli(capsys, *args)
    one_line_error(rc, err, "linear", "amax / 127.5", "model.layers.0.mlp.down_proj")
    assert not (tmp_path / "y.safetensors").exists()
    rc, out, err = cli(capsys, *args, "--act", "int8")  # canonical int8, explicitly asked for
    assert rc == 0 and "activations: int8" in out, err


# -- config variants: overrides and refusals ------------------------------------------------------
def _variant(tmp_path: Path, src: str, edit) -> Path:
    dst = tmp_path / "ck"
    dst.mkdir()
    shutil.copy(ROOT / src / "model.safetensors", dst / "model.safetensors")
    cfg = json.loads((ROOT / src / "config.json").read_text())
    edit(cfg["quantization_config"])
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _wspec(qc):
    return qc["global_quant_config"]["weight"]


@pytest.mark.parametrize("edit,needles", [
    (lambda qc: _wspec(qc).update(dtype="fp8_e4m3"), ["'fp8_e4m3'", "not defined"]),
    (lambda qc: _wspec(qc).update(dtype="mx", mx_element_dtype="fp6_e2m3"), ["'mx'", "fp6_e2m3"]),
    (lambda qc: _wspec(qc).update(qscheme="per_tensor"), ["per_tensor", "not defined"]),
    (lambda qc: _wspec(qc).update(zero_point_type="float32"), ["zero_point_type", "float32"]),
    (lambda qc: _wspec(qc).update(symmetric="true"), ["symmetric", "not a bool"]),
    (lambda qc: qc["export"].update(weight_format="fake_quantized"), ["fake_quantized"]),
    (lambda qc: qc["export"].update(pack_method="zigzag"), ["pack_method", "zigzag"]),
    (lambda qc: qc.update(layer_type_quant_config={"Conv2d": qc["global_quant_config"]}), ["Conv2d"]),
    (lambda qc: qc.update(kv_cache_quant_config={"*v_proj": {}}), ["kv_cache_quant_config"]),
    (lambda qc: qc["global_quant_config"].update(bias=_wspec(qc)), ["bias quantization"]),
    (lambda qc: qc["global_quant_config"].update(output_tensors=_wspec(qc)), ["output_tensors quantization"]),
    (lambda qc: qc.update(exclude=["model.layers.0.mlp.up_proj"]), ["up_proj", "exclude"]),
])
def test_unsupported_quark_schemes_are_one_named_line(capsys, tmp_path, edit, needles):
    folder = _variant(tmp_path, "quark-uint4-g32-asym-order", edit)
    rc, _, err = cli(capsys, "inspect", folder)
    one_line_error(rc, err, "inspect", *needles)


def test_mxfp4_activation_modes_without_a_variant_are_refused(capsys, tmp_path):
    def floor(qc):
        qc["global_quant_config"]["input_tensors"]["scale_calculation_mode"] = "floor"
    folder = _variant(tmp_path, "quark-mxfp4-w4a4", floor)
    rc, _, err = cli(capsys, "linear", folder, "--layer", "model.layers.0.mlp.down_proj", "-i", _x_path(tmp_path),
                     "-o", tmp_path / "y.safetensors")
    one_line_error(rc, err, "linear", "scale_calculation_mode='floor'")


def test_layer_type_quant_config_linear_is_honoured(tmp_path):
    """The same scheme given as layer_type_quant_config {"Linear": ...} (global null) reads the same."""
    def move(qc):
        qc["layer_type_quant_config"] = {"Linear": qc["global_quant_config"]}
        qc["global_quant_config"] = None
    a = Checkpoint(ROOT / "quark-uint4-g32-asym-order")
    b = Checkpoint(_variant(tmp_path, "quark-uint4-g32-asym-order", move))
    assert [(l.name, l.zero_convention, l.group_size) for l in a.layers()] == \
        [(l.name, l.zero_convention, l.group_size) for l in b.layers()]


def test_layer_quant_config_changes_the_reading(tmp_path):
    """Dropping the o_proj override (int4) reads its codes as uint4: the weight changes, so the
    override is what makes the bit-exact match above."""
    from emulator.layers import dequantize_layer

    folder = _variant(tmp_path, "quark-uint4-g32-asym-order", lambda qc: qc.update(layer_quant_config={}))
    ck = Checkpoint(folder)
    info = ck.layer("model.layers.0.self_attn.o_proj")
    assert info.zero_convention == "uint4-order"
    ref = load_tensors(ROOT / "quark-uint4-g32-asym-order" / "toolkit_dequant.safetensors")
    assert not np.array_equal(dequantize_layer(ck, info), ref["model.layers.0.self_attn.o_proj.weight"].data)


def test_pack_method_changes_the_reading(tmp_path):
    from emulator.layers import dequantize_layer

    folder = _variant(tmp_path, "quark-int4-g32-sym-reorder", lambda qc: qc["export"].update(pack_method="order"))
    ck = Checkpoint(folder)
    info = ck.layer("model.layers.0.self_attn.q_proj")
    ref = load_tensors(ROOT / "quark-int4-g32-sym-reorder" / "toolkit_dequant.safetensors")
    assert not np.array_equal(dequantize_layer(ck, info), ref[info.name + ".weight"].data)


def test_wrong_zero_point_shape_is_named(capsys, tmp_path):
    dst = tmp_path / "ck"
    dst.mkdir()
    shutil.copy(ROOT / "quark-uint4-g32-asym-order" / "config.json", dst / "config.json")
    t = load_tensors(ROOT / "quark-uint4-g32-asym-order" / "model.safetensors")
    zp = t["model.layers.0.mlp.up_proj.weight_zero_point"]
    t["model.layers.0.mlp.up_proj.weight_zero_point"] = Tensor(zp.data[:, :8].copy(), zp.dtype)
    save_tensors(dst / "model.safetensors", t)
    rc, _, err = cli(capsys, "dequant", dst, "--layer", "model.layers.0.mlp.up_proj", "-o", tmp_path / "w.safetensors")
    one_line_error(rc, err, "dequant", "model.layers.0.mlp.up_proj", "weight_zero_point", "[4, 16]")


@pytest.mark.parametrize("pattern", ["*", "*k_proj", "model.layers.?.mlp.*", "*[qk]_proj", "*[!q]_proj",
                                     "model.layers.0.mlp.down_proj", "*.mlp.*_proj", "[", "*[a-c]*", "a*b*c*d*e",
                                     "model.layers.0.self_attn.*proj*", "**proj", "*.layers.[0-9].*", "*[z-a]*", "*[]]*",
                                     "*[!]]*", "[a-]*", "*[\x00-\U0010ffff]*", "*[-a]", "a[", "*[!"])
def test_glob_match_is_fnmatchcase(pattern):
    names = [_name(s) for s in ALL] + ["lm_head", "", "abcde", "a[b", "model.layers.10.mlp.up_proj", "x]y", "a-", "-a"]
    for n in names:
        assert glob_match(pattern, n) == fnmatch.fnmatchcase(n, pattern), (pattern, n)


def test_glob_match_is_fast_on_adversarial_patterns():
    import time

    t = time.perf_counter()
    assert not glob_match("*a" * 200 + "b", "a" * 1000)
    assert time.perf_counter() - t < 5


def test_errors_are_qconform_errors(tmp_path):
    folder = _variant(tmp_path, "quark-int8-w8a8", lambda qc: _wspec(qc).update(qscheme="per_group"))
    with pytest.raises(QconformError, match="int8 per_group"):
        Checkpoint(folder).layers()


def test_layer_missing_its_scale_is_named(capsys, tmp_path):
    dst = tmp_path / "ck"
    dst.mkdir()
    shutil.copy(ROOT / "quark-int4-g32-sym-reorder" / "config.json", dst / "config.json")
    t = load_tensors(ROOT / "quark-int4-g32-sym-reorder" / "model.safetensors")
    del t["model.layers.0.mlp.up_proj.weight_scale"]
    save_tensors(dst / "model.safetensors", t)
    rc, _, err = cli(capsys, "inspect", dst)
    one_line_error(rc, err, "inspect", "model.layers.0.mlp.up_proj", "weight_scale", "missing")


# -- activation quantizers: Quark's own, stored by make_quark_checkpoints.py -------------------------
def _act_ref():
    return load_tensors(ROOT / "quark_act_qdq.safetensors")


def test_quark_mxfp4_activation_quantizer_is_the_even_variant():
    """Quark's dynamic MXFP4 input quantizer (scale_calculation_mode "even") on a 64x128 input with
    zero, tiny and tie blocks equals the variant qconform maps it to, and not the canonical FLOOR."""
    from emulator.formats import mxfp4
    from emulator.quark import mx_variant_fields

    t = _act_ref()
    x, xq = t["mxfp4.x"].data, t["mxfp4.xq"].data
    act = Checkpoint(ROOT / "quark-mxfp4-w4a4").layer("model.layers.0.mlp.down_proj").activation
    mapped = mxfp4.MxVariant(**mx_variant_fields(act, "down_proj"))
    ours = mxfp4.dequantize_mxfp4(*mxfp4.quantize_mxfp4(x, mapped))
    bad = ours != xq
    assert not bad.any(), f"{int(bad.sum())} differ; first at {np.argwhere(bad)[0].tolist()}"
    floor = mxfp4.dequantize_mxfp4(*mxfp4.quantize_mxfp4(x, mxfp4.CANONICAL))
    assert (floor != xq).any()


def test_quark_int8_activation_is_not_the_canonical_variant():
    """Why the declared int8 scheme is refused: Quark's per-token result is not the canonical
    amax/127 quantizer's (its scale is amax/127.5), on rows where the two must differ."""
    from emulator.activations import int8 as a8

    t = _act_ref()
    x, xq = t["int8.x"].data, t["int8.xq"].data
    r = a8.quantize_int8_per_token(x, a8.CANONICAL_SYM)
    canon = (r.q.astype(np.float64) * np.asarray(r.scale, dtype=np.float64).reshape(-1, 1)).astype(np.float32)
    assert (canon != xq).sum() > 1000
    # amax / 127.5 with x * (1 / scale), written from Quark's observer / fake-quantize arithmetic
    amax = np.abs(x).max(axis=1, keepdims=True)
    s = np.maximum(amax / np.float32(127.5), np.finfo(np.float32).eps).astype(np.float32)
    q = np.clip(np.rint(x * (np.float32(1) / s)), -128, 127).astype(np.float32)
    np.testing.assert_array_equal(q * s, xq)


def test_pattern_matching_work_is_bounded(capsys, tmp_path):
    """A config with thousands of long glob patterns is refused in bounded time, not matched for minutes."""
    import time

    pats = ["*" + "a*" * 400 + "zz" + str(i) for i in range(2000)]
    folder = _variant(tmp_path, "quark-uint4-g32-asym-order", lambda qc: qc.update(exclude=pats))
    t = time.perf_counter()
    rc, _, err = cli(capsys, "inspect", folder)
    one_line_error(rc, err, "inspect", "steps")
    assert time.perf_counter() - t < 30


def test_static_int8_activations_are_refused_by_name(capsys, tmp_path):
    def static(qc):
        qc["global_quant_config"]["input_tensors"].update(is_dynamic=False, qscheme="per_tensor")
    folder = _variant(tmp_path, "quark-int8-w8a8", static)
    rc, _, err = cli(capsys, "linear", folder, "--layer", "model.layers.0.mlp.down_proj", "-i", _x_path(tmp_path),
                     "-o", tmp_path / "y.safetensors")
    one_line_error(rc, err, "linear", "static int8")


def test_linear_names_the_activation_rule_the_checkpoint_declares(tmp_path, capsys):
    """A Quark W4A4 layer's MXFP4 activations follow its own scale_calculation_mode ('even'): `linear` says so."""
    import ml_dtypes

    from conformance.cli.main import main
    from emulator.tensorfile import Tensor, save_tensors

    folder = Path(__file__).resolve().parents[1] / "data" / "toolkit_checkpoints" / "quark" / "quark-mxfp4-w4a4"
    x = np.random.default_rng(2).standard_normal((2, 128)).astype(ml_dtypes.bfloat16).astype(np.float32)
    save_tensors(tmp_path / "x.safetensors", {"x": Tensor(x, "BF16")})
    rc = main(["linear", str(folder), "--layer", "model.layers.0.mlp.down_proj", "-i", str(tmp_path / "x.safetensors"),
               "-o", str(tmp_path / "y.safetensors")])
    out = capsys.readouterr().out
    assert rc == 0 and "activations: mxfp4" in out and "the checkpoint declares mx_scale_rule=even" in out
