"""Everything in a bundle that follows from its results: written by ``certify``, recomputed by ``verify-bundle``.

Semantics: docs/certification.md#verification. One function per derived record, called by both the
writer and the verifier, so a bundle whose derived files (bundle.json's counts and ``ok``,
declared.json, waivers.json, environment.json, summary.json, report.md, report.html) disagree with
its results cannot verify, however its MANIFEST.json was re-sealed.
"""

from __future__ import annotations

import json
import shlex
from collections import Counter
from pathlib import Path

from conformance.judge.verdict import BAD, JUDGED, Verdict

__all__ = ["BAD", "JUDGED", "latest_results", "backend_lines", "run_headers", "declared_table", "waiver_record",
           "environment_record", "verdict_summary", "reports", "json_bytes"]

# BAD; JUDGED: verdicts that come from comparing an output with its interval (a certification needs at least one
# per backend): conformance/judge/verdict.py


def json_bytes(obj) -> bytes:
    from conformance.report.summary import json_safe

    return (json.dumps(json_safe(obj), indent=1, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")


def latest_results(lines: list[dict]) -> dict:
    """(backend, case id) -> the last result line for it (a resumed run's later line replaces an earlier one)."""
    latest = {}
    for r in lines:
        if r.get("kind") == "result" and "backend" in r and "case_id" in r:
            latest[(r["backend"], r["case_id"])] = r
    return latest


def backend_lines(lines: list[dict]) -> dict:
    return {r.get("backend"): r for r in lines if r.get("kind") == "backend"}


def run_headers(lines: list[dict]) -> list[dict]:
    return [r for r in lines if r.get("kind") == "run"]


def declared_table(latest: dict) -> dict:
    """declared.json: backend -> scheme -> each distinct declaration with its case count and an example case."""
    declared: dict = {}
    for r in latest.values():
        if not r.get("declared"):
            continue
        slot = declared.setdefault(r["backend"], {}).setdefault(r["scheme"], [])
        for e in slot:
            if e["declared"] == r["declared"]:
                e["cases"] += 1
                break
        else:
            slot.append({"declared": r["declared"], "cases": 1, "example_case": r["case_id"]})
    return declared


def waiver_record(latest: dict, headers: list[dict]) -> dict:
    """waivers.json: the waivers given (the run headers'), applied, expired, stale, and the dates judged on."""
    applied = [{"backend": r["backend"], "case_id": r["case_id"], "waived_verdict": r.get("waived_verdict"),
                "waiver": r.get("waiver")} for r in latest.values() if r["verdict"] == Verdict.WAIVED]
    expired = [{"backend": r["backend"], "case_id": r["case_id"], "waiver": r["waiver_expired"]}
               for r in latest.values() if r.get("waiver_expired")]
    stale = [{"backend": r["backend"], "case_id": r["case_id"], "waiver": r["unexpected_pass_of_waived_case"]}
             for r in latest.values() if r.get("unexpected_pass_of_waived_case")]
    given = []
    for h in headers:
        for w in h.get("waivers") or []:
            if w not in given:
                given.append(w)
    dates = sorted({h.get("waiver_date") or (h.get("time") or "")[:10] for h in headers} - {""})
    return {"given": given, "applied": applied, "expired": expired, "stale": stale, "dates": dates}


def environment_record(headers: list[dict], blines: dict) -> dict:
    """environment.json: the environment of the first run header, and the backends' lines."""
    env = next((h.get("environment") for h in headers if h.get("environment")), None) or {}
    return dict(env, backends=list(blines.values()))


def verdict_summary(latest: dict, labels: list[str], blines: dict) -> dict:
    """bundle.json's derived fields: verdict counts, unavailable backends, judged cases per backend, ok.

    ``ok`` (certified): every backend available, at least one judged case per backend, no fail, crash or
    timeout after waivers, and no unwaived semantic deviation. A backend that refused or could not run every
    case certifies nothing. ``level``: the farthest conformance level of the judged declarations. A verdict
    that is none of the suite's (a damaged line) counts as bad: it certifies nothing.
    """
    from conformance.judge.levels import run_level

    counts = Counter(r["verdict"] for r in latest.values())
    known = {v.value for v in Verdict}
    n_bad = sum(n for v, n in counts.items() if v in BAD or v not in known)
    unavailable = {b: (blines.get(b, {}).get("reason") or "unavailable") for b in labels
                   if blines.get(b, {}).get("available") is False}
    judged = {b: sum(1 for (rb, _), r in latest.items() if rb == b
                     and (r.get("waived_verdict") or r["verdict"]) in JUDGED) for b in labels}
    unjudged = sorted(b for b, n in judged.items() if n == 0)
    # judged cases whose declaration is a semantic deviation no waiver accepts (docs/conformance.md#levels)
    semantic = sum(1 for r in latest.values() if r.get("level") == "semantic" and r["verdict"] != Verdict.UNSUPPORTED
                   and not r.get("deviation_waiver"))
    levels = [r.get("level") for r in latest.values() if r.get("level") and r["verdict"] != Verdict.UNSUPPORTED]
    return {"verdicts": dict(sorted(counts.items())), "n_results": len(latest), "n_bad": n_bad,
            "unavailable": unavailable, "judged_cases": judged, "no_judged_case": unjudged,
            "semantic_deviations": semantic, "level": run_level(levels),
            "ok": n_bad == 0 and semantic == 0 and not unavailable and not unjudged and bool(labels)}


def reports(lines: list[dict], meta: dict, title: str) -> dict[str, bytes]:
    """summary.json, report.md and report.html of a bundle, from its results and bundle.json alone.

    Paths in them are the bundle's own (``bundles/<name>``), not where the bundle was written, so the
    same bytes come out wherever the bundle is verified.
    """
    from conformance.report.write import render_html, render_markdown, summarize_sources
    from conformance.report.summary import json_safe

    latest = latest_results(lines)
    bundle_of = {}
    results = []
    for key, r in latest.items():
        r = dict(r)
        b = r.pop("bundle", None)
        if b:
            bundle_of[key] = "bundles/" + Path(b).name
        results.append(r)
    headers = run_headers(lines)
    env = next((h.get("environment") for h in reversed(headers) if h.get("environment")), None) or {}
    src = {"path": ".", "folder": ".", "headers": headers, "backends": backend_lines(lines), "results": results,
           "bundle": meta, "environment": env, "host": meta.get("host_label")}
    summary = summarize_sources([src])
    for e in summary.get("failures", []):
        bp = bundle_of.get((e["backend"], e["case_id"]))
        e["bundle"] = bp
        e["replay"] = f"qconform replay {shlex.quote(bp)}" if bp else None
    return {"summary.json": (json.dumps(json_safe(summary), indent=1, sort_keys=False, allow_nan=False)
                             + "\n").encode("utf-8"),
            "report.html": render_html(summary, title=title).encode("utf-8"),
            "report.md": render_markdown(summary, title=title).encode("utf-8")}


def report_title(labels: list[str], host: str) -> str:
    return f"qconform certification: {', '.join(labels)} on {host}"
