"""No module imports another project module's private (``_name``) names.

ruff's PLC2701 ([tool.ruff] in pyproject.toml) sees private imports only across top-level
packages; this test sees them inside one package too (``from .codec import _same``). A private
name another module needs is part of its interface: give it a public name.

No private name is imported across modules (issue #15). KNOWN lists exceptions (none today); a new
import fails, and so does a KNOWN entry that is gone.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("emulator", "backends", "conformance", "benchmarks", "tools", "tests")

#: (file, imported module as written, name): remove an entry when its import goes
KNOWN: set = set()  # none left: every private import across modules was made public or removed


def _private_imports(root: Path = ROOT, tops=PROJECT) -> set:
    found = set()
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.ImportFrom):
                    continue
                module = "." * node.level + (node.module or "")
                if node.level == 0 and module.split(".")[0] not in tops:
                    continue  # another distribution's private names are its business (re._parser)
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.add((path.relative_to(root).as_posix(), module, alias.name))
    return found


def test_the_check_sees_private_imports(tmp_path):
    """The scan itself, on a planted package: relative and absolute private imports are found,
    public names, dunders and other distributions' private names are not."""
    pkg = tmp_path / "emulator"
    pkg.mkdir()
    (pkg / "a.py").write_text("def _hidden():\n    pass\n")
    (pkg / "b.py").write_text("from .a import _hidden\nfrom re import _parser\nfrom .a import __doc__\n")
    (pkg / "c.py").write_text("def f():\n    from emulator.a import _hidden, public\n")
    assert _private_imports(tmp_path, ("emulator",)) == {("emulator/b.py", ".a", "_hidden"),
                                                         ("emulator/c.py", "emulator.a", "_hidden")}


def test_no_new_private_cross_module_imports():
    found = _private_imports()
    new = sorted(found - KNOWN)
    assert not new, "private names imported from another module (give them public names): " + "; ".join(
        f"{f}: from {m} import {n}" for f, m, n in new)
    gone = sorted(KNOWN - found)
    assert not gone, "KNOWN private imports that are gone (remove them from tests/test_private_imports.py): " + \
        "; ".join(f"{f}: from {m} import {n}" for f, m, n in gone)
