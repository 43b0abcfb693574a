"""Planted-bug kernels for the failure localization (docs/conformance.md#failure-localization), and the
tests that the localization names each bug's place and pattern.

``Planted`` is a small NumPy kernel written from the format descriptions of docs/formats/*.md (packing
layouts, zero-point conventions, E2M1/E8M0 tables, per-token int8 quantization), not from the emulator's
code: it unpacks the checkpoint tensors itself, forms the weights, quantizes activations where the scheme
does, multiplies in float64 and rounds once to the output dtype with ml_dtypes. ``bug=NAME`` plants one bug
from its one-line description in ``BUGS``; ``bug=none`` is the control, which must pass (the localization's
findings then come from the bug). Workers load it with
QCONFORM_EXTRA_BACKENDS="planted=test_localize_kernels:Planted" and this folder on PYTHONPATH.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from conformance.judge.localize_text import localization_lines
from backends.base import Availability, Backend, Case, Declared, Prepared, yes

#: bug -> its description (what a kernel author would write in a bug report)
BUGS = {
    "none": "no bug (control)",
    "gptq_v1_zero_no_plus1": "GPTQ v1 qzeros read without adding 1",
    "gptq_zero_group1": "the zero point of K group 1 read one too high (the other groups right)",
    "gptq_nibble_swap": "the two nibbles of every qweight byte swapped",
    "gptq_next_group_scale": "group g dequantized with the scale and zero point of group g+1 (last group: its own)",
    "gptq_g_idx_ignored": "g_idx ignored: column k uses group k // group_size",
    "gptq_drop_nibble7": "the top nibble (field 7) of every qweight word dropped (read as 0 code-wise: weight 0)",
    "ct_nibble_swap": "the two nibbles of every weight_packed byte swapped",
    "ct_tail128_zero": "the last K mod 128 columns never multiplied (the K loop runs in blocks of 128)",
    "ct_g_idx_ignored": "weight_g_idx ignored: column k uses group k // group_size",
    "awq_sequential": "AWQ's interleaved nibble order ignored: slot s holds column 8j + s",
    "mx_ff_finite": "E8M0 byte 0xFF decoded like 0xFE (2^127) instead of NaN",
    "mx_next_block_scale": "MXFP4 block b multiplied by the E8M0 scale of block b+1 (last block: its own)",
    "w4a4_act_scale_high": "MXFP4 activation block exponent floor(log2 amax) - 1 instead of - 2",
    "mx_neg_zero_as_m6": "FP4 code 0b1000 (-0) looked up as -6",
    "w8a8_amax_128": "per-token activation scale amax/128 instead of amax/127",
    "w8a8_azp_sign": "asymmetric activation zero point: its correction added instead of subtracted",
    "w8a8_bias_twice": "bias added twice in the epilogue",
    "w8a8_output_rtz": "the fp32 accumulator truncated to the output dtype (round toward zero)",
    "probe_raises": "outputs 1% too large, and raises on any row with a single non-zero (a kernel refusing probes)",
    "w8a16_scale_transposed": "per-channel weight scale indexed by the input channel",
    "w4a8_amax_128": "per-token activation scale amax/128 instead of amax/127 (int4 weights)",
}

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # docs/formats/awq.md: slot s of a word holds column 8j + AWQ_ORDER[s]
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])  # docs/formats/mxfp4.md


def _nibbles(words: np.ndarray) -> np.ndarray:
    """int32 words [..., W] -> 4-bit fields [..., 8 W], field i of word j at 8 j + i (LSB first)."""
    u = words.astype(np.int64) & 0xFFFFFFFF
    f = np.stack([(u >> (4 * i)) & 0xF for i in range(8)], axis=-1)
    return f.reshape(*words.shape[:-1], words.shape[-1] * 8)


def _round(y: np.ndarray, dtype: str, truncate: bool = False) -> np.ndarray:
    t = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}[dtype]
    r = y.astype(t).astype(np.float64)
    if truncate:  # step back toward zero where rounding to nearest went away from it: one less magnitude bit
        with np.errstate(invalid="ignore", over="ignore"):
            away = (np.abs(r) > np.abs(y)) & np.isfinite(y)
        bits = r.astype(t).view(np.uint32 if t is np.float32 else np.uint16)
        toward = (bits - away.astype(bits.dtype)).view(t).astype(np.float64)
        r = np.where(away, toward, r)
    return r.astype(np.float32)


class Planted(Backend):
    name = "planted"
    covers = "test kernel with one planted bug (tests/conformance/test_localize_kernels.py)"
    priority = -1000

    def __init__(self, **params):
        super().__init__(**params)
        self.bug = params.get("bug", "none")
        assert self.bug in BUGS, self.bug

    def availability(self):
        return Availability(True, "test kernel", "0", "cpu")

    def can_implement(self, case):
        return yes()

    def declared(self, case):
        acc = "int32" if case.spec.activations == "int8" else "float32"
        return Declared(variants={}, accumulate=acc, output=case.output_dtype, notes=f"planted bug: {self.bug}")

    def prepare(self, case, tensors):
        return Prepared(case, {"W": self._weights(case, tensors)})

    # -- weights, from docs/formats/*.md -----------------------------------------------------------------
    def _weights(self, case: Case, t: dict) -> np.ndarray:
        N, K, G, bug = case.N, case.K, case.group, self.bug
        fmt = case.weight_format
        if fmt == "gptq":  # qweight [K/8, N] packed along K; qzeros [G, N/8] packed along N, v1: stored = z - 1
            q = _nibbles(t["qweight"].T).astype(np.float64)  # [N, K]
            if bug == "gptq_nibble_swap":
                q = q.reshape(N, -1, 2)[:, :, ::-1].reshape(N, K)
            if bug == "gptq_drop_nibble7":
                q[:, 7::8] = np.nan  # the field is never read: the product skips it (weight 0 below)
            z = _nibbles(t["qzeros"]).astype(np.float64)[:, :N] + (0 if bug == "gptq_v1_zero_no_plus1" else 1)
            if bug == "gptq_zero_group1":
                z[1] += 1
            s = t["scales"].astype(np.float64)
            g = t["g_idx"].astype(np.int64)
            if bug == "gptq_g_idx_ignored":
                g = np.arange(K) // G
            if bug == "gptq_next_group_scale":
                g = np.minimum(g + 1, s.shape[0] - 1)
            W = (q - z[g].T) * s[g].T
            return np.nan_to_num(W, nan=0.0) if bug == "gptq_drop_nibble7" else W
        if fmt == "awq":  # qweight [K, N/8] packed along N in AWQ's order; qzeros [G, N/8] the same way
            order = tuple(range(8)) if bug == "awq_sequential" else AWQ_ORDER

            def unpack_n(words):
                f = _nibbles(words).reshape(words.shape[0], -1, 8)
                out = np.empty_like(f)
                out[:, :, list(order)] = f
                return out.reshape(words.shape[0], -1).astype(np.float64)

            q, z, s = unpack_n(t["qweight"]).T, unpack_n(t["qzeros"]), t["scales"].astype(np.float64)
            g = np.arange(K) // G
            return (q - z[g].T) * s[g].T
        if fmt == "ct-pack-quantized":  # weight_packed [N, ceil(K/8)] of q + 8; zero points packed along N
            q = _nibbles(t["weight_packed"])[:, :K].astype(np.float64) - 8
            if bug == "ct_nibble_swap":
                q = q.reshape(N, -1, 2)[:, :, ::-1].reshape(N, K)
            s = t["weight_scale"].astype(np.float64)
            zp = (_nibbles(t["weight_zero_point"].T).T[:N].astype(np.float64) - 8 if "weight_zero_point" in t
                  else np.zeros_like(s))
            g = t["weight_g_idx"].astype(np.int64) if "weight_g_idx" in t else np.arange(K) // G
            if bug == "ct_g_idx_ignored":
                g = np.arange(K) // G
            W = (q - zp[:, g]) * s[:, g]
            if bug == "ct_tail128_zero":
                W[:, K - K % 128:] = 0.0
            return W
        if fmt == "ct-int-quantized":  # weight int8 [N, K], weight_scale [N, 1]
            s = t["weight_scale"].astype(np.float64).reshape(-1)
            if bug == "w8a16_scale_transposed":
                return t["weight"].astype(np.float64) * s[None, :K]
            return t["weight"].astype(np.float64) * s[:, None]
        if fmt == "ct-mxfp4":  # weight_packed [N, K/2]: low nibble element 2j; weight_scale [N, K/32] E8M0
            p = t["weight_packed"].astype(np.int64)
            codes = np.stack([p & 0xF, p >> 4], axis=-1).reshape(N, K)
            table = E2M1.copy()
            if bug == "mx_neg_zero_as_m6":
                table[8] = -6.0
            b = t["weight_scale"].astype(np.int64)
            if bug == "mx_ff_finite":
                b = np.minimum(b, 0xFE)
            sc = np.where(b == 0xFF, np.nan, np.ldexp(1.0, b - 127))
            if bug == "mx_next_block_scale":
                sc = sc[:, np.minimum(np.arange(sc.shape[1]) + 1, sc.shape[1] - 1)]
            return table[codes] * np.repeat(sc, 32, axis=1)
        raise NotImplementedError(fmt)

    # -- the product -----------------------------------------------------------------------------------------
    def run(self, prepared, x, bias=None, **_):
        case, W = prepared.case, prepared.data["W"]
        x = np.asarray(x, np.float64)
        if self.bug == "probe_raises":
            if ((x != 0).sum(axis=1) == 1).any():
                raise ValueError("one-hot rows refused")
            W = W * 1.01
        if case.spec.activations == "int8":
            if case.act_symmetric:
                amax = np.abs(x).max(axis=1, keepdims=True)
                d = 128.0 if self.bug in ("w8a8_amax_128", "w4a8_amax_128") else 127.0
                s = (amax / d).astype(np.float32).astype(np.float64)
                with np.errstate(invalid="ignore", divide="ignore"):
                    q = np.clip(np.rint(np.where(s > 0, x / s, 0)), -128, 127)
                zp = np.zeros_like(s)
            else:  # docs/formats/activations.md: s = (max - min) / 255, azp = RNE(-128 - min / s)
                lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
                s = ((hi - lo).astype(np.float32) / np.float32(255)).astype(np.float64)
                with np.errstate(invalid="ignore", divide="ignore"):
                    zp = np.rint((np.float32(-128) - (lo / s).astype(np.float32)).astype(np.float64))
                    q = np.clip(np.rint((x / s).astype(np.float32).astype(np.float64)) + zp, -128, 127)
                q, zp, s = np.nan_to_num(q), np.nan_to_num(zp), np.nan_to_num(s)
            sign = -1.0 if self.bug == "w8a8_azp_sign" else 1.0
            xd = (q + sign * -zp) * s if self.bug == "w8a8_azp_sign" else (q - zp) * s
            y = xd @ W.T
        elif case.spec.activations == "mxfp4":  # docs/formats/mxfp4.md: blocks of 32, exponent floor(log2 amax) - 2
            xb = x.reshape(len(x), -1, 32)
            amax = np.abs(xb).max(axis=2, keepdims=True)
            with np.errstate(divide="ignore"):
                e = np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - (1 if self.bug == "w4a4_act_scale_high" else 2)
            mag = np.abs(xb) / np.ldexp(1.0, e.astype(np.int64))
            grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
            # round to nearest E2M1 value, ties to the even code (even mantissa bit), saturating at 6
            d = np.abs(mag[..., None] - grid)
            best = np.argmin(d + 1e-12 * (np.arange(8) % 2), axis=-1)
            xq = np.sign(xb) * grid[best] * np.ldexp(1.0, e.astype(np.int64))
            y = xq.reshape(x.shape) @ W.T
        else:
            y = x @ W.T
        if bias is not None:
            y = y + np.asarray(bias, np.float64) * (2 if self.bug == "w8a8_bias_twice" else 1)
        return _round(y, case.output_dtype, truncate=self.bug == "w8a8_output_rtz")


SPEC = "planted=test_localize_kernels:Planted"

# -- the cases: (bug, case, expected stage, substrings the localization must name) ---------------------------------
_W4 = dict(M=3, N=64)
CASES = [
    ("gptq_v1_zero_no_plus1", Case("w4a16", "gptq", K=256, group_size=64, sym=False, **_W4), "weights",
     ["every row", "every K group", "zero point off by one"]),
    ("gptq_zero_group1", Case("w4a16", "gptq", K=256, group_size=64, sym=False, **_W4), "weights",
     ["every row, K group 1: offset by exactly one scale step down", "a zero point off by one"]),
    ("gptq_nibble_swap", Case("w4a16", "gptq", K=256, group_size=64, **_W4), "weights",
     ["nibbles swapped within a byte"]),
    ("gptq_next_group_scale", Case("w4a16", "gptq", K=256, group_size=64, sym=False, **_W4), "weights",
     ["K groups 0, 1, 2", "group g+1 used for group g"]),
    ("gptq_g_idx_ignored", Case("w4a16", "gptq", K=256, group_size=64, act_order=True, **_W4), "weights",
     ["g_idx ignored"]),
    ("gptq_drop_nibble7", Case("w4a16", "gptq", K=256, group_size=64, **_W4), "weights",
     ["columns k with k mod 8 = 7", "read as zero"]),
    ("ct_nibble_swap", Case("w4a16", "ct-pack-quantized", K=128, group_size=32, **_W4), "weights",
     ["every row, every K group", "nibbles swapped within a byte"]),
    ("ct_tail128_zero", Case("w4a16", "ct-pack-quantized", K=200, group_size=-1, **_W4), "weights",
     ["the last K mod 128 = 72 columns", "read as zero"]),
    ("ct_g_idx_ignored", Case("w4a16", "ct-pack-quantized", K=192, group_size=64, sym=False, act_order=True, **_W4),
     "weights", ["g_idx ignored"]),
    ("awq_sequential", Case("w4a16", "awq", K=128, group_size=64, sym=False, **_W4), "weights",
     ["weights wrong: rows n with n mod 8 in {1, 2, 3, 4, 5, 6}, every K group: AWQ's interleaved nibble order",
      "not applied",
      "(codes and zero points alike)"]),
    ("mx_ff_finite", Case("w4a16-mxfp4", "ct-mxfp4", K=128, group_size=32, **_W4), "weights",
     ["weights wrong: row 5 (of 64), MX block 1: E8M0 byte 0xFF (NaN scale) decoded as finite (read as 2^127)"]),
    ("mx_neg_zero_as_m6", Case("w4a16-mxfp4", "ct-mxfp4", K=128, group_size=32, **_W4), "weights",
     ["FP4 code 0b1000 (-0) read as -6"]),
    ("mx_next_block_scale", Case("w4a16-mxfp4", "ct-mxfp4", K=128, group_size=32, **_W4), "weights",
     ["MX blocks 0, 1, 2", "the E8M0 scale of block b+1 used for block b"]),
    ("w4a4_act_scale_high", Case("w4a4-mxfp4", "ct-mxfp4", K=128, group_size=32, **_W4), "activation quantization",
     ["activation block scale one E8M0 step high"]),
    ("w8a8_amax_128", Case("w8a8", "ct-int-quantized", K=96, group_size=-1, scale_dtype="float32", **_W4),
     "activation quantization", ["activation scale amax/128 instead of amax/127"]),
    ("w8a8_azp_sign", Case("w8a8", "ct-int-quantized", K=96, group_size=-1, sym=False, scale_dtype="float32", **_W4),
     "activation quantization", ["activation zero point sign flipped"]),
    ("w8a8_bias_twice", Case("w8a8", "ct-int-quantized", K=96, group_size=-1, bias=True, scale_dtype="float32", **_W4),
     "epilogue", ["bias added twice"]),
    ("w8a8_output_rtz", Case("w8a8", "ct-int-quantized", K=96, group_size=-1, scale_dtype="float32", **_W4),
     "epilogue", ["output rounded toward zero (truncated) instead of to nearest"]),
    ("w8a16_scale_transposed", Case("w8a16", "ct-int-quantized", M=3, N=64, K=64, group_size=-1,
                                    scale_dtype="float32"), "weights", ["scale transposed"]),
    ("w4a8_amax_128", Case("w4a8", "gptq", K=256, group_size=64, **_W4), "activation quantization",
     ["activation scale amax/128 instead of amax/127"]),
]


def case_inputs(bug: str, case: Case):
    """The case's seeded inputs; the 0xFF bug gets one E8M0 byte 0xFF planted (row 5, block 1)."""
    from conformance.cases.inputs import make_inputs

    inp = make_inputs(case, 3)
    if bug == "mx_ff_finite":
        t = dict(inp.tensors)
        sc = t["weight_scale"].copy()
        sc[5, 1] = 0xFF
        t["weight_scale"] = sc
        inp = dataclasses.replace(inp, tensors=t)
    return inp


