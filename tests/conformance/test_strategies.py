"""Hypothesis strategies, and the emulator passing its own suite as every named variant it declares."""

import os

import numpy as np
import pytest
from hypothesis import given, settings

from conformance.cases.strategies import activations, case_inputs, cases
from conformance.run.inprocess import judge_inputs

OK = {"pass", "pass-with-tie-flips", "mistrusted"}
NIGHTLY = os.environ.get("QCONFORM_HYPOTHESIS_PROFILE") == "nightly"


@settings(max_examples=40)
@given(case_inputs())
def test_emulator_passes_random_cases(inp):
    rec = judge_inputs("emulator", inp, target=NIGHTLY)
    assert rec["verdict"] in OK, (inp.case.describe(), rec.get("reason"))


@settings(max_examples=25)
@given(cases())
def test_cases_are_valid_and_buildable(case):
    from conformance.cases.inputs import make_inputs

    inp = make_inputs(case, 0)
    assert inp.x.shape == (case.M, case.K)
    assert np.all(np.isfinite(inp.x))


@settings(max_examples=25)
@given(activations(4, 64, "bfloat16", distributions=("int8_ties",)))
def test_tie_distribution_really_makes_ties(x):
    from emulator.activations.int8 import quantize_int8_per_token

    a = quantize_int8_per_token(x)
    assert a.tie[:, 1:].all()


# Every named variant the emulator can compute: declared honestly, the emulator must pass its own
# exact and edge tiers (the suite must not fail a correct kernel of any named semantics).
VARIANTS = [
    "act_rounding=rhaz", "act_rounding=rtz", "act_rounding=rhtz", "reciprocal=recip_amax",
    "reciprocal=recip_scale", "act_scale_dtype=bfloat16", "act_scale_dtype=float16", "zero_row=eps,eps=1e-5",
    "qmin=-127", "mx_scale_rule=even", "mx_scale_rule=rceil", "mx_scale_rule=ceil", "e2m1_rounding=rhaz",
    "e2m1_rounding=rhtz", "e2m1_rounding=rtz", "mx_zero_block=half", "mx_nan_block=ignore",
    "dequant_order=mul_then_sub,weight_dtype=bfloat16", "weight_scale_dtype=bfloat16", "weight_dtype=bfloat16",
    "weight_dtype=float16", "zero_read=ignore_qzeros", "zero_read=v1_packed_add", "path=exact",
]


def _affected(variant: str, spec) -> bool:
    if spec.case.spec.quantize_only:  # no matmul: judged exactly (tests/conformance/test_quantize_only.py)
        return False
    s = spec.case.scheme
    if variant.startswith(("act_", "reciprocal", "zero_row", "qmin")):
        return s in ("w8a8", "w4a8")
    if variant.startswith(("mx_", "e2m1")):
        return s == "w4a4-mxfp4"
    if variant.startswith("zero_read"):
        return spec.case.weight_format == "gptq" and s != "w4a16-moe"
    if variant.startswith(("dequant_order", "weight_scale_dtype")):
        return spec.case.weight_format in ("gptq", "awq", "ct-pack-quantized") and s in ("w4a16", "w4a8")
    if variant.startswith("weight_dtype"):
        return s in ("w4a16", "w4a16-mxfp4")
    return True


@pytest.mark.parametrize("variant", VARIANTS)
def test_emulator_variant_passes_its_own_suite(variant):
    from backends.registry import create
    from conformance.judge.acceptance import declared_interval
    from conformance.run.runner import judge
    from conformance.cases.suite import case_list

    specs = [s for s in case_list(profile="smoke", tiers=("exact", "edge", "golden")) if _affected(variant, s)]
    specs = specs[:: max(1, len(specs) // 24)]  # a spread of at most ~24 cases per variant
    assert specs
    b = create("emulator:" + variant)
    for spec in specs:
        inp = spec.inputs()
        if not b.can_implement(inp.case).ok:
            continue
        d = b.declared(inp.case)
        y = b.run(b.prepare(inp.case, inp.tensors), inp.x, bias=inp.bias, router_logits=inp.router_logits)
        rec = judge(inp, declared_interval(inp, d), np.asarray(y, np.float32), d).record()
        assert rec["verdict"] in OK, (variant, spec.case_id, rec["reason"])
