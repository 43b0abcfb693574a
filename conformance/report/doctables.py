"""Tables in the docs that are computed from the code, never typed: case counts per profile and tier.

Semantics: docs/conformance.md#case-counts.

    python -m conformance.report.doctables           # print the tables
    python -m conformance.report.doctables --write   # rewrite them in README.md and docs/conformance.md
    python -m conformance.report.doctables --check   # exit 1 naming each file whose table is stale

A table lives between ``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->``; the
text between the markers is replaced whole. tests/conformance/test_doctables.py runs --check.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

__all__ = ["tables", "rewrite", "stale", "DOC_FILES"]

ROOT = Path(__file__).resolve().parents[2]
#: files (relative to the repository root) whose generated blocks this module owns
DOC_FILES = ("README.md", "docs/conformance.md")


def case_counts() -> str:
    """Cases per profile and tier (``case_list``; the nightly profile's seeds change, its counts do not)."""
    from conformance.cases.suite import PROFILES, TIERS, case_list

    rows = ["| profile | shapes (M, N, K) | random seeds | " + " | ".join(TIERS) + " | all |",
            "| --- | --- | --- |" + " --- |" * (len(TIERS) + 1)]
    for name, prof in PROFILES.items():
        if prof.get("cases") == "families":  # a checkpoint's own families: counts depend on the checkpoint
            shapes = ", ".join(f"{m}x{n}x{k}" for m, n, k in prof["shapes"])
            rows.append(f"| `{name}` | each case family of a checkpoint (`certify --for-model`) at {shapes}, K widened "
                        f"to two groups | {prof['seeds']} | " + " | ".join("per family" for _ in TIERS) + " | per family |")
            continue
        counts = [len(case_list(tiers=(t,), profile=name)) for t in TIERS]
        shapes = ", ".join(f"{m}x{n}x{k}" for m, n, k in prof["shapes"])
        if prof.get("cases") == "model":
            from conformance.cases.model_profile import MODEL_CONFIGS, MODEL_M

            shapes = f"layers of {', '.join(MODEL_CONFIGS)} at M = {', '.join(map(str, MODEL_M))}"
        rows.append(f"| `{name}` | {shapes} | {prof['seeds']}{' (fresh)' if prof['fresh_seeds'] else ''} | "
                    + " | ".join(str(c) for c in counts) + f" | {len(case_list(profile=name))} |")
    return "\n".join(rows)


def tables() -> dict[str, str]:
    return {"case-counts": case_counts()}


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- generated: {re.escape(name)} -->\n)(.*?)(<!-- end generated: {re.escape(name)} -->)",
                      re.S)


def rewrite(text: str, generated: dict[str, str]) -> str:
    for name, body in generated.items():
        text = _block(name).sub(lambda m: m.group(1) + body + "\n" + m.group(3), text)
    return text


def stale(root: Path = ROOT) -> list[str]:
    """Files whose generated blocks differ from what the code gives now."""
    gen = tables()
    return [f for f in DOC_FILES if (root / f).is_file()
            and rewrite((root / f).read_text(encoding="utf-8"), gen) != (root / f).read_text(encoding="utf-8")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.report.doctables")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    gen = tables()
    if args.check:
        bad = stale()
        for f in bad:
            print(f"{f}: generated table is stale; run: python -m conformance.report.doctables --write")
        return 1 if bad else 0
    if args.write:
        for f in DOC_FILES:
            p = ROOT / f
            text = p.read_text(encoding="utf-8")
            new = rewrite(text, gen)
            if new != text:
                p.write_text(new, encoding="utf-8")
                print(f"rewrote {f}")
        return 0
    for name, body in gen.items():
        print(f"<!-- generated: {name} -->\n{body}\n<!-- end generated: {name} -->")
    return 0


if __name__ == "__main__":
    sys.exit(main())
