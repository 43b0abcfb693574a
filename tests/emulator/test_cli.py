"""The ``qconform`` command line (conformance/cli/main.py).

Most calls run ``main([...])`` in-process (fast); a few run ``python -m conformance.cli.main`` in a
subprocess to check what a user sees: exit status, one error line, no traceback. Output files are
read back with the `safetensors` library, and results are checked against independent oracles:
exact rational rounding (fractions), numpy float32 arithmetic for the documented int8 activation
quantizer, the checkpoint's own stored scales for the half-step bound.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy as stnp
import safetensors.torch as stt
import torch

import qc_ckpt_cases as cases
from conformance.cli.main import main
from emulator.checkpoint import Checkpoint
from emulator.layers import dequantize_layer
from emulator.synthetic import SCHEMES

REPO = Path(__file__).resolve().parents[2]
TOOLKIT = REPO / "tests" / "data" / "toolkit_checkpoints"
LAYER = cases.LAYER
A16_SCHEMES = ["gptq-w4g32-asym-v2", "gptq-w4g32-asym-v2-actorder", "awq-w4g32", "ct-w4a16-g32-sym",
               "ct-mxfp4-w4a16"]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """One synthetic checkpoint per scheme (with bias), and the original weights."""
    root = tmp_path_factory.mktemp("ckpts")
    out = {}
    for scheme in SCHEMES:
        originals = cases.write(root / scheme, scheme, bias=True)
        out[scheme] = (root / scheme, originals)
    return out


def cli(capsys, *args) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def cli_sub(*args, timeout: int = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "conformance.cli.main", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def assert_input_error(rc: int, err: str, cmd: str, *needles: str, out: str = "") -> str:
    """Exit 2, and stderr is one line 'qconform <cmd>: error: ...' naming every needle; no traceback."""
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, err
    assert lines[0].startswith(f"qconform {cmd}: error: "), lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert out == ""
    return lines[0]


def read_st(path: Path) -> tuple[dict, dict]:
    """Tensors (torch) and metadata of a file, read by the reference library."""
    with safetensors.safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, (f.metadata() or {})


# -- exact rounding oracle -----------------------------------------------------------------------
_BITS = {"float32": (np.float32, np.uint32), "float16": (np.float16, np.uint16),
         "bfloat16": (ml_dtypes.bfloat16, np.uint16)}


def round_exact(v: float, dtype: str) -> float:
    """The value of ``dtype`` nearest the float64 ``v`` (ties to even), decided with exact fractions
    among the neighbours of a first guess; no cast's own rounding is trusted."""
    if v == 0 or not np.isfinite(v):
        return v
    ft, ut = _BITS[dtype]
    guess = np.array([v]).astype(np.float32).astype(ft) if dtype == "bfloat16" else np.array([v]).astype(ft)
    b = int(guess.view(ut)[0])
    cands = []
    for d in (-2, -1, 0, 1, 2):
        c = np.array([b + d], dtype=np.int64).astype(ut).view(ft).astype(np.float64)[0]
        if np.isfinite(c) and (c == 0 or np.sign(c) == np.sign(v)):
            cands.append((c, (b + d) & 1))
    ex = Fraction(v)
    best = min(cands, key=lambda c: (abs(Fraction(c[0]) - ex), c[1]))
    return best[0]


def test_round_exact_oracle_itself():
    # a float64 value just above a bfloat16 tie: rounding through float32 would land on the tie
    v = 1 + 2.0 ** -8 + 2.0 ** -30
    assert round_exact(v, "bfloat16") == 1 + 2.0 ** -7
    assert float(np.float32(v).astype(ml_dtypes.bfloat16)) == 1.0  # the double-rounding trap exists
    assert round_exact(1 + 2.0 ** -8, "bfloat16") == 1.0  # exact tie: to even
    assert round_exact(1 + 3 * 2.0 ** -8, "bfloat16") == 1 + 2.0 ** -6
    assert round_exact(-(1 + 2.0 ** -11 + 2.0 ** -24), "float16") == -(1 + 2.0 ** -10)
    assert round_exact(1 + 2.0 ** -24 + 2.0 ** -50, "float32") == 1 + 2.0 ** -23


def _as64(t: torch.Tensor) -> np.ndarray:
    return t.double().numpy()


