"""Cost of the exact reference and acceptance interval per case of the model profile, against M*N*K.

    python -m tools.model_reference_cost [--scheme S ...] [--json FILE]

For each case of ``case_list(profile="model")``: the time to draw its inputs (``layer-codes``) and the
time of ``conformance.judge.acceptance.declared_interval`` under the canonical declaration with fp32
accumulation (what the emulator backend and every level assessment ask for). Prints a markdown table
and the least-squares fit ``seconds = a + b * GMAC`` over the linear (non-MoE) cases, where
GMAC = M*N*K / 1e9. Numbers in docs/performance.md#model-profile come from this command.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def measure(schemes=None) -> list[dict]:
    from conformance.judge.acceptance import declared_interval
    from conformance.cases.suite import case_list
    from emulator.declaration import canonical_declaration

    rows = []
    for spec in case_list(profile="model", schemes=schemes):
        c = spec.case
        t0 = time.perf_counter()
        inp = spec.inputs()
        t1 = time.perf_counter()
        declared_interval(inp, canonical_declaration(c, accumulate="float32"))
        t2 = time.perf_counter()
        rows.append({"case_id": spec.case_id, "scheme": c.scheme, "M": c.M, "N": c.N, "K": c.K, "E": c.E,
                     "mnk": c.M * c.N * c.K, "inputs_s": t1 - t0, "reference_s": t2 - t1})
    return rows


def fit(rows: list[dict]) -> tuple[float, float]:
    """(a seconds, b seconds per GMAC) of seconds = a + b * GMAC over the linear cases."""
    lin = [r for r in rows if not r["E"]]
    g = np.array([r["mnk"] / 1e9 for r in lin])
    s = np.array([r["reference_s"] for r in lin])
    a, b = np.linalg.lstsq(np.stack([np.ones_like(g), g], axis=1), s, rcond=None)[0]
    return float(a), float(b)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheme", action="append")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows = measure(args.scheme)
    print("| scheme | M | N x K | M*N*K (GMAC) | inputs (s) | reference + interval (s) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        nk = f"{r['N']}x{r['K']}" + (f" (E={r['E']})" if r["E"] else "")
        print(f"| {r['scheme']} | {r['M']} | {nk} | {r['mnk'] / 1e9:.3f} | {r['inputs_s']:.2f} | {r['reference_s']:.2f} |")
    a, b = fit(rows)
    total = sum(r["reference_s"] for r in rows)
    print(f"\nfit over the linear cases: seconds = {a:.2f} + {b:.2f} * GMAC; all {len(rows)} references: {total:.0f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "fit": {"a_s": a, "b_s_per_gmac": b}}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
