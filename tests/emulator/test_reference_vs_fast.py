"""Each format's fast path equals its reference function bit for bit, for every variant.

Regression gate: these tests compare emulator code with emulator code. The reference
functions (``dequantize_<format>_reference``: unpack, expand groups, apply the rule) are the
specification a kernel vendor reads; the public ``dequantize_*`` functions are the blocked,
threaded fast path (fast_dequant.py, fast_unpack.py) that the fallback backend, acceptance
and the benchmarks call. The references are checked against independent oracles elsewhere:
test_blocked_dequant.py (element-by-element reading + variant_oracle, no emulator code),
test_int_oracles.py (compressed-tensors, ONNX), and the MXFP4 test at the end of this file
(ml_dtypes' float4_e2m1fn / float8_e8m0fnu).

Here every variant the public functions accept is exercised, including the roundings the
independent oracle does not compute (RHAZ, RHTZ), scales across the whole range of their
dtype (subnormal, zero, negative, large enough to overflow a 16-bit compute dtype),
degenerate act-order maps (empty groups), channel-wise groups and odd shapes; blocks are
tiny and threads more than blocks, so every block edge is crossed.
"""

import itertools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from variant_oracle import same_bits

import emulator.parallel as par
from emulator.formats import awq, fast_dequant, fast_unpack, gptq, mxfp4
from emulator.formats import compressed_tensors as ct
from emulator.formats.int_common import DequantVariant, default_g_idx
from emulator.numerics.rounding import Rounding

ORDERS = ["sub_then_mul", "mul_then_sub", "float_zero"]
SCALE_DTYPES = [None, "float16", "bfloat16", "float32"]
COMPUTE = ["float32", "float16", "bfloat16"]
ROUNDINGS = [r.value for r in Rounding]
ZERO_DTYPES = [None, "float16", "bfloat16", "float32"]
ALL_VARIANTS = [{"order": o, "scale_dtype": sd, "compute_dtype": c, "compute_rounding": r, "zero_dtype": zd}
                for o, sd, c, r, zd in itertools.product(ORDERS, SCALE_DTYPES, COMPUTE, ROUNDINGS, ZERO_DTYPES)
                if o == "float_zero" or zd is None]  # zero_dtype only matters to float_zero
VARIANT = st.fixed_dictionaries({
    "order": st.sampled_from(ORDERS), "scale_dtype": st.sampled_from(SCALE_DTYPES),
    "compute_dtype": st.sampled_from(COMPUTE), "compute_rounding": st.sampled_from(ROUNDINGS),
    "zero_dtype": st.sampled_from(ZERO_DTYPES)})
#: the canonical default and the variants the fast path computes in float32 (SUB_THEN_MUL, RNE) often
VARIANTS = st.one_of(st.just({}), st.fixed_dictionaries({
    "scale_dtype": st.sampled_from(SCALE_DTYPES), "compute_dtype": st.sampled_from(COMPUTE)}), VARIANT)


@pytest.fixture(autouse=True)
def tiny_blocks(monkeypatch):
    monkeypatch.setattr(par, "BLOCK_BYTES", 200)  # one row per block (8 for AWQ's alignment)
    monkeypatch.setattr(par, "MIN_ELEMENTS", 0)  # always threaded
    monkeypatch.setattr(par, "row_threads", lambda: 3)  # three uneven spans


def _words(rng, shape) -> np.ndarray:
    w = rng.integers(-(2 ** 31), 2 ** 31, shape, dtype=np.int64).astype(np.int32)
    w.flags.writeable = False  # checkpoint tensors are inputs
    return w


_EXPONENTS = {"float16": (-26, 16), "bfloat16": (-135, 128), "float32": (-150, 128)}


def _scales(rng, shape, dtype) -> np.ndarray:
    """Finite scales over the whole range of ``dtype``: subnormals, zeros, negatives, near the maximum."""
    name = np.dtype(dtype).name
    lo, hi = _EXPONENTS[name]
    s = rng.standard_normal(shape) * 2.0 ** rng.integers(lo, hi, shape)
    s[rng.random(shape) < 0.1] = 0.0
    big = float(ml_dtypes.finfo(dtype).max)
    s = np.clip(s, -big, big).astype(dtype)
    s.flags.writeable = False
    return s


def _check(fast_fn, ref_fn, *args, **kw):
    with np.errstate(all="ignore"):
        fast, ref = fast_fn(*args, **kw), ref_fn(*args, **kw)
    assert same_bits(fast, ref), kw


def _g_idx(rng, k, n_groups, group, kind):
    if kind == "identity":
        return None
    if kind == "permuted":
        return rng.permutation(default_g_idx(k, group)).astype(np.int32)
    return rng.integers(0, n_groups, k).astype(np.int32)  # any map: some groups may be empty


