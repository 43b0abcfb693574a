"""Fingerprint output: one line per axis, the text report, and the per-scheme markdown tables of
docs/fingerprints.md.

Part of conformance/fingerprint/decide.py (which re-exports ``format_text`` and ``markdown_tables``).
"""

from __future__ import annotations

from conformance.fingerprint.axes import PROBE_AXES, SCHEME_AXES

__all__ = ["axis_line", "vocabulary_line", "format_text", "markdown_tables", "vocabulary_tables"]


# -- output ---------------------------------------------------------------------------------------
def axis_line(scheme: str, a: dict) -> str:
    head = f"  {scheme:12s} {a['axis']:20s}"
    if a["status"] == "unsupported":
        return f"{head} unsupported: {a.get('reason', '')[:160]}"
    if a["status"] == "not-applicable":
        return f"{head} not applicable: {a.get('reason', '')[:200]}"
    if a["status"] in ("crash", "error"):
        return f"{head} {a['status']}: {a.get('reason', '')[:200]}"
    if a["status"] == "not-named":  # the localization shows the weights or activations wrong (fingerprint.py)
        return f"{head} not named: {a.get('reason', '')[:300]}"
    cons = ", ".join(a.get("consistent", [])) or "NONE"
    if a["axis"] == "accumulate" and a.get("bracket"):
        cons = f"{a['bracket']} (consistent: {cons})"
    exc = "; ".join(f"{v} [{', '.join(p) or '-'}]" for v, p in a.get("excluded", {}).items())
    line = f"{head} consistent: {cons}"
    if a.get("identified") and len(a.get("consistent", [])) > 1:
        line += f" (identified: {a['identified']}, {a.get('identified_by', '')})"
    if exc:
        line += f" | excluded: {exc}"
    if a["status"] == "not-observable":
        line += " | not observable"
    if a.get("unseparated"):
        line += " | not separated: " + ", ".join("/".join(p) for p in a["unseparated"][:4])
    if a.get("crashed_probes"):
        line += f" | {len(a['crashed_probes'])} probe(s) failed: " + a["crashed_probes"][0][:120]
    if a.get("unexplained_probes"):
        line += " | set aside (no value explains them): " + ", ".join(a["unexplained_probes"][:3])
    line += f" | declared: {a.get('declared') or '-'}"
    if a.get("contradiction"):
        line += f"  ** CONTRADICTS DECLARATION: {a['contradiction']}"
    return line


def format_text(result: dict) -> str:
    lines = [f"fingerprint of {result.get('label', result['backend'])} "
             f"({result.get('version') or '-'}, {result.get('device') or '-'}), activations {result['act_dtype']}"]
    if result.get("status") == "unavailable":
        lines.append(f"  unavailable: {result.get('reason')}")
        return "\n".join(lines)
    for scheme, s in result["schemes"].items():
        for a in s["axes"]:
            lines.append(axis_line(scheme, a))
        voc = result.get("vocabulary", {}).get(scheme)
        if voc:
            lines.append(vocabulary_line(scheme, voc))
        if s.get("unmodelled_keys"):
            lines.append(f"  {scheme:12s} declared keys the emulator does not model: {', '.join(s['unmodelled_keys'])}")
    if result["contradictions"]:
        lines.append(f"{len(result['contradictions'])} contradiction(s) with the declared arithmetic:")
        lines += [f"  - {c}" for c in result["contradictions"]]
    else:
        lines.append("no contradiction with the declared arithmetic")
    return "\n".join(lines)


def vocabulary_line(scheme: str, voc: dict) -> str:
    """Every vocabulary key of the scheme: its identified value, or why there is none."""
    ident = [f"{k}={r['values'][0]}" for k, r in voc.items() if r["status"] == "identified"]
    amb = [f"{k}={'|'.join(r['values'])}" for k, r in voc.items() if r["status"] == "ambiguous"]
    rest: dict = {}
    for k, r in voc.items():
        if r["status"] not in ("identified", "ambiguous"):
            rest.setdefault(r["status"], []).append(k)
    parts = [f"identified {', '.join(ident) or '-'}"]
    if amb:
        parts.append(f"ambiguous {', '.join(amb)}")
    parts += [f"{st} {', '.join(ks)}" for st, ks in rest.items()]
    return f"  {scheme:12s} vocabulary: " + "; ".join(parts)


