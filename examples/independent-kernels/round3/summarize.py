"""Summarize round-3 run folders: per run, the failing tiers/generators and the localization lines.

usage: python summarize.py /tmp/r3/ci/*   (folders holding results.jsonl)"""

from __future__ import annotations

import collections
import json
import pathlib
import sys


def summarize(folder: pathlib.Path) -> dict:
    bad = collections.Counter()
    locs = collections.Counter()
    n = 0
    verdicts = collections.Counter()
    for line in (folder / "results.jsonl").read_text().splitlines():
        d = json.loads(line)
        if "verdict" not in d:
            continue
        n += 1
        verdicts[d["verdict"]] += 1
        if d["verdict"] in ("fail", "crash", "timeout"):
            bad[f"{d.get('tier')}/{d.get('generator')}"] += 1
            loc = d.get("localization") or {}
            if loc.get("summary"):
                locs[f"[{loc.get('stage')}] {loc['summary']}"] += 1
    return {"run": folder.name, "cases": n, "verdicts": dict(verdicts), "failing": dict(bad.most_common()),
            "localization": dict(locs.most_common(4))}


if __name__ == "__main__":
    for p in sys.argv[1:]:
        p = pathlib.Path(p)
        if (p / "results.jsonl").exists():
            print(json.dumps(summarize(p)))
