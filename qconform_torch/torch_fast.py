"""The emulator backend's A16 fast path on torch's fp32 GEMM, for a layer the op's cache keeps.

Semantics: docs/fallback.md#the-op (what the fast path guarantees); speed: docs/performance.md#model-level.

The fast path declares fp32 accumulation of the exactly dequantized weights (backends/emulator.py
``computed``): the weight the emulator's dequantizer forms (``declared_weight``, float32, exact values), any
product order, each partial sum an fp32 add or FMA, then the bias added in fp32 and one RNE rounding to the
output dtype. This module keeps that weight as a torch tensor, dequantized once per layer (not per M: the
weight depends on the layer's tensors only), and multiplies with ``torch.mm``, i.e. the BLAS that torch's own
``nn.Linear`` uses, on torch's intra-op threads. In a model whose other work (attention, norms) runs in
torch, this avoids handing the cores back and forth between torch's OpenMP pool and NumPy's worker threads.

That is fp32 accumulation only while torch computes float32 products in IEEE float32: with
``torch.set_float32_matmul_precision("medium")`` or ``torch.backends.mkldnn.matmul.fp32_precision = "bf16"``
oneDNN may round the operands to bfloat16 (or TF32). ``ieee_fp32_matmul_refusal`` reads those settings on every
call and checks once per process, on operands whose products and sums any narrower arithmetic would round,
that ``torch.mm`` returns the exact fp32 results; where either says no, the caller takes the NumPy path
(emulator/formats/fast_matmul.py), which is fp32 by construction.

Bits: any fp32 summation order is within the fast path's declared interval, but not every order gives the
same bits; a layer the cache streams instead (qconform_torch/blocked.py: NumPy's sgemm over row blocks) may
differ in the last bits from the same layer kept here (both within the declared interval:
tests/fallback/test_torch_fast.py).
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from emulator.numerics.fast_round import round_fast

from .int_kernels import MAX_K, b_operand
from .int_kernels import self_check as int8_self_check

__all__ = ["ieee_fp32_matmul_refusal", "TorchFastLinear", "TorchW8A8Linear", "self_check", "reset_self_check"]

_CHECK = {"done": False, "why": None}
_LOCK = threading.Lock()


def _settings_refusal() -> str | None:
    """Why torch's fp32 matmul settings may not be IEEE float32 now (None: they are)."""
    for where, obj in (("torch.backends", torch.backends), ("torch.backends.mkldnn", torch.backends.mkldnn),
                       ("torch.backends.mkldnn.matmul", getattr(torch.backends.mkldnn, "matmul", None))):
        p = getattr(obj, "fp32_precision", None)
        if p not in (None, "none", "ieee"):
            return f"{where}.fp32_precision is {p!r}"
    try:
        p = torch.get_float32_matmul_precision()
    except RuntimeError:  # legacy and new APIs mixed: the new ones above decided
        return None
    return None if p == "highest" else f"torch.get_float32_matmul_precision() is {p!r}"


def self_check() -> str | None:
    """None where ``torch.mm`` multiplies float32 operands as float32 here, else why not; once per process.

    Operands 1 + 2**-12 (exact in float32, rounded to 1 by bfloat16's 8 and TF32's 11 significand bits)
    against ones, on a small and a model-sized shape, in each operand position: every product and every
    partial sum, in any order, is an integer multiple of 1 + 2**-12 with at most K <= 1024 of them, i.e. at
    most 22 significant bits: exact in float32, so the only fp32 answer is K * (1 + 2**-12)."""
    with _LOCK:
        if _CHECK["done"]:
            return _CHECK["why"]
        why = None
        tail = 1 + 2.0 ** -12
        try:
            for m, k, n in ((3, 64, 5), (16, 1024, 64)):
                for xv, wv in ((tail, 1.0), (1.0, tail)):
                    got = torch.mm(torch.full((m, k), xv), torch.full((n, k), wv).t()).numpy()
                    want = np.float32(k * tail)
                    if not np.all(got == want):
                        why = (f"torch.mm of {m}x{k} by {k}x{n} returned {float(got.flat[0])!r} where float32 "
                               f"operands give {float(want)!r} (its fp32 products round their operands)")
                        break
                if why:
                    break
        except (RuntimeError, TypeError) as e:
            why = f"torch.mm failed ({type(e).__name__}: {e})"
        _CHECK.update(done=True, why=why)
        return why


def reset_self_check() -> None:
    """Forget the once-per-process check's answer (the next ``self_check`` runs it again)."""
    with _LOCK:
        _CHECK.update(done=False, why=None)


def ieee_fp32_matmul_refusal() -> str | None:
    """None where torch's fp32 GEMM may stand for the fast path's fp32 accumulation now, else why not."""
    return _settings_refusal() or self_check()


