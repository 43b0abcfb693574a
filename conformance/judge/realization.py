"""Whether a case realizes its coverage value class: the property read back from the case's tensors.

Semantics: docs/conformance.md#coverage. The generators are conformance/cases/coverage_values.py; this
check reads the class's property back with independent code (conformance/judge/oracles.py's unpackers for
the weights, plain NumPy for the activations) and the canonical reference, so a generator that stops
producing its class fails here instead of silently covering nothing.
"""

from __future__ import annotations
import numpy as np
from backends.base import Case
from conformance.cases.inputs import CaseInputs
from conformance.cases.coverage import AMAX

from conformance.cases.coverage_values import INT16_MAX, MANTISSA_BITS, activation_units, units_of

__all__ = ["realized"]


def _f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float32).astype(np.float64) if np.asarray(a).dtype.name == "bfloat16" \
        else np.asarray(a).astype(np.float64)


def _element_scales(case: Case, t: dict):
    """(scale of every weight element [N, K], group of every column [K]) read from the tensors."""
    N, K, fmt = case.N, case.K, case.weight_format
    if fmt == "gptq":
        g = np.asarray(t["g_idx"]).astype(np.int64)
        return _f64(t["scales"])[g, :].T, g
    if fmt == "awq":
        s = _f64(t["scales"])
        g = np.arange(K) // (K // s.shape[0])
        return s[g, :].T, g
    if fmt == "ct-pack-quantized":
        s = _f64(t["weight_scale"])
        g = np.asarray(t["weight_g_idx"]).astype(np.int64) if "weight_g_idx" in t else np.arange(K) // (K // s.shape[1])
        return s[:, g], g
    if fmt == "ct-int-quantized":
        return np.broadcast_to(_f64(t["weight_scale"]).reshape(N, 1), (N, K)), np.zeros(K, np.int64)
    sb = np.asarray(t["weight_scale"]).astype(np.int64)
    s = np.where(sb == 0xFF, np.nan, np.exp2((sb - 127).astype(np.float64)))
    return np.repeat(s, 32, axis=1), np.arange(K) // 32


def _ff_blocks(cls: str, case: Case, t: dict, x: np.ndarray) -> tuple[bool, str]:
    """Whether a 0xFF block has the codes (and activations) of ``cls``: its E2M1 codes read from the packed
    nibbles (low nibble: even element; bit 3: the sign; bits 0-2 zero: +-0), docs/formats/mxfp4.md."""
    p = np.asarray(t["weight_packed"]).astype(np.int64)
    codes = np.stack([p & 0xF, p >> 4], axis=-1).reshape(p.shape[0], -1)
    seen = 0
    for n, b in np.argwhere(np.asarray(t["weight_scale"]) == 0xFF):
        c = codes[n, 32 * b:32 * b + 32]
        mag, neg = c & 7, c >> 3
        if cls == "nan-scale-zero-codes":
            seen += bool((mag == 0).all())
            continue
        xb = x[:, 32 * b:32 * b + 32]
        w_one = bool(mag.any()) and len(set(neg[mag != 0].tolist())) == 1
        x_one = bool(((xb > 0).all(axis=1) | (xb < 0).all(axis=1)).all())
        if activation_units(case) == "block":  # every element quantizes to a non-zero E2M1 code
            x_one &= bool((np.abs(xb) > np.abs(xb).max(axis=1, keepdims=True) / 16).all())
        seen += w_one and x_one
    return seen > 0, f"{seen} 0xFF block(s) with {cls[10:]}"


def _reference(inp: CaseInputs) -> np.ndarray:
    from emulator.declaration import canonical_declaration

    from conformance.judge.acceptance import declared_interval

    return np.asarray(declared_interval(inp, canonical_declaration(inp.case)).y_ref, np.float64)


def _finite_and_not(y: np.ndarray, what: str) -> tuple[bool, str]:
    bad, good = ~np.isfinite(y), np.isfinite(y)
    if what == "nan":
        bad = np.isnan(y)
    return bool(bad.any() and good.any()), f"reference output: {int(bad.sum())} {what}, {int(good.sum())} finite"


