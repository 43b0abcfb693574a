"""Checkpoint folders and format detection (emulator/checkpoint.py, emulator/detect.py).

- every synthetic scheme: the detected LayerInfo is the one written (expectations from the
  scheme descriptions, tests/emulator/qc_ckpt_cases.py), and sharding the same tensors over
  two files + model.safetensors.index.json changes nothing, bit for bit;
- the real toolkit checkpoints under tests/data/toolkit_checkpoints/: every folder is
  detected, with expectations derived from its own provenance.json / config.json;
- malformed checkpoints: the error type, and a message naming the layer and tensor.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import qc_ckpt_cases as cases
from emulator.checkpoint import Checkpoint
from emulator.errors import FormatError, QconformError
from emulator.layers import dequantize_layer
from emulator.synthetic import SCHEMES
from emulator.tensorfile import load_tensors, save_tensors

TOOLKIT = Path(__file__).resolve().parents[1] / "data" / "toolkit_checkpoints"


def test_expectations_cover_every_scheme():
    assert set(cases.EXPECTED) == set(SCHEMES)


# -- synthetic schemes ---------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_detects_what_was_written(tmp_path, scheme):
    n, k, n_layers = 32, 256, 2
    originals = cases.write(tmp_path, scheme, n=n, k=k, n_layers=n_layers, bias=True)
    ck = Checkpoint(tmp_path)
    layers = ck.layers()
    assert [l.name for l in layers] == [cases.layer_name(scheme, i) for i in range(n_layers)]
    exp = cases.EXPECTED[scheme]
    for info in layers:
        assert info.format == exp["format"]
        assert tuple(info.shape) == cases.expected_shape(scheme, n, k)
        assert info.bits == exp["bits"]
        assert info.group_size == exp["group_size"]
        assert info.sym == exp["sym"]
        assert info.act_order == exp["act_order"]
        assert info.zero_convention == exp["zero_convention"]
        if exp["activation"] is None:
            assert not info.activation
        else:
            assert {key: info.activation.get(key) for key in exp["activation"]} == exp["activation"]
        # every role names a tensor of this layer that exists; the bias is found where it was written
        for role, tname in info.tensors.items():
            assert ck.has(tname) and tname.startswith(info.name)
        has_bias = f"{info.name}.bias" in ck.tensor_names()
        assert ("bias" in info.tensors) == has_bias
        if scheme != "gptoss-mxfp4":
            assert has_bias  # written with bias=True
        json.dumps(info.to_json())  # JSON-serialisable (inspect --json)
    # the weights dequantize to the shape detected
    for info in layers:
        w = dequantize_layer(ck, info)
        assert w.dtype == np.float32 and w.shape == tuple(info.shape)
    assert set(originals) <= {cases.LAYER.replace("layers.0.", f"layers.{i}.") for i in range(n_layers)}


@pytest.mark.parametrize("scheme", ["ct-w4a16-g32-sym", "ct-w8a8-int8", "ct-mxfp4-w4a16"])
def test_ignored_and_unquantized_modules_are_not_layers(tmp_path, scheme):
    cases.write(tmp_path, scheme)

    def add(t):
        for role in [r for r in list(t) if r.startswith(cases.LAYER + ".")]:
            t["lm_head." + role.rsplit(".", 1)[1]] = t[role]  # ignored by the config ("ignore": ["lm_head"])
        t["model.embed_tokens.weight"] = np.zeros((8, 4), np.float16)
        t["model.norm.weight"] = np.ones(4, np.float16)
    cases.edit_tensors(tmp_path, add)
    assert [l.name for l in Checkpoint(tmp_path).layers()] == [cases.LAYER]


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_sharded_checkpoint_detects_and_dequantizes_identically(tmp_path, scheme):
    one, two = tmp_path / "one", tmp_path / "two"
    cases.write(one, scheme, n_layers=2, bias=True)
    cases.write(two, scheme, n_layers=2, bias=True)
    wm = cases.shard(two)
    assert not (two / "model.safetensors").exists() and len(set(wm.values())) == 2
    a, b = Checkpoint(one), Checkpoint(two)
    la, lb = a.layers(), b.layers()
    assert [x.to_json() for x in la] == [x.to_json() for x in lb]
    straddles = False
    for x, y in zip(la, lb):
        wa, wb = dequantize_layer(a, x), dequantize_layer(b, y)
        assert wa.dtype == wb.dtype == np.float32
        assert np.array_equal(wa.view(np.uint32), wb.view(np.uint32))  # bit for bit
        straddles |= len({wm[t] for t in y.tensors.values()}) > 1
    assert straddles  # the test really reads one layer from two files


def test_extra_safetensors_beside_model_are_skipped_and_named(tmp_path, capsys):
    """Issue 22 item 10: transformers reads model.safetensors (no index); a reference dump or optimizer state
    beside it, even one repeating a model tensor name, is not read, and inspect names it."""
    from conformance.cli.main import main

    cases.write(tmp_path, "gptq-w4g32-sym-v1")
    t = load_tensors(tmp_path / "model.safetensors")
    save_tensors(tmp_path / "extra.safetensors", {f"{cases.LAYER}.scales": np.zeros_like(t[f"{cases.LAYER}.scales"].data)})
    save_tensors(tmp_path / "optimizer.safetensors", {"step": np.zeros(1, np.int64)})
    ck = Checkpoint(tmp_path)
    assert [f for f, _ in ck.skipped_files] == ["extra.safetensors", "optimizer.safetensors"]
    assert ck._files[f"{cases.LAYER}.scales"].path.name == "model.safetensors"
    assert main(["inspect", str(tmp_path), "--headers-only"]) == 0
    out = capsys.readouterr().out
    assert "skipped file: extra.safetensors (not read: model.safetensors holds the model" in out
    assert "skipped file: optimizer.safetensors" in out


def test_single_unnamed_file_is_read_and_several_without_index_are_refused(tmp_path):
    cases.write(tmp_path, "gptq-w4g32-sym-v1")
    (tmp_path / "model.safetensors").rename(tmp_path / "weights.safetensors")
    assert Checkpoint(tmp_path).layers() and Checkpoint(tmp_path).skipped_files == []
    save_tensors(tmp_path / "other.safetensors", {"x": np.zeros(1, np.float32)})
    with pytest.raises(FormatError) as e:
        Checkpoint(tmp_path)
    assert "other.safetensors, weights.safetensors" in str(e.value) and "index" in str(e.value)


def test_index_names_files_it_does_not_list(tmp_path):
    cases.write(tmp_path, "gptq-w4g32-sym-v1")
    cases.shard(tmp_path, 2)
    save_tensors(tmp_path / "reference_dump.safetensors", {"y": np.zeros(1, np.float32)})
    ck = Checkpoint(tmp_path)
    assert ck.skipped_files == [("reference_dump.safetensors", "not read: model.safetensors.index.json does not list it")]


def test_symlinked_model_outside_the_folder_is_refused_without_an_index(tmp_path):
    """Issue 22 item 9: with an index such a shard was refused; without one it was read."""
    outside = tmp_path / "elsewhere"
    cases.write(outside, "gptq-w4g32-sym-v1")
    folder = tmp_path / "ckpt"
    cases.write(folder, "gptq-w4g32-sym-v1")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(outside / "model.safetensors")
    with pytest.raises(FormatError) as e:
        Checkpoint(folder)
    assert "outside the checkpoint folder" in str(e.value) and "model.safetensors" in str(e.value)
    inside = folder / "real.bin"
    (outside / "model.safetensors").rename(inside)  # a symlink within the folder stays readable
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(inside)
    assert Checkpoint(folder).layers()


def test_duplicate_keys_in_config_json_are_refused(tmp_path):
    """Issue 22 item 9: json.loads keeps the last of two equal keys; the safetensors header reader refuses them,
    and so does the config reader now (here the duplicate would flip sym)."""
    cases.write(tmp_path, "gptq-w4g32-sym-v1")
    text = (tmp_path / "config.json").read_text()
    assert '"sym": true' in text
    (tmp_path / "config.json").write_text(text.replace('"sym": true', '"sym": true, "sym": false'))
    with pytest.raises(FormatError) as e:
        Checkpoint(tmp_path)
    assert "config.json" in str(e.value) and "'sym' twice" in str(e.value)


def test_nul_byte_in_index_names_the_entry(tmp_path):
    cases.write(tmp_path, "gptq-w4g32-sym-v1")
    cases.shard(tmp_path, 2)
    idx = tmp_path / "model.safetensors.index.json"
    data = json.loads(idx.read_text())
    name = sorted(data["weight_map"])[0]
    data["weight_map"][name] = "model-00001\u0000-of-00002.safetensors"
    idx.write_text(json.dumps(data))
    with pytest.raises(FormatError) as e:
        Checkpoint(tmp_path)
    msg = str(e.value)
    assert "NUL byte" in msg and name in msg and "model.safetensors.index.json" in msg


def test_toolkit_dequant_file_is_not_a_shard(tmp_path):
    cases.write(tmp_path, "awq-w4g32")
    save_tensors(tmp_path / "toolkit_dequant.safetensors", {f"{cases.LAYER}.weight": np.zeros((2, 2), np.float32),
                                                           f"{cases.LAYER}.scales": np.zeros((2, 2), np.float16)})
    assert [l.name for l in Checkpoint(tmp_path).layers()] == [cases.LAYER]


def test_layer_lookup_accepts_tensor_names_and_suggests(tmp_path):
    cases.write(tmp_path, "gptq-w4g32-sym-v1", n_layers=3)
    ck = Checkpoint(tmp_path)
    name = cases.LAYER
    assert ck.layer(name).name == name
    assert ck.layer(name + ".qweight").name == name
    assert ck.layer(name + ".weight").name == name
    with pytest.raises(QconformError) as e:
        ck.layer("model.layers.0.mlp.down_prj")
    assert "down_prj" in str(e.value) and name in str(e.value)
    with pytest.raises(FormatError) as e:
        ck.tensor_info(name + ".bias")
    assert "bias" in str(e.value)


def test_gptoss_layer_lookup_by_blocks_tensor(tmp_path):
    cases.write(tmp_path, "gptoss-mxfp4")
    ck = Checkpoint(tmp_path)
    assert ck.layer(cases.EXPERTS + "_blocks").name == cases.EXPERTS


# -- malformed checkpoints -----------------------------------------------------------------------
@pytest.mark.parametrize("case", cases.MALFORMED, ids=[c.id for c in cases.MALFORMED])
def test_malformed_checkpoint_raises_naming_layer_and_tensor(tmp_path, case):
    folder = cases.build(case, tmp_path / "ckpt")
    with pytest.raises(QconformError) as e:
        ck = Checkpoint(folder)
        for info in ck.layers():
            dequantize_layer(ck, info)
    err = e.value
    assert type(err) is case.error, f"{type(err).__name__}: {err}"
    msg = str(err)
    assert "\n" not in msg
    for needle in case.names:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    if case.layer is not None:
        assert err.layer == case.layer
    if case.tensor is not None:
        want = case.tensor if isinstance(case.tensor, tuple) else (case.tensor,)
        assert err.tensor in want, msg


def test_symmetric_gptq_without_qzeros_reads_the_midpoint_zero(tmp_path):
    """qzeros may be left out of a *symmetric* layer only; the emulator then uses the midpoint zero,
    so the weights are exactly those of the same layer with its qzeros."""
    a, b = tmp_path / "a", tmp_path / "b"
    for f in (a, b):
        cases.write(f, "gptq-w4g32-sym-v1")
    cases.edit_tensors(b, lambda t: t.pop(f"{cases.LAYER}.qzeros"))
    ca, cb = Checkpoint(a), Checkpoint(b)
    wa = dequantize_layer(ca, ca.layer(cases.LAYER))
    wb = dequantize_layer(cb, cb.layer(cases.LAYER))
    assert np.array_equal(wa, wb)


def test_missing_g_idx_is_fine_without_act_order(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for f in (a, b):
        cases.write(f, "gptq-w4g32-asym-v2")
    cases.edit_tensors(b, lambda t: t.pop(f"{cases.LAYER}.g_idx"))
    ca, cb = Checkpoint(a), Checkpoint(b)
    assert np.array_equal(dequantize_layer(ca, ca.layer(cases.LAYER)), dequantize_layer(cb, cb.layer(cases.LAYER)))


def test_not_a_folder(tmp_path):
    with pytest.raises(FormatError) as e:
        Checkpoint(tmp_path / "nope")
    assert "nope" in str(e.value)


def test_folder_without_safetensors(tmp_path):
    cases.write(tmp_path, "awq-w4g32")
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FormatError) as e:
        Checkpoint(tmp_path)
    assert "safetensors" in str(e.value)


def test_corrupt_safetensors_in_checkpoint_names_the_file(tmp_path):
    cases.write(tmp_path, "awq-w4g32")
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) - 5])
    with pytest.raises(FormatError) as e:
        Checkpoint(tmp_path)
    assert "model.safetensors" in str(e.value)


# -- real toolkit checkpoints --------------------------------------------------------------------
def _toolkit_folders() -> list:
    if not TOOLKIT.is_dir():
        return []
    return sorted(p.name for p in TOOLKIT.iterdir() if p.is_dir() and (p / "config.json").exists())


def _expected_from_provenance(folder: Path) -> dict:
    """What the toolkit says it wrote: the quantized modules and their shapes from provenance.json,
    the scheme from the quantization_config it saved (config.json)."""
    prov = json.loads((folder / "provenance.json").read_text())
    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    modules = prov.get("dequant_function") or {}
    shapes = {k[: -len(".weight")]: tuple(v) for k, v in prov["toolkit_dequant"]["tensors"].items()}
    if not modules:
        modules = dict.fromkeys(shapes)
    scheme = prov.get("scheme") or {}
    method = qc["quant_method"].lower()
    exp: dict = {"modules": sorted(modules), "shapes": shapes, "activation": None, "act_order": False}
    if method == "gptq":  # AutoGPTQ / GPTQModel layout; checkpoint_format says v1 or v2 zeros
        v2 = qc.get("checkpoint_format", "gptq") == "gptq_v2"
        # GPTQModel writes v1 by subtracting 0x11111111 from packed v2 words (docs/formats/gptq.md, PACKED_SUB)
        v1 = "v1-packed" if prov.get("toolkit") == "gptqmodel" else "v1"
        exp.update(format="gptq", bits=qc["bits"], group_size=qc["group_size"], sym=qc["sym"],
                   act_order=bool(qc.get("desc_act")), zero_convention="v2" if v2 else v1)
    elif method == "awq":  # AutoAWQ GEMM: zero_point=True means asymmetric, zeros stored as is
        exp.update(format="awq", bits=qc["bits"], group_size=qc["group_size"], sym=not qc["zero_point"],
                   zero_convention="literal")
    elif method in ("auto-round", "intel/auto-round"):
        packing = qc["packing_format"]
        if "gptq" in packing:  # auto-round's auto_gptq packing is AutoGPTQ's (v1) layout
            exp.update(format="gptq", bits=qc["bits"], group_size=qc["group_size"], sym=qc["sym"],
                       zero_convention="v1")
        elif "awq" in packing:
            exp.update(format="awq", bits=qc["bits"], group_size=qc["group_size"], sym=qc["sym"],
                       zero_convention="literal")
        elif "llm_compressor" in packing and "mx" in qc["data_type"]:
            exp.update(format="ct-mxfp4", bits=4, group_size=32, sym=True, zero_convention=None)
            if qc.get("act_bits", 16) < 16:
                exp["activation"] = {"num_bits": qc["act_bits"],
                                     "type": "float" if "fp" in qc["act_data_type"] else "int"}
        else:
            raise AssertionError(f"{folder.name}: no expectation for auto-round packing {packing!r}")
    elif method == "compressed-tensors":
        groups = list(qc["config_groups"].values())
        assert len(groups) == 1, "one config group expected in these checkpoints"
        g = groups[0]
        w = g["weights"]
        fmt = (g.get("format") or qc["format"]).lower()
        if "mxfp4" in fmt:
            exp.update(format="ct-mxfp4", bits=4, group_size=32, sym=True, zero_convention=None)
        elif fmt == "pack-quantized":
            exp.update(format="ct-pack-quantized", bits=w["num_bits"], sym=w["symmetric"], zero_convention="offset",
                       group_size=w["group_size"] if w["strategy"] == "group" else -1,
                       act_order=bool(w.get("actorder")))
        elif fmt == "int-quantized":
            exp.update(format="ct-int-quantized", bits=w["num_bits"], sym=w["symmetric"], zero_convention=None,
                       group_size=w["group_size"] if w["strategy"] == "group" else -1)
        else:
            raise AssertionError(f"{folder.name}: no expectation for compressed-tensors format {fmt!r}")
        act = g.get("input_activations")
        if act:
            exp["activation"] = {"num_bits": act["num_bits"], "type": act["type"]}
    else:
        raise AssertionError(f"{folder.name}: no expectation for quant_method {method!r}")
    if "sym" in scheme and exp["format"] != "ct-mxfp4":
        assert exp["sym"] == scheme["sym"], "provenance scheme and saved config disagree"
    if "group_size" in scheme:
        assert exp["group_size"] == scheme["group_size"]
    return exp


def test_toolkit_checkpoints_are_present():
    found = _toolkit_folders()
    print("toolkit checkpoints:", ", ".join(found))
    assert len(found) >= 10, found


@pytest.mark.parametrize("name", _toolkit_folders())
def test_toolkit_checkpoint_is_detected(name):
    folder = TOOLKIT / name
    if not (folder / "provenance.json").exists():
        pytest.skip(f"{name}: no provenance.json (folder still being written?)")
    exp = _expected_from_provenance(folder)
    ck = Checkpoint(folder)
    layers = {l.name: l for l in ck.layers()}
    assert sorted(layers) == exp["modules"]
    prov = json.loads((folder / "provenance.json").read_text())
    ckpt_tensors = prov.get("checkpoint_tensors") or {}
    for mod, info in layers.items():
        where = f"{name}: {mod}"
        assert info.format == exp["format"], where
        assert tuple(info.shape) == exp["shapes"][mod], where
        assert info.bits == exp["bits"], where
        assert info.group_size == exp["group_size"], where
        assert info.sym == exp["sym"], where
        assert info.act_order == exp["act_order"], where
        assert info.zero_convention == exp["zero_convention"], where
        if exp["activation"] is None:
            assert not info.activation, where
        else:
            assert {k: info.activation.get(k) for k in exp["activation"]} == exp["activation"], where
        for tname in info.tensors.values():
            if ckpt_tensors:
                assert tname in ckpt_tensors, where
                assert ck.tensor_info(tname) == (ckpt_tensors[tname]["dtype"], tuple(ckpt_tensors[tname]["shape"]))


@pytest.mark.parametrize("side_file,drop_method", [("quantization_config.json", False),
                                                   ("quantize_config.json", False), ("quantize_config.json", True)])
def test_quantization_config_side_files(tmp_path, side_file, drop_method):
    """auto-round writes quantization_config.json, AutoGPTQ / GPTQModel quantize_config.json (whose
    quant_method is implied); either stands in for a config.json without quantization_config."""
    cases.write(tmp_path, "gptq-w4g32-asym-v2")
    cfg = json.loads((tmp_path / "config.json").read_text())
    qc = cfg.pop("quantization_config")
    if drop_method:
        qc.pop("quant_method")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / side_file).write_text(json.dumps(qc))
    (info,) = Checkpoint(tmp_path).layers()
    assert (info.format, info.zero_convention, info.sym, info.group_size) == ("gptq", "v2", False, 32)


def test_unknown_quant_method_in_side_file_names_that_file(tmp_path):
    cases.write(tmp_path, "gptq-w4g32-sym-v1")
    cfg = json.loads((tmp_path / "config.json").read_text())
    qc = cfg.pop("quantization_config")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "quantization_config.json").write_text(json.dumps({**qc, "quant_method": "hqq"}))
    with pytest.raises(QconformError) as e:
        Checkpoint(tmp_path)
    assert "quantization_config.json" in str(e.value) and "hqq" in str(e.value)
