"""No module reaches into another project module's private (``_name``) names: by import or by attribute.

ruff's PLC2701 ([tool.ruff] in pyproject.toml) sees private imports only across top-level packages;
this test sees them inside one package too (``from .codec import _same``), and it sees private
*attribute* access across modules, which no linter does. A private name another module needs is part
of its interface: give it a public name, add a public method, or move the code into the module that
owns the name.

Imports: ``from x import _y`` where ``x`` is a project module (relative or absolute).

Attributes, by AST (``_private_attributes``): in module M, an access ``E._x`` (read, write or delete;
also ``getattr``/``setattr``/``hasattr``/``delattr(E, "_x")`` and ``monkeypatch.setattr(E, "_x", ...)``
with a literal name), where ``_x`` has one leading underscore and is not an enum sunder name
(``_value_``), or is a mangled ``__x``, is flagged when

1. the root of ``E`` (the leftmost name of ``a.b.c``) is bound in M to a *project module*
   (``import emulator.moe as emoe``, ``from emulator.formats import fast_dequant``, ``import emulator``):
   a module's private names belong to that module, even when M happens to define a name of the same
   spelling; or
2. ``E`` is anything else except ``self``, ``cls`` and ``super()`` (an object made elsewhere:
   ``runner._run_one``, ``b._fast``, ``type(x)._helper``), and ``_x`` is *not defined in M*: not the
   name of a def or class in M, not a name M assigns, not an attribute M assigns anywhere
   (``self._x = ...``, ``obj._x = ...``). A name M defines is M's own (its classes use it on other
   instances of themselves, e.g. ``other._cache``); a name M does not define belongs to someone else.

Not flagged: ``self._x``/``cls._x``/``super()._x`` (a subclass using its base's protected helpers);
roots bound to another distribution (``import torch``, ``from torch import nn``,
``torch = pytest.importorskip("torch")``, ``importlib.import_module("torch")``): another library's
private names are its business, not the project's coupling; and the names in ``FOREIGN``, private names
of other libraries reached through objects the AST cannot trace to an import (a ``torch`` passed as a
parameter, an ``nn.Module``'s ``_parameters``). ``test_foreign_names_are_not_the_projects`` checks that no
FOREIGN name is defined in the project, so the pass can never hide the project's own coupling.

KNOWN lists the residue in product code and KNOWN_TESTS in tests/ (a test reaching into another
module's private state is coupling too), each with a one-line reason. Both may only shrink: a new
access fails, and so does a KNOWN entry that is gone.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("emulator", "backends", "conformance", "qconform_torch", "benchmarks", "tools")
PROJECT = PRODUCT + ("tests",)

#: (file, imported module as written, name): remove an entry when its import goes
KNOWN_IMPORTS: set = set()  # none left: every private import across modules was made public or removed

#: private names of other distributions reached through objects bound by no import (a parameter, an
#: attribute of a library object); none of them may be defined in the project (a test checks)
FOREIGN = {
    "_C": "torch / vLLM compiled-extension op namespaces (torch.ops._C)",
    "_xpu_C": "vllm-xpu-kernels' compiled-extension op namespace",
    "_is_amx_tile_supported": "torch.cpu's ISA probes",
    "_is_avx512_supported": "torch.cpu's ISA probes",
    "_is_avx512_bf16_supported": "torch.cpu's ISA probes",
    "_cpu": "torch._C._cpu (AMX permission request)",
    "_init_amx": "torch._C._cpu._init_amx",
    "_parameters": "torch.nn.Module's parameter table (replaced in place without copying)",
    "_buffers": "torch.nn.Module's buffer table",
    "_version": "torch.Tensor's in-place version counter (detects a changed weight)",
    "_apply_gate": "transformers' GptOssExperts activation",
    "_actions": "argparse's parser actions (tests list every option)",
    "_input_quantizer": "quark's quantizer slot on a quantized module (test data generator)",
}

#: (file, expression as ast.unparse writes it): product-code residue, with the reason it stays
KNOWN: dict = {}

_NO_LIB = "replaces the adapter's library import to show the reason a missing or broken library gives"
_STATE = "resets or replaces module state the test must control (a process-wide cache or memo)"
_INSIDE = "asserts on an internal value no public call exposes"
#: (file, expression): tests that reach into another module's private state, with the reason
KNOWN_TESTS: dict = {
    ("tests/backends/test_ark.py", "ark_mod._CORE_COMPUTE"): _INSIDE + " (the bestla core's compute dtype)",
    ("tests/backends/test_ark.py", "ark_mod._import_ark"): _NO_LIB,
    ("tests/backends/test_cuda.py", "cu._import_torch"): _NO_LIB,
    ("tests/backends/test_emulator_backend.py", "b._cache"): _INSIDE + " (prepared weights are kept once)",
    ("tests/backends/test_gemlite_bnb.py", "bb._import_bnb"): _NO_LIB,
    ("tests/backends/test_gemlite_bnb.py", "gm._import_gemlite"): _NO_LIB,
    ("tests/backends/test_registry.py", "registry._entry_points"): "plants a vendor entry point without installing one",
    ("tests/backends/test_torch_cpu.py", "tc._import_torch"): _NO_LIB,
    ("tests/backends/test_torch_cpu.py", "tc._op"): _NO_LIB + " (one aten op missing)",
    ("tests/backends/test_torch_cpu.py", "tc._torch_state"): "skips torch tests by the adapter's own import verdict",
    ("tests/backends/test_vllm_cpu.py", "be._w8a8_path"): _INSIDE + " (vLLM's W8A8 kernel choice by ISA)",
    ("tests/backends/test_vllm_cpu.py", "vc._find_vllm_spec"): _NO_LIB,
    ("tests/backends/test_vllm_cpu.py", "vc._import_torch"): _NO_LIB,
    ("tests/backends/test_vllm_cpu.py", "vc._probe"): "replaces the library probe to test the ISA keys on any host",
    ("tests/backends/test_xpu.py", "xpu._import"): _NO_LIB,
    ("tests/backends/test_xpu.py", "xpu._import_torch"): _NO_LIB,
    ("tests/backends/test_xpu.py", "xpu._installed"): _NO_LIB,
    ("tests/backends/test_zentorch.py", "zt.ZentorchBackend._import"): _NO_LIB,
    ("tests/backends/test_zentorch.py", "zt._KEEP_ALIVE"): "keeps tensors a zentorch op holds alive as the adapter does",
    ("tests/conformance/test_coverage.py", "cov._checker"): _STATE,
    ("tests/conformance/test_runner_robust.py", "Runner._append"): "loses one record write to show the run notices",
    ("tests/conformance/test_runner_robust.py", "verify._jsonl"): "counts the verifier's parses of the results file",
    ("tests/conformance/test_variant_vocabulary.py", "fingerprint._DEFAULTS"): _INSIDE + " (fingerprint defaults = axes)",
    ("tests/conformance/test_variant_vocabulary.py", "fingerprint._known_keys"): _INSIDE + " (fingerprint keys = axes)",
    ("tests/emulator/test_checkpoint.py", "ck._files"): _INSIDE + " (which shard a tensor is read from)",
    ("tests/emulator/test_loader_scaling.py", "saferegex._COMPILED"): _STATE,
    ("tests/fallback/test_measured_dispatch.py", "Dispatcher._floor_gate"): "lets a noisy kernel past the floor check "
                                                                        "to show the per-layer check keeps it out",
    ("tests/fallback/test_fused_fallback.py", "s._xt"): _INSIDE + " (x's transpose keeps a BLAS-friendly stride)",
    ("tests/fallback/test_int_kernels.py", "int_kernels._CHECK"): _STATE,
    ("tests/fallback/test_int_kernels.py", "int_kernels._CHOICE"): _STATE,
    ("tests/fallback/test_int_kernels.py", "int_kernels._b_operand"): "plants a wrong operand layout to show the check fails",
    ("tests/fallback/test_int_kernels.py", "int_kernels._int8_product"): "plants a wrong product to show the check fails",
    ("tests/fallback/test_prepared_cache.py", "c._d"): _INSIDE + " (which keys the cache keeps)",
    ("tests/test_packaging.py", "cli._require"): _INSIDE + " (the missing-dependency message)",
}


def _private(name: str) -> bool:
    if name.startswith("__"):
        return not name.endswith("__")  # a mangled __x is private; a dunder is not
    return name.startswith("_") and not (name.endswith("_") and len(name) > 2)  # _value_: enum sunder


def _module_names(root: Path, tops) -> set:
    out = set()
    for top in tops:
        for p in (root / top).rglob("*.py"):
            parts = list(p.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


@functools.cache
def _parse(path: Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _trees(root: Path, tops):
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            yield path.relative_to(root).as_posix(), _parse(path)


def _absolute(rel: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = rel[:-3].split("/")
    base = parts[:-1]  # a module's package; __init__'s package is its own folder, also parts[:-1]
    prefix = base[:len(base) - node.level + 1]
    return ".".join(prefix + ([node.module] if node.module else []))


def _bindings(rel: str, tree: ast.AST, modules: set, tops) -> tuple[dict, set]:
    """Names bound to project modules ({name: module}) and names bound to other distributions."""
    project, foreign = {}, set()

    def bind(name, module):
        if module.split(".")[0] in tops or module in modules:
            if module in modules:
                project[name] = module
        else:
            foreign.add(name)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                bind(a.asname or a.name.split(".")[0], a.name if a.asname else a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(rel, node)
            for a in node.names:
                name = a.asname or a.name
                if module.split(".")[0] in tops:
                    if f"{module}.{a.name}" in modules:
                        project[name] = f"{module}.{a.name}"
                else:
                    foreign.add(name)
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
              and isinstance(node.value, ast.Call) and node.value.args
              and isinstance(node.value.args[0], ast.Constant) and isinstance(node.value.args[0].value, str)
              and ast.unparse(node.value.func) in ("pytest.importorskip", "importlib.import_module", "import_module")):
            bind(node.targets[0].id, node.value.args[0].value)
    return project, foreign


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _accesses(tree: ast.AST):
    """(owner expression, attribute name, text) for every private attribute access."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            yield node.value, node.attr, ast.unparse(node)
        elif (isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and _private(node.args[1].value)
              and ast.unparse(node.func) in ("getattr", "setattr", "hasattr", "delattr", "monkeypatch.setattr",
                                             "monkeypatch.delattr")):
            yield node.args[0], node.args[1].value, f"{ast.unparse(node.args[0])}.{node.args[1].value}"


