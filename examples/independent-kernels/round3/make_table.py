"""One markdown row per run folder: verdict counts, the failing generators (top 3) and the console's
localization lines (distinct, first two), as `qconform run` printed them.

usage: python make_table.py /tmp/r3/ci   (folders made by run_one.sh, each with its .log beside it)"""

from __future__ import annotations

import collections
import json
import pathlib
import sys


def row(folder: pathlib.Path) -> str:
    verdicts, gens = collections.Counter(), collections.Counter()
    for line in (folder / "results.jsonl").read_text().splitlines():
        d = json.loads(line)
        if "verdict" not in d:
            continue
        verdicts[d["verdict"]] += 1
        if d["verdict"] in ("fail", "crash", "timeout"):
            gens[f"{d.get('tier')}/{d.get('generator')}"] += 1
    log = folder.with_name(folder.name + ".log")
    locs = []
    if log.exists():
        for ln in log.read_text().splitlines():
            s = ln.strip()
            if s.startswith("localization:"):
                t = s[len("localization:"):].strip()
                if t not in locs:
                    locs.append(t)
    v = " / ".join(f"{n} {k}" for k, n in sorted(verdicts.items()))
    g = ", ".join(f"{k} {n}" for k, n in gens.most_common(3)) or "-"
    lz = "<br>".join(x[:300] for x in locs[:2]) or "-"
    return f"| `{folder.name}` | {v} | {g} | {lz} |"


if __name__ == "__main__":
    root = pathlib.Path(sys.argv[1])
    print("| run | verdicts | failing generators | localization (console) |\n| --- | --- | --- | --- |")
    for p in sorted(root.iterdir()):
        if p.is_dir() and (p / "results.jsonl").exists():
            print(row(p))
