"""report.html: one self-contained file (inline CSS and SVG, no script, no network: it opens from disk).

Semantics: docs/certification.md#reports. Input: the summary of conformance/report/summary.py.
"""

from __future__ import annotations

import html
import math

from conformance.judge.localize_text import localization_lines
from conformance.report.summary import (LEVELS_MEANING, PASS_MEANING, deviation_lines, RATIO_BINS, VERDICT_ORDER, cell_index, counts_text, describe_worst, fmt_ratio,
                      fmt_sqnr)

__all__ = ["render_html", "ratio_histogram_svg", "COLOURS", "TINTS"]

#: background, text colour per verdict (colour-blind safe pairs: red/orange/yellow vs blue-green)
COLOURS = {
    "crash": ("#7f1d1d", "#ffffff"),
    "timeout": ("#c2410c", "#ffffff"),
    "fail": ("#dc2626", "#ffffff"),
    "waived": ("#a78bfa", "#1e1b4b"),
    "quality-warning": ("#facc15", "#3f2d00"),
    "mistrusted": ("#93c5fd", "#0c2a4d"),
    "pass-sqnr": ("#fdba74", "#431407"),
    "pass-with-tie-flips": ("#5eead4", "#053b35"),
    "pass": ("#16a34a", "#ffffff"),
    "unsupported": ("#e5e7eb", "#4b5563"),
}
#: light cell background per verdict
TINTS = {"crash": "#fecaca", "timeout": "#ffedd5", "fail": "#fee2e2", "waived": "#ede9fe", "quality-warning": "#fef9c3",
         "mistrusted": "#dbeafe", "pass-sqnr": "#ffedd5", "pass-with-tie-flips": "#ccfbf1", "pass": "#dcfce7", "unsupported": "#f3f4f6"}
#: histogram of per-case max error/bound ratios: exactly 0 (correctly rounded everywhere), ten bins of 0.1
#: up to 1 (inside the interval), and > 1 (outside: a failure or tie flips)
PER_GROUP = 40  # failing cases shown per failure signature in the HTML report


