"""Intel XPU kernels of vllm-xpu-kernels (and ARK's XPU library) as a qconform backend.

Covers, with vLLM's host-side weight transforms reproduced in torch (docs/backends/xpu.md):

- ``w4a16`` (lib=vllm-xpu-kernels): ``torch.ops._xpu_C.int4_gemm_w4a16`` (oneDNN int4
  matmul, ``csrc/xpu/onednn/int4_gemm_w4a16.h``: weights u4 with per-group scales and u4
  zero points, ``fpmath_mode`` bf16/f16 with ``apply_to_int``), fed as vLLM feeds it:
  GPTQ through ``XPUInt4Config``/``XPUGPTQLinearMethod`` + ``vllm_xpu_kernels.quantization.
  _quantize_convert.transpose_onednn_woq_format`` (qweight [K/8, N] made column-major:
  ``transpose(0, 1).contiguous().transpose(0, 1)``; sym: zero point int32 ``[8]``;
  asym: ``qzeros + 0x11111111`` -- the v1 packed add, which carries a field 0xF into its
  neighbour); AWQ through ``XPUAWQLinearMethod`` (``AWQUtils.repack`` to GPTQ row packing
  with the ``[0, 4, 1, 5, 2, 6, 3, 7]`` un-interleave, literal zeros); compressed-tensors
  through ``kernels/linear/mixed_precision/xpu.py::XPUwNa16LinearKernel``
  (``weight_packed.t()``, scales ``.t().contiguous()``, zero point ``.t().contiguous()``
  or ``tensor([8], int8)``).
- ``w4a4-mxfp4`` (vLLM PR #38896, ``kernels/linear/mxfp4/xpu.py::XPUMxFp4LinearKernel``):
  weight ``[N, K/2]`` u8 viewed as ``float4_e2m1fn_x2`` and stored ``.t()`` (a non-contiguous
  [K/2, N] view), e8m0 scale ``.t().contiguous()`` -> [K/32, N]; activations by
  ``torch.ops._C.per_token_group_quant_mxfp4(x, x_q, x_s, 32, eps=1e-10)``
  (``_xpu_ops._xpu_mxfp4_quantize_impl``; kernel ``csrc/quantization/fp4/mxfp4_quant.h``),
  then ``torch.ops._xpu_C.fp4_gemm`` (oneDNN ``fp4_gemm_w4a4.h``, e8m0 src scales 1x32,
  wei scales 32x1, dst bf16/f16 only).
- ``w4a16-moe`` (vLLM PR #41426, ``fused_moe/oracle/int_wna16.py::_process_weights_xpu``,
  ``fused_moe/experts/xpu_moe.py::XPUExpertsWNA16``): GPTQ w13 ``[E, K/8, 2I]`` int32 ->
  ``transpose(1, 2).contiguous().view(uint8)`` = ``[E, 2I, K/2]`` (little-endian: low nibble
  = lower K index), scales ``[E, K/G, 2I]`` -> ``[E, 2I, K/G]``; w2 likewise; no zero points
  (the kernel turns uint4b8 into s4). Runs ``vllm_xpu_kernels.fused_moe_interface``
  (``XpuFusedMoe`` / ``xpu_fused_moe(is_int4=True)``).
- ``w4a16`` with ``xpu:lib=ark``: auto-round's ARK XPU library as vLLM PR #39778
  (``inc/schemes/inc_wna16_linear.py::INCARKLinearMethod``) drives it through
  ``auto_round_kernel.qlinear.QuantLinear.post_init``: int weight ``[K, N]`` minus 8 as int8,
  fp16 scales, ``repack_quantized_weight(..., cdt="int8", wdt="int4", sdt="fp16")``, then
  ``woqgemm`` -- i.e. activations are quantized to int8 inside ARK (cdt=int8), which no
  a16 declaration can express; symmetric only (asym raises NotImplementedError on XPU).

Nothing here can run without an XPU: ``availability`` says why. The kernel calls are
the ``call_*`` functions, checked without an XPU against the op schemas of the pinned
vllm-xpu-kernels wheel (tests/backends/test_xpu_wheel.py). The host-side
transforms are plain torch and are tested on any host by decoding the transformed
tensors with the kernels' documented layouts (``decode_*`` below, NumPy).
``xpu_mxfp4_quant_model`` is a NumPy transcription of the activation quantizer's source,
used to check the declared emulator variant (``XPU_MX_VARIANT``) against what the source
computes: equal bit for bit (codes and scale bytes) except in the corners listed in
docs/backends/xpu.md.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import numpy as np

from .base import Availability, Backend, Case, Declared, Prepared, Support, no, yes
from .torch_layout import AWQ_REVERSE_ORDER, pack_fields, torch_dtype, unpack_fields

__all__ = [
    "XpuBackend",
    "XPU_MX_VARIANT",
    "xpu_state",
    "prepare_w4a16_host",
    "prepare_mxfp4_host",
    "prepare_moe_host",
    "prepare_ark_host",
    "decode_onednn_u4_weight",
    "decode_onednn_u4_zero_points",
    "decode_fp4_weight",
    "decode_moe_u4",
    "xpu_mxfp4_quant_model",
    "call_int4_gemm_w4a16",
    "call_mxfp4_linear",
    "call_fused_moe",
    "call_ark_repack",
    "call_ark_woqgemm",
]

#: The XPU MXFP4 activation quantizer (mxfp4_quant.h) in emulator variant names:
#: scale 2**ceil(log2(amax/6)) (RCEIL); elements counted against thresholds with '>' (ties
#: toward zero: RHTZ); NaN elements: the clamp fmax(-6, fmin(NaN, 6)) returns +6 before the
#: sign test, so every NaN, +NaN or -NaN, becomes +6 (SATURATE_POSITIVE); the sign bit is
#: (v < 0), so -0 gives code 0 (element zero sign POSITIVE); amax starts at eps = 1e-10 and the
#: descale amax/6 is floored at eps, so every block's scale is at least 2**-33 (byte 94:
#: EPS_1E10_FLOOR, not only all-zero blocks); sycl max / fmax skip NaN in the amax reduction
#: (Inf still gives an Inf scale -> e8m0 0xFF).
XPU_MX_VARIANT = {"mx_scale_rule": "rceil", "e2m1_rounding": "rhtz", "e2m1_nan": "saturate_positive",
                  "e2m1_zero_sign": "positive", "mx_zero_block": "eps_1e10_floor", "mx_nan_block": "ignore"}
MX_EPS = 1e-10
LIBS = ("vllm-xpu-kernels", "ark")
#: ARK on XPU computes with int8 activations (cdt=int8): held to the floor ARK's CPU int8 cores are held
#: to (backends/ark.py INT8_CORE_SQNR_FLOOR_DB, docs/backends/ark.md#int8-cores)
ARK_INT8_SQNR_FLOOR_DB = 30.0
_16BIT = ("bfloat16", "float16")


def _import_torch():
    import torch  # noqa: PLC0415

    return torch


def _import(name: str):
    return importlib.import_module(name)


def _dist_version(name: str) -> str | None:
    try:
        from importlib import metadata  # noqa: PLC0415

        return metadata.version(name)
    except Exception:
        return None


def _installed(name: str) -> bool:
    """Whether package ``name`` is installed (found, not imported: a found package whose extension fails to
    load is 'failed to load', not 'not installed')."""
    return importlib.util.find_spec(name) is not None


def xpu_state(lib: str = "vllm-xpu-kernels") -> tuple[bool, str, str | None]:
    """(available, reason, library version) for ``lib`` on this host."""
    try:
        torch = _import_torch()
    except Exception as e:
        return False, f"torch is not importable: {type(e).__name__}: {e}", None
    xpu = getattr(torch, "xpu", None)
    try:
        has_xpu = bool(xpu is not None and xpu.is_available())
    except Exception as e:  # pragma: no cover - broken runtime
        return False, f"no XPU device: torch.xpu.is_available() raised {type(e).__name__}: {e}", None
    if not has_xpu:
        return False, "no XPU device: torch.xpu.is_available() is False", None
    if lib == "vllm-xpu-kernels":
        if not _installed("vllm_xpu_kernels"):
            return False, "vllm_xpu_kernels not installed: no module named 'vllm_xpu_kernels'", None
        try:
            for mod in ("vllm_xpu_kernels._C", "vllm_xpu_kernels._xpu_C", "vllm_xpu_kernels._moe_C"):
                _import(mod)
        except Exception as e:  # installed, but an extension does not load (torch / oneAPI mismatch)
            return False, f"vllm_xpu_kernels failed to load: {type(e).__name__}: {e}", None
        ver = _dist_version("vllm-xpu-kernels")
        return True, f"vllm-xpu-kernels {ver} on {torch.xpu.get_device_name(0)}", ver
    if not _installed("auto_round_kernel"):
        return False, "auto_round_kernel not installed: no module named 'auto_round_kernel'", None
    try:
        ark = _import("auto_round_kernel")
    except Exception as e:
        return False, f"auto_round_kernel failed to load: {type(e).__name__}: {e}", None
    ver = _dist_version("auto-round-lib")
    if getattr(ark, "xpu_lib", None) is None:
        return False, "auto_round_kernel has no XPU library loaded (auto_round_kernel.xpu_lib is None)", ver
    return True, f"auto-round-lib {ver} (ARK XPU) on {torch.xpu.get_device_name(0)}", ver


# -- host-side transforms (plain torch, CPU) ----------------------------------------------------------
def _t(a, dtype=None):
    torch = _import_torch()
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if dtype is None else t.to(dtype)


def _scales(a, act_dtype: str):
    """Checkpoint scales as vLLM holds them: a parameter of the model dtype (params_dtype)."""
    return _t(np.asarray(a).astype(np.float32)).to(torch_dtype(act_dtype))


def _v1_packed_add(qzeros: np.ndarray):
    """``qzeros + 0x11111111`` on int32 words, modulo 2**32 (transpose_onednn_woq_format)."""
    words = np.ascontiguousarray(qzeros, dtype=np.int32).view(np.uint32) + np.uint32(0x11111111)
    return _t(words.view(np.int32))


def prepare_w4a16_host(case: Case, tensors: dict) -> dict:
    """int4_gemm_w4a16 operands as vLLM builds them: qweight [K/8, N] int32 (column-major),
    scales [K/G, N] (model dtype), zero points (int8 [1] = 8, or int32 [K/G, N/8] u4 fields)."""
    torch = _import_torch()
    fmt = case.weight_format
    sym = case.sym and fmt != "awq"
    if fmt == "gptq":
        qweight = _t(np.asarray(tensors["qweight"], np.int32))
        qweight = qweight.transpose(0, 1).contiguous().transpose(0, 1)  # transpose_onednn_woq_format
        scales = _scales(tensors["scales"], case.act_dtype).contiguous()
        # sym: transpose_onednn_woq_format copies int8 [8] into the int32 qzeros parameter (as_strided_ to
        # shape [1]), so int4_gemm_w4a16 receives an int32 [1] = 8 (the CT path's placeholder is int8)
        zp = torch.tensor([8], dtype=torch.int32) if sym else _v1_packed_add(tensors["qzeros"])
        return {"qweight": qweight, "scales": scales, "zero_points": zp, "group_size": case.group_size,
                "path": "XPUGPTQLinearMethod"}
    if fmt == "awq":
        # AWQUtils.repack: unpack columns, undo the AWQ interleave, repack weights along K (rows)
        # and zeros along N (columns, sequential); then transpose_onednn_woq_format(method="awq").
        q = unpack_fields(tensors["qweight"], 4, 1, AWQ_REVERSE_ORDER)  # [K, N]
        z = unpack_fields(tensors["qzeros"], 4, 1, AWQ_REVERSE_ORDER)  # [K/G, N]
        qweight = pack_fields(q, 4, 0).transpose(0, 1).contiguous().transpose(0, 1)
        zp = pack_fields(z, 4, 1)
        scales = _scales(tensors["scales"], case.act_dtype).contiguous()
        return {"qweight": qweight, "scales": scales, "zero_points": zp, "group_size": case.group_size,
                "path": "XPUAWQLinearMethod"}
    if fmt == "ct-pack-quantized":
        wp = _t(np.asarray(tensors["weight_packed"], np.int32))  # [N, K/8]
        scales = _scales(tensors["weight_scale"], case.act_dtype).t().contiguous()
        if tensors.get("weight_zero_point") is not None:
            zp = _t(np.asarray(tensors["weight_zero_point"], np.int32)).t().contiguous()
        else:
            zp = torch.tensor([8], dtype=torch.int8)
        return {"qweight": wp.t(), "scales": scales, "zero_points": zp, "group_size": case.group_size,
                "path": "XPUwNa16LinearKernel"}
    raise ValueError(f"xpu: no w4a16 transform for {fmt}")


def prepare_mxfp4_host(case: Case, tensors: dict) -> dict:
    """XPUMxFp4LinearKernel.process_weights_after_loading: fp4 weight view [K/2, N], e8m0 scale [K/32, N]."""
    torch = _import_torch()
    w = _t(np.asarray(tensors["weight_packed"], np.uint8)).view(torch.float4_e2m1fn_x2).t()
    s = _t(np.asarray(tensors["weight_scale"], np.uint8)).view(torch.float8_e8m0fnu).t().contiguous()
    return {"weight": w, "weight_scale": s}


def prepare_moe_host(case: Case, tensors: dict) -> dict:
    """_process_weights_xpu: w13 [E, 2I, K/2] u8, w2 [E, K, I/2] u8, scales transposed to [E, out, in/G]."""
    if sys.byteorder != "little":  # pragma: no cover - as vLLM
        raise NotImplementedError("the GPTQ int32 -> uint8 nibble repack relies on little-endian byte order")
    torch = _import_torch()
    out = {}
    for w in ("w13", "w2"):
        qw = _t(np.asarray(tensors[f"{w}_qweight"], np.int32))
        out[w] = qw.transpose(1, 2).contiguous().view(torch.uint8)
        out[f"{w}_scales"] = _scales(tensors[f"{w}_scales"], case.act_dtype).transpose(1, 2).contiguous()
    return out


def prepare_ark_host(case: Case, tensors: dict) -> dict:
    """auto_round_kernel QuantLinear.post_init before the opaque repack (XPU, symmetric GPTQ):
    intweight [K, N] int8 = q - 8, scales fp16 [K/G, N], no zero points."""
    torch = _import_torch()
    q = unpack_fields(tensors["qweight"], 4, 0)  # [K, N]
    intweight = (q - 8).to(torch.int8).contiguous()
    scales = _t(np.asarray(tensors["scales"]).astype(np.float32)).to(torch.float16).contiguous()
    return {"intweight": intweight, "scales": scales, "zeros": torch.empty(0, dtype=torch.int8),
            "group_size": case.group, "cdt": "int8", "wdt": "int4", "sdt": "fp16"}


# -- the kernels' layouts, read back in NumPy (what the tests decode with) ---------------------
def _raw_bytes(t) -> np.ndarray:
    """The bytes of ``t``'s storage from its storage offset on (CPU tensor)."""
    torch = _import_torch()
    flat = t.as_strided((t.untyped_storage().nbytes() // t.element_size() - t.storage_offset(),), (1,),
                        t.storage_offset())
    return flat.view(torch.uint8).numpy().copy()


def _nibbles(raw: np.ndarray) -> np.ndarray:
    """u4 element i = low nibble of byte i//2 for even i, high nibble for odd i (little-endian u4)."""
    out = np.empty(raw.size * 2, dtype=np.uint8)
    out[0::2] = raw & 0xF
    out[1::2] = raw >> 4
    return out


def decode_onednn_u4_weight(qweight, K: int, N: int) -> np.ndarray:
    """int4_gemm_w4a16's reading of B: u4 {K, N}; 'nt' iff stride(-2) == 1, ldb as the .h computes it.
    Returns q [K, N]."""
    st = qweight.stride()
    nt = st[-2] == 1
    ldb = st[-2] * 8 if st[-1] == 1 else st[-1] * 8
    u4 = _nibbles(_raw_bytes(qweight))
    k = np.arange(K)[:, None]
    n = np.arange(N)[None, :]
    idx = k + n * ldb if nt else k * ldb + n
    return u4[idx]


def decode_onednn_u4_zero_points(zp, n_groups: int, N: int) -> np.ndarray:
    """zero points: int8 [1] broadcast (symmetric) or u4 {K/G, N} with strides {N, 1}."""
    if zp.dim() == 1 and zp.numel() == 1:
        return np.full((n_groups, N), int(zp.item()), dtype=np.int64)
    u4 = _nibbles(_raw_bytes(zp.contiguous()))
    return u4[: n_groups * N].reshape(n_groups, N).astype(np.int64)


def decode_fp4_weight(w, K: int, N: int) -> np.ndarray:
    """fp4_gemm's reading of the [K/2, N] float4_e2m1fn_x2 weight: f4 {K, N}, 'nt' iff stride(-2) == 1,
    ldb = 2 * stride(-1); element 2i in the low nibble. Returns codes [N, K]."""
    st = w.stride()
    nt = st[-2] == 1
    ldb = st[-2] if st[-1] == 1 else 2 * st[-1]
    u4 = _nibbles(_raw_bytes(w))
    k = np.arange(K)[None, :]
    n = np.arange(N)[:, None]
    return u4[k + n * ldb] if nt else u4[k * ldb + n]


def decode_moe_u4(w) -> np.ndarray:
    """xpu_fused_moe(is_int4=True) reading of [E, N_out, K_in/2] uint8: contiguous u4 along K, low nibble first."""
    E, n_out, half = w.shape
    return _nibbles(_raw_bytes(w.contiguous()))[: E * n_out * half * 2].reshape(E, n_out, half * 2)


# -- the XPU MXFP4 activation quantizer, transcribed from mxfp4_quant.h ----------------------------
def xpu_mxfp4_quant_model(x) -> tuple[np.ndarray, np.ndarray]:
    """per_token_group_quant_mxfp4 step by step in float32 -> (codes [M, K] uint8, e8m0 bytes [M, K/32]).

    local_absmax = eps; max over |x| (sycl max/fmax: NaN skipped); y_s = absmax / 6;
    y_s = exp2(ceil(log2(fmax(|y_s|, eps)))) (log2 taken correctly rounded to fp32);
    inv = 1 / y_s; v = clamp(x * inv) with fmax(-6, fmin(v, 6)) (fmin/fmax return the non-NaN
    operand); code = #{thresholds t in (0.25, .75, 1.25, 1.75, 2.5, 3.5, 5) : |v| > t} | (v < 0) << 3.
    The float32 scale becomes e8m0 by torch's .to(float8_e8m0fnu) (exact for powers of two, Inf -> 0xFF).
    """
    x32 = np.asarray(x, dtype=np.float32)
    M, K = x32.shape
    xb = x32.reshape(M, K // 32, 32)
    eps = np.float32(MX_EPS)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        absmax = np.fmax.reduce(np.abs(xb), axis=-1)
        absmax = np.fmax(absmax, eps)
        y = (absmax / np.float32(6.0)).astype(np.float32)
        y = np.fmax(np.abs(y), eps)
        lg = np.log2(y.astype(np.float64)).astype(np.float32)
        y_s = np.exp2(np.ceil(lg).astype(np.float64)).astype(np.float32)
        inv = (np.float32(1.0) / y_s).astype(np.float32)
        v = (xb * inv[..., None]).astype(np.float32)
        v = np.fmax(np.float32(-6.0), np.fmin(v, np.float32(6.0)))
        th = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32)
        code = (np.abs(v)[..., None] > th).sum(axis=-1).astype(np.uint8)
        code |= ((v < 0).astype(np.uint8) << 3)
        bits = y_s.view(np.uint32)
        byte = ((bits >> 23) & 0xFF).astype(np.uint8)
        byte = np.where(np.isfinite(y_s), byte, np.uint8(0xFF)).astype(np.uint8)
    return code.reshape(M, K), byte


class XpuBackend(Backend):
    name = "xpu"
    covers = ("vllm-xpu-kernels on Intel XPU: _xpu_C.int4_gemm_w4a16 (GPTQ/AWQ/CT W4A16), _xpu_C.fp4_gemm + "
              "_C.per_token_group_quant_mxfp4 (CT MXFP4 W4A4, vLLM PR #38896), fused_moe_interface int4 MoE "
              "(vLLM PR #41426); lib=ark: auto-round ARK XPU woqgemm (vLLM PR #39778)")
    priority = 60

    def __init__(self, **params: str):
        super().__init__(**params)
        unknown = set(params) - {"lib"}
        if unknown:
            raise ValueError(f"xpu: unknown parameter(s) {sorted(unknown)}; known: lib")
        self.lib = params.get("lib", "vllm-xpu-kernels")
        if self.lib not in LIBS:
            raise ValueError(f"xpu: lib must be one of {', '.join(LIBS)}, got {self.lib!r}")

    def availability(self) -> Availability:
        ok, reason, ver = xpu_state(self.lib)
        return Availability(ok, reason, ver, "xpu" if ok else None)

    def schemes(self) -> list[str]:
        return ["w4a16"] if self.lib == "ark" else ["w4a16", "w4a4-mxfp4", "w4a16-moe"]

    # -- can_implement ----------------------------------------------------------------------------
    def can_implement(self, case: Case) -> Support:
        if self.lib == "ark":
            return self._can_ark(case)
        s = case.scheme
        if s == "w4a16":
            return self._can_w4a16(case)
        if s == "w4a4-mxfp4":
            return self._can_mxfp4(case)
        if s == "w4a16-moe":
            return self._can_moe(case)
        if s == "w4a16-mxfp4":
            return no("vLLM has no XPU MXFP4 W4A16 linear kernel: XPUMxFp4LinearKernel is W4A4 "
                      "(dynamic MXFP4 activations)")
        if s in ("w8a8", "w4a8", "w8a16"):
            return no(f"{s} is not covered by this adapter (vllm-xpu-kernels' int8/w4a8 oneDNN GEMMs are not "
                      "adapted)")
        return no(f"scheme {s} is not implemented by the xpu backend")

    @staticmethod
    def _common_16bit(case: Case, what: str) -> Support | None:
        if case.act_dtype not in _16BIT:
            return no(f"{what} takes bfloat16/float16 activations only, got {case.act_dtype}")
        if case.output_dtype != case.act_dtype:
            return no(f"{what} writes the activation dtype ({case.act_dtype}), asked for {case.output_dtype}")
        return None

    def _can_w4a16(self, case: Case) -> Support:
        if case.weight_format not in ("gptq", "awq", "ct-pack-quantized"):
            return no(f"int4_gemm_w4a16 needs int4 codes; weight format {case.weight_format} has none")
        if case.bits != 4:
            return no(f"int4_gemm_w4a16 is int4 only, got bits={case.bits}")
        bad = self._common_16bit(case, "int4_gemm_w4a16 (XPUwNa16: BF16/FP16 activations)")
        if bad is not None:
            return bad
        if case.act_order:
            return no("act order: XPUGPTQLinearMethod shuffles qweight by g_idx but calls int4_gemm_w4a16 with "
                      "g_idx=None, and XPUwNa16LinearKernel passes the raw group map where the kernel's "
                      "index_select wants a permutation; not adapted")
        if case.weight_format == "gptq" and not case.sym and case.zero_convention == "v2":
            return no("gptq_v2 asymmetric: vLLM's xpu_int4 GPTQ path ignores checkpoint_format and adds "
                      "0x11111111 (the v1 +1) to literal zero points")
        if case.group_size not in (-1, 0) and case.group_size % 32:
            return no(f"XPUwNa16 group sizes are -1 or multiples of 32, got {case.group_size}")
        if case.K % 32:
            return no(f"XPUwNa16 input size must be a multiple of 32, got K = {case.K}")
        if case.N % 8:
            return no(f"N = {case.N} is not a multiple of 8 (int32-packed u4 zero points / AWQ columns)")
        return yes()

    def _can_mxfp4(self, case: Case) -> Support:
        if case.weight_format != "ct-mxfp4":
            return no(f"XPUMxFp4LinearKernel takes compressed-tensors MXFP4 weights, got {case.weight_format}")
        bad = self._common_16bit(case, "fp4_gemm (output must be float16 or bfloat16)")
        if bad is not None:
            return bad
        if case.K % 32:
            return no(f"K = {case.K} is not a multiple of the MX block 32")
        return yes()

    def _can_moe(self, case: Case) -> Support:
        if case.weight_format != "gptq" or not case.sym:
            return no("XPUExpertsWNA16 takes symmetric GPTQ int4 experts only (kInt4Static / kInt4Static32)")
        bad = self._common_16bit(case, "xpu_fused_moe")
        if bad is not None:
            return bad
        if case.group not in (32, 128):
            return no(f"XPUExpertsWNA16 accepts the kInt4Static / kInt4Static32 keys (group 128 / 32), "
                      f"got group {case.group}")
        if case.act_order:
            return no("XPU MoE takes no g_idx (act order)")
        return yes()

    def _can_ark(self, case: Case) -> Support:
        if case.scheme != "w4a16":
            return no(f"the ARK XPU path (INCARKLinearMethod) is W4A16 only, got {case.scheme}")
        if case.weight_format != "gptq":
            return no("ARK on XPU is driven through auto-round GPTQ-packed checkpoints here; AWQ/CT checkpoints "
                      "carry zero points or another packing")
        if not case.sym:
            return no("ARK QuantLinear.post_init raises NotImplementedError for asymmetric weights on XPU")
        if case.bits != 4 or case.act_order:
            return no("ARK XPU: int4 without act order only")
        if case.act_dtype not in _16BIT:
            return no(f"ARK woqgemm_linear on XPU computes in float16; activations {case.act_dtype} not adapted")
        return yes()

    # -- declared -----------------------------------------------------------------------------------
    def declared(self, case: Case) -> Declared:
        act = case.act_dtype
        if self.lib == "ark":
            return Declared(variants={"zero_read": "ignore_qzeros", "weight_scale_dtype": "float16"},
                            weight_dtype="float16", act_compute_dtype="float16", accumulate="float32",
                            output=case.output_dtype, arithmetic="opaque", sqnr_floor_db=ARK_INT8_SQNR_FLOOR_DB,
                            notes="ARK XPU cdt=int8: activations are quantized to int8 inside ARK (rule not "
                                  "published), not expressible as a16: arithmetic=opaque, judged by SQNR >= "
                                  f"{ARK_INT8_SQNR_FLOOR_DB:g} dB against the canonical reference")
        if case.scheme == "w4a16":
            v = {"weight_scale_dtype": act, "dequant_order": "sub_then_mul"}
            if case.weight_format == "gptq":
                v["zero_read"] = "ignore_qzeros" if case.sym else "v1_packed_add"
            return Declared(variants=v, weight_dtype=act, act_compute_dtype=None, accumulate="float32",
                            output=act, notes="oneDNN int4 matmul, fpmath_mode(%s, apply_to_int): weights "
                            "(u4 - zp) * s rounded to %s, f32 accumulation" % (act, act))
        if case.scheme == "w4a4-mxfp4":
            return Declared(variants=dict(XPU_MX_VARIANT), weight_dtype="exact", act_compute_dtype=None,
                            accumulate="float32", output=act,
                            notes="activation quant: mxfp4_quant.h (RCEIL, ties toward zero, NaN -> +6, -0 -> +0, "
                                  "every block's scale >= 2**-33 from eps 1e-10, NaN skipped by the amax); "
                                  "oneDNN fp4_gemm with e8m0 block scales, f32 accumulation")
        if case.scheme == "w4a16-moe":
            # weight_formation=float32_then_round: what the MoE reference formed for weight_dtype before the axis
            # existed (the exact weights rounded once to act), kept unchanged
            # fused_moe_interface.py: gemm1_output, act_output and gemm2_output have the hidden states' dtype;
            # csrc/moe/moe_gather.cpp sums fp32 topk_weights * gemm2_output in fp32, stores the output dtype
            # weight_scale_dtype: prepare_moe_host hands the kernel the scales in the activation dtype
            return Declared(variants={"moe_renormalize": True, "weight_formation": "float32_then_round",
                                      "weight_scale_dtype": act, "moe_gate_up_dtype": act,
                                      "moe_expert_output_dtype": "activation"},
                            weight_dtype=act, act_compute_dtype=None,
                            accumulate="float32", output=act,
                            notes="grouped GEMMs with int4 (uint4b8 -> s4) weights and %s scales; gate/up "
                                  "(gemm1_output), SiLU*up and expert outputs (gemm2_output) in %s, weighted "
                                  "sum in fp32 (moe_gather); routing softmax/top-k/renormalize in fp32" % (act, act))
        raise ValueError(f"xpu: nothing declared for {case.scheme}")

    # -- prepare -----------------------------------------------------------------------------------
    def prepare(self, case: Case, tensors: dict) -> Prepared:
        if self.lib == "ark":
            data = prepare_ark_host(case, tensors)
        elif case.scheme == "w4a16":
            data = prepare_w4a16_host(case, tensors)
        elif case.scheme == "w4a4-mxfp4":
            data = prepare_mxfp4_host(case, tensors)
        elif case.scheme == "w4a16-moe":
            data = prepare_moe_host(case, tensors)
        else:
            raise ValueError(f"xpu: cannot prepare {case.scheme}")
        ok, _, _ = xpu_state(self.lib)
        if ok:
            data = self._to_device(case, data)
        return Prepared(case, data)

    def _to_device(self, case: Case, data: dict) -> dict:
        torch = _import_torch()
        out = {}
        for k, v in data.items():
            if isinstance(v, torch.Tensor):
                if k in ("qweight",) and case.scheme == "w4a16" and self.lib != "ark":
                    # keep the column-major strides of the host tensor
                    out[k] = v.t().contiguous().to("xpu").t() if v.stride()[-2] == 1 else v.to("xpu")
                elif k == "weight" and case.scheme == "w4a4-mxfp4":
                    out[k] = v.t().contiguous().to("xpu").t()  # [N, K/2] storage, .t() view as vLLM
                else:
                    out[k] = v.to("xpu")
            else:
                out[k] = v
        if self.lib == "ark":
            out["blob"] = call_ark_repack(_import("auto_round_kernel"), out)
        return out

    # -- run -----------------------------------------------------------------------------------
    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        ok, reason, _ = xpu_state(self.lib)
        if not ok:
            raise RuntimeError(f"xpu backend unavailable: {reason}")
        torch = _import_torch()
        case = prepared.case
        d = prepared.data
        act = torch_dtype(case.act_dtype)
        xt = torch.from_numpy(np.ascontiguousarray(x, np.float32)).to("xpu").to(act)
        bias = inputs.get("bias")
        bt = None if bias is None else torch.from_numpy(np.asarray(bias, np.float32)).to("xpu").to(act)
        with torch.no_grad():
            if self.lib == "ark":
                y = call_ark_woqgemm(_import("auto_round_kernel"), xt, d, bt, case.N, case.K)
            elif case.scheme == "w4a16":
                y = call_int4_gemm_w4a16(torch.ops, xt, d, bt)
            elif case.scheme == "w4a4-mxfp4":
                y = call_mxfp4_linear(torch.ops, xt, d, bt, act)
            elif case.scheme == "w4a16-moe":
                y = self._run_moe(case, d, xt, inputs["router_logits"])
            else:
                raise ValueError(f"xpu: cannot run {case.scheme}")
            torch.xpu.synchronize()
        return y.to(torch.float32).cpu().numpy()

    def _run_moe(self, case: Case, d: dict, xt, router_logits):
        torch = _import_torch()
        moe = _import("vllm_xpu_kernels.fused_moe_interface")
        logits = torch.from_numpy(np.asarray(router_logits, np.float32)).to("xpu")
        p = torch.softmax(logits, dim=-1, dtype=torch.float32)
        w, ids = torch.topk(p, case.top_k, dim=-1)
        w = w / w.sum(dim=-1, keepdim=True)
        return call_fused_moe(moe, xt, d, w, ids.to(torch.int32), case.top_k, case.E)


# -- the kernel calls (one place, so tests can bind them to the wheel's registered schemas) ----------
def call_int4_gemm_w4a16(ops, xt, d: dict, bias):
    """``_xpu_C.int4_gemm_w4a16(A, B, bias, B_scale, B_zp, group_size, g_idx)`` as vLLM's apply calls it."""
    return ops._xpu_C.int4_gemm_w4a16(xt, d["qweight"], bias, d["scales"], d["zero_points"], d["group_size"], None)


def call_mxfp4_linear(ops, xt, d: dict, bias, out_dtype):
    """XPUMxFp4LinearKernel.apply: ``_C.per_token_group_quant_mxfp4`` (eps 1e-10), the float32 scales cast to
    e8m0, then ``_xpu_C.fp4_gemm(A, B, A_scale, B_scale, out_dtype, bias)``."""
    torch = _import_torch()
    M, K = xt.shape
    x_q = torch.empty(M, K // 2, device=xt.device, dtype=torch.uint8)
    x_s = torch.empty(M, K // 32, device=xt.device, dtype=torch.float32)
    ops._C.per_token_group_quant_mxfp4(xt, x_q, x_s, 32, MX_EPS)
    x_fp4 = x_q.view(torch.float4_e2m1fn_x2)
    x_s = x_s.to(dtype=torch.float8_e8m0fnu, memory_format=torch.preserve_format)
    return ops._xpu_C.fp4_gemm(x_fp4, d["weight"], x_s, d["weight_scale"], out_dtype, bias)


def call_ark_repack(ark, d: dict):
    """QuantLinear.post_init on XPU: ``repack_quantized_weight(QB, scaleB, zp, groupsize, compute_type,
    weight_type, scale_type, asym)`` (the 8-argument form) with cdt int8, wdt int4, sdt fp16, symmetric."""
    return ark.repack_quantized_weight(d["intweight"], d["scales"], d["zeros"], d["group_size"], d["cdt"], d["wdt"],
                                       d["sdt"], False)


def call_ark_woqgemm(ark, xt, d: dict, bias, n: int, k: int):
    """``woqgemm_linear(A, B, bias, n, k, groupsize, compute_type, weight_type, scale_type, asym)`` on the blob."""
    return ark.woqgemm_linear(xt, d["blob"], bias, n, k, d["group_size"], d["cdt"], d["wdt"], d["sdt"], False)


def call_fused_moe(moe, xt, d: dict, topk_weights, topk_ids, top_k: int, n_experts: int):
    """vllm_xpu_kernels.fused_moe_interface: ``XpuFusedMoe(...).apply(...)`` (0.1.16.x) or, in older
    releases, ``xpu_fused_moe(..., is_int4=True)``; SiLU, no biases. Returns the output [M, K]."""
    out = xt.new_zeros(xt.shape)
    if hasattr(moe, "XpuFusedMoe"):
        impl = moe.XpuFusedMoe(w13=d["w13"], w13_scales=d["w13_scales"], w13_bias=None, w2=d["w2"],
                               w2_scales=d["w2_scales"], w2_bias=None, n_experts_per_token=top_k,
                               activation="silu", num_experts=n_experts)
        impl.apply(output=out, hidden_states=xt, topk_weights=topk_weights, topk_ids=topk_ids)
        return out
    return moe.xpu_fused_moe(hidden_states=xt, w13=d["w13"], w13_scales=d["w13_scales"], w13_bias=None,
                             w2=d["w2"], w2_scales=d["w2_scales"], w2_bias=None, topk_weights=topk_weights,
                             topk_ids=topk_ids, n_experts_per_token=top_k, activation="silu",
                             num_experts=n_experts, is_int4=True)
