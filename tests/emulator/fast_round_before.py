"""The fast roundings as they stood before #23 item 5 made them one (``emulator.numerics.fast_round``):
main at 03fbf79, kept verbatim (docstrings shortened) as the baseline of the regression gate in
tests/emulator/test_fast_round.py. Test code only: nothing outside that test imports it.

- ``round_float32_array`` / ``round_float64_array``: emulator/numerics/floats.py
- ``output_grid_rne``: emulator/numerics/output_grid.py ``rne``
- ``acceptance_rtz32`` / ``acceptance_round_to``: conformance/judge/acceptance.py ``_rtz32`` / ``round_to``
"""

from __future__ import annotations

import numpy as np

from emulator.numerics.floats import round_to_dtype
from emulator.numerics.rounding import Rounding

_FAST = ("float32", "float16", "bfloat16")


def round_float32_array(y32: np.ndarray, dtype: str) -> np.ndarray:
    y = np.asarray(y32, dtype=np.float32)
    if dtype == "float32":
        return y
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return y.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        bits = y.view(np.uint32)
        lsb = (bits >> np.uint32(16)) & np.uint32(1)
        rounded = (bits + np.uint32(0x7FFF) + lsb) & np.uint32(0xFFFF0000)
        nan = np.isnan(y)
        if nan.any():
            rounded = np.where(nan, (bits | np.uint32(0x00400000)) & np.uint32(0xFFFF0000), rounded)
        return rounded.view(np.float32)
    raise ValueError(f"unknown dtype {dtype!r}")


def round_float64_array(y64: np.ndarray, dtype: str) -> np.ndarray:
    y = np.asarray(y64, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        f = y.astype(np.float32)
    if dtype == "float32":
        return f
    fin = np.isfinite(y)
    with np.errstate(invalid="ignore"):
        over = fin & (np.abs(f.astype(np.float64)) > np.abs(y))
    bits = f.view(np.uint32).copy()
    bits -= over.view(np.uint8)
    t = bits.view(np.float32)
    with np.errstate(invalid="ignore"):
        inexact = fin & (t.astype(np.float64) != y)
    bits |= inexact.view(np.uint8)
    return round_float32_array(bits.view(np.float32), dtype)


def output_grid_rne(v: np.ndarray, out_dtype: str) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    if out_dtype not in _FAST or v.ndim == 0:
        return round_to_dtype(v, out_dtype, Rounding.RNE)
    out = round_float64_array(v, out_dtype).astype(np.float64)
    nan = np.isnan(v)
    if nan.any():
        out[nan] = round_to_dtype(v[nan], out_dtype, Rounding.RNE)
    return out


def acceptance_rtz32(v: np.ndarray, dtype: str) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        f = v.astype(np.float32)
        over = np.abs(f.astype(np.float64)) > np.abs(v)
    bits = f.view(np.uint32).copy()
    bits -= over.astype(np.uint32)
    if dtype == "float32":
        return bits.view(np.float32)
    if dtype == "bfloat16":
        return (bits & np.uint32(0xFFFF0000)).view(np.float32)
    f = bits.view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = f.astype(np.float16)
        over = np.abs(h.astype(np.float32)) > np.abs(f)
    hb = h.view(np.uint16).copy()
    hb -= over.astype(np.uint16)
    return hb.view(np.float16).astype(np.float32)


def acceptance_round_to(v, dtype: str, mode="rne") -> np.ndarray:
    mode = Rounding.parse(mode)
    v = np.asarray(v, dtype=np.float64)
    if dtype not in _FAST or mode not in (Rounding.RNE, Rounding.RTZ) or v.ndim == 0:
        return round_to_dtype(v, dtype, mode)
    out = (round_float64_array(v, dtype) if mode is Rounding.RNE else acceptance_rtz32(v, dtype)).astype(np.float64)
    nan = np.isnan(v)
    if nan.any():
        out[nan] = round_to_dtype(v[nan], dtype, mode)
    return out
