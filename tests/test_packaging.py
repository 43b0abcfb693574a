"""What `pip install .` ships: every Python package of the project is listed in pyproject.toml (a package
left out installs without it, and the installed `qconform` fails where an editable checkout works)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("emulator", "backends", "conformance", "benchmarks", "qconform_torch", "golden")


def test_every_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for top in TOPS for p in (ROOT / top).rglob("__init__.py")}
    assert found - listed == set(), f"packages missing from pyproject.toml: {sorted(found - listed)}"
    assert listed - found == set(), f"listed packages that do not exist: {sorted(listed - found)}"
