"""The variant vocabulary (emulator/variants.py) drives every consumer: each axis and each value is tried
through Declared, the emulator backend's parameters, the typed stage variants, the acceptance intervals,
``qconform linear --variant``, the fingerprint and docs/variants.md (docs/variants.md)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from backends.base import Case, Declared
from backends.emulator import EmulatorBackend
from conformance.fingerprint import decide as fingerprint
from conformance.judge.acceptance import compare, declared_interval
from conformance.cases.inputs import make_inputs
from emulator import moe as emoe
from emulator.activations import int8 as a8
from emulator.declaration import dequant_variant, int8_variant, moe_variant, mx_variant
from emulator.formats.int_common import CANONICAL_DEQUANT, DequantVariant
from emulator.formats import mxfp4
from emulator.variants import AXES, FIELD_AXES, VARIANT_AXES, Level, VariantError, markdown_table

ROOT = Path(__file__).resolve().parents[2]


def _values(a):
    """Every named value of an axis, or representative ones of a typed axis."""
    if a.values:
        return list(a.values)
    return {"bool": [True, False], "int": [a.bounds[0], a.bounds[1]] if a.bounds else [a.canonical],
            "float": [1e-7, 1e-5]}[a.kind]


def _case_for(a) -> Case:
    scheme = a.schemes[0]
    return {"w4a16": Case("w4a16", "gptq", 2, 32, 64, group_size=32, sym=False),
            "w8a8": Case("w8a8", "ct-int-quantized", 2, 32, 64, group_size=-1),
            "w4a8": Case("w4a8", "ct-pack-quantized", 2, 32, 64, group_size=32, scale_dtype="float32"),
            "w4a4-mxfp4": Case("w4a4-mxfp4", "ct-mxfp4", 2, 32, 64, group_size=32),
            "w4a16-moe": Case("w4a16-moe", "gptq", 3, 32, 64, group_size=32, E=4, top_k=2)}[scheme]


AXIS_VALUES = [(k, v) for k, a in AXES.items() for v in _values(a)]


@pytest.mark.parametrize("key,value", AXIS_VALUES, ids=[f"{k}={v}" for k, v in AXIS_VALUES])
def test_every_value_is_accepted_by_declared_and_the_emulator_backend(key, value):
    a = AXES[key]
    if a.field:
        if key == "output" and value == "case":
            with pytest.raises(VariantError):
                Declared(variants={}, output="case")
        else:
            extra = {"sqnr_floor_db": 30.0} if (key, value) == ("arithmetic", "opaque") else {}
            d = Declared(variants={}, **{key: (None if (key, value) == ("act_compute_dtype", "none") else value)},
                         **extra)
            assert d.value(key) == value
    else:
        assert Declared(variants={key: value}).value(key) == value
        # the command-line spelling of the value parses to the same typed value
        assert Declared(variants={key: str(value).lower()}).value(key) == value
    if key not in ("output", "arithmetic"):  # the emulator's output dtype is the case's; its arithmetic is declared
        b = EmulatorBackend(**{key: str(value).lower()})
        assert b.computed(_case_for(a)).value(key) == value


@pytest.mark.parametrize("key", sorted(AXES))
def test_unknown_values_are_errors_naming_the_known_ones(key):
    a = AXES[key]
    bad = {"choice": "no_such_value", "bool": "maybe", "int": "-1000", "float": "-1"}[a.kind]
    with pytest.raises(VariantError, match=re.escape(key)):
        a.parse(bad)
    if key != "arithmetic":
        with pytest.raises(ValueError, match=re.escape(key)):
            EmulatorBackend(**{key: bad})
    if not a.field:
        with pytest.raises(VariantError, match="known" if a.kind == "choice" else re.escape(key)):
            Declared(variants={key: bad})


def test_unknown_keys_are_errors_everywhere():
    with pytest.raises(VariantError, match="known: .*act_rounding"):
        Declared(variants={"act_roundng": "rne"})
    with pytest.raises(ValueError, match="act_roundng.*known: .*act_rounding"):
        EmulatorBackend(act_roundng="rne")
    with pytest.raises(VariantError, match="Declared field"):
        Declared(variants={"accumulate": "float32"})
    with pytest.raises(VariantError):
        Declared(variants={}, accumulate="float8")


def _typed(key, value):
    """The emulator field an axis targets (``target`` names it), read from the typed builder."""
    a = AXES[key]
    # values that are only defined together with another axis
    companion = {("azp_before_rounding", True): {"act_symmetric": False}, ("zero_row", "eps"): {"eps": 1e-7},
                 ("reciprocal", "recip_amax"): {"act_symmetric": True}}.get((key, value), {})
    # weight_rounding rounds the conversions to a 16-bit weight_dtype (weight_formation=in_weight_dtype)
    d = Declared(variants={key: value, **companion}, weight_dtype="bfloat16" if key == "weight_rounding" else "exact")
    cls, _, field = a.target.partition(".")
    if cls == "Int8ActVariant":
        return getattr(int8_variant(d), field), field
    if cls == "MxVariant":
        return getattr(mx_variant(d), field), field
    if cls == "MoeVariant":
        return getattr(moe_variant(d), field), field
    if cls == "DequantVariant":
        return getattr(dequant_variant(d), field), field
    return None, None


@pytest.mark.parametrize("key,value", [(k, v) for k, v in AXIS_VALUES if AXES[k].target.split(".")[0] in
                                       ("Int8ActVariant", "MxVariant", "MoeVariant", "DequantVariant")])
def test_each_value_reaches_the_emulator_field_it_names(key, value):
    got, field = _typed(key, value)
    canonical = {"Int8ActVariant": a8.Int8ActVariant(), "MxVariant": mxfp4.MxVariant(),
                 "MoeVariant": emoe.MoeVariant(), "DequantVariant": DequantVariant()}[AXES[key].target.split(".")[0]]
    got_v = got.value if hasattr(got, "value") else got
    # the vocabulary's value name is the emulator enum's value, or maps onto the field's meaning
    special = {("moe_tie_order", "higher_index_first"): False, ("moe_tie_order", "lower_index_first"): True,
               ("moe_tie_order", "any"): True, ("moe_intermediate_dtype", "activation"): None,
               ("moe_gate_up_dtype", "exact"): None, ("moe_expert_output_dtype", "exact"): None,
               ("act_dequant_scale_dtype", "same"): None,
               ("moe_act_quant", "none"): None, ("weight_scale_dtype", "checkpoint"): None, ("zero_dtype", "weight"): None}
    expected = special.get((key, value), value)
    if (key, value) == ("moe_act_quant", "int8"):
        assert isinstance(got, a8.Int8ActVariant)
        return
    assert got_v == expected, (key, value, field, got)
    if value != AXES[key].canonical and (key, value) not in special:
        assert got != getattr(canonical, field)


def test_weight_axes_reach_the_dequantizer_arguments():
    assert dequant_variant(Declared(variants={"dequant_order": "float_zero", "zero_dtype": "bfloat16",
                                              "weight_scale_dtype": "float16", "weight_rounding": "rtz"},
                                    weight_dtype="bfloat16")) == DequantVariant(
        order="float_zero", zero_dtype="bfloat16", scale_dtype="float16", compute_rounding="rtz",
        compute_dtype="bfloat16")
    assert dequant_variant(Declared(variants={"weight_scale_dtype": "checkpoint", "zero_dtype": "weight"})) \
        == CANONICAL_DEQUANT


# -- every non-canonical variant value changes the declared interval somewhere it applies ---------------
OBSERVABLE = [(k, v) for k, a in VARIANT_AXES.items() for v in _values(a) if v != a.canonical and a.kind == "choice"
              and k not in ("nan_to_int", "e2m1_nan", "e2m1_zero_sign", "mx_zero_block", "mx_nan_block",
                            "zero_dtype", "weight_rounding", "moe_tie_order", "bias_stage", "azp_epilogue",
                            "act_granularity", "act_scheme", "zero_row", "act_dequant_scale_dtype")]


@pytest.mark.parametrize("key,value", OBSERVABLE, ids=[f"{k}={v}" for k, v in OBSERVABLE])
def test_emulator_backend_with_each_variant_passes_its_own_declaration(key, value):
    """Regression gate (the emulator against its own declaration): every variant the vocabulary names
    runs through the backend and the acceptance code end to end, for a case it applies to."""
    case = _case_for(AXES[key])
    inp = make_inputs(case, 3)
    b = EmulatorBackend(**{key: value})
    if not b.can_implement(case):
        pytest.skip(b.can_implement(case).reason)
    y = b.run(b.prepare(case, inp.tensors), inp.x, **({"router_logits": inp.router_logits}
                                                      if inp.router_logits is not None else {}))
    assert compare(y, declared_interval(inp, b.declared(case))).ok


# -- levels: the classifications the trust issue names -----------------------------------------------------
def test_levels_of_declarations():
    asym_v1 = Case("w4a16", "gptq", 2, 32, 64, group_size=32, sym=False, zero_convention="v1")
    sym_v1 = Case("w4a16", "gptq", 2, 32, 64, group_size=32, sym=True, zero_convention="v1")
    w8a8 = Case("w8a8", "ct-int-quantized", 2, 32, 64, group_size=-1)
    assert Declared(variants={"zero_read": "v1_literal"}).level(asym_v1) is Level.SEMANTIC
    # on a symmetric checkpoint another reading is exact only where every qzeros field is the midpoint: the
    # level looks at the tensors, and without them it is the conservative answer
    mid = make_inputs(Case("w4a16", "gptq", 2, 32, 64, group_size=32, sym=True, zero_convention="v1"), 0).tensors
    assert Declared(variants={"zero_read": "v1_literal"}).level(sym_v1, mid) is Level.CANONICAL
    assert Declared(variants={"zero_read": "ignore_qzeros"}).level(sym_v1, mid) is Level.CANONICAL
    assert Declared(variants={"zero_read": "ignore_qzeros"}).level(sym_v1) is Level.SEMANTIC
    odd = dict(mid, qzeros=mid["qzeros"] ^ np.int32(1))  # the first field of every word is no longer the midpoint
    assert Declared(variants={"zero_read": "ignore_qzeros"}).level(sym_v1, odd) is Level.SEMANTIC
    assert Declared(variants={"act_rounding": "rhaz"}).level(w8a8) is Level.ROUNDING
    assert Declared(variants={"act_rounding": "rhaz"}).level(asym_v1) is Level.CANONICAL  # no int8 activations
    assert Declared(variants={"act_granularity": "per_tensor"}).level(w8a8) is Level.SEMANTIC
    assert Declared(variants={"act_symmetric": False}).level(w8a8) is Level.SEMANTIC
    asym_w8a8 = Case("w8a8", "ct-int-quantized", 2, 32, 64, group_size=-1, sym=False)
    assert Declared(variants={"act_symmetric": False}).level(asym_w8a8) is Level.CANONICAL
    assert Declared(variants={}).level(asym_w8a8) is Level.CANONICAL  # silent: the checkpoint's own scheme
    assert Declared(variants={}, output_rounding="rtz").level(w8a8) is Level.ROUNDING
    assert Declared(variants={}, accumulate="int32", output="bfloat16").level(w8a8) is Level.CANONICAL
    assert Declared(variants={}, accumulate="bfloat16", output="bfloat16").level(w8a8) is Level.ROUNDING
    assert Declared(variants={}, weight_dtype="float32", output="bfloat16").level(sym_v1) is Level.CANONICAL
    assert Declared(variants={"weight_scale_dtype": "float16"}, output="bfloat16").level(sym_v1, mid) is Level.CANONICAL
    assert Declared(variants={"weight_scale_dtype": "bfloat16"}, output="bfloat16").level(sym_v1) is Level.ROUNDING
    d = Declared(variants={"zero_read": "v1_literal", "act_rounding": "rhaz"}, output="bfloat16")
    assert [str(x) for x in d.deviations(asym_v1)] == ["zero_read=v1_literal"]


def test_asymmetric_w8a8_canonical_reference_is_asymmetric():
    """A silent declaration on an asymmetric W8A8 case means the checkpoint's azp activations."""
    case = Case("w8a8", "ct-int-quantized", 3, 32, 64, group_size=-1, sym=False)
    assert int8_variant(Declared(variants={}), case).symmetric is False
    assert int8_variant(Declared(variants={}), Case("w8a8", "ct-int-quantized", 3, 32, 64, group_size=-1)).symmetric


