"""The failure localization names layout, group-size, field-stride, MoE-MLP and amax-rounding bugs by their class
(docs/conformance.md#failure-localization; conformance/judge/localize_layout.py, localize_moe_mlp.py,
localize_amax.py), and a correct kernel gets no such claim.

Each buggy kernel is written here from the bug's one-line description in ``BUGS`` on top of the independent NumPy
kernels of test_localize_kernels.py / test_localize_patterns.py (which unpack the checkpoints from
docs/formats/*.md, not from the emulator); the localization runs in process on the case's own packed weights.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import test_localize_kernels as kernels
import test_localize_patterns as patterns
from backends.base import Case
from conformance.judge.localize_text import localization_lines

BUGS = {
    "none": "no bug (control)",
    "ct_scale_reshape": "compressed-tensors weight_scale [N, G] reshaped (not transposed) to [G, N]",
    "gptq8_stride4": "GPTQ 8-bit codes extracted with a 4-bit field stride (field i = (word >> 4 i) & 0xFF)",
    "gptq_g32_hardcoded": "the scale (and zero point) group of column k is k // 32: a kernel written for G = 32",
    "channel_term": "channels 5 and 9 get 1000 times their weight scale added to every output (a per-channel term "
                    "from a wrong buffer), whatever the input",
    "moe_sigmoid": "the MoE MLP computes sigmoid(gate) * up instead of silu(gate) * up",
    "moe_gelu": "the MoE MLP computes gelu(gate) * up (erf form) instead of silu(gate) * up",
    "moe_w2_groups_from_k": "w2's scale group size computed from the hidden size K (K // n_groups) instead of I",
}


class Layout(kernels.Planted):
    name = "layout"

    def __init__(self, **params):
        bug = params.get("bug", "none")
        assert bug in BUGS, bug
        super().__init__(bug="none")
        self.bug = bug

    def _weights(self, case: Case, t: dict) -> np.ndarray:
        N, K, bug = case.N, case.K, self.bug
        if bug == "ct_scale_reshape":  # docs/formats/compressed-tensors.md: fields store q + 8, scale [N, G]
            q = kernels._nibbles(t["weight_packed"])[:, :K].astype(np.float64) - 8
            s = t["weight_scale"].astype(np.float64)
            G = s.shape[1]
            s_gn = s.reshape(G, N)  # the bug: a reshape where a transpose belongs
            return q * s_gn[np.arange(K) // case.group, :].T
        if case.weight_format == "gptq" and case.bits == 8:  # docs/formats/gptq.md: qweight [K/4, N], 8-bit
            # fields along K (field i at bits 8i..8i+7; the bug: at 4i..4i+7); qzeros [G, N/4] along N, v1: z - 1
            stride = 4 if bug == "gptq8_stride4" else 8
            w = t["qweight"].astype(np.int64) & 0xFFFFFFFF  # [K/4, N]
            q = np.stack([(w >> (stride * i)) & 0xFF for i in range(4)], axis=1).reshape(K, N).T.astype(np.float64)
            zw = t["qzeros"].astype(np.int64) & 0xFFFFFFFF  # [G, N/4], 8-bit fields along N
            z = np.stack([(zw >> (8 * i)) & 0xFF for i in range(4)], axis=-1).reshape(zw.shape[0], -1)[:, :N] + 1
            s = t["scales"].astype(np.float64)
            g = np.arange(K) // case.group
            return (q - z[g].T) * s[g].T
        if bug == "gptq_g32_hardcoded":  # docs/formats/gptq.md, 4-bit; the group index of a G = 32 kernel
            q = kernels._nibbles(t["qweight"].T).astype(np.float64)
            z = kernels._nibbles(t["qzeros"]).astype(np.float64)[:, :N] + 1
            s = t["scales"].astype(np.float64)
            g = np.minimum(np.arange(K) // 32, s.shape[0] - 1)
            return (q - z[g].T) * s[g].T
        return super()._weights(case, t)

    def run(self, prepared, x, bias=None, **kw):
        y = super().run(prepared, x, bias=bias, **kw)
        if self.bug != "channel_term":
            return y
        s = prepared.data["t"]["weight_scale"].astype(np.float64).reshape(-1)
        y = y.astype(np.float64)
        y[:, [5, 9]] += 1000 * s[[5, 9]]
        return kernels._round(y, prepared.case.output_dtype)

    def prepare(self, case, tensors):
        p = super().prepare(case, tensors)
        p.data["t"] = tensors
        return p


def _localize(bug: str, case: Case, seed: int = 3) -> dict:
    from conformance.cases.inputs import make_inputs
    from conformance.judge.localize import localize

    inp = make_inputs(case, seed)
    k = Layout(bug=bug)
    prepared = k.prepare(case, inp.tensors)
    return localize(case, inp.tensors, k.declared(case), lambda x, b: k.run(prepared, x, bias=b), inp.bias)


_W = dict(M=3, N=64)
# (bug, case, must name, must not claim)
WEIGHT_CASES = [
    ("ct_scale_reshape", Case("w4a16", "ct-pack-quantized", K=128, group_size=32, **_W),
     ["weights wrong: every row, every K group: the scales' [N, G] = [64, 4] matrix reshaped to [G, N] instead of "
      "transposed: the scale of row n, group g read from flat position g * N + n"],
     ["no named pattern", "every weight scaled by"]),
    ("gptq8_stride4", Case("w8a16", "gptq", K=128, group_size=64, bits=8, **_W),
     ["columns k with k mod 4 in {1, 2, 3}", "8-bit codes extracted with a 4-bit field stride: field i of each "
      "32-bit word read from bits 4i..4i+7"],
     ["no named pattern", "whole number of scale steps", "bytes in reverse order"]),
    ("gptq_g32_hardcoded", Case("w4a8", "gptq", K=256, group_size=128, **_W),
     ["columns 32..127: group size 32 (hard-coded) instead of 128: column k read with the scale and "
      "zero point of group min(k // 32, 1)"],
     ["group g+1 used for group g", "equally consistent", "no named pattern"]),
    ("channel_term", Case("w8a16", "ct-int-quantized", K=64, group_size=-1, scale_dtype="float32", **_W),
     ["rows 5, 9 (of 64): the same amount", "added to every one-hot output of the row, whatever the input column: a "
      "term added per output channel, not a weight"],
     ["no named pattern", "whole number of scale steps", "offset by exactly"]),
]


@pytest.mark.parametrize("bug,case,names,not_names", WEIGHT_CASES, ids=[c[0] for c in WEIGHT_CASES])
def test_weight_layout_bug_named_by_its_class(bug, case, names, not_names):
    loc = _localize(bug, case)
    text = "\n".join(localization_lines(loc))
    assert loc["stage"] == "weights", text
    for n in names:
        assert n in text, f"{n!r} not in:\n{text}"
    claims = "\n".join(line for line in text.splitlines() if line.startswith(("localization:", "  weights:")))
    for n in not_names:  # (an activation probe over wrong weights differs too: that part says so, unnamed)
        assert n not in claims, f"{n!r} claimed in:\n{text}"
    assert len(loc["weights"]["findings"]) == 1, text  # one bug: one finding, nothing left unexplained
    # a per-channel term is marked as outside the weights (for the stage); a weight bug is not
    assert bool(loc["weights"]["findings"][0].get("not_weights")) == (bug == "channel_term"), text


@pytest.mark.parametrize("bug,case,names,not_names", WEIGHT_CASES, ids=[c[0] for c in WEIGHT_CASES])
def test_correct_kernel_gets_no_layout_claim(bug, case, names, not_names):
    """The same kernel without the bug reads back exact on the same case: no weight finding at all."""
    loc = _localize("none", case)
    assert loc["weights"]["ok"] and not loc["weights"]["findings"], localization_lines(loc)


def test_layout_hypotheses_are_the_described_permutations():
    """Each layout hypothesis is the bug its name describes, checked on a small hand-made decomposition: the
    reshape reads flat position g * N + n, the group size G' reads group min(k // G', n - 1), and a 4-bit stride
    of 8-bit fields reads bits 4i..4i+7 of the packed word."""
    from conformance.judge.localize_layout import layout_hypotheses, restride
    from conformance.judge.localize_weights import Structure

    N, K, G = 3, 32, 16
    q = np.arange(N * K, dtype=np.float64).reshape(N, K) % 7
    scale = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])  # [N, n_groups]
    grp = np.arange(K) // G
    st = Structure("int", q * scale[:, grp], q, q.astype(np.int64), np.zeros_like(scale), scale, grp, G, 4, "K", 8)
    case = Case("w4a16", "ct-pack-quantized", M=1, N=N, K=K, group_size=G)
    hyps = dict(layout_hypotheses(st, case))
    flat = scale.reshape(-1)  # [1, 2, 3, 4, 5, 6]
    want = np.array([[flat[g * N + n] for g in range(2)] for n in range(N)])  # s'[n, g] = flat[g N + n]
    name = next(k for k in hyps if "reshaped to [G, N]" in k)
    np.testing.assert_array_equal(hyps[name], q * want[:, grp])
    name = next(k for k in hyps if k.startswith("group size 8 (hard-coded) instead of 16"))
    np.testing.assert_array_equal(hyps[name], q * scale[:, np.minimum(np.arange(K) // 8, 1)])
    # 8-bit fields 0x11, 0x22, 0x33, 0x44 in one word 0x44332211: at a 4-bit stride field i = bits 4i..4i+7
    f = restride(np.array([[0x11, 0x22, 0x33, 0x44]]), 8, 4, 8)
    np.testing.assert_array_equal(f, [[0x11, 0x21, 0x22, 0x32]])


# -- MoE: the expert's MLP -----------------------------------------------------------------------------------------
class MoeMlp(patterns.PatternedMoe):
    def __init__(self, **params):
        bug = params.get("bug", "none")
        assert bug in BUGS, bug
        kernels.Planted.__init__(self, bug="none")
        self.bug = bug

    def prepare(self, case, tensors):
        from backends.base import Prepared

        w13 = patterns._experts(tensors["w13_qweight"], tensors["w13_scales"], case.group)  # [E, K, 2I]
        if self.bug == "moe_w2_groups_from_k":  # docs/formats/moe.md: w2 [E, I/8, K] packed along I, scales [E, n, K]
            E, _, K = tensors["w2_qweight"].shape
            q = np.stack([kernels._nibbles(tensors["w2_qweight"][e].T).T for e in range(E)]).astype(np.float64)
            s = tensors["w2_scales"].astype(np.float64)
            n = s.shape[1]
            g = np.minimum(np.arange(q.shape[1]) // (K // n), n - 1)  # the bug: K // n_groups, not I // n_groups
            w2 = (q - 8) * s[:, g, :]
        else:
            w2 = patterns._experts(tensors["w2_qweight"], tensors["w2_scales"], case.moe_w2_group_size)
        return Prepared(case, {"w13": w13, "w2": w2})

    def run(self, prepared, x, bias=None, router_logits=None, **_):
        case, bug = prepared.case, self.bug
        if bug not in ("moe_sigmoid", "moe_gelu"):
            self.bug, bug_saved = "none", bug
            try:
                return super().run(prepared, x, bias=bias, router_logits=router_logits)
            finally:
                self.bug = bug_saved
        import math

        w13, w2 = prepared.data["w13"], prepared.data["w2"]
        I = w2.shape[1]
        x = np.asarray(x, np.float64)
        L = np.asarray(router_logits, np.float64)
        p = np.exp(L - L.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        y = np.zeros((len(x), w2.shape[2]))
        erf = np.vectorize(math.erf)
        for m in range(len(x)):
            ids = np.argsort(-p[m], kind="stable")[: case.top_k]
            w = p[m, ids] / p[m, ids].sum()
            for j, e in enumerate(ids):
                h = x[m] @ w13[e]
                gate, up = h[:I], h[I:]
                act = 1 / (1 + np.exp(-gate)) if bug == "moe_sigmoid" else 0.5 * (1 + erf(gate / math.sqrt(2)))
                a = kernels._round(act * (1 if bug == "moe_sigmoid" else gate) * up, case.act_dtype).astype(np.float64)
                y[m] += w[j] * (a @ w2[e])
        return kernels._round(y, case.output_dtype)


# I = N = 64 in two w2 groups of 32, K = 128: K // n_groups = 64 != 32
_MOE = Case("w4a16-moe", "gptq", M=4, N=64, K=128, group_size=32, E=4, top_k=2)
MOE_CASES = [
    ("moe_sigmoid", ["experts 0, 1, 2, 3 (of 4) fail alone",
                     "the MLP activation is sigmoid(gate) * up instead of silu(gate) * up"]),
    ("moe_gelu", ["the MLP activation is gelu(gate) * up (erf form) instead of silu(gate) * up"]),
    ("moe_w2_groups_from_k", ["the down projection (w2): its 2 scale groups of 32 input rows read with 64 rows per "
                              "group (computed as the hidden size K // n_groups = 128 // 2)"]),
]


def _localize_moe(bug: str):
    from conformance.cases.inputs import make_inputs
    from conformance.judge.localize import localize

    inp = make_inputs(_MOE, 4)
    k = MoeMlp(bug=bug)
    prepared = k.prepare(_MOE, inp.tensors)
    return localize(_MOE, inp.tensors, k.declared(_MOE), lambda x, b, router_logits=None: k.run(
        prepared, x, bias=b, router_logits=router_logits), inp.bias, x=inp.x, router_logits=inp.router_logits)


@pytest.mark.parametrize("bug,names", MOE_CASES, ids=[c[0] for c in MOE_CASES])
def test_moe_mlp_bug_named(bug, names):
    loc = _localize_moe(bug)
    text = "\n".join(localization_lines(loc))
    assert loc["stage"] == "experts", text
    for n in names:
        assert n in text, f"{n!r} not in:\n{text}"
    assert "no named projection bug" not in text, text
    others = [b for b, _ in MOE_CASES if b != bug]  # the other classes are not claimed
    for b, ns in MOE_CASES:
        if b in others:
            assert ns[-1] not in text, text


def test_moe_correct_kernel_gets_no_mlp_claim():
    loc = _localize_moe("none")
    assert not loc["experts"]["failing"] and not loc["experts"]["findings"], localization_lines(loc)


# -- activation amax rounded before the scale ----------------------------------------------------------------------------
_GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])


def _mx_block(x: np.ndarray, amax: float) -> np.ndarray:
    """docs/formats/mxfp4.md: exponent floor(log2 amax) - 2, elements RNE (ties to the even code) to E2M1,
    saturating at 6; here with the amax given."""
    e = int(np.floor(np.log2(amax))) - 2
    mag = np.minimum(np.abs(x) / 2.0 ** e, 6)
    best = np.argmin(np.abs(mag[:, None] - _GRID) + 1e-12 * (np.arange(8) % 2), axis=1)
    return np.sign(x) * _GRID[best] * 2.0 ** e


def test_mx_amax_rounded_to_bf16_hypothesis_is_the_described_bug():
    """Block 0's amax sits one float32 ulp below 8: rounded to bfloat16 it is 8, the exponent one higher; block 1's
    amax (5) is unchanged by the rounding. The hypothesis' activations equal the described kernel's, and differ
    from the declared quantization in block 0 only."""
    from conformance.judge.localize_amax import amax_hypotheses
    from backends.base import Declared

    rng = np.random.default_rng(0)
    x = rng.uniform(-4, 4, (1, 64)).astype(np.float32)
    x[0, 3] = np.nextafter(np.float32(8), np.float32(0))
    x[0, 40] = np.float32(-5)
    case = Case("w4a4-mxfp4", "ct-mxfp4", M=1, N=8, K=64, group_size=32, act_dtype="float32")
    hyps = {n: v for n, _, v in amax_hypotheses(case, Declared(variants={}), x)}
    name = next(n for n in hyps if "rounded to bfloat16" in n)
    assert "amax rounded up to the next power of two" in name
    xb = x[0].astype(np.float64)
    a0 = float(np.float32(np.abs(xb[:32]).max()).astype(ml_dtypes.bfloat16))
    assert a0 == 8.0
    want = np.r_[_mx_block(xb[:32], a0), _mx_block(xb[32:], 5.0)]
    np.testing.assert_array_equal(hyps[name][0], want)
    declared = np.r_[_mx_block(xb[:32], np.abs(xb[:32]).max()), _mx_block(xb[32:], 5.0)]
    assert not np.array_equal(want[:32], declared[:32]) and np.array_equal(want[32:], declared[32:])


def test_int8_amax_rounded_to_bf16_hypothesis_is_the_described_bug():
    """Symmetric per-token int8 with the row's amax rounded to bfloat16 before s = amax / 127 (float32 steps)."""
    from conformance.judge.localize_amax import amax_hypotheses
    from backends.base import Declared

    x = np.array([[1.0, -0.5, 3.14159, 0.25, -2.0, 0.1, 0.7, 1.3]], np.float32)
    case = Case("w8a8", "ct-int-quantized", M=1, N=4, K=8, group_size=-1, act_dtype="float32", scale_dtype="float32")
    hyps = {n: v for n, _, v in amax_hypotheses(case, Declared(variants={}), x)}
    name = "activation amax rounded to bfloat16 before the scale is computed from it"
    amax = np.float32(float(np.float32(3.14159).astype(ml_dtypes.bfloat16)))  # 3.140625
    s = np.float32(amax / np.float32(127))
    q = np.clip(np.rint((x / s).astype(np.float32).astype(np.float64)), -128, 127)
    np.testing.assert_array_equal(hyps[name], q * np.float64(s))


def test_amax_hypotheses_change_nothing_where_the_rounding_is_exact():
    """A correct kernel's rows with amax exact in bfloat16 (a power of two here) get hypotheses equal to the declared
    quantization, so the own-rows analysis (which requires a hypothesis to change the failing rows) cannot claim one."""
    from conformance.judge.localize_amax import amax_hypotheses
    from backends.base import Declared

    x = (np.arange(64, dtype=np.float32).reshape(1, 64) % 13 - 6) / 2
    x[0, 0], x[0, 32] = 4.0, -8.0
    case = Case("w4a4-mxfp4", "ct-mxfp4", M=1, N=8, K=64, group_size=32, act_dtype="float32")
    xb = x[0].astype(np.float64)
    declared = np.r_[_mx_block(xb[:32], 4.0), _mx_block(xb[32:], 8.0)]
    for name, _, v in amax_hypotheses(case, Declared(variants={}), x):
        np.testing.assert_array_equal(v[0], declared, err_msg=name)

