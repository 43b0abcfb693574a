"""The stages of the mutant pipeline (conformance/selftest/doubles/mutants.py): the canonical building blocks
(integer codes, exact dequantized weights, activation quantizers) and the bugs the mutants plant in
them (weights, activations, products). Semantics: docs/selftest.md.
"""

from __future__ import annotations

import numpy as np

from emulator.activations import int8 as a8
from emulator.formats import awq, compressed_tensors as ct, gptq, mxfp4
from emulator.formats.packing import unpack_int32
from emulator.numerics.e2m1 import encode_e2m1
from emulator.numerics.e8m0 import E8M0_NAN, mx_scale_byte
from emulator.numerics.floats import round_to_dtype

from backends.base import Case

F32 = np.float32


# -- canonical building blocks ------------------------------------------------------------------
def as_f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float32).astype(np.float64) if np.asarray(a).dtype.name == "bfloat16" \
        else np.asarray(a).astype(np.float64)


def bf16_bits(bits: np.ndarray) -> np.ndarray:
    """The value of bfloat16 bit patterns (uint16), as float64: they are the top half of a float32."""
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def int_codes(case: Case, t: dict):
    """(q int64 [N, K], z int64 [G, N], s float64 [G, N], g int64 [K]) with W = (q - z[g].T) * s[g].T."""
    fmt = case.weight_format
    if fmt == "gptq":
        p = gptq.GptqParams(bits=case.bits, group_size=case.group_size, sym=case.sym, desc_act=case.act_order,
                            zero_convention=case.gptq_zero_convention)
        c = gptq.unpack_gptq(gptq.GptqTensors(t["qweight"], t["qzeros"], t["scales"], t.get("g_idx")), p,
                             shape=(case.N, case.K))
        return c.q.astype(np.int64), c.zeros.astype(np.int64), as_f64(c.scales), np.asarray(c.g_idx, np.int64)
    if fmt == "awq":
        c = awq.unpack_awq(awq.AwqTensors(t["qweight"], t["qzeros"], t["scales"]),
                           awq.AwqParams(bits=4, group_size=case.group_size), shape=(case.N, case.K))
        G = c.zeros.shape[0]
        return c.q.astype(np.int64), c.zeros.astype(np.int64), as_f64(c.scales), np.arange(case.K) // (case.K // G)
    if fmt == "ct-pack-quantized":
        channel = case.group_size in (-1, 0)
        p = ct.CtPackParams(num_bits=case.bits, strategy="channel" if channel else "group",
                            group_size=None if channel else case.group_size, symmetric=case.sym,
                            actorder=case.act_order)
        c = ct.unpack_ct_packed(ct.CtPackedTensors(t["weight_packed"], t["weight_scale"], t["weight_shape"],
                                                   t.get("weight_zero_point"), t.get("weight_g_idx")), p)
        s = as_f64(c.scales).T  # [G, N]
        G = s.shape[0]
        g = np.asarray(c.g_idx, np.int64) if c.g_idx is not None else np.arange(case.K) // (case.K // G)
        z = np.zeros((G, case.N), np.int64) if c.zero_point is None else c.zero_point.astype(np.int64).T
        return c.q.astype(np.int64), z, s, g
    if fmt == "ct-int-quantized":
        s = as_f64(t["weight_scale"]).reshape(1, -1)
        return (np.asarray(t["weight"]).astype(np.int64), np.zeros((1, case.N), np.int64), s,
                np.zeros(case.K, np.int64))
    raise ValueError(f"no integer codes in format {fmt!r}")


def from_codes(q, z, s, g) -> np.ndarray:
    """The exact weight (q - z) * s, rounded once to float32 (the canonical dequantized value)."""
    return ((q - z[g, :].T) * s[g, :].T).astype(np.float32).astype(np.float64)


def canonical_weight(case: Case, t: dict) -> np.ndarray:
    if case.weight_format == "ct-mxfp4":
        codes, sb = mxfp4.unpack_mxfp4_ct(t)
        w = mxfp4.dequantize_mxfp4(codes, sb, dtype=np.float64)
        # A16 uses the float32 dequantized weight (6 * 2**127 overflows to Inf), W4A4 the exact one
        return w if case.scheme == "w4a4-mxfp4" else w.astype(np.float32).astype(np.float64)
    return from_codes(*int_codes(case, t))


def int8_emulator(variant: a8.Int8ActVariant):
    """Activation quantizer through the emulator's own quantizer with a named variant."""
    def f(case, x32):
        acts = a8.quantize_int8_per_token(x32, variant)
        return acts.q.astype(np.float64) - acts.zero_point, acts.scale.astype(np.float64)
    return f


