"""The failure localization names the pattern that explains a planted bug, not one that meets a few of its
elements by coincidence (docs/conformance.md#failure-localization), through the real worker op ``localize``.

``Patterned`` plants one bug, written from its one-line description in ``BUGS`` on top of the independent
NumPy kernel of test_localize_kernels.py (which unpacks the checkpoints from docs/formats/*.md, not from the
emulator). Each case runs in an isolated worker (QCONFORM_EXTRA_BACKENDS) on a bundle of its inputs, as
``qconform run`` and ``replay`` localize a failure. Each test asserts the named place and pattern and that a
competing wrong name (the one an earlier localization gave for the same bug) is not claimed.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import test_localize_kernels as kernels
from backends.base import Case
from conformance.judge.localize_text import localization_lines

HERE = Path(__file__).resolve().parent
SPEC = "patterned=test_localize_patterns:Patterned"

BUGS = {
    "none": "no bug (control)",
    "ct_zp_plus8": "compressed-tensors zero point read without removing its +8 packing offset",
    "ct_codes_from_end": "K % 8 != 0: the K codes taken from the end of the padded packed row (channel-wise)",
    "gptq_zero_group0": "every K group uses group 0's zero points (the zero row index never advanced)",
    "int8_row0_scale": "the per-channel weight_scale [N, 1] read as one per-tensor value: row 0's",
    "scale_ftz": "float16 subnormal weight scales flushed to zero",
    "e2m1_code7_as_5": "the E2M1 table entry of code 7 typed as 5.0 instead of 6.0",
    "act_bf16": "float32 activations converted to bfloat16 before the GEMM",
    "skip_zero_w": "products with a zero weight skipped (sparsity shortcut)",
    "bias_after_round": "bias added to the already rounded output, in the output dtype",
    "w8a8_eps": "asymmetric activation range max - min clamped to at least 1e-10 (an eps guard)",
    "w8a8_rowsum_int16": "asymmetric W8A8: the weight row sums of the azp correction kept in int16 (wrap)",
    "w8a8_rowsum_k_tail": "asymmetric W8A8: the weight row sums of the azp correction skip the last K % 32 columns",
    # round 3 of the independent check (examples/independent-kernels/round3/README.md), each its own class
    "m_tail_8": "row tiles of 8 with no remainder loop: output rows past the last full tile of 8 left at zero",
    "int8_clamp_m128": "int8 weight codes clamped to [-127, 127] (code -128 read as -127)",
    "out_via_fp16": "the bfloat16 output formed through a float16 buffer: RNE to float16, then to bfloat16",
    "out_satfinite": "the output conversion saturates: +-Inf become +-the largest finite value (NaN kept)",
    "prod_fp16": "each product rounded to float16, then summed exactly (control of out_via_fp16: not the output)",
    "w8a8_pair_sat": "symmetric W8A8 on u8 x s8 pair instructions: codes + 128 as u8, each pair of products summed "
                     "with int16 saturation, 128 * the weight row sum removed",
    "zp_comp_whole_row": "asymmetric grouped int4: the zero point removed as a compensation z_g * sum(x) over the "
                         "whole row instead of over group g's columns",
    "bias_each_partial": "split-K in chunks of 64 columns: every partial sum adds the bias",
    "w8a8_bias_in_acc": "symmetric W8A8: the bias folded into the int32 accumulator as RNE(bias / (sx * sw))",
    "w8a8_no_bias": "symmetric W8A8: the bias never added (control of w8a8_bias_in_acc)",
    "bias_bf16": "the bias converted to bfloat16 before the add (a bias buffer typed bfloat16)",
    "act_nan_to_num": "activations sanitized first: NaN -> 0, +-Inf -> +-the activation dtype's largest finite",
}

_MAX = {"bfloat16": float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), "float16": 65504.0,
        "float32": float(np.finfo(np.float32).max)}


def _bf16(a):
    return np.asarray(a, np.float64).astype(ml_dtypes.bfloat16).astype(np.float64)


class Patterned(kernels.Planted):
    name = "patterned"
    covers = "test kernel with one planted bug (tests/conformance/test_localize_patterns.py)"

    def __init__(self, **params):
        bug = params.get("bug", "none")
        assert bug in BUGS, bug
        super().__init__(bug="none")
        self.bug = bug

    def _weights(self, case: Case, t: dict) -> np.ndarray:
        N, K, bug = case.N, case.K, self.bug
        if bug in ("ct_zp_plus8", "ct_codes_from_end"):  # docs/formats/compressed-tensors.md: fields store q + 8
            f = kernels._nibbles(t["weight_packed"]).astype(np.float64)  # [N, 8 * ceil(K / 8)]
            q = (f[:, f.shape[1] - K:] if bug == "ct_codes_from_end" else f[:, :K]) - 8
            s = t["weight_scale"].astype(np.float64)
            zp = (kernels._nibbles(t["weight_zero_point"].T).T[:N].astype(np.float64) - (0 if bug == "ct_zp_plus8" else 8)
                  if "weight_zero_point" in t else np.zeros_like(s))
            g = np.minimum(np.arange(K) // case.group, s.shape[1] - 1)
            return (q - zp[:, g]) * s[:, g]
        if bug == "gptq_zero_group0":  # docs/formats/gptq.md: v1 qzeros store z - 1, packed along N
            q = kernels._nibbles(t["qweight"].T).astype(np.float64)
            z = kernels._nibbles(t["qzeros"]).astype(np.float64)[:, :N] + 1
            z = np.broadcast_to(z[:1], z.shape)
            s, g = t["scales"].astype(np.float64), t["g_idx"].astype(np.int64)
            return (q - z[g].T) * s[g].T
        if bug == "int8_clamp_m128":
            return np.maximum(t["weight"].astype(np.float64), -127) * t["weight_scale"].astype(np.float64).reshape(-1, 1)
        if bug == "int8_row0_scale":
            return t["weight"].astype(np.float64) * t["weight_scale"].astype(np.float64).reshape(-1)[0]
        if bug == "scale_ftz":
            s = t["weight_scale"].astype(np.float64).reshape(-1)
            s = np.where(np.abs(s) < 2.0 ** -14, 0.0, s)  # below float16's smallest normal
            return t["weight"].astype(np.float64) * s[:, None]
        if bug == "e2m1_code7_as_5":
            p = t["weight_packed"].astype(np.int64)
            codes = np.stack([p & 0xF, p >> 4], axis=-1).reshape(N, K)
            table = kernels.E2M1.copy()
            table[7] = 5.0
            b = t["weight_scale"].astype(np.int64)
            sc = np.where(b == 0xFF, np.nan, np.ldexp(1.0, b - 127))
            return table[codes] * np.repeat(sc, 32, axis=1)
        return super()._weights(case, t)

    def run(self, prepared, x, bias=None, **_):
        case, W, bug = prepared.case, prepared.data["W"], self.bug
        x = np.asarray(x, np.float64)
        if bug == "act_bf16":
            x = _bf16(x)
        if bug == "skip_zero_w":
            with np.errstate(invalid="ignore"):
                y = np.where(W[None] == 0, 0.0, x[:, None, :] * W[None]).sum(-1)
            return kernels._round(y + (0 if bias is None else np.asarray(bias, np.float64)), case.output_dtype)
        if bug == "bias_after_round":
            y = kernels._round(x @ W.T, case.output_dtype).astype(np.float64)
            return kernels._round(y + (0 if bias is None else np.asarray(bias, np.float64)), case.output_dtype)
        if bug == "w8a8_eps":  # docs/formats/activations.md asymmetric per-token int8, with the eps guard
            f32 = np.float32
            x32 = x.astype(f32)
            lo, hi = x32.min(axis=1, keepdims=True), x32.max(axis=1, keepdims=True)
            s = (np.maximum((hi - lo).astype(f32), f32(1e-10)) / f32(255)).astype(f32)
            zp = np.rint((f32(-128) - (lo / s).astype(f32)).astype(np.float64))
            q = np.clip(np.rint((x32 / s).astype(f32).astype(np.float64)) + zp, -128, 127)
            y = ((q - zp) * s.astype(np.float64)) @ W.T
            return kernels._round(y + (0 if bias is None else np.asarray(bias, np.float64)), case.output_dtype)
        if bug == "zp_comp_whole_row":  # y = sum_g s_g (sum_{k in g} x_k q_k) - sum_g s_g z_g * sum_k x_k
            t = prepared.data["t"]
            K = case.K
            q = kernels._nibbles(t["weight_packed"])[:, :K].astype(np.float64) - 8
            sg = t["weight_scale"].astype(np.float64)
            zg = kernels._nibbles(t["weight_zero_point"].T).T[: case.N].astype(np.float64) - 8
            g = np.arange(K) // case.group
            y = x @ (q * sg[:, g]).T - x.sum(axis=1, keepdims=True) * (sg * zg).sum(axis=1)[None, :]
            return kernels._round(y + (0 if bias is None else np.asarray(bias, np.float64)), case.output_dtype)
        if bug in ("w8a8_bias_in_acc", "w8a8_no_bias"):  # symmetric per-token int8, s = amax / 127; integer dot; bias on its grid
            f32 = np.float32
            x32 = x.astype(f32)
            s = (np.abs(x32).max(axis=1, keepdims=True) / f32(127)).astype(f32).astype(np.float64)
            q = np.where(s > 0, np.clip(np.rint(x / np.where(s > 0, s, 1)), -128, 127), 0.0)
            t = prepared.data["t"]
            qw, sw = t["weight"].astype(np.float64), t["weight_scale"].astype(np.float64).reshape(-1)
            ss = s * sw[None, :]
            acc = q @ qw.T
            if bias is not None and bug == "w8a8_bias_in_acc":
                with np.errstate(invalid="ignore", divide="ignore"):
                    bi = np.where(ss > 0, np.rint(np.asarray(bias, np.float64)[None, :] / np.where(ss > 0, ss, 1)), 0)
                acc = acc + bi
            return kernels._round(acc * ss, case.output_dtype)
        if bug == "w8a8_pair_sat":  # docs/formats/activations.md symmetric per-token int8: s = amax / 127
            f32 = np.float32
            x32 = x.astype(f32)
            s = (np.abs(x32).max(axis=1, keepdims=True) / f32(127)).astype(f32)
            safe = np.where(s > 0, s, f32(1))
            q = np.where(s > 0, np.clip(np.rint((x32 / safe).astype(f32).astype(np.float64)), -128, 127), 0.0)
            t = prepared.data["t"]
            qw, sw = t["weight"].astype(np.float64), t["weight_scale"].astype(np.float64).reshape(-1)
            u = q + 128
            pair = u[:, None, 0::2] * qw[None, :, 0::2] + u[:, None, 1::2] * qw[None, :, 1::2]  # K even here
            acc = np.clip(pair, -32768, 32767).sum(-1) - 128 * qw.sum(axis=1)[None, :]
            y = acc * s.astype(np.float64) * sw[None, :]
            return kernels._round(y + (0 if bias is None else np.asarray(bias, np.float64)), case.output_dtype)
        if bug in ("w8a8_rowsum_int16", "w8a8_rowsum_k_tail"):  # asym int8: y = s sw (sum q qw - azp rowsum(qw))
            f32 = np.float32
            x32 = x.astype(f32)
            lo, hi = x32.min(axis=1, keepdims=True), x32.max(axis=1, keepdims=True)
            s = ((hi - lo).astype(f32) / f32(255)).astype(f32)
            safe = np.where(s > 0, s, f32(1))
            zp = np.where(s > 0, np.rint((f32(-128) - (lo / safe).astype(f32)).astype(np.float64)), 0.0)
            q = np.where(s > 0, np.clip(np.rint((x32 / safe).astype(f32).astype(np.float64)) + zp, -128, 127), 0.0)
            t = prepared.data["t"]
            qw, sw = t["weight"].astype(np.float64), t["weight_scale"].astype(np.float64).reshape(-1)
            K = qw.shape[1]
            rs = qw[:, : K - K % 32].sum(axis=1) if bug == "w8a8_rowsum_k_tail" else \
                (qw.sum(axis=1) + 32768) % 65536 - 32768
            acc = q @ qw.T - zp * rs[None, :]
            y = acc * s.astype(np.float64) * sw[None, :]
            return kernels._round(y + (0 if bias is None else np.asarray(bias, np.float64)), case.output_dtype)
        if bug in ("m_tail_8", "out_via_fp16", "prod_fp16", "out_satfinite", "act_nan_to_num", "bias_bf16",
                   "bias_each_partial"):
            if bug == "act_nan_to_num":
                mx = _MAX[case.act_dtype]
                x = np.nan_to_num(x, nan=0.0, posinf=mx, neginf=-mx)
            if bug == "bias_each_partial" and bias is not None:
                acc = sum(x[:, a:a + 64] @ W[:, a:a + 64].T + np.asarray(bias, np.float64) for a in range(0, case.K, 64))
                return kernels._round(acc, case.output_dtype)
            if bug == "bias_bf16" and bias is not None:
                bias = _bf16(bias)
            with np.errstate(invalid="ignore", over="ignore"):
                acc = x @ W.T + (0 if bias is None else np.asarray(bias, np.float64))
            if bug == "m_tail_8" and len(x) > 8 and len(x) % 8:
                acc[len(x) - len(x) % 8:] = 0.0
            if bug == "out_via_fp16":
                acc = kernels._round(acc, "float16").astype(np.float64)
            if bug == "prod_fp16":
                acc = kernels._round(x[:, None, :] * W[None], "float16").astype(np.float64).sum(-1)
            y = kernels._round(acc, case.output_dtype)
            if bug == "out_satfinite":
                mx = _MAX[case.output_dtype]
                y = np.where(np.isnan(y), y, np.clip(y, -mx, mx))
            return y
        return super().run(prepared, x.astype(np.float32), bias=bias)

    def prepare(self, case, tensors):
        p = super().prepare(case, tensors)
        p.data["t"] = tensors
        return p


def _inputs(bug: str, case: Case):
    """The case's seeded inputs, with what makes the bug show: subnormal scales, NaN activations, a constant row."""
    from conformance.cases.inputs import make_inputs

    inp = make_inputs(case, 5)
    t, x = dict(inp.tensors), np.array(inp.x)
    if bug == "scale_ftz":
        s = t["weight_scale"].copy()
        s[[3, 10]] = np.float16(2.0 ** -17)  # two subnormal float16 scales
        t["weight_scale"] = s
    if bug == "skip_zero_w":
        w = t["weight"].copy()
        w[:, 5] = 0  # column 5's weights all zero: a NaN there meets only zeros
        w[7, 9] = 0
        t["weight"] = w
        x[1, 5] = np.nan
    if bug == "int8_clamp_m128":
        w = t["weight"].copy()
        w[::3, ::5] = -128  # the code a symmetric [-127, 127] path cannot hold
        t["weight"] = w
    if bug in ("out_satfinite", "act_nan_to_num", "none"):
        x[1, 3] = np.inf  # a row whose output is +-Inf (or NaN where a weight is 0)
        x[2, 6] = np.nan
    if bug == "w8a8_eps":
        x[2] = np.float32(0.375)  # a constant row: range 0
    if bug == "w8a8_rowsum_int16":
        w = t["weight"].copy()
        w[:2] = 127  # rows 0, 1: row sums 127 K, past int16
        t["weight"] = w
    return dataclasses.replace(inp, tensors=t, x=x)


