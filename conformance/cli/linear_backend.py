"""``qconform linear CKPT --layer L --backend auto|NAME``: one checkpoint layer through a backend or the dispatcher.

Semantics: docs/backends.md#dispatcher. The layer becomes a Case with its canonical tensors
(emulator/layer_cases.py); ``auto`` asks the dispatcher (backends/registry.py ``select``), which names
the backend it chose and why it skipped each other one. The output is judged against the chosen
backend's declared interval and its conformance level is printed, so a user sees what the answer is
worth, not only which kernel gave it.
"""

from __future__ import annotations

import numpy as np

from backends.registry import dispatcher, select
from emulator.declaration import declared_output, declared_reference
from emulator.errors import UnsupportedFormatError
from emulator.layer_cases import case_tensors, layer_case
from emulator.layers import dequantize_layer, layer_bias

from conformance.judge.acceptance import compare, declared_interval
from conformance.cases.inputs import CaseInputs

__all__ = ["linear_through_backend", "linear_with_variants"]


def linear_through_backend(ck, info, x: np.ndarray, dtype: str, act: str, spec: str) -> tuple[np.ndarray, list[str], bool]:
    """(y, lines to print, inside its declared interval) for layer ``info`` on activations ``x``."""
    dequantize_layer(ck, info)  # every tensor validated as `dequant` does: bad input is exit 2 before any kernel runs
    case = layer_case(info, int(x.shape[0]), dtype, act)
    tensors = case_tensors(ck, info, case)
    bias = layer_bias(ck, info)
    bias32 = None if bias is None else np.asarray(bias, np.float32)
    lines = []
    if spec == "auto":
        sel = select(case, tensors=tensors, activations=np.asarray(x, np.float32))
        backend = sel.backend
        lines.append(f"backend: {backend.label} (dispatched for {case.describe()})")
        lines += [f"  skipped {name}: {why}" for name, why in sel.skipped]
    else:
        backend = dispatcher().named(spec, case)  # unavailable or cannot implement: RuntimeError saying why
        lines.append(f"backend: {backend.label} (named)")
    declared = backend.declared(case)
    x32 = np.asarray(x, np.float32)
    y = np.asarray(backend.run(backend.prepare(case, tensors), x32, **({"bias": bias32} if bias32 is not None else {})))
    cmp = compare(y, declared_interval(CaseInputs(case, 0, tensors, x32, bias32), declared))
    level = declared.level(case, tensors).label
    devs = ", ".join(str(d) for d in declared.deviations(case, tensors)) or "none"
    lines.append(f"level: {level} (declared deviations: {devs})")
    lines.append("inside its declared interval: " + ("yes" if cmp.ok else
                                                       f"NO ({cmp.n_out} element(s) outside; max {cmp.max_ulp} ULP)"))
    return y, lines, bool(cmp.ok)


def linear_with_variants(ck, info, x: np.ndarray, dtype: str, act: str, declared) -> tuple[np.ndarray, np.ndarray]:
    """(y, y_exact) of layer ``info`` under the named variants of ``declared``: the layer as a Case and the
    emulator's declared reference (emulator/declaration.py), for variants the direct path does not apply."""
    import dataclasses

    dequantize_layer(ck, info)  # every tensor validated as `dequant` does
    case = layer_case(info, int(x.shape[0]), dtype, act)
    declared = dataclasses.replace(declared, output=dtype)  # the reference is rounded to x's dtype
    scheme = case.spec.name
    for key in declared.variants:
        from emulator.variants import AXES

        if not AXES[key].applies_to(scheme):
            raise UnsupportedFormatError(f"--variant {key}: applies to {', '.join(AXES[key].schemes)}; layer "
                                         f"{info.name} is {scheme}")
    tensors = case_tensors(ck, info, case)
    bias = layer_bias(ck, info)
    b32 = None if bias is None else np.asarray(bias, np.float32)
    x32 = np.asarray(x, np.float32)
    y = declared_output(case, tensors, x32, b32, None, declared)
    ref = declared_reference(case, tensors, x32, b32, None, declared)
    return y, np.asarray(ref.y_exact, np.float64)
