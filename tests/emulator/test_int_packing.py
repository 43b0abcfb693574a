"""LSB-first int32 packing (emulator/formats/packing.py) and the shared
dequantization rule (emulator/formats/int_common.py).

Expected words are written out by hand from the documented layouts; the
dequantization rule is checked against exact rational arithmetic and against
torch's own fp16/bf16 arithmetic (the formulas of vLLM's reference).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.errors import FormatError
from emulator.formats.int_common import ComputeDtype, DequantOrder, DequantVariant, dequantize_affine
from emulator.formats.packing import inverse_order, pack_int32, unpack_int32

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def u32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.int32).view(np.uint32)


# --- hand-written layouts --------------------------------------------------------------


def test_4bit_element_8j_plus_i_in_nibble_i_of_word_j():
    vals = np.array([1, 2, 3, 4, 5, 6, 7, 8, 15, 0, 0, 0, 0, 0, 0, 9])
    words = pack_int32(vals, 4, axis=0)
    assert words.dtype == np.int32
    assert u32(words).tolist() == [0x87654321, 0x9000000F]


def test_8bit_four_per_word():
    words = pack_int32(np.array([1, 2, 3, 4, 0xFF, 0, 0x80, 0x7F]), 8)
    assert u32(words).tolist() == [0x04030201, 0x7F8000FF]


def test_2bit_sixteen_per_word():
    vals = np.array([3] + [0] * 14 + [2])
    assert u32(pack_int32(vals, 2)).tolist() == [0x80000003]


def test_top_field_makes_the_int32_negative():
    words = pack_int32(np.array([0] * 7 + [8]), 4)
    assert words.tolist() == [-(2**31)]


def test_awq_slot_order():
    # slot s holds element order[s]: nibbles (slot 0..7) = 0, 2, 4, 6, 1, 3, 5, 7
    words = pack_int32(np.arange(8), 4, order=AWQ_ORDER)
    assert u32(words).tolist() == [0x75316420]
    assert unpack_int32(words, 4, order=AWQ_ORDER).tolist() == list(range(8))
    assert inverse_order(AWQ_ORDER) == (0, 4, 1, 5, 2, 6, 3, 7)


def test_pack_along_axis_1():
    vals = np.array([[1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 0, 0, 0, 0, 0, 1]])
    assert u32(pack_int32(vals, 4, axis=1)).tolist() == [[0x87654321], [0x10000000]]
    assert u32(pack_int32(vals.T, 4, axis=0)).tolist() == [[0x87654321, 0x10000000]]


# --- round trip --------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    bits=st.sampled_from([2, 4, 8]),
    rows=st.integers(1, 5),
    words=st.integers(1, 4),
    axis=st.sampled_from([0, 1]),
    use_order=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_round_trip(bits, rows, words, axis, use_order, seed):
    rng = np.random.default_rng(seed)
    per = 32 // bits
    shape = (words * per, rows) if axis == 0 else (rows, words * per)
    vals = rng.integers(0, 2**bits, shape)
    order = tuple(rng.permutation(per)) if use_order else None
    packed = pack_int32(vals, bits, axis=axis, order=order)
    assert packed.dtype == np.int32
    assert packed.shape[axis] == words
    back = unpack_int32(packed, bits, axis=axis, order=order)
    assert back.dtype == np.uint8
    np.testing.assert_array_equal(back, vals)
    # and every int32 word survives unpack -> pack
    again = pack_int32(back, bits, axis=axis, order=order)
    np.testing.assert_array_equal(again, packed)


# --- errors ------------------------------------------------------------------------


def test_pack_rejects_out_of_range_values():
    with pytest.raises(FormatError, match=r"^qweight: 4-bit value 16 at index \[3\] is out of range \[0, 15\]"):
        pack_int32(np.array([0, 1, 2, 16, 0, 0, 0, 0]), 4, tensor="qweight")
    with pytest.raises(FormatError, match=r"4-bit value -1 .* out of range"):
        pack_int32(np.array([-1, 0, 0, 0, 0, 0, 0, 0]), 4)


def test_pack_rejects_ragged_axis_and_floats():
    with pytest.raises(FormatError, match=r"^layer0\.q: length 12 of axis 0 .* not a multiple of 8"):
        pack_int32(np.zeros(12, dtype=np.int32), 4, tensor="q", layer="layer0")
    with pytest.raises(FormatError, match=r"q: expected an integer array, got dtype float32"):
        pack_int32(np.zeros(8, dtype=np.float32), 4, tensor="q")


def test_unpack_requires_int32():
    with pytest.raises(FormatError, match=r"^qzeros: expected dtype int32, got int64"):
        unpack_int32(np.zeros((2, 2), dtype=np.int64), 4, tensor="qzeros")


def test_bad_order_is_a_programming_error():
    with pytest.raises(ValueError, match="permutation"):
        pack_int32(np.zeros(8, dtype=np.int32), 4, order=(0, 1, 2, 3, 4, 5, 6, 6))


# --- the dequantization rule -------------------------------------------------------


def _exact(q, z, s) -> list:
    return [Fraction(int(qi) - int(zi)) * Fraction(float(si)) for qi, zi, si in zip(q.ravel(), z.ravel(), s.ravel())]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), scale_dtype=st.sampled_from(["float16", "bfloat16"]), bits=st.sampled_from([4, 8]))
def test_canonical_is_exact_for_16_bit_scales(seed, scale_dtype, bits):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 2**bits, 64)
    z = rng.integers(0, 2**bits + 1, 64)  # v1 reads up to 2**bits
    bits16 = rng.integers(0, 0x7C00, 64).astype(np.uint16)  # any finite non-negative fp16 pattern
    s = bits16.view(np.float16)
    if scale_dtype == "bfloat16":
        s = rng.integers(0, 0x7F80, 64).astype(np.uint16).view(ml_dtypes.bfloat16)
    out = dequantize_affine(q, z, s)
    assert out.dtype == np.float32
    overflow = Fraction(2**128 - 2**103)  # float32 max + half an ulp: RNE rounds to Inf from here
    for g, e in zip(out.tolist(), _exact(q, z, s)):
        if abs(e) >= overflow:  # only a bfloat16 scale above ~2**128 / 256 gets here (documented)
            assert g == (float("inf") if e > 0 else float("-inf"))
        else:
            assert Fraction(g) == e, (g, e)


def test_canonical_rounds_once_for_float32_scales():
    s = np.array([1 + 2**-23, 3 * (1 + 2**-22)], dtype=np.float32)
    q, z = np.array([7, 255]), np.array([0, 0])
    out = dequantize_affine(q, z, s)
    # 7 * (1 + 2**-23) = 7 + 7 * 2**-23; the float32 spacing in [4, 8) is 2**-21,
    # and 7 * 2**-23 = 1.75 spacings, which rounds to 2 spacings
    assert out[0] == np.float32(7 + 2**-20)
    exact1 = Fraction(255) * Fraction(float(s[1]))
    assert abs(Fraction(float(out[1])) - exact1) <= Fraction(2) ** (7 + 2 - 24)  # half an ulp at 765


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(["float16", "bfloat16"]),
    order=st.sampled_from(list(DequantOrder)),
)
def test_compute_dtype_matches_torch_arithmetic(seed, dtype, order):
    """vLLM's reference formulas evaluated by torch in fp16/bf16 are the variants."""
    torch = pytest.importorskip("torch")
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 16, 256)
    z = rng.integers(0, 17, 256)
    s = (rng.random(256) * 0.5 + 1e-3).astype(np.float32)
    s_t = torch.from_numpy(s).to(tdt)  # scales live in the compute dtype
    qt, zt = torch.from_numpy(q), torch.from_numpy(z)
    if order is DequantOrder.SUB_THEN_MUL:
        ref = (qt - zt).to(tdt) * s_t
    elif order is DequantOrder.MUL_THEN_SUB:  # quant_utils.quantize_weights(ref_zero_points_after_scales=True)
        ref = qt.to(tdt) * s_t - zt.to(tdt) * s_t
    else:  # tinygemm: zero stored in the dtype, then one fused multiply-add (exact in fp32 here) rounded once
        zero = ((8 - zt).float() * s_t.float()).to(tdt)
        ref = ((qt - 8).float() * s_t.float() + zero.float()).to(tdt)
    s_np = s_t.float().numpy()  # the scales as stored in that dtype
    out = dequantize_affine(q, z, s_np, midpoint=8, variant=DequantVariant(order=order, compute_dtype=dtype))
    np.testing.assert_array_equal(out.view(np.uint32), ref.float().numpy().view(np.uint32))


