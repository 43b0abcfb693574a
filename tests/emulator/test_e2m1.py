"""FP4 E2M1 codes, rounding, NaN rules and nibble packing against independent oracles.

Oracles:
- ml_dtypes ``float4_e2m1fn`` (decode of every code; RNE encode from float32; its NaN rule);
- the ONNX reference evaluator (Cast FLOAT -> FLOAT4E2M1) and ONNX's own 4-bit packing
  (``numpy_helper.from_array`` / ``to_array``, ``helper.make_tensor``);
- torchao's ``f32_to_f4_unpacked`` / ``pack_uint4`` when torchao imports (optional);
- ``grid_oracle``: nearest-value search over the hand-written OCP value table with each mode's
  tie rule, in Fractions (no bit manipulation, nothing shared with the emulator);
- torch ``float4_e2m1fn_x2`` where torch can convert (2.13 CPU cannot: skipped with the reason).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.numerics.e2m1 import E2M1_VALUES, E2M1NanRule, E2M1ZeroSign, decode_e2m1, encode_e2m1, pack_e2m1, unpack_e2m1
from emulator.numerics.rounding import Rounding

ml_dtypes = pytest.importorskip("ml_dtypes")
F4 = ml_dtypes.float4_e2m1fn

# OCP MX v1.0 §5.3.3 value table, code = s<<3 | e<<1 | m (written out by hand)
OCP_TABLE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
GRID = [Fraction(v) for v in OCP_TABLE[:8]]
MIDPOINTS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


def grid_oracle(x: float, mode: Rounding) -> int:
    """E2M1 code of x: saturate at 6, nearest grid value, ties by the mode's rule."""
    neg = bool(np.signbit(x))
    a = abs(Fraction(x)) if np.isfinite(x) else Fraction(100)
    if a >= 6:
        idx = 7
    else:
        hi = next(i for i, g in enumerate(GRID) if g >= a)
        lo = hi if GRID[hi] == a else hi - 1
        if mode is Rounding.RTZ or lo == hi:
            idx = lo
        else:
            dlo, dhi = a - GRID[lo], GRID[hi] - a
            if dlo != dhi:
                idx = lo if dlo < dhi else hi
            elif mode is Rounding.RNE:
                idx = lo if lo % 2 == 0 else hi  # even code = mantissa bit 0
            elif mode is Rounding.RHAZ:
                idx = hi
            else:  # RHTZ
                idx = lo
    return idx | (8 if neg else 0)


def _ml_codes(x) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(x).astype(F4).view(np.uint8)


def dense_sweep() -> np.ndarray:
    """float32 sweep: whole positive range coarsely, [0.125, 8] densely, every midpoint +-3 ulps."""
    coarse = np.arange(0, 0x7F800001, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    fine = np.arange(0x3E000000, 0x41000001, 257, dtype=np.uint64).astype(np.uint32).view(np.float32)
    pts = np.array(MIDPOINTS + OCP_TABLE[:8] + [8.0, 12.0, 0.125, 1e-45, 3.4e38], dtype=np.float32)
    near = [pts]
    for _ in range(3):
        near.append(np.nextafter(near[-1], np.float32(np.inf)))
    lo = [pts]
    for _ in range(3):
        lo.append(np.nextafter(lo[-1], np.float32(0)))
    pos = np.concatenate([coarse, fine, *near, *lo, np.array([np.inf], np.float32)])
    return np.concatenate([pos, -pos])


SWEEP = dense_sweep()


# --------------------------------------------------------------------------- decode

def test_value_table():
    assert E2M1_VALUES.dtype == np.float32
    assert E2M1_VALUES.tolist() == OCP_TABLE
    assert np.signbit(E2M1_VALUES[8]) and not np.signbit(E2M1_VALUES[0])


def test_decode_every_code_vs_ml_dtypes():
    codes = np.arange(16, dtype=np.uint8)
    want = codes.view(F4).astype(np.float32)
    got = decode_e2m1(codes)
    assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want))
    assert decode_e2m1(codes.astype(np.int64)).tolist() == OCP_TABLE
    with pytest.raises(ValueError):
        decode_e2m1(np.array([16]))
    with pytest.raises(TypeError):
        decode_e2m1(np.array([1.0]))


