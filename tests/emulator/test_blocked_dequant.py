"""The fast dequantizers and the reference functions equal an element-by-element reading of the checkpoint.

The fast dequantizers (``dequantize_gptq`` / ``_awq`` / ``_ct_packed``) unpack codes inside
cache-sized row blocks on several threads (emulator/parallel.py, fast_dequant.CodeRows); the
reference functions (``dequantize_*_reference``) are the readable specification. Every test
here forces tiny blocks and more threads than rows per block, so block edges, uneven thread
spans and AWQ's 8-row alignment are all crossed, and compares *both* with an oracle written
from the format definitions (docs/formats/gptq.md, awq.md, compressed-tensors.md): each field
read as ``(word >> bits * slot) & mask`` by index arithmetic, and ``(q - z) * s`` under the
drawn named variant computed by variant_oracle.affine_oracle (exact float64 intermediates,
each rounding a numpy / ml_dtypes cast; no emulator code).
"""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from variant_oracle import affine_oracle, same_bits

import emulator.parallel as par
from emulator.formats import awq, gptq
from emulator.formats import compressed_tensors as ct
from emulator.formats.fast_unpack import unpack_int32_transposed
from emulator.formats.int_common import DequantVariant, default_g_idx
from emulator.formats.mxfp4 import dequantize_mxfp4_ct, dequantize_mxfp4_gptoss
from emulator.formats.packing import unpack_int32

#: canonical, or any named variant whose roundings the oracle computes (RNE and RTZ)
VARIANTS = st.one_of(st.just({}), st.fixed_dictionaries({
    "order": st.sampled_from(["sub_then_mul", "mul_then_sub", "float_zero"]),
    "scale_dtype": st.sampled_from([None, "float16", "bfloat16", "float32"]),
    "compute_dtype": st.sampled_from(["float32", "float16", "bfloat16"]),
    "compute_rounding": st.sampled_from(["rne", "rtz"]),
    "zero_dtype": st.sampled_from([None, "float16", "bfloat16", "float32"]),
}))


@pytest.fixture(autouse=True)
def tiny_blocks(monkeypatch):
    monkeypatch.setattr(par, "BLOCK_BYTES", 200)  # one row per block (8 for AWQ's alignment)
    monkeypatch.setattr(par, "MIN_ELEMENTS", 0)  # always threaded
    monkeypatch.setattr(par, "row_threads", lambda: 3)  # three uneven spans


def _field(words: np.ndarray, slot, bits: int) -> np.ndarray:
    return ((words.astype(np.int64) & 0xFFFFFFFF) >> (bits * np.asarray(slot, np.int64))) & ((1 << bits) - 1)


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False  # checkpoint tensors are inputs: a dequantizer writing into them raises
    return a


def _random_words(rng, shape) -> np.ndarray:
    return _read_only(rng.integers(-(2 ** 31), 2 ** 31, shape, dtype=np.int64).astype(np.int32))


def _laid_out(words: np.ndarray, layout: str) -> np.ndarray:
    """The same words row-major ("C", as loaded), column-major ("F", as quantize_gptq's transposed view)
    or as a strided view (every other column of a wider array): the unpackers take their fast paths by
    memory layout, and every layout must give the same fields."""
    if layout == "F":
        return _read_only(np.asfortranarray(words))
    if layout == "strided":
        wide = np.zeros((words.shape[0], 2 * words.shape[1]), words.dtype)
        wide[:, ::2] = words
        return _read_only(wide)[:, ::2]
    return words


def _random_scales(rng, shape, dtype) -> np.ndarray:
    s = rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 8, shape)
    s[rng.random(shape) < 0.1] = 0.0  # zero scales: +-0 results
    return _read_only(s.astype(dtype))


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return same_bits(a, b)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), bits=st.sampled_from([4, 8]), n8=st.integers(1, 5),
       groups=st.integers(1, 4), words_per_group=st.integers(1, 2), act_order=st.booleans(), v2=st.booleans(),
       sym=st.booleans(), scale_dtype=st.sampled_from([np.float16, ml_dtypes.bfloat16]), variant=VARIANTS,
       layout=st.sampled_from(["C", "F", "strided"]))