def check_y_rounds_y_exact(y: torch.Tensor, y_exact: np.ndarray, dtype: str) -> None:
    y64 = _as64(y)
    want = np.vectorize(lambda v: round_exact(float(v), dtype))(y_exact)
    assert np.array_equal(y64, want), np.argwhere(y64 != want)[:5]
    assert np.array_equal(np.signbit(y64), np.signbit(want))


# -- inspect -------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_inspect_text(capsys, ckpts, scheme):
    folder, _ = ckpts[scheme]
    rc, out, err = cli(capsys, "inspect", folder)
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert str(folder) in lines[0] and "layers=1" in lines[0]
    assert lines[1].split()[:3] == ["layer", "format", "shape"]
    row = lines[2].split()
    exp = cases.EXPECTED[scheme]
    assert row[0] == cases.layer_name(scheme) and row[1] == exp["format"]
    assert row[2] == "x".join(map(str, cases.expected_shape(scheme)))
    assert row[3] == str(exp["bits"]) and row[4] == str(exp["group_size"])
    assert len(lines) == 4 and lines[3].startswith("values: checked")


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_inspect_json(capsys, ckpts, scheme):
    folder, _ = ckpts[scheme]
    rc, out, err = cli(capsys, "inspect", folder, "--json")
    assert rc == 0 and err == ""
    doc = json.loads(out)
    cfg = json.loads((folder / "config.json").read_text())
    assert doc["quant_method"] == cfg["quantization_config"]["quant_method"]
    assert Path(doc["checkpoint"]) == folder
    (layer,) = doc["layers"]
    exp = cases.EXPECTED[scheme]
    assert layer["name"] == cases.layer_name(scheme)
    assert layer["shape"] == list(cases.expected_shape(scheme))
    for key in ("format", "bits", "group_size", "sym", "act_order", "zero_convention"):
        assert layer[key] == exp[key], key
    with safetensors.safe_open(str(folder / "model.safetensors"), framework="np") as f:
        names = set(f.keys())
    assert set(layer["tensors"].values()) <= names
    assert ("bias" in layer["tensors"]) == (f"{layer['name']}.bias" in names)


