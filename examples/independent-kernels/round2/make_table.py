"""Markdown rows for the README from the run folders: bug | lives in | one line | ci pass/fail | failing
generators (most failing first) | localization summary of the most frequent group.

usage: python make_table.py ROOT/ci   (folders named <backend>_bug_<bug>-<scheme>)"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from qconform_r2.bugs import BUGS  # noqa: E402
from summarize import summarize  # noqa: E402

root = pathlib.Path(sys.argv[1])
for backend, bugs in BUGS.items():
    for bug, (where, line) in bugs.items():
        runs = sorted(root.glob(f"{backend}_bug_{bug}-*"))
        cells = []
        for r in runs:
            if not (r / "results.jsonl").exists():
                continue
            s = summarize(r)
            scheme = r.name.rsplit("-", 1)[-1] if not r.name.endswith("mxfp4") and not r.name.endswith("moe") else \
                r.name.split(f"{bug}-", 1)[1]
            v = s["verdicts"]
            gens = ", ".join(f"{k} {n}" for k, n in list(s["failing"].items())[:3])
            loc = next(iter(s["localization"]), "-")
            cells.append(f"{scheme}: {v.get('pass', 0)} pass / {v.get('fail', 0)} fail / {v.get('crash', 0)} crash"
                         + (f"; {gens}" if gens else "") + (f"; loc: {loc[:160]}" if loc != "-" else ""))
        print(f"| `{backend}:{bug}` | {where} | {line} | {'<br>'.join(cells) or 'not run'} |")
