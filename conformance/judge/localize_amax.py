"""Failure localization, activation quantization: the amax rounded before the scale is computed from it.

Semantics: docs/conformance.md#failure-localization (step 4). A kernel that holds the row's (int8) or the
block's (MXFP4) absolute maximum in a narrower dtype than the activations, or rounds it to a power of two,
computes its scale from the rounded amax:

- MXFP4: the block exponent floor(log2 amax) - 2 is taken of RNE_T(amax), T = bfloat16 or float16: an amax
  within half a unit of T below 2^k rounds up to 2^k, so the block scale is one E8M0 step high there (and
  only there); likewise an amax rounded up to the next power of two (the scale exponent ceil(log2 amax) - 2);
- int8 (symmetric and asymmetric per token): the scale amax / 127 (or (max - min) / 255) of the rounded
  amax (max, min), the codes rint(x / s) clamped.

``amax_hypotheses(case, declared, X)`` returns (name, part, dequantized activations) for rows X (float32),
as ``conformance.judge.localize_acts._custom`` does; ``analyze_own_rows`` judges them alike (every output of
every row within one unit in the last place, and the failing rows changed). Hook (for the lead):
``out += amax_hypotheses(case, declared, x)`` at the end of ``localize_acts._custom``.
"""

from __future__ import annotations

import numpy as np

from emulator.declaration import int8_variant
from emulator.numerics.floats import round_to_dtype

from backends.base import Case, Declared

__all__ = ["amax_hypotheses", "mx_quantize_with_exponent"]

_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])


def mx_quantize_with_exponent(xb: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Blocks xb [..., 32] (float64) quantized to E2M1 (RNE, saturating at 6) with block scale 2^(e - 2);
    dequantized values."""
    sc = np.ldexp(1.0, np.clip(e - 2, -127, 127).astype(np.int64))
    m = np.minimum(np.abs(xb) / sc, 6.0)
    d = np.abs(m[..., None] - _E2M1)
    best = np.argmin(d + 1e-12 * (np.arange(8) % 2), axis=-1)  # ties to the even code
    return np.sign(xb) * _E2M1[best] * sc


def _blocks(amax: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The quantized blocks where the amax is finite and non-zero; zero blocks 0, NaN/Inf blocks NaN (their
    scale is NaN: docs/formats/mxfp4.md)."""
    return np.where(amax == 0, 0.0, np.where(np.isfinite(amax), v, np.nan))


def _floor_log2(a: np.ndarray) -> np.ndarray:
    _, e = np.frexp(a)
    return (e - 1).astype(np.float64)


def amax_hypotheses(case: Case, declared: Declared, X: np.ndarray) -> list:
    """(name, part, dequantized activations [rows, K]) for the amax rounded before the scale, on float32 rows X."""
    x = np.asarray(X, np.float32)
    out = []
    with np.errstate(all="ignore"):
        if case.spec.activations == "mxfp4":
            xb = x.astype(np.float64).reshape(len(x), -1, 32)
            amax = np.max(np.abs(xb), axis=2, keepdims=True)
            live = (amax > 0) & np.isfinite(amax)
            safe = np.where(live, amax, 1.0)
            for T in ("bfloat16", "float16"):
                if T == case.act_dtype:
                    continue
                r = np.asarray(round_to_dtype(safe, T), np.float64)
                e = np.where(np.isfinite(r), _floor_log2(np.where(np.isfinite(r), r, 1.0)), _floor_log2(safe) + 1)
                v = _blocks(amax, mx_quantize_with_exponent(xb, e))
                out.append((f"activation block amax rounded to {T} before the scale exponent: an amax just below "
                            "2^k rounds up to 2^k (amax rounded up to the next power of two), the block scale one "
                            "E8M0 step high there", "scale", v.reshape(x.shape)))
            fl = _floor_log2(safe)
            up = np.where(np.ldexp(1.0, fl.astype(np.int64)) == safe, fl, fl + 1)
            v = _blocks(amax, mx_quantize_with_exponent(xb, up))
            out.append(("activation block amax rounded up to the next power of two before the scale exponent "
                        "(exponent ceil(log2 amax) - 2)", "scale", v.reshape(x.shape)))
        elif case.spec.activations == "int8":
            v8 = int8_variant(declared, case)
            f32 = np.float32
            for T in ("bfloat16", "float16"):
                if T == case.act_dtype:
                    continue

                def rnd(a, T=T):
                    return np.asarray(round_to_dtype(a.astype(np.float64), T), np.float64).astype(f32)
                if v8.symmetric:
                    amax = rnd(np.max(np.abs(x), axis=1, keepdims=True))
                    s = (amax / f32(127)).astype(f32)
                    safe = np.where(s > 0, s, f32(1))
                    q = np.clip(np.rint((x / safe).astype(f32).astype(np.float64)), -128, 127)
                    deq = np.where(s > 0, q * s.astype(np.float64), 0.0)
                else:
                    lo = rnd(np.min(x, axis=1, keepdims=True))
                    hi = rnd(np.max(x, axis=1, keepdims=True))
                    s = ((hi - lo).astype(f32) / f32(255)).astype(f32)
                    safe = np.where(s > 0, s, f32(1))
                    azp = np.rint((f32(-128) - (lo / safe).astype(f32)).astype(np.float64))
                    q = np.clip(np.rint((x / safe).astype(f32).astype(np.float64)) + azp, -128, 127)
                    deq = np.where(s > 0, (q - azp) * s.astype(np.float64), 0.0)
                what = "amax" if v8.symmetric else "max and min"
                out.append((f"activation {what} rounded to {T} before the scale is computed from it", "scale", deq))
    return out