# -- tables (docs/fingerprints.md) -------------------------------------------------------------------
def _cell(a: dict | None) -> str:
    if a is None:
        return ""
    st = a.get("status")
    if st == "unsupported":
        return "-"
    if st == "not-applicable":
        return "n/a"
    if st in ("crash", "error"):
        return st
    if st == "not-named":
        return "not named (inputs wrong)"
    cons = a.get("consistent") or []
    if a["axis"] == "accumulate" and a.get("bracket"):
        b = a["bracket"]
        text = ("<= float64" if b.startswith("no accumulation error") else
                b.replace("coarser than ", "> ").replace(", within the ", ", <= ").replace(" bound", ""))
    elif st == "not-observable":
        text = "not observable"
    else:
        text = " / ".join(cons) if cons else "NONE"
    if a.get("contradiction"):
        text += f" **(declared {a.get('declared')})**"
    return text


def markdown_tables(results: list[dict], names: list[str] | None = None, hand_only: bool = False) -> str:
    """One markdown table per scheme: a row per fingerprint, a column per axis (consistent values);
    ``hand_only``: the hand-written axes only (``vocabulary_tables`` shows the derived ones)."""
    names = names or [r.get("label", r["backend"]) for r in results]
    out = []
    for scheme, axes in SCHEME_AXES.items():
        if hand_only:
            axes = tuple(a for a in axes if not PROBE_AXES[a].derived)
            if not axes:
                continue
        rows = []
        for name, r in zip(names, results):
            got = {a["axis"]: a for a in r.get("schemes", {}).get(scheme, {}).get("axes", [])}
            if not got or all(a.get("status") == "unsupported" for a in got.values()):
                continue
            rows.append(f"| {name} | " + " | ".join(_cell(got.get(ax)) for ax in axes) + " |")
        if not rows:
            continue
        out.append(f"**{scheme}**\n")
        out.append("| backend | " + " | ".join(axes) + " |")
        out.append("| --- | " + " | ".join("---" for _ in axes) + " |")
        out += rows
        out.append("")
    return "\n".join(out)


def _vcell(row: dict | None) -> str:
    if row is None:
        return ""
    st = row["status"]
    if st == "identified":
        return row["values"][0]
    if st == "ambiguous":
        return " / ".join(row["values"])
    return {"not-observable": "not observable", "not-applicable": "n/a", "unsupported": "-", "inconsistent": "NONE",
            "not-probed": "", "declaration": ""}.get(st, st)


def vocabulary_tables(results: list[dict], names: list[str] | None = None, derived_only: bool = True) -> str:
    """Per scheme a table with a row per vocabulary key and a column per fingerprint: the value identified
    (``a / b``: consistent, none identified; ``n/a``: not applicable; ``-``: the backend implements no
    probe case); ``derived_only``: the keys decided by derived axes (the hand-written ones have their tables)."""
    names = names or [r.get("label", r["backend"]) for r in results]
    out = []
    for scheme in SCHEME_AXES:
        voc = [r.get("vocabulary", {}).get(scheme, {}) for r in results]
        cols = [i for i, v in enumerate(voc) if any(x["status"] not in ("unsupported", "not-probed", "declaration")
                                                      for x in v.values())]
        if not cols:
            continue
        keys = []
        for v in (voc[i] for i in cols):
            for k, row in v.items():
                probe = row.get("probe")
                if probe is None or (derived_only and not PROBE_AXES[probe].derived) or k in keys:
                    continue
                keys.append(k)
        if not keys:
            continue
        out.append(f"**{scheme}** (derived axes)\n")
        out.append("| key | " + " | ".join(names[i] for i in cols) + " |")
        out.append("| --- | " + " | ".join("---" for _ in cols) + " |")
        for k in keys:
            out.append(f"| `{k}` | " + " | ".join(_vcell(voc[i].get(k)) for i in cols) + " |")
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    """python -m conformance.fingerprint.render NAME=FILE.json ...: the tables of docs/fingerprints.md."""
    import json
    import sys

    pairs = [a.split("=", 1) for a in (sys.argv[1:] if argv is None else argv)]
    if not pairs or any(len(p) != 2 for p in pairs):
        print("usage: python -m conformance.fingerprint.render NAME=FINGERPRINT.json ...", file=sys.stderr)
        return 2
    names = [p[0] for p in pairs]
    results = [json.loads(open(p[1], encoding="utf-8").read()) for p in pairs]
    print(markdown_tables(results, names, hand_only=True))
    print(vocabulary_tables(results, names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
