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
    from conformance.judge.acceptance import declared_interval
    from conformance.judge.localize import localize
    from conformance.run.runner import judge

    case = Case("w4a16", "gptq", M=1, N=64, K=512, group_size=64)
    inp = kernels.case_inputs("none", case)
    k = DecodeOnlyBug(bug="none")
    prepared = k.prepare(case, inp.tensors)
    decl = k.declared(case)
    y = k.run(prepared, inp.x)
    assert judge(inp, declared_interval(inp, decl), y, decl).verdict == "fail"  # the case fails at M = 1
    loc = localize(case, inp.tensors, decl, lambda x, b: k.run(prepared, x, bias=b), inp.bias)
    assert loc["stage"] == "weights", loc["summary"]
    assert "nibbles swapped within a byte" in loc["summary"]
    assert "read back exact" not in loc["summary"]



class SparseColumnBug(kernels.Planted):
    """A few GPTQ columns (``COLUMNS``) read as weight 0: a bug in columns the readback does not probe."""

    COLUMNS: list = []

    def _weights(self, case, t):
        W = super()._weights(case, t)
        W[:, self.COLUMNS] = 0.0
        return W


def test_a_partial_readback_never_says_the_weights_read_back_exact_unqualified():
    """K = 4096: about 1024 of the columns are read back; a weight bug in columns not among them leaves the
    readback exact, and the summary must say that only those columns were read back."""
    from conformance.judge.localize import localize

    case = Case("w4a16", "gptq", M=4, N=64, K=4096, group_size=128)
    inp = kernels.case_inputs("none", case)
    control = kernels.Planted(bug="none")
    cp = control.prepare(case, inp.tensors)
    probed: set = set()

    def watch(x, b):  # the columns the one-hot readback probes: rows with a single non-zero
        x = np.asarray(x)
        one = (x != 0).sum(axis=1) == 1
        probed.update(np.nonzero(x[one])[1].tolist())
        return control.run(cp, x, bias=b)

    localize(case, inp.tensors, control.declared(case), watch, inp.bias)
    assert 256 <= len(probed) < 4096
    SparseColumnBug.COLUMNS = [c for c in range(1000, 3000) if c not in probed][::40]
    assert len(SparseColumnBug.COLUMNS) >= 10
    k = SparseColumnBug(bug="none")
    prepared = k.prepare(case, inp.tensors)
    from conformance.judge.acceptance import declared_interval
    from conformance.run.runner import judge

    decl = k.declared(case)
    assert judge(inp, declared_interval(inp, decl), k.run(prepared, inp.x), decl).verdict == "fail"
    loc = localize(case, inp.tensors, decl, lambda x, b: k.run(prepared, x, bias=b), inp.bias)
    assert "read back exact" not in loc["summary"] or f"{len(probed)} of 4096 columns" in loc["summary"], \
        loc["summary"]
