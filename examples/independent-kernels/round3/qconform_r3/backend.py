"""The adapters (docs/backends.md#interface). Correct arithmetic by default; ``NAME:bug=BUG`` plants one
defect while keeping the correct kernel's declaration, as a vendor unaware of the bug would."""

from __future__ import annotations

import numpy as np

from backends.base import Availability, Backend, Case, Declared, Prepared, Support, no, yes

from . import __version__
from .bugs import BUGS, check
from .decode import AWQ_ORDER, decode_int, dequant_int, dequant_mx, e8m0, fields, mx_codes  # noqa: F401
from .num import FMT, e2m1_code, e2m1_value, f64, rnd

F32 = np.float32


class _R3(Backend):
    priority = 0
    schemes_: tuple = ()

    def __init__(self, **params: str):
        super().__init__(**params)
        self.bug = params.get("bug") or None
        check(self.name, self.bug)

    def availability(self) -> Availability:
        return Availability(True, "NumPy kernel (round 3 of the independent check)", __version__, "cpu")

    def schemes(self) -> list[str]:
        return list(self.schemes_)

    def _out(self, acc: np.ndarray, case: Case) -> np.ndarray:
        T = case.output_dtype
        bug = self.bug
        if bug == "out_via_fp16" and T == "bfloat16":
            y = rnd(rnd(acc, "float16"), "bfloat16")
        else:
            y = rnd(acc, T)
        if bug == "out_satfinite":
            mx = FMT[T][2]
            y = np.where(np.isnan(y), y, np.clip(y, -mx, mx))
        return y.astype(np.float32)

    def _bias(self, acc, case, inputs):
        bias = inputs.get("bias")
        if bias is None:
            return acc
        b = f64(bias)
        if self.bug == "bias_to_bf16" and case.act_dtype != "bfloat16":
            b = rnd(b, "bfloat16")
        if self.bug == "m1_no_bias" and acc.shape[0] == 1:
            return acc
        return acc + b


# ---------------------------------------------------------------- A16 (W4A16 / W8A16)
class R3A16(_R3):
    name = "r3-a16"
    covers = "round-3 NumPy W4A16/W8A16: exact fp32 weights, float64 GEMM, bias in float64, one RNE output rounding"
    schemes_ = ("w4a16", "w8a16")

    def can_implement(self, case: Case) -> Support:
        if case.scheme not in self.schemes_:
            return no(f"only {', '.join(self.schemes_)}")
        if case.weight_format not in ("gptq", "awq", "ct-pack-quantized", "ct-int-quantized"):
            return no(f"weight format {case.weight_format}")
        return yes()

    def declared(self, case: Case) -> Declared:
        return Declared(variants={}, weight_dtype="exact", accumulate="float64", output=case.output_dtype,
                        notes="W = fl32((q - z) * s), float64 GEMM and bias, one RNE rounding")

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        data = {"w": dequant_int(case, tensors, self.bug)}
        if self.bug == "actorder_x_perm_only" and case.act_order:
            gi = tensors.get("g_idx", tensors.get("weight_g_idx"))
            if gi is not None:
                perm = np.argsort(np.asarray(gi).astype(np.int64), kind="stable")
                gs = np.asarray(gi).astype(np.int64)[perm]  # the sorted group map the kernel is given
                data["perm"] = perm
                data["w"] = self._perm_weights(case, tensors, gs)
        return Prepared(case, data)

    @staticmethod
    def _perm_weights(case, tensors, gs):
        # sorted position r multiplies the (unpermuted) code row of column r with the zero and scale of gs[r]
        t = dict(tensors)
        K = case.K
        fake = dict(t)
        key = "g_idx" if "g_idx" in t else "weight_g_idx"
        fake[key] = gs.astype(np.int32)
        qz_s, s2, _ = decode_int(case, fake, None)  # q[n, r] - z[gs[r], n]
        with np.errstate(all="ignore"):
            return (qz_s * s2[gs].T).astype(np.float32).astype(np.float64)[:, :K]

    def _gemm(self, case, xa, w):
        with np.errstate(all="ignore"):
            return xa @ w.T

    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        case, bug = prepared.case, self.bug
        xa = f64(x)
        if bug == "act_nan_to_num":
            mx = FMT[case.act_dtype][2]
            xa = np.nan_to_num(xa, nan=0.0, posinf=mx, neginf=-mx)
        if "perm" in prepared.data:
            xa = xa[:, prepared.data["perm"]]
        acc = self._gemm(case, xa, prepared.data["w"])
        acc = self._bias(acc, case, inputs)
        M = acc.shape[0]
        if bug == "m_tail_skipped" and M > 8 and M % 8:
            acc[M - M % 8:] = 0.0
        return self._out(acc, case)


