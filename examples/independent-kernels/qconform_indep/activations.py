"""Dynamic activation quantizers written from docs/formats/activations.md and docs/formats/mxfp4.md.

int8 per token (vLLM ``dynamic_scaled_int8_quant`` / ``..._azp_quant`` semantics): every step an fp32
operation. MXFP4 (OCP MX v1.0 §6.3): FLOOR scale, RNE E2M1 elements. ``bug`` plants a defect.
"""

from __future__ import annotations

import numpy as np

from .numerics import e2m1_rne

f32 = np.float32


def _round(v, bug):
    if bug == "act_rhaz":
        return np.sign(v) * np.floor(np.abs(v) + 0.5)  # std::round: ties away from zero
    return np.rint(v)


def int8_per_token(x: np.ndarray, symmetric: bool, bug: str | None):
    """x float32 [M, K] -> (q int64 [M, K], scale float32 [M], azp int64 [M])."""
    x = np.asarray(x, f32)
    M = x.shape[0]
    with np.errstate(all="ignore"):
        if symmetric:
            amax = np.max(np.abs(x), axis=1).astype(f32)
            if bug == "act_scale_recip_mul":
                scale = (amax * f32(f32(1) / f32(127))).astype(f32)
            else:
                scale = (amax / f32(127)).astype(f32)
            if bug == "act_zero_row_nan":
                quo = (x / scale[:, None]).astype(f32)
            else:
                safe = np.where(scale == 0, f32(1), scale)
                quo = np.where(scale[:, None] == 0, f32(0), (x / safe[:, None]).astype(f32))
            r = _round(quo, bug)
            if bug != "act_no_saturation":
                r = np.clip(r, -128, 127)
            q = np.nan_to_num(r, nan=0).astype(np.int64)
            if bug == "act_no_saturation":
                q = ((q + 128) % 256) - 128  # int8 store wraps
            return q, scale, np.zeros(M, np.int64)
        mn = np.min(x, axis=1).astype(f32)
        mx = np.max(x, axis=1).astype(f32)
        if bug == "asym_zero_inclusive":
            mn, mx = np.minimum(mn, f32(0)), np.maximum(mx, f32(0))
        scale = ((mx - mn).astype(f32) / f32(255)).astype(f32)
        safe = np.where(scale == 0, f32(1), scale)
        if bug == "asym_zp_uint8_domain":
            azp = np.rint(-(mn / safe).astype(f32)).astype(np.int64) - 128
        else:
            azp = np.rint((f32(-128) - (mn / safe).astype(f32)).astype(f32)).astype(np.int64)
        azp = np.where(scale == 0, 0, azp)
        quo = np.where(scale[:, None] == 0, f32(0), (x / safe[:, None]).astype(f32))
        r = _round(quo, bug) + azp[:, None]
        if bug == "act_no_saturation":
            q = ((r.astype(np.int64) + 128) % 256) - 128
        else:
            q = np.clip(r, -128, 127).astype(np.int64)
        return q, scale, azp


def mx_quantize(x: np.ndarray, bug: str | None):
    """x float32 [M, K] (K % 32 == 0) -> (element values [M, K] float64, block scales [M, K/32] float64; NaN = 0xFF)."""
    x = np.asarray(x, np.float64)
    M, K = x.shape
    xb = x.reshape(M, K // 32, 32)
    with np.errstate(all="ignore"):
        if bug == "mx_nan_skipped":
            amax = np.nanmax(np.where(np.isnan(xb), -np.inf, np.abs(xb)), axis=2)
            amax = np.where(np.isneginf(amax), 0.0, amax)
            xb = np.where(np.isnan(xb), 0.0, xb)
        else:
            amax = np.max(np.abs(xb), axis=2)
        amax32 = amax.astype(f32)
        if bug == "mx_log2_float":
            e = np.floor(np.log2(amax32)).astype(np.float64)  # fp32 log2 rounds up just below 2**k
        elif bug == "mx_scale_ceil":
            e = np.ceil(np.log2(amax / 6.0)) + 2
        else:
            _, ex = np.frexp(amax)
            e = (ex - 1).astype(np.float64)
        s = np.clip(e - 2, -127, 127)
        s = np.where(amax == 0, -127, s)
        bad = ~np.isfinite(amax)
        scale = np.where(bad, np.nan, np.ldexp(1.0, np.where(bad, 0, s).astype(np.int64)))
        quo = xb / np.where(bad, 1.0, scale)[..., None]
        if bug == "mx_no_saturation":
            p = np.where(np.abs(quo) > 6, 0.0, e2m1_rne(quo))  # lookup table misses past the top code
        else:
            p = e2m1_rne(quo, "rhaz" if bug == "mx_elem_rhaz" else "rne")
        p = np.where(bad[..., None], 0.0, p)
    return p.reshape(M, K), scale
