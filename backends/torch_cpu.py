"""PyTorch's own CPU quantized-GEMM ops (ATen, torch 2.13) as a qconform backend.

Covers four ATen CPU kernels, one per scheme (docs/backends/torch-cpu.md):

- ``w4a16``: ``aten._convert_weight_to_int4pack_for_cpu`` + ``aten._weight_int4pack_mm_for_cpu``
  (pytorch/pytorch ``aten/src/ATen/native/cpu/int4mm_kernel.cpp``, ``LinearAlgebra.cpp``; the
  CPU-only ops were split from the CUDA tinygemm ops in pytorch/pytorch PR #139611). Weights are
  prepared as torchao's ``Int4CPULayout`` does (pytorch/ao ``torchao/dtypes/uintx/int4_cpu_layout.py``:
  int32 codes [N, K] in [0, 15] -> ``_convert_weight_to_int4pack_for_cpu(codes, 1)``; scales and zeros
  packed by ``pack_tinygemm_scales_and_zeros`` into [K/G, N, 2] in the activation dtype; the bias is
  added to the kernel's output afterwards). The kernel computes ``w = (q - 8) * s + zero`` with a
  FLOAT zero point; integer zero points z map to ``zero = (8 - z) * s`` (the mapping GPTQModel's
  ``TorchAtenLinear``, ``gptqmodel/nn_modules/qlinear/torch_aten_kernel.py``, uses), computed in
  float32 and stored (RNE) in the activation dtype.
- ``w8a16``: ``aten._weight_int8pack_mm`` (``aten/src/ATen/native/cpu/int8mm_kernel.cpp``): int8
  weights [N, K] and one scale per output channel, both in the activation dtype (as GPTQModel's
  ``TorchInt8Linear``, ``gptqmodel/nn_modules/qlinear/torch_int8.py``, calls it; bias added after).
- ``w8a8``: ``torch._int_mm`` (int8 x int8 -> int32 on CPU) with the project's canonical dynamic
  per-token int8 activation quantization implemented here in torch (emulator/activations/int8.py:
  amax / 127 in fp32, ``x / scale`` in fp32, ``torch.round`` = RNE, saturate to [-128, 127], zero
  row -> scale 0 and codes 0), then the per-token and per-channel scales applied in fp32.
- ``w4a8``: ``aten._dyn_quant_pack_4bit_weight`` + ``aten._dyn_quant_matmul_4bit`` (KleidiAI on Arm,
  pytorch/pytorch PR #134124; on x86 the reference fallback in ``int4mm_kernel.cpp``,
  ``ref_dyn_quant_matmul_4bit_{channelwise,groupwise}_kernel``), prepared and called as vLLM's
  ``Dynamic4bitLinearKernel`` does (vllm-project/vllm
  ``vllm/model_executor/kernels/linear/mixed_precision/dynamic_4bit.py``). Its activation
  quantization is KleidiAI's asymmetric per-row "qa8dx" scheme (emulator
  ``Int8ActVariant(scheme="kai_qa8dx")``).

Declared with emulator variants (docs/backends/torch-cpu.md#declared-arithmetic): the int4pack float
zero point (``dequant_order=float_zero``, ``zero_dtype``), the bias added to the already rounded
16-bit output (``bias_stage=after_output_rounding``), qa8dx activations (``act_scheme=kai_qa8dx``) and
the truncating bf16 store of the W4A8 channel-wise fallback (``output_rounding=rtz``).
"""

from __future__ import annotations

import dataclasses
import functools
import platform

import numpy as np

from .base import Availability, Backend, Case, Declared, Prepared, Support, no, yes
from .torch_layout import AWQ_REVERSE_ORDER, to_torch, torch_dtype, unpack_fields  # noqa: F401 - re-exported