class R3A16F32(R3A16):
    """fp32 weights and activations, fp32 products and split-K fp32 accumulation (chunks of 128 along K,
    partials added in fp32): declared accumulate=float32, the honest description of such a kernel."""

    name = "r3-a16-f32"
    covers = "round-3 NumPy W4A16/W8A16: fp32 split-K GEMM (K chunks of 128, fp32 partials), fp32 bias add"

    def declared(self, case: Case) -> Declared:
        return Declared(variants={}, weight_dtype="exact", accumulate="float32", output=case.output_dtype,
                        notes="W = fl32((q - z) * s); fp32 products and sums, split-K chunks of 128 combined in fp32; bias added in fp32")

    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        case, bug = prepared.case, self.bug
        xa = f64(x)
        w = prepared.data["w"]
        if bug == "tf32_products" and case.act_dtype == "float32":
            xa, w = rnd(xa, "tf32"), rnd(w, "tf32")
        x32, w32 = xa.astype(F32), w.astype(F32)
        K = x32.shape[1]
        b = inputs.get("bias")
        b32 = None if b is None else np.asarray(b).astype(F32)
        acc = np.zeros((x32.shape[0], w32.shape[0]), dtype=F32)
        with np.errstate(all="ignore"):
            for k0 in range(0, K, 128):
                part = x32[:, k0:k0 + 128] @ w32[:, k0:k0 + 128].T
                if bug == "splitk_bias_each" and b32 is not None:
                    part = part + b32
                acc = acc + part
            if b32 is not None and bug != "splitk_bias_each":
                acc = acc + b32
        return self._out(acc.astype(np.float64), case)


# ---------------------------------------------------------------- W4A16 MXFP4
class R3Mx16(R3A16):
    name = "r3-mx16"
    covers = "round-3 NumPy W4A16-MXFP4: E2M1 x E8M0 exact (0xFF -> NaN), float64 GEMM"
    schemes_ = ("w4a16-mxfp4",)

    def can_implement(self, case: Case) -> Support:
        if case.scheme != "w4a16-mxfp4" or case.weight_format != "ct-mxfp4":
            return no("only w4a16-mxfp4 ct-mxfp4")
        return yes()

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        return Prepared(case, {"w": dequant_mx(tensors, self.bug)})


# ---------------------------------------------------------------- int8 activations
def quant_int8(x, sym: bool):
    """docs/formats/activations.md, every step an IEEE fp32 op: codes, scale, azp (float64 holders)."""
    x32 = np.asarray(x, dtype=np.float64).astype(F32)
    lim = 2.0 ** 31 - 1
    with np.errstate(all="ignore"):
        if sym:
            amax = np.max(np.abs(x32), axis=1)
            scale = (amax / F32(127)).astype(F32)
            azp = np.zeros(x32.shape[0])
            safe = np.where(scale == 0, F32(1), scale)
            r = np.clip(np.rint((x32 / safe[:, None]).astype(F32).astype(np.float64)), -lim, lim)
        else:
            mx, mn = np.max(x32, axis=1), np.min(x32, axis=1)
            scale = ((mx - mn).astype(F32) / F32(255)).astype(F32)
            safe = np.where(scale == 0, F32(1), scale)
            m = (mn / safe).astype(F32)
            azp = np.clip(np.rint((F32(-128) - m).astype(F32).astype(np.float64)), -lim, lim)
            r = np.clip(np.rint((x32 / safe[:, None]).astype(F32).astype(np.float64)), -lim, lim) + azp[:, None]
        q = np.clip(r, -128, 127)
        zero = scale == 0
        q[zero] = 0
        azp = np.where(zero, 0.0, azp)
    return q, scale.astype(np.float64), azp


