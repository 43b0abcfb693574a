"""qconform adapters of the independent kernels. ``--backend NAME:bug=BUG`` plants one defect.

Declarations (docs/variants.md) are what the *correct* kernel does; a buggy kernel keeps the correct
kernel's declaration, as a vendor who does not know about the bug would.
"""

from __future__ import annotations

import numpy as np

from backends.base import Availability, Backend, Case, Declared, Prepared, Support, no, yes

from . import __version__
from .activations import int8_per_token, mx_quantize
from .numerics import e8m0, round_to
from .weights import dequant_int, dequant_mx, int_parts

BUGS_A16 = ("gptq_v1_no_plus1", "gptq_v2_plus1", "gptq_v1_wrap", "gptq_sym_assumed", "gptq8_sym_assumed",
            "gptq_gidx_ignored", "gptq_gidx_inverse", "last_group_prev_scale", "nibble_high_first",
            "awq_plain_order", "awq_zero_plus1", "awq_ntail_zero8", "ct_channel_kfloor", "ct_zp_along_k",
            "ct_gidx_ignored", "ct_group128_hardcoded", "int8_as_uint8", "scale_subnormal_ftz",
            "k_tail128_dropped", "n_tail16_dropped", "m1_rtz_output", "bias_after_rounding",
            "fp16_partial_sums", "mx_nibble_swap", "mx_ff_as_2p127", "mx_byte_shift_ftz", "mx_pair_tail",
            "mx_fp16_weights")
BUGS_INT8 = ("act_rhaz", "act_scale_recip_mul", "act_zero_row_nan", "act_no_saturation", "asym_zero_inclusive",
             "asym_zp_uint8_domain", "azp_rowsum_int16", "w4a8_group_acc_int16", "w4a8_scale_group0",
             "bias_after_rounding", "m1_rtz_output")
BUGS_MX = ("mx_nan_skipped", "mx_log2_float", "mx_scale_ceil", "mx_no_saturation", "mx_elem_rhaz",
           "mx_ff_as_2p127", "mx_byte_shift_ftz", "bias_after_rounding")


def _to_out(acc: np.ndarray, case: Case, bug: str | None, bias) -> np.ndarray:
    """float64 accumulator (+ bias) rounded once to the output dtype (RNE)."""
    out = case.output_dtype
    mode = "rtz" if bug == "m1_rtz_output" and acc.shape[0] == 1 else "rne"
    if bias is not None and bug != "bias_after_rounding":
        acc = acc + np.asarray(bias, np.float64)
    y = round_to(acc, out, mode)
    if bias is not None and bug == "bias_after_rounding":
        y = round_to(y + np.asarray(bias, np.float64), out)
    return y.astype(np.float32)


class _Base(Backend):
    schemes_: tuple[str, ...] = ()
    bugs: tuple[str, ...] = ()

    def __init__(self, **params: str):
        super().__init__(**params)
        self.bug = params.get("bug") or None
        if self.bug is not None and self.bug not in self.bugs:
            raise ValueError(f"unknown bug {self.bug!r}; known: {', '.join(self.bugs)}")

    def availability(self) -> Availability:
        return Availability(True, "NumPy kernel", __version__, "cpu")

    def schemes(self) -> list[str]:
        return list(self.schemes_)

    def can_implement(self, case: Case) -> Support:
        if case.scheme not in self.schemes_:
            return no(f"only {', '.join(self.schemes_)} (got {case.scheme})")
        if case.E:
            return no("no MoE")
        return yes()

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        return Prepared(case, dict(tensors))


class IndepA16(_Base):
    """W4A16 / W8A16 (GPTQ, AWQ, compressed-tensors) and W4A16-MXFP4: exact float64 weights, float64 GEMM."""

    name = "indep-a16"
    covers = "independent check: exact weights, float64 GEMM, one RNE output rounding"
    schemes_ = ("w4a16", "w8a16", "w4a16-mxfp4")
    bugs = BUGS_A16

    def declared(self, case: Case) -> Declared:
        return Declared(variants={}, weight_dtype="exact", accumulate="float64", output=case.output_dtype,
                        output_rounding="rne", notes="W exact in float64, x @ W^T in float64, one RNE rounding")

    def weights(self, case, t):
        return dequant_mx(case, t, self.bug) if case.scheme == "w4a16-mxfp4" else dequant_int(case, t, self.bug)

    def run(self, prepared: Prepared, x: np.ndarray, **inputs) -> np.ndarray:
        case, bug = prepared.case, self.bug
        w = self.weights(case, prepared.data)  # [N, K]
        x = np.asarray(x).astype(np.float64)
        M, K = x.shape
        N = w.shape[0]
        if bug == "k_tail128_dropped" and K % 128 and K > 128:
            Kb = K - K % 128  # the K loop runs in blocks of 128; the remainder is never visited
            x, w = x[:, :Kb], w[:, :Kb]
        with np.errstate(all="ignore"):
            if bug == "fp16_partial_sums":
                acc = np.zeros((M, N))
                for k0 in range(0, x.shape[1], 64):  # per-block partial sums stored in fp16
                    acc = acc + round_to(x[:, k0:k0 + 64] @ w[:, k0:k0 + 64].T, "float16")
            else:
                acc = x @ w.T
        if bug == "n_tail16_dropped" and N % 16 and N > 16:
            acc[:, N - N % 16:] = 0.0
        return _to_out(acc, case, bug, inputs.get("bias"))


