"""What ``qconform run`` prints: progress on any stream, the verdict table, the failure groups.

Semantics: docs/conformance.md#console. Everything here reads the summary of
conformance/report/summary.py, so the console, summary.json and the reports count the same cases.
"""

from __future__ import annotations

import sys
import time

from conformance.judge.localize_text import localization_lines
from conformance.report.summary import describe_worst, deviation_lines, headline
from conformance.judge.verdict import BAD, PASSING, Verdict

__all__ = ["LineProgress", "BarProgress", "print_table", "print_failures", "print_verdict", "WIDTH"]

WIDTH = 100  # the console table fits 100 columns
#: (verdict, column title), in the table's column order; titles are at most 6 characters (``Verdict.short``)
TABLE_VERDICTS = tuple((v.value, v.short) for v in (
    Verdict.PASS, Verdict.PASS_WITH_TIE_FLIPS, Verdict.QUALITY_WARNING, Verdict.FAIL, Verdict.CRASH, Verdict.TIMEOUT,
    Verdict.UNSUPPORTED, Verdict.WAIVED, Verdict.MISTRUSTED, Verdict.PASS_SQNR))
MAX_EXAMPLES = 5  # cases listed per failure group on the console (all are in report.md)


class LineProgress:
    """Progress for a log or a pipe: one line every ``every`` seconds or every 10 % of the cases."""

    def __init__(self, total: int, *, stream=None, every: float = 5.0, clock=time.monotonic):
        self.total = max(int(total), 1)
        self.stream = stream or sys.stderr
        self.every = every
        self.clock = clock
        self.t0 = self.last_t = clock()
        self.last_tenth = 0
        self.bad = 0

    def __call__(self, done: int, _runner_total: int, rec: dict) -> None:
        if rec.get("verdict") in BAD:
            self.bad += 1
        now = self.clock()
        tenth = min(10, done * 10 // self.total)
        if tenth > self.last_tenth or now - self.last_t >= self.every or done == self.total:
            self.last_tenth, self.last_t = tenth, now
            rate = done / max(now - self.t0, 1e-9)
            self.stream.write(f"progress: {done}/{self.total} ({100 * done // self.total} %), {self.bad} failing, "
                              f"{rate:.1f} cases/s, last {rec.get('backend', '?')} {rec.get('verdict', '?')}\n")
            self.stream.flush()


class BarProgress:
    """Progress for a terminal: one bar rewritten in place."""

    def __init__(self, total: int, *, stream=None):
        self.total = max(int(total), 1)
        self.stream = stream or sys.stderr

    def __call__(self, done: int, _runner_total: int, rec: dict) -> None:
        width = 30
        n = int(width * min(done, self.total) / self.total)
        self.stream.write(f"\r[{'#' * n}{'-' * (width - n)}] {done}/{self.total} {rec.get('backend', '?')[:20]:20s} "
                          f"{rec.get('verdict', '?'):20s}")
        if done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def make_progress(total: int, *, enabled: bool = True, stream=None):
    """The progress printer for the stream: a bar on a terminal, lines elsewhere; None when disabled."""
    if not enabled:
        return None
    stream = stream or sys.stderr
    isatty = getattr(stream, "isatty", lambda: False)()
    return BarProgress(total, stream=stream) if isatty else LineProgress(total, stream=stream)


def _fit(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


#: verdict columns the table always shows; the others only when some cell has such a case
TABLE_ALWAYS = ("pass", "fail", "crash", "unsupported")


def print_table(summary: dict, out=None) -> None:
    """One row per (backend, scheme) cell: the verdict counts, within WIDTH columns. Every column is
    separated from its neighbour by a space; scheme names are never cut; a verdict column that is zero in
    every cell is left out (TABLE_ALWAYS are always shown); backend names are cut only to fit WIDTH."""
    out = out or sys.stdout
    cells = sorted(summary["cells"], key=lambda c: (c["column"], c["scheme"]))
    shown = [(v, t) for v, t in TABLE_VERDICTS if v in TABLE_ALWAYS or any(c["counts"].get(v) for c in cells)]
    sw = max([len("scheme")] + [len(c["scheme"]) for c in cells])
    room = WIDTH - 1 - sw - 7 * len(shown)
    bw = max(min(max([len("backend")] + [len(c["column"]) for c in cells]), room), 12)
    head = f"{'backend':{bw}s} {'scheme':{sw}s}" + "".join(f" {t:>6s}" for _, t in shown)
    out.write(head + "\n")
    for c in cells:
        row = f"{_fit(c['column'], bw):{bw}s} {c['scheme']:{sw}s}" + "".join(
            f" {c['counts'].get(v, 0):6d}" for v, _ in shown)
        out.write(row + "\n")


def print_failures(summary: dict, out=None) -> None:
    """Each failure group: count, signature, one example in full (worst element, notes, replay), more ids."""
    out = out or sys.stdout
    by_case = {(f["column"], f["case_id"]): f for f in summary["failures"]}
    for g in summary.get("failure_groups", []):
        sig, ex = g["signature"], g["example"]
        out.write(f"{sig['verdict'].upper()} x{g['count']}: {sig['column']} {sig['scheme']} {sig['weight_format']} "
                  f"[variants {sig['variants']}]: {sig['reason']}\n")
        out.write(f"  example {ex['case_id']}: {ex['reason'][:300]}\n")
        out.write(f"  worst element {describe_worst(ex['worst_element'])}\n")
        for line in localization_lines(ex.get("localization")):  # docs/conformance.md#failure-localization
            out.write(f"  {line}\n")
        out.write(f"  declaration notes: {ex['notes'] or '(none)'}\n")
        if ex.get("replay"):
            out.write(f"  reproduce (in the output folder): {ex['replay']}\n")
        others = [cid for cid in g["case_ids"] if cid != ex["case_id"]]
        for cid in others[:MAX_EXAMPLES - 1]:
            f = by_case.get((sig["column"], cid), {})
            out.write(f"  also {cid}: worst {describe_worst(f.get('worst_element'))}\n")
        if len(others) > MAX_EXAMPLES - 1:
            out.write(f"  ... and {len(others) - (MAX_EXAMPLES - 1)} more of this kind (report.md)\n")
    for w in summary["waivers"]["stale"]:
        out.write(f"STALE WAIVER: {w['column']} {w['case_id']} passes; waiver {(w.get('waiver') or {}).get('issue')} "
                  "can go\n")


def print_verdict(summary: dict, out=None) -> None:
    """The last lines: what was not certified and why, then the headline with the counts."""
    out = out or sys.stdout
    for nc in summary.get("not_certified", []):
        out.write(f"not certified: {nc['column']}: {nc['why']}\n")
    for na in summary.get("no_applicable_case", []):
        out.write(f"not judged: {na['column']}: {na['why']}\n")
    for line in deviation_lines(summary):
        out.write(line + "\n")
    t = summary["totals"]
    # only verdicts inside the declared interval count as passed; waived and mistrusted cases are named apart
    n_ok = sum(t.get(v, 0) for v in PASSING)
    others = ", ".join(f"{t[v]} {v}" for v in (Verdict.PASS_SQNR.value, Verdict.WAIVED.value, Verdict.MISTRUSTED.value)
                       if t.get(v))
    out.write(f"conformance: {headline(summary)}: {n_ok} passed, {summary['n_bad']} failed, "
              + (f"{others}, " if others else "")
              + f"{t.get('unsupported', 0)} unsupported, of {summary['n_results']} result(s)\n")

