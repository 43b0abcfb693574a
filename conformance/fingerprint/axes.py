"""Fingerprint axes: the semantic axes ``qconform fingerprint`` decides, their named values, and
the probe cases each scheme's axes are decided on.

Part of conformance/fingerprint/decide.py (which re-exports the public names); semantics: docs/fingerprints.md.
"""

from __future__ import annotations

import dataclasses

from backends.base import Case
from emulator.variants import AXES as VOCABULARY
from emulator.variants import FIELD_AXES

__all__ = ["AXES", "SCHEME_AXES", "Axis", "DECLARED_FIELDS", "DEFAULTS", "norm_value", "known_keys",
           "values_for_case", "candidate_cases", "rows_options"]

#: Declared fields (not variants) an axis may set
DECLARED_FIELDS = tuple(k for k in FIELD_AXES if k != "arithmetic")

def _unset(key: str):
    """The canonical value of a vocabulary axis as the probes spell it (None where it means 'not named')."""
    v = VOCABULARY[key].canonical
    return None if (key, v) in (("weight_scale_dtype", "checkpoint"), ("act_compute_dtype", "none")) else v


#: canonical value of each variant key (what an absent key means), from the vocabulary (emulator/variants.py)
DEFAULTS = {k: _unset(k) for k in VOCABULARY}


def norm_value(key: str, v):
    if v is None:
        v = DEFAULTS.get(key)
    if v is None:
        return None
    v = VOCABULARY[key].parse(v) if key in VOCABULARY else v
    if isinstance(v, str):
        v = v.lower()
    if key == "weight_dtype" and v == "exact":
        return "float32"  # int formats: 'exact' forms (q - z) * s in float32 (int_common.dequantize_affine)
    if key == "accumulate" and v == "exact":
        return "float64"  # u = 0: no bound wider than float64's on these probes
    if (key, v) in (("weight_scale_dtype", "checkpoint"), ("act_compute_dtype", "none")):
        return None
    return v


# -- axes ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Axis:
    """One semantic axis: named values, each a set of overrides of the declaration."""

    name: str
    title: str
    probe: str  # probe family: int8 | mx | gptq-sym | gptq-v1 | dequant | accumulate
    values: tuple  # ((value name, {key: value}), ...)
    nuisance: tuple = ()  # other axes (names in AXES) ranged over while deciding this one
    depends: tuple = ()  # earlier axes of the scheme whose findings condition this one
    modes: tuple = ()  # candidate-input styles for the search
    note: str = ""
    act: str | None = None  # activation dtype tried before the run's own (None: the run's)
    derived: bool = False  # made from the vocabulary by derive_axes (not written by hand)
    bias: bool = False  # probe cases with a bias
    context: tuple = ()  # keys the values set only to make the axis act (not what the axis decides)
    requires: tuple = ()  # (earlier axis, value labels it must find one of, why): else not applicable

    @property
    def keys(self) -> tuple:
        """The vocabulary keys this axis decides (those its values set)."""
        return tuple(dict.fromkeys(k for _, ov in self.values for k in ov if k not in self.context))


def _vals(key: str, names) -> tuple:
    return tuple((str(n), {key: n}) for n in names)


_ZERO_ROW_VALUES = (("zero", {"zero_row": "zero", "eps": None}), ("nan", {"zero_row": "nan", "eps": None}),
                    ("eps=1e-10", {"zero_row": "eps", "eps": 1e-10}), ("eps=1e-07", {"zero_row": "eps", "eps": 1e-7}),
                    ("eps=1e-05", {"zero_row": "eps", "eps": 1e-5}))

_MX_NAN_VALUES = (("scale_nan", {"mx_nan_block": "scale_nan", "e2m1_nan": None}),) + tuple(
    (f"ignore/{r}", {"mx_nan_block": "ignore", "e2m1_nan": r})
    for r in ("zero", "zero_signed", "zero_sign_flipped", "saturate", "saturate_positive", "raise"))

