"""Acceptance intervals derived from a backend's declared arithmetic.

Semantics: docs/conformance.md#acceptance.

For one case the emulator computes the *declared reference*: the exact value
of the scheme under the variants the backend names (activation rounding,
reciprocal form, scale dtype, zero-point reading, MX scale rule, ...), with the
dequantized weights and the activations rounded to the dtypes the backend says
it forms them in. That part is deterministic, so it is emulated, not tolerated.

What cannot be emulated is the order of the backend's floating-point
accumulation. It is bounded rigorously (Higham, *Accuracy and Stability of
Numerical Algorithms*, §3.1, Lemma 3.1 / eq. 3.4): for any summation order in a
dtype with unit roundoff u,

    |fl(sum_k p_k) - sum_k p_k|  <=  gamma_K(u) * sum_k |p_k|,   gamma_n = n u / (1 - n u)

plus the float64 evaluation error of the reference itself (``y_bound``).
The accepted outputs are the output-dtype values in
[RD(y - b), RU(y + b)]: every value a correct kernel can produce by rounding an
accumulator that lies within the bound.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from backends.base import Case, Declared
from emulator import linear as lin
from emulator import moe as emoe
from emulator.activations import int8 as a8
from emulator.formats import awq, compressed_tensors as ct, gptq, mxfp4
from emulator.numerics.floats import decode, encode, format_of, round_to_dtype
from emulator.numerics.rounding import Rounding

from .cases import CaseInputs

__all__ = ["UNIT_ROUNDOFF", "Interval", "declared_interval", "compare", "Comparison", "round_down", "round_up"]

#: unit roundoff u = 2**-p of each accumulation dtype (0: exact integer accumulation)
UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "tf32": 2.0 ** -11, "float16": 2.0 ** -11,
                 "bfloat16": 2.0 ** -8, "int32": 0.0, "exact": 0.0}


def _gamma(n: int, u: float) -> float:
    nu = n * u
    return np.inf if nu >= 1 else nu / (1 - nu)


def _next(v: np.ndarray, dtype: str, toward: float) -> np.ndarray:
    """The neighbour of each ``dtype`` value v in direction ``toward`` (+inf or -inf)."""
    fmt = format_of(dtype)
    bits = encode(v, fmt).astype(np.int64)
    sign_bit = 1 << (fmt.bits - 1)
    neg = (bits & sign_bit) != 0
    mag = bits & (sign_bit - 1)
    up = toward > 0
    # moving away from zero: magnitude + 1; toward zero: magnitude - 1; zero crosses sign
    away = np.where(neg, not up, up)
    zero = mag == 0
    new_mag = np.where(away, mag + 1, mag - 1)
    new_sign = np.where(zero, 0 if up else sign_bit, bits & sign_bit)
    new_mag = np.where(zero, 1, new_mag)
    out = decode((new_sign | new_mag).astype(np.uint64), fmt)
    return np.where(np.isfinite(v), out, v)


def round_down(v: np.ndarray, dtype: str) -> np.ndarray:
    """Largest ``dtype`` value <= v (toward -inf)."""
    t = round_to_dtype(v, dtype, Rounding.RTZ)
    return np.where((t > v) | ((t != v) & (v < 0)), _next(t, dtype, -np.inf), t)


def round_up(v: np.ndarray, dtype: str) -> np.ndarray:
    """Smallest ``dtype`` value >= v (toward +inf)."""
    t = round_to_dtype(v, dtype, Rounding.RTZ)
    return np.where((t < v) | ((t != v) & (v > 0)), _next(t, dtype, np.inf), t)


@dataclasses.dataclass
class Interval:
    """Accepted outputs for one case under one declaration."""

    y_ref: np.ndarray  # declared reference, rounded once to the output dtype (RNE)
    y_exact: np.ndarray  # declared reference, float64
    lo: np.ndarray  # lowest accepted output value (output dtype grid)
    hi: np.ndarray  # highest accepted output value
    bound: np.ndarray  # total absolute bound before outward rounding
    out_dtype: str
    parts: dict = dataclasses.field(default_factory=dict)


# -- declared weights and activations ---------------------------------------------------------
def _weight_kwargs(declared: Declared) -> dict:
    v = declared.variants
    kw = {}
    if v.get("dequant_order"):
        kw["order"] = v["dequant_order"]
    if v.get("weight_scale_dtype"):
        kw["scale_dtype"] = v["weight_scale_dtype"]
    if declared.weight_dtype not in ("exact", None):
        kw["compute_dtype"] = declared.weight_dtype
    return kw


def declared_weight(case: Case, tensors: dict, declared: Declared) -> np.ndarray:
    """Dequantized weight [N, K] as the backend declares it forms it (float32 values)."""
    fmt = case.weight_format
    kw = _weight_kwargs(declared)
    if fmt == "gptq":
        p = gptq.GptqParams(bits=case.bits, group_size=case.group_size, sym=case.sym, desc_act=case.act_order,
                            zero_convention="gptq_v2" if case.zero_convention == "v2" else "gptq")
        t = gptq.GptqTensors(tensors["qweight"], tensors["qzeros"], tensors["scales"], tensors.get("g_idx"))
        zr = declared.variants.get("zero_read")
        return gptq.dequantize_gptq(t, p, shape=(case.N, case.K), **({"zero_read": zr} if zr else {}), **kw)
    if fmt == "awq":
        t = awq.AwqTensors(tensors["qweight"], tensors["qzeros"], tensors["scales"])
        return awq.dequantize_awq(t, awq.AwqParams(bits=4, group_size=case.group_size), shape=(case.N, case.K), **kw)
    if fmt == "ct-pack-quantized":
        channel = case.group_size in (-1, 0)
        p = ct.CtPackParams(num_bits=case.bits, strategy="channel" if channel else "group",
                            group_size=None if channel else case.group_size, symmetric=case.sym,
                            actorder=case.act_order)
        t = ct.CtPackedTensors(tensors["weight_packed"], tensors["weight_scale"], tensors["weight_shape"],
                               tensors.get("weight_zero_point"), tensors.get("weight_g_idx"))
        return ct.dequantize_ct_packed(t, p, **kw)
    if fmt == "ct-int-quantized":
        return ct.dequantize_ct_int8(ct.CtInt8Tensors(tensors["weight"], tensors["weight_scale"]), **kw)
    if fmt == "ct-mxfp4":
        w = mxfp4.dequantize_mxfp4_ct(tensors, dtype=np.float64)
        if declared.weight_dtype not in ("exact", None):
            w = round_to_dtype(w, declared.weight_dtype)
        return w.astype(np.float32)
    raise ValueError(f"no declared weight for format {fmt!r}")


def int8_variant(declared: Declared) -> a8.Int8ActVariant:
    v = declared.variants
    kw = {}
    for src, dst in (("act_rounding", "rounding"), ("reciprocal", "reciprocal"), ("act_scale_dtype", "scale_dtype"),
                     ("zero_row", "zero_row"), ("nan_to_int", "nan_to_int")):
        if v.get(src) is not None:
            kw[dst] = v[src]
    for key in ("qmin", "qmax"):
        if v.get(key) is not None:
            kw[key] = int(v[key])
    if v.get("eps") is not None:
        kw["eps"] = float(v["eps"])
    if v.get("act_symmetric") is not None:
        kw["symmetric"] = bool(v["act_symmetric"])
    if v.get("uint8_zp128") is not None:
        kw["uint8_zp128"] = bool(v["uint8_zp128"])
    return a8.Int8ActVariant(**kw)


def mx_variant(declared: Declared) -> mxfp4.MxVariant:
    v = declared.variants
    kw = {}
    for src, dst in (("mx_scale_rule", "scale_rule"), ("e2m1_rounding", "element_rounding"),
                     ("e2m1_nan", "element_nan"), ("mx_zero_block", "zero_block"), ("mx_nan_block", "nan_block")):
        if v.get(src) is not None:
            kw[dst] = v[src]
    return mxfp4.MxVariant(**kw)


# -- intervals ----------------------------------------------------------------------------------
def _finish(y_exact, y_bound64, mag, n_terms, declared: Declared, out_dtype: str, parts=None, extra=None) -> Interval:
    u = UNIT_ROUNDOFF.get(declared.accumulate)
    if u is None:
        raise ValueError(f"unknown accumulation dtype {declared.accumulate!r}")
    with np.errstate(invalid="ignore", over="ignore"):
        acc_bound = _gamma(n_terms, u) * mag
        if extra is not None:
            acc_bound = acc_bound + extra
        bound = acc_bound + y_bound64
    with np.errstate(invalid="ignore", over="ignore"):
        lo = round_down(y_exact - bound, out_dtype)
        hi = round_up(y_exact + bound, out_dtype)
    y_ref = round_to_dtype(y_exact, out_dtype)
    return Interval(y_ref=y_ref, y_exact=y_exact, lo=lo, hi=hi, bound=bound, out_dtype=out_dtype, parts=parts or {})


def declared_interval(inp: CaseInputs, declared: Declared) -> Interval:
    """The accepted outputs of a backend declaring ``declared`` on ``inp``."""
    case = inp.case
    out_dtype = declared.output or case.output_dtype
    x = inp.x.astype(np.float64)
    if declared.act_compute_dtype:
        x = round_to_dtype(x, declared.act_compute_dtype)
    bias = None if inp.bias is None else inp.bias.astype(np.float64)
    _, act = {"w4a16": (0, "a16"), "w8a16": (0, "a16"), "w4a16-mxfp4": (0, "a16"), "w8a8": (0, "int8"),
              "w4a8": (0, "int8"), "w4a4-mxfp4": (0, "mxfp4"), "w4a16-moe": (0, "moe")}[case.scheme]
    if act == "moe":
        w13 = emoe.dequantize_gptq_experts(inp.tensors["w13_qweight"], inp.tensors["w13_scales"], group_size=case.group)
        w2 = emoe.dequantize_gptq_experts(inp.tensors["w2_qweight"], inp.tensors["w2_scales"],
                                          group_size=min(case.group, case.N))
        if declared.weight_dtype not in ("exact", None):
            w13 = round_to_dtype(w13, declared.weight_dtype)
            w2 = round_to_dtype(w2, declared.weight_dtype)
        r = emoe.moe_w16(x.astype(np.float32), inp.router_logits, w13, w2, case.top_k,
                         variant=emoe.MoeVariant(**(declared.variants.get("moe") or {})), out_dtype=out_dtype)
        # Two GEMMs + routing in the declared precision: bound each stage's accumulation and the
        # fp32 routing weights (relative u each), propagated through |w2| |a|.
        u = UNIT_ROUNDOFF[declared.accumulate]
        ia = case.N
        inter_mag = r.y_bound / max(lin.gamma(ia + case.top_k + 8), 1e-300)
        extra = (_gamma(case.K, u) * 4 + _gamma(ia + case.top_k + 4, u) + 2.0 ** -7) * inter_mag
        return _finish(r.y_exact, r.y_bound, inter_mag, ia, declared, out_dtype,
                       parts={"topk_ids": r.parts["topk_ids"]}, extra=extra)
    if act == "a16":
        w = declared_weight(case, inp.tensors, declared).astype(np.float64)
        r = lin.linear_w16(x, w, bias, out_dtype=out_dtype)
        mag = np.abs(x) @ np.abs(w).T + (0 if bias is None else np.abs(bias))
        # products of fp32 operands round once more than the sum: K + 1 terms
        return _finish(r.y_exact, r.y_bound, mag, case.K + 1 + (bias is not None), declared, out_dtype)
    if act == "int8":
        v = int8_variant(declared)
        if case.scheme == "w8a8":
            t = inp.tensors
            r = lin.linear_w8a8(x.astype(np.float32), t["weight"], np.asarray(t["weight_scale"], np.float32).reshape(-1),
                                bias, act=v, out_dtype=out_dtype)
            scale_mag = np.abs(r.acc * r.parts["x_scale"].astype(np.float64)
                               * np.asarray(t["weight_scale"], np.float64).reshape(1, -1))
            mag = scale_mag + (0 if bias is None else np.abs(bias))
            # int32 accumulation is exact; the scale products and the bias add round in the accumulate dtype
            acc_decl = dataclasses.replace(declared, accumulate="float32" if declared.accumulate == "int32"
                                           else declared.accumulate)
            return _finish(r.y_exact, r.y_bound, mag, 3, acc_decl, out_dtype, parts=r.parts)
        # W4A8: integer weights (q - z) and group scales under the declared weight reading
        w = declared_weight(case, inp.tensors, dataclasses.replace(declared, weight_dtype="exact")).astype(np.float64)
        r = lin.linear_w16(lin_dequant_acts(x, v), w, bias, out_dtype=out_dtype)
        acts = a8.quantize_int8_per_token(x.astype(np.float32), v)
        xd = a8.dequantize_int8_per_token(acts)
        mag = np.abs(xd) @ np.abs(w).T + (0 if bias is None else np.abs(bias))
        n_groups = case.K // case.group
        acc_decl = dataclasses.replace(declared, accumulate="float32" if declared.accumulate == "int32"
                                       else declared.accumulate)
        return _finish(r.y_exact, r.y_bound, mag, n_groups + 3, acc_decl, out_dtype,
                       parts={"x_q": acts.q, "x_scale": acts.scale, "x_tie": acts.tie})
    if act == "mxfp4":
        mv = mx_variant(declared)
        codes, sb = mxfp4.unpack_mxfp4_ct(inp.tensors)
        r = lin.linear_mxfp4_w4a4(x.astype(np.float32), codes, sb, bias, act=mv, out_dtype=out_dtype)
        xd = mxfp4.dequantize_mxfp4(r.parts["x_codes"], r.parts["x_scale"], dtype=np.float64)
        wd = mxfp4.dequantize_mxfp4(codes, sb, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            mag = np.abs(xd) @ np.abs(wd).T + (0 if bias is None else np.abs(bias))
        return _finish(r.y_exact, r.y_bound, mag, case.K + 1, declared, out_dtype, parts=r.parts)
    raise ValueError(case.scheme)


def lin_dequant_acts(x: np.ndarray, v: a8.Int8ActVariant) -> np.ndarray:
    return a8.dequantize_int8_per_token(a8.quantize_int8_per_token(x.astype(np.float32), v))


# -- comparison -----------------------------------------------------------------------------------
@dataclasses.dataclass
class Comparison:
    ok: bool
    n_out: int  # elements outside the interval
    max_ratio: float  # max |y - y_exact| / bound (0/0 -> 0; inf where bound is 0 and y differs)
    max_ulp: int  # max ULP distance to y_ref in the output dtype
    sqnr_db: float
    worst: tuple | None  # index of the worst element
    exact_match: bool

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _ordinal(v: np.ndarray, dtype: str) -> np.ndarray:
    """Map output-dtype values to integers that are consecutive across the grid (total order)."""
    fmt = format_of(dtype)
    b = encode(v, fmt).astype(np.int64)
    sign_bit = 1 << (fmt.bits - 1)
    mag = b & (sign_bit - 1)
    return np.where(b & sign_bit, -mag, mag)


def compare(y: np.ndarray, iv: Interval) -> Comparison:
    y64 = np.asarray(y, dtype=np.float64)
    if y64.shape != iv.y_exact.shape:
        return Comparison(False, int(iv.y_exact.size), np.inf, -1, -np.inf, None, False)
    nonfinite_ref = ~np.isfinite(iv.y_exact)
    # Non-finite references (NaN/Inf activations, 0xFF scales) must be matched exactly: same Inf, or NaN.
    same_nonfinite = (np.isnan(iv.y_exact) & np.isnan(y64)) | (np.isinf(iv.y_exact) & (y64 == iv.y_exact))
    with np.errstate(invalid="ignore"):
        inside = np.where(nonfinite_ref, same_nonfinite, (y64 >= iv.lo) & (y64 <= iv.hi))
    err = np.abs(y64 - iv.y_ref)
    # error/bound ratio: distance from the correctly rounded reference over the interval's reach on that
    # side; 0 for a correctly rounded result, <= 1 exactly when inside the interval
    with np.errstate(invalid="ignore"):
        side = np.where(y64 >= iv.y_ref, iv.hi - iv.y_ref, iv.y_ref - iv.lo)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err == 0, 0.0, err / side)
    nan_ref = nonfinite_ref
    ratio = np.where(nan_ref, 0.0, ratio)
    ratio = np.where(np.isnan(ratio), np.inf, ratio)
    finite = np.isfinite(y64) & np.isfinite(iv.y_ref)
    ulp = np.abs(_ordinal(np.where(finite, y64, 0), iv.out_dtype) - _ordinal(np.where(finite, iv.y_ref, 0), iv.out_dtype))
    with np.errstate(invalid="ignore", over="ignore"):
        sig = float(np.sum(np.where(finite, iv.y_exact, 0) ** 2))
        noise = float(np.sum(np.where(finite, y64 - iv.y_exact, 0) ** 2))
    sqnr = np.inf if noise == 0 else (10 * np.log10(sig / noise) if sig > 0 else -np.inf)
    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(np.where(np.isfinite(ratio), ratio, 1e300))),
                                                    ratio.shape)) if ratio.size else None
    exact = bool(np.array_equal(np.where(nan_ref, 0, y64), np.where(nan_ref, 0, iv.y_ref)))
    return Comparison(ok=bool(inside.all()), n_out=int((~inside).sum()), max_ratio=float(ratio.max(initial=0.0)),
                      max_ulp=int(ulp.max(initial=0)), sqnr_db=float(sqnr), worst=worst, exact_match=exact)
