"""The verdict of one stored case, recomputed from a bundle's arrays (``verify-bundle`` and its ``--rerun`` audit).

Semantics: docs/certification.md#verification.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["offline_verdict"]


def offline_verdict(d: dict, meta: dict, declared: "dict | None"):
    """``conformance.judge.verdict.decide`` on the arrays one case stored (``decode_case``): a ``Judgement``."""
    from conformance.judge.acceptance import Interval
    from conformance.judge.verdict import decide, require_output_grid

    bound = np.array([1.0 if meta.get("bound_positive") else 0.0])
    loose = Interval(y_ref=d["y_ref"], y_exact=d["y_exact_proxy"], lo=d["lo"], hi=d["hi"], bound=bound,
                     out_dtype=meta["dtype"])
    judged = dataclasses.replace(loose, lo=d["jlo"], hi=d["jhi"])
    declared = declared or {}
    if declared.get("arithmetic") == "opaque":
        from conformance.judge.verdict import decide_opaque

        with np.errstate(all="ignore"):
            return require_output_grid(decide_opaque(d["y"], loose, judged, float(declared["sqnr_floor_db"])), d["y"])
    alt = None
    if "alo" in d:
        name = str(meta.get("alt"))
        axis = name.split("=", 1)[0]
        mine = f"{axis}={(declared.get('variants') or {}).get(axis) or 'rne'}"
        alt = lambda: (name, mine, d["alo"], d["ahi"])  # noqa: E731
    tie = (lambda: (d["tlo"], d["thi"], d["ties"])) if "tlo" in d else None
    with np.errstate(all="ignore"):
        return require_output_grid(decide(d["y"], loose, judged, output_rounding=declared.get("output_rounding")
                                          or "rne", alt=alt, tie=tie), d["y"])
