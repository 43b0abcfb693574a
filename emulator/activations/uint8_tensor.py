"""Dynamic per-tensor uint8 activation quantization: ONNX ``DynamicQuantizeLinear``.

Semantics: docs/formats/activations.md#uint8-per-tensor (and docs/conformance.md#quantize-only-cases,
scheme ``q-uint8-tensor``). Source: the ONNX operator specification of DynamicQuantizeLinear (opset 11)
and its executable reference, ``onnx/reference/ops/op_dynamic_quantize_linear.py``, every step an IEEE
fp32 operation::

    rmax  = max(0, max x),  rmin = min(0, min x)        (the range always includes 0)
    scale = fl32(fl32(rmax - rmin) / 255)                (fl32(1 / 255) when rmax == rmin: the spec is
                                                          silent there; the reference fills in 1/255)
    zp    = RNE(clamp(fl32(0 - fl32(rmin / scale)), 0, 255))   (clamp = max(0, min(255, v)): NaN -> 255)
    q     = clamp(RNE(fl32(x / scale)) + zp, 0, 255)     (stored as uint8; the zero point too; NaN -> 0)

A range whose scale underflows to 0 (|rmax - rmin| < 255 * 2**-150) gives NaN or +-Inf quotients; the
reference's Python clamp and uint8 conversion make zp = 255 and the codes 255 (x > 0), 0 (x <= 0).

The scheme is defined by ONNX as a whole, so it is its own function here rather than a variant of the
per-token int8 quantizer (emulator/activations/int8.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import FormatError

__all__ = ["Uint8Activations", "quantize_uint8_per_tensor", "dequantize_uint8_per_tensor"]


@dataclasses.dataclass
class Uint8Activations:
    """Codes uint8 [M, K], the scale as float32 [1] and the zero point as uint8 [1]."""

    q: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray


def quantize_uint8_per_tensor(x) -> Uint8Activations:
    """ONNX DynamicQuantizeLinear of x (float32 values; NaN is undefined and raises)."""
    x32 = np.asarray(x)
    if x32.dtype != np.float32:
        x64 = np.asarray(x, np.float64)
        x32 = x64.astype(np.float32)
        if not np.array_equal(x32.astype(np.float64), x64, equal_nan=True):
            raise FormatError("activations must be exactly representable in float32", tensor="x")
    if np.isnan(x32).any():
        raise FormatError("NaN in activations: DynamicQuantizeLinear is undefined for NaN input", tensor="x")
    f = np.float32
    with np.errstate(all="ignore"):
        rmax = f(max(f(0), x32.max(initial=f(0))))
        rmin = f(min(f(0), x32.min(initial=f(0))))
        span = f(1.0) if rmax == rmin else f(rmax - rmin)
        scale = f(span / f(255))
        zp_real = f(f(0) - f(rmin / scale))
        # the reference's own clamp order, max(qmin, min(qmax, v)): a scale that underflowed to 0 makes v NaN
        # (0 / 0) or +Inf, and Python's min(255, NaN) is 255 (NaN < 255 is false), so zp = 255
        zp = f(np.rint(max(f(0), min(f(255), zp_real))))
        q = np.clip(np.rint((x32 / scale).astype(f)) + zp, 0, 255)
        q = np.where(np.isnan(q), 0, q)  # 0 / 0: NaN clipped stays NaN; its uint8 conversion gives 0 (x86, Arm)
    return Uint8Activations(q=q.astype(np.uint8), scale=np.array([scale], f), zero_point=np.array([zp], np.uint8))


def dequantize_uint8_per_tensor(acts: Uint8Activations) -> np.ndarray:
    """x_hat = (q - zp) * scale, exact in float64 [M, K]."""
    return (acts.q.astype(np.float64) - float(acts.zero_point[0])) * float(acts.scale[0])
