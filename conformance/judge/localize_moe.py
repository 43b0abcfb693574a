"""Failure localization, MoE: which expert, projection or routing step a failing w4a16-moe case points at.

Semantics: docs/conformance.md#failure-localization. ``conformance.judge.localize`` calls ``localize_moe`` with the
backend's ``run(x, bias, router_logits)`` on the case's own weights. Probes (each judged as the verdict judges,
inside the interval of one declared rounding):

1. per expert e (at most ``MAX_EXPERTS``): the case's own rows with router logits that send every token to e
   (logit 0 for e, -1e4 for the others: float64 softmax gives e the weight 1 and the others 0, with or without
   renormalization), so the output is expert e's alone. A failing expert is then matched against its stacked
   neighbours' projections (w13 or w2 of expert e +- 1: a stacked-tensor stride) and the other w13 layouts
   (``moe_gate_up``);
2. every expert passing alone while the case fails: the case's own routing judged under the other routing
   declarations (``moe_renormalize``, ``moe_tie_order``); else the combination of the top-k outputs is named.

Cost: at most MAX_EXPERTS + 1 kernel calls of the case's M rows and a few interval computations per failing expert.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from emulator.variants import axis

from backends.base import Case, Declared

from conformance.cases.inputs import CaseInputs
from conformance.judge.acceptance import declared_interval
from conformance.judge.localize_moe_mlp import ExpertObservation, name_expert_bug

__all__ = ["localize_moe", "MAX_EXPERTS"]

#: experts probed alone at most (the first ones: a bug in expert indexing shows on any)
MAX_EXPERTS = 16
_SCATTER = "the top-"
_W13 = ("w13_qweight", "w13_scales", "w13_qzeros", "w13_g_idx")
_W2 = ("w2_qweight", "w2_scales", "w2_qzeros", "w2_g_idx")


def _judge(case: Case, tensors: dict, declared: Declared, X, logits, y, bias=None) -> np.ndarray:
    """Where ``y`` lies outside the declared interval (one declared rounding) of rows X with ``logits``."""
    return _judged(case, tensors, declared, X, logits, y, bias)[0]


def _judged(case: Case, tensors: dict, declared: Declared, X, logits, y, bias=None):
    """(outside, interval): where ``y`` lies outside the declared interval of rows X with ``logits``, and it."""
    from conformance.judge.verdict import reference_declaration, rounded_interval  # the verdict's own intervals

    ref = reference_declaration(case, declared)
    inp = CaseInputs(dataclasses.replace(case, M=len(X)), 0, tensors, np.asarray(X, np.float32), bias,
                     router_logits=np.asarray(logits, np.float32))
    iv = rounded_interval(declared_interval(inp, ref), ref)
    with np.errstate(invalid="ignore"):
        nonfinite = ~np.isfinite(iv.y_exact)
        same = (np.isnan(iv.y_exact) & np.isnan(y)) | (np.isinf(iv.y_exact) & (y == iv.y_exact))
        inside = np.where(nonfinite, same, (y >= iv.lo) & (y <= iv.hi))
    return ~inside, iv


def _rolled(tensors: dict, names, shift: int) -> dict:
    """The tensors with the stacked experts of ``names`` rolled: expert e reads expert (e + shift) % E's."""
    t = dict(tensors)
    for k in names:
        if k in t:
            t[k] = np.roll(np.asarray(t[k]), -shift, axis=0)
    return t


#: the variant axes of a dtype inside one expert's MLP, tried as hypotheses on a failing expert
_EXPERT_DTYPE_AXES = ("moe_intermediate_dtype", "moe_gate_up_dtype")


