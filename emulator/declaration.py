"""A declaration (``Declared``): the arithmetic a kernel claims for one case, and the weights it computes.

Semantics: docs/conformance.md#acceptance (what a declaration means), docs/variants.md (the
vocabulary its keys come from: emulator/variants.py) and docs/conformance.md#levels.

Everything a declaration names is validated against the variant vocabulary when it is built, so a
typo is an error, never a silently canonical kernel. From a declaration the emulator builds the
typed variants of each stage (``dequant_variant``, ``int8_variant``, ``mx_variant``, ``moe_variant``) and the weights the
kernel declares it forms (``declared_weight``); conformance/judge/acceptance.py bounds the rest.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import linear as lin
from . import moe as emoe
from .activations import int8 as a8
from .formats import awq, compressed_tensors as ct, gptq, mxfp4
from .formats.int_common import DequantVariant, check_out
from .numerics.floats import round_to_dtype
from .numerics.rounding import Rounding
from .schemes import Case
from .variants import AXES, FIELD_AXES, Level, VariantError, acts, declared_level, normalize_variants

__all__ = ["Declared", "Deviation", "Reference", "int8_variant", "mx_variant", "moe_variant", "dequant_variant",
           "arithmetic_dtype", "rounds_after_arithmetic", "round_weights", "declared_weight", "declared_reference", "declared_output", "canonical_declaration"]


@dataclasses.dataclass(frozen=True)
class Deviation:
    """One declared value that is not the case's canonical one."""

    key: str
    value: object
    level: Level

    def __str__(self) -> str:
        v = str(self.value).lower() if isinstance(self.value, bool) else self.value
        return f"{self.key}={v}"