def localize_in_worker(bug: str, case: Case, tmp_path: Path) -> dict:
    """The worker op ``localize`` on a bundle of the case's inputs, with the backend's own declaration."""

    inp = _inputs(bug, case)
    k = Patterned(bug=bug)
    decl = k.declared(case)
    return _localized_in_worker(tmp_path, inp, case, decl, SPEC, f"patterned:bug={bug}", bug)


def _localized_in_worker(tmp_path, inp, case, decl, spec: str, backend: str, bug: str) -> dict:
    """The localization a worker process gives ``backend`` (registered by ``spec``) on ``inp`` saved as a bundle."""
    from conformance.cases.bundle import ReplayBundle, save_bundle
    from conformance.run.workerclient import WorkerClient
    from conformance.run.workerproc import WorkerProcess

    path = save_bundle(tmp_path / f"{bug}.safetensors", ReplayBundle(inp, {"case": case.to_json()}, backend=spec,
                                                                     declared=decl.to_json(), verdict="fail",
                                                                     reason="planted"))
    env = {"QCONFORM_EXTRA_BACKENDS": spec,
           "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)}
    w = WorkerClient(WorkerProcess(backend, env=env), 300)
    try:
        rep = w.localize(decl, bundle=path)
    finally:
        w.close()
    assert rep.failure is None, rep.failure
    return rep.localization


_W = dict(M=3, N=64)
# (bug, case, stage, must name, must not claim)
CASES = [
    ("ct_zp_plus8", Case("w4a16", "ct-pack-quantized", K=128, group_size=32, sym=False, **_W), "weights",
     ["every row, every K group: offset by exactly 8 scale steps down", "a zero point off by +8"],
     ["sign flipped", "nibbles swapped"]),
    ("ct_codes_from_end", Case("w4a16", "ct-pack-quantized", M=3, N=9, K=12, group_size=-1), "weights",
     ["every row", "codes shifted along K by 4 column(s): column k reads the code of column k + 4",
      "padding field(s)"],
     ["nibbles in reverse order", "zero point off by one", "codes off by one"]),
    ("gptq_zero_group0", Case("w4a16", "gptq", K=256, group_size=64, sym=False, **_W), "weights",
     ["the zero point of K group 0 used for every group"], ["off by one", "read as zero"]),
    ("int8_row0_scale", Case("w8a16", "ct-int-quantized", K=64, group_size=-1, **_W), "weights",
     ["row 0's scale used for every row"], ["every weight scaled by", "row 0 (of"]),
    ("scale_ftz", Case("w8a16", "ct-int-quantized", K=64, group_size=-1, scale_dtype="float16", **_W), "weights",
     ["subnormal float16 scales flushed to zero"], ["weights wrong: rows 0, 3, 4, 10 (of 64): read as zero",
                                                    "computed with the weights"]),
    ("e2m1_code7_as_5", Case("w4a16-mxfp4", "ct-mxfp4", K=128, group_size=32, **_W), "weights",
     ["FP4 code 0b0111 (6) read as 5"], ["every weight scaled by"]),
    ("act_bf16", Case("w8a16", "ct-int-quantized", K=64, group_size=-1, act_dtype="float32", **_W), "activations",
     ["act_compute_dtype=bfloat16"], ["the failure is in the product"]),
    ("skip_zero_w", Case("w8a16", "ct-int-quantized", K=64, group_size=-1, act_dtype="float32", **_W), "product",
     ["products with a zero weight skipped"], ["act_compute_dtype", "the failure is in the product, the accumulation"]),
    ("bias_after_round", Case("w8a16", "ct-int-quantized", K=64, group_size=-1, bias=True, **_W), "epilogue",
     ["bias_stage=after_output_rounding"], ["truncated", "the failure is in the product"]),
    ("w8a8_eps", Case("w8a8", "ct-int-quantized", M=4, N=64, K=96, group_size=-1, sym=False, scale_dtype="float32"),
     # the eps value itself is not told apart here: any eps this small quantizes a constant row alike
     "activation quantization", ["activation quantization wrong (zero-row guard)", "the kernel quantizes as zero_row=eps"],
     ["the failure is in the product"]),
    ("w8a8_rowsum_int16", Case("w8a8", "ct-int-quantized", M=3, N=64, K=384, group_size=-1, sym=False,
                               scale_dtype="float32"), "azp correction",
     ["azp correction wrong", "the weight row sums kept in int16 (wrapped)"],
     ["weights or activation quantization", "scaled by"]),
    ("w8a8_rowsum_k_tail", Case("w8a8", "ct-int-quantized", M=3, N=64, K=80, group_size=-1, sym=False,
                                scale_dtype="float32"), "azp correction",
     ["azp correction wrong", "the weight row sums skip the last K mod 32 = 16 columns"],
     ["activation zero point ignored"]),
    ("zp_comp_whole_row", Case("w4a16", "ct-pack-quantized", K=128, group_size=32, sym=False, **_W), "weights",
     ["every row, every K group: the zero-point compensation z_g * sum_k qx[k] taken over the whole row"],
     ["zero point off by", "no named pattern", "scale steps"]),
    ("w8a8_bias_in_acc", Case("w8a8", "ct-int-quantized", M=3, N=64, K=64, group_size=-1, scale_dtype="float32",
                              bias=True), "epilogue", ["bias folded into the int32 accumulator"], ["bias not added"]),
    ("w8a8_no_bias", Case("w8a8", "ct-int-quantized", M=3, N=64, K=64, group_size=-1, scale_dtype="float32",
                          bias=True), "epilogue", ["bias not added"], ["bias folded"]),
    ("w8a8_pair_sat", Case("w8a8", "ct-int-quantized", M=3, N=64, K=64, group_size=-1, scale_dtype="float32"),
     "accumulation", ["u8 x s8 pairs of products summed with int16 saturation"],
     ["weights wrong", "scale steps", "activation quantization wrong"]),
    ("m_tail_8", Case("w8a16", "ct-int-quantized", M=12, N=64, K=64, group_size=-1), "output rows",
     ["output rows m >= 8 * floor(M / 8) = 8 of every call of M = 12 rows",
      "past the last full tile of 8 rows, left at zero"], ["weights wrong", "read as zero", "bias not added"]),
    ("int8_clamp_m128", Case("w8a16", "ct-int-quantized", K=64, group_size=-1, **_W), "weights",
     ["code -128 read as -127 (the lowest code clamped"], ["scale steps", "scales read as"]),
    ("int8_clamp_m128", Case("w8a8", "ct-int-quantized", M=3, N=64, K=64, group_size=-1, scale_dtype="float32"),
     "weights", ["code -128 read as -127 (the lowest code clamped"], ["scale steps (128)", "scales read as"]),
    ("out_via_fp16", Case("w8a16", "ct-int-quantized", M=8, N=64, K=64, group_size=-1, act_dtype="bfloat16"),
     "epilogue", ["the output rounded to float16 first, then to bfloat16"], ["the failure is in the product"]),
    ("prod_fp16", Case("w8a16", "ct-int-quantized", M=8, N=64, K=64, group_size=-1, act_dtype="bfloat16"),
     "accumulation", ["the product (or a partial sum) is rounded to float16"], ["double rounding", "epilogue"]),
    ("bias_bf16", Case("w8a16", "ct-int-quantized", K=64, group_size=-1, act_dtype="float32", bias=True, **_W),
     "epilogue", ["bias rounded to bfloat16 before the add"], ["scaled by its own factor", "bias not added"]),
    ("bias_each_partial", Case("w8a16", "ct-int-quantized", K=192, group_size=-1, act_dtype="float32", bias=True,
                               **_W), "epilogue", ["bias added 3 times"], ["scaled by its own factor", "bias added twice"]),
    ("out_satfinite", Case("w8a16", "ct-int-quantized", K=64, group_size=-1, act_dtype="bfloat16", **_W),
     "epilogue", ["the output conversion saturates", "reference inf"], ["the failure is in the product"]),
    ("act_nan_to_num", Case("w8a16", "ct-int-quantized", K=64, group_size=-1, act_dtype="float16", **_W),
     "activations", ["NaN/Inf activations replaced by finite values", "NaN -> 0, +-Inf -> +-max of float16"],
     ["the failure is in the product", "saturates"]),
]

#: what none of the round-3 hypotheses may claim on a correct kernel
_ROUND3_CLAIMS = ("output rows", "read as", "double rounding", "saturates", "nan_to_num")


@pytest.fixture(scope="module", autouse=True)
def _extra_backends():
    old = os.environ.get("QCONFORM_EXTRA_BACKENDS")
    os.environ["QCONFORM_EXTRA_BACKENDS"] = SPEC
    yield
    if old is None:
        os.environ.pop("QCONFORM_EXTRA_BACKENDS", None)
    else:
        os.environ["QCONFORM_EXTRA_BACKENDS"] = old


@pytest.mark.parametrize("bug,case,stage,names,not_names", CASES, ids=[c[0] for c in CASES])
def test_worker_localization_names_the_pattern(bug, case, stage, names, not_names, tmp_path):
    loc = localize_in_worker(bug, case, tmp_path)
    text = "\n".join(localization_lines(loc))
    assert loc["stage"] == stage, text
    for n in names:
        assert n in text, f"{n!r} not in:\n{text}"
    claims = "\n".join(line for line in text.splitlines() if not line.startswith("  probe:"))
    for n in not_names:
        assert n not in claims, f"{n!r} claimed in:\n{text}"
    if bug == "scale_ftz":  # exactly the rows whose float16 scale is subnormal (seeded ones and the planted 3, 10),
        # and a row of zero weights, which reads as zero under either rule (the place counts it in, as docs say)
        t = _inputs(bug, case).tensors
        s = t["weight_scale"].astype(np.float64).reshape(-1)
        rows = np.nonzero((np.abs(s) < 2.0 ** -14) | ~t["weight"].any(axis=1))[0]
        assert {3, 10} <= set(rows.tolist())
        where = ", ".join(map(str, rows))
        assert f"weights wrong: rows {where} (of 64): subnormal float16 scales flushed to zero" in text, text


@pytest.mark.parametrize("case", [c[1] for c in CASES if c[0] in BUGS and c[0] in (
    "m_tail_8", "out_via_fp16", "out_satfinite")], ids=["m12", "bf16-out", "inf-act"])
def test_correct_kernel_gets_no_round3_claim(case, tmp_path):
    """Control: the correct kernel, localized on the inputs that show the round-3 bugs (M = 12, NaN/Inf
    activations), is claimed none of their patterns."""
    loc = localize_in_worker("none", case, tmp_path)
    text = "\n".join(line for line in localization_lines(loc) if not line.startswith("  probe:"))
    for n in _ROUND3_CLAIMS:
        assert n not in text, f"{n!r} claimed on a correct kernel:\n{text}"


@pytest.mark.parametrize("bug,case,stage,names,not_names", CASES, ids=[c[0] for c in CASES])
def test_control_passes_and_the_bug_changes_the_output(bug, case, stage, names, not_names):
    """The kernel without its bug passes the same inputs (so each name above comes from the bug), and the bug
    changes the output."""
    from conformance.judge.acceptance import declared_interval
    from conformance.report.summary import PASSING
    from conformance.run.runner import judge

    inp = _inputs(bug, case)
    ok, bad = Patterned(bug="none"), Patterned(bug=bug)
    decl = ok.declared(case)
    y = ok.run(ok.prepare(case, inp.tensors), inp.x, bias=inp.bias)
    assert judge(inp, declared_interval(inp, decl), y, decl).verdict in PASSING
    yb = bad.run(bad.prepare(case, inp.tensors), inp.x, bias=inp.bias)
    assert judge(inp, declared_interval(inp, decl), yb, decl).verdict not in PASSING


# -- MoE: a fused-MoE kernel from docs/formats/moe.md, one planted bug each ------------------------------------
MOE_BUGS = {
    "none": "no bug (control)",
    "moe_w2_next_expert": "the down projection (w2) of expert (e + 1) % E used for expert e (stacked-tensor stride)",
    "moe_gate_up_swapped": "the w13 halves read as up, gate (rows 0..I-1 taken as up)",
    "moe_no_renorm": "the top-k routing weights not renormalized to sum 1",
    "moe_scatter_overwrite": "the top-k experts' outputs written to the output (the last slot wins), not added",
    "moe_scatter_sorted": "each (token, slot) pair's output added to row r // k of the expert-sorted pair list, not its token",
    "moe_intermediate_fp16": "the SiLU(gate) * up intermediate always stored in float16 (an fp16 intermediate cache)",
}


def _experts(qweight, scales, group: int) -> np.ndarray:
    """[E, rows/8, cols] int32 packed along the rows (LSB first), symmetric int4 (z = 8) -> [E, rows, cols]."""
    E, _, cols = qweight.shape
    q = np.stack([kernels._nibbles(qweight[e].T).T for e in range(E)]).astype(np.float64)  # [E, rows, cols]
    s = scales.astype(np.float64)
    rows = q.shape[1]
    g = np.arange(rows) // (rows if group == -1 else group)
    return (q - 8) * s[:, g, :]


class PatternedMoe(Patterned):
    name = "patterned-moe"

    def __init__(self, **params):
        bug = params.get("bug", "none")
        assert bug in MOE_BUGS, bug
        kernels.Planted.__init__(self, bug="none")
        self.bug = bug

    def declared(self, case):
        from backends.base import Declared

        return Declared(variants={}, accumulate="float64", output=case.output_dtype, notes=f"planted bug: {self.bug}")

    def prepare(self, case, tensors):
        from backends.base import Prepared

        w13 = _experts(tensors["w13_qweight"], tensors["w13_scales"], case.group)  # [E, K, 2I]
        w2 = _experts(tensors["w2_qweight"], tensors["w2_scales"], case.moe_w2_group_size)  # [E, I, K]
        if self.bug == "moe_w2_next_expert":
            w2 = np.roll(w2, -1, axis=0)
        return Prepared(case, {"w13": w13, "w2": w2})

    def run(self, prepared, x, bias=None, router_logits=None, **_):
        case, bug = prepared.case, self.bug
        w13, w2 = prepared.data["w13"], prepared.data["w2"]
        I = w2.shape[1]
        x = np.asarray(x, np.float64)
        L = np.asarray(router_logits, np.float64)
        p = np.exp(L - L.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        y = np.zeros((len(x), w2.shape[2]))
        pairs = sorted((int(e), m, j) for m in range(len(x))
                       for j, e in enumerate(np.argsort(-p[m], kind="stable")[: case.top_k]))
        row_of = {(m, j): r // case.top_k for r, (_, m, j) in enumerate(pairs)}  # expert-sorted position r
        for m in range(len(x)):
            ids = np.argsort(-p[m], kind="stable")[: case.top_k]  # ties: the lower index first
            w = p[m, ids] / (1.0 if bug == "moe_no_renorm" else p[m, ids].sum())
            for j, e in enumerate(ids):
                h = x[m] @ w13[e]
                gate, up = (h[I:], h[:I]) if bug == "moe_gate_up_swapped" else (h[:I], h[I:])
                inter = "float16" if bug == "moe_intermediate_fp16" else case.act_dtype
                a = kernels._round(gate / (1 + np.exp(-gate)) * up, inter).astype(np.float64)
                o = w[j] * (a @ w2[e])
                r = row_of[(m, j)] if bug == "moe_scatter_sorted" else m
                y[r] = o if bug == "moe_scatter_overwrite" else y[r] + o
        return kernels._round(y, case.output_dtype)


MOE_SPEC = "patterned-moe=test_localize_patterns:PatternedMoe"
_MOE = Case("w4a16-moe", "gptq", M=6, N=32, K=64, group_size=32, E=4, top_k=2)
MOE_CASES = [
    ("moe_w2_next_expert", "experts", ["experts 0, 1, 2, 3 (of 4) fail alone",
                                       "the down projection (w2) of expert (e + 1) mod E used for expert e"],
     ["gate/up", "moe_gate_up"]),
    ("moe_gate_up_swapped", "experts", ["fail alone: moe_gate_up=up_gate"], ["down projection", "routing"]),
    ("moe_no_renorm", "routing", ["every expert alone is right", "moe_renormalize=false"],
     ["experts wrong", "moe_tie_order"]),
    ("moe_scatter_overwrite", "combination", ["combination of the top-2 outputs wrong", "written, not added (a scatter that overwrites)"],
     ["moe_renormalize", "no named projection bug"]),
    ("moe_scatter_sorted", "combination", ["outputs added to the wrong tokens"], ["no named projection bug"]),
    ("moe_intermediate_fp16", "experts", ["fail alone: moe_intermediate_dtype=float16"],
     ["moe_intermediate_dtype=float64", "no named projection bug", "routing"]),
]


@pytest.mark.parametrize("bug,stage,names,not_names", MOE_CASES, ids=[c[0] for c in MOE_CASES])
def test_worker_localization_names_the_moe_expert_or_routing(bug, stage, names, not_names, tmp_path):
    from conformance.cases.inputs import make_inputs
    from conformance.judge.acceptance import declared_interval
    from conformance.report.summary import PASSING
    from conformance.run.runner import judge

    inp = make_inputs(_MOE, 4)
    ok, k = PatternedMoe(bug="none"), PatternedMoe(bug=bug)
    decl = k.declared(_MOE)
    for kern, passing in ((ok, True), (k, False)):  # the control passes, the bug fails this case
        y = kern.run(kern.prepare(_MOE, inp.tensors), inp.x, router_logits=inp.router_logits)
        assert (judge(inp, declared_interval(inp, decl), y, decl).verdict in PASSING) is passing, kern.bug
    loc = _localized_in_worker(tmp_path, inp, _MOE, decl, MOE_SPEC, f"patterned-moe:bug={bug}", bug)
    text = "\n".join(localization_lines(loc))
    assert loc["stage"] == stage, text
    for n in names:
        assert n in text, f"{n!r} not in:\n{text}"
    claims = "\n".join(line for line in text.splitlines() if not line.startswith("  probe:"))
    for n in not_names:
        assert n not in claims, f"{n!r} claimed in:\n{text}"
