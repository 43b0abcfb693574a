"""gemlite (mobiusml/gemlite, Triton low-bit GEMM) as a qconform backend: W4A16 / W8A16 integer weights.

Semantics and results: docs/backends/gemlite.md.

The kernel is gemlite's ``GEMM`` Triton kernel (``gemlite/triton_kernels/gemm_kernels.py``,
``gemm_INT_kernel``), called through ``GemLiteLinearTriton.pack`` + ``forward_functional(..., matmul_type=GEMM)``
(gemlite 0.6.0.post2, ``gemlite/core.py``). Facts used here, from that source:

- weights are unpacked from 32-bit words packed over K (``pack_weights_over_cols_*``) and dequantized
  per K-tile by ``dequantize`` in ``triton_kernels/utils.py`` in the *meta dtype* (the dtype of the
  scales, which we give in the activation dtype). With ``fma_mode=False`` and grouped scales
  (``W_group_mode=3``) each weight is ``(q.to(meta) - z) * s``: ``q - z`` is an exact small integer and
  the product is rounded once to fp16/bf16 -- the canonical ``sub_then_mul`` with
  ``weight_dtype = weight_scale_dtype =`` the activation dtype;
- ``tl.dot(a, b, acc=acc, out_dtype=float32)``: fp16/bf16 products (exact) summed in fp32;
- ``acc.to(output_dtype)`` (RNE) and the bias, if any, added by ``forward_functional`` to the 16-bit
  output in torch (``out += bias``): ``bias_stage=after_output_rounding``;
- one K group per tile: ``BLOCK_SIZE_K = max(min(BLOCK_SIZE_K, group_size), 32)`` (the config pruner),
  so a group size below 32 would share one scale between two groups -- refused;
- a single group (``group_size == K``, also ``group_size=-1``) makes the scales per-channel, and
  ``pack`` then switches to ``channel_scale_mode=1`` (``acc.to(meta) * scale`` after the
  accumulation), an arithmetic no declared variant models -- refused;
- ``fma_mode=True`` (gemlite's default, used by its vLLM plugin) stores the zero as
  ``(-z * s).to(dtype)`` and forms ``fma(q, s, zero)``: a float zero measured from code 0, which is
  not the emulator's ``float_zero`` (measured from the midpoint); ``gemlite:fma_mode=true`` is
  therefore declared ``arithmetic=opaque`` (SQNR floor ``FMA_SQNR_FLOOR_DB``).

By default the adapter pins the GEMM kernel (``gemlite:kernel=gemm``). gemlite's own choice
(``gemlite:kernel=auto``, ``get_matmul_type``: GEMV_REVSPLITK for M <= 4, GEMM_SPLITK for M < 64, GEMM
above) uses split-K kernels whose fp32 partial sums are rounded to the output dtype and added with
atomics (``gemm_splitK_kernels.py``, ``gemv_revsplitK_kernels.py``), in no declared accumulation
order: declared ``arithmetic=opaque`` (SQNR floor ``AUTO_SQNR_FLOOR_DB``).
Parameters: ``gemlite:fma_mode=false|true`` (default false), ``gemlite:kernel=gemm|auto`` (default gemm).
"""

from __future__ import annotations

import importlib

import numpy as np

from .base import Availability, Backend, Case, Declared, Prepared, Support, no, yes
from .cuda import cuda_state, read_int4_codes
from .torch_layout import unpack_fields

__all__ = ["GemliteBackend", "gemlite_state", "read_int_codes", "FMA_SQNR_FLOOR_DB", "AUTO_SQNR_FLOOR_DB", "MIN_GROUP"]

#: the smallest group size whose scales gemlite's GEMM loads one per K tile (BLOCK_SIZE_K >= 32)
MIN_GROUP = 32
#: fma_mode=true (float zero from code 0): fp16/bf16 weights differ from canonical by <= 1 ulp of the
#: product where the zero is inexact; measured on the H100 >= 45.0 dB (bf16) / 62.9 dB (fp16) against the
#: canonical reference on finite inputs (docs/backends/gemlite.md#fma-mode)
FMA_SQNR_FLOOR_DB = 40.0
#: kernel=auto (split-K kernels adding 16-bit partial sums with atomics): the floor of the project's other opaque
#: kernels; measured on the H100 >= 38.5 dB (bf16) / 62.7 dB (fp16) from canonical (docs/backends/gemlite.md)
AUTO_SQNR_FLOOR_DB = 30.0
_ACT_DTYPES = ("float16", "bfloat16")


def _import_torch():
    import torch  # noqa: PLC0415

    return torch


def _import_gemlite():
    return importlib.import_module("gemlite")


