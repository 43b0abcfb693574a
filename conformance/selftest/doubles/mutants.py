"""Mutant backends: the emulator with one planted bug each (``qconform selftest``).

Semantics: docs/selftest.md. Each mutant computes a scheme the way a kernel with one
real-world bug would — a GPTQ v1 zero point read without its +1, AWQ nibbles in
sequential order, int8 activations rounded half away from zero, an MXFP4 scale one
E8M0 step low, a MoE that forgets to renormalize, ... — and *declares* the canonical
arithmetic of a correct fp32 kernel (int32 for the int8-activation schemes), as
``emulator:...,declare=canonical`` does. A few declare a non-default but correct
variant and break it (``int8-clamp-127`` declares asymmetric activations;
``mx-rule-B-for-A`` declares rule A and computes rule B; ``silent-fallback-*``
declare a non-canonical variant and return the emulator's canonical result for the
shapes their "kernel" does not support). The conformance suite must fail every one
of them: a surviving mutant is a gap in the suite.

Mutants never appear in the default registry or in ``qconform run``: ``qconform
selftest`` creates them directly or registers them for its workers with
``QCONFORM_EXTRA_BACKENDS="mutant=conformance.selftest.doubles.mutants:MutantBackend"``; the backend
spec is ``mutant:bug=<name>``. ``bug=none`` is the control: the same pipeline with no
bug, which must pass every case (it proves that the kills come from the bugs).

The pipeline (``MutantBackend.run``) is the emulator's reference arithmetic written
out once — dequantized weights, activations quantized by the scheme's rule, one
float64 product, one rounding to the output dtype — with a hook at each stage where a
mutant plants its bug. Each stage is exact or within float64 error, so the control is
inside every interval the canonical declaration allows. The stages and the bugs planted in
them live in mutant_stages.py; this module declares the mutants and runs the pipeline.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from emulator import moe as emoe
from emulator.activations import int8 as a8
from emulator.numerics.floats import round_to_dtype

from backends.base import SCHEMES, Case, Declared, Prepared
from backends.emulator import EmulatorBackend

from conformance.selftest.doubles.mutant_stages import (  # the pipeline's stages and the bugs planted in them
    as_f64, awq_n64, awq_sequential, bf16_accumulate, canonical_weight, codes_bug, fp16_bits_as_bf16,
    g_idx_ignored, group_off_by_one, int8_emulator, int8_local, k_tail, midpoint, mx_acts_in_a16, mx_emulator,
    mx_local, mx_neg_zero_unmasked, mx_qdq, mx_square_transposed, nibble_swap, stale_cache, transpose_square,
    weights_rounded,
)

__all__ = ["Mutant", "MUTANTS", "CONTROL", "MutantBackend", "mutant_names", "EXTRA_BACKENDS_ENTRY"]

#: what ``qconform selftest`` puts in QCONFORM_EXTRA_BACKENDS for its worker processes
EXTRA_BACKENDS_ENTRY = "mutant=conformance.selftest.doubles.mutants:MutantBackend"

INT_FORMATS = ("gptq", "awq", "ct-pack-quantized", "ct-int-quantized")


def _schemes_where(pred) -> tuple:
    """The names of the schemes (emulator/schemes.py, in their order) whose Scheme satisfies ``pred``."""
    return tuple(name for name, spec in SCHEMES.items() if pred(spec))


#: 16-bit activations (int or MXFP4 weights)
A16 = _schemes_where(lambda s: s.activations == "a16")
#: int4/int8 weights with 16-bit activations
A16_INT = _schemes_where(lambda s: s.activations == "a16" and s.weights in ("int4", "int8"))
INT8_ACTS = _schemes_where(lambda s: s.int8_activations)
#: linear layers whose int weights a checkpoint packs with zero points and groups (GPTQ / AWQ / CT pack)
PACKED_INT = _schemes_where(lambda s: s.activations != "moe"
                            and any(f in ("gptq", "awq", "ct-pack-quantized") for f in s.formats))
#: int4 linear layers (AWQ is a 4-bit format)
INT4_LINEAR = _schemes_where(lambda s: s.weights == "int4" and s.activations != "moe")
#: every scheme with 4-bit weight fields (int4 or MXFP4)
FOUR_BIT = _schemes_where(lambda s: s.weights in ("int4", "mxfp4"))
#: linear layers (every scheme but the fused MoE block)
LINEAR = _schemes_where(lambda s: s.activations != "moe")
#: what the silent-fallback mutants cover: the schemes where the fallback hooks apply
FALLBACK = tuple(name for name in SCHEMES if name != "w4a16-mxfp4")


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One planted bug: where it lives (``schemes`` and the ``live`` predicate, which the selftest
    uses to run only the cases the bug can affect), what it is, which public report it is modelled
    on, and the hooks that plant it in ``MutantBackend``'s pipeline (None: the canonical stage)."""

    name: str
    title: str
    source: str
    schemes: tuple
    live: Callable[[Case], bool] = lambda c: True
    declare: Callable[[Case], dict] | None = None  # Declared fields other than the canonical ones
    tensors: Callable | None = None  # (case, tensors) -> tensors   the checkpoint as the kernel reads it
    weight: Callable | None = None  # (backend, case, tensors, w float64 [N, K]) -> w
    int8: Callable | None = None  # (case, x32) -> (q - zp float64 [M, K], scale float64 [M, 1])
    mx: Callable | None = None  # (case, x32) -> dequantized MXFP4 activations float64
    a16: Callable | None = None  # (case, x64) -> x64 as the A16 kernel uses it
    matmul: Callable | None = None  # (case, x64, w64) -> y float64
    bias: Callable | None = None  # (case, y, b) -> y
    output: Callable | None = None  # (case, y) -> y rounded to the output dtype
    moe: dict = dataclasses.field(default_factory=dict)  # MoE knobs (see _moe)
    fallback: Callable[[Case], bool] | None = None  # True: the "kernel" cannot: return the emulator's result

    def applies(self, case: Case) -> bool:
        return case.scheme in self.schemes and bool(self.live(case))


