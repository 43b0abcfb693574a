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


def test_fallback_has_its_own_extra_and_the_error_names_it(monkeypatch):
    """Issue 22 item 12: `qconform model` needs torch and transformers only; `qconform[torch]` installs exactly
    what the fallback's error asks for, without the test tools (pytest, ruff, onnx, ...)."""
    import importlib

    import pytest

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = {r.split("==")[0]: r for r in extras["torch"]}
    assert set(pins) == {"torch", "transformers"}
    assert all(pins[k] in extras["test"] for k in pins)  # the same pins the tests run against
    from qconform_torch import cli

    real = importlib.import_module

    def missing(name, *a, **k):
        if name == "transformers":
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(importlib, "import_module", missing)
    with pytest.raises(ValueError) as e:
        cli._require("transformers")
    msg = str(e.value)
    assert "pip install 'qconform[torch]'" in msg and all(p in msg for p in pins.values()) and "[test]" not in msg