def gemlite_state() -> dict:
    """{'ok', 'reason', 'version', 'device'} of this host: CUDA first (gemlite's import needs a GPU)."""
    st = cuda_state()
    if not st["ok"]:
        return {"ok": False, "reason": st["reason"], "version": None, "device": None}
    try:
        gl = _import_gemlite()
    except Exception as e:  # ImportError, or triton / driver trouble at import
        return {"ok": False, "reason": f"gemlite is not importable: {type(e).__name__}: {e}", "version": None,
                "device": None}
    cap = st["capability"]
    ver = getattr(gl, "__version__", "?")
    import triton  # noqa: PLC0415 - gemlite imported it already

    return {"ok": True, "reason": f"gemlite {ver}, triton {triton.__version__}, {st['reason']}", "version": ver,
            "device": f"{st['device']} (sm_{cap[0]}{cap[1]})"}


def read_int_codes(case: Case, tensors: dict):
    """Canonical (q [N, K] unsigned codes, z [K/G, N] zero points, s [K/G, N] float32) in torch (CPU).

    4-bit: ``backends.cuda.read_int4_codes`` (GPTQ v1/v2, AWQ, compressed-tensors). 8-bit GPTQ:
    the same reading with ``bits`` wide fields (v1 ``z = field + 1``, v2 ``z = field``).
    """
    if case.bits == 4:
        return read_int4_codes(case, tensors)
    torch = _import_torch()
    if case.weight_format != "gptq":
        raise ValueError(f"gemlite: {case.bits}-bit codes are read for GPTQ only, got {case.weight_format}")
    b = case.bits
    q = unpack_fields(tensors["qweight"], b, 0).to(torch.int64).T.contiguous()
    fields = unpack_fields(tensors["qzeros"], b, 1).to(torch.int64)
    z = fields if case.zero_convention == "v2" else fields + 1
    s = torch.as_tensor(np.asarray(tensors["scales"]).astype(np.float32))
    return q, z, s