def _expert_hypotheses(case: Case, tensors: dict, declared: Declared):
    """(pattern, tensors, declaration) for bugs confined to the experts' weights (judged expert by expert)."""
    E = case.E
    for names, proj in ((_W2, "down projection (w2)"), (_W13, "gate/up projection (w13)")):
        for sh in (1, -1):
            if E > 1:
                yield (f"the {proj} of expert (e {'+' if sh > 0 else '-'} 1) mod E used for expert e "
                       "(a stacked-tensor stride)", _rolled(tensors, names, sh), declared)
    for key in _EXPERT_DTYPE_AXES:  # the vocabulary's per-expert dtypes, each other value (docs/variants.md)
        now = declared.value(key)
        for v in axis(key).values:
            if v != now:
                yield (f"{key}={v} ({axis(key).title} {v})", tensors,
                       dataclasses.replace(declared, variants={**declared.variants, key: v}))
    now = declared.value("moe_gate_up")
    for v in ("gate_up", "up_gate", "interleaved"):
        if v != now:
            yield (f"moe_gate_up={v} (the w13 rows read as {v.replace('_', ', ')} instead of {now.replace('_', ', ')})",
                   tensors, dataclasses.replace(declared, variants={**declared.variants, "moe_gate_up": v}))


def _routing_hypotheses(declared: Declared):
    ren = declared.value("moe_renormalize")
    yield (f"moe_renormalize={str(not ren).lower()} (top-k weights {'not ' if ren else ''}renormalized to sum 1)",
           dataclasses.replace(declared, variants={**declared.variants, "moe_renormalize": not ren}))
    tie = declared.value("moe_tie_order")
    for v in ("lower_index_first", "higher_index_first"):
        if v != tie:
            yield (f"moe_tie_order={v} (exact router ties resolved {v.replace('_', ' ')})",
                   dataclasses.replace(declared, variants={**declared.variants, "moe_tie_order": v}))


def _fitting(case: Case, tensors: dict, declared: Declared, run_e: tuple, bias) -> list:
    """The names of every expert hypothesis whose interval holds the expert's outputs (``run_e``: rows, router
    logits, outputs), in the order tried."""
    X, Le, ye = run_e
    out = []
    for name, t, d in _expert_hypotheses(case, tensors, declared):
        try:
            if not _judge(case, t, d, X, Le, ye, bias).any():
                out.append(name)
        except (ValueError, TypeError, KeyError):
            continue
    return out


def _scattered(ye: np.ndarray, iv, bad_e: np.ndarray) -> bool:
    """The failing rows' outputs summed over the tokens equal the reference's sum (within the sum of the interval
    widths and half a unit of the output dtype per row) in >= 90 % of the failing columns, and some row differs:
    each output went to some token, the wrong one."""
    if len(ye) < 2:
        return False
    with np.errstate(invalid="ignore", over="ignore"):
        cols = bad_e.any(axis=0) & np.isfinite(ye).all(axis=0) & np.isfinite(iv.y_exact).all(axis=0)
        if not cols.any():
            return False
        d = np.abs(ye[:, cols].sum(axis=0) - iv.y_exact[:, cols].sum(axis=0))
        # each observed row is rounded once to the output dtype: half a unit of it per row, both sides
        half = 2.0 ** -({"bfloat16": 8, "float16": 11}.get(iv.out_dtype, 24))
        tol = ((iv.hi - iv.lo)[:, cols].sum(axis=0)
               + half * (np.abs(ye[:, cols]).sum(axis=0) + np.abs(iv.y_exact[:, cols]).sum(axis=0)))
    return bool((d <= tol).mean() >= 0.9)


def _one_name(experts: dict, fits: dict) -> None:
    """Where one hypothesis fits every failing expert, name it for each (a dtype that several values of the axis
    explain for one expert, e.g. float16 and float64 intermediates, but only one for all)."""
    lists = [fits.get(e) or [] for e in experts["failing"]]
    common = set(lists[0]).intersection(*lists[1:]) if lists and all(lists) else set()
    if not common:
        return
    name = next(n for n in lists[0] if n in common)
    for f in experts["findings"]:
        f["pattern"] = name


