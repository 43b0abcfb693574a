"""The invariant under every green a run can print: it holds a result for every case it was asked for.

Semantics: docs/conformance.md#exit-status. ``enforce`` is the one function that turns a summary
whose results fall short of its case list (or whose run was stopped) into INCOMPLETE or
INTERRUPTED: never CONFORMANT, never exit 0. ``summarize_sources`` applies it with the counts of
each source's last run header (so ``qconform report`` on a half-finished folder says so too);
``qconform run`` applies it again, right before its exit status, with the exact (backend, case)
pairs it asked for.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["INCOMPLETE", "INTERRUPTED", "HEADLINES", "header_shortfall", "missing_pairs", "enforce"]

INCOMPLETE = "incomplete"
INTERRUPTED = "interrupted"
#: the headlines of these statuses (conformance/report/summary.py's HEADLINES takes them from here)
HEADLINES = {INCOMPLETE: "INCOMPLETE", INTERRUPTED: "INTERRUPTED"}
#: column / run statuses a shortfall replaces (a found failure stays NOT CONFORMANT: it is a finding)
_REPLACED = ("conformant", "accurate", "not-certified", "unavailable")


def header_shortfall(src: dict, *, property_tier: str = "property") -> "dict | None":
    """{backend label: missing count} where a source's last run header asks for more results than it holds
    (``case_count`` cases for each of its ``backends``); None when it holds them all or has no header."""
    headers = src.get("headers") or []
    if not headers:
        return None
    h = headers[-1]
    n_cases, backends = h.get("case_count"), h.get("backends") or []
    n_prop = h.get("property_searches")  # one result line per (backend, property family)
    n_prop = n_prop if isinstance(n_prop, int) and n_prop > 0 else 0
    if not isinstance(n_cases, int) or n_cases < 0 or n_cases + n_prop == 0 or not backends:
        return None
    results = src.get("results") or []
    missing: dict = {}
    for want, mine, none in ((n_cases, lambda r: r.get("tier") != property_tier, "(backends with no result)"),
                             (n_prop, lambda r: r.get("tier") == property_tier, "(backends with no property search)")):
        if not want:
            continue
        per = Counter(r.get("backend") for r in results if mine(r))
        for b, n in per.items():
            if n < want:
                missing[b] = missing.get(b, 0) + want - n
        absent = len(backends) - len(per)  # backends of the header with no result line at all
        if absent > 0:
            missing[none] = missing.get(none, 0) + absent * want
    return missing or None


def missing_pairs(results: list, labels: dict, backends: list, case_ids: list) -> dict:
    """{backend label (or spec, where it never said hello): missing count} for the (backend, case) pairs
    of ``backends`` x ``case_ids`` that have no result record in ``results``."""
    have = {(r.get("backend"), r.get("case_id")) for r in results if r.get("kind", "result") == "result"}
    out = {}
    for b in backends:
        label = labels.get(b)
        n = len(case_ids) if label is None else sum(1 for cid in case_ids if (label, cid) not in have)
        if n:
            out[label or b] = n
    return out


def enforce(summary: dict, *, missing: "dict | None" = None, expected: "int | None" = None,
            interrupted: "str | None" = None) -> dict:
    """Mark ``summary`` (in place; returned) INTERRUPTED (``interrupted``: what stopped the run) or, where
    ``missing`` counts results it lacks, INCOMPLETE; ``ok`` is then False. A summary with nothing missing
    and no interruption is returned unchanged."""
    missing = {k: v for k, v in (missing or {}).items() if v > 0}
    if not missing and not interrupted:
        return summary
    n_missing = sum(missing.values())
    total = expected if expected is not None else summary.get("n_results", 0) + n_missing
    notes = summary.setdefault("notes", [])
    if interrupted:
        summary["status"] = INTERRUPTED
        notes.insert(0, f"interrupted ({interrupted}): {max(total - n_missing, 0)} of {total} result(s) written; "
                        "the verdict counts only the cases that finished")
    elif summary.get("status") in _REPLACED:
        summary["status"] = INCOMPLETE
    if missing and not interrupted:
        notes.insert(0, f"incomplete: {n_missing} of {total} result(s) missing ("
                        + ", ".join(f"{k}: {v}" for k, v in sorted(missing.items())) + ")")
    for col in summary.get("columns") or []:
        if col.get("key") in missing and col.get("status") in _REPLACED:
            col["status"] = INCOMPLETE
    summary["ok"] = False
    summary["n_missing"] = n_missing
    if summary["status"] in HEADLINES:  # (a NOT CONFORMANT summary keeps its headline)
        summary["headline"] = HEADLINES[summary["status"]]
    return summary