class GemliteBackend(Backend):
    name = "gemlite"
    covers = ("gemlite (mobiusml) Triton GEMM kernel gemm_INT_kernel: W4A16/W8A16 grouped integer weights, "
              "fp16/bf16 activations")
    priority = 60

    def __init__(self, **params: str):
        super().__init__(**params)
        unknown = set(params) - {"fma_mode", "kernel"}
        if unknown:
            raise ValueError(f"gemlite: unknown parameter(s) {sorted(unknown)}; known: fma_mode, kernel")
        self.kernel = params.get("kernel", "gemm").lower()
        if self.kernel not in ("gemm", "auto"):
            raise ValueError(f"gemlite: kernel must be gemm or auto, got {params.get('kernel')!r}")
        fm = params.get("fma_mode", "false").lower()
        if fm not in ("true", "false"):
            raise ValueError(f"gemlite: fma_mode must be true or false, got {params.get('fma_mode')!r}")
        self.fma_mode = fm == "true"

    # -- 1. availability ------------------------------------------------------------------------
    def availability(self) -> Availability:
        st = gemlite_state()
        return Availability(st["ok"], st["reason"], st["version"], st["device"])

    def schemes(self) -> list[str]:
        return ["w4a16", "w8a16"]

    # -- 2. can_implement -----------------------------------------------------------------------
    def can_implement(self, case: Case) -> Support:
        if case.scheme not in ("w4a16", "w8a16"):
            return no(f"scheme {case.scheme} is not implemented by the gemlite backend (integer weights x "
                      f"fp16/bf16 activations only)")
        fmt = case.weight_format
        if fmt not in ("gptq", "awq", "ct-pack-quantized"):
            return no(f"gemlite backend reads GPTQ, AWQ and compressed-tensors pack-quantized codes, got {fmt}")
        if case.bits == 4:
            pass
        elif fmt == "gptq" and case.bits == 8:
            pass
        else:
            return no(f"{case.bits}-bit {fmt} codes are not read by the gemlite backend (4-bit any format; "
                      f"8-bit GPTQ)")
        if case.act_order:
            return no("act order (g_idx) is not supported: gemlite's GEMM reads contiguous K groups")
        if case.act_dtype not in _ACT_DTYPES:
            return no(f"gemlite's fp32 path multiplies in tl.dot's default TF32 precision (not declared here); "
                      f"activations must be float16 or bfloat16, got {case.act_dtype}")
        if case.output_dtype != case.act_dtype:
            return no(f"gemlite writes the activation dtype ({case.act_dtype}), asked for {case.output_dtype}")
        g = case.group
        if case.K % 32:
            return no(f"GemLiteLinearTriton needs in_features divisible by 32, got K = {case.K}")
        if case.K % g:
            return no(f"K = {case.K} is not a multiple of the group size {g}")
        if g < MIN_GROUP:
            return no(f"group size {g} < {MIN_GROUP}: gemlite's GEMM tiles K by at least 32 and loads one scale per "
                      f"tile (kernel_config_pruner: BLOCK_SIZE_K = max(min(BLOCK_SIZE_K, group_size), 32))")
        if case.K // g < 2:
            return no("one group per row (group_size = K): gemlite packs per-channel scales with "
                      "channel_scale_mode=1, scaling the rounded accumulator after the GEMM (not a declared "
                      "variant)")
        return yes()

    # -- 3. declared ----------------------------------------------------------------------------
    def declared(self, case: Case) -> Declared:
        if case.scheme not in ("w4a16", "w8a16"):
            raise ValueError(f"gemlite: nothing declared for scheme {case.scheme}")
        dt = case.act_dtype
        variants = {"weight_scale_dtype": dt, "dequant_order": "sub_then_mul"}
        weight = f"w = {dt}((q - z) * {dt}(s)) (W_group_mode=3)"
        if self.fma_mode:
            weight = (f"w = fma_{dt}(q, {dt}(s), {dt}(-z * s)) (W_group_mode=4: a float zero from code 0, "
                      f"no declared variant)")
        if self.kernel == "gemm":
            gemm = f"GEMM kernel: tl.dot {dt} x {dt} -> fp32 accumulator; output RNE to {dt}"
        else:
            # split-K / GEMV kernels: fp32 partial sums rounded to the output dtype and added with atomics, in an
            # order the launch decides; no declared accumulation models it (accumulate=<16-bit> has an infinite
            # bound once (K + 1) u >= 1, e.g. K >= 255 in bf16), so it is judged by SQNR
            gemm = (f"gemlite's own kernel choice (GEMV_REVSPLITK / GEMM_SPLITK / GEMM by M): fp32 partial sums "
                    f"rounded to {dt} and added by atomics")
        notes = f"gemlite: {weight}; {gemm}"
        if case.bias:
            variants["bias_stage"] = "after_output_rounding"
            notes += "; bias added to the 16-bit output by forward_functional (out += bias)"
        if self.fma_mode or self.kernel == "auto":
            floor = AUTO_SQNR_FLOOR_DB if self.kernel == "auto" else FMA_SQNR_FLOOR_DB
            return Declared(variants=variants, weight_dtype=dt, accumulate="float32", output=dt, notes=notes,
                            arithmetic="opaque", sqnr_floor_db=floor)
        return Declared(variants=variants, weight_dtype=dt, accumulate="float32", output=dt, notes=notes)

    # -- 4. prepare -----------------------------------------------------------------------------
    def prepare(self, case: Case, tensors: dict) -> Prepared:
        torch = _import_torch()
        q, z, s = read_int_codes(case, tensors)
        data = {"q": q, "z": z, "s": s}
        if gemlite_state()["ok"]:
            gl = _import_gemlite()
            tdt = getattr(torch, case.act_dtype)
            gdt = gl.DType.FP16 if case.act_dtype == "float16" else gl.DType.BF16
            lin = gl.GemLiteLinearTriton(W_nbits=case.bits, group_size=case.group, in_features=case.K,
                                         out_features=case.N, input_dtype=gdt, output_dtype=gdt,
                                         scaled_activations=False)
            dev = torch.device("cuda")
            # scales and zeros [N, K/G] in the activation dtype, as gemlite's A16Wn helper passes them
            s_n = s.T.contiguous().to(tdt).to(dev)
            z_n = z.T.contiguous().to(torch.float32).to(tdt).to(dev)  # small integers: exact in fp16/bf16
            lin.pack(q.to(torch.uint8).to(dev), s_n, z_n, bias=None, fma_mode=self.fma_mode)
            data["linear"] = lin
        return Prepared(case, data)

    # -- 5. run ---------------------------------------------------------------------------------
    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        torch = _import_torch()
        st = gemlite_state()
        if not st["ok"]:
            raise RuntimeError(f"gemlite backend unavailable: {st['reason']}")
        case = prepared.case
        lin = prepared.data["linear"]
        gl = _import_gemlite()
        tdt = getattr(torch, case.act_dtype)
        a = torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32)).cuda().to(tdt).contiguous()
        bias = inputs.get("bias")
        b = None if bias is None else torch.as_tensor(np.asarray(bias, np.float32)).cuda().to(tdt)
        with torch.no_grad():
            # gemlite's own entry point (what GemLiteLinearTriton.forward_manual / forward call), with the bias it
            # adds to the 16-bit output (out += bias); kernel=gemm pins the GEMM kernel, auto (-1) lets gemlite pick
            kind = gl.core.GEMLITE_MATMUL_TYPES_MAPPING["GEMM"] if self.kernel == "gemm" else -1
            y = gl.forward_functional(a, b, lin.get_tensor_args(), lin.get_meta_args(), kind)
            torch.cuda.synchronize()
        return y.to(torch.float32).cpu().numpy()
