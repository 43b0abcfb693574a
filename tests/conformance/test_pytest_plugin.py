"""The pytest plugin turns cases into items that pass, fail with a replay command, or skip with a reason."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pytest(tmp_path, *args, env=None):
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT)
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q",
                           "-p", "no:cacheprovider", "-o", "addopts=", *args],
                          cwd=tmp_path, env=e, capture_output=True, text=True, timeout=600)


def test_plugin_items_pass_on_the_emulator_under_xdist(tmp_path):
    out = tmp_path / "out"
    r = _pytest(tmp_path, "--qconform-backend=emulator", "--qconform-profile=smoke", "--qconform-scheme=w8a8",
                "--qconform-tier=edge", f"--qconform-out={out}", "-n", "2")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    n = int(r.stdout.strip().splitlines()[-1].split()[0])
    assert n >= 5
    recs = [json.loads(l) for f in out.glob("results-*.jsonl") for l in f.read_text().splitlines()]
    assert len(recs) == n and {x["verdict"] for x in recs} <= {"pass", "mistrusted"}


def test_plugin_failure_prints_replay_command(tmp_path):
    out = tmp_path / "out"
    r = _pytest(tmp_path, "--qconform-backend=emulator:act_rounding=rhaz,declare=canonical",
                "--qconform-profile=smoke", "--qconform-scheme=w8a8", "--qconform-tier=edge",
                f"--qconform-out={out}", "-k", "int8-ties")
    assert r.returncode == 1, r.stdout[-2000:]
    assert "qconform replay" in r.stdout and "act_rounding=rhaz" in r.stdout


def test_plugin_without_backend_adds_nothing(tmp_path):
    (tmp_path / "test_x.py").write_text("def test_a():\n    assert True\n")
    r = _pytest(tmp_path)
    assert r.returncode == 0 and "1 passed" in r.stdout
