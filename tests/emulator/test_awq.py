"""AWQ GEMM (emulator/formats/awq.py): layout, RTN bound, variants, errors.

Expected words are written by hand from AutoAWQ's ``order_map``
(awq/modules/linear/gemm.py) and ``AWQ_REVERSE_ORDER`` (awq/utils/packing_utils.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.errors import FormatError, UnsupportedFormatError
from emulator.formats.awq import (
    AWQ_PACK_ORDER,
    AWQ_REVERSE_ORDER,
    AwqCodes,
    AwqParams,
    AwqTensors,
    dequantize_awq,
    pack_awq,
    quantize_awq,
    unpack_awq,
)
from emulator.formats.int_common import DequantVariant
from emulator.formats.packing import unpack_int32


def words(*hex_words) -> np.ndarray:
    return np.array(hex_words, dtype=np.uint32).view(np.int32)


def test_orders():
    assert AWQ_PACK_ORDER == (0, 2, 4, 6, 1, 3, 5, 7)
    assert AWQ_REVERSE_ORDER == (0, 4, 1, 5, 2, 6, 3, 7)


def test_hand_example():
    """K = 2, N = 8, one group. Row k=0 word 0x75316420 holds q[c] = c; row k=1 word
    0x00000001 holds column 0 = 1 (slot 0) only; zeros word 0x33333333 -> z = 3; s = 0.25."""
    p = AwqParams(group_size=-1)
    t = AwqTensors(
        qweight=words(0x75316420, 0x00000001).reshape(2, 1),
        qzeros=words(0x33333333).reshape(1, 1),
        scales=np.full((1, 8), 0.25, dtype=np.float16),
    )
    w = dequantize_awq(t, p)
    assert w.shape == (8, 2)
    assert w[:, 0].tolist() == [(c - 3) * 0.25 for c in range(8)]
    assert w[:, 1].tolist() == [(1 - 3) * 0.25] + [(0 - 3) * 0.25] * 7


def test_slot_of_column():
    """Column c lives in slot AWQ_REVERSE_ORDER[c] (bits 4*slot .. 4*slot+3)."""
    q = np.zeros((8, 1), dtype=np.uint8)
    for c in range(8):
        q[:] = 0
        q[c, 0] = 0xA
        t = pack_awq(AwqCodes(q=q, zeros=np.zeros((1, 8), dtype=np.int32), scales=np.ones((1, 8), dtype=np.float16)), AwqParams(group_size=-1))
        assert t.qweight.view(np.uint32).tolist() == [[0xA << (4 * AWQ_REVERSE_ORDER[c])]]


@settings(max_examples=40, deadline=None)
@given(
    group_size=st.sampled_from([-1, 32, 64, 128]),
    n=st.sampled_from([8, 16, 32]),
    groups=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_round_trip(group_size, n, groups, seed):
    rng = np.random.default_rng(seed)
    p = AwqParams(group_size=group_size)
    k = 64 * groups if group_size == -1 else group_size * groups
    ng = 1 if group_size == -1 else groups
    codes = AwqCodes(
        q=rng.integers(0, 16, (n, k)).astype(np.uint8),
        zeros=rng.integers(0, 16, (ng, n)).astype(np.int32),
        scales=(rng.random((ng, n)) + 0.01).astype(np.float16),
    )
    t = pack_awq(codes, p)
    assert t.qweight.shape == (k, n // 8) and t.qzeros.shape == (ng, n // 8)
    back = unpack_awq(t, p)
    for f in ("q", "zeros", "scales"):
        np.testing.assert_array_equal(getattr(back, f), getattr(codes, f))
    # the qweight of AWQ is the transposed, column-interleaved GPTQ packing: read it
    # with the reverse order written out as a gather
    fields = unpack_int32(t.qweight, 4, axis=1)  # slot-major, no order
    cols = fields.reshape(k, n // 8, 8)[:, :, list(AWQ_REVERSE_ORDER)].reshape(k, n)
    np.testing.assert_array_equal(cols.T, codes.q)


@settings(max_examples=30, deadline=None)
@given(
    group_size=st.sampled_from([-1, 32, 64, 128]),
    seed=st.integers(0, 2**32 - 1),
    wdtype=st.sampled_from(["float32", "float16"]),
    positive_groups=st.booleans(),
)
def test_quantize_within_half_a_step(group_size, seed, wdtype, positive_groups):
    rng = np.random.default_rng(seed)
    n, k = 16, 128
    w = (rng.standard_normal((n, k)) * 10.0 ** rng.uniform(-2, 2)).astype(wdtype)
    if positive_groups:
        w = np.abs(w)  # all-positive groups: z = 0, literal in AWQ
    p = AwqParams(group_size=group_size)
    t = quantize_awq(w, p)
    deq = dequantize_awq(t, p).astype(np.float64)
    c = unpack_awq(t, p)
    g = np.arange(k) // (k // c.zeros.shape[0])
    s = c.scales.astype(np.float64)[g, :].T
    z = c.zeros[g, :].T
    q = c.q.astype(np.int64)
    err = np.abs(w.astype(np.float64) - deq)
    assert np.all(err <= np.where(q < 15, np.abs(w - (deq + s)), np.inf))
    assert np.all(err <= np.where(q > 0, np.abs(w - (deq - s)), np.inf))
    inside = (w >= (-z - 0.5) * s) & (w <= (15 - z + 0.5) * s)
    assert np.all(err[inside] <= s[inside] / 2)
    assert np.all(err <= s * (0.5 + 16 * 2.0**-11))
    if positive_groups:
        assert np.all(c.zeros == 0)


@pytest.mark.parametrize(
    "variant",
    [dict(order="mul_then_sub", compute_dtype="float16"), dict(scale_dtype="bfloat16"), dict(compute_dtype="bfloat16")],
)
def test_variants_differ(variant):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 128)).astype(np.float32)
    p = AwqParams(group_size=32)
    t = quantize_awq(w, p)
    assert np.any(dequantize_awq(t, p, variant=DequantVariant(**variant)) != dequantize_awq(t, p))


def test_params():
    assert AwqParams.from_config({"w_bit": 4, "q_group_size": 64, "zero_point": True, "version": "GEMM"}) == AwqParams(group_size=64)
    with pytest.raises(UnsupportedFormatError, match="4-bit"):
        AwqParams(bits=8)
    with pytest.raises(UnsupportedFormatError, match="gemm"):
        AwqParams.from_config({"version": "gemv"})


def _good():
    p = AwqParams(group_size=64)
    return p, quantize_awq(np.random.default_rng(2).standard_normal((64, 128)).astype(np.float32), p)


@pytest.mark.parametrize(
    "change, pattern",
    [
        (dict(qweight=np.zeros((128, 7), dtype=np.int32)), r"^qweight: expected shape \[K, N/8\] = \[128, 8\], got \[128, 7\]$"),
        (dict(qweight=np.zeros((128, 8), dtype=np.uint32)), r"^qweight: expected dtype int32, got uint32$"),
        (dict(qzeros=np.zeros((1, 8), dtype=np.int32)), r"^qzeros: expected shape \[K/G, N/8\] = \[2, 8\], got \[1, 8\]$"),
        (dict(scales=np.ones((2, 64), dtype=np.float32)), r"^scales: expected dtype float16 or bfloat16, got float32$"),
        (dict(scales=np.full((2, 64), np.nan, dtype=np.float16)), r"^scales: scale nan at index \[0, 0\] is not finite"),
    ],
)
def test_malformed(change, pattern):
    p, t = _good()
    d = dict(qweight=t.qweight, qzeros=t.qzeros, scales=t.scales)
    d.update(change)
    with pytest.raises(FormatError, match=pattern):
        dequantize_awq(AwqTensors(**d), p, shape=(64, 128))


def test_errors_in_codes():
    p = AwqParams(group_size=-1)
    ok = AwqCodes(q=np.zeros((8, 8), dtype=np.uint8), zeros=np.zeros((1, 8), dtype=np.int32), scales=np.ones((1, 8), dtype=np.float16))
    z = ok.zeros.copy()
    z[0, 6] = 16
    with pytest.raises(FormatError, match=r"^blk\.qzeros: zero point 16 at index \[0, 6\] is out of range \[0, 15\]"):
        pack_awq(AwqCodes(q=ok.q, zeros=z, scales=ok.scales), p, layer="blk")
    with pytest.raises(FormatError, match=r"^qweight: N = 12 is not a multiple of 8"):
        pack_awq(AwqCodes(q=np.zeros((12, 8), dtype=np.uint8), zeros=np.zeros((1, 12), dtype=np.int32), scales=np.ones((1, 12), dtype=np.float16)), p)
    with pytest.raises(FormatError, match=r"^scales: K = 96 is not a multiple of group_size 64"):
        quantize_awq(np.zeros((8, 96), dtype=np.float32), AwqParams(group_size=64))
