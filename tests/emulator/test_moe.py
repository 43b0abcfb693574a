"""W4A16 MoE reference against an independent torch float64 implementation."""

import numpy as np
import pytest

from emulator.formats import gptq
from emulator.moe import GateUpOrder, GptqExperts, MoeVariant, dequantize_gptq_experts, moe_gptq_w4a16, moe_w16, route
from emulator.errors import FormatError


def test_route_ties_go_to_lower_index_and_variant_reverses():
    logits = np.array([[1.0, 3.0, 3.0, 0.0, 3.0]])
    ids, w = route(logits, 2)
    assert ids.tolist() == [[1, 2]]
    ids_r, _ = route(logits, 2, MoeVariant(tie_lower_index_first=False))
    assert ids_r.tolist() == [[4, 2]]
    assert w.sum() == pytest.approx(1.0)


def test_route_renormalize():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 8))
    _, w = route(logits, 3)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-15)
    _, w2 = route(logits, 3, MoeVariant(renormalize=False))
    assert np.all(w2.sum(axis=1) < 1.0)
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(np.sort(w2, axis=1)[:, ::-1], np.sort(p, axis=1)[:, ::-1][:, :3], rtol=1e-14)


def torch_moe(x, logits, w13, w2, top_k, renormalize=True, inter_dtype=None, expert_dtype=None, weighted=False):
    torch = pytest.importorskip("torch")
    xt = torch.from_numpy(x.astype(np.float64))
    p = torch.softmax(torch.from_numpy(logits.astype(np.float64)), dim=-1)
    vals, idx = torch.topk(p, top_k, dim=-1, sorted=True)
    if renormalize:
        vals = vals / vals.sum(dim=-1, keepdim=True)
    out = torch.zeros(x.shape, dtype=torch.float64)
    I = w13.shape[1] // 2
    for m in range(x.shape[0]):
        for j in range(top_k):
            e = int(idx[m, j])
            h = xt[m] @ torch.from_numpy(w13[e].astype(np.float64)).T
            a = torch.nn.functional.silu(h[:I]) * h[I:]
            if inter_dtype is not None:
                a = a.to(inter_dtype).to(torch.float64)
            o = a @ torch.from_numpy(w2[e].astype(np.float64)).T
            if expert_dtype is not None and weighted:
                out[m] += (vals[m, j] * o).to(expert_dtype).to(torch.float64)
            elif expert_dtype is not None:
                out[m] += vals[m, j] * o.to(expert_dtype).to(torch.float64)
            else:
                out[m] += vals[m, j] * o
    return out.numpy()


def _experts(seed=0, E=4, K=64, I=32):
    rng = np.random.default_rng(seed)
    w13 = (rng.standard_normal((E, 2 * I, K)) * 0.05).astype(np.float16)
    w2 = (rng.standard_normal((E, K, I)) * 0.05).astype(np.float16)
    x = rng.standard_normal((5, K)).astype(np.float16)
    logits = rng.standard_normal((5, E)).astype(np.float32)
    return x, logits, w13, w2


