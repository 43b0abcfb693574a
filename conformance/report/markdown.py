"""report.md: the summary as Markdown (what a CI job attaches or a pull request quotes).

Semantics: docs/certification.md#reports. Input: the summary of conformance/report/summary.py.
"""

from __future__ import annotations

from conformance.judge.localize_text import localization_lines
from conformance.report.summary import LEVELS_MEANING, PASS_MEANING, RATIO_BINS, cell_index, deviation_lines, counts_text, describe_worst, fmt_ratio, fmt_sqnr

__all__ = ["render_markdown", "MAX_LISTED"]

MAX_LISTED = 300  # failing cases listed in full (all are in summary.json)


def _md(text: str) -> str:
    """Text safe inside a Markdown table cell or list item."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(summary: dict, *, title: str = "qconform conformance report") -> str:
    L = _md_status(summary, title) + _md_matrix(summary) + _md_failures(summary) + _md_waivers_and_environment(summary)
    return "\n".join(L) + "\n"


def _md_status(summary: dict, title: str) -> list[str]:
    """The title, the status line, what a pass means, the notes and the levels."""
    L = [f"# {title}", "", f"**{summary['headline']}**: {summary['n_results']} result(s), {summary['n_judged']} "
         f"judged, {summary['n_bad']} failing (fail, crash, timeout).", "", PASS_MEANING, ""]
    for nc in summary.get("not_certified", []):
        L.append(f"- **not certified**: {nc['column']}: {_md(nc['why'])}")
    if summary.get("not_certified"):
        L.append("")
    for n in summary.get("notes", []):
        if not n.startswith("not certified: "):
            L += [f"> {n}", ""]
    L += ["## Conformance levels", "", f"Run level: **{summary.get('level') or '-'}**. {LEVELS_MEANING}", ""]
    L += [f"- {_md(line)}" for line in deviation_lines(summary)] or ["- every judged declaration is canonical"]
    L += [""]
    return L


def _md_matrix(summary: dict) -> list[str]:
    """The support matrix and why cases were unsupported."""
    idx = cell_index(summary)
    L: list = []
    L += ["## Support matrix", "",
          "Cell: worst verdict, counts, then the worst error/bound ratio, ULP distance, lowest SQNR and tie flips; "
          "`hist` is the per-case max error/bound histogram (bins " + ", ".join(RATIO_BINS) + ").", ""]
    cols = summary["columns"]
    L.append("| scheme | " + " | ".join(c["key"] for c in cols) + " |")
    L.append("| --- |" + " --- |" * len(cols))
    for scheme in summary["schemes"]:
        row = [scheme]
        for col in cols:
            c = idx.get((col["key"], scheme))
            if c is None:
                row.append("—")
                continue
            row.append(f"**{c['worst_verdict']}** {counts_text(c['counts'])}<br>level {c.get('level') or '-'}, ratio ≤ {fmt_ratio(c['max_ratio'])}, "
                       f"ULP ≤ {c['max_ulp'] if c['max_ulp'] is not None else '-'}, SQNR ≥ {fmt_sqnr(c['min_sqnr_db'])}, "
                       f"ties {c['tie_flips']}<br>hist `{' '.join(str(h) for h in c['ratio_hist'])}`")
        L.append("| " + " | ".join(row) + " |")
    unsup = [c for c in summary["cells"] if c.get("unsupported_reasons")]
    if unsup:
        L += ["", "## Unsupported cases", "", "Why each backend declined cases (its `can_implement` reason), per cell:", ""]
        for c in unsup:
            L.append(f"- {c['column']} · {c['scheme']}:")
            for r, n in c["unsupported_reasons"].items():
                L.append(f"  - {n} × {_md(r)}")
    return L


def _md_failures(summary: dict) -> list[str]:
    """The failing cases, grouped by signature, at most MAX_LISTED listed."""
    L: list = []
    L += ["", f"## Failing cases ({len(summary['failures'])})", ""]
    if not summary["failures"]:
        L.append("None.")
    else:
        L += ["Grouped by signature (backend, scheme, format, declared variants, verdict, reason). Replay commands "
              "name bundles relative to the folder of this report: run them there.", ""]
    by_case = {(f["column"], f["case_id"]): f for f in summary["failures"]}
    listed = 0
    for g in summary.get("failure_groups", []):
        sig, ex = g["signature"], g["example"]
        L += [f"### {g['count']} × {sig['verdict']}: {sig['column']} · {sig['scheme']} · {sig['weight_format']} · "
              f"variants `{sig['variants']}`", "", f"Reason: {_md(sig['reason'])}", "",
              f"Example `{ex['case_id']}`: {_md(ex['reason'] or '')}", "",
              f"- worst element {describe_worst(ex['worst_element'])}",
              f"- declaration notes: {_md(ex['notes'] or '(none)')}"]
        L += [f"- {_md(line.strip())}" for line in localization_lines(ex.get("localization"))]
        if ex.get("replay"):
            L.append(f"- replay: `{ex['replay']}`")
        L += ["", "| case | worst element | replay |", "| --- | --- | --- |"]
        for cid in g["case_ids"]:
            if listed >= MAX_LISTED:
                break
            f = by_case.get((sig["column"], cid), {})
            L.append(f"| `{cid}` | {_md(describe_worst(f.get('worst_element')))} | "
                     f"{'`' + f['replay'] + '`' if f.get('replay') else '—'} |")
            listed += 1
        L.append("")
    if listed < len(summary["failures"]):
        L.append(f"... {len(summary['failures']) - listed} more failing case(s) in summary.json")
    return L


def _md_waivers_and_environment(summary: dict) -> list[str]:
    """The waivers, each host's environment and the runs."""
    L: list = []
    w = summary["waivers"]
    L += ["", "## Waivers", ""]
    if not (w["declared"] or w["applied"] or w["expired"] or w["stale"]):
        L.append("No waivers were given.")
    for x in w["declared"]:
        L.append(f"- declared: backend `{x.get('backend')}` scheme `{x.get('scheme')}` case `{x.get('case')}` — "
                 f"{x.get('reason')} ({x.get('issue')}, expires {x.get('expires')})")
    for label, rows in (("applied", w["applied"]), ("expired", w["expired"]), ("stale", w["stale"])):
        for r in rows[:MAX_LISTED]:
            L.append(f"- {label}: {r['column']} `{r['case_id']}` ({(r.get('waiver') or {}).get('issue', '')})")
    L += ["", "## Environment", ""]
    for host, env in summary["environment"].items():
        L.append(f"### {host}")
        L.append("")
        for k in ("platform", "python", "cpu", "torch", "numpy", "emulator_version", "suite_version", "git_commit",
                  "devices"):
            if env.get(k) is not None:
                L.append(f"- {k}: {', '.join(env[k]) if isinstance(env[k], list) else env[k]}")
        if env.get("libraries"):
            L.append("- libraries: " + ", ".join(f"{k} {v}" for k, v in env["libraries"].items()))
        if env.get("cpu_flags"):
            L.append("- CPU flags: " + " ".join(env["cpu_flags"]))
        for b in env.get("backends") or []:
            L.append(f"- backend {b.get('backend')}: {b.get('version') or '-'} on {b.get('device') or '-'}"
                     + ("" if b.get("available") else f" (unavailable: {b.get('reason')})"))
        L.append("")
    if summary["runs"]:
        L += ["## Runs", "", "| host | profile | cases | shard | case list sha256 | time |", "| --- | --- | --- | --- | --- | --- |"]
        for r in summary["runs"]:
            L.append(f"| {r.get('host')} | {r.get('profile')} | {r.get('case_count')} | {r.get('shard') or '-'} | "
                     f"`{r.get('case_list_sha256')}` | {r.get('time')} |")
    return L
