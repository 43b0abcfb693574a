"""The property tier's mutation self-test: each planted-bug double searched until one family fails.

Semantics: docs/selftest.md (property tier). The search itself is conformance/run/property_search.py.
"""

from __future__ import annotations

import os
from pathlib import Path

from conformance.judge.verdict import BAD
from conformance.run.property_search import run_property

__all__ = ["mutant_kills"]


def mutant_kills(names, out_dir: "str | Path", *, profile: str = "ci", seed: "int | None" = None,
                 timeout: float = 120.0) -> dict:
    """The mutation self-test for this tier (docs/selftest.md): each mutant of conformance/selftest/doubles/mutants.py
    runs in a worker (``mutant:bug=NAME``), searched over the families of its schemes until one fails.

    Returns {name: {"killed": bool, "family": ..., "verdict": ..., "minimal": ..., "first_failure": ...,
    "calls": ...}}. The control (``none``) must survive: it shows the kills come from the bugs.
    """
    from conformance.selftest.doubles.mutants import EXTRA_BACKENDS_ENTRY, MUTANTS

    from conformance.run.runner import Runner

    extra = os.environ.get("QCONFORM_EXTRA_BACKENDS", "")
    env = {"QCONFORM_EXTRA_BACKENDS": ",".join(x for x in (extra, EXTRA_BACKENDS_ENTRY) if x)}
    out = {}
    for name in names:
        schemes = MUTANTS[name].schemes if name in MUTANTS else None
        runner = Runner(Path(out_dir) / name, timeout=timeout, progress=False, worker_env=env)
        recs = run_property(runner, [f"mutant:bug={name}"], profile=profile, seed=seed, schemes=schemes,
                            stop_at_first_failure=True,
                            case_filter=_mutant_filter(MUTANTS.get(name)))
        bad = [r for r in recs if r["verdict"] in BAD]
        info = {"killed": bool(bad), "families": len(recs),
                "calls": sum((r.get("property") or {}).get("calls", 0) for r in recs)}
        if bad:
            p = bad[0].get("property") or {}
            info.update(family=p.get("family"), verdict=bad[0]["verdict"], case_id=bad[0]["case_id"],
                        minimal=p.get("minimal"), first_failure=p.get("first_failure"))
        out[name] = info
    return out


def _mutant_filter(mutant):
    """The cases a mutant's bug lives in. Its int8 stage is a symmetric quantizer (the seeded suite's
    W8A8 is symmetric), so asymmetric-activation cases are left out for mutants that replace it: they
    would be killed by the symmetry, not by their bug."""
    if mutant is None:
        return None
    return lambda c: mutant.applies(c) and (c.act_symmetric or mutant.int8 is None)