class TorchFastLinear:
    """One layer's exactly dequantized weight [N, K] as a float32 torch tensor; ``__call__(x32, bias, dtype)``
    -> y [M, N] float32 (NumPy) = RNE_dtype(fl32(x @ W^T) + bias)."""

    __slots__ = ("weight", "nbytes")

    def __init__(self, w32: np.ndarray):
        w = np.ascontiguousarray(w32, dtype=np.float32)
        self.weight = torch.from_numpy(w)
        self.nbytes = int(w.nbytes)

    def __call__(self, x32: np.ndarray, bias, output_dtype: str) -> np.ndarray:
        y = torch.mm(torch.from_numpy(np.ascontiguousarray(x32, dtype=np.float32)), self.weight.t())
        if bias is not None:
            y.add_(torch.from_numpy(np.asarray(bias, dtype=np.float32)))  # the fp32 bias add, after the sum
        if output_dtype == "float32":
            # already the float32 result: ``round_fast`` to float32 would only quiet a signalling NaN, and every
            # value here is an arithmetic result (K >= 1 products summed), which IEEE 754 makes quiet
            return y.numpy()
        return round_fast(y.numpy(), output_dtype)


class TorchW8A8Linear:
    """The emulator backend's canonical W8A8 fast path (backends/emulator.py ``_run_w8a8``, symmetric int8
    channel weights, dynamic symmetric per-token int8 activations) in torch ops, equal to it bit for bit:

    - per token: scale = fl32(amax / 127), codes = clamp(RNE(fl32(x / scale)), -128, 127) (a zero row gives
      codes 0; an underflowed scale's 0/0 gives 0, x/0 = +-Inf saturates), all IEEE float32 operations;
    - the exact integer sums by ``torch._int_mm`` (int8 x int8 -> int32: exact for K < 2**17, and the engine
      proved against NumPy's int64 matmul once per process: qconform_torch/int_kernels.py ``self_check``);
    - y = sum * (sx * sw) in float64 (sx * sw exact: 24 + 24 bits; one rounding), + bias in float64, then one
      rounding to the output dtype (``round_fast``).

    ``usable`` is False where the engine cannot take the layer (weights not int8, K >= 2**17, a failed
    self-check): the caller keeps the backend's own path."""

    __slots__ = ("_b", "_ws", "nbytes", "usable")

    def __init__(self, weight: np.ndarray, weight_scale: np.ndarray):
        w = np.asarray(weight)
        self.usable = bool(w.dtype == np.int8 and w.ndim == 2 and 0 < w.shape[1] < MAX_K and w.shape[0] > 0
                           and int8_self_check())
        self._b = b_operand(np.ascontiguousarray(w)) if self.usable else None
        ws = np.asarray(weight_scale).astype(np.float32).astype(np.float64).reshape(1, -1)
        self._ws = torch.from_numpy(ws)
        self.nbytes = int(w.nbytes + ws.nbytes)

    def __call__(self, x32: np.ndarray, bias, output_dtype: str) -> np.ndarray:
        x = torch.from_numpy(np.ascontiguousarray(x32, dtype=np.float32))
        amax = x.abs().amax(dim=1, keepdim=True)  # torch.amax propagates NaN: a row with NaN has amax NaN
        if bool(torch.isnan(amax).any()):
            raise ValueError("x: NaN in activations: per-token int8 quantization is undefined for NaN input")
        # float32 / float32 (127 is exact), one IEEE division each: a tensor divisor, as a scalar one may be
        # turned into a multiply by its reciprocal, which rounds twice
        scale = torch.div(amax, torch.full_like(amax, 127.0))
        q = torch.div(x, scale)
        # RNE (torch.round: half to even), saturate, then NaN -> code 0: a zero row (scale 0: every x is +-0) and
        # an underflowed scale give 0/0 = NaN, which round and clamp keep as NaN; x/0 = +-Inf saturates to the
        # clamp bounds. In place on one buffer (the order nan_to_num -> round -> clamp gives the same codes).
        q = q.round_().clamp_(-128, 127).nan_to_num_(0.0).to(torch.int8)
        acc = torch._int_mm(q, self._b)
        # acc * (sx * sw) in float64: sx * sw is exact (24 + 24 bits), so this is one rounding of the exact value
        y = acc.to(torch.float64).mul_(scale.to(torch.float64) * self._ws)
        if bias is not None:
            y.add_(torch.from_numpy(np.asarray(bias, dtype=np.float64)))
        if output_dtype == "float32":
            # torch's float64 -> float32 cast is the IEEE RNE conversion ``round_fast`` makes (subnormals, overflow,
            # a NaN's sign and top payload bits kept: tests/fallback/test_torch_fast.py compares them bit for bit)
            return y.to(torch.float32).numpy()
        return round_fast(y.numpy(), output_dtype)
