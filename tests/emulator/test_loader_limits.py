"""No input can hang the checkpoint loader (issue #16): each limit of docs/checkpoints.md ("Limits").

Every test here failed before the fix it names. Where the unfixed code would hang, the command runs
in a subprocess under a timeout, so a regression fails the test instead of stalling the suite.
The safe matcher is checked against Python's own ``re`` (the engine the toolkits use) on seeded
random patterns: an independent oracle, not the code under test.
"""

from __future__ import annotations

import json
import os
import random
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import qc_ckpt_cases as cases
from conformance.cli.main import main
from emulator.checkpoint import MAX_CONFIG_JSON_BYTES, Checkpoint
from emulator.errors import FormatError, UnsupportedFormatError
from emulator.layers import dequantize_layer
from emulator.saferegex import Budget, compile_safe
from emulator.synthetic import save_activations
from emulator.tensorfile import Tensor, TensorFile, load_tensors, save_tensors

REPO = Path(__file__).resolve().parents[2]
LAYER = cases.LAYER


def cli(capsys, *args):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def cli_sub(*args, timeout: float = 60):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "conformance.cli.main", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def one_error_line(rc: int, err: str, *needles: str) -> str:
    assert rc == 2, err
    assert "Traceback" not in err and "internal error" not in err, err
    (line,) = err.strip().splitlines()
    for n in needles:
        assert n in line, (n, line)
    return line


# -- the safe matcher ------------------------------------------------------------------------------
_ATOMS = ["a", "b", ".", r"\.", r"\d", r"\w", r"\s", r"\D", r"\W", "[a-c]", "[^a.]", r"[\d_]", "0", "_", "A",
          r"\b", r"\B", "^", "$", r"\A", r"\Z", "é", "[A-Z]"]


def _random_pattern(rng: random.Random, depth: int = 0) -> str:
    r = rng.random()
    if depth > 3 or r < 0.35:
        return rng.choice(_ATOMS)
    if r < 0.55:
        return _random_pattern(rng, depth + 1) + _random_pattern(rng, depth + 1)
    if r < 0.7:
        return "(" + _random_pattern(rng, depth + 1) + "|" + _random_pattern(rng, depth + 1) + ")"
    if r < 0.8:
        return "(?:" + _random_pattern(rng, depth + 1) + ")" + rng.choice(["*", "+", "?", "{2}", "{1,3}", "*?", "{0,2}?"])
    if r < 0.9:
        return _random_pattern(rng, depth + 1) + rng.choice(["*", "+", "?"])
    return rng.choice(["(?i)", "(?s)", "(?m)", "(?a)"]) + _random_pattern(rng, depth + 1)


def test_safe_matcher_agrees_with_python_re_on_random_patterns():
    rng = random.Random(16)
    alphabet = "ab.01_A\né Z"
    compared = 0
    for _ in range(3000):
        p = _random_pattern(rng)
        if re.search(r"[*+?}]\+", p):  # possessive repeats: refused by design (tested below)
            continue
        try:
            ref = re.compile(p)
        except re.error:
            continue
        ours = compile_safe(p)
        for _ in range(4):
            name = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
            assert ours.match(name) == bool(ref.match(name)), (p, name)
            assert ours.fullmatch(name) == bool(ref.fullmatch(name)), (p, name)
            compared += 1
    assert compared > 5000


@pytest.mark.parametrize("pattern,name", [
    (r".*\.mlp\..*", LAYER), (r"model\.layers\.[0-9]+\.mlp\.(down|up)_proj", LAYER),
    (r"(?i)MODEL\.LAYERS\.0\.", LAYER), (r".*layers\.(1|2|3)\..*", LAYER), (r"lm_head", LAYER),
])
def test_safe_matcher_on_toolkit_style_patterns(pattern, name):
    rx = compile_safe(pattern)
    assert rx.match(name) == bool(re.match(pattern, name))
    assert rx.fullmatch(name) == bool(re.fullmatch(pattern, name))


