"""Reports of a conformance run: ``summary.json``, ``report.md`` and a self-contained ``report.html``.

Semantics: docs/certification.md#reports.

    qconform report OUT [--html] [--md] [--out DIR]     # OUT: a run folder (results.jsonl, results-*.jsonl)
    qconform report merge BUNDLE... --out DIR [--no-verify]   # one matrix over several hosts' bundles

Input is the run's JSONL: ``kind: run`` header lines (profile, case-list hash, environment,
waivers), ``kind: backend`` lines (version, device) and ``kind: result`` lines (one per
backend x case; a later line for the same pair replaces an earlier one, as a resumed run
writes them). pytest-xdist workers write ``results-<worker>.jsonl``: every such file in
the folder is read.

The matrix has one row per scheme and one column per backend (per host + backend when
bundles from several hosts are merged). Each cell is coloured by its worst verdict and
shows the verdict counts, the worst error/bound ratio, the largest ULP distance, the lowest
SQNR, the tie flips, and an inline SVG histogram of the per-case error/bound ratios
(drawn here, no script, no network: the file opens from disk).
"""

from __future__ import annotations

import html
import json
import math
import shlex
from collections import Counter
from pathlib import Path

__all__ = ["load_source", "summarize_sources", "write_reports", "render_html", "render_markdown", "report_run",
           "merge_bundles", "register", "VERDICT_ORDER", "RATIO_BINS"]

#: verdicts from worst to best; a cell takes the colour of its worst verdict ("unsupported" only when
#: nothing else is there)
VERDICT_ORDER = ("crash", "timeout", "fail", "waived", "quality-warning", "mistrusted", "pass-with-tie-flips", "pass",
                 "unsupported")
BAD = ("fail", "crash", "timeout")
#: background, text colour per verdict (colour-blind safe pairs: red/orange/yellow vs blue-green)
COLOURS = {
    "crash": ("#7f1d1d", "#ffffff"),
    "timeout": ("#c2410c", "#ffffff"),
    "fail": ("#dc2626", "#ffffff"),
    "waived": ("#a78bfa", "#1e1b4b"),
    "quality-warning": ("#facc15", "#3f2d00"),
    "mistrusted": ("#93c5fd", "#0c2a4d"),
    "pass-with-tie-flips": ("#5eead4", "#053b35"),
    "pass": ("#16a34a", "#ffffff"),
    "unsupported": ("#e5e7eb", "#4b5563"),
}
#: light cell background per verdict
TINTS = {"crash": "#fecaca", "timeout": "#ffedd5", "fail": "#fee2e2", "waived": "#ede9fe", "quality-warning": "#fef9c3",
         "mistrusted": "#dbeafe", "pass-with-tie-flips": "#ccfbf1", "pass": "#dcfce7", "unsupported": "#f3f4f6"}
#: histogram of per-case max error/bound ratios: exactly 0 (correctly rounded everywhere), ten bins of 0.1
#: up to 1 (inside the interval), and > 1 (outside: a failure or tie flips)
RATIO_BINS = ("0",) + tuple(f"{k / 10:.1f}-{(k + 1) / 10:.1f}" for k in range(10)) + (">1",)
SCHEME_ORDER = ("w4a16", "w8a16", "w8a8", "w4a8", "w4a16-mxfp4", "w4a4-mxfp4", "w4a16-moe")
MAX_LISTED = 300  # failing cases listed in full in the Markdown report (all are in summary.json)
PER_GROUP = 40  # failing cases shown per (column, scheme) in the HTML report


# -- reading -----------------------------------------------------------------------------------------
def _read_jsonl(path: Path) -> list[dict]:
    from .runner import read_results

    return read_results(path)


