"""One way to wire a command (issue #23 item 4): every ``qconform`` command is added by its room's
``register(subparsers, services)``, listed once in conformance/cli/main.py's COMMANDS."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conformance.cli.main import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]

#: the commands the README and docs promise (a command lost from the table fails here)
EXPECTED = {"inspect", "dequant", "linear", "quantize", "selfcheck", "coverage", "campaign", "run", "replay",
            "golden", "target", "backends", "selftest", "report", "certify", "verify-bundle", "fingerprint",
            "model", "bench"}


def _add_parser_sites(path: Path) -> list[tuple[str, int]]:
    """(enclosing function, line) of every ``<x>.add_parser(...)`` call in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    sites = []

    def walk(node, fn):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and child.func.attr == "add_parser"):
                sites.append((fn, child.lineno))
            walk(child, name)

    walk(tree, "<module>")
    return sites


def _offending(paths) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{line} in {fn}" for p in paths for fn, line in _add_parser_sites(p)
            if not (fn == "register" or fn.startswith("_register"))]


def test_every_sub_parser_is_added_by_a_register_function():
    paths = [p for top in ("conformance", "qconform_torch", "benchmarks", "backends", "emulator")
             for p in sorted((ROOT / top).rglob("*.py"))]
    bad = _offending(paths)
    assert not bad, "sub-parsers added outside a register(sub, services): " + "; ".join(bad)


def test_the_wiring_check_can_fail(tmp_path):
    f = tmp_path / "rogue.py"
    f.write_text("def add_mine(sub):\n    sub.add_parser('mine')\n\ndef register(sub, services):\n"
                 "    sub.add_parser('ok')\n")
    sites = _add_parser_sites(f)
    assert sites == [("add_mine", 2), ("register", 5)]


def test_every_command_module_registers_and_every_promised_command_exists():
    import importlib

    for m in COMMANDS:
        assert callable(getattr(importlib.import_module(m), "register", None)), m
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    names = set(sub.choices)
    assert names >= EXPECTED, f"commands missing from `qconform --help`: {sorted(EXPECTED - names)}"


@pytest.mark.parametrize("argv", [["inspect", "--help"], ["report", "--help"], ["model", "--help"]])
def test_registered_commands_parse(argv, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 0 and argv[0] in capsys.readouterr().out
