"""The summary of one or several runs (what summary.json holds), shared by the console and the reports.

Semantics: docs/certification.md#reports and docs/conformance.md#verdicts.

A run is CONFORMANT only when every backend it names was available, judged at least one
case, and no case failed, crashed or timed out. A backend that was unavailable, or whose
every case was 'unsupported', makes the run NOT CERTIFIED (never a pass); the summary says
which backend and why. Failing cases carry their worst element, the declaration's notes and a
replay command relative to the report's folder, and are grouped by signature (backend,
scheme, format, declared variants, reason with its numbers masked).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
from collections import Counter
from pathlib import Path

from emulator.schemes import SCHEMES

from conformance.run.completeness import HEADLINES as COMPLETENESS_HEADLINES
from conformance.run.completeness import enforce, header_shortfall
from conformance.judge.levels import run_level
from conformance.judge.verdict import BAD, PASSING, Verdict

__all__ = ["summarize_sources", "headline", "deviation_lines", "LEVELS_MEANING", "describe_worst", "variant_text", "PASS_MEANING", "VERDICT_ORDER",
           "fmt_ratio", "fmt_sqnr", "cell_index", "counts_text",
           "BAD", "PASSING", "RATIO_BINS", "SCHEME_ORDER", "json_safe"]

#: verdicts from worst to best (``Verdict.order``); a cell takes the colour of its worst verdict ("unsupported"
#: only when nothing else is there). BAD and PASSING (what the console counts as passed): conformance/judge/verdict.py
VERDICT_ORDER = tuple(v.value for v in sorted(Verdict, key=lambda v: v.order))
#: histogram of per-case max error/bound ratios: exactly 0 (correctly rounded everywhere), ten bins of 0.1
#: up to 1 (inside the interval), and > 1 (outside: a failure or tie flips)
RATIO_BINS = ("0",) + tuple(f"{k / 10:.1f}-{(k + 1) / 10:.1f}" for k in range(10)) + (">1",)
#: the schemes in the order the suite lists them (emulator/schemes.py)
SCHEME_ORDER = tuple(SCHEMES)
#: what 'pass' means, in one sentence (the HTML and Markdown reports print it)
PASS_MEANING = ("'pass' means every output element lies inside the interval that the backend's own declared "
                "arithmetic (its named variants, weight and accumulator dtypes, output rounding) allows around "
                "the exact result of the case (docs/conformance.md#acceptance).")
#: what the levels mean, in one paragraph (the reports print it)
LEVELS_MEANING = ("Levels (docs/conformance.md#levels): 'canonical' declarations compute the checkpoint's own "
                  "semantics; 'rounding' ones differ only in how values are rounded (tie rules, RTZ, 16-bit "
                  "scales, accumulation precision), and their distance from the canonical reference is measured "
                  "on the same cases; a 'semantic' deviation computes other weights, zero points, scales or "
                  "activations than the checkpoint defines and makes the run NOT CONFORMANT unless waived.")
#: summary status -> headline (the lead's conformance levels add 'CONFORMANT WITH DECLARED VARIANTS')
HEADLINES = {"conformant": "CONFORMANT", "not-conformant": "NOT CONFORMANT", "not-certified": "NOT CERTIFIED",
             "unavailable": "UNAVAILABLE",
             # fewer results than the run's cases, or a run that was stopped (conformance/run/completeness.py)
             **COMPLETENESS_HEADLINES,
             # opaque arithmetic judged by SQNR (docs/conformance.md#opaque-arithmetic): never called conformant
             "accurate": "ACCURATE TO DECLARED SQNR FLOORS (OPAQUE ARITHMETIC)"}
#: a conformant run whose declarations round differently from the checkpoint (docs/conformance.md#levels)
WITH_VARIANTS = "CONFORMANT WITH DECLARED VARIANTS"


def headline(summary: dict) -> str:
    """The verdict of a summary (the reports' banner and the console's last line)."""
    if summary["status"] == "conformant" and summary.get("level") in ("rounding", "semantic"):  # semantic: waived
        return WITH_VARIANTS
    return HEADLINES[summary["status"]]


def _add_level(c: dict, rec: dict) -> None:
    """A judged record's level and declared deviations (with their measured distance) into a cell."""
    lvl = rec.get("level")
    if not lvl or rec.get("verdict") == Verdict.UNSUPPORTED:
        return
    c["levels"][lvl] += 1
    for d in rec.get("deviations") or []:
        agg = c["deviations"].setdefault(d["variant"], {"variant": d["variant"], "level": d["level"], "cases": 0,
                                                        "max_ulp": None, "min_sqnr_db": None, "n_outside": 0,
                                                        "waived": 0})
        agg["cases"] += 1
        agg["waived"] += bool(rec.get("deviation_waiver"))
        dist = rec.get("canonical_distance") or {}
        if dist.get("max_ulp") is not None and dist["max_ulp"] >= 0:
            agg["max_ulp"] = max(agg["max_ulp"] or 0, int(dist["max_ulp"]))
        s = dist.get("sqnr_db")
        if s is not None and not (isinstance(s, float) and (math.isnan(s) or math.isinf(s))):
            agg["min_sqnr_db"] = float(s) if agg["min_sqnr_db"] is None else min(agg["min_sqnr_db"], float(s))
        agg["n_outside"] += int(dist.get("n_outside") or 0)


