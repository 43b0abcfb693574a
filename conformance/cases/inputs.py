"""Build the inputs of a case: canonical checkpoint tensors, activations, bias, router logits.

Semantics: docs/conformance.md#cases. Every tensor is made by the emulator's
own quantizers and packers from seeded weights, so the checkpoint tensors are
exactly what the real toolkits write (see docs/formats/*).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from backends.base import Case
from emulator.formats import awq, compressed_tensors as ct, gptq, mxfp4
from emulator.numerics.floats import round_to_dtype
from emulator.synthetic import make_weight, tiny_amplitude

__all__ = ["CaseInputs", "make_inputs", "weight_tensors"]


@dataclasses.dataclass
class CaseInputs:
    case: Case
    seed: int
    tensors: dict  # canonical checkpoint tensors, by checkpoint name (no layer prefix)
    x: np.ndarray  # float32 array holding act_dtype values [M, K]
    bias: np.ndarray | None = None  # float32 holding act_dtype values [N]
    router_logits: np.ndarray | None = None  # MoE: float32 [M, E]
    weight_fp: np.ndarray | None = None  # the float weight the tensors were quantized from


def _round(a: np.ndarray, dtype: str) -> np.ndarray:
    return round_to_dtype(a, dtype).astype(np.float32)


def ct_tensor_dict(t) -> dict:
    """compressed-tensors pack-quantized tensors by their checkpoint names (optional ones only if present)."""
    out = {"weight_packed": t.weight_packed, "weight_scale": t.weight_scale,
           "weight_shape": np.asarray(t.weight_shape, dtype=np.int64)}
    if t.weight_zero_point is not None:
        out["weight_zero_point"] = t.weight_zero_point
    if t.weight_g_idx is not None:
        out["weight_g_idx"] = t.weight_g_idx
    return out


def weight_tensors(case: Case, w: np.ndarray, seed: int) -> dict:
    """Quantize w [N, K] into the canonical checkpoint tensors of ``case.weight_format``."""
    fmt = case.weight_format
    sd = case.scale_dtype
    if fmt == "gptq":
        p = gptq.GptqParams(bits=case.bits, group_size=case.group_size, sym=case.sym, desc_act=case.act_order,
                            zero_convention=case.gptq_zero_convention)
        g_idx = None
        if case.act_order:
            g_idx = (np.random.default_rng(seed + 1).permutation(case.K) // case.group).astype(np.int32)
        t = gptq.quantize_gptq(w, p, g_idx, scale_dtype=sd,
                               v1_zero_write="raise" if case.sym else "packed_sub")
        g = t.g_idx if t.g_idx is not None else (np.arange(case.K) // case.group).astype(np.int32)
        return {"qweight": t.qweight, "qzeros": t.qzeros, "scales": t.scales, "g_idx": np.asarray(g, np.int32)}
    if fmt == "awq":
        t = awq.quantize_awq(w, awq.AwqParams(bits=4, group_size=case.group_size), scale_dtype=sd)
        return {"qweight": t.qweight, "qzeros": t.qzeros, "scales": t.scales}
    if fmt == "ct-pack-quantized":
        channel = case.group_size in (-1, 0)
        p = ct.CtPackParams(num_bits=case.bits, strategy="channel" if channel else "group",
                            group_size=None if channel else case.group_size, symmetric=case.sym,
                            actorder=case.act_order)
        g_idx = None
        if case.act_order:
            g_idx = (np.random.default_rng(seed + 1).permutation(case.K) // case.group).astype(np.int32)
        return ct_tensor_dict(ct.quantize_ct_packed(w, p, g_idx=g_idx, scale_dtype=sd))
    if fmt == "ct-int-quantized":
        t = ct.quantize_ct_int8(w, scale_dtype=sd)
        return {"weight": t.weight, "weight_scale": t.weight_scale}
    if fmt == "ct-mxfp4":
        codes, sb = mxfp4.quantize_mxfp4(w)
        return mxfp4.pack_mxfp4_ct(codes, sb)
    raise ValueError(f"no weight builder for format {fmt!r}")


def make_inputs(case: Case, seed: int = 0) -> CaseInputs:
    """Seeded inputs for ``case`` (weights with planted degenerate groups, Gaussian activations)."""
    rng = np.random.default_rng(seed)
    x = _round(rng.standard_normal((case.M, case.K)), case.act_dtype)
    if case.spec.quantize_only:  # activations alone: no weights (docs/conformance.md#quantize-only-cases)
        return CaseInputs(case, seed, {}, x)
    bias = _round(rng.standard_normal(case.N) * 0.1, case.act_dtype) if case.bias else None
    if case.spec.activations == "moe":
        E, I = case.E, case.N
        w13 = np.stack([make_weight(2 * I, case.K, seed + 10 + e, group=case.group) for e in range(E)])
        # w2's input dimension is I: channel-wise stays channel-wise (one group of I), not a group of K
        g2 = I if case.channelwise else min(case.group, I)
        w2 = np.stack([make_weight(case.K, I, seed + 50 + e, group=g2) for e in range(E)])
        p = gptq.GptqParams(bits=4, group_size=case.group_size, sym=True)
        t13 = [gptq.quantize_gptq(w13[e], p, scale_dtype=case.scale_dtype) for e in range(E)]
        p2 = gptq.GptqParams(bits=4, group_size=case.moe_w2_group_size, sym=True)
        t2 = [gptq.quantize_gptq(w2[e], p2, scale_dtype=case.scale_dtype) for e in range(E)]
        tensors = {"w13_qweight": np.stack([t.qweight for t in t13]), "w13_scales": np.stack([t.scales for t in t13]),
                   "w2_qweight": np.stack([t.qweight for t in t2]), "w2_scales": np.stack([t.scales for t in t2])}
        logits = rng.standard_normal((case.M, E)).astype(np.float32)
        return CaseInputs(case, seed, tensors, x, None, logits, None)
    w = make_weight(case.N, case.K, seed + 3, group=case.group, tiny=_tiny(case))
    return CaseInputs(case, seed, weight_tensors(case, w, seed), x, bias, None, w)


def _tiny(case: Case) -> float:
    """The planted tiny group's amplitude: as small as the case's scale dtype can store (8-bit weights
    with float16 scales get a larger one than 4-bit weights, or their scales would underflow)."""
    bits = 8 if case.weight_format == "ct-int-quantized" else case.bits
    return tiny_amplitude(bits, case.scale_dtype)
