"""Review: the localization must probe the kernel at the case's own M (docs/conformance.md#failure-localization).

A decode kernel (M = 1) with a weight bug the M > 1 path does not have: the one-hot readback must run one
row per call, or it reads back the other path's weights and reports "weights read back exact" (a kernel
author would then look in the accumulation). The planted kernel is tests/conformance/test_localize_kernels.py's,
its bug (nibbles swapped) planted in the M = 1 path only.
"""

from __future__ import annotations

import numpy as np

import test_localize_kernels as kernels
from backends.base import Case


class DecodeOnlyBug(kernels.Planted):
    """Correct for M > 1; at M = 1 the two nibbles of every qweight byte are swapped."""

    def prepare(self, case, tensors):
        p = super().prepare(case, tensors)
        p.data["W_decode"] = kernels.Planted(bug="gptq_nibble_swap")._weights(case, tensors)
        return p

    def run(self, prepared, x, bias=None, **kw):
        if np.asarray(x).shape[0] == 1:
            prepared = type(prepared)(prepared.case, {"W": prepared.data["W_decode"]})
        return super().run(prepared, x, bias=bias, **kw)


def test_a_decode_only_weight_bug_is_localized_in_the_weights():
    from conformance.acceptance import declared_interval
    from conformance.localize import localize
    from conformance.runner import judge

    case = Case("w4a16", "gptq", M=1, N=64, K=512, group_size=64)
    inp = kernels.case_inputs("none", case)
    k = DecodeOnlyBug(bug="none")
    prepared = k.prepare(case, inp.tensors)
    decl = k.declared(case)
    y = k.run(prepared, inp.x)
    assert judge(inp, declared_interval(inp, decl), y, decl)["verdict"] == "fail"  # the case fails at M = 1
    loc = localize(case, inp.tensors, decl, lambda x, b: k.run(prepared, x, bias=b), inp.bias)
    assert loc["stage"] == "weights", loc["summary"]
    assert "nibbles swapped within a byte" in loc["summary"]
    assert "read back exact" not in loc["summary"]
