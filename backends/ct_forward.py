"""compressed-tensors' runtime activation quantizer (its forward module) as a qconform backend.

Covers the quantize-only schemes (docs/conformance.md#quantize-only-cases) through the library's own
calls, as ``forward_quantize`` runs them for dynamic ``input_activations``
(neuralmagic/compressed-tensors ``src/compressed_tensors/quantization/lifecycle/forward.py``;
``compute_dynamic_scales_and_zp`` and ``calculate_qparams`` in ``quantization/utils/helpers.py``):

- ``q-int8-token``: ``QuantizationArgs(num_bits=8, type=int, strategy=token, dynamic=True,
  symmetric=case.sym)``; x is passed as [1, M, K] (the token strategy keeps dims 0 and 1);
  ``quantize(..., dtype=torch.int8)`` gives the codes and ``dequantize`` the dequantized values;
- ``q-mxfp4``: the library's ``MXFP4`` preset's ``input_activations`` (float 4-bit, group 32,
  uint8 E8M0 scales); ``quantize`` returns E2M1 values as floats, mapped to their codes here
  (a value off the E2M1 grid is an error, never rounded), the float scales to their E8M0 bytes.

Everything runs in the input's dtype, as the library does. Its choices that differ from the canonical
definitions (the symmetric divisor 127.5, the zero-inclusive range, bf16/fp16 arithmetic, the eps that
replaces a zero scale, the rounding of the MX scale) are declared where the variant vocabulary names
them and otherwise show up as failures naming the first differing element (docs/backends/compressed-tensors.md).
"""

from __future__ import annotations

import functools

import numpy as np

from .base import Availability, BackendError, Case, Declared, Support, no, quiet_library_import, yes
from .quantize_base import QuantizeOnlyBackend, e2m1_codes_from_values, e8m0_bytes_from_scales

__all__ = ["CompressedTensorsBackend"]


@functools.lru_cache(maxsize=1)
def _state():
    with quiet_library_import():  # compressed-tensors imports torchao, with its import-time warnings
        return _import()


def _import():
    try:
        import compressed_tensors
        import torch
        from compressed_tensors.quantization import QuantizationArgs
        from compressed_tensors.quantization.lifecycle import forward
        from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES
    except Exception as e:  # noqa: BLE001
        return None, f"compressed-tensors not importable: {type(e).__name__}: {e}"
    return (torch, compressed_tensors.__version__, QuantizationArgs, forward, PRESET_SCHEMES), ""


def _torch_dtype(torch, name: str):
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


class CompressedTensorsBackend(QuantizeOnlyBackend):
    name = "compressed-tensors"
    covers = "compressed_tensors.quantization.lifecycle.forward quantize/dequantize (dynamic int8 per-token, MXFP4)"
    priority = 10
    SCHEMES = {"q-int8-token": "dynamic token-strategy int8 input_activations",
               "q-mxfp4": "the MXFP4 preset's input_activations"}

    def __init__(self, **params: str):
        super().__init__(**params)
        if params:
            raise ValueError(f"compressed-tensors: unknown parameter(s) {', '.join(sorted(params))}; it takes none")

    def availability(self) -> Availability:
        st, why = _state()
        if st is None:
            return Availability(False, why)
        return Availability(True, "compressed-tensors forward quantize/dequantize on CPU", st[1], "cpu")

    def _can(self, case: Case) -> Support:
        if case.scheme == "q-mxfp4" and "MXFP4" not in _state()[0][4]:
            return no(f"compressed-tensors {_state()[0][1]} has no MXFP4 preset")
        return yes()

    def declared(self, case: Case) -> Declared:
        v = {}
        if case.scheme == "q-int8-token":
            # calculate_qparams: the range always includes 0, the symmetric scale is amax / (255 / 2), every
            # torch op runs in the input's dtype, a zero scale becomes finfo(dtype).eps, and the asymmetric
            # zero point is clamped to [-128, 127] before it is rounded
            v.update(act_range="zero_inclusive", act_arith_dtype="input", zero_row="dtype_eps")
            if case.sym:
                v["act_sym_divisor"] = "half_range"
            else:  # forward_helpers._quantize: scaled = x / scale; scaled += zero_point; then round
                v.update(azp_clamp=True, azp_before_rounding=True)
        if case.scheme == "q-mxfp4":
            # calculate_qparams -> generate_mx_scales: amax rounded to E2M1's mantissa width, then floor(log2):
            # the EVEN rule; a -0 element comes back as +0 (torch's E2M1 rounding in quantize); an amax that EVEN
            # rounds past 2**127 becomes the scale 2**128 = +Inf, byte 0xFF (a NaN block); x / scale is a torch op in
            # x's dtype, so a quotient that underflows there is -0, then +0 (mx_quotient_dtype=input)
            v.update(mx_scale_rule="even", e2m1_zero_sign="positive", mx_scale_overflow="nan",
                     mx_quotient_dtype="input")
        return Declared(variants=v, output=case.output_dtype, notes=f"compressed-tensors {_state()[0][1]} forward")

    def _args(self, case: Case):
        torch, _v, QuantizationArgs, _f, presets = _state()[0]
        if case.scheme == "q-mxfp4":
            return presets["MXFP4"]["input_activations"]
        return QuantizationArgs(num_bits=8, type="int", strategy="token", dynamic=True, symmetric=case.sym)

    def _quantize(self, case: Case, x: np.ndarray) -> dict:
        torch, _v, _qa, forward, _p = _state()[0]
        dt = _torch_dtype(torch, case.act_dtype)
        args = self._args(case)
        if case.scheme == "q-int8-token":
            xt = torch.from_numpy(np.ascontiguousarray(x)).to(dt)[None]  # [1, M, K]: tokens on dim 1
            scale, zp = forward.compute_dynamic_scales_and_zp(value=xt, args=args, module=None)
            codes = forward.quantize(xt, scale, zp, args, dtype=torch.int8)
            deq = forward.dequantize(codes, scale, zp, args, dtype=dt)
            out = {"codes": codes[0].numpy(), "scale": scale.reshape(case.M, 1).to(torch.float32).numpy(),
                   "dequantized": deq[0].to(torch.float32).numpy()}
            zpn = zp.reshape(case.M, 1).to(torch.float64).numpy()
            if not case.sym or np.any(zpn != 0):  # a symmetric zero point must be 0; otherwise the judge sees it
                if np.any(zpn != np.round(zpn)):
                    raise BackendError("compressed-tensors returned a non-integer zero point")
                out["zero_point"] = zpn.astype(np.int32)
            return out
        xt = torch.from_numpy(np.ascontiguousarray(x)).to(dt)
        scale, zp = forward.compute_dynamic_scales_and_zp(value=xt, args=args, module=None)
        q = forward.quantize(xt, scale, zp, args)
        deq = forward.dequantize(q, scale, zp, args, dtype=dt)
        sb = e8m0_bytes_from_scales(scale.to(torch.float32).numpy()).reshape(case.M, case.K // 32)
        qv = q.to(torch.float32).numpy().reshape(case.M, case.K)
        # a NaN-scale block's elements are unspecified (OCP MX §5.3; the judge does not compare them): code 0
        qv = np.where(np.repeat(sb == 0xFF, 32, axis=1), np.float32(0), qv)
        return {"codes": e2m1_codes_from_values(qv),
                "scale": sb,
                "dequantized": deq.to(torch.float32).numpy().reshape(case.M, case.K)}