@dataclasses.dataclass(frozen=True)
class Declared:
    """The arithmetic a backend claims for one case.

    ``variants`` maps variant keys of emulator/variants.py (docs/variants.md) to values, e.g.
    ``{"act_rounding": "rne", "reciprocal": "recip_scale", "zero_read": "ignore_qzeros"}``; an absent
    key means the canonical value. ``weight_dtype`` is the dtype of the weights that enter the product
    ("exact": the canonical float32 weights); how they are formed in it is the variant
    ``weight_formation`` (docs/formats/gptq.md#weight-formation): ``in_weight_dtype`` (canonical: the
    scale converted to ``weight_dtype`` and every step of the dequantization rounded to it),
    ``float32_then_round`` (formed in float32, then rounded once to ``weight_dtype``) or
    ``in_scale_dtype`` (formed in the scale's dtype, then rounded once to ``weight_dtype``);
    ``act_compute_dtype`` the dtype
    activations are rounded to before the product (None: used as given), ``accumulate`` the
    accumulation dtype, ``output`` the output dtype, rounded once from the accumulator with
    ``output_rounding`` ("rne", or "rtz" for a kernel that truncates). Unknown keys or values raise
    ``VariantError`` (a ValueError) naming the known ones.
    """

    variants: dict
    weight_dtype: str = "exact"
    act_compute_dtype: str | None = None
    accumulate: str = "float32"
    output: str = "float32"
    output_rounding: str = "rne"
    notes: str = ""
    #: "declared" (the fields and variants above are the kernel's arithmetic) or "opaque" (they are not
    #: exact: outputs are judged by SQNR against the canonical reference, at least ``sqnr_floor_db``)
    arithmetic: str = "declared"
    sqnr_floor_db: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "variants", normalize_variants(self.variants))
        for key in ("weight_dtype", "accumulate", "output_rounding", "arithmetic"):
            object.__setattr__(self, key, FIELD_AXES[key].parse(getattr(self, key)))
        if self.arithmetic == "opaque":
            f = self.sqnr_floor_db
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not (0 < float(f) < 400):
                raise VariantError(f"arithmetic=opaque needs sqnr_floor_db, a number of dB in (0, 400), got {f!r}")
            object.__setattr__(self, "sqnr_floor_db", float(f))
        elif self.sqnr_floor_db is not None:
            raise VariantError("sqnr_floor_db applies to arithmetic=opaque only")
        if self.act_compute_dtype is not None:
            v = FIELD_AXES["act_compute_dtype"].parse(self.act_compute_dtype)
            object.__setattr__(self, "act_compute_dtype", None if v == "none" else v)
        if self.output is not None and FIELD_AXES["output"].parse(self.output) == "case":
            raise VariantError("Declared.output must name a dtype (float32, float16 or bfloat16)")

    def value(self, key: str):
        """The declared value of axis ``key`` (its canonical value where the declaration is silent)."""
        a = AXES[key]
        if a.field:
            v = getattr(self, key)
            return "none" if key == "act_compute_dtype" and v is None else v
        return self.variants.get(key, a.canonical)

    def deviations(self, case: Case, tensors: dict | None = None) -> list[Deviation]:
        """Every declared value that is not canonical for ``case``, with its level (docs/conformance.md#levels).

        ``tensors`` (the case's checkpoint tensors) decide the levels that depend on the data: a GPTQ
        zero-point reading other than the canonical one is canonical only where every qzeros field is the
        symmetric midpoint; without the tensors it is a semantic deviation.

        Axes that do not act on this declaration are ignored (``variants.acts``, from each axis's
        ``acts_when`` in emulator/variants.py: an int8 rounding rule on a W4A16 case, a zero-point axis on
        symmetric activations, the int8-activation axes of a MoE case without ``moe_act_quant=int8``).
        """
        def value_of(key):
            return self.value_for(key, case)

        return [Deviation(key, value_of(key), lvl) for key in AXES
                if acts(key, value_of, case.scheme)
                and (lvl := declared_level(key, value_of, case, tensors)) is not Level.CANONICAL]

    def value_for(self, key: str, case: Case):
        """The declared value of axis ``key`` for ``case``: ``value``, except that a silent declaration takes
        the case's own value where the axis says so (``Axis.from_case``: ``act_symmetric``)."""
        a = AXES[key]
        if a.from_case and not a.field and key not in self.variants:
            return getattr(case, a.from_case)
        return self.value(key)

    def act_symmetric_for(self, case: Case) -> bool:
        """Whether activations are quantized symmetrically for ``case``: the declared act_symmetric, else the
        checkpoint's own scheme (``value_for``)."""
        return bool(self.value_for("act_symmetric", case))

    def level(self, case: Case, tensors: dict | None = None) -> Level:
        """The farthest level of this declaration's values for ``case`` (and its ``tensors``)."""
        return max((d.level for d in self.deviations(case, tensors)), default=Level.CANONICAL)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        if self.arithmetic == "declared":  # the default: omitted, so records and golden files written before the
            del d["arithmetic"], d["sqnr_floor_db"]  # opaque fields existed keep their bytes
        return d


def canonical_declaration(case: Case, accumulate: str = "exact") -> Declared:
    """The checkpoint's own semantics for ``case`` (the reference every level is measured against)."""
    return Declared(variants={}, accumulate=accumulate, output=case.output_dtype)


# -- typed variants of each stage ---------------------------------------------------------------------
INT8_VARIANT_FIELDS = {"act_rounding": "rounding", "reciprocal": "reciprocal", "act_scale_dtype": "scale_dtype",
                "zero_row": "zero_row", "eps": "eps", "nan_to_int": "nan_to_int", "qmin": "qmin", "qmax": "qmax",
                "act_symmetric": "symmetric", "uint8_zp128": "uint8_zp128", "act_scale_formula": "scale_formula",
                "act_granularity": "granularity", "act_scheme": "scheme", "azp_before_rounding": "azp_before_rounding",
                "act_dequant_scale_dtype": "dequant_scale_dtype", "act_sym_divisor": "sym_divisor",
                "act_range": "range_rule", "act_arith_dtype": "arith_dtype", "azp_clamp": "azp_clamp",
                "azp_domain": "azp_domain", "int32_saturation": "int32_saturation", "azp_overflow": "azp_overflow",
                "azp_fused": "azp_fused", "azp_clamp_nan": "azp_clamp_nan"}
