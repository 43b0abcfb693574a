"""GPTQ (emulator/formats/gptq.py): layout, zero conventions and their variants,
RTN quantization bound, act-order, and error messages.

Hand-written expected words and values follow the layout documented by
AutoGPTQ (auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py: pack / forward)
and GPTQModel (gptqmodel/utils/model.py: v1 <-> v2 conversion).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.errors import FormatError, UnsupportedFormatError
from emulator.formats.gptq import (
    GptqCodes,
    GptqParams,
    GptqTensors,
    GptqV1ZeroWrite,
    GptqZeroRead,
    dequantize_gptq,
    pack_gptq,
    quantize_gptq,
    unpack_gptq,
)
from emulator.formats.int_common import DequantVariant, ZeroConvention

V1, V2 = ZeroConvention.V1, ZeroConvention.V2


def words(*hex_words) -> np.ndarray:
    return np.array(hex_words, dtype=np.uint32).view(np.int32)


def u32(a) -> list:
    return np.asarray(a).view(np.uint32).tolist()


def fp16(*v) -> np.ndarray:
    return np.array(v, dtype=np.float16)


# --- hand-written examples ---------------------------------------------------------------


def test_sym_v1_word_and_values():
    """K = 8, N = 8, one group: q[n, k] = k, qzeros 0x77777777 (z = 7 + 1 = 8), s = 0.5."""
    p = GptqParams(bits=4, group_size=-1, sym=True, zero_convention=V1)
    t = GptqTensors(
        qweight=words(*[0x76543210] * 8).reshape(1, 8),
        qzeros=words(0x77777777).reshape(1, 1),
        scales=np.full((1, 8), 0.5, dtype=np.float16),
        g_idx=np.zeros(8, dtype=np.int32),
    )
    w = dequantize_gptq(t, p)
    assert w.dtype == np.float32 and w.shape == (8, 8)
    expect = [(k - 8) * 0.5 for k in range(8)]
    assert all(row == expect for row in w.tolist())
    # v2 reads the same field literally: z = 7
    w2 = dequantize_gptq(t, GptqParams(bits=4, group_size=-1, sym=True, zero_convention=V2))
    assert w2[0].tolist() == [(k - 7) * 0.5 for k in range(8)]


def test_quantize_sym_writes_0x77777777_in_v1_and_0x88888888_in_v2():
    w = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    for conv, word in ((V1, 0x77777777), (V2, 0x88888888)):
        t = quantize_gptq(w, GptqParams(bits=4, group_size=32, sym=True, zero_convention=conv))
        assert t.qzeros.shape == (2, 2)
        assert set(u32(t.qzeros.ravel())) == {word}
    t8 = quantize_gptq(w, GptqParams(bits=8, group_size=32, sym=True, zero_convention=V1))
    assert t8.qweight.shape == (16, 16) and t8.qzeros.shape == (2, 4)
    assert set(u32(t8.qzeros.ravel())) == {0x7F7F7F7F}  # z = 128, stored 127


def test_v1_field_f_reads_as_16():
    p = GptqParams(bits=4, group_size=-1, sym=False, zero_convention=V1)
    t = GptqTensors(
        qweight=words(*[0x00000000] * 8).reshape(1, 8),  # q = 0 everywhere
        qzeros=words(0x0000000F).reshape(1, 1),  # column 0: field 15; columns 1..7: field 0
        scales=np.full((1, 8), 1.0, dtype=np.float16),
    )
    codes = unpack_gptq(t, p)
    assert codes.zeros.tolist() == [[16, 1, 1, 1, 1, 1, 1, 1]]
    w = dequantize_gptq(t, p)  # W[n, k] = (0 - z[n]) * 1
    assert w[0].tolist() == [-16.0] * 8 and w[1].tolist() == [-1.0] * 8


def test_v1_read_variants_on_a_carry():
    """fields (slot 0..7) = F, 3, 0, 0, 0, 0, 0, F: word 0xF000003F."""
    p = GptqParams(bits=4, group_size=-1, sym=False, zero_convention=V1)
    t = GptqTensors(
        qweight=np.zeros((1, 8), dtype=np.int32),
        qzeros=words(0xF000003F).reshape(1, 1),
        scales=np.ones((1, 8), dtype=np.float16),
    )
    z = lambda read: unpack_gptq(t, p, zero_read=read).zeros[0].tolist()  # noqa: E731
    assert z(GptqZeroRead.CANONICAL) == [16, 4, 1, 1, 1, 1, 1, 16]
    # 0xF000003F + 0x11111111 = 0x01111150 (mod 2**32): slot 0 wraps to 0 and carries into slot 1
    assert z(GptqZeroRead.V1_PACKED_ADD) == [0, 5, 1, 1, 1, 1, 1, 0]
    assert z(GptqZeroRead.V1_WRAP) == [0, 4, 1, 1, 1, 1, 1, 0]
    assert z(GptqZeroRead.IGNORE_QZEROS) == [8] * 8


def test_v1_packed_add_8bit():
    p = GptqParams(bits=8, group_size=-1, sym=False, zero_convention=V1)
    t = GptqTensors(
        qweight=np.zeros((1, 4), dtype=np.int32),
        qzeros=words(0x00FF07FF).reshape(1, 1),
        scales=np.ones((1, 4), dtype=np.float16),
    )
    assert unpack_gptq(t, p).zeros[0].tolist() == [256, 8, 256, 1]
    # 0x00FF07FF + 0x01010101 = 0x02000900
    assert unpack_gptq(t, p, zero_read="v1_packed_add").zeros[0].tolist() == [0, 9, 0, 2]


ZEROS_WITH_0 = np.array([[3, 0, 5, 8, 1, 2, 15, 9]])


def _codes(zeros, bits=4):
    n = zeros.shape[1]
    return GptqCodes(
        q=np.zeros((n, 32 // bits), dtype=np.uint8),
        zeros=zeros,
        scales=np.ones((1, n), dtype=np.float16),
        g_idx=np.zeros(32 // bits, dtype=np.int32),
    )


def test_v1_zero_point_0_is_an_error_by_default():
    p = GptqParams(bits=4, group_size=-1, sym=False, zero_convention=V1)
    with pytest.raises(FormatError, match=r"^qzeros: zero point 0 at \[group 0, column 1\] is not representable in GPTQ v1"):
        pack_gptq(_codes(ZEROS_WITH_0), p)
    # v2 stores it literally: fields 3, 0, 5, 8, 1, 2, 15, 9
    t = pack_gptq(_codes(ZEROS_WITH_0), GptqParams(bits=4, group_size=-1, sym=False, zero_convention=V2))
    assert u32(t.qzeros) == [[0x9F218503]]


def test_v1_zero_point_0_write_variants():
    p = GptqParams(bits=4, group_size=-1, sym=False, zero_convention=V1)
    pack = lambda how: u32(pack_gptq(_codes(ZEROS_WITH_0), p, v1_zero_write=how).qzeros)[0][0]  # noqa: E731
    # fields z-1 = 2, -1, 4, 7, 0, 1, 14, 8
    assert pack(GptqV1ZeroWrite.FIELD_ALL_ONES) == 0x8E1074F2
    # AutoGPTQ: uint32(-1) << 4 = 0xFFFFFFF0 OR-ed in: slots 1..7 all become F
    assert pack(GptqV1ZeroWrite.AUTOGPTQ_OR) == 0xFFFFFFF2
    # GPTQModel: 0x9F218503 - 0x11111111 = 0x8E1073F2 (slot 1 borrows from slot 2)
    assert pack(GptqV1ZeroWrite.PACKED_SUB) == 0x8E1073F2


def test_packed_sub_round_trips_only_through_packed_add():
    p = GptqParams(bits=4, group_size=-1, sym=False, zero_convention=V1)
    t = pack_gptq(_codes(ZEROS_WITH_0), p, v1_zero_write="packed_sub")
    assert unpack_gptq(t, p, zero_read="v1_packed_add").zeros.tolist() == ZEROS_WITH_0.tolist()
    assert unpack_gptq(t, p).zeros.tolist() == [[3, 16, 4, 8, 1, 2, 15, 9]]


def test_autogptq_or_smears_8bit_too():
    p = GptqParams(bits=8, group_size=-1, sym=False, zero_convention=V1)
    t = pack_gptq(_codes(np.array([[5, 0, 7, 9]]), bits=8), p, v1_zero_write="autogptq_or")
    assert u32(t.qzeros) == [[0xFFFFFF04]]
    assert unpack_gptq(t, p).zeros.tolist() == [[5, 256, 256, 256]]


def test_act_order_indexes_scales_by_g_idx():
    """K = 16, G = 8: channel k uses row g_idx[k] of scales and qzeros."""
    p = GptqParams(bits=4, group_size=8, sym=False, desc_act=True, zero_convention=V2)
    g_idx = np.array([1, 0] * 8, dtype=np.int32)
    t = GptqTensors(
        qweight=words(0x11111111, 0x11111111).reshape(2, 1).repeat(8, axis=1),  # q = 1
        qzeros=words(0x00000000, 0x00000000).reshape(2, 1),  # z = 0 everywhere
        scales=np.array([[2.0] * 8, [3.0] * 8], dtype=np.float16),
        g_idx=g_idx,
    )
    assert dequantize_gptq(t, p)[0].tolist() == [3.0, 2.0] * 8


def test_from_config():
    p = GptqParams.from_config({"bits": 8, "group_size": 32, "desc_act": True, "sym": False, "checkpoint_format": "gptq_v2"})
    assert p == GptqParams(bits=8, group_size=32, sym=False, desc_act=True, zero_convention=V2)
    with pytest.raises(UnsupportedFormatError, match="checkpoint_format"):
        GptqParams.from_config({"checkpoint_format": "marlin"})
    with pytest.raises(UnsupportedFormatError, match="bits"):
        GptqParams(bits=3)


# --- properties ------------------------------------------------------------------------

params_st = st.builds(
    GptqParams,
    bits=st.sampled_from([4, 8]),
    group_size=st.sampled_from([-1, 32, 64, 128]),
    sym=st.booleans(),
    desc_act=st.booleans(),
    zero_convention=st.sampled_from([V1, V2]),
)


def _shape(data, p: GptqParams):
    n = data.draw(st.sampled_from([8, 16, 24]), label="N")
    if p.group_size == -1:
        k = data.draw(st.sampled_from([32, 64, 96]), label="K")
    else:
        k = p.group_size * data.draw(st.integers(1, 3), label="groups")
    return n, k


def _g_idx(rng, k, group, desc_act):
    g = np.arange(k) // group
    return (rng.permutation(g) if desc_act else g).astype(np.int32)


@settings(max_examples=40, deadline=None)
@given(p=params_st, data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_codes_round_trip(p, data, seed):
    rng = np.random.default_rng(seed)
    n, k = _shape(data, p)
    group = k if p.group_size == -1 else p.group_size
    zlo, zhi = (1, p.maxq + 1) if p.zero_convention is V1 else (0, p.maxq)
    codes = GptqCodes(
        q=rng.integers(0, p.maxq + 1, (n, k)).astype(np.uint8),
        zeros=rng.integers(zlo, zhi + 1, (k // group, n)).astype(np.int32),
        scales=(rng.random((k // group, n)) + 0.01).astype(np.float16),
        g_idx=_g_idx(rng, k, group, p.desc_act),
    )
    t = pack_gptq(codes, p)
    assert t.qweight.shape == (k * p.bits // 32, n) and t.qweight.dtype == np.int32
    assert t.qzeros.shape == (k // group, n * p.bits // 32) and t.qzeros.dtype == np.int32
    back = unpack_gptq(t, p)
    for f in ("q", "zeros", "scales", "g_idx"):
        np.testing.assert_array_equal(getattr(back, f), getattr(codes, f))
    # any int32 qzeros/qweight words survive unpack -> pack
    t2 = GptqTensors(
        qweight=rng.integers(-(2**31), 2**31, t.qweight.shape).astype(np.int32),
        qzeros=rng.integers(-(2**31), 2**31, t.qzeros.shape).astype(np.int32),
        scales=t.scales,
        g_idx=t.g_idx,
    )
    again = pack_gptq(unpack_gptq(t2, p), p)
    np.testing.assert_array_equal(again.qweight, t2.qweight)
    np.testing.assert_array_equal(again.qzeros, t2.qzeros)


def _check_rtn_bound(w, deq, q, z, s, maxq, unit_roundoff):
    """The documented bound of quantize_*: nearest grid point; |err| <= s/2 inside
    the half-extended grid range; |err| <= s * (1/2 + 2**bits * u) everywhere."""
    w = w.astype(np.float64)
    deq = deq.astype(np.float64)
    err = np.abs(w - deq)
    up = np.where(q < maxq, np.abs(w - (deq + s)), np.inf)
    down = np.where(q > 0, np.abs(w - (deq - s)), np.inf)
    assert np.all(err <= up) and np.all(err <= down), "not a nearest grid point"
    inside = (w >= (0 - z - 0.5) * s) & (w <= (maxq - z + 0.5) * s)
    assert np.all(err[inside] <= s[inside] / 2)
    assert np.all(err <= s * (0.5 + (maxq + 1) * unit_roundoff))


@settings(max_examples=30, deadline=None)
@given(p=params_st, data=st.data(), seed=st.integers(0, 2**32 - 1), wdtype=st.sampled_from(["float32", "float16"]))
def test_quantize_within_half_a_step(p, data, seed, wdtype):
    rng = np.random.default_rng(seed)
    n, k = _shape(data, p)
    group = k if p.group_size == -1 else p.group_size
    mag = 10.0 ** rng.uniform(-2, 2)
    w = (rng.standard_normal((n, k)) * mag).astype(wdtype)
    if data.draw(st.booleans(), label="some zeros"):
        w[:, :: 5] = 0
    g_idx = _g_idx(rng, k, group, p.desc_act)
    t = quantize_gptq(w, p, g_idx)
    deq = dequantize_gptq(t, p)
    c = unpack_gptq(t, p)
    s = c.scales.astype(np.float64)[c.g_idx, :].T
    z = c.zeros[c.g_idx, :].T
    _check_rtn_bound(w, deq, c.q.astype(np.int64), z, s, p.maxq, 2.0**-11)
    if p.sym:
        assert np.all(c.zeros == p.sym_zero)


@settings(max_examples=25, deadline=None)
@given(
    bits=st.sampled_from([4, 8]),
    group_size=st.sampled_from([32, 64]),
    sym=st.booleans(),
    conv=st.sampled_from([V1, V2]),
    seed=st.integers(0, 2**32 - 1),
)
def test_desc_act_equals_sorted_equivalent(bits, group_size, sym, conv, seed):
    """Act-order with a random g_idx == the same codes sorted by g_idx with g_idx = k // G
    (what vLLM's sort_weights + marlin do)."""
    rng = np.random.default_rng(seed)
    n, k = 16, group_size * 3
    w = rng.standard_normal((n, k)).astype(np.float32)
    g_idx = rng.permutation(np.arange(k) // group_size).astype(np.int32)
    p_act = GptqParams(bits=bits, group_size=group_size, sym=sym, desc_act=True, zero_convention=conv)
    t = quantize_gptq(w, p_act, g_idx)
    deq_act = dequantize_gptq(t, p_act)
    c = unpack_gptq(t, p_act)
    perm = np.argsort(g_idx, kind="stable")
    p_plain = GptqParams(bits=bits, group_size=group_size, sym=sym, desc_act=False, zero_convention=conv)
    sorted_codes = GptqCodes(q=c.q[:, perm], zeros=c.zeros, scales=c.scales, g_idx=g_idx[perm])
    deq_sorted = dequantize_gptq(pack_gptq(sorted_codes, p_plain), p_plain)
    np.testing.assert_array_equal(deq_act[:, perm].view(np.uint32), deq_sorted.view(np.uint32))
    # and quantizing the sorted weights directly gives the same tensors
    t_sorted = quantize_gptq(w[:, perm], p_plain)
    np.testing.assert_array_equal(dequantize_gptq(t_sorted, p_plain), deq_sorted)


# --- variants are not aliases -------------------------------------------------------------


def _asym_v1_tensors(seed=0):
    rng = np.random.default_rng(seed)
    p = GptqParams(bits=4, group_size=32, sym=False, zero_convention=V1)
    zeros = rng.integers(1, 16, (2, 16)).astype(np.int32)
    zeros[0, 3] = 16  # field 0xF: the v1 edge every read variant handles differently
    codes = GptqCodes(
        q=rng.integers(0, 16, (16, 64)).astype(np.uint8),
        zeros=zeros,
        scales=(rng.random((2, 16)) + 0.01).astype(np.float16),
        g_idx=(np.arange(64) // 32).astype(np.int32),
    )
    return p, pack_gptq(codes, p)


@pytest.mark.parametrize(
    "variant",
    [
        dict(zero_read=GptqZeroRead.V1_PACKED_ADD),
        dict(zero_read=GptqZeroRead.V1_WRAP),
        dict(zero_read=GptqZeroRead.IGNORE_QZEROS),
        dict(order="mul_then_sub", compute_dtype="float16"),
        dict(scale_dtype="bfloat16"),
        dict(compute_dtype="float16"),
        dict(compute_dtype="bfloat16"),
    ],
    ids=lambda v: "-".join(str(getattr(x, "value", x)) for x in v.values()),
)
def test_each_read_variant_differs_from_canonical(variant):
    p, t = _asym_v1_tensors()
    arithmetic = dict(variant)
    read = arithmetic.pop("zero_read", GptqZeroRead.CANONICAL)
    assert np.any(dequantize_gptq(t, p, zero_read=read, variant=DequantVariant(**arithmetic)) != dequantize_gptq(t, p))


def test_v2_differs_from_v1_on_the_same_tensors():
    p, t = _asym_v1_tensors()
    p2 = GptqParams(bits=4, group_size=32, sym=False, zero_convention=V2)
    assert np.any(dequantize_gptq(t, p2) != dequantize_gptq(t, p))


def test_v1_only_variants_refuse_v2():
    p2 = GptqParams(bits=4, group_size=32, sym=False, zero_convention=V2)
    _, t = _asym_v1_tensors()
    with pytest.raises(UnsupportedFormatError, match="v1"):
        dequantize_gptq(t, p2, zero_read="v1_wrap")


def test_ignore_qzeros_agrees_with_canonical_on_a_true_sym_checkpoint():
    w = np.random.default_rng(3).standard_normal((8, 64)).astype(np.float32)
    p = GptqParams(bits=4, group_size=32, sym=True)
    t = quantize_gptq(w, p)
    np.testing.assert_array_equal(dequantize_gptq(t, p, zero_read="ignore_qzeros"), dequantize_gptq(t, p))


# --- errors -----------------------------------------------------------------------------


def _good(p=None):
    p = p or GptqParams(bits=4, group_size=64, sym=False, zero_convention=V2)
    w = np.random.default_rng(5).standard_normal((64, 128)).astype(np.float32)
    return p, quantize_gptq(w, p)


def _replace(t, **kw):
    d = dict(qweight=t.qweight, qzeros=t.qzeros, scales=t.scales, g_idx=t.g_idx)
    d.update(kw)
    return GptqTensors(**d)


@pytest.mark.parametrize(
    "change, pattern",
    [
        (dict(qweight=np.zeros((16, 63), dtype=np.int32)), r"^qweight: expected shape \[K/8, N\] = \[16, 64\], got \[16, 63\]$"),
        (dict(qweight=np.zeros((16, 64), dtype=np.int64)), r"^qweight: expected dtype int32, got int64$"),
        (dict(qzeros=np.zeros((2, 9), dtype=np.int32)), r"^qzeros: expected shape \[K/G, N/8\] = \[2, 8\], got \[2, 9\]$"),
        (dict(qzeros=np.zeros((2, 8), dtype=np.uint32)), r"^qzeros: expected dtype int32, got uint32$"),
        (dict(scales=np.ones((2, 64), dtype=np.float32)), r"^scales: expected dtype float16 or bfloat16, got float32$"),
        (dict(scales=np.ones((2, 63), dtype=np.float16)), r"^scales: expected shape \[K/G, N\] = \[2, 64\], got \[2, 63\]$"),
        (dict(scales=np.ones((1, 64), dtype=np.float16)), r"^scales: expected shape \[K/G, N\] = \[2, 64\], got \[1, 64\]$"),
        (dict(g_idx=np.zeros(100, dtype=np.int32)), r"^g_idx: expected shape \[K\] = \[128\], got \[100\]$"),
        (dict(g_idx=np.zeros(128, dtype=np.int64)), r"^g_idx: expected dtype int32, got int64$"),
    ],
)
def test_malformed_tensors(change, pattern):
    p, t = _good()
    with pytest.raises(FormatError, match=pattern):
        dequantize_gptq(_replace(t, **change), p, shape=(64, 128))


def test_shape_is_inferred_from_scales_and_g_idx():
    p, t = _good()
    with pytest.raises(FormatError, match=r"^qweight: expected shape \[K/8, N\] = \[16, 64\], got \[16, 63\]$"):
        dequantize_gptq(_replace(t, qweight=np.zeros((16, 63), dtype=np.int32)), p)
    with pytest.raises(FormatError, match=r"^qweight: expected shape \[K/8, N\] = \[12, 64\], got \[16, 64\]$"):
        dequantize_gptq(_replace(t, g_idx=(np.arange(96) // 64).astype(np.int32)), GptqParams(bits=4, group_size=32, sym=False, zero_convention=V2))


def test_bad_scales_values():
    p, t = _good()
    s = t.scales.copy()
    s[1, 3] = np.nan
    with pytest.raises(FormatError, match=r"^scales: scale nan at index \[1, 3\] is not finite"):
        dequantize_gptq(_replace(t, scales=s), p)
    s = t.scales.copy()
    s[0, 5] = np.inf
    with pytest.raises(FormatError, match=r"^scales: scale inf at index \[0, 5\] is not finite"):
        dequantize_gptq(_replace(t, scales=s), p)
    # negative scales are valid (auto-round sym writes them): used as stored, negating the group
    s = t.scales.copy()
    s[0, :] = -s[0, :]
    neg = dequantize_gptq(_replace(t, scales=s), p)
    pos = dequantize_gptq(t, p)
    g0 = np.nonzero(t.g_idx == 0)[0]
    np.testing.assert_array_equal(neg[:, g0], -pos[:, g0])


def test_bad_g_idx_values():
    p, t = _good()
    g = t.g_idx.copy()
    g[7] = 2
    with pytest.raises(FormatError, match=r"^g_idx: group index 2 at index \[7\] is out of range \[0, 1\]"):
        dequantize_gptq(_replace(t, g_idx=g), p)
    g = t.g_idx.copy()
    g[5] = 1
    with pytest.raises(FormatError, match=r"^g_idx: desc_act=False requires g_idx\[k\] == k // group_size \(64\); g_idx\[5\] = 1, expected 0$"):
        dequantize_gptq(_replace(t, g_idx=g), p)


def test_group_and_pack_divisibility():
    p = GptqParams(bits=4, group_size=64, sym=False, zero_convention=V2)
    _, t = _good()
    with pytest.raises(FormatError, match=r"^scales: K = 96 is not a multiple of group_size 64$"):
        unpack_gptq(t, p, shape=(64, 96))
    codes = GptqCodes(
        q=np.zeros((8, 100), dtype=np.uint8), zeros=np.zeros((1, 8), dtype=np.int32),
        scales=np.ones((1, 8), dtype=np.float16), g_idx=np.zeros(100, dtype=np.int32),
    )
    with pytest.raises(FormatError, match=r"^qweight: K = 100 is not a multiple of 8 \(4-bit fields per int32\)$"):
        pack_gptq(codes, GptqParams(bits=4, group_size=-1, zero_convention=V2))
    codes = GptqCodes(
        q=np.zeros((12, 8), dtype=np.uint8), zeros=np.zeros((1, 12), dtype=np.int32),
        scales=np.ones((1, 12), dtype=np.float16), g_idx=np.zeros(8, dtype=np.int32),
    )
    with pytest.raises(FormatError, match=r"^qzeros: N = 12 is not a multiple of 8"):
        pack_gptq(codes, GptqParams(bits=4, group_size=-1, zero_convention=V2))


def test_codes_out_of_range():
    p = GptqParams(bits=4, group_size=-1, sym=False, zero_convention=V2)
    c = _codes(np.array([[3, 16, 5, 8, 1, 2, 15, 9]]))
    with pytest.raises(FormatError, match=r"^qzeros: zero point \(gptq_v2 stores z\) 16 at index \[0, 1\] is out of range \[0, 15\]"):
        pack_gptq(c, p)
    c = _codes(np.array([[3, 17, 5, 8, 1, 2, 15, 9]]))
    with pytest.raises(FormatError, match=r"^qzeros: zero point \(gptq v1 stores z - 1\) 17 .* out of range \[0, 16\]"):
        pack_gptq(c, GptqParams(bits=4, group_size=-1, sym=False, zero_convention=V1))
    c = _codes(np.array([[3, 1, 5, 8, 1, 2, 15, 9]]))
    q = c.q.copy()
    q[2, 4] = 16
    with pytest.raises(FormatError, match=r"^q: code 16 at index \[2, 4\] is out of range \[0, 15\]"):
        pack_gptq(GptqCodes(q=q, zeros=c.zeros, scales=c.scales, g_idx=c.g_idx), p)


def test_layer_name_prefixes_the_message():
    p, t = _good()
    with pytest.raises(FormatError, match=r"^model\.layers\.0\.mlp\.down_proj\.qweight: expected dtype int32") as e:
        dequantize_gptq(_replace(t, qweight=t.qweight.astype(np.int64)), p, layer="model.layers.0.mlp.down_proj")
    assert e.value.layer == "model.layers.0.mlp.down_proj" and e.value.tensor == "qweight"


def test_quantize_rejects_bad_weights():
    p = GptqParams(bits=4, group_size=32)
    w = np.zeros((8, 64), dtype=np.float32)
    w[1, 2] = np.nan
    with pytest.raises(FormatError, match=r"^w: weight nan at index \[1, 2\] is not finite"):
        quantize_gptq(w, p)
    with pytest.raises(FormatError, match=r"^w: expected dtype float16 or bfloat16 or float32, got float64"):
        quantize_gptq(np.zeros((8, 64)), p)
    with pytest.raises(FormatError, match=r"^scales: scale .* is not representable as a positive finite float16"):
        quantize_gptq(np.full((8, 64), 1e30, dtype=np.float32), p)