def result_files(path: "str | Path") -> list[Path]:
    """The JSONL files of a run: a file as given, or a folder's results.jsonl and results-*.jsonl."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: no such file or folder")
    files = ([p / "results.jsonl"] if (p / "results.jsonl").is_file() else []) + sorted(p.glob("results-*.jsonl"))
    if not files:
        raise FileNotFoundError(f"{p}: no results.jsonl or results-*.jsonl (not a qconform run folder)")
    return files


def load_source(path: "str | Path", *, host: str | None = None) -> dict:
    """One run (folder or JSONL file): headers, backend lines, the latest result per (backend, case)."""
    p = Path(path)
    headers, backends, latest = [], {}, {}
    for f in result_files(p):
        for rec in _read_jsonl(f):
            kind = rec.get("kind")
            if kind == "run":
                headers.append(rec)
            elif kind == "backend":
                backends[rec.get("backend")] = rec
            elif kind == "result" and "backend" in rec and "case_id" in rec:
                latest[(rec["backend"], rec["case_id"])] = rec
    folder = p if p.is_dir() else p.parent
    bundle = None
    if (folder / "bundle.json").is_file():
        try:
            bundle = json.loads((folder / "bundle.json").read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            bundle = None
    env = next((h.get("environment") for h in reversed(headers) if h.get("environment")), None) or {}
    if host is None:
        host = (bundle or {}).get("host_label") or env.get("host")
    return {"path": str(p), "folder": str(folder), "headers": headers, "backends": backends,
            "results": list(latest.values()), "bundle": bundle, "environment": env, "host": host}


# -- summarizing -------------------------------------------------------------------------------------
def _bin(ratio) -> int:
    if ratio is None:
        return -1
    r = float(ratio)
    if math.isnan(r) or r > 1:
        return len(RATIO_BINS) - 1
    if r <= 0:
        return 0
    return min(10, max(1, math.ceil(r * 10 - 1e-12)))


def _worst(counts: Counter) -> str | None:
    for v in VERDICT_ORDER:
        if counts.get(v):
            return v
    return None


def _replay_path(rec: dict, folder: Path) -> str | None:
    b = rec.get("bundle")
    if not b:
        return None
    if Path(b).exists():
        return b
    alt = folder / "bundles" / Path(b).name
    return str(alt) if alt.exists() else b


def _new_cell() -> dict:
    return {"n": 0, "counts": Counter(), "max_ratio": None, "max_ratio_inf": False, "max_ulp": None,
            "min_sqnr_db": None, "tie_flips": 0, "n_outside": 0, "exact_match": 0, "ratio_hist": [0] * len(RATIO_BINS),
            "worst_case": None}


def summarize_sources(sources: list[dict], *, by_host: bool = False) -> dict:
    """The summary (what summary.json holds) of one or several runs."""
    columns: dict[str, dict] = {}
    cells: dict[tuple, dict] = {}
    failures, waived, expired, stale = [], [], [], []
    declared_waivers = []
    schemes_seen = set()
    for src in sources:
        folder = Path(src["folder"])
        for rec in src["results"]:
            b = rec["backend"]
            key = f"{src['host'] or '?'} / {b}" if by_host else b
            if key not in columns:
                bl = src["backends"].get(b, {})
                columns[key] = {"key": key, "backend": b, "host": src["host"], "version": bl.get("version"),
                                "device": bl.get("device"), "available": bl.get("available"),
                                "source": src["path"], "verified": src.get("verified")}
            scheme = rec.get("scheme") or "?"
            schemes_seen.add(scheme)
            c = cells.setdefault((key, scheme), _new_cell())
            c["n"] += 1
            v = rec.get("verdict", "?")
            c["counts"][v] += 1
            m = rec.get("metrics") or {}
            if m:
                r = m.get("max_ratio")
                if r is not None:
                    r = float(r)
                    if math.isinf(r) or math.isnan(r):
                        c["max_ratio_inf"] = True
                    elif c["max_ratio"] is None or r > c["max_ratio"]:
                        c["max_ratio"] = r
                    if c["worst_case"] is None or r > c["worst_case"][0] or math.isnan(r):
                        c["worst_case"] = (r, rec["case_id"])
                    c["ratio_hist"][_bin(r)] += 1
                u = m.get("max_ulp")
                if u is not None and u >= 0:
                    c["max_ulp"] = max(c["max_ulp"] or 0, int(u))
                s = m.get("sqnr_db")
                if s is not None and not math.isnan(float(s)) and not math.isinf(float(s)):
                    c["min_sqnr_db"] = float(s) if c["min_sqnr_db"] is None else min(c["min_sqnr_db"], float(s))
                c["tie_flips"] += int(m.get("tie_flips") or 0)
                c["n_outside"] += int(m.get("n_outside") or 0)
                c["exact_match"] += bool(m.get("exact_match"))
            entry = {"column": key, "backend": b, "host": src["host"], "scheme": scheme, "case_id": rec["case_id"],
                     "verdict": v, "reason": rec.get("reason", "")}
            if v in BAD:
                bp = _replay_path(rec, folder)
                entry["bundle"] = bp
                entry["replay"] = f"qconform replay {shlex.quote(bp)}" if bp else None
                failures.append(entry)
            if v == "waived":
                waived.append(dict(entry, waived_verdict=rec.get("waived_verdict"), waiver=rec.get("waiver")))
            if rec.get("waiver_expired"):
                expired.append(dict(entry, waiver=rec["waiver_expired"]))
            if rec.get("unexpected_pass_of_waived_case"):
                stale.append(dict(entry, waiver=rec["unexpected_pass_of_waived_case"]))
        for h in src["headers"]:
            for w in h.get("waivers") or []:
                if w not in declared_waivers:
                    declared_waivers.append(w)
    schemes = [s for s in SCHEME_ORDER if s in schemes_seen] + sorted(schemes_seen - set(SCHEME_ORDER))
    out_cells = []
    totals = Counter()
    for (key, scheme), c in cells.items():
        totals.update(c["counts"])
        worst = _worst(c["counts"])
        if worst == "unsupported" and len(c["counts"]) > 1:
            worst = _worst(Counter({k: v for k, v in c["counts"].items() if k != "unsupported"}))
        out_cells.append({"column": key, "scheme": scheme, "n": c["n"], "worst_verdict": worst,
                          "counts": dict(c["counts"]),
                          "max_ratio": math.inf if c["max_ratio_inf"] else c["max_ratio"],
                          "max_ulp": c["max_ulp"], "min_sqnr_db": c["min_sqnr_db"], "tie_flips": c["tie_flips"],
                          "n_outside": c["n_outside"], "exact_match_cases": c["exact_match"],
                          "ratio_hist": c["ratio_hist"],
                          "worst_case": c["worst_case"][1] if c["worst_case"] else None})
    runs = []
    envs = {}
    for src in sources:
        for h in src["headers"]:
            runs.append({k: h.get(k) for k in ("profile", "tiers", "schemes", "backends", "shard", "case_count",
                                               "case_list_sha256", "time", "emulator_version")}
                        | {"host": src["host"], "source": src["path"]})
        envs[src["host"] or src["path"]] = dict(src["environment"], backends=list(src["backends"].values()))
    n_bad = sum(totals.get(v, 0) for v in BAD)
    hashes = {r["case_list_sha256"] for r in runs if r.get("case_list_sha256")}
    notes = []
    if not runs:
        notes.append("no run header (kind: run) in the results: pytest-xdist workers write none, so the "
                     "environment is unknown")
    if len(hashes) > 1:
        notes.append(f"the sources ran {len(hashes)} different case lists (profiles, schemes or shards differ)")
    unverified = [c["key"] for c in columns.values() if c.get("verified") is False]
    if unverified:
        notes.append("not verified (no certification bundle): " + ", ".join(unverified))
    return {"qconform_summary": 1, "ok": n_bad == 0, "n_results": sum(totals.values()), "n_bad": n_bad,
            "totals": dict(totals), "columns": list(columns.values()), "schemes": schemes, "cells": out_cells,
            "failures": failures, "waivers": {"declared": declared_waivers, "applied": waived, "expired": expired,
                                              "stale": stale},
            "runs": runs, "environment": envs, "notes": notes,
            "bundles": [src["bundle"] for src in sources if src.get("bundle")]}


def _json_safe(o):
    if isinstance(o, float):
        if math.isnan(o):
            return "nan"
        if math.isinf(o):
            return "inf" if o > 0 else "-inf"
        return o
    if isinstance(o, dict):
        return {str(k): _json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_json_safe(v) for v in o]
    return o


# -- rendering helpers --------------------------------------------------------------------------------
def _fmt_ratio(r) -> str:
    if r is None:
        return "-"
    if isinstance(r, float) and math.isinf(r):
        return "inf"
    return f"{r:.3g}"


def _fmt_sqnr(s) -> str:
    return "n/a" if s is None else f"{s:.1f} dB"


def _cell_index(summary: dict) -> dict:
    return {(c["column"], c["scheme"]): c for c in summary["cells"]}


def _counts_text(counts: dict) -> str:
    short = {"pass-with-tie-flips": "tie-flips", "quality-warning": "quality", "unsupported": "unsupp."}
    return " · ".join(f"{counts[v]} {short.get(v, v)}" for v in VERDICT_ORDER if counts.get(v))


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
.note{color:#92400e}
"""