# float_zero with the zero point held in the weight dtype (zero_dtype=weight); with float32 weights also in a
# 16-bit dtype (tinygemm's bf16 zero): 16-bit weights round a finer zero's difference away
_DEQUANT_VALUES = tuple((f"{d}/{o}", {"weight_dtype": d, "dequant_order": o, "zero_dtype": None})
                        for d in ("float32", "bfloat16", "float16")
                        for o in ("sub_then_mul", "mul_then_sub", "float_zero")) + tuple(
    (f"float32/float_zero/zero={z}", {"weight_dtype": "float32", "dequant_order": "float_zero", "zero_dtype": z})
    for z in ("bfloat16", "float16"))

AXES: dict[str, Axis] = {a.name: a for a in [
    # dynamic int8 activations (W8A8, W4A8)
    Axis("act_rounding", "activation rounding (ties)", "int8", _vals("act_rounding", ("rne", "rhaz", "rtz", "rhtz")),
         modes=("pow2", "random")),
    Axis("act_scale_dtype", "activation scale dtype", "int8",
         _vals("act_scale_dtype", ("float32", "bfloat16", "float16")), nuisance=("reciprocal",),
         depends=("act_rounding",), modes=("random", "odd")),
    Axis("reciprocal", "quotient form (x/s, x*(127/amax), x*(1/s))", "int8",
         _vals("reciprocal", ("divide", "recip_amax", "recip_scale")),
         depends=("act_rounding", "act_scale_dtype"), modes=("odd", "random")),
    Axis("zero_row", "zero-row / amax-eps rule", "int8", _ZERO_ROW_VALUES,
         depends=("act_rounding", "act_scale_dtype", "reciprocal"), modes=("tiny", "zero"),
         note="an all-zero row gives 0 under 'zero' and 'nan' alike; only eps clamps show, on rows with amax < eps"),
    Axis("zero_range", "zero-range rule on asymmetric rows", "int8-asym",
         _vals("zero_row", ("zero", "dtype_eps", "unit_range")), modes=("constant", "gen:reference-int8"),
         depends=("act_rounding",),
         note="a zero range (max == min) keeps scale 0, becomes the dtype's epsilon, or 1 (scale 1/255): constant "
              "rows of an asymmetric activation show it; a symmetric all-zero row gives 0 under all three"),
    Axis("qmin", "int8 clamp range", "int8", (("[-128,127]", {"qmin": -128}), ("[-127,127]", {"qmin": -127})),
         depends=("act_rounding", "act_scale_dtype", "reciprocal", "zero_row"), modes=("subnormal", "random"),
         act="float32",
         note="symmetric per-token quotients stay within +-127.5 unless the scale underflows: probed with "
              "subnormal amax, in float32 activations where the backend takes them (a float32 scale of a "
              "16-bit amax never underflows)"),
    # MXFP4 activations (W4A4)
    Axis("mx_scale_rule", "MX shared-scale rule", "mx",
         _vals("mx_scale_rule", ("floor", "even", "rceil", "ceil", "rceil_log2f")),
         nuisance=("e2m1_rounding",), modes=("boundary",),
         note="rceil_log2f differs from rceil only on float32 amax just above 6 * 2^k, which 16-bit activations "
              "cannot hold"),
    Axis("e2m1_rounding", "E2M1 tie rule", "mx", _vals("e2m1_rounding", ("rne", "rhaz", "rtz", "rhtz")),
         depends=("mx_scale_rule",), modes=("boundary",)),
    Axis("mx_nan", "NaN rule (block scale / element code)", "mx", _MX_NAN_VALUES,
         depends=("mx_scale_rule", "e2m1_rounding"), modes=("nan",),
         note="with the block scale made NaN the element code is invisible; codes +0/-0 are equal in a sum"),
    Axis("mx_zero_block", "zero-block scale", "mx", _vals("mx_zero_block", ("min", "half", "eps_fp32", "eps_1e10", "eps_1e10_floor")),
         depends=("mx_scale_rule", "e2m1_rounding"), modes=("zero",),
         note="an all-zero block contributes 0 whatever its scale: not observable in a linear's output"),
    # GPTQ zero points
    Axis("gptq_sym_qzeros", "GPTQ sym=True: are qzeros read?", "gptq-sym",
         (("read (canonical)", {"zero_read": "canonical"}), ("ignored (z=8)", {"zero_read": "ignore_qzeros"})),
         modes=("random",)),
    Axis("gptq_v1_zero", "GPTQ v1 zero convention", "gptq-v1",
         _vals("zero_read", ("canonical", "v1_literal", "v1_wrap", "v1_packed_add")), modes=("random",)),
    # dequantization (A16)
    Axis("weight_scale_dtype", "dtype the weight scales are read in", "dequant",
         (("checkpoint", {"weight_scale_dtype": None}), ("bfloat16", {"weight_scale_dtype": "bfloat16"}),
          ("float16", {"weight_scale_dtype": "float16"})), nuisance=("dequant",), modes=("cancel", "random")),
    Axis("dequant", "weight dtype / dequant order", "dequant", _DEQUANT_VALUES, depends=("weight_scale_dtype",),
         modes=("cancel", "random"),
         note="with 16-bit scales and float32 weights every order is exact, so the orders coincide there"),
    Axis("accumulate", "accumulation precision (bracket)", "accumulate",
         _vals("accumulate", ("float64", "float32", "float16", "bfloat16")),
         depends=("gptq_sym_qzeros", "weight_scale_dtype", "dequant")),
]}

