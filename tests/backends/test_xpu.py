"""The xpu backend (backends/xpu.py): vllm-xpu-kernels / ARK on Intel XPU.

No XPU exists here or in CI; on an XPU host (`tox -e xpu`) the same tests pass: availability is
asserted to equal device presence, never its absence. tests/backends/test_xpu_wheel.py checks the
kernel calls and transforms against the pinned vllm-xpu-kernels wheel's own files.
What is tested is vLLM's host-side weight transforms, decoded back with NumPy readers of
the kernels' documented layouts and compared with the emulator's canonical codes, and the
declared MXFP4 activation variant against a transcription of the kernel source.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from backend_int4_codes import canonical_codes

from backends import xpu
from backends.base import Case, Declared
from conformance.judge.acceptance import declared_weight, mx_variant
from conformance.cases.inputs import make_inputs
from emulator.formats import gptq, mxfp4
from emulator.formats.packing import unpack_int32
from emulator.numerics.floats import round_to_dtype


def _torch():
    return pytest.importorskip("torch")


# -- availability ----------------------------------------------------------------------------------
def test_availability_without_xpu(monkeypatch):
    torch = _torch()
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    for lib in ("vllm-xpu-kernels", "ark"):
        av = xpu.XpuBackend(lib=lib).availability()
        assert not av.available
        assert av.reason == "no XPU device: torch.xpu.is_available() is False"


def _device_present() -> bool:
    torch = _torch()
    return bool(hasattr(torch, "xpu") and torch.xpu.is_available())


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


@pytest.mark.parametrize("lib,package", [("vllm-xpu-kernels", "vllm_xpu_kernels"), ("ark", "auto_round_kernel")])
def test_availability_equals_device_presence(lib, package):
    """Where the library is installed, the backend is available exactly when an XPU is present (so this passes
    on an XPU host -- `tox -e xpu` there -- and here); without a device the reason says so."""
    av = xpu.XpuBackend(lib=lib).availability()
    present = _device_present()
    if not present:
        assert not av.available
        assert av.reason == "no XPU device: torch.xpu.is_available() is False"
    elif _installed(package):
        assert av.available, f"an XPU is present and {package} is installed, yet: {av.reason}"
        assert av.device == "xpu" and av.version
    else:
        assert not av.available and av.reason.startswith(f"{package} not installed")


def test_availability_xpu_but_no_kernels(monkeypatch):
    torch = _torch()
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(xpu, "_installed", lambda name: False)
    av = xpu.XpuBackend().availability()
    assert not av.available
    assert av.reason == "vllm_xpu_kernels not installed: no module named 'vllm_xpu_kernels'"
    av = xpu.XpuBackend(lib="ark").availability()
    assert av.reason == "auto_round_kernel not installed: no module named 'auto_round_kernel'"


def test_availability_installed_but_extension_fails(monkeypatch):
    """An installed package whose extension does not load (e.g. the wheel under a CPU torch) is 'failed to
    load' with the loader's text, never 'not installed' and never available."""
    torch = _torch()
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(xpu, "_installed", lambda name: True)

    def broken(name):
        raise ImportError("libsycl.so.8: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(xpu, "_import", broken)
    av = xpu.XpuBackend().availability()
    assert not av.available
    assert av.reason == ("vllm_xpu_kernels failed to load: ImportError: libsycl.so.8: cannot open shared object "
                         "file: No such file or directory")
    av = xpu.XpuBackend(lib="ark").availability()
    assert not av.available and av.reason.startswith("auto_round_kernel failed to load: ImportError: libsycl")


def test_availability_ark_without_xpu_lib(monkeypatch):
    """auto_round_kernel imports without an XPU but leaves xpu_lib None (stubbed: importing the real
    package with is_available patched would try to dlopen its XPU extension)."""
    import types

    torch = _torch()
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(xpu, "_installed", lambda name: True)
    monkeypatch.setattr(xpu, "_import", lambda name: types.SimpleNamespace(xpu_lib=None))
    av = xpu.XpuBackend(lib="ark").availability()
    assert not av.available
    assert av.reason == "auto_round_kernel has no XPU library loaded (auto_round_kernel.xpu_lib is None)"


def test_availability_without_torch(monkeypatch):
    def boom():
        raise ImportError("No module named 'torch'")

    monkeypatch.setattr(xpu, "_import_torch", boom)
    av = xpu.XpuBackend().availability()
    assert av.reason == "torch is not importable: ImportError: No module named 'torch'"


def test_parameters():
    with pytest.raises(ValueError, match="lib must be"):
        xpu.XpuBackend(lib="ipex")
    with pytest.raises(ValueError, match="unknown parameter"):
        xpu.XpuBackend(path="x")


def test_run_without_xpu_raises(monkeypatch):
    torch = _torch()
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)  # the device-less path, on any host
    case = Case("w4a16", "gptq", 3, 64, 128)
    b = xpu.XpuBackend()
    inp = make_inputs(case, 0)
    prep = b.prepare(case, inp.tensors)
    with pytest.raises(RuntimeError, match="no XPU device"):
        b.run(prep, inp.x)


# -- can_implement --------------------------------------------------------------------------------
REFUSALS = [
    ("vllm-xpu-kernels", Case("w4a16", "gptq", 3, 64, 128, act_dtype="float32"), "bfloat16/float16 activations"),
    ("vllm-xpu-kernels", Case("w4a16", "gptq", 3, 64, 128, act_order=True), "act order"),
    ("vllm-xpu-kernels", Case("w4a16", "gptq", 3, 64, 128, sym=False, zero_convention="v2"), "0x11111111"),
    ("vllm-xpu-kernels", Case("w4a16", "gptq", 3, 64, 128, bits=8), "int4 only"),
    ("vllm-xpu-kernels", Case("w4a16", "gptq", 3, 64, 128, group_size=16), "multiples of 32"),
    ("vllm-xpu-kernels", Case("w4a16", "gptq", 3, 64, 80, group_size=-1), "multiple of 32"),
    ("vllm-xpu-kernels", Case("w4a16", "ct-mxfp4", 3, 64, 128), "has none"),
    ("vllm-xpu-kernels", Case("w4a16", "gptq", 3, 64, 128, out_dtype="float32"), "writes the activation dtype"),
    ("vllm-xpu-kernels", Case("w4a4-mxfp4", "ct-mxfp4", 3, 64, 128, act_dtype="float32"), "float16 or bfloat16"),
    ("vllm-xpu-kernels", Case("w4a4-mxfp4", "gptq", 3, 64, 128), "compressed-tensors MXFP4"),
    ("vllm-xpu-kernels", Case("w4a16-mxfp4", "ct-mxfp4", 3, 64, 128), "no XPU MXFP4 W4A16"),
    ("vllm-xpu-kernels", Case("w4a16-moe", "gptq", 3, 64, 128, E=4, top_k=2, group_size=64), "group 64"),
    ("vllm-xpu-kernels", Case("w4a16-moe", "gptq", 3, 64, 128, E=4, top_k=2, sym=False), "symmetric GPTQ"),
    ("vllm-xpu-kernels", Case("w4a16-moe", "gptq", 3, 64, 128, E=4, top_k=2, act_dtype="float32"), "float16"),
    ("vllm-xpu-kernels", Case("w8a8", "ct-int-quantized", 32, 64, 128), "not covered"),
    ("ark", Case("w4a16", "gptq", 3, 64, 128, sym=False), "NotImplementedError"),
    ("ark", Case("w4a16", "awq", 3, 64, 128), "GPTQ-packed"),
    ("ark", Case("w4a4-mxfp4", "ct-mxfp4", 3, 64, 128), "W4A16 only"),
    ("ark", Case("w4a16", "gptq", 3, 64, 128, act_dtype="float32"), "float16"),
]


@pytest.mark.parametrize("lib,case,why", REFUSALS, ids=[f"{lib}|{c.describe()}|{w}" for lib, c, w in REFUSALS])
def test_can_implement_refusals(lib, case, why):
    s = xpu.XpuBackend(lib=lib).can_implement(case)
    assert not s.ok
    assert why in s.reason


def test_can_implement_accepts():
    b = xpu.XpuBackend()
    for c in (Case("w4a16", "gptq", 1, 64, 128, group_size=32), Case("w4a16", "gptq", 3, 96, 256, sym=False),
              Case("w4a16", "awq", 3, 64, 128, act_dtype="float16"), Case("w4a16", "ct-pack-quantized", 3, 64, 128),
              Case("w4a16", "ct-pack-quantized", 3, 64, 128, sym=False, group_size=-1),
              Case("w4a4-mxfp4", "ct-mxfp4", 16, 256, 256), Case("w4a16-moe", "gptq", 3, 64, 128, E=4, top_k=2)):
        assert b.can_implement(c).ok, (c.describe(), b.can_implement(c).reason)
    assert xpu.XpuBackend(lib="ark").can_implement(Case("w4a16", "gptq", 3, 64, 128)).ok


# -- host-side transforms, decoded with the kernels' layouts ----------------------------------------
W4A16 = [("gptq", True, 32, "bfloat16"), ("gptq", False, 128, "bfloat16"), ("gptq", False, 32, "float16"),
         ("gptq", True, -1, "float16"), ("awq", False, 64, "bfloat16"), ("awq", False, 128, "float16"),
         ("ct-pack-quantized", True, 32, "bfloat16"), ("ct-pack-quantized", False, 64, "float16"),
         ("ct-pack-quantized", False, -1, "bfloat16")]


@pytest.mark.parametrize("fmt,sym,g,act", W4A16)
def test_w4a16_transform_decodes_to_declared_codes(fmt, sym, g, act):
    torch = _torch()
    case = Case("w4a16", fmt, 3, 64, 256, group_size=g, sym=sym, act_dtype=act)
    t = make_inputs(case, 1).tensors
    d = xpu.prepare_w4a16_host(case, t)
    K, N, G = case.K, case.N, case.group
    qw = d["qweight"]
    assert qw.dtype == torch.int32 and tuple(qw.shape) == (K // 8, N) and qw.stride() == (1, K // 8)  # "nt"
    assert d["scales"].dtype == getattr(torch, act) and tuple(d["scales"].shape) == (K // G, N)
    assert d["scales"].is_contiguous()
    q = xpu.decode_onednn_u4_weight(qw, K, N)
    z = xpu.decode_onednn_u4_zero_points(d["zero_points"], K // G, N)
    eq, ez = canonical_codes(case, t)
    np.testing.assert_array_equal(q, eq.T)
    decl = xpu.XpuBackend().declared(case)
    if fmt == "gptq" and sym:  # int32: transpose_onednn_woq_format copies 8 into the int32 qzeros parameter
        assert d["zero_points"].dtype == torch.int32 and d["zero_points"].tolist() == [8]
        assert decl.variants["zero_read"] == "ignore_qzeros"
    elif fmt == "gptq":
        _, zv = canonical_codes(case, t, "v1_packed_add")
        np.testing.assert_array_equal(z, zv)
        assert decl.variants["zero_read"] == "v1_packed_add"
    else:
        np.testing.assert_array_equal(z, ez)
        assert "zero_read" not in decl.variants
    # the weights the kernel forms from these operands, (u4 - zp) * s in the model dtype, are the declared ones
    s = d["scales"].to(torch.float32).numpy().astype(np.float64)
    gi = np.arange(K) // G
    w = round_to_dtype((q.astype(np.float64) - z[gi, :]) * s[gi, :], act).T
    np.testing.assert_array_equal(w, declared_weight(case, t, decl))


def test_gptq_v1_packed_add_carry():
    """A true zero point 0 is stored (by GPTQModel's packed subtract) as field 0xF with a borrow from its
    neighbour; the XPU path's qzeros + 0x11111111 undoes that exactly, the canonical field + 1 does not."""
    _torch()
    case = Case("w4a16", "gptq", 1, 16, 64, group_size=32, sym=False)
    rng = np.random.default_rng(0)
    q = rng.integers(0, 16, (16, 64)).astype(np.uint8)
    z = rng.integers(1, 15, (2, 16)).astype(np.int32)
    z[0, 3] = 0  # field 3 of word 0 of group 0
    z[1, 8] = 0  # field 0 of word 1 of group 1
    s = np.full((2, 16), 0.01, np.float16)
    p = gptq.GptqParams(group_size=32, sym=False)
    tt = gptq.pack_gptq(gptq.GptqCodes(q, z, s, np.arange(64, dtype=np.int32) // 32), p, v1_zero_write="packed_sub")
    t = {"qweight": tt.qweight, "qzeros": tt.qzeros, "scales": tt.scales, "g_idx": tt.g_idx}
    d = xpu.prepare_w4a16_host(case, t)
    zk = xpu.decode_onednn_u4_zero_points(d["zero_points"], 2, 16)
    np.testing.assert_array_equal(zk, z)
    _, zc = canonical_codes(case, t)
    assert not np.array_equal(zc, z)  # canonical (field + 1) reads 16 and a decremented neighbour there
    assert zc[0, 3] == 16 and zc[0, 4] == z[0, 4] - 1


def test_mxfp4_transform():
    torch = _torch()
    case = Case("w4a4-mxfp4", "ct-mxfp4", 3, 96, 256)
    t = make_inputs(case, 2).tensors
    d = xpu.prepare_mxfp4_host(case, t)
    w, s = d["weight"], d["weight_scale"]
    assert w.dtype == torch.float4_e2m1fn_x2 and tuple(w.shape) == (128, 96)
    assert not w.is_contiguous() and w.stride() == (1, 128)  # .t() of the [N, K/2] checkpoint tensor
    assert s.dtype == torch.float8_e8m0fnu and tuple(s.shape) == (8, 96) and s.is_contiguous()
    codes, sb = mxfp4.unpack_mxfp4_ct(t)
    np.testing.assert_array_equal(xpu.decode_fp4_weight(w, 256, 96), codes)
    np.testing.assert_array_equal(s.view(torch.uint8).numpy(), sb.T)  # scale (k // 32, n) at k // 32 * N + n


@pytest.mark.parametrize("act,g", [("bfloat16", 32), ("float16", 128)])
def test_moe_transform(act, g):
    torch = _torch()
    case = Case("w4a16-moe", "gptq", 3, 64, 128, group_size=g, E=3, top_k=2, act_dtype=act)
    t = make_inputs(case, 3).tensors
    d = xpu.prepare_moe_host(case, t)
    E, I, K = case.E, case.N, case.K
    assert d["w13"].dtype == torch.uint8 and tuple(d["w13"].shape) == (E, 2 * I, K // 2)
    assert tuple(d["w2"].shape) == (E, K, I // 2)
    assert tuple(d["w13_scales"].shape) == (E, 2 * I, K // g) and d["w13_scales"].dtype == getattr(torch, act)
    g2 = min(g, I)
    assert tuple(d["w2_scales"].shape) == (E, K, I // g2)
    for w, qkey, skey in (("w13", "w13_qweight", "w13_scales"), ("w2", "w2_qweight", "w2_scales")):
        dec = xpu.decode_moe_u4(d[w])
        for e in range(E):
            canon = unpack_int32(t[qkey][e], 4, axis=0).T  # [out, in]
            np.testing.assert_array_equal(dec[e], canon)
            np.testing.assert_array_equal(d[skey][e].float().numpy(),
                                          round_to_dtype(t[skey][e].astype(np.float64), act).T)
    # the kernel's u4 -> s4 step (implement_zp: nibble - 8, low nibble first) gives q - 8
    assert int(xpu.decode_moe_u4(d["w13"]).min()) >= 0 and int(xpu.decode_moe_u4(d["w13"]).max()) <= 15


def test_ark_transform():
    torch = _torch()
    case = Case("w4a16", "gptq", 3, 64, 128, group_size=32)
    t = make_inputs(case, 4).tensors
    d = xpu.prepare_ark_host(case, t)
    assert d["intweight"].dtype == torch.int8 and tuple(d["intweight"].shape) == (128, 64)
    q, _ = canonical_codes(case, t)
    np.testing.assert_array_equal(d["intweight"].numpy().astype(np.int64) + 8, q.T)
    assert d["scales"].dtype == torch.float16 and (d["cdt"], d["wdt"], d["sdt"]) == ("int8", "int4", "fp16")
    assert d["zeros"].numel() == 0


# -- declared arithmetic ----------------------------------------------------------------------------
def test_declared():
    b = xpu.XpuBackend()
    d = b.declared(Case("w4a4-mxfp4", "ct-mxfp4", 3, 64, 128))
    assert d.variants == xpu.XPU_MX_VARIANT and d.accumulate == "float32" and d.output == "bfloat16"
    d = b.declared(Case("w4a16", "awq", 3, 64, 128, act_dtype="float16"))
    assert (d.weight_dtype, d.variants["weight_scale_dtype"], d.output) == ("float16", "float16", "float16")
    d = b.declared(Case("w4a16-moe", "gptq", 3, 64, 128, E=4, top_k=2))
    assert d.variants == {"moe_renormalize": True, "weight_formation": "float32_then_round",
                          "weight_scale_dtype": "bfloat16", "moe_gate_up_dtype": "bfloat16",
                          "moe_expert_output_dtype": "activation"} and d.weight_dtype == "bfloat16"
    d = xpu.XpuBackend(lib="ark").declared(Case("w4a16", "gptq", 3, 64, 128))
    assert "int8" in d.notes and d.arithmetic == "opaque" and d.sqnr_floor_db == 30.0  # W4A8 inside: SQNR-judged
    from backends.ark import INT8_CORE_SQNR_FLOOR_DB

    assert d.sqnr_floor_db == INT8_CORE_SQNR_FLOOR_DB  # the floor ARK's CPU int8 cores are held to


def _xpu_moe_transcription(inp):
    """A torch CPU transcription of vllm-xpu-kernels 0.1.16.2 ``XpuFusedMoe._apply_kernel`` for int4 experts, from
    the source (not from emulator/): the adapter's s4 weights (u4 - 8) times its scales (held in the activation
    dtype, ``prepare_moe_host``) in the activation dtype; ``gemm1_output``, ``act_output`` (``silu_and_mul``: fp32
    SiLU(gate) * up) and ``gemm2_output`` in the activation dtype, fp32 accumulation; ``moe_gather``
    (csrc/moe/moe_gather.cpp): fp32 sum of fp32 topk_weights * gemm2_output, stored in the output dtype; routing
    as ``XpuBackend._run_moe`` (fp32 softmax, top-k, renormalize)."""
    torch = _torch()
    case = inp.case
    dt = getattr(torch, case.act_dtype)
    d = xpu.prepare_moe_host(case, inp.tensors)
    f32 = torch.float32

    def weights(w, s):  # [E, out, in]: (u4 - 8) * s, one rounding to dt per element
        q = torch.from_numpy(xpu.decode_moe_u4(d[w]).astype(np.int64) - 8).to(dt)
        return q * torch.repeat_interleave(d[s], q.shape[2] // d[s].shape[2], dim=2)

    w13, w2 = weights("w13", "w13_scales"), weights("w2", "w2_scales")
    x = torch.from_numpy(inp.x).to(dt)
    p = torch.softmax(torch.from_numpy(np.asarray(inp.router_logits, np.float32)), dim=-1, dtype=f32)
    tw, ids = torch.topk(p, case.top_k, dim=-1)
    tw = tw / tw.sum(dim=-1, keepdim=True)
    acc = torch.zeros(case.M, case.K, dtype=f32)
    for m in range(case.M):
        for j in range(case.top_k):
            e = int(ids[m, j])
            h = (x[m].to(f32) @ w13[e].to(f32).T).to(dt)  # gemm1_output
            g, up = h[:case.N].to(f32), h[case.N:].to(f32)
            a = (g / (1 + torch.exp(-g)) * up).to(dt)  # act_output
            o = (a.to(f32) @ w2[e].to(f32).T).to(dt)  # gemm2_output
            acc[m] += o.to(f32) * tw[m, j]  # moe_gather
    return acc.to(dt).to(f32).numpy()


@pytest.mark.parametrize("act", ["bfloat16", "float16"])
def test_moe_declaration_contains_the_kernel_transcription(act):
    """The XPU MoE declaration accepts a transcription of the kernel source on every element. On bf16 cases,
    without ``moe_expert_output_dtype`` (gemm2_output in the activation dtype) or ``moe_gate_up_dtype``
    (gemm1_output) it does not: the bound has no allowance for roundings a declaration does not name. (On fp16
    cases the allowance for the kernel's fp32 SiLU, SILU_REL_ERR = 2^-14 of |SiLU(g) up|, reaches across an fp16
    rounding boundary of the intermediate on about a quarter of its elements, and the box that follows is as
    wide as those roundings: docs/formats/moe.md#acceptance-bound.)"""
    from conformance.judge.acceptance import compare, declared_interval

    b = xpu.XpuBackend()
    for seed in range(2):
        case = Case("w4a16-moe", "gptq", 8, 64, 128, group_size=32, E=4, top_k=2, act_dtype=act)
        inp = make_inputs(case, seed)
        y = _xpu_moe_transcription(inp)
        d = b.declared(case)
        assert compare(y, declared_interval(inp, d)).ok
        if act != "bfloat16":
            continue
        for key in ("moe_expert_output_dtype", "moe_gate_up_dtype"):
            v = {k: val for k, val in d.variants.items() if k != key}
            c = compare(y, declared_interval(inp, dataclasses.replace(d, variants=v)))
            assert not c.ok, (key, c)


def _xpu_variant():
    return mx_variant(Declared(variants=dict(xpu.XPU_MX_VARIANT)))


def test_declared_mx_variant_differs_from_canonical():
    """The XPU activation quantizer differs from canonical MXFP4 exactly where its source says it does."""
    v = _xpu_variant()
    assert v.describe() == {"scale_rule": "rceil", "element_rounding": "rhtz", "element_nan": "saturate_positive",
                            "zero_block": "eps_1e10_floor", "nan_block": "ignore", "element_zero_sign": "positive",
                            "byte0_divisor": "byte", "scale_overflow": "clamp",
                            "quotient_dtype": "exact"}  # no byte-0 block; RCEIL cannot overflow
    x = np.zeros((6, 32), np.float32)
    x[0, :8] = [6, 0.75, 1.75, 3.5, 5, 2.5, 0.25, 1.25]  # scale 1 under both rules: ties only
    x[1, 0] = 1.6  # FLOOR: 2**(0-2) -> byte 125; RCEIL: 2**ceil(log2(1.6/6)) = 2**-1 -> byte 126
    x[2, :] = 0  # zero block: byte 0 canonically, 2**ceil(log2 1e-10) = 2**-33 (byte 94) on XPU
    x[3, :4] = [np.nan, 1.0, -2.0, -np.nan]  # NaN: 0xFF canonically, skipped by the XPU amax
    x[4, :3] = [-0.0, 4.0, -1.0]  # -0.0: code 8 canonically, 0 on XPU (sign from v < 0)
    x[5, :2] = [1e-12, -2e-12]  # tiny block: canonical FLOOR byte 86, XPU floors every block at 94
    c_can, s_can = mxfp4.quantize_mxfp4(np.delete(x, 3, axis=0))
    c_xpu, s_xpu = mxfp4.quantize_mxfp4(x, v)
    assert c_can[0, :8].tolist() == [7, 2, 4, 6, 6, 4, 0, 2]  # RNE: 0.75->1, 1.75->2, 3.5->4
    assert c_xpu[0, :8].tolist() == [7, 1, 3, 5, 6, 4, 0, 2]  # ties toward zero: 0.5, 1.5, 3
    assert s_can[:, 0].tolist() == [127, 125, 0, 127, 86] and s_xpu[:, 0].tolist() == [127, 126, 94, 126, 127, 94]
    assert mxfp4.quantize_mxfp4(x[3:4])[1][0, 0] == 0xFF
    # scale 2**-1: +NaN -> +6, 1 -> 2, -2 -> -4, -NaN -> +6 (not -6: the clamp precedes the sign test)
    assert c_xpu[3, :4].tolist() == [7, 4, 14, 7]
    assert c_can[3, :3].tolist() == [8, 6, 10] and c_xpu[4, :3].tolist() == [0, 6, 10]  # -0.0 -> +0 on XPU
    assert c_xpu[5, :2].tolist() == [0, 8]  # 1e-12 * 2**33 -> 0; -2e-12 * 2**33 rounds to -0 (v < 0: code 8)


def _mx_inputs():
    rng = np.random.default_rng(5)
    out = []
    for dt in ("float32", "bfloat16", "float16"):
        mag = np.exp(rng.uniform(-6, 6, (48, 1)))
        out.append(round_to_dtype(rng.standard_normal((48, 256)) * mag, dt).astype(np.float32))
    ties = np.zeros((2, 64), np.float32)
    ties[0, :16] = np.array([6, 0.75, 1.75, 3.5, 5, 2.5, 0.25, 1.25, -0.75, -1.75, -3.5, -5, -2.5, -0.25, 8, -7])
    ties[1, 32:40] = [96, 12, 28, 56, 80, 40, 4, 20]  # scale 2**4: ties 0.75*16 ... at a larger scale
    out.append(ties)
    zero = np.zeros((1, 64), np.float32)
    zero[0, 32] = 3
    out.append(zero)
    # the corners the variant names: signed zeros, +-NaN (one block all NaN), blocks with amax below
    # 6e-10 (tiny normals, fp32 subnormals, amax in [1e-10, 6e-10)), amax = 6e-10 +- a few ulps
    edge = np.zeros((6, 128), np.float32)
    edge[:, 0::7] = -0.0
    edge[0, :32] = rng.standard_normal(32)
    edge[0, 3], edge[0, 9], edge[0, 10] = np.nan, -np.nan, -0.0
    edge[0, 32:64] = np.nan
    edge[0, 64:96] = -np.nan
    edge[0, 96:100] = [-np.nan, 0.5, -0.0, -0.25]
    edge[1, :32] = rng.standard_normal(32) * 1e-12
    edge[1, 32:64] = rng.standard_normal(32) * 3e-10
    edge[1, 64:96] = (rng.integers(-50, 50, 32) * 2.0 ** -149).astype(np.float32)  # fp32 subnormals
    edge[1, 96:128] = rng.standard_normal(32) * 1e-9
    for j, a in enumerate((np.float32(6e-10), np.nextafter(np.float32(6e-10), np.float32(1)),
                           np.nextafter(np.float32(6e-10), np.float32(0)), np.float32(1e-10))):
        edge[2, 32 * j] = a
        edge[2, 32 * j + 1] = -a / 3
    edge[3] = rng.standard_normal(128) * np.repeat(2.0 ** np.array([-30, -60, 20, 60]), 32)
    edge[4, :] = -0.0
    edge[5] = round_to_dtype(rng.standard_normal(128) * 1e-11, "bfloat16")
    out.append(edge)
    return out


@pytest.mark.parametrize("i", range(6))
def test_source_model_matches_declared_variant(i):
    """xpu_mxfp4_quant_model (a step-by-step transcription of mxfp4_quant.h) equals the declared emulator
    variant XPU_MX_VARIANT bit for bit -- codes and scale bytes -- on finite and NaN inputs, signed zeros,
    zero and tiny blocks (the corners and their neighbours; the remaining corners are in
    test_source_model_where_variant_is_silent)."""
    x = _mx_inputs()[i]
    c, s = xpu.xpu_mxfp4_quant_model(x)
    ce, se = mxfp4.quantize_mxfp4(x, _xpu_variant())
    np.testing.assert_array_equal(s, se)
    np.testing.assert_array_equal(c, ce)


def test_source_model_inputs_reach_the_corners():
    """The edge inputs above do exercise every variant axis (else the bit-for-bit test would prove little)."""
    x = _mx_inputs()[5]
    c, s = xpu.xpu_mxfp4_quant_model(x)
    can_c, can_s = mxfp4.quantize_mxfp4(x, mxfp4.MxVariant(scale_rule="rceil", element_rounding="rhtz",
                                                            nan_block="ignore"))
    assert np.any(s != can_s)  # tiny blocks floored at byte 94
    assert np.any((s == 94) & (can_s < 94))
    assert np.any(c[np.signbit(x) & (x == 0)] == 0) and np.all(can_c[np.signbit(x) & (x == 0)] == 8)
    neg_nan = np.isnan(x) & np.signbit(x)
    assert neg_nan.any() and np.all(c[neg_nan] == 7)


def test_source_model_where_variant_is_silent():
    """Documented differences between the kernel source and the declared variant (docs/backends/xpu.md)."""
    v = _xpu_variant()
    x = np.zeros((1, 128), np.float32)
    x[0, 0] = np.float32(6 * 2.0 ** 5 * (1 + 2.0 ** -23))  # amax/6 just above 2**5: fp32 log2 -> 5.0 exactly
    x[0, 32], x[0, 33] = 100.0, -2.0 ** -149  # fp32 x * (1/32) underflows to -0.0: code 0; exact value: code 8
    x[0, 64], x[0, 65], x[0, 66] = np.inf, -1.0, np.nan  # an Inf block: scale 0xFF in both, codes differ
    c, s = xpu.xpu_mxfp4_quant_model(x)
    ce, se = mxfp4.quantize_mxfp4(x, v)
    assert (s[0, 0], se[0, 0]) == (127 + 5, 127 + 6)  # ceil(log2) in fp32 misses the round-up
    assert c[0, 0] == 7 and ce[0, 0] == 5  # 6.0000007 clamps to 6 vs 3.0000004 -> 3
    assert (s[0, 1], se[0, 1]) == (127 + 5, 127 + 5) and (c[0, 33], ce[0, 33]) == (0, 8)
    assert s[0, 2] == se[0, 2] == 0xFF  # the block decodes to NaN whatever its codes
    assert c[0, 64:67].tolist() == [7, 0, 7] and ce[0, 64:67].tolist() == [0, 0, 0]
    assert np.array_equal(c[0, 32:64] != ce[0, 32:64], np.arange(32) == 1)  # only the underflowed element
