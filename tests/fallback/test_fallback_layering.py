"""Layering of qconform_torch: emulator <- backends <- qconform_torch <- conformance (docs/fallback.md).

qconform_torch imports emulator and backends, never conformance; emulator and backends never import
qconform_torch (deferred imports included), and emulator stays NumPy-only (no torch anywhere in it).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imported(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_qconform_torch_sits_between_backends_and_conformance():
    files = sorted((ROOT / "qconform_torch").glob("*.py"))
    assert len(files) >= 4
    bad = [f"{p.name} imports conformance" for p in files if "conformance" in _imported(p)]
    assert not bad, bad
    assert any("backends" in _imported(p) for p in files)  # the dispatcher really is used


def test_lower_layers_never_import_qconform_torch_and_emulator_has_no_torch():
    bad = []
    for pkg in ("emulator", "backends"):
        for p in sorted((ROOT / pkg).rglob("*.py")):
            imps = _imported(p)
            if "qconform_torch" in imps:
                bad.append(f"{p.relative_to(ROOT)} imports qconform_torch")
            if pkg == "emulator" and "torch" in imps:
                bad.append(f"{p.relative_to(ROOT)} imports torch")
    assert not bad, bad


def test_qconform_parser_does_not_import_torch():
    """`pip install .` has no torch: every other command must still start (qconform model imports it lazily)."""
    import subprocess
    import sys

    code = ("import sys, conformance.cli.main as c; c.build_parser(); "
            "print('torch' in sys.modules, 'qconform_torch.op' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-1000:]
    assert r.stdout.split() == ["False", "False"]