def _bin(ratio) -> int:
    if ratio is None:
        return -1
    r = float(ratio)
    if math.isnan(r) or r > 1:
        return len(RATIO_BINS) - 1
    if r <= 0:
        return 0
    return min(10, max(1, math.ceil(r * 10 - 1e-12)))


_KNOWN = frozenset(v.value for v in Verdict)


def _bad(verdict) -> bool:
    """fail, crash, timeout, or a verdict that is none of the suite's (a damaged or hand-edited line): never a pass."""
    return verdict in BAD or verdict not in _KNOWN


def _worst(counts: Counter) -> str | None:
    unknown = sorted(str(v) for v, n in counts.items() if n and v not in _KNOWN)
    if unknown:
        return unknown[0]
    worst = Verdict.worst(v for v, n in counts.items() if n)
    return worst.value if worst is not None else None


def _bundle_path(rec: dict, folder: Path) -> Path | None:
    """The replay bundle of a result: as recorded, else the same name under the run folder's bundles/ (a
    folder that was moved or copied to another host)."""
    b = rec.get("bundle")
    if not b:
        return None
    alt = folder / "bundles" / Path(b).name
    if alt.exists():
        return alt
    return Path(b)


def _relative(path: Path, base: Path) -> str:
    try:
        rel = os.path.relpath(Path(path).resolve(), Path(base).resolve())
    except ValueError:  # another drive (Windows)
        return str(path)
    return Path(rel).as_posix()


def variant_text(declared: dict | None) -> str:
    """The declared variants as 'key=value,...' ('canonical' when none are declared)."""
    if not declared:
        return "-"
    v = declared.get("variants") or {}
    items = []
    for k in sorted(v):
        val = v[k]
        if isinstance(val, dict):
            val = "{" + ",".join(f"{a}={b}" for a, b in sorted(val.items())) + "}"
        items.append(f"{k}={val}")
    return ",".join(items) or "canonical"


def _num(x) -> str:
    if x is None:
        return "-"
    try:
        return f"{float(x):.9g}"
    except (TypeError, ValueError):
        return str(x)


def _nonfinite(x) -> bool:
    try:
        return not math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def describe_worst(we: dict | None) -> str:
    """'[i, j]: observed o, expected e (exact), interval [lo, hi], N ULP' (one line)."""
    if not we:
        return "no output to compare"
    idx = we.get("index")
    if "tensor" in we:  # a quantize-only case's first differing element (conformance/judge/quantized.py)
        return f"{we['tensor']}{list(idx or [])}: observed {_num(we.get('observed'))}, expected {_num(we.get('expected'))}"
    text = f"{list(idx) if idx is not None else '?'}: observed {_num(we.get('observed'))}, expected "
    if _nonfinite(we.get("expected")):  # a NaN/Inf reference has no interval: it must be matched exactly
        text += f"{_num(we.get('expected'))} (exact; a NaN/Inf reference must be matched exactly)"
    else:
        text += f"{_num(we.get('expected'))} (exact), interval [{_num(we.get('lo'))}, {_num(we.get('hi'))}]"
    if we.get("ulp") is not None:
        text += f", {we['ulp']} ULP from the reference {_num(we.get('reference'))}"
    if we.get("nonfinite_mismatches"):  # named first (conformance/judge/verdict.py failing_element)
        text += f"; the first of {we['nonfinite_mismatches']} NaN/Inf mismatch(es)"
    return text


