"""The one verdict rule: an observed output against its intervals -> verdict, reason, metrics.

Semantics: docs/conformance.md#verdicts. ``decide`` is pure (arrays in, a record out): the runner
calls it through ``conformance.runner.judge`` with intervals computed by the emulator, and
``verify-bundle`` calls it with the intervals stored in a certification bundle
(``conformance.certify.verify``), so both judge by the same code and the same thresholds.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from .acceptance import Interval, compare, ulp_distance

__all__ = ["QUALITY_MEAN_RATIO", "QUALITY_MAX_RATIO", "Evidence", "decide", "decide_opaque", "degenerate_reference",
           "failing_element",
           "sqnr_db"]

#: a pass whose error/bound ratio averages above this (with a maximum above QUALITY_MAX_RATIO) is a
#: quality-warning: correct by the contract's letter, but consistently at its edge
QUALITY_MEAN_RATIO = 0.5
QUALITY_MAX_RATIO = 0.9


@dataclasses.dataclass
class Evidence:
    """The intervals ``decide`` used beyond the declared ones (certification bundles store them)."""

    alt: "tuple[str, np.ndarray, np.ndarray] | None" = None  # (axis=rule, lo, hi) of a tie rule that explains y
    tie: "tuple[np.ndarray, np.ndarray, np.ndarray] | None" = None  # (lo, hi, ties per row) widened by tie flips


def _unbounded(iv: Interval) -> int:
    """Elements whose reference is finite but whose bound is not (Higham's gamma_n is infinite once n*u >= 1)."""
    with np.errstate(invalid="ignore"):
        return int((np.isfinite(iv.y_exact) & ~np.isfinite(np.broadcast_to(iv.bound, iv.y_exact.shape))).sum())


def degenerate_reference(ref: np.ndarray) -> bool:
    """All zero, constant or non-finite: agreement with such a reference proves nothing."""
    finite = np.isfinite(ref)
    return (not finite.any()) or bool(np.all(ref[finite] == 0)) or (ref.size > 1 and np.unique(ref[finite]).size <= 1)


def failing_element(y, judged: Interval, loose: Interval) -> "tuple[tuple, int] | None":
    """(index, count of NaN/Inf mismatches) of the element a failure names: the first NaN/Inf mismatch
    (reference or output non-finite, and not the same NaN/Inf) if any, else the element outside ``judged``
    farthest outside ``loose`` (error/bound ratio); None when no element is outside (docs/conformance.md#verdicts)."""
    y64 = np.asarray(y, np.float64)
    if y64.shape != judged.y_exact.shape:
        return None
    ref = judged.y_exact
    with np.errstate(invalid="ignore"):
        same = (np.isnan(ref) & np.isnan(y64)) | (np.isinf(ref) & (y64 == ref))
        nonfinite_bad = (~np.isfinite(ref) | ~np.isfinite(y64)) & ~same
        outside = np.where(np.isfinite(ref), ~((y64 >= judged.lo) & (y64 <= judged.hi)), ~same)
    n_nf = int(nonfinite_bad.sum())
    if n_nf:
        return tuple(int(i) for i in np.argwhere(nonfinite_bad)[0]), n_nf
    if not outside.any():
        return None
    with np.errstate(invalid="ignore", divide="ignore"):
        side = np.where(y64 >= loose.y_ref, loose.hi - loose.y_ref, loose.y_ref - loose.lo)
        ratio = np.where(y64 == loose.y_ref, 0.0, np.abs(y64 - loose.y_ref) / side)
    ratio = np.where(outside, np.nan_to_num(ratio, nan=np.inf, posinf=np.inf), -1.0)
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(ratio)), ratio.shape)), 0


def _name_failing_element(rec: dict, y, loose: Interval, judged: Interval) -> dict:
    """A failing record's worst element made a failing one (item: the element a report names must fail)."""
    if rec.get("verdict") != "fail":
        return rec
    found = failing_element(y, judged, loose)
    if found is None:
        return rec
    idx, n_nf = found
    y64 = np.asarray(y, np.float64)
    rec["n_nonfinite_mismatch"] = n_nf
    rec["worst"] = list(idx)
    rec["worst_element"] = {"index": list(idx), "observed": float(y64[idx]), "expected": float(judged.y_exact[idx]),
                            "lo": float(judged.lo[idx]), "hi": float(judged.hi[idx]),
                            "reference": float(judged.y_ref[idx]),
                            "ulp": ulp_distance(float(y64[idx]), float(judged.y_ref[idx]), judged.out_dtype)}
    if n_nf:
        rec["worst_element"]["nonfinite_mismatches"] = n_nf
    return rec


