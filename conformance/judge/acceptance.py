"""Acceptance intervals derived from a backend's declared arithmetic.

Semantics: docs/conformance.md#acceptance.

For one case the emulator computes the *declared reference*: the exact value
of the scheme under the variants the backend names (activation rounding,
reciprocal form, scale dtype, zero-point reading, MX scale rule, ...), with the
dequantized weights and the activations rounded to the dtypes the backend says
it forms them in. That part is deterministic, so it is emulated, not tolerated.

What cannot be emulated is the order of the backend's floating-point
accumulation. It is bounded rigorously (Higham, *Accuracy and Stability of
Numerical Algorithms*, §3.1, Lemma 3.1 / eq. 3.4): for any summation order in a
dtype with unit roundoff u,

    |fl(sum_k p_k) - sum_k p_k|  <=  gamma_K(u) * sum_k |p_k|,   gamma_n = n u / (1 - n u)

plus the float64 evaluation error of the reference itself (``y_bound``).
The accepted outputs are the output-dtype values in
[RD(y - b), RU(y + b)]: every value a correct kernel can produce by rounding an
accumulator that lies within the bound. A backend that declares
``output_rounding="rtz"`` rounds its accumulator toward zero; the set of its
possible outputs is exactly [RTZ(y - b), RTZ(y + b)] (RTZ is monotone and
returns grid points unchanged), and its reference is RTZ(y).

Declared stages beyond one GEMM (derivations in the docstrings below and in
docs/formats/activations.md#declared-stages-and-their-acceptance-bounds, docs/formats/moe.md):

- ``bias_stage="after_output_rounding"``: the engine adds the bias to the
  kernel's already rounded output (``_after_output_rounding``);
- ``azp_epilogue="compensation"``: asymmetric W8A8 whose epilogue subtracts
  the zero-point term in floating point (``_w8a8_interval``);
- MoE ``act_quant``: int8-quantized GEMM inputs, with the intermediate's
  quantization perturbed by the first GEMM's rounding (``_moe_act_quant_range``), and every MoE
  declaration: the kernel's own intermediate and expert outputs, element by element (``_moe_deviation``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from emulator import linear as lin
from emulator import moe as emoe
from emulator.activations import int8 as a8
from emulator.declaration import Declared, declared_reference, declared_weight, int8_variant, moe_variant, mx_variant
from emulator.numerics.fast_round import FAST_DTYPES, round_fast
from emulator.numerics.floats import decode, encode, format_of, round_to_dtype
from emulator.numerics.rounding import Rounding
from emulator.numerics.sqnr import sqnr_db

from conformance.cases.inputs import CaseInputs

__all__ = ["UNIT_ROUNDOFF", "UNDERFLOW_UNIT", "Interval", "INTERMEDIATES", "declared_interval", "one_rounding_bounds",
           "compare", "Comparison", "round_down",
           "round_up", "grid_neighbour", "ulp_distance",
           # the declared weights and stage variants live in emulator/declaration.py; re-exported for callers here
           "declared_weight", "int8_variant", "mx_variant", "moe_variant"]

#: unit roundoff u = 2**-p of each accumulation dtype (0: exact integer accumulation)
UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "tf32": 2.0 ** -11, "float16": 2.0 ** -11,
                 "bfloat16": 2.0 ** -8, "int32": 0.0, "exact": 0.0}


#: half the smallest subnormal of each accumulation dtype: the most a product that underflows can lose
#: in absolute terms under round-to-nearest (Higham, *Accuracy and Stability*, §2.1: fl(a*b) = ab(1 + d) + e,
#: |e| <= this; sums of subnormals are exact, so only the K products and the scale products add an e).
#: tf32 keeps fp32's exponent range with 10 stored mantissa bits (2**-136 is its smallest subnormal).
UNDERFLOW_UNIT = {"float64": 2.0 ** -1075, "float32": 2.0 ** -150, "tf32": 2.0 ** -137, "float16": 2.0 ** -25,
                  "bfloat16": 2.0 ** -134, "int32": 0.0, "exact": 0.0}


def _gamma(n: int, u: float) -> float:
    nu = n * u
    return np.inf if nu >= 1 else nu / (1 - nu)


#: output dtypes with float32 fast paths (float32 holds each of their values exactly)
_FAST = FAST_DTYPES


def _native(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def grid_neighbour(v: np.ndarray, dtype: str, toward: float) -> np.ndarray:
    """The neighbour of each ``dtype`` value v in direction ``toward`` (+inf or -inf)."""
    if dtype in _FAST:  # IEEE nextAfter in the dtype itself (ml_dtypes' for bfloat16): v is on its grid
        t = _native(dtype)
        with np.errstate(over="ignore", invalid="ignore"):
            out = np.nextafter(v.astype(t), np.asarray(toward, dtype=t)).astype(np.float64)
        return np.where(np.isfinite(v), out, v)
    fmt = format_of(dtype)
    bits = encode(v, fmt).astype(np.int64)
    sign_bit = 1 << (fmt.bits - 1)
    neg = (bits & sign_bit) != 0
    mag = bits & (sign_bit - 1)
    up = toward > 0
    # moving away from zero: magnitude + 1; toward zero: magnitude - 1; zero crosses sign
    away = np.where(neg, not up, up)
    zero = mag == 0
    new_mag = np.where(away, mag + 1, mag - 1)
    new_sign = np.where(zero, 0 if up else sign_bit, bits & sign_bit)
    new_mag = np.where(zero, 1, new_mag)
    out = decode((new_sign | new_mag).astype(np.uint64), fmt)
    return np.where(np.isfinite(v), out, v)


def round_down(v: np.ndarray, dtype: str) -> np.ndarray:
    """Largest ``dtype`` value <= v (toward -inf)."""
    t = round_fast(v, dtype, Rounding.RTZ, as_float64=True)
    return np.where((t > v) | ((t != v) & (v < 0)), grid_neighbour(t, dtype, -np.inf), t)


def round_up(v: np.ndarray, dtype: str) -> np.ndarray:
    """Smallest ``dtype`` value >= v (toward +inf)."""
    t = round_fast(v, dtype, Rounding.RTZ, as_float64=True)
    return np.where((t < v) | ((t != v) & (v > 0)), grid_neighbour(t, dtype, np.inf), t)


@dataclasses.dataclass
class Interval:
    """Accepted outputs for one case under one declaration."""

    y_ref: np.ndarray  # declared reference, rounded once to the output dtype (RNE)
    y_exact: np.ndarray  # declared reference, float64
    lo: np.ndarray  # lowest accepted output value (output dtype grid)
    hi: np.ndarray  # highest accepted output value
    bound: np.ndarray  # total absolute bound before outward rounding
    out_dtype: str
    # the declared reference's intermediates that judging needs (the tie widening, conformance/judge/verdict.py);
    # None where the scheme has no such stage
    x_q: "np.ndarray | None" = None  # int8 activation codes
    x_scale: "np.ndarray | None" = None  # activation scales (int8: per row or tensor; MXFP4: E8M0 bytes per block)
    x_zero_point: "np.ndarray | None" = None  # int8 activation zero points
    x_tie: "np.ndarray | None" = None  # True where an activation sat exactly on a rounding tie
    x_codes: "np.ndarray | None" = None  # MXFP4 activation codes (E2M1)
    topk_ids: "np.ndarray | None" = None  # MoE: the experts each token was routed to
    act_quant_deviation: "np.ndarray | None" = None  # MoE act_quant: the bound's share from the intermediate
    #: the declaration adds the bias after rounding the output (bias_stage=after_output_rounding): the
    #: interval is not that of one rounding of an accumulator
    bias_after_output_rounding: bool = False

    def intermediates(self) -> dict:
        """The fields set beyond the interval itself, by name (conformance/run/refcache.py stores them)."""
        out = {k: getattr(self, k) for k in INTERMEDIATES if getattr(self, k) is not None}
        if self.bias_after_output_rounding:
            out["bias_after_output_rounding"] = True
        return out


#: Interval fields taken from the emulator's reference intermediates (``Reference.parts``) of the same name
INTERMEDIATES = ("x_q", "x_scale", "x_zero_point", "x_tie", "x_codes", "topk_ids", "act_quant_deviation")


def _intermediates(parts: "dict | None") -> dict:
    return {k: v for k, v in (parts or {}).items() if k in INTERMEDIATES}


# -- intervals ----------------------------------------------------------------------------------
OUTPUT_ROUNDINGS = ("rne", "rtz")


def _output_rounding(declared: Declared) -> Rounding:
    r = (declared.output_rounding or "rne").lower()
    if r not in OUTPUT_ROUNDINGS:
        raise ValueError(f"unknown output_rounding {declared.output_rounding!r}; known: {', '.join(OUTPUT_ROUNDINGS)}")
    return Rounding.parse(r)


def _finish(y_exact, y_bound64, mag, n_terms, declared: Declared, out_dtype: str, parts=None, extra=None) -> Interval:
    u = UNIT_ROUNDOFF.get(declared.accumulate)
    if u is None:
        raise ValueError(f"unknown accumulation dtype {declared.accumulate!r}")
    mode = _output_rounding(declared)
    with np.errstate(invalid="ignore", over="ignore"):
        # relative rounding of every step, plus the absolute loss of each of the n_terms products that
        # underflow into the subnormal range (docs/findings.md#interval-underflow)
        acc_bound = _gamma(n_terms, u) * mag + n_terms * UNDERFLOW_UNIT[declared.accumulate]
        if extra is not None:
            acc_bound = acc_bound + extra
        bound = acc_bound + y_bound64
    with np.errstate(invalid="ignore", over="ignore"):
        if mode is Rounding.RTZ:
            # RTZ is monotone and fixes grid points: the outputs of accumulators in [y - b, y + b] are
            # exactly the grid points of [RTZ(y - b), RTZ(y + b)]
            lo = round_fast(y_exact - bound, out_dtype, Rounding.RTZ, as_float64=True)
            hi = round_fast(y_exact + bound, out_dtype, Rounding.RTZ, as_float64=True)
        else:
            lo = round_down(y_exact - bound, out_dtype)
            hi = round_up(y_exact + bound, out_dtype)
    y_ref = round_fast(y_exact, out_dtype, mode, as_float64=True)
    return Interval(y_ref=y_ref, y_exact=y_exact, lo=lo, hi=hi, bound=bound, out_dtype=out_dtype,
                    **_intermediates(parts))


def one_rounding_bounds(iv: Interval, mode) -> "tuple[np.ndarray, np.ndarray]":
    """(lo, hi) of ``iv`` narrowed to the outputs of one rounding ``mode`` (rne or rtz) of an accumulator within
    its bound: the grid points of [R(y - b), R(y + b)] (R monotone, grid points fixed; the arguments widened by
    one float64 ulp outward, so the float64 evaluation of y -+ b cannot exclude a correct value). Elements with
    a non-finite reference or bound keep ``iv``'s ends (docs/conformance.md#acceptance)."""
    with np.errstate(invalid="ignore", over="ignore"):
        lo_t = round_fast(np.nextafter(iv.y_exact - iv.bound, -np.inf), iv.out_dtype, mode, as_float64=True)
        hi_t = round_fast(np.nextafter(iv.y_exact + iv.bound, np.inf), iv.out_dtype, mode, as_float64=True)
        fin = np.isfinite(iv.y_exact) & np.isfinite(iv.bound)
        return np.where(fin, np.maximum(iv.lo, lo_t), iv.lo), np.where(fin, np.minimum(iv.hi, hi_t), iv.hi)


