"""The verdict core: the ``Verdict`` names, and ``judge`` (an observed output against its intervals -> a ``Judgement``).

Semantics: docs/conformance.md#verdicts. Every verdict the suite writes is a ``Verdict``; which of them
pass, are bad, were judged, and how they rank is said here once (its properties), nowhere else.

``judge`` is the one place a case's output is judged: it narrows the declared interval to the outputs of
one declared rounding (``rounded_interval``), looks for another tie rule that explains a miss
(``_alternative_rule``) and widens by activation tie flips (``_tie_interval``), then applies the rule
``decide`` (or ``decide_opaque`` for ``arithmetic=opaque``). The runner, ``replay``, the self-test, the
certification writer (which stores the judged interval it returns) and the deep verifier all call it;
``decide`` itself is pure (arrays in, a ``Judgement`` out), so ``verify-bundle`` applies it to the intervals
a certification bundle stores (``conformance.certify.offline``) by the same code and thresholds.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Callable, Iterable

import numpy as np

from emulator.declaration import Declared, declared_weight
from emulator.numerics.fast_round import round_fast
from emulator.numerics.sqnr import sqnr_db

from conformance.judge.acceptance import (Interval, compare, declared_interval, one_rounding_bounds, round_down, round_up,
                                         ulp_distance)
from conformance.judge.output_grid import off_grid

__all__ = ["Verdict", "PASSING", "BAD", "JUDGED", "Judgement", "judge", "judged_against", "rounded_interval",
           "reference_declaration",
           "QUALITY_MEAN_RATIO", "QUALITY_MAX_RATIO", "Evidence", "decide", "decide_opaque", "degenerate_reference",
           "failing_element", "require_output_grid"]


class Verdict(str, enum.Enum):
    """What one (backend, case) came to (docs/conformance.md#verdicts). A ``str``: the JSONL holds the value,
    and a record read back compares equal to its member (``"pass" == Verdict.PASS``)."""

    PASS = "pass"
    PASS_WITH_TIE_FLIPS = "pass-with-tie-flips"
    QUALITY_WARNING = "quality-warning"
    PASS_SQNR = "pass-sqnr"
    MISTRUSTED = "mistrusted"
    FAIL = "fail"
    CRASH = "crash"
    TIMEOUT = "timeout"
    UNSUPPORTED = "unsupported"
    WAIVED = "waived"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def parse(cls, text: "str | Verdict") -> "Verdict":
        """The member named ``text``; a ValueError naming the known verdicts otherwise."""
        try:
            return cls(text)
        except ValueError:
            raise ValueError(f"unknown verdict {text!r}; known: {', '.join(v.value for v in cls)}") from None

    @property
    def passing(self) -> bool:
        """Inside the declared interval (with tie flips, or at its edge): what certifies a case and what the
        console counts as passed. Not ``pass-sqnr`` (opaque arithmetic is never a conformance pass), not
        ``mistrusted`` (agreement that proves nothing), not ``waived`` (a known defect)."""
        return self in _PASSING

    @property
    def bad(self) -> bool:
        """``fail``, ``crash`` or ``timeout``: the run is NOT CONFORMANT and the self-test counts a kill."""
        return self in _BAD

    @property
    def judged(self) -> bool:
        """Came from comparing an output with its interval (a certification needs one per backend)."""
        return self in _JUDGED

    @property
    def neutral(self) -> bool:
        """Neither certifies nor withholds: not judged against the kernel, or agreement that proves nothing."""
        return self in (Verdict.UNSUPPORTED, Verdict.MISTRUSTED)

    @property
    def agrees(self) -> bool:
        """The output is one the declaration allows exactly as declared (inside the judged interval, or for a
        quantize-only case equal to the reference), whether or not that proves anything."""
        return self in (Verdict.PASS, Verdict.QUALITY_WARNING, Verdict.MISTRUSTED)

    @property
    def order(self) -> int:
        """Severity rank, 0 the worst: a report cell takes the colour of its worst verdict, a property family
        its weakest passing one. ``unsupported`` ranks last (a cell shows it only when nothing else is there)."""
        return _ORDER.index(self)

    @property
    def short(self) -> str:
        """At most 6 characters: the console table's column title."""
        return _SHORT[self]

    @classmethod
    def worst(cls, verdicts: "Iterable[str | Verdict]") -> "Verdict | None":
        """The most severe of ``verdicts`` (None when empty)."""
        vs = [cls.parse(v) for v in verdicts]
        return min(vs, key=lambda v: v.order) if vs else None


_PASSING = frozenset({Verdict.PASS, Verdict.PASS_WITH_TIE_FLIPS, Verdict.QUALITY_WARNING})
_BAD = frozenset({Verdict.FAIL, Verdict.CRASH, Verdict.TIMEOUT})
_JUDGED = frozenset({Verdict.PASS, Verdict.PASS_WITH_TIE_FLIPS, Verdict.QUALITY_WARNING, Verdict.MISTRUSTED,
                     Verdict.PASS_SQNR, Verdict.FAIL})
#: worst to best. pass-sqnr ranks below quality-warning: it is no conformance pass at all, so a family or cell
#: holding both must not read as the (conformant) quality warning
_ORDER = (Verdict.CRASH, Verdict.TIMEOUT, Verdict.FAIL, Verdict.WAIVED, Verdict.PASS_SQNR, Verdict.QUALITY_WARNING,
          Verdict.MISTRUSTED, Verdict.PASS_WITH_TIE_FLIPS, Verdict.PASS, Verdict.UNSUPPORTED)
_SHORT = {Verdict.PASS: "pass", Verdict.PASS_WITH_TIE_FLIPS: "ties", Verdict.QUALITY_WARNING: "qual",
          Verdict.FAIL: "fail", Verdict.CRASH: "crash", Verdict.TIMEOUT: "tmout", Verdict.UNSUPPORTED: "unsup",
          Verdict.WAIVED: "waived", Verdict.MISTRUSTED: "mistr", Verdict.PASS_SQNR: "sqnr"}
#: the sets, for ``rec["verdict"] in BAD`` on records read back (a str equals and hashes as its member)
PASSING = _PASSING
BAD = _BAD
JUDGED = _JUDGED


#: a pass whose error/bound ratio averages above this (with a maximum above QUALITY_MAX_RATIO) is a
#: quality-warning: correct by the contract's letter, but consistently at its edge
QUALITY_MEAN_RATIO = 0.5
QUALITY_MAX_RATIO = 0.9


@dataclasses.dataclass
class Evidence:
    """The intervals ``decide`` used beyond the declared ones (certification bundles store them)."""

    alt: "tuple[str, np.ndarray, np.ndarray] | None" = None  # (axis=rule, lo, hi) of a tie rule that explains y
    tie: "tuple[np.ndarray, np.ndarray, np.ndarray] | None" = None  # (lo, hi, ties per row) widened by tie flips


@dataclasses.dataclass(frozen=True)
class Judgement:
    """One judged output: its verdict and reason, its metrics (docs/conformance.md#metrics: max_ratio,
    max_ulp, sqnr_db, n_outside, exact_match, worst, tie_flips, worst_element; sqnr_floor_db when opaque),
    the outward interval the ratios and ULPs use (``loose``), the interval insideness was tested against
    (``judged``), and the other intervals the decision used (``evidence``)."""

    verdict: Verdict
    reason: str
    metrics: dict
    loose: Interval
    judged: Interval
    evidence: Evidence = dataclasses.field(default_factory=Evidence)

    def record(self) -> dict:
        """The flat form (metrics with ``verdict`` and ``reason``): what ``verify-bundle`` compares field by field."""
        return dict(self.metrics, verdict=self.verdict, reason=self.reason)


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


def _name_failing_element(j: Judgement, y) -> Judgement:
    """A failure's worst element made a failing one (item: the element a report names must fail)."""
    if j.verdict is not Verdict.FAIL:
        return j
    loose, judged, rec = j.loose, j.judged, j.metrics
    found = failing_element(y, judged, loose)
    if found is None:
        return j
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
    return j


def decide(y, loose: Interval, judged: Interval, *, output_rounding: str = "rne", alt=None, tie=None) -> Judgement:
    """The judgement of output ``y`` (``_decide``); a failure's worst element is a failing element,
    NaN/Inf mismatches first (``failing_element``)."""
    return _name_failing_element(_decide(y, loose, judged, output_rounding=output_rounding, alt=alt, tie=tie), y)


def _decide(y, loose: Interval, judged: Interval, *, output_rounding: str = "rne",
           alt: "Callable[[], tuple[str, str, np.ndarray, np.ndarray] | None] | None" = None,
           tie: "Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray] | None] | None" = None) -> Judgement:
    """The judgement of output ``y`` (the rule itself: ``judge`` gives it a case's intervals).

    ``loose`` is the outward interval [RD(y - b), RU(y + b)] (error/bound ratios, ULP distance, the
    worst element, the quality warning); ``judged`` the interval insideness is tested against (one
    declared rounding of an accumulator within the bound). Outside it, ``alt()`` may name another tie
    rule whose judged interval (lo, hi) contains y (-> ``fail`` naming it), and ``tie()`` may give the
    judged interval widened by activation tie flips with the tie count per row (-> ``pass-with-tie-flips``).
    Both are called only when needed; what they returned is kept in the judgement's ``evidence``.
    """
    ev = Evidence()
    cmp = compare(y, loose)
    cmp_j = compare(y, judged)
    rec = {"max_ratio": cmp.max_ratio, "max_ulp": cmp.max_ulp, "sqnr_db": cmp.sqnr_db, "n_outside": cmp_j.n_out,
           "exact_match": cmp.exact_match, "worst": list(cmp.worst) if cmp.worst else None, "tie_flips": 0}

    def done(verdict: Verdict, reason: str) -> Judgement:
        return Judgement(verdict, reason, rec, loose, judged, ev)

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
        return done(Verdict.FAIL, (
            f"the declared arithmetic gives no finite bound for {unbounded} element(s) with a finite reference "
            "(e.g. 16-bit accumulation over K terms with K*u >= 1): declare arithmetic=opaque with an SQNR floor"))
    if cmp_j.ok:
        if degenerate_reference(judged.y_ref):
            return done(Verdict.MISTRUSTED, "reference output is all zero, constant or non-finite")
        fin = np.isfinite(judged.y_exact)
        with np.errstate(divide="ignore", invalid="ignore"):
            side = np.where(y64 >= loose.y_ref, loose.hi - loose.y_ref, loose.y_ref - loose.lo)
            ratio = np.where(y64 == loose.y_ref, 0.0, np.abs(y64 - loose.y_ref) / side)
        ratio = ratio[fin & np.isfinite(ratio)]
        if (ratio.size and judged.bound.max(initial=0) > 0 and ratio.mean() > QUALITY_MEAN_RATIO
                and ratio.max() > QUALITY_MAX_RATIO):
            return done(Verdict.QUALITY_WARNING, f"error uses {ratio.mean():.0%} of the bound on average")
        return done(Verdict.PASS, "")
    n_out = cmp_j.n_out
    if y64.shape != judged.y_exact.shape:
        return done(Verdict.FAIL, f"output shape {tuple(y64.shape)} is not the expected "
                    f"{tuple(judged.y_exact.shape)}")
    a = alt() if alt is not None else None
    if a is not None:
        name, mine, alo, ahi = a
        if compare(y, dataclasses.replace(judged, lo=alo, hi=ahi)).ok:
            ev.alt = (name, alo, ahi)
            return done(Verdict.FAIL, f"{n_out} output element(s) outside the declared interval; the "
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
            return done(Verdict.PASS_WITH_TIE_FLIPS, f"outside the declared interval only where {rec['tie_flips']} "
                                                     f"activation tie(s) in {len(rows)} row(s) can flip")
    if cmp.ok:  # inside the outward interval, not the judged one: not the declared rounding
        return done(Verdict.FAIL, f"{n_out} output element(s) are not the declared rounding "
                    f"({(output_rounding or 'rne').lower()}) of any accumulator "
                    "within the bound (e.g. truncated instead of rounded to nearest)")
    return done(Verdict.FAIL, f"{n_out} output element(s) outside the declared interval")


def decide_opaque(y, loose: Interval, judged: Interval, floor_db: float) -> Judgement:
    """``_decide_opaque``, its failure naming a failing element (NaN/Inf mismatches first)."""
    return _name_failing_element(_decide_opaque(y, loose, judged, floor_db), y)


def _decide_opaque(y, loose: Interval, judged: Interval, floor_db: float) -> Judgement:
    """Verdict of a kernel declaring ``arithmetic=opaque`` (docs/conformance.md#opaque-arithmetic).

    Its arithmetic cannot be emulated, so it is judged against the intervals of its declared semantics
    with the canonical arithmetic (``loose`` outward, ``judged`` one rounding, as ``decide`` takes them;
    ``conformance.judge.verdict.reference_declaration``) and their reference rounded to the output dtype: the SQNR over the finite reference elements must be at least ``floor_db``, and
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

    def done(verdict: Verdict, reason: str) -> Judgement:
        return Judgement(verdict, reason, rec, loose, judged)

    if y64.shape != ref.shape:
        rec["sqnr_db"] = float("-inf")
        return done(Verdict.FAIL, f"output shape {list(y64.shape)}, expected {list(ref.shape)}")
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
        return done(Verdict.FAIL, f"{n} element(s) where the canonical reference is NaN or infinite "
                    f"differ from it (first {list(first)}: observed {float(y64[first])!r}, "
                    f"reference {float(ref[first])!r})")
    if not np.isfinite(y64[~nonfinite]).all():
        return done(Verdict.FAIL, "non-finite output where the canonical reference is finite")
    if degenerate_reference(ref):
        return done(Verdict.MISTRUSTED, "reference output is all zero, constant or non-finite")
    if not s >= floor_db:
        return done(Verdict.FAIL, f"opaque arithmetic: SQNR {s:.1f} dB against the reference "
                    f"is below the declared floor {floor_db:g} dB")
    return done(Verdict.PASS_SQNR, f"opaque arithmetic: SQNR {s:.1f} dB >= the declared floor "
                f"{floor_db:g} dB (not a conformance pass)")


# -- judging one case: its intervals, the other tie rules, the tie flips ---------------------------
def rounded_interval(iv: Interval, declared: Declared) -> Interval:
    """The interval narrowed to the outputs a kernel that rounds *once*, as it declares, can produce.

    A kernel's accumulator lies in [y - b, y + b]; it rounds it once to the output dtype with its
    declared ``output_rounding`` R (rne or rtz). R is monotone and returns grid points unchanged, so
    its outputs are exactly the grid points of [R(y - b), R(y + b)] (the arguments widened by one
    float64 ulp outward, so the float64 evaluation of y -+ b cannot exclude a correct value). The
    interval from ``declared_interval`` rounds outward ([RD(y - b), RU(y + b)]), which also admits
    the neighbour on the other side of a correctly rounded value: a kernel that truncates while
    declaring round-to-nearest would pass it. Where the declaration adds a stage after the rounding
    (``bias_stage=after_output_rounding``) the interval is kept as is: ``declared_interval`` narrowed the
    rounded output before the bias was added (``acceptance.one_rounding_bounds``); under another rounding too.
    """
    mode = (declared.output_rounding or "rne").lower()
    if mode not in ("rne", "rtz") or iv.bias_after_output_rounding:
        return iv
    lo, hi = one_rounding_bounds(iv, mode)
    return dataclasses.replace(iv, lo=lo, hi=hi)


def reference_declaration(case, declared: Declared) -> Declared:
    """The declaration a case's output is judged against: the backend's own, or for ``arithmetic=opaque``
    its named variants (which weights, zero points, scales) with the canonical arithmetic: exact weights,
    float32 accumulation, one RNE rounding to the output dtype (docs/conformance.md#opaque-arithmetic)."""
    if declared.arithmetic != "opaque":
        return declared
    return Declared(variants=dict(declared.variants), accumulate="float32", output=declared.output or case.output_dtype)


def _tie_widening(iv: Interval, inp, declared: Declared) -> "tuple[np.ndarray, np.ndarray] | None":
    """Extra allowed error per output element if every activation tie could flip, and tie counts per row."""
    tie = iv.x_tie
    if tie is None or not np.any(tie):
        return None
    case = inp.case
    if case.spec.activations == "int8":
        w = declared_weight(case, inp.tensors, dataclasses.replace(declared, weight_dtype="exact")).astype(np.float64)
        step = np.abs(iv.x_scale.astype(np.float64)) * tie  # one code = one scale step
    else:
        # MXFP4 (w4a4-mxfp4) is not widened: its block scale is a power of two, so x / 2^s is exact and an E2M1
        # midpoint is a midpoint in every arithmetic (the quotient dtypes that round are declared variants the
        # reference applies). A flipped E2M1 tie is another rounding rule, even when only some midpoints flip.
        return None
    with np.errstate(invalid="ignore"):
        widen = step @ np.abs(w).T
    return widen, tie.sum(axis=1)


#: the variant axis naming a scheme's activation tie rule
_TIE_AXES = {"w8a8": "act_rounding", "w4a8": "act_rounding", "w4a4-mxfp4": "e2m1_rounding"}


def _alternative_rule(inp, y, declared: Declared, judged: Interval):
    """(axis=rule, axis=declared rule, lo, hi) of the first other tie rule whose judged interval holds ``y``.

    A kernel that resolves *every* tie by a different rule is not flipping ties by
    accident of its arithmetic: it implements another rounding mode.
    """
    axis = _TIE_AXES.get(inp.case.scheme)
    if axis is None:
        return None
    mine = declared.variants.get(axis) or "rne"
    for rule in ("rne", "rhaz", "rhtz", "rtz"):
        if rule == mine:
            continue
        alt = dataclasses.replace(declared, variants=dict(declared.variants, **{axis: rule}))
        try:
            aiv = rounded_interval(declared_interval(inp, alt), alt)
            if compare(y, dataclasses.replace(judged, lo=aiv.lo, hi=aiv.hi)).ok:
                return f"{axis}={rule}", f"{axis}={mine}", aiv.lo, aiv.hi
        except Exception:  # noqa: BLE001 - a rule the scheme cannot evaluate explains nothing
            continue
    return None


def _tie_interval(inp, judged: Interval, declared: Declared):
    """(lo, hi, ties per row): the judged interval widened by every activation tie flip, or None."""
    if not np.isfinite(judged.y_exact).all():
        return None
    widened = _tie_widening(judged, inp, declared)
    if widened is None:
        return None
    widen, ties_per_row = widened
    with np.errstate(invalid="ignore"):
        wide = rounded_interval(dataclasses.replace(
            judged, lo=round_down(judged.y_exact - judged.bound - widen, judged.out_dtype),
            hi=round_up(judged.y_exact + judged.bound + widen, judged.out_dtype), bound=judged.bound + widen), declared)
    return wide.lo, wide.hi, ties_per_row


def require_output_grid(j: Judgement, y) -> Judgement:
    """``j`` made a failure naming the first element of ``y`` off ``j.judged.out_dtype``'s grid, if any: a kernel
    that declares a 16-bit output but returns float32 values would otherwise pass every element whose judged
    interval spans two grid values (conformance/judge/output_grid.py; docs/conformance.md#verdicts)."""
    judged = j.judged
    y64 = np.asarray(y, np.float64)
    if j.verdict is Verdict.FAIL or y64.shape != judged.y_exact.shape:
        return j
    bad = off_grid(y64, judged.out_dtype)
    n = int(bad.sum())
    if not n:
        return j
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    metrics = dict(j.metrics, worst=list(idx))
    metrics["worst_element"] = {"index": list(idx), "observed": float(y64[idx]), "expected": float(judged.y_exact[idx]),
                                "lo": float(judged.lo[idx]), "hi": float(judged.hi[idx]),
                                "reference": float(judged.y_ref[idx]),
                                "ulp": ulp_distance(float(round_fast(y64[idx], judged.out_dtype, as_float64=True)),
                                                    float(judged.y_ref[idx]), judged.out_dtype)}
    reason = (f"{n} output element(s) are not values of the declared output dtype {judged.out_dtype} "
              f"(off its grid: e.g. element {list(idx)} = {float(y64[idx])!r}; the kernel returns another "
              "dtype's values or rounds to a wider format than it declares)")
    return dataclasses.replace(j, verdict=Verdict.FAIL, reason=reason, metrics=metrics)


def judged_against(inp, declared: Declared) -> Interval:
    """The interval ``judge`` takes for case ``inp`` under ``declared``: that of ``reference_declaration``."""
    return declared_interval(inp, reference_declaration(inp.case, declared))


def judge(inp, iv: Interval, y, declared: Declared) -> Judgement:
    """The judgement of one observed output ``y`` of case ``inp`` under ``declared``.

    ``iv`` is ``judged_against(inp, declared)``, the interval of ``reference_declaration(inp.case, declared)``
    (the runner takes it from its reference cache). Inside means inside ``rounded_interval`` (the outputs of one
    declared rounding of an accumulator within the bound: the judgement's ``judged``); the error/bound
    ratios and the quality warning use the outward interval ``iv`` (its ``loose``). Outside, the other tie
    rules and the activation tie flips are tried (their intervals kept in ``evidence``). A declaration of
    ``arithmetic=opaque`` is judged by ``decide_opaque`` against the canonical interval.
    """
    if declared.arithmetic == "opaque":
        judged = rounded_interval(iv, reference_declaration(inp.case, declared))
        return require_output_grid(decide_opaque(y, iv, judged, declared.sqnr_floor_db), y)
    judged = rounded_interval(iv, declared)
    return require_output_grid(decide(y, iv, judged, output_rounding=declared.output_rounding,
                                      alt=lambda: _alternative_rule(inp, y, declared, judged),
                                      tie=lambda: _tie_interval(inp, judged, declared)), y)
