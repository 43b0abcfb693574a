"""The dispatcher as a backend: ``auto`` runs each case on the backend its ``Dispatcher`` picks for it.

Semantics: docs/backends.md#dispatcher.

``qconform run --backend auto`` judges what a user of the dispatcher gets on this host: every case
goes to the highest-priority available backend that can implement it, declares no semantic deviation
for it (judged on the case's own tensors and activations, which the suite gives through ``plan_on``) and has
no known defect for it, else to the emulator (backends/dispatch.py, the declaration-and-priority policy: the
suite does not time kernels). The declaration judged is the chosen
backend's own (its notes name the choice), so a rounding-level variant is reported with its measured
distance from the canonical reference, as for any backend.

Parameters: ``only=NAME+NAME+...`` restricts the candidates (the emulator is always the fallback);
``opaque=allow`` lets the dispatcher choose backends that declare ``arithmetic=opaque`` (judged by
SQNR only; refused by default).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from emulator import __version__ as emulator_version

from .base import SCHEMES, Availability, Backend, Case, Declared, Prepared, Support, no, yes
from .dispatch import activation_refusal

__all__ = ["AutoBackend"]


class AutoBackend(Backend):
    name = "auto"
    covers = "the dispatcher (backends/dispatch.py Dispatcher): the best backend for each case on this host"
    priority = -1000  # never a candidate of the dispatcher itself

    def __init__(self, **params: str):
        super().__init__(**params)
        unknown = sorted(set(params) - {"only", "opaque"})
        if unknown:
            raise ValueError(f"auto: unknown parameter(s) {', '.join(unknown)}; known: only, opaque")
        if params.get("opaque", "refuse") not in ("refuse", "allow"):
            raise ValueError(f"auto: opaque must be refuse or allow, got {params['opaque']!r}")
        self.allow_opaque = params.get("opaque") == "allow"
        self.candidates = [c for c in params["only"].split("+") if c] if params.get("only") else None
        if self.candidates is not None:
            from .registry import create

            for c in self.candidates:  # unknown names or parameters: an error now, not 'skipped' later
                create(c)
        from .registry import dispatcher

        self.dispatcher = dispatcher(candidates=self.candidates, allow_opaque=self.allow_opaque)

    def availability(self) -> Availability:
        return Availability(True, "always available (the emulator is the fallback)", emulator_version, "cpu")

    def plan_on(self, inp) -> None:
        """The inputs (``CaseInputs``) the next plan, prepare and run of ``inp.case`` are for: the choice is
        judged on their checkpoint tensors and activations, as the op judges a layer (a level that depends on
        them: backends/dispatch.py ``refusal``). The suite's worker and in-process runner call it before
        ``declared``; ``prepare`` and ``run`` refuse tensors and activations the choice was not judged on."""
        x = getattr(inp, "x", None)
        self._planned = (repr(inp.case), dict(inp.tensors), None if x is None else np.asarray(x, np.float32))
        self._plan_id = getattr(self, "_plan_id", 0) + 1

    def _plan(self, case: Case):
        planned = getattr(self, "_planned", None)
        return planned if planned is not None and planned[0] == repr(case) else None

    def select(self, case: Case):
        """The dispatcher's Choice for ``case``: judged on the planned tensors and activations of this case
        where ``plan_on`` gave them (contenders kept per plan), else on the case alone (kept per case)."""
        planned = self._plan(case)
        if planned is None:
            return self.dispatcher.choose(case)
        return self.dispatcher.choose(case, tensors=planned[1], layer=("plan", self._plan_id), activations=planned[2])

    def can_implement(self, case: Case) -> Support:
        sel = self.select(case)
        sup = sel.backend.can_implement(case)
        return yes() if sup.ok else no(f"no backend, the emulator included, implements it: {sup.reason}")

    def declared(self, case: Case) -> Declared:
        sel = self.select(case)
        d = sel.backend.declared(case)
        skipped = "; ".join(f"{n}: {why}" for n, why in sel.skipped) or "none"
        return dataclasses.replace(d, notes=f"dispatched to {sel.backend.label} (skipped: {skipped}). {d.notes}")

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        planned = self._plan(case)
        if planned is not None and not _same_tensors(planned[1], tensors):
            raise RuntimeError(f"auto planned {case.describe()} on other checkpoint tensors than these: its choice "
                               "was judged on those (plan_on)")
        b = self.select(case).backend
        return Prepared(case, {"backend": b, "prepared": b.prepare(case, tensors)})

    def run(self, prepared: Prepared, x, **inputs):
        b = prepared.data["backend"]
        if b.name != self.dispatcher.fallback_name:  # chosen without these activations: never a silent misroute
            why = activation_refusal(b.declared(prepared.case), prepared.case, x)
            if why:
                raise RuntimeError(f"auto chose {b.label} for {prepared.case.describe()} without these activations "
                                   f"(plan_on judged its choice on other ones, or on none), and it {why}")
        return b.run(prepared.data["prepared"], x, **inputs)

    def quantize(self, prepared: Prepared, x):
        return prepared.data["backend"].quantize(prepared.data["prepared"], x)

    def schemes(self) -> list[str]:
        return list(SCHEMES)


def _same_tensors(a: dict, b: dict) -> bool:
    """Whether two tensor dicts hold the same names, dtypes and bytes."""
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = (v if isinstance(v, np.ndarray) else getattr(v, "data", v) for v in (a[k], b[k]))
        x, y = np.asarray(x), np.asarray(y)
        if x is y:
            continue
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            return False
    return True
