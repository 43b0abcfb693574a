"""Signal-to-quantization-noise ratio: the one definition every SQNR in qconform uses.

Semantics: docs/conformance.md#opaque-arithmetic (the judge's floor), docs/fallback.md#comparing-logits (the
model-level check). Tests with hand-derived values: tests/emulator/test_sqnr.py.

    SQNR = 10 log10( sum ref^2 / sum (y - ref)^2 )   dB, over the compared elements

Conventions:
- compared elements: where ``where`` is True; by default where ``ref`` is finite (a NaN or Inf reference
  element is not a signal: the callers match non-finite elements exactly by their own rule);
- both arrays are widened to float64 exactly (float32, float16 and bfloat16 values are float64 values) and the
  squares and their sums are accumulated in float64 (NumPy's pairwise ``np.sum``; unselected elements count
  as 0 in place, so the order does not depend on the mask);
- no noise (every compared element equal, or none compared): +inf;
- a NaN or Inf in ``y`` at a compared element (noise not finite): -inf, whatever the signal;
- a zero signal with noise (a zero reference): -inf;
- the result is a Python float.
"""

from __future__ import annotations

import math

import numpy as np

from .rounding import as_float64

__all__ = ["sqnr_db"]


def sqnr_db(y, ref, where=None) -> float:
    """SQNR of ``y`` against ``ref`` in dB (the module docstring's conventions); same shapes, or ValueError."""
    y64, r64 = as_float64(y), as_float64(ref)
    if y64.shape != r64.shape:
        raise ValueError(f"sqnr_db: y has shape {list(y64.shape)}, the reference {list(r64.shape)}")
    mask = np.isfinite(r64) if where is None else np.asarray(where, dtype=bool)
    with np.errstate(invalid="ignore", over="ignore"):
        sig = float(np.sum(np.where(mask, r64, 0.0) ** 2))
        noise = float(np.sum(np.where(mask, y64 - r64, 0.0) ** 2))
    if noise == 0:
        return math.inf
    if not math.isfinite(noise) or sig == 0:
        return -math.inf
    return 10 * math.log10(sig / noise)