def localize_with(bug: str, case: Case, inp=None) -> dict:
    from conformance.judge.localize import localize

    inp = inp or case_inputs(bug, case)
    k = Planted(bug=bug)
    prepared = k.prepare(case, inp.tensors)
    return localize(case, inp.tensors, k.declared(case), lambda x, b: k.run(prepared, x, bias=b), inp.bias)


@pytest.mark.parametrize("bug,case,stage,names", CASES, ids=[c[0] for c in CASES])
def test_localization_names_the_planted_bug(bug, case, stage, names):
    loc = localize_with(bug, case)
    text = "\n".join(localization_lines(loc))
    assert loc["stage"] == stage, text
    for n in names:
        assert n in loc["summary"] or n in text, f"{n!r} not in:\n{text}"
    if stage == "weights":  # one planted bug: one finding, nothing left unexplained beside it
        assert len(loc["weights"]["findings"]) == 1, text


@pytest.mark.parametrize("bug,case,stage,names", CASES, ids=[c[0] for c in CASES])
def test_control_kernel_passes_and_reads_back_exact(bug, case, stage, names):
    """The same kernel without its bug passes the case (the suite's judge) and every probe reads back exact,
    so each finding above comes from the bug, not from the kernel or the probes."""
    from conformance.judge.acceptance import declared_interval
    from conformance.run.runner import judge

    inp = case_inputs("none", case)
    k = Planted(bug="none")
    decl = k.declared(case)
    y = k.run(k.prepare(case, inp.tensors), inp.x, bias=inp.bias)
    from conformance.report.summary import PASSING

    assert judge(inp, declared_interval(inp, decl), y, decl).verdict in PASSING
    loc = localize_with("none", case, inp)
    assert loc["stage"] == "accumulation or output rounding", loc["summary"]
    ybug = Planted(bug=bug).run(Planted(bug=bug).prepare(case, case_inputs(bug, case).tensors), inp.x, bias=inp.bias)
    assert not np.array_equal(ybug, y, equal_nan=True)  # the planted bug changes this case's output