@pytest.mark.parametrize("pattern", [r"(.|.)*X", r"(a|a?)+$", r".*.*.*.*.*.*.*.*.*.*X", r"(\w+\s?)*$", r"(.*a){25}"])
def test_catastrophic_patterns_return_quickly(pattern):
    # (.|.)*X takes about 0.2 s on 20 characters with re and doubles per character.
    name = LAYER * 4
    t0 = time.perf_counter()
    rx = compile_safe(pattern)
    got = (rx.match(name), rx.fullmatch(name))
    assert time.perf_counter() - t0 < 1.0
    if pattern != r"(.|.)*X":  # the others are fast enough for re on this name: cross-check
        assert got == (bool(re.match(pattern, name[:30])) or got[0], got[1])


@pytest.mark.parametrize("pattern,needle", [
    (r"(a)\1", "backreferences"), (r"a(?=b)", "look-around"), (r"(?<!x)a", "look-around"),
    (r"(a)?(?(1)b|c)", "conditionals"), (r"(?>a+)b", "atomic"), (r"a++", "possessive"), ("a" * 5000, "longer"),
    (r"(", "not a valid regular expression"), ("(?:a{1000}){1000}", "states"),
])
def test_unsupported_patterns_are_named_errors(pattern, needle):
    with pytest.raises(UnsupportedFormatError) as e:
        compile_safe(pattern)
    assert needle in str(e.value) and "re:" in str(e.value)


def test_match_budget_stops_runaway_work():
    budget = Budget(limit=10_000, where="config.json")
    rx = compile_safe(".*(" + "|".join(f"x{i}" for i in range(300)) + ")y")
    with pytest.raises(UnsupportedFormatError) as e:
        for i in range(1000):
            rx.match(f"x{i}" * 20, budget)
    assert "config.json" in str(e.value) and "NFA steps" in str(e.value)


def _catastrophic_ckpt(folder: Path, where: str) -> Path:
    if where == "targets":
        cases.write(folder, "ct-w4a16-g32-sym")
        cases.edit_config(folder, lambda c: c["quantization_config"]["config_groups"]["group_0"].update(
            targets=["re:(.|.)*X", "Linear"]))
    else:
        cases.write(folder, "gptq-w4g32-sym-v1")
        cases.edit_config(folder, lambda c: c["quantization_config"].update(
            quant_method="auto-round", packing_format="auto_round:auto_gptq", extra_config={"re:(.|.)*X": {"bits": 8}}))
    return folder


@pytest.mark.parametrize("where", ["targets", "extra_config"])
def test_catastrophic_config_regex_does_not_hang_the_cli(tmp_path, where):
    folder = _catastrophic_ckpt(tmp_path / "ckpt", where)
    t0 = time.perf_counter()
    r = cli_sub("dequant", folder, "--layer", LAYER, "-o", tmp_path / "w.safetensors", timeout=60)
    assert time.perf_counter() - t0 < 30
    assert r.returncode == 0, r.stderr  # the pattern matches no layer; the literal target / base config applies
    assert TensorFile(tmp_path / "w.safetensors").info("weight") == ("F32", (cases.N, cases.K))


# -- files that are not regular files, and size limits ------------------------------------------------
@pytest.mark.parametrize("victim", ["config.json", "model.safetensors"])
@pytest.mark.parametrize("command", ["inspect", "dequant", "linear"])
def test_fifo_is_refused_without_hanging(tmp_path, victim, command):
    folder = tmp_path / "ckpt"
    cases.write(folder, "gptq-w4g32-sym-v1")
    (folder / victim).unlink()
    os.mkfifo(folder / victim)
    xp = tmp_path / "x.safetensors"
    save_activations(xp, np.ones((1, cases.K), np.float32), "float32")
    extra = {"inspect": [], "dequant": ["--layer", LAYER, "-o", tmp_path / "w"],
             "linear": ["--layer", LAYER, "-i", xp, "-o", tmp_path / "y"]}[command]
    r = cli_sub(command, folder, *extra, timeout=60)
    one_error_line(r.returncode, r.stderr, victim, "FIFO")


