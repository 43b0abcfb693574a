"""Shared pieces of the literal-docs kernels (issue 21 item 5): float rounding by an independent oracle
(NumPy's IEEE float32/float16 casts, ml_dtypes' bfloat16), the four integer tie rules of
docs/formats.md#rounding-modes, and the completeness check over an axis list.

Nothing here reads emulator/ code: the kernels that use it are written from docs/ only.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from emulator.variants import AXES

NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
#: torch.finfo(dtype).eps (docs/formats/activations.md#reference-implementations: 2^-23, 2^-7, 2^-10)
EPS = {"float32": 2.0 ** -23, "bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}


def fl(a, dtype: str) -> np.ndarray:
    """``a`` (float64, the exact or correctly rounded float64 result of one operation on values of ``dtype``)
    rounded once, to nearest even, to ``dtype``, as float64. The float64 step is innocuous double rounding
    (53 >= 2p + 2 for p <= 24: Figueroa 1995)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(a, np.float64).astype(NP[dtype]).astype(np.float64)


def round_int(v, mode: str) -> np.ndarray:
    """docs/formats.md#rounding-modes to an integer: RNE, RHAZ (ties away), RTZ (truncate), RHTZ (ties toward 0)."""
    v = np.asarray(v, np.float64)
    with np.errstate(invalid="ignore"):
        if mode == "rne":
            return np.rint(v)
        if mode == "rhaz":
            return np.sign(v) * np.floor(np.abs(v) + 0.5)
        if mode == "rtz":
            return np.trunc(v)
        if mode == "rhtz":
            return np.sign(v) * np.ceil(np.abs(v) - 0.5)
    raise ValueError(mode)


def missing_kernels(stage, registry: dict) -> list[str]:
    """``key=value`` of every value of the axes of ``stage`` that ``registry`` (key -> {value: ...}) has no
    kernel for: each named value of a choice axis, both values of a bool axis, and at least one value
    other than the canonical one for an int or float axis."""
    missing = []
    for key, a in AXES.items():
        if a.stage is not stage:
            continue
        have = registry.get(key, {})
        if a.kind == "choice":
            want = list(a.values)
        elif a.kind == "bool":
            want = [True, False]
        else:
            want = [v for v in have if v != a.canonical][:1] or ["<a non-canonical value>"]
        missing += [f"{key}={v}" for v in want if v not in have]
    return missing
