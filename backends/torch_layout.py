"""Torch-side checkpoint layout helpers the adapters share (one definition each).

The adapters (torch_cpu, zentorch, ark/ark_layout, vllm_cpu, cuda, xpu) rebuild the operands
their kernels take from the canonical checkpoint tensors, in torch, as the engines they mirror
do. What every one of them needs lives here: the AWQ nibble order, int32 word <-> field
(un)packing, the activation dtype name -> torch dtype map and numpy -> torch conversion.

These are transcribed from the checkpoint formats' public producers (AutoAWQ
``awq/utils/packing_utils.py``, GPTQ / compressed-tensors ``pack_to_int32``), NOT imported
from the emulator: the emulator is the oracle the adapters are compared with, so a wrong
constant there must not silently become the adapters' constant too (docs/formats/awq.md,
docs/formats/gptq.md describe the layouts).

torch is imported on first use, so importing this module never needs torch.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "AWQ_PACK_ORDER",
    "AWQ_REVERSE_ORDER",
    "TORCH_DTYPE_NAMES",
    "import_torch",
    "torch_dtype",
    "to_torch",
    "unpack_fields",
    "pack_fields",
]

#: AutoAWQ's pack order: slot s of each int32 word holds column 8j + AWQ_PACK_ORDER[s]
AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
#: its inverse (AutoAWQ / vLLM ``AWQ_REVERSE_ORDER``): column c of a word sits in slot AWQ_REVERSE_ORDER[c]
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)
#: the activation / output dtype names a Case uses, all of which torch spells the same way
TORCH_DTYPE_NAMES = ("float32", "float16", "bfloat16")


def import_torch():
    import torch  # noqa: PLC0415 - torch is optional: imported where a kernel needs it

    return torch


def torch_dtype(name: str):
    """``float32`` | ``float16`` | ``bfloat16`` -> the torch dtype (KeyError naming the dtype otherwise)."""
    if name not in TORCH_DTYPE_NAMES:
        raise KeyError(f"no torch dtype for {name!r}; known: {', '.join(TORCH_DTYPE_NAMES)}")
    return getattr(import_torch(), name)


def to_torch(a, dtype=None):
    """numpy (or torch) -> a CPU torch tensor owning a copy (checkpoint arrays may be read-only
    views); ``dtype``: the numpy dtype to convert to first. ml_dtypes bfloat16 arrays are
    reinterpreted through int16 (torch cannot read numpy's bfloat16)."""
    torch = import_torch()
    if isinstance(a, torch.Tensor):
        return a.clone()
    arr = np.ascontiguousarray(np.asarray(a, dtype=dtype))
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(arr.copy())


def unpack_fields(words, bits: int, dim: int, order=None):
    """int32 words -> unsigned ``bits``-wide fields along ``dim``, int32, contiguous.

    Field i of a word sits in bits ``[bits*i, bits*(i+1))`` (LSB first); with ``order``, element
    c of each word is read from slot ``order[c]`` (AWQ: ``AWQ_REVERSE_ORDER``). ``words`` is a
    torch tensor or anything numpy reads as int32 words.
    """
    torch = import_torch()
    if not isinstance(words, torch.Tensor):
        words = torch.from_numpy(np.ascontiguousarray(words, dtype=np.int32))
    f = 32 // bits
    w = words.to(torch.int32)
    dim = dim % w.dim()
    shifts = torch.arange(f, dtype=torch.int32) * bits
    if order is not None:  # element c of each word lives in slot order[c]
        shifts = torch.tensor([order[c] * bits for c in range(f)], dtype=torch.int32)
    # the fields axis right after ``dim`` ([..., words, F, ...]), so merging the two is a plain reshape
    # of a contiguous result (no transposed copies). int32 shifts are arithmetic: the top field's
    # sign-extended bits are removed by the mask
    shifts = shifts.reshape((f,) + (1,) * (w.dim() - dim - 1))
    fields = (w.unsqueeze(dim + 1) >> shifts) & ((1 << bits) - 1)
    shape = list(w.shape)
    shape[dim] *= f
    return fields.reshape(shape).contiguous()


def pack_fields(values, bits: int, dim: int):
    """The inverse of ``unpack_fields`` without an order: ``bits``-wide values (taken modulo
    ``2**bits``, so two's-complement codes pack as their low bits) packed LSB first along
    ``dim`` into int32 words (wrapping to int32), contiguous."""
    torch = import_torch()
    f = 32 // bits
    moved = values.to(torch.int64).movedim(dim, -1)
    v = moved.reshape(*moved.shape[:-1], moved.shape[-1] // f, f) & ((1 << bits) - 1)
    words = (v << (torch.arange(f, dtype=torch.int64) * bits)).sum(dim=-1)
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words)
    return words.to(torch.int32).movedim(-1, dim).contiguous()