def _verdict_span(v: str | None) -> str:
    if not v:
        return ""
    bg, fg = COLOURS.get(v, ("#ffffff", "#111827"))
    return f'<span class="verdict" style="background:{bg};color:{fg}">{html.escape(v)}</span>'


def render_html(summary: dict, *, title: str = "qconform conformance report") -> str:
    esc = html.escape
    idx = _cell_index(summary)
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>", f"<h1>{esc(title)}</h1>"]
    ok = summary["ok"]
    out.append(f'<div id="status" class="banner {"ok" if ok else "bad"}">'
               f'{"CONFORMANT" if ok else "NOT CONFORMANT"}: {summary["n_results"]} result(s), '
               f'{summary["n_bad"]} failing (fail, crash, timeout)</div>')
    for n in summary.get("notes", []):
        out.append(f'<p class="note">{esc(n)}</p>')
    out.append('<div class="legend">' + "".join(
        f'<span style="background:{COLOURS[v][0]};color:{COLOURS[v][1]}">{esc(v)}</span>' for v in VERDICT_ORDER)
        + "</div>")

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
            metrics = (f'ratio ≤ {_fmt_ratio(c["max_ratio"])} · ULP ≤ {c["max_ulp"] if c["max_ulp"] is not None else "-"}'
                       f' · SQNR ≥ {_fmt_sqnr(c["min_sqnr_db"])} · tie flips {c["tie_flips"]}')
            plot = ""
            if sum(c["ratio_hist"]):
                plot = ratio_histogram_svg(c["ratio_hist"], title=f"{col['key']} {scheme}: per-case max error/bound")
            out.append(f'<td class="cell v-{esc(v or "none")}" id="{cid}" data-verdict="{esc(v or "none")}" '
                       f'data-cases="{c["n"]}" style="background:{light};border-left:6px solid {bg}">'
                       f'{_verdict_span(v)}<div class="counts">{esc(_counts_text(c["counts"]))}</div>'
                       f'{plot}<div class="metrics">{esc(metrics)}</div></td>')
        out.append("</tr>")
    out.append("</tbody></table>")

    out.append(f'<h2 id="failures-title">Failing cases ({len(summary["failures"])})</h2>')
    if summary["failures"]:
        groups: dict = {}
        for f in summary["failures"]:
            groups.setdefault((f["column"], f["scheme"]), []).append(f)
        out.append('<div id="failures">')
        for gi, ((col, scheme), rows) in enumerate(groups.items()):
            kinds = Counter(r["verdict"] for r in rows)
            out.append(f'<details class="fgroup"{" open" if gi < 3 else ""}><summary><b>{esc(col)}</b> · '
                       f'{esc(scheme)}: {esc(_counts_text(kinds))}</summary>'
                       '<table class="failures"><colgroup><col style="width:7%"><col style="width:58%">'
                       '<col style="width:35%"></colgroup><thead><tr><th>verdict</th><th>case and replay command'
                       '</th><th>reason</th></tr></thead><tbody>')
            for f in rows[:PER_GROUP]:
                replay = f'<br><code class="replay">{esc(f["replay"])}</code>' if f.get("replay") else ""
                out.append(f'<tr><td>{_verdict_span(f["verdict"])}</td><td class="case"><code>{esc(f["case_id"])}'
                           f'</code>{replay}</td><td class="reason">{esc((f["reason"] or "")[:400])}</td></tr>')
            out.append("</tbody></table>")
            if len(rows) > PER_GROUP:
                out.append(f"<p>... and {len(rows) - PER_GROUP} more (all in summary.json)</p>")
            out.append("</details>")
        out.append("</div>")
    else:
        out.append('<p id="failures">None.</p>')

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
            for r in rows[:MAX_LISTED]:
                out.append(f"<li>{esc(r['column'])}: <code>{esc(r['case_id'])}</code> — "
                           f"{esc(str((r.get('waiver') or {}).get('issue', '')))}</li>")
            out.append("</ul>")

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
    out.append("</body></html>")
    return "\n".join(out)


