"""No new long function and no new function with a long parameter list in product code (regression gate).

A function over ``MAX_LINES`` lines (its ``def`` line to its last line, docstring included) has steps that
want names: split it into named steps (seams). A function over ``MAX_PARAMS`` parameters (``self``/``cls``
not counted; ``*args``/``**kwargs`` count one each) passes options that want a home: a frozen dataclass of
options (a parameter object, e.g. conformance/certify/write.py's ``CertifyOptions``).

Counted by AST over PRODUCT; nested functions and methods by their qualified name (``Runner.__init__``,
``outer.inner``). KNOWN_LONG and KNOWN_WIDE list the residue; both may only shrink: a new long or wide
function fails, and so does a KNOWN entry that no longer is one (remove it). tests/ is not gated (a test's
length is its story).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("emulator", "backends", "conformance", "qconform_torch", "benchmarks", "tools")
MAX_LINES = 80
MAX_PARAMS = 8

#: functions over MAX_LINES lines, "file::qualified name" (lines when listed)
KNOWN_LONG: set = set()  # none left: the last ones (fingerprint/decide, judge/localize*, run/worker) got named steps

#: functions with more than MAX_PARAMS parameters, "file::qualified name" (parameters when listed)
KNOWN_WIDE: set = set()  # none left: the dequantizers take a DequantVariant, bundles a ReplayBundle/StoredCase


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and method, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, prefix + node.name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")
        else:
            yield from _functions(node, prefix)


def _params(node) -> int:
    a = node.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    names = [n for n in names if n not in ("self", "cls")]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def _lines(node) -> int:
    return node.end_lineno - node.lineno + 1


@functools.cache
def measure(root: Path = ROOT, tops=PRODUCT) -> tuple[dict, dict]:
    """({name: lines} of the long functions, {name: parameters} of the wide ones)."""
    long, wide = {}, {}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for name, node in _functions(tree):
                if _lines(node) > MAX_LINES:
                    long[f"{rel}::{name}"] = _lines(node)
                if _params(node) > MAX_PARAMS:
                    wide[f"{rel}::{name}"] = _params(node)
    return long, wide


def test_the_gate_sees_long_and_wide_functions(tmp_path):
    """The count itself, on a planted module: an 81-line method, a 9-parameter nested function and a
    function with *args/**kwargs over the limit are found; an 80-line function, a method with self plus
    8 parameters and a class body are not."""
    pkg = tmp_path / "emulator"
    pkg.mkdir()
    body81 = "    x = 1\n" * 80
    body80 = "    x = 1\n" * 79
    (pkg / "m.py").write_text(
        "class A:\n"
        "    def long(self):\n" + "    " + body81.replace("\n    ", "\n        ")
        + "    def ok(self, a, b, c, d, e, f, g, h):\n        pass\n"
        + "def fine():\n" + body80
        + "def outer():\n    def inner(a, b, c, d, e, f, g, h, i):\n        pass\n"
        + "def star(a, b, c, d, e, f, g, *args, **kwargs):\n    pass\n")
    long, wide = measure(tmp_path, ("emulator",))
    assert long == {"emulator/m.py::A.long": 81}
    assert wide == {"emulator/m.py::outer.inner": 9, "emulator/m.py::star": 9}


def _check(found: dict, known: set, what: str, fix: str):
    new = sorted(set(found) - known)
    assert not new, f"new {what} (give it {fix}; tests/test_function_size.py): " + "; ".join(
        f"{n} ({found[n]})" for n in new)
    gone = sorted(known - set(found))
    assert not gone, f"KNOWN {what} that no longer are (remove them from tests/test_function_size.py): " + \
        "; ".join(gone)


def test_no_new_long_functions():
    _check(measure()[0], KNOWN_LONG, f"functions over {MAX_LINES} lines", "named steps")


def test_no_new_wide_functions():
    _check(measure()[1], KNOWN_WIDE, f"functions over {MAX_PARAMS} parameters", "a parameter object")