def _gptq_case(rng, bits, n8, groups, words_per_group, channel, act, v2, scale_dtype):
    f = 32 // bits
    n, group = 8 * n8, f * words_per_group
    k = group * groups
    n_groups = 1 if channel else groups
    p = gptq.GptqParams(bits=bits, group_size=-1 if channel else group, sym=False, desc_act=act != "identity",
                        zero_convention="gptq_v2" if v2 else "gptq")
    t = gptq.GptqTensors(_words(rng, (k // f, n)), _words(rng, (n_groups, n // f)),
                         _scales(rng, (n_groups, n), scale_dtype), _g_idx(rng, k, n_groups, k // n_groups, act))
    return t, p, (n, k)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), bits=st.sampled_from([4, 8]), n8=st.integers(1, 4), groups=st.integers(1, 4),
       words_per_group=st.integers(1, 2), channel=st.booleans(),
       act=st.sampled_from(["identity", "permuted", "any"]), v2=st.booleans(),
       scale_dtype=st.sampled_from([np.float16, ml_dtypes.bfloat16]), zero_read=st.sampled_from(list(gptq.GptqZeroRead)),
       variant=VARIANTS)
def test_gptq_fast_equals_reference(seed, bits, n8, groups, words_per_group, channel, act, v2, scale_dtype, zero_read,
                                    variant):
    if v2 and zero_read not in (gptq.GptqZeroRead.CANONICAL, gptq.GptqZeroRead.IGNORE_QZEROS):
        zero_read = gptq.GptqZeroRead.CANONICAL  # the other readings are of v1 checkpoints only
    t, p, shape = _gptq_case(np.random.default_rng(seed), bits, n8, groups, words_per_group, channel, act, v2,
                             scale_dtype)
    _check(gptq.dequantize_gptq, gptq.dequantize_gptq_reference, t, p, shape=shape, zero_read=zero_read, variant=DequantVariant(**variant))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), n8=st.integers(1, 6), groups=st.integers(1, 4),
       group=st.sampled_from([1, 8, 16, 32, -1]), scale_dtype=st.sampled_from([np.float16, ml_dtypes.bfloat16]),
       variant=VARIANTS)