def reason_pattern(reason: str) -> str:
    """A failure reason with its counts masked, so 48 and 51 elements outside group together; digits inside a
    name (``e2m1_rounding``, ``float16``) are part of the name and stay."""
    return re.sub(r"(?<![\w.])\d+(\.\d+)?(?![A-Za-z_])", "N", (reason or "").strip())[:200]


def _new_cell() -> dict:
    return {"n": 0, "counts": Counter(), "max_ratio": None, "max_ratio_inf": False, "max_ulp": None,
            "min_sqnr_db": None, "tie_flips": 0, "n_outside": 0, "exact_match": 0, "ratio_hist": [0] * len(RATIO_BINS),
            "worst_case": None, "unsupported": Counter(), "levels": Counter(), "deviations": {}}


def _add_metrics(c: dict, rec: dict) -> None:
    m = rec.get("metrics") or {}
    if not m:
        return
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


def _failure_entry(rec: dict, key: str, src: dict, base: Path | None) -> dict:
    declared = rec.get("declared") or None
    entry = {"column": key, "backend": rec["backend"], "host": src["host"], "scheme": rec.get("scheme") or "?",
             "weight_format": rec.get("weight_format") or "?", "tier": rec.get("tier"), "case_id": rec["case_id"],
             "verdict": rec.get("verdict"), "reason": rec.get("reason", ""),
             "notes": (declared or {}).get("notes") or "", "variants": variant_text(declared),
             "worst_element": (rec.get("metrics") or {}).get("worst_element"), "bundle": None, "replay": None,
             "localization": rec.get("localization")}
    bp = _bundle_path(rec, Path(src["folder"]))
    if bp is not None:
        rel = _relative(bp, base if base is not None else Path(src["folder"]))
        entry["bundle"] = rel
        entry["replay"] = f"qconform replay {shlex.quote(rel)}"
    return entry


def _group_failures(failures: list[dict]) -> list[dict]:
    """Failures grouped by (column, scheme, format, variants, verdict, reason pattern): count and one example."""
    groups: dict = {}
    for f in failures:
        sig = (f["column"], f["scheme"], f["weight_format"], f["variants"], f["verdict"], reason_pattern(f["reason"]))
        g = groups.get(sig)
        if g is None:
            g = groups[sig] = {"signature": dict(zip(("column", "scheme", "weight_format", "variants", "verdict",
                                                      "reason"), sig)),
                               "count": 0, "example": f, "case_ids": []}
        g["count"] += 1
        g["case_ids"].append(f["case_id"])
    return sorted(groups.values(), key=lambda g: (-g["count"], g["signature"]["column"], g["signature"]["scheme"]))


def summarize_sources(sources: list[dict], *, by_host: bool = False, base: "str | Path | None" = None) -> dict:
    """The summary (what summary.json holds) of one or several runs.

    ``base`` is the folder the reports are written into: replay commands name bundles relative to
    it (default: each source's own folder).
    """
    t = _tally(sources, by_host, Path(base) if base is not None else None)
    out_cells, totals = _finished_cells(t.cells)
    runs, envs = _runs_and_environments(sources)
    n_bad = sum(n for v, n in totals.items() if _bad(v))
    n_results = sum(totals.values())
    n_judged = n_results - totals.get(Verdict.UNSUPPORTED.value, 0)
    not_certified, no_applicable = _column_statuses(t)
    if n_bad or t.semantic:
        status = "not-conformant"
    elif not n_judged and t.unavailable:
        status = "unavailable"
    elif not_certified or not n_judged:
        status = "not-certified"
    elif totals.get(Verdict.PASS_SQNR.value):
        status = "accurate"
    else:
        status = "conformant"
    notes = _summary_notes(t, runs, n_results, not_certified, no_applicable)
    summary = {"qconform_summary": 2, "ok": status == "conformant", "status": status,
               # the run's conformance level: the farthest level of every judged declaration
               "level": run_level(lvl for c in out_cells for lvl in c["levels"]),
               "semantic_deviations": t.semantic,
               "n_results": n_results, "n_judged": n_judged, "n_bad": n_bad,
               "totals": dict(totals), "columns": list(t.columns.values()), "schemes": t.schemes(), "cells": out_cells,
               "not_certified": not_certified, "no_applicable_case": no_applicable, "unavailable": t.unavailable,
               "failures": t.failures, "failure_groups": _group_failures(t.failures),
               "waivers": {"declared": t.declared_waivers, "applied": t.waived, "expired": t.expired,
                           "stale": t.stale},
               "runs": runs, "environment": envs, "notes": notes,
               "bundles": [src["bundle"] for src in sources if src.get("bundle")]}
    summary["headline"] = headline(summary)
    short: dict = {}  # the invariant: never CONFORMANT with fewer results than a run's cases
    for src in sources:
        for b, n in (header_shortfall(src) or {}).items():
            key = _column_key(src, b, by_host)
            short[key] = short.get(key, 0) + n
    return enforce(summary, missing=short)


