"""The reference of a quantize-only case: activations in, codes + scales (+ zero points) + their
dequantized values out, under a declaration's named variants.

Semantics: docs/conformance.md#quantize-only-cases. The schemes (emulator/schemes.py): ``q-int8-token``
(emulator/activations/int8.py, symmetric or asymmetric by ``Case.sym``), ``q-uint8-tensor``
(emulator/activations/uint8_tensor.py, ONNX DynamicQuantizeLinear) and ``q-mxfp4``
(emulator/formats/mxfp4.py, OCP MX). Every output has one fixed dtype and shape (``output_contract``), so a
backend returning a wrong dtype, a wrong shape or a missing tensor fails rather than being converted.
"""

from __future__ import annotations

import numpy as np

from .activations import int8 as a8
from .activations import uint8_tensor as u8
from .declaration import Declared, int8_variant, mx_variant
from .formats import mxfp4
from .numerics.floats import round_to_dtype
from .schemes import Case

__all__ = ["OUTPUT_NAMES", "output_contract", "quantize_reference"]

#: the tensors a quantize-only backend returns, in this order
OUTPUT_NAMES = ("codes", "scale", "zero_point", "dequantized")


def output_contract(case: Case, declared: Declared) -> dict[str, tuple[str, tuple]]:
    """name -> (dtype, shape) of every tensor the case must return (docs/conformance.md#quantize-only-cases).

    ``codes``: int8 [M, K] (uint8 under ``uint8_zp128=true``; uint8 for q-uint8-tensor; E2M1 codes 0..15
    one per uint8 for q-mxfp4); ``scale``: float32 [M, 1] (q-int8-token), float32 [1] (q-uint8-tensor),
    E8M0 bytes uint8 [M, K/32] (q-mxfp4); ``zero_point``: int32 [M, 1] (asymmetric q-int8-token), uint8 [1]
    (q-uint8-tensor), none otherwise; ``dequantized``: float32 [M, K] holding values of the input dtype.
    """
    M, K = case.M, case.K
    if case.scheme == "q-int8-token":
        v = int8_variant(declared, case)
        out = {"codes": ("uint8" if v.uint8_zp128 else "int8", (M, K)), "scale": ("float32", (M, 1))}
        if not v.symmetric or v.scheme is a8.Int8Scheme.KAI_QA8DX:
            out["zero_point"] = ("int32", (M, 1))
    elif case.scheme == "q-uint8-tensor":
        out = {"codes": ("uint8", (M, K)), "scale": ("float32", (1,)), "zero_point": ("uint8", (1,))}
    elif case.scheme == "q-mxfp4":
        out = {"codes": ("uint8", (M, K)), "scale": ("uint8", (M, K // mxfp4.BLOCK))}
    else:
        raise ValueError(f"{case.scheme!r} is not a quantize-only scheme")
    out["dequantized"] = ("float32", (M, K))
    return out


def _to_act(v64: np.ndarray, dtype: str) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return round_to_dtype(v64, dtype).astype(np.float32)


def quantize_reference(case: Case, x: np.ndarray, declared: Declared) -> dict[str, np.ndarray]:
    """The tensors of ``output_contract`` for activations ``x`` [M, K] under ``declared``'s variants.

    ``dequantized`` is the exact (q - zp) * scale rounded once (RNE) to the case's activation dtype.
    Raises FormatError where the scheme is undefined for the input (NaN into int8 or uint8).
    """
    if case.scheme == "q-int8-token":
        v = int8_variant(declared, case)
        acts = a8.quantize_int8_per_token(x, v)
        out = {"codes": acts.stored(v), "scale": acts.scale.astype(np.float32)}
        if "zero_point" in output_contract(case, declared):
            out["zero_point"] = acts.zero_point.astype(np.int32)
        with np.errstate(invalid="ignore", over="ignore"):
            out["dequantized"] = _to_act(a8.dequantize_int8_per_token(acts), case.act_dtype)
        return out
    if case.scheme == "q-uint8-tensor":
        acts = u8.quantize_uint8_per_tensor(x)
        return {"codes": acts.q, "scale": acts.scale, "zero_point": acts.zero_point,
                "dequantized": _to_act(u8.dequantize_uint8_per_tensor(acts), case.act_dtype)}
    if case.scheme == "q-mxfp4":
        codes, sb = mxfp4.quantize_mxfp4(x, mx_variant(declared, case))
        with np.errstate(over="ignore", invalid="ignore"):
            deq = mxfp4.dequantize_mxfp4(codes, sb, dtype=np.float64, what="x")
        return {"codes": codes.astype(np.uint8), "scale": sb.astype(np.uint8), "dequantized": _to_act(deq, case.act_dtype)}
    raise ValueError(f"{case.scheme!r} is not a quantize-only scheme")