def localize_moe(case: Case, tensors: dict, declared: Declared, run, x: np.ndarray, router_logits: np.ndarray,
                 bias=None) -> dict:
    """Name the failing experts (and their projection) or the routing step of a failing MoE case."""
    X = np.asarray(x, np.float32)
    L = np.asarray(router_logits, np.float64)
    loc: dict = {"probes": [], "stage": None}
    y = np.asarray(run(X, bias, L.astype(np.float32)), np.float64)
    bad = _judge(case, tensors, declared, X, L, y, bias)
    experts = {"n_bad": int(bad.sum()), "n": int(bad.size), "failing": [], "passing": [], "findings": []}
    E = case.E
    probed = list(range(min(E, MAX_EXPERTS)))
    fits: dict = {}
    for e in probed:
        Le = np.full((len(X), E), -1e4, np.float64)
        Le[:, e] = 0.0
        ye = np.asarray(run(X, bias, Le.astype(np.float32)), np.float64)
        bad_e, iv_e = _judged(case, tensors, declared, X, Le, ye, bias)
        if not bad_e.any():
            experts["passing"].append(e)
            continue
        experts["failing"].append(e)
        fits[e] = _fitting(case, tensors, declared, (X, Le, ye), bias)
        named = fits[e][0] if fits[e] else None
        if named is None:  # inside the MLP: its activation, a projection's groups (localize_moe_mlp)
            from conformance.judge.verdict import reference_declaration

            try:
                seen = ExpertObservation(e, X, Le, ye, bad_e, iv_e.lo, iv_e.hi)
                named = name_expert_bug(case, tensors, reference_declaration(case, declared), seen, bias)
            except (ValueError, TypeError, KeyError):
                named = None
        if named is None and _scattered(ye, iv_e, bad_e):
            named = (f"{_SCATTER}{case.top_k} outputs added to the wrong tokens (a scatter with a wrong token index, "
                     "e.g. the expert-sorted position instead of its token): the outputs summed over the tokens are "
                     "right, each token's are not")
        if named is None and case.top_k > 1 and np.all(ye[np.isfinite(ye)] == 0):
            named = (f"{_SCATTER}{case.top_k} slots' outputs written, not added (a scatter that overwrites): with the "
                     "expert at weight 1 and the other slots at weight 0, the output is 0, a weight-0 slot's")
        experts["findings"].append({"where": f"expert {e} alone (every token routed to it)", "n": int(bad_e.sum()),
                                    "pattern": named or "the expert's output differs (no named projection bug "
                                                        "explains it: the MLP, its activation or its weights)"})
    loc["probes"].append(f"experts alone: the case's {len(X)} rows routed to one expert at a time (experts "
                         f"{probed[0]}..{probed[-1]} of {E}; router logits 0 for it, -1e4 for the others)")
    loc["experts"] = experts
    _one_name(experts, fits)
    if experts["failing"]:
        pats = {f["pattern"] for f in experts["findings"]}
        which = ", ".join(map(str, experts["failing"]))
        head = f"experts wrong: expert{'s' if len(experts['failing']) > 1 else ''} {which} (of {E}) fail alone"
        if experts["passing"]:
            head += f" (expert{'s' if len(experts['passing']) > 1 else ''} {', '.join(map(str, experts['passing']))} pass)"
        loc["stage"] = "experts"
        loc["summary"] = head + ": " + "; ".join(sorted(pats))
        if all(p.startswith(_SCATTER) for p in pats):  # the experts are right: their sum is not
            loc["stage"] = "combination"
            loc["summary"] = f"combination of the top-{case.top_k} outputs wrong: " + loc["summary"]
        return loc
    loc["probes"].append("routing: the case's own router logits judged under the other routing declarations")
    if bad.any():
        for name, d in _routing_hypotheses(declared):
            try:
                if not _judge(case, tensors, d, X, L, y, bias).any():
                    loc["stage"], loc["summary"] = "routing", (
                        f"routing wrong: every expert alone is right, and the case's outputs lie inside the interval "
                        f"of {name}")
                    return loc
            except (ValueError, TypeError):
                continue
    k = case.top_k
    loc["stage"] = "routing or combination"
    loc["summary"] = ("routing or combination wrong: every expert alone (experts "
                      f"{probed[0]}..{probed[-1]}) is right, the case's own routing is not: the top-{k} selection, its "
                      "weights (softmax, renormalization) or the sum of the selected experts' outputs (e.g. a "
                      "scatter that overwrites instead of adding)" if bad.any() else
                      "the case's own rows pass when run again with the same router logits")
    return loc