def test_gptq_equals_element_reading(seed, bits, n8, groups, words_per_group, act_order, v2, sym, scale_dtype, variant,
                                     layout):
    rng = np.random.default_rng(seed)
    f = 32 // bits
    n, group = 8 * n8, f * words_per_group
    k = group * groups
    qweight = _laid_out(_random_words(rng, (k // f, n)), layout)
    qzeros = _random_words(rng, (groups, n // f))
    scales = _random_scales(rng, (groups, n), scale_dtype)
    g = rng.permutation(default_g_idx(k, group)).astype(np.int32) if act_order else None
    p = gptq.GptqParams(bits=bits, group_size=group, sym=sym, desc_act=act_order,
                        zero_convention="gptq_v2" if v2 else "gptq")
    t = gptq.GptqTensors(qweight, qzeros, scales, g)
    fast = gptq.dequantize_gptq(t, p, shape=(n, k), variant=DequantVariant(**variant))
    ref = gptq.dequantize_gptq_reference(t, p, shape=(n, k), variant=DequantVariant(**variant))

    kk, nn = np.arange(k), np.arange(n)
    q = _field(qweight[kk // f, :], (kk % f)[:, None], bits).T  # [N, K]
    zfield = _field(qzeros[:, nn // f], (nn % f)[None, :], bits)  # [G, N]
    z = zfield if v2 else zfield + 1  # v1 stores z - 1 (docs/formats/gptq.md#zero-points)
    gi = default_g_idx(k, group) if g is None else g
    expect = affine_oracle(q, z[gi, :].T, scales[gi, :].T, midpoint=1 << (bits - 1), **variant)
    assert _same(ref, expect) and _same(fast, expect)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), n8=st.integers(1, 6), groups=st.integers(1, 4),
       group=st.sampled_from([8, 16, 32]), variant=VARIANTS)
def test_awq_equals_element_reading(seed, n8, groups, group, variant):
    rng = np.random.default_rng(seed)
    n, k = 8 * n8, group * groups
    qweight = _random_words(rng, (k, n // 8))
    qzeros = _random_words(rng, (groups, n // 8))
    scales = _random_scales(rng, (groups, n), np.float16)
    t, p = awq.AwqTensors(qweight, qzeros, scales), awq.AwqParams(bits=4, group_size=group)
    fast = awq.dequantize_awq(t, p, shape=(n, k), variant=DequantVariant(**variant))
    ref = awq.dequantize_awq_reference(t, p, shape=(n, k), variant=DequantVariant(**variant))
    # AutoAWQ's order_map (0, 2, 4, 6, 1, 3, 5, 7): slot s of a word holds column 8j + order[s]
    slot_of = np.argsort(np.array([0, 2, 4, 6, 1, 3, 5, 7]))
    nn = np.arange(n)
    q = _field(qweight[:, nn // 8], slot_of[nn % 8][None, :], 4).T  # [N, K]
    z = _field(qzeros[:, nn // 8], slot_of[nn % 8][None, :], 4)  # [G, N]
    gi = default_g_idx(k, group)
    expect = affine_oracle(q, z[gi, :].T, scales[gi, :].T, midpoint=8, **variant)
    assert _same(ref, expect) and _same(fast, expect)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), bits=st.sampled_from([4, 8]), n=st.integers(1, 20),
       groups=st.integers(1, 3), group=st.sampled_from([4, 12, 16, 32]), sym=st.booleans(),
       channel=st.booleans(), act_order=st.booleans(),
       scale_dtype=st.sampled_from([np.float16, ml_dtypes.bfloat16, np.float32]), variant=VARIANTS)
def test_ct_pack_quantized_equals_element_reading(seed, bits, n, groups, group, sym, channel, act_order, scale_dtype,
                                                  variant):
    rng = np.random.default_rng(seed)
    f, offset = 32 // bits, 1 << (bits - 1)
    k = group * groups  # K need not be a multiple of 8: the last word is padded
    n_groups = 1 if channel else groups
    act_order = act_order and not channel
    packed = _random_words(rng, (n, -(-k // f)))
    scales = _random_scales(rng, (n, n_groups), scale_dtype)
    zpp = None if sym else _random_words(rng, (-(-n // f), n_groups))
    g = rng.permutation(default_g_idx(k, k // n_groups)).astype(np.int32) if act_order else None
    p = ct.CtPackParams(num_bits=bits, strategy="channel" if channel else "group", group_size=None if channel else group,
                        symmetric=sym, actorder=act_order)
    t = ct.CtPackedTensors(packed, scales, np.array([n, k], np.int64), zpp, g)
    fast = ct.dequantize_ct_packed(t, p, variant=DequantVariant(**variant))
    ref = ct.dequantize_ct_packed_reference(t, p, variant=DequantVariant(**variant))

    kk, nn = np.arange(k), np.arange(n)
    q = _field(packed[:, kk // f], (kk % f)[None, :], bits) - offset  # [N, K] signed codes
    z = np.zeros((n, n_groups), np.int64) if sym else _field(zpp[nn // f, :], (nn % f)[:, None], bits) - offset
    gi = default_g_idx(k, k // n_groups) if g is None else g
    expect = affine_oracle(q, z[:, gi], scales[:, gi], midpoint=0, **variant)
    assert _same(ref, expect) and _same(fast, expect)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), bits=st.sampled_from([2, 4, 8]), a=st.integers(1, 9), b=st.integers(1, 9),
       axis=st.sampled_from([0, 1]), awq_order=st.booleans(), layout=st.sampled_from(["C", "F", "strided"]))
def test_transposed_unpack_equals_unpack_then_transpose(seed, bits, a, b, axis, awq_order, layout):
    rng = np.random.default_rng(seed)
    order = (0, 2, 4, 6, 1, 3, 5, 7) if awq_order and bits == 4 else None
    words = _laid_out(_random_words(rng, (a, b)), layout)
    expect = unpack_int32(words, bits, axis=axis, order=order).T
    got = unpack_int32_transposed(words, bits, axis=axis, order=order)
    assert got.flags.c_contiguous and np.array_equal(got, expect)


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
@pytest.mark.parametrize("n_rows,align", [(1, 1), (7, 1), (64, 8), (61, 8), (1000, 1)])
def test_row_blocks_cover_every_row_once_on_aligned_boundaries(monkeypatch, threads, n_rows, align):
    monkeypatch.setattr(par, "row_threads", lambda: threads)
    seen = []
    par.for_row_chunks(n_rows, n_rows * 50, lambda r0, r1: seen.append((r0, r1)), row_bytes=64, align=align)
    covered = np.zeros(n_rows, np.int64)
    for r0, r1 in seen:
        assert r0 < r1 and r0 % align == 0
        covered[r0:r1] += 1
    assert (covered == 1).all()


def _gptq_case(rng, n=32, k=64):
    p = gptq.GptqParams(bits=4, group_size=32, sym=False, zero_convention="gptq_v2")
    t = gptq.GptqTensors(_random_words(rng, (k // 8, n)), _random_words(rng, (k // 32, n // 8)),
                         _random_scales(rng, (k // 32, n), np.float16), None)
    return t, p, (n, k)


def test_out_receives_the_weight_and_is_returned():
    rng = np.random.default_rng(0)
    t, p, shape = _gptq_case(rng)
    buf = np.full(shape, np.nan, np.float32)
    got = gptq.dequantize_gptq(t, p, shape=shape, out=buf)
    assert got is buf and _same(buf, gptq.dequantize_gptq(t, p, shape=shape))


@pytest.mark.parametrize("bad,message", [
    (np.zeros((32, 64), np.float64), "dtype float64"),
    (np.zeros((64, 32), np.float32), "shape [64, 32]"),
    (np.zeros((64, 32), np.float32).T, "not C-contiguous"),
    ("read-only", "read-only"),
    ([[0.0] * 64] * 32, "expected a numpy.ndarray"),
])
def test_bad_out_is_named(bad, message):
    rng = np.random.default_rng(1)
    t, p, shape = _gptq_case(rng)
    if isinstance(bad, str):
        bad = np.zeros(shape, np.float32)
        bad.flags.writeable = False
    with pytest.raises(ValueError, match="out: .*" + message.replace("[", r"\[").replace("]", r"\]")):
        gptq.dequantize_gptq(t, p, shape=shape, out=bad)


def test_awq_ct_and_mxfp4_write_into_out():
    rng = np.random.default_rng(2)
    n, k = 16, 64
    at = awq.AwqTensors(_random_words(rng, (k, n // 8)), _random_words(rng, (2, n // 8)),
                        _random_scales(rng, (2, n), np.float16))
    ap = awq.AwqParams(bits=4, group_size=32)
    buf = np.empty((n, k), np.float32)
    assert awq.dequantize_awq(at, ap, out=buf) is buf and _same(buf, awq.dequantize_awq(at, ap))
    ctt = ct.CtPackedTensors(_random_words(rng, (n, k // 8)), _random_scales(rng, (n, 2), np.float16),
                             np.array([n, k], np.int64))
    cp = ct.CtPackParams(num_bits=4, group_size=32)
    assert ct.dequantize_ct_packed(ctt, cp, out=buf) is buf and _same(buf, ct.dequantize_ct_packed(ctt, cp))
    mx = {"weight_packed": rng.integers(0, 256, (n, k // 2), dtype=np.uint8),
          "weight_scale": rng.integers(0, 256, (n, k // 32), dtype=np.uint8)}
    got = dequantize_mxfp4_ct(mx, out=buf)
    ref = dequantize_mxfp4_ct(mx, dtype=np.float64).astype(np.float32)
    assert got is buf and _same(buf, ref)  # NaN (scale 0xFF) and -0 (code 8) included, bit for bit
    with pytest.raises(ValueError, match=r"out: shape \[16, 64\] \(expected \[2, 16, 64\]\)"):
        dequantize_mxfp4_gptoss(rng.integers(0, 256, (2, n, k // 32, 16), dtype=np.uint8),
                                rng.integers(0, 256, (2, n, k // 32), dtype=np.uint8), out=buf)
    with pytest.raises(ValueError, match="only float32"):
        dequantize_mxfp4_ct(mx, dtype=np.float64, out=buf)


@pytest.mark.parametrize("zeros", ["all 0", "all 5", "all 15", "per group"])
@pytest.mark.parametrize("act_order", [False, True])
def test_grouped_zeros_constant_or_per_group_equal_the_oracle(zeros, act_order):
    """One zero for the whole layer is subtracted as a scalar (fast_dequant._FastPlan); the bits must be
    those of the elementwise oracle, as for per-group zeros."""
    from emulator.formats.fast_dequant import dequantize_grouped

    rng = np.random.default_rng(17)
    n, k, group = 24, 96, 32
    q = _read_only(rng.integers(0, 16, (n, k)).astype(np.uint8))
    z = {"all 0": np.zeros((n, k // group), np.int32), "all 5": np.full((n, k // group), 5, np.int32),
         "all 15": np.full((n, k // group), 15, np.int32),
         "per group": rng.integers(0, 16, (n, k // group)).astype(np.int32)}[zeros]
    s = _random_scales(rng, (n, k // group), np.float16)
    g = rng.permutation(default_g_idx(k, group)).astype(np.int32) if act_order else None
    gi = default_g_idx(k, group) if g is None else g
    got = dequantize_grouped(q, _read_only(z), s, g, code_range=(0, 15))
    assert _same(got, affine_oracle(q, z[:, gi], s[:, gi], midpoint=0))