def _column_key(src: dict, backend: str, by_host: bool) -> str:
    return f"{src['host'] or '?'} / {backend}" if by_host else backend


@dataclasses.dataclass
class _Tally:
    """The records of every source, counted per column (backend, or host / backend) and per (column, scheme) cell."""

    columns: dict = dataclasses.field(default_factory=dict)
    cells: dict = dataclasses.field(default_factory=dict)
    failures: list = dataclasses.field(default_factory=list)
    waived: list = dataclasses.field(default_factory=list)
    expired: list = dataclasses.field(default_factory=list)
    stale: list = dataclasses.field(default_factory=list)
    declared_waivers: list = dataclasses.field(default_factory=list)
    unavailable: dict = dataclasses.field(default_factory=dict)
    #: backends a default run chose itself (no --backend): one with no applicable case is reported, not failed
    optional: set = dataclasses.field(default_factory=set)
    schemes_seen: set = dataclasses.field(default_factory=set)
    semantic: list = dataclasses.field(default_factory=list)  # judged records of an unwaived semantic deviation

    def column(self, key: str, b: str, src: dict) -> dict:
        if key not in self.columns:
            bl = src["backends"].get(b, {})
            self.columns[key] = {"key": key, "backend": b, "host": src["host"], "version": bl.get("version"),
                                 "device": bl.get("device"), "available": bl.get("available"),
                                 "reason": bl.get("reason") or "", "source": src["path"],
                                 "verified": src.get("verified"),
                                 "n": 0, "judged": 0, "n_bad": 0, "n_semantic": 0, "n_sqnr": 0}
        return self.columns[key]

    def schemes(self) -> list:
        seen = self.schemes_seen
        return [s for s in SCHEME_ORDER if s in seen] + sorted(seen - set(SCHEME_ORDER))

    def add(self, rec: dict, src: dict, key: str, base) -> None:
        """One result record of ``src`` in column ``key``."""
        b = rec["backend"]
        col = self.column(key, b, src)
        scheme = rec.get("scheme") or "?"
        self.schemes_seen.add(scheme)
        c = self.cells.setdefault((key, scheme), _new_cell())
        c["n"] += 1
        v = rec.get("verdict", "?")
        c["counts"][v] += 1
        col["n"] += 1
        col["judged"] += v != Verdict.UNSUPPORTED
        col["n_bad"] += _bad(v)
        col["n_sqnr"] += v == Verdict.PASS_SQNR
        if v == Verdict.UNSUPPORTED:
            c["unsupported"][rec.get("reason") or "(no reason given)"] += 1
        _add_metrics(c, rec)
        _add_level(c, rec)
        if rec.get("level") == "semantic" and v != Verdict.UNSUPPORTED and not rec.get("deviation_waiver"):
            col["n_semantic"] += 1
            self.semantic.append({"column": key, "scheme": scheme, "case_id": rec["case_id"],
                                  "variants": [d["variant"] for d in rec.get("deviations") or []
                                               if d["level"] == "semantic"]})
        if _bad(v):
            self.failures.append(_failure_entry(rec, key, src, base))
        entry = {"column": key, "backend": b, "host": src["host"], "scheme": scheme, "case_id": rec["case_id"],
                 "verdict": v, "reason": rec.get("reason", "")}
        if v == Verdict.WAIVED:
            self.waived.append(dict(entry, waived_verdict=rec.get("waived_verdict"), waiver=rec.get("waiver")))
        if rec.get("waiver_expired"):
            self.expired.append(dict(entry, waiver=rec["waiver_expired"]))
        if rec.get("unexpected_pass_of_waived_case"):
            self.stale.append(dict(entry, waiver=rec["unexpected_pass_of_waived_case"]))


