"""The adapters (docs/backends.md#interface). Correct arithmetic by default; ``NAME:bug=BUG`` plants one
defect while keeping the correct kernel's declaration, as a vendor unaware of the bug would."""

from __future__ import annotations

import numpy as np

from backends.base import Availability, Backend, Case, Declared, Prepared, Support, no, yes

from . import __version__
from .bugs import BUGS, check
from .num import as_f64, e2m1_round, round_to
from .weights import decode_int, dequant_int, dequant_mx, e8m0, mx_codes, unpack


class _R2(Backend):
    priority = 0
    schemes_: tuple = ()

    def __init__(self, **params: str):
        super().__init__(**params)
        self.bug = params.get("bug") or None
        check(self.name, self.bug)

    def availability(self) -> Availability:
        return Availability(True, "NumPy kernel (round 2 of the independent check)", __version__, "cpu")

    def schemes(self) -> list[str]:
        return list(self.schemes_)

    def _out(self, acc: np.ndarray, case: Case) -> np.ndarray:
        mode = "rtz" if self.bug == "out_rtz" and case.output_dtype == "bfloat16" else "rne"
        return round_to(acc, case.output_dtype, mode).astype(np.float32)


# ---------------------------------------------------------------- A16 (W4A16 / W8A16)
class R2A16(_R2):
    name = "r2-a16"
    covers = "round-2 NumPy W4A16/W8A16: exact fp32 weights, float64 GEMM, one RNE output rounding"
    schemes_ = ("w4a16", "w8a16")
    weight_dtype = "exact"

    def can_implement(self, case: Case) -> Support:
        if case.scheme not in self.schemes_:
            return no(f"only {', '.join(self.schemes_)}")
        if case.weight_format not in ("gptq", "awq", "ct-pack-quantized", "ct-int-quantized"):
            return no(f"weight format {case.weight_format}")
        return yes()

    def declared(self, case: Case) -> Declared:
        return Declared(variants={}, weight_dtype=self.weight_dtype, accumulate="float64", output=case.output_dtype,
                        notes="W = fl32((q - z) * s) exactly, float64 GEMM, bias in float64, one RNE rounding")

    def _weights(self, case, tensors, bug):
        return dequant_int(case, tensors, bug)

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        w = self._weights(case, tensors, self.bug)
        data = {"w": w}
        if self.bug == "m1_sym_zero":
            data["w"] = self._weights(case, tensors, None)
            if case.weight_format in ("gptq", "awq"):
                data["w_m1"] = self._weights(case, tensors, "m1_sym_zero")
        return Prepared(case, data)

    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        case, bug = prepared.case, self.bug
        xa = as_f64(x)
        w = prepared.data["w"]
        if bug == "m1_sym_zero" and xa.shape[0] == 1 and "w_m1" in prepared.data:
            w = prepared.data["w_m1"]
        if bug == "act_to_bf16" and case.act_dtype == "float32":
            xa = round_to(xa, "bfloat16")
        K = xa.shape[1]
        if bug == "k_tail_dropped" and K >= 128 and K % 128:
            xa, w = xa[:, : K - K % 128], w[:, : K - K % 128]
        if bug == "skip_zero_weights":
            p = xa[:, None, :] * w[None, :, :]
            acc = np.where(w[None] == 0, 0.0, p).sum(-1)
        else:
            with np.errstate(invalid="ignore", over="ignore"):
                acc = xa @ w.T
        N = acc.shape[1]
        if bug == "n_tail_zero" and N >= 64 and N % 64:
            acc[:, N - N % 64:] = 0.0
        bias = inputs.get("bias")
        if bias is not None and bug != "bias_after_round":
            acc = acc + as_f64(bias)
        y = self._out(acc, case)
        if bias is not None and bug == "bias_after_round":
            y = round_to(as_f64(y) + as_f64(bias), case.output_dtype).astype(np.float32)
        return y


