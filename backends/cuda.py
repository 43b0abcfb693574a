"""PyTorch's own CUDA quantized-GEMM ops (ATen) as a qconform backend.

Covers two ATen CUDA kernels (docs/backends/cuda.md):

- ``w4a16``: tinygemm, ``aten._convert_weight_to_int4pack`` + ``aten._weight_int4pack_mm``
  (pytorch/pytorch ``aten/src/ATen/native/cuda/int4mm.cu``; test and layout convention
  in ``test/test_linalg.py::_group_quantize_tensor`` / ``test__int4_mm``; the uint8
  [N, K/2] input of ``_convert_weight_to_int4pack`` since torch 2.5, pytorch PR #129940;
  the CPU op split into ``*_for_cpu`` in PR #139611). Facts used here, from int4mm.cu:
  the packer input is uint8 [N, K/2] with element ``2j`` in the HIGH nibble of byte ``j``
  (``matrix_to_m16n8k16_Bint4_layout`` + ``convert_i4x8_to_bf16x2x4``; test_linalg packs
  ``out[:, ::2] << 4 | out[:, 1::2]`` for CUDA); activations must be bfloat16
  (``TORCH_CHECK(A.dtype() == at::kBFloat16)``) and the output is bfloat16
  (``__float22bfloat162_rn``); ``qScaleAndZeros`` is bf16 [K/G, N, 2] (scale, zero);
  each weight is ``fma.rn.bf16x2((q - 8), scale, zero)`` -- ONE bf16 rounding of
  ``(q - 8) * s + zero`` -- where ``q - 8`` is exact (magic-number int4 -> bf16);
  products go through ``mma.sync.m16n8k16 .f32.bf16.bf16.f32`` and are summed in fp32;
  G in {32, 64, 128, 256}; N a multiple of 8; K a multiple of 16 * innerKTiles.
  Integer zero points z are mapped to tinygemm's float zero (torchao
  ``ZeroPointDomain.FLOAT``): ``zero = bf16((8 - z) * bf16(s))``; the scale itself is
  rounded fp16 -> bf16. That is the emulator's named variant ``dequant_order=float_zero``
  with ``zero_dtype=bfloat16``, ``weight_scale_dtype=bfloat16`` and ``weight_dtype=bfloat16``
  (docs/formats/gptq.md#float-zero-point-dequantorderfloat_zero): ``round_bf16((q - m) * s_bf16
  + round_bf16((m - z) * s_bf16))`` with m = 8 for GPTQ/AWQ codes (m = 0 for compressed-tensors'
  signed codes, the same numbers). With z = 8 (symmetric) the zero is exactly 0 and the weight
  is the canonical ``bf16((q - z) * bf16(s))``. ``tinygemm_weight`` below recomputes the
  weights from the packed operands in torch (an oracle independent of the emulator's code);
  tests/backends/test_cuda.py checks it equals the declared variant bit for bit.
  No vLLM path uses tinygemm; the canonical zero-point reading of each checkpoint format
  (GPTQ v1 ``field + 1`` / v2 literal, AWQ literal, compressed-tensors offset) is used.
- ``w8a8``: ``torch._int_mm`` (int8 [M, K] @ int8 [K, N] -> int32 via cuBLASLt;
  ``aten/src/ATen/native/cuda/Blas.cpp::_int_mm_out_cuda``: M > 16, K and N multiples
  of 8), with the project's canonical dynamic per-token activation quantization done on
  the device in torch (emulator/activations/int8.py): amax in fp32, ``scale = amax / 127``
  and ``x / scale`` as TRUE fp32 divisions (a CPU-scalar divisor would make CUDA compute
  ``x * (1/127)``: ``BinaryDivTrueKernel.cu`` turns ``tensor / cpu_scalar`` into a
  reciprocal multiply), ``torch.round`` (RNE), saturate to [-128, 127], zero row ->
  scale 0 and codes 0; then ``acc * x_scale * w_scale (+ bias)`` in fp32.

Refused, with reasons in ``can_implement``: MXFP4 (``torch._scaled_mm`` with
``float4_e2m1fn_x2`` and e8m0 block scales needs cuBLASLt block-scaled GEMM, sm_100+),
W8A16/W4A8/MoE (no torch CUDA op).

Parameters: ``cuda:bias_mode=bf16_add`` (default) adds a w4a16 bias to the bf16 kernel output
in bf16, as torchao's tinygemm linear does; declared as ``bias_stage=after_output_rounding``
(conformance/judge/acceptance.py: y = RNE_bf16(o + b), o the rounded kernel output), so the
declared interval covers the double rounding. ``cuda:bias_mode=refuse`` refuses w4a16 cases
with a bias instead. ``cuda:inner_k_tiles=2|4|8`` (default: the largest that divides K / 16).
"""

