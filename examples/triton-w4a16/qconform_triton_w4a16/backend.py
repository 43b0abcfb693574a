"""qconform adapter of the Triton W4A16 GPTQ kernel (registered as ``triton-w4a16``).

Declared arithmetic (checked by ``qconform certify``, recovered by ``qconform fingerprint``):
scales read in the activation dtype T (``weight_scale_dtype`` = T: the engine loads them into
T parameters), weights ``T((q - z) * s_T)`` (``weight_dtype`` = T, one RNE rounding), activations
used as given, fp32 accumulation (tensor-core ``tl.dot``), bias added in fp32, output rounded once
(RNE) to T; the canonical GPTQ zero reading (v1: field + 1, v2: field; symmetric checkpoints' qzeros
are read, not assumed 8).
"""

from __future__ import annotations

import numpy as np

from backends.base import Availability, Backend, Case, Declared, Prepared, Support, no, yes

from . import __version__

_TORCH_DTYPE = {"bfloat16": "bfloat16", "float16": "float16"}


def _state() -> tuple[bool, str, str | None]:
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return False, f"torch not importable: {type(e).__name__}: {e}", None
    try:
        import triton
    except Exception as e:  # noqa: BLE001
        return False, f"triton not importable: {type(e).__name__}: {e}", None
    if not torch.cuda.is_available():
        return False, f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__})", None
    name = torch.cuda.get_device_name(0)
    return True, f"triton {triton.__version__} on {name}", name


class TritonW4A16Backend(Backend):
    name = "triton-w4a16"
    covers = "example plugin: Triton W4A16 GEMM on GPTQ-layout int4 weights (T weights, fp32 tensor-core accumulation)"
    priority = 0

    def availability(self) -> Availability:
        ok, reason, dev = _state()
        return Availability(ok, reason, __version__, dev)

    def schemes(self) -> list[str]:
        return ["w4a16"]

    def can_implement(self, case: Case) -> Support:
        if case.scheme != "w4a16" or case.weight_format != "gptq" or case.bits != 4:
            return no(f"only w4a16 GPTQ int4 (got {case.scheme}/{case.weight_format}, {case.bits} bits)")
        if case.act_dtype not in _TORCH_DTYPE:
            return no(f"activations must be bfloat16 or float16 (got {case.act_dtype}): tl.dot on fp32 would use TF32")
        if case.output_dtype != case.act_dtype:
            return no("the output dtype is the activation dtype")
        if case.K % 8 or case.N % 8:
            return no(f"K={case.K} and N={case.N} must be multiples of 8 (GPTQ packing)")
        return yes()

    def declared(self, case: Case) -> Declared:
        T = case.act_dtype
        return Declared(variants={"weight_scale_dtype": T, "dequant_order": "sub_then_mul"}, weight_dtype=T,
                        act_compute_dtype=None, accumulate="float32", output=T, output_rounding="rne",
                        notes=f"scales as {T}; w = {T}(fp32((q - z) * s)) RNE; tl.dot fp32 accumulation; bias in "
                              f"fp32; output RNE to {T}")

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        import torch

        dt = getattr(torch, _TORCH_DTYPE[case.act_dtype])
        dev = torch.device("cuda")
        qweight = torch.from_numpy(np.ascontiguousarray(tensors["qweight"]).view(np.int32)).to(dev)
        qzeros = torch.from_numpy(np.ascontiguousarray(tensors["qzeros"]).view(np.int32)).to(dev)
        scales = torch.from_numpy(np.asarray(tensors["scales"], dtype=np.float32)).to(dev).to(dt).contiguous()
        g = tensors.get("g_idx")
        if g is None:
            g = np.arange(case.K) // case.group
        g_idx = torch.from_numpy(np.ascontiguousarray(g, dtype=np.int32)).to(dev)
        return Prepared(case, {"qweight": qweight, "qzeros": qzeros, "scales": scales, "g_idx": g_idx, "dtype": dt,
                               "zero_offset": 0 if case.zero_convention == "v2" else 1})

    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        import torch

        from .kernel import w4a16_gptq

        d = prepared.data
        xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).cuda().to(d["dtype"])
        bias = inputs.get("bias")
        bt = None if bias is None else torch.from_numpy(np.asarray(bias, np.float32)).cuda().to(d["dtype"])
        y = w4a16_gptq(xt, d["qweight"], d["qzeros"], d["scales"], d["g_idx"], bt, zero_offset=d["zero_offset"])
        torch.cuda.synchronize()
        return y.float().cpu().numpy()
