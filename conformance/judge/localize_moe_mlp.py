"""Failure localization, MoE: inside one expert's MLP, which part is wrong (the activation, a projection's groups).

Semantics: docs/conformance.md#failure-localization (step 6). ``conformance.judge.localize_moe`` runs the case's
rows routed to one expert e alone (output = expert e's MLP, y = (act(gate) * up) W2[e]^T with
[gate, up] = x W13[e]^T); where no stacked-tensor or gate/up-layout bug explains a failing expert, it asks
``name_expert_bug`` which of these classes does, each written as the outputs it would give:

- the MLP's activation is not SiLU: sigmoid, GELU (erf or tanh), ReLU, none (gate * up), or SiLU without
  the up factor;
- a projection's group size computed from the wrong dimension (or hard-coded): w13's K groups or w2's I
  groups read with G' rows per group, G' = K // n, I // n, 2I // n, the other projection's group size or
  32/64/128, instead of the projection's own (row i with the scale of group min(i // G', n - 1)).

An output element is explained when it lies within the declared interval's width (plus one unit in the last
place) of the hypothesis' output, which uses the declared forward (intermediate rounding, weight dtype) with
the one change. The claim rule is the weight readback's: a hypothesis is named only where it explains at least
90 % of the expert's failing elements and the observed output matches it on at least 90 % of the elements it
moves outside the declared interval.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from emulator import moe as emoe
from emulator.declaration import declared_reference, round_weights
from emulator.numerics.floats import round_to_dtype

from backends.base import Case, Declared

__all__ = ["ExpertObservation", "name_expert_bug", "activation_functions", "MIN_SHARE"]

#: a hypothesis must explain this share of the failing elements, and match this share of those it moves
MIN_SHARE = 0.9
_MANT = {"float32": 23, "float16": 10, "bfloat16": 7}
_ERF = np.vectorize(math.erf, otypes=[np.float64])


@dataclasses.dataclass(frozen=True)
class ExpertObservation:
    """Expert ``e`` run alone: rows ``X`` routed to it by ``logits``, the kernel's outputs ``y``, which of them
    fail (``bad``) and the declared interval [``lo``, ``hi``]."""

    e: int
    X: np.ndarray
    logits: np.ndarray
    y: np.ndarray
    bad: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


@dataclasses.dataclass(frozen=True)
class _ExpertForward:
    """What the declared forward of one expert needs: its input rows, its weights, the MoE variant, the
    intermediate and output dtypes and the bias."""

    x: np.ndarray
    w13: np.ndarray
    w2: np.ndarray
    mv: object
    inter: str
    bias: object
    out_dtype: str

    def run(self, act, w13=None, w2=None) -> np.ndarray:
        return _forward(self.x, self.w13 if w13 is None else w13, self.w2 if w2 is None else w2, self.mv, act,
                        self.inter, self.bias, self.out_dtype)


def activation_functions() -> list:
    """(name, act(gate, up)) for the MLP activations a kernel may use instead of silu(gate) * up."""
    with np.errstate(all="ignore"):
        return [
            ("sigmoid(gate) * up instead of silu(gate) * up", lambda g, u: u / (1.0 + np.exp(-g))),
            ("gelu(gate) * up (erf form) instead of silu(gate) * up",
             lambda g, u: 0.5 * g * (1.0 + _ERF(g / math.sqrt(2.0))) * u),
            ("gelu(gate) * up (tanh approximation) instead of silu(gate) * up",
             lambda g, u: 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3))) * u),
            ("relu(gate) * up instead of silu(gate) * up", lambda g, u: np.maximum(g, 0.0) * u),
            ("gate * up (no activation) instead of silu(gate) * up", lambda g, u: g * u),
            ("silu(gate) without the up factor", lambda g, u: g / (1.0 + np.exp(-g))),
        ]


def _silu_up(g, u):
    return g / (1.0 + np.exp(-g)) * u


def _forward(x, w13, w2, mv, act, inter_dtype: str, bias, out_dtype: str) -> np.ndarray:
    """One expert's MLP on rows x (weight 1), rounded once to the output dtype."""
    with np.errstate(all="ignore"):
        h = x @ w13.T
        if mv.gate_up_dtype:
            h = round_to_dtype(h, mv.gate_up_dtype)
        gate, up = emoe.split_gate_up(h, mv)
        a = act(gate, up)
        if inter_dtype != "float64":
            a = round_to_dtype(a, inter_dtype)
        o = a @ w2.T
        if mv.expert_output_dtype:
            o = round_to_dtype(o, mv.expert_output_dtype if mv.expert_output_dtype != "activation" else inter_dtype)
        if bias is not None:
            o = o + np.asarray(bias, np.float64)[None, :]
        return np.asarray(round_to_dtype(o, out_dtype), np.float64)


