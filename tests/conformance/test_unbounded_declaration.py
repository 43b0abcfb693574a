"""A declaration whose error bound is infinite accepts every output, so it must never pass.

Higham's gamma_n = n*u / (1 - n*u) is infinite once n*u >= 1: 16-bit accumulation (bf16: u = 2**-8)
over K >= 255 terms. Found by the gemlite adapter's first declaration (docs/backends/gemlite.md).
"""

import dataclasses

import numpy as np

from backends.registry import create
from conformance.judge.acceptance import declared_interval
from conformance.cases.inputs import make_inputs
from conformance.run.runner import judge
from emulator.schemes import Case


def _bf16_accumulation(K: int):
    case = Case("w4a16", "gptq", M=2, N=16, K=K, group_size=32, act_dtype="bfloat16")
    inp = make_inputs(case, 0)
    b = create("emulator")
    d = dataclasses.replace(b.declared(case), accumulate="bfloat16")
    y = np.asarray(b.run(b.prepare(case, inp.tensors), inp.x, bias=None), np.float32)
    return inp, d, y


def test_garbage_fails_where_the_bound_is_infinite():
    inp, d, y = _bf16_accumulation(512)
    iv = declared_interval(inp, d)
    assert not np.isfinite(iv.bound).any()  # the premise: gamma_512(2**-8) is infinite
    for bad in (y * 1000 + 7, np.zeros_like(y), y):
        rec = judge(inp, iv, np.asarray(bad, np.float32), d).record()
        assert rec["verdict"] == "fail", rec
        assert "no finite bound" in rec["reason"]


def test_short_sums_keep_a_finite_bound_and_pass():
    inp, d, y = _bf16_accumulation(64)
    iv = declared_interval(inp, d)
    assert np.isfinite(iv.bound).all()
    assert judge(inp, iv, y, d).verdict == "pass"
    assert judge(inp, iv, np.asarray(y * 1000 + 7, np.float32), d).verdict == "fail"
