"""bitsandbytes' CUDA LLM.int8 kernels (threshold 0: no outlier decomposition) as a qconform W8A8 backend.

Semantics and results: docs/backends/bitsandbytes.md.

The path is the one ``bitsandbytes.nn.Linear8bitLt`` / ``MatMul8bitLt`` takes with ``threshold=0``
(bitsandbytes 0.50.2): ``torch.ops.bitsandbytes.int8_vectorwise_quant`` (CUDA kernel
``kInt8VectorQuant``), ``int8_linear_matmul`` (``igemmlt``: cuBLASLt int8 x int8 -> int32) and
``int8_mm_dequant`` (``kdequant_mm_int32_fp16``). Facts used here, from ``csrc/kernels.cu`` /
``csrc/ops.cu`` and ``bitsandbytes/backends/cuda/ops.py``:

- activations must be float16 (``int8_vectorwise_quant``: "A must be float16"); the row absmax is
  reduced in fp16 (exact) and stored as ``row_stats`` in fp32; codes are
  ``__float2int_rn(x * __fdividef(127, absmax))``: RNE of x times an *approximate* fp32 quotient
  (``div.approx``, up to 2 ulp), so a code can differ from ``x * (127 / amax)`` where the product lies
  within a few ulp of a half-integer;
- the weight is int8 [N, K] with per-row ``col_stats = absmax_w``; a checkpoint's scale s is
  ``absmax_w / 127``, so the adapter passes ``fl32(127 * s)`` (the repack an engine must make);
- the epilogue is ``__float2half(fmaf(acc * row_stats * col_stats, 6.200012e-05f, bias))``: two fp32
  products, a fused multiply-add by an fp32 approximation of 1/127**2, the fp16 bias inside the fma,
  one RNE rounding to fp16 (the kernel writes fp16 only);
- ``int8_linear_matmul`` falls back to an fp32 ``torch.matmul`` (with a RuntimeWarning) when K is not
  a multiple of 4 or cuBLASLt has no algorithm: the adapter refuses K % 4 and turns the warning into an
  error, so the fallback is never certified as this kernel.

The scale arithmetic (approximate quotient, the rescaled weight scale, the 1/127**2 constant) is not a
declared variant: declared ``arithmetic=opaque`` with the nearest variants (``reciprocal=recip_scale``, the
one ``qconform fingerprint`` found consistent on the H100 -- it excluded ``recip_amax`` on one probe --,
fp32 scales, fp16 output) and an SQNR floor of ``SQNR_FLOOR_DB`` against the canonical reference.
"""

from __future__ import annotations

import importlib
import warnings

import numpy as np

from .base import Availability, Backend, Case, Declared, Prepared, Support, no, yes
from .cuda import cuda_state

__all__ = ["BitsandbytesBackend", "bnb_state", "SQNR_FLOOR_DB", "colstats_from_scale"]

#: the SQNR floor against the canonical reference (docs/backends/bitsandbytes.md#sqnr-floor): one activation code
#: flipped by the approximate quotient moves a whole output row by s_x s_w w; in a row whose absmax is an outlier
#: channel (the other codes small) that alone is ~42 dB for M = 1. The floor, as for ARK's opaque int8 cores, is
#: 30 dB: it catches scale, layout and sign errors; the codes themselves are checked separately on the device
#: (tests/backends/test_gemlite_bnb.py::test_bnb_codes_are_recip_scale_up_to_near_ties)
SQNR_FLOOR_DB = 30.0


def _import_torch():
    import torch  # noqa: PLC0415

    return torch


def _import_bnb():
    return importlib.import_module("bitsandbytes")


def bnb_state() -> dict:
    """{'ok', 'reason', 'version', 'device'} of this host: CUDA first, then the bitsandbytes import."""
    st = cuda_state()
    if not st["ok"]:
        return {"ok": False, "reason": st["reason"], "version": None, "device": None}
    try:
        bnb = _import_bnb()
        _import_torch().ops.bitsandbytes.int8_vectorwise_quant  # noqa: B018 - the op must be registered
    except Exception as e:
        return {"ok": False, "reason": f"bitsandbytes is not importable: {type(e).__name__}: {e}", "version": None,
                "device": None}
    cap = st["capability"]
    ver = getattr(bnb, "__version__", "?")
    return {"ok": True, "reason": f"bitsandbytes {ver}, {st['reason']}", "version": ver,
            "device": f"{st['device']} (sm_{cap[0]}{cap[1]})"}


def colstats_from_scale(weight_scale) -> np.ndarray:
    """bitsandbytes' per-row weight statistic (absmax_w, fp32 [N]) for a checkpoint scale s = absmax_w / 127."""
    return (np.asarray(weight_scale).astype(np.float32).reshape(-1) * np.float32(127.0)).astype(np.float32)


