"""Failure localization, activation quantization: the failing case's own rows, one at a time.

Semantics: docs/conformance.md#failure-localization (step 4). ``conformance.judge.localize`` calls
``analyze_own_rows`` for int8 and MXFP4 activations. Per-token (per-row) quantization makes the rows of a
case independent, so each of the case's own activation rows is run alone (M = 1) against the same prepared
weights, judged as the verdict judges, and

1. classified by what it holds that an activation quantizer can get wrong (``row_classes``): a zero row,
   NaN/Inf, a constant row, a one-signed row, amax exactly a power of two or one unit below one, values whose
   scaled quotient sits exactly on a rounding tie, values that saturate, ...; the classes whose rows fail and
   those whose rows pass are named;
2. compared with every other value of the scheme's activation-quantization axes of the variant vocabulary
   (emulator/variants.py: ``act_rounding=rhaz``, ``act_scale_formula=recip_mul``, ``azp_domain=uint8``,
   ``mx_scale_rule=ceil``, ...) and a few bugs no real kernel declares (codes not saturated, MX quotients
   above 6 read as 0, the MX exponent from a float32 log2): a hypothesis *explains* the rows when every
   output of every row run lies inside the interval of that declaration (or within one unit in the last
   place of its exact value), and it changes the failing rows; the part it names (scale, rounding, clamp,
   zero point, ...) is the part of the quantizer that is off;
3. for symmetric int8 and MXFP4, the kernel's dequantized amax (hence its scale) is read from a probe row
   holding the failing row's amax element alone, as the interval that the observed outputs leave, and
   compared with the declared one.

The result is a JSON-able dict (``findings`` as the other localization parts have them).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from emulator.declaration import int8_variant, mx_variant
from emulator.numerics.floats import round_to_dtype
from emulator.variants import AXES, Stage

from backends.base import Case, Declared

from conformance.judge.localize_amax import amax_hypotheses
from conformance.judge.localize_weights import close

__all__ = ["analyze_own_rows", "RowProbe", "row_classes", "hypotheses", "PARTS", "MAX_OWN_ROWS"]

#: at most this many of the case's rows are run alone (failing rows first)
MAX_OWN_ROWS = 24
#: multiply-adds the emulator spends on the hypotheses' references (rows * N * K * hypotheses) at most
MAX_HYPOTHESIS_MACS = 1 << 31
#: the part of the quantizer each vocabulary axis belongs to
PARTS = {"act_rounding": "rounding", "e2m1_rounding": "rounding", "mx_quotient_dtype": "rounding",
         "reciprocal": "scale", "act_scale_dtype": "scale", "act_dequant_scale_dtype": "scale",
         "act_scale_formula": "scale", "act_sym_divisor": "scale", "act_arith_dtype": "scale",
         "mx_scale_rule": "scale", "mx_byte0_divisor": "scale", "mx_scale_overflow": "scale",
         "qmin": "clamp", "qmax": "clamp", "zero_row": "zero-row guard", "mx_zero_block": "zero-block guard",
         "nan_to_int": "NaN handling", "e2m1_nan": "NaN handling", "mx_nan_block": "NaN handling",
         "act_symmetric": "zero point", "act_range": "zero point", "azp_before_rounding": "zero point",
         "azp_clamp": "zero point", "azp_clamp_nan": "zero point", "azp_domain": "zero point",
         "int32_saturation": "zero point", "azp_fused": "zero point", "azp_overflow": "zero point",
         "act_granularity": "granularity", "e2m1_zero_sign": "sign of zero", "uint8_zp128": "code storage",
         "act_scheme": "scheme"}
#: eps values of zero_row=eps tried (the sources of emulator/variants.py's zero_row axis: Triton, SGL CPU, XPU)
_EPS_VALUES = (1e-10, 1e-7, 1e-5, 1e-8, 1e-6, 1e-12)
#: values whose reference raises or that need another value to mean anything
_SKIP = {("nan_to_int", "raise"), ("e2m1_nan", "raise"), ("azp_fused", True), ("act_scheme", "kai_qa8dx")}
#: row classes that only the activation quantizer sees (a failure confined to them is the quantizer's);
#: a one-signed or a constant row also stresses the accumulator (large sums), so it is not among them
QUANTIZER_CLASSES = ("zero row", "NaN/Inf in the row", "amax exactly a power of two",
                     "amax one unit below a power of two", "exact ties after scaling", "saturating values",
                     "saturating codes", "tiny amax (subnormal scale)", "zero point saturated at the int32 limit")

#: the order in which classes shared by every failing row are named (the most specific first)
_PRIORITY = ("zero point saturated at the int32 limit", "NaN/Inf in the row", "zero row", "saturating codes",
             "exact ties after scaling", "amax one unit below a power of two", "saturating values",
             "tiny amax (subnormal scale)", "amax exactly a power of two", "zero point outside the int8 code range",
             "constant row", "one-signed row")

Judge = Callable[[np.ndarray, np.ndarray, "np.ndarray | None", Declared], tuple]
Run = Callable[[np.ndarray, "np.ndarray | None"], np.ndarray]


# -- row classes -------------------------------------------------------------------------------------------
def _ulp_of(v: np.ndarray, dtype: str) -> np.ndarray:
    mant = {"float32": 23, "float16": 10, "bfloat16": 7}.get(dtype, 23)
    _, e = np.frexp(np.abs(v))
    return np.ldexp(1.0, e - 1 - mant)


def _pow2(v: np.ndarray) -> np.ndarray:
    m, _ = np.frexp(np.abs(v))
    return (v != 0) & np.isfinite(v) & (m == 0.5)


def row_classes(case: Case, x: np.ndarray, tie: "np.ndarray | None", scale: "np.ndarray | None",
                zero_point: "np.ndarray | None" = None) -> list[list[str]]:
    """The value classes of each row of ``x`` (float32 [rows, K]); ``tie``: the declared reference's tie mask
    ([rows, K]); ``scale``: its scales (int8: per row; MXFP4: E8M0 bytes per block); ``zero_point``: its int8
    zero points (asymmetric). MXFP4 classes are of
    the row's 32-element blocks (a row has the class if one of its blocks has it)."""
    x64 = np.asarray(x, np.float64)
    out = []
    mx = case.spec.activations == "mxfp4"
    for i, r in enumerate(x64):
        cls = []
        fin = np.isfinite(r)
        if not fin.all():
            cls.append("NaN/Inf in the row")
        rf = r[fin]
        if rf.size and not np.any(rf):
            cls.append("zero row")
        elif rf.size:
            if np.all(rf == rf[0]):
                cls.append("constant row")
            elif np.all(rf >= 0) or np.all(rf <= 0):
                cls.append("one-signed row")
            blocks = [r[j:j + 32] for j in range(0, r.size, 32)] if mx else [r]
            amaxes = np.array([np.max(np.abs(b[np.isfinite(b)]), initial=0.0) for b in blocks])
            amaxes = amaxes[amaxes > 0]
            if _pow2(amaxes).any():
                cls.append("amax exactly a power of two")
            if _pow2(amaxes + _ulp_of(amaxes, case.act_dtype)).any() and not _pow2(amaxes).all():
                cls.append("amax one unit below a power of two")
            if mx:  # |x| / 2^(floor(log2 amax) - 2) > 6: an element the E2M1 grid saturates
                bexp = np.repeat([np.floor(np.log2(a)) if a > 0 else 0 for a in
                                  [np.max(np.abs(b[np.isfinite(b)]), initial=0.0) for b in blocks]], 32)[: r.size]
                with np.errstate(invalid="ignore", over="ignore"):
                    quo = np.abs(r) / np.ldexp(1.0, (bexp - 2).astype(np.int64))
                if np.any(np.isfinite(quo) & (quo > 6)):
                    cls.append("saturating values")
            elif scale is not None and np.size(scale) > i:
                s = float(np.ravel(scale)[i]) if np.ndim(scale) else float(scale)
                if 0 < s < np.finfo(np.float32).tiny:
                    cls.append("tiny amax (subnormal scale)")
                z = float(np.ravel(zero_point)[i]) if zero_point is not None and np.size(zero_point) > i else 0.0
                if s > 0 and abs(z) < 2.0 ** 31 - 1:
                    with np.errstate(all="ignore"):
                        raw = np.rint((rf.astype(np.float32) / np.float32(s)).astype(np.float32)) + z
                    if np.any((raw > 127) | (raw < -128)):
                        cls.append("saturating codes")
        if zero_point is not None and np.size(zero_point) > i:
            z = float(np.ravel(zero_point)[i])
            if abs(z) >= 2.0 ** 31 - 1:
                cls.append("zero point saturated at the int32 limit")
            elif not -128 <= z <= 127:
                cls.append("zero point outside the int8 code range")
        if tie is not None and np.asarray(tie)[i].any():
            cls.append("exact ties after scaling")
        if not cls:
            cls.append("ordinary row")
        out.append(cls)
    return out