# -- declarations ---------------------------------------------------------------------------------
def _decl(**variants):
    return lambda case: {"variants": dict(variants)}


def _fallback_declaration(case: Case) -> dict:
    """The non-canonical variant each scheme's "kernel" claims (observable where it differs)."""
    if case.scheme in INT8_ACTS:
        return {"variants": {"act_rounding": "rhaz"}}
    if case.scheme == "w4a4-mxfp4":
        return {"variants": {"mx_scale_rule": "rceil"}}
    if case.scheme == "w4a16-moe":
        return {"variants": {"moe_renormalize": False}}
    return {"variants": {}, "weight_dtype": "bfloat16"}


def _fallback_int8(case, x32):
    return int8_emulator(a8.Int8ActVariant(rounding="rhaz"))(case, x32)


def _fallback_weight(backend, case, t, w):
    from conformance.judge.acceptance import declared_weight

    return declared_weight(case, t, Declared(variants={}, weight_dtype="bfloat16")).astype(np.float64)


# -- the mutants ------------------------------------------------------------------------------------
def _gptq(c):
    return c.weight_format == "gptq"


def _int_fmt(c):
    return c.weight_format in INT_FORMATS


def _grouped(c):
    return c.group_size not in (-1, 0) and c.K // c.group > 1


_MX_RULES = ("floor", "even", "rceil", "ceil")


def _rule_pairs() -> list[Mutant]:
    out = []
    for declared in _MX_RULES:
        for computed in _MX_RULES:
            if declared == computed:
                continue
            out.append(Mutant(
                f"mx-rule-{computed}-for-{declared}",
                f"MXFP4 activation scale computed with the {computed.upper()} rule while {declared.upper()} is declared",
                "research notes §1.6: FLOOR (OCP), EVEN (Quark, vLLM reference, CUTLASS after vllm PR #43557), "
                "RCEIL (torchao, XPU mxfp4_quant.h), CEIL; docs/backends/xpu.md",
                ("w4a4-mxfp4",),
                declare=(lambda case, d=declared: {"variants": {} if d == "floor" else {"mx_scale_rule": d}}),
                mx=mx_emulator(scale_rule=computed)))
    return out


