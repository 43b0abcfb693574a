"""Fast unpacking of int32-packed fields, in cache-sized row blocks (speed only).

The specification of the layouts is ``packing.py`` (``unpack_int32``: one shift and mask per
field) and docs/formats/gptq.md#packing; every function here returns exactly what
``unpack_int32`` returns for the same arguments (tests/emulator/test_blocked_dequant.py,
tests/emulator/test_reference_vs_fast.py). They are what the public ``dequantize_*`` and
``unpack_*`` functions use; the ``*_reference`` functions never call them.

Two tricks make them fast:

- nibble spreading (``spread_fields``): 8-bit fields are the words' little-endian bytes; a
  byte holding two 4-bit fields, widened to uint16 ``0x00hl``, becomes ``0x0h0l`` under
  ``(x | x << 4) & 0x0F0F``, whose two bytes are the fields in order;
- transposing words, not fields (``transposed_field_rows``): GPTQ packs along K and AWQ
  along N, while the weight is [N, K]; transposing the 32-bit words (a quarter or an eighth
  of the bytes) inside a block before unpacking writes every field once, in place.
"""

from __future__ import annotations

import sys

import numpy as np

from ..errors import FormatError, require
from ..parallel import for_row_chunks
from .packing import check_order, fields_per_word, unpack_int32

__all__ = ["spread_fields", "sequential_fields", "transposed_field_rows", "unpack_int32_transposed"]

_LITTLE = sys.byteorder == "little"
_U16_4, _U16_LOW_NIBBLES = np.uint16(4), np.uint16(0x0F0F)


def spread_fields(w: np.ndarray, bits: int) -> np.ndarray | None:
    """Sequential (LSB-first) fields of uint32 words as a new uint8 array [..., n * 32 / bits].

    Returns None where the byte tricks do not apply (other widths, a big-endian host).
    """
    if not _LITTLE or bits not in (4, 8):
        return None
    if bits == 8:
        w = w.astype(np.uint32, order="C")  # always a new array: callers may overwrite the fields
        return w.view(np.uint8).reshape(w.shape[:-1] + (w.shape[-1] * 4,))
    w = np.ascontiguousarray(w, dtype=np.uint32)  # transposes a transposed view; the widening below copies
    x = w.view(np.uint8).astype(np.uint16)
    np.bitwise_or(x, np.left_shift(x, _U16_4), out=x)
    np.bitwise_and(x, _U16_LOW_NIBBLES, out=x)
    return x.view(np.uint8).reshape(w.shape[:-1] + (w.shape[-1] * 8,))


def sequential_fields(words: np.ndarray, bits: int) -> np.ndarray:
    """``unpack_int32(words, bits, axis=-1)`` of int32/uint32 words, without its checks (for blocks)."""
    w = np.asarray(words).view(np.uint32)
    fast = spread_fields(w, bits)
    return fast if fast is not None else unpack_int32(w.view(np.int32), bits, axis=-1)


def unpack_int32_transposed(packed, bits: int, axis: int, *, order=None, tensor: str = "packed",
                            layer: str | None = None) -> np.ndarray:
    """``unpack_int32(packed, bits, axis, order=order).T`` for a 2-D ``packed``, as a contiguous array."""
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
    order = check_order(order, per_word)
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
            w = pu[:, r0:r1].T
            if not w.flags.c_contiguous:  # a row-major qweight (as loaded): its block's words are strided
                # copy the block's columns first (rows of contiguous words), then transpose in cache
                w = np.ascontiguousarray(np.ascontiguousarray(pu[:, r0:r1]).T)
            # (a column-major qweight, e.g. the transposed view quantize_gptq returns, is already in order)
            fast = spread_fields(w, bits) if sequential else None
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
