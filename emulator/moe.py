"""W4A16 mixture-of-experts reference (fused-MoE semantics of vLLM).

Semantics: docs/formats/moe.md.

For each token m with router logits r[m, :E]:

1. p = softmax(r) (evaluated in float64; kernels use fp32);
2. the top-k experts by p, ties broken toward the lower expert index;
3. weights = p[topk], divided by their sum when ``renormalize``;
4. per chosen expert e: h = x @ W13[e]^T  (W13[e] is [2I, K]: gate rows 0..I-1,
   then up rows I..2I-1), a = silu(gate) * up, rounded to the intermediate
   dtype (the activation dtype: fused-MoE kernels store it in a buffer of that type),
   o_e = a @ W2[e]^T  (W2[e] is [K, I]), used exactly (``expert_output_dtype``: rounded first);
5. y[m] = sum_j weights_j * o_{e_j}, rounded once to the output dtype.

Weights are the exact dequantized expert matrices (any int4 format), so the
MoE semantics stay independent of the weight format. ``MoeVariant`` names the
choices kernels make differently, among them int8-quantized GEMM inputs
(``act_quant``: a W4A8 MoE, vLLM CPU ``fused_experts_cpu`` INT4_W4A8): x and
the intermediate a are replaced by their per-token int8 quantize-dequantize
(``activations.int8``) before the GEMM that consumes them.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np

from .activations import int8 as a8
from .errors import require
from .formats.int_common import CANONICAL_DEQUANT, DequantVariant
from .linear import LinearResult, dtype_name, gamma, round_output
from .numerics.floats import round_to_dtype
from .numerics.rounding import as_float64

__all__ = ["GateUpOrder", "MoeVariant", "CANONICAL", "route", "moe_w16", "GptqExperts", "dequantize_gptq_experts",
           "moe_gptq_w4a16"]


class GateUpOrder(str, enum.Enum):
    """How the fused w13 rows split into gate and up halves."""

    GATE_UP = "gate_up"  # canonical: rows [0, I) gate, [I, 2I) up (vLLM FusedMoE w13)
    UP_GATE = "up_gate"  # halves swapped
    INTERLEAVED = "interleaved"  # gate = even rows, up = odd rows (gpt-oss gate_up_proj)


@dataclasses.dataclass(frozen=True)
class MoeVariant:
    """Choices of the fused-MoE forward. Defaults are canonical.

    - ``gate_up_dtype``: the dtype the first GEMM's output h (gate and up) is rounded to (RNE) before
      SiLU * up; None (canonical): h is used exactly. vLLM's fused-MoE kernels store h in a buffer of
      the activation dtype (``intermediate_cache0`` / ``ic0``).
    - ``expert_output_dtype``: the dtype each expert's output o_e = a @ W2[e]^T is rounded to (RNE) before
      the weighted sum; None (canonical): o_e is used exactly; "activation": the activation dtype.
      vllm-xpu-kernels stores o_e in ``gemm2_output`` (activation dtype) and ``moe_gather`` sums
      w_j * o_e in fp32 (``fused_moe_interface.py``, ``csrc/moe/moe_gather.cpp``).
    - ``expert_output_weighted``: with ``expert_output_dtype``, the routing weight multiplies o_e
      first and the product w_j * o_e is what is rounded; the sum adds the rounded products. vLLM CPU
      ``moe_int4.cpp``: ``copy_mul_stub`` stores fp32 C * weight in ``intermediate_cache2`` (activation
      dtype), ``sum_stub`` adds the top-k rows.
    - ``act_quant``: an ``Int8ActVariant`` (or a dict of its fields): both GEMM inputs are quantized
      per token with it and used dequantized, ``x -> (q_x - zp_x) s_x`` before the first GEMM and
      ``a -> (q_a - zp_a) s_a`` (one scale per token and chosen expert) before the second; None
      (canonical): the GEMMs take x and a as they are (W4A16). vLLM CPU ``fused_experts_cpu`` with
      ``CPUQuantMethod.INT4_W4A8`` (``csrc/cpu/sgl-kernels/moe_int4.cpp``: ``quantize_row_int8`` of the
      hidden states, stage 0, and of ``silu_and_mul``'s output, stage 1.5).
    """

    renormalize: bool = True
    gate_up: GateUpOrder = GateUpOrder.GATE_UP
    tie_lower_index_first: bool = True
    intermediate_dtype: str | None = None  # None: the activation dtype; "float64": no rounding
    gate_up_dtype: str | None = None
    expert_output_dtype: str | None = None  # None: exact; "activation": the activation dtype
    expert_output_weighted: bool = False
    act_quant: a8.Int8ActVariant | None = None

    def __post_init__(self):
        object.__setattr__(self, "gate_up", GateUpOrder(self.gate_up))
        if isinstance(self.act_quant, dict):
            object.__setattr__(self, "act_quant", a8.Int8ActVariant(**self.act_quant))

    def describe(self) -> dict:
        return {"renormalize": self.renormalize, "gate_up": self.gate_up.value,
                "tie_lower_index_first": self.tie_lower_index_first,
                "intermediate_dtype": self.intermediate_dtype, "gate_up_dtype": self.gate_up_dtype,
                "expert_output_dtype": self.expert_output_dtype, "expert_output_weighted": self.expert_output_weighted,
                "act_quant": None if self.act_quant is None else self.act_quant.describe()}


CANONICAL = MoeVariant()


def route(logits, top_k: int, variant: MoeVariant = CANONICAL) -> tuple[np.ndarray, np.ndarray]:
    """Softmax routing -> (expert ids int64 [M, top_k], weights float64 [M, top_k])."""
    r = as_float64(logits)
    require(r.ndim == 2, f"expected router logits [M, E], got shape {list(r.shape)}", tensor="router_logits")
    E = r.shape[1]
    require(1 <= top_k <= E, f"top_k={top_k} must be in [1, E={E}]", tensor="router_logits")
    require(bool(np.all(np.isfinite(r))), "NaN or Inf in router logits", tensor="router_logits")
    z = np.exp(r - r.max(axis=1, keepdims=True))
    p = z / z.sum(axis=1, keepdims=True)
    # Stable sort on -p keeps equal probabilities in index order (lower index first).
    order = np.argsort(-p, axis=1, kind="stable")
    if not variant.tie_lower_index_first:
        order = (E - 1) - np.argsort(-p[:, ::-1], axis=1, kind="stable")
    ids = order[:, :top_k]
    w = np.take_along_axis(p, ids, axis=1)
    if variant.renormalize:
        w = w / w.sum(axis=1, keepdims=True)
    return ids.astype(np.int64), w


def split_gate_up(h: np.ndarray, variant: MoeVariant) -> tuple[np.ndarray, np.ndarray]:
    inter = h.shape[-1] // 2
    if variant.gate_up is GateUpOrder.GATE_UP:
        return h[..., :inter], h[..., inter:]
    if variant.gate_up is GateUpOrder.UP_GATE:
        return h[..., inter:], h[..., :inter]
    return h[..., 0::2], h[..., 1::2]


def _silu(g: np.ndarray) -> np.ndarray:
    return g / (1.0 + np.exp(-g))


def _quant_dequant(v: np.ndarray, variant: a8.Int8ActVariant) -> tuple[np.ndarray, a8.Int8Activations]:
    """Per-token int8 quantize-dequantize of the rows of v (values exact in float32)."""
    acts = a8.quantize_int8_per_token(v.astype(np.float32), variant)
    return a8.dequantize_int8_per_token(acts), acts


def moe_w16(x, router_logits, w13, w2, top_k: int, *, variant: MoeVariant = CANONICAL,
            out_dtype: str | None = None) -> LinearResult:
    """Fused-MoE reference with dequantized experts w13 [E, 2I, K], w2 [E, K, I].

    ``parts`` holds the routing (``topk_ids``, ``topk_weights``) and, per token and chosen slot j,
    the GEMM-1 output ``h`` [M, top_k, 2I] (after ``gate_up_dtype``), the intermediate ``a``
    [M, top_k, I] (after ``intermediate_dtype``), the GEMM-2 input ``a_in`` (``a``, or its
    quantize-dequantize under ``act_quant``, whose scales are ``a_scale`` [M, top_k]) and the expert
    outputs ``o`` [M, top_k, K] (before ``expert_output_dtype``); with ``act_quant`` also ``x_in``, the
    dequantized quantized x.
    """
    out_dtype = out_dtype or dtype_name(x)
    x64 = as_float64(x)
    # float64 experts are read in place (no copy: an expert no token routes to is never touched, so a
    # caller may leave it unmaterialised zeros)
    w13 = w13 if isinstance(w13, np.ndarray) and w13.dtype == np.float64 else as_float64(w13)
    w2 = w2 if isinstance(w2, np.ndarray) and w2.dtype == np.float64 else as_float64(w2)
    require(w13.ndim == 3 and w2.ndim == 3, "expected w13 [E, 2I, K] and w2 [E, K, I]", tensor="w13")
    E, two_i, K = w13.shape
    require(two_i % 2 == 0, f"w13 has an odd number of rows {two_i}", tensor="w13")
    inter = two_i // 2
    require(w2.shape == (E, K, inter), f"expected w2 shape {[E, K, inter]}, got {list(w2.shape)}", tensor="w2")
    require(x64.ndim == 2 and x64.shape[1] == K, f"expected x [M, {K}], got {list(x64.shape)}", tensor="x")
    ids, wts = route(router_logits, top_k, variant)
    require(ids.shape[0] == x64.shape[0], "router_logits and x disagree on M", tensor="router_logits")
    inter_dtype = variant.intermediate_dtype or dtype_name(x)
    out_e_dtype = dtype_name(x) if variant.expert_output_dtype == "activation" else variant.expert_output_dtype
    M = x64.shape[0]
    parts: dict = {"topk_ids": ids, "topk_weights": wts}
    x_in = x64
    if variant.act_quant is not None:
        x_in, xa = _quant_dequant(x64, variant.act_quant)
        parts.update(x_in=x_in, x_q=xa.q, x_scale=xa.scale, x_tie=xa.tie)
    h_all = np.zeros((M, top_k, two_i))
    a_all = np.zeros((M, top_k, inter))
    a_in_all = np.zeros((M, top_k, inter))
    a_scale = np.zeros((M, top_k))
    o_all = np.zeros((M, top_k, K))
    y = np.zeros((M, K), dtype=np.float64)
    mag = np.zeros((M, K), dtype=np.float64)
    for j in range(top_k):
        for e in np.unique(ids[:, j]):
            rows = np.nonzero(ids[:, j] == e)[0]
            h = x_in[rows] @ w13[e].T
            if variant.gate_up_dtype:
                h = round_to_dtype(h, variant.gate_up_dtype)
            gate, up = split_gate_up(h, variant)
            a = _silu(gate) * up
            if inter_dtype != "float64":
                a = round_to_dtype(a, inter_dtype)
            a_in = a
            if variant.act_quant is not None:
                a_in, aa = _quant_dequant(a, variant.act_quant)
                a_scale[rows, j] = aa.scale[:, 0]
            h_all[rows, j], a_all[rows, j], a_in_all[rows, j] = h, a, a_in
            o = a_in @ w2[e].T
            o_all[rows, j] = o
            w = wts[rows, j:j + 1]
            if out_e_dtype and variant.expert_output_weighted:
                y[rows] += round_to_dtype(w * o, out_e_dtype)
            elif out_e_dtype:
                y[rows] += w * round_to_dtype(o, out_e_dtype)
            else:
                y[rows] += w * o
            mag[rows] += np.abs(wts[rows, j:j + 1]) * (np.abs(a_in) @ np.abs(w2[e]).T)
    parts.update(h=h_all, a=a_all, a_in=a_in_all, o=o_all)
    if variant.act_quant is not None:
        parts["a_scale"] = a_scale
    # float64 evaluation error only (the reference itself is defined in float64 after routing).
    bound = gamma(inter + top_k + 8) * mag
    res_y, amb = round_output(y, bound, out_dtype)
    return LinearResult(y=res_y, y_exact=y, y_bound=bound, y_ambiguous=amb, out_dtype=out_dtype, parts=parts)


@dataclasses.dataclass(frozen=True)
class GptqExperts:
    """One fused-MoE weight's stacked GPTQ experts in vLLM's FusedMoE layout, with its quantize config.

    ``qweight [E, in/8, out]`` int32 (each expert a GPTQ ``qweight``, packed along the input dim),
    ``scales [E, in/G, out]``, optional ``qzeros [E, in/G, out/8]``: symmetric experts without qzeros use
    the midpoint zero 2**(bits-1). For w13, out = 2I (gate rows, then up rows); for w2, in = I.
    """

    qweight: np.ndarray
    scales: np.ndarray
    group_size: int
    qzeros: np.ndarray | None = None
    bits: int = 4
    zero_convention: str = "gptq"


def dequantize_gptq_experts(weights: GptqExperts, *, variant: DequantVariant = CANONICAL_DEQUANT,
                            tensor: str = "w13", experts=None) -> np.ndarray:
    """Stacked GPTQ experts -> float32 [E, out, in], each formed by ``gptq.dequantize_gptq``.

    ``variant``: the weight arithmetic (``formats.int_common.DequantVariant``).
    ``experts`` (expert ids): dequantize only those; the others stay zeros (unmaterialised pages).
    """
    from .formats import gptq

    qw = np.asarray(weights.qweight)
    sc = np.asarray(weights.scales)
    qzeros, bits = weights.qzeros, weights.bits
    require(qw.ndim == 3, f"expected [E, in/{32 // bits}, out], got shape {list(qw.shape)}", tensor=f"{tensor}_qweight")
    require(sc.ndim == 3 and sc.shape[0] == qw.shape[0] and sc.shape[2] == qw.shape[2],
            f"expected [E, in/G, out] matching qweight {list(qw.shape)}, got {list(sc.shape)}", tensor=f"{tensor}_scales")
    E, _, out_dim = qw.shape
    in_dim = qw.shape[1] * (32 // bits)
    sym = qzeros is None
    params = gptq.GptqParams(bits=bits, group_size=weights.group_size, sym=sym,
                             zero_convention=weights.zero_convention)
    sym_qz = None
    if qzeros is None:
        # the midpoint zeros' qzeros [G, out/8] depend on G and out only (not on the group size), so they
        # are packed once, from a stand-in with one 8-code word per group
        n_groups = sc.shape[1]
        z = np.full((n_groups, out_dim), params.sym_zero, dtype=np.int64)
        stand_in = dataclasses.replace(params, group_size=8)
        codes = gptq.GptqCodes(q=np.zeros((out_dim, 8 * n_groups), np.uint8), zeros=z, scales=sc[0],
                               g_idx=(np.arange(8 * n_groups) // 8).astype(np.int32))
        sym_qz = gptq.pack_gptq(codes, stand_in).qzeros
    out = np.zeros((E, out_dim, in_dim), dtype=np.float32)
    for e in (range(E) if experts is None else experts):
        qz = sym_qz if qzeros is None else np.asarray(qzeros)[e]
        t = gptq.GptqTensors(qweight=qw[e], qzeros=qz, scales=sc[e], g_idx=None)
        out[e] = gptq.dequantize_gptq(t, params, shape=(out_dim, in_dim), layer=f"{tensor}[expert {e}]",
                                      variant=variant)
    return out


def moe_gptq_w4a16(x, router_logits, w13: GptqExperts, w2: GptqExperts, top_k: int, *,
                   variant: MoeVariant = CANONICAL, out_dtype: str | None = None) -> LinearResult:
    """W4A16 MoE on GPTQ int4 experts in vLLM's FusedMoE layout (``GptqExperts``), formed canonically."""
    return moe_w16(x, router_logits, dequantize_gptq_experts(w13, tensor="w13"),
                   dequantize_gptq_experts(w2, tensor="w2"), top_k, variant=variant, out_dtype=out_dtype)