def declared_interval(inp: CaseInputs, declared: Declared) -> Interval:
    """The accepted outputs of a backend declaring ``declared`` on ``inp``."""
    if declared.value("bias_stage") == "after_output_rounding" and inp.bias is not None:
        return _after_output_rounding(inp, declared)
    return _interval(inp, declared)


def _after_output_rounding(inp: CaseInputs, declared: Declared) -> Interval:
    """``bias_stage=after_output_rounding``: y = RNE_T(o + b_T), o the kernel's output without bias.

    The kernel rounds its accumulator to the output dtype T (under ``output_rounding``); the engine
    (torchao's Int4CPU linear, GPTQModel's torch kernels) then adds the bias held in T with a 16-bit
    elementwise add, which torch evaluates as fl32(o + b) rounded to T. For T = fp16/bf16 that double
    rounding equals one RNE of the exact sum: fp32's 24 bits are at least 2p + 2 for p <= 11
    (Figueroa, "When is double rounding innocuous?", SIGNUM Newsletter 30(3), 1995); for T = fp32 it is
    one rounding. Every o the kernel can produce lies in [lo0, hi0], the interval of the same
    declaration without bias, and RNE_T(o + b) is non-decreasing in o, so

        lo = RNE_T(lo0 + b_T),  hi = RNE_T(hi0 + b_T),  y_ref = RNE_T(y_ref0 + b_T).

    (``[lo0, hi0]`` narrowed to one rounding, ``one_rounding_bounds``, as the judge narrows every interval.)
    The interval may contain values no o reaches (near cancellation o's grid is coarser than y's): it
    is the tightest interval, not the exact set. ``y_exact`` is the unrounded y0 + b and ``bound`` the
    distance from it to the farther end.
    """
    rest = {k: v for k, v in declared.variants.items() if k != "bias_stage"}
    iv0 = _interval(dataclasses.replace(inp, bias=None), dataclasses.replace(declared, variants=rest))
    # o is one rounding of an accumulator within the bound: [R(y0 - b0), R(y0 + b0)], not the outward interval,
    # which also admits the neighbour across a correctly rounded o (a truncating kernel declaring RNE) and, near
    # cancellation, the single rounding of acc + bias (a kernel that adds the bias in its accumulator)
    iv0 = dataclasses.replace(iv0, **dict(zip(("lo", "hi"), one_rounding_bounds(iv0, _output_rounding(declared)))))
    T = iv0.out_dtype
    b = round_fast(inp.bias.astype(np.float64), T, as_float64=True)[None, :]

    def add(o):
        with np.errstate(invalid="ignore", over="ignore"):
            return round_fast(np.asarray(o, np.float64) + b, T, as_float64=True)

    lo, hi, y_ref = add(iv0.lo), add(iv0.hi), add(iv0.y_ref)
    with np.errstate(invalid="ignore", over="ignore"):
        y_exact = iv0.y_exact + b
        bound = np.maximum(y_exact - lo, hi - y_exact)
    bound = np.where(np.isfinite(bound), bound, iv0.bound)
    return dataclasses.replace(iv0, y_ref=y_ref, y_exact=y_exact, lo=lo, hi=hi, bound=bound, out_dtype=T,
                               bias_after_output_rounding=True)