from __future__ import annotations

import numpy as np

from .base import Availability, Backend, Case, Declared, Prepared, Support, no, yes
from .torch_layout import AWQ_REVERSE_ORDER, TORCH_DTYPE_NAMES, torch_dtype, unpack_fields

__all__ = [
    "CudaBackend",
    "INT4PACK_GROUPS",
    "cuda_state",
    "read_int4_codes",
    "tinygemm_pack",
    "decode_tinygemm_u8",
    "tinygemm_weight",
    "quantize_act_int8",
]

#: group sizes ``_weight_int4pack_mm`` accepts (int4mm.cu TORCH_CHECK on qGroupSize)
INT4PACK_GROUPS = (32, 64, 128, 256)


def _import_torch():
    import torch  # noqa: PLC0415

    return torch


def cuda_state() -> dict:
    """{'ok', 'reason', 'torch', 'device', 'capability'} of this host (not cached: cheap)."""
    try:
        torch = _import_torch()
    except Exception as e:  # ImportError or a broken install
        return {"ok": False, "reason": f"torch is not importable: {type(e).__name__}: {e}", "torch": None,
                "device": None, "capability": None}
    ver = torch.__version__
    try:
        avail = bool(torch.cuda.is_available())
    except Exception as e:  # pragma: no cover - broken driver
        return {"ok": False, "reason": f"no CUDA device: torch.cuda.is_available() raised {type(e).__name__}: {e} "
                                       f"(torch {ver})", "torch": ver, "device": None, "capability": None}
    if not avail:
        return {"ok": False, "reason": f"no CUDA device: torch.cuda.is_available() is False (torch {ver})",
                "torch": ver, "device": None, "capability": None}
    name = torch.cuda.get_device_name(0)
    cap = tuple(torch.cuda.get_device_capability(0))
    return {"ok": True, "reason": f"{name} (sm_{cap[0]}{cap[1]}), torch {ver}, CUDA {torch.version.cuda}",
            "torch": ver, "device": name, "capability": cap}


# -- canonical int4 codes, in torch (CPU) ---------------------------------------------------------
def _f32(a):
    torch = _import_torch()
    return torch.as_tensor(np.asarray(a).astype(np.float32))


def read_int4_codes(case: Case, tensors: dict):
    """Canonical (q [N, K] 0..15, z [K/G, N], s [K/G, N] float32) of an int4 checkpoint, in torch.

    GPTQ: v1 ``z = field + 1``, v2 ``z = field``; AWQ: literal zeros with the AWQ column
    interleave; compressed-tensors: q and zp both stored with +8 (sym: z = 8).
    """
    torch = _import_torch()
    fmt = case.weight_format
    if fmt == "gptq":
        q = unpack_fields(tensors["qweight"], 4, 0).to(torch.int64).T.contiguous()
        fields = unpack_fields(tensors["qzeros"], 4, 1).to(torch.int64)
        z = fields if case.zero_convention == "v2" else fields + 1
        s = _f32(tensors["scales"])
    elif fmt == "awq":
        q = unpack_fields(tensors["qweight"], 4, 1, AWQ_REVERSE_ORDER).to(torch.int64).T.contiguous()
        z = unpack_fields(tensors["qzeros"], 4, 1, AWQ_REVERSE_ORDER).to(torch.int64)
        s = _f32(tensors["scales"])
    elif fmt == "ct-pack-quantized":
        N, K = (int(v) for v in np.asarray(tensors["weight_shape"]).reshape(-1)[:2])
        q = unpack_fields(tensors["weight_packed"], 4, 1)[:, :K].to(torch.int64).contiguous()
        s = _f32(tensors["weight_scale"]).T.contiguous()
        if tensors.get("weight_zero_point") is not None:
            z = unpack_fields(tensors["weight_zero_point"], 4, 0)[:N].to(torch.int64).T.contiguous()
        else:
            z = torch.full(s.shape, 8, dtype=torch.int64)
    else:
        raise ValueError(f"no int4 codes in weight format {fmt!r}")
    return q, z.to(torch.int64), s


