"""How the independent-kernel regression gates run a plugin (examples/independent-kernels/*): ``qconform run`` in a
subprocess with the plugin's backends registered through QCONFORM_EXTRA_BACKENDS, one scheme and tier of the ci
profile, -j 1. Shared by tests/conformance/test_independent_kernels*.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_plugin(tmp_path: Path, plugin: Path, spec: str, backend: str, scheme: str,
               tier: str) -> tuple[int, dict, str]:
    """(exit status, summary.json, console text) of ``backend`` on ``scheme``'s ``tier`` of the ci profile."""
    env = dict(os.environ, QCONFORM_EXTRA_BACKENDS=spec, PYTHONPATH=os.pathsep.join([str(ROOT), str(plugin)]))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "conformance.cli.main", "run", "--backend", backend, "--profile", "ci",
                        "--scheme", scheme, "--tier", tier, "-j", "1", "--no-progress", "--out", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    return r.returncode, summary, r.stdout + r.stderr
