"""torch-cpu backend: availability, refusals, layout transforms, smoke comparisons, probes.

docs/backends/torch-cpu.md. Kernel calls are skipped (with the availability reason)
where torch or an op is missing; the layout tests need only torch.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from backends import torch_cpu as tc
from backends.base import Case
from conformance.judge.acceptance import compare, declared_interval
from conformance.cases.inputs import CaseInputs, make_inputs
from conformance.run.runner import BAD, Runner, load_waivers
from conformance.cases.suite import CaseSpec, case_list
from emulator.activations import int8 as a8

QA8DX = a8.Int8ActVariant(scheme="kai_qa8dx", rounding="rhaz")

#: the variant keys torch-cpu declares beyond the canonical arithmetic (docs/backends/torch-cpu.md)
NEW_KEYS = ("dequant_order", "zero_dtype", "bias_stage", "act_scheme", "act_rounding")


def _without(d, *keys):
    """The declaration with ``keys`` removed: what the suite would have judged before they had names."""
    return dataclasses.replace(d, variants={k: v for k, v in d.variants.items() if k not in keys})

HAVE_TORCH = tc._torch_state()[0]
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason=tc._torch_state()[1] or "torch missing")


def _backend():
    return tc.TorchCpuBackend()


def _skip_unless(scheme: str):
    ok, why = tc.op_status(scheme)
    if not ok:
        pytest.skip(f"torch-cpu {scheme} unavailable: {why}")


# ----------------------------------------------------------------------------------- availability
def test_availability_when_torch_missing(monkeypatch):
    def broken():
        raise ImportError("No module named 'torch'")

    monkeypatch.setattr(tc, "_import_torch", broken)
    tc._torch_state.cache_clear()
    tc.op_status.cache_clear()
    try:
        b = _backend()
        av = b.availability()
        assert not av.available
        assert "torch is not importable" in av.reason and "No module named 'torch'" in av.reason
        sup = b.can_implement(Case("w4a16", "gptq", 1, 64, 128))
        assert not sup.ok and "No module named 'torch'" in sup.reason
        assert b.schemes() == []
    finally:
        tc._torch_state.cache_clear()
        tc.op_status.cache_clear()


@needs_torch
def test_availability_lists_each_op():
    av = _backend().availability()
    assert av.version and av.version.startswith("2.")
    for scheme in tc.OPS:
        assert f"{scheme} via " in av.reason
    assert av.device.startswith("cpu")


@needs_torch
def test_missing_op_reason(monkeypatch):
    real = tc._op
    monkeypatch.setattr(tc, "_op", lambda name: None if name == "_dyn_quant_matmul_4bit" else real(name))
    tc.op_status.cache_clear()
    try:
        ok, why = tc.op_status("w4a8")
        assert not ok and "_dyn_quant_matmul_4bit" in why and "has no aten op" in why
        sup = _backend().can_implement(Case("w4a8", "gptq", 1, 64, 128, act_dtype="float32"))
        assert not sup.ok and "_dyn_quant_matmul_4bit" in sup.reason
    finally:
        tc.op_status.cache_clear()


def test_rejects_parameters():
    with pytest.raises(ValueError, match="no parameters"):
        tc.TorchCpuBackend(foo="1")


# ---------------------------------------------------------------------------------- can_implement
REFUSALS = [
    (Case("w4a16-mxfp4", "ct-mxfp4", 1, 64, 128), "no CPU op for scheme"),
    (Case("w4a16", "gptq", 1, 64, 128, act_order=True), "act order"),
    (Case("w4a16", "gptq", 1, 64, 128, out_dtype="float32"), "activation dtype"),
    (Case("w4a16", "gptq", 1, 64, 128, group_size=16), "qGroupSize 32, 64, 128 or 256"),
    (Case("w4a16", "gptq", 1, 64, 1024, group_size=512), "qGroupSize 32, 64, 128 or 256"),
    (Case("w4a16", "gptq", 1, 64, 128, bits=8), "4-bit only"),
    (Case("w4a16", "ct-int-quantized", 1, 64, 128), "int4 GPTQ/AWQ"),
    (Case("w4a16", "gptq", 1, 64, 48, group_size=-1), "channel-wise scales need K divisible"),
    (Case("w8a16", "gptq", 1, 64, 128, bits=8, sym=False, group_size=-1), "no zero point"),
    (Case("w8a16", "gptq", 1, 64, 128, bits=8, group_size=128), "one scale per output channel"),
    (Case("w8a16", "gptq", 1, 64, 128, bits=4, group_size=-1), "8-bit weights"),
    (Case("w8a16", "awq", 1, 64, 128), "int8 GPTQ or compressed-tensors"),
    (Case("w8a8", "gptq", 1, 64, 128, bits=8), "compressed-tensors int-quantized"),
    (Case("w4a8", "awq", 1, 64, 128, act_dtype="float32"), "carries zero points"),
    (Case("w4a8", "gptq", 1, 64, 128, sym=False, act_dtype="float32"), "no weight zero point"),
    (Case("w4a8", "gptq", 1, 64, 144, group_size=48, act_dtype="float32"), "group_size % 32 == 0"),
    (Case("w4a16-moe", "gptq", 1, 64, 128, E=4, top_k=2), "no CPU op for scheme"),
]


@needs_torch
@pytest.mark.parametrize("case,why", REFUSALS, ids=[c.describe() for c, _ in REFUSALS])
def test_can_implement_refusals(case, why):
    if case.scheme in tc.OPS:
        _skip_unless(case.scheme)
    sup = _backend().can_implement(case)
    assert not sup.ok
    assert why in sup.reason, sup.reason


@needs_torch
@pytest.mark.parametrize("case", [
    Case("w4a16", "awq", 3, 96, 256, group_size=64, act_dtype="float16"),
    Case("w4a16", "ct-pack-quantized", 3, 96, 256, group_size=-1, sym=False),
    Case("w8a16", "ct-int-quantized", 3, 96, 100, act_dtype="float16"),
    Case("w8a8", "ct-int-quantized", 3, 96, 100, out_dtype="float32"),
    Case("w4a8", "ct-pack-quantized", 3, 96, 256, group_size=64, act_dtype="float32"),
    Case("w4a8", "gptq", 3, 96, 256, group_size=-1, act_dtype="bfloat16"),
    Case("w4a8", "gptq", 3, 96, 256, group_size=64, act_dtype="bfloat16"),  # vLLM upcasts to fp32
    Case("w4a8", "gptq", 3, 96, 256, group_size=64, act_dtype="float16"),
], ids=lambda c: c.describe())
def test_can_implement_accepts(case):
    _skip_unless(case.scheme)
    assert _backend().can_implement(case).ok


# ------------------------------------------------------------------------------- layout transforms
def _emulator_codes(case: Case, tensors: dict):
    """(q unsigned [N, K], z [N, G], s [N, G]) by the emulator's own readers (the oracle)."""
    from emulator.formats import awq, compressed_tensors as ct, gptq

    if case.weight_format == "gptq":
        p = gptq.GptqParams(bits=case.bits, group_size=case.group_size, sym=case.sym,
                            zero_convention=case.gptq_zero_convention)
        c = gptq.unpack_gptq(gptq.GptqTensors(tensors["qweight"], tensors["qzeros"], tensors["scales"],
                                              tensors["g_idx"]), p, shape=(case.N, case.K))
        return c.q.astype(np.int64), c.zeros.T.astype(np.int64), np.asarray(c.scales).T
    if case.weight_format == "awq":
        c = awq.unpack_awq(awq.AwqTensors(tensors["qweight"], tensors["qzeros"], tensors["scales"]),
                           awq.AwqParams(bits=4, group_size=case.group_size), shape=(case.N, case.K))
        return c.q.astype(np.int64), c.zeros.T.astype(np.int64), np.asarray(c.scales).T
    channel = case.group_size in (-1, 0)
    p = ct.CtPackParams(num_bits=case.bits, strategy="channel" if channel else "group",
                        group_size=None if channel else case.group_size, symmetric=case.sym)
    c = ct.unpack_ct_packed(ct.CtPackedTensors(tensors["weight_packed"], tensors["weight_scale"],
                                               tensors["weight_shape"], tensors.get("weight_zero_point")), p)
    off = 1 << (case.bits - 1)
    zp = np.zeros_like(np.asarray(c.scales), dtype=np.int64) if c.zero_point is None else c.zero_point
    return c.q.astype(np.int64) + off, np.asarray(zp, np.int64) + off, np.asarray(c.scales)


