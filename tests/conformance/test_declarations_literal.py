"""Kernels written literally from the docs' sentence of each weight, GEMM and epilogue value (issue 21 item 5).

Each kernel is torch code written from one row of docs/variants.md#declared-fields or
docs/formats/gptq.md (zero-point readings, orders, scale dtypes, the float zero point), reading a hand-packed
GPTQ v1 checkpoint by docs/formats/gptq.md#packing: not from the emulator's code. A kernel is a function of the
case's inputs (``kernel(inp) -> y``); the registry of test_literal_docs_weights.py names the value each one
implements and judges it there (it must pass under that value and fail under a mis-declaration). The
weight-formation kernels are in test_declarations_weight_formation.py, the W4A8 products in
test_declarations_w4a8_product.py, the W8A8 epilogues in test_literal_docs_int8.py.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from backends.base import Case
from conformance.cases.inputs import CaseInputs
from test_declarations_weight_formation import unpack_fields

M, N, K, G = 4, 16, 128, 32
TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _pack(fields: np.ndarray, axis: int) -> np.ndarray:
    """docs/formats/gptq.md#packing: element 8j + i along ``axis`` is bits [4i, 4i + 4) of int32 word j."""
    f = np.moveaxis(fields.astype(np.uint32), axis, 0)
    words = np.zeros((f.shape[0] // 8,) + f.shape[1:], np.uint32)
    for i in range(8):
        words |= f[i::8] << np.uint32(4 * i)
    return np.moveaxis(words.view(np.int32), 0, axis)


@functools.lru_cache(maxsize=1)
def gptq_v1_checkpoint():
    """(q [N, K], qzeros fields [K/G, N], scales, tensors): a GPTQ v1 asymmetric 4-bit checkpoint with every
    qzeros field value 0..15 (0xF reads as 16) and float16 scales."""
    rng = np.random.default_rng(7)
    q = rng.integers(0, 16, (N, K))
    fields = rng.permutation(np.resize(np.arange(16), (K // G, N)).ravel()).reshape(K // G, N)
    s = (rng.uniform(0.5, 2.0, (K // G, N)) * 2.0 ** -6).astype(np.float16)
    t = {"qweight": _pack(q.T, 0), "qzeros": _pack(fields, 1), "scales": s,
         "g_idx": (np.arange(K) // G).astype(np.int32)}
    return q, fields, s, t


@functools.lru_cache(maxsize=None)
def gptq_v1_inputs(act="bfloat16", out=None, bias=False, seed=0) -> CaseInputs:
    """The checkpoint as a W4A16 case: activations (and bias) drawn in float32 and rounded to ``act``."""
    t = gptq_v1_checkpoint()[3]
    case = Case("w4a16", "gptq", M, N, K, group_size=G, sym=False, zero_convention="v1", act_dtype=act,
                out_dtype=out, bias=bias)
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal((M, K)).astype(np.float32)).to(TORCH[act]).float().numpy()
    b = torch.from_numpy(rng.standard_normal(N).astype(np.float32)).to(TORCH[act]).float().numpy() if bias else None
    return CaseInputs(case, seed, t, x, b)


def gptq_v1_fields(inp):
    """(q [N, K], qzeros fields [K/G, N], scales [K/G, N] float32) read from the packed tensors (docs/formats/gptq.md)."""
    t = inp.tensors
    q = unpack_fields(torch.from_numpy(np.asarray(t["qweight"]).astype(np.int64)), 4, 0).T.numpy()
    fields = unpack_fields(torch.from_numpy(np.asarray(t["qzeros"]).astype(np.int64)), 4, 1).numpy()
    return q, fields, np.asarray(t["scales"]).astype(np.float32)


def _weights(q, z, s, scale_dtype=None) -> torch.Tensor:
    """(q - z) * s in float32 (exact for 16-bit scales), z and s per group of G columns."""
    zk = torch.from_numpy(np.repeat(z, G, axis=0).T.astype(np.float32))
    sk = torch.from_numpy(np.repeat(s.astype(np.float32), G, axis=0).T)
    if scale_dtype:
        sk = sk.to(TORCH[scale_dtype]).float()
    return (torch.from_numpy(q.astype(np.float32)) - zk) * sk


def _gemm(inp, w: torch.Tensor, out_dtype=None) -> np.ndarray:
    """float32 products and sums, one RNE rounding to ``out_dtype`` (default: the case's output dtype)."""
    y = torch.from_numpy(inp.x) @ w.T
    if inp.bias is not None:
        y = y + torch.from_numpy(inp.bias)
    return y.to(TORCH[out_dtype or inp.case.output_dtype]).float().numpy()


def canonical_weights(inp) -> torch.Tensor:
    """The v1 reading 'z = field + 1' (docs/formats/gptq.md#zero-points-zeroconvention), (q - z) * s in float32."""
    q, fields, s = gptq_v1_fields(inp)
    return _weights(q, fields + 1, s)


def canonical_kernel(inp) -> np.ndarray:
    """The checkpoint's own semantics: float32 weights, float32 products and sums, one RNE rounding."""
    return _gemm(inp, canonical_weights(inp))


# -- zero-point readings (docs/formats/gptq.md#reading-v1-zero-points-gptqzeroread) ---------------------------
def zero_read_kernel(value: str):
    def kernel(inp):
        q, fields, s = gptq_v1_fields(inp)
        if value == "canonical":  # 'V1: field + 1'
            z = fields + 1
        elif value == "v1_literal":  # 'field (a v1 checkpoint read as if it were v2: no +1)'
            z = fields
        elif value == "v1_wrap":  # '(field + 1) & maxq: 0xF reads as 0, no carry'
            z = (fields + 1) & 0xF
        elif value == "ignore_qzeros":  # '2^(b-1) for every group; qzeros is not read'
            z = np.full_like(fields, 8)
        else:  # 'add 0x11111111 to each int32 word (mod 2^32), then read fields literally' (carries included)
            words = (np.asarray(inp.tensors["qzeros"]).view(np.uint32).astype(np.uint64) + 0x11111111) % 2 ** 32
            z = np.stack([(words >> (4 * i)) & 0xF for i in range(8)], axis=2).reshape(fields.shape).astype(np.int64)
        return _gemm(inp, _weights(q, z, s))
    kernel.__name__ = f"zero_read_{value}"
    return kernel


# -- scale dtype and the float zero point (docs/formats/gptq.md#dequantization) ----------------------------------
def scale_bf16_kernel(inp):
    """'the scales are first rounded (RNE) to this dtype': the float16 checkpoint scales loaded into bf16."""
    q, fields, s = gptq_v1_fields(inp)
    return _gemm(inp, _weights(q, fields + 1, s, scale_dtype="bfloat16"))


def float_zero_kernel(zdt: str):
    """'zero = RNE_Z((m - z) * s_C), w = round_C((q - m) * s_C + zero)' with C = float32, Z = ``zdt`` (bfloat16:
    torch's CPU int4pack path, an fp32 FMA with a bf16 zero point)."""
    def kernel(inp):
        q, fields, s = gptq_v1_fields(inp)
        z = np.repeat(fields + 1, G, axis=0).T.astype(np.float32)
        sk = np.repeat(s, G, axis=0).T
        zero = torch.from_numpy((8 - z) * sk).to(TORCH[zdt]).double()  # the exact product (fp32: exact), rounded once
        w = ((torch.from_numpy(q.astype(np.float64)) - 8) * torch.from_numpy(sk).double() + zero).float()  # one rounding
        return _gemm(inp, w)
    kernel.__name__ = f"float_zero_z_{zdt}"
    return kernel


# -- GEMM and epilogue fields (docs/variants.md#declared-fields) ---------------------------------------------------
def act_compute_kernel(adt: str):
    """'rounds each activation (RNE) to that dtype before the product'."""
    def kernel(inp):
        y = torch.from_numpy(inp.x).to(TORCH[adt]).float() @ canonical_weights(inp).T
        return y.to(TORCH[inp.case.output_dtype]).float().numpy()
    kernel.__name__ = f"act_compute_{adt}"
    return kernel


def accumulate_16bit_kernel(acc_dt: str):
    """'sums in that dtype, any order': a 16-bit accumulator, each product rounded to it and added one at a time."""
    def kernel(inp):
        w = canonical_weights(inp)
        x = torch.from_numpy(inp.x)
        acc = torch.zeros(x.shape[0], w.shape[0], dtype=TORCH[acc_dt])
        for k in torch.randperm(x.shape[1], generator=torch.Generator().manual_seed(0)).tolist():
            acc = (acc.float() + (x[:, k:k + 1] * w[:, k][None, :]).to(TORCH[acc_dt]).float()).to(TORCH[acc_dt])
        return acc.float().to(TORCH[inp.case.output_dtype]).float().numpy()
    kernel.__name__ = f"accumulate_{acc_dt}"
    return kernel


def output_rtz_kernel(inp):
    """'rounds it toward zero (drops the low bits)': the fp32 accumulator truncated to bf16."""
    acc = torch.from_numpy(inp.x) @ canonical_weights(inp).T
    return (acc.view(torch.int32) & ~0xFFFF).view(torch.float32).numpy()


def output_dtype_kernel(dtype: str):
    """'returns that dtype': the float32 accumulator rounded (RNE) to ``dtype``, whatever the case's dtype."""
    def kernel(inp):
        return _gemm(inp, canonical_weights(inp), out_dtype=dtype)
    kernel.__name__ = f"output_{dtype}"
    return kernel


def bias_after_output_rounding_kernel(inp):
    """docs/formats/activations.md#declared-stages-and-their-acceptance-bounds: the kernel rounds its accumulator
    to the output dtype; the bias is added to that rounded output by a 16-bit add in the output dtype."""
    T = TORCH[inp.case.output_dtype]
    acc = torch.from_numpy(inp.x) @ canonical_weights(inp).T
    return (acc.to(T) + torch.from_numpy(inp.bias).to(T)).float().numpy()


def test_hand_packed_checkpoint_reads_back():
    """The packer and the reader follow docs/formats/gptq.md#packing the same way: fields read back unchanged,
    and the fixture holds every 4-bit qzeros field (0xF included, the value the v1 readings part on)."""
    q, fields, s, _ = gptq_v1_checkpoint()
    q2, f2, s2 = gptq_v1_fields(gptq_v1_inputs())
    assert np.array_equal(q2, q) and np.array_equal(f2, fields) and np.array_equal(s2, s.astype(np.float32))
    assert set(np.unique(fields)) == set(range(16))
    # a hand-checked word: fields 1, 2, ..., 8 (low nibble first) are 0x87654321
    assert _pack(np.arange(1, 9)[:, None], 0)[0, 0] == np.int32(0x87654321 - 2 ** 32)