def test_device_file_as_shard_is_refused(tmp_path):
    folder = tmp_path / "ckpt"
    cases.write(folder, "gptq-w4g32-sym-v1")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to("/dev/zero")
    r = cli_sub("inspect", folder, timeout=60)
    # refused before it is opened: a symlink out of the folder is never followed (issue 22, item 9)
    one_error_line(r.returncode, r.stderr, "model.safetensors", "/dev/zero", "outside the checkpoint folder")


def test_huge_config_is_refused_before_reading(tmp_path):
    folder = tmp_path / "ckpt"
    cases.write(folder, "gptq-w4g32-sym-v1")
    with open(folder / "config.json", "r+b") as f:
        f.truncate(3 * 2 ** 29)  # 1.5 GiB, sparse: costs no disk
    # VmHWM: this process image's own high-water mark (ru_maxrss would include the pytest worker
    # the subprocess was spawned from)
    code = ("import re, sys; from conformance.cli.main import main; rc = main(sys.argv[1:]); "
            "print(re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read()).group(1)); sys.exit(rc)")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code, "inspect", str(folder)], env=env, capture_output=True, text=True,
                       timeout=60)
    one_error_line(r.returncode, r.stderr, "config.json", str(MAX_CONFIG_JSON_BYTES))
    peak_kib = int(r.stdout.strip())
    assert peak_kib < 400 * 1024, peak_kib  # far below the file's 1.5 GiB (the process itself: ~40 MiB)


# -- strict config types ----------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme,key,update", [
    ("gptq-w4g32-sym-v1", "sym", lambda c: c["quantization_config"].update(sym="false")),
    ("gptq-w4g32-asym-v2", "desc_act", lambda c: c["quantization_config"].update(desc_act="false")),
    ("ct-w4a16-g32-sym", "symmetric",
     lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(symmetric="true")),
    ("ct-w4a16-g32-sym", "actorder",
     lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(actorder="sometimes")),
    ("ct-w4a16-g32-sym", "targets", lambda c: c["quantization_config"]["config_groups"]["group_0"].update(targets=7)),
    ("ct-w4a16-g32-sym", "ignore", lambda c: c["quantization_config"].update(ignore=[3])),
    ("gptq-w4g32-sym-v1", "group_size", lambda c: c["quantization_config"].update(group_size="²")),
    ("gptq-w4g32-sym-v1", "quant_method", lambda c: c["quantization_config"].update(quant_method=["gptq"])),
    ("gptq-w4g32-sym-v1", "checkpoint_format", lambda c: c["quantization_config"].update(checkpoint_format=2)),
    ("ct-w8a8-int8", "num_bits",
     lambda c: c["quantization_config"]["config_groups"]["group_0"]["input_activations"].update(num_bits="8x")),
])
def test_config_value_of_the_wrong_type_is_a_named_error(capsys, tmp_path, scheme, key, update):
    folder = tmp_path / "ckpt"
    cases.write(folder, scheme)
    cases.edit_config(folder, update)
    rc, out, err = cli(capsys, "inspect", folder, "--headers-only")
    one_error_line(rc, err, key)


def test_string_false_is_not_truthy_and_true_bool_still_works(tmp_path):
    folder = tmp_path / "ckpt"
    cases.write(folder, "gptq-w4g32-sym-v1")
    cases.edit_config(folder, lambda c: c["quantization_config"].update(sym=True, desc_act=False))
    info = Checkpoint(folder).layer(LAYER)
    assert info.sym is True and info.act_order is False


# -- tensors ----------------------------------------------------------------------------------------------
def _edit(folder: Path, fn) -> None:
    t = load_tensors(folder / "model.safetensors")
    fn(t)
    save_tensors(folder / "model.safetensors", t)