def decide(y, loose: Interval, judged: Interval, *, output_rounding: str = "rne",
           alt=None, tie=None, evidence: "Evidence | None" = None) -> dict:
    """Verdict and metrics of output ``y`` (``_decide``); a failure's worst element is a failing element,
    NaN/Inf mismatches first (``failing_element``)."""
    return _name_failing_element(_decide(y, loose, judged, output_rounding=output_rounding, alt=alt, tie=tie,
                                         evidence=evidence), y, loose, judged)


def _decide(y, loose: Interval, judged: Interval, *, output_rounding: str = "rne",
           alt: "Callable[[], tuple[str, str, np.ndarray, np.ndarray] | None] | None" = None,
           tie: "Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray] | None] | None" = None,
           evidence: "Evidence | None" = None) -> dict:
    """Verdict and metrics of output ``y``.

    ``loose`` is the outward interval [RD(y - b), RU(y + b)] (error/bound ratios, ULP distance, the
    worst element, the quality warning); ``judged`` the interval insideness is tested against (one
    declared rounding of an accumulator within the bound). Outside it, ``alt()`` may name another tie
    rule whose judged interval (lo, hi) contains y (-> ``fail`` naming it), and ``tie()`` may give the
    judged interval widened by activation tie flips with the tie count per row (-> ``pass-with-tie-flips``).
    Both are called only when needed; what they returned is kept in ``evidence``.
    """
    ev = evidence if evidence is not None else Evidence()
    cmp = compare(y, loose)
    cmp_j = compare(y, judged)
    rec = {"max_ratio": cmp.max_ratio, "max_ulp": cmp.max_ulp, "sqnr_db": cmp.sqnr_db, "n_outside": cmp_j.n_out,
           "exact_match": cmp.exact_match, "worst": list(cmp.worst) if cmp.worst else None, "tie_flips": 0}
    y64 = np.asarray(y, np.float64)
    if rec["worst"] is not None and y64.shape == judged.y_exact.shape:
        idx = tuple(rec["worst"])
        rec["worst_element"] = {"index": rec["worst"], "observed": float(y64[idx]),
                                "expected": float(judged.y_exact[idx]), "lo": float(judged.lo[idx]),
                                "hi": float(judged.hi[idx]), "reference": float(judged.y_ref[idx]),
                                "ulp": ulp_distance(float(y64[idx]), float(judged.y_ref[idx]), judged.out_dtype)}
    unbounded = _unbounded(judged)
    if unbounded and y64.shape == judged.y_exact.shape:
        # an infinite (or NaN) bound accepts every output: such a declaration checks nothing, so it never passes
        return dict(rec, verdict="fail", reason=(
            f"the declared arithmetic gives no finite bound for {unbounded} element(s) with a finite reference "
            "(e.g. 16-bit accumulation over K terms with K*u >= 1): declare arithmetic=opaque with an SQNR floor"))
    if cmp_j.ok:
        if degenerate_reference(judged.y_ref):
            return dict(rec, verdict="mistrusted", reason="reference output is all zero, constant or non-finite")
        fin = np.isfinite(judged.y_exact)
        with np.errstate(divide="ignore", invalid="ignore"):
            side = np.where(y64 >= loose.y_ref, loose.hi - loose.y_ref, loose.y_ref - loose.lo)
            ratio = np.where(y64 == loose.y_ref, 0.0, np.abs(y64 - loose.y_ref) / side)
        ratio = ratio[fin & np.isfinite(ratio)]
        if (ratio.size and judged.bound.max(initial=0) > 0 and ratio.mean() > QUALITY_MEAN_RATIO
                and ratio.max() > QUALITY_MAX_RATIO):
            return dict(rec, verdict="quality-warning", reason=f"error uses {ratio.mean():.0%} of the bound on average")
        return dict(rec, verdict="pass", reason="")
    n_out = cmp_j.n_out
    if y64.shape != judged.y_exact.shape:
        return dict(rec, verdict="fail", reason=f"output shape {tuple(y64.shape)} is not the expected "
                                                f"{tuple(judged.y_exact.shape)}")
    a = alt() if alt is not None else None
    if a is not None:
        name, mine, alo, ahi = a
        if compare(y, dataclasses.replace(judged, lo=alo, hi=ahi)).ok:
            ev.alt = (name, alo, ahi)
            return dict(rec, verdict="fail", reason=f"{n_out} output element(s) outside the declared interval; the "
                                                    f"output matches {name} instead of the declared {mine}")
    t = tie() if tie is not None else None
    if t is not None:
        tlo, thi, ties_per_row = t
        ev.tie = t
        nan_ref = np.isnan(judged.y_exact)
        with np.errstate(invalid="ignore"):
            inside_decl = (y64 >= judged.lo) & (y64 <= judged.hi)
            inside_tie = ((y64 >= tlo) & (y64 <= thi)) | (nan_ref & np.isnan(y64))
        if inside_tie.all():
            rows = np.nonzero(~(inside_decl | (nan_ref & np.isnan(y64))).all(axis=1))[0]
            rec["tie_flips"] = int(np.asarray(ties_per_row)[rows].sum())
            return dict(rec, verdict="pass-with-tie-flips",
                        reason=f"outside the declared interval only where {rec['tie_flips']} activation tie(s) "
                               f"in {len(rows)} row(s) can flip")
    if cmp.ok:  # inside the outward interval, not the judged one: not the declared rounding
        return dict(rec, verdict="fail", reason=f"{n_out} output element(s) are not the declared rounding "
                                                f"({(output_rounding or 'rne').lower()}) of any accumulator "
                                                "within the bound (e.g. truncated instead of rounded to nearest)")
    return dict(rec, verdict="fail", reason=f"{n_out} output element(s) outside the declared interval")


