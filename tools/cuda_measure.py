"""Device-side measurements of the cuda adapter: probes, the smoke matrix and the float-zero reproducer.

Run on a CUDA host (the lent GPU machine): ``python -m tools.cuda_measure [out.json]``. The numbers
and what they establish are in docs/backends/cuda.md. This is a tool, not part of the adapter: it
judges the kernel with the conformance code, which the adapter itself must not import.
"""

from __future__ import annotations

import numpy as np

from backends.base import Case
from backends.cuda import CudaBackend, cuda_state, tinygemm_weight
from conformance.judge.acceptance import compare, declared_interval, declared_weight
from conformance.cases.inputs import make_inputs


def _w4a16_cases():
    out = []
    for fmt, sym, zc in (("gptq", True, None), ("gptq", False, None), ("gptq", False, "v2"), ("awq", False, None),
                         ("ct-pack-quantized", True, None), ("ct-pack-quantized", False, None)):
        for (M, N, K, g) in ((1, 64, 128, 32), (3, 96, 256, 128), (16, 256, 128, -1), (3, 64, 256, 64),
                             (16, 96, 128, 128), (1, 256, 256, 256)):
            if fmt == "awq" and g == -1:
                g = 128
            out.append(Case("w4a16", fmt, M, N, K, group_size=g, sym=sym, zero_convention=zc, act_dtype="bfloat16"))
    return out


def _w8a8_cases():
    out = []
    for dt in ("bfloat16", "float16", "float32"):
        for (M, N, K, sd) in ((17, 64, 256, "float16"), (32, 96, 256, "float16"), (64, 256, 128, "float32"),
                              (24, 128, 128, "bfloat16")):
            for bias in (False, True):
                out.append(Case("w8a8", "ct-int-quantized", M, N, K, act_dtype=dt, bias=bias, scale_dtype=sd))
    return out


def measure(seeds=(0, 1)) -> list[dict]:
    """Run the smoke matrix against the emulator; one row per case and seed."""

    rows = []
    for case in _w4a16_cases() + _w8a8_cases() + [
            Case("w4a16", "gptq", 3, 64, 128, group_size=32, sym=True, bias=True),
            Case("w4a16", "gptq", 16, 256, 256, group_size=128, sym=False, bias=True),
            Case("w4a16", "awq", 3, 96, 256, group_size=64, sym=False, bias=True),
            Case("w4a16", "ct-pack-quantized", 16, 64, 128, group_size=-1, sym=False, bias=True)]:
        be = CudaBackend()
        sup = be.can_implement(case)
        if not sup:
            rows.append({"case": case.describe(), "refused": sup.reason})
            continue
        for seed in seeds:
            inp = make_inputs(case, seed)
            prep = be.prepare(case, inp.tensors)
            y = be.run(prep, inp.x, bias=inp.bias)
            c = compare(y, declared_interval(inp, be.declared(case)))
            rows.append({"case": case.describe(), "zero_convention": case.zero_convention, "bias": case.bias,
                         "scale_dtype": case.scale_dtype, "seed": seed, "exact": c.exact_match, "inside": c.ok,
                         "n_out": c.n_out, "max_ulp": c.max_ulp, "sqnr_db": round(c.sqnr_db, 1)})
    return rows


