"""The canonical reference of one layer by blocks of output rows: a bounded working set, the same numbers.

Semantics: docs/fallback.md#memory.

``qconform linear`` (emulator/layers.py ``linear_layer``) dequantizes a whole layer and evaluates it in
float64 with rigorous error bounds: about ``BYTES_PER_WEIGHT`` bytes of transient arrays per weight
element. Here the layer's packed tensors are sliced into blocks of output rows (every format stores
output rows along one axis, some packed ``F`` to a word along it), each block is a layer of its own
(``LayerInfo`` with N rows) run through the *same* ``linear_layer``, and the blocks' outputs are the
columns of y. Every step of the reference is per output element (dequantization is elementwise, the
activation quantizers depend on x only, each output element is one sum over K plus its bias, rounded
once), so a block's exact values and bounds are those of the same elements of the whole layer.

The one thing that is not per element is float64 evaluation order: the BLAS dgemm of a block may round a
sum differently from the dgemm of the whole layer (measured: tens of percent of the float64 sums of a
random 512-row layer differ in their last bits between the two). Both are within the rigorous bound of
the exact sum, so the rounded outputs agree wherever the bound decides the rounding; where it straddles
a rounding boundary (``y_ambiguous``, which ``exact_by_rows`` counts as ``ambiguous``) the reference
decides the element from its exact value (emulator/linear.py ``decide_exactly``). So the result is
``qconform linear``'s bit for bit at every element: the exact sum rounded once.

Layouts not sliced here (Quark int, unknown tensor roles, a tensor whose row axis has another length
than the layer's N, N not a multiple of the packing) take the whole-layer path, which also reports any
such inconsistency as ``qconform dequant`` does.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from emulator import linear as lin
from emulator.activations.int8 import CANONICAL_SYM
from emulator.activations.int8_fast import quantize_int8_fast
from emulator.checkpoint import LayerInfo
from emulator.errors import FormatError, UnsupportedFormatError
from emulator.fast_linear_w16 import linear_w16_fast, row_norm_bounds
from emulator.layers import declared_activation, dequantize_layer, layer_bias, linear_layer
from emulator.tensorfile import Tensor

from .exact_product import float64_product_for

__all__ = ["row_slicer", "reference", "exact_by_rows", "validate_by_rows", "block_rows", "BYTES_PER_WEIGHT", "BYTES_PER_OUTPUT",
           "MIN_BLOCK_BYTES"]

#: transient bytes of the reference per weight element of a block (fp32 dequantized weight, float64 copies,
#: the dequantizer's unpacked codes): tracemalloc measured ~40 for W4A4, 8-20 for W8A8 / W4A8 and ~6 for A16
#: (emulator/fast_linear_w16.py widens the weight by cached row blocks) on a 1024 x 1024 layer at M = 4;
#: 80 leaves a margin (the block peak is checked in tests/fallback/test_fallback_exact_blocks.py)
BYTES_PER_WEIGHT = 80
#: per output element of a block ([M, n] float64 sums, magnitudes, bounds, exactness masks, rounded y)
BYTES_PER_OUTPUT = 96
#: the smallest block budget (one NumPy pass per block costs ~0.1 ms of Python: ever smaller blocks only
#: add calls), also used when the budget is 0
MIN_BLOCK_BYTES = 1 << 20


class BlockTensors:
    """The part of ``emulator.checkpoint.Checkpoint`` the layer functions read, over given tensors by role."""

    def __init__(self, info: LayerInfo, by_role: dict[str, Tensor]):
        self._by_name = {info.tensors[role]: t for role, t in by_role.items()}

    def tensor(self, name: str, *, layer: str | None = None) -> Tensor:
        return self._by_name[name]

    def layer_tensors(self, info: LayerInfo) -> dict[str, Tensor]:
        return {role: self._by_name[name] for role, name in info.tensors.items()}


def _rows(t: Tensor | None, axis: int, n0: int, n1: int) -> Tensor | None:
    if t is None:
        return None
    idx = [slice(None)] * t.data.ndim
    idx[axis] = slice(n0, n1)
    return Tensor(t.data[tuple(idx)], t.dtype)  # a view: no copy of the packed bytes


#: format -> {role: (axis holding output rows, rows per entry along it: 0 = the packing F = 32 // bits)}
_LAYOUT = {
    "gptq": {"qweight": (1, 1), "scales": (1, 1), "qzeros": (1, 0), "g_idx": None, "bias": (0, 1)},
    "awq": {"qweight": (1, 0), "scales": (1, 1), "qzeros": (1, 0), "bias": (0, 1)},
    "ct-pack-quantized": {"weight_packed": (0, 1), "weight_scale": (0, 1), "weight_zero_point": (0, 0),
                          "weight_g_idx": None, "weight_shape": "shape", "bias": (0, 1)},
    "ct-int-quantized": {"weight": (0, 1), "weight_scale": (0, 1), "bias": (0, 1)},
    "ct-mxfp4": {"weight_packed": (0, 1), "weight_scale": (0, 1), "bias": (0, 1)},
    "quark-mxfp4": {"weight": (0, 1), "weight_scale": (0, 1), "bias": (0, 1)},
    "gptoss-mxfp4": {"blocks": (1, 1), "scales": (1, 1)},  # one expert, [1, N, K/32, 16] / [1, N, K/32]
}


def row_slicer(info: LayerInfo, tensors: dict[str, Tensor]):
    """(rows a block must be a multiple of, take(n0, n1) -> (block LayerInfo, its tensors by role)), or None
    where this layout is not sliced (the caller runs the whole layer)."""
    layout = _LAYOUT.get(info.format)
    if layout is None or not set(tensors) <= set(layout):
        return None
    if info.format == "gptoss-mxfp4" and (len(info.shape) != 3 or info.shape[0] != 1):
        return None
    N, K = int(info.shape[-2]), int(info.shape[-1])
    bits = int(info.bits or 0)
    if bits <= 0 or 32 % bits:
        return None
    pf = 32 // bits  # codes per 32-bit word
    mult = 1
    for role, t in tensors.items():
        spec = layout[role]
        if spec is None:
            continue
        if spec == "shape":  # ct's weight_shape: must say [N, K]; each block gets its own
            if [int(v) for v in np.asarray(t.data).reshape(-1)] != [N, K]:
                return None
            continue
        axis, per = spec
        per = per or pf
        if t.data.ndim <= axis or t.data.shape[axis] * per != N:
            return None
        mult = max(mult, per)
    if N % mult:
        return None

    def take(n0: int, n1: int):
        out = {}
        for role, t in tensors.items():
            spec = layout[role]
            if spec is None:
                out[role] = t
            elif spec == "shape":
                out[role] = Tensor(np.asarray([n1 - n0, K], dtype=t.data.dtype), t.dtype)
            else:
                axis, per = spec
                per = per or pf
                out[role] = _rows(t, axis, n0 // per, n1 // per)
        shape = (n1 - n0, K) if len(info.shape) == 2 else (1, n1 - n0, K)
        return dataclasses.replace(info, shape=shape), out

    return mult, take


def reference(src, info: LayerInfo, x32: np.ndarray, dtype: str, int_engine=None, weights=None) -> lin.LinearResult:
    """The canonical reference of a layer (``qconform linear``); a [1, N, K] layer is one stacked expert.

    A16 layers run ``linear_w16_fast`` (emulator/fast_linear_w16.py): the float64 error bounded from the rows'
    2-norms instead of a second GEMM, the same y as ``qconform linear`` (tests/emulator/test_exact_reference_gate.py).
    ``int_engine``: the W8A8 exact accumulator's engine (emulator/fast_linear.py; speed only).
    ``weights`` (speed only; qconform_torch/op.py): a cache of this layer's validated inputs, ``weights(what,
    make)`` -> make() or the value it kept for ``what``; with it, an A16 layer's dequantized weight and its rows'
    norms are formed once, and a W8A8 compressed-tensors layer, once validated by ``linear_layer`` (which dequantizes the whole
    layer to check every tensor), runs ``linear_layer``'s own W8A8 call without that check."""
    if len(info.shape) == 3:
        w = dequantize_layer(src, info)[0] if weights is None else weights("w", lambda: dequantize_layer(src, info)[0])
        return _w16(x32, w, None, dtype, weights)
    try:
        act = declared_activation(info)
    except UnsupportedFormatError:
        act = None  # linear_layer says why
    if act == "a16":
        # dequantize_layer validates every tensor and the bias, as linear_layer does
        w = dequantize_layer(src, info) if weights is None else weights("w", lambda: dequantize_layer(src, info))
        return _w16(x32, w, layer_bias(src, info), dtype, weights)
    if act == "int8" and info.format == "ct-int-quantized" and weights is not None:
        if weights("validated", lambda: None) is not None:  # linear_layer ran on these tensors and accepted them
            t = src.layer_tensors(info)
            return lin.linear_w8a8(x32, t["weight"].data, t["weight_scale"].data.reshape(-1), layer_bias(src, info),
                                   act=CANONICAL_SYM, out_dtype=dtype, int_engine=int_engine,
                                   quantize=quantize_int8_fast)
        res = linear_layer(src, info, x32, out_dtype=dtype, int_engine=int_engine)
        weights("validated", lambda: True)
        return res
    return linear_layer(src, info, x32, out_dtype=dtype, int_engine=int_engine)


