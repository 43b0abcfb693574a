"""The xpu adapter against the pinned vllm-xpu-kernels wheel's own files, on a host without an XPU.

- Op schemas: every ``_xpu_C`` / ``_C`` op the adapter calls (``call_*`` in backends/xpu.py) and the ops
  the wheel's ``XpuFusedMoe`` calls are read as strings from the wheel's extension files (the
  ``TORCH_LIBRARY`` registration text; the library is never loaded), parsed by torch's schema parser,
  defined in a private test namespace, and the adapter's own call code is run against them with CPU
  tensors: torch's dispatcher binds the arguments (order, count, types) and a recording kernel checks
  each argument's dtype and shape against the kernel's documented layout. The recorders compute
  nothing; no result is taken from them.
- Host-side transforms: the adapter's transforms against the wheel's pure-Python ones
  (``quantization/_quantize_convert.py``: ``transpose_onednn_woq_format``, ``AWQUtils.repack``;
  ``fused_moe_interface.py``: ``implement_zp`` inside ``XpuFusedMoe``; ``moe_utils.py``:
  ``dequant_mxfp4``), run on CPU tensors. Files that import the extensions are not imported: only
  their top-level definitions are compiled (no ``.so`` is loaded).

Where the wheel comes from (docs/backends/xpu.md#checks-against-the-wheel): ``QCONFORM_XPU_WHEEL``
(a path to the pinned .whl), else the installed distribution at the pinned version, else a cached
or freshly ``pip download``-ed copy (sha256 checked). If it cannot be had, the wheel tests skip with
the reason; the schema reader's own test runs everywhere.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

from backends import xpu
from backends.base import Case
from conformance.cases.inputs import make_inputs
from emulator.formats import mxfp4
from emulator.formats.packing import unpack_int32
from emulator.numerics.floats import round_to_dtype

torch = pytest.importorskip("torch")

PINNED = "0.1.16.2"
WHEEL_NAME = f"vllm_xpu_kernels-{PINNED}-cp38-abi3-manylinux_2_28_x86_64.whl"
WHEEL_SHA256 = "86bfa26abbb605fab485236a386e6de07f76320177c456fa96e55c27502af17a"  # PyPI's file, checked here
ENV = "QCONFORM_XPU_WHEEL"
#: extension file of each op namespace (TORCH_LIBRARY(_C / _xpu_C / _moe_C) in the wheel's csrc)
LIBRARY_FILE = {"_C": "_C.abi3.so", "_xpu_C": "_xpu_C.abi3.so", "_moe_C": "_moe_C.abi3.so"}
#: the ops the adapter's call_* functions call (test_adapter_calls_are_all_checked keeps this complete)
ADAPTER_OPS = {("_xpu_C", "int4_gemm_w4a16"), ("_C", "per_token_group_quant_mxfp4"), ("_xpu_C", "fp4_gemm")}
#: the ops XpuFusedMoe (int4, SiLU, one device) calls
MOE_OPS = {("_moe_C", "remap_hidden_states"), ("_xpu_C", "cutlass_grouped_gemm_interface"),
           ("_C", "silu_and_mul"), ("_moe_C", "moe_gather")}


# -- the schema reader (no library load) ----------------------------------------------------------------
_IDENT = re.compile(rb"[A-Za-z0-9_]")


def registered_schema(blob: bytes, name: str) -> str:
    """The one op schema ``name(...) -> ...`` stored as a NUL-terminated string in an extension's bytes.

    Candidates are every occurrence of ``name(`` not preceded by an identifier character, read up to
    the next NUL; those torch's schema parser accepts with that exact name count. Error messages that
    mention the op do not parse and are ignored. None or several distinct schemas: ValueError."""
    found = set()
    key = name.encode() + b"("
    at = blob.find(key)
    while at != -1:
        if at == 0 or not _IDENT.match(blob[at - 1:at]):
            end = blob.find(b"\x00", at)
            text = blob[at:end if end != -1 else len(blob)]
            try:
                s = torch._C.parse_schema(text.decode("ascii"))
            except (RuntimeError, UnicodeDecodeError):
                s = None
            if s is not None and s.name == name:
                found.add(re.sub(r"\s+", " ", text.decode("ascii")))  # C++ literal concatenation leaves runs
        at = blob.find(key, at + 1)
    if len(found) != 1:
        raise ValueError(f"op {name}: {'no' if not found else len(found)} registered schema(s) in the library"
                         + ("" if not found else f": {sorted(found)}"))
    return found.pop()


def test_schema_reader_on_synthetic_library():
    """The reader on a made-up extension image: schemas as the registration strings appear (padded,
    multi-line whitespace as C++ literal concatenation leaves it), an error message naming the op, a longer
    op name ending in the same name, binary noise. Schema text modelled on vllm-xpu-kernels'
    csrc/xpu/torch_bindings.cpp registrations."""
    rng = np.random.default_rng(0)
    noise = bytes(rng.integers(1, 256, 300, dtype=np.uint8))
    blob = (noise + b"\x00int4_gemm_w4a16 expects a bf16 or fp16 input\x00"
            + b"int4_gemm_w4a16(Tensor A, Tensor B, Tensor? bias, Tensor B_scale, Tensor B_zp, int group_size,"
              b"           Tensor? g_idx) -> Tensor\x00" + noise
            + b"\x00my_int4_gemm_w4a16(Tensor A) -> Tensor\x00"
            + b"fp4_gemm(Tensor A, Tensor B) -> Tensor\x00fp4_gemm(Tensor A, Tensor B, int k) -> Tensor\x00")
    assert registered_schema(blob, "int4_gemm_w4a16") == ("int4_gemm_w4a16(Tensor A, Tensor B, Tensor? bias, "
                                                           "Tensor B_scale, Tensor B_zp, int group_size, "
                                                           "Tensor? g_idx) -> Tensor")  # whitespace runs: one
    assert registered_schema(blob, "my_int4_gemm_w4a16") == "my_int4_gemm_w4a16(Tensor A) -> Tensor"
    with pytest.raises(ValueError, match="op fp4_gemm: 2 registered schema"):
        registered_schema(blob, "fp4_gemm")
    with pytest.raises(ValueError, match="op per_token_group_quant_mxfp4: no registered schema"):
        registered_schema(blob, "per_token_group_quant_mxfp4")


# -- the wheel -------------------------------------------------------------------------------------------
class WheelFiles:
    """Read-only access to the pinned wheel's files: from the .whl (a zip) or an installed copy."""

    def __init__(self, *, whl: Path | None = None, root: Path | None = None, origin: str):
        self.whl, self.root, self.origin = whl, root, origin
        self._zip = zipfile.ZipFile(whl) if whl is not None else None

    def read(self, member: str) -> bytes:
        path = f"vllm_xpu_kernels/{member}"
        if self._zip is not None:
            return self._zip.read(path)
        return (self.root / path).read_bytes()

    def text(self, member: str) -> str:
        return self.read(member).decode("utf-8")


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qconform" / "wheels"


def _download(dest: Path) -> str | None:
    """pip-download the pinned wheel into ``dest`` (under a lock: xdist workers share it); None or why not."""
    import fcntl

    dest.mkdir(parents=True, exist_ok=True)
    with open(dest / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / WHEEL_NAME).is_file():
            return None
        cmd = [sys.executable, "-m", "pip", "download", f"vllm-xpu-kernels=={PINNED}", "--no-deps",
               "--only-binary=:all:", "--platform", "manylinux_2_28_x86_64", "--python-version", "3.12",
               "--implementation", "cp", "-d", str(dest), "-q"]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{type(e).__name__}: {e}"
        if r.returncode != 0 or not (dest / WHEEL_NAME).is_file():
            lines = (r.stderr or r.stdout or "").strip().splitlines()
            return f"pip download exited {r.returncode}: {lines[-1] if lines else 'no output'}"
    return None


def locate_wheel() -> WheelFiles:
    """The pinned wheel's files, or pytest.skip with the reason it cannot be had (a bad QCONFORM_XPU_WHEEL
    fails instead: a path given by hand that is wrong is an error, not a reason to skip)."""
    given = os.environ.get(ENV)
    if given:
        p = Path(given)
        if not p.is_file():
            pytest.fail(f"{ENV}={given}: no such file")
        if _sha256(p) != WHEEL_SHA256:
            pytest.fail(f"{ENV}={given}: not the pinned {WHEEL_NAME} (sha256 {_sha256(p)} != {WHEEL_SHA256})")
        return WheelFiles(whl=p, origin=f"{ENV}={given}")
    from importlib import metadata

    with contextlib.suppress(metadata.PackageNotFoundError):
        dist = metadata.distribution("vllm-xpu-kernels")
        if dist.version == PINNED:
            root = Path(dist.locate_file(""))
            if (root / "vllm_xpu_kernels" / LIBRARY_FILE["_xpu_C"]).is_file():
                return WheelFiles(root=root, origin=f"installed vllm-xpu-kernels {PINNED} in {root}")
    cached = _cache_dir() / WHEEL_NAME
    for attempt in (1, 2):
        if not cached.is_file():
            why = _download(_cache_dir())
            if why is not None:
                pytest.skip(f"vllm-xpu-kernels=={PINNED} wheel not available ({why}); "
                            f"set {ENV}=/path/to/{WHEEL_NAME}")
        digest = _sha256(cached)
        if digest == WHEEL_SHA256:
            return WheelFiles(whl=cached, origin=str(cached))
        if attempt == 1:  # a damaged cache entry (e.g. an interrupted copy): fetch it again, once
            with contextlib.suppress(FileNotFoundError):
                cached.unlink()
    pytest.fail(f"{cached}: sha256 {digest} is not the pinned wheel's {WHEEL_SHA256}")


def test_wheel_given_by_hand_must_be_the_pinned_one(monkeypatch, tmp_path):
    """A QCONFORM_XPU_WHEEL that is missing or is another file is an error (never a skip, never used)."""
    monkeypatch.setenv(ENV, str(tmp_path / WHEEL_NAME))
    with pytest.raises(pytest.fail.Exception, match="no such file"):
        locate_wheel()
    other = tmp_path / WHEEL_NAME
    other.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip under the pinned name
    with pytest.raises(pytest.fail.Exception, match="not the pinned"):
        locate_wheel()


@pytest.fixture(scope="module")
def wheel() -> WheelFiles:
    return locate_wheel()


@pytest.fixture(scope="module")
def schemas(wheel) -> dict:
    """{(namespace, op): schema text} read from the wheel's extension files."""
    out = {}
    wanted = ADAPTER_OPS | MOE_OPS
    for ns in sorted({ns for ns, _ in wanted}):
        blob = wheel.read(LIBRARY_FILE[ns])
        for ns2, op in sorted(wanted):
            if ns2 == ns:
                out[(ns, op)] = registered_schema(blob, op)
    return out


# -- the wheel's schemas as test ops, with recording kernels ---------------------------------------------
_LIBS: dict = {}  # test namespace -> torch.library.Library (kept alive; each op defined once per process)
_ACTIVE: list = []  # the Recorder whose calls list the kernels append to


def _test_op(lib_ns: str, op: str, text: str):
    """The wheel's schema ``text`` defined in a private namespace (one per namespace and schema text), with a
    CPU kernel that records the bound arguments into the active Recorder."""
    test_ns = f"qconform_whl_{lib_ns.strip('_')}_{hashlib.sha1(text.encode()).hexdigest()[:8]}"
    if test_ns not in _LIBS:
        _LIBS[test_ns] = torch.library.Library(test_ns, "DEF")
    if not hasattr(getattr(torch.ops, test_ns), op):
        s = torch._C.parse_schema(text)
        names = [a.name for a in s.arguments]

        def record(*args, **kwargs):
            bound = dict(zip(names, args))
            bound.update(kwargs)
            _ACTIVE[-1].calls.append((op, bound))
            return torch.empty(0) if len(s.returns) == 1 else None

        _LIBS[test_ns].define(text)
        _LIBS[test_ns].impl(op, record, "CPU")
    return getattr(getattr(torch.ops, test_ns), op)


class Recorder:
    """``ops._C`` / ``ops._xpu_C`` / ``ops._moe_C`` holding the wheel's schemas; ``calls``: (op, {arg: value})."""

    def __init__(self, schemas: dict):
        self.calls: list[tuple[str, dict]] = []
        ns: dict = {}
        for (lib_ns, op), text in schemas.items():
            ns.setdefault(lib_ns, {})[op] = _test_op(lib_ns, op, text)
        self.ops = types.SimpleNamespace(**{k: types.SimpleNamespace(**v) for k, v in ns.items()})


@pytest.fixture
def recorder(schemas):
    r = Recorder(schemas)
    _ACTIVE.append(r)
    yield r
    _ACTIVE.remove(r)


def test_registered_schemas_are_the_pinned_ones(schemas):
    """The argument lists the adapter is written against (vLLM's call sites, docs/backends/xpu.md) are the
    ones the pinned wheel registers: names, order, types, optionality."""
    def sig(key):
        s = torch._C.parse_schema(schemas[key])
        return [(a.name, repr(a.real_type)) for a in s.arguments]

    assert sig(("_xpu_C", "int4_gemm_w4a16")) == [
        ("A", "Tensor"), ("B", "Tensor"), ("bias", "Optional[Tensor]"), ("B_scale", "Tensor"),
        ("B_zp", "Tensor"), ("group_size", "int"), ("g_idx", "Optional[Tensor]")]
    assert sig(("_xpu_C", "fp4_gemm")) == [
        ("A", "Tensor"), ("B", "Tensor"), ("A_scale", "Tensor"), ("B_scale", "Tensor"),
        ("out_dtype", "Optional[ScalarType]"), ("bias_", "Optional[Tensor]")]
    assert sig(("_C", "per_token_group_quant_mxfp4")) == [
        ("input", "Tensor"), ("output_q", "Tensor"), ("output_s", "Tensor"), ("group_size", "int"),
        ("eps", "float")]
    s = torch._C.parse_schema(schemas[("_C", "per_token_group_quant_mxfp4")])
    assert [a.alias_info is not None and a.alias_info.is_write for a in s.arguments] == [False, True, True,
                                                                                        False, False]


def test_adapter_calls_are_all_checked():
    """Every torch op the adapter calls is one whose schema this file checks (a new call must be added)."""
    src = Path(xpu.__file__).read_text()
    called = set(re.findall(r"ops\.(_xpu_C|_C|_moe_C)\.(\w+)\(", src))
    assert called == ADAPTER_OPS


# -- the adapter's calls bound to the wheel's schemas --------------------------------------------------------
W4A16_CASES = [("gptq", True, 32, "bfloat16"), ("gptq", False, 128, "float16"), ("awq", False, 64, "bfloat16"),
               ("ct-pack-quantized", True, 32, "float16"), ("ct-pack-quantized", False, -1, "bfloat16")]


def check_int4_gemm_args(a: dict, case: Case, xt, bias) -> None:
    """int4_gemm_w4a16.h's operands: mat2 [k/8, n] int32 read "nt" (stride(-2) == 1), scale [k/group, n] in the
    input dtype, zp either 1-D (symmetric: broadcast) or [k/group, n/8] u4 fields; group_size as configured."""
    K, N, G = case.K, case.N, case.group
    assert a["A"] is xt and a["bias"] is bias and a["g_idx"] is None
    assert a["B"].dtype == torch.int32 and tuple(a["B"].shape) == (K // 8, N) and a["B"].stride() == (1, K // 8)
    assert a["B_scale"].dtype == xt.dtype and tuple(a["B_scale"].shape) == (K // G, N)
    zp = a["B_zp"]
    if case.sym and case.weight_format != "awq":
        assert zp.dim() == 1 and zp.tolist() == [8]
    else:
        assert zp.dtype == torch.int32 and tuple(zp.shape) == (K // G, N // 8)
    assert a["group_size"] == case.group_size


@pytest.mark.parametrize("fmt,sym,g,act", W4A16_CASES)
def test_int4_gemm_w4a16_call_matches_schema(recorder, fmt, sym, g, act):
    case = Case("w4a16", fmt, 5, 64, 256, group_size=g, sym=sym, act_dtype=act)
    d = xpu.prepare_w4a16_host(case, make_inputs(case, 1).tensors)
    xt = torch.zeros(5, 256, dtype=getattr(torch, act))
    bias = torch.zeros(64, dtype=xt.dtype)
    xpu.call_int4_gemm_w4a16(recorder.ops, xt, d, bias)
    [(op, a)] = recorder.calls
    assert op == "int4_gemm_w4a16"
    check_int4_gemm_args(a, case, xt, bias)


def test_schema_check_rejects_wrong_calls(recorder):
    """The check can fail: a float group size or a missing g_idx does not bind to the wheel's schema; bias and
    scales swapped bind (both tensors) but fail the operand check."""
    case = Case("w4a16", "gptq", 5, 64, 256, group_size=32)
    d = xpu.prepare_w4a16_host(case, make_inputs(case, 1).tensors)
    xt = torch.zeros(5, 256, dtype=torch.bfloat16)
    op = recorder.ops._xpu_C.int4_gemm_w4a16
    with pytest.raises(RuntimeError, match="group_size"):
        op(xt, d["qweight"], None, d["scales"], d["zero_points"], 32.0, None)
    with pytest.raises(RuntimeError, match="g_idx"):
        op(xt, d["qweight"], None, d["scales"], d["zero_points"], 32)
    assert recorder.calls == []
    op(xt, d["qweight"], d["scales"], torch.zeros(0), d["zero_points"], 32, None)
    [(_, a)] = recorder.calls
    with pytest.raises(AssertionError):
        check_int4_gemm_args(a, case, xt, None)


@pytest.mark.parametrize("act", ["bfloat16", "float16"])
def test_mxfp4_linear_calls_match_schemas(recorder, act):
    case = Case("w4a4-mxfp4", "ct-mxfp4", 3, 96, 256, act_dtype=act)
    d = xpu.prepare_mxfp4_host(case, make_inputs(case, 2).tensors)
    M, K, N = 3, 256, 96
    xt = torch.zeros(M, K, dtype=getattr(torch, act))
    xpu.call_mxfp4_linear(recorder.ops, xt, d, None, xt.dtype)
    [(op1, q), (op2, g)] = recorder.calls
    assert op1 == "per_token_group_quant_mxfp4"
    assert q["input"] is xt and q["group_size"] == 32 and q["eps"] == pytest.approx(1e-10)
    assert q["output_q"].dtype == torch.uint8 and tuple(q["output_q"].shape) == (M, K // 2)
    assert q["output_s"].dtype == torch.float32 and tuple(q["output_s"].shape) == (M, K // 32)
    assert op2 == "fp4_gemm"
    # fp4_gemm_w4a4.h: A fp4 [m, k/2] with e8m0 scales [m, k/32]; B fp4 [k/2, n] read "nt", e8m0 [k/32, n]
    assert g["A"].dtype == torch.float4_e2m1fn_x2 and tuple(g["A"].shape) == (M, K // 2)
    assert g["A"].untyped_storage().data_ptr() == q["output_q"].untyped_storage().data_ptr()  # the quantizer's
    assert g["A_scale"].dtype == torch.float8_e8m0fnu and tuple(g["A_scale"].shape) == (M, K // 32)
    assert g["B"].dtype == torch.float4_e2m1fn_x2 and tuple(g["B"].shape) == (K // 2, N)
    assert g["B"].stride() == (1, K // 2)
    assert g["B_scale"].dtype == torch.float8_e8m0fnu and tuple(g["B_scale"].shape) == (K // 32, N)
    assert g["out_dtype"] == xt.dtype and g["bias_"] is None


# -- the wheel's Python, compiled without its extension imports -----------------------------------------------
def load_definitions(source: str, filename: str, names: set[str] | None, namespace: dict) -> dict:
    """Compile the top-level function / class definitions and plain assignments of a wheel module (all, or
    those in ``names``) into ``namespace``; imports are skipped (so no extension is loaded)."""
    tree = ast.parse(source, filename)
    keep = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            if names is None or node.name in names:
                keep.append(node)
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            if names is None or any(t.id in names for t in node.targets):
                keep.append(node)
    exec(compile(ast.Module(body=keep, type_ignores=[]), filename, "exec"), namespace)  # noqa: S102
    return namespace


@pytest.fixture(scope="module")
def quantize_convert(wheel, tmp_path_factory):
    """vllm_xpu_kernels/quantization/_quantize_convert.py, imported from the wheel (it imports only torch)."""
    p = tmp_path_factory.mktemp("xpu_wheel") / "_quantize_convert.py"
    p.write_bytes(wheel.read("quantization/_quantize_convert.py"))
    spec = importlib.util.spec_from_file_location("qconform_wheel_quantize_convert", p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def xpu_is_cpu(monkeypatch):
    """The wheel's transforms end with ``.to("xpu")`` (e.g. the symmetric zero point): send it to the CPU."""
    to = torch.Tensor.to

    def to_cpu(self, *args, **kwargs):
        args = tuple("cpu" if a == "xpu" else a for a in args)
        if kwargs.get("device") == "xpu":
            kwargs["device"] = "cpu"
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to_cpu)


def _same(a, b, what):
    assert a.dtype == b.dtype, (what, a.dtype, b.dtype)
    assert tuple(a.shape) == tuple(b.shape) and a.stride() == b.stride(), (what, a.shape, b.shape, a.stride(),
                                                                          b.stride())
    assert torch.equal(a, b), what


@pytest.mark.parametrize("fmt,sym,g,act", [("gptq", True, 32, "bfloat16"), ("gptq", False, 128, "float16"),
                                           ("gptq", False, 32, "bfloat16"), ("gptq", True, -1, "float16"),
                                           ("awq", False, 64, "bfloat16"), ("awq", False, 128, "float16")])
def test_w4a16_transform_equals_wheel(quantize_convert, xpu_is_cpu, fmt, sym, g, act):
    """prepare_w4a16_host == the wheel's transpose_onednn_woq_format (after AWQUtils.repack for AWQ) on the
    same checkpoint, as vLLM's XPUGPTQLinearMethod / XPUAWQLinearMethod call them: values, dtypes, strides."""
    case = Case("w4a16", fmt, 3, 64, 256, group_size=g, sym=sym, act_dtype=act)
    t = make_inputs(case, 7).tensors
    ours = xpu.prepare_w4a16_host(case, t)
    qweight = torch.from_numpy(np.ascontiguousarray(t["qweight"], np.int32))
    qzeros = torch.from_numpy(np.ascontiguousarray(t["qzeros"], np.int32))
    scales = torch.from_numpy(np.asarray(t["scales"], np.float32)).to(getattr(torch, act))  # params_dtype
    if fmt == "awq":
        qweight, qzeros = quantize_convert.AWQUtils.repack(qweight, qzeros)
    layer = types.SimpleNamespace(qweight=qweight, scales=scales, qzeros=qzeros)
    quantize_convert.transpose_onednn_woq_format(layer, fmt, sym)
    _same(ours["qweight"], layer.qweight, "qweight")
    _same(ours["scales"], layer.scales, "scales")
    _same(ours["zero_points"], layer.qzeros, "zero points")


@pytest.fixture(scope="module")
def moe_utils(wheel):
    ns = {"torch": torch, "__name__": "qconform_wheel_moe_utils"}
    return load_definitions(wheel.text("moe_utils.py"), "moe_utils.py",
                            {"_FP4_E2M1_LUT", "_FP4_E2M1_LUT_XPU", "_get_lut", "_fp4_e2m1fn_x2_to_float_lut",
                             "dequant_mxfp4"}, ns)


def test_mxfp4_transform_dequantizes_with_wheel(moe_utils):
    """The wheel's dequant_mxfp4 (its reference reading of fp4x2 bytes, low nibble = even element, times the
    e8m0 block scale) on the adapter's fp4_gemm operands, turned back to [N, K/2] / [N, K/32], equals the
    emulator's dequantized checkpoint."""
    case = Case("w4a4-mxfp4", "ct-mxfp4", 3, 96, 256)
    t = make_inputs(case, 2).tensors
    d = xpu.prepare_mxfp4_host(case, t)
    w = moe_utils["dequant_mxfp4"](d["weight"].t(), d["weight_scale"].t())
    codes, sb = mxfp4.unpack_mxfp4_ct(t)
    np.testing.assert_array_equal(w.numpy(), mxfp4.dequantize_mxfp4(codes, sb))


class _TorchWithOps(types.ModuleType):
    """torch, except ``torch.ops`` is the recorder's namespace (for the wheel's MoE class compiled here)."""

    def __init__(self, ops):
        super().__init__("torch")
        self.ops = ops

    def __getattr__(self, name):
        return getattr(torch, name)


@pytest.mark.parametrize("act,g", [("bfloat16", 32), ("float16", 128)])
def test_moe_call_through_wheel_xpu_fused_moe(wheel, recorder, act, g):
    """The adapter's MoE call (call_fused_moe) on the adapter's transformed experts, through the wheel's own
    XpuFusedMoe (its implement_zp runs on the weights, on the CPU) down to the registered ops' schemas."""
    ns = {"torch": _TorchWithOps(recorder.ops), "os": os, "Optional": Optional,
          "__name__": "qconform_wheel_fused_moe_interface"}
    load_definitions(wheel.text("fused_moe_interface.py"), "fused_moe_interface.py", None, ns)
    moe = types.SimpleNamespace(XpuFusedMoe=ns["XpuFusedMoe"])
    case = Case("w4a16-moe", "gptq", 3, 64, 128, group_size=g, E=3, top_k=2, act_dtype=act)
    t = make_inputs(case, 3).tensors
    d = xpu.prepare_moe_host(case, t)
    E, I, K, M = case.E, case.N, case.K, case.M
    xt = torch.zeros(M, K, dtype=getattr(torch, act))
    topk_w = torch.full((M, 2), 0.5)
    topk_ids = torch.tensor([[0, 1], [1, 2], [2, 0]], dtype=torch.int32)
    out = xpu.call_fused_moe(moe, xt, d, topk_w, topk_ids, case.top_k, E)
    assert tuple(out.shape) == (M, K) and out.dtype == xt.dtype
    ops = [op for op, _ in recorder.calls]
    assert ops == ["remap_hidden_states", "cutlass_grouped_gemm_interface", "silu_and_mul",
                   "cutlass_grouped_gemm_interface", "moe_gather"]
    g1, g2 = (a for op, a in recorder.calls if op == "cutlass_grouped_gemm_interface")
    g2_ = min(g, I)
    for call, n_out, k_in, gs, w in ((g1, 2 * I, K, g, "w13"), (g2, K, I, g2_, "w2")):
        assert (call["N"], call["K"], call["num_experts"]) == (n_out, k_in, E)
        b, s = call["ptr_B"], call["ptr_B_scale"]
        assert b.dtype == torch.int8 and tuple(b.shape) == (E, n_out, k_in // 2)  # implement_zp's s4 bytes
        assert s.dtype == xt.dtype and tuple(s.shape) == (E, n_out, k_in // gs)
        # implement_zp (the wheel's u4 -> s4 rewrite) of the adapter's layout: nibble j of row n is
        # q[n, j] - 8 as 4-bit two's complement, low nibble = even input index
        raw = b.view(torch.uint8).numpy()
        s4 = np.empty(raw.shape[:-1] + (raw.shape[-1] * 2,), np.int64)
        s4[..., 0::2], s4[..., 1::2] = raw & 0xF, raw >> 4
        s4 = np.where(s4 >= 8, s4 - 16, s4)
        for e in range(E):
            canon = unpack_int32(t[f"{w}_qweight"][e], 4, axis=0).T.astype(np.int64)  # [out, in]
            np.testing.assert_array_equal(s4[e], canon - 8)
            np.testing.assert_array_equal(s[e].float().numpy(),
                                          round_to_dtype(t[f"{w}_scales"][e].astype(np.float64), act).T)
