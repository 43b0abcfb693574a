"""Weight decoders written from docs/formats/{gptq,awq,compressed-tensors,mxfp4}.md.

Every decoder returns ``(qz, s, gidx)``: the integer ``q - z`` [N, K] (float64), the per-(group, row)
scale [G, N] (float64, the stored values) and the group of every input column [K]; the kernels form
``W = fl32(qz * s[gidx].T)``. ``bug`` switches on one planted defect (names in bugs.py).
"""

from __future__ import annotations

import numpy as np

from .num import as_f64, e2m1_decode

AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # slot s holds column 8j + AWQ_PACK_ORDER[s]


def unpack(words: np.ndarray, bits: int, axis: int, order=None, field_stride: int | None = None) -> np.ndarray:
    """int32 words -> unsigned fields along ``axis`` (field i = bits b*i.., LSB first)."""
    w = np.moveaxis(np.asarray(words).view(np.uint32).astype(np.uint64), axis, -1)
    F = 32 // bits
    stride = bits if field_stride is None else field_stride
    mask = (1 << bits) - 1
    f = np.stack([(w >> np.uint64(stride * i)) & np.uint64(mask) for i in range(F)], axis=-1)  # [..., W, F]
    if order is not None:  # slot s holds column order[s]: put it there
        out = np.empty_like(f)
        out[..., list(order)] = f
        f = out
    f = f.reshape(w.shape[:-1] + (w.shape[-1] * F,))
    return np.moveaxis(f, -1, axis).astype(np.int64)


def _scales(t: np.ndarray, bug: str | None) -> np.ndarray:
    t = np.asarray(t)
    if bug == "scale_bf16_bits_as_fp16" and t.dtype.name == "bfloat16":
        return t.view(np.uint16).view(np.float16).astype(np.float64)
    s = as_f64(t)
    if bug == "scale_to_bf16" and t.dtype == np.float16:
        from .num import round_to
        s = round_to(s, "bfloat16")
    if bug == "scale_abs":
        s = np.abs(s)
    if bug == "scale_ftz" and t.dtype == np.float16:
        s = np.where(np.abs(s) < 2.0 ** -14, 0.0 * s, s)
    return s