def _interval(inp: CaseInputs, declared: Declared) -> Interval:
    case = inp.case
    ref = declared_reference(case, inp.tensors, inp.x, inp.bias, inp.router_logits, declared)
    op, out_dtype = ref.operands, ref.out_dtype
    bias = op.get("bias")
    acts = case.spec.activations
    if acts == "moe":
        return _moe_interval(inp, ref, declared)
    if case.scheme == "w8a8":
        return _w8a8_interval(inp, ref, _int_accumulation(declared))
    mag = op.get("mag")  # sum |x| |w| as the reference formed it (emulator/linear.py), else formed here
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf activations (edge tier)
        if mag is None:
            mag = np.abs(op["x"]) @ np.abs(op["w"]).T
        mag = mag + (0 if bias is None else np.abs(bias))
    if acts == "int8":  # W4A8: exact integer group sums, then the group scales and the sum of groups in fp32
        return _finish(ref.y_exact, ref.y_bound, mag, case.K // case.group + 3, _int_accumulation(declared), out_dtype,
                       parts=ref.parts)
    if acts == "mxfp4":
        return _finish(ref.y_exact, ref.y_bound, mag, case.K + 1, declared, out_dtype, parts=ref.parts)
    # products of fp32 operands round once more than the sum: K + 1 terms
    return _finish(ref.y_exact, ref.y_bound, mag, case.K + 1 + (bias is not None), declared, out_dtype)


