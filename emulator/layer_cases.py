"""A checkpoint layer as a ``Case`` plus canonical tensors: what a backend (or the dispatcher) takes.

Semantics: docs/checkpoints.md#layers-as-cases.

The emulator reads a layer straight from the checkpoint (emulator/layers.py). A backend takes a
``Case`` (emulator/schemes.py) and the checkpoint's tensors under their canonical names. This module
maps one to the other for the layers a Case can describe exactly, and refuses the others by name:
a layer whose semantics a Case cannot carry (GPTQModel's packed-add v1 zeros, asymmetric int8
weights, gpt-oss blocks, stacked experts) must never be handed to a kernel under a Case that
means something else.
"""

from __future__ import annotations

import numpy as np

from .checkpoint import Checkpoint, LayerInfo
from .errors import UnsupportedFormatError
from .formats import gptq
from .schemes import Case

__all__ = ["layer_case", "case_tensors"]

_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _scheme(info: LayerInfo, act: str) -> str:
    if info.format == "ct-mxfp4":
        return {"a16": "w4a16-mxfp4", "mxfp4": "w4a4-mxfp4"}.get(act) or _no(info, f"{act} activations")
    if act == "a16":
        return "w4a16" if info.bits == 4 else "w8a16"
    if act == "int8":
        return "w8a8" if info.format == "ct-int-quantized" else ("w4a8" if info.bits == 4 else _no(info, "W8A8 "
                                                                                                    "with packed int8"))
    return _no(info, f"{act} activations")


def _no(info: LayerInfo, what: str):
    raise UnsupportedFormatError(f"{info.name}: {info.format} with {what} has no Case a backend can take; "
                                 "run the emulator reference (qconform linear without --backend)")


def layer_case(info: LayerInfo, M: int, act_dtype: str, act: str) -> Case:
    """The Case of ``info`` for M tokens of ``act_dtype`` activations under activation scheme ``act``."""
    if len(info.shape) != 2:
        _no(info, f"stacked experts {list(info.shape)}")
    if info.format == "gptq" and info.zero_convention not in ("v1", "v2"):
        _no(info, f"zero convention {info.zero_convention!r} (GPTQModel's packed-add v1 zeros)")
    if info.format not in ("gptq", "awq", "ct-pack-quantized", "ct-int-quantized", "ct-mxfp4"):
        _no(info, "this layout")
    if info.format == "ct-int-quantized" and "weight_zero_point" in info.tensors:
        _no(info, "asymmetric int8 weights")
    N, K = info.shape
    scheme = _scheme(info, act)
    sym = bool(info.sym) if info.sym is not None else True
    if scheme == "w8a8":  # a W8A8 Case's sym is its activations' (its int8 weights are symmetric)
        sym = bool((info.activation or {}).get("symmetric", True))
    scale_dtype = _DTYPES.get(info.scale_dtype or "", None) if info.format != "ct-mxfp4" else None
    # compressed-tensors actorder "weight" orders calibration only, not the stored format (quant_args.py
    # ActivationOrdering): without weight_g_idx the groups are contiguous, as the reference reads them
    act_order = info.act_order and (info.format != "ct-pack-quantized" or "weight_g_idx" in info.tensors)
    return Case(scheme, info.format, M, N, K, group_size=info.group_size, sym=sym, act_order=act_order,
                zero_convention=info.zero_convention if info.format == "gptq" else None, act_dtype=act_dtype,
                bias="bias" in info.tensors, bits=info.bits, scale_dtype=scale_dtype)


def case_tensors(ckpt: Checkpoint, info: LayerInfo, case: Case) -> dict:
    """The layer's tensors by canonical name (no layer prefix), as the suite's cases hold them.

    GPTQ layers without qzeros or g_idx get the ones their config implies (the midpoint zero of a
    symmetric checkpoint, groups in order), as every GPTQ loader does.
    """
    t = {role: ckpt.tensor(name, layer=info.name).data for role, name in info.tensors.items() if role != "bias"}
    if info.format == "gptq":
        params = gptq.GptqParams(bits=case.bits, group_size=case.group_size, sym=case.sym, desc_act=case.act_order,
                                 zero_convention=case.gptq_zero_convention)
        g = case.group
        if "g_idx" not in t:
            t["g_idx"] = (np.arange(case.K) // g).astype(np.int32)
        if "qzeros" not in t:
            if not case.sym:
                raise UnsupportedFormatError(f"{info.name}: asymmetric GPTQ layer without qzeros")
            n_groups = case.K // g
            codes = gptq.GptqCodes(q=np.zeros((case.N, case.K), np.uint8),
                                   zeros=np.full((n_groups, case.N), params.sym_zero, np.int64),
                                   scales=np.ones((n_groups, case.N), np.float16), g_idx=t["g_idx"])
            t["qzeros"] = gptq.pack_gptq(codes, params).qzeros
    if info.format == "ct-pack-quantized" and "weight_shape" not in t:
        t["weight_shape"] = np.asarray([case.N, case.K], np.int64)
    return t
