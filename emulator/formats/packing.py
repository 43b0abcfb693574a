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
"""

from __future__ import annotations

import sys

import numpy as np

from ..parallel import for_row_chunks
from ..errors import FormatError, require
from .int_common import check_integer_range, shape_str

__all__ = ["SUPPORTED_BITS", "fields_per_word", "inverse_order", "pack_int32", "sequential_fields", "transposed_field_rows", "unpack_int32",
           "unpack_int32_transposed"]

SUPPORTED_BITS = (2, 4, 8)


def fields_per_word(bits: int) -> int:
    """How many ``bits``-wide fields one 32-bit word holds."""
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits}")
    return 32 // bits


def _check_order(order, per_word: int) -> tuple:
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
    order = _check_order(order, per_word)
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
    ``axis`` multiplied by ``32 // bits``.
    """
    per_word = fields_per_word(bits)
    order = _check_order(order, per_word)
    p = np.asarray(packed)
    if p.dtype != np.int32:
        raise FormatError(f"expected dtype int32, got {p.dtype.name}", layer=layer, tensor=tensor)
    require(p.ndim >= 1, "expected at least a 1-D array", layer=layer, tensor=tensor)
    axis = axis % p.ndim
    words = np.moveaxis(p, axis, -1).view(np.uint32)
    mask = np.uint32((1 << bits) - 1)
    fields = np.empty(words.shape + (per_word,), dtype=np.uint8)

    sequential = tuple(order) == tuple(range(per_word))

    def rows(r0, r1):
        fast = _fields_in_order(words[r0:r1], bits) if sequential else None
        if fast is not None:
            fields[r0:r1] = fast.reshape(fields[r0:r1].shape)
            return
        for slot, element in enumerate(order):
            fields[r0:r1, ..., element] = (words[r0:r1] >> np.uint32(bits * slot)) & mask

    if words.ndim >= 2:
        for_row_chunks(words.shape[0], fields.size, rows)
    else:
        rows(0, words.shape[0])
    out = fields.reshape(words.shape[:-1] + (words.shape[-1] * per_word,))
    return np.moveaxis(out, -1, axis)


def sequential_fields(words: np.ndarray, bits: int) -> np.ndarray:
    """The LSB-first ``bits``-wide fields of int32/uint32 words along the last axis, as uint8
    [..., n * 32 / bits] (``unpack_int32(words, bits, axis=-1)`` without its checks; for blocks)."""
    w = np.asarray(words).view(np.uint32)
    fast = _fields_in_order(w, bits)
    return fast if fast is not None else unpack_int32(w.view(np.int32), bits, axis=-1)


def _fields_in_order(w: np.ndarray, bits: int) -> np.ndarray | None:
    """Sequential (LSB-first) fields of uint32 words as a new uint8 array [..., n * 32 / bits], fast.

    8-bit fields are the words' bytes (little-endian). 4-bit fields: each byte holds two
    nibbles, low one first; widened to a uint16 0x00hl, ``(x | x << 4) & 0x0F0F`` is 0x0h0l,
    whose two bytes (little-endian) are the nibbles in order. Returns None where these do not
    apply (other widths, big-endian).
    """
    if sys.byteorder != "little" or bits not in (4, 8):
        return None
    if bits == 8:
        w = w.astype(np.uint32, order="C")  # always a new array: callers may overwrite the fields
        return w.view(np.uint8).reshape(w.shape[:-1] + (w.shape[-1] * 4,))
    w = np.ascontiguousarray(w, dtype=np.uint32)  # transposes a transposed view; the widening below copies
    x = w.view(np.uint8).astype(np.uint16)
    np.bitwise_or(x, np.left_shift(x, np.uint16(4)), out=x)
    np.bitwise_and(x, np.uint16(0x0F0F), out=x)
    return x.view(np.uint8).reshape(w.shape[:-1] + (w.shape[-1] * 8,))