READ_CASES = [
    Case("w4a16", "gptq", 1, 64, 256, group_size=32, sym=True),
    Case("w4a16", "gptq", 1, 64, 256, group_size=128, sym=False),
    Case("w4a16", "gptq", 1, 64, 256, group_size=128, sym=False, zero_convention="v2"),
    Case("w4a16", "awq", 1, 64, 256, group_size=64),
    Case("w4a16", "ct-pack-quantized", 1, 64, 256, group_size=32, sym=True),
    Case("w4a16", "ct-pack-quantized", 1, 96, 256, group_size=-1, sym=False, scale_dtype="bfloat16"),
    Case("w8a16", "gptq", 1, 64, 256, group_size=-1, bits=8, scale_dtype="bfloat16"),
    Case("w8a16", "ct-pack-quantized", 1, 64, 256, group_size=-1, bits=8, scale_dtype="float32"),
]


@needs_torch
@pytest.mark.parametrize("case", READ_CASES, ids=lambda c: c.describe() + f" bits={c.bits}")
def test_read_codes_matches_emulator_unpack(case):
    inp = make_inputs(case, 1)
    c = tc.read_codes(case, inp.tensors)
    q, z, s = _emulator_codes(case, inp.tensors)
    np.testing.assert_array_equal(c.q.numpy(), q)
    if case.sym and case.weight_format == "gptq":
        assert (c.z.numpy() == 1 << (case.bits - 1)).all()  # qzeros not read for symmetric GPTQ
    np.testing.assert_array_equal(c.z.numpy(), z)
    np.testing.assert_array_equal(c.s.float().numpy(), np.asarray(s, np.float32))


