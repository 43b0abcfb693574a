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


#: (significand bits p, smallest normal exponent, largest finite value) of each dtype (IEEE 754 binary32/16; bfloat16)
#: tfloat32: float32's exponent range with float16's 11 significant bits (docs/variants.md#declared-fields)
FORMATS = {"float32": (24, -126, float(np.finfo(np.float32).max)), "float16": (11, -14, 65504.0),
           "bfloat16": (8, -126, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)),
           "tfloat32": (11, -126, (2 - 2.0 ** -10) * 2.0 ** 127)}


def fl(a, dtype: str) -> np.ndarray:
    """``a`` (float64) rounded once, to nearest even, to ``dtype``, as float64: the textbook rule, quantum
    2^(max(e, emin) - p + 1) for |a| in [2^e, 2^(e+1)), np.rint (RNE) of the exact quotient by it, +-Inf at or
    beyond max + ulp(max)/2. Not ml_dtypes' float64 -> bfloat16 cast, which rounds through float32 (twice:
    1 + 2^-8 + 2^-30 becomes 1.0, not 1 + 2^-7)."""
    p, emin, vmax = FORMATS[dtype]
    a = np.asarray(a, np.float64)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        _, ex = np.frexp(np.where(np.isfinite(a) & (a != 0), a, 1.0))
        e = ex - 1.0  # exact floor(log2 |a|) (frexp: |a| = m 2^ex, m in [0.5, 1))
        quantum = np.ldexp(1.0, (np.maximum(e, emin) - p + 1).astype(np.int64))
        r = np.rint(a / quantum) * quantum
        threshold = vmax + np.ldexp(1.0, int(np.floor(np.log2(vmax))) - p)  # max + ulp(max) / 2
        r = np.where(np.abs(a) >= threshold, np.copysign(np.inf, a), r)
        return np.where(np.isfinite(a) & (a != 0), r, a)


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