def unpack_int32_transposed(packed, bits: int, axis: int, *, order=None, tensor: str = "packed",
                            layer: str | None = None) -> np.ndarray:
    """``unpack_int32(packed, bits, axis, order=order).T`` for a 2-D ``packed``, as a contiguous array.

    Transposes the 32-bit words (a quarter or an eighth of the bytes) before unpacking, so
    the result is written in its final [rows, cols] order instead of being unpacked and then
    transposed byte by byte — the layout step that dominates dequantizing GPTQ and AWQ.
    """
    rows, shape, align = transposed_field_rows(packed, bits, axis, order=order, tensor=tensor, layer=layer)
    out = np.empty(shape, dtype=np.uint8)

    def fill(r0, r1):
        out[r0:r1] = rows(r0, r1)

    for_row_chunks(shape[0], out.size, fill, row_bytes=shape[1], align=align)
    return out


def transposed_field_rows(packed, bits: int, axis: int, *, order=None, tensor: str = "packed",
                          layer: str | None = None):
    """Row blocks of ``unpack_int32(packed, bits, axis, order=order).T`` for a 2-D ``packed``.

    Returns ``(rows, shape, align)``: ``rows(r0, r1)`` gives result rows [r0, r1) as
    contiguous uint8 (``r0`` a multiple of ``align``), ``shape`` is the whole result's shape.
    A dequantizer calls ``rows`` inside its cache-sized blocks, so the unpacked codes never
    travel through main memory (emulator/parallel.py).
    """
    per_word = fields_per_word(bits)
    order = _check_order(order, per_word)
    p = np.asarray(packed)
    if p.dtype != np.int32:
        raise FormatError(f"expected dtype int32, got {p.dtype.name}", layer=layer, tensor=tensor)
    require(p.ndim == 2, f"expected a 2-D array, got shape {list(p.shape)}", layer=layer, tensor=tensor)
    pu = p.view(np.uint32)
    n_a, n_b = pu.shape
    mask = np.uint32((1 << bits) - 1)
    sequential = order == tuple(range(per_word))
    if axis % 2 == 0:  # packed along rows (GPTQ qweight [K/F, N]): result [N, K], fields along the last axis

        def rows(r0, r1):
            # copy the block's columns first (rows of contiguous words), then transpose in cache
            w = np.ascontiguousarray(pu[:, r0:r1]).T
            fast = _fields_in_order(w, bits) if sequential else None
            if fast is not None:
                return fast
            out = np.empty((r1 - r0, n_a, per_word), dtype=np.uint8)
            for slot, element in enumerate(order):
                out[:, :, element] = (w >> np.uint32(bits * slot)) & mask
            return out.reshape(r1 - r0, n_a * per_word)

        return rows, (n_b, n_a * per_word), 1

    # packed along columns (AWQ qweight [K, N/F]): result row F*j + e holds field order^-1[e] of word column j

    def rows(r0, r1):
        j0, j1 = r0 // per_word, -(-r1 // per_word)
        blk = np.ascontiguousarray(pu[:, j0:j1])  # [A, J]
        out = np.empty((j1 - j0, per_word, n_a), dtype=np.uint8)
        if bits in (4, 8) and sys.byteorder == "little":
            # the words' bytes, transposed to [J, 4, A] so every field row below is contiguous
            by = np.ascontiguousarray(blk.view(np.uint8).reshape(n_a, j1 - j0, 4).transpose(1, 2, 0))
            for slot, element in enumerate(order):
                if bits == 8:
                    out[:, element, :] = by[:, slot, :]
                elif slot % 2 == 0:
                    np.bitwise_and(by[:, slot // 2, :], np.uint8(0x0F), out=out[:, element, :])
                else:
                    np.right_shift(by[:, slot // 2, :], np.uint8(4), out=out[:, element, :])
        else:
            w = blk.T
            for slot, element in enumerate(order):
                out[:, element, :] = (w >> np.uint32(bits * slot)) & mask
        out = out.reshape((j1 - j0) * per_word, n_a)
        return out[r0 - j0 * per_word: r1 - j0 * per_word]

    return rows, (n_b * per_word, n_a), per_word
