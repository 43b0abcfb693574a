"""Fingerprint hypotheses and the separation search: joint declarations per axis value, and the
candidate inputs kept while they separate pairs of hypotheses with different values.

Part of conformance/fingerprint/decide.py; semantics: docs/fingerprints.md (how one axis is decided, steps 1-2).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from backends.base import Declared
from emulator.variants import conditions_hold

from conformance.judge.acceptance import declared_interval
from conformance.cases.inputs import CaseInputs
from conformance.fingerprint.axes import CONDITIONAL, DECLARED_FIELDS, ProbeAxis, norm_value

__all__ = ["Raises", "Hypothesis", "apply_overrides", "declared_value", "hypotheses", "hypothesis_intervals",
           "search_separating_inputs", "identify"]


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


def _zero_dtype(v, weight_dtype):
    v = norm_value("zero_dtype", v)
    return weight_dtype if v == "weight" else v


def declared_value(axis: ProbeAxis, base: Declared) -> str | None:
    """The axis value the backend's own declaration names (None: not among the probed values). A key the
    probe value co-decides with the key it acts under (``CONDITIONAL``) is compared only where it acts on the
    declaration that value makes (``variants.conditions_hold``: e.g. ``eps`` only under ``zero_row=eps``)."""
    for name, ov in axis.values:
        ok = True
        made = None
        for k, v in ov.items():
            if k in axis.context:
                continue
            have = getattr(base, k) if k in DECLARED_FIELDS else base.variants.get(k)
            if k in CONDITIONAL:
                made = made or apply_overrides(base, ov)
                if not conditions_hold(k, made.value):
                    continue
            if k == "zero_dtype":  # 'weight' is the weight dtype (of the declaration, of the value)
                have = _zero_dtype(have, norm_value("weight_dtype", base.weight_dtype))
                v = _zero_dtype(v, norm_value("weight_dtype", ov.get("weight_dtype", base.weight_dtype)))
            if norm_value(k, have) != norm_value(k, v):
                ok = False
                break
        if ok:
            return name
    return None


def _extra_declared_value(axis: ProbeAxis, base: Declared) -> tuple | None:
    """The declaration's own value of the axis as one more named value, when no probed value is it."""
    keys = sorted(axis.keys)
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


def hypotheses(axis: ProbeAxis, base: Declared, fixed: dict, ranged: dict) -> tuple[list[Hypothesis], list[tuple]]:
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
@dataclasses.dataclass(frozen=True)
class Raises:
    """A hypothesis that refuses this input (e.g. ``nan_to_int=raise`` on a NaN quotient): it predicts an
    error reply, not an output, and is separated from every hypothesis that predicts an output."""

    error: str


def hypothesis_intervals(inp: CaseInputs, hyps: list[Hypothesis]):
    """Per hypothesis: its Interval on ``inp``, Raises where the emulator refuses the input under it."""
    out = []
    for h in hyps:
        try:
            out.append(declared_interval(inp, h.declared))
        except (ValueError, FloatingPointError, ArithmeticError) as e:
            out.append(Raises(f"{type(e).__name__}: {e}"[:300]))
        except Exception:  # a hypothesis the emulator cannot evaluate on this input separates nothing
            out.append(None)
    return out


def _raise_pairs(ivs) -> np.ndarray:
    """[H, H]: one hypothesis predicts an error on this input, the other an output."""
    r = np.array([isinstance(iv, Raises) for iv in ivs])
    v = np.array([iv is not None and not isinstance(iv, Raises) for iv in ivs])
    return (r[:, None] & v[None, :]) | (v[:, None] & r[None, :])


def search_separating_inputs(hyps: list[Hypothesis], trial, max_trials: int, patience: int = 24, min_trials: int = 8,
                             max_ref_only: int = 2):
    """Keep candidate inputs while they let new pairs of hypotheses with different values be told apart.

    A pair (i, j) is told apart in one direction when j's reference output lies outside i's accepted
    set on some element (a kernel computing j excludes i); disjoint sets tell it apart both ways. Where
    one value's sets lie inside the other's (``rtz`` inside ``rne``'s rounding interval, a float32
    output inside a bf16 one) only one direction exists: the narrower value is then identified by
    being the most specific consistent one (``most_specific``).

    Stops when every direction is found, after ``patience`` candidates without progress, or -- after
    ``min_trials`` candidates -- when every direction left is impossible on every candidate so far
    (identical or nested references, e.g. a zero block's scale). Up to ``max_ref_only`` inputs are
    also kept where a pair told apart in neither direction has different references (see
    ``identify``). Returns (inputs, [H, H] pairs told apart in neither direction, upper triangle).
    """
    H = len(hyps)
    need = np.array([[hyps[i].value != hyps[j].value for j in range(H)] for i in range(H)])
    possible = np.zeros((H, H), bool)  # direction (i, j) could be found: j's set is not inside i's somewhere
    ref_need = need.copy()  # pairs whose references have not differed on a kept input
    kept, stale, ref_only = [], 0, 0
    for t in range(max_trials):
        if not need.any() or stale >= patience or (t >= min_trials and not (need & possible).any()):
            break
        inp = trial(t)
        ivs = hypothesis_intervals(inp, hyps)
        ex = _excludes(ivs)
        possible |= ~_contains(ivs)
        new = need & ex
        rd = _refs_differ(ivs)
        if new.any():
            kept.append(inp)
            need &= ~new
            ref_need &= ~rd
            stale = 0
        else:
            # an input on which the references differ though every accepted set holds the other's
            # reference: it cannot exclude, but shows which value an output reproduces bit for bit
            if (ref_need & need & need.T & rd).any() and ref_only < max_ref_only:
                kept.append(inp)
                ref_need &= ~rd
                ref_only += 1
            stale += 1
    return kept, np.triu(need & need.T, 1)