def _w16(x32: np.ndarray, w: np.ndarray, bias, dtype: str, weights) -> lin.LinearResult:
    """The A16 reference of a dequantized weight; its rows' norms kept beside it where the cache keeps it."""
    norms = None
    if weights is not None and w.dtype == np.float32:
        norms = weights("w norms", lambda: row_norm_bounds(w))
    return linear_w16_fast(x32, w, bias, out_dtype=dtype, w_norms=norms, product=float64_product_for())


def block_rows(N: int, K: int, M: int, budget_bytes: int, mult: int) -> int:
    """Output rows per block: the reference's working set of a block within max(budget, MIN_BLOCK_BYTES), but
    at least ``mult`` rows (one packing unit; rows are never split along K)."""
    per_row = BYTES_PER_WEIGHT * K + BYTES_PER_OUTPUT * max(M, 1)
    rows = max(budget_bytes, MIN_BLOCK_BYTES) // per_row // mult * mult
    return min(N, max(mult, rows))


def exact_by_rows(src, info: LayerInfo, x32: np.ndarray, dtype: str, budget_bytes: int,
                  int_engine=None, weights=None) -> tuple[np.ndarray, dict]:
    """(y as float32 holding values of ``dtype``, stats) of the canonical reference, computed by row blocks
    whose working set stays within max(``budget_bytes``, MIN_BLOCK_BYTES) where the layout allows.

    stats: ``blocks`` (1: the whole layer), ``rows`` per block, ``ambiguous`` / ``ambiguous_at`` (how many
    and which (m, n) elements' float64 bound straddles a rounding boundary in their block: the reference
    decided those from their exact value)."""
    N, K = int(info.shape[-2]), int(info.shape[-1])
    M = int(x32.shape[0])
    tensors = src.layer_tensors(info)
    sl = row_slicer(info, tensors)
    rows = N if sl is None else block_rows(N, K, M, budget_bytes, sl[0])
    if rows >= N:
        res = reference(src, info, x32, dtype, int_engine, weights)
        at = [(int(m), int(n)) for m, n in np.argwhere(res.y_ambiguous)]
        return np.asarray(res.y, np.float32), {"blocks": 1, "rows": N, "ambiguous": len(at), "ambiguous_at": at}
    take = sl[1]
    y = np.empty((M, N), np.float32)
    at: list[tuple[int, int]] = []
    try:
        for n0 in range(0, N, rows):
            n1 = min(N, n0 + rows)
            sub, by_role = take(n0, n1)
            res = reference(BlockTensors(sub, by_role), sub, x32, dtype, int_engine)
            y[:, n0:n1] = res.y
            if res.y_ambiguous.any():
                at += [(int(m), int(n) + n0) for m, n in np.argwhere(res.y_ambiguous)]
            del res
    except FormatError:
        # a bad tensor: the whole-layer reference reports it as `qconform dequant` does (whole-layer indices)
        reference(src, info, x32, dtype)
        raise
    return y, {"blocks": -(-N // rows), "rows": rows, "ambiguous": len(at), "ambiguous_at": at}


def validate_by_rows(src, info: LayerInfo, budget_bytes: int) -> None:
    """Every tensor of the layer checked as ``qconform dequant`` checks it (``dequantize_layer``), by the row
    blocks of ``exact_by_rows``: no whole-layer fp32 copy where the layout is sliced."""
    N, K = int(info.shape[-2]), int(info.shape[-1])
    sl = row_slicer(info, src.layer_tensors(info))
    rows = N if sl is None else block_rows(N, K, 0, budget_bytes, sl[0])
    if rows >= N:
        dequantize_layer(src, info)
        return
    try:
        for n0 in range(0, N, rows):
            sub, by_role = sl[1](n0, min(N, n0 + rows))
            dequantize_layer(BlockTensors(sub, by_role), sub)
    except FormatError:
        dequantize_layer(src, info)  # the whole layer's error (whole-layer indices)
        raise