def _asym_rows(x: np.ndarray):
    """Per row, in fp32 as docs/formats/activations.md#canonical-asymmetric-azp writes it (plain NumPy, not the
    emulator): (scale, fl32(min / scale), fl32(-128 - min / scale), the quotients fl32(x / scale))."""
    f32 = np.float32
    x = np.asarray(x, f32)
    with np.errstate(all="ignore"):
        mn, mx = x.min(axis=1), x.max(axis=1)
        scale = ((mx - mn).astype(f32) / f32(255)).astype(f32)
        m = (mn / scale).astype(f32)
        zr = (f32(-128) - m).astype(f32)
        quo = (x / scale[:, None]).astype(f32)
    return scale, m.astype(np.float64), zr.astype(np.float64), quo.astype(np.float64)


def _realized_asym_acts(cls: str, case: Case, x: np.ndarray) -> tuple[bool, str]:
    if case.act_symmetric or activation_units(case) != "row":
        return False, "not asymmetric per-token int8 activations"
    scale, m, zr, quo = _asym_rows(x)
    live = (scale > 0) & np.isfinite(scale)
    within = live & (np.abs(zr) <= 2.0 ** 31 - 1)
    if cls == "azp-int32-saturation":
        n = int((live & ~within).sum())
        return n > 0, f"{n} row(s) whose zero point saturates int32"
    if cls == "azp-int8-domain":
        n = int((within & (np.rint(zr) != np.rint(-m) - 128)).sum())
        return n > 0, f"{n} row(s) whose int8- and uint8-domain zero points differ"
    pre = np.rint(quo) + np.rint(zr)[:, None]  # codes before saturation
    n = int((live & ((pre > 127) | (pre < -128)).any(axis=1)).sum())
    return n > 0, f"{n} row(s) with a code outside [-128, 127] before saturation"


def realized(cls: str, inp: CaseInputs) -> tuple[bool, str]:
    """Whether the inputs hold value class ``cls``, and what was seen."""
    case, x = inp.case, np.asarray(inp.x, np.float64)
    if cls in ("azp-int32-saturation", "azp-int8-domain", "act-code-saturation"):
        return _realized_asym_acts(cls, case, x)
    if cls == "ordinary":
        return bool(np.isfinite(x).all()), "finite activations"
    if cls == "router-ties":
        lg = np.sort(np.asarray(inp.router_logits, np.float64), axis=1)[:, ::-1]
        k = case.top_k
        ok = bool(np.all(lg[:, k - 1] == lg[:, k]))
        return ok, f"k-th and (k+1)-th logits equal in every row: {ok}"
    if cls == "act-byte0-fine-steps":
        return _realized_byte0(inp, case, x)
    if cls in AMAX or cls.startswith("act-"):
        seen = _realized_in_units(cls, case, x)
        if seen is not None:
            return seen
    if cls in ("nan-act", "inf-act"):
        return _realized_non_finite_acts(cls, inp, case, x)
    return _realized_weights(cls, inp, case, x)


