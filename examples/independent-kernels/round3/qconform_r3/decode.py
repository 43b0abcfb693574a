"""Weight decoders written from docs/formats/{gptq,awq,compressed-tensors,mxfp4}.md.

``decode_int`` returns the integer ``q - z`` [N, K] (float64), the scales [G, N] (float64) and the group of
every input column [K]; kernels form W = fl32((q - z) * s). ``bug`` switches one planted defect on."""

from __future__ import annotations

import numpy as np

from .num import e2m1_value, f64

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # slot s of a word holds column 8j + AWQ_ORDER[s]
PACKED = ("qweight", "qzeros", "weight_packed", "weight_zero_point")


def fields(words, bits: int, axis: int, top_signed: bool = False) -> np.ndarray:
    """int32 words -> fields along ``axis`` (field i at bits [b*i, b*(i+1)), LSB first), int64."""
    w = np.moveaxis(np.asarray(words).astype(np.int64), axis, -1)
    F = 32 // bits
    u = w & 0xFFFFFFFF
    out = [(u >> (bits * i)) & ((1 << bits) - 1) for i in range(F)]
    if top_signed:  # arithmetic shift of the signed word, no mask
        out[F - 1] = np.asarray(w, dtype=np.int64) >> (bits * (F - 1))
    f = np.stack(out, axis=-1).reshape(w.shape[:-1] + (w.shape[-1] * F,))
    return np.moveaxis(f, -1, axis)


def _byteswap(t: dict, bug) -> dict:
    if bug != "words_byteswapped":
        return t
    t = dict(t)
    for k in PACKED:
        if k in t:
            t[k] = np.asarray(t[k]).astype(np.int32).byteswap()
    return t


def _groups(K: int, G: int, ng: int, gidx, bug, act_order: bool) -> np.ndarray:
    if gidx is not None and act_order:
        g = np.asarray(gidx).astype(np.int64)
        if bug == "gidx_sorted_uniform":
            perm = np.argsort(g, kind="stable")
            g2 = np.empty_like(g)
            g2[perm] = np.minimum(np.arange(K) // G, ng - 1)
            g = g2
        return g
    g = np.minimum(np.arange(K) // G, ng - 1)
    if bug == "group_boundary_plus1":
        g = np.minimum((np.arange(K) + 1) // G, ng - 1)
    return g


def decode_int(case, t: dict, bug=None):
    t = _byteswap(t, bug)
    fmt, b, K, N = case.weight_format, case.bits, case.K, case.N
    G = case.group
    top = bug == "top_field_arith_shift"
    ztop = bug == "qzeros_top_field_arith_shift"
    if fmt == "gptq":
        q = fields(t["qweight"], b, 0, top)[:K].T  # [N, K]
        if bug == "gptq8_sign_extend" and b == 8:
            q = np.where(q >= 128, q - 256, q)
        zf = fields(t["qzeros"], b, 1, ztop)[:, :N]  # [G, N]
        z = zf if case.zero_convention == "v2" else zf + 1
        s = f64(t["scales"])
        g = _groups(K, G, s.shape[0], t.get("g_idx"), bug, case.act_order)
    elif fmt == "awq":
        def awq(words, top_):
            f = fields(words, 4, 1, top_)  # [R, N] in slot order
            R = f.shape[0]
            f = f.reshape(R, -1, 8)
            out = np.empty_like(f)
            out[:, :, list(AWQ_ORDER)] = f
            return out.reshape(R, -1)
        q = awq(t["qweight"], top)[:, :N].T
        z = awq(t["qzeros"], ztop)[:, :N]
        s = f64(t["scales"])
        if bug == "awq_scales_interleaved":
            ss = s.reshape(s.shape[0], -1, 8)
            out = np.empty_like(ss)
            out[:, :, list(AWQ_ORDER)] = ss
            s = out.reshape(s.shape)
        g = _groups(K, G, s.shape[0], None, bug, False)
    elif fmt == "ct-pack-quantized":
        off = 1 << (b - 1)
        f = fields(t["weight_packed"], b, 1, top)[:, :K]  # [N, K]
        if bug == "ct_codes_as_int4" and b == 4:
            q = np.where(f >= 8, f - 16, f)
        else:
            q = f - off
        s = f64(t["weight_scale"]).T  # [G, N]
        if t.get("weight_zero_point") is not None and not case.sym:
            zpw = np.asarray(t["weight_zero_point"])
            if bug == "ct_zp_n_floor" and N % 8:
                zpw = zpw.copy()
                zpw[N // 8:] = 0
            z = (fields(zpw, b, 0, ztop)[:N] - off).T  # [G, N]
        else:
            z = np.zeros_like(s)
        g = _groups(K, G, s.shape[0], t.get("weight_g_idx"), bug, case.act_order)
    elif fmt == "ct-int-quantized":
        q = np.asarray(t["weight"]).astype(np.int64)
        if bug == "int8_w_clamp_m127":
            q = np.maximum(q, -127)
        sc = f64(t["weight_scale"]).reshape(-1)
        s = (np.full(N, sc[0]) if sc.size == 1 else sc)[None, :]
        z = np.zeros_like(s)
        g = np.zeros(K, dtype=np.int64)
    else:
        raise ValueError(fmt)
    qz = q.astype(np.float64) - z[g].T
    return qz, s, g


def dequant_int(case, t: dict, bug=None) -> np.ndarray:
    qz, s, g = decode_int(case, t, bug)
    with np.errstate(all="ignore"):
        return (qz * s[g].T).astype(np.float32).astype(np.float64)  # exact product, one rounding to fp32


def mx_codes(t: dict):
    p = np.asarray(t["weight_packed"]).astype(np.int64)  # [N, K/2]
    c = np.stack([p & 0xF, p >> 4], axis=-1).reshape(p.shape[0], -1)
    return c, np.asarray(t["weight_scale"]).astype(np.int64)


def e8m0(byte, bug=None) -> np.ndarray:
    b = np.asarray(byte).astype(np.int64)
    if bug == "e8m0_signed_char":
        sb = np.where(b >= 128, b - 256, b)
        return np.ldexp(1.0, sb - 127)
    return np.where(b == 255, np.nan, np.ldexp(1.0, np.where(b == 255, 0, b) - 127))


def dequant_mx(t: dict, bug=None) -> np.ndarray:
    c, sb = mx_codes(t)
    if bug == "e2m1_twos_complement":
        from .num import E2M1
        v = np.where(c >= 8, -E2M1[(16 - c) & 7], E2M1[c & 7])
    else:
        v = e2m1_value(c)
    sc = e8m0(sb, bug)
    with np.errstate(all="ignore"):
        return (v * np.repeat(sc, 32, axis=1)).astype(np.float32).astype(np.float64)