class R3W8A8(_R3):
    name = "r3-w8a8"
    covers = "round-3 NumPy W8A8: per-token int8 (sym / azp) in fp32 steps, exact integer dot, float64 epilogue"
    schemes_ = ("w8a8",)

    def can_implement(self, case: Case) -> Support:
        if case.scheme != "w8a8" or case.weight_format != "ct-int-quantized":
            return no("only w8a8 ct-int-quantized")
        return yes()

    def declared(self, case: Case) -> Declared:
        v = {} if case.act_symmetric else {"act_symmetric": False}
        return Declared(variants=v, weight_dtype="exact", accumulate="int32", output=case.output_dtype,
                        notes="per-token int8 per docs (fp32 steps); exact sum (qx - azp) qw; y = acc sx sw + b in float64")

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        qz, s, _ = decode_int(case, tensors, self.bug)
        return Prepared(case, {"qw": qz, "sw": s.reshape(-1)})

    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        case, bug, d = prepared.case, self.bug, prepared.data
        sym = case.act_symmetric or (bug == "w8a8_m1_sym" and x.shape[0] == 1)
        q, sx, azp = quant_int8(f64(x), sym)
        qw = d["qw"]
        if bug == "w8a8_vpmaddubsw_sat":
            u = q + 128.0  # uint8
            K = u.shape[1]
            if K % 2:
                u = np.concatenate([u, np.zeros((u.shape[0], 1))], axis=1)
                qw = np.concatenate([qw, np.zeros((qw.shape[0], 1))], axis=1)
            pair = (u[:, None, 0::2] * qw[None, :, 0::2] + u[:, None, 1::2] * qw[None, :, 1::2])
            pair = np.clip(pair, -32768, 32767)
            acc = pair.sum(-1) - (128.0 + azp)[:, None] * d["qw"].sum(1)[None, :]
        else:
            acc = (q - azp[:, None]) @ qw.T
        ss = sx[:, None] * d["sw"][None, :]
        b = inputs.get("bias")
        if bug == "w8a8_bias_int32" and b is not None:
            with np.errstate(all="ignore"):
                bi = np.rint(np.asarray(b, dtype=np.float64).astype(F32)[None, :] / ss.astype(F32)).astype(np.float64)
            bi = np.where(np.isfinite(bi), np.clip(bi, -(2.0 ** 31), 2.0 ** 31 - 1), 2.0 ** 31 - 1)
            y = (acc + bi) * ss
        else:
            y = self._bias(acc * ss, case, inputs)
        return self._out(y, case)


