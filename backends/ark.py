"""ARK (auto-round-lib, ``import auto_round_kernel``): the CPU weight-only GEMMs vLLM PR #39778 calls.

Covers: vLLM PR #39778 ("[Quantization][Autoround][Toolkit] Add W4A16 Support"),
``vllm/model_executor/layers/quantization/inc/schemes/inc_wna16_linear.py::INCARKLinearMethod``
and ``.../inc/schemes/inc_ark_ops.py`` (custom op ``vllm::inc_ark_woq_linear`` ->
``auto_round_kernel.woqgemm_linear``), with the weight preparation of
``auto_round_kernel/qlinear.py::QuantLinear.post_init`` (intel/auto-round
``auto_round_extension/ark/auto_round_kernel/qlinear.py``); plus the other public ARK
GEMM entry points that run on a CPU: ``woqgemm`` with int8 weights (W8A16) and
``woqgemm_s8`` (int8 weights, dynamic int8 activations; see W8A8 below).

How vLLM prepares a layer (reproduced in torch by ``ark_layout.gptq_layout`` / ``awq_layout``, re-exported here):

1. ``INCXPULinearBase._create_inc_weights``: GPTQ ``qweight [K/8, N]`` (AWQ-packed
   ``auto_round:auto_awq``: ``[K, N/8]``), ``scales [K/G, N]`` in ``params_dtype`` (loading
   casts the checkpoint's scales to the model dtype = the activation dtype),
   ``qzeros [K/G, N/8]``, ``g_idx = k // G`` (the checkpoint's g_idx is never passed to ARK).
2. AWQ-packed qweight is converted losslessly to GPTQ order
   (``_convert_awq_qweight_to_gptq``: unpack, reorder nibbles with [0,4,1,5,2,6,3,7],
   repack along K). **qzeros are copied unconverted.**
3. ``QuantLinear(bits, group_size, sym, ...)`` — the class with ``QUANT_TYPE =
   "ark_gptq_nozp"``, ``ZP_BIAS = 0`` — gets qweight/qzeros/scales/bias copied in, then
   ``post_init()``: unpack qweight along K to ``[K, N]`` and subtract ``qbias = 2**(bits-1)``
   (int8); asym: unpack qzeros along N, add ``ZP_BIAS`` (0: **no GPTQ-v1 +1**) and subtract
   qbias; sym: zeros are not read (ARK's zero point is 8 for every group). On CPU:
   ``sdt = "fp32"`` (scales ``.to(float32)``), ``cdt = "auto"``; then
   ``ark.repack_quantized_weight(intweight, scales, zeros, group_size, cdt, wdt, sdt, asym)``
   returns the opaque bestla blob; bias is kept in float32.
4. ``apply``: ``woqgemm_linear(x, blob, bias, N, K, group_size, "auto", "int4", "fp32", asym)``:
   x converted to float32 (exact for 16-bit inputs), ``woqgemm`` writes float32, and the
   result is ``.to(x.dtype)`` (one RNE rounding).

Parameters (``ark:engine=...,cdt=...,route=...``):

- ``engine=vllm`` (default): the steps above. ``engine=auto-round``: auto-round's own
  HF inference classes — ``QuantLinearGPTQ`` (``ZP_BIAS = 1``, the v1 +1) for v1 GPTQ
  checkpoints and ``QuantLinearAWQ`` (qzeros reordered like qweight) for AWQ.
- ``cdt``: the compute type passed to ARK (``auto`` as vLLM; ``fp32``, ``bf16``, ``fp16``,
  ``int8``).
- ``route=engine`` (default): only what the named engine sends to ARK. vLLM on CPU
  (``vllm/model_executor/layers/quantization/inc/schemes/inc_wna16_scheme.py``,
  ``INCWna16Scheme.get_linear_method``): GPTQ-packed layers with ``bits == 4 and sym`` go to
  ``INCARKLinearMethod``; any other GPTQ config raises ``NotImplementedError("INC on CPU:
  unsupported config ...")``; AWQ-packed layers go to ``INCWNA16LinearScheme`` (AutoAWQ
  methods), not ARK; on XPU only ``bits in {2, 4} and sym`` reach ARK. No engine sends
  compressed-tensors layouts or W8A8 to ARK. auto-round's own classes take GPTQ (sym/asym,
  4/8-bit) and AWQ. ``route=all``: every layout this adapter can build — the latent vLLM glue
  paths (asymmetric v1 GPTQ read without the +1, AWQ zero points left in AWQ order, 8-bit),
  the compressed-tensors transforms and ``woqgemm_s8`` — so those defects stay reproducible
  (docs/backends/ark.md#discrepancies).

What the CPU library computes (``wrapper/include/cpu_wrapper.hpp::BTLAGemmCoreId``): the
bestla GEMM core is chosen from ``cdt`` *and the host*. On a CPU whose vendor is not
GenuineIntel it returns the AVX2 fp32 core for every ``cdt`` (measured: blobs and outputs
identical for auto/fp32/bf16/fp16/int8 on an AMD EPYC). On Intel, ``auto`` (and ``int8``)
falls through "from low precision to high precision": the int8 KBlock cores (AMX-INT8,
AVX512-VNNI, AVX-VNNI) first, which quantize activations per token *per K-block* (uint8
with a zero point on the VNNI cores, ``prologue_a::ActivationKBlockQuantize``), then
AMX-FP16, AMX-BF16, AVX512F/AVX2 fp32. The fp32 cores convert weights to float32 and
accumulate in float32; the int8 cores' per-block activation scales are not expressible by
the emulator's per-token variants, so those hosts/cdts are refused.

W8A8 (``woqgemm_s8``, CPU oneDNN build: ``dnnl_wrapper.hpp::DnnlWrapper::woq_s8``):
dynamic **per-tensor** symmetric int8 activations — one amax over all M rows,
``scale = fl32(amax * fl32(1/127))``, quantized by a oneDNN reorder with a dst scale
(measured: quotient ``x * fl32(1/scale)``, RNE ties, saturating) — then an s8s8 matmul with
per-tensor src and per-channel weight scales. Declared with the emulator's
``act_granularity=per_tensor`` and ``act_scale_formula=recip_mul``, so every M is accepted.

Not available on CPU (``can_implement`` says why): ``igemm_s8s8s32`` (the CPU path
routes int8 through ``CpuWrapper::gemm``, which writes float32 bit patterns into the int32
output: garbage), the MoE GEMMs (``moe_gemm``, ``moe``, ``MoeSymmetricGemm``: XPU only),
MXFP4 (no FP4 weight type in ``woqgemm``; ``mxfp4_hadamard_quant`` is XPU only;
``mxfp4_quant_reference`` is a pure-torch activation quantizer — its rule is in
docs/backends/ark.md). The XPU library loads only when ``torch.xpu.is_available()``.

Semantics and measurements: docs/backends/ark.md.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib

import numpy as np

from .ark_layout import (  # noqa: F401 - re-exported: the layout transforms live in ark_layout.py
    ArkLayout, awq_layout, awq_qweight_to_gptq, ct_int8_layout, ct_pack_layout, gptq_layout, params_scales,
    scales32, unpack_awq, unpack_gptq_qweight, unpack_gptq_qzeros,
)
from .host import cpu_info
from .base import Availability, Backend, Case, Declared, Prepared, Support, no, yes
from .torch_layout import import_torch, to_torch, torch_dtype

__all__ = [
    "ArkBackend",
    "params_scales",
    "ArkLayout",
    "host_cpu",
    "s8_matmul_path",
    "onednn_isa_cap",
    "gemm_core",
    "unpack_gptq_qweight",
    "unpack_gptq_qzeros",
    "awq_qweight_to_gptq",
    "unpack_awq",
    "gptq_layout",
    "awq_layout",
    "ct_pack_layout",
    "ct_int8_layout",
    "ENGINES",
    "CDTS",
    "ROUTES",
]

ENGINES = ("vllm", "auto-round")
CDTS = ("auto", "fp32", "bf16", "fp16", "int8")
ROUTES = ("engine", "all")
#: where vLLM decides which INC (auto-round) layers reach ARK
VLLM_ROUTER = "vllm/model_executor/layers/quantization/inc/schemes/inc_wna16_scheme.py::INCWna16Scheme.get_linear_method"


# -- host: which bestla core would ARK choose -------------------------------------------------
@dataclasses.dataclass(frozen=True)
class HostCpu:
    vendor: str
    flags: frozenset


@functools.lru_cache(maxsize=1)
def host_cpu() -> HostCpu:
    """CPU vendor string and ISA flags (Linux /proc/cpuinfo; empty when unreadable)."""
    info = cpu_info()
    vendor, flags = info["vendor"], frozenset(info["flags"])
    return HostCpu(vendor, flags)


#: the accuracy ARK's int8 cores are held to (arithmetic=opaque): int8 quantization of activations per
#: K-block keeps about 6 dB per bit minus the block's crest factor (~40 dB for Gaussian rows); the floor
#: leaves 10 dB for rows with outliers (docs/backends/ark.md#int8-cores)
INT8_CORE_SQNR_FLOOR_DB = 30.0


def gemm_core(cdt: str, wbits: int, group: int, asym: bool, host: HostCpu | None = None) -> str:
    """The bestla core ``BTLAGemmCoreId(QuantParam*)`` picks (cpu_wrapper.hpp), by name.

    Returns one of: avx2, avx512f (fp32 compute); amx_bf16 (bf16); amx_fp16 (fp16);
    amx_int8, avx512_vnni, avx_vnni (int8 activations, per-K-block quantized).
    """
    h = host or host_cpu()
    if h.vendor != "GenuineIntel":
        return "avx2"  # `if (!_cd->INTEL()) return tAVX2::ID;` whatever the compute type
    f = h.flags
    order = {"auto": ("s8", "f16", "bf16", "f32"), "int8": ("s8", "f16", "bf16", "f32"),
             "fp16": ("f16", "bf16", "f32"), "bf16": ("bf16", "f32"), "fp32": ("f32",)}[cdt]
    can_s8 = not (asym and wbits == 8) and (group % 4 == 0)
    for step in order:
        if step == "s8" and can_s8:
            if "amx_int8" in f and group % 64 == 0:  # tAMX_INT8_SS_KBlock::KTILE
                return "amx_int8"
            if "avx512_vnni" in f:
                return "avx512_vnni"
            if "avx_vnni" in f:
                return "avx_vnni"
        if step == "f16" and "amx_fp16" in f and group % 32 == 0:
            return "amx_fp16"
        if step == "bf16" and "amx_bf16" in f and group % 32 == 0:
            return "amx_bf16"
        if step == "f32":
            return "avx512f" if "avx512f" in f else "avx2"
    return "avx2"


_CORE_COMPUTE = {"avx2": "float32", "avx512f": "float32", "amx_bf16": "bfloat16", "amx_fp16": "float16",
                 "amx_int8": "int8", "avx512_vnni": "int8", "avx_vnni": "int8"}


# -- woqgemm_s8: which oneDNN int8 matmul the library's oneDNN build reaches ----------------------
#: oneDNN's ISA cap (ONEDNN_MAX_CPU_ISA; DNNL_MAX_CPU_ISA is the older name), honoured by ARK's oneDNN
ONEDNN_ISA_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
_ONEDNN_ISA_RANK = {"sse41": 1, "avx": 2, "avx2": 3, "avx2_vnni": 4, "avx2_vnni_2": 5, "avx512_core": 6,
                    "avx512_core_vnni": 7, "avx512_core_bf16": 8, "avx512_core_fp16": 9, "avx10_1_512": 9,
                    "avx512_core_amx": 10, "avx10_1_512_amx": 10, "avx512_core_amx_fp16": 11,
                    "avx10_1_512_amx_fp16": 11}
#: woqgemm_s8 on a host whose oneDNN has no VNNI int8 matmul (AVX2-only, AVX-512 without VNNI, or an ISA cap
#: below it): oneDNN's gemm:jit s8s8 path shifts the activations to u8 (+128, compensated afterwards) and
#: multiplies with vpmaddubsw, whose int16 pair sums saturate. Measured (ONEDNN_MAX_CPU_ISA=AVX2 on a Zen 5,
#: the AVX2-only Zen 3 of issue 22): the accumulator is exactly sum_j sat16((x[2j]+128) w[2j] + (x[2j+1]+128)
#: w[2j+1]) - 128 sum_k w[k] for K <= 256. docs/backends/ark.md#woqgemm_s8-by-isa.
S8_NO_VNNI_SATURATION = ("KNOWN KERNEL DEFECT (docs/backends/ark.md#woqgemm_s8-by-isa): woqgemm_s8 without a VNNI "
                         "int8 matmul (oneDNN gemm:jit, AVX2 / AVX-512 without VNNI) saturates vpmaddubsw's int16 "
                         "pair sums of (x+128)*w: wrong answers (thousands of ulps) for ordinary inputs")
#: woqgemm_s8 on an AMX-INT8 host: the library's oneDNN AMX matmul JIT throws Xbyak "not supported" for all
#: but tiny problems (RuntimeError with one thread, SIGABRT with more). docs/backends/ark.md.
S8_AMX_XBYAK = ("KNOWN KERNEL DEFECT (docs/backends/ark.md#intel-host-with-amx-measured): woqgemm_s8's oneDNN AMX "
                "matmul raises Xbyak 'not supported' (RuntimeError, or SIGABRT from a worker thread)")
#: the oneDNN int8 matmul woqgemm_s8 reaches: path -> the defect it has (None: exact int32 accumulation)
S8_PATH_DEFECT = {"amx": S8_AMX_XBYAK, "avx512_vnni": None, "avx2_vnni": None, "no_vnni": S8_NO_VNNI_SATURATION}


def onednn_isa_cap(environ=None) -> int | None:
    """The rank of oneDNN's ISA cap from the environment (None: no cap, or ALL/DEFAULT/unknown)."""
    import os

    env = os.environ if environ is None else environ
    for key in ONEDNN_ISA_ENV:
        val = env.get(key, "").strip().lower()
        if val:
            return _ONEDNN_ISA_RANK.get(val)
    return None