def int8_local(*, scale_formula: str = "divide", per_tensor: bool = False, zero_row: str = "zero"):
    """Symmetric per-token int8 written out (for the bugs the emulator has no variant for):
    amax = max |x| (fp32), scale = fl32(amax / 127) or fl32(amax * fl32(1/127)), q = sat(RNE(fl32(x / scale)));
    a zero row gives scale 0 and codes 0, or (zero_row="nan") NaN codes that stay NaN, as a
    torch reference without the guard does (``torch.round(x / 0).clamp(-128, 127)`` keeps NaN)."""
    def f(case, x32):
        amax = np.abs(x32).max(axis=1, keepdims=True).astype(F32)
        if per_tensor:
            amax = np.full_like(amax, amax.max())
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if scale_formula == "recip_mul":
                scale = (amax * (F32(1) / F32(127)).astype(F32)).astype(F32)
            else:
                scale = (amax / F32(127)).astype(F32)
            quot = (x32 / scale).astype(F32)
        zero = (amax == 0)[:, 0]
        if zero_row == "zero":
            quot[zero] = 0
        q = np.clip(np.rint(quot.astype(np.float64)), -128, 127)
        return q, scale.astype(np.float64)
    return f


def mx_qdq(x32, variant=mxfp4.CANONICAL) -> np.ndarray:
    codes, sb = mxfp4.quantize_mxfp4(x32, variant, what="x")
    return mxfp4.dequantize_mxfp4(codes, sb, dtype=np.float64, what="x")


def mx_emulator(**variant):
    v = mxfp4.MxVariant(**variant)
    return lambda case, x32: mx_qdq(x32, v)


def mx_local(*, byte_delta: int = 0, amax_floor: float = 0.0):
    """MXFP4 activation quantization with the canonical FLOOR rule, then a planted error: the scale
    byte moved by ``byte_delta`` E8M0 steps (a biased exponent), or amax floored at ``amax_floor``
    before the scale is chosen (an epsilon meant for all-zero blocks)."""
    def f(case, x32):
        xb = x32.reshape(x32.shape[0], -1, mxfp4.BLOCK)
        amax = mxfp4.block_amax(xb)
        if amax_floor:
            amax = np.maximum(amax, F32(amax_floor)).astype(F32)
        sb = mx_scale_byte(amax, "floor")
        ok = sb != E8M0_NAN
        sb = np.where(ok, np.clip(sb.astype(np.int64) + byte_delta, 0, 254), sb).astype(np.uint8)
        s = np.where(ok, sb.astype(np.int64) - 127, 0)
        codes = encode_e2m1(np.ldexp(xb.astype(np.float64), -s[..., None]), "rne", "zero")
        codes = np.where((~ok)[..., None], np.uint8(0), codes).reshape(x32.shape).astype(np.uint8)
        return mxfp4.dequantize_mxfp4(codes, sb, dtype=np.float64, what="x")
    return f


# -- weight bugs --------------------------------------------------------------------------------
def codes_bug(fn):
    """A weight hook that rewrites the integer codes (q, z, s, g) before the exact dequantization."""
    def hook(backend, case, t, w):
        return from_codes(*fn(case, t, *int_codes(case, t)))
    return hook


def midpoint(case):
    return 0 if case.weight_format == "ct-pack-quantized" else 1 << (case.bits - 1)


def awq_sequential(case, t, q, z, s, g, *, weights: bool, zeros: bool):
    if weights:
        q = unpack_int32(t["qweight"], 4, axis=1).astype(np.int64).T  # slot order, no AWQ_REVERSE_ORDER
    if zeros:
        z = unpack_int32(t["qzeros"], 4, axis=1).astype(np.int64)
    return q, z, s, g