# -- hypotheses ------------------------------------------------------------------------------------------------
def hypotheses(case: Case, declared: Declared) -> list[tuple[str, str, Declared]]:
    """(name, part, declaration) for every other value of the scheme's activation-quantization axes."""
    stage = Stage.INT8_ACTIVATIONS if case.spec.activations == "int8" else Stage.MX_ACTIVATIONS
    out = []
    for ax in AXES.values():
        if ax.stage is not stage or not ax.applies_to(case.scheme) or ax.kind == "float":
            continue
        now = declared.variants.get(ax.key, case.act_symmetric if ax.key == "act_symmetric" else ax.canonical)
        if ax.kind == "bool":
            values = (not now,)
        elif ax.kind == "int":
            values = {"qmin": (-127,), "qmax": (126,)}.get(ax.key, ())
        else:
            values = tuple(v for v in ax.values if v != now)
        for v in values:
            if (ax.key, v) in _SKIP or v == now:
                continue
            if (ax.key, v) == ("zero_row", "eps"):  # the guard needs its eps: the engines' values
                for e in _EPS_VALUES:
                    de = dataclasses.replace(declared, variants={**declared.variants, "zero_row": "eps", "eps": e})
                    out.append((f"zero_row=eps, eps={e:g} ({ax.title}: the range clamped to at least {e:g} "
                                f"instead of {_fmt(now)})", PARTS.get(ax.key, "quantizer"), de))
                continue
            d = dataclasses.replace(declared, variants={**declared.variants, ax.key: v})
            try:
                int8_variant(d, case) if stage is Stage.INT8_ACTIVATIONS else mx_variant(d, case)
            except (ValueError, TypeError):
                continue
            out.append((f"{ax.key}={_fmt(v)} ({ax.title}: {_fmt(v)} instead of {_fmt(now)})",
                        PARTS.get(ax.key, "quantizer"), d))
    return out