def _check_probe_axes() -> None:
    """Every override of every probe axis names a vocabulary key and a value it accepts (fails at import)."""
    for ax in AXES.values():
        for name, ov in ax.values:
            for k, v in ov.items():
                if k not in VOCABULARY:
                    raise AssertionError(f"fingerprint axis {ax.name}: {k!r} is not a variant key")
                if v is not None:
                    VOCABULARY[k].parse(v)


_check_probe_axes()


#: the hand-written axes probed per scheme, in order (later axes are conditioned on earlier ones via
#: ``depends``); derive_axes appends an axis for every vocabulary key none of them decides
_HAND_SCHEME_AXES = {
    "w8a8": ("act_rounding", "act_scale_dtype", "reciprocal", "zero_row", "qmin", "zero_range"),
    "w4a8": ("act_rounding", "act_scale_dtype", "reciprocal", "zero_row", "qmin"),
    "w4a16": ("gptq_sym_qzeros", "gptq_v1_zero", "weight_scale_dtype", "dequant", "accumulate"),
    "w4a16-mxfp4": ("accumulate",),
    "w4a4-mxfp4": ("mx_scale_rule", "e2m1_rounding", "mx_nan", "mx_zero_block"),
    "w4a16-moe": (),
}

# -- axes derived from the vocabulary -----------------------------------------------------------------
#: the probe family of a vocabulary stage, per scheme ("generic": the suite's seeded inputs, reshaped
#: by the axis's modes; conformance/fingerprint/probes.py)
_STAGE_FAMILY = {"int8-activations": "int8", "mx-activations": "mx", "moe": "moe", "weights": "generic",
                 "gemm": "generic", "epilogue": "generic"}

