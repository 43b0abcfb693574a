"""Packing b-bit unsigned fields into int32 words, LSB first, and back.

Semantics: docs/formats/gptq.md#packing (AWQ's slot order: docs/formats/awq.md).

Layout. Along the packed axis, consecutive runs of ``F = 32 // bits``
elements form one word. Without a slot order, element ``F*j + i`` of the axis
is field ``i`` of word ``j``, i.e. bits ``[bits*i, bits*(i+1))`` counted from
the least significant bit (the layout of AutoGPTQ's ``pack``, vLLM's
``pack_quantized_values_into_int32`` and compressed-tensors'
``pack_to_int32``). With a slot order ``order`` (a permutation of
``range(F)``), slot ``s`` of word ``j`` holds element ``F*j + order[s]``
(AutoAWQ's ``order_map``).

Worked example, 4-bit, no order: elements ``[1, 2, 3, 4, 5, 6, 7, 8]`` give
the word ``0x87654321``; with AWQ's order ``(0, 2, 4, 6, 1, 3, 5, 7)``,
elements ``[0, 1, 2, 3, 4, 5, 6, 7]`` give ``0x75316420``.

Words are stored as int32 (the checkpoints' dtype): the word's 32 bits
reinterpreted as two's complement, so a top field >= 2**(bits-1) makes the
int32 negative. Packing is pure integer bit manipulation.

These are the plain, readable primitives the ``*_reference`` dequantizers use. The fast,
blocked unpacking the public ``dequantize_*`` functions use lives in ``fast_unpack.py``
and returns the same fields.
"""

from __future__ import annotations

import numpy as np

from ..errors import FormatError, require
from .int_common import check_integer_range, shape_str

__all__ = ["SUPPORTED_BITS", "fields_per_word", "check_order", "inverse_order", "pack_int32", "unpack_int32"]

SUPPORTED_BITS = (2, 4, 8)


def fields_per_word(bits: int) -> int:
    """How many ``bits``-wide fields one 32-bit word holds."""
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits}")
    return 32 // bits


def check_order(order, per_word: int) -> tuple:
    """The slot order as a tuple (``range(per_word)`` for None); ValueError unless a permutation."""
    if order is None:
        return tuple(range(per_word))
    order = tuple(int(o) for o in order)
    if sorted(order) != list(range(per_word)):
        raise ValueError(f"order must be a permutation of range({per_word}), got {order}")
    return order


def inverse_order(order) -> tuple:
    """The slot of each element: ``inverse_order(order)[order[s]] == s``."""
    order = tuple(int(o) for o in order)
    inv = [0] * len(order)
    for slot, element in enumerate(order):
        inv[element] = slot
    return tuple(inv)


def pack_int32(values, bits: int, axis: int = 0, *, order=None, tensor: str = "values", layer: str | None = None) -> np.ndarray:
    """Pack unsigned ``bits``-wide integers along ``axis`` into int32 words.

    ``values`` is any integer array with every element in [0, 2**bits - 1]
    (else FormatError naming ``tensor``); the length of ``axis`` must be a
    multiple of ``32 // bits``. The result has that axis divided by
    ``32 // bits`` and dtype int32.
    """
    per_word = fields_per_word(bits)
    order = check_order(order, per_word)
    v = np.asarray(values)
    require(v.ndim >= 1, "expected at least a 1-D array", layer=layer, tensor=tensor)
    check_integer_range(v, 0, (1 << bits) - 1, f"{bits}-bit value", tensor=tensor, layer=layer)
    axis = axis % v.ndim
    length = v.shape[axis]
    require(
        length % per_word == 0,
        f"length {length} of axis {axis} (shape {shape_str(v.shape)}) is not a multiple of "
        f"{per_word}, the number of {bits}-bit fields per int32 word",
        layer=layer,
        tensor=tensor,
    )
    moved = np.moveaxis(v.astype(np.uint32), axis, -1)
    groups = moved.reshape(moved.shape[:-1] + (length // per_word, per_word))
    words = np.zeros(groups.shape[:-1], dtype=np.uint32)
    for slot, element in enumerate(order):
        words |= groups[..., element] << np.uint32(bits * slot)
    return np.moveaxis(words.view(np.int32), -1, axis)


def unpack_int32(packed, bits: int, axis: int = 0, *, order=None, tensor: str = "packed", layer: str | None = None) -> np.ndarray:
    """Inverse of ``pack_int32`` with the same ``bits``, ``axis`` and ``order``.

    ``packed`` must be int32 (FormatError otherwise). Returns uint8 fields with
    ``axis`` multiplied by ``32 // bits``: element ``F*j + e`` of the axis is
    ``(word_j >> (bits * slot_e)) & (2**bits - 1)``, ``slot_e`` the slot holding
    element ``e`` (``inverse_order(order)[e]``; ``e`` itself without an order).
    """
    per_word = fields_per_word(bits)
    order = check_order(order, per_word)
    p = np.asarray(packed)
    if p.dtype != np.int32:
        raise FormatError(f"expected dtype int32, got {p.dtype.name}", layer=layer, tensor=tensor)
    require(p.ndim >= 1, "expected at least a 1-D array", layer=layer, tensor=tensor)
    axis = axis % p.ndim
    words = np.moveaxis(p, axis, -1).view(np.uint32)[..., None]  # [..., W, 1]
    shifts = np.uint32(bits) * np.array(inverse_order(order), dtype=np.uint32)  # [F]: the slot of element e
    fields = ((words >> shifts) & np.uint32((1 << bits) - 1)).astype(np.uint8)  # [..., W, F]
    return np.moveaxis(fields.reshape(fields.shape[:-2] + (-1,)), -1, axis)