def _find_difference(fn_a, fn_b, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 16, 4096)
    z = rng.integers(0, 17, 4096)
    s = rng.integers(0x0400, 0x3C00, 4096).astype(np.uint16).view(np.float16)  # normal fp16 scales < 1
    return np.flatnonzero(fn_a(q, z, s).view(np.uint32) != fn_b(q, z, s).view(np.uint32)).size


def test_mul_then_sub_equals_canonical_with_16_bit_scales_in_fp32():
    """Documented: the order only matters with a 16-bit compute dtype or fp32 scales."""
    same = _find_difference(dequantize_affine, lambda q, z, s: dequantize_affine(q, z, s, variant=DequantVariant(order="mul_then_sub")))
    assert same == 0


@pytest.mark.parametrize(
    "variant",
    [
        dict(order=DequantOrder.MUL_THEN_SUB, compute_dtype=ComputeDtype.FLOAT16),
        dict(order=DequantOrder.MUL_THEN_SUB, compute_dtype=ComputeDtype.BFLOAT16),
        dict(compute_dtype=ComputeDtype.FLOAT16),
        dict(compute_dtype=ComputeDtype.BFLOAT16),
        dict(scale_dtype=ComputeDtype.BFLOAT16),
    ],
    ids=lambda v: "-".join(str(x.value) for x in v.values()),
)
def test_every_arithmetic_variant_differs_from_canonical(variant):
    assert _find_difference(dequantize_affine, lambda q, z, s: dequantize_affine(q, z, s, variant=DequantVariant(**variant))) > 0