class BitsandbytesBackend(Backend):
    name = "bitsandbytes"
    covers = ("bitsandbytes LLM.int8 CUDA kernels (threshold 0): kInt8VectorQuant + cuBLASLt igemmlt + "
              "kdequant_mm_int32_fp16, W8A8 fp16")
    priority = 50

    def __init__(self, **params: str):
        super().__init__(**params)
        if params:
            raise ValueError(f"bitsandbytes: unknown parameter(s) {sorted(params)}; it takes none")

    # -- 1. availability ------------------------------------------------------------------------
    def availability(self) -> Availability:
        st = bnb_state()
        return Availability(st["ok"], st["reason"], st["version"], st["device"])

    def schemes(self) -> list[str]:
        return ["w8a8"]

    # -- 2. can_implement -----------------------------------------------------------------------
    def can_implement(self, case: Case) -> Support:
        if case.scheme != "w8a8":
            return no(f"scheme {case.scheme} is not implemented by the bitsandbytes backend (LLM.int8 W8A8 only)")
        if case.weight_format != "ct-int-quantized":
            return no(f"W8A8 takes compressed-tensors int-quantized int8 weights, got {case.weight_format}")
        if not case.act_symmetric:
            return no("int8_vectorwise_quant is symmetric (row absmax); asymmetric activations are not supported")
        if case.act_dtype != "float16":
            return no(f"int8_vectorwise_quant takes float16 activations only (ops.py: 'A must be float16'), "
                      f"got {case.act_dtype}")
        if case.output_dtype != "float16":
            return no(f"kdequant_mm_int32_fp16 writes float16 only, asked for {case.output_dtype}")
        if case.K % 4:
            return no(f"int8_linear_matmul falls back to an fp32 torch.matmul when K % 4 != 0 (cuBLASLt int8 "
                      f"needs K a multiple of 4), got K = {case.K}")
        if case.N % 4:
            return no(f"cuBLASLt int8 GEMM (igemmlt) needs N a multiple of 4, got N = {case.N}")
        return yes()

    # -- 3. declared ----------------------------------------------------------------------------
    def declared(self, case: Case) -> Declared:
        if case.scheme != "w8a8":
            raise ValueError(f"bitsandbytes: nothing declared for scheme {case.scheme}")
        return Declared(
            variants={"act_rounding": "rne", "reciprocal": "recip_scale", "act_scale_dtype": "float32",
                      "zero_row": "zero", "qmin": -128, "qmax": 127},
            weight_dtype="exact", act_compute_dtype=None, accumulate="int32", output="float16",
            notes="codes = rni(x * __fdividef(127, amax_fp16)) (approximate quotient); cuBLASLt int8 -> int32; "
                  "y = fp16(fmaf(acc * amax_x * fl32(127 s_w), 6.200012e-05f, bias)); opaque: the scale "
                  "arithmetic is no declared variant",
            arithmetic="opaque", sqnr_floor_db=SQNR_FLOOR_DB)

    # -- 4. prepare -----------------------------------------------------------------------------
    def prepare(self, case: Case, tensors: dict) -> Prepared:
        torch = _import_torch()
        w = torch.as_tensor(np.ascontiguousarray(tensors["weight"], dtype=np.int8))
        cs = torch.as_tensor(colstats_from_scale(tensors["weight_scale"]))
        data = {"weight": w, "col_stats": cs}
        if bnb_state()["ok"]:
            data["weight_dev"] = w.cuda()
            data["col_stats_dev"] = cs.cuda()
        return Prepared(case, data)

    # -- 5. run ---------------------------------------------------------------------------------
    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        torch = _import_torch()
        st = bnb_state()
        if not st["ok"]:
            raise RuntimeError(f"bitsandbytes backend unavailable: {st['reason']}")
        d = prepared.data
        ops = torch.ops.bitsandbytes
        a = torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32)).cuda().to(torch.float16).contiguous()
        bias = inputs.get("bias")
        b = None if bias is None else torch.as_tensor(np.asarray(bias, np.float32)).cuda().to(torch.float16)
        with torch.no_grad(), warnings.catch_warnings():
            # the fp32 torch.matmul fallback of int8_linear_matmul announces itself with a RuntimeWarning
            warnings.simplefilter("error", RuntimeWarning)
            qa, row_stats, outliers = ops.int8_vectorwise_quant.default(a, 0.0)
            if outliers is not None:
                raise RuntimeError("bitsandbytes: int8_vectorwise_quant returned outlier columns with threshold 0")
            acc = ops.int8_linear_matmul.default(qa, d["weight_dev"])
            y = ops.int8_mm_dequant.default(acc, row_stats, d["col_stats_dev"], dtype=torch.float16, bias=b)
            torch.cuda.synchronize()
        return y.to(torch.float32).cpu().numpy()