MUTANT_LIST: list[Mutant] = [
    # --- integer weights: zero points, packing, groups, scales
    Mutant("gptq-v1-no-plus1", "GPTQ v1 zero point read without the +1 (z = field)",
           "docs/backends/ark.md discrepancy 1 (vLLM INC/ARK glue builds auto-round QuantLinear with ZP_BIAS = 0)",
           PACKED_INT, live=lambda c: _gptq(c) and c.zero_convention != "v2",
           weight=codes_bug(lambda case, t, q, z, s, g: (q, z - 1, s, g))),
    Mutant("gptq-v2-as-v1", "GPTQ v2 (gptq_v2) checkpoint read as v1 (z = field + 1)",
           "vllm-project/vllm#26343, PR #26092 (v2 checkpoints given the v1 +1: '!!!' output)",
           PACKED_INT, live=lambda c: _gptq(c) and c.zero_convention == "v2",
           weight=codes_bug(lambda case, t, q, z, s, g: (q, z + 1, s, g))),
    Mutant("qzeros-ignored-asym", "asymmetric model run by a symmetric kernel: zero points ignored (midpoint used)",
           "research notes §1.1/§4 (gptq_marlin uint4b8 / XPU oneDNN read no qzeros; must refuse sym=False)",
           PACKED_INT,
           live=lambda c: c.weight_format in ("gptq", "awq", "ct-pack-quantized") and not (c.sym and c.weight_format != "awq"),
           weight=codes_bug(lambda case, t, q, z, s, g: (q, np.full_like(z, midpoint(case)), s, g))),
    Mutant("sym-qzeros-ignored", "symmetric GPTQ model whose qzeros are not 0x77777777: qzeros ignored",
           "emulator GptqZeroRead.IGNORE_QZEROS (vLLM gptq_marlin uint4b8, XPU oneDNN) on a sym checkpoint with "
           "non-midpoint qzeros", PACKED_INT, live=lambda c: _gptq(c) and c.sym,
           weight=codes_bug(lambda case, t, q, z, s, g: (q, np.full_like(z, 1 << (case.bits - 1)), s, g))),
    Mutant("awq-sequential", "AWQ qweight and qzeros unpacked in sequential nibble order (no AWQ reorder)",
           "docs/formats/awq.md (AWQ_PACK_ORDER 0,2,4,6,1,3,5,7); vLLM awq_triton reverse order",
           INT4_LINEAR, live=lambda c: c.weight_format == "awq",
           weight=codes_bug(lambda *a: awq_sequential(*a, weights=True, zeros=True))),
    Mutant("awq-zeros-not-reordered", "AWQ qweight converted to GPTQ order but qzeros copied unchanged",
           "docs/backends/ark.md discrepancy 2 (vLLM ARK glue: AWQ asym zero points permuted within 8 columns)",
           INT4_LINEAR, live=lambda c: c.weight_format == "awq",
           weight=codes_bug(lambda *a: awq_sequential(*a, weights=False, zeros=True))),
    Mutant("nibbles-swapped", "the two 4-bit fields of every weight byte swapped (high nibble read as element 2j)",
           "research notes §1.6/§1.7 (low nibble = even element: vLLM upcast_fp4, test_fused_moe_wn16 packing)",
           FOUR_BIT,
           live=lambda c: c.bits == 4 and c.weight_format != "ct-int-quantized", tensors=nibble_swap),
    Mutant("g-idx-ignored", "act-order g_idx ignored: group of channel k taken as k // G",
           "vllm-project/vllm#7374 (desc_act GPTQ: act-order g_idx mishandled, nonsense output)",
           PACKED_INT, live=lambda c: c.act_order, tensors=g_idx_ignored),
    Mutant("group-off-by-one", "group index off by one at group boundaries: channel k uses group (k + 1) // G",
           "a classic indexing bug of grouped kernels (the last channel of each group takes the next group's "
           "scale and zero)", PACKED_INT, live=lambda c: _int_fmt(c) and _grouped(c) and not c.act_order,
           weight=codes_bug(group_off_by_one)),
    Mutant("scales-transposed-square", "scale matrix read transposed; shape checks pass when it is square",
           "research notes §3 item 5 (vllm PR #33200: zero points passed in the wrong layout); "
           "docs/backends/vllm-cpu.md discrepancy 6 (AWQ scales as a transposed view)",
           PACKED_INT + _schemes_where(lambda s: s.weights == "mxfp4"),
           live=lambda c: (c.weight_format == "ct-mxfp4" and c.N == c.K // 32)
           or (c.weight_format in ("gptq", "awq", "ct-pack-quantized") and c.N == c.K // c.group),
           weight=lambda b, case, t, w: (mx_square_transposed(b, case, t, w) if case.weight_format == "ct-mxfp4"
                                         else codes_bug(transpose_square)(b, case, t, w))),
    Mutant("fp16-scales-as-bf16", "float16 weight scales read as bfloat16 bits",
           "docs/backends/zentorch.md discrepancy 2 (zentorch_woq_linear accepts fp16 scales, returns garbage)",
           PACKED_INT,
           live=lambda c: c.weight_format in ("gptq", "awq", "ct-pack-quantized") and c.scale_dtype == "float16",
           weight=codes_bug(fp16_bits_as_bf16)),
    Mutant("weights-bf16", "W4A16/W8A16 weights dequantized in bf16 (RNE) while exact fp32 weights are declared",
           "docs/backends/cuda.md (tinygemm forms weights in bf16) declared as fp32",
           A16_INT, live=_int_fmt, weight=weights_rounded("rne")),
    Mutant("weights-bf16-truncated", "weights converted fp32 -> bf16 by truncation (dropping the low 16 bits)",
           "docs/backends/vllm-cpu.md discrepancy 3 (the _C_AVX512 build truncates fp32 -> bf16)",
           A16_INT, live=_int_fmt, weight=weights_rounded("rtz")),
    Mutant("stale-weight-cache", "weight cache keyed by address/shape: a new weight of the same shape is ignored",
           "docs/backends/zentorch.md discrepancy 1 (ZenDNN weight cache keyed by the tensor's address)",
           PACKED_INT, live=_int_fmt, weight=stale_cache),
    Mutant("awq-n64-tile", "AWQ GEMM with N % 128 == 64: the last 32 output columns written from the wrong results",
           "vllm-project/vllm#7400 and PR #13227 (awq gemm wrong when N is not a multiple of 128)",
           ("w4a16",), live=lambda c: c.weight_format == "awq" and c.N % 128 == 64, weight=awq_n64),
    Mutant("int8pack-k-tail", "bf16 int8-weight GEMM steps K by 16 with no tail: reads past each row when K % 16 != 0",
           "docs/backends/torch-cpu.md P4 (torch _weight_int8pack_mm, AVX512 bf16 kernel)",
           ("w8a16",), live=lambda c: c.act_dtype == "bfloat16" and c.K % 16 != 0, matmul=k_tail),
    # --- bias, accumulation, output
    Mutant("bias-dropped", "bias ignored", "docs/backends/cuda.md (tinygemm has no bias: bias_mode)",
           LINEAR, live=lambda c: c.bias,
           bias=lambda case, y, b: y),
    Mutant("bias-twice", "bias added twice (in the kernel epilogue and again by the engine)",
           "docs/backends/torch-cpu.md (engine adds the bias after the kernel: bias_stage)",
           LINEAR, live=lambda c: c.bias,
           bias=lambda case, y, b: y + 2 * b),
    Mutant("accumulate-bf16", "partial sums accumulated in bf16 while fp32 accumulation is declared",
           "research notes §2 (vLLM tests' bf16 references hide it); an accumulator of the activation dtype",
           A16, matmul=bf16_accumulate),
    Mutant("output-truncated-fp16", "fp32 accumulator converted to the fp16 output by truncation, not RNE",
           "docs/backends/vllm-cpu.md discrepancy 3 and torch-cpu.md (truncating stores, output_rounding=rtz) "
           "while rne is declared",
           LINEAR,
           live=lambda c: c.output_dtype == "float16",
           output=lambda case, y: round_to_dtype(y, case.output_dtype, "rtz")),
    # --- int8 activations
    Mutant("int8-rhaz", "int8 activation codes rounded half away from zero instead of RNE",
           "docs/backends/torch-cpu.md (KleidiAI qa8dx roundf); research notes §1.5", INT8_ACTS,
           int8=int8_emulator(a8.Int8ActVariant(rounding="rhaz"))),
    Mutant("int8-rtz", "int8 activation codes truncated toward zero", "research notes §1.5 (truncating casts)",
           INT8_ACTS, int8=int8_emulator(a8.Int8ActVariant(rounding="rtz"))),
    Mutant("int8-clamp-127", "azp int8 activations clamped to [-127, 127] instead of [-128, 127]",
           "research notes §1.5 (symmetric-range clamps in asymmetric paths); declared: act_symmetric=false "
           "(vLLM dynamic_scaled_int8_azp_quant), where every row's minimum maps to -128", INT8_ACTS,
           declare=_decl(act_symmetric=False),
           int8=int8_emulator(a8.Int8ActVariant(symmetric=False, qmin=-127, qmax=127))),
    Mutant("int8-recip-scale", "x * fl32(1 / scale) instead of x / scale",
           "emulator Reciprocal.RECIP_SCALE (vLLM x86 oneDNN path, torchao) declared as division",
           INT8_ACTS, int8=int8_emulator(a8.Int8ActVariant(reciprocal="recip_scale"))),
    Mutant("int8-recip-amax", "x * fl32(127 / amax) instead of x / scale",
           "emulator Reciprocal.RECIP_AMAX (vLLM CUDA dynamic kernel, Triton, SGL CPU) declared as division",
           INT8_ACTS, int8=int8_emulator(a8.Int8ActVariant(reciprocal="recip_amax"))),
    Mutant("int8-scale-recip-mul", "scale = fl32(amax * fl32(1/127)) instead of fl32(amax / 127)",
           "docs/backends/ark.md discrepancy 4 (ARK DnnlWrapper::dyn_quant_s8); docs/backends/cuda.md "
           "(tensor / 127.0 multiplies by the reciprocal)", INT8_ACTS, int8=int8_local(scale_formula="recip_mul")),
    Mutant("int8-zero-row-nan", "zero activation row: 0 / 0 = NaN codes propagate (no zero guard)",
           "emulator ZeroRowRule.NAN (x86 oneDNN path has no guard); a torch reference without eps",
           INT8_ACTS, live=lambda c: c.M > 1, int8=int8_local(zero_row="nan")),
    Mutant("int8-scale-bf16", "activation scale rounded to bf16 before use",
           "research notes §1.5 (XPU reference scale and zentorch scales in bf16)", INT8_ACTS,
           int8=int8_emulator(a8.Int8ActVariant(scale_dtype="bfloat16"))),
    Mutant("int8-per-tensor", "one activation scale for the whole tensor instead of one per token",
           "docs/backends/ark.md discrepancy 4 (ARK woqgemm_s8 is W8A8 with a per-tensor activation scale)",
           INT8_ACTS, live=lambda c: c.M > 1, int8=int8_local(per_tensor=True)),
    # --- MXFP4
    *_rule_pairs(),
    Mutant("mx-scale-one-step-low", "MXFP4 activation scale byte one E8M0 step low",
           "ROCm/FlyDSL PR #590 (scales one E8M0 step low on 67.9 % of bytes, gsm8k 0.670 -> 0.485)",
           ("w4a4-mxfp4",), mx=mx_local(byte_delta=-1)),
    Mutant("e2m1-rhaz", "E2M1 activation elements rounded half away from zero instead of RNE",
           "research notes §1.6 (RNE in the vLLM reference; threshold encoders)", ("w4a4-mxfp4",),
           mx=mx_emulator(element_rounding="rhaz")),
    Mutant("e2m1-nan-six", "NaN activation element encoded as +6 and skipped by the block amax",
           "docs/backends/xpu.md (XPU mxfp4_quant: fmax/fmin clamp before the sign test, NaN -> +6)",
           ("w4a4-mxfp4",), live=lambda c: c.M > 3, mx=mx_emulator(element_nan="saturate", nan_block="ignore")),
    Mutant("mx-zero-block-eps", "zero-block rule implemented as an epsilon floor on amax (6e-10)",
           "docs/backends/xpu.md (local_absmax starts at eps: every block below 6e-10 gets 2**-33)",
           ("w4a4-mxfp4",), mx=mx_local(amax_floor=6e-10)),
    Mutant("mx-neg-zero-unmasked", "E2M1 -0 weight lost by the zero mask of an exponent-add dequantizer",
           "vLLM sgl-kernels vec.h cvt_mxfp4_e2m1_bf16_intrinsic_lut (zero mask on x & 0x7FFF; "
           "research notes §1.6) with the mask on the raw bits", ("w4a16-mxfp4", "w4a4-mxfp4"),
           weight=mx_neg_zero_unmasked),
    Mutant("mxfp4-w4a16-quantizes-acts", "CT MXFP4 W4A16 run as W4A4: activations quantized to MXFP4",
           "vllm-project/vllm#56770 (CT MXFP4 W4A16 misclassified as W4A4 on SM100+)", ("w4a16-mxfp4",),
           a16=mx_acts_in_a16),
    # --- MoE
    Mutant("moe-no-renormalize", "top-k routing weights not renormalized", "research notes §1.7 (renormalize)",
           ("w4a16-moe",), moe={"renormalize": False}),
    Mutant("moe-gate-up-swapped", "w13 halves swapped: up taken as the gate",
           "research notes §1.7 (gate = first half of w13; KleidiAI SwiGLU_Ug comment)", ("w4a16-moe",),
           moe={"gate_up_swapped": True}),
    Mutant("moe-topk-tie-reversed", "equal router probabilities broken toward the higher expert index",
           "research notes §1.7 (torch.topk tie order unspecified)", ("w4a16-moe",), moe={"tie_reversed": True}),
    Mutant("moe-wrong-expert", "expert e computed with the weights of expert (e + 1) mod E",
           "research notes §3 items 2-3 (expert/shard index mapping errors under TP/EP)", ("w4a16-moe",),
           moe={"expert_offset": 1}),
    Mutant("moe-int8-acts", "W4A16 MoE that quantizes both GEMM inputs to int8 per token",
           "docs/backends/vllm-cpu.md discrepancy 4 (CPU 'W4A16' MoE runs INT4_W4A8)", ("w4a16-moe",),
           moe={"int8_acts": True}),
    Mutant("moe-w2-group-from-w13", "w2 dequantized with w13's group size (channel-wise, I != K)",
           "docs/backends/vllm-cpu.md discrepancy 5 (fused_experts_cpu reuses w13's group size for w2)",
           ("w4a16-moe",), live=lambda c: c.group_size in (-1, 0) and c.N != c.K, moe={"w2_group_bug": True}),
    # --- a kernel that does not run
    Mutant("silent-fallback-ntail", "declares a non-canonical variant; returns the emulator's canonical result "
           "when N % 64 != 0 (its 'unsupported' shapes)",
           "vllm PR #45136 (XPU WNA16 MoE silently fell back to another kernel); min_thread_n tiling limits",
           FALLBACK,
           live=lambda c: c.scheme not in A16_INT or _int_fmt(c),
           declare=_fallback_declaration, fallback=lambda c: c.N % 64 != 0, int8=_fallback_int8,
           mx=mx_emulator(scale_rule="rceil"), weight=lambda b, c, t, w: (_fallback_weight(b, c, t, w)
                                                                          if c.scheme in A16_INT else w),
           moe={"renormalize": False}),
    Mutant("silent-fallback-m1", "declares a non-canonical variant; returns the emulator's canonical result "
           "for M = 1 (decode)",
           "docs/backends/ark.md (woqgemm M = 1 only) and cuda.md (_int_mm needs M > 16): a wrapper that falls "
           "back silently", FALLBACK,
           live=lambda c: c.scheme not in A16_INT or _int_fmt(c),
           declare=_fallback_declaration, fallback=lambda c: c.M == 1, int8=_fallback_int8,
           mx=mx_emulator(scale_rule="rceil"), weight=lambda b, c, t, w: (_fallback_weight(b, c, t, w)
                                                                          if c.scheme in A16_INT else w),
           moe={"renormalize": False}),
]

#: the control: the pipeline with no bug (must pass everything)
CONTROL = Mutant("none", "no bug (control)", "-", tuple(SCHEMES))

MUTANTS: dict[str, Mutant] = {m.name: m for m in MUTANT_LIST}
assert len(MUTANTS) == len(MUTANT_LIST), "duplicate mutant names"


def mutant_names() -> list[str]:
    return [m.name for m in MUTANT_LIST]


def get(name: str) -> Mutant:
    if name == CONTROL.name:
        return CONTROL
    if name not in MUTANTS:
        raise ValueError(f"unknown mutant {name!r}; known: {', '.join(MUTANTS)} (and the control 'none')")
    return MUTANTS[name]


# -- the backend ------------------------------------------------------------------------------------
class MutantBackend(EmulatorBackend):
    """``mutant:bug=NAME``: the emulator's arithmetic with the named bug planted (module docstring)."""

    name = "mutant"
    covers = "a deliberately buggy emulator for qconform selftest (never a real kernel)"
    priority = -1000

    def __init__(self, **params: str):
        bug = params.pop("bug", None)
        if bug is None:
            raise ValueError(f"mutant: say which bug (mutant:bug=NAME); known: {', '.join(MUTANTS)}")
        super().__init__(**params)
        self.mutant = get(bug)
        self.params["bug"] = bug  # part of the label
        self.state: dict = {}
        self._emulator = EmulatorBackend()

    def declared(self, case: Case) -> Declared:
        kw = {"variants": {}}
        if self.mutant.declare is not None:
            kw.update(self.mutant.declare(case))
        acc = "int32" if case.scheme in INT8_ACTS else "float32"
        return Declared(accumulate=acc, output=case.output_dtype,
                        notes=f"mutant {self.mutant.name}: {self.mutant.title}", **kw)

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        return Prepared(case, {"tensors": tensors})

    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        m, case = self.mutant, prepared.case
        t = prepared.data["tensors"]
        bias, logits = inputs.get("bias"), inputs.get("router_logits")
        if m.fallback is not None and m.fallback(case):
            p = self._emulator.prepare(case, t)
            return np.asarray(self._emulator.run(p, x, bias=bias, router_logits=logits), np.float32)
        if m.tensors is not None:
            t = m.tensors(case, t)
        x32 = np.asarray(x, np.float32)
        if case.scheme == "w4a16-moe":
            return _moe(case, t, x32, logits, m.moe).astype(np.float32)
        b = None if bias is None else np.asarray(bias, np.float64)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            if case.scheme == "w8a8":
                y = self._w8a8(case, t, x32)
            else:
                w = canonical_weight(case, t)
                if m.weight is not None:
                    w = m.weight(self, case, t, w)
                xe = self._acts(case, x32)
                y = m.matmul(case, xe, w) if m.matmul is not None else xe @ w.T
            if b is not None:
                y = m.bias(case, y, b) if m.bias is not None else y + b
            out = m.output(case, y) if m.output is not None else round_to_dtype(y, case.output_dtype)
        return np.asarray(out, np.float32)

    def _acts(self, case: Case, x32: np.ndarray) -> np.ndarray:
        m = self.mutant
        if case.scheme == "w4a8":
            q, s = (m.int8 or int8_emulator(_canonical_int8(case)))(case, x32)
            return q * s
        if case.scheme == "w4a4-mxfp4":
            return (m.mx or (lambda c, v: mx_qdq(v)))(case, x32)
        x64 = x32.astype(np.float64)
        return m.a16(case, x64) if m.a16 is not None else x64

    def _w8a8(self, case: Case, t: dict, x32: np.ndarray) -> np.ndarray:
        """Integer codes times both scales, as the exact reference: (q_x - zp) @ q_w^T * (s_x s_w)."""
        m = self.mutant
        q, s = (m.int8 or int8_emulator(_canonical_int8(case)))(case, x32)
        wq = np.asarray(t["weight"]).astype(np.float64)
        ws = as_f64(t["weight_scale"]).reshape(1, -1)
        return (q @ wq.T) * (s * ws)


def _canonical_int8(case: Case) -> "a8.Int8ActVariant":
    """The canonical activation quantizer of the case: symmetric, or azp for asymmetric W8A8."""
    return a8.CANONICAL_SYM if case.act_symmetric else a8.CANONICAL_ASYM


def _moe(case: Case, t: dict, x32: np.ndarray, logits, knobs: dict) -> np.ndarray:
    """The fused-MoE forward of emulator/moe.py written out with the knobs mutants turn."""
    E, I, k = case.E, case.N, case.top_k
    w13 = emoe.dequantize_gptq_experts(emoe.GptqExperts(t["w13_qweight"], t["w13_scales"], group_size=case.group))
    w13 = w13.astype(np.float64)
    s2 = np.asarray(t["w2_scales"])
    if knobs.get("w2_group_bug") and s2.shape[1] == 1:
        # one group_size = K / G13 derived from w13 reused for w2 (in-dim I < K): zero groups, every
        # output block reads the first block's scales
        s2 = s2[:, :, np.arange(s2.shape[2]) % 32]
    w2 = emoe.dequantize_gptq_experts(emoe.GptqExperts(t["w2_qweight"], s2, group_size=case.moe_w2_group_size),
                                      tensor="w2").astype(np.float64)
    r = np.asarray(logits, np.float64)
    z = np.exp(r - r.max(axis=1, keepdims=True))
    p = z / z.sum(axis=1, keepdims=True)
    if knobs.get("tie_reversed"):
        order = (E - 1) - np.argsort(-p[:, ::-1], axis=1, kind="stable")
    else:
        order = np.argsort(-p, axis=1, kind="stable")
    ids = order[:, :k]
    wts = np.take_along_axis(p, ids, axis=1)
    if knobs.get("renormalize", True):
        wts = wts / wts.sum(axis=1, keepdims=True)
    act = case.act_dtype
    qdq = int8_emulator(a8.CANONICAL_SYM)
    x = x32.astype(np.float64)
    if knobs.get("int8_acts"):
        q, s = qdq(case, x32)
        x = q * s
    y = np.zeros((x.shape[0], case.K))
    for m in range(x.shape[0]):
        for j in range(k):
            e = (int(ids[m, j]) + knobs.get("expert_offset", 0)) % E
            h = x[m] @ w13[e].T
            gate, up = h[:I], h[I:]
            if knobs.get("gate_up_swapped"):
                gate, up = up, gate
            a = round_to_dtype(gate / (1.0 + np.exp(-gate)) * up, act)
            if knobs.get("int8_acts"):
                q, s = qdq(case, a[None, :].astype(np.float32))
                a = (q * s)[0]
            y[m] += wts[m, j] * (a @ w2[e].T)
    return round_to_dtype(y, case.output_dtype)