#: the ATen ops each scheme needs
OPS = {
    "w4a16": ("_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu"),
    "w8a16": ("_weight_int8pack_mm",),
    "w8a8": ("_int_mm",),
    "w4a8": ("_dyn_quant_pack_4bit_weight", "_dyn_quant_matmul_4bit"),
}
#: known kernel defect, run (not refused) because no engine guards it: docs/backends/torch-cpu.md (P4)
INT8PACK_K_TAIL = ("KNOWN KERNEL DEFECT (docs/backends/torch-cpu.md, P4): _weight_int8pack_mm's AVX512 bf16 kernel "
                   "steps K by 16 with no tail and no size check; K % 16 != 0 reads past each row (wrong values "
                   "with M = 1, SIGSEGV from misaligned loads with several rows). GPTQModel's TorchInt8QuantLinear "
                   "(gptqmodel/nn_modules/qlinear/torch_int8.py: SUPPORTS_IN_FEATURES_DIVISIBLE_BY = [1]) calls it "
                   "for any K, so this case is run; expect fail or crash (waivers/known-kernel-defects.toml)")
INT_MM_K1 = ("KNOWN KERNEL DEFECT (docs/findings.md, torch 2.13 CPU torch._int_mm: K = 1): with K = 1 the [1, N] "
             "view w.t() has strides (1, 1), torch passes the stride as oneDNN's leading dimension, oneDNN rejects "
             "ldb = 1 < N without an error and the int32 output is never written (uninitialised values); N = 1 is "
             "exact. The adapter calls _int_mm(q, w.t()) as torch's own int8 linear does, so this case is run; "
             "expect fail (waivers/known-kernel-defects.toml)")
#: group sizes ``_weight_int4pack_mm_for_cpu`` accepts (LinearAlgebra.cpp TORCH_CHECK)
INT4PACK_GROUPS = (32, 64, 128, 256)


def _import_torch():
    import torch  # noqa: PLC0415

    return torch


@functools.lru_cache(maxsize=1)
def _torch_state() -> tuple[bool, str, str | None, str | None]:
    """(importable, reason, version, cpu capability)."""
    try:
        torch = _import_torch()
    except Exception as e:  # ImportError, or a broken install raising anything else
        return False, f"torch is not importable: {type(e).__name__}: {e}", None, None
    try:
        cap = torch.backends.cpu.get_cpu_capability()
    except Exception:  # pragma: no cover - very old torch
        cap = None
    return True, "", torch.__version__, cap


def _op(name: str):
    torch = _import_torch()
    if name == "_int_mm":
        return getattr(torch, "_int_mm", None)
    packet = getattr(torch.ops.aten, name, None)
    return packet


@functools.lru_cache(maxsize=None)
def op_status(scheme: str) -> tuple[bool, str]:
    """Whether the ops of ``scheme`` exist and run on this host (a tiny real call), and why not."""
    ok, reason, _, _ = _torch_state()
    if not ok:
        return False, reason
    torch = _import_torch()
    missing = []
    for name in OPS[scheme]:
        try:
            if _op(name) is None:
                missing.append(name)
        except Exception:
            missing.append(name)
    if missing:
        return False, f"torch {torch.__version__} has no aten op(s) {', '.join(missing)}"
    try:
        if scheme == "w4a16":
            q = torch.zeros(16, 64, dtype=torch.int32)
            p = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
            sz = torch.zeros(2, 16, 2, dtype=torch.bfloat16)
            torch.ops.aten._weight_int4pack_mm_for_cpu(torch.zeros(1, 64, dtype=torch.bfloat16), p, 32, sz)
        elif scheme == "w8a16":
            torch.ops.aten._weight_int8pack_mm(torch.zeros(1, 32), torch.zeros(4, 32, dtype=torch.int8), torch.ones(4))
        elif scheme == "w8a8":
            torch._int_mm(torch.zeros(1, 32, dtype=torch.int8), torch.zeros(32, 4, dtype=torch.int8))
        elif scheme == "w4a8":
            w = torch.zeros(16, 32, dtype=torch.uint8)
            pw = torch.ops.aten._dyn_quant_pack_4bit_weight(w, torch.ones(16, 1), None, 64, 64, 16)
            torch.ops.aten._dyn_quant_matmul_4bit(torch.zeros(1, 64), pw, 64, 64, 16)
    except Exception as e:
        return False, f"{'/'.join(OPS[scheme])} failed on this host: {type(e).__name__}: {str(e).splitlines()[0]}"
    return True, ""


