"""Fingerprint axes: the semantic axes ``qconform fingerprint`` decides, their named values, and
the probe cases each scheme's axes are decided on.

Part of conformance/fingerprint.py (which re-exports the public names); semantics: docs/fingerprints.md.
"""

from __future__ import annotations

import dataclasses

from backends.base import Case
from emulator.variants import AXES as VOCABULARY

__all__ = ["AXES", "SCHEME_AXES", "Axis", "DECLARED_FIELDS", "DEFAULTS", "norm_value", "known_keys",
           "values_for_case", "candidate_cases", "rows_options"]

#: Declared fields (not variants) an axis may set
DECLARED_FIELDS = ("weight_dtype", "accumulate", "act_compute_dtype")

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


def _vals(key: str, names) -> tuple:
    return tuple((str(n), {key: n}) for n in names)


_ZERO_ROW_VALUES = (("zero", {"zero_row": "zero", "eps": None}), ("nan", {"zero_row": "nan", "eps": None}),
                    ("eps=1e-10", {"zero_row": "eps", "eps": 1e-10}), ("eps=1e-07", {"zero_row": "eps", "eps": 1e-7}),
                    ("eps=1e-05", {"zero_row": "eps", "eps": 1e-5}))

_MX_NAN_VALUES = (("scale_nan", {"mx_nan_block": "scale_nan", "e2m1_nan": None}),) + tuple(
    (f"ignore/{r}", {"mx_nan_block": "ignore", "e2m1_nan": r})
    for r in ("zero", "zero_signed", "zero_sign_flipped", "saturate", "saturate_positive"))

_DEQUANT_VALUES = tuple((f"{d}/{o}", {"weight_dtype": d, "dequant_order": o})
                        for d in ("float32", "bfloat16", "float16")
                        for o in ("sub_then_mul", "mul_then_sub", "float_zero"))

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
    Axis("qmin", "int8 clamp range", "int8", (("[-128,127]", {"qmin": -128}), ("[-127,127]", {"qmin": -127})),
         depends=("act_rounding", "act_scale_dtype", "reciprocal", "zero_row"), modes=("subnormal", "random"),
         note="symmetric per-token quotients stay within +-127.5 unless the scale underflows: probed with "
              "subnormal amax"),
    # MXFP4 activations (W4A4)
    Axis("mx_scale_rule", "MX shared-scale rule", "mx", _vals("mx_scale_rule", ("floor", "even", "rceil", "ceil")),
         nuisance=("e2m1_rounding",), modes=("boundary",)),
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


#: the axes probed per scheme, in order (later axes are conditioned on earlier ones via ``depends``)
SCHEME_AXES = {
    "w8a8": ("act_rounding", "act_scale_dtype", "reciprocal", "zero_row", "qmin"),
    "w4a8": ("act_rounding", "act_scale_dtype", "reciprocal", "zero_row", "qmin"),
    "w4a16": ("gptq_sym_qzeros", "gptq_v1_zero", "weight_scale_dtype", "dequant", "accumulate"),
    "w4a16-mxfp4": ("accumulate",),
    "w4a4-mxfp4": ("mx_scale_rule", "e2m1_rounding", "mx_nan", "mx_zero_block"),
}


def values_for_case(axis: Axis, case: Case) -> Axis:
    """Drop values that coincide by construction on this case (so they are not reported as unseparated)."""
    vals = axis.values
    if axis.name == "dequant" and (case.sym or case.weight_format == "ct-mxfp4"):
        vals = tuple(v for v in vals if not v[0].endswith("/float_zero"))
    if axis.name == "weight_scale_dtype":
        vals = tuple(v for v in vals if v[0] != case.scale_dtype)
    return dataclasses.replace(axis, values=vals)


def known_keys() -> set:
    """Every key of the variant vocabulary (emulator/variants.py): the acceptance code models each one."""
    return set(VOCABULARY)


# -- probe cases ----------------------------------------------------------------------------------
def candidate_cases(scheme: str, probe: str, act: str) -> list[Case]:
    """The probe cases of an axis, best first: the first one the backend can implement is used."""
    N, K = 64, 128
    if scheme == "w8a8":
        return [Case("w8a8", "ct-int-quantized", 1, N, K, group_size=-1, act_dtype=act, scale_dtype=sd)
                for sd in ("float32", "bfloat16")]
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
    if probe in ("int8", "mx"):
        return (8, 1, 17)
    if probe == "accumulate":
        return (12, 1)
    return (4, 1)
