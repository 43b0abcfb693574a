"""Independent oracles for the integer weight formats.

- compressed-tensors' own ``pack_to_int32`` / ``unpack_from_int32``, its
  ``PackedQuantizationCompressor.decompress`` (pack-quantized) and
  ``IntQuantizationCompressor.decompress`` (int-quantized), and its
  ``quantize`` (the rounding rule), bit for bit;
- the ONNX reference evaluator's ``DequantizeLinear`` (opset 21/23, blocked
  int4/uint4/int8/uint8 with ``block_size`` along K), bit for bit, on integer
  codes generated here, not by the emulator.

Each dequantization is checked twice: the fast path (``dequantize_*``) and the
specification (``dequantize_*_reference``).

torch / compressed_tensors / onnx are imported only here, and each test skips
when its oracle is missing.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.formats.awq import (
    AwqCodes,
    AwqParams,
    dequantize_awq,
    dequantize_awq_reference,
    pack_awq,
)
from emulator.formats.compressed_tensors import (
    CtCodes,
    CtInt8Tensors,
    CtPackedTensors,
    CtPackParams,
    dequantize_ct_int8,
    dequantize_ct_int8_reference,
    dequantize_ct_packed,
    dequantize_ct_packed_reference,
    pack_ct_packed,
    unpack_ct_packed,
)
from emulator.formats.gptq import (
    GptqCodes,
    GptqParams,
    dequantize_gptq,
    dequantize_gptq_reference,
    pack_gptq,
)
from emulator.formats.int_common import DequantVariant, ZeroConvention, rtn_codes


def _torch():
    return pytest.importorskip("torch")


def _ct_helpers():
    _torch()
    mod = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    return mod.pack_to_int32, mod.unpack_from_int32


def _scale_array(rng, shape, dtype):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    s = (rng.random(shape) * 0.5 + 2.0**-6).astype(np.float32)
    return s.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else s.astype(dtype)


def _to_torch(a):
    torch = _torch()
    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16).astype(np.int32) << 16).view(torch.float32).to(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def _from_torch(t) -> np.ndarray:
    """float tensor -> float32 numpy (exact for fp16/bf16/fp32)."""
    return t.float().numpy()


def bits32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


# --- compressed-tensors: packing helpers -------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    bits=st.sampled_from([4, 8]),
    n=st.integers(1, 20),
    k=st.integers(1, 70),
    seed=st.integers(0, 2**32 - 1),
)
def test_ct_pack_helpers_agree(bits, n, k, seed):
    torch = _torch()
    pack_to_int32, unpack_from_int32 = _ct_helpers()
    rng = np.random.default_rng(seed)
    p = CtPackParams(num_bits=bits, strategy="channel", group_size=None, symmetric=False)
    q = rng.integers(p.qmin, p.qmax + 1, (n, k)).astype(np.int8)
    zp = rng.integers(p.qmin, p.qmax + 1, (n, 1)).astype(np.int8)
    t = pack_ct_packed(CtCodes(q=q, scales=np.ones((n, 1), dtype=np.float32), zero_point=zp), p)
    ref_w = pack_to_int32(torch.from_numpy(q), bits).numpy()
    ref_z = pack_to_int32(torch.from_numpy(zp), bits, packed_dim=0).numpy()
    np.testing.assert_array_equal(t.weight_packed, ref_w)
    np.testing.assert_array_equal(t.weight_zero_point, ref_z)
    # unpacking arbitrary words (padding fields included) agrees too
    words = rng.integers(-(2**31), 2**31, t.weight_packed.shape).astype(np.int32)
    zwords = rng.integers(-(2**31), 2**31, t.weight_zero_point.shape).astype(np.int32)
    mine = unpack_ct_packed(
        CtPackedTensors(words, np.ones((n, 1), dtype=np.float32), np.array([n, k]), weight_zero_point=zwords), p
    )
    ref_q = unpack_from_int32(torch.from_numpy(words), bits, torch.Size([n, k])).numpy()
    ref_zp = unpack_from_int32(torch.from_numpy(zwords), bits, torch.Size([n, 1]), packed_dim=0).numpy()
    np.testing.assert_array_equal(mine.q, ref_q)
    np.testing.assert_array_equal(mine.zero_point, ref_zp)


# --- compressed-tensors: full decompress --------------------------------------------------


def _ct_scheme(p: CtPackParams):
    qmod = pytest.importorskip("compressed_tensors.quantization")
    return qmod.QuantizationScheme(
        targets=["Linear"],
        weights=qmod.QuantizationArgs(
            num_bits=p.num_bits, type="int", symmetric=p.symmetric, strategy=p.strategy.value, group_size=p.group_size
        ),
    )


ct_params_st = st.one_of(
    st.builds(CtPackParams, num_bits=st.sampled_from([4, 8]), strategy=st.just("group"),
              group_size=st.sampled_from([32, 64, 128]), symmetric=st.booleans()),
    st.builds(CtPackParams, num_bits=st.sampled_from([4, 8]), strategy=st.just("channel"),
              group_size=st.none(), symmetric=st.booleans()),
)


@settings(max_examples=30, deadline=None)
@given(
    p=ct_params_st,
    n=st.sampled_from([1, 8, 12]),
    groups=st.integers(1, 2),
    scale_dtype=st.sampled_from(["float16", "bfloat16", "float32"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_ct_decompress_agrees(p, n, groups, scale_dtype, seed):
    torch = _torch()
    compressors = pytest.importorskip("compressed_tensors.compressors")
    rng = np.random.default_rng(seed)
    k = (p.group_size or 36) * groups  # channel: K = 36 or 72, not a multiple of 8 (padded words)
    ng = k // p.group_size if p.group_size else 1
    q = rng.integers(p.qmin, p.qmax + 1, (n, k)).astype(np.int8)
    zp = None if p.symmetric else rng.integers(p.qmin, p.qmax + 1, (n, ng)).astype(np.int8)
    s = _scale_array(rng, (n, ng), scale_dtype)
    t = pack_ct_packed(CtCodes(q=q, scales=s, zero_point=zp), p)
    sd = {
        "weight_packed": torch.from_numpy(t.weight_packed),
        "weight_scale": _to_torch(t.weight_scale),
        "weight_shape": torch.from_numpy(t.weight_shape),
    }
    if not p.symmetric:
        sd["weight_zero_point"] = torch.from_numpy(t.weight_zero_point)
    ref = compressors.PackedQuantizationCompressor.decompress(sd, _ct_scheme(p))["weight"]
    assert str(ref.dtype).endswith(scale_dtype)
    # the library computes (q - zp) * s in the scale's dtype: our compute_dtype variant
    mine = dequantize_ct_packed(t, p, variant=DequantVariant(compute_dtype=scale_dtype))
    np.testing.assert_array_equal(bits32(mine), bits32(_from_torch(ref)))
    spec = dequantize_ct_packed_reference(t, p, variant=DequantVariant(compute_dtype=scale_dtype))
    np.testing.assert_array_equal(bits32(spec), bits32(_from_torch(ref)))


@settings(max_examples=15, deadline=None)
@given(scale_dtype=st.sampled_from(["float16", "bfloat16", "float32"]), seed=st.integers(0, 2**32 - 1))
def test_ct_int_quantized_decompress_agrees(scale_dtype, seed):
    torch = _torch()
    compressors = pytest.importorskip("compressed_tensors.compressors")
    qmod = pytest.importorskip("compressed_tensors.quantization")
    rng = np.random.default_rng(seed)
    n, k = 8, 24
    t = CtInt8Tensors(
        weight=rng.integers(-128, 128, (n, k)).astype(np.int8),
        weight_scale=_scale_array(rng, (n, 1), scale_dtype),
    )
    scheme = qmod.QuantizationScheme(
        targets=["Linear"],
        weights=qmod.QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="channel"),
        input_activations=qmod.QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True),
    )
    sd = {"weight": torch.from_numpy(t.weight), "weight_scale": _to_torch(t.weight_scale)}
    ref = compressors.IntQuantizationCompressor.decompress(sd, scheme)["weight"]
    mine = dequantize_ct_int8(t, variant=DequantVariant(compute_dtype=scale_dtype))
    np.testing.assert_array_equal(bits32(mine), bits32(_from_torch(ref)))
    np.testing.assert_array_equal(bits32(dequantize_ct_int8_reference(t, variant=DequantVariant(compute_dtype=scale_dtype))), bits32(_from_torch(ref)))


@settings(max_examples=20, deadline=None)
@given(bits=st.sampled_from([4, 8]), symmetric=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_ct_quantize_rounding_rule_agrees(bits, symmetric, seed):
    """The library's quantize (x / s + zp, clamp, torch.round) = clamp(RNE(w / s + zp)),
    zero point added before rounding, checked where the division is exact:
    power-of-two scales, weights on exact ties."""
    torch = _torch()
    fwd = pytest.importorskip("compressed_tensors.quantization.lifecycle.forward")
    qmod = pytest.importorskip("compressed_tensors.quantization")
    rng = np.random.default_rng(seed)
    n, k = 4, 64
    p = CtPackParams(num_bits=bits, strategy="channel", group_size=None, symmetric=symmetric)
    s = 2.0 ** rng.integers(-6, 2, (n, 1)).astype(np.float64)
    halves = rng.integers(-2 * p.offset - 6, 2 * p.offset + 6, (n, k))  # includes +-x.5 ties and out-of-range values
    w = (halves * 0.5 * s).astype(np.float32)
    zp = np.zeros((n, 1), dtype=np.int64) if symmetric else rng.integers(p.qmin, p.qmax + 1, (n, 1))
    args = qmod.QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric, strategy="channel")
    ref = fwd.quantize(
        torch.from_numpy(w), torch.from_numpy(s.astype(np.float32)),
        torch.from_numpy(zp.astype(np.int8)), args, dtype=torch.int8,
    ).numpy()
    mine = rtn_codes(w.astype(np.float64), s, zp, p.qmin, p.qmax, what="w", zero_before_rounding=True)
    np.testing.assert_array_equal(mine, ref)
    if not symmetric and np.any(zp % 2):
        # rounding before adding an odd zero point moves every tie the other way
        other = rtn_codes(w.astype(np.float64), s, zp, p.qmin, p.qmax, what="w")
        assert np.any(other != ref)


# --- ONNX DequantizeLinear ---------------------------------------------------------------


def _onnx():
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnx.reference")
    return onnx


def _int_initializer(name, values, signed, bits):
    """An ONNX int4/uint4 (two fields per byte, first element in the low nibble:
    onnx.proto's packing rule) or int8/uint8 initializer."""
    onnx = _onnx()
    from onnx import numpy_helper

    values = np.asarray(values)
    if bits == 8:
        return numpy_helper.from_array(values.astype(np.int8 if signed else np.uint8), name)
    flat = values.reshape(-1).astype(np.int64) & 0xF
    if flat.size % 2:
        flat = np.append(flat, 0)
    raw = (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8).tobytes()
    t = onnx.TensorProto()
    t.name = name
    t.data_type = onnx.TensorProto.INT4 if signed else onnx.TensorProto.UINT4
    t.dims.extend(values.shape)
    t.raw_data = raw
    back = numpy_helper.to_array(t).astype(np.int64)
    np.testing.assert_array_equal(back, values)  # our reading of ONNX's packing is right
    return t


def onnx_dequantize(q, s, z, *, signed, bits, block, out_float32=True):
    """DequantizeLinear(q [N, K], s [N, K/block], z [N, K/block] or None), axis=1."""
    onnx = _onnx()
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    inits = [_int_initializer("x", q, signed, bits), numpy_helper.from_array(np.asarray(s), "s")]
    inputs = ["x", "s"]
    if z is not None:
        inits.append(_int_initializer("z", z, signed, bits))
        inputs.append("z")
    attrs = dict(axis=1, block_size=block)
    if out_float32:
        attrs["output_dtype"] = onnx.TensorProto.FLOAT
    node = helper.make_node("DequantizeLinear", inputs, ["y"], **attrs)
    out_type = onnx.TensorProto.FLOAT if out_float32 else inits[1].data_type
    graph = helper.make_graph([node], "dq", [], [helper.make_tensor_value_info("y", out_type, list(np.shape(q)))], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23 if out_float32 else 21)])
    return np.asarray(ReferenceEvaluator(model).run(None, {})[0]).astype(np.float32)