class R3W4A8(_R3):
    name = "r3-w4a8"
    covers = "round-3 NumPy W4A8: per-token sym int8, exact per-group integer dots (zero point by compensation), float64 combination"
    schemes_ = ("w4a8",)

    def can_implement(self, case: Case) -> Support:
        if case.scheme != "w4a8" or case.weight_format not in ("gptq", "ct-pack-quantized"):
            return no("only w4a8 gptq / ct-pack-quantized")
        return yes()

    def declared(self, case: Case) -> Declared:
        return Declared(variants={}, weight_dtype="exact", accumulate="float64", output=case.output_dtype,
                        notes="acc_g = sum qx q - z_g sum_g qx exact; y = sx sum_g sw_g acc_g + b in float64")

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        qz, s, g = decode_int(case, tensors, None)
        # the kernel keeps unsigned codes q and the per-group zero z separately (compensation form)
        t = tensors
        if case.weight_format == "gptq":
            q = fields(t["qweight"], case.bits, 0)[:case.K].T.astype(np.float64)
        else:
            q = fields(t["weight_packed"], case.bits, 1)[:, :case.K].astype(np.float64) - (1 << (case.bits - 1))
        z = q - qz  # [N, K]: the zero of column k's group
        return Prepared(case, {"q": q, "z": z, "s": s, "g": g})

    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        case, bug, d = prepared.case, self.bug, prepared.data
        xa = f64(x)
        q, z, s, g = d["q"], d["z"], d["s"], d["g"]
        M = xa.shape[0]
        tot = np.zeros((M, q.shape[0]))
        if bug != "w4a8_act_per_group":
            qx, sx, _ = quant_int8(xa, True)
            rowsum_all = qx.sum(1)
        for gg in range(s.shape[0]):
            cols = np.nonzero(g == gg)[0]
            if not cols.size:
                continue
            if bug == "w4a8_act_per_group":
                qx_g, sx_g, _ = quant_int8(xa[:, cols], True)
                qxc = qx_g
            else:
                qxc = qx[:, cols]
            zg = z[:, cols[0]]  # one zero per (group, row)
            sumx = rowsum_all if bug == "w4a8_comp_rowsum_not_group" else qxc.sum(1)
            acc = qxc @ q[:, cols].T - sumx[:, None] * zg[None, :]
            with np.errstate(all="ignore"):
                if bug == "w4a8_act_per_group":
                    tot += sx_g[:, None] * (acc * s[gg][None, :])
                else:
                    tot += acc * s[gg][None, :]
        y = tot if bug == "w4a8_act_per_group" else sx[:, None] * tot
        return self._out(self._bias(y, case, inputs), case)


