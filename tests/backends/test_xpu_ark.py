"""The xpu backend's ARK variant (``xpu:lib=ark``) against the installed auto-round-lib's own Python, on CPU.

ARK's XPU library cannot load without an XPU, but its Python layer is the same on every device:
``QuantLinear.post_init`` (what vLLM's INCARKLinearMethod runs) and the ``repack_quantized_weight`` /
``woqgemm_linear`` wrappers. Here they run on CPU tensors with the native entry points replaced by
spies that record what they were handed (nothing is computed by the spies; no result is used): the
adapter's host transform must give post_init's weight operands, and the adapter's calls must reach
the native layer with the arguments in the places ARK's wrappers read them from.
"""

from __future__ import annotations

import numpy as np
import pytest

from backends import xpu
from backends.base import Case
from conformance.cases.inputs import make_inputs

torch = pytest.importorskip("torch")
ark = pytest.importorskip("auto_round_kernel")
qlinear = pytest.importorskip("auto_round_kernel.qlinear")


@pytest.mark.parametrize("g", [32, 128])
def test_ark_host_transform_equals_post_init(monkeypatch, g):
    """prepare_ark_host's int8 weight (q - 8, [K, N]), scales and empty zeros are what ARK's own
    QuantLinear.post_init (symmetric GPTQ, the class vLLM's INCARKLinearMethod builds) hands to
    repack_quantized_weight for the same checkpoint."""
    case = Case("w4a16", "gptq", 3, 64, 256, group_size=g)
    t = make_inputs(case, 4).tensors
    ours = xpu.prepare_ark_host(case, t)
    seen = []
    monkeypatch.setattr(ark, "repack_quantized_weight", lambda *a: seen.append(a) or torch.empty(0, dtype=torch.int8))
    layer = qlinear.QuantLinear(bits=4, group_size=g, sym=True, in_features=case.K, out_features=case.N, bias=False,
                                weight_dtype=torch.float16)
    layer.qweight.copy_(torch.from_numpy(np.asarray(t["qweight"], np.int32)))
    layer.qzeros.copy_(torch.from_numpy(np.asarray(t["qzeros"], np.int32)))
    layer.scales.copy_(torch.from_numpy(np.asarray(t["scales"], np.float32)).to(torch.float16))
    layer.post_init()
    [(intweight, scales, zeros, group_size, cdt, wdt, sdt, asym)] = seen
    assert intweight.dtype == ours["intweight"].dtype == torch.int8
    assert torch.equal(intweight, ours["intweight"])
    assert zeros.numel() == 0 and ours["zeros"].numel() == 0 and asym is False
    assert group_size == ours["group_size"] == g and wdt == ours["wdt"] == "int4"
    # on the CPU post_init keeps fp32 scales and cdt "auto"; on an XPU it casts them to fp16 and sets cdt int8
    # (qlinear.py, the xpu branch): the adapter's fp16 scales are those values
    assert (cdt, sdt) == ("auto", "fp32") and (ours["cdt"], ours["sdt"]) == ("int8", "fp16")
    assert torch.equal(scales.to(torch.float16), ours["scales"])


def test_ark_calls_reach_the_native_layer_in_place(monkeypatch):
    """call_ark_repack / call_ark_woqgemm through ARK's real Python wrappers: each argument arrives where the
    wrapper's parser puts it (the 8-argument repack form; woqgemm_linear's n, k, group size, types)."""
    case = Case("w4a16", "gptq", 3, 64, 256, group_size=32)
    d = xpu.prepare_ark_host(case, make_inputs(case, 5).tensors)
    core, gemm = [], []
    monkeypatch.setattr(ark, "_repack_quantized_weight_core",
                        lambda *a: core.append(a) or torch.zeros(16, dtype=torch.int8))
    blob = xpu.call_ark_repack(ark, d)
    [(qb, scale_b, zp, groupsize, compute_type, weight_type, scale_type, asym)] = core
    assert qb is d["intweight"] and scale_b is d["scales"] and groupsize == 32 and asym is False
    assert (compute_type, weight_type, scale_type) == ("int8", "int4", "fp16")
    # an empty zp with asym False: the wrapper substitutes zeros [K/G, N] (what the native layer reads)
    assert zp.dtype == torch.int8 and tuple(zp.shape) == (case.K // 32, case.N) and not zp.any()

    monkeypatch.setattr(ark, "woqgemm", lambda *a, **k: gemm.append(a) or torch.zeros(a[0].shape[0], a[3]))
    xt = torch.zeros(3, case.K, dtype=torch.bfloat16)
    y = xpu.call_ark_woqgemm(ark, xt, dict(d, blob=blob), None, case.N, case.K)
    [(a2d, b, bias, n, k, gs, ct, wt, st, asym2)] = gemm
    assert b is blob and (n, k, gs) == (case.N, case.K, 32) and (ct, wt, st, asym2) == ("int8", "int4", "fp16", False)
    assert tuple(a2d.shape) == (3, case.K) and bias.numel() == 0
    assert tuple(y.shape) == (3, case.N) and y.dtype == xt.dtype  # cast back to the input dtype by the wrapper


def test_adapter_ark_calls_are_all_checked():
    """Every ARK entry point the adapter calls is one checked above (a new call must be added here)."""
    import re
    from pathlib import Path

    called = set(re.findall(r"\bark\.(\w+)\(", Path(xpu.__file__).read_text()))
    assert called == {"repack_quantized_weight", "woqgemm_linear"}