def test_decode_vs_torch_float4_e2m1fn_x2():
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("torch has no float4_e2m1fn_x2 dtype")
    packed = torch.from_numpy(pack_e2m1(np.arange(16, dtype=np.uint8)))
    try:
        vals = packed.view(torch.float4_e2m1fn_x2).to(torch.float32)
    except (NotImplementedError, RuntimeError) as e:
        pytest.skip(f"torch {torch.__version__} cannot convert float4_e2m1fn_x2 on CPU: {e}")
    # a torch that can convert must give element 0 from the low nibble (Float4_e2m1fn_x2.h: "val1 : val0")
    assert vals.numel() == 16, f"unexpected element count {vals.numel()} from float4_e2m1fn_x2 -> float32"
    assert vals.flatten().tolist() == OCP_TABLE


# --------------------------------------------------------------------------- encode, RNE

def test_encode_rne_dense_sweep_vs_ml_dtypes():
    got = encode_e2m1(SWEEP, Rounding.RNE)
    assert np.array_equal(got, _ml_codes(SWEEP))


def test_encode_rne_vs_onnx_reference_cast():
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT4E2M1)
    graph = helper.make_graph([node], "cast_fp4",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT4E2M1, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFA00000], np.uint32).view(np.float32)
    x = np.concatenate([SWEEP[::7], nans])
    with np.errstate(invalid="ignore"):
        y = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = encode_e2m1(x, Rounding.RNE, nan=E2M1NanRule.ZERO_SIGN_FLIPPED)
    assert np.array_equal(got, np.asarray(y).view(np.uint8))


def test_midpoint_ties_all_modes_table():
    # research notes §1.2/§8.3, re-derived by grid_oracle
    table = {
        Rounding.RNE: [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0],
        Rounding.RHAZ: [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0],
        Rounding.RHTZ: [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0],
        Rounding.RTZ: [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0],
    }
    for mode, want in table.items():
        for sign in (1.0, -1.0):
            x = np.array(MIDPOINTS) * sign
            got = decode_e2m1(encode_e2m1(x, mode))
            assert got.tolist() == [sign * w for w in want], mode
            assert [OCP_TABLE[grid_oracle(v, mode)] for v in x.tolist()] == [sign * w for w in want]
    # RNE ties agree with ml_dtypes
    assert _ml_codes(np.array(MIDPOINTS, np.float32)).tolist() == encode_e2m1(np.array(MIDPOINTS)).tolist()


@pytest.mark.parametrize("mode", list(Rounding))
def test_encode_all_modes_vs_grid_oracle(mode):
    rng = np.random.default_rng(7)
    x = np.concatenate([
        SWEEP[(SWEEP > -9) & (SWEEP < 9)][::37],
        rng.uniform(-7, 7, 2000),
        np.array([-0.0, 0.0, 1e-300, -1e-300, 6.0000001, -5.999999, np.inf, -np.inf, 1e300]),
        np.array(MIDPOINTS), -np.array(MIDPOINTS),  # float64 ties and their float64 neighbours
        np.nextafter(np.array(MIDPOINTS), np.inf), np.nextafter(np.array(MIDPOINTS), 0),
        -np.nextafter(np.array(MIDPOINTS), np.inf), -np.nextafter(np.array(MIDPOINTS), 0),
    ])
    got = encode_e2m1(x, mode)
    want = np.array([grid_oracle(v, mode) for v in x.tolist()], dtype=np.uint8)
    assert np.array_equal(got, want)


