"""Regression gate: the localization of some self-test mutants (conformance/selftest/doubles/mutants.py, the emulator
with one planted bug each; docs/selftest.md). The mutants are built on the emulator, so this is not an
independent oracle (test_localize_kernels.py is): it pins what each mutant's description says is wrong."""

import pytest

from backends.base import Case
from conformance.cases.inputs import make_inputs
from conformance.selftest.doubles.mutants import MutantBackend
from conformance.judge.localize import localize

GPTQ = Case("w4a16", "gptq", 3, 64, 256, group_size=64, sym=False)
W8A8 = Case("w8a8", "ct-int-quantized", 3, 64, 96, group_size=-1, bias=True)
MUTANTS = [
    ("group-off-by-one", GPTQ, "weights", "columns k with k mod 64 = 63: the scale and zero point of group g+1"),
    ("fp16-scales-as-bf16", GPTQ, "weights", "every row, every K group: float16 scale bits read as bfloat16"),
    ("awq-n64-tile", Case("w4a16", "awq", 3, 64, 128, group_size=64, sym=False), "weights",
     "rows 32..63 (of 64), every K group: output channel n computed with the weights of channel n - 32"),
    ("qzeros-ignored-asym", GPTQ, "weights", "the stored zero points ignored: the midpoint 8 used"),
    ("bias-dropped", W8A8, "epilogue", "bias not added"),
    ("int8-clamp-127", W8A8, "activation quantization", "activation codes clamped to [-127, 127]"),
    ("int8-per-tensor", W8A8, "activation quantization", "one activation scale for the whole tensor"),
    ("mx-scale-one-step-low", Case("w4a4-mxfp4", "ct-mxfp4", 3, 64, 128, group_size=32), "activation quantization",
     "activation block scale one E8M0 step low"),
    ("output-truncated-fp16", GPTQ, "epilogue", "output rounded toward zero (truncated)"),
]


@pytest.mark.parametrize("name,case,stage,text", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_mutant_localization(name, case, stage, text):
    k = MutantBackend(bug=name)
    inp = make_inputs(case, 2)
    p = k.prepare(case, inp.tensors)
    loc = localize(case, inp.tensors, k.declared(case), lambda x, b: k.run(p, x, bias=b), inp.bias)
    assert loc["stage"] == stage and text in loc["summary"], loc["summary"]