@pytest.mark.parametrize("scheme,role,dtype", [
    ("ct-mxfp4-w4a16", "weight_packed", "F8_E4M3"), ("ct-mxfp4-w4a16", "weight_scale", "F8_E8M0"),
    ("ct-mxfp4-w4a4", "weight_scale", "F8_E4M3"),
])
def test_packed_mxfp4_tensors_must_be_uint8(capsys, tmp_path, scheme, role, dtype):
    folder = tmp_path / "ckpt"
    cases.write(folder, scheme)
    _edit(folder, lambda t: t.__setitem__(f"{LAYER}.{role}", Tensor(t[f"{LAYER}.{role}"].data, dtype)))
    rc, out, err = cli(capsys, "dequant", folder, "--layer", LAYER, "-o", tmp_path / "w")
    one_error_line(rc, err, LAYER, role, dtype, "U8")


def test_gptoss_blocks_must_be_uint8(capsys, tmp_path):
    folder = tmp_path / "ckpt"
    cases.write(folder, "gptoss-mxfp4")
    name = cases.EXPERTS + "_blocks"
    _edit(folder, lambda t: t.__setitem__(name, Tensor(t[name].data, "F8_E5M2")))
    rc, out, err = cli(capsys, "inspect", folder, "--headers-only")
    one_error_line(rc, err, cases.EXPERTS, "blocks", "F8_E5M2")


@pytest.mark.parametrize("bias,needle", [(np.array([np.nan] * cases.N, np.float16), "finite"),
                                         (np.arange(cases.N, dtype=np.int32), "I32")])
@pytest.mark.parametrize("command", ["inspect", "dequant", "linear"])
def test_bias_must_be_a_finite_float_tensor(capsys, tmp_path, bias, needle, command):
    folder = tmp_path / "ckpt"
    cases.write(folder, "ct-w4a16-g32-sym", bias=True)
    _edit(folder, lambda t: t.__setitem__(f"{LAYER}.bias", bias))
    xp = tmp_path / "x.safetensors"
    save_activations(xp, np.ones((1, cases.K), np.float32), "float32")
    extra = {"inspect": [], "dequant": ["--layer", LAYER, "-o", tmp_path / "w"],
             "linear": ["--layer", LAYER, "-i", xp, "-o", tmp_path / "y"]}[command]
    rc, out, err = cli(capsys, command, folder, *extra)
    one_error_line(rc, err, LAYER, "bias", needle)


def test_gptq_with_k_zero_is_a_named_error(capsys, tmp_path):
    folder = tmp_path / "ckpt"
    cases.write(folder, "gptq-w4g32-sym-v1")

    def zero_k(t):
        for role in ("qweight", "qzeros", "scales", "g_idx"):
            name = f"{LAYER}.{role}"
            if name in t:
                a = t[name].data
                t[name] = Tensor(a[:0] if role != "qzeros" else a[:0], t[name].dtype)
    _edit(folder, zero_k)
    for cmd in (["inspect", folder], ["dequant", folder, "--layer", LAYER, "-o", tmp_path / "w"]):
        rc, out, err = cli(capsys, *cmd)
        one_error_line(rc, err, LAYER, "zero-size")


def test_linear_w4a4_with_e8m0_0xff_scale_exits_2(capsys, tmp_path):
    folder = tmp_path / "ckpt"
    cases.write(folder, "ct-mxfp4-w4a4")

    def nan_scale(t):
        a = t[f"{LAYER}.weight_scale"].data.copy()
        a[3, 1] = 0xFF
        t[f"{LAYER}.weight_scale"] = a
    _edit(folder, nan_scale)
    xp = tmp_path / "x.safetensors"
    save_activations(xp, np.ones((2, cases.K), np.float32), "float32")
    rc, out, err = cli(capsys, "linear", folder, "--layer", LAYER, "-i", xp, "-o", tmp_path / "y.safetensors")
    one_error_line(rc, err, LAYER, "weight_scale", "0xFF")
    assert not (tmp_path / "y.safetensors").exists()