@settings(max_examples=25, deadline=None)
@given(
    bits=st.sampled_from([4, 8]),
    group_size=st.sampled_from([-1, 32, 64]),
    conv=st.sampled_from([ZeroConvention.V1, ZeroConvention.V2]),
    seed=st.integers(0, 2**32 - 1),
)
def test_gptq_agrees_with_onnx(bits, group_size, conv, seed):
    rng = np.random.default_rng(seed)
    n, k = 16, 128
    G = k if group_size == -1 else group_size
    p = GptqParams(bits=bits, group_size=group_size, sym=False, zero_convention=conv)
    maxq = 2**bits - 1
    q = rng.integers(0, maxq + 1, (n, k))
    z = rng.integers(1, maxq + 1, (k // G, n))  # 1..maxq: representable in both conventions and in ONNX
    s = _scale_array(rng, (k // G, n), "float16")
    t = pack_gptq(GptqCodes(q=q.astype(np.uint8), zeros=z.astype(np.int32), scales=s, g_idx=(np.arange(k) // G).astype(np.int32)), p)
    ref32 = onnx_dequantize(q, s.T, z.T, signed=False, bits=bits, block=G)
    np.testing.assert_array_equal(bits32(dequantize_gptq(t, p)), bits32(ref32))
    ref16 = onnx_dequantize(q, s.T, z.T, signed=False, bits=bits, block=G, out_float32=False)
    np.testing.assert_array_equal(bits32(dequantize_gptq(t, p, variant=DequantVariant(compute_dtype="float16"))), bits32(ref16))
    np.testing.assert_array_equal(bits32(dequantize_gptq_reference(t, p)), bits32(ref32))
    np.testing.assert_array_equal(bits32(dequantize_gptq_reference(t, p, variant=DequantVariant(compute_dtype="float16"))), bits32(ref16))


@settings(max_examples=15, deadline=None)
@given(group_size=st.sampled_from([-1, 32, 128]), seed=st.integers(0, 2**32 - 1))
def test_awq_agrees_with_onnx(group_size, seed):
    rng = np.random.default_rng(seed)
    n, k = 24, 128
    G = k if group_size == -1 else group_size
    q = rng.integers(0, 16, (n, k))
    z = rng.integers(0, 16, (k // G, n))
    s = _scale_array(rng, (k // G, n), "float16")
    p = AwqParams(group_size=group_size)
    t = pack_awq(AwqCodes(q=q.astype(np.uint8), zeros=z.astype(np.int32), scales=s), p)
    ref = onnx_dequantize(q, s.T, z.T, signed=False, bits=4, block=G)
    np.testing.assert_array_equal(bits32(dequantize_awq(t, p)), bits32(ref))
    np.testing.assert_array_equal(bits32(dequantize_awq_reference(t, p)), bits32(ref))


@settings(max_examples=25, deadline=None)
@given(
    p=ct_params_st,
    scale_dtype=st.sampled_from(["float16", "bfloat16", "float32"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_ct_agrees_with_onnx(p, scale_dtype, seed):
    rng = np.random.default_rng(seed)
    n, k = 8, 128
    G = p.group_size or k
    q = rng.integers(p.qmin, p.qmax + 1, (n, k))
    zp = None if p.symmetric else rng.integers(p.qmin, p.qmax + 1, (n, k // G))
    s = _scale_array(rng, (n, k // G), scale_dtype)
    t = pack_ct_packed(CtCodes(q=q.astype(np.int8), scales=s, zero_point=None if zp is None else zp.astype(np.int8)), p)
    ref32 = onnx_dequantize(q, s, zp, signed=True, bits=p.num_bits, block=G)
    np.testing.assert_array_equal(bits32(dequantize_ct_packed(t, p)), bits32(ref32))
    ref_s = onnx_dequantize(q, s, zp, signed=True, bits=p.num_bits, block=G, out_float32=False)
    np.testing.assert_array_equal(bits32(dequantize_ct_packed(t, p, variant=DequantVariant(compute_dtype=scale_dtype))), bits32(ref_s))
    np.testing.assert_array_equal(bits32(dequantize_ct_packed_reference(t, p)), bits32(ref32))
    np.testing.assert_array_equal(bits32(dequantize_ct_packed_reference(t, p, variant=DequantVariant(compute_dtype=scale_dtype))), bits32(ref_s))
