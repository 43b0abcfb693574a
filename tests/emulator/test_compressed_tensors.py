"""compressed-tensors pack-quantized / int-quantized (emulator/formats/compressed_tensors.py):
hand-written layouts, round trips, RTN bound and errors. The library itself is
the oracle in test_int_oracles.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.errors import FormatError, UnsupportedFormatError
from emulator.formats.compressed_tensors import (
    CtCodes,
    CtInt8Tensors,
    CtPackedTensors,
    CtPackParams,
    CtStrategy,
    dequantize_ct_int8,
    dequantize_ct_packed,
    pack_ct_packed,
    quantize_ct_int8,
    quantize_ct_packed,
    unpack_ct_packed,
)
from emulator.formats.int_common import DequantVariant


def u32(a) -> list:
    return np.asarray(a).view(np.uint32).tolist()


def words(*hex_words) -> np.ndarray:
    return np.array(hex_words, dtype=np.uint32).view(np.int32)


# --- hand-written layouts --------------------------------------------------------------


def test_sym_4bit_stores_q_plus_8():
    """q = -8..-1 (K = 8, N = 1) -> fields 0..7 -> 0x76543210; W = q * 2."""
    p = CtPackParams(num_bits=4, strategy="channel", group_size=None, symmetric=True)
    codes = CtCodes(q=np.arange(-8, 0, dtype=np.int8).reshape(1, 8), scales=np.array([[2.0]], dtype=np.float16))
    t = pack_ct_packed(codes, p)
    assert u32(t.weight_packed) == [[0x76543210]]
    assert t.weight_shape.tolist() == [1, 8] and t.weight_shape.dtype == np.int64
    assert dequantize_ct_packed(t, p).tolist() == [[2.0 * q for q in range(-8, 0)]]


def test_sym_8bit_stores_q_plus_128():
    p = CtPackParams(num_bits=8, strategy="channel", group_size=None, symmetric=True)
    codes = CtCodes(q=np.array([[-128, -1, 0, 127]], dtype=np.int8), scales=np.array([[0.5]], dtype=np.float32))
    t = pack_ct_packed(codes, p)
    assert u32(t.weight_packed) == [[0xFF807F00]]
    assert dequantize_ct_packed(t, p).tolist() == [[-64.0, -0.5, 0.0, 63.5]]


def test_asym_zero_point_packed_along_n_with_offset():
    """zp (signed) per row n = -8, -1, 0, 7, 3, -3, 1, 2 -> fields 0, 7, 8, 15, 11, 5, 9, 10
    packed along N: 0xA95BF870 in weight_zero_point [1, 1]."""
    p = CtPackParams(num_bits=4, strategy="channel", group_size=None, symmetric=False)
    zp = np.array([-8, -1, 0, 7, 3, -3, 1, 2], dtype=np.int8).reshape(8, 1)
    q = np.full((8, 8), 7, dtype=np.int8)
    t = pack_ct_packed(CtCodes(q=q, scales=np.ones((8, 1), dtype=np.float16), zero_point=zp), p)
    assert u32(t.weight_zero_point) == [[0xA95BF870]]
    assert t.weight_zero_point.shape == (1, 1)
    assert dequantize_ct_packed(t, p)[:, 0].tolist() == [15.0, 8.0, 7.0, 0.0, 4.0, 10.0, 6.0, 5.0]


def test_k_not_a_multiple_of_8_is_padded_with_zero_fields():
    """channel strategy, K = 10: two words per row, the last 6 fields of word 1 are 0."""
    p = CtPackParams(num_bits=4, strategy="channel", group_size=None, symmetric=True)
    q = np.array([[7, -8, 0, 0, 0, 0, 0, 0, 1, 2]], dtype=np.int8)
    t = pack_ct_packed(CtCodes(q=q, scales=np.ones((1, 1), dtype=np.float16)), p)
    assert u32(t.weight_packed) == [[0x8888880F, 0x000000A9]]
    np.testing.assert_array_equal(unpack_ct_packed(t, p).q, q)


def test_group_strategy_and_g_idx():
    """K = 16, G = 8, actorder: weight_g_idx maps channel k to column g_idx[k] of weight_scale."""
    p = CtPackParams(num_bits=4, strategy="group", group_size=8, symmetric=True, actorder=True)
    g = np.array([1, 0] * 8, dtype=np.int32)
    t = CtPackedTensors(
        weight_packed=words(0x99999999, 0x99999999).reshape(1, 2),  # q = 1
        weight_scale=np.array([[2.0, 3.0]], dtype=np.float32),
        weight_shape=np.array([1, 16], dtype=np.int64),
        weight_g_idx=g,
    )
    assert dequantize_ct_packed(t, p).tolist() == [[3.0, 2.0] * 8]
    # without actorder the same map must be the identity
    with pytest.raises(FormatError, match=r"^weight_g_idx: desc_act=False requires"):
        dequantize_ct_packed(t, CtPackParams(num_bits=4, strategy="group", group_size=8))


def test_int8_hand_example():
    t = CtInt8Tensors(weight=np.array([[-128, 0, 127], [1, -1, 2]], dtype=np.int8), weight_scale=np.array([[0.5], [0.25]], dtype=np.float16))
    assert dequantize_ct_int8(t).tolist() == [[-64.0, 0.0, 63.5], [0.25, -0.25, 0.5]]
    t1 = CtInt8Tensors(weight=t.weight, weight_scale=np.array([2.0], dtype=np.float32))  # tensor strategy
    assert dequantize_ct_int8(t1).tolist() == [[-256.0, 0.0, 254.0], [2.0, -2.0, 4.0]]


def test_from_config():
    p = CtPackParams.from_config({"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 128, "actorder": "group"})
    assert p == CtPackParams(num_bits=4, strategy=CtStrategy.GROUP, group_size=128, symmetric=False, actorder=True)
    with pytest.raises(UnsupportedFormatError, match="type 'int'"):
        CtPackParams.from_config({"num_bits": 4, "type": "float"})
    with pytest.raises(UnsupportedFormatError, match="num_bits"):
        CtPackParams(num_bits=3)


# --- properties ------------------------------------------------------------------------

params_st = st.one_of(
    st.builds(CtPackParams, num_bits=st.sampled_from([4, 8]), strategy=st.just("group"),
              group_size=st.sampled_from([32, 64, 128]), symmetric=st.booleans()),
    st.builds(CtPackParams, num_bits=st.sampled_from([4, 8]), strategy=st.just("channel"),
              group_size=st.none(), symmetric=st.booleans()),
)


def _shape(data, p):
    n = data.draw(st.sampled_from([1, 5, 8, 16]), label="N")
    if p.strategy is CtStrategy.CHANNEL:
        return n, data.draw(st.sampled_from([8, 10, 33, 64]), label="K")
    return n, p.group_size * data.draw(st.integers(1, 3), label="groups")


@settings(max_examples=40, deadline=None)
@given(p=params_st, data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_round_trip(p, data, seed):
    rng = np.random.default_rng(seed)
    n, k = _shape(data, p)
    ng = 1 if p.strategy is CtStrategy.CHANNEL else k // p.group_size
    codes = CtCodes(
        q=rng.integers(p.qmin, p.qmax + 1, (n, k)).astype(np.int8),
        scales=(rng.random((n, ng)) + 0.01).astype(np.float32),
        zero_point=None if p.symmetric else rng.integers(p.qmin, p.qmax + 1, (n, ng)).astype(np.int8),
    )
    t = pack_ct_packed(codes, p)
    f = 32 // p.num_bits
    assert t.weight_packed.shape == (n, -(-k // f))
    if not p.symmetric:
        assert t.weight_zero_point.shape == (-(-n // f), ng)
    back = unpack_ct_packed(t, p)
    np.testing.assert_array_equal(back.q, codes.q)
    np.testing.assert_array_equal(back.scales, codes.scales)
    if not p.symmetric:
        np.testing.assert_array_equal(back.zero_point, codes.zero_point)


@settings(max_examples=30, deadline=None)
@given(p=params_st, data=st.data(), seed=st.integers(0, 2**32 - 1), wdtype=st.sampled_from(["float32", "float16", "bfloat16"]))
def test_quantize_within_half_a_step(p, data, seed, wdtype):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(seed)
    n, k = _shape(data, p)
    w = (rng.standard_normal((n, k)) * 10.0 ** rng.uniform(-2, 2)).astype(np.float32)
    if data.draw(st.booleans(), label="all positive"):
        w = np.abs(w)
    w = w.astype(ml_dtypes.bfloat16) if wdtype == "bfloat16" else w.astype(wdtype)
    t = quantize_ct_packed(w, p)
    assert t.weight_scale.dtype.name == wdtype  # scales default to the weight's dtype
    c = unpack_ct_packed(t, p)
    ng = c.scales.shape[1]
    g = np.arange(k) // (k // ng)
    s = c.scales.astype(np.float64)[:, g]
    z = np.zeros_like(s) if c.zero_point is None else c.zero_point.astype(np.int64)[:, g]
    q = c.q.astype(np.int64)
    # the grid value of each code, exact in float64 (the bound is about the codes the
    # quantizer picks; with float32 scales dequantize_* rounds this once more to float32)
    deq = (q - z) * s
    np.testing.assert_array_equal(dequantize_ct_packed(t, p), deq.astype(np.float32))
    w64 = w.astype(np.float64)
    err = np.abs(w64 - deq)
    assert np.all(err <= np.where(q < p.qmax, np.abs(w64 - (deq + s)), np.inf))
    assert np.all(err <= np.where(q > p.qmin, np.abs(w64 - (deq - s)), np.inf))
    inside = (w64 >= (p.qmin - z - 0.5) * s) & (w64 <= (p.qmax - z + 0.5) * s)
    assert np.all(err[inside] <= s[inside] / 2)
    u = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}[wdtype]
    assert np.all(err <= s * (0.5 + 2**p.num_bits * u))


def test_zero_group_gets_eps_scale():
    """compressed-tensors replaces a zero scale with finfo(scale dtype).eps."""
    w = np.zeros((2, 64), dtype=np.float16)
    t = quantize_ct_packed(w, CtPackParams(num_bits=4, group_size=32))
    assert t.weight_scale.tolist() == [[2.0**-10] * 2] * 2
    assert np.all(dequantize_ct_packed(t, CtPackParams(num_bits=4, group_size=32)) == 0)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 8), k=st.integers(1, 40))
def test_int8_quantize_bound(seed, n, k):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * 10.0 ** rng.uniform(-2, 2)).astype(np.float32)
    t = quantize_ct_int8(w)
    assert t.weight.dtype == np.int8 and t.weight_scale.shape == (n, 1) and t.weight_scale.dtype == np.float32
    s = t.weight_scale.astype(np.float64)
    err = np.abs(w.astype(np.float64) - t.weight.astype(np.float64) * s)  # exact grid values
    # amax / s = 127.5 (exactly, up to scale rounding): only +amax sits outside [-128.5, 127.5]
    assert np.all(err <= s * (0.5 + 256 * 2.0**-24))


@pytest.mark.parametrize(
    "variant",
    [dict(order="mul_then_sub"), dict(compute_dtype="bfloat16"), dict(scale_dtype="bfloat16")],
)
def test_variants_differ_with_float32_scales(variant):
    w = np.random.default_rng(4).standard_normal((16, 64)).astype(np.float32)
    p = CtPackParams(num_bits=4, group_size=32, symmetric=False)
    t = quantize_ct_packed(w, p)
    assert t.weight_scale.dtype == np.float32
    assert np.any(dequantize_ct_packed(t, p, variant=DequantVariant(**variant)) != dequantize_ct_packed(t, p))


# --- errors -----------------------------------------------------------------------------


def _good(symmetric=False):
    p = CtPackParams(num_bits=4, strategy="group", group_size=32, symmetric=symmetric)
    w = np.random.default_rng(6).standard_normal((16, 64)).astype(np.float16)
    return p, quantize_ct_packed(w, p)


def _replace(t, **kw):
    d = dict(
        weight_packed=t.weight_packed, weight_scale=t.weight_scale, weight_shape=t.weight_shape,
        weight_zero_point=t.weight_zero_point, weight_g_idx=t.weight_g_idx,
    )
    d.update(kw)
    return CtPackedTensors(**d)


@pytest.mark.parametrize(
    "change, pattern",
    [
        (dict(weight_packed=np.zeros((16, 7), dtype=np.int32)), r"^weight_packed: expected shape \[N, ceil\(K/8\)\] = \[16, 8\], got \[16, 7\]$"),
        (dict(weight_packed=np.zeros((16, 8), dtype=np.uint8)), r"^weight_packed: expected dtype int32, got uint8$"),
        (dict(weight_shape=np.array([16, 64, 1])), r"^weight_shape: expected shape \[2\] = \[2\], got \[3\]$"),
        (dict(weight_shape=np.array([16.0, 64.0])), r"^weight_shape: expected dtype int64 or int32, got float64$"),
        (dict(weight_shape=np.array([16, 96])), r"^weight_packed: expected shape \[N, ceil\(K/8\)\] = \[16, 12\], got \[16, 8\]$"),
        (dict(weight_shape=np.array([16, 40])), r"^weight_shape: K = 40 is not a multiple of group_size 32$"),
        (dict(weight_scale=np.ones((16, 3), dtype=np.float16)), r"^weight_scale: expected shape \[N, K/G\] = \[16, 2\], got \[16, 3\]$"),
        (dict(weight_scale=np.ones((16, 2), dtype=np.int32)), r"^weight_scale: expected dtype float16 or bfloat16 or float32, got int32$"),
        (dict(weight_zero_point=None), r"^weight_zero_point: missing: an asymmetric scheme needs it$"),
        (dict(weight_zero_point=np.zeros((16, 2), dtype=np.int32)), r"^weight_zero_point: expected shape \[ceil\(N/8\), K/G\] = \[2, 2\], got \[16, 2\]$"),
        (dict(weight_g_idx=np.zeros(60, dtype=np.int32)), r"^weight_g_idx: expected shape \[K\] = \[64\], got \[60\]$"),
    ],
)
def test_malformed_asym(change, pattern):
    p, t = _good()
    with pytest.raises(FormatError, match=pattern):
        dequantize_ct_packed(_replace(t, **change), p)


def test_sym_with_zero_point_is_an_error():
    p, t = _good(symmetric=True)
    with pytest.raises(FormatError, match=r"^l3\.weight_zero_point: present, but the scheme is symmetric"):
        dequantize_ct_packed(_replace(t, weight_zero_point=np.zeros((2, 2), dtype=np.int32)), p, layer="l3")


def test_scale_values():
    p, t = _good()
    s = t.weight_scale.copy()
    s[3, 1] = np.inf
    with pytest.raises(FormatError, match=r"^weight_scale: scale inf at index \[3, 1\] is not finite"):
        dequantize_ct_packed(_replace(t, weight_scale=s), p)
    # negative scales are valid (int_common.check_scales): used as stored, negating the group
    s = t.weight_scale.copy()
    s[3, 1] = -s[3, 1]
    neg = dequantize_ct_packed(_replace(t, weight_scale=s), p)
    pos = dequantize_ct_packed(t, p)
    np.testing.assert_array_equal(neg[3, 32:], -pos[3, 32:])
    np.testing.assert_array_equal(neg[:3], pos[:3])


def test_codes_out_of_range():
    p = CtPackParams(num_bits=4, strategy="channel", group_size=None, symmetric=False)
    q = np.zeros((8, 8), dtype=np.int8)
    q[1, 2] = 8
    with pytest.raises(FormatError, match=r"^q: code 8 at index \[1, 2\] is out of range \[-8, 7\]"):
        pack_ct_packed(CtCodes(q=q, scales=np.ones((8, 1), dtype=np.float16), zero_point=np.zeros((8, 1), dtype=np.int8)), p)
    zp = np.zeros((8, 1), dtype=np.int8)
    zp[5, 0] = -9
    with pytest.raises(FormatError, match=r"^weight_zero_point: zero point -9 at index \[5, 0\] is out of range \[-8, 7\]"):
        pack_ct_packed(CtCodes(q=np.zeros((8, 8), dtype=np.int8), scales=np.ones((8, 1), dtype=np.float16), zero_point=zp), p)


def test_int8_errors():
    ok = CtInt8Tensors(weight=np.zeros((4, 8), dtype=np.int8), weight_scale=np.ones((4, 1), dtype=np.float32))
    with pytest.raises(FormatError, match=r"^weight: expected dtype int8, got int16$"):
        dequantize_ct_int8(CtInt8Tensors(weight=ok.weight.astype(np.int16), weight_scale=ok.weight_scale))
    with pytest.raises(FormatError, match=r"^weight_scale: expected shape \[N, 1\] = \[4, 1\] \(channel\) or \[1\] \(tensor\), got \[1, 4\]$"):
        dequantize_ct_int8(CtInt8Tensors(weight=ok.weight, weight_scale=np.ones((1, 4), dtype=np.float32)))
    with pytest.raises(FormatError, match=r"^weight_scale: scale nan at index \[2, 0\] is not finite"):
        s = ok.weight_scale.copy()
        s[2, 0] = np.nan
        dequantize_ct_int8(CtInt8Tensors(weight=ok.weight, weight_scale=s))