def _int_accumulation(declared: Declared) -> Declared:
    """int32 accumulation is exact; the scale products and sums around it are bounded in float32."""
    return dataclasses.replace(declared, accumulate="float32" if declared.accumulate == "int32" else declared.accumulate)


def _w8a8_interval(inp: CaseInputs, ref, declared: Declared) -> Interval:
    """W8A8: int32 accumulation is exact; the scale products and the bias add round in fp32.

    ``azp_epilogue="exact"`` (canonical): the kernel forms sum_k (q_x - azp) w as an integer and
    computes s_a s_w acc + b with at most 3 roundings: gamma_3 (|s_a s_w acc| + |b|).

    ``azp_epilogue="compensation"`` (asymmetric activations; vLLM's x86 oneDNN epilogue,
    ``csrc/cpu/dnnl_kernels.cpp``): the integer GEMM sees the stored codes, and the zero point is
    removed in floating point, y = fl(fl(A - B) + b) with

        A = fl(fl(S1 s_w) s_a),  S1 = sum_k q_x w            (int32, exact; 2 roundings)
        B = fl(fl(S2 s_w) fl(s_a azp)),  S2 = sum_k w        (exact; 3 roundings)

    so the computed value is A(1 + t4) - B(1 + t5) + b(1 + t1) with |t_n| <= gamma_n (Higham, Lemma
    3.1), and |y - y0| <= gamma_5 (|s_a s_w S1| + |s_a s_w azp S2| + |b|): the magnitude is that of the
    two terms *before* they cancel, which the canonical |s_a s_w (S1 - azp S2)| can underestimate by
    orders of magnitude.
    """
    case, t = inp.case, inp.tensors
    op, r_parts, out_dtype = ref.operands, ref.parts, ref.out_dtype
    ws64 = np.broadcast_to(op["ws"].astype(np.float64), (case.N,))[None, :]
    sa = r_parts["x_scale"].astype(np.float64)
    bias = op["bias"]
    bmag = 0 if bias is None else np.abs(bias)
    if declared.value("azp_epilogue") == "compensation":
        wq = np.asarray(t["weight"]).astype(np.float64)
        s1 = r_parts["x_q"].astype(np.float64) @ wq.T
        s2 = r_parts["x_zero_point"].astype(np.float64) * wq.sum(axis=1)[None, :]
        mag = np.abs(sa * ws64) * (np.abs(s1) + np.abs(s2)) + bmag
        return _finish(ref.y_exact, ref.y_bound, mag, 5, declared, out_dtype, parts=r_parts)
    mag = np.abs(op["acc"] * sa * ws64) + bmag
    return _finish(ref.y_exact, ref.y_bound, mag, 3, declared, out_dtype, parts=r_parts)


