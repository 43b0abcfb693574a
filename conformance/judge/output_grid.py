"""The output dtype's grid: a kernel's output must be values of the output dtype it declares.

The judge's intervals compare values only; a kernel that declares bfloat16 (or float16) output but
returns float32 values would pass every element whose judged interval spans two grid values. The
worker carries every output as float32 (exact for the 16-bit dtypes), so an element is a value of the
declared dtype exactly when rounding it to that dtype leaves it unchanged (docs/conformance.md#verdicts).
The rule a judgement obeys with it is ``conformance.judge.verdict.require_output_grid``.
"""

from __future__ import annotations

import numpy as np

from emulator.numerics.fast_round import round_fast

__all__ = ["off_grid"]


def off_grid(y, dtype: str) -> np.ndarray:
    """Mask of the finite elements of ``y`` that are not values of ``dtype`` (NaN and +-Inf are on every grid)."""
    y64 = np.asarray(y, np.float64)
    fin = np.isfinite(y64)
    with np.errstate(invalid="ignore", over="ignore"):
        return fin & (round_fast(np.where(fin, y64, 0.0), dtype, as_float64=True) != np.where(fin, y64, 0.0))