class IndepA16Bf16Weights(IndepA16):
    """Dequantize in fp32 (fl32((q - z) * s)), round each weight once to bf16 (RNE), multiply (float64 sums)."""

    name = "indep-a16-bf16w"
    covers = "independent check: fp32 dequant, weights rounded once to bf16, float64 GEMM"

    def declared(self, case: Case) -> Declared:
        return Declared(variants={"weight_formation": "float32_then_round"}, weight_dtype="bfloat16",
                        accumulate="float64", output=case.output_dtype, output_rounding="rne",
                        notes="w = bf16(fl32((q - z) * fl32(s))); float64 GEMM; one RNE output rounding")

    def weights(self, case, t):
        if case.scheme == "w4a16-mxfp4":
            w = dequant_mx(case, t, self.bug)
        else:
            qz, s, _ = int_parts(case, t, self.bug)
            w = (qz.astype(np.float32) * s.astype(np.float32)).astype(np.float64)
        return round_to(w.astype(np.float32).astype(np.float64), "bfloat16")


class IndepInt8Act(_Base):
    """W8A8 (sym and asym per-token activations) and W4A8: exact integer dots, float64 epilogue."""

    name = "indep-int8act"
    covers = "independent check: per-token int8 activations, exact integer GEMM, float64 epilogue"
    schemes_ = ("w8a8", "w4a8")
    bugs = BUGS_INT8

    def declared(self, case: Case) -> Declared:
        return Declared(variants={}, weight_dtype="exact", accumulate="float64",
                        output=case.output_dtype, output_rounding="rne",
                        notes="canonical per-token int8 (fp32 steps, RNE, saturate); integer dots; float64 epilogue")

    def run(self, prepared: Prepared, x: np.ndarray, **inputs) -> np.ndarray:
        case, bug, t = prepared.case, self.bug, prepared.data
        x32 = np.asarray(x).astype(np.float32)
        q, sx, azp = int8_per_token(x32, case.act_symmetric, bug)
        qz, s, g = int_parts(case, t, None)  # [N, K] integer weights (q - z) and their scales
        qw = qz.astype(np.int64)
        sx = sx.astype(np.float64)
        if case.scheme == "w8a8":
            acc = q @ qw.T  # int64 exact
            if case.act_symmetric:
                pass
            elif bug == "azp_rowsum_int16":
                rs = np.sum(qw, axis=1).astype(np.int16).astype(np.int64)  # weight row sums kept in int16
                acc = acc - azp[:, None] * rs[None, :]
            else:
                acc = acc - azp[:, None] * np.sum(qw, axis=1)[None, :]
            with np.errstate(all="ignore"):
                y = acc.astype(np.float64) * sx[:, None] * s[:, 0][None, :]
            return _to_out(y, case, bug, inputs.get("bias"))
        # W4A8: per-group integer accumulators, scaled per group
        ng = int(g.max()) + 1
        y = np.zeros((q.shape[0], qw.shape[0]))
        for gi in range(ng):
            ks = np.nonzero(g == gi)[0]
            if ks.size == 0:
                continue
            acc = q[:, ks] @ qw[:, ks].T
            if bug == "w4a8_group_acc_int16":
                acc = acc.astype(np.int16).astype(np.int64)
            sg = s[:, 0] if bug == "w4a8_scale_group0" else s[:, ks[0]]  # per-group scales read as per-channel
            y += acc * sg[None, :]
        with np.errstate(all="ignore"):
            y = y * sx[:, None]
        return _to_out(y, case, bug, inputs.get("bias"))


class IndepMx(_Base):
    """W4A4-MXFP4: OCP FLOOR / RNE activation quantization, exact block products, float64 sum."""

    name = "indep-mx"
    covers = "independent check: MXFP4 x MXFP4, exact block products"
    schemes_ = ("w4a4-mxfp4",)
    bugs = BUGS_MX

    def declared(self, case: Case) -> Declared:
        return Declared(variants={}, weight_dtype="exact", accumulate="float64", output=case.output_dtype,
                        output_rounding="rne", notes="OCP MX FLOOR scales, RNE elements; float64 sums")

    def run(self, prepared: Prepared, x: np.ndarray, **inputs) -> np.ndarray:
        case, bug, t = prepared.case, self.bug, prepared.data
        px, sx = mx_quantize(np.asarray(x).astype(np.float32), bug)
        w = dequant_mx(case, t, bug if bug in ("mx_ff_as_2p127", "mx_byte_shift_ftz") else None)
        M, K = px.shape
        with np.errstate(all="ignore"):
            xs = px * np.repeat(sx, 32, axis=1)
            acc = xs @ w.T
        return _to_out(acc, case, bug, inputs.get("bias"))


__all__ = ["IndepA16", "IndepA16Bf16Weights", "IndepInt8Act", "IndepMx", "e8m0"]