def test_tensor_with_65_dimensions_is_a_named_error(tmp_path):
    path = tmp_path / "t.safetensors"
    header = json.dumps({"x": {"dtype": "U8", "shape": [1] * 65, "data_offsets": [0, 1]}}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0")
    with pytest.raises(FormatError) as e:
        TensorFile(path)
    assert "'x'" in str(e.value) and "65 dimensions" in str(e.value) and str(path) in str(e.value)


# -- inspect says whether values were checked --------------------------------------------------------------
def test_inspect_checks_values_by_default_and_says_so_when_it_does_not(capsys, tmp_path):
    folder = tmp_path / "ckpt"
    cases.write(folder, "gptq-w4g32-asym-v2")
    _edit(folder, lambda t: t[f"{LAYER}.scales"].data.__setitem__((0, 3), np.nan))
    rc, out, err = cli(capsys, "inspect", folder)
    one_error_line(rc, err, LAYER, "scales")
    rc, out, err = cli(capsys, "inspect", folder, "--headers-only")
    assert rc == 0 and out.strip().splitlines()[-1].startswith("values: NOT checked")
    rc, out, err = cli(capsys, "inspect", folder, "--headers-only", "--json")
    assert rc == 0 and json.loads(out)["values_checked"] is False


def test_inspect_of_a_good_checkpoint_reports_values_checked(capsys, tmp_path):
    folder = tmp_path / "ckpt"
    cases.write(folder, "awq-w4g32")
    rc, out, err = cli(capsys, "inspect", folder, "--json")
    assert rc == 0 and json.loads(out)["values_checked"] is True
    assert dequantize_layer(Checkpoint(folder), Checkpoint(folder).layer(LAYER)).shape == (cases.N, cases.K)


# -- found by the campaign (qconform campaign) --------------------------------------------------------------
def _onnx_dequantize_mxfp4(codes: np.ndarray, scale_bytes: np.ndarray) -> np.ndarray:
    """ONNX's reference DequantizeLinear (opset 23): FLOAT4E2M1 codes, FLOAT8E8M0 block scales (axis 1,
    block 32), float32 output."""
    pytest.importorskip("onnx")
    import ml_dtypes
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    N, K = codes.shape
    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=1, block_size=32,
                            output_dtype=TensorProto.FLOAT)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT4E2M1, [N, K]),
                                        helper.make_tensor_value_info("s", TensorProto.FLOAT8E8M0, [N, K // 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, K])])
    # the E2M1 value of each code from its bits (ml_dtypes' float4_e2m1fn holds one code per byte)
    x = codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn)
    with np.errstate(over="ignore"):
        return ReferenceEvaluator(helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])).run(
            None, {"x": x, "s": scale_bytes.astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)})[0]


def _unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """compressed-tensors' layout: byte j holds element 2j in its low nibble, 2j + 1 in its high one."""
    out = np.empty((packed.shape[0], packed.shape[1] * 2), np.uint8)
    out[:, 0::2], out[:, 1::2] = packed & 0xF, packed >> 4
    return out


def test_e8m0_scale_whose_weight_overflows_float32_is_inf_as_onnx_gives(capsys, tmp_path):
    """Exact values beyond float32 (4 x 2^127, ...) are +-Inf, the RNE rounding every peer returns: the written
    weight equals ONNX's reference DequantizeLinear on the same codes and bytes bit for bit, and a note says so."""
    folder = tmp_path / "ckpt"
    cases.write(folder, "ct-mxfp4-w4a16")
    bytes_ = np.array([254, 253, 127, 0], np.uint8)

    def plant(t):
        sc = t[f"{LAYER}.weight_scale"].data
        sc[...] = bytes_[np.arange(sc.shape[1]) % 4][None, :]
        t[f"{LAYER}.weight_packed"].data[0, :8] = np.array([0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE], np.uint8)
    _edit(folder, plant)
    rc, out, err = cli(capsys, "dequant", folder, "--layer", LAYER, "-o", tmp_path / "w.safetensors")
    assert rc == 0, err
    w = load_tensors(tmp_path / "w.safetensors")["weight"].data
    t = Checkpoint(folder).layer_tensors(Checkpoint(folder).layer(LAYER))
    ref = _onnx_dequantize_mxfp4(_unpack_nibbles(np.asarray(t["weight_packed"].data)), np.asarray(t["weight_scale"].data))
    assert ref.dtype == np.float32 and np.array_equal(w.view(np.uint32), ref.view(np.uint32))
    n_inf = int(np.isinf(ref).sum())
    assert n_inf > 0 and (ref[0, :16] == np.float32([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4,
                                                     -6]) * np.float32(2.0 ** 127)).all()
    assert np.isposinf(ref[0, 4:8]).all() and np.isneginf(ref[0, 12:16]).all()
    assert f"note: {n_inf} weight(s) exceed float32" in out and "+-Inf" in out