def _realized_in_units(cls: str, case, x: np.ndarray) -> "tuple[bool, str] | None":
    """Activation classes seen per quantization unit (row, group or block); None: not one of them."""
    unit = activation_units(case) if cls != "act-saturation" else "block"
    units = units_of(x, unit if unit != "none" else "row")
    if cls in AMAX:
        m = MANTISSA_BITS[case.act_dtype]
        seen = []
        for u in units:
            a = float(np.max(np.abs(u)))
            e = int(np.floor(np.log2(a)))
            forms = {"amax=2^k": [2.0 ** e], "amax=2^k-ulp": [2.0 ** (e + 1) - 2.0 ** (e - m)],
                     "amax=2^k+ulp": [2.0 ** e + 2.0 ** (e - m)],
                     "amax=1.5*2^k-ulp": [1.5 * 2.0 ** e - 2.0 ** (e - m)],
                     "amax=1.5*2^k+ulp": [1.5 * 2.0 ** e + 2.0 ** (e - m)], "amax=1.75*2^k": [1.75 * 2.0 ** e]}
            seen.append(a in forms[cls])
        return all(seen), f"{sum(seen)} of {len(seen)} {unit}s with {cls}"
    if cls == "act-one-signed":
        n = sum(bool(((u >= 0).all() and (u > 0).any()) or ((u <= 0).all() and (u < 0).any())) for u in units)
        return n > 0, f"{n} one-signed {unit}(s)"
    if cls == "act-constant-rows":
        n = sum(bool((r == r[0]).all() and r[0] != 0) for r in x)
        return n > 0, f"{n} constant non-zero row(s)"
    if cls == "act-saturation":
        n = 0
        for u in units:
            a = float(np.max(np.abs(u)))
            n += bool(a > 0 and a / 2.0 ** (np.floor(np.log2(a)) - 2) > 6)
        return n > 0, f"{n} block(s) whose amax scales above 6"
    return None


