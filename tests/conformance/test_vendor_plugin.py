"""A third-party backend installed as its own package is found, certified and its bundle verifies.

examples/vendor-plugin is installed into a throw-away virtual environment that sees this Python's
packages (``python -m venv --system-site-packages --without-pip``; this Python's pip then runs
``pip install --no-deps --no-build-isolation -e``: no network). Everything else runs with that environment's interpreter, so the backend is reached
only through its ``qconform.backends`` entry point -- no QCONFORM_EXTRA_BACKENDS, no PYTHONPATH.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "examples" / "vendor-plugin"


def _run(cmd, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("QCONFORM_EXTRA_BACKENDS", "PYTHONPATH")}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory):
    venv = tmp_path_factory.mktemp("vendor-venv") / "venv"
    # --without-pip: the venv's own bootstrapped pip/setuptools would shadow this Python's (and an old
    # bundled setuptools cannot build a wheel without the 'wheel' package); the system pip is visible
    r = _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)])
    if r.returncode != 0:
        pytest.skip(f"cannot create a virtual environment here: {r.stderr.strip()[-300:]}")
    py = venv / "bin" / "python"
    r = _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-e",
              str(PLUGIN)])
    assert r.returncode == 0, r.stdout + r.stderr
    return str(py)


_REGISTRY = ("import json; from backends.registry import registered, create; r = registered(); "
             "b = create('vendor-w4a16') if 'vendor-w4a16' in r else None; "
             "print(json.dumps({'origin': r.get('vendor-w4a16'), 'available': b and b.availability().available, "
             "'schemes': b and b.schemes()}))")


def test_plugin_is_registered_through_its_entry_point(venv_python):
    r = _run([venv_python, "-c", _REGISTRY])
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["origin"].startswith("entry point qconform_vendor_example.backend:")
    assert got["available"] and got["schemes"] == ["w4a16"]
    # the plugin is not visible to an interpreter that has not installed it
    r = _run([sys.executable, "-c", _REGISTRY])
    assert json.loads(r.stdout)["origin"] is None


def test_plugin_is_certified_end_to_end_and_the_bundle_verifies(venv_python, tmp_path):
    bundle = tmp_path / "vendor-bundle"
    r = _run([venv_python, "-m", "conformance.cli.main", "certify", "--backend", "vendor-w4a16", "--profile", "smoke",
              "--scheme", "w4a16", "--tier", "exact", "--tier", "edge", "--out", str(bundle), "--no-progress"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "certification: PASS" in r.stdout
    v = _run([venv_python, "-m", "conformance.cli.main", "verify-bundle", str(bundle), "--json"])
    assert v.returncode == 0, v.stdout[-3000:] + v.stderr[-2000:]
    rep = json.loads(v.stdout)
    assert rep["ok"] and rep["problems"] == []
    assert rep["checked"].get("recomputed", 0) > 0  # verdicts were recomputed from stored outputs
    # the verdicts: GPTQ cases judged, everything else refused with the adapter's reason
    results = [json.loads(l) for l in (bundle / "results.jsonl").read_text().splitlines() if l.strip()]
    results = [x for x in results if x.get("kind") == "result"]
    judged = [x for x in results if x["verdict"] != "unsupported"]
    assert judged and all(x["weight_format"] == "gptq" for x in judged)
    assert {x["verdict"] for x in judged} <= {"pass", "mistrusted"}
    act_order = [x for x in results if x["spec"]["case"]["act_order"]]
    assert act_order and all(x["verdict"] == "unsupported" and "act order" in x["reason"] for x in act_order)
    # the bundle records the arithmetic the plugin declared
    decl = [x["declared"] for x in judged]
    assert all(d["weight_dtype"] == "bfloat16" and d["accumulate"] == "float32" for d in decl)
    # tampering is detected
    res_file = bundle / "results.jsonl"
    res_file.write_text(res_file.read_text().replace('"verdict": "pass"', '"verdict": "fail"', 1))
    v = _run([venv_python, "-m", "conformance.cli.main", "verify-bundle", str(bundle)])
    assert v.returncode == 1


def test_fingerprint_recovers_the_plugins_declared_dequantization(venv_python, tmp_path):
    out = tmp_path / "fp.json"
    r = _run([venv_python, "-m", "conformance.cli.main", "fingerprint", "--backend", "vendor-w4a16", "--scheme", "w4a16",
              "--axis", "gptq_v1_zero", "--axis", "dequant", "--json", str(out)])
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    axes = {a["axis"]: a for a in json.loads(out.read_text())["schemes"]["w4a16"]["axes"]}
    assert axes["dequant"]["consistent"] == ["bfloat16/sub_then_mul"]
    assert axes["gptq_v1_zero"]["consistent"] == ["canonical"]