def tinygemm_pack(case: Case, tensors: dict) -> dict:
    """The host-side tinygemm layout (pure torch, CPU): what ``_convert_weight_to_int4pack`` takes.

    Returns ``packed_u8`` uint8 [N, K/2] (element 2j in the high nibble of byte j),
    ``scales_and_zeros`` bf16 [K/G, N, 2] (scale, float zero) and ``group``.
    """
    torch = _import_torch()
    q, z, s = read_int4_codes(case, tensors)
    q8 = q.to(torch.uint8)
    packed = ((q8[:, 0::2] << 4) | q8[:, 1::2]).contiguous()
    s_bf = s.to(torch.bfloat16)
    zf = ((8 - z).to(torch.float32) * s_bf.to(torch.float32)).to(torch.bfloat16)  # product exact in fp32
    sz = torch.stack([s_bf, zf], dim=-1).contiguous()
    return {"packed_u8": packed, "scales_and_zeros": sz, "group": case.group}


def decode_tinygemm_u8(packed_u8) -> np.ndarray:
    """Kernel-side reading of the uint8 [N, K/2] input: k = 2j from the high nibble, 2j+1 from the low."""
    p = np.asarray(packed_u8, dtype=np.uint8)
    out = np.empty((p.shape[0], p.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2] = p >> 4
    out[:, 1::2] = p & 0xF
    return out


def tinygemm_weight(case: Case, tensors: dict) -> np.ndarray:
    """The weights tinygemm multiplies, recomputed from the packed operands in torch: [N, K] float32 values.

    ``bf16((q - 8) * s_bf16 + zero_bf16)`` with q read back from ``packed_u8`` and (s, zero)
    from ``scales_and_zeros``: the kernel's ``fma.rn.bf16x2`` (one rounding). The fp32
    arithmetic here is exact, so the final ``.to(bfloat16)`` (RNE) is that one rounding:
    ``(q - 8) * s`` has <= 4 + 8 significant bits, and the float zero (0, or a bf16 value of
    magnitude >= |s|) is a multiple of s's bf16 quantum, as is the product; the sum stays
    below 2**6 |s|, i.e. within 14 bits of that quantum. Independent of the emulator's
    dequantization code (torch only), it is the oracle the declared
    ``dequant_order=float_zero`` variant is tested against.
    """
    torch = _import_torch()
    pk = tinygemm_pack(case, tensors)
    q = torch.from_numpy(decode_tinygemm_u8(pk["packed_u8"].numpy()).astype(np.float32))  # [N, K]
    sz = pk["scales_and_zeros"].to(torch.float32)  # [K/G, N, 2]
    gi = torch.arange(q.shape[1]) // pk["group"]
    s = sz[gi, :, 0].T
    zf = sz[gi, :, 1].T
    return ((q - 8.0) * s + zf).to(torch.bfloat16).to(torch.float32).numpy()


# -- dynamic per-token int8 activations (canonical), in torch on any device -------------------
def quantize_act_int8(x32):
    """Canonical symmetric per-token int8 of a float32 tensor [M, K] -> (q int8, scale fp32 [M, 1]).

    Both divisions are tensor/tensor (true IEEE fp32 division on CUDA); see module docstring.
    """
    torch = _import_torch()
    amax = x32.abs().amax(dim=1, keepdim=True)
    scale = torch.div(amax, torch.full_like(amax, 127.0))
    zero = scale == 0
    quo = torch.div(x32, torch.where(zero, torch.ones_like(scale), scale))
    quo = torch.where(zero, torch.zeros_like(quo), quo)
    q = torch.round(quo).clamp_(-128, 127).to(torch.int8)
    return q, scale


def _inner_k_tiles(K: int, requested: str | None) -> int | None:
    if requested not in (None, "", "auto"):
        t = int(requested)
        return t if K % (16 * t) == 0 else None
    for t in (8, 4, 2):
        if K % (16 * t) == 0:
            return t
    return None


class CudaBackend(Backend):
    name = "cuda"
    covers = ("PyTorch CUDA ops: tinygemm aten._weight_int4pack_mm (int4mm.cu, W4A16 bf16) and "
              "torch._int_mm (cuBLASLt int8, W8A8 with canonical per-token activations)")
    priority = 70

    def __init__(self, **params: str):
        super().__init__(**params)
        unknown = set(params) - {"bias_mode", "inner_k_tiles"}
        if unknown:
            raise ValueError(f"cuda: unknown parameter(s) {sorted(unknown)}; known: bias_mode, inner_k_tiles")
        self.bias_mode = params.get("bias_mode", "bf16_add")
        if self.bias_mode not in ("refuse", "bf16_add"):
            raise ValueError(f"cuda: bias_mode must be refuse or bf16_add, got {self.bias_mode!r}")
        self.inner_k_tiles = params.get("inner_k_tiles")
        if self.inner_k_tiles not in (None, "auto", "2", "4", "8"):
            raise ValueError(f"cuda: inner_k_tiles must be 2, 4, 8 or auto, got {self.inner_k_tiles!r}")

    # -- 1. availability ------------------------------------------------------------------------
    def availability(self) -> Availability:
        st = cuda_state()
        dev = None
        if st["ok"]:
            cap = st["capability"]
            dev = f"{st['device']} (sm_{cap[0]}{cap[1]})"
        return Availability(st["ok"], st["reason"], st["torch"], dev)

    def schemes(self) -> list[str]:
        return ["w4a16", "w8a8"]

    # -- 2. can_implement -----------------------------------------------------------------------
    def can_implement(self, case: Case) -> Support:
        s = case.scheme
        if s == "w4a16":
            return self._can_w4a16(case)
        if s == "w8a8":
            return self._can_w8a8(case)
        if s == "w4a4-mxfp4":
            return no("torch._scaled_mm MXFP4 (float4_e2m1fn_x2 operands with float8_e8m0fnu 1x32 block scales) "
                      "needs cuBLASLt block-scaled GEMM, compute capability 10.x (Blackwell); not on sm_90 (H100) "
                      "and not implemented here")
        if s == "w4a16-mxfp4":
            return no("no torch CUDA op multiplies MXFP4 weights by 16-bit activations (torch._scaled_mm takes "
                      "fp8/fp4 for both operands)")
        if s == "w8a16":
            return no("no torch CUDA op for int8 weights x 16-bit activations (aten._weight_int8pack_mm is "
                      "CPU/MPS only)")
        if s == "w4a8":
            return no("no torch CUDA op for int4 weights x int8 activations (aten._dyn_quant_matmul_4bit is CPU only)")
        if s == "w4a16-moe":
            return no("no torch CUDA fused-MoE op")
        return no(f"scheme {s} is not implemented by the cuda backend")

    def _can_w4a16(self, case: Case) -> Support:
        if case.weight_format not in ("gptq", "awq", "ct-pack-quantized"):
            return no(f"tinygemm needs int4 codes; weight format {case.weight_format} has none")
        if case.bits != 4:
            return no(f"_weight_int4pack_mm is int4 only, got bits={case.bits}")
        if case.act_order:
            return no("_weight_int4pack_mm takes contiguous K groups and no g_idx (act order)")
        if case.act_dtype != "bfloat16":
            return no(f"_weight_int4pack_mm takes bfloat16 activations only (int4mm.cu: "
                      f"TORCH_CHECK(A.dtype() == at::kBFloat16)), got {case.act_dtype}")
        if case.output_dtype != "bfloat16":
            return no(f"_weight_int4pack_mm writes bfloat16 only, asked for {case.output_dtype}")
        g = case.group
        if g not in INT4PACK_GROUPS:
            what = f"group_size=-1 means G = K = {case.K}" if case.group_size in (-1, 0) else f"G = {g}"
            return no(f"_weight_int4pack_mm qGroupSize must be 32, 64, 128 or 256 ({what})")
        if case.K % g:
            return no(f"K = {case.K} is not a multiple of the group size {g}")
        if _inner_k_tiles(case.K, self.inner_k_tiles) is None:
            return no(f"K = {case.K} is not a multiple of 16 * innerKTiles "
                      f"({'32' if self.inner_k_tiles in (None, 'auto') else 16 * int(self.inner_k_tiles)})")
        if case.N % 8:
            return no(f"N = {case.N} is not a multiple of 8 (tinygemm n-tiles of 8)")
        if case.weight_format == "awq" and case.N % 8:
            return no("AWQ packs 8 columns per word")
        if case.bias and self.bias_mode == "refuse":
            return no("_weight_int4pack_mm has no bias operand and cuda:bias_mode=refuse was given (the default, "
                      "bf16_add, adds it to the bf16 output as torchao does)")
        return yes()

    def _can_w8a8(self, case: Case) -> Support:
        if case.weight_format != "ct-int-quantized":
            return no(f"W8A8 takes compressed-tensors int-quantized int8 weights, got {case.weight_format}")
        if case.M <= 16:
            return no(f"torch._int_mm on CUDA needs M > 16 (Blas.cpp: 'self.size(0) needs to be greater than 16'), "
                      f"got M = {case.M}")
        if case.K % 8:
            return no(f"torch._int_mm on CUDA needs K a multiple of 8, got K = {case.K}")
        if case.N % 8:
            return no(f"torch._int_mm on CUDA needs N a multiple of 8, got N = {case.N}")
        if case.output_dtype not in TORCH_DTYPE_NAMES:
            return no(f"unsupported output dtype {case.output_dtype}")
        return yes()

    # -- 3. declared --------------------------------------------------------------------------------
    def declared(self, case: Case) -> Declared:
        if case.scheme == "w4a16":
            # tinygemm's float zero point: w = fma_bf16(q - 8, bf16(s), bf16((8 - z) * bf16(s)))
            variants = {"weight_scale_dtype": "bfloat16", "dequant_order": "float_zero", "zero_dtype": "bfloat16"}
            notes = ("tinygemm: w = fma_bf16(q - 8, bf16(s), bf16((8 - z) * bf16(s))) (dequant_order=float_zero, "
                     "zero_dtype=bfloat16; canonical for z = 8); mma bf16 x bf16 -> fp32; output RNE to bf16")
            if case.bias:
                variants["bias_stage"] = "after_output_rounding"
                notes += "; bias added to the bf16 output in bf16, as torchao does (bias_stage=after_output_rounding)"
            return Declared(variants=variants, weight_dtype="bfloat16", act_compute_dtype=None, accumulate="float32",
                            output="bfloat16", notes=notes)
        if case.scheme == "w8a8":
            return Declared(
                variants={"act_rounding": "rne", "reciprocal": "divide", "act_scale_dtype": "float32",
                          "zero_row": "zero", "qmin": -128, "qmax": 127},
                weight_dtype="exact", act_compute_dtype=None, accumulate="int32", output=case.output_dtype,
                notes="activation quant in torch on the device (true fp32 divisions, torch.round); "
                      "cuBLASLt int8 GEMM -> int32; y = acc * x_scale * w_scale (+ bias) in fp32, RNE to output")
        raise ValueError(f"cuda: nothing declared for scheme {case.scheme}")

    # -- 4. prepare -----------------------------------------------------------------------------
    def prepare(self, case: Case, tensors: dict) -> Prepared:
        torch = _import_torch()
        if case.scheme == "w4a16":
            pk = tinygemm_pack(case, tensors)
            data = dict(pk)
            data["inner_k_tiles"] = _inner_k_tiles(case.K, self.inner_k_tiles)
            if cuda_state()["ok"]:
                dev = torch.device("cuda")
                data["int4pack"] = torch.ops.aten._convert_weight_to_int4pack(pk["packed_u8"].to(dev),
                                                                             data["inner_k_tiles"])
                data["sz_dev"] = pk["scales_and_zeros"].to(dev)
            return Prepared(case, data)
        if case.scheme == "w8a8":
            w = torch.as_tensor(np.ascontiguousarray(tensors["weight"], dtype=np.int8))
            ws = _f32(tensors["weight_scale"]).reshape(-1)
            data = {"weight": w, "weight_scale": ws}
            if cuda_state()["ok"]:
                data["weight_dev"] = w.cuda()
                data["weight_scale_dev"] = ws.cuda()
            return Prepared(case, data)
        raise ValueError(f"cuda: cannot prepare scheme {case.scheme}")

    # -- 5. run ---------------------------------------------------------------------------------
    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        torch = _import_torch()
        st = cuda_state()
        if not st["ok"]:
            raise RuntimeError(f"cuda backend unavailable: {st['reason']}")
        case = prepared.case
        d = prepared.data
        bias = inputs.get("bias")
        x32 = torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32)).cuda()
        with torch.no_grad():
            if case.scheme == "w4a16":
                a = x32.to(torch.bfloat16).contiguous()
                y = torch.ops.aten._weight_int4pack_mm(a, d["int4pack"], d["group"], d["sz_dev"])
                if bias is not None:
                    if self.bias_mode != "bf16_add":
                        raise RuntimeError("cuda w4a16 with a bias needs bias_mode=bf16_add")
                    y = y + torch.as_tensor(np.asarray(bias, np.float32)).cuda().to(torch.bfloat16)
            elif case.scheme == "w8a8":
                q, xs = quantize_act_int8(x32)
                acc = torch._int_mm(q, d["weight_dev"].t())
                y = acc.to(torch.float32) * xs
                y = y * d["weight_scale_dev"].reshape(1, -1)
                if bias is not None:
                    y = y + torch.as_tensor(np.asarray(bias, np.float32)).cuda()
                y = y.to(torch_dtype(case.output_dtype))
            else:
                raise ValueError(f"cuda: cannot run scheme {case.scheme}")
            torch.cuda.synchronize()
        return y.to(torch.float32).cpu().numpy()