def probes() -> dict:
    """Device facts the declarations rest on (run on a CUDA host)."""
    import torch
    out = {}
    dev = torch.device("cuda")
    # 1. tensor / CPU-scalar on CUDA multiplies by the reciprocal (BinaryDivTrueKernel.cu)
    a = torch.rand(1 << 20, device=dev, dtype=torch.float32) * 100
    by_scalar = a / 127.0
    by_tensor = torch.div(a, torch.full_like(a, 127.0))
    by_recip = a * torch.tensor(np.float32(1.0) / np.float32(127.0), device=dev)
    out["div_cpu_scalar_differs_from_true_division"] = int((by_scalar != by_tensor).sum())
    out["div_cpu_scalar_equals_reciprocal_multiply"] = bool(torch.equal(by_scalar, by_recip))
    host = (a.cpu().numpy() / np.float32(127.0)).astype(np.float32)
    out["div_tensor_equals_numpy_ieee"] = bool(np.array_equal(by_tensor.cpu().numpy(), host))
    # 2. torch.round is RNE on CUDA
    t = torch.tensor([0.5, 1.5, 2.5, -2.5, 126.5, 127.5], device=dev)
    out["torch_round_cuda"] = torch.round(t).tolist()
    # 3. MXFP4 through torch._scaled_mm on this device
    try:
        M, N, K = 32, 64, 128
        a4 = torch.zeros(M, K // 2, dtype=torch.uint8, device=dev).view(torch.float4_e2m1fn_x2)
        b4 = torch.zeros(N, K // 2, dtype=torch.uint8, device=dev).view(torch.float4_e2m1fn_x2)
        sa = torch.full((M, K // 32), 127, dtype=torch.uint8, device=dev).view(torch.float8_e8m0fnu)
        sb = torch.full((N, K // 32), 127, dtype=torch.uint8, device=dev).view(torch.float8_e8m0fnu)
        torch._scaled_mm(a4, b4.t(), sa, sb, out_dtype=torch.bfloat16)
        out["scaled_mm_mxfp4"] = "ran"
    except Exception as e:  # expected on sm_90
        out["scaled_mm_mxfp4"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    # 4. _int_mm with M = 16
    try:
        torch._int_mm(torch.zeros(16, 32, dtype=torch.int8, device=dev), torch.zeros(32, 8, dtype=torch.int8,
                                                                                   device=dev))
        out["int_mm_M16"] = "ran"
    except Exception as e:
        out["int_mm_M16"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    # 5. _weight_int4pack_mm with fp16 activations
    try:
        pk = torch.ops.aten._convert_weight_to_int4pack(torch.zeros(64, 64, dtype=torch.uint8, device=dev), 2)
        sz = torch.zeros(4, 64, 2, dtype=torch.float16, device=dev)
        torch.ops.aten._weight_int4pack_mm(torch.zeros(2, 128, dtype=torch.float16, device=dev), pk, 32, sz)
        out["int4pack_mm_fp16"] = "ran"
    except Exception as e:
        out["int4pack_mm_fp16"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    # 6. one asymmetric weight, read back through a one-hot activation: float zero rounding
    out["float_zero_reproducer"] = float_zero_reproducer()
    return out


def float_zero_reproducer() -> dict:
    """q = 0, z = 15, s = 0.005035400390625 (a bf16 value), x = e_0: y[0, 0] is the weight tinygemm formed.

    canonical bf16((q - z) * s) = -0.0756836; tinygemm bf16((q - 8) * s + bf16((8 - z) * s)) = -0.0751953.
    """
    import torch
    N, K, G = 8, 32, 32
    case = Case("w4a16", "gptq", 1, N, K, group_size=G, sym=False)
    from emulator.formats import gptq as _g

    q = np.zeros((N, K), np.uint8)
    z = np.full((1, N), 15, np.int32)
    s = np.full((1, N), 0.005035400390625, np.float16)
    t = _g.pack_gptq(_g.GptqCodes(q, z, s, np.zeros(K, np.int32)), _g.GptqParams(group_size=G, sym=False))
    tensors = {"qweight": t.qweight, "qzeros": t.qzeros, "scales": t.scales, "g_idx": t.g_idx}
    x = np.zeros((1, K), np.float32)
    x[0, 0] = 1.0
    b = CudaBackend()
    y = b.run(b.prepare(case, tensors), x)
    torch.cuda.synchronize()
    return {"kernel": float(y[0, 0]), "canonical_bf16": float(np.float32(-0.07568359375)),
            "tinygemm_model": float(tinygemm_weight(case, tensors)[0, 0]),
            "declared_float_zero": float(declared_weight(case, tensors, b.declared(case))[0, 0])}


if __name__ == "__main__":  # pragma: no cover - device-side measurement
    import json
    import sys

    st = cuda_state()
    print(st["reason"])
    res = {"state": {k: (list(v) if isinstance(v, tuple) else v) for k, v in st.items()}, "probes": probes(),
           "rows": measure()}
    print(res["probes"])
    for r in res["rows"]:
        print(r)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(res, f, indent=1)