def _tally(sources: list[dict], by_host: bool, base) -> _Tally:
    t = _Tally()
    for src in sources:
        for rec in src["results"]:
            t.add(rec, src, _column_key(src, rec["backend"], by_host), base)
        for b, bl in src["backends"].items():
            if bl.get("available") is False:
                t.unavailable[_column_key(src, b, by_host)] = bl.get("reason") or "unavailable"
        for h in src["headers"]:
            for w in h.get("waivers") or []:
                if w not in t.declared_waivers:
                    t.declared_waivers.append(w)
            for b in h.get("default_selection") or []:
                t.optional.add(_column_key(src, b, by_host))
            # backends a `qconform target` could not start at all (no result lines)
            for b, why in (h.get("unavailable") or {}).items():
                t.unavailable.setdefault(_column_key(src, b, by_host), why)
    return t


def _finished_cells(cells: dict) -> tuple:
    """(the summary's cells, the verdict totals over them)."""
    out_cells = []
    totals = Counter()
    for (key, scheme), c in cells.items():
        totals.update(c["counts"])
        worst = _worst(c["counts"])
        if worst == Verdict.UNSUPPORTED and len(c["counts"]) > 1:
            worst = _worst(Counter({k: v for k, v in c["counts"].items() if k != Verdict.UNSUPPORTED}))
        out_cells.append({"column": key, "scheme": scheme, "n": c["n"], "worst_verdict": worst,
                          "counts": dict(c["counts"]),
                          "max_ratio": math.inf if c["max_ratio_inf"] else c["max_ratio"],
                          "max_ulp": c["max_ulp"], "min_sqnr_db": c["min_sqnr_db"], "tie_flips": c["tie_flips"],
                          "n_outside": c["n_outside"], "exact_match_cases": c["exact_match"],
                          "ratio_hist": c["ratio_hist"],
                          "worst_case": c["worst_case"][1] if c["worst_case"] else None,
                          "unsupported_reasons": dict(c["unsupported"].most_common()),
                          # conformance level of the cell: the farthest level of its judged declarations
                          "level": run_level(c["levels"]), "levels": dict(c["levels"]),
                          "deviations": sorted(c["deviations"].values(), key=lambda d: d["variant"])})
    return out_cells, totals


def _runs_and_environments(sources: list[dict]) -> tuple:
    runs = []
    envs = {}
    for src in sources:
        for h in src["headers"]:
            runs.append({k: h.get(k) for k in ("profile", "tiers", "schemes", "backends", "shard", "case_count",
                                               "case_list_sha256", "time", "emulator_version")}
                        | {"host": src["host"], "source": src["path"]})
        envs[src["host"] or src["path"]] = dict(src["environment"], backends=list(src["backends"].values()))
    return runs, envs


def _column_statuses(t: _Tally) -> tuple:
    """Set each column's status; (what was not certified and why, default-selected columns with no applicable
    case): every unavailable backend, every column with no judged case."""
    not_certified = [{"column": k, "why": f"unavailable: {why}"} for k, why in t.unavailable.items()]
    no_applicable = []  # default-selected backends with no case they implement: reported, not a failed run
    for col in t.columns.values():
        col["status"] = ("unavailable" if col["key"] in t.unavailable else "not-certified" if not col["judged"]
                         else "not-conformant" if col["n_bad"] or col["n_semantic"]
                         else "accurate" if col["n_sqnr"] else "conformant")
        if not col["judged"] and col["key"] not in t.unavailable:
            if col["key"] in t.optional:
                col["status"] = "no-applicable-case"
                no_applicable.append({"column": col["key"], "why": f"no applicable case: all {col['n']} case(s) "
                                                                   "unsupported (chosen by the default selection)"})
                continue
            not_certified.append({"column": col["key"], "why": f"no case judged: all {col['n']} case(s) unsupported"})
    return not_certified, no_applicable