class R2A16Bf16Weights(R2A16):
    name = "r2-a16-bf16w"
    covers = "round-2 NumPy W4A16/W8A16: fp32 dequantization rounded once to bf16, float64 GEMM"

    def declared(self, case: Case) -> Declared:
        return Declared(variants={"weight_formation": "float32_then_round"}, weight_dtype="bfloat16",
                        accumulate="float64", output=case.output_dtype,
                        notes="W = bf16(fl32((q - z) * s)) (RNE once), float64 GEMM, one RNE output rounding")

    def _weights(self, case, tensors, bug):
        return round_to(dequant_int(case, tensors, bug), "bfloat16")


# ---------------------------------------------------------------- W4A16 MXFP4
class R2Mx16(R2A16):
    name = "r2-mx16"
    covers = "round-2 NumPy W4A16-MXFP4: E2M1 x E8M0 exact, float64 GEMM"
    schemes_ = ("w4a16-mxfp4",)

    def can_implement(self, case: Case) -> Support:
        if case.scheme != "w4a16-mxfp4" or case.weight_format != "ct-mxfp4":
            return no("only w4a16-mxfp4 ct-mxfp4")
        return yes()

    def declared(self, case: Case) -> Declared:
        return Declared(variants={}, weight_dtype="exact", accumulate="float64", output=case.output_dtype,
                        notes="W = fl32(E2M1[code] * 2^(byte-127)), 0xFF -> NaN; float64 GEMM; one RNE rounding")

    def _weights(self, case, tensors, bug):
        return dequant_mx(tensors, bug)


# ---------------------------------------------------------------- int8 activations
def quant_int8(x: np.ndarray, sym: bool, bug: str | None):
    """Per-token int8 (docs/formats/activations.md), every step an IEEE fp32 operation.
    Returns codes (float64 integers), scale (float64 holding fp32), azp (float64 integers)."""
    f = np.float32
    x32 = np.asarray(x, dtype=f)
    M = x32.shape[0]
    with np.errstate(all="ignore"):
        if sym:
            amax = np.max(np.abs(x32), axis=1)
            if bug == "w4a8_per_tensor_act":
                amax = np.full(M, amax.max(), dtype=f)
            div = f(128) if bug == "w4a8_amax_128" else f(127)
            scale = (amax / div).astype(f)
            azp = np.zeros(M, dtype=np.float64)
            lo = np.zeros(M, dtype=f)
        else:
            mx, mn = np.max(x32, axis=1), np.min(x32, axis=1)
            if bug == "w8a8_zero_inclusive":
                mx, mn = np.maximum(mx, f(0)), np.minimum(mn, f(0))
            rng = (mx - mn).astype(f)
            if bug == "w8a8_const_row_eps":
                rng = np.maximum(rng, f(1e-10))
            scale = (rng / f(255)).astype(f)
            lo = mn
        safe = np.where(scale == 0, f(1), scale)
        if bug == "w8a8_recip":
            quot = (x32 * (f(1) / safe)[:, None].astype(f)).astype(f)
        else:
            quot = (x32 / safe[:, None]).astype(f)
        if bug == "w8a8_rhaz":
            r = np.sign(quot) * np.floor(np.abs(quot).astype(np.float64) + 0.5)
        else:
            r = np.rint(quot.astype(np.float64))
        if not sym:
            zq = (f(-128) - (lo / safe).astype(f)).astype(f)
            azp = np.clip(np.rint(zq.astype(np.float64)), -(2.0 ** 31 - 1), 2.0 ** 31 - 1)
            r = np.clip(r, -(2.0 ** 31 - 1), 2.0 ** 31 - 1) + azp[:, None]
        qmin = -127.0 if bug == "w8a8_clamp127" else -128.0
        q = np.clip(r, qmin, 127.0)
        zero = scale == 0
        q[zero] = 0.0
        azp = np.where(zero, 0.0, azp)
    return q, scale.astype(np.float64), azp