#: vocabulary key -> MxVariant field (and INT8_VARIANT_FIELDS: -> Int8ActVariant field)
MX_VARIANT_FIELDS = {"mx_scale_rule": "scale_rule", "e2m1_rounding": "element_rounding", "e2m1_nan": "element_nan",
              "mx_zero_block": "zero_block", "mx_nan_block": "nan_block", "e2m1_zero_sign": "element_zero_sign",
              "mx_byte0_divisor": "byte0_divisor", "mx_scale_overflow": "scale_overflow",
              "mx_quotient_dtype": "quotient_dtype"}


def int8_variant(declared: Declared, case: Case | None = None) -> a8.Int8ActVariant:
    """The dynamic int8 activation quantizer a declaration names (canonical where it is silent).

    ``act_symmetric`` left silent follows the case (``Case.act_symmetric``): asymmetric W8A8
    checkpoints define asymmetric activations.
    """
    kw = {}
    for key, field in INT8_VARIANT_FIELDS.items():
        if key in declared.variants:
            v = declared.variants[key]
            kw[field] = None if (key == "act_dequant_scale_dtype" and v == "same") else v
    if "symmetric" not in kw and case is not None:
        kw["symmetric"] = case.act_symmetric
    if kw.get("arith_dtype") == "input" and case is not None:
        kw["arith_dtype"] = case.act_dtype  # the reference quantizes float32 copies: the case names the dtype
    return a8.Int8ActVariant(**kw)


def mx_variant(declared: Declared, case: Case | None = None) -> mxfp4.MxVariant:
    """The MXFP4 activation quantizer a declaration names; ``mx_quotient_dtype=input`` resolves to the case's
    activation dtype (without a case, to the dtype of the array quantized)."""
    kw = {f: declared.variants[k] for k, f in MX_VARIANT_FIELDS.items() if k in declared.variants}
    if kw.get("quotient_dtype") == "input" and case is not None:
        kw["quotient_dtype"] = case.act_dtype  # the reference quantizes float32 copies: the case names the dtype
    return mxfp4.MxVariant(**kw)


def moe_variant(declared: Declared, case: Case | None = None) -> emoe.MoeVariant:
    """The fused-MoE forward a declaration names (``moe_tie_order=any`` is read by the acceptance code)."""
    v = declared.value
    inter = v("moe_intermediate_dtype")
    gate_up_dtype = v("moe_gate_up_dtype")
    expert_out = v("moe_expert_output_dtype")
    if expert_out == "activation" and case is not None:
        expert_out = case.act_dtype  # the reference runs on float32 copies: the case names the dtype
    return emoe.MoeVariant(
        renormalize=v("moe_renormalize"), gate_up=v("moe_gate_up"),
        tie_lower_index_first=v("moe_tie_order") != "higher_index_first",
        intermediate_dtype=None if inter == "activation" else inter,
        gate_up_dtype=None if gate_up_dtype == "exact" else gate_up_dtype,
        expert_output_dtype=None if expert_out == "exact" else expert_out,
        expert_output_weighted=v("moe_expert_output_weighted"),
        act_quant=_moe_act_quant(declared, case) if v("moe_act_quant") == "int8" else None)


def _moe_act_quant(declared: Declared, case: Case | None) -> a8.Int8ActVariant:
    q = int8_variant(declared)  # symmetric unless declared: the MoE GEMM inputs have no checkpoint scheme
    if q.arith_dtype == "input" and case is not None:
        q = dataclasses.replace(q, arith_dtype=case.act_dtype)
    return q