def _private_attributes(root: Path = ROOT, tops=PROJECT, scope=None) -> set:
    """(file, expression) for every private attribute access across modules (the rule in the docstring).
    ``tops`` are the project's packages (what counts as a project module); ``scope`` those scanned."""
    modules = _module_names(root, tops)
    found = set()
    for rel, tree in _trees(root, scope or tops):
        project, foreign = _bindings(rel, tree, modules, tops)
        defined = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and not (isinstance(_root(node), ast.Name) and _root(node).id in project)):
                defined.add(node.attr)
        for owner, name, text in _accesses(tree):
            base = _root(owner)
            if isinstance(base, ast.Name) and base.id in project:
                found.add((rel, text))
                continue
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                continue
            if (isinstance(base, ast.Name) and base.id in foreign) or name in FOREIGN or name in defined:
                continue
            found.add((rel, text))
    return found


def _private_imports(root: Path = ROOT, tops=PROJECT) -> set:
    found = set()
    for rel, tree in _trees(root, tops):
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            module = "." * node.level + (node.module or "")
            if node.level == 0 and module.split(".")[0] not in tops:
                continue  # another distribution's private names are its business (re._parser)
            for alias in node.names:
                if _private(alias.name):
                    found.add((rel, module, alias.name))
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


def test_the_check_sees_private_attributes(tmp_path):
    """The attribute scan, on a planted package: a project module's private name (imported as a module
    by every spelling, even when the reader defines the same name), a private method called on an object
    made elsewhere, getattr/monkeypatch with a literal name, a write into another module and a project module
    bound by importlib are found; self/cls/super(), a name the module defines itself, dunders, enum sunders,
    other distributions' privates (imported, or bound by pytest.importorskip) and FOREIGN names are not."""
    pkg = tmp_path / "emulator"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("_TABLE = 1\nclass Engine:\n    def _fast(self):\n        return self._slow()\n")
    (pkg / "sub" / "m.py").write_text("def _threads():\n    return 1\n")
    (pkg / "b.py").write_text(
        "import torch\nimport emulator.a as ea\nfrom emulator.sub import m\nfrom . import a\nimport emulator\n"
        "from .a import Engine\n"
        "def _TABLE():\n    pass\n"                       # b defines _TABLE too: ea._TABLE is still a's
        "class Mine(Engine):\n"
        "    def _own(self, other):\n"
        "        return self._fast() + cls._x + super()._fast() + other._own + other._cache\n"
        "    def go(self):\n        self._cache = {}\n"
        "x = ea._TABLE + a._TABLE + emulator.a._TABLE\n"
        "m._threads = lambda: 2\n"                          # a write into another module
        "y = Engine()._fast() + type(x)._fast\n"           # an object made elsewhere
        "z = getattr(Engine(), '_fast') + x.__class__ + x._value_ + torch._C + x._parameters\n"
        "def t(monkeypatch):\n    monkeypatch.setattr(m, '_threads', None)\n"
        "w = x.__mangled\n"
        "import pytest, importlib\ntv = pytest.importorskip('torchvision')\nq = tv._io\n"  # another distribution's
        "em = importlib.import_module('emulator.a')\nr = em._TABLE\n")
    found = _private_attributes(tmp_path, ("emulator",))
    assert found == {("emulator/b.py", t) for t in (
        "ea._TABLE", "a._TABLE", "emulator.a._TABLE", "m._threads", "Engine()._fast", "type(x)._fast",
        "Engine()._fast", "x.__mangled", "em._TABLE")}
    # the monkeypatch and getattr spellings are found on their own (their text equals the attribute's)
    (pkg / "c.py").write_text("from .sub import m\nfrom .a import Engine\n"
                              "def t(monkeypatch):\n    monkeypatch.setattr(m, '_threads', None)\n"
                              "    return getattr(Engine(), '_fast')\n")
    found = _private_attributes(tmp_path, ("emulator",))
    assert {("emulator/c.py", "m._threads"), ("emulator/c.py", "Engine()._fast")} <= found