class R2W8A8(_R2):
    name = "r2-w8a8"
    covers = "round-2 NumPy W8A8: per-token int8 (sym / azp) in fp32 steps, exact integer dot, float64 epilogue"
    schemes_ = ("w8a8",)

    def can_implement(self, case: Case) -> Support:
        if case.scheme != "w8a8" or case.weight_format != "ct-int-quantized":
            return no("only w8a8 ct-int-quantized")
        return yes()

    def declared(self, case: Case) -> Declared:
        v = {} if case.act_symmetric else {"act_symmetric": False}
        return Declared(variants=v, weight_dtype="exact", accumulate="int32", output=case.output_dtype,
                        notes="codes per docs/formats/activations.md (fp32 steps, RNE, saturate); exact int dot with "
                              "the zero point removed by row-sum compensation; y = acc * sx * sw + b in float64")

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        qw, sw, _ = decode_int(case, tensors, None)
        K = qw.shape[1]
        kk = K - K % 32 if self.bug == "w8a8_rowsum_k_tail" else K
        rowsum = qw[:, :kk].sum(axis=1)
        if self.bug == "w8a8_rowsum_int16":
            rowsum = rowsum.astype(np.int64).astype(np.int16).astype(np.float64)
        return Prepared(case, {"qw": qw, "sw": sw.reshape(-1), "rowsum": rowsum})

    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        case, bug, d = prepared.case, self.bug, prepared.data
        q, sx, azp = quant_int8(as_f64(x), case.act_symmetric, bug)
        acc = q @ d["qw"].T
        corr = azp[:, None] * d["rowsum"][None, :]
        acc = acc + corr if bug == "w8a8_azp_sign" else acc - corr
        M = acc.shape[0]
        if bug == "w8a8_sx_bf16" and case.act_dtype == "bfloat16":
            sx = round_to(sx, "bfloat16")
        if bug == "w8a8_m_tail_scale" and M > 4 and M % 4:
            sx = sx.copy()
            sx[M - M % 4:] = sx[M - M % 4 - 1]
        y = acc * (sx[:, None] * d["sw"][None, :])
        bias = inputs.get("bias")
        if bias is not None:
            y = y + as_f64(bias)
        return self._out(y, case)