# -- MoE ------------------------------------------------------------------------------------------
def _moe_interval(inp: CaseInputs, ref, declared: Declared) -> Interval:
    """Two GEMMs + routing in the declared precision: each stage's accumulation and the fp32 routing
    weights (relative u each), propagated through |w2| |a|, plus the deviation the kernel's own
    intermediate and expert outputs can have from the reference's (``_moe_deviation``), element by
    element (docs/formats/moe.md#acceptance-bound)."""
    case = inp.case
    op, out_dtype = ref.operands, ref.out_dtype
    w13, w2, mv, r = op["w13"], op["w2"], op["variant"], op["result"]
    u = UNIT_ROUNDOFF[declared.accumulate]
    ia = case.N
    inter_mag = r.y_bound / max(lin.gamma(ia + case.top_k + 8), 1e-300)
    dev = _moe_deviation(r, np.asarray(op["x"], np.float64), w13, w2, mv, u, out_dtype)
    extra = (_gamma(case.K, u) * 4 + _gamma(ia + case.top_k + 4, u)) * inter_mag + dev * (
        1 + _gamma(ia + case.top_k + 4, u))
    parts = {"topk_ids": r.parts["topk_ids"]}
    if mv.act_quant is not None:
        parts["act_quant_deviation"] = dev
    iv = _finish(r.y_exact, r.y_bound, inter_mag, ia, declared, out_dtype, parts=parts, extra=extra)
    if declared.value("moe_tie_order") == "any":
        iv = _union_over_tie_orders(iv, inp, declared)
    return iv


def _union_over_tie_orders(iv: Interval, inp: CaseInputs, declared: Declared) -> Interval:
    """A kernel whose top-k order on exact ties is unspecified may pick either tied expert in a row:
    accept, row by row, the union of the intervals of both tie rules (rows without ties are unchanged,
    since both rules choose the same experts there)."""
    other = _interval(inp, dataclasses.replace(declared, variants=dict(declared.variants,
                                                                       moe_tie_order="higher_index_first")))
    lo, hi = np.minimum(iv.lo, other.lo), np.maximum(iv.hi, other.hi)
    return dataclasses.replace(iv, lo=lo, hi=hi, bound=np.maximum(iv.bound, other.bound + np.abs(other.y_exact
                                                                                                  - iv.y_exact)))


#: allowance for the kernel's fp32 SiLU (x / (1 + exp(-x)) with vectorized exp approximations) relative to
#: |silu(g) * up|: far above the documented accuracy of at::vec exp (u10/u20 ULP), far below a 16-bit ULP
SILU_REL_ERR = 2.0 ** -14
_SILU_ARGMIN = -1.2784645427610738  # silu'(g) = 0: the global minimum of g / (1 + exp(-g))


def _silu(g):
    with np.errstate(over="ignore"):
        return g / (1.0 + np.exp(-g))


def _silu_range(lo, hi):
    """[min, max] of silu over [lo, hi] (decreasing below its argmin, increasing above)."""
    a, b = _silu(lo), _silu(hi)
    mn = np.where((lo <= _SILU_ARGMIN) & (hi >= _SILU_ARGMIN), _silu(_SILU_ARGMIN), np.minimum(a, b))
    return mn, np.maximum(a, b)