def gptq(case, t: dict, bug: str | None = None):
    b = case.bits
    K, N = case.K, case.N
    q = unpack(t["qweight"], b, axis=0, field_stride=4 if bug == "gptq8_field_stride4" and b == 8 else None)[:K]  # [K, N]
    zf = unpack(t["qzeros"], b, axis=1)[:, :N]  # [G, N]
    if bug == "gptq8_zero_mask_nibble" and b == 8:
        zf = zf & 0xF
    if case.zero_convention != "v2":  # v1 (AutoGPTQ): the field stores z - 1
        z = zf + 1
        if bug == "gptq_v1_wrap":
            z = z & ((1 << b) - 1)
    else:
        z = zf
    if bug == "gptq_zero_group0":
        z = np.broadcast_to(z[:1], z.shape)
    s = _scales(t["scales"], bug)
    G = s.shape[0]
    gidx = np.asarray(t["g_idx"]).astype(np.int64) if "g_idx" in t else np.arange(K) // case.group
    if bug == "gidx_ignored":
        gidx = np.minimum(np.arange(K) // max(K // G, 1), G - 1)
    qz = (q - z[gidx]).T.astype(np.float64)  # [N, K]
    if bug == "m1_sym_zero":  # the decode (M = 1) kernel's weights: the backend picks them at run time
        qz = (q - (1 << (b - 1))).T.astype(np.float64)
    return qz, s, gidx


def awq(case, t: dict, bug: str | None = None):
    K, N = case.K, case.N
    order = AWQ_PACK_ORDER
    if bug == "awq_order_inverted":
        order = tuple(int(i) for i in np.argsort(AWQ_PACK_ORDER))  # the reverse map used as the pack map
    q = unpack(t["qweight"], 4, axis=1, order=order)[:, :N]  # [K, N]
    zorder = AWQ_PACK_ORDER if bug != "awq_zeros_natural_order" else None
    z = unpack(t["qzeros"], 4, axis=1, order=zorder if bug != "awq_order_inverted" else order)[:, :N]  # [G, N]
    s = _scales(t["scales"], bug)
    G = s.shape[0]
    gidx = np.arange(K) // (K // G)
    qz = (q - z[gidx]).T.astype(np.float64)
    if bug == "m1_sym_zero":
        qz = (q - 8).T.astype(np.float64)
    return qz, s, gidx


def ct_packed(case, t: dict, bug: str | None = None):
    b = case.bits
    N, K = (int(v) for v in np.asarray(t["weight_shape"]))
    off = 1 << (b - 1)
    qf = unpack(t["weight_packed"], b, axis=1)  # [N, F*ceil(K/F)]
    if bug == "ct_k_tail_from_end":
        q = qf[:, qf.shape[1] - K:] - off
    else:
        q = qf[:, :K] - off
    st = t["weight_scale"]
    if bug == "ct_scale_reshape":
        s_nG = _scales(st, bug)
        s = s_nG.reshape(s_nG.shape[1], s_nG.shape[0])  # [G, N] by reshape instead of transpose
    else:
        s = _scales(st, bug).T  # [G, N]
    G = s.shape[0]
    if "weight_zero_point" in t:
        zf = unpack(t["weight_zero_point"], b, axis=0)[:N]  # [N, G]
        zp = zf - off if bug != "ct_zp_offset_kept" else zf
    else:
        zp = np.zeros((N, G), dtype=np.int64)
    if "weight_g_idx" in t and bug != "gidx_ignored":
        gidx = np.asarray(t["weight_g_idx"]).astype(np.int64)
    else:
        gidx = np.arange(K) // (K // G) if G > 1 else np.zeros(K, dtype=np.int64)
    qz = (q - zp[:, gidx]).astype(np.float64)
    return qz, s, gidx


def ct_int8(case, t: dict, bug: str | None = None):
    q = np.asarray(t["weight"]).astype(np.float64)  # [N, K]
    s = _scales(t["weight_scale"], bug).reshape(-1)
    N, K = q.shape
    if s.size == 1:
        s = np.full(N, s[0])
    if bug == "ct_int8_first_scale":
        s = np.full(N, s[0])
    return q, s.reshape(1, N), np.zeros(K, dtype=np.int64)


def decode_int(case, t: dict, bug: str | None = None):
    f = case.weight_format
    if f == "gptq":
        return gptq(case, t, bug)
    if f == "awq":
        return awq(case, t, bug)
    if f == "ct-pack-quantized":
        return ct_packed(case, t, bug)
    if f == "ct-int-quantized":
        return ct_int8(case, t, bug)
    raise ValueError(f"unknown weight format {f}")


def dequant_int(case, t: dict, bug: str | None = None) -> np.ndarray:
    """fl32((q - z) * s): float64 array holding float32 values [N, K]."""
    qz, s, gidx = decode_int(case, t, bug)
    w = qz * s[gidx].T
    return w.astype(np.float32).astype(np.float64)


def mx_codes(t: dict, bug: str | None = None):
    p = np.asarray(t["weight_packed"]).astype(np.int64)  # [N, K/2]
    lo, hi = p & 0xF, p >> 4
    if bug == "mx_nibble_swap":
        lo, hi = hi, lo
    c = np.stack([lo, hi], axis=-1).reshape(p.shape[0], p.shape[1] * 2)
    return c, np.asarray(t["weight_scale"]).astype(np.int64)  # codes [N, K], bytes [N, K/32]


def e8m0(byte: np.ndarray, bug: str | None = None) -> np.ndarray:
    b = np.asarray(byte).astype(np.int64)
    bias = 126 if bug == "e8m0_bias_126" else 127
    v = np.ldexp(1.0, b - bias)
    if bug == "e8m0_byte0_zero":
        v = np.where(b == 0, 0.0, v)
    if bug != "e8m0_ff_finite":
        v = np.where(b == 255, np.nan, v)
    return v


def dequant_mx(t: dict, bug: str | None = None) -> np.ndarray:
    c, sb = mx_codes(t, bug)
    lut = None
    if bug == "e2m1_lut_typo":
        lut = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0])
    v = e2m1_decode(c) if lut is None else e2m1_decode(c, lut)
    sc = e8m0(sb, bug)
    w = v * np.repeat(sc, 32, axis=1)
    with np.errstate(over="ignore"):
        return w.astype(np.float32).astype(np.float64)
