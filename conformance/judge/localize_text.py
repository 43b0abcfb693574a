"""A failure localization (conformance/judge/localize.py) as text lines: console, report.md, report.html, replay.

Semantics: docs/conformance.md#failure-localization. Pure: a record's ``localization`` dict in, lines out.
"""

from __future__ import annotations

__all__ = ["localization_lines", "summary_line", "PARTS"]

#: (record key, title) of each probed stage, in the order they are shown
PARTS = (("output_rows", "output rows"), ("weights", "weights"), ("activations", "activation quantization"), ("own_rows", "own rows"),
         ("bias", "bias"), ("own_output", "own output"), ("experts", "experts"))


def summary_line(loc: dict | None) -> str:
    """One line: the stage found wrong and how (or why there is no localization)."""
    if not loc:
        return ""
    if loc.get("error"):
        return f"not localized: the probes failed ({loc['error']})"
    return loc.get("summary") or ""


def localization_lines(loc: dict | None, limit: int = 6) -> list[str]:
    """The summary line, then each finding with its place, pattern and count, then the probes run."""
    if not loc:
        return []
    out = [f"localization: {summary_line(loc)}"]
    for key, title in PARTS:
        part = loc.get(key)
        if not part or part.get("ok"):
            continue
        if part.get("explained_by"):
            out.append(f"  {title}: the one-hot readback differs only as '{part['explained_by']}' makes it (right)")
            continue
        for f in part.get("findings", [])[:limit]:
            out.append(f"  {title}: {f['where']}: {f['pattern']} ({f['n']} of {part['n']} probe elements)")
    own = loc.get("own_rows") or {}
    if own.get("classes") and not own.get("ok"):
        cls = "; ".join(f"{t['class']}: {t['fail']} fail, {t['pass']} pass" for t in own["classes"])
        out.append(f"  own rows by value class: {cls}")
    if own.get("alone_vs_together"):
        out.append(f"  own rows: {own['alone_vs_together']}")
    for p in loc.get("probes", []):
        out.append(f"  probe: {p}")
    return out