@settings(deadline=None, database=None)
@given(st.floats(width=32, allow_nan=False))
def test_encode_rne_hypothesis_vs_ml_dtypes(x):
    a = np.array([x], np.float32)
    assert encode_e2m1(a)[0] == _ml_codes(a)[0] == grid_oracle(x, Rounding.RNE)


@settings(deadline=None, database=None)
@given(st.floats(allow_nan=False), st.sampled_from(list(Rounding)))
def test_encode_float64_hypothesis_vs_grid_oracle(x, mode):
    assert encode_e2m1(np.array([x]), mode)[0] == grid_oracle(x, mode)


def test_ml_dtypes_float64_input_double_rounds_through_float32():
    """Documented divergence: ml_dtypes converts float64 -> float4 through float32."""
    x = np.array([0.25 + 2.0**-40, -(2.5 + 2.0**-40), 5.0 + 2.0**-40])
    assert encode_e2m1(x).tolist() == [1, 13, 7]  # exact: just above each tie -> away from zero
    assert _ml_codes(x).tolist() == [0, 12, 6]  # ml_dtypes: fp32 rounds onto the tie, then ties-to-even
    assert np.array_equal(_ml_codes(x), encode_e2m1(x.astype(np.float32)))


def test_negative_zero_and_small_negatives_keep_sign():
    x = np.array([-0.0, -0.1, -0.25, 0.0, 0.1])
    assert encode_e2m1(x).tolist() == [8, 8, 8, 0, 0]
    assert _ml_codes(x.astype(np.float32)).tolist() == [8, 8, 8, 0, 0]


def test_zero_sign_positive_differs_from_canonical_only_on_negative_zero():
    """E2M1ZeroSign.POSITIVE (vllm-xpu-kernels: sign = x < 0): -0 -> code 0; values rounding to 0 keep code 8."""
    x = np.array([-0.0, -0.1, -0.25, 0.0, 0.1, -1.0, -7.0, -np.inf])
    keep = encode_e2m1(x)
    pos = encode_e2m1(x, zero_sign=E2M1ZeroSign.POSITIVE)
    assert keep.tolist() == [8, 8, 8, 0, 0, 10, 15, 15]
    assert pos.tolist() == [0, 8, 8, 0, 0, 10, 15, 15]
    assert (keep != pos).tolist() == [True] + [False] * 7
    assert encode_e2m1(x, zero_sign="keep").tolist() == keep.tolist()
    assert np.array_equal(decode_e2m1(keep), decode_e2m1(pos))  # the codes decode alike
    with pytest.raises(ValueError):
        encode_e2m1(x, zero_sign="negative")


# --------------------------------------------------------------------------- NaN rules

NANS = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF], np.uint32).view(np.float32)


def test_nan_rules():
    neg = np.signbit(NANS)
    assert encode_e2m1(NANS, nan=E2M1NanRule.SATURATE).tolist() == [15 if n else 7 for n in neg]
    assert encode_e2m1(NANS, nan=E2M1NanRule.SATURATE_POSITIVE).tolist() == [7] * len(NANS)
    assert encode_e2m1(NANS, nan="saturate_positive").tolist() != encode_e2m1(NANS, nan="saturate").tolist()
    assert encode_e2m1(NANS, nan=E2M1NanRule.ZERO_SIGNED).tolist() == [8 if n else 0 for n in neg]
    assert encode_e2m1(NANS, nan=E2M1NanRule.ZERO).tolist() == [0] * len(NANS)
    assert encode_e2m1(NANS, nan="zero_sign_flipped").tolist() == [0 if n else 8 for n in neg]
    with pytest.raises(ValueError, match="NaN"):
        encode_e2m1(NANS)  # RAISE is the default
    with pytest.raises(ValueError):
        encode_e2m1(NANS, nan="bogus")