def test_awq_fast_equals_reference(seed, n8, groups, group, scale_dtype, variant):
    rng = np.random.default_rng(seed)
    n, k = 8 * n8, (8 * groups if group == -1 else group * groups)
    n_groups = 1 if group == -1 else groups
    t = awq.AwqTensors(_words(rng, (k, n // 8)), _words(rng, (n_groups, n // 8)), _scales(rng, (n_groups, n), scale_dtype))
    p = awq.AwqParams(bits=4, group_size=group)
    _check(awq.dequantize_awq, awq.dequantize_awq_reference, t, p, shape=(n, k), variant=DequantVariant(**variant))


def _ct_case(rng, bits, n, groups, group, sym, channel, act, scale_dtype):
    f, k = 32 // bits, group * groups  # K need not be a multiple of F: the last word is padded
    n_groups = 1 if channel else groups
    act = "identity" if channel else act
    p = ct.CtPackParams(num_bits=bits, strategy="channel" if channel else "group",
                        group_size=None if channel else group, symmetric=sym, actorder=act != "identity")
    zpp = None if sym else _words(rng, (-(-n // f), n_groups))
    t = ct.CtPackedTensors(_words(rng, (n, -(-k // f))), _scales(rng, (n, n_groups), scale_dtype),
                           np.array([n, k], np.int64), zpp, _g_idx(rng, k, n_groups, k // n_groups, act))
    return t, p


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), bits=st.sampled_from([4, 8]), n=st.integers(1, 20), groups=st.integers(1, 3),
       group=st.sampled_from([1, 4, 12, 16, 32]), sym=st.booleans(), channel=st.booleans(),
       act=st.sampled_from(["identity", "permuted", "any"]),
       scale_dtype=st.sampled_from([np.float16, ml_dtypes.bfloat16, np.float32]), variant=VARIANTS)
def test_ct_packed_fast_equals_reference(seed, bits, n, groups, group, sym, channel, act, scale_dtype, variant):
    t, p = _ct_case(np.random.default_rng(seed), bits, n, groups, group, sym, channel, act, scale_dtype)
    _check(ct.dequantize_ct_packed, ct.dequantize_ct_packed_reference, t, p, variant=DequantVariant(**variant))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(1, 20), k=st.integers(1, 40), per_tensor=st.booleans(),
       scale_dtype=st.sampled_from([np.float16, ml_dtypes.bfloat16, np.float32]), variant=VARIANTS)
def test_ct_int8_fast_equals_reference(seed, n, k, per_tensor, scale_dtype, variant):
    rng = np.random.default_rng(seed)
    q = rng.integers(-128, 128, (n, k)).astype(np.int8)
    t = ct.CtInt8Tensors(q, _scales(rng, (1,) if per_tensor else (n, 1), scale_dtype))
    _check(ct.dequantize_ct_int8, ct.dequantize_ct_int8_reference, t, variant=DequantVariant(**variant))


def test_every_variant_combination_on_fixed_layers():
    """The full product of orders x scale dtypes x compute dtypes x roundings x zero dtypes, per format."""
    rng = np.random.default_rng(7)
    cases = []
    for bits, v2, act in [(4, False, "permuted"), (8, True, "any")]:
        t, p, shape = _gptq_case(rng, bits, 2, 3, 1, False, act, v2, np.float16)
        cases.append((gptq.dequantize_gptq, gptq.dequantize_gptq_reference, (t, p), {"shape": shape}))
    t, p, shape = _gptq_case(rng, 4, 1, 2, 1, True, "identity", False, ml_dtypes.bfloat16)
    for read in gptq.GptqZeroRead:
        cases.append((gptq.dequantize_gptq, gptq.dequantize_gptq_reference, (t, p), {"shape": shape, "zero_read": read}))
    n, k = 16, 32
    at = awq.AwqTensors(_words(rng, (k, n // 8)), _words(rng, (2, n // 8)), _scales(rng, (2, n), np.float16))
    cases.append((awq.dequantize_awq, awq.dequantize_awq_reference, (at, awq.AwqParams(group_size=16)), {}))
    for bits, sym, channel, sd in [(4, False, False, np.float32), (8, True, True, ml_dtypes.bfloat16),
                                   (4, True, False, np.float16)]:
        t, p = _ct_case(rng, bits, 9, 2, 12, sym, channel, "any", sd)
        cases.append((ct.dequantize_ct_packed, ct.dequantize_ct_packed_reference, (t, p), {}))
    i8 = ct.CtInt8Tensors(rng.integers(-128, 128, (5, 24)).astype(np.int8), _scales(rng, (5, 1), np.float32))
    cases.append((ct.dequantize_ct_int8, ct.dequantize_ct_int8_reference, (i8,), {}))
    assert len(ALL_VARIANTS) == 3 * 4 * 3 * 4 + 3 * 4 * 4 * 3  # every combination, counted by hand
    for fast_fn, ref_fn, args, kw in cases:
        for variant in ALL_VARIANTS:
            _check(fast_fn, ref_fn, *args, **kw, variant=DequantVariant(**variant))


def test_real_block_sizes_and_threads(monkeypatch):
    """The default block size and the layer-size threshold for threading (no tiny blocks)."""
    monkeypatch.setattr(par, "BLOCK_BYTES", 2 * 1024 * 1024)
    monkeypatch.setattr(par, "MIN_ELEMENTS", 1 << 20)
    rng = np.random.default_rng(11)
    t, p, shape = _gptq_case(rng, 4, 128, 8, 16, False, "permuted", False, np.float16)  # 1024 x 1024
    assert shape[0] * shape[1] >= par.MIN_ELEMENTS
    _check(gptq.dequantize_gptq, gptq.dequantize_gptq_reference, t, p, shape=shape)
    n, k = 1024, 1024
    at = awq.AwqTensors(_words(rng, (k, n // 8)), _words(rng, (8, n // 8)), _scales(rng, (8, n), np.float16))
    _check(awq.dequantize_awq, awq.dequantize_awq_reference, at, awq.AwqParams(group_size=128), shape=(n, k))
    ctt, cp = _ct_case(rng, 4, 1000, 8, 128, False, False, "identity", ml_dtypes.bfloat16)
    _check(ct.dequantize_ct_packed, ct.dequantize_ct_packed_reference, ctt, cp)
    mx = {"weight_packed": rng.integers(0, 256, (1024, 512), dtype=np.uint8),
          "weight_scale": rng.integers(0, 256, (1024, 32), dtype=np.uint8)}
    _check(mxfp4.dequantize_mxfp4_ct, mxfp4.dequantize_mxfp4_ct_reference, mx)


# --- MXFP4 ----------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(1, 9), blocks=st.integers(1, 4))
def test_mxfp4_ct_fast_equals_reference(seed, n, blocks):
    rng = np.random.default_rng(seed)
    t = {"weight_packed": rng.integers(0, 256, (n, 16 * blocks), dtype=np.uint8),
         "weight_scale": rng.integers(0, 256, (n, blocks), dtype=np.uint8)}  # 0x00, 0xFE, 0xFF included
    _check(mxfp4.dequantize_mxfp4_ct, mxfp4.dequantize_mxfp4_ct_reference, t)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), experts=st.integers(1, 3), n=st.integers(1, 5), blocks=st.integers(1, 3))
def test_mxfp4_gptoss_fast_equals_reference(seed, experts, n, blocks):
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (experts, n, blocks, 16), dtype=np.uint8)
    s = rng.integers(0, 256, (experts, n, blocks), dtype=np.uint8)
    _check(mxfp4.dequantize_mxfp4_gptoss, mxfp4.dequantize_mxfp4_gptoss_reference, b, s)


def test_mxfp4_reference_equals_ml_dtypes_reading():
    """Independent oracle: ml_dtypes' float4_e2m1fn (low nibble first) times its float8_e8m0fnu scale.

    Every packed byte meets every scale byte (0x00 = 2**-127, 0xFE = 2**127, 0xFF = NaN); the
    product is formed in float64 (exact) and rounded once to float32 by numpy.
    """
    packed = np.tile(np.arange(256, dtype=np.uint8), (256, 1))  # [256, 256 bytes = 512 elements]
    scale = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 512 // 32, axis=1)
    low, high = (packed & 0xF).view(ml_dtypes.float4_e2m1fn), (packed >> 4).view(ml_dtypes.float4_e2m1fn)
    values = np.stack([low, high], axis=-1).reshape(256, 512).astype(np.float64)
    scales = np.repeat(scale.view(ml_dtypes.float8_e8m0fnu).astype(np.float64), 32, axis=1)
    with np.errstate(over="ignore"):
        expect = (values * scales).astype(np.float32)
    assert np.isnan(expect[255]).all() and np.isinf(expect[254]).any()  # the NaN scale and an overflow are in
    assert same_bits(mxfp4.dequantize_mxfp4_ct_reference({"weight_packed": packed, "weight_scale": scale}), expect)
    blocks = packed.reshape(256, 16, 16)
    assert same_bits(mxfp4.dequantize_mxfp4_gptoss_reference(blocks, scale), expect)


def test_references_never_call_the_fast_path(monkeypatch):
    """With every fast-path entry point (and the row-block threading) made to raise, the
    references still compute, and the public functions (the fast path) do not."""
    def forbidden(*args, **kwargs):
        raise AssertionError("a reference function called the fast path")

    fast_modules = {fast_dequant.__name__, fast_unpack.__name__}
    patched = []
    for module in (gptq, awq, ct, mxfp4, fast_dequant, fast_unpack):
        for name, value in list(vars(module).items()):
            if getattr(value, "__module__", None) in fast_modules or value is par.for_row_chunks:
                monkeypatch.setattr(module, name, forbidden)
                patched.append(f"{module.__name__.rsplit('.', 1)[-1]}.{name}")
    assert {"gptq.dequantize_grouped", "awq.transposed_field_rows", "compressed_tensors.dequantize_affine_fast",
            "compressed_tensors.sequential_fields", "mxfp4.dequantize_mxfp4_packed",
            "fast_dequant.for_row_chunks", "fast_unpack.for_row_chunks"} <= set(patched), patched
    rng = np.random.default_rng(3)
    t, p, shape = _gptq_case(rng, 4, 1, 2, 1, False, "permuted", False, np.float16)
    at, ap = awq.AwqTensors(_words(rng, (16, 1)), _words(rng, (2, 1)), _scales(rng, (2, 8), np.float16)), \
        awq.AwqParams(group_size=8)
    ctt, cp = _ct_case(rng, 4, 5, 2, 12, False, False, "any", np.float32)
    i8 = ct.CtInt8Tensors(rng.integers(-128, 128, (3, 8)).astype(np.int8), _scales(rng, (1,), np.float16))
    mx = {"weight_packed": rng.integers(0, 256, (2, 16), dtype=np.uint8),
          "weight_scale": rng.integers(0, 256, (2, 1), dtype=np.uint8)}
    blocks, scales = rng.integers(0, 256, (2, 3, 1, 16), dtype=np.uint8), rng.integers(0, 256, (2, 3, 1), dtype=np.uint8)
    with np.errstate(all="ignore"):
        gptq.dequantize_gptq_reference(t, p, shape=shape, variant=DequantVariant(order="float_zero"))
        awq.dequantize_awq_reference(at, ap, variant=DequantVariant(compute_dtype="bfloat16"))
        ct.dequantize_ct_packed_reference(ctt, cp, variant=DequantVariant(order="mul_then_sub"))
        ct.dequantize_ct_int8_reference(i8)
        mxfp4.dequantize_mxfp4_ct_reference(mx)
        mxfp4.dequantize_mxfp4_gptoss_reference(blocks, scales)
    for call in [lambda: gptq.dequantize_gptq(t, p, shape=shape), lambda: awq.dequantize_awq(at, ap),
                 lambda: ct.dequantize_ct_packed(ctt, cp), lambda: ct.dequantize_ct_int8(i8),
                 lambda: mxfp4.dequantize_mxfp4_ct(mx), lambda: mxfp4.dequantize_mxfp4_gptoss(blocks, scales)]:
        with pytest.raises(AssertionError, match="called the fast path"):
            call()