def s8_matmul_path(host: HostCpu | None = None, environ=None) -> str:
    """The oneDNN int8 matmul ``woqgemm_s8`` reaches on ``host`` under oneDNN's ISA cap: ``amx``,
    ``avx512_vnni``, ``avx2_vnni`` (brgemm with VNNI dot products: exact int32) or ``no_vnni`` (gemm:jit
    with vpmaddubsw: int16 pair saturation). Read from CPU flags, never assumed (tests/backends/test_ark.py
    checks it against ONEDNN_VERBOSE's implementation name)."""
    f = (host or host_cpu()).flags
    cap = onednn_isa_cap(environ)

    def allowed(isa: str) -> bool:
        return cap is None or cap >= _ONEDNN_ISA_RANK[isa]

    avx512_core = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= f
    if avx512_core and {"amx_int8", "amx_tile"} <= f and allowed("avx512_core_amx"):
        return "amx"
    if avx512_core and "avx512_vnni" in f and allowed("avx512_core_vnni"):
        return "avx512_vnni"
    if "avx_vnni" in f and allowed("avx2_vnni"):
        return "avx2_vnni"
    return "no_vnni"


# -- the backend --------------------------------------------------------------------------------
def _import_ark():
    return importlib.import_module("auto_round_kernel")


class ArkBackend(Backend):
    name = "ark"
    covers = ("auto-round-lib ARK CPU woqgemm (vLLM PR #39778 INCARKLinearMethod / inc_ark_ops.py, "
              "auto_round_kernel.qlinear.QuantLinear): by default what vLLM routes to ARK on CPU (4-bit sym GPTQ); "
              "route=all: W4A16/W8A16 int weights of every layout, woqgemm_s8 W8A8 (per-tensor)")
    priority = 50

    def __init__(self, **params: str):
        super().__init__(**params)
        unknown = set(params) - {"engine", "cdt", "route"}
        if unknown:
            raise ValueError(f"ark: unknown parameter(s) {sorted(unknown)}; known: engine, cdt, route")
        self.engine = params.get("engine", "vllm")
        if self.engine not in ENGINES:
            raise ValueError(f"ark: engine must be one of {ENGINES}, got {self.engine!r}")
        self.cdt = params.get("cdt", "auto")
        if self.cdt not in CDTS:
            raise ValueError(f"ark: cdt must be one of {CDTS}, got {self.cdt!r}")
        self.route = params.get("route", "engine")
        if self.route not in ROUTES:
            raise ValueError(f"ark: route must be one of {ROUTES}, got {self.route!r}")

    # -- 1. availability
    def availability(self) -> Availability:
        try:
            ark = _import_ark()
        except Exception as e:  # ImportError, or the library's own import-time failure
            return Availability(False, f"auto_round_kernel (auto-round-lib) cannot be imported: "
                                       f"{type(e).__name__}: {e}")
        version = self._library_version(ark)
        xpu = self._xpu_note(ark)
        if getattr(ark, "cpu_lib", None) is None:
            return Availability(False, f"auto_round_kernel imported but its CPU library did not load "
                                       f"(auto_round_kernel_cpu); {xpu}", version)
        h = host_cpu()
        core = gemm_core(self.cdt, 4, 128, False, h)
        dev = (f"cpu ({h.vendor or 'unknown vendor'}): bestla {core} core for cdt={self.cdt}"
               + (" — non-Intel vendor, cdt ignored" if h.vendor != "GenuineIntel" else ""))
        return Availability(True, f"CPU library loaded; {xpu}", version, dev)

    @staticmethod
    def _library_version(ark) -> str | None:
        try:
            from importlib import metadata

            return metadata.version("auto-round-lib")
        except Exception:
            try:
                return importlib.import_module("auto_round_kernel.version").__version__
            except Exception:
                return getattr(ark, "__version__", None)

    @staticmethod
    def _xpu_note(ark) -> str:
        if getattr(ark, "xpu_lib", None) is not None:
            return "XPU library loaded (not used by this adapter)"
        try:
            import torch

            has_xpu = bool(torch.xpu.is_available())
        except Exception as e:
            return f"XPU library not loaded: torch.xpu unusable ({type(e).__name__}: {e})"
        if not has_xpu:
            return "XPU library not loaded: torch.xpu.is_available() is False (no Intel GPU / no XPU torch build)"
        return "XPU library failed to load although torch.xpu is available"

    # -- 2. can_implement
    def schemes(self) -> list[str]:
        return ["w4a16", "w8a16", "w8a8"]

    def can_implement(self, case: Case) -> Support:
        s, fmt = case.scheme, case.weight_format
        if s == "w4a16-moe":
            return no("ARK's MoE GEMMs (moe_gemm, moe, moe_gemm_decode/prefill, MoeSymmetricGemm.prepare) "
                      "raise NotImplementedError off XPU ('is only supported on XPU'); this adapter drives the CPU "
                      "library only")
        if s in ("w4a16-mxfp4", "w4a4-mxfp4"):
            return no("ARK has no MXFP4 GEMM on CPU: woqgemm weight types are int2..int8 and fp8 only; "
                      "mxfp4_hadamard_quant is XPU-only and mxfp4_quant_reference is a pure-torch "
                      "activation quantizer, not a kernel")
        if s == "w4a8":
            core = gemm_core("int8", 4, case.group, not case.sym)
            if _CORE_COMPUTE[core] != "int8":
                h = host_cpu()
                return no(f"cdt=int8 does not reach an int8 core on this host: BTLAGemmCoreId picks the "
                          f"{core} fp32 core (vendor {h.vendor or '?'}"
                          f"{', not GenuineIntel' if h.vendor != 'GenuineIntel' else ''}), so ARK would run "
                          "W4A16 in fp32, not W4A8")
            return no(f"ARK's int8 core ({core}) quantizes activations per token per K-block "
                      "(ActivationKBlockQuantize: uint8 with a zero point on VNNI cores) — not expressible by "
                      "the emulator's per-token int8 variants")
        if case.out_dtype not in (None, case.act_dtype):
            return no("woqgemm_linear returns the activation dtype (out = result.to(x.dtype)); "
                      f"out_dtype {case.out_dtype} != act_dtype {case.act_dtype}")
        if case.act_order:
            return no("ARK packs K-blocks in order: QuantLinear ignores g_idx and vLLM's INC ARK path never "
                      "passes it (act order / desc_act unsupported)")
        if case.E:
            return no("dense GEMM adapter: E > 0 is a MoE case")
        g = case.group
        if case.K % g:
            return no(f"K={case.K} is not a multiple of group_size {g} (QuantLinear: 'in_features must be "
                      "divisible by group_size')")
        if s == "w8a8":
            if fmt != "ct-int-quantized":
                return no("W8A8 here is woqgemm_s8 with compressed-tensors int-quantized int8 weights only")
            if not case.act_symmetric:
                # found by the property tier (docs/findings.md): run anyway it gives wrong answers (M=1 N=1 K=2)
                return no("woqgemm_s8 quantizes activations symmetrically (DnnlWrapper::dyn_quant_s8): an asymmetric "
                          "(azp) W8A8 checkpoint has no ARK path")
            return self._engine_route(case)
        if s == "w4a16":
            if case.bits != 4:
                return no(f"scheme w4a16 needs 4-bit weights, got bits={case.bits}")
        elif s == "w8a16":
            if case.bits != 8 and fmt != "ct-int-quantized":
                return no(f"scheme w8a16 needs 8-bit weights, got bits={case.bits}")
        else:
            return no(f"scheme {s} is not implemented by ARK on CPU")
        if fmt not in ("gptq", "awq", "ct-pack-quantized", "ct-int-quantized"):
            return no(f"weight format {fmt} has no ARK integer path")
        if fmt == "ct-int-quantized" and s != "w8a16":
            return no("ct-int-quantized int8 weights: scheme w8a16 (woqgemm int8 blob) or w8a8 (woqgemm_s8)")
        if fmt == "awq":
            if case.bits != 4:
                return no("AWQ is 4-bit only")
            if case.sym:
                return no("AWQ checkpoints carry zero points (AutoAWQ GEMM is asymmetric); ARK with sym=True "
                          "ignores qzeros (zero 8) — run AWQ as sym=False")
        routed = self._engine_route(case)
        if not routed:
            return routed
        # an int8 core (cdt=auto on Intel VNNI/AMX hosts, as vLLM runs it) quantizes activations per token per
        # K-block: not expressible, so declared arithmetic=opaque and judged by SQNR (see declared())
        return yes()

    def _engine_route(self, case: Case) -> Support:
        """route=engine: does the named engine send this layer to ARK? (route=all: every buildable layout)."""
        if self.route == "all":
            return yes()
        more = " (ark:route=all runs the layout anyway, as a latent-path demonstration)"
        fmt = case.weight_format
        if case.scheme == "w8a8":
            return no("no engine calls woqgemm_s8: vLLM's W8A8 CPU kernels are oneDNN/SGL/zentorch, and auto-round "
                      "exports no W8A8 layer using it" + more)
        if fmt in ("ct-pack-quantized", "ct-int-quantized"):
            return no("no engine sends compressed-tensors checkpoints to ARK: vLLM routes them through its "
                      "compressed-tensors schemes; ARK is reached only through the INC (auto-round) config" + more)
        if self.engine == "auto-round":
            return yes()  # QuantLinearGPTQ / QuantLinear (v2) / QuantLinearAWQ: sym and asym, 2..8 bits on CPU
        if fmt == "awq":
            return no(f"vLLM ({VLLM_ROUTER}) sends AWQ-packed INC layers on CPU to INCWNA16LinearScheme "
                      "(AutoAWQ methods), not to ARK; only XPU sends them to ARK, and only symmetric ones" + more)
        if case.bits != 4 or not case.sym:
            return no(f"vLLM ({VLLM_ROUTER}) sends only 4-bit symmetric GPTQ layers to ARK on CPU and raises "
                      f"NotImplementedError('INC on CPU: unsupported config') for bits={case.bits} "
                      f"{'sym' if case.sym else 'asym'}" + more)
        if case.group_size in (-1, 0):
            return no("vLLM's INC ARK path cannot load group_size -1: INCXPULinearBase._create_inc_weights computes "
                      "input_size_per_partition // group_size (inc_wna16_linear.py), and woqgemm validates "
                      "groupsize > 0" + more)
        return yes()

    # -- 3. declared
    def known_defect(self, case: Case) -> str | None:
        """woqgemm_s8 (W8A8) by this host's oneDNN int8 path (S8_PATH_DEFECT): saturating without VNNI, Xbyak
        errors on AMX; exact on the VNNI brgemm paths."""
        if case.scheme == "w8a8":
            return S8_PATH_DEFECT[s8_matmul_path()]
        return None

    def declared(self, case: Case) -> Declared:
        out = case.output_dtype
        if case.scheme == "w8a8":
            defect = self.known_defect(case)
            return Declared(
                variants={"act_rounding": "rne", "reciprocal": "recip_scale", "act_scale_dtype": "float32",
                          "qmin": -128, "qmax": 127, "zero_row": "zero", "act_granularity": "per_tensor",
                          "act_scale_formula": "recip_mul"},
                accumulate="int32", output=out,
                notes="woqgemm_s8: dynamic per-TENSOR int8 (one amax over all rows, act_granularity=per_tensor); "
                      "scale = fl32(amax * fl32(1/127)) (act_scale_formula=recip_mul); oneDNN reorder with a dst "
                      "scale (x * fl32(1/scale), RNE, saturating); s8s8 matmul, int32 accumulation, fp32 scaling "
                      "and bias; output fp32 then RNE to the activation dtype"
                      + (f"; oneDNN int8 path here: {s8_matmul_path()}; {defect}" if defect else ""))
        variants: dict = {}
        notes = []
        if case.weight_format in ("gptq", "awq") and self.engine == "vllm" and case.act_dtype != "float32":
            variants["weight_scale_dtype"] = case.act_dtype
            notes.append(f"scales loaded into params_dtype ({case.act_dtype}) parameters before .to(float32)")
        if case.weight_format == "gptq" and case.sym:
            variants["zero_read"] = "ignore_qzeros"
            notes.append("sym: qzeros are not read, zero point 8 (QuantLinear intweight -= qbias)")
        v1_asym = case.weight_format == "gptq" and not case.sym and case.zero_convention != "v2"
        if v1_asym and self.engine == "auto-round" and case.bits == 8:
            variants["zero_read"] = "v1_wrap"
            notes.append("QuantLinearGPTQ 8-bit: zeros.to(uint8) += 1 wraps field 0xFF to 0 ((field + 1) & 0xFF)")
        if v1_asym and self.engine == "vllm":
            variants["zero_read"] = "v1_literal"
            notes.append("v1 asym qzeros are read without the +1 (QuantLinear ZP_BIAS=0 as vLLM instantiates it): "
                         "zero_read=v1_literal (one code below the checkpoint's meaning; latent in vLLM, which "
                         "routes only sym GPTQ to ARK on CPU)")
        if case.weight_format == "awq" and self.engine == "vllm":
            notes.append("EXPECTED DISCREPANCY: vLLM copies AWQ qzeros without the nibble reorder it applies to "
                         "qweight; QuantLinear reads them in GPTQ order (zeros permuted within 8 columns)")
        core = gemm_core(self.cdt, 8 if case.scheme == "w8a16" else 4, case.group, not case.sym)
        comp = _CORE_COMPUTE[core]
        if comp == "int8":
            notes.append(f"bestla core {core} (cdt={self.cdt} on this host): activations quantized to int8 per token "
                         "per K-block (ActivationKBlockQuantize; uint8 with a zero point on VNNI cores), int8 x int "
                         "dot products, block scales applied in float32 — not expressible by the emulator's "
                         f"variants: arithmetic=opaque, judged by SQNR >= {INT8_CORE_SQNR_FLOOR_DB:g} dB against the "
                         "canonical reference (docs/backends/ark.md#int8-cores)")
            return Declared(variants=variants, weight_dtype="exact", accumulate="float32", output=out,
                            notes="; ".join(notes), arithmetic="opaque", sqnr_floor_db=INT8_CORE_SQNR_FLOOR_DB)
        wdt, adt = "exact", None
        if comp in ("bfloat16", "float16"):  # AMX bf16/fp16 cores (source-derived; not measured here)
            wdt, adt = comp, comp
        notes.append(f"bestla core {core}: weights (q - z) * s formed in {'float32' if wdt == 'exact' else wdt}, "
                     f"activations x.to(float32){'' if adt is None else ' then ' + adt}, float32 accumulation, "
                     "float32 bias add, output .to(x.dtype) (RNE)")
        if case.group_size in (-1, 0):
            notes.append("group_size -1 mapped to one K-block (QuantLinear: group_size = in_features); vLLM's INC "
                         "ARK path itself cannot load -1 (input_size // -1 in create_weights, and "
                         "woqgemm validates groupsize > 0)")
        return Declared(variants=variants, weight_dtype=wdt, act_compute_dtype=adt, accumulate="float32",
                        output=out, notes="; ".join(notes))

    # -- 4. prepare
    def layout(self, case: Case, tensors: dict) -> ArkLayout:
        fmt = case.weight_format
        if fmt == "gptq":
            return gptq_layout(case, tensors, self.engine)
        if fmt == "awq":
            return awq_layout(case, tensors, self.engine)
        if fmt == "ct-pack-quantized":
            return ct_pack_layout(case, tensors)
        if fmt == "ct-int-quantized":
            return ct_int8_layout(case, tensors)
        raise ValueError(f"ark: no layout for weight format {fmt!r}")

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        ark = _import_ark()
        if case.scheme == "w8a8":
            w = to_torch(tensors["weight"], np.int8)
            n = w.shape[0]
            s = np.broadcast_to(np.asarray(tensors["weight_scale"], dtype=np.float32).reshape(-1), (n,))
            return Prepared(case, {"kind": "s8", "B": w.contiguous(), "scaleB": scales32(s), "ark": ark})
        lay = self.layout(case, tensors)
        sdt = "fp32"  # QuantLinear.post_init on CPU
        blob = ark.repack_quantized_weight(lay.intweight.contiguous(), lay.scales.contiguous(),
                                           lay.zeros.contiguous(), lay.group, self.cdt, lay.wdt, sdt, lay.asym)
        return Prepared(case, {"kind": "woq", "blob": blob, "layout": lay, "sdt": sdt, "ark": ark})

    # -- 5. run
    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        torch = import_torch()
        case = prepared.case
        d = prepared.data
        ark = d["ark"]
        act = torch_dtype(case.act_dtype)
        xt = to_torch(x, np.float32).to(act)
        bias = inputs.get("bias")
        bt = None if bias is None else to_torch(bias, np.float32).to(act)
        with torch.no_grad():
            if d["kind"] == "s8":
                # No engine wraps woqgemm_s8: give it float32 (exact), as woqgemm_linear does for woqgemm.
                b32 = None if bt is None else bt.to(torch.float32).contiguous()
                y = ark.woqgemm_s8(xt.to(torch.float32).contiguous(), d["B"], d["scaleB"], b32).to(act)
            else:
                lay: ArkLayout = d["layout"]
                # vLLM: ark_linear.bias is a float32 buffer the layer's bias is copied into
                b32 = None if bt is None else bt.to(torch.float32)
                y = ark.woqgemm_linear(xt, d["blob"], b32, case.N, case.K, lay.group, self.cdt, lay.wdt, d["sdt"],
                                       lay.asym)
        out_dt = torch_dtype(case.output_dtype)
        return y.to(out_dt).to(torch.float32).numpy()

