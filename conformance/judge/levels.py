"""Conformance levels of a judged case: how far the declaration is from the checkpoint's semantics, and by
how much the kernel's output differs from the canonical reference.

Semantics: docs/conformance.md#levels; the level of each variant value is defined once, in
emulator/variants.py (docs/variants.md).

A case passes when the output lies inside the interval of the backend's *own* declaration. The level
says what that pass is worth: ``canonical`` (the declaration is the checkpoint's semantics),
``rounding`` (declared variants that only round differently; the measured distance from the
canonical reference is recorded: worst ULP, SQNR, elements outside the canonical interval) or
``semantic`` (the kernel computes other weights, zero points, scales or activations than the
checkpoint defines). A run with an unwaived semantic deviation is NOT CONFORMANT.
"""

from __future__ import annotations

from emulator.declaration import Declared, canonical_declaration
from emulator.schemes import Case
from emulator.variants import Level

from conformance.judge.acceptance import compare, declared_interval

__all__ = ["assess", "run_level", "LEVEL_ORDER"]

LEVEL_ORDER = tuple(m.label for m in Level)


def assess(case: Case, declared: Declared, inp, y, *, interval=None) -> dict:
    """{"level", "deviations"[, "canonical_distance"]} of one judged case (JSON-able).

    ``canonical_distance`` (only for a non-canonical declaration with an output): the output compared
    with the canonical interval (fp32 accumulation, the checkpoint's own semantics): its worst ULP
    distance from the canonical reference, SQNR against the exact canonical value, and how many elements
    lie outside the canonical interval. ``interval(declared)``: how the interval of a declaration on
    ``inp`` is obtained (default ``declared_interval``; the runner shares them, conformance/run/refcache.py).
    """
    devs = declared.deviations(case, inp.tensors)
    level = max((d.level for d in devs), default=Level.CANONICAL)
    out = {"level": level.label,
           "deviations": [{"variant": str(d), "level": d.level.label} for d in devs]}
    if devs and y is not None:
        try:
            canonical = canonical_declaration(case, accumulate="float32")
            c = compare(y, interval(canonical) if interval else declared_interval(inp, canonical))
        except Exception as e:  # noqa: BLE001 - the canonical reference may be undefined (e.g. NaN inputs)
            out["canonical_distance"] = {"error": f"{type(e).__name__}: {e}"}
        else:
            out["canonical_distance"] = {"max_ulp": c.max_ulp, "sqnr_db": c.sqnr_db, "n_outside": c.n_out}
    return out


def run_level(levels) -> str | None:
    """The farthest of several levels (labels); None when there are none."""
    seen = [Level.parse(x) for x in levels if x]
    return max(seen).label if seen else None