def _realized_byte0(inp: CaseInputs, case: Case, x: np.ndarray) -> tuple[bool, str]:
    """MX blocks whose amax is in [2^-125, 2^-124) (scale 2^-127: byte 0) holding an odd multiple of 2^-128 (the
    finest E2M1 step there); W4A4: met by an E8M0 0xFE weight block with non-zero codes in the same K block."""
    if case.K % 32:
        return False, "K not a multiple of 32"
    hits = set()
    for m in range(x.shape[0]):
        for b in range(x.shape[1] // 32):
            u = x[m, 32 * b:32 * b + 32]
            a = float(np.max(np.abs(u)))
            fine = u * 2.0 ** 128
            if 2.0 ** -125 <= a < 2.0 ** -124 and bool(((fine % 2) == 1).any() | ((fine % 2) == -1).any()):
                hits.add(b)
    what = f"{len(hits)} block column(s) at scale byte 0 with finest-step elements"
    if not hits or case.spec.quantize_only:
        return bool(hits), what
    p = np.asarray(inp.tensors["weight_packed"]).astype(np.int64)
    codes = np.stack([p & 0xF, p >> 4], axis=-1).reshape(p.shape[0], -1)
    sb = np.asarray(inp.tensors["weight_scale"])
    met = sorted(b for b in hits if ((sb[:, b] == 0xFE) & ((codes[:, 32 * b:32 * b + 32] & 7) != 0).any(axis=1)).any())
    return bool(met), f"{what}; met by 0xFE weight blocks with non-zero codes: {len(met)}"


def _realized_non_finite_acts(cls: str, inp: CaseInputs, case, x: np.ndarray) -> tuple[bool, str]:
    """NaN or Inf activations, with finite rows whose reference output shows them."""
    finite_rows = int(np.isfinite(x).all(axis=1).sum())
    has = np.isnan(x).any() if cls == "nan-act" else (np.isinf(x).any() and not np.isnan(x).any())
    if not has or not finite_rows:
        return False, f"{cls}: activations hold it: {bool(has)}; {finite_rows} finite row(s)"
    if case.spec.quantize_only:
        return True, f"{finite_rows} finite row(s)"
    return _finite_and_not(_reference(inp), "nan" if cls == "nan-act" else "non-finite")


def _realized_weights(cls: str, inp: CaseInputs, case, x: np.ndarray) -> tuple[bool, str]:
    """Weight and scale classes, seen in the independently dequantized weight and its scales."""
    from conformance.judge.oracles import independent_weight

    t = inp.tensors
    W = independent_weight(case, t)
    S, g = _element_scales(case, t)
    if cls == "w-one-signed":
        n = sum(bool(((r >= 0).all() and (r > 0).any()) or ((r <= 0).all() and (r < 0).any())) for r in W)
        return n > 0, f"{n} one-signed weight row(s)"
    if cls == "w-constant-rows":
        n = sum(bool((r == r[0]).all() and r[0] != 0) for r in W)
        return n > 0, f"{n} constant non-zero weight row(s)"
    if cls == "w-rowsum-beyond-int16":
        sums = np.rint(W / S).sum(axis=1)
        n = int((np.abs(sums) > INT16_MAX).sum())
        asym = not case.act_symmetric
        return n > 0 and asym, f"{n} weight row(s) with |sum of codes| > {INT16_MAX}; asymmetric activations: {asym}"
    if cls == "code-eq-zero":
        n = sum(bool((W[i] == 0).all() and (S[i] != 0).all()) for i in range(W.shape[0]))
        return n > 0, f"{n} row(s) whose codes all equal their zero points (non-zero scales)"
    if cls == "w-saturation":
        c = W[0] / S[0]
        if case.weight_format == "ct-mxfp4":
            ok = all(c[g == b].max() == 6 and c[g == b].min() == -6 for b in np.unique(g))
        elif case.weight_format == "ct-int-quantized":
            ok = bool(c.max() == 127 and c.min() == -127)
        else:
            maxq = (1 << case.bits) - 1
            ok = all(c[g == b].max() - c[g == b].min() == maxq for b in np.unique(g))
        return ok, f"row 0 reaches both ends of the code range in every group: {ok}"
    if cls == "scale-subnormal":
        if case.weight_format == "ct-mxfp4":
            n = int(np.isin(np.asarray(t["weight_scale"]), (0, 1)).sum())
            return n > 0, f"{n} E8M0 byte(s) 0x00/0x01"
        key = {"gptq": "scales", "awq": "scales"}.get(case.weight_format, "weight_scale")
        s = _f64(t[key])
        tiny = {"float16": 2.0 ** -14, "bfloat16": 2.0 ** -126, "float32": 2.0 ** -126}[case.scale_dtype]
        n = int(((s != 0) & (np.abs(s) < tiny)).sum())
        return n > 0, f"{n} subnormal {case.scale_dtype} scale(s)"
    if cls == "scale-extreme":
        if case.weight_format == "ct-mxfp4":
            big = bool((np.asarray(t["weight_scale"]) == 0xFE).any())
        else:
            big = bool(np.nanmax(np.abs(S)) >= 2.0 ** 14)
        y = _reference(inp)
        return big and bool(np.isfinite(y).any()), f"huge scale present: {big}; {int(np.isfinite(y).sum())} finite output(s)"
    if cls == "scale-negative":
        key = {"gptq": "scales", "awq": "scales"}.get(case.weight_format, "weight_scale")
        s = _f64(t[key])
        neg, pos = int((s < 0).sum()), int((s > 0).sum())
        live = bool((W[S < 0] != 0).any())  # a negative scale some non-zero weight is dequantized with
        ok = neg > 0 and (pos > 0 or s.size == 1) and live
        return ok, f"{neg} negative and {pos} positive scale(s); non-zero weights under a negative scale: {live}"
    if cls == "g_idx-unequal-groups":
        key = "g_idx" if case.weight_format == "gptq" else "weight_g_idx"
        gi = np.asarray(t[key]).astype(np.int64) if key in t else None
        ng = case.K // case.group
        if gi is None or gi.shape != (case.K,) or gi.min() < 0 or gi.max() >= ng:
            return False, f"no {key} into [0, {ng}) in the tensors"
        sizes = np.bincount(gi, minlength=ng)
        return bool((sizes != case.group).any()), f"{key} group sizes {sizes.tolist()} (G = {case.group})"
    if cls in ("nan-scale", "nan-scale-zero-codes", "nan-scale-one-signed"):
        sb = np.asarray(t["weight_scale"])
        has = bool((sb == 0xFF).any()) and bool(np.isfinite(x).all())
        if not has:
            return False, "no 0xFF byte with finite activations"
        if cls != "nan-scale":
            ok, why = _ff_blocks(cls, case, t, x)
            if not ok:
                return False, why
        return _finite_and_not(_reference(inp), "nan")
    raise ValueError(f"unknown value class {cls!r}")
