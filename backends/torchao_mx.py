"""torchao's MX quantizer (``torchao.prototype.mx_formats``: ``to_mx`` / ``to_dtype``) as a qconform backend.

Covers: the quantize-only scheme ``q-mxfp4`` (docs/conformance.md#quantize-only-cases), MXFP4 elements
(``torch.float4_e2m1fn_x2``) in blocks of 32 with E8M0 scales, under each torchao
``ScaleCalculationMode`` (backend parameter ``scale_mode=floor|rceil|even|ceil``, default floor), plus its
dequantization ``to_dtype`` back to the input dtype. Source: pytorch/ao
``torchao/prototype/mx_formats/mx_tensor.py`` (``to_mx``, ``_to_mx_rceil``, ``to_dtype``) and
``torchao/prototype/mx_formats/config.py`` (``ScaleCalculationMode``). Inputs bf16 or fp32 only
(``to_mx`` asserts it). Results: docs/backends/torchao.md.

Declared with the variant vocabulary (emulator/variants.py): ``mx_scale_rule`` = the scale mode (torchao's
FLOOR is OCP's rule, the canonical one; EVEN, RCEIL and CEIL are the named rounding-level variants).
The codes come back packed two per byte; torchao's own ``unpack_uint4`` unpacks them.
"""

from __future__ import annotations

import functools

import numpy as np

from .base import Availability, Case, Declared, Support, no, quiet_library_import, yes
from .quantize_base import QuantizeOnlyBackend

__all__ = ["TorchaoMxBackend", "SCALE_MODES"]

#: backend parameter scale_mode -> the emulator's mx_scale_rule (the same names; rceil is declared as rceil_log2f)
SCALE_MODES = {"floor": "floor", "rceil": "rceil", "even": "even", "ceil": "ceil"}


@functools.lru_cache(maxsize=1)
def _state():
    with quiet_library_import():  # torchao's per-extension and torch's pytree warnings, once per command
        return _import()


def _import():
    try:
        import torch
        import torchao
        from torchao.prototype.mx_formats import mx_tensor
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.kernels import unpack_uint4
    except Exception as e:  # noqa: BLE001 - any import failure makes the backend unavailable, with the reason
        return None, f"torchao MX formats not importable: {type(e).__name__}: {e}"
    return (torch, torchao.__version__, mx_tensor, ScaleCalculationMode, unpack_uint4), ""


class TorchaoMxBackend(QuantizeOnlyBackend):
    name = "torchao"
    covers = "torchao.prototype.mx_formats to_mx / to_dtype (MXFP4 activations, each ScaleCalculationMode)"
    priority = 10
    SCHEMES = {"q-mxfp4": "to_mx(x, torch.float4_e2m1fn_x2, 32, scaling_mode)"}

    def __init__(self, **params: str):
        super().__init__(**params)
        unknown = sorted(set(params) - {"scale_mode"})
        if unknown:
            raise ValueError(f"torchao: unknown parameter(s) {', '.join(unknown)}; known: scale_mode")
        self.scale_mode = params.get("scale_mode", "floor").lower()
        if self.scale_mode not in SCALE_MODES:
            raise ValueError(f"torchao: scale_mode must be one of {', '.join(SCALE_MODES)}, got {self.scale_mode!r}")

    def availability(self) -> Availability:
        st, why = _state()
        if st is None:
            return Availability(False, why)
        return Availability(True, "torchao MX to_mx on CPU (eager)", st[1], "cpu")

    def _can(self, case: Case) -> Support:
        if case.act_dtype not in ("bfloat16", "float32"):
            return no(f"torchao to_mx takes bfloat16 or float32 input only, not {case.act_dtype}")
        return yes()

    def declared(self, case: Case) -> Declared:
        v = {"mx_scale_rule": SCALE_MODES[self.scale_mode]}
        if self.scale_mode == "rceil":
            # _to_mx_rceil's eager fallback: ceil of an fp32 torch.log2; exponent 0 divides by 1.0
            v.update(mx_scale_rule="rceil_log2f", mx_byte0_divisor="one")
        else:
            # a block whose byte is 0 (2**-127) is divided by the fp32 scale clamped to 2**-126
            v["mx_byte0_divisor"] = "min_normal"
        return Declared(variants=v, output=case.output_dtype,
                        notes=f"torchao {_state()[0][1] if _state()[0] else '?'} to_mx scaling_mode={self.scale_mode}")

    def _quantize(self, case: Case, x: np.ndarray) -> dict:
        torch, _v, mx_tensor, mode_enum, unpack_uint4 = _state()[0]
        dt = torch.bfloat16 if case.act_dtype == "bfloat16" else torch.float32
        xt = torch.from_numpy(np.ascontiguousarray(x)).to(dt)  # exact: x holds act_dtype values
        mode = mode_enum(self.scale_mode)
        scale, packed = mx_tensor.to_mx(xt, torch.float4_e2m1fn_x2, 32, scaling_mode=mode)
        deq = mx_tensor.to_dtype(packed, scale, torch.float4_e2m1fn_x2, 32, dt)
        codes = unpack_uint4(packed.view(torch.uint8)).reshape(case.M, case.K)
        return {"codes": codes.numpy().astype(np.uint8, copy=False),
                "scale": scale.view(torch.uint8).reshape(case.M, case.K // 32).numpy(),
                "dequantized": deq.to(torch.float32).numpy()}