def test_nan_rule_zero_sign_flipped_equals_ml_dtypes():
    x64 = np.array([0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001], np.uint64).view(np.float64)
    for x in (NANS, x64):
        assert np.array_equal(encode_e2m1(x, nan=E2M1NanRule.ZERO_SIGN_FLIPPED), _ml_codes(x))


def test_infinities_saturate_like_ml_dtypes():
    x = np.array([np.inf, -np.inf, 1e38, -1e38], np.float32)
    assert encode_e2m1(x).tolist() == [7, 15, 7, 15] == _ml_codes(x).tolist()


# --------------------------------------------------------------------------- torchao (optional)

def test_encode_and_pack_vs_torchao():
    torch = pytest.importorskip("torch")
    kernels = pytest.importorskip("torchao.prototype.mx_formats.kernels")
    x = SWEEP[np.abs(SWEEP) < 1e30]
    x = x[: len(x) // 2 * 2]
    ta = kernels.f32_to_f4_unpacked(torch.from_numpy(x.copy())).numpy()
    codes = encode_e2m1(x)
    assert np.array_equal(codes, ta)
    two_d = codes.reshape(-1, 2)
    assert np.array_equal(pack_e2m1(two_d), kernels.pack_uint4(torch.from_numpy(two_d.copy())).numpy())
    # Documented divergence: torchao's bit path turns NaN into code 3 / 11 (+-1.5)
    tn = kernels.f32_to_f4_unpacked(torch.from_numpy(np.array([np.nan, -np.nan], np.float32))).numpy()
    assert tn.tolist() == [3, 11]


# --------------------------------------------------------------------------- packing

def test_pack_layout_low_nibble_first():
    codes = np.array([0x1, 0x7, 0xA, 0x0, 0xF, 0x8], np.uint8)
    assert pack_e2m1(codes).tolist() == [0x71, 0x0A, 0x8F]
    assert np.array_equal(unpack_e2m1(pack_e2m1(codes)), codes)


def test_pack_vs_onnx_numpy_helper_and_make_tensor():
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    for n in (2, 32, 64, 1000):
        codes = rng.integers(0, 16, n).astype(np.uint8)
        as_f4 = codes.view(F4)
        t = numpy_helper.from_array(as_f4, "w")
        assert t.data_type == TensorProto.FLOAT4E2M1
        assert t.raw_data == pack_e2m1(codes).tobytes()
        back = numpy_helper.to_array(t)
        assert np.array_equal(back.view(np.uint8), codes)
        mt = helper.make_tensor("w", TensorProto.FLOAT4E2M1, [n], as_f4)
        assert list(mt.int32_data) == pack_e2m1(codes).astype(np.int32).tolist()
    # research note example: fp4 [0.5, 6, -1] -> 71 0a (odd count: ONNX pads the last high nibble with 0)
    t = numpy_helper.from_array(np.array([0.5, 6, -1], np.float32).astype(F4), "w")
    assert t.raw_data.hex() == "710a"
    assert t.raw_data == pack_e2m1(np.array([1, 7, 10, 0], np.uint8)).tobytes()
    with pytest.raises(ValueError, match="odd"):
        pack_e2m1(np.array([1, 7, 10], np.uint8))  # qconform refuses odd counts instead of padding


def test_pack_unpack_axes_and_errors():
    rng = np.random.default_rng(5)
    c = rng.integers(0, 16, (4, 6, 8)).astype(np.uint8)
    for axis in (0, 1, 2, -1):
        p = pack_e2m1(c, axis=axis)
        assert p.shape[axis] == c.shape[axis] // 2
        assert np.array_equal(unpack_e2m1(p, axis=axis), c)
        moved = np.moveaxis(c, axis, -1)
        assert np.array_equal(np.moveaxis(p, axis, -1), moved[..., 0::2] | (moved[..., 1::2] << 4))
    with pytest.raises(ValueError):
        pack_e2m1(np.array([16, 0], np.uint8))
    with pytest.raises(TypeError):
        unpack_e2m1(np.array([1, 2], np.int32))