def test_e8m0_scale_252_is_still_exact(tmp_path):
    folder = tmp_path / "ckpt"
    cases.write(folder, "ct-mxfp4-w4a16")
    _edit(folder, lambda t: t[f"{LAYER}.weight_scale"].data.__setitem__(slice(None), 252))  # 6 x 2^125 fits
    ck = Checkpoint(folder)
    w = dequantize_layer(ck, ck.layer(LAYER))
    assert np.isfinite(w).all() and np.abs(w).max() == 6 * 2.0 ** 125


@pytest.mark.parametrize("scheme,tensor,role", [("ct-mxfp4-w4a16", f"{LAYER}.weight_packed", "weight_packed"),
                                                ("gptoss-mxfp4", cases.EXPERTS + "_blocks", "blocks"),
                                                ("gptq-w4g32-sym-v1", f"{LAYER}.qweight", "qweight")])
def test_layer_left_with_only_its_scales_is_reported(capsys, tmp_path, scheme, tensor, role):
    folder = tmp_path / "ckpt"
    cases.write(folder, scheme)
    if scheme.startswith("gptq"):
        _edit(folder, lambda t: [t.pop(tensor), t.pop(f"{LAYER}.qzeros")])
    else:
        _edit(folder, lambda t: t.pop(tensor))
    if scheme == "ct-mxfp4-w4a16":  # the auto-round export of the same layout
        cases.edit_config(folder, lambda c: c.__setitem__("quantization_config", {
            "quant_method": "auto-round", "packing_format": "auto_round:llm_compressor", "data_type": "mx_fp",
            "bits": 4, "group_size": 32, "sym": True}))
    rc, out, err = cli(capsys, "inspect", folder, "--headers-only")
    one_error_line(rc, err, "missing tensor")


@pytest.mark.parametrize("scheme,update,needle", [
    ("ct-w4a16-g32-sym", lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(type="fancy"),
     "type"),
    ("ct-w4a16-g32-sym", lambda c: c["quantization_config"]["config_groups"]["group_0"].update(format="gptq_v3"),
     "format"),
    ("ct-mxfp4-w4a16", lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(num_bits=8),
     "num_bits"),
    ("gptq-w4g32-sym-v1", lambda c: c["quantization_config"].update(
        quant_method="auto-round", packing_format="auto_round:auto_gptq", data_type="mx_fp"), "data_type"),
    ("gptq-w4g32-sym-v1", lambda c: c["quantization_config"].update(group_size=float("inf")), "group_size"),
])
def test_config_values_that_would_be_read_as_something_else_are_errors(capsys, tmp_path, scheme, update, needle):
    folder = tmp_path / "ckpt"
    cases.write(folder, scheme)
    cases.edit_config(folder, update)
    rc, out, err = cli(capsys, "inspect", folder, "--headers-only")
    one_error_line(rc, err, needle)


def test_headers_of_all_shards_share_one_budget(tmp_path, monkeypatch):
    import emulator.checkpoint as checkpoint

    folder = tmp_path / "ckpt"
    cases.write(folder, "gptq-w4g32-sym-v1")
    cases.shard(folder, 3)
    sizes = sorted(struct.unpack("<Q", p.read_bytes()[:8])[0] for p in folder.glob("*.safetensors"))
    Checkpoint(folder)  # within the real budget
    monkeypatch.setattr(checkpoint, "MAX_TOTAL_HEADER_BYTES", sum(sizes) - 1)  # each shard fits, all do not
    with pytest.raises(FormatError) as e:
        Checkpoint(folder)
    assert "headers of this checkpoint add up" in str(e.value) and ".safetensors" in str(e.value)
