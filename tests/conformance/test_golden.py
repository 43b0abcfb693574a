"""Golden tensors: the committed files verify, regenerate byte for byte, and catch a flipped byte."""

import shutil

import numpy as np
import pytest

from conformance.cases import golden
from conformance.judge.golden_regenerate import regenerate


def test_committed_golden_files_verify():
    assert golden.verify() == []
    specs = golden.golden_specs()
    assert len(specs) >= 40
    schemes = {s.case.scheme for s in specs}
    assert schemes == {"w4a16", "w8a8", "w4a8", "w4a16-mxfp4", "w4a4-mxfp4", "w4a16-moe", "q-int8-token",
                       "q-uint8-tensor", "q-mxfp4"}


def _data_files(folder) -> list[str]:
    """The golden data of a folder: its safetensors files and the manifest (not the package's __init__.py)."""
    return sorted(p.name for p in folder.iterdir() if p.suffix == ".safetensors" or p.name == golden.MANIFEST)


def test_golden_package_holds_only_data_and_its_docstring():
    """golden/ is a data package: anything else in it (a stray file, a module) would ship unchecked."""
    names = {p.name for p in golden.GOLDEN_DIR.iterdir()} - {"__pycache__"}
    assert names - set(_data_files(golden.GOLDEN_DIR)) == {"__init__.py"}


def test_regenerate_reproduces_every_byte(tmp_path):
    regenerate(tmp_path)
    committed = _data_files(golden.GOLDEN_DIR)
    fresh = sorted(p.name for p in tmp_path.iterdir())
    assert committed == fresh
    for name in committed:
        assert (tmp_path / name).read_bytes() == (golden.GOLDEN_DIR / name).read_bytes(), name


def test_flipped_byte_is_named(tmp_path):
    dst = tmp_path / "g"
    shutil.copytree(golden.GOLDEN_DIR, dst)
    victim = sorted(dst.glob("*.safetensors"))[3]
    data = bytearray(victim.read_bytes())
    data[-5] ^= 0x01
    victim.write_bytes(bytes(data))
    problems = golden.verify(dst)
    assert len(problems) == 1 and problems[0].startswith(victim.name)
    (dst / sorted(p.name for p in dst.glob("*.safetensors"))[0]).unlink()
    assert any("missing" in p for p in golden.verify(dst))
    (dst / "extra.safetensors").write_bytes(b"x")
    assert any(p.startswith("extra.safetensors: not in the manifest") for p in golden.verify(dst))


def test_cli_golden_verify_fails_naming_the_file(tmp_path, capsys):
    from conformance.cli.main import main

    dst = tmp_path / "g"
    shutil.copytree(golden.GOLDEN_DIR, dst)
    victim = sorted(dst.glob("*.safetensors"))[0]
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert main(["golden", "verify", "--dir", str(dst)]) == 1
    assert victim.name in capsys.readouterr().out
    assert main(["golden", "verify"]) == 0


def test_emulator_reproduces_golden_outputs():
    """The stored references equal what the emulator computes now (a regression gate on the emulator)."""
    from backends.base import Declared
    from conformance.judge.acceptance import declared_interval

    from conformance.judge.quantized import decide_quantized, expected_for
    from emulator.tensorfile import load_tensors

    for spec in golden.golden_specs():
        inp = golden.golden_inputs(spec)
        if spec.case.spec.quantize_only:  # stored codes, scales, zero points, dequantized values
            t = load_tensors(golden.GOLDEN_DIR / (spec.generator + ".safetensors"))
            stored = {k[len("q_expected."):]: v.data for k, v in t.items() if k.startswith("q_expected.")}
            now = expected_for(spec.case, inp.x, Declared(variants={}))
            assert stored and decide_quantized(now, stored)["exact_match"], spec.generator
            continue
        exp = golden.golden_expected(spec)
        iv = declared_interval(inp, Declared(variants={}, accumulate="exact", output=spec.case.output_dtype))
        np.testing.assert_array_equal(iv.y_ref, exp["y_ref"], err_msg=spec.generator)