def arithmetic_dtype(declared: Declared, case: Case | None = None) -> str | None:
    """The dtype C the dequantization arithmetic runs in under ``weight_formation`` (None: float32, the
    canonical arithmetic; docs/formats/gptq.md#weight-formation).

    ``in_weight_dtype``: C = ``weight_dtype``; ``float32_then_round``: float32; ``in_scale_dtype``: the
    scale's dtype (``weight_scale_dtype``, else the checkpoint's ``case.scale_dtype``).
    """
    formation = declared.value("weight_formation")
    if formation == "in_weight_dtype":
        return None if declared.weight_dtype in ("exact", "float32") else declared.weight_dtype
    if formation == "float32_then_round":
        return None
    s = declared.value("weight_scale_dtype")
    if s == "checkpoint":
        if case is None:
            raise ValueError("weight_formation=in_scale_dtype needs the case (the checkpoint's scale dtype)")
        s = case.scale_dtype
    return None if s == "float32" else s


def rounds_after_arithmetic(declared: Declared) -> bool:
    """Whether the formed weights are rounded once more, to a 16-bit ``weight_dtype``, after the arithmetic
    (``float32_then_round``, ``in_scale_dtype``); under ``in_weight_dtype`` the arithmetic's own roundings
    put them there."""
    return (declared.weight_dtype not in ("exact", "float32")
            and declared.value("weight_formation") != "in_weight_dtype")


def dequant_variant(declared: Declared, case: Case | None = None) -> DequantVariant:
    """The weight arithmetic a declaration names, the ``variant`` of every ``dequantize_*`` (order, scale and zero
    dtypes, the arithmetic dtype of ``weight_formation``; canonical where it is silent); the rounding after it
    is ``round_weights``."""
    v = declared.variants
    kw = {}
    if "dequant_order" in v:
        kw["order"] = v["dequant_order"]
    if v.get("weight_scale_dtype", "checkpoint") != "checkpoint":
        kw["scale_dtype"] = v["weight_scale_dtype"]
    if v.get("zero_dtype", "weight") != "weight":
        kw["zero_dtype"] = v["zero_dtype"]
    c = arithmetic_dtype(declared, case)
    if c is not None:
        kw["compute_dtype"] = c
        if "weight_rounding" in v and declared.value("weight_formation") == "in_weight_dtype":
            kw["compute_rounding"] = v["weight_rounding"]  # every conversion to weight_dtype rounds this way
    return DequantVariant(**kw)


def round_weights(w: np.ndarray, declared: Declared) -> np.ndarray:
    """Formed weights rounded once to a 16-bit ``Declared.weight_dtype`` with the declared ``weight_rounding``,
    where ``weight_formation`` rounds after the arithmetic (``rounds_after_arithmetic``); else ``w`` itself."""
    if not rounds_after_arithmetic(declared):
        return w
    with np.errstate(over="ignore", invalid="ignore"):
        return round_to_dtype(w, declared.weight_dtype, Rounding.parse(declared.value("weight_rounding")))


def declared_weight(case: Case, tensors: dict, declared: Declared, *, out: np.ndarray | None = None) -> np.ndarray:
    """Dequantized weight [N, K] as the backend declares it forms it (float32 values).

    ``out``: a float32 [N, K] C-contiguous array to write the weight into (a cache reusing
    its buffer); the int4 and MXFP4 dequantizers write into it directly.
    """
    w = _declared_weight(case, tensors, declared, out)
    if out is not None and w is not out:
        check_out(out, (case.N, case.K))[...] = w
        return out
    return w


def _declared_weight(case: Case, tensors: dict, declared: Declared, out) -> np.ndarray:
    w = _formed_weight(case, tensors, declared, out)
    if not rounds_after_arithmetic(declared):
        return w
    r = round_weights(w, declared)
    if out is not None:
        out[...] = r
        return out
    return r.astype(np.float32)