@needs_torch
def test_read_codes_ct_int():
    case = Case("w8a8", "ct-int-quantized", 1, 32, 64, group_size=-1, scale_dtype="float32")
    inp = make_inputs(case, 0)
    c = tc.read_codes(case, inp.tensors)
    np.testing.assert_array_equal((c.q - c.z).numpy(), inp.tensors["weight"].astype(np.int64))


@needs_torch
def test_unpack_fields_awq_order():
    import torch

    # AWQ: elements [0..7] are stored as 0x75316420 (emulator/formats/packing.py worked example)
    w = torch.tensor([[0x75316420]], dtype=torch.int32)
    assert tc.unpack_fields(w, 4, 1, tc.AWQ_REVERSE_ORDER).tolist() == [[0, 1, 2, 3, 4, 5, 6, 7]]
    w = torch.tensor([[0x87654321 - (1 << 32)]], dtype=torch.int32)
    assert tc.unpack_fields(w, 4, 1).tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]


@needs_torch
@pytest.mark.parametrize("N", [16, 48, 64, 96, 160])
def test_int4pack_layout_roundtrip(N):
    import torch

    cap = tc._torch_state()[3]
    if platform.machine().lower() not in ("x86_64", "amd64") or cap not in ("AVX512", "AVX2", "DEFAULT"):
        pytest.skip(f"int4pack layout decoded for x86 only (machine {platform.machine()}, capability {cap})")
    K = 64
    q = torch.randint(0, 16, (N, K), dtype=torch.int32, generator=torch.Generator().manual_seed(N))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    assert packed.dtype == torch.uint8 and tuple(packed.shape) == (N, K // 2)
    np.testing.assert_array_equal(tc.unpack_int4pack_cpu(packed, N, K, cap).numpy(), q.numpy())


@needs_torch
def test_tinygemm_scales_and_zeros():
    import torch

    s = torch.tensor([[0.5, 1.0078125], [0.25, 3.0]], dtype=torch.float16)  # [N=2, G=2]
    z = torch.tensor([[8, 1], [0, 15]], dtype=torch.int32)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        sz = tc.tinygemm_scales_and_zeros(s, z, dt)
        assert sz.dtype == dt and tuple(sz.shape) == (2, 2, 2)  # [G, N, 2]
        np.testing.assert_array_equal(sz[..., 0].t().float().numpy(), s.to(dt).float().numpy())
        exact = ((8 - z).double() * s.to(dt).double())
        np.testing.assert_array_equal(sz[..., 1].t().double().numpy(), exact.to(dt).double().numpy())
    # float32: the float zero is exact, so (q - 8) * s + zero == (q - z) * s for every q
    sz = tc.tinygemm_scales_and_zeros(s, z, torch.float32)
    for q in range(16):
        w = (q - 8) * sz[..., 0].t().double() + sz[..., 1].t().double()
        np.testing.assert_array_equal(w.numpy(), ((q - z).double() * s.double()).numpy())
    # bfloat16: 7 * 1.0078125 = 7.0546875 is not a bf16 value; the stored zero is 7.0625
    sz = tc.tinygemm_scales_and_zeros(s, z, torch.bfloat16)
    assert float(sz[1, 0, 1]) == 7.0625


@needs_torch
def test_int4pack_group_for_channelwise():
    assert tc.int4pack_group(Case("w4a16", "gptq", 1, 64, 768, group_size=-1)) == 256
    assert tc.int4pack_group(Case("w4a16", "gptq", 1, 64, 96, group_size=-1)) == 32
    assert tc.int4pack_group(Case("w4a16", "gptq", 1, 64, 48, group_size=-1)) == 0


@needs_torch
def test_dyn_quant_fallback_layout():
    import torch

    _skip_unless("w4a8")
    if tc.kleidiai_available():
        pytest.skip("KleidiAI packs an opaque blob")
    N, K, bl = 16, 64, 32
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (N, K), dtype=torch.int32, generator=g)
    nib = tc.dyn_quant_nibbles(q)
    # low nibble = even k, high nibble = odd k
    np.testing.assert_array_equal((nib & 0xF).numpy(), q[:, 0::2].numpy())
    np.testing.assert_array_equal((nib >> 4).numpy(), q[:, 1::2].numpy())
    s = torch.rand(N, K // bl, generator=g) + 0.5
    bias = torch.randn(N, generator=g)
    pw = torch.ops.aten._dyn_quant_pack_4bit_weight(nib.reshape(N, K // bl, bl // 2), s, bias, bl, K, N)
    n_w = N * K // 2
    np.testing.assert_array_equal(pw[:n_w].to(torch.uint8).numpy(), nib.reshape(-1).numpy())
    np.testing.assert_array_equal(pw[n_w:n_w + N * K // bl].numpy(), s.reshape(-1).numpy())
    np.testing.assert_array_equal(pw[n_w + N * K // bl:].numpy(), bias.numpy())


@needs_torch
def test_int8_quant_in_torch_matches_emulator():
    import torch

    from emulator.activations import int8 as a8

    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 96)).astype(np.float32)
    x[1] = 0.0  # zero row
    x[2, :8] = [127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5]  # amax 127 -> scale 1: exact ties
    x[2, 8:] = 0.25
    x[3] *= 1e-30  # tiny row
    q, scale = tc.quantize_int8_per_token_torch(torch.from_numpy(x))
    ref = a8.quantize_int8_per_token(x, a8.CANONICAL_SYM)
    np.testing.assert_array_equal(q.numpy().astype(np.int32), ref.q)
    np.testing.assert_array_equal(scale.numpy(), ref.scale)
    assert q[2, :8].tolist() == [127, 0, 2, 2, 0, -2, -2, 4]  # round half to even


def test_kai_qa8dx_model():
    """The emulator's kai_qa8dx scheme on hand-made rows (docs/formats/activations.md#kleidiai-qa8dx)."""
    x = np.zeros((3, 8), np.float32)
    x[0, :3] = [127.5, 0.25, 0.75]  # all >= 0: range [0, 127.5], inv = 2, ties at 0.5, 1.5
    x[2] = np.linspace(-1.0, 3.0, 8, dtype=np.float32)
    a = a8.quantize_int8_per_token(x, QA8DX)
    q, zp, scale = a.q, a.zero_point[:, 0], a.scale[:, 0]
    assert scale[0] == 0.5 and zp[0] == -128
    assert (q[0, :3] - zp[0]).tolist() == [255, 1, 2]  # std::round: half away from zero (0.5 -> 1, 1.5 -> 2)
    assert scale[1] == 1.0 and (q[1] - zp[1] == 0).all()  # zero row: inv = 1, codes = zp
    xd = (q[2] - zp[2]) * np.float64(scale[2])
    assert np.max(np.abs(xd - x[2])) <= scale[2] / 2 + 1e-7


def _dyn_quant_fallback_model(x, q, s, bias, bl):
    """The fp32 x86 fallback of _dyn_quant_matmul_4bit on top of the emulator's qa8dx codes:
    iacc_g = sum (q_a - zp)(q - 8) (int32), acc = fl32(sum_g fl32(iacc_g * s_g)) (one group: no sum),
    y = fl32(fl32(acc * s_a) + bias)."""
    acts = a8.quantize_int8_per_token(x, QA8DX)
    xq = (acts.q - acts.zero_point).astype(np.int64)
    w = q.astype(np.int64) - 8
    f = np.float32
    y = np.zeros((x.shape[0], q.shape[0]), f)
    for m in range(x.shape[0]):
        acc = None
        for g in range(q.shape[1] // bl):
            ia = (xq[m, g * bl:(g + 1) * bl][None, :] * w[:, g * bl:(g + 1) * bl]).sum(1)
            t = (ia.astype(f) * s[:, g]).astype(f)
            acc = t if acc is None else (acc + t).astype(f)
        r = (acc * acts.scale[m, 0]).astype(f)
        y[m] = r if bias is None else (r + bias).astype(f)
    return y


@needs_torch
def test_dyn_quant_fallback_bit_exact_with_emulator_qa8dx():
    """The real op (fp32, channel-wise and groupwise, with and without bias) equals the fallback's fp32
    arithmetic applied to the emulator's kai_qa8dx codes bit for bit, on rows built to separate qa8dx
    from the canonical asymmetric scheme: all-positive rows, exact .5 ties of x * inv, zero rows."""
    import torch

    _skip_unless("w4a8")
    if tc.kleidiai_available():
        pytest.skip("KleidiAI kernels, not the reference fallback")
    rng = np.random.default_rng(0)
    n = 0
    for trial in range(48):
        M, N, K = int(rng.integers(1, 6)), 32, int(rng.choice([64, 128, 256]))
        bl = int(rng.choice([K, 32, 64]))
        x = (rng.standard_normal((M, K)) * rng.choice([1.0, 10.0, 0.01])).astype(np.float32)
        if trial % 5 == 0:
            x = np.abs(x) + 0.5
        if trial % 7 == 0:
            x[0] = 0
        if trial % 3 == 0:
            x[-1] = 0
            x[-1, 0] = 127.5
            x[-1, 1:20] = np.arange(19) / 2 + 0.25  # inv = 2: x * inv = k + 0.5
        q = rng.integers(0, 16, (N, K))
        s = (rng.random((N, K // bl)) * 0.1 + 0.01).astype(np.float32)
        if bl < K:  # groupwise scales are bfloat16
            s = torch.from_numpy(s).bfloat16().float().numpy()
        bias = (rng.standard_normal(N) * 0.1).astype(np.float32) if trial % 2 else None
        nib = tc.dyn_quant_nibbles(torch.from_numpy(q.astype(np.int32)))
        sc = torch.from_numpy(s).to(torch.float32 if bl == K else torch.bfloat16)
        pw = torch.ops.aten._dyn_quant_pack_4bit_weight(nib.reshape(N, K // bl, bl // 2), sc,
                                                        None if bias is None else torch.from_numpy(bias), bl, K, N)
        y = torch.ops.aten._dyn_quant_matmul_4bit(torch.from_numpy(x), pw, bl, K, N).numpy()
        np.testing.assert_array_equal(y, _dyn_quant_fallback_model(x, q, s, bias, bl), err_msg=f"trial {trial}")
        n += 1
    assert n == 48


# ------------------------------------------------------------------------------ smoke comparisons
def _smoke(case: Case, seed: int = 0):
    _skip_unless(case.scheme)
    b = _backend()
    sup = b.can_implement(case)
    assert sup.ok, sup.reason
    inp = make_inputs(case, seed)
    d = b.declared(case)
    y = b.run(b.prepare(case, inp.tensors), inp.x, bias=inp.bias)
    return inp, d, y


SMOKE = [
    # W4A16
    Case("w4a16", "gptq", 1, 64, 128, group_size=32, sym=True, act_dtype="bfloat16"),
    Case("w4a16", "gptq", 3, 96, 256, group_size=128, sym=True, act_dtype="float16", bias=True),
    Case("w4a16", "gptq", 16, 256, 128, group_size=-1, sym=True, act_dtype="float32"),
    Case("w4a16", "gptq", 3, 96, 256, group_size=32, sym=False, act_dtype="bfloat16"),
    Case("w4a16", "gptq", 1, 64, 128, group_size=128, sym=False, zero_convention="v2", act_dtype="float16"),
    Case("w4a16", "awq", 16, 256, 128, group_size=32, act_dtype="bfloat16", bias=True),
    Case("w4a16", "awq", 3, 96, 256, group_size=-1, act_dtype="float32", bias=True),
    Case("w4a16", "awq", 1, 64, 256, group_size=64, act_dtype="float16"),
    Case("w4a16", "gptq", 5, 72, 256, group_size=32, sym=False, act_dtype="bfloat16", bias=True),  # N padded
    Case("w4a16", "ct-pack-quantized", 3, 40, 128, group_size=-1, sym=True, act_dtype="float32"),
    Case("w4a16", "ct-pack-quantized", 3, 96, 256, group_size=128, sym=True, act_dtype="bfloat16", bias=True),
    Case("w4a16", "ct-pack-quantized", 16, 256, 128, group_size=32, sym=False, act_dtype="float16"),
    Case("w4a16", "ct-pack-quantized", 3, 64, 256, group_size=-1, sym=False, act_dtype="bfloat16",
         scale_dtype="float32"),
    Case("w4a16", "ct-pack-quantized", 3, 64, 256, group_size=32, sym=False, act_dtype="float32",
         scale_dtype="float32"),
    # W8A16 (bf16 scales: fp16 scales of the planted tiny rows underflow in make_inputs)
    Case("w8a16", "gptq", 3, 96, 256, group_size=-1, bits=8, act_dtype="bfloat16", scale_dtype="bfloat16"),
    Case("w8a16", "ct-pack-quantized", 16, 256, 128, group_size=-1, bits=8, act_dtype="float16",
         scale_dtype="bfloat16", bias=True),
    Case("w8a16", "ct-int-quantized", 1, 64, 128, act_dtype="float32", scale_dtype="float32", bias=True),
    Case("w8a16", "ct-int-quantized", 3, 96, 100, act_dtype="float16", scale_dtype="bfloat16"),
    Case("w8a16", "ct-int-quantized", 16, 64, 256, act_dtype="bfloat16", scale_dtype="float32", bias=True),
    # W8A8
    Case("w8a8", "ct-int-quantized", 1, 64, 128, act_dtype="bfloat16", scale_dtype="bfloat16"),
    Case("w8a8", "ct-int-quantized", 3, 96, 256, act_dtype="float16", scale_dtype="bfloat16", bias=True),
    Case("w8a8", "ct-int-quantized", 16, 256, 128, act_dtype="float32", scale_dtype="float32", bias=True),
    Case("w8a8", "ct-int-quantized", 3, 96, 100, act_dtype="bfloat16", scale_dtype="float32",
         out_dtype="float32"),
    # W4A8
    Case("w4a8", "gptq", 1, 64, 128, group_size=32, act_dtype="float32"),
    Case("w4a8", "gptq", 3, 96, 256, group_size=-1, act_dtype="bfloat16", bias=True),
    Case("w4a8", "ct-pack-quantized", 16, 256, 128, group_size=128, act_dtype="float32", bias=True),
    Case("w4a8", "ct-pack-quantized", 3, 96, 256, group_size=64, act_dtype="float32"),
    Case("w4a8", "ct-pack-quantized", 16, 64, 256, group_size=-1, act_dtype="bfloat16"),
    Case("w4a8", "gptq", 3, 96, 256, group_size=32, act_dtype="bfloat16", bias=True),
    Case("w4a8", "ct-pack-quantized", 16, 64, 128, group_size=64, act_dtype="float16"),
]


@needs_torch
@pytest.mark.parametrize("case", SMOKE, ids=lambda c: c.describe() + (" bias" if c.bias else ""))
def test_smoke_inside_declared_interval(case):
    inp, d, y = _smoke(case)
    c = compare(y, declared_interval(inp, d))
    assert c.ok, (case.describe(), c)


@needs_torch
def test_smoke_exact_for_16bit_sym_w4a16():
    # fp32 accumulation of exact weights and a single RNE to bf16: bit-exact on these inputs
    inp, d, y = _smoke(Case("w4a16", "gptq", 3, 96, 256, group_size=128, sym=True, act_dtype="bfloat16"))
    assert compare(y, declared_interval(inp, d)).exact_match


# ------------------------------------------------------------------------------ constructed probes
def _ct_asym_tensors(N, K, q_signed, zp_signed, scale):
    from emulator.formats import compressed_tensors as ct

    p = ct.CtPackParams(num_bits=4, strategy="group", group_size=K, symmetric=False)
    t = ct.pack_ct_packed(ct.CtCodes(q=np.full((N, K), q_signed, np.int8),
                                     scales=np.full((N, 1), scale, np.float16),
                                     zero_point=np.full((N, 1), zp_signed, np.int8)), p)
    return {"weight_packed": t.weight_packed, "weight_scale": t.weight_scale,
            "weight_shape": np.asarray(t.weight_shape, np.int64), "weight_zero_point": t.weight_zero_point}


@needs_torch
def test_probe_int4pack_float_zero():
    """q = z = 15, s = 1 + 2**-7: canonical (q - z) s = 0; the kernel's (q - 8) s + bf16((8 - z) s)
    = 7.0546875 + bf16(-7.0546875) = 7.0546875 - 7.0625 = -2**-7 (docs/backends/torch-cpu.md#w4a16)."""
    case = Case("w4a16", "ct-pack-quantized", 1, 16, 32, group_size=32, sym=False, act_dtype="bfloat16")
    _skip_unless("w4a16")
    t = _ct_asym_tensors(16, 32, 7, 7, 1.0078125)
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 1.0
    b = _backend()
    y = b.run(b.prepare(case, t), x)
    assert (y == -2.0 ** -7).all()
    inp = CaseInputs(case, 0, t, x)
    d = b.declared(case)
    assert d.variants["dequant_order"] == "float_zero" and d.variants["zero_dtype"] == "bfloat16"
    assert compare(y, declared_interval(inp, d)).exact_match
    canon = declared_interval(inp, _without(d, "dequant_order", "zero_dtype"))  # canonical (q - z) s weights
    assert (canon.y_ref == 0).all()
    assert not compare(y, canon).ok
    # float32 activations store the zero exactly: canonical
    case32 = dataclasses.replace(case, act_dtype="float32")
    y32 = b.run(b.prepare(case32, t), x)
    assert (y32 == 0).all()


@needs_torch
def test_probe_w4a8_qa8dx():
    """All-positive rows (qa8dx widens the range to 0) and exact .5 ties (std::round): the
    kernel equals the local qa8dx model, and is outside the nearest canonical asym variant."""
    case = Case("w4a8", "gptq", 3, 64, 128, group_size=-1, act_dtype="float32")
    _skip_unless("w4a8")
    inp = make_inputs(case, 0)
    x = inp.x.copy()
    x[0] = np.abs(x[0]) + 0.5
    x[1] = 0.0
    x[1, 0] = 127.5
    x[1, 1:40] = np.arange(39) / 2 + 0.25  # inv = 2: x * inv = k + 0.5
    inp = dataclasses.replace(inp, x=x.astype(np.float32))
    b = _backend()
    d = b.declared(case)
    y = b.run(b.prepare(case, inp.tensors), inp.x)
    assert d.variants["act_scheme"] == "kai_qa8dx"
    assert compare(y, declared_interval(inp, d)).ok
    # the nearest canonical scheme (asymmetric, RHAZ, x * fl32(1/scale)) is outside
    canon = dataclasses.replace(d, variants=dict(_without(d, "act_scheme").variants, act_symmetric=False,
                                                 reciprocal="recip_scale"))
    assert not compare(y, declared_interval(inp, canon)).ok


@needs_torch
def test_probe_w8a8_ties_and_zero_row():
    case = Case("w8a8", "ct-int-quantized", 3, 64, 128, act_dtype="bfloat16", scale_dtype="bfloat16", bias=True)
    _skip_unless("w8a8")
    inp = make_inputs(case, 0)
    x = inp.x.copy()
    x[0, :8] = [127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5]
    x[1] = 0.0
    inp = dataclasses.replace(inp, x=x)
    b = _backend()
    d = b.declared(case)
    y = b.run(b.prepare(case, inp.tensors), inp.x, bias=inp.bias)
    iv = declared_interval(inp, d)
    c = compare(y, iv)
    assert c.ok and c.max_ulp <= 1
    np.testing.assert_array_equal(y[1], inp.bias)  # zero row: scale 0, codes 0, only the bias


@needs_torch
def test_probe_bias_after_output_rounding():
    """acc = 1 + 2**-8 rounds (tie, even) to 1.0 in bf16 inside the kernel; + bias -1 gives 0,
    where a single rounding of acc + bias gives 2**-8."""
    case = Case("w8a16", "ct-int-quantized", 1, 16, 16, act_dtype="bfloat16", bias=True)
    _skip_unless("w8a16")
    w = np.zeros((16, 16), np.int8)
    w[:, :2] = 1
    t = {"weight": w, "weight_scale": np.ones((16, 1), np.float16)}
    x = np.zeros((1, 16), np.float32)
    x[0, :2] = [1.0, 2.0 ** -8]
    bias = np.full(16, -1.0, np.float32)
    b = _backend()
    y = b.run(b.prepare(case, t), x, bias=bias)
    assert (y == 0).all()
    inp = CaseInputs(case, 0, t, x, bias)
    d = b.declared(case)
    assert d.variants["bias_stage"] == "after_output_rounding"
    assert compare(y, declared_interval(inp, d)).exact_match
    assert not compare(y, declared_interval(inp, _without(d, "bias_stage"))).ok


@needs_torch
def test_probe_int8pack_bf16_reads_past_row():
    """Kernel discrepancy: _weight_int8pack_mm (AVX512, bf16) steps K by 16 with no tail; K = 40
    reads 8 elements past each row (can_implement refuses K % 16 != 0). Run in a subprocess:
    with several rows the unaligned _mm256_load_si256 can crash the process."""
    if tc._torch_state()[3] != "AVX512":
        pytest.skip("the AVX512 bf16 int8pack kernel is not the one dispatched here")
    _skip_unless("w8a16")
    code = textwrap.dedent("""
        import torch
        torch.manual_seed(0)
        N, K = 8, 40
        buf = torch.ones(64, dtype=torch.bfloat16)
        buf[:K] = torch.randn(K).bfloat16()
        x = buf[:K].view(1, K)
        w = torch.randint(-127, 128, (N, K), dtype=torch.int8)
        y = torch.ops.aten._weight_int8pack_mm(x, w, torch.ones(N, dtype=torch.bfloat16)).float()[0, :-1]
        ref = (x.float() @ w.float().t())[0, :-1]
        past = ref + w[1:, :8].float().sum(1)
        print(int(torch.allclose(y, ref, rtol=1e-2, atol=1e-2)), int(torch.allclose(y, past, rtol=1e-2, atol=1e-2)))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    correct, reads_past = map(int, r.stdout.split())
    if correct:
        pytest.fail("_weight_int8pack_mm bf16 now handles K % 16 != 0: relax TorchCpuBackend._can_w8a16")
    assert reads_past


@needs_torch
def test_probe_w4a8_bf16_channelwise_truncates():
    """The bf16 channel-wise fallback writes its fp32 result to bf16 by dropping the low 16 bits
    (round toward zero): it equals the fp32 path's output truncated, not rounded."""
    import torch

    _skip_unless("w4a8")
    if tc.kleidiai_available():
        pytest.skip("KleidiAI kernels, not the reference fallback")
    case = Case("w4a8", "gptq", 16, 64, 256, group_size=-1, act_dtype="bfloat16", bias=True)
    inp = make_inputs(case, 3)
    b = _backend()
    d = b.declared(case)
    assert d.output_rounding == "rtz"
    y = b.run(b.prepare(case, inp.tensors), inp.x, bias=inp.bias)
    case32 = dataclasses.replace(case, act_dtype="float32")
    y32 = b.run(b.prepare(case32, inp.tensors), inp.x, bias=inp.bias)
    trunc = (torch.from_numpy(y32).view(torch.int32) & ~0xFFFF).view(torch.float32).numpy()
    np.testing.assert_array_equal(y, trunc)
    rne = torch.from_numpy(y32).bfloat16().float().numpy()
    assert (y != rne).any()
    assert compare(y, declared_interval(inp, d)).ok


def test_w4a8_groupwise_declares_bf16_scales():
    b = _backend()
    d = b.declared(Case("w4a8", "gptq", 1, 64, 256, group_size=64, act_dtype="float32"))
    assert d.variants["weight_scale_dtype"] == "bfloat16"
    d = b.declared(Case("w4a8", "gptq", 1, 64, 256, group_size=-1, act_dtype="float32"))
    assert "weight_scale_dtype" not in d.variants


# ------------------------------------------------- known kernel defect: run, judged, waived (never pass)
WAIVERS = Path(__file__).resolve().parents[2] / "waivers" / "known-kernel-defects.toml"
K_TAIL_CASE = Case("w8a16", "ct-int-quantized", 4, 64, 40, group_size=-1, scale_dtype="bfloat16")


def _k_tail_defect(c: Case) -> bool:
    """Independent statement of the defect's domain: int8pack W8A16 with bf16 activations and K % 16 != 0."""
    return c.scheme == "w8a16" and c.act_dtype == "bfloat16" and c.K % 16 != 0


@needs_torch
def test_int8pack_bf16_k_tail_is_run_not_refused():
    """The engine the adapter follows (GPTQModel TorchInt8QuantLinear, SUPPORTS_IN_FEATURES_DIVISIBLE_BY = [1])
    calls _weight_int8pack_mm for any K, so the adapter accepts the case and says why it will fail."""
    _skip_unless("w8a16")
    b = _backend()
    assert b.can_implement(K_TAIL_CASE).ok
    assert "KNOWN KERNEL DEFECT" in b.declared(K_TAIL_CASE).notes
    fp16 = dataclasses.replace(K_TAIL_CASE, act_dtype="float16")
    assert b.can_implement(fp16).ok and "KNOWN KERNEL DEFECT" not in b.declared(fp16).notes
    assert "KNOWN KERNEL DEFECT" not in b.declared(dataclasses.replace(K_TAIL_CASE, K=48)).notes


def test_known_defect_waivers_are_current_and_exact():
    """Every shipped waiver names an upstream reference and a future expiry; the torch-cpu int8pack one covers
    exactly the defect's cases in every profile (no more: it must not hide other torch-cpu results), and the
    torch-cpu qzeros one only the sym-nonmidpoint-qzeros edge cases."""
    ws = load_waivers(WAIVERS)
    assert ws
    today = time.strftime("%Y-%m-%d")
    for w in ws:
        assert w.issue and w.reason and w.expires > today, w
    # one waiver per K of the case lists' K tails (a glob cannot say K % 16 != 0)
    wi = [w for w in ws if w.backend == "torch-cpu" and "_weight_int8pack_mm" in w.reason]
    assert wi
    for profile in ("smoke", "ci", "certification"):
        specs = case_list(profile=profile)
        hit = {s.case_id for s in specs for w in wi if w.matches("torch-cpu", s)}
        want = {s.case_id for s in specs if _k_tail_defect(s.case)}
        assert want and hit == want, (profile, hit ^ want)
        assert not any(w.matches(label, s) for s in specs for w in wi for label in ("ark", "zentorch", "torch-cpu:x"))
    (q,) = [w for w in ws if w.backend == "torch-cpu" and "qzeros" in w.reason]
    specs = case_list(profile="ci")
    hit = {s.generator for s in specs if q.matches("torch-cpu", s)}
    assert hit and all(g.endswith("sym-nonmidpoint-qzeros") for g in hit), hit  # the edge and golden ones


@needs_torch
def test_int8pack_k_tail_case_is_waived_never_pass(tmp_path):
    """Through the isolated runner: without the waiver the suite's K = 40 bf16 case is fail or crash; with
    it the case is listed as waived, its real verdict kept in waived_verdict (never a pass)."""
    _skip_unless("w8a16")
    if tc._torch_state()[3] != "AVX512":
        pytest.skip("the defective AVX512 bf16 int8pack kernel is dispatched only on AVX-512 hosts; this host's "
                    f"torch CPU capability is {tc._torch_state()[3]}")
    spec = CaseSpec(K_TAIL_CASE, "random", "gaussian", 7)
    bare = Runner(tmp_path / "bare", timeout=120, progress=False).run(["torch-cpu"], [spec])
    assert [r["verdict"] for r in bare] in (["fail"], ["crash"]), bare
    waived = Runner(tmp_path / "waived", timeout=120, progress=False,
                    waivers=load_waivers(WAIVERS)).run(["torch-cpu"], [spec])
    (rec,) = waived
    assert rec["verdict"] == "waived" and rec["waived_verdict"] in BAD and "int8pack" in rec["waiver"]["reason"]
    assert "unexpected_pass_of_waived_case" not in rec


def test_int_mm_k1_is_a_known_failure(tmp_path):
    """The coverage design's K = 1 W8A8 cases reach torch._int_mm's K = 1 defect (docs/findings.md): judged
    ``fail`` on every host class seen (AVX2 Zen 3, AVX-512 Zen 5), ``waived`` under the project's waiver file;
    a fix upstream turns this test red (then drop the waiver)."""
    from pathlib import Path

    from conformance.run.runner import Runner, load_waivers
    from conformance.cases.suite import case_list

    k1 = [s for s in case_list(profile="ci", schemes=["w8a8"]) if s.case.K == 1]
    assert any(s.case.N == 1 for s in k1)  # the coverage tables put the smallest legal shape in ci
    k1 = [s for s in k1 if s.case.N == 1][:1] + [s for s in k1 if s.case.N > 1][:2]
    r = Runner(tmp_path / "plain", progress=False, timeout=120)
    try:
        plain = r.run(["torch-cpu"], k1)
    finally:
        r.close()
    # N = 1 is exact (no leading dimension to get wrong); N > 1 is not
    assert [x["verdict"] for x in plain] == ["pass", "fail", "fail"], [x["reason"] for x in plain]
    waivers = load_waivers(Path(__file__).resolve().parents[2] / "waivers" / "known-kernel-defects.toml")
    r = Runner(tmp_path / "waived", progress=False, timeout=120, waivers=waivers)
    try:
        waived = r.run(["torch-cpu"], k1)
    finally:
        r.close()
    assert [(x["verdict"], x.get("waived_verdict")) for x in waived] == [("pass", None)] + [("waived", "fail")] * 2
    assert not any("unexpected_pass_of_waived_case" in x for x in waived)  # the waiver names only failing cases
    # the dispatcher never picks the kernel where the defect is known (auto answers those cases elsewhere)
    from backends.dispatch import dispatch_refusal
    from backends.registry import create

    tc = create("torch-cpu")
    for spec, defect in zip(k1, (False, True, True)):
        refused = dispatch_refusal(tc, spec.case)
        assert (refused is not None and "_int_mm" in refused) == defect, (spec.case_id, refused)