class R2W4A8(_R2):
    name = "r2-w4a8"
    covers = "round-2 NumPy W4A8: per-token sym int8 activations, exact per-group integer dots, float64 combination"
    schemes_ = ("w4a8",)

    def can_implement(self, case: Case) -> Support:
        if case.scheme != "w4a8" or case.weight_format not in ("gptq", "awq", "ct-pack-quantized"):
            return no("only w4a8 with int4 gptq/awq/ct weights")
        if not case.act_symmetric:
            return no("symmetric activations only")
        return yes()

    def declared(self, case: Case) -> Declared:
        return Declared(variants={}, weight_dtype="exact", accumulate="float64", output=case.output_dtype,
                        notes="acc_g exact per group; y = sx * sum_g sw_g acc_g + b in float64; one RNE rounding")

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        qz, sw, gidx = decode_int(case, tensors, None)
        if self.bug == "w4a8_hardcoded_g32":
            gidx = np.minimum(np.arange(qz.shape[1]) // 32, sw.shape[0] - 1)
        return Prepared(case, {"qz": qz, "sw": sw, "gidx": gidx})

    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        case, bug, d = prepared.case, self.bug, prepared.data
        q, sx, _ = quant_int8(as_f64(x), True, bug)
        qz, sw, gidx = d["qz"], d["sw"], d["gidx"]
        G = sw.shape[0]
        if bug == "w4a8_single_scale":
            tot = (q @ qz.T) * sw[0][None, :]
        else:
            tot = np.zeros((q.shape[0], qz.shape[0]))
            for g in range(G):
                cols = gidx == g
                if cols.any():
                    tot += (q[:, cols] @ qz[:, cols].T) * sw[g][None, :]
        y = sx[:, None] * tot
        bias = inputs.get("bias")
        if bias is not None:
            y = y + as_f64(bias)
        return self._out(y, case)


# ---------------------------------------------------------------- W4A4 MXFP4
def quant_mx(x: np.ndarray, bug: str | None):
    """OCP MX v1.0 6.3, FLOOR scale, RNE E2M1 elements: returns (element values [M, K], scale [M, K/32])."""
    M, K = x.shape
    xb = np.asarray(x, dtype=np.float32).astype(np.float64).reshape(M, K // 32, 32)
    with np.errstate(all="ignore"):
        a = np.abs(xb)
        amax = np.nanmax(a, axis=2) if bug == "w4a4_nan_ignored" else np.max(a, axis=2)
        bad = ~np.isfinite(amax)
        if bug == "w4a4_amax_via_bf16":
            amax = round_to(amax, "bfloat16")
        _, e = np.frexp(amax)
        fl = e - 1  # floor(log2 amax)
        if bug == "w4a4_rceil":
            t = amax / 6.0
            _, e6 = np.frexp(t)
            s = np.where(t == np.ldexp(0.5, e6), e6 - 1, e6)  # ceil(log2(amax / 6))
        else:
            s = fl - 2
        s = np.clip(s, -127, 127)
        s = np.where(amax == 0, -127, s)
        scale = np.ldexp(1.0, s)
        xs = xb / scale[:, :, None]
        if bug == "w4a4_nan_ignored":
            xs = np.where(np.isnan(xs), 0.0, xs)
        el = e2m1_round(xs, "rhaz" if bug == "w4a4_rhaz" else "rne")
        scale = np.where(bad, np.nan, scale)
    return el.reshape(M, K), scale


class R2W4A4(_R2):
    name = "r2-w4a4"
    covers = "round-2 NumPy W4A4-MXFP4: FLOOR scales, RNE elements, exact block products, float64 sum"
    schemes_ = ("w4a4-mxfp4",)

    def can_implement(self, case: Case) -> Support:
        if case.scheme != "w4a4-mxfp4" or case.weight_format != "ct-mxfp4":
            return no("only w4a4-mxfp4 ct-mxfp4")
        return yes()

    def declared(self, case: Case) -> Declared:
        return Declared(variants={}, weight_dtype="exact", accumulate="float64", output=case.output_dtype,
                        notes="activations: FLOOR scale, RNE E2M1 saturating at 6, NaN/Inf block -> NaN; "
                              "sum over blocks of 2^(sx+sw) * block dot, float64")

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        from .num import e2m1_decode
        c, sb = mx_codes(tensors, None)
        return Prepared(case, {"wv": e2m1_decode(c), "ws": e8m0(sb)})

    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        case, d = prepared.case, prepared.data
        el, sx = quant_mx(as_f64(x), self.bug)
        M, K = el.shape
        nb = K // 32
        wv, ws = d["wv"], d["ws"]  # [N, K], [N, nb]
        y = np.zeros((M, wv.shape[0]))
        with np.errstate(all="ignore"):
            for b in range(nb):
                blk = el[:, 32 * b: 32 * b + 32] @ wv[:, 32 * b: 32 * b + 32].T
                y = y + blk * (sx[:, b][:, None] * ws[:, b][None, :])
        bias = inputs.get("bias")
        if bias is not None:
            y = y + as_f64(bias)
        return self._out(y, case)


# ---------------------------------------------------------------- W4A16 MoE
def _silu(g):
    with np.errstate(over="ignore", invalid="ignore"):
        return g / (1.0 + np.exp(-g))


class R2Moe(_R2):
    name = "r2-moe"
    covers = "round-2 NumPy W4A16 MoE (vLLM FusedMoE GPTQ sym int4 experts), float64 routing and GEMMs"
    schemes_ = ("w4a16-moe",)

    def can_implement(self, case: Case) -> Support:
        if case.scheme != "w4a16-moe" or case.weight_format != "gptq":
            return no("only w4a16-moe gptq")
        return yes()

    def declared(self, case: Case) -> Declared:
        return Declared(variants={}, weight_dtype="exact", accumulate="float64", output=case.output_dtype,
                        notes="softmax/top-k (ties: lower index)/renormalize in float64; h = x W13^T exact weights; "
                              "a = silu(gate) * up rounded to the activation dtype; y = sum_j w_j a W2^T, one RNE")

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        q13 = unpack(tensors["w13_qweight"], 4, axis=1)  # [E, K, 2I]
        s13 = as_f64(tensors["w13_scales"])  # [E, K/G, 2I]
        q2 = unpack(tensors["w2_qweight"], 4, axis=1)  # [E, I, K]
        s2 = as_f64(tensors["w2_scales"])  # [E, I/G2, K]
        E, K, I2 = q13.shape
        I = I2 // 2
        G13 = K // s13.shape[1]
        G2 = I // s2.shape[1]
        if self.bug == "moe_w2_group_from_hidden":
            G2 = max(K // s2.shape[1], 1)
        w13 = ((q13 - 8) * s13[:, np.arange(K) // G13, :]).astype(np.float32).astype(np.float64)
        r2 = np.minimum(np.arange(I) // G2, s2.shape[1] - 1)
        w2 = ((q2 - 8) * s2[:, r2, :]).astype(np.float32).astype(np.float64)
        if self.bug == "moe_w2_next_expert":
            w2 = np.roll(w2, -1, axis=0)
        return Prepared(case, {"w13": w13, "w2": w2, "I": I})

    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        case, bug, d = prepared.case, self.bug, prepared.data
        xa = as_f64(x)
        lg = as_f64(inputs["router_logits"])
        M, E = lg.shape
        k = case.top_k
        with np.errstate(all="ignore"):
            z = np.exp(lg - lg.max(axis=1, keepdims=True))
            p = z / z.sum(axis=1, keepdims=True)
        if bug == "moe_softmax_fp16":
            p = round_to(p, "float16")
        if bug == "moe_tie_higher":
            ids = np.argsort(-p[:, ::-1], axis=1, kind="stable")[:, :k]
            ids = E - 1 - ids
        else:
            ids = np.argsort(-p, axis=1, kind="stable")[:, :k]
        w = np.take_along_axis(p, ids, axis=1)
        if bug != "moe_no_renorm":
            w = w / (w.sum(axis=1, keepdims=True) + (1e-6 if bug == "moe_renorm_eps" else 0.0))
        I = d["I"]
        y = np.zeros((M, xa.shape[1]))
        with np.errstate(all="ignore"):
            for m in range(M):
                for j in range(k):
                    e = ids[m, j]
                    h = xa[m] @ d["w13"][e]
                    gate, up = h[:I], h[I:]
                    if bug == "moe_gate_up_swapped":
                        gate, up = up, gate
                    act = (1.0 / (1.0 + np.exp(-gate))) * up if bug == "moe_sigmoid_not_silu" else _silu(gate) * up
                    if bug != "moe_intermediate_no_round" or case.act_dtype == "float32":
                        act = round_to(act, case.act_dtype)
                    o = w[m, j] * (act @ d["w2"][e])
                    y[m] = o if bug == "moe_scatter_overwrite" else y[m] + o
        bias = inputs.get("bias")
        if bias is not None:
            y = y + as_f64(bias)
        return self._out(y, case)


ALL = {c.name: c for c in (R2A16, R2A16Bf16Weights, R2Mx16, R2W8A8, R2W4A8, R2W4A4, R2Moe)}
assert set(ALL) == set(BUGS), "every backend has its bug table"
