"""The emulator as a backend: the fallback when no accelerator kernel is present.

Covers: every scheme qconform defines (emulator/). Two paths:

- ``path=fast`` (default): dequantize the weights once (cached by a content hash
  of the checkpoint tensors), then one float64 BLAS matmul per call; the result is
  the declared reference rounded once to the output dtype;
- ``path=exact``: the reference linear of emulator/linear.py on every call.

Both return the canonical result (or the variant named by its parameters), so
the emulator passes its own suite bit for bit. Parameters select variants, e.g.
``emulator:act_rounding=rhaz`` or ``emulator:mx_scale_rule=even``: the backend
then *declares* those variants, and a run against the canonical declaration
shows whether the suite catches the difference.
"""

from __future__ import annotations

import hashlib

import numpy as np

from emulator import __version__ as emulator_version
from emulator.numerics.floats import round_to_dtype

from .base import Availability, Backend, Case, Declared, Prepared, Support, no, yes

#: parameters that name emulator variants (docs/formats.md) and are passed into the declaration
VARIANT_KEYS = ("act_rounding", "reciprocal", "act_scale_dtype", "qmin", "qmax", "zero_row", "eps", "act_symmetric",
                "uint8_zp128", "zero_read", "dequant_order", "weight_scale_dtype", "mx_scale_rule", "e2m1_rounding",
                "e2m1_nan", "mx_zero_block", "mx_nan_block")


class EmulatorBackend(Backend):
    name = "emulator"
    covers = "qconform's NumPy reference emulator (emulator/), canonical semantics or a named variant"
    priority = -100  # the fallback: chosen only when nothing else can implement a case

    def __init__(self, **params: str):
        super().__init__(**params)
        unknown = set(params) - set(VARIANT_KEYS) - {"path", "weight_dtype", "accumulate", "declare"}
        if unknown:
            raise ValueError(f"emulator: unknown parameter(s) {sorted(unknown)}; known: path, weight_dtype, accumulate, "
                             "declare, " + ", ".join(VARIANT_KEYS))
        # declare=canonical: compute the named variant but *claim* canonical semantics, i.e. a
        # kernel whose declaration is wrong; the suite must catch it (docs/conformance.md#proof).
        self.declare = params.get("declare", "self")
        if self.declare not in ("self", "canonical"):
            raise ValueError(f"emulator: declare must be self or canonical, got {self.declare!r}")
        self.path = params.get("path", "fast")
        if self.path not in ("fast", "exact"):
            raise ValueError(f"emulator: path must be fast or exact, got {self.path!r}")
        self._cache: dict[str, np.ndarray] = {}

    def availability(self) -> Availability:
        return Availability(True, "always available (NumPy)", emulator_version, "cpu")

    def can_implement(self, case: Case) -> Support:
        if case.scheme == "w4a16-moe" and case.weight_format != "gptq":
            return no("MoE is defined for GPTQ symmetric int4 experts only")
        return yes()

    def schemes(self) -> list[str]:
        from .base import SCHEMES

        return list(SCHEMES)

    def computed(self, case: Case) -> Declared:
        """What this instance actually computes (its variants), whatever it declares."""
        variants = {k: v for k, v in self.params.items() if k in VARIANT_KEYS}
        return Declared(variants=variants, weight_dtype=self.params.get("weight_dtype", "exact"),
                        accumulate=self.params.get("accumulate", "exact"), output=case.output_dtype,
                        notes=f"emulator path={self.path}")

    def declared(self, case: Case) -> Declared:
        if self.declare == "canonical":
            return Declared(variants={}, accumulate="exact", output=case.output_dtype,
                            notes="claims canonical semantics")
        return self.computed(case)

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        return Prepared(case, {"tensors": tensors})

    def _weight(self, case: Case, tensors: dict) -> np.ndarray:
        from conformance.acceptance import declared_weight

        h = hashlib.sha256(repr(case.to_json()).encode())
        for k in sorted(tensors):
            a = np.ascontiguousarray(tensors[k])
            h.update(k.encode() + str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
        key = h.hexdigest()
        if key not in self._cache:
            self._cache.clear()  # hold at most one dequantized copy of a layer
            self._cache[key] = declared_weight(case, tensors, self.computed(case)).astype(np.float64)
        return self._cache[key]

    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        from conformance.acceptance import declared_interval
        from conformance.cases import CaseInputs

        case = prepared.case
        tensors = prepared.data["tensors"]
        if self.path == "fast" and case.scheme in ("w4a16", "w8a16", "w4a16-mxfp4"):
            w = self._weight(case, tensors)
            y = np.asarray(x, dtype=np.float64) @ w.T
            if inputs.get("bias") is not None:
                y = y + np.asarray(inputs["bias"], dtype=np.float64)
            return round_to_dtype(y, case.output_dtype).astype(np.float32)
        inp = CaseInputs(case, 0, tensors, np.asarray(x, np.float32), inputs.get("bias"), inputs.get("router_logits"))
        return declared_interval(inp, self.computed(case)).y_ref.astype(np.float32)