def _moe_intermediate_box(r, x_in, w13, mv: emoe.MoeVariant, u: float, out_dtype: str):
    """(alo, ahi) [M, top_k, I]: per token m, slot j and element i, the range of the kernel's intermediate a'
    (docs/formats/moe.md#acceptance-bound), by interval arithmetic with monotone steps:

    1. h' in [h - e_h, h + e_h], h = x_in W13[e]^T exact, e_h = (gamma_{K+2}(u) + gamma_K(2^-53)) |x_in| |W13[e]|^T
       (under act_quant the per-block integer dot is exact; block scaling and the block sum are fp32),
       then rounded to ``gate_up_dtype`` when declared (RNE, monotone: [RNE(lo), RNE(hi)]);
    2. silu(g) * up over the box (silu's exact range on an interval; the product's four corners),
       widened by SILU_REL_ERR for the kernel's fp32 evaluation, rounded to the intermediate dtype.
    """
    ids = r.parts["topk_ids"]
    inter_dtype = mv.intermediate_dtype or out_dtype
    M, top_k = ids.shape
    K = x_in.shape[1]
    alo = np.zeros((M, top_k, w13.shape[1] // 2))
    ahi = np.zeros_like(alo)
    for j in range(top_k):
        for e in np.unique(ids[:, j]):
            rows = np.nonzero(ids[:, j] == e)[0]
            with np.errstate(invalid="ignore", over="ignore"):  # non-finite inputs: NaN boxes, as the reference
                alo[rows, j], ahi[rows, j] = _moe_box_rows(x_in[rows], w13[e], mv, u, K, inter_dtype)
    return alo, ahi


def _moe_box_rows(x_rows, w13_e, mv: emoe.MoeVariant, u: float, K: int, inter_dtype: str):
    """Steps 1-2 of ``_moe_intermediate_box`` for the rows routed to one expert."""
    h = x_rows @ w13_e.T
    eh = (_gamma(K + 2, u) + lin.gamma(K)) * (np.abs(x_rows) @ np.abs(w13_e).T)
    hlo, hhi = h - eh, h + eh
    if mv.gate_up_dtype:
        hlo, hhi = round_to_dtype(hlo, mv.gate_up_dtype), round_to_dtype(hhi, mv.gate_up_dtype)
    glo, ulo = emoe.split_gate_up(hlo, mv)
    ghi, uhi = emoe.split_gate_up(hhi, mv)
    slo, shi = _silu_range(glo, ghi)
    corners = np.stack([slo * ulo, slo * uhi, shi * ulo, shi * uhi])
    plo, phi = corners.min(axis=0), corners.max(axis=0)
    widen = SILU_REL_ERR * np.maximum(np.abs(plo), np.abs(phi)) + 2.0 ** -140
    plo, phi = plo - widen, phi + widen
    if inter_dtype != "float64":
        plo, phi = round_to_dtype(plo, inter_dtype), round_to_dtype(phi, inter_dtype)
    return plo, phi


def _moe_deviation(r, x, w13, w2, mv: emoe.MoeVariant, u: float, out_dtype: str) -> np.ndarray:
    """Bound [M, K] on |y_kernel - y_ref| from the kernel's own intermediate and expert outputs.

    Per token m, slot j (expert e) and element i, the kernel's GEMM-2 input a'_in lies in a box around the
    reference's a_in: ``_moe_intermediate_box`` (no act_quant) or ``_moe_act_quant_range``; D_i = the larger
    distance from a_in,i to it (0 where the box is the one value a_in,i). Then the expert output
    o' = a'_in W2[e]^T lies within e_o = D |W2[e]|^T + gamma_{I+2}(u) |a'_in| |W2[e]|^T of the reference's o.
    Without ``expert_output_dtype`` that is |y' - y| <= sum_j |w_j| D |W2[e]|^T (the GEMM-2 accumulation is in
    the caller's own term). With it, the stored value v' = RNE(o') (or RNE(w_j' o') when weighted, w_j' the
    kernel's fp32 weight) lies between the roundings of the ends of [v - e_v, v + e_v] (RNE is monotone), so
    |v' - v| <= max(|RNE(v + e_v) - v|, |RNE(v - e_v) - v|) with v the reference's stored value.
    """
    ids, wts = r.parts["topk_ids"], r.parts["topk_weights"]
    a_in = r.parts["a_in"]
    if mv.act_quant is not None:
        vlo, vhi = _moe_act_quant_range(r, w13, mv, u, out_dtype)
    else:
        vlo, vhi = _moe_intermediate_box(r, x, w13, mv, u, out_dtype)
    with np.errstate(invalid="ignore"):
        dev_el = np.maximum(np.maximum(vhi - a_in, a_in - vlo), 0.0)
    amag = np.maximum(np.abs(vlo), np.abs(vhi))
    M, top_k = ids.shape
    dev = np.zeros((M, w2.shape[1]))
    for j in range(top_k):
        for e in np.unique(ids[:, j]):
            rows = np.nonzero(ids[:, j] == e)[0]
            with np.errstate(invalid="ignore", over="ignore"):  # non-finite inputs: NaN, as the reference
                dev[rows] += _moe_expert_deviation(r.parts["o"][rows, j], wts[rows, j:j + 1], dev_el[rows, j],
                                                   amag[rows, j], w2[e], mv, u, top_k)
    return dev


def _moe_expert_deviation(o, wt, dev_el, amag, w2_e, mv: emoe.MoeVariant, u: float, top_k: int) -> np.ndarray:
    """One expert's share of ``_moe_deviation`` for the rows routed to it (o: the reference's expert outputs
    before ``expert_output_dtype``, wt: their routing weights)."""
    w = np.abs(wt)
    d_o = dev_el @ np.abs(w2_e).T
    od = mv.expert_output_dtype
    if not od:
        return w * d_o
    e_o = d_o + _gamma(dev_el.shape[1] + 2, u) * (amag @ np.abs(w2_e).T)
    if mv.expert_output_weighted:
        # the kernel's fp32 routing weight w' is within gamma_{I+top_k+4}(u) of w (the caller's routing term),
        # and the product w' o' rounds once in fp32 before the store
        v = wt * o
        e_v = w * e_o + _gamma(dev_el.shape[1] + top_k + 6, u) * w * (np.abs(o) + e_o)
        rv = round_to_dtype(v, od)
        return np.maximum(np.abs(round_to_dtype(v + e_v, od) - rv), np.abs(round_to_dtype(v - e_v, od) - rv))
    ro = round_to_dtype(o, od)
    return w * np.maximum(np.abs(round_to_dtype(o + e_o, od) - ro), np.abs(round_to_dtype(o - e_o, od) - ro))


def _moe_act_quant_range(r, w13, mv: emoe.MoeVariant, u: float, out_dtype: str):
    """(vlo, vhi) [M, top_k, I]: the range of the kernel's dequantized int8 intermediate under ``act_quant``.

    x's quantization is emulated exactly (it sees the exact input). The intermediate a is not: the
    kernel quantizes *its* a', which differs from the reference a by the first GEMM's rounding. Per
    token m, slot j (expert e) and element i, interval arithmetic with monotone steps:

    1-2. a' lies in the box of ``_moe_intermediate_box`` (on the dequantized x);
    3. the row's amax' lies in [max_i mig(a'_i), max_i mag(a'_i)]; the code of a'_i under the declared
       (symmetric) ``act_quant`` is monotone in a'_i and in amax', so it lies between the codes of the
       four corners, each computed by the emulator's own quantizer on the row [amax', a'_i]; the
       scale s(amax') is monotone in amax', so it lies between the scales of the two ends; the
       kernel's dequantized value c' s' lies in the product of those two ranges (the product itself
       is not monotone in amax', so the corners of the product are not enough).

    Elements whose box stays inside one code move only by the scale change |s' - s| |c|, so the
    bound is tight where the first GEMM's error cannot move a code.
    """
    aq = mv.act_quant
    if not aq.symmetric or aq.scheme is not a8.Int8Scheme.MINMAX or aq.granularity is not a8.Granularity.PER_TOKEN:
        raise ValueError("the MoE act_quant bound is defined for symmetric per-token MINMAX int8 schemes")
    alo, ahi = _moe_intermediate_box(r, r.parts["x_in"], w13, mv, u, out_dtype)
    # 3: amax' range per row, codes and scales at the corners
    mig = np.where((alo <= 0) & (ahi >= 0), 0.0, np.minimum(np.abs(alo), np.abs(ahi)))
    mag = np.maximum(np.abs(alo), np.abs(ahi))
    amin_row, amax_row = mig.max(axis=2), mag.max(axis=2)  # [M, top_k]

    def codes(amax, v):
        """Signed code (q - zp) of v in a row whose amax is max(amax, |v|), by the emulator's quantizer."""
        A = np.broadcast_to(amax[..., None], v.shape).reshape(-1)
        acts = a8.quantize_int8_per_token(np.stack([A, v.reshape(-1)], axis=1).astype(np.float32), aq)
        return (acts.q[:, 1].astype(np.float64) - acts.zero_point[:, 0]).reshape(v.shape)

    def scale(amax):
        acts = a8.quantize_int8_per_token(amax.reshape(-1, 1).astype(np.float32), aq)
        return acts.scale[:, 0].astype(np.float64).reshape(amax.shape)[..., None]

    c = np.stack([codes(amin_row, alo), codes(amin_row, ahi), codes(amax_row, alo), codes(amax_row, ahi)])
    clo, chi = c.min(axis=0), c.max(axis=0)
    slo, shi = scale(amin_row), scale(amax_row)
    # the kernel's dequantized value c' s' with c' in [clo, chi], s' in [slo, shi]: the interval product
    prods = np.stack([clo * slo, clo * shi, chi * slo, chi * shi])
    return prods.min(axis=0), prods.max(axis=0)


# -- comparison -----------------------------------------------------------------------------------
@dataclasses.dataclass
class Comparison:
    ok: bool
    n_out: int  # elements outside the interval
    max_ratio: float  # max |y - y_exact| / bound (0/0 -> 0; inf where bound is 0 and y differs)
    max_ulp: int  # max ULP distance to y_ref in the output dtype
    sqnr_db: float
    worst: tuple | None  # index of the worst element
    exact_match: bool

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _grid_bits(v: np.ndarray, dtype: str) -> np.ndarray:
    """``encode(v, dtype)`` as int64 for the ``_FAST`` dtypes and finite or infinite v: RNE to the grid
    (``round_fast``), then the value's own bits (float32 holds every value of the three exactly)."""
    g = round_fast(v, dtype, as_float64=True)
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "float32":
            return g.astype(np.float32).view(np.uint32).astype(np.int64)
        if dtype == "float16":
            return g.astype(np.float16).view(np.uint16).astype(np.int64)
        return (g.astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.int64)


def _ordinal(v: np.ndarray, dtype: str) -> np.ndarray:
    """Map output-dtype values to integers that are consecutive across the grid (total order)."""
    fmt = format_of(dtype)
    v = np.asarray(v, dtype=np.float64)
    if dtype in _FAST and v.ndim and not np.isnan(v).any():
        b = _grid_bits(v, dtype)
    else:
        b = encode(v, fmt).astype(np.int64)
    sign_bit = 1 << (fmt.bits - 1)
    mag = b & (sign_bit - 1)
    return np.where(b & sign_bit, -mag, mag)


def ulp_distance(a: float, b: float, dtype: str) -> int | None:
    """How many ``dtype`` grid steps lie between two values of that grid (None where either is not finite)."""
    if not (np.isfinite(a) and np.isfinite(b)):
        return None
    oa, ob = _ordinal(np.array([a, b], np.float64), dtype)
    return int(abs(int(oa) - int(ob)))


def compare(y: np.ndarray, iv: Interval) -> Comparison:
    y64 = np.asarray(y, dtype=np.float64)
    if y64.shape != iv.y_exact.shape:
        return Comparison(False, int(iv.y_exact.size), np.inf, -1, -np.inf, None, False)
    nonfinite_ref = ~np.isfinite(iv.y_exact)
    # Non-finite references (NaN/Inf activations, 0xFF scales) must be matched exactly: same Inf, or NaN.
    same_nonfinite = (np.isnan(iv.y_exact) & np.isnan(y64)) | (np.isinf(iv.y_exact) & (y64 == iv.y_exact))
    with np.errstate(invalid="ignore"):
        inside = np.where(nonfinite_ref, same_nonfinite, (y64 >= iv.lo) & (y64 <= iv.hi))
    with np.errstate(invalid="ignore"):
        err = np.where(y64 == iv.y_ref, 0.0, np.abs(y64 - iv.y_ref))  # Inf == Inf is no error
    # error/bound ratio: distance from the correctly rounded reference over the interval's reach on that
    # side; 0 for a correctly rounded result, <= 1 exactly when inside the interval
    with np.errstate(invalid="ignore"):
        side = np.where(y64 >= iv.y_ref, iv.hi - iv.y_ref, iv.y_ref - iv.lo)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err == 0, 0.0, err / side)
    nan_ref = nonfinite_ref
    ratio = np.where(nan_ref, 0.0, ratio)
    ratio = np.where(np.isnan(ratio), np.inf, ratio)
    finite = np.isfinite(y64) & np.isfinite(iv.y_ref)
    ulp = np.abs(_ordinal(np.where(finite, y64, 0), iv.out_dtype) - _ordinal(np.where(finite, iv.y_ref, 0), iv.out_dtype))
    sqnr = sqnr_db(y64, iv.y_exact, where=finite)  # against the exact reference, where output and y_ref are finite
    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(np.where(np.isfinite(ratio), ratio, 1e300))),
                                                    ratio.shape)) if ratio.size else None
    exact = bool(np.array_equal(np.where(nan_ref, 0, y64), np.where(nan_ref, 0, iv.y_ref)))
    return Comparison(ok=bool(inside.all()), n_out=int((~inside).sum()), max_ratio=float(ratio.max(initial=0.0)),
                      max_ulp=int(ulp.max(initial=0)), sqnr_db=float(sqnr), worst=worst, exact_match=exact)
