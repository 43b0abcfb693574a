"""Levels that depend on the tensors: a declared rounding-level variant that is more on given tensors.

Semantics: docs/conformance.md#levels (what "rounding level" promises) and docs/fallback.md#the-dispatcher
(who asks: the dispatcher, before it routes an input to a kernel).

A variant of the dynamic int8 activation quantizer is *rounding level* when it moves each dequantized
activation by about one quantization step at most (a tie rule, a reciprocal, a 16-bit scale). Several such
variants only bite in a degenerate regime, and there they are not rounding: an amax clamp (``zero_row=eps``,
zentorch's 127e-10) zeroes every row whose range lies below the clamp, a zero-scale rule turns a zero row into
NaN, a 16-bit scale underflows. Whether that regime is reached depends on the input alone, so it is decided on
the input: ``activation_deviation`` quantizes ``x`` with the declared quantizer and with the canonical one and
compares the dequantized activations element by element.

The bound, ``STEPS`` canonical quantization steps, is what rounding-level variants stay inside: each of the two
quantizers is within half a step of ``x`` (the declared one within half of its own step), a 16-bit scale or
dequantization scale moves 127 codes by at most 127 * 2^-9 ~ 0.25 step (bfloat16, RNE) and a code rounded the
other way by one step; 2 steps hold all of that. A clamp that bites moves an element by up to 127 steps (to 0),
and NaN where the canonical value is finite (or the reverse) is never rounding. Where the canonical quantizer
itself is undefined (NaN activations: emulator/activations/int8.py raises) there is nothing to compare with
and the question is the reference's, not the dispatcher's (None).

The weights have the same kind of variant: a 16-bit scale or weight dtype (``weight_scale_dtype``,
``weight_dtype``, ``weight_formation``) is rounding level in general and flushes a subnormal float32 scale to 0
or overflows a large one. ``weight_deviation`` forms the weights both ways and refuses what no rounding explains:
a weight that becomes non-finite, or moves by more than half its own magnitude (a zero weight must stay zero).
A 16-bit rounding moves a weight by 2^-9 of itself per rounding, a float-zero dequantization order by about
2^-9 of the zero point's product: far inside that bound; a flushed or overflowed scale is far outside it.
"""

from __future__ import annotations

import numpy as np

from .activations import int8 as a8
from .activations.int8_fast import dequantize_int8_fast, quantize_int8_fast
from .declaration import Declared, canonical_declaration, declared_weight, int8_variant
from .errors import FormatError
from .schemes import SCHEMES, Case

__all__ = ["STEPS", "activation_deviation", "weight_deviation", "WEIGHT_AXES"]

#: the declaration entries that shape the weights a kernel forms (the weight stage's variants and these fields)
WEIGHT_AXES = ("weight_dtype", "weight_rounding", "weight_formation")

#: how many canonical quantization steps a rounding-level quantizer variant may move a dequantized activation
STEPS = 2.0


def _within_by_codes(ref: a8.Int8Activations, got: a8.Int8Activations) -> bool:
    """True only where every dequantized activation of ``got`` is provably within ``STEPS`` canonical steps of
    ``ref``'s without forming them (False: undecided, the exact comparison decides). Sufficient condition: both
    zero points 0, both scales finite, per row 128 |s_got - s_ref| <= |s_ref| / 2 (float64 of two float32 values:
    its rounding is ~2^-52 relative, far inside the factor 2 of margin) and every code within 1 of the canonical
    one; then |q_g s_g - q_r s_r| <= |q_g - q_r| |s_r| + |q_g| |s_g - s_r| <= 1.5 |s_r| (|q_g| <= 128), and the
    float64 difference the exact comparison forms, rounded monotonically, stays <= 2 |s_r| too."""
    if ref.zero_point.any() or got.zero_point.any():
        return False
    s_r = ref.scale.astype(np.float64)
    s_g = got.scale.astype(np.float64)
    with np.errstate(all="ignore"):
        if not (np.isfinite(s_r).all() and np.isfinite(s_g).all()):
            return False
        if not (128.0 * np.abs(s_g - s_r) <= 0.5 * np.abs(s_r)).all():
            return False
    d = ref.q - got.q  # int32 codes in [-128, 127]: no overflow (both kept: the exact comparison may need them)
    return bool(d.min() >= -1 and d.max() <= 1)


def _quantized(x: np.ndarray, v: a8.Int8ActVariant) -> a8.Int8Activations:
    """The fast quantizer: equal to ``a8.quantize_int8_per_token`` field for field
    (emulator/activations/int8_fast.py), as every call pays this."""
    return quantize_int8_fast(x, v, codes_only=True)


