"""The output dtype's grid: a kernel's output must be values of the output dtype it declares.

The judge's intervals compare values only; a kernel that declares bfloat16 (or float16) output but
returns float32 values would pass every element whose judged interval spans two grid values. The
worker carries every output as float32 (exact for the 16-bit dtypes), so an element is a value of the
declared dtype exactly when rounding it to that dtype leaves it unchanged (docs/conformance.md#verdicts).
"""

from __future__ import annotations

import numpy as np

from .acceptance import Interval, round_to, ulp_distance

__all__ = ["off_grid", "require_output_grid"]


def off_grid(y, dtype: str) -> np.ndarray:
    """Mask of the finite elements of ``y`` that are not values of ``dtype`` (NaN and +-Inf are on every grid)."""
    y64 = np.asarray(y, np.float64)
    fin = np.isfinite(y64)
    with np.errstate(invalid="ignore", over="ignore"):
        return fin & (round_to(np.where(fin, y64, 0.0), dtype) != np.where(fin, y64, 0.0))


def require_output_grid(rec: dict, y, judged: Interval) -> dict:
    """``rec`` made a failure naming the first element of ``y`` off ``judged.out_dtype``'s grid, if any."""
    y64 = np.asarray(y, np.float64)
    if rec.get("verdict") == "fail" or y64.shape != judged.y_exact.shape:
        return rec
    bad = off_grid(y64, judged.out_dtype)
    n = int(bad.sum())
    if not n:
        return rec
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    rec = dict(rec, verdict="fail", worst=list(idx),
               reason=f"{n} output element(s) are not values of the declared output dtype {judged.out_dtype} "
                      f"(off its grid: e.g. element {list(idx)} = {float(y64[idx])!r}; the kernel returns another "
                      "dtype's values or rounds to a wider format than it declares)")
    rec["worst_element"] = {"index": list(idx), "observed": float(y64[idx]), "expected": float(judged.y_exact[idx]),
                            "lo": float(judged.lo[idx]), "hi": float(judged.hi[idx]),
                            "reference": float(judged.y_ref[idx]),
                            "ulp": ulp_distance(float(round_to(y64[idx], judged.out_dtype)), float(judged.y_ref[idx]),
                                                judged.out_dtype)}
    return rec