def sqnr_db(y, ref) -> float:
    """10 log10(sum ref^2 / sum (y - ref)^2) over the elements where ref is finite (inf: equal)."""
    y64, r64 = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    fin = np.isfinite(r64)
    with np.errstate(invalid="ignore", over="ignore"):
        sig = float(np.sum(r64[fin] ** 2))
        noise = float(np.sum((y64[fin] - r64[fin]) ** 2))
    if noise == 0:
        return float("inf")
    if not np.isfinite(noise):
        return float("-inf")
    return 10 * float(np.log10(sig / noise)) if sig > 0 else float("-inf")


def decide_opaque(y, loose: Interval, judged: Interval, floor_db: float) -> dict:
    """``_decide_opaque``, its failure naming a failing element (NaN/Inf mismatches first)."""
    return _name_failing_element(_decide_opaque(y, loose, judged, floor_db), y, loose, judged)


def _decide_opaque(y, loose: Interval, judged: Interval, floor_db: float) -> dict:
    """Verdict of a kernel declaring ``arithmetic=opaque`` (docs/conformance.md#opaque-arithmetic).

    Its arithmetic cannot be emulated, so it is judged against the intervals of its declared semantics
    with the canonical arithmetic (``loose`` outward, ``judged`` one rounding, as ``decide`` takes them;
    ``conformance.runner.reference_declaration``) and their reference rounded to the output dtype: the SQNR over the finite reference elements must be at least ``floor_db``, and
    where the reference is not finite the output must be the same NaN or infinity. The verdict is
    ``pass-sqnr`` (never ``pass``), else ``fail``; ULP and interval metrics are reported against the
    canonical intervals.
    """
    y64 = np.asarray(y, np.float64)
    ref = loose.y_ref
    cmp = compare(y, loose)
    cmp_j = compare(y, judged)
    rec = {"max_ratio": cmp.max_ratio, "max_ulp": cmp.max_ulp, "n_outside": cmp_j.n_out,
           "exact_match": cmp.exact_match, "worst": list(cmp.worst) if cmp.worst else None, "tie_flips": 0,
           "sqnr_floor_db": float(floor_db)}
    if y64.shape != ref.shape:
        return dict(rec, sqnr_db=float("-inf"), verdict="fail",
                    reason=f"output shape {list(y64.shape)}, expected {list(ref.shape)}")
    if rec["worst"] is not None:
        idx = tuple(rec["worst"])
        rec["worst_element"] = {"index": rec["worst"], "observed": float(y64[idx]),
                                "expected": float(judged.y_exact[idx]), "lo": float(judged.lo[idx]),
                                "hi": float(judged.hi[idx]), "reference": float(ref[idx]),
                                "ulp": ulp_distance(float(y64[idx]), float(ref[idx]), judged.out_dtype)}
    s = sqnr_db(y64, ref)
    rec["sqnr_db"] = s
    nonfinite = ~np.isfinite(ref)
    same = (np.isnan(ref) & np.isnan(y64)) | (np.isinf(ref) & (y64 == ref))
    if (nonfinite & ~same).any():
        bad = nonfinite & ~same
        n = int(bad.sum())
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        # the first such element named: the record's worst_element is the worst *finite* one
        return dict(rec, verdict="fail", reason=f"{n} element(s) where the canonical reference is NaN or infinite "
                                                 f"differ from it (first {list(first)}: observed {float(y64[first])!r}, "
                                                 f"reference {float(ref[first])!r})")
    if not np.isfinite(y64[~nonfinite]).all():
        return dict(rec, verdict="fail", reason="non-finite output where the canonical reference is finite")
    if degenerate_reference(ref):
        return dict(rec, verdict="mistrusted", reason="reference output is all zero, constant or non-finite")
    if not s >= floor_db:
        return dict(rec, verdict="fail", reason=f"opaque arithmetic: SQNR {s:.1f} dB against the reference "
                                                f"is below the declared floor {floor_db:g} dB")
    return dict(rec, verdict="pass-sqnr", reason=f"opaque arithmetic: SQNR {s:.1f} dB >= the declared floor "
                                                 f"{floor_db:g} dB (not a conformance pass)")
