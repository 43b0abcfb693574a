"""Fingerprint hypotheses and the separation search: joint declarations per axis value, and the
candidate inputs kept while they separate pairs of hypotheses with different values.

Part of conformance/fingerprint.py; semantics: docs/fingerprints.md (how one axis is decided, steps 1-2).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from backends.base import Declared

from .acceptance import declared_interval
from .cases import CaseInputs
from .fingerprint_axes import DECLARED_FIELDS, Axis, norm_value

__all__ = ["Hypothesis", "apply_overrides", "declared_value", "hypotheses", "hypothesis_intervals",
           "search_separating_inputs"]


# -- hypotheses ------------------------------------------------------------------------------------
def apply_overrides(base: Declared, overrides: dict) -> Declared:
    variants = dict(base.variants)
    fields = {}
    for k, v in overrides.items():
        if k in DECLARED_FIELDS:
            fields[k] = v
        elif v is None:
            variants.pop(k, None)
        else:
            variants[k] = v
    return dataclasses.replace(base, variants=variants, **fields)


def declared_value(axis: Axis, base: Declared) -> str | None:
    """The axis value the backend's own declaration names (None: not among the probed values)."""
    for name, ov in axis.values:
        ok = True
        for k, v in ov.items():
            have = getattr(base, k) if k in DECLARED_FIELDS else base.variants.get(k)
            if k == "eps" and norm_value("zero_row", base.variants.get("zero_row")) != "eps":
                continue
            if k == "e2m1_nan" and norm_value("mx_nan_block", base.variants.get("mx_nan_block")) == "scale_nan":
                continue
            if norm_value(k, have) != norm_value(k, v):
                ok = False
                break
        if ok:
            return name
    return None


def _extra_declared_value(axis: Axis, base: Declared) -> tuple | None:
    """The declaration's own value of the axis as one more named value, when no probed value is it."""
    keys = sorted({k for _, ov in axis.values for k in ov})
    ov = {k: (getattr(base, k) if k in DECLARED_FIELDS else base.variants.get(k)) for k in keys}
    if axis.name == "zero_row" and norm_value("zero_row", ov.get("zero_row")) == "eps":
        return (f"eps={float(ov['eps']):.0e}", ov)
    label = "/".join(str(norm_value(k, ov[k])) for k in keys)
    return (f"declared:{label}", ov)


@dataclasses.dataclass
class Hypothesis:
    value: str
    declared: Declared
    combo: dict  # the nuisance values of this hypothesis, by axis


def hypotheses(axis: Axis, base: Declared, fixed: dict, ranged: dict) -> tuple[list[Hypothesis], list[tuple]]:
    """Joint hypotheses: axis values x ranged axes' values, on the base with fixed overrides applied."""
    values = list(axis.values)
    if declared_value(axis, base) is None:
        extra = _extra_declared_value(axis, base)
        if extra is not None and extra[0] not in dict(values):
            values.append(extra)
    b = base
    for _, ov in fixed.values():
        b = apply_overrides(b, ov)
    names = list(ranged)
    hyps = []
    for combo in itertools.product(*[ranged[n] for n in names]):
        d0 = b
        for ov in (c[1] for c in combo):
            d0 = apply_overrides(d0, ov)
        for vname, ov in values:
            hyps.append(Hypothesis(vname, apply_overrides(d0, ov), {n: c[0] for n, c in zip(names, combo)}))
    return hyps, values


# -- separation search ---------------------------------------------------------------------------
def hypothesis_intervals(inp: CaseInputs, hyps: list[Hypothesis]):
    out = []
    for h in hyps:
        try:
            out.append(declared_interval(inp, h.declared))
        except Exception:  # a hypothesis the emulator cannot evaluate on this input separates nothing
            out.append(None)
    return out


def _separated(ivs) -> np.ndarray:
    """[H, H] boolean: hypotheses i and j have disjoint accepted sets on some output element."""
    H = len(ivs)
    sep = np.zeros((H, H), bool)
    ok = [iv for iv in ivs if iv is not None]
    if not ok:
        return sep
    shape = ok[0].y_exact.shape
    y = np.full((H,) + shape, np.nan)
    lo = np.full((H,) + shape, np.nan)
    hi = np.full((H,) + shape, np.nan)
    valid = np.zeros(H, bool)
    for i, iv in enumerate(ivs):
        if iv is not None and iv.y_exact.shape == shape:
            y[i], lo[i], hi[i], valid[i] = iv.y_exact, iv.lo, iv.hi, True
    fin = np.isfinite(y)
    for i in range(H):
        if not valid[i]:
            continue
        with np.errstate(invalid="ignore"):
            d = (hi[i] < lo) | (hi < lo[i])
            both = fin[i] & fin
            nan_same = (~fin[i] & ~fin) & ((np.isnan(y[i]) & np.isnan(y)) | (y[i] == y))
            s = np.where(both, d, np.where(fin[i] & fin, False, ~nan_same))
        sep[i] = s.reshape(H, -1).any(axis=1) & valid
    return sep


def search_separating_inputs(hyps: list[Hypothesis], trial, max_trials: int, patience: int = 24, min_trials: int = 8):
    """Keep candidate inputs while they separate new pairs of hypotheses with different values.

    Stops when every pair is separated, after ``patience`` candidates without progress, or -- after
    ``min_trials`` candidates -- when every pair left has had identical references on every candidate
    (values that coincide by construction, e.g. a zero block's scale).
    """
    H = len(hyps)
    need = np.array([[hyps[i].value != hyps[j].value for j in range(H)] for i in range(H)])
    need &= np.triu(np.ones((H, H), bool), 1)
    differs = np.zeros((H, H), bool)
    kept, stale = [], 0
    for t in range(max_trials):
        if not need.any() or stale >= patience or (t >= min_trials and not (need & differs).any()):
            break
        inp = trial(t)
        ivs = hypothesis_intervals(inp, hyps)
        sep = _separated(ivs)
        sep = sep | sep.T
        differs |= _differ(ivs)
        new = need & sep
        if new.any():
            kept.append(inp)
            need &= ~new
            stale = 0
        else:
            stale += 1
    return kept, need


def _differ(ivs) -> np.ndarray:
    """[H, H]: the two hypotheses' references or intervals differ somewhere (NaN equal to NaN)."""
    H = len(ivs)
    out = np.ones((H, H), bool)
    ok = [iv for iv in ivs if iv is not None]
    if not ok:
        return out
    shape = ok[0].y_exact.shape
    valid = np.array([iv is not None and iv.y_exact.shape == shape for iv in ivs])
    st = np.full((H, 3) + shape, np.nan)
    for i, iv in enumerate(ivs):
        if valid[i]:
            st[i] = (iv.y_exact, iv.lo, iv.hi)
    flat = st.reshape(H, -1)
    for i in np.nonzero(valid)[0]:
        same = ((flat == flat[i]) | (np.isnan(flat) & np.isnan(flat[i]))).all(axis=1) & valid
        out[i] = ~same
    return out