# ---------------------------------------------------------------- W4A4 MXFP4
def quant_mx(x, bug=None):
    """docs/formats/mxfp4.md canonical quantization: codes [M, K] (uint8) and scale bytes [M, K/32]."""
    M, K = x.shape
    xb = np.asarray(x, dtype=np.float64).astype(F32).astype(np.float64).reshape(M, K // 32, 32)
    with np.errstate(all="ignore"):
        amax = np.max(np.abs(xb), axis=2)  # NaN propagates
        bad = ~np.isfinite(amax)
        _, e = np.frexp(np.where(bad | (amax == 0), 1.0, amax))
        lo = -126 if bug == "w4a4_exp_min_126" else -127
        s = np.clip(e - 1 - 2, lo, 127)
        s = np.where(amax == 0, lo, s)
        quo = xb / np.ldexp(1.0, s)[:, :, None]
        codes = e2m1_code(quo, tie5_up=bug == "e2m1_threshold_5")
        byte = np.where(bad, 255, s + 127)
        codes = np.where(bad[:, :, None], 0, codes)
    return codes.reshape(M, K).astype(np.uint8), byte.astype(np.uint8)


class R3W4A4(_R3):
    name = "r3-w4a4"
    covers = "round-3 NumPy W4A4-MXFP4: FLOOR scales, RNE E2M1 saturating at 6, exact block products, float64 sum"
    schemes_ = ("w4a4-mxfp4",)

    def can_implement(self, case: Case) -> Support:
        if case.scheme != "w4a4-mxfp4" or case.weight_format != "ct-mxfp4":
            return no("only w4a4-mxfp4 ct-mxfp4")
        return yes()

    def declared(self, case: Case) -> Declared:
        return Declared(variants={}, weight_dtype="exact", accumulate="float64", output=case.output_dtype,
                        notes="activations per OCP MX FLOOR + RNE; y = sum_b 2^(sx+sw) sum e2m1 e2m1 + b, float64")

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        c, sb = mx_codes(tensors)
        return Prepared(case, {"wv": e2m1_value(c), "ws": e8m0(sb)})

    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        case, d = prepared.case, prepared.data
        codes, byte = quant_mx(f64(x), self.bug)
        xv = e2m1_value(codes)
        xs = e8m0(byte)
        M, K = xv.shape
        wv, ws = d["wv"], d["ws"]
        y = np.zeros((M, wv.shape[0]))
        with np.errstate(all="ignore"):
            for bb in range(K // 32):
                sl = slice(32 * bb, 32 * bb + 32)
                y = y + (xv[:, sl] @ wv[:, sl].T) * (xs[:, bb][:, None] * ws[:, bb][None, :])
        return self._out(self._bias(y, case, inputs), case)


# ---------------------------------------------------------------- W4A16 MoE
class R3Moe(_R3):
    name = "r3-moe"
    covers = "round-3 NumPy W4A16 MoE (GPTQ sym int4 experts): float64 routing and GEMMs, intermediate in the act dtype"
    schemes_ = ("w4a16-moe",)

    def can_implement(self, case: Case) -> Support:
        if case.scheme != "w4a16-moe" or case.weight_format != "gptq":
            return no("only w4a16-moe gptq")
        return yes()

    def declared(self, case: Case) -> Declared:
        return Declared(variants={}, weight_dtype="exact", accumulate="float64", output=case.output_dtype,
                        notes="float64 softmax, top-k (ties: lower index), renormalize; a = silu(gate) up rounded to the act dtype")

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        q13 = fields(tensors["w13_qweight"], 4, 1).astype(np.float64) - 8  # [E, K, 2I]
        s13 = f64(tensors["w13_scales"])  # [E, K/G, 2I]
        q2 = fields(tensors["w2_qweight"], 4, 1).astype(np.float64) - 8  # [E, I, K]
        s2 = f64(tensors["w2_scales"])  # [E, I/G2, K]
        E, K, I2 = q13.shape
        I = I2 // 2
        if self.bug == "moe_scales_expert0":
            s13 = np.broadcast_to(s13[:1], s13.shape)
        g13 = np.arange(K) // (K // s13.shape[1])
        g2 = np.arange(I) // (I // s2.shape[1])
        with np.errstate(all="ignore"):
            w13 = (q13 * s13[:, g13, :]).astype(np.float32).astype(np.float64)  # [E, K, 2I]
            w2 = (q2 * s2[:, g2, :]).astype(np.float32).astype(np.float64)  # [E, I, K]
        return Prepared(case, {"w13": w13, "w2": w2, "I": I})

    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        case, bug, d = prepared.case, self.bug, prepared.data
        xa = f64(x)
        lg = f64(inputs["router_logits"])
        if bug == "moe_logits_to_act_dtype":
            lg = rnd(lg, case.act_dtype)
        M, E = lg.shape
        k = case.top_k
        with np.errstate(all="ignore"):
            z = np.exp(lg - lg.max(axis=1, keepdims=True))
            p = z / z.sum(axis=1, keepdims=True)
        ids = np.argsort(-p, axis=1, kind="stable")[:, :k]
        if bug == "moe_topk_duplicate":
            ids = np.repeat(ids[:, :1], k, axis=1)
        w = np.take_along_axis(p, ids, axis=1)
        if not (bug == "moe_top1_no_renorm" and k == 1):
            w = w / w.sum(axis=1, keepdims=True)
        I = d["I"]
        idt = "float16" if bug == "moe_intermediate_fp16" else case.act_dtype
        pairs = [(m, j) for m in range(M) for j in range(k)]
        order = sorted(range(len(pairs)), key=lambda r: (ids[pairs[r][0], pairs[r][1]], r))  # expert-sorted
        y = np.zeros((M, xa.shape[1]))
        with np.errstate(all="ignore"):
            for r_sorted, r in enumerate(order):
                m, j = pairs[r]
                e = ids[m, j]
                h = xa[m] @ d["w13"][e]
                gate, up = h[:I], h[I:]
                a = rnd(gate / (1.0 + np.exp(-gate)) * up, idt)
                o = w[m, j] * (a @ d["w2"][e])
                row = r_sorted // k if bug == "moe_scatter_sorted_order" else m
                y[row] = y[row] + o
        return self._out(self._bias(y, case, inputs), case)


# ---------------------------------------------------------------- quantize-only
class R3Quant(_R3):
    name = "r3-q"
    covers = "round-3 NumPy activation quantizers: per-token int8 (sym/asym), ONNX per-tensor uint8, MXFP4"
    schemes_ = ("q-int8-token", "q-uint8-tensor", "q-mxfp4")

    def can_implement(self, case: Case) -> Support:
        if case.scheme not in self.schemes_:
            return no("quantize-only schemes only")
        return yes()

    def declared(self, case: Case) -> Declared:
        v = {} if case.act_symmetric or case.scheme != "q-int8-token" else {"act_symmetric": False}
        return Declared(variants=v, weight_dtype="exact", accumulate="float64", output="float32",
                        notes="the canonical quantizers of docs/formats/activations.md and mxfp4.md")

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        return Prepared(case, {})

    def run(self, prepared, x, **inputs):
        raise RuntimeError("quantize-only backend")

    def _deq(self, v, case):
        if self.bug == "q_dequant_fp32":
            return rnd(v, "float32").astype(np.float32)
        return rnd(v, case.act_dtype).astype(np.float32)

    def quantize(self, prepared: Prepared, x: np.ndarray) -> dict:
        case, bug = prepared.case, self.bug
        xa = f64(x)
        if case.scheme == "q-int8-token":
            sym = case.act_symmetric
            q, sx, azp = quant_int8(xa, sym)
            out = {"codes": q.astype(np.int8), "scale": sx.astype(np.float32).reshape(-1, 1),
                   "dequantized": self._deq((q - azp[:, None]) * sx[:, None], case)}
            if not sym:
                out["zero_point"] = ((-azp) if bug == "qint8_zp_sign" else azp).astype(np.int32).reshape(-1, 1)
            return out
        if case.scheme == "q-uint8-tensor":
            x32 = xa.astype(F32)
            with np.errstate(all="ignore"):
                rmax, rmin = max(F32(0), np.max(x32)), min(F32(0), np.min(x32))
                scale = F32(F32(1) / F32(255)) if rmax == rmin else F32(F32(rmax - rmin) / F32(255))
                zf = float(F32(F32(0) - F32(rmin / scale)))
                zf = min(max(zf, 0.0), 255.0)
                zp = float(np.trunc(zf)) if bug == "qu8_zp_trunc" else float(np.rint(zf))
                q = np.clip(np.rint((x32 / scale).astype(F32).astype(np.float64)) + zp, 0, 255)
            return {"codes": q.astype(np.uint8), "scale": np.array([scale], dtype=np.float32),
                    "zero_point": np.array([zp], dtype=np.uint8),
                    "dequantized": self._deq((q - zp) * float(scale), case)}
        # q-mxfp4
        M, K = xa.shape
        xb = xa.astype(F32).astype(np.float64).reshape(M, K // 32, 32)
        with np.errstate(all="ignore"):
            amax = np.max(np.abs(xb), axis=2)
            bad = ~np.isfinite(amax)
            _, e = np.frexp(np.where(bad | (amax == 0), 1.0, amax))
            s = np.where(amax == 0, -127, np.clip(e - 3, -127, 127))
            codes = e2m1_code(xb / np.ldexp(1.0, s)[:, :, None], zero_positive=bug == "qmx_zero_sign")
            codes = np.where(bad[:, :, None], 0, codes).reshape(M, K).astype(np.uint8)
            byte = np.where(bad, 255, s + 127).astype(np.uint8)
            val = e2m1_value(codes)
            if bug == "qmx_dequant_ldexp":
                sc = np.ldexp(1.0, byte.astype(np.int64) - 127)
            else:
                sc = e8m0(byte)
            deq = val * np.repeat(sc, 32, axis=1)
        return {"codes": codes, "scale": byte, "dequantized": self._deq(deq, case)}


ALL = {c.name: c for c in (R3A16, R3A16F32, R3Mx16, R3W8A8, R3W4A8, R3W4A4, R3Moe, R3Quant)}
for _n in ALL:
    BUGS.setdefault(_n, {})