def _refs_differ(ivs) -> np.ndarray:
    """[H, H]: the two references differ on some element (NaN equal to NaN)."""
    out = _raise_pairs(ivs)
    arr = _arrays(ivs)
    if arr is None:
        return out
    ref, _, _, valid = arr
    for i in np.nonzero(valid)[0]:
        same = ((ref == ref[i]) | (np.isnan(ref) & np.isnan(ref[i]))).all(axis=1)
        out[i] |= ~same & valid
    return out


def _arrays(ivs):
    ok = [iv for iv in ivs if iv is not None and not isinstance(iv, Raises)]
    if not ok:
        return None
    shape = ok[0].y_exact.shape
    H = len(ivs)
    ref, lo, hi = (np.full((H,) + shape, np.nan) for _ in range(3))
    valid = np.zeros(H, bool)
    for i, iv in enumerate(ivs):
        if iv is not None and not isinstance(iv, Raises) and iv.y_exact.shape == shape:
            ref[i], lo[i], hi[i], valid[i] = iv.y_ref, iv.lo, iv.hi, True
    return ref.reshape(H, -1), lo.reshape(H, -1), hi.reshape(H, -1), valid


def _excludes(ivs) -> np.ndarray:
    """[H, H]: j's reference output lies outside i's accepted set on some element (NaN: inside only a NaN
    set), or exactly one of the two predicts an error."""
    out = _raise_pairs(ivs)
    arr = _arrays(ivs)
    if arr is None:
        return out
    ref, lo, hi, valid = arr
    for i in np.nonzero(valid)[0]:
        with np.errstate(invalid="ignore"):
            nan_i = np.isnan(lo[i]) | np.isnan(hi[i])
            inside = np.where(nan_i, np.isnan(ref), (ref >= lo[i]) & (ref <= hi[i]))
        out[i] |= (~inside).any(axis=1) & valid
    return out


def _contains(ivs) -> np.ndarray:
    """[H, H]: i's accepted set contains j's on every element (both error, or NaN sets alike, count as equal)."""
    rs = np.array([isinstance(iv, Raises) for iv in ivs])
    out = rs[:, None] & rs[None, :]
    arr = _arrays(ivs)
    if arr is None:
        return out
    ref, lo, hi, valid = arr
    for i in np.nonzero(valid)[0]:
        with np.errstate(invalid="ignore"):
            nan_i = np.isnan(lo[i]) | np.isnan(hi[i])
            nan_j = np.isnan(lo) | np.isnan(hi)
            c = np.where(nan_i | nan_j, nan_i & nan_j, (lo[i] <= lo) & (hi <= hi[i]))
        out[i] |= c.all(axis=1) & valid
    return out


def identify(consistent_hyps: list[int], hyps: list[Hypothesis], intervals: list[list], outputs: list) -> tuple:
    """(value, how) the probes identify among the consistent hypotheses, or (None, "") when they do not:

    - ``only consistent``: one value is consistent;
    - ``most specific``: one value's accepted sets lie inside those of every other consistent value on
      every probe (``rtz`` inside ``rne``'s rounding interval: an output inside both is the rtz one's);
    - ``bit-exact``: one consistent value's reference equals the output on every probe element (where
      the accepted sets overlap so much that no output excludes a value, the output still reproduces
      one value's numbers and not the others').

    ``intervals``: per probe, per hypothesis; ``outputs``: per probe, the output (None: an error reply).
    """
    values = list(dict.fromkeys(hyps[h].value for h in consistent_hyps))
    if len(values) == 1:
        return values[0], "only consistent"
    if not values:
        return None, ""
    # h is the most specific when every other consistent g accepts all h does, and g's own reference fell
    # outside h's set on some probe (where the output stayed inside it: the kernel did not compute g's)
    found = set()
    for h in consistent_hyps:
        if all(all(_contains([ivs[g], ivs[h]])[0, 1] for ivs in intervals)
               and any(_excludes([ivs[h], ivs[g]])[0, 1] for ivs in intervals)
               for g in consistent_hyps if hyps[g].value != hyps[h].value):
            found.add(hyps[h].value)
    if len(found) == 1:
        return next(iter(found)), "most specific"
    exact = set()
    for h in consistent_hyps:
        ok = True
        for ivs, y in zip(intervals, outputs):
            iv = ivs[h]
            if y is None or iv is None or isinstance(iv, Raises):
                ok = ok and (y is None) == isinstance(iv, Raises)
                continue
            r = np.asarray(iv.y_ref, np.float64)
            yy = np.asarray(y, np.float64)
            if r.shape != yy.shape or not ((r == yy) | (np.isnan(r) & np.isnan(yy))).all():
                ok = False
        if ok:
            exact.add(hyps[h].value)
    if len(exact) == 1:
        return next(iter(exact)), "bit-exact"
    return None, ""
