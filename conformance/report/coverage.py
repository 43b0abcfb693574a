"""What each profile's covering design covers, as the docs table and as a certification bundle records it.

Semantics: docs/conformance.md#coverage (the tables: conformance/cases/coverage.py).

    python -m conformance.report.coverage             # print the coverage tables (qconform coverage)
    python -m conformance.report.coverage --write     # rewrite them in docs/conformance.md (--check: exit 1 when stale)
"""

from __future__ import annotations

import hashlib
import json

from conformance.cases.coverage import FACTOR_KINDS, TABLES, VALUE_CLASS_DOCS, profile_coverage
from conformance.cases.specs import PROFILES

__all__ = ["profile_seeds", "coverage_of", "coverage_record", "markdown", "main", "DOC_FILE", "BLOCK"]

DOC_FILE = "docs/conformance.md"
BLOCK = "coverage"


def profile_seeds(profile: str) -> tuple:
    """The design seeds a profile draws (none: the profile has no coverage cases)."""
    return tuple(PROFILES[profile].get("coverage", ()))


def coverage_of(profile: str, scheme: str) -> dict:
    """``coverage.profile_coverage`` of the profile's design seeds."""
    return dict(profile_coverage(scheme, profile_seeds(profile)), profile=profile)


def coverage_record(profile: str, schemes=None) -> dict:
    """The coverage a bundle records (bundle.json ``coverage``): per scheme, its table's classes and pairs
    and what the profile's coverage cases cover; ``table_sha256`` names the tables' exact content."""
    sha = hashlib.sha256(json.dumps(TABLES, sort_keys=True).encode()).hexdigest()
    per = {}
    for s in TABLES:
        if schemes and s not in schemes:
            continue
        c = coverage_of(profile, s)
        per[s] = {k: c[k] for k in ("cases", "classes", "classes_covered", "pairs_feasible", "pairs_covered",
                                    "pairs_infeasible")}
    return {"profile": profile, "design_seeds": list(profile_seeds(profile)), "table_sha256": sha, "schemes": per}


def markdown() -> str:
    """The feature tables and each profile's coverage, as the docs show them."""
    out = ["Feature tables (`conformance/cases/coverage.py` `TABLES`): each scheme's factors and classes.", "",
           "| scheme | format features | shape classes | value classes |", "| --- | --- | --- | --- |"]
    for s, t in TABLES.items():
        fmt = "; ".join(f"{f}: {', '.join(t[f])}" for f in FACTOR_KINDS["format"] if f in t)
        shp = "; ".join(f"{f}: {', '.join(t[f])}" for f in FACTOR_KINDS["shape"] if f in t)
        out.append(f"| `{s}` | {fmt or '-'} | {shp} | {', '.join(t['values'])} |")
    out += ["", "Coverage of each profile that draws a design (pairs: of two factors' classes; infeasible: no "
            "valid case holds both).", "",
            "| profile | scheme | design seeds | coverage cases | classes covered | feasible pairs covered | "
            "infeasible pairs |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for p in PROFILES:
        if not profile_seeds(p):
            continue
        for s in TABLES:
            c = coverage_of(p, s)
            out.append(f"| `{p}` | `{s}` | {', '.join(map(str, c['design_seeds']))} | {c['cases']} | "
                       f"{c['classes_covered']}/{c['classes']} | {c['pairs_covered']}/{c['pairs_feasible']} | "
                       f"{c['pairs_infeasible']} |")
    out += ["", "Value classes:", ""]
    out += [f"- `{k}`: {v}" for k, v in VALUE_CLASS_DOCS.items()]
    return "\n".join(out)


def main(argv=None) -> int:
    import argparse
    import sys

    from conformance.report.doctables import ROOT, rewrite

    ap = argparse.ArgumentParser(prog="python -m conformance.report.coverage",
                                 description="the coverage tables of docs/conformance.md#coverage")
    ap.add_argument("--markdown", action="store_true", help="print the coverage tables (the default)")
    ap.add_argument("--write", action="store_true", help=f"rewrite the generated block in {DOC_FILE}")
    ap.add_argument("--check", action="store_true", help=f"exit 1 when {DOC_FILE}'s block is stale")
    args = ap.parse_args(argv)
    md = markdown()
    if args.write or args.check:
        path = ROOT / DOC_FILE
        text = path.read_text(encoding="utf-8")
        new = rewrite(text, {BLOCK: md})
        if args.check:
            if new != text:
                print(f"{DOC_FILE}: the coverage table is stale; run python -m conformance.report.coverage --write",
                      file=sys.stderr)
                return 1
            return 0
        path.write_text(new, encoding="utf-8")
        return 0
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def register(sub, services) -> None:
    """``qconform coverage`` (conformance/cli/main.py's COMMANDS)."""
    s = sub.add_parser("coverage", help="the feature tables and what each profile's covering design covers "
                                        "(docs/conformance.md#coverage)")
    s.add_argument("--markdown", action="store_true", help="print the tables as the docs show them (the default)")
    s.set_defaults(fn=lambda args: main([]))