def kleidiai_available() -> bool:
    """True where _dyn_quant_* dispatch to KleidiAI (Arm) instead of the reference fallback."""
    try:
        torch = _import_torch()
        kai = getattr(torch.backends, "kleidiai", None)
        return bool(kai is not None and kai.is_available())
    except Exception:
        return False


# ------------------------------------------------------------------------------------------------
# Reading canonical checkpoint tensors into integer codes (pure torch; mirrors emulator/formats)
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Codes:
    """Unsigned codes ``q [N, K]`` (int32), zero points ``z [N, G]`` (int32; the symmetric
    midpoint 2**(bits-1) when the scheme is symmetric) and scales ``s [N, G]`` (checkpoint dtype)."""

    q: "object"
    z: "object"
    s: "object"
    bits: int


def read_codes(case: Case, tensors: dict) -> Codes:
    """Canonical checkpoint tensors -> unsigned codes, zero points and scales, all [N, ...]."""
    torch = _import_torch()
    fmt = case.weight_format
    N, K = case.N, case.K
    if fmt == "gptq":
        bits = case.bits
        q = unpack_fields(to_torch(tensors["qweight"]), bits, 0)[:K].t().contiguous()
        s = to_torch(tensors["scales"]).t().contiguous()
        if case.sym:
            # symmetric GPTQ: qzeros are not read (vLLM uint4b8 / uint8b128; emulator zero_read=ignore_qzeros)
            z = torch.full(s.shape, 1 << (bits - 1), dtype=torch.int32)
        else:
            fields = unpack_fields(to_torch(tensors["qzeros"]), bits, 1)[:, :N]
            z = (fields if case.zero_convention == "v2" else fields + 1).t().contiguous()
        return Codes(q, z.to(torch.int32), s, bits)
    if fmt == "awq":
        q = unpack_fields(to_torch(tensors["qweight"]), 4, 1, AWQ_REVERSE_ORDER).t().contiguous()
        z = unpack_fields(to_torch(tensors["qzeros"]), 4, 1, AWQ_REVERSE_ORDER).t().contiguous()
        s = to_torch(tensors["scales"]).t().contiguous()
        return Codes(q, z, s, 4)
    if fmt == "ct-pack-quantized":
        bits = case.bits
        q = unpack_fields(to_torch(tensors["weight_packed"]), bits, 1)[:, :K].contiguous()
        s = to_torch(tensors["weight_scale"]).reshape(N, -1).contiguous()
        if "weight_zero_point" in tensors and tensors["weight_zero_point"] is not None:
            z = unpack_fields(to_torch(tensors["weight_zero_point"]), bits, 0)[:N].contiguous()
        else:
            z = torch.full(s.shape, 1 << (bits - 1), dtype=torch.int32)
        return Codes(q, z, s, bits)
    if fmt == "ct-int-quantized":
        w = to_torch(tensors["weight"]).to(torch.int32)
        s = to_torch(tensors["weight_scale"]).reshape(-1)
        if s.numel() == 1:
            s = s.expand(N)
        return Codes(w + 128, torch.full((N, 1), 128, dtype=torch.int32), s.reshape(N, 1).contiguous(), 8)
    raise ValueError(f"torch-cpu reads no weight format {fmt!r}")


# ------------------------------------------------------------------------------------------------
# Layout transforms
# ------------------------------------------------------------------------------------------------
def int4pack_block_n(capability: str | None) -> int:
    """BLOCK_N of weight_to_int4pack_kernel: Vectorized<float>::size() * 4 (64 on AVX512, else 32)."""
    return 64 if capability == "AVX512" else 32