def _fmt(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _custom(case: Case, declared: Declared, X: np.ndarray) -> list[tuple[str, str, np.ndarray]]:
    """(name, part, dequantized activations) for bugs no declaration names, on float32 rows X."""
    x = np.asarray(X, np.float32)
    f32 = np.float32
    out = []
    with np.errstate(all="ignore"):
        if case.spec.activations == "int8":
            v = int8_variant(declared, case)
            if v.symmetric:
                amax = np.max(np.abs(x), axis=1, keepdims=True)
                for d, name in ((f32(128), "scale amax/128 instead of amax/127"),):
                    s = (amax / d).astype(f32)
                    q = np.clip(np.rint(np.where(s > 0, x / np.where(s > 0, s, 1), 0)), -128, 127)
                    out.append((f"activation {name}", "scale", q * s.astype(np.float64)))
                s = (amax / f32(127)).astype(f32)
                r = np.rint(np.where(s > 0, (x / np.where(s > 0, s, 1)).astype(f32), 0)).astype(np.int64)
                out.append(("activation codes not saturated: a quotient past 127 wraps around in int8", "clamp",
                            (((r + 128) % 256) - 128) * s.astype(np.float64)))
            else:
                lo, hi = np.min(x, axis=1, keepdims=True), np.max(x, axis=1, keepdims=True)
                s = ((hi - lo).astype(f32) / f32(255)).astype(f32)
                safe = np.where(s > 0, s, f32(1))
                azp = np.where(s > 0, np.rint((f32(-128) - (lo / safe).astype(f32)).astype(f32)), 0).astype(np.int64)
                r = np.rint(np.where(s > 0, (x / safe).astype(f32), 0)).astype(np.int64) + azp
                out.append(("activation codes not saturated: a code past 127 wraps around in int8", "clamp",
                            ((((r + 128) % 256) - 128) - azp) * s.astype(np.float64)))
        elif case.spec.activations == "mxfp4":
            grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
            xb = x.astype(np.float64).reshape(len(x), -1, 32)
            amax = np.max(np.abs(xb), axis=2, keepdims=True)
            safe = np.where((amax > 0) & np.isfinite(amax), amax, 1.0)
            e_floor = np.floor(np.log2(safe))
            e_f32 = np.floor(np.log2(safe.astype(f32)).astype(f32)).astype(np.float64)

            def quant(e, big_to_zero=False):
                sc = np.ldexp(1.0, (e - 2).astype(np.int64))
                m = np.abs(xb) / sc
                d = np.abs(m[..., None] - grid)
                best = np.argmin(d + 1e-12 * (np.arange(8) % 2), axis=-1)  # ties to the even code
                v = np.sign(xb) * grid[best] * sc
                if big_to_zero:
                    v = np.where(m > 6, 0.0, v)
                return np.where(amax > 0, v, 0.0).reshape(x.shape)

            out.append(("activation quotients above 6 read as 0 (no saturation to 6)", "clamp",
                        quant(e_floor, big_to_zero=True)))
            out.append(("activation block exponent floor(log2(amax)) computed in float32 (rounds up just below 2^k)",
                        "scale", quant(e_f32)))
    out += amax_hypotheses(case, declared, x)  # amax rounded before the scale (bf16/fp16, up to 2^k)
    return out


# -- the analysis ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RowProbe:
    """What every step of the own-rows analysis runs and judges with: the case, its declaration, the kernel.

    ``run(x, bias)``: the backend's ``run`` on the prepared case; ``judge(X, Y, bias, decl)`` -> (reference
    outputs, outside-the-interval mask) of rows X with outputs Y under ``decl``; ``W``: the declared weights
    [N, K] (exact); ``reference_parts(X, bias)``: the declared reference's intermediates (``x_tie``,
    ``x_scale``, ``x_zero_point``) for rows X; ``bias``: the case's bias."""

    case: Case
    declared: Declared
    run: Run
    judge: Judge
    W: np.ndarray
    reference_parts: "Callable[[np.ndarray, np.ndarray | None], dict]"
    bias: "np.ndarray | None" = None

    @property
    def out_dtype(self) -> str:
        return self.declared.output or self.case.output_dtype

    def run_alone(self, X: np.ndarray) -> np.ndarray:
        """The kernel's outputs of rows X, each run alone (M = 1), float64 [rows, N]."""
        return np.concatenate([np.asarray(self.run(X[i:i + 1], self.bias), np.float64) for i in range(len(X))])

    def classes(self, X: np.ndarray, bias: "np.ndarray | None") -> list[list[str]]:
        """``row_classes`` of rows X, from the declared reference's intermediates with ``bias``."""
        parts = self.reference_parts(X, bias)
        return row_classes(self.case, X, parts.get("x_tie"), parts.get("x_scale"), parts.get("x_zero_point"))


@dataclasses.dataclass(frozen=True)
class _RowsRun:
    """The case's rows run alone: which (``rows``, indices into the case), their inputs ``X``, outputs ``Y``, the
    declared reference ``exp`` and outside mask ``bad``, the failing ones (``fail``) and those that failed in
    the case's own call of M rows (``together``)."""

    rows: np.ndarray
    X: np.ndarray
    Y: np.ndarray
    exp: np.ndarray
    bad: np.ndarray
    fail: np.ndarray
    together: np.ndarray


def analyze_own_rows(probe: RowProbe, x: np.ndarray, probe_rows: "tuple | None" = None) -> "dict | None":
    """Run the case's own rows ``x`` alone and name the row classes and the quantizer rule behind the failure.

    ``probe_rows``: (rows, outside mask) of the probe rows whose quantization is exact, already run: they join
    the class table as rows of their classes."""
    case, declared = probe.case, probe.declared
    if case.spec.activations not in ("int8", "mxfp4") or x is None or not len(x):
        return None
    if case.spec.activations == "int8" and declared.value("act_granularity") == "per_tensor":
        return {"ok": True, "skipped": "one activation scale for the whole tensor: the rows are not independent",
                "findings": [], "n": 0}
    rr = _run_rows_alone(probe, np.asarray(x, np.float32))
    fail, bad, rows = rr.fail, rr.bad, rr.rows
    res: dict = {"ok": not fail.any(), "rows": rows.tolist(), "n": int(bad.size), "n_bad": int(bad.sum()),
                 "failing_rows": rows[fail].tolist(), "findings": []}
    together = _alone_vs_together(case, rr)
    if together:
        res["alone_vs_together"] = together
    classes = probe.classes(rr.X, probe.bias)
    _classify(probe, res, rr, classes, probe_rows)
    if not fail.any():
        return res
    fits = _rules_that_fit(probe, rr)
    if len(fits) > 1:  # rows on which the rules that fit disagree, run alone: keep the rules that still fit
        fits, n_disc = _discriminate(probe, fits, rr.X[fail])
        if n_disc:
            res["discriminating_rows"] = n_disc
    res["findings"].append(_rule_finding(res, fits, f"rows {_list(rows[fail].tolist())} (of {case.M}) run alone",
                                         int(bad.sum())))
    res["scale"] = _scale_readback(probe, rr.X[fail][:4], rows[fail][:4])
    for s in [s for s in res["scale"] if s.get("off")][:2]:
        res["findings"].append({"where": f"row {s['row']} (its amax element alone)", "pattern": s["text"],
                                "n": int(probe.W.shape[0])})
    return res


def _run_rows_alone(probe: RowProbe, x: np.ndarray) -> _RowsRun:
    """The case's own call (its M rows) first: which rows fail as the case ran; then at most MAX_OWN_ROWS rows
    (failing rows first) each run alone and judged."""
    y_all = np.asarray(probe.run(x, probe.bias), np.float64)
    _, bad_all = probe.judge(x, y_all, probe.bias, probe.declared)
    fail_all = bad_all.any(axis=1)
    order = list(np.nonzero(fail_all)[0]) + list(np.nonzero(~fail_all)[0])
    rows = np.array(sorted(order[:MAX_OWN_ROWS]), np.int64)
    X = x[rows]
    Y = probe.run_alone(X)
    exp, bad = probe.judge(X, Y, probe.bias, probe.declared)
    return _RowsRun(rows, X, Y, exp, bad, bad.any(axis=1), fail_all[rows])


def _alone_vs_together(case: Case, rr: _RowsRun) -> "str | None":
    """Where rows fail alone but not in the case's call, or the other way round (None: the same rows fail)."""
    if np.array_equal(rr.together, rr.fail):
        return None
    alone_only = rr.rows[rr.fail & ~rr.together].tolist()
    if alone_only:
        return f"rows {_list(alone_only)} fail alone (M = 1) but pass in the case's call of M = {case.M} rows"
    return (f"rows {_list(rr.rows[rr.together & ~rr.fail].tolist())} fail in the case's call of M = {case.M} rows "
            "but pass alone (M = 1): the rows are not independent (a scale or state spanning rows)")


def _classify(probe: RowProbe, res: dict, rr: _RowsRun, classes: list, probe_rows: "tuple | None") -> None:
    """The class table (the case's rows and the exact probe rows: how many of each class fail and pass) into
    ``res``; where rows fail, the classes every failing row has, ordered by how few passing rows share them."""
    all_classes, all_fail = list(classes), list(rr.fail)
    if probe_rows is not None and len(probe_rows[0]):
        all_classes += probe.classes(probe_rows[0], None)
        all_fail += list(np.asarray(probe_rows[1]).any(axis=1))
        res["probe_rows_in_table"] = int(len(probe_rows[0]))
    table = {}
    for c, f in zip(all_classes, all_fail):
        for name in c:
            t = table.setdefault(name, [0, 0])
            t[0 if f else 1] += 1
    res["classes"] = [{"class": k, "fail": v[0], "pass": v[1]} for k, v in table.items()]
    res["row_classes"] = {int(r): c for r, c in zip(rr.rows, classes)}
    if not rr.fail.any():
        return
    # the classes every failing row has, and how many passing rows share them
    common = set(classes[int(np.nonzero(rr.fail)[0][0])])
    for c, f in zip(classes, rr.fail):
        if f:
            common &= set(c)
    confined = sorted((k for k in common if k != "ordinary row"),
                      key=lambda k: (table[k][1], _PRIORITY.index(k) if k in _PRIORITY else len(_PRIORITY)))
    res["failing_classes"] = confined
    res["passing_classes"] = sorted({k for c, f in zip(all_classes, all_fail) if not f for k in c})
    res["passing_without"] = {k: sum(1 for c, f in zip(all_classes, all_fail) if not f and k not in c) for k in confined}


def _rules_that_fit(probe: RowProbe, rr: _RowsRun) -> list:
    """(exact matches, -index, name, part, declaration or None) of the rules that explain the rows, best first:
    vocabulary values (judged with their own interval) and named bugs (within 1 ulp), on the failing rows first
    and as many passing rows as the reference budget allows."""
    case, out_dtype = probe.case, probe.out_dtype
    hyps = hypotheses(case, probe.declared)
    cap = max(2, MAX_HYPOTHESIS_MACS // max(1, case.N * case.K * (len(hyps) + 4)))
    keep = np.sort(np.r_[np.nonzero(rr.fail)[0], np.nonzero(~rr.fail)[0]][:cap])
    Xh, Yh, exp_h = rr.X[keep], rr.Y[keep], rr.exp[keep]
    fits = []
    for name, part, d in hyps:
        try:
            hexp, hbad = probe.judge(Xh, Yh, probe.bias, d)
        except Exception:  # noqa: BLE001 - a declaration the reference cannot evaluate on these rows
            continue
        if hbad.any() or np.array_equal(hexp, exp_h, equal_nan=True):
            continue
        fits.append((int(close(Yh, hexp, out_dtype, 0).sum()), -len(fits), name, part, d))
    b = 0.0 if probe.bias is None else np.asarray(probe.bias, np.float64)[None, :]
    for name, part, deq in _custom(case, probe.declared, Xh):
        with np.errstate(all="ignore"):
            hy = np.asarray(round_to_dtype(deq @ probe.W.T + b, out_dtype), np.float64)
        if close(Yh, hy, out_dtype, 1).all() and not close(exp_h, hy, out_dtype, 0).all():
            fits.append((int(close(Yh, hy, out_dtype, 0).sum()), -len(fits), name, part, None))
    fits.sort(key=lambda f: f[:2], reverse=True)
    return fits


def _rule_finding(res: dict, fits: list, where: str, n_bad: int) -> dict:
    """The finding of the failing rows: the rule that fits best (its part into ``res``), or none named."""
    cls_txt = _class_text(res)
    if not fits:
        return {"where": where, "pattern": "outputs differ; no activation-quantization rule of the vocabulary "
                "explains them" + cls_txt, "n": n_bad}
    res["hypothesis"], res["part"] = fits[0][2], fits[0][3]
    res["candidates"] = [f[2] for f in fits[:4]]
    pattern = f"{res['part']}: the kernel quantizes as {res['hypothesis']}"
    if len(fits) > 1:
        pattern += " (also consistent: " + "; ".join(f[2] for f in fits[1:3]) + ")"
    return {"where": where, "pattern": pattern + cls_txt, "n": n_bad}


def _predict(probe: RowProbe, fit, Xc):
    """A rule's rounded reference outputs on rows Xc (vocabulary rules: their declaration's reference)."""
    name, d = fit[2], fit[4]
    W, bias = probe.W, probe.bias
    if d is not None:
        return probe.judge(Xc, np.zeros((len(Xc), W.shape[0])), bias, d)[0]
    b = 0.0 if bias is None else np.asarray(bias, np.float64)[None, :]
    deq = dict((n, q) for n, _, q in _custom(probe.case, probe.declared, Xc))[name]
    with np.errstate(all="ignore"):
        return np.asarray(round_to_dtype(deq @ W.T + b, probe.out_dtype), np.float64)


def _fits(probe: RowProbe, fit, Xc, Yc) -> bool:
    if fit[4] is not None:
        return not probe.judge(Xc, Yc, probe.bias, fit[4])[1].any()
    return bool(close(Yc, _predict(probe, fit, Xc), probe.out_dtype, 1).all())


def _discriminate(probe: RowProbe, fits, Xf, n_rows: int = 8, seed: int = 3):
    """Among the failing rows scaled by factors in [0.5, 2) (rounded to the activation dtype, so the amax, the
    scale and the quotients move), the rows where the fitting rules predict different outputs; each runs alone
    and the rules that no longer fit are dropped. Returns (fits, rows run)."""
    rng = np.random.default_rng(seed)
    top = fits[:6]
    cand = []
    for r in Xf[:4]:
        for f in rng.uniform(0.5, 2.0, 48):
            cand.append(np.asarray(round_to_dtype(r.astype(np.float64) * f, probe.case.act_dtype), np.float32))
    if not cand:
        return fits, 0
    Xc = np.stack(cand)
    try:
        preds = [_predict(probe, f, Xc) for f in top]
    except Exception:  # noqa: BLE001 - a rule the reference cannot evaluate on these rows: keep the fits as they are
        return fits, 0
    with np.errstate(invalid="ignore"):
        split = np.array([len({tuple(np.nan_to_num(p[i]).round(12)) for p in preds}) for i in range(len(Xc))])
    pick = [i for i in np.argsort(-split, kind="stable") if split[i] > 1][:n_rows]
    if not pick:
        return fits, 0
    Xd = Xc[pick]
    try:
        Yd = probe.run_alone(Xd)
    except Exception:  # noqa: BLE001 - the kernel refused a row: keep the fits as they are
        return fits, 0
    kept = [f for f in top if _fits(probe, f, Xd, Yd)]
    return (kept + [f for f in fits[6:] if kept] if kept else fits), len(pick)


def _class_text(res: dict) -> str:
    fc = res.get("failing_classes") or []
    if not fc:
        return "; the failing rows hold no value class that stresses the quantizer (ordinary rows fail)"
    c = fc[0]
    n_pass = next(t["pass"] for t in res["classes"] if t["class"] == c)
    n_fail = next(t["fail"] for t in res["classes"] if t["class"] == c)
    others = res.get("passing_without", {}).get(c, 0)
    return (f"; every failing row is a row with {c.lower()} ({n_fail} fail, {n_pass} such row(s) pass; "
            + (f"{others} row(s) without it pass)" if others else "no row without it was run)"))


def _list(v, limit: int = 8) -> str:
    v = [int(i) for i in v]
    return ", ".join(map(str, v[:limit])) + (f", ... ({len(v)} in all)" if len(v) > limit else "")


def _scale_readback(probe: RowProbe, X: np.ndarray, rows) -> list:
    """Symmetric int8 / MXFP4: each failing row's amax element alone (its column and sign) gives outputs
    y[n] = round(D * W[n, k]): the interval of D those outputs leave, against the declared dequantized amax
    and the values other scale rules give (int8: D = 127 * scale)."""
    from emulator.activations import int8 as a8
    from emulator.formats import mxfp4

    case, declared, run, W, out_dtype = probe.case, probe.declared, probe.run, probe.W, probe.out_dtype
    int8 = case.spec.activations == "int8"
    if int8 and not int8_variant(declared, case).symmetric:
        return []
    res = []
    for r, xr in zip(rows, X):
        fin = np.where(np.isfinite(xr), np.abs(xr.astype(np.float64)), -1.0)
        k = int(np.argmax(fin))
        if fin[k] <= 0:
            continue
        p = np.zeros((1, xr.size), np.float32)
        p[0, k] = xr[k]
        try:
            y = np.asarray(run(p, None), np.float64)[0]
        except Exception:  # noqa: BLE001 - a kernel that refuses the probe: no scale readback
            continue
        lo, hi = _d_interval(y, W[:, k], out_dtype)
        if lo is None or not (np.isfinite(lo) and np.isfinite(hi)):  # records are strict JSON: no Infinity
            continue
        a = float(abs(xr[k]))
        f32 = np.float32
        if int8:
            q = a8.quantize_int8_per_token(p, int8_variant(declared, case))
            d_decl = abs(float(a8.dequantize_int8_per_token(q)[0, k]))
            rules = {"amax/127": float(f32(a) / f32(127)), "amax/127.5": float(f32(a) / f32(127.5)),
                     "amax/128": float(f32(a) / f32(128)), "amax * fl32(1/127)": float(f32(a) * (f32(1) / f32(127))),
                     "amax/127 in bfloat16": float(round_to_dtype(np.float64(f32(a) / f32(127)), "bfloat16")),
                     "amax/127 in float16": float(round_to_dtype(np.float64(f32(a) / f32(127)), "float16"))}
            seen = {n: 127 * s for n, s in rules.items()}
            what = f"scale in [{lo / 127:.9g}, {hi / 127:.9g}] (D = 127 * scale), declared {d_decl / 127:.9g}"
        else:
            codes, sb = mxfp4.quantize_mxfp4(p, mx_variant(declared, case))
            d_decl = abs(float(mxfp4.dequantize_mxfp4(codes, sb, dtype=np.float64)[0, k]))
            e = int(np.floor(np.log2(a))) - 2
            grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
            seen = {}
            for de in (-1, 0, 1):
                m = a / 2.0 ** (e + de)
                j = np.argmin(np.abs(grid - min(m, 6)) + 1e-12 * (np.arange(8) % 2))  # ties to the even code
                seen[f"block scale 2^{e + de}"] = float(grid[j] * 2.0 ** (e + de))
            what = f"dequantized amax in [{lo:.9g}, {hi:.9g}], declared {d_decl:.9g} (block scale 2^{e})"
        inside = lo <= d_decl <= hi
        match = [n for n, d in seen.items() if lo <= d <= hi]
        text = (f"the kernel's {what}" + (f"; consistent with {', '.join(match)}" if match else "")
                + ("" if inside else ": the activation scale is off"))
        res.append({"row": int(r), "amax": a, "lo": lo, "hi": hi, "declared": d_decl, "off": not inside,
                    "consistent": match, "text": text})
    return res


def _d_interval(y: np.ndarray, w: np.ndarray, dtype: str):
    """[lo, hi] of |D| with y[n] = round(D * w[n]) (one rounding to ``dtype``) for the finite nonzero w[n]."""
    m = np.isfinite(y) & np.isfinite(w) & (w != 0)
    if not m.any():
        return None, None
    u = _ulp_of(y[m], dtype)
    with np.errstate(all="ignore"):
        a = np.abs((y[m] - u / 2) / w[m])
        b = np.abs((y[m] + u / 2) / w[m])
    lo, hi = float(np.max(np.minimum(a, b))), float(np.min(np.maximum(a, b)))
    return (lo, hi) if lo <= hi else (None, None)