# -- the golden tensors ship with the package ---------------------------------------------------------------
def test_golden_folder_is_the_package_data_found_through_importlib_resources():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "QCONFORM_GOLDEN_DIR"}
    env["PYTHONPATH"] = str(root)
    code = ("from importlib import resources; from conformance.cases import golden; "
            "print(golden.GOLDEN_DIR); print(resources.files('golden'))")
    r = subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True, timeout=120)
    lines = r.stdout.split()
    assert r.returncode == 0 and lines[0] == lines[1] == str(root / "golden"), r.stderr


def test_pyproject_package_data_lists_every_golden_file():
    import fnmatch
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    conf = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "golden" in conf["packages"]
    globs = conf["package-data"]["golden"]
    files = _data_files(golden.GOLDEN_DIR)
    assert len(files) == len(golden.golden_specs()) + 1  # + MANIFEST.json
    assert [f for f in files if not any(fnmatch.fnmatch(f, g) for g in globs)] == []


def _build_wheel(tmp_path):
    """A real wheel of the checkout (setuptools, no network, no build isolation): its path."""
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    root = Path(__file__).resolve().parents[2]
    src = tmp_path / "src"
    shutil.copytree(root, src, ignore=shutil.ignore_patterns(".git", "*.egg-info", "build", "dist", "__pycache__",
                                                              ".tox", ".venv", "qconform-out", "tests"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return next((tmp_path / "dist").glob("qconform-*.whl"))


def test_wheel_carries_the_golden_tensors(tmp_path):
    """A real wheel build (setuptools, no network): every golden file is inside it, byte for byte."""
    import zipfile

    whl = _build_wheel(tmp_path)
    with zipfile.ZipFile(whl) as z:
        for name in _data_files(golden.GOLDEN_DIR):
            assert z.read(f"golden/{name}") == (golden.GOLDEN_DIR / name).read_bytes(), name


def test_missing_golden_set_is_an_error_not_fewer_cases(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), QCONFORM_GOLDEN_DIR=str(tmp_path / "nowhere"))
    r = subprocess.run([sys.executable, "-m", "conformance.cli.main", "run", "--backend", "emulator", "--out",
                        str(tmp_path / "o"), "--no-progress"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "golden tensors not found" in err[0] and str(tmp_path / "nowhere") in err[0]
    assert not (tmp_path / "o" / "results.jsonl").exists()
    with pytest.raises(Exception, match="golden tensors not found"):
        golden.golden_specs(tmp_path)


@pytest.mark.slow
def test_non_editable_install_judges_the_golden_tier_from_another_folder(tmp_path):
    """A wheel installed into a fresh venv (no checkout on its path), run from an unrelated folder: the golden tier
    is found as package data of the top-level ``golden`` package and judged, not skipped or shrunk."""
    import json
    import os
    import subprocess
    import sys
    import venv

    whl = _build_wheel(tmp_path)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(whl)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "QCONFORM_GOLDEN_DIR")}
    r = subprocess.run([str(py), "-c", "import conformance, golden; print(conformance.__file__); print(golden.__file__)"],
                       cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and all(line.startswith(str(env_dir)) for line in r.stdout.split()), r.stdout + r.stderr
    r = subprocess.run([str(py), "-m", "conformance.cli.main", "run", "--backend", "emulator", "--scheme", "w4a16",
                        "--tier", "golden", "--out", str(work / "out"), "-j", "1"],
                       cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = [json.loads(line) for line in (work / "out" / "results.jsonl").read_text().splitlines() if line]
    judged = [x for x in results if x.get("kind") == "result" and x.get("tier") == "golden" and x["verdict"] == "pass"]
    expected = [s for s in golden.golden_specs() if s.case.scheme == "w4a16"]
    assert expected and len(judged) == len(expected), r.stdout[-3000:]