def render_markdown(summary: dict, *, title: str = "qconform conformance report") -> str:
    idx = _cell_index(summary)
    L = [f"# {title}", "", f"**{'CONFORMANT' if summary['ok'] else 'NOT CONFORMANT'}**: {summary['n_results']} "
         f"result(s), {summary['n_bad']} failing (fail, crash, timeout).", ""]
    for n in summary.get("notes", []):
        L += [f"> {n}", ""]
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
            row.append(f"**{c['worst_verdict']}** {_counts_text(c['counts'])}<br>ratio ≤ {_fmt_ratio(c['max_ratio'])}, "
                       f"ULP ≤ {c['max_ulp'] if c['max_ulp'] is not None else '-'}, SQNR ≥ {_fmt_sqnr(c['min_sqnr_db'])}, "
                       f"ties {c['tie_flips']}<br>hist `{' '.join(str(h) for h in c['ratio_hist'])}`")
        L.append("| " + " | ".join(row) + " |")
    L += ["", f"## Failing cases ({len(summary['failures'])})", ""]
    if not summary["failures"]:
        L.append("None.")
    for f in summary["failures"][:MAX_LISTED]:
        L.append(f"- **{f['verdict']}** {f['column']} `{f['case_id']}`: {(f['reason'] or '')[:300]}")
        if f.get("replay"):
            L.append(f"  `{f['replay']}`")
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
    return "\n".join(L) + "\n"