def test_mul_then_sub_differs_from_sub_then_mul_at_fp16():
    a = lambda q, z, s: dequantize_affine(q, z, s, variant=DequantVariant(compute_dtype="float16"))  # noqa: E731
    b = lambda q, z, s: dequantize_affine(q, z, s, variant=DequantVariant(order="mul_then_sub", compute_dtype="float16"))  # noqa: E731
    assert _find_difference(a, b) > 0


def test_mul_then_sub_differs_with_float32_scales():
    s = np.array([1 + 2**-23], dtype=np.float32)
    q, z = np.array([3]), np.array([1])
    # canonical: 2 * s = 2 + 2**-22, exact (spacing in [2, 4) is 2**-22).
    # MUL_THEN_SUB: 3s = 3 + 1.5 spacings -> tie, to even: 3 + 2 spacings = 3 + 2**-21;
    # z*s = s exactly; 3 + 2**-21 - (1 + 2**-23) = 2 + 1.5 spacings -> tie, to even: 2 + 2**-21.
    assert dequantize_affine(q, z, s)[0] == np.float32(2 + 2**-22)
    assert dequantize_affine(q, z, s, variant=DequantVariant(order="mul_then_sub"))[0] == np.float32(2 + 2**-21)


def test_zero_scale_gives_signed_zero():
    out = dequantize_affine(np.array([3, 8, 9]), np.array([8, 8, 8]), np.zeros(3, dtype=np.float16))
    assert out.tolist() == [0.0, 0.0, 0.0]
    assert np.signbit(out).tolist() == [True, False, False]
