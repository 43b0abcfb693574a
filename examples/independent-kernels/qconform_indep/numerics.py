"""Rounding to 16/32-bit floats and unpacking of the checkpoint layouts, written from the format docs.

Rounding: one RNE step from float64 to a float format with ``p`` significant bits, smallest quantum
``2**qmin`` (subnormals) and largest finite value ``maxval`` (IEEE 754 roundTiesToEven, overflow to Inf).
Packing: docs/formats/gptq.md#packing (LSB first), docs/formats/awq.md#slot-order, docs/formats/mxfp4.md.
"""

from __future__ import annotations

import numpy as np

_FMT = {  # p, qmin, maxval
    "bfloat16": (8, -133, float.fromhex("0x1.fep127")),
    "float16": (11, -24, 65504.0),
    "float32": (24, -149, float(np.finfo(np.float32).max)),
}


def round_to(v, dtype: str, mode: str = "rne") -> np.ndarray:
    """float64 values rounded once to ``dtype`` (RNE, or RTZ: drop the low bits), returned as float64."""
    v = np.asarray(v, np.float64)
    if dtype == "float64":
        return v
    p, qmin, maxval = _FMT[dtype]
    with np.errstate(all="ignore"):
        _, e = np.frexp(v)
        q = np.maximum(e - p, qmin)
        scaled = np.ldexp(v, -q)
        r = np.rint(scaled) if mode == "rne" else np.trunc(scaled)
        r = np.ldexp(r, q)
        if mode == "rne":
            r = np.where(np.abs(r) > maxval, np.copysign(np.inf, v), r)
        else:
            r = np.where(np.abs(r) > maxval, np.copysign(maxval, v), r)
            r = np.where(np.isinf(v), v, r)
    return np.where(np.isfinite(v), r, v)


def unpack(words, bits: int, axis: int) -> np.ndarray:
    """Fields of int32 words along ``axis``: element F*j + i is field i of word j (bits b*i .. b*i+b-1)."""
    w = np.asarray(words).astype(np.int64) & 0xFFFFFFFF
    F = 32 // bits
    w = np.moveaxis(w, axis, -1)
    shifts = np.arange(F, dtype=np.int64) * bits
    f = (w[..., None] >> shifts) & ((1 << bits) - 1)
    f = f.reshape(w.shape[:-1] + (w.shape[-1] * F,))
    return np.moveaxis(f, -1, axis)


AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # slot s holds column 8j + AWQ_PACK_ORDER[s]


def unpack_awq(words, plain: bool = False) -> np.ndarray:
    """AWQ [R, N/8] words -> [R, N] codes (slot order of docs/formats/awq.md)."""
    f = unpack(words, 4, axis=1)  # [R, N] in slot order
    if plain:
        return f
    R, N = f.shape
    f = f.reshape(R, N // 8, 8)
    out = np.empty_like(f)
    for s, c in enumerate(AWQ_PACK_ORDER):
        out[:, :, c] = f[:, :, s]
    return out.reshape(R, N)


E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def unpack_e2m1(packed) -> np.ndarray:
    """uint8 [..., K/2] -> codes [..., K]: element 2j in the low nibble of byte j."""
    b = np.asarray(packed).astype(np.int64)
    lo, hi = b & 0xF, b >> 4
    return np.stack([lo, hi], axis=-1).reshape(b.shape[:-1] + (b.shape[-1] * 2,))


def e8m0(byte) -> np.ndarray:
    """E8M0 scale bytes -> float64 2**(byte - 127); 0xFF is NaN."""
    b = np.asarray(byte).astype(np.int64)
    return np.where(b == 255, np.nan, np.ldexp(1.0, b - 127))


def e2m1_rne(v, mode: str = "rne") -> np.ndarray:
    """Round to the E2M1 grid {0, .5, 1, 1.5, 2, 3, 4, 6} (ties to even mantissa), saturating at 6."""
    a = np.abs(np.asarray(v, np.float64))
    rnd = np.rint if mode == "rne" else (lambda t: np.floor(t + 0.5))
    r = np.where(a < 2, rnd(a * 2) / 2, np.where(a < 4, rnd(a), rnd(a / 2) * 2))
    r = np.minimum(r, 6.0)
    return np.copysign(r, v)