def test_moe_matches_torch_reference():
    torch = pytest.importorskip("torch")
    x, logits, w13, w2 = _experts()
    r = moe_w16(x, logits, w13, w2, 2)
    ref = torch_moe(x, logits, w13, w2, 2, inter_dtype=torch.float16)
    np.testing.assert_allclose(r.y_exact, ref, rtol=1e-9, atol=1e-12)
    r64 = moe_w16(x, logits, w13, w2, 2, variant=MoeVariant(intermediate_dtype="float64"))
    np.testing.assert_allclose(r64.y_exact, torch_moe(x, logits, w13, w2, 2), rtol=1e-9, atol=1e-12)
    assert not np.array_equal(r.y_exact, r64.y_exact)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_expert_output_dtype_matches_torch_reference(dtype):
    """expert_output_dtype rounds each o_e before the weighted sum; weighted rounds w_j o_e (docs/formats/moe.md
    #expert-outputs): against torch casts of the float64 expert outputs."""
    torch = pytest.importorskip("torch")
    x, logits, w13, w2 = _experts(2)
    td = getattr(torch, dtype)
    base = moe_w16(x, logits, w13, w2, 2).y_exact
    for weighted in (False, True):
        r = moe_w16(x, logits, w13, w2, 2, variant=MoeVariant(expert_output_dtype=dtype, expert_output_weighted=weighted))
        ref = torch_moe(x, logits, w13, w2, 2, inter_dtype=torch.float16, expert_dtype=td, weighted=weighted)
        np.testing.assert_allclose(r.y_exact, ref, rtol=1e-12, atol=1e-15)
        assert not np.array_equal(r.y_exact, base)
    act = moe_w16(x, logits, w13, w2, 2, variant=MoeVariant(expert_output_dtype="activation")).y_exact
    np.testing.assert_allclose(act, torch_moe(x, logits, w13, w2, 2, inter_dtype=torch.float16,
                                              expert_dtype=torch.float16), rtol=1e-12, atol=1e-15)


def test_every_moe_variant_differs():
    x, logits, w13, w2 = _experts(1)
    base = moe_w16(x, logits, w13, w2, 2).y_exact
    for v in (MoeVariant(renormalize=False), MoeVariant(gate_up=GateUpOrder.UP_GATE),
              MoeVariant(gate_up=GateUpOrder.INTERLEAVED)):
        assert not np.allclose(moe_w16(x, logits, w13, w2, 2, variant=v).y_exact, base), v
    tie_logits = np.zeros_like(logits)
    a = moe_w16(x, tie_logits, w13, w2, 1).y_exact
    b = moe_w16(x, tie_logits, w13, w2, 1, variant=MoeVariant(tie_lower_index_first=False)).y_exact
    assert not np.allclose(a, b)


def test_gptq_experts_layout_matches_per_expert_gptq():
    rng = np.random.default_rng(2)
    E, K, I, G = 3, 64, 32, 32
    p = gptq.GptqParams(bits=4, group_size=G, sym=True)
    w13 = (rng.standard_normal((E, 2 * I, K)) * 0.05).astype(np.float16)
    w2 = (rng.standard_normal((E, K, I)) * 0.05).astype(np.float16)
    t13 = [gptq.quantize_gptq(w13[e], p) for e in range(E)]
    t2 = [gptq.quantize_gptq(w2[e], p) for e in range(E)]
    q13, s13 = np.stack([t.qweight for t in t13]), np.stack([t.scales for t in t13])
    q2, s2 = np.stack([t.qweight for t in t2]), np.stack([t.scales for t in t2])
    assert q13.shape == (E, K // 8, 2 * I) and q2.shape == (E, I // 8, K)
    d13 = dequantize_gptq_experts(GptqExperts(q13, s13, group_size=G))
    for e in range(E):
        np.testing.assert_array_equal(d13[e], gptq.dequantize_gptq(t13[e], p))
    x = rng.standard_normal((4, K)).astype(np.float16)
    logits = rng.standard_normal((4, E)).astype(np.float32)
    r = moe_gptq_w4a16(x, logits, GptqExperts(q13, s13, group_size=G), GptqExperts(q2, s2, group_size=G), 2)
    d2 = dequantize_gptq_experts(GptqExperts(q2, s2, group_size=G), tensor="w2")
    np.testing.assert_array_equal(r.y_exact, moe_w16(x, logits, d13, d2, 2).y_exact)


def test_moe_errors_name_tensors():
    x, logits, w13, w2 = _experts()
    with pytest.raises(FormatError, match="w2"):
        moe_w16(x, logits, w13, w2[:, :, :3], 2)
    with pytest.raises(FormatError, match="router_logits.*top_k"):
        moe_w16(x, logits, w13, w2, 9)
    bad = logits.copy()
    bad[0, 0] = np.nan
    with pytest.raises(FormatError, match="router_logits: NaN"):
        moe_w16(x, bad, w13, w2, 2)