def _regrouped(tensors: dict, proj: str, e: int, group: int, grp: np.ndarray, declared: Declared) -> np.ndarray:
    """Expert e's projection ``proj`` ("w13" | "w2") [out, in] with input row i read with scale group grp[i]."""
    qw, sc = np.asarray(tensors[f"{proj}_qweight"]), np.asarray(tensors[f"{proj}_scales"])
    unit = np.ones_like(sc)
    qz = emoe.dequantize_gptq_experts(emoe.GptqExperts(qw, unit, group), tensor=proj, experts=[e])[e].astype(np.float64)
    s = sc[e].astype(np.float64)[grp, :].T  # [out, in]
    w = (qz * s).astype(np.float32).astype(np.float64)
    return round_weights(w, declared)


def _group_candidates(case: Case, D: int, n: int, G: int, other: int) -> list:
    """(G', how) group sizes a kernel may use for a projection with D input rows in n groups of G."""
    I, K = case.N, case.K
    out = {}
    for dim, what in ((K, "the hidden size K"), (I, "the intermediate size I"), (2 * I, "2I (the w13 rows)")):
        if dim // n not in out:
            out[dim // n] = f"computed as {what} // n_groups = {dim} // {n}"
    out.setdefault(other, "the other projection's group size")
    for g in (32, 64, 128):
        out.setdefault(g, "hard-coded")
    return [(g, how) for g, how in out.items() if g >= 1 and g != G]


def _hypotheses(case: Case, tensors: dict, declared: Declared, e: int, fwd: _ExpertForward):
    for name, act in activation_functions():
        yield f"the MLP activation is {name}", lambda act=act: fwd.run(act)
    if case.channelwise:
        return
    K, I = case.K, case.N
    G13, G2 = case.group, case.moe_w2_group_size
    for proj, title, D, G, other in (("w2", "the down projection (w2)", I, G2, G13),
                                     ("w13", "the gate/up projection (w13)", K, G13, G2)):
        n = np.asarray(tensors[f"{proj}_scales"]).shape[1]
        if n < 2:
            continue
        true_grp = np.minimum(np.arange(D) // G, n - 1)
        for Gp, how in _group_candidates(case, D, n, G, other):
            grp = np.minimum(np.arange(D) // Gp, n - 1)
            if np.array_equal(grp, true_grp):
                continue
            name = (f"{title}: its {n} scale groups of {G} input rows read with {Gp} rows per group ({how}): "
                    f"input row i read with the scale of group min(i // {Gp}, {n - 1})")

            def out(proj=proj, G=G, grp=grp):
                wp = _regrouped(tensors, proj, e, G, grp, declared)
                return fwd.run(_silu_up, **{proj: wp})
            yield name, out


def name_expert_bug(case: Case, tensors: dict, declared: Declared, seen: ExpertObservation, bias=None) -> "str | None":
    """The pattern that explains expert ``seen.e``'s failing outputs (``seen.bad``: outside the declared
    interval), or None."""
    e, X, logits, y, bad, lo, hi = seen.e, seen.X, seen.logits, seen.y, seen.bad, seen.lo, seen.hi
    if not bad.any():
        return None
    mcase = dataclasses.replace(case, M=len(X))
    ref = declared_reference(mcase, tensors, np.asarray(X, np.float32), None, np.asarray(logits, np.float32),
                             declared)
    mv = ref.operands["variant"]
    if mv.act_quant is not None:  # a W4A8 MoE: its intermediate quantization is not modelled here
        return None
    x = np.asarray(ref.operands["x"], np.float64)
    w13, w2 = ref.operands["w13"][e], ref.operands["w2"][e]
    inter = mv.intermediate_dtype or case.act_dtype
    out_dtype = declared.output or case.output_dtype
    y = np.asarray(y, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        width = np.where(np.isfinite(hi - lo), hi - lo, 0.0)
    n_bad = int(bad.sum())
    best = None
    fwd = _ExpertForward(x, w13, w2, mv, inter, bias, out_dtype)
    for name, make in _hypotheses(case, tensors, declared, e, fwd):
        try:
            yh = make()
        except (ValueError, TypeError, KeyError):
            continue
        with np.errstate(invalid="ignore", over="ignore"):
            ulp = np.abs(yh) * 2.0 ** -_MANT[out_dtype]  # at least one unit in the last place of the output dtype
            ok = (np.abs(y - yh) <= width + ulp) | (np.isnan(y) & np.isnan(yh)) | (y == yh)
            moved = ~((yh >= lo) & (yh <= hi)) & ~(np.isnan(yh) & np.isnan(y))
        n = int((bad & ok).sum())
        if n < MIN_SHARE * n_bad or not moved.any():
            continue
        prec = float((moved & ok).sum()) / int(moved.sum())
        if prec >= MIN_SHARE and (best is None or (n, prec) > best[:2]):
            best = (n, prec, name)
    if best is None:
        return None
    n, _, name = best
    return name + ("" if n == n_bad else f" (explains {n} of the {n_bad} failing outputs)")