def _summary_notes(t: _Tally, runs: list, n_results: int, not_certified: list, no_applicable: list) -> list:
    hashes = {r["case_list_sha256"] for r in runs if r.get("case_list_sha256")}
    notes = []
    if not runs:
        notes.append("no run header (kind: run) in the results: pytest-xdist workers write none, so the "
                     "environment is unknown")
    if not n_results and not t.unavailable:
        notes.append("no results: nothing was judged")
    if len(hashes) > 1:
        notes.append(f"the sources ran {len(hashes)} different case lists (profiles, schemes or shards differ)")
    for nc in not_certified:
        notes.append(f"not certified: {nc['column']}: {nc['why']}")
    for na in no_applicable:
        notes.append(f"not judged: {na['column']}: {na['why']}")
    sem_groups = Counter((s["column"], s["scheme"], ",".join(s["variants"])) for s in t.semantic)
    for (col, sch, var), n in sorted(sem_groups.items()):
        notes.append(f"semantic deviation (NOT CONFORMANT unless waived): {col} {sch}: {var} declared on {n} "
                     "judged case(s)")
    unverified = [c["key"] for c in t.columns.values() if c.get("verified") is False]
    if unverified:
        notes.append("not verified (no certification bundle): " + ", ".join(unverified))
    return notes


def deviation_lines(summary: dict) -> list[str]:
    """One line per (column, declared variant) that is not canonical: its level, cases and the measured distance
    of those cases from the canonical reference (docs/conformance.md#levels): of each case's whole declaration,
    so a variant declared beside a farther one shows that one's distance (an upper bound for it)."""
    agg: dict = {}
    for c in summary.get("cells", []):
        for d in c.get("deviations") or []:
            a = agg.setdefault((c["column"], d["variant"]), dict(d, schemes=[], cases=0, max_ulp=None,
                                                                  min_sqnr_db=None, n_outside=0, waived=0))
            a["schemes"].append(c["scheme"])
            a["cases"] += d["cases"]
            a["waived"] += d.get("waived", 0)
            a["n_outside"] += d.get("n_outside") or 0
            if d.get("max_ulp") is not None:
                a["max_ulp"] = max(a["max_ulp"] or 0, d["max_ulp"])
            if d.get("min_sqnr_db") is not None:
                a["min_sqnr_db"] = d["min_sqnr_db"] if a["min_sqnr_db"] is None else min(a["min_sqnr_db"],
                                                                                        d["min_sqnr_db"])
    lines = []
    for (col, var), a in sorted(agg.items()):
        dist = []
        if a["max_ulp"] is not None:
            dist.append(f"worst {a['max_ulp']} ULP")
        if a["min_sqnr_db"] is not None:
            dist.append(f"SQNR >= {a['min_sqnr_db']:.1f} dB")
        dist.append(f"{a['n_outside']} element(s) outside the canonical interval")
        kind = "semantic deviation" if a["level"] == "semantic" else "declared variant"
        waived = f", {a['waived']} waived" if a["waived"] else ""
        # the distance is measured per case, of the case's whole declaration: a case declaring this variant and
        # a semantic one shows the semantic one's distance here too (so: an upper bound for this variant)
        lines.append(f"{kind}: {col}: {var} ({a['level']}) on {a['cases']} judged case(s){waived} "
                     f"[{', '.join(sorted(set(a['schemes'])))}]; distance of those cases from canonical (their "
                     f"whole declaration, with any other variant it names): {', '.join(dist)}")
    return lines


def json_safe(o):
    """NaN/Inf as strings (summary.json is strict JSON)."""
    if isinstance(o, float):
        if math.isnan(o):
            return "nan"
        if math.isinf(o):
            return "inf" if o > 0 else "-inf"
        return o
    if isinstance(o, dict):
        return {str(k): json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_safe(v) for v in o]
    return o


# -- text helpers shared by the console, Markdown and HTML ---------------------------------------------
def fmt_ratio(r) -> str:
    if r is None:
        return "-"
    if isinstance(r, float) and math.isinf(r):
        return "inf"
    if isinstance(r, str):
        return r
    return f"{r:.3g}"


def fmt_sqnr(s) -> str:
    return "n/a" if s is None else f"{s:.1f} dB"


def cell_index(summary: dict) -> dict:
    return {(c["column"], c["scheme"]): c for c in summary["cells"]}


def counts_text(counts: dict) -> str:
    short = {"pass-with-tie-flips": "tie-flips", "quality-warning": "quality", "unsupported": "unsupp."}
    return " · ".join(f"{counts[v]} {short.get(v, v)}" for v in VERDICT_ORDER if counts.get(v))