def group_off_by_one(case, t, q, z, s, g):
    G = s.shape[0]
    k = np.arange(case.K)
    return q, z, s, np.minimum((k + 1) // (case.K // G), G - 1)


def transpose_square(case, t, q, z, s, g):
    return (q, z, s.T, g) if s.shape[0] == s.shape[1] else (q, z, s, g)


def fp16_bits_as_bf16(case, t, q, z, s, g):
    raw = np.asarray(t["scales"] if case.weight_format in ("gptq", "awq") else t["weight_scale"])
    if raw.dtype != np.float16:
        return q, z, s, g
    bf = bf16_bits(raw.view(np.uint16))
    return q, z, (bf.T if case.weight_format == "ct-pack-quantized" else bf), g


def weights_rounded(mode):
    def hook(backend, case, t, w):
        exact = (lambda q, z, s, g: (q - z[g, :].T) * s[g, :].T)(*int_codes(case, t))
        return round_to_dtype(exact, "bfloat16", mode)
    return hook


def stale_cache(backend, case, t, w):
    """ZenDNN keyed its weight cache by the tensor's address: the same address (here: the same
    format and shape) returns the weight it cached first, whatever the tensor holds now."""
    key = (case.scheme, case.weight_format, case.N, case.K, case.bits)
    cache = backend.state.setdefault("weights", {})
    return cache.setdefault(key, w)


def awq_n64(backend, case, t, w):
    if case.N % 128 != 64:
        return w
    w = w.copy()
    w[case.N - 32:] = w[case.N - 64:case.N - 32]  # the last half-tile written from the wrong c_warp results
    return w


def nibble_swap(case, t):
    def swap(a):
        a = np.asarray(a)
        if a.dtype == np.uint8:
            return ((a & 0x0F) << 4) | (a >> 4)
        u = a.view(np.uint32)
        return (((u & np.uint32(0x0F0F0F0F)) << np.uint32(4)) | ((u >> np.uint32(4)) & np.uint32(0x0F0F0F0F))).view(
            a.dtype)
    names = ("qweight", "weight_packed", "w13_qweight", "w2_qweight")
    return {k: (swap(v) if k in names else v) for k, v in t.items()}


def g_idx_ignored(case, t):
    G = case.K // case.group
    t = dict(t)
    for name in ("g_idx", "weight_g_idx"):
        if name in t:
            t[name] = (np.arange(case.K) // (case.K // G)).astype(np.asarray(t[name]).dtype)
    return t


def mx_square_transposed(backend, case, t, w):
    codes, sb = mxfp4.unpack_mxfp4_ct(t)
    if sb.shape[0] != sb.shape[1]:
        return w
    w2 = mxfp4.dequantize_mxfp4(codes, np.ascontiguousarray(sb.T), dtype=np.float64)
    return w2 if case.scheme == "w4a4-mxfp4" else w2.astype(np.float32).astype(np.float64)


def mx_neg_zero_unmasked(backend, case, t, w):
    """vLLM CPU (sgl-kernels ``cvt_mxfp4_e2m1_bf16_intrinsic_lut``) scales the bf16 LUT value by adding
    (byte - 127) << 7 to its bits and then restores zeros it found with ``(x & 0x7FFF) == 0``; with the
    mask on the raw bits (``x == 0``) the E2M1 -0 (bf16 0x8000) is lost: it takes the exponent add and
    becomes -2**(byte - 254), or wraps to a large positive value or +Inf for bytes below 127."""
    codes, sb = mxfp4.unpack_mxfp4_ct(t)
    byte = np.repeat(sb.astype(np.int64), mxfp4.BLOCK, axis=-1)
    val = bf16_bits(((0x8000 + (byte - 127) * 128) & 0xFFFF).astype(np.uint16))
    neg0 = (codes == 8) & (byte != 0xFF)
    return np.where(neg0, val, w)


# -- activation / product / output bugs ---------------------------------------------------------------
def k_tail(case, x, w):
    """torch ``_weight_int8pack_mm`` (bf16, AVX512): K is stepped by 16 with no tail loop, so each dot
    product also reads the 16 - K % 16 elements after its row: the next row of x and of w (past the
    end of x: memory holding 1.0, as in the reproducer; past the end of w: zeros)."""
    y = x @ w.T
    M, K = x.shape
    pad = (-K) % 16
    if not pad:
        return y
    xf = np.concatenate([x.reshape(-1), np.ones(pad)])
    wf = np.concatenate([w.reshape(-1), np.zeros(pad)])
    xs = np.stack([xf[(m + 1) * K:(m + 1) * K + pad] for m in range(M)])
    ws = np.stack([wf[(n + 1) * K:(n + 1) * K + pad] for n in range(w.shape[0])])
    return y + xs @ ws.T


def bf16_accumulate(case, x, w):
    """Every partial sum rounded to bf16 (an accumulator register of the activation dtype)."""
    acc = np.zeros((x.shape[0], w.shape[0]))
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(x.shape[1]):
            acc = round_to_dtype(acc + x[:, k:k + 1] * w[None, :, k], "bfloat16")
    return acc


def mx_acts_in_a16(case, x64):
    return mx_qdq(x64.astype(np.float32))