def _formed_weight(case: Case, tensors: dict, declared: Declared, out) -> np.ndarray:
    """The weights after the declared arithmetic (before the rounding of ``round_weights``)."""
    fmt = case.weight_format
    dv = dequant_variant(declared, case)
    if fmt == "gptq":
        p = gptq.GptqParams(bits=case.bits, group_size=case.group_size, sym=case.sym, desc_act=case.act_order,
                            zero_convention=case.gptq_zero_convention)
        t = gptq.GptqTensors(tensors["qweight"], tensors["qzeros"], tensors["scales"], tensors.get("g_idx"))
        return gptq.dequantize_gptq(t, p, shape=(case.N, case.K), zero_read=declared.value("zero_read"), variant=dv,
                                    out=out)
    if fmt == "awq":
        t = awq.AwqTensors(tensors["qweight"], tensors["qzeros"], tensors["scales"])
        return awq.dequantize_awq(t, awq.AwqParams(bits=4, group_size=case.group_size), shape=(case.N, case.K),
                                  variant=dv, out=out)
    if fmt == "ct-pack-quantized":
        p = ct.CtPackParams(num_bits=case.bits, strategy="channel" if case.channelwise else "group",
                            group_size=None if case.channelwise else case.group_size, symmetric=case.sym,
                            actorder=case.act_order)
        t = ct.CtPackedTensors(tensors["weight_packed"], tensors["weight_scale"], tensors["weight_shape"],
                               tensors.get("weight_zero_point"), tensors.get("weight_g_idx"))
        return ct.dequantize_ct_packed(t, p, variant=dv, out=out)
    if fmt == "ct-int-quantized":
        return ct.dequantize_ct_int8(ct.CtInt8Tensors(tensors["weight"], tensors["weight_scale"]), variant=dv)
    if fmt == "ct-mxfp4":
        c = arithmetic_dtype(declared, case) if declared.value("weight_formation") == "in_weight_dtype" else None
        if c is None:  # float32 arithmetic (the E8M0 scale is a float32 power of two): the exact product, RNE
            return mxfp4.dequantize_mxfp4_ct(tensors, out=out)
        return _mx_in_dtype(tensors, c, Rounding.parse(declared.value("weight_rounding")))
    raise ValueError(f"no declared weight for format {fmt!r}")


def _mx_in_dtype(tensors: dict, dtype: str, mode: Rounding) -> np.ndarray:
    """MXFP4 weights formed in ``dtype``: the E2M1 value (exact in every 16-bit dtype) times the E8M0 scale
    converted to ``dtype``, the product rounded to ``dtype`` (float16 cannot hold most 2**e: they overflow or
    underflow on conversion, as a kernel converting the scale would)."""
    from .numerics.e2m1 import decode_e2m1
    from .numerics.e8m0 import decode_e8m0

    codes, sb = mxfp4.unpack_mxfp4_ct(tensors)
    with np.errstate(over="ignore", invalid="ignore"):
        s = round_to_dtype(decode_e8m0(sb), dtype, mode)
        s = np.repeat(s, mxfp4.BLOCK, axis=-1)
        return round_to_dtype(decode_e2m1(codes).astype(np.float64) * s, dtype, mode).astype(np.float32)


# -- the declared reference ------------------------------------------------------------------------------
@dataclasses.dataclass
class Reference:
    """The exact value of a case under a declaration, before the output rounding.

    ``y_exact`` (float64) is the declared computation evaluated exactly (or within ``y_bound``, the
    float64 evaluation error of emulator/linear.py), ``operands`` the float64 operands it was formed
    from (what an acceptance bound needs: weights, activations as used, accumulators), ``parts``
    intermediate results worth reporting (activation codes and scales, top-k ids).
    """

    y_exact: np.ndarray
    y_bound: np.ndarray
    out_dtype: str
    operands: dict
    parts: dict