def unpack_int4pack_cpu(packed, N: int, K: int, capability: str | None):
    """Inverse of ``_convert_weight_to_int4pack_for_cpu`` on x86 (int4mm_kernel.cpp
    ``weight_to_int4pack_kernel``): packed uint8 [N, K/2] -> codes int32 [N, K].

    Per block of BLOCK_N output channels the bytes are [K, BLOCK_N/2]; a full AVX512
    block puts channel d (low nibble) with d+32 (high nibble) in byte d and d+16 with
    d+48 in byte 16+d; a full AVX2 block pairs d with d+16; partial blocks and the
    non-vectorized build pair consecutive channels (n low, n+1 high).
    """
    torch = _import_torch()
    bn = int4pack_block_n(capability)
    flat = packed.reshape(-1).to(torch.int32)
    out = torch.empty(N, K, dtype=torch.int32)
    for b0 in range(0, N, bn):
        nb = min(bn, N - b0)
        blk = flat[b0 * K // 2:(b0 + nb) * K // 2].reshape(K, nb // 2)
        lo, hi = blk & 0xF, blk >> 4
        if nb == bn and capability == "AVX512":
            out[b0 + 0:b0 + 16] = lo[:, 0:16].t()
            out[b0 + 32:b0 + 48] = hi[:, 0:16].t()
            out[b0 + 16:b0 + 32] = lo[:, 16:32].t()
            out[b0 + 48:b0 + 64] = hi[:, 16:32].t()
        elif nb == bn and capability == "AVX2":
            out[b0:b0 + 16] = lo[:, 0:16].t()
            out[b0 + 16:b0 + 32] = hi[:, 0:16].t()
        else:
            out[b0:b0 + nb:2] = lo.t()
            out[b0 + 1:b0 + nb:2] = hi.t()
    return out


def tinygemm_scales_and_zeros(s, z, act_dtype):
    """[N, G] scales and integer zero points -> qScaleAndZeros [G, N, 2] in the activation dtype.

    scale = s rounded (RNE) to the activation dtype T; zero = (8 - z) * scale computed in
    float32 (exact: a 16-bit scale times an integer of at most 5 bits) and rounded once
    (RNE) to T, so that ``(q - 8) * scale + zero == (q - z) * scale`` whenever that zero is
    representable in T. Packed as torchao's ``pack_tinygemm_scales_and_zeros``:
    ``cat([scale, zero], -1).transpose(0, 1)``.
    """
    torch = _import_torch()
    s_t = s.to(act_dtype)
    zero = ((8 - z).to(torch.float32) * s_t.to(torch.float32)).to(act_dtype)
    return torch.stack([s_t, zero], dim=-1).transpose(0, 1).contiguous()


def int4pack_group(case: Case) -> int:
    """The qGroupSize passed to the kernel: the case's group, or for channel-wise scales the
    largest accepted group dividing K (scales and zeros repeated over its K/G groups)."""
    if case.group_size not in (-1, 0):
        return case.group_size
    for g in sorted(INT4PACK_GROUPS, reverse=True):
        if case.K % g == 0:
            return g
    return 0


def _w4a8_channelwise(case: Case) -> bool:
    return case.group_size in (-1, 0) or case.group_size == case.K


def _w4a8_kernel_dtype(case: Case) -> str:
    """The dtype vLLM's Dynamic4bitLinearKernel hands to the op: bf16 only when channel-wise."""
    return "bfloat16" if case.act_dtype == "bfloat16" and _w4a8_channelwise(case) else "float32"


def dyn_quant_nibbles(q):
    """codes [N, K] in [0, 15] -> uint8 [N, K/2], even k in the low nibble (the fallback's reading)."""
    torch = _import_torch()
    return (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8).contiguous()


# ------------------------------------------------------------------------------------------------
# The backend
# ------------------------------------------------------------------------------------------------
class TorchCpuBackend(Backend):
    name = "torch-cpu"
    covers = ("PyTorch ATen CPU ops (torch 2.13): _weight_int4pack_mm_for_cpu (W4A16), _weight_int8pack_mm "
              "(W8A16), torch._int_mm (W8A8 with canonical per-token int8 activations), _dyn_quant_matmul_4bit "
              "(W4A8, KleidiAI qa8dx activations; reference fallback on x86)")
    priority = 30

    def __init__(self, **params: str):
        super().__init__(**params)
        if params:
            raise ValueError(f"torch-cpu takes no parameters, got {sorted(params)}")

    # -- 1. availability ------------------------------------------------------------------------
    def availability(self) -> Availability:
        ok, reason, version, cap = _torch_state()
        if not ok:
            return Availability(False, reason, None, None)
        per = {s: op_status(s) for s in OPS}
        if not any(v[0] for v in per.values()):
            why = "; ".join(f"{s}: {r}" for s, (_, r) in per.items())
            return Availability(False, f"no torch CPU quantized op runs here: {why}", version, f"cpu ({cap})")
        parts = []
        for s, (good, r) in per.items():
            parts.append(f"{s} via {'+'.join(OPS[s])}: " + ("yes" if good else f"no ({r})"))
        if per["w4a8"][0]:
            parts.append("w4a8 runs " + ("KleidiAI" if kleidiai_available() else
                                          f"the reference fallback (no KleidiAI on {platform.machine()})"))
        return Availability(True, "; ".join(parts), version, f"cpu ({cap})")

    def schemes(self) -> list[str]:
        return [s for s in OPS if op_status(s)[0]]

    # -- 2. can_implement -----------------------------------------------------------------------
    def can_implement(self, case: Case) -> Support:
        if case.scheme not in OPS:
            return no(f"torch has no CPU op for scheme {case.scheme} (torch-cpu covers {', '.join(OPS)})")
        ok, why = op_status(case.scheme)
        if not ok:
            return no(why)
        if case.act_order:
            return no("act order (g_idx) is not supported: the torch CPU kernels take contiguous K groups only")
        if case.out_dtype not in (None, case.act_dtype) and case.scheme != "w8a8":
            return no(f"the kernel writes its output in the activation dtype ({case.act_dtype}), "
                      f"not {case.out_dtype}")
        return getattr(self, "_can_" + case.scheme.replace("-", "_"))(case)

    def _can_w4a16(self, case: Case) -> Support:
        if case.weight_format not in ("gptq", "awq", "ct-pack-quantized"):
            return no(f"w4a16 needs int4 GPTQ/AWQ/compressed-tensors weights, not {case.weight_format}")
        if case.bits != 4:
            return no(f"_weight_int4pack_mm_for_cpu is 4-bit only, got bits={case.bits}")
        if case.K % 2:
            return no(f"_convert_weight_to_int4pack_for_cpu needs even K, got K={case.K}")
        g = int4pack_group(case)
        if case.group_size in (-1, 0):
            if g == 0:
                return no(f"channel-wise scales need K divisible by one of {INT4PACK_GROUPS} "
                          f"(scales are repeated over groups), got K={case.K}")
        elif g not in INT4PACK_GROUPS:
            return no(f"_weight_int4pack_mm_for_cpu accepts qGroupSize 32, 64, 128 or 256 only, got {g}")
        elif case.K % g:
            return no(f"K={case.K} is not a multiple of group_size {g}")
        return yes()

    def _can_w8a16(self, case: Case) -> Support:
        if case.weight_format not in ("gptq", "ct-pack-quantized", "ct-int-quantized"):
            return no(f"w8a16 needs int8 GPTQ or compressed-tensors weights, not {case.weight_format}")
        if case.weight_format != "ct-int-quantized" and case.bits != 8:
            return no(f"_weight_int8pack_mm takes 8-bit weights, got bits={case.bits}")
        if case.weight_format != "ct-int-quantized":
            if not case.sym:
                return no("_weight_int8pack_mm has no zero point: asymmetric 8-bit weights are not supported")
            if case.group_size not in (-1, 0):
                return no(f"_weight_int8pack_mm takes one scale per output channel, not groups of {case.group_size}")
        # bf16 with K % 16 != 0 is NOT refused: the AVX512 bf16 kernel has no K tail (known defect
        # INT8PACK_K_TAIL), and the engine this adapter follows guards nothing (GPTQModel TorchInt8QuantLinear:
        # SUPPORTS_IN_FEATURES_DIVISIBLE_BY = [1], bfloat16 in SUPPORTS_DTYPES), so the kernel runs and the
        # verdict is fail or crash; waivers/known-kernel-defects.toml names the suite's case
        return yes()

    def _can_w8a8(self, case: Case) -> Support:
        if case.weight_format != "ct-int-quantized":
            return no(f"w8a8 is defined for compressed-tensors int-quantized weights, not {case.weight_format}")
        return yes()

    def _can_w4a8(self, case: Case) -> Support:
        if case.weight_format not in ("gptq", "ct-pack-quantized"):
            return no(f"_dyn_quant_matmul_4bit takes symmetric int4 weights (q - 8); {case.weight_format} "
                      "carries zero points")
        if case.bits != 4:
            return no(f"_dyn_quant_matmul_4bit is 4-bit only, got bits={case.bits}")
        if not case.sym:
            return no("_dyn_quant_matmul_4bit has no weight zero point (weights are q - 8): asymmetric int4 "
                      "is not supported")
        if case.K % 2:
            return no(f"_dyn_quant_matmul_4bit packs two codes per byte: K must be even, got {case.K}")
        if not _w4a8_channelwise(case) and (case.group_size % 32 or case.K % case.group_size):
            return no(f"_dyn_quant_matmul_4bit groupwise needs group_size % 32 == 0 and K % group_size == 0, "
                      f"got group_size={case.group_size}, K={case.K}")
        return yes()

    # -- 3. declared ----------------------------------------------------------------------------
    def known_defect(self, case: Case) -> str | None:
        """INT8PACK_K_TAIL: the AVX512 bf16 _weight_int8pack_mm reads past each row when K % 16 != 0;
        INT_MM_K1: _int_mm leaves its output unwritten for K = 1 and N > 1 (the dispatcher never picks either)."""
        if case.scheme == "w8a16" and case.act_dtype == "bfloat16" and case.K % 16:
            return INT8PACK_K_TAIL
        if case.scheme == "w8a8" and case.K == 1 and case.N > 1:
            return INT_MM_K1
        return None

    def declared(self, case: Case) -> Declared:
        T = case.act_dtype
        if case.scheme == "w4a16":
            v: dict = {}
            if case.weight_format == "gptq" and case.sym:
                v["zero_read"] = "ignore_qzeros"
            if T != "float32" and case.scale_dtype != T:
                v["weight_scale_dtype"] = T
            # the kernel's float zero point (qScaleAndZeros holds zero_T = RNE_T(fp32((8 - z) * s_T)));
            # for symmetric weights z = 8 and the zero is 0, i.e. the canonical value
            v["dequant_order"] = "float_zero"
            v["zero_dtype"] = T
            note = ("_weight_int4pack_mm_for_cpu: w = (q - 8) * s_T + zero_T with zero_T = RNE_T((8 - z) * s_T) "
                    "(dequant_order=float_zero, zero_dtype=T), formed in fp32 (FMA on AVX512 bf16, mul+add on the "
                    "scalar fp16/fp32 path; exact either way for 16-bit T), fp32 accumulation in K order, output "
                    "rounded RNE to T; bias (if any) added after, in T, as torchao's Int4CPU linear does.")
            if case.bias and T != "float32":
                v["bias_stage"] = "after_output_rounding"
            return Declared(variants=v, weight_dtype="float32", act_compute_dtype=None, accumulate="float32",
                            output=T, notes=note)
        if case.scheme == "w8a16":
            v = {}
            if case.weight_format == "gptq":
                v["zero_read"] = "ignore_qzeros"
            if T != "float32" and case.scale_dtype != T:
                v["weight_scale_dtype"] = T
            if case.bias and T != "float32":
                v["bias_stage"] = "after_output_rounding"
            notes = ("_weight_int8pack_mm: w = fp32(q * s_T) (exact for 16-bit scales), fp32 accumulation "
                     "(16-lane FMA + reduce on AVX512 bf16, scalar otherwise), output rounded RNE to T; bias added "
                     "after, in T.")
            if T == "bfloat16" and case.K % 16:
                notes += " " + INT8PACK_K_TAIL
            return Declared(variants=v, weight_dtype="float32", accumulate="float32", output=T, notes=notes)
        if case.scheme == "w8a8":
            v = {"act_rounding": "rne", "reciprocal": "divide", "act_scale_dtype": "float32", "qmin": -128,
                 "qmax": 127, "zero_row": "zero", "act_symmetric": True}
            return Declared(variants=v, weight_dtype="exact", accumulate="int32", output=case.output_dtype,
                            notes="canonical per-token int8 quantization in torch (amax/127 fp32, x/scale fp32, "
                                  "torch.round RNE, clamp, zero row -> 0), torch._int_mm int32, then "
                                  "fp32(fp32(acc * x_scale) * w_scale) [+ bias fp32], rounded RNE to the output.")
        if case.scheme == "w4a8":
            # KleidiAI's qa8dx activations; the C sources round the codes with std::round (RHAZ)
            v = {"act_scheme": "kai_qa8dx", "act_rounding": "rhaz"}
            if case.weight_format == "gptq":
                v["zero_read"] = "ignore_qzeros"
            channel = _w4a8_channelwise(case)
            if not channel and case.scale_dtype != "bfloat16":
                v["weight_scale_dtype"] = "bfloat16"  # vLLM: "KleidiAI kernel requires bfloat16 scales"
            kernel_dtype = _w4a8_kernel_dtype(case)
            out_round = "rtz" if kernel_dtype == "bfloat16" else "rne"
            return Declared(variants=v, weight_dtype="exact", act_compute_dtype=None, accumulate="int32", output=T,
                            output_rounding=out_round,
                            notes="vLLM Dynamic4bitLinearKernel + _dyn_quant_matmul_4bit x86 reference fallback: "
                                  f"kernel input {kernel_dtype}; KleidiAI qa8dx activations (act_scheme=kai_qa8dx), "
                                  "int32 sum of (qa - zp)(q - 8) per group, fp32 acc += iacc * s_g, * x_scale, "
                                  "+ bias (fp32); fp32 output (cast RNE to the activation dtype), or bf16 by "
                                  "truncation (rtz) on the bf16 channel-wise path.")
        raise ValueError(case.scheme)

    # -- 4. prepare -----------------------------------------------------------------------------
    def prepare(self, case: Case, tensors: dict) -> Prepared:
        sup = self.can_implement(case)
        if not sup:
            raise ValueError(f"torch-cpu cannot implement {case.describe()}: {sup.reason}")
        torch = _import_torch()
        T = torch_dtype(case.act_dtype)
        c = read_codes(case, tensors)
        if case.scheme == "w4a16":
            g = int4pack_group(case)
            reps = (case.K // g) // c.s.shape[1]
            s, z = c.s, c.z
            if reps > 1:  # channel-wise scales repeated over the kernel's groups
                s, z = s.repeat_interleave(reps, dim=1), z.repeat_interleave(reps, dim=1)
            q = c.q
            pad = -case.N % 16  # the pack op needs N % 16 == 0: pad output channels with w = 0, sliced off
            if pad:
                q = torch.cat([q, torch.full((pad, case.K), 8, dtype=q.dtype)])
                s = torch.cat([s, torch.zeros((pad, s.shape[1]), dtype=s.dtype)])
                z = torch.cat([z, torch.full((pad, z.shape[1]), 8, dtype=z.dtype)])
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1)
            sz = tinygemm_scales_and_zeros(s, z, T)
            return Prepared(case, {"packed": packed, "sz": sz, "group": g})
        if case.scheme == "w8a16":
            w = (c.q - c.z[:, :1]).to(torch.int8).contiguous()  # sym: z is the midpoint 128
            return Prepared(case, {"w": w, "s": c.s.reshape(-1).to(T).contiguous()})
        if case.scheme == "w8a8":
            w = to_torch(tensors["weight"]).contiguous()
            return Prepared(case, {"w": w, "s": c.s.reshape(-1).to(torch.float32).contiguous()})
        if case.scheme == "w4a8":
            # vLLM Dynamic4bitLinearKernel.process_weights_after_loading: signed codes + 8 packed two per byte
            # (even k low), channel-wise scales float32 [N, 1], group scales bfloat16 [N, K/G]
            bl = case.K if _w4a8_channelwise(case) else case.group_size
            nib = dyn_quant_nibbles(c.q)
            scales = c.s.to(torch.float32 if bl == case.K else torch.bfloat16).reshape(case.N, -1).contiguous()
            return Prepared(case, {"nib": nib, "scales": scales, "bl": bl, "packed": {},
                                   "kernel_dtype": torch_dtype(_w4a8_kernel_dtype(case))})
        raise ValueError(case.scheme)

    # -- 5. run ---------------------------------------------------------------------------------
    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        torch = _import_torch()
        case = prepared.case
        d = prepared.data
        T = torch_dtype(case.act_dtype)
        xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(T).contiguous()
        bias = inputs.get("bias")
        if case.scheme == "w4a16":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(xt, d["packed"], d["group"], d["sz"])[:, :case.N]
            if bias is not None:
                y = y + torch.from_numpy(np.asarray(bias, np.float32)).to(T)
            return y.to(torch.float32).numpy()
        if case.scheme == "w8a16":
            y = torch.ops.aten._weight_int8pack_mm(xt, d["w"], d["s"])
            if bias is not None:
                y = y + torch.from_numpy(np.asarray(bias, np.float32)).to(T)
            return y.to(torch.float32).numpy()
        if case.scheme == "w8a8":
            q, scale = quantize_int8_per_token_torch(xt.to(torch.float32))
            acc = torch._int_mm(q, d["w"].t())
            y = (acc.to(torch.float32) * scale) * d["s"]
            if bias is not None:
                y = y + torch.from_numpy(np.asarray(bias, np.float32))
            return y.to(torch_dtype(case.output_dtype)).to(torch.float32).numpy()
        if case.scheme == "w4a8":
            key = None if bias is None else np.asarray(bias, np.float32).tobytes()
            if key not in d["packed"]:
                d["packed"].clear()
                b = None if bias is None else torch.from_numpy(np.asarray(bias, np.float32).copy())
                N, K, bl = case.N, case.K, d["bl"]
                d["packed"][key] = torch.ops.aten._dyn_quant_pack_4bit_weight(
                    d["nib"].reshape(N, K // bl, bl // 2), d["scales"], b, bl, K, N)
            # vLLM apply_weights: fp16, and bf16 with groups, run the float32 kernel and cast back
            y = torch.ops.aten._dyn_quant_matmul_4bit(xt.to(d["kernel_dtype"]), d["packed"][key], d["bl"],
                                                      case.K, case.N)
            return y.to(T).to(torch.float32).numpy()
        raise ValueError(case.scheme)


def quantize_int8_per_token_torch(x32):
    """The emulator's canonical symmetric per-token int8 quantization, in torch.

    amax = max|x| (fp32); scale = fp32(amax / 127) (an elementwise tensor division, not a
    scalar one, so no reciprocal is substituted); q = sat(torch.round(fp32(x / scale)))
    with torch.round = round half to even; rows with amax = 0 get scale 0 and codes 0.
    Returns (q int8 [M, K], scale fp32 [M, 1]).
    """
    torch = _import_torch()
    amax = x32.abs().amax(dim=1, keepdim=True)
    scale = amax / torch.full_like(amax, 127.0)
    zero = scale == 0
    quot = x32 / torch.where(zero, torch.ones_like(scale), scale)
    q = torch.round(quot).clamp(-128, 127)
    q = torch.where(zero, torch.zeros_like(q), q)
    return q.to(torch.int8), scale
