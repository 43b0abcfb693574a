"""Run a backend in this process and judge one input (no worker isolation: a crash takes the caller down).

For property tests written with the suite's Hypothesis strategies (conformance/cases/strategies.py,
docs/conformance.md#hypothesis-strategies); the runner (conformance/run/runner.py) is the isolated way.
"""

from __future__ import annotations

import numpy as np

from conformance.cases.inputs import CaseInputs

__all__ = ["judge_inputs"]


def judge_inputs(backend: str, inp: CaseInputs, *, target: bool = False) -> dict:
    """Run ``backend`` in-process on ``inp`` and judge it against its own declaration.

    With ``target=True`` the error/bound ratio goes to ``hypothesis.target`` (nightly profile).
    """
    from backends.registry import create

    from conformance.judge.verdict import Verdict, judge, judged_against

    b = create(backend)
    if hasattr(b, "plan_on"):  # a dispatcher judges its choice on the case's own activations
        b.plan_on(inp)
    sup = b.can_implement(inp.case)
    if not sup.ok:
        return {"verdict": Verdict.UNSUPPORTED.value, "reason": sup.reason}
    declared = b.declared(inp.case)
    y = b.run(b.prepare(inp.case, inp.tensors), inp.x, bias=inp.bias, router_logits=inp.router_logits)
    rec = judge(inp, judged_against(inp, declared), np.asarray(y, np.float32), declared).record()
    if target:
        from hypothesis import target as _target

        ratio = rec.get("max_ratio", 0.0)
        _target(float(ratio) if np.isfinite(ratio) else 1e6, label="error/bound ratio")
    return rec