#: how a derived axis is probed where the stage's defaults do not separate its values: probe family,
#: candidate-input modes, the activation dtype that shows it, representative values of int/float keys,
#: and the reason values coincide where they do (reported, and checked by
#: tests/conformance/test_fingerprint_vocabulary.py)
TUNING: dict[str, dict] = {
    "weight_rounding": dict(modes=("cancel", "random"), probe="dequant",
                            requires=("dequant", ("bfloat16/", "float16/"),
                                      "acts only where the weights are formed in a 16-bit dtype")),
    # (the scale is float16 on the probes: bfloat16 weights separate the formations, float16 ones only under
    # the orders with intermediate roundings)
    "weight_formation": dict(modes=("random",), probe="dequant",
                             requires=("dequant", ("bfloat16/", "float16/"),
                                       "acts only where the weights are formed in a 16-bit dtype")),
    "w4a8_product": dict(probe="int8-f32-scales", modes=("random",), act="float32",
                         note="the products differ only where (q - z) * sw is not a float32 value: probed with "
                              "float32 scales and float32 activations"),
    "act_compute_dtype": dict(modes=("wide",), note="activations already in the rounded-to dtype are unchanged"),
    "output_rounding": dict(modes=("random",)),
    "output": dict(modes=("random",)),
    "bias_stage": dict(modes=("bias",), bias=True, schemes=("w8a8", "w4a8", "w4a16", "w4a16-mxfp4", "w4a4-mxfp4")),
    "act_dequant_scale_dtype": dict(modes=("random", "odd"), act="float32",
                                    note="a 16-bit output resolves a 16-bit epilogue scale only near rounding "
                                         "boundaries: probed with float32 activations where the backend takes them"),
    "act_scale_formula": dict(modes=("odd", "random"), act="float32",
                              note="amax * fl32(1/127) and amax / 127 differ by one fp32 ulp of the scale: "
                                   "a 16-bit output resolves that only near a rounding boundary"),
    "qmax": dict(values=(127, 126), modes=("random",)),
    "nan_to_int": dict(modes=("zero",), context={"zero_row": "nan"},
                       requires=("zero_row", ("nan",), "acts only under zero_row=nan (a NaN quotient on an all-zero "
                                                       "row)")),
    "act_symmetric": dict(probe="int8-asym", values=(True, False), modes=("random", "odd")),
    "azp_before_rounding": dict(probe="int8-asym", modes=("random", "odd"), schemes=("w8a8",),
                                note="acts only on asymmetric activations (W8A8 with an activation zero point)"),
    "azp_epilogue": dict(probe="int8-asym", modes=("random",)),
    "uint8_zp128": dict(modes=("random",), note="codes q + 128 held in uint8 are the same values"),
    "act_granularity": dict(modes=("random",)),
    "act_scheme": dict(modes=("random",)),
    "e2m1_zero_sign": dict(modes=("boundary",), note="the codes of +0 and -0 add the same 0"),
    "moe_tie_order": dict(modes=("tie",)),
    # reference quantizers (emulator/reference_quantizers.py): the suite's reference-int8 / reference-mx edge
    # inputs (conformance/cases/generators.py) separate them; the asymmetric ones on W8A8 with an activation zero point
    "act_sym_divisor": dict(modes=("random", "gen:reference-int8")),
    "act_arith_dtype": dict(modes=("gen:reference-int8", "random")),
    "act_range": dict(probe="int8-asym", schemes=("w8a8",), modes=("gen:reference-int8", "random")),
    "azp_clamp": dict(probe="int8-asym", schemes=("w8a8",), modes=("gen:reference-int8",)),
    "int32_saturation": dict(probe="int8-asym", schemes=("w8a8",), modes=("gen:reference-int8",), act="float32",
                             note="only a zero point beyond int32 (float32 rows [-2, -2 + 2^-23]) reaches it"),
    "azp_fused": dict(probe="int8-asym", schemes=("w8a8",), modes=("random", "odd"),
                      context={"azp_before_rounding": True, "reciprocal": "recip_scale"},
                      requires=("azp_before_rounding", ("true",), "acts only where the zero point is added before "
                                                                  "the rounding to x * (1/s) (azp_before_rounding, "
                                                                  "reciprocal=recip_scale)")),
    "azp_overflow": dict(probe="int8-asym", schemes=("w8a8",), modes=("gen:reference-int8",), act="float32",
                         note="only a zero point beyond int32 (float32 rows [-2, -2 + 2^-23]) reaches it"),
    "mx_byte0_divisor": dict(modes=("tiny",), note="acts on blocks whose scale byte is 0 (amax below 2^-124)"),
    "mx_scale_overflow": dict(modes=("huge",), context={"mx_scale_rule": "even"},
                              requires=("mx_scale_rule", ("even",), "acts only where EVEN rounds amax past the "
                                                                    "largest scale (amax >= 1.75 * 2^127)")),
    "azp_domain": dict(probe="int8-asym", schemes=("w8a8",), modes=("gen:reference-int8",), act="float32",
                       note="the int8 and uint8 zero points differ on float32 rows only"),
    "moe_intermediate_dtype": dict(act="float32", note="a 16-bit output hides most intermediate roundings: probed "
                                                       "with float32 activations where the backend takes them"),
    "moe_gate_up_dtype": dict(act="float32", note="a 16-bit output hides most intermediate roundings: probed "
                                                  "with float32 activations where the backend takes them"),
    "moe_expert_output_dtype": dict(act="bfloat16", note="probed with bfloat16 activations where the backend takes "
                                                         "them: a bf16 store shows on a bf16 output, an fp32 store "
                                                         "on an fp32 output hardly ever"),
    "moe_expert_output_weighted": dict(act="bfloat16", context={"moe_expert_output_dtype": "bfloat16"},
                                       requires=("moe_expert_output_dtype", ("activation", "float16", "bfloat16"),
                                                 "acts only where the expert outputs are stored in a 16-bit dtype "
                                                 "(moe_expert_output_dtype)")),
}