def ratio_histogram_svg(hist: list[int], *, width: int = 168, height: int = 58, title: str = "") -> str:
    """An inline SVG bar chart of a ratio histogram: bars as <path> per zone, axis, the bound at ratio 1."""
    n = len(hist)
    left, right, top, bottom = 3, 3, 4, 14
    pw = width - left - right
    ph = height - top - bottom
    bw = pw / n
    peak = max(hist) if hist and max(hist) > 0 else 1
    zones = {"exact": ([0], "#166534"), "low": (list(range(1, 6)), "#22c55e"), "high": (list(range(6, 11)), "#eab308"),
             "out": ([n - 1], "#dc2626")}
    parts = []
    for zone, (idx, colour) in zones.items():
        d = []
        for i in idx:
            if i >= n or hist[i] <= 0:
                continue
            # sqrt scale keeps single cases visible next to hundreds; at least 2 px
            h = max(2.0, ph * math.sqrt(hist[i] / peak))
            x = left + i * bw + 1
            y = top + ph - h
            d.append(f"M{x:.1f} {y:.1f}h{bw - 2:.1f}v{h:.1f}h{-(bw - 2):.1f}z")
        if d:
            parts.append(f'<path class="bars bars-{zone}" fill="{colour}" d="{"".join(d)}"/>')
    base_y = top + ph + 0.5
    axis = f'<path class="axis" stroke="#6b7280" stroke-width="1" fill="none" d="M{left} {base_y:.1f}H{width - right}"/>'
    bx = left + (n - 1) * bw
    bound = (f'<path class="bound" stroke="#991b1b" stroke-width="1" stroke-dasharray="2 2" fill="none" '
             f'd="M{bx:.1f} {top - 2}V{base_y:.1f}"/>')
    labels = (f'<text x="{left + bw / 2:.1f}" y="{height - 3}" text-anchor="middle">0</text>'
              f'<text x="{left + 5.5 * bw:.1f}" y="{height - 3}" text-anchor="middle">0.5</text>'
              f'<text x="{bx - 1:.1f}" y="{height - 3}" text-anchor="end">1</text>'
              f'<text x="{bx + 1:.1f}" y="{height - 3}" text-anchor="start">&gt;1</text>')
    tip = title + "\n" + "\n".join(f"{lab}: {c}" for lab, c in zip(RATIO_BINS, hist) if c)
    return (f'<svg class="ratio-plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img"><title>{html.escape(tip.strip())}</title>'
            f'{"".join(parts)}{axis}{bound}{labels}</svg>')


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:24px;color:#111827;
background:#f9fafb}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d1d5db;padding-bottom:4px}
.banner{display:inline-block;padding:6px 14px;border-radius:6px;font-weight:600;margin:8px 0}
.ok{background:#16a34a;color:#fff}.bad{background:#dc2626;color:#fff}
table{border-collapse:collapse;background:#fff}
th,td{border:1px solid #d1d5db;padding:6px 8px;vertical-align:top;font-size:13px}
th{background:#f3f4f6;text-align:left}
table.matrix td.cell{min-width:176px}
table.matrix th.col{max-width:210px;overflow-wrap:anywhere}
table.matrix th.col small{display:block;font-weight:400;color:#4b5563}
.verdict{font-weight:700;font-size:13px;border-radius:4px;padding:1px 6px;display:inline-block}
.counts{font-size:12px;margin:3px 0}.metrics{font-size:11px;color:#1f2937;margin-top:2px}
td.empty{background:#f3f4f6;color:#9ca3af;text-align:center}
svg.ratio-plot{display:block;background:#fff;margin-top:4px;border:1px solid #e5e7eb;border-radius:3px}
svg.ratio-plot text{font-size:8px;fill:#4b5563}
.legend span{display:inline-block;margin:2px 6px 2px 0;padding:2px 8px;border-radius:4px;font-size:12px}
code{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12px}
table.failures{width:100%;table-layout:fixed;margin:6px 0 12px}
td.case code{word-break:break-all}code.replay{color:#1d4ed8}td.reason{word-break:break-word}
details.fgroup{margin:4px 0}details.fgroup summary{cursor:pointer;font-size:14px;padding:3px 0}
.note{color:#92400e}div.example{font-size:13px;margin:4px 0 6px;padding:6px;background:#fff;border:1px solid #e5e7eb}
td.worst{font-size:12px;word-break:break-word}details.unsupported{font-size:11px;margin-top:3px}
details.unsupported ul{margin:2px 0;padding-left:16px}
"""


def _verdict_span(v: str | None) -> str:
    if not v:
        return ""
    bg, fg = COLOURS.get(v, ("#ffffff", "#111827"))
    return f'<span class="verdict" style="background:{bg};color:{fg}">{html.escape(v)}</span>'


def _unsupported_html(c: dict) -> str:
    """The cell's unsupported reasons with their counts (why the backend declined those cases)."""
    reasons = c.get("unsupported_reasons") or {}
    if not reasons:
        return ""
    items = "".join(f"<li>{n} × {html.escape(r)}</li>" for r, n in reasons.items())
    return f'<details class="unsupported"><summary>{sum(reasons.values())} unsupported: why</summary><ul>{items}</ul></details>'


def render_html(summary: dict, *, title: str = "qconform conformance report") -> str:
    out = (_html_status(summary, title) + _html_matrix(summary) + _html_failures(summary) + _html_waivers(summary)
           + _html_environment(summary) + ["</body></html>"])
    return "\n".join(out)


def _html_status(summary: dict, title: str) -> list[str]:
    """The page head, the status banner, what a pass means, the notes, the levels and the legend."""
    esc = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>", f"<h1>{esc(title)}</h1>"]
    ok = summary["ok"]
    out.append(f'<div id="status" class="banner {"ok" if ok else "bad"}" data-status="{esc(summary["status"])}">'
               f'{esc(summary["headline"])}: {summary["n_results"]} result(s), {summary["n_judged"]} judged, '
               f'{summary["n_bad"]} failing (fail, crash, timeout)</div>')
    out.append(f'<p id="pass-meaning">{esc(PASS_MEANING)}</p>')
    if summary.get("not_certified"):
        out.append('<ul id="not-certified">' + "".join(
            f'<li><b>not certified</b>: {esc(n["column"])}: {esc(n["why"])}</li>' for n in summary["not_certified"])
            + "</ul>")
    for n in summary.get("notes", []):
        if not n.startswith("not certified: "):  # listed above
            out.append(f'<p class="note">{esc(n)}</p>')
    out.append(f'<h2>Conformance levels</h2><p id="levels" data-level="{esc(summary.get("level") or "-")}">Run level: '
               f'<b>{esc(summary.get("level") or "-")}</b>. {esc(LEVELS_MEANING)}</p>')
    out.append('<ul id="deviations">' + ("".join(f"<li>{esc(line)}</li>" for line in deviation_lines(summary))
                                          or "<li>every judged declaration is canonical</li>") + "</ul>")
    out.append('<div class="legend">' + "".join(
        f'<span style="background:{COLOURS[v][0]};color:{COLOURS[v][1]}">{esc(v)}</span>' for v in VERDICT_ORDER)
        + "</div>")
    return out


def _html_matrix(summary: dict) -> list[str]:
    """The support matrix: schemes by backends, each cell coloured by its worst verdict."""
    esc = html.escape
    idx = cell_index(summary)
    out = []
    out.append('<h2 id="matrix-title">Support matrix</h2>')
    out.append("<p>Rows: schemes; columns: backends. A cell takes the colour of its worst verdict. The plot is "
               "the histogram of each case's largest error/bound ratio (0: correctly rounded everywhere; up to "
               "1: inside the declared interval; &gt;1: outside). Ratio, ULP and SQNR are the worst over the "
               "cell's cases.</p>")
    out.append('<table id="matrix" class="matrix"><thead><tr><th>scheme</th>')
    for ci, col in enumerate(summary["columns"]):
        sub = " · ".join(x for x in (col.get("version") and f"v{col['version']}", col.get("device")) if x)
        host = f"<small>host {esc(col['host'])}</small>" if col.get("host") and " / " in col["key"] else ""
        out.append(f'<th class="col" id="col-{ci}">{esc(col["backend"])}{host}<small>{esc(sub)}</small></th>')
    out.append("</tr></thead><tbody>")
    for scheme in summary["schemes"]:
        out.append(f'<tr id="row-{esc(scheme)}"><th>{esc(scheme)}</th>')
        for ci, col in enumerate(summary["columns"]):
            c = idx.get((col["key"], scheme))
            cid = f"cell-{ci}-{esc(scheme)}"
            if c is None:
                out.append(f'<td class="cell empty" id="{cid}" data-verdict="none">no cases</td>')
                continue
            v = c["worst_verdict"]
            bg = COLOURS.get(v, ("#ffffff", "#111827"))[0]
            light = TINTS.get(v, "#ffffff")
            metrics = (f'ratio ≤ {fmt_ratio(c["max_ratio"])} · ULP ≤ {c["max_ulp"] if c["max_ulp"] is not None else "-"}'
                       f' · SQNR ≥ {fmt_sqnr(c["min_sqnr_db"])} · tie flips {c["tie_flips"]}')
            plot = ""
            if sum(c["ratio_hist"]):
                plot = ratio_histogram_svg(c["ratio_hist"], title=f"{col['key']} {scheme}: per-case max error/bound")
            out.append(f'<td class="cell v-{esc(v or "none")}" id="{cid}" data-verdict="{esc(v or "none")}" '
                       f'data-cases="{c["n"]}" style="background:{light};border-left:6px solid {bg}">'
                       f'{_verdict_span(v)}<div class="counts">{esc(counts_text(c["counts"]))}</div>'
                       f'{plot}<div class="metrics">{esc(metrics)}</div>{_unsupported_html(c)}</td>')
        out.append("</tr>")
    out.append("</tbody></table>")
    return out


def _html_failures(summary: dict) -> list[str]:
    """The failing cases, grouped by signature, with an example and replay commands."""
    esc = html.escape
    out = []
    out.append(f'<h2 id="failures-title">Failing cases ({len(summary["failures"])})</h2>')
    if summary["failures"]:
        out.append("<p>Grouped by signature (backend, scheme, format, declared variants, verdict, reason). Replay "
                   "commands name bundles relative to the folder of this report: run them there.</p>")
        out.append('<div id="failures">')
        members: dict = {}
        for f in summary["failures"]:
            members.setdefault(f["case_id"] + "\0" + f["column"], f)
        for gi, g in enumerate(summary["failure_groups"]):
            sig, ex = g["signature"], g["example"]
            out.append(f'<details class="fgroup" id="fgroup-{gi}"{" open" if gi < 3 else ""}><summary>'
                       f'{_verdict_span(sig["verdict"])} <b>{esc(sig["column"])}</b> · {esc(sig["scheme"])} · '
                       f'{esc(sig["weight_format"])} · variants <code>{esc(sig["variants"])}</code>: '
                       f'<b>{g["count"]}</b> case(s) — {esc(sig["reason"])}</summary>')
            out.append(f'<div class="example"><b>example</b> <code>{esc(ex["case_id"])}</code>: '
                       f'{esc(ex["reason"] or "")}<br><b>worst element</b> {esc(describe_worst(ex["worst_element"]))}'
                       f'<br><b>declaration notes</b>: {esc(ex["notes"] or "(none)")}'
                       + "".join(f'<br><span class="localization">{esc(line)}</span>'
                                 for line in localization_lines(ex.get("localization")))
                       + (f'<br><b>replay</b> <code class="replay">{esc(ex["replay"])}</code>' if ex.get("replay")
                          else "") + "</div>")
            out.append('<table class="failures"><colgroup><col style="width:40%"><col style="width:38%">'
                       '<col style="width:22%"></colgroup><thead><tr><th>case</th><th>worst element</th>'
                       '<th>replay</th></tr></thead><tbody>')
            for cid in g["case_ids"][:PER_GROUP]:
                f = members.get(cid + "\0" + sig["column"], {})
                replay = f'<code class="replay">{esc(f["replay"])}</code>' if f.get("replay") else "—"
                out.append(f'<tr><td class="case"><code>{esc(cid)}</code></td><td class="worst">'
                           f'{esc(describe_worst(f.get("worst_element")))}</td><td class="case">{replay}</td></tr>')
            out.append("</tbody></table>")
            if g["count"] > PER_GROUP:
                out.append(f"<p>... and {g['count'] - PER_GROUP} more (all in summary.json)</p>")
            out.append("</details>")
        out.append("</div>")
    else:
        out.append('<p id="failures">None.</p>')
    return out


def _html_waivers(summary: dict) -> list[str]:
    """The waivers given, applied, expired and stale."""
    esc = html.escape
    out = []
    w = summary["waivers"]
    out.append('<h2 id="waivers-title">Waivers</h2>')
    if not (w["declared"] or w["applied"] or w["expired"] or w["stale"]):
        out.append("<p>No waivers were given.</p>")
    if w["declared"]:
        out.append("<table><thead><tr><th>backend</th><th>scheme</th><th>case</th><th>reason</th><th>issue</th>"
                   "<th>expires</th></tr></thead><tbody>")
        for x in w["declared"]:
            out.append("<tr>" + "".join(f"<td>{esc(str(x.get(k, '')))}</td>" for k in
                                        ("backend", "scheme", "case", "reason", "issue", "expires")) + "</tr>")
        out.append("</tbody></table>")
    for label, rows in (("applied (a non-pass waived)", w["applied"]), ("expired (turned into fail)", w["expired"]),
                        ("stale (the waived case passes)", w["stale"])):
        if rows:
            out.append(f"<p><b>{len(rows)} {esc(label)}</b></p><ul>")
            for r in rows[:PER_GROUP * 10]:
                out.append(f"<li>{esc(r['column'])}: <code>{esc(r['case_id'])}</code> — "
                           f"{esc(str((r.get('waiver') or {}).get('issue', '')))}</li>")
            out.append("</ul>")
    return out


def _html_environment(summary: dict) -> list[str]:
    """Each host's environment, then the runs."""
    esc = html.escape
    out = []
    out.append('<h2 id="environment-title">Environment</h2>')
    for host, env in summary["environment"].items():
        out.append(f"<h3>{esc(str(host))}</h3><table class=\"env\"><tbody>")
        for k in ("host", "platform", "python", "cpu", "cpu_count", "torch", "numpy", "emulator_version",
                  "suite_version", "git_commit", "devices"):
            if env.get(k) is not None:
                val = ", ".join(env[k]) if isinstance(env[k], list) else str(env[k])
                out.append(f"<tr><th>{esc(k)}</th><td>{esc(val)}</td></tr>")
        if env.get("libraries"):
            out.append("<tr><th>libraries</th><td>" + esc(", ".join(f"{k} {v}" for k, v in env["libraries"].items()))
                       + "</td></tr>")
        if env.get("cpu_flags"):
            out.append(f"<tr><th>CPU flags</th><td><code>{esc(' '.join(env['cpu_flags']))}</code></td></tr>")
        for b in env.get("backends") or []:
            state = "available" if b.get("available") else f"unavailable: {b.get('reason', '')}"
            out.append(f"<tr><th>backend {esc(str(b.get('backend')))}</th><td>{esc(str(b.get('version') or '-'))} "
                       f"on {esc(str(b.get('device') or '-'))}; {esc(state)}</td></tr>")
        out.append("</tbody></table>")
    if summary["runs"]:
        out.append('<h2 id="runs-title">Runs</h2><table><thead><tr><th>host</th><th>profile</th><th>cases</th>'
                   "<th>backends</th><th>shard</th><th>case list sha256</th><th>time</th></tr></thead><tbody>")
        for r in summary["runs"]:
            out.append(f"<tr><td>{esc(str(r.get('host')))}</td><td>{esc(str(r.get('profile')))}</td>"
                       f"<td>{esc(str(r.get('case_count')))}</td><td>{esc(', '.join(r.get('backends') or []))}</td>"
                       f"<td>{esc(str(r.get('shard') or '-'))}</td><td><code>{esc(str(r.get('case_list_sha256')))}"
                       f"</code></td><td>{esc(str(r.get('time')))}</td></tr>")
        out.append("</tbody></table>")
    return out