# -- fingerprint and docs derive from the vocabulary ----------------------------------------------------
def test_fingerprint_keys_and_defaults_come_from_the_vocabulary():
    assert fingerprint._known_keys() == set(AXES)
    for key, a in AXES.items():
        if a.canonical not in ("checkpoint", "none"):
            assert fingerprint._DEFAULTS[key] == a.canonical
    for ax in fingerprint.PROBE_AXES.values():
        for _, ov in ax.values:
            assert set(ov) <= set(AXES), ax.name


def test_docs_table_is_generated_from_the_vocabulary():
    text = (ROOT / "docs" / "variants.md").read_text(encoding="utf-8")
    body = text.split("<!-- BEGIN GENERATED: python -m emulator.variants -->\n", 1)[1].split("<!-- END GENERATED -->")[0]
    assert body == markdown_table(), "docs/variants.md is stale: regenerate it with `python -m emulator.variants`"
    for key in AXES:
        assert f"`{key}`" in body


def test_field_axes_are_declared_fields():
    import dataclasses

    names = {f.name for f in dataclasses.fields(Declared)}
    assert set(FIELD_AXES) <= names
    assert not set(VARIANT_AXES) & names


def test_linear_help_lists_every_variant_key():
    from conformance.cli.checkpoint_cmds import LINEAR_FIELDS, linear_variant_keys

    keys = linear_variant_keys()
    assert set(keys) == set(VARIANT_AXES) | set(LINEAR_FIELDS)
    assert "accumulate" not in keys and "output" not in keys and "arithmetic" not in keys


def test_int_axes_bounds():
    with pytest.raises(VariantError):
        AXES["qmin"].parse("1.5")
    assert AXES["qmin"].parse("-127") == -127
    with pytest.raises(VariantError):
        AXES["eps"].parse("nan")
    assert np.isclose(AXES["eps"].parse("1e-7"), 1e-7)