#: (key, scheme) where a vocabulary axis applies on paper but the scheme's cases cannot exercise it
NOT_APPLICABLE = {
    ("bias_stage", "w4a16-moe"): "a fused MoE block takes no bias (conformance.cases.inputs.make_inputs)",
}

#: axes that are the declaration's own claim, not a computation: no output can show them
DECLARATION_ONLY = {
    "arithmetic": "whether the arithmetic is declared exactly is the backend's claim about itself (an opaque "
                  "kernel is judged by SQNR), not something its outputs compute",
}

#: the fingerprint schemes that have probe cases (candidate_cases), in report order
FINGERPRINT_SCHEMES = tuple(_HAND_SCHEME_AXES)


def _rep_values(key: str) -> tuple:
    """The values a derived axis probes: a choice axis's values, both booleans, representative numbers."""
    a = VOCABULARY[key]
    if "values" in TUNING.get(key, {}):
        return tuple(TUNING[key]["values"])
    if a.values:
        return tuple(a.values)
    if a.kind == "bool":
        return (a.canonical, not a.canonical)
    raise AssertionError(f"vocabulary axis {key!r} ({a.kind}): no representative values; give them in "
                         f"conformance/fingerprint_axes.TUNING[{key!r}]['values']")


def value_label(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _derived_schemes(key: str) -> tuple:
    a = VOCABULARY[key]
    if "schemes" in TUNING.get(key, {}):
        return tuple(TUNING[key]["schemes"])
    if TUNING.get(key, {}).get("probe") == "dequant":
        return ("w4a16",)
    if a.stage.value in ("gemm", "epilogue") or a.schemes == tuple(VOCABULARY["output"].schemes):
        return tuple(s for s in FINGERPRINT_SCHEMES if a.applies_to(s))  # every scheme computes it
    fam = TUNING.get(key, {}).get("probe") or _STAGE_FAMILY[a.stage.value]
    if fam.startswith("int8"):
        return tuple(s for s in ("w8a8", "w4a8") if a.applies_to(s))
    if fam == "mx":
        return tuple(s for s in ("w4a4-mxfp4",) if a.applies_to(s))
    if fam == "moe":
        return tuple(s for s in ("w4a16-moe",) if a.applies_to(s))
    return tuple(s for s in ("w4a16",) if a.applies_to(s))  # weights: the int4 probe cases


def _family(key: str, scheme: str) -> str:
    """The probe family deciding ``key`` on ``scheme``."""
    fam = TUNING.get(key, {}).get("probe") or _STAGE_FAMILY[VOCABULARY[key].stage.value]
    if fam == "generic":  # a GEMM/epilogue choice: the int8 schemes' diagonal probes show it too
        return {"w8a8": "int8", "w4a8": "int8", "w4a16-moe": "moe"}.get(scheme, fam)
    return fam


def derive_axes() -> tuple[dict, dict]:
    """(every probe axis by name, the axes probed per scheme): the hand-written axes, then one axis for
    every vocabulary key that none of them decides, probed on the schemes it applies to (named
    ``key`` on the first family, ``key@family`` on others)."""
    axes = dict(AXES)
    covered = {k for ax in AXES.values() for k in ax.keys}
    # conditioned on the hand-written axes a scheme found (the accumulation bracket at its finest consistent
    # precision: a kernel outside the declared accumulation bound is judged on every other axis with its own)
    hand = tuple(AXES)
    per_scheme = {s: list(v) for s, v in _HAND_SCHEME_AXES.items()}
    for key, va in VOCABULARY.items():
        if key in covered or key in DECLARATION_ONLY:
            continue
        t = TUNING.get(key, {})
        names: dict[str, str] = {}
        for s in _derived_schemes(key):
            fam = _family(key, s)
            name = names.setdefault(fam, key if not names else f"{key}@{fam}")
            if name not in axes:
                axes[name] = Axis(name, va.title, fam,
                                  tuple((value_label(v), {key: v, **t.get("context", {})}) for v in _rep_values(key)),
                                  depends=hand, modes=t.get("modes", ("random",)), note=t.get("note", ""),
                                  act=t.get("act"), derived=True, bias=bool(t.get("bias")),
                                  context=tuple(t.get("context", {})), requires=t.get("requires", ()))
            per_scheme[s].append(name)
    return axes, {s: tuple(v) for s, v in per_scheme.items() if v}


AXES, SCHEME_AXES = derive_axes()


def coinciding_values(axis: Axis, case: Case, declared=None) -> dict:
    """{value: (the value it computes the same numbers as on this case, why)} (by construction);
    ``declared``: the declaration the axis's values are applied to."""
    out = {}
    act_scale = (declared.variants.get("act_scale_dtype") if declared is not None else None) or "float32"
    for name, ov in axis.values:
        if axis.name == "dequant" and (case.sym or case.weight_format == "ct-mxfp4") and "float_zero" in name:
            out[name] = (name.split("/")[0] + "/sub_then_mul",
                         "symmetric weights: the float zero point (8 - z)·s is 0, as in sub_then_mul")
        elif axis.name == "weight_scale_dtype" and name == case.scale_dtype:
            out[name] = ("checkpoint", f"the checkpoint's scales are {case.scale_dtype} already")
        elif ov.get("act_compute_dtype") in ("float32", case.act_dtype):
            out[name] = ("none", f"{case.act_dtype} activations are unchanged by rounding to {ov['act_compute_dtype']}")
        elif ov.get("output") == case.output_dtype:
            out[name] = ("case", f"the case's output dtype is {case.output_dtype}")
        elif ov.get("act_dequant_scale_dtype") == act_scale:
            out[name] = ("same", f"the activation scale is {act_scale} already")
        elif ov.get("act_arith_dtype") == case.act_dtype:
            out[name] = ("input", f"the activations are {case.act_dtype}")
        elif ov.get("moe_intermediate_dtype") == case.act_dtype:
            out[name] = ("activation", f"the activation dtype is {case.act_dtype}")
        elif axis.name == "moe_expert_output_dtype" and ov.get("moe_expert_output_dtype") == case.act_dtype:
            out[name] = ("activation", f"the activation dtype is {case.act_dtype}")
    return out


def values_for_case(axis: Axis, case: Case, declared=None) -> Axis:
    """Drop values that coincide by construction on this case (so they are not reported as unseparated),
    and spell ``output=case`` as the case's output dtype (a Declared names a dtype)."""
    drop = coinciding_values(axis, case, declared)
    vals = tuple((n, {k: (case.output_dtype if (k, v) == ("output", "case") else v) for k, v in ov.items()})
                 for n, ov in axis.values if n not in drop)
    return dataclasses.replace(axis, values=vals)


def known_keys() -> set:
    """Every key of the variant vocabulary (emulator/variants.py): the acceptance code models each one."""
    return set(VOCABULARY)


# -- probe cases ----------------------------------------------------------------------------------
def candidate_cases(scheme: str, probe: str, act: str, bias: bool = False) -> list[Case]:
    """The probe cases of an axis, best first: the first one the backend can implement is used."""
    cases = _candidate_cases(scheme, probe, act)
    return [dataclasses.replace(c, bias=True) for c in cases] if bias else cases


def _candidate_cases(scheme: str, probe: str, act: str) -> list[Case]:
    N, K = 64, 128
    if scheme == "w8a8" and probe == "int8-asym":  # asymmetric activations: sym=False carries them on W8A8
        return [Case("w8a8", "ct-int-quantized", 1, N, K, group_size=-1, sym=False, act_dtype=act, scale_dtype=sd)
                for sd in ("float32", "bfloat16")]
    if scheme == "w4a16-moe":
        return [Case("w4a16-moe", "gptq", 1, N, K, group_size=32, E=4, top_k=2, act_dtype=act)]
    if scheme == "w8a8":
        return [Case("w8a8", "ct-int-quantized", 1, N, K, group_size=-1, act_dtype=act, scale_dtype=sd)
                for sd in ("float32", "bfloat16")]
    if scheme == "w4a8" and probe == "int8-f32-scales":  # float32 scales: (q - z) * sw is not always a float32
        return [Case("w4a8", "ct-pack-quantized", 1, N, K, group_size=32, sym=True, act_dtype=act,
                     scale_dtype="float32"),
                Case("w4a8", "gptq", 1, N, K, group_size=32, sym=True, zero_convention="v1", act_dtype=act,
                     scale_dtype="float32")]
    if scheme == "w4a8":
        return [Case("w4a8", "gptq", 1, N, K, group_size=32, sym=True, zero_convention="v1", act_dtype=act),
                Case("w4a8", "ct-pack-quantized", 1, N, K, group_size=32, sym=True, act_dtype=act),
                Case("w4a8", "ct-pack-quantized", 1, N, K, group_size=-1, sym=True, act_dtype=act)]
    if scheme == "w4a4-mxfp4":
        return [Case("w4a4-mxfp4", "ct-mxfp4", 1, N, K, group_size=32, act_dtype=act)]
    if scheme == "w4a16-mxfp4":
        return [Case("w4a16-mxfp4", "ct-mxfp4", 1, N, K, group_size=32, act_dtype=act)]
    if scheme == "w4a16":
        if probe == "gptq-sym":
            return [Case("w4a16", "gptq", 4, N, K, group_size=32, sym=True, zero_convention="v1", act_dtype=act)]
        if probe == "gptq-v1":
            return [Case("w4a16", "gptq", 4, N, K, group_size=32, sym=False, zero_convention="v1", act_dtype=act)]
        if probe == "dequant":
            return [Case("w4a16", "ct-pack-quantized", 4, N, K, group_size=32, sym=False, act_dtype=act),
                    Case("w4a16", "gptq", 4, N, K, group_size=32, sym=False, zero_convention="v2", act_dtype=act),
                    Case("w4a16", "awq", 4, N, K, group_size=32, sym=False, act_dtype=act),
                    Case("w4a16", "gptq", 4, N, K, group_size=32, sym=True, zero_convention="v1", act_dtype=act),
                    Case("w4a16", "ct-pack-quantized", 4, N, K, group_size=32, sym=True, act_dtype=act)]
        return [Case("w4a16", "ct-pack-quantized", 1, N, K, group_size=32, sym=True, act_dtype=act),
                Case("w4a16", "gptq", 1, N, K, group_size=32, sym=True, zero_convention="v1", act_dtype=act),
                Case("w4a16", "awq", 1, N, K, group_size=32, sym=False, act_dtype=act)]
    raise ValueError(f"no probe cases for scheme {scheme!r}")


def rows_options(probe: str) -> tuple:
    """Row counts tried for a probe (rows are independent: a kernel that takes only M = 1 gets one per probe)."""
    if probe in ("int8", "int8-asym", "mx"):
        return (8, 1, 17)
    if probe == "moe":
        return (4, 1)
    if probe == "accumulate":
        return (12, 1)
    return (4, 1)