def activation_deviation(declared: Declared, case: Case, x) -> str | None:
    """Why ``declared``'s int8 activation quantizer is not within rounding of the canonical one on ``x`` [M, K]
    (None: it is, or the case has no int8-quantized activations, or the declaration names no quantizer variant).

    Checked: schemes whose activations are int8-quantized from ``x`` (w8a8, w4a8; not the MoE block, whose
    GEMM inputs are not ``x``). The MXFP4 activation quantizer is not checked here (its variants' levels do
    not depend on the input in the same way: docs/formats/mxfp4.md)."""
    if not SCHEMES[case.scheme].int8_activations:
        return None
    canon_v = int8_variant(canonical_declaration(case), case)
    decl_v = int8_variant(declared, case)
    if decl_v == canon_v:
        return None
    x = np.asarray(x, np.float32)
    try:
        ref_acts = _quantized(x, canon_v)
    except FormatError:  # the canonical quantizer is undefined on this input (NaN): nothing to compare with
        return None
    try:
        with np.errstate(all="ignore"):
            got_acts = _quantized(x, decl_v)
    except FormatError as e:
        return f"its activation quantizer raises on this input where the canonical one does not ({e})"
    if _within_by_codes(ref_acts, got_acts):  # the usual answer, proved on the codes and scales alone
        return None
    with np.errstate(all="ignore"):
        ref, got = dequantize_int8_fast(ref_acts), dequantize_int8_fast(got_acts)
        step = np.abs(ref_acts.scale.astype(np.float64))  # [M, 1]: broadcast against [M, K]
        diff = np.abs(got - ref)
        if np.isfinite(diff).all():  # both finite everywhere (Inf or NaN in either makes the difference so)
            far = diff > STEPS * step
        else:
            fin = np.isfinite(ref) & np.isfinite(got)
            same_special = ~fin & ((ref == got) | (np.isnan(ref) & np.isnan(got)))
            far = np.where(fin, diff > STEPS * step, ~same_special)
    n = int(far.sum())
    if not n:
        return None
    rows = int(far.any(axis=1).sum())
    i, j = (int(a) for a in np.argwhere(far)[0])
    return (f"on this input its activation quantizer moves {n} of {far.size} dequantized activations ({rows} of "
            f"{far.shape[0]} rows) more than {STEPS:g} quantization steps from the canonical one (e.g. x[{i}, {j}] "
            f"= {float(x[i, j]):.6g}: {float(got[i, j]):.6g} where the canonical quantizer gives {float(ref[i, j]):.6g})")


def weight_deviation(declared: Declared, case: Case, tensors: dict) -> str | None:
    """Why a 16-bit dtype ``declared`` rounds the weight scales or the weights to does not hold this layer's
    ``tensors`` to within its unit roundoff (None: it does, or the declaration rounds to none; MoE stacks and
    quantize-only cases have no such weights here).

    The dtypes: ``weight_scale_dtype`` (other than the checkpoint's), a 16-bit ``weight_dtype`` and the
    arithmetic dtype of ``weight_formation``. The values: the checkpoint's float scales and the canonical weights
    (``declared_weight`` under the canonical declaration). A finite non-zero value v is held where rounding it
    to the dtype moves it by at most the dtype's unit roundoff 2^-(p+1) of itself (p mantissa bits): true of
    every value in the normal range and of those the dtype represents exactly; a value the dtype flushes toward
    zero (its subnormal range) or overflows is moved by more, and is the reason."""
    from .declaration import arithmetic_dtype
    from .numerics.floats import format_of, round_to_dtype

    if SCHEMES[case.scheme].activations == "moe" or case.spec.quantize_only:
        return None
    why = _float_zero_deviation(declared, case, tensors)
    if why:
        return why
    scale_dtype = declared.value("weight_scale_dtype")
    dtypes = {d for d in (None if scale_dtype == "checkpoint" else scale_dtype, declared.weight_dtype,
                          arithmetic_dtype(declared, case)) if d in ("float16", "bfloat16")}
    if not dtypes:
        return None
    values = {}  # the scales first: where a scale is not held, that is the cause
    for key in ("scales", "weight_scale"):
        t = tensors.get(key)
        data = t if t is None or isinstance(t, np.ndarray) else getattr(t, "data", t)  # an array or a Tensor
        if data is not None and str(np.asarray(data).dtype) in ("float32", "float16", "bfloat16"):
            values["scale"] = np.asarray(data).astype(np.float64)
    values["weight"] = np.asarray(declared_weight(case, tensors, canonical_declaration(case)), np.float64)
    for dtype in sorted(dtypes):
        u = 2.0 ** -(format_of(dtype).man_bits + 1)
        for what, v in values.items():
            with np.errstate(all="ignore"):
                r = np.asarray(round_to_dtype(v, dtype), np.float64)
                bad = np.isfinite(v) & (v != 0) & ~(np.abs(r - v) <= u * np.abs(v))
            n = int(bad.sum())
            if n:
                k = int(np.flatnonzero(bad)[0])
                val = float(v.reshape(-1)[k])
                return (f"{dtype} does not hold {n} of {v.size} of this layer's {what}s (flushed toward zero or "
                        f"overflowed: e.g. {val:.6g} becomes {float(r.reshape(-1)[k]):.6g}, not within its unit "
                        f"roundoff 2^-{format_of(dtype).man_bits + 1})")
    return None


def _float_zero_deviation(declared: Declared, case: Case, tensors: dict) -> str | None:
    """Why a 16-bit ``zero_dtype`` under ``dequant_order=float_zero`` does not hold this layer's float zero points
    ((m - z) * s, docs/formats/gptq.md): where one overflows the dtype, weights the canonical dequantization gives
    finite become +-Inf or NaN (an extreme but legal scale times a zero-point distance of up to 2^bits)."""
    zero_dtype = declared.value("zero_dtype")
    if declared.value("dequant_order") != "float_zero" or zero_dtype not in ("float16", "bfloat16"):
        return None
    with np.errstate(all="ignore"):
        canon = np.asarray(declared_weight(case, tensors, canonical_declaration(case)), np.float64)
        got = np.asarray(declared_weight(case, tensors, declared), np.float64)
    bad = np.isfinite(canon) & ~np.isfinite(got)
    n = int(bad.sum())
    if not n:
        return None
    k = int(np.flatnonzero(bad)[0])
    return (f"{zero_dtype} float zero points overflow on this layer: {n} of {bad.size} weights the canonical "
            f"dequantization gives finite become non-finite (e.g. {float(canon.reshape(-1)[k]):.6g} -> "
            f"{float(got.reshape(-1)[k]):.6g})")