def declared_reference(case: Case, tensors: dict, x: np.ndarray, bias: np.ndarray | None,
                       router_logits: np.ndarray | None, declared: Declared) -> Reference:
    """The reference of ``case`` under ``declared`` for activations ``x`` [M, K] (float32 values)."""
    out_dtype = declared.output or case.output_dtype
    x = np.asarray(x).astype(np.float64)
    if declared.act_compute_dtype:
        x = round_to_dtype(x, declared.act_compute_dtype)
    b = None if bias is None else np.asarray(bias).astype(np.float64)
    acts = case.spec.activations
    if acts == "moe":
        return _moe_reference(case, tensors, x, router_logits, declared, out_dtype)
    if acts == "a16":
        w = declared_weight(case, tensors, declared)  # float32 values; linear_w16 widens it
        r = lin.linear_w16(x, w, b, out_dtype=out_dtype)
        return Reference(r.y_exact, r.y_bound, out_dtype, {"x": x, "w": w, "bias": b, "mag": r.mag}, {})
    if acts == "int8":
        v = int8_variant(declared, case)
        if case.scheme == "w8a8":
            ws = np.asarray(tensors["weight_scale"], np.float32).reshape(-1)
            if declared.value("weight_scale_dtype") != "checkpoint":
                ws = round_to_dtype(ws, declared.value("weight_scale_dtype")).astype(np.float32)
            r = lin.linear_w8a8(x.astype(np.float32), tensors["weight"], ws, b, act=v, out_dtype=out_dtype)
            return Reference(r.y_exact, r.y_bound, out_dtype, {"ws": ws, "acc": r.acc, "bias": b}, r.parts)
        w = _w4a8_weight(case, tensors, declared)
        q = a8.quantize_int8_per_token(x.astype(np.float32), v)
        xd = a8.dequantize_int8_per_token(q)
        r = lin.linear_w16(xd, w, b, out_dtype=out_dtype)
        parts = {"x_q": q.q, "x_scale": q.scale, "x_tie": q.tie, "x_zero_point": q.zero_point}
        return Reference(r.y_exact, r.y_bound, out_dtype, {"x": xd, "w": w, "bias": b, "mag": r.mag}, parts)
    if acts == "mxfp4":
        codes, sb = mxfp4.unpack_mxfp4_ct(tensors)
        r = lin.linear_mxfp4_w4a4(x.astype(np.float32), codes, sb, b, act=mx_variant(declared, case),
                                  out_dtype=out_dtype)
        xd = mxfp4.dequantize_mxfp4(r.parts["x_codes"], r.parts["x_scale"], dtype=np.float64)
        wd = mxfp4.dequantize_mxfp4(codes, sb, dtype=np.float64)
        return Reference(r.y_exact, r.y_bound, out_dtype, {"x": xd, "w": wd, "bias": b, "mag": r.mag}, r.parts)
    raise ValueError(f"no declared reference for scheme {case.scheme!r}")


def _w4a8_weight(case: Case, tensors: dict, declared: Declared) -> np.ndarray:
    """The float64 [N, K] weights whose exact products with the dequantized int8 activations sum to the W4A8
    reference under ``w4a8_product`` (docs/formats/activations.md#w4a8-int4-weights-int8-dynamic-activations).

    ``group_int`` (canonical): ``(q - z) * sw`` exactly (a 4-bit integer times a scale of at most 24 bits
    fits float64), so the sum is ``sx * sum_g sw * acc_g`` with exact integer ``acc_g``. ``float32_weights``:
    the weights dequantized and rounded to float32 first, ``fl32((q - z) * sw)``. A ``dequant_order`` other
    than sub_then_mul, or a ``zero_dtype``, forms the weights in float arithmetic: the float32 form then.
    weight_dtype and weight_formation do not apply (the weights enter an int8-activation GEMM)."""
    plain = {k: v for k, v in declared.variants.items() if k not in ("weight_formation", "weight_rounding")}
    d = dataclasses.replace(declared, weight_dtype="exact", variants=plain)
    float_formed = (declared.value("w4a8_product") == "float32_weights"
                    or declared.value("dequant_order") != "sub_then_mul" or "zero_dtype" in plain)
    if float_formed:
        return declared_weight(case, tensors, d).astype(np.float64)
    key = "scales" if case.weight_format == "gptq" else "weight_scale"
    scales = np.asarray(tensors[key])
    # unit scales give the integers (q - z) under the declared weight reading (exact in float32: |q - z| < 16)
    unit = dict(tensors, **{key: np.ones_like(scales)})
    q_z = declared_weight(case, unit, d).astype(np.float64)
    sw = scales.astype(np.float32)  # float16 / bfloat16 / float32 values, exact in float32
    if declared.value("weight_scale_dtype") != "checkpoint":
        sw = round_to_dtype(sw.astype(np.float64), declared.value("weight_scale_dtype")).astype(np.float32)
    sw = sw.astype(np.float64)
    if case.weight_format == "gptq":  # scales [G, N], g_idx [K]
        g = tensors.get("g_idx")
        g = np.arange(case.K) // (case.K // sw.shape[0]) if g is None else np.asarray(g).astype(np.int64)
        per = sw[g, :].T
    else:  # compressed-tensors: weight_scale [N, G], weight_g_idx [K]
        g = tensors.get("weight_g_idx")
        g = np.arange(case.K) // (case.K // sw.shape[1]) if g is None else np.asarray(g).astype(np.int64)
        per = sw[:, g]
    return q_z * per


