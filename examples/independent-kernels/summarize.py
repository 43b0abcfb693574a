"""Summarize run_matrix.sh outputs: per run, failing count, failing tiers and the first localization line.

usage: python summarize.py RUN_DIR... (each a `qconform run --out` folder)"""

import json
import sys
from collections import Counter
from pathlib import Path

for d in sys.argv[1:]:
    p = Path(d) / "summary.json"
    if not p.exists():
        print(f"{Path(d).name}\tNO SUMMARY")
        continue
    s = json.loads(p.read_text())
    fails = s.get("failures", [])
    tiers = Counter(f.get("tier") for f in fails)
    loc = ""
    for f in fails:
        lz = f.get("localization") or {}
        if lz.get("summary"):
            loc = lz["summary"]
            break
    print(f"{Path(d).name}\tbad={s['n_bad']}/{s['n_results']}\ttiers={dict(tiers)}\t{loc[:300]}")
