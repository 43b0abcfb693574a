"""When a variant axis acts (emulator/variants.py ``Axis.acts_when``, docs/variants.md#when-an-axis-acts), seen
through what reads it: ``Declared.deviations`` and the fingerprint's co-decided keys. Expected values are the
semantics stated in docs/formats/activations.md, docs/formats/gptq.md and docs/formats/mxfp4.md."""

from __future__ import annotations

import pytest

from emulator.declaration import Declared
from emulator.schemes import Case
from emulator.variants import AXES, Level, acts

W8A8_SYM = Case("w8a8", "ct-int-quantized", 1, 32, 64, group_size=-1)
W8A8_ASYM = Case("w8a8", "ct-int-quantized", 1, 32, 64, group_size=-1, sym=False)
W4A16 = Case("w4a16", "ct-pack-quantized", 1, 32, 64, group_size=32, sym=False, scale_dtype="float16")
MOE = Case("w4a16-moe", "gptq", 1, 32, 64, group_size=32, E=4, top_k=2)
W4A4 = Case("w4a4-mxfp4", "ct-mxfp4", 1, 32, 64, group_size=32)


def _devs(case, variants=None, **fields) -> dict:
    return {d.key: d.level for d in Declared(variants=variants or {}, **fields).deviations(case)}


@pytest.mark.parametrize("variants,case,key,acting", [
    ({"eps": 1e-5}, W8A8_SYM, "eps", False),  # an eps clamp under zero_row=zero clamps nothing
    ({"zero_row": "eps", "eps": 1e-5}, W8A8_SYM, "eps", True),
    ({"e2m1_nan": "saturate"}, W4A4, "e2m1_nan", False),  # a NaN block scale hides the element code
    ({"e2m1_nan": "saturate", "mx_nan_block": "ignore"}, W4A4, "e2m1_nan", True),
    ({"zero_dtype": "bfloat16"}, W4A16, "zero_dtype", False),  # no float zero point under sub_then_mul
    ({"zero_dtype": "bfloat16", "dequant_order": "float_zero"}, W4A16, "zero_dtype", True),
    ({"act_range": "zero_inclusive"}, W8A8_SYM, "act_range", False),  # symmetric rows have no min/max range
    ({"act_range": "zero_inclusive"}, W8A8_ASYM, "act_range", True),
    ({"act_range": "zero_inclusive", "act_symmetric": False}, W8A8_SYM, "act_range", True),
    ({"azp_fused": True, "act_symmetric": False}, W8A8_SYM, "azp_fused", False),  # nothing to fuse
    ({"azp_fused": True, "azp_before_rounding": True, "reciprocal": "recip_scale"}, W8A8_ASYM, "azp_fused", True),
    ({"azp_clamp_nan": "high"}, W8A8_ASYM, "azp_clamp_nan", False),  # no clamp, nothing to do with NaN
    ({"azp_clamp_nan": "high", "azp_clamp": True}, W8A8_ASYM, "azp_clamp_nan", True),
    ({"act_rounding": "rhaz"}, MOE, "act_rounding", False),  # 16-bit GEMM inputs: no int8 rounding
    ({"act_rounding": "rhaz", "moe_act_quant": "int8"}, MOE, "act_rounding", True),
    ({"act_rounding": "rhaz"}, W4A16, "act_rounding", False),  # not an int8-activation scheme
    # docs/formats/moe.md#expert-outputs: the weight multiplies the output before *that store*; exact outputs
    # have no store, so weighting them first changes nothing
    ({"moe_expert_output_weighted": True}, MOE, "moe_expert_output_weighted", False),
    ({"moe_expert_output_weighted": True, "moe_expert_output_dtype": "activation"}, MOE,
     "moe_expert_output_weighted", True),
    ({"moe_expert_output_weighted": True, "moe_expert_output_dtype": "bfloat16"}, MOE,
     "moe_expert_output_weighted", True),
])
def test_an_axis_deviates_only_where_it_acts(variants, case, key, acting):
    assert (key in _devs(case, variants)) is acting
    typed = Declared(variants=variants)
    assert acts(key, lambda k: typed.value_for(k, case), case.scheme) is acting


def test_weight_rounding_and_formation_act_on_16_bit_weights_and_in_scale_dtype_always():
    assert "weight_rounding" not in _devs(W4A16, {"weight_rounding": "rtz"})  # exact float32 weights
    assert _devs(W4A16, {"weight_rounding": "rtz"}, weight_dtype="bfloat16")["weight_rounding"] is Level.ROUNDING
    assert "weight_formation" not in _devs(W4A16, {"weight_formation": "float32_then_round"}, weight_dtype="float32")
    # formed in the (float16) scale's dtype: not the float32 weights, whatever the weight dtype
    assert "weight_formation" in _devs(W4A16, {"weight_formation": "in_scale_dtype"}, weight_dtype="float32")


def test_azp_clamp_is_rounding_level_under_a_zero_inclusive_range():
    assert _devs(W8A8_ASYM, {"azp_clamp": True})["azp_clamp"] is Level.SEMANTIC
    assert _devs(W8A8_ASYM, {"azp_clamp": True, "act_range": "zero_inclusive"})["azp_clamp"] is Level.ROUNDING


def test_a_silent_act_symmetric_is_the_case_s():
    assert Declared(variants={}).value_for("act_symmetric", W8A8_ASYM) is False
    assert Declared(variants={}).value_for("act_symmetric", W8A8_SYM) is True
    assert "act_symmetric" not in _devs(W8A8_ASYM)  # the checkpoint's own scheme: canonical
    assert _devs(W8A8_ASYM, {"act_symmetric": True})["act_symmetric"] is Level.SEMANTIC


def test_the_fingerprint_reads_its_co_decided_keys_from_the_vocabulary():
    """eps, e2m1_nan and zero_dtype are decided with the key they act under (one probe axis each)."""
    from conformance.fingerprint.axes import CONDITIONAL

    assert CONDITIONAL == {"eps": "acts only under zero_row=eps", "e2m1_nan": "acts only under mx_nan_block=ignore",
                           "zero_dtype": "acts only under dequant_order=float_zero"}
    for key in CONDITIONAL:
        assert AXES[key].acts_when