# -- writing -----------------------------------------------------------------------------------------
def write_reports(out_dir: "str | Path", summary: dict, *, html_report: bool = True, md_report: bool = True,
                  title: str = "qconform conformance report") -> list[Path]:
    """Write summary.json (always), report.html and report.md into ``out_dir``; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    p = out / "summary.json"
    p.write_text(json.dumps(_json_safe(summary), indent=1, sort_keys=False, allow_nan=False) + "\n", encoding="utf-8")
    written.append(p)
    if html_report:
        p = out / "report.html"
        p.write_text(render_html(summary, title=title), encoding="utf-8")
        written.append(p)
    if md_report:
        p = out / "report.md"
        p.write_text(render_markdown(summary, title=title), encoding="utf-8")
        written.append(p)
    return written


def report_run(run: "str | Path", out_dir: "str | Path | None" = None, *, html_report: bool = True,
               md_report: bool = True) -> list[Path]:
    """The reports of one run folder (or JSONL file), written next to it unless ``out_dir`` is given."""
    src = load_source(run)
    if out_dir is None and (Path(src["folder"]) / "MANIFEST.json").is_file():
        from emulator.errors import QconformError

        raise QconformError(f"{src['folder']} is a sealed certification bundle: its reports are part of it "
                            "(rewriting them would break its hashes); give --out DIR")
    summary = summarize_sources([src])
    return write_reports(out_dir or src["folder"], summary, html_report=html_report, md_report=md_report)


def merge_bundles(bundles: list["str | Path"], out_dir: "str | Path", *, verify: bool = True) -> tuple[dict, list]:
    """One matrix over several certification bundles (or run folders): a column per host + backend.

    Bundles are verified first (``conformance.certify.verify_bundle``) unless ``verify`` is False; a
    bundle that fails is refused. Returns (summary, paths written).
    """
    from emulator.errors import QconformError

    sources = []
    for b in bundles:
        folder = Path(b)
        is_bundle = (folder / "MANIFEST.json").is_file()
        verified = None
        if is_bundle and verify:
            from .certify import verify_bundle

            res = verify_bundle(folder)
            if not res.ok:
                raise QconformError(f"{folder}: bundle does not verify ({len(res.problems)} problem(s)); first: "
                                    f"{res.problems[0]}")
            verified = True
        elif not is_bundle:
            verified = False
        src = load_source(folder)
        src["verified"] = verified
        sources.append(src)
    hosts = [s["host"] or Path(s["folder"]).name for s in sources]
    for s, h in zip(sources, hosts):
        s["host"] = h
    summary = summarize_sources(sources, by_host=True)
    summary["merged_from"] = [s["folder"] for s in sources]
    paths = write_reports(out_dir, summary, title="qconform conformance report (merged)")
    return summary, paths


# -- command line ------------------------------------------------------------------------------------
def cmd_report(args) -> int:
    paths = list(args.paths)
    if paths and paths[0] == "merge":
        if len(paths) < 2:
            raise ValueError("report merge: give one or more bundle folders")
        if not args.out:
            raise ValueError("report merge: --out DIR is required")
        summary, written = merge_bundles(paths[1:], args.out, verify=not args.no_verify)
        print(f"merged {len(paths) - 1} source(s): {len(summary['columns'])} column(s) x "
              f"{len(summary['schemes'])} scheme(s), {summary['n_bad']} failing")
        for p in written:
            print(f"wrote {p}")
        return 0
    if len(paths) != 1:
        raise ValueError("report: give one run folder or results JSONL file (or 'merge BUNDLE... --out DIR')")
    want_html, want_md = args.html, args.md
    if not want_html and not want_md:
        want_html = want_md = True
    written = report_run(paths[0], args.out, html_report=want_html, md_report=want_md)
    for p in written:
        print(f"wrote {p}")
    return 0


def register(sub) -> None:
    s = sub.add_parser("report", help="summary.json, report.md and report.html of a run; 'report merge BUNDLE... "
                                      "--out DIR' combines bundles from several hosts")
    s.add_argument("paths", nargs="+", metavar="OUT", help="a run folder (or results JSONL); or: merge BUNDLE...")
    s.add_argument("--html", action="store_true", help="write report.html (default: html and md)")
    s.add_argument("--md", action="store_true", help="write report.md (default: html and md)")
    s.add_argument("--out", help="folder for the reports (default: the run folder); required for merge")
    s.add_argument("--no-verify", action="store_true", help="merge: skip verifying the bundles")
    s.set_defaults(fn=cmd_report)