def test_inspect_json_subprocess(ckpts):
    folder, _ = ckpts["ct-w8a8-int8"]
    r = cli_sub("inspect", folder, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    (layer,) = doc["layers"]
    assert layer["format"] == "ct-int-quantized" and layer["activation"]["num_bits"] == 8


def test_inspect_every_toolkit_checkpoint(capsys):
    folders = sorted(p for p in TOOLKIT.iterdir() if (p / "config.json").exists() and (p / "provenance.json").exists())
    assert folders
    for folder in folders:
        rc, out, err = cli(capsys, "inspect", folder, "--json")
        assert rc == 0, (folder.name, err)
        prov = json.loads((folder / "provenance.json").read_text())
        shapes = {k[: -len(".weight")]: v for k, v in prov["toolkit_dequant"]["tensors"].items()}
        assert {l["name"]: l["shape"] for l in json.loads(out)["layers"]} == shapes, folder.name


# -- dequant -------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_dequant_bit_exact_and_within_half_a_step(capsys, ckpts, tmp_path, scheme):
    folder, originals = ckpts[scheme]
    name = cases.layer_name(scheme)
    out = tmp_path / "w.safetensors"
    rc, stdout, err = cli(capsys, "dequant", folder, "--layer", name, "-o", out)
    assert rc == 0 and err == ""
    assert name in stdout
    tensors, meta = read_st(out)
    assert list(tensors) == ["weight"]
    w = tensors["weight"]
    assert w.dtype == torch.float32 and tuple(w.shape) == cases.expected_shape(scheme)
    assert meta.get("layer") == name and meta.get("format") == cases.EXPECTED[scheme]["format"]
    # bit for bit what the library computes
    ck = Checkpoint(folder)
    ref = dequantize_layer(ck, ck.layer(name))
    assert np.array_equal(w.numpy().view(np.uint32), ref.view(np.uint32))
    # within half a quantization step of the original weight (expert 0 for stacked experts)
    orig = originals[LAYER].astype(np.float64)
    got = w.numpy().astype(np.float64)
    if scheme == "gptoss-mxfp4":
        bound = cases.half_step_bound(folder, scheme, name, np.stack([orig, orig]))[0]
        got = got[0]
    else:
        bound = cases.half_step_bound(folder, scheme, name, orig)
    err_ = np.abs(got - orig)
    assert np.all(err_ <= bound), (float((err_ / np.maximum(bound, 1e-300)).max()), np.argwhere(err_ > bound)[:5])
    assert float((err_ / np.maximum(bound, 1e-300)).max()) > 0.3  # the bound is not vacuous
    if "mxfp4" in scheme:
        assert cases.on_e2m1_grid(w.numpy(), folder, name, cases.EXPECTED[scheme]["format"])


def test_dequant_stacked_experts(capsys, ckpts, tmp_path):
    folder, _ = ckpts["gptoss-mxfp4"]
    out = tmp_path / "w.safetensors"
    rc, _, err = cli(capsys, "dequant", folder, "--layer", cases.EXPERTS, "-o", out)
    assert rc == 0, err
    w = read_st(out)[0]["weight"]
    with safetensors.safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        blocks = f.get_slice(cases.EXPERTS + "_blocks").get_shape()
    E, n, kb, sixteen = blocks
    assert sixteen == 16 and tuple(w.shape) == (E, n, kb * 32) and E == cases.N_EXPERTS
    assert not torch.equal(w[0], w[1])  # two different experts


def test_dequant_accepts_tensor_name_for_layer(capsys, ckpts, tmp_path):
    folder, _ = ckpts["gptq-w4g32-sym-v1"]
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert cli(capsys, "dequant", folder, "--layer", LAYER, "-o", a)[0] == 0
    assert cli(capsys, "dequant", folder, "--layer", LAYER + ".qweight", "-o", b)[0] == 0
    assert a.read_bytes() == b.read_bytes()


# -- linear --------------------------------------------------------------------------------------
def _write_x(path: Path, x: np.ndarray, dtype: str) -> np.ndarray:
    """Write x (values exactly representable in dtype) with the reference library; return them as float64."""
    if dtype == "bfloat16":
        t = torch.from_numpy(np.asarray(x, np.float32)).to(torch.bfloat16)
        assert np.array_equal(t.float().numpy(), np.asarray(x, np.float32))
        stt.save_file({"x": t}, str(path))
        return t.double().numpy()
    a = np.asarray(x, dtype=dtype)
    stnp.save_file({"x": a}, str(path))
    return a.astype(np.float64)


def _random_x(m: int, k: int, dtype: str, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)
    if dtype == "bfloat16":
        x = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    return x.astype(dtype) if dtype != "bfloat16" else x


@pytest.mark.parametrize("dtype,st_name", [("float32", torch.float32), ("float16", torch.float16),
                                           ("bfloat16", torch.bfloat16)])
@pytest.mark.parametrize("scheme", A16_SCHEMES)
def test_linear_a16_output_dtypes_and_rounding(capsys, ckpts, tmp_path, scheme, dtype, st_name):
    folder, _ = ckpts[scheme]
    xp, yp = tmp_path / "x.safetensors", tmp_path / "y.safetensors"
    x64 = _write_x(xp, _random_x(5, cases.K, dtype, seed=11), dtype)
    rc, out, err = cli(capsys, "linear", folder, "--layer", LAYER, "-i", xp, "-o", yp)
    assert rc == 0, err
    t, meta = read_st(yp)
    assert set(t) == {"y", "y_exact"}
    assert t["y"].dtype == st_name and t["y_exact"].dtype == torch.float64
    assert tuple(t["y"].shape) == tuple(t["y_exact"].shape) == (5, cases.N)
    y_exact = t["y_exact"].numpy()
    check_y_rounds_y_exact(t["y"], y_exact, dtype)
    # y_exact is x @ W^T + bias with the dequantized weights (float64 evaluation of an exact product)
    ck = Checkpoint(folder)
    w = dequantize_layer(ck, ck.layer(LAYER)).astype(np.float64)
    with safetensors.safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        bias = f.get_tensor(LAYER + ".bias").double().numpy()
    ref = x64 @ w.T + bias
    scale = np.abs(x64) @ np.abs(w).T + np.abs(bias)
    assert np.all(np.abs(y_exact - ref) <= 1e-13 * scale)


def _unit_weight_checkpoint(folder: Path, n: int = 4, k: int = 32) -> None:
    """compressed-tensors int-quantized int8 weights, scale 1, 16-bit activations; row 0 sums x[0:3]."""
    folder.mkdir(parents=True)
    w = np.zeros((n, k), np.int8)
    w[0, :3] = 1
    w[1, 0] = -1
    stt.save_file({f"{LAYER}.weight": torch.from_numpy(w),
                   f"{LAYER}.weight_scale": torch.ones((n, 1), dtype=torch.bfloat16)},
                  str(folder / "model.safetensors"))
    qc = {"quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
          "config_groups": {"group_0": {"targets": ["Linear"], "format": "int-quantized", "input_activations": None,
                                        "weights": {"num_bits": 8, "type": "int", "symmetric": True,
                                                    "strategy": "channel", "dynamic": False}}}}
    (folder / "config.json").write_text(json.dumps({"quantization_config": qc}))


@pytest.mark.parametrize("dtype,x0,want", [
    # y = x0 + x1 + x2 lies just above a tie of the output dtype; rounding through float32 first
    # would land on the tie and round to even (1.0): the right answer is the upper neighbour.
    ("bfloat16", [1.0, 2.0 ** -8, 2.0 ** -30], 1 + 2.0 ** -7),
    ("float16", [1.0, 2.0 ** -11, 2.0 ** -24], 1 + 2.0 ** -10),
    ("float32", [1.0, 2.0 ** -24, 2.0 ** -50], 1 + 2.0 ** -23),
    # exact ties go to even
    ("bfloat16", [1.0, 2.0 ** -8, 0.0], 1.0),
    ("float16", [1.0, 3 * 2.0 ** -11, 0.0], 1 + 2.0 ** -9),
])
def test_linear_rounds_once_to_x_dtype(capsys, tmp_path, dtype, x0, want):
    folder = tmp_path / "ckpt"
    _unit_weight_checkpoint(folder)
    x = np.zeros((2, 32), np.float32)
    x[0, :3] = x0
    x[1, 0] = 0.5
    xp, yp = tmp_path / "x.safetensors", tmp_path / "y.safetensors"
    _write_x(xp, x, dtype)
    rc, _, err = cli(capsys, "linear", folder, "--layer", LAYER, "-i", xp, "-o", yp)
    assert rc == 0, err
    t, _ = read_st(yp)
    assert t["y_exact"][0, 0].item() == sum(x0)  # exact in float64
    assert t["y"][0, 0].item() == want
    assert t["y"][1, 1].item() == -0.5 and t["y"][1, 2].item() == 0.0


def _int8_oracle(x32: np.ndarray, rounding: str = "rne") -> tuple[np.ndarray, np.ndarray]:
    """Canonical dynamic per-token int8 (docs/formats/activations.md), in numpy float32 arithmetic:
    scale = fl32(amax / 127), q = sat[-128, 127](round(fl32(x / scale)))."""
    amax = np.abs(x32).max(axis=1, keepdims=True)
    scale = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        quot = np.where(scale > 0, x32 / np.where(scale > 0, scale, 1), 0).astype(np.float32).astype(np.float64)
    if rounding == "rne":
        q = np.rint(quot)
    else:  # half away from zero
        q = np.sign(quot) * np.floor(np.abs(quot) + 0.5)
    return np.clip(q, -128, 127).astype(np.int64), scale[:, 0].astype(np.float64)


def _ct_int8_weight(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    with safetensors.safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return (f.get_tensor(LAYER + ".weight").numpy().astype(np.int64),
                f.get_tensor(LAYER + ".weight_scale").double().numpy().reshape(-1))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("act", [None, "int8"])
def test_linear_w8a8_writes_the_integer_accumulator(capsys, ckpts, tmp_path, dtype, act):
    folder, _ = ckpts["ct-w8a8-int8"]
    xp, yp = tmp_path / "x.safetensors", tmp_path / "y.safetensors"
    x64 = _write_x(xp, _random_x(6, cases.K, dtype, seed=5), dtype)
    args = ["linear", folder, "--layer", LAYER, "-i", xp, "-o", yp] + (["--act", act] if act else [])
    rc, _, err = cli(capsys, *args)
    assert rc == 0, err
    t, _ = read_st(yp)
    assert set(t) == {"y", "y_exact", "acc"}
    assert t["acc"].dtype == torch.int64 and tuple(t["acc"].shape) == (6, cases.N)
    q, sx = _int8_oracle(x64.astype(np.float32))
    wq, sw = _ct_int8_weight(folder)
    acc = q @ wq.T
    assert np.array_equal(t["acc"].numpy(), acc)
    with safetensors.safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        bias = f.get_tensor(LAYER + ".bias").double().numpy()
    ref = acc * (sx[:, None] * sw[None, :]) + bias
    y_exact = t["y_exact"].numpy()
    assert np.all(np.abs(y_exact - ref) <= 2.0 ** -50 * (np.abs(ref) + np.abs(bias)))
    check_y_rounds_y_exact(t["y"], y_exact, dtype)


def test_linear_variant_rounding_rhaz_changes_ties_only(capsys, ckpts, tmp_path):
    folder, _ = ckpts["ct-w8a8-int8"]
    x = np.zeros((2, cases.K), np.float32)
    x[0, :4] = [127.0, 0.5, -0.5, 2.5]  # amax 127 -> scale exactly 1 -> quotients 0.5, -0.5, 2.5 are ties
    x[1, :3] = [127.0, 0.25, 3.0]  # no ties: both rules agree
    xp = tmp_path / "x.safetensors"
    _write_x(xp, x, "float32")
    outs = {}
    for name, extra in (("default", []), ("rhaz", ["--variant", "act_rounding=rhaz"])):
        yp = tmp_path / f"{name}.safetensors"
        rc, out, err = cli(capsys, "linear", folder, "--layer", LAYER, "-i", xp, "-o", yp, "--act", "int8", *extra)
        assert rc == 0, err
        assert f"activations: int8; variants: {'act_rounding=rhaz' if extra else 'canonical'}" in out
        outs[name] = read_st(yp)[0]
    wq, _ = _ct_int8_weight(folder)
    dq = _int8_oracle(x, "rhaz")[0] - _int8_oracle(x, "rne")[0]
    assert dq[0, 1:4].tolist() == [1, -1, 1] and not dq[1].any()
    diff = outs["rhaz"]["acc"].numpy() - outs["default"]["acc"].numpy()
    assert np.array_equal(diff, dq @ wq.T)
    assert not torch.equal(outs["rhaz"]["y"][0], outs["default"]["y"][0])
    assert torch.equal(outs["rhaz"]["y"][1], outs["default"]["y"][1])


@pytest.mark.parametrize("variant,needle", [("nonsense=1", "nonsense"), ("act_rounding=sideways", "sideways"),
                                            ("act_rounding", "key=value"), ("act_symmetric=maybe", "act_symmetric"),
                                            ("rounding=rhaz", "it takes: preset, zero_read"), ("moe_renormalize=false", "applies to w4a16-moe"),
                                            ("accumulate=float32", "describes a kernel"),
                                            ("qmin=-200", "qmin")])
def test_linear_bad_variant(capsys, ckpts, tmp_path, variant, needle):
    folder, _ = ckpts["ct-w8a8-int8"]
    xp = tmp_path / "x.safetensors"
    _write_x(xp, np.ones((1, cases.K)), "float32")
    rc, out, err = cli(capsys, "linear", folder, "--layer", LAYER, "-i", xp, "-o", tmp_path / "y.safetensors",
                       "--variant", variant)
    assert_input_error(rc, err, "linear", needle, out=out)
    assert not (tmp_path / "y.safetensors").exists()


def _x_files(tmp_path: Path) -> dict:
    k = cases.K
    d = {}
    d["no-x"] = tmp_path / "nox.safetensors"
    stnp.save_file({"y": np.ones((1, k), np.float32)}, str(d["no-x"]))
    d["int-x"] = tmp_path / "intx.safetensors"
    stnp.save_file({"x": np.ones((1, k), np.int32)}, str(d["int-x"]))
    d["1d-x"] = tmp_path / "x1d.safetensors"
    stnp.save_file({"x": np.ones(k, np.float32)}, str(d["1d-x"]))
    d["wrong-K"] = tmp_path / "xk.safetensors"
    stnp.save_file({"x": np.ones((2, k + 32), np.float32)}, str(d["wrong-K"]))
    d["nan-x"] = tmp_path / "xnan.safetensors"
    stnp.save_file({"x": np.full((1, k), np.nan, np.float32)}, str(d["nan-x"]))
    d["not-safetensors"] = tmp_path / "garbage.safetensors"
    d["not-safetensors"].write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    d["missing-file"] = tmp_path / "absent.safetensors"
    return d


@pytest.mark.parametrize("which,needle", [("no-x", "'x'"), ("int-x", "'x'"), ("1d-x", "'x'"), ("wrong-K", "x"),
                                          ("nan-x", "'x'"), ("not-safetensors", "garbage.safetensors"),
                                          ("missing-file", "absent.safetensors")])
def test_linear_bad_activations(capsys, ckpts, tmp_path, which, needle):
    folder, _ = ckpts["gptq-w4g32-sym-v1"]
    xp = _x_files(tmp_path)[which]
    rc, out, err = cli(capsys, "linear", folder, "--layer", LAYER, "-i", xp, "-o", tmp_path / "y.safetensors")
    assert_input_error(rc, err, "linear", needle, out=out)


@pytest.mark.parametrize("scheme,act,needle", [("gptq-w4g32-sym-v1", "mxfp4", "MXFP4"),
                                               ("gptoss-mxfp4", None, "experts")])
def test_linear_unsupported_combinations(capsys, ckpts, tmp_path, scheme, act, needle):
    folder, _ = ckpts[scheme]
    xp = tmp_path / "x.safetensors"
    _write_x(xp, np.ones((1, cases.K)), "float16")
    args = ["linear", folder, "--layer", cases.layer_name(scheme), "-i", xp, "-o", tmp_path / "y.safetensors"]
    rc, out, err = cli(capsys, *args, *(["--act", act] if act else []))
    assert_input_error(rc, err, "linear", needle, out=out)


def test_linear_nan_weight_scale_with_int8_activations(capsys, tmp_path):
    case = next(c for c in cases.MALFORMED if c.id == "ct-int8-nan-scale")
    folder = cases.build(case, tmp_path / "ckpt")
    xp = tmp_path / "x.safetensors"
    _write_x(xp, np.ones((1, cases.K)), "float32")
    rc, out, err = cli(capsys, "linear", folder, "--layer", LAYER, "-i", xp, "-o", tmp_path / "y.safetensors",
                       "--act", "int8")
    assert_input_error(rc, err, "linear", LAYER, "weight_scale", out=out)


# -- malformed input -----------------------------------------------------------------------------
@pytest.mark.parametrize("case", cases.MALFORMED, ids=[c.id for c in cases.MALFORMED])
def test_dequant_malformed_exit_2_one_line(capsys, tmp_path, case):
    folder = cases.build(case, tmp_path / "ckpt")
    rc, out, err = cli(capsys, "dequant", folder, "--layer", cases.layer_name(case.scheme),
                       "-o", tmp_path / "w.safetensors")
    assert_input_error(rc, err, "dequant", *case.names, out=out)
    if isinstance(case.tensor, str):
        assert case.tensor in err
    assert not (tmp_path / "w.safetensors").exists()


@pytest.mark.parametrize("case", [c for c in cases.MALFORMED if c.layer is None or "config" in c.id
                                  or c.id.startswith("index")], ids=lambda c: c.id)
def test_inspect_malformed_exit_2_one_line(capsys, tmp_path, case):
    folder = cases.build(case, tmp_path / "ckpt")
    rc, out, err = cli(capsys, "inspect", folder)
    assert_input_error(rc, err, "inspect", *case.names, out=out)


@pytest.mark.parametrize("case_id", ["gptq-nan-scale", "index-missing-shard"])
def test_malformed_subprocess_has_no_traceback(tmp_path, case_id):
    case = next(c for c in cases.MALFORMED if c.id == case_id)
    folder = cases.build(case, tmp_path / "ckpt")
    r = cli_sub("dequant", folder, "--layer", cases.layer_name(case.scheme), "-o", tmp_path / "w.safetensors")
    assert_input_error(r.returncode, r.stderr, "dequant", *case.names, out=r.stdout)


def test_unknown_layer_suggests_similar(capsys, ckpts, tmp_path):
    folder, _ = ckpts["awq-w4g32"]
    rc, out, err = cli(capsys, "dequant", folder, "--layer", "model.layers.0.mlp.down_prj", "-o", tmp_path / "w")
    line = assert_input_error(rc, err, "dequant", "down_prj", out=out)
    assert "similar" in line and LAYER in line


def test_unknown_layer_subprocess(ckpts, tmp_path):
    folder, _ = ckpts["ct-w4a16-g32-sym"]
    r = cli_sub("dequant", folder, "--layer", "model.layers.0.mlp.up_proj", "-o", tmp_path / "w.safetensors")
    line = assert_input_error(r.returncode, r.stderr, "dequant", "up_proj", out=r.stdout)
    assert LAYER in line


def test_missing_checkpoint_folder(capsys, tmp_path):
    rc, out, err = cli(capsys, "inspect", tmp_path / "does-not-exist")
    assert_input_error(rc, err, "inspect", "does-not-exist", out=out)


def test_dequant_output_folder_missing(capsys, ckpts, tmp_path):
    folder, _ = ckpts["awq-w4g32"]
    rc, out, err = cli(capsys, "dequant", folder, "--layer", LAYER, "-o", tmp_path / "nowhere" / "w.safetensors")
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1


# -- run -----------------------------------------------------------------------------------------
def test_selfcheck_job(tmp_path):
    out_dir = tmp_path / "out"
    r = cli_sub("selfcheck", "--out", out_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    last = r.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"emulator: (\d+) passed, 0 failed", last)
    assert m, last
    lines = (out_dir / "results.jsonl").read_text().splitlines()
    header, checks = json.loads(lines[0]), [json.loads(l) for l in lines[1:]]
    assert header["kind"] == "run" and header["backend"] == "emulator" and header["schemes"] == list(SCHEMES)
    assert len(checks) == int(m.group(1)) >= len(SCHEMES)
    assert {c["scheme"] for c in checks} == set(SCHEMES)
    for c in checks:
        assert c["verdict"] == "pass" and c["detected_format_ok"] and c["round_trip_ok"] and c["linear_ok"], c
        assert c["format"] == cases.EXPECTED[c["scheme"]]["format"]


def test_synthetic_bf16_activations_round_to_nearest(tmp_path):
    """emulator.synthetic.save_activations (what users call to make -i files) rounds bf16 once, to nearest even."""
    from emulator.synthetic import save_activations

    x = np.array([[1 + 2.0 ** -8 + 2.0 ** -20, -(1 + 2.0 ** -8 + 2.0 ** -30), 1 + 2.0 ** -8, 3.0]])
    save_activations(tmp_path / "x.safetensors", x, "bfloat16")
    got = read_st(tmp_path / "x.safetensors")[0]["x"]
    assert got.dtype == torch.bfloat16
    assert got.double().numpy().tolist() == [[round_exact(float(v), "bfloat16") for v in x[0]]]
    assert got.double().numpy()[0, :3].tolist() == [1 + 2.0 ** -7, -(1 + 2.0 ** -7), 1.0]


def test_linear_preset_equals_its_variants_and_unknown_keys_list_linear_keys(capsys, ckpts, tmp_path):
    """--preset NAME and --variant preset=NAME give the bytes --variant with the preset's own keys gives
    (regression gate), and differ from canonical on the MX layer; an unknown key lists only the keys linear
    takes (not the kernel-only fields accumulate, output, arithmetic)."""
    from conformance.cli.checkpoint_cmds import linear_variant_keys
    from emulator.reference_quantizers import reference_variants

    folder, _ = ckpts["ct-mxfp4-w4a16"]
    xp = tmp_path / "x.safetensors"
    x = np.random.default_rng(0).standard_normal((4, cases.K)) * 4  # EVEN rounds some block's amax up, FLOOR not
    _write_x(xp, x.astype(np.float32), "float32")
    outs = {}
    spelled = [f"--variant={k}={v}" for k, v in reference_variants("torchao-mx-even").items()]
    for name, extra in (("preset", ["--preset", "torchao-mx-even"]), ("key", ["--variant", "preset=torchao-mx-even"]),
                        ("spelled", spelled), ("canonical", [])):
        out = tmp_path / f"{name}.safetensors"
        rc, o, err = cli(capsys, "linear", folder, "--layer", LAYER, "-i", xp, "-o", out, "--act", "mxfp4", *extra)
        assert rc == 0, err
        outs[name] = out.read_bytes()
    assert outs["preset"] == outs["key"] == outs["spelled"] != outs["canonical"]
    rc, out, err = cli(capsys, "linear", folder, "--layer", LAYER, "-i", xp, "-o", tmp_path / "y.safetensors",
                       "--variant", "no_such_key=1")
    listed = err.split("takes:")[1]
    assert rc == 2 and all(k in listed for k in linear_variant_keys())
    assert "accumulate" not in listed and "arithmetic" not in listed