def _experts(weights: emoe.GptqExperts, dv: DequantVariant, used, declared: Declared, tensor: str) -> np.ndarray:
    """float64 [E, out, in] of the experts ``used`` formed as ``declared`` says (``dequant_variant``, then
    ``round_weights``); the other experts zeros."""
    out = None
    for e in used:  # one expert at a time: at most one float32 expert materialised besides the result
        w = emoe.dequantize_gptq_experts(weights, variant=dv, tensor=tensor, experts=[e])[e]
        if out is None:
            out = np.zeros((len(weights.qweight),) + w.shape, dtype=np.float64)
        out[e] = round_weights(w.astype(np.float64), declared)
    if out is None:  # no token (M = 0): the shapes only
        w = emoe.dequantize_gptq_experts(weights, variant=dv, tensor=tensor, experts=[])
        out = np.zeros(w.shape, dtype=np.float64)
    return out


def _moe_reference(case, tensors, x, router_logits, declared, out_dtype) -> Reference:
    dv = dequant_variant(declared, case)
    mv = moe_variant(declared, case)  # the case resolves act_arith_dtype=input
    if mv.intermediate_dtype is None:
        # the kernel's intermediate buffer has the activation dtype (docs/formats/moe.md), not x's float32 carrier
        mv = dataclasses.replace(mv, intermediate_dtype=case.act_dtype)
    # only the experts some token routes to are read (moe_w16 indexes by the same routing): the others
    # are left zeros, never materialised (60 Qwen1.5-MoE experts are 4 GB in float64)
    used = np.unique(emoe.route(router_logits, case.top_k, mv)[0])
    w13 = _experts(emoe.GptqExperts(tensors["w13_qweight"], tensors["w13_scales"], case.group), dv, used, declared,
                   "w13")
    w2 = _experts(emoe.GptqExperts(tensors["w2_qweight"], tensors["w2_scales"], case.moe_w2_group_size), dv, used,
                  declared, "w2")
    r = emoe.moe_w16(x.astype(np.float32), router_logits, w13, w2, case.top_k, variant=mv, out_dtype=out_dtype)
    return Reference(r.y_exact, r.y_bound, out_dtype, {"x": x, "w13": w13, "w2": w2, "variant": mv, "result": r},
                     r.parts)


def declared_output(case: Case, tensors: dict, x: np.ndarray, bias: np.ndarray | None,
                    router_logits: np.ndarray | None, declared: Declared) -> np.ndarray:
    """What a kernel computing exactly as ``declared`` returns: the reference rounded once to the output
    dtype with ``output_rounding`` (the bias added to the rounded output under
    ``bias_stage=after_output_rounding``). float64 array of output-dtype values."""
    mode = Rounding.parse(declared.output_rounding)
    if declared.value("bias_stage") == "after_output_rounding" and bias is not None:
        ref = declared_reference(case, tensors, x, None, router_logits, declared)
        b = round_to_dtype(np.asarray(bias).astype(np.float64), ref.out_dtype)[None, :]
        with np.errstate(invalid="ignore", over="ignore"):
            return round_to_dtype(round_to_dtype(ref.y_exact, ref.out_dtype, mode) + b, ref.out_dtype)
    ref = declared_reference(case, tensors, x, bias, router_logits, declared)
    return round_to_dtype(ref.y_exact, ref.out_dtype, mode)