def test_foreign_names_are_not_the_projects():
    """A FOREIGN name is passed over everywhere, so the project must not define one itself (a def, class,
    assigned name or ``self._x = ...``), else a cross-module use of it would hide behind the pass."""
    own = set()
    for _, tree in _trees(ROOT, PROJECT):
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                own.add(node.attr)  # writes into another library's objects (config._attn_implementation) are not
    assert not sorted(own & set(FOREIGN)), "FOREIGN names the project defines itself: remove them from FOREIGN"


def test_no_new_private_cross_module_imports():
    found = _private_imports()
    new = sorted(found - KNOWN_IMPORTS)
    assert not new, "private names imported from another module (give them public names): " + "; ".join(
        f"{f}: from {m} import {n}" for f, m, n in new)
    gone = sorted(KNOWN_IMPORTS - found)
    assert not gone, "KNOWN private imports that are gone (remove them from tests/test_private_imports.py): " + \
        "; ".join(f"{f}: from {m} import {n}" for f, m, n in gone)


def _check_known(found: set, known: dict, what: str):
    new = sorted(found - set(known))
    assert not new, (f"private attributes of another module used in {what} (give them public names, add a "
                     "public method, or move the code; docstring of tests/test_private_imports.py): "
                     + "; ".join(f"{f}: {t}" for f, t in new))
    gone = sorted(set(known) - found)
    assert not gone, ("KNOWN private attribute uses that are gone (remove them from tests/test_private_imports.py): "
                      + "; ".join(f"{f}: {t}" for f, t in gone))


def test_no_new_private_attribute_access_in_product_code():
    _check_known(_private_attributes(scope=PRODUCT), KNOWN, "product code")


def test_no_new_private_attribute_access_in_tests():
    _check_known(_private_attributes(scope=("tests",)), KNOWN_TESTS, "tests")
