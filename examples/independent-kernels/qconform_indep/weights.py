"""Integer codes, zero points and scales of each checkpoint layout -> float64 weights W [N, K].

Written from docs/formats/gptq.md, awq.md, compressed-tensors.md, mxfp4.md. ``bug`` names a planted
defect (README.md lists them); ``None`` is the correct reading.
"""

from __future__ import annotations

import numpy as np

from .numerics import E2M1, e8m0, round_to, unpack, unpack_awq, unpack_e2m1


def _f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def int_parts(case, t: dict, bug: str | None):
    """(qz [N, K] = q - z as float64, scale [N, K] float64, group map g [K]) for the integer formats."""
    K, N, fmt = case.K, case.N, case.weight_format
    G = case.group
    if fmt == "gptq":
        b = case.bits
        F = 32 // b
        q = unpack(t["qweight"], b, axis=0)[:K]  # [K, N]
        zf = unpack(t["qzeros"], b, axis=1)[:, :N]  # [G, N]
        v1 = case.gptq_zero_convention == "gptq"
        if bug == "gptq_v1_no_plus1":
            z = zf
        elif bug == "gptq_v2_plus1":
            z = zf + 1
        elif bug == "gptq_v1_wrap":
            z = (zf + 1) & ((1 << b) - 1) if v1 else zf
        else:
            z = zf + 1 if v1 else zf
        if bug == "gptq_sym_assumed" or (bug == "gptq8_sym_assumed" and b == 8):
            z = np.full_like(z, 1 << (b - 1))
        s = _f64(t["scales"])  # [G, N]
        if "g_idx" in t and case.act_order and bug not in ("gptq_gidx_ignored",):
            g = np.asarray(t["g_idx"]).astype(np.int64)
        else:
            g = np.arange(K) // G
        if bug == "gptq_gidx_inverse" and case.act_order and "g_idx" in t:
            # sorts K by g_idx and then maps the sorted order back with the wrong permutation
            perm = np.argsort(np.asarray(t["g_idx"]), kind="stable")
            g = np.asarray(t["g_idx"]).astype(np.int64)[np.argsort(perm)]
        if bug == "nibble_high_first":
            q = unpack(t["qweight"], b, axis=0).reshape(-1, F, N)[:, ::-1, :].reshape(-1, N)[:K]
        qz = q.T.astype(np.float64) - z[g].T  # [N, K]
        gs = g
        if bug == "last_group_prev_scale" and s.shape[0] >= 2:
            gs = np.minimum(g, s.shape[0] - 2)  # group loop stops one early: the last group keeps the previous scale
        return qz, s[gs].T, g
    if fmt == "awq":
        q = unpack_awq(t["qweight"], plain=bug == "awq_plain_order")  # [K, N]
        z = unpack_awq(t["qzeros"], plain=bug == "awq_plain_order")  # [G, N]
        if bug == "awq_zero_plus1":
            z = z + 1
        s = _f64(t["scales"])
        g = np.arange(K) // G
        if bug == "awq_ntail_zero8" and N % 64:
            z = z.copy()
            z[:, N - N % 64:] = 8  # the tail tile of 64 columns takes the symmetric default
        return q.T.astype(np.float64) - z[g].T, s[g].T, g
    if fmt == "ct-pack-quantized":
        b = case.bits
        off = 1 << (b - 1)
        words = np.asarray(t["weight_packed"])
        if bug == "ct_channel_kfloor" and K % (32 // b):
            q = unpack(words[:, : K // (32 // b)], b, axis=1)
            q = np.concatenate([q, np.full((N, K - q.shape[1]), off)], axis=1)  # dropped tail reads as 0
        else:
            q = unpack(words, b, axis=1)[:, :K]
        q = q - off  # [N, K] signed
        s = _f64(t["weight_scale"])  # [N, K/G] or [N, 1]
        if "weight_zero_point" in t and not case.sym:
            if bug == "ct_zp_along_k":
                zp = unpack(t["weight_zero_point"], b, axis=1)[:, : s.shape[1]] - off
                zp = np.resize(zp, s.shape)
            else:
                zp = unpack(t["weight_zero_point"], b, axis=0)[:N] - off  # [N, K/G]
        else:
            zp = np.zeros(s.shape)
        ng = s.shape[1]
        if case.channelwise or ng == 1:
            g = np.zeros(K, np.int64)
        elif "weight_g_idx" in t and bug != "ct_gidx_ignored":
            g = np.asarray(t["weight_g_idx"]).astype(np.int64)
        else:
            g = np.arange(K) // (128 if bug == "ct_group128_hardcoded" else G)
            g = np.minimum(g, ng - 1)
        return q.astype(np.float64) - zp[:, g], s[:, g], g
    if fmt == "ct-int-quantized":
        w = np.asarray(t["weight"])
        q = w.view(np.uint8).astype(np.float64) if bug == "int8_as_uint8" else w.astype(np.float64)
        s = _f64(t["weight_scale"]).reshape(-1, 1)
        s = np.broadcast_to(s, (N, 1))
        return q, np.broadcast_to(s, (N, K)), np.zeros(K, np.int64)
    raise ValueError(fmt)


def dequant_int(case, t: dict, bug: str | None) -> np.ndarray:
    """W [N, K] = (q - z) * s computed exactly (float64) and rounded once to float32 (exact for 16-bit scales;
    with float32 scales that one rounding is part of the definition: docs/formats/gptq.md#dequantization)."""
    qz, s, _ = int_parts(case, t, bug)
    if bug == "scale_subnormal_ftz" and case.scale_dtype == "float16":
        s = np.where(np.abs(s) < 2.0 ** -14, 0.0, s)  # DAZ on fp16 subnormal scales
    return round_to(qz * s, "float32")


def dequant_mx(case, t: dict, bug: str | None) -> np.ndarray:
    """MXFP4 W [N, K] = E2M1(code) * 2**(byte - 127) (float64: exact)."""
    codes = unpack_e2m1(t["weight_packed"])
    if bug == "mx_nibble_swap":
        codes = codes.reshape(codes.shape[0], -1, 2)[:, :, ::-1].reshape(codes.shape)
    vals = E2M1[codes]
    byte = np.asarray(t["weight_scale"]).astype(np.int64)
    sc = e8m0(byte)
    if bug == "mx_ff_as_2p127":
        sc = np.where(byte == 255, 2.0 ** 127, sc)
    if bug == "mx_byte_shift_ftz":
        sc = np.where(byte == 0, 0.0, sc)  # (byte << 23) as fp32: byte 0 is +0, not 2**-127
    if bug == "mx_pair_tail" and sc.shape[1] % 2 and sc.shape[1] >= 3:
        sc = sc.copy()
        sc[:, -1] = sc[:, -2]  # blocks handled two at a time; the odd last block reuses its neighbour
    w = vals * np.repeat(sc, 32, axis=1)[:, : vals.shape[1]]
    if bug == "mx_fp16_weights":
        w = round_to(w, "float16")
    return w
