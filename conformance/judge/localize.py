"""Failure localization: explain a failing case in the terms of its inputs (weights, activations, epilogue).

Semantics: docs/conformance.md#failure-localization. ``localize(case, tensors, declared, run, bias)``
runs *probes* through the backend on the case's own packed weights (``run(x, bias)`` is the backend's
``run`` on the prepared case: the isolated worker calls it, conformance/run/worker.py op ``localize``, and
``qconform replay`` through that worker) and judges each output as the verdict does (inside the interval of
one declared rounding, computed by the emulator):

1. weight readback: one-hot activation rows (value v at column k, zero elsewhere; v chosen so the
   scheme's activation quantization is exact: 1 for 16-bit and MXFP4 activations, 127 or 255 for int8,
   checked with the emulator's quantizer) give output [k, n] = v * W[n, k] rounded to the output dtype:
   the kernel's effective weights, diffed per row, group, zero point, scale block and field position
   (conformance/judge/localize_weights.py);
2. activation quantization (int8 and MXFP4 activations): rows whose quantization is exact (integer
   multiples of 2^j with amax 127 * 2^j; E2M1 values times 2^e with block amax 6 * 2^e: the rows and the
   hypotheses below are conformance/judge/localize_exact.py's); a mismatch there
   with weights read back exact is in the activation quantization or the epilogue, and named where a
   hypothesis (scale amax/128, zero point sign flipped or ignored, a per-token or per-channel factor)
   explains it;
   a weight readback that differs runs again at a second value (3 v first): a product rounded to a dtype,
   round(v w), is told from a weight rounded to it, v round(w) (conformance/judge/localize_weights.py);
3. the case's own activation rows (``x``; int8 and MXFP4 activations), one at a time: classified by value
   class and matched against every other value of the activation-quantization vocabulary
   (conformance/judge/localize_acts.py);
4. bias: all-zero activation rows with the case's bias (bias added twice, missing, subtracted).

Probes run in chunks of the case's M rows, so the kernel takes the same path (M = 1 decode kernels
too). The result is a JSON-able dict; conformance/judge/localize_text.py renders it (console, reports, replay).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from emulator.activations import int8 as a8
from emulator.declaration import int8_variant, round_weights
from emulator.numerics.floats import round_to_dtype

from backends.base import Case, Declared

from conformance.judge.acceptance import declared_interval
from conformance.cases.inputs import CaseInputs
from conformance.judge.localize_acts import QUANTIZER_CLASSES, RowProbe, analyze_own_rows
from conformance.judge.localize_exact import (AZP_CORRECTION, INT_DOT, OUTPUT_RTZ, act_hypotheses, analyze_rows,
                                              exact_activation_rows, one_hot_value, round_output,
                                              second_value)
from conformance.judge.localize_epilogue import OwnOutput, epilogue_hypotheses, int_bias_hypotheses
from conformance.judge.localize_moe import localize_moe
from conformance.judge.localize_rows import RowReadback, row_pattern, shift_for
from conformance.judge.localize_weights import Structure, analyze_weights, close, product_or_weight, structure

__all__ = ["localize", "to_json", "WEIGHTS_OR_ACTIVATIONS", "MAX_PROBE_COLUMNS"]

#: stages whose finding means the arithmetic after them (accumulation) cannot be judged from the output
WEIGHTS_OR_ACTIVATIONS = ("weights", "activation quantization", "weights or activation quantization")
#: at most this many one-hot columns (the first and last groups and a spread of the rest beyond it)
MAX_PROBE_COLUMNS = 1024
#: at most this many kernel calls of M rows per probe; beyond it the chunks grow (whole multiples of M)
MAX_CALLS = 256

Run = Callable[[np.ndarray, "np.ndarray | None"], np.ndarray]


#: at most this many weights (N * K) are decomposed; a larger case is not localized (replay a smaller one)
MAX_WEIGHTS = 1 << 25
#: multiply-adds the emulator spends on the one-hot probe's reference (probe columns * N * K) at most
MAX_PROBE_MACS = 1 << 31


def _probe_columns(case: Case) -> np.ndarray:
    K = case.K
    # at most MAX_CALLS calls of exactly M rows: a chunk of more rows would take another kernel path (M = 1 decode)
    budget = int(min(MAX_PROBE_COLUMNS, max(1, case.M) * MAX_CALLS,
                     max(64, MAX_PROBE_MACS // max(1, case.N * K))))
    if K <= budget:
        return np.arange(K)
    g = min(max(case.group, 32), budget // 8)
    edge = np.r_[np.arange(min(2 * g, K)), np.arange(max(0, K - 2 * g), K)]
    rest = np.linspace(0, K - 1, max(0, budget - edge.size)).astype(np.int64)
    return np.unique(np.r_[edge, rest])


class _Prober:
    """Runs probe rows through the backend and the emulator in the same chunks of M rows."""

    def __init__(self, case: Case, tensors: dict, declared: Declared, run: Run):
        self.case, self.tensors, self.declared, self.run = case, tensors, declared, run

    def chunks(self, n: int):
        m = max(1, self.case.M)
        step = m * max(1, -(-n // (m * MAX_CALLS)))
        return [(i, min(i + step, n), step) for i in range(0, n, step)]

    def __call__(self, X: np.ndarray, bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(observed, reference, outside) [rows, N] for probe rows X (float32 act_dtype values): the
        reference rounded once to the output dtype, and where the output is outside the declared interval
        (the judged interval of conformance/judge/verdict.py's ``judge``: one declared rounding)."""
        xs, ys = [], []
        for a, b, step in self.chunks(len(X)):
            x = np.zeros((step, X.shape[1]), np.float32)
            x[: b - a] = X[a:b]
            y = np.asarray(self.run(x, bias), np.float64)
            if y.shape != (step, self.case.N):
                raise ValueError(f"probe output shape {list(y.shape)}, expected {[step, self.case.N]}")
            xs.append(x)
            ys.append(y)
        # rows are independent unless one activation scale spans the tensor: then the chunks the kernel saw
        groups = ([np.concatenate(xs)], [np.concatenate(ys)]) if not self._per_tensor() else (xs, ys)
        obs, exp, bad = [], [], []
        for x, y in zip(*groups):
            e, b = self.judge(x, y, bias)
            obs.append(y)
            exp.append(e)
            bad.append(b)
        n = len(X)
        return _rows(obs, xs, n), _rows(exp, xs, n), _rows(bad, xs, n)

    def _interval(self, X: np.ndarray, bias, declared: "Declared | None" = None):
        from conformance.judge.verdict import reference_declaration, rounded_interval  # the verdict's own intervals

        ref_decl = reference_declaration(self.case, declared or self.declared)
        inp = CaseInputs(dataclasses.replace(self.case, M=len(X)), 0, self.tensors, np.asarray(X, np.float32), bias)
        return rounded_interval(declared_interval(inp, ref_decl), ref_decl)  # one declared rounding

    def judge(self, X: np.ndarray, y: np.ndarray, bias, declared: "Declared | None" = None):
        """(reference, outside) [rows, N] of outputs ``y`` of rows X judged as the verdict judges them, under
        ``declared`` (default: the backend's declaration): the reference rounded once to the output dtype and
        where ``y`` lies outside the declared interval (one declared rounding)."""
        iv = self._interval(X, bias, declared)
        nonfinite = ~np.isfinite(iv.y_exact)
        with np.errstate(invalid="ignore"):
            same = (np.isnan(iv.y_exact) & np.isnan(y)) | (np.isinf(iv.y_exact) & (y == iv.y_exact))
            inside = np.where(nonfinite, same, (y >= iv.lo) & (y <= iv.hi))
        return np.where(nonfinite, iv.y_exact, iv.y_ref), ~inside

    def parts(self, X: np.ndarray, bias) -> dict:
        """The declared reference's intermediates for rows X (``x_tie``, ``x_scale``, ...)."""
        return self._interval(X, bias).intermediates()

    def _per_tensor(self) -> bool:
        return self.case.spec.activations == "int8" and self.declared.value("act_granularity") == "per_tensor"


def _rows(parts: list, xs: list, n: int) -> np.ndarray:
    """The first n real probe rows of the chunked outputs (each chunk's padding rows dropped)."""
    out, seen, step = [], 0, len(xs[0])
    full = np.concatenate(parts)
    for i in range(len(xs)):
        take = min(step, n - seen)
        out.append(full[i * step: i * step + take])
        seen += take
    return np.concatenate(out)


# -- the whole localization ------------------------------------------------------------------------------------
def localize(case: Case, tensors: dict, declared: Declared, run: Run, bias: np.ndarray | None = None,
             x: np.ndarray | None = None, router_logits: np.ndarray | None = None) -> dict:
    """Probe the backend (``run``) on the case's own weights and say which stage is wrong, and how; ``x``: the
    case's own activation rows (int8 and MXFP4 activations: run one at a time, conformance/judge/localize_acts.py);
    MoE (``router_logits`` given, ``run(x, bias, router_logits=...)``): conformance/judge/localize_moe.py."""
    if case.spec.activations == "moe" and router_logits is not None and not case.spec.quantize_only:
        return localize_moe(case, tensors, declared, lambda a, b, r: run(a, b, router_logits=r), x, router_logits,
                            bias)
    if case.spec.quantize_only or case.spec.activations == "moe":
        return {"stage": "not localized", "summary": f"no localization for {case.scheme} yet", "probes": []}
    if case.N * case.K > MAX_WEIGHTS:
        return {"stage": "not localized", "probes": [],
                "summary": f"not localized: N*K = {case.N * case.K} weights exceed {MAX_WEIGHTS} (replay a smaller case)"}
    st = structure(case, tensors, declared)
    if st is None:
        return {"stage": "not localized", "summary": f"no weight decomposition for {case.weight_format}",
                "probes": []}
    W_decl = round_weights(st.W, declared) if case.spec.activations == "a16" else st.W
    p = _Probing(_Prober(case, tensors, declared, run), st, W_decl, bias)
    loc: dict = {"probes": [], "stage": None}
    readback = _weights_step(p, loc)
    weights = readback.weights if readback is not None else None
    acts, exact_rows = _activations_step(p, readback, loc)
    own = _own_rows_step(p, x, weights, exact_rows, loc)
    bias_res = _bias_step(p, loc)
    whole = None
    # a one-hot row holds one product per output: a product rounded to X and an output rounded through X first
    # read back alike, so the case's own output (sums of many products) is judged too
    single = (weights or {}).get("rounding", {}).get("what") in ("product", "either")
    if x is not None and (weights is None or weights["ok"] or single) and not (own and own.get("hypothesis")) and (
            acts is None or acts["ok"]) and (bias_res is None or bias_res["ok"]):
        whole = _own_output_step(p, x, loc)
    loc["stage"], loc["summary"] = _conclude(case, weights, acts, bias_res, own)
    if loc.get("output_rows"):  # the rows of every call: whatever the other probes show, this is the first bug
        f = loc["output_rows"]["findings"][0]
        also = "" if loc["stage"] == "accumulation or output rounding" else f"; besides: {loc['summary']}"
        loc["stage"], loc["summary"] = "output rows", f"output rows wrong: {f['pattern']}{also}"
    if whole and whole.get("hypothesis") and loc["stage"] == "accumulation or output rounding":
        loc["stage"], loc["summary"] = whole["stage"], whole["summary"]
    elif whole and whole.get("stage") == "epilogue" and single:
        loc["stage"], loc["summary"] = "epilogue", (whole["summary"] + " (the one-hot readback, one product per "
                                                    "output, cannot tell a rounded product from a rounded output)")
    return loc


@dataclasses.dataclass(frozen=True)
class _Probing:
    """What every step of one localization probes with: the prober (the case, its declaration, the kernel),
    the case's weight decomposition ``st``, its declared weights ``W`` [N, K] as the product sees them, and
    its bias."""

    prober: _Prober
    st: Structure
    W: np.ndarray
    bias: "np.ndarray | None"

    @property
    def case(self) -> Case:
        return self.prober.case

    @property
    def declared(self) -> Declared:
        return self.prober.declared

    @property
    def out_dtype(self) -> str:
        return self.declared.output or self.case.output_dtype


@dataclasses.dataclass(frozen=True)
class _Readback:
    """The one-hot weight readback: value ``v`` at columns ``ks`` (rows ``X``), the outputs ``obs`` and their
    outside mask ``bad``, the bias the kernel needed (``bias_in``, None: probed without), and the findings."""

    v: float
    ks: np.ndarray
    X: np.ndarray
    obs: np.ndarray
    bad: np.ndarray
    bias_in: "np.ndarray | None"
    weights: dict

    @property
    def b64(self):
        return 0.0 if self.bias_in is None else np.asarray(self.bias_in, np.float64)[None, :]


def _weights_step(p: _Probing, loc: dict) -> "_Readback | None":
    """1. weights: the one-hot readback, diffed (conformance/judge/localize_weights.py); where it differs, a second
    value tells a rounded product from a rounded weight, and a truncated output is tried."""
    case, declared = p.case, p.declared
    v = one_hot_value(case, declared)
    if v is None:
        return None
    ks = _probe_columns(case)
    X = np.zeros((ks.size, case.K), np.float32)
    X[np.arange(ks.size), ks] = v
    try:
        obs1, exp1, bad1 = p.prober(X, None)
        bias_in = None
    except Exception:  # noqa: BLE001 - a kernel that needs its bias: probe with it and expect it
        obs1, exp1, bad1 = p.prober(X, p.bias)
        bias_in = p.bias
    rows_found = None
    if bad1.any():  # an output row of every call wrong (an M tail) reads like wrong columns: told apart first
        rows_found, obs1, exp1, bad1 = _output_rows(p, X, (obs1, exp1, bad1), bias_in)
    b64 = 0.0 if bias_in is None else np.asarray(bias_in, np.float64)[None, :]

    def to_output(Wh: np.ndarray, cols: np.ndarray) -> np.ndarray:
        Wr = round_weights(Wh, declared) if case.spec.activations == "a16" else Wh
        with np.errstate(invalid="ignore", over="ignore"):
            return round_output(v * Wr + (b64.T if bias_in is not None else 0.0), p.out_dtype)

    weights = analyze_weights(p.st, obs1.T, exp1.T, bad1.T, ks, case, to_output)
    weights["probed_columns"] = int(ks.size)  # "read back exact" covers these columns only
    if rows_found is not None:
        loc["output_rows"] = {"ok": False, "findings": [rows_found], "n": int(bad1.size)}
        loc["probes"].append("output rows: the same one-hot rows shifted inside the kernel's calls of M rows")
    rb = _Readback(v, ks, X, obs1, bad1, bias_in, weights)
    v2 = None if weights["ok"] else second_value(case, declared, v)
    if v2 is not None:
        v2 = _product_or_weight(p, rb, v2)
    if not weights["ok"] and bad1.any():
        # the one-hot products need rounding (v * w off the output grid): is it truncated instead?
        with np.errstate(invalid="ignore", over="ignore"):
            exact1 = v * p.W[:, ks].T + (b64 if bias_in is not None else 0.0)
        rtz = round_to_dtype(exact1, p.out_dtype, "rtz")
        if close(obs1, rtz, p.out_dtype, 0)[bad1].all():
            weights["explained_by"] = OUTPUT_RTZ
    loc["probes"].append(f"weight readback: {ks.size} one-hot row(s) of value {v:g} (columns "
                         f"{'all' if ks.size == case.K else f'{ks.size} of {case.K}'}), in chunks of M={case.M}")
    if v2 is not None:
        loc["probes"].append(f"weight readback: the same {ks.size} one-hot row(s) at value {v2:g} (a rounded "
                             "product and a rounded weight differ there)")
    loc["weights"] = weights
    return rb


def _output_rows(p: _Probing, X: np.ndarray, first: tuple, bias_in):
    """(finding or None, obs, exp, bad): the one-hot readback run again with its rows shifted inside the kernel's
    calls (conformance/judge/localize_rows.py); where the failing rows follow the row position, the rows
    that failed there are replaced by their shifted readback (at a passing position) for the weight diff."""
    obs1, exp1, bad1 = first
    n = len(X)
    step = p.prober.chunks(n)[0][2]
    pos1 = np.arange(n) % step
    P = np.unique(pos1[bad1.any(axis=1)])
    s = shift_for(P, step) if 0 < P.size < step else 0
    if not s or p.prober.chunks(n + s)[0][2] != step:
        return None, obs1, exp1, bad1
    X2 = np.concatenate([np.zeros((s, X.shape[1]), np.float32), X])
    try:
        obs2, exp2, bad2 = (a[s:] for a in p.prober(X2, bias_in))
    except Exception:  # noqa: BLE001 - the kernel refused the shifted readback: the first one stands
        return None, obs1, exp1, bad1
    pos2 = (np.arange(n) + s) % step
    found = row_pattern(RowReadback(bad1, obs1, pos1, step), RowReadback(bad2, obs2, pos2, step))
    if found is None:
        return None, obs1, exp1, bad1
    finding, hit = found
    take = hit & ~np.isin(pos2, P)  # read those columns where the shifted run put them on a passing row
    obs, exp, bad = obs1.copy(), exp1.copy(), bad1.copy()
    obs[take], exp[take], bad[take] = obs2[take], exp2[take], bad2[take]
    bad[hit & ~take] = False  # at a failing position in both runs: not read
    return finding, obs, exp, bad


def _off_failing_rows(loc: dict, bad: np.ndarray, step: int) -> np.ndarray:
    """``bad`` without the rows at the call positions the output-row finding already explains."""
    rows = (loc.get("output_rows") or {}).get("findings")
    if not rows:
        return bad
    return bad & ~np.isin(np.arange(len(bad)) % step, rows[0]["rows"])[:, None]


def _product_or_weight(p: _Probing, rb: _Readback, v2: float) -> "float | None":
    """A rounded product or a rounded weight? (round(v w) and v round(w) differ at the second value v2): the
    answer into the readback's findings; v2, or None where the kernel refused the second readback."""
    weights = rb.weights
    try:
        obs2, _, _ = p.prober(rb.X * np.float32(v2 / rb.v), rb.bias_in)
        pw = product_or_weight(p.W[:, rb.ks].T, [(rb.v, rb.obs), (v2, obs2)], p.out_dtype, rb.b64)
    except Exception:  # noqa: BLE001 - the kernel refused the second readback: the first one's findings stand
        pw, v2 = None, None
    if pw is not None:
        weights["rounding"] = pw
        finding = {"where": "every probed weight", "pattern": pw["pattern"], "n": weights["n_bad"]}
        if pw["what"] == "product":
            weights["explained_by"] = pw["pattern"]
        weights["findings"] = [finding]
    return v2


def _activations_step(p: _Probing, rb: "_Readback | None", loc: dict) -> "tuple[dict | None, tuple | None]":
    """2. activation quantization (int8 / MXFP4 activations): rows whose declared quantization is exact, matched
    against the activation and epilogue hypotheses. (findings or None, (rows, outside mask) or None)."""
    case, declared, st = p.case, p.declared, p.st
    Xa = exact_activation_rows(case, declared)
    if Xa is None:
        return None, None
    obs, exp, bad = p.prober(Xa, None)
    step = p.prober.chunks(len(Xa))[0][2]
    bad = _off_failing_rows(loc, bad, step)
    wq = ((st.q, st.scale[:, 0]) if st.kind == "int" and st.n_groups == 1 and not np.any(st.zero)
          and case.spec.activations == "int8" else None)
    acts = analyze_rows(obs, exp, bad, act_hypotheses(case, declared, Xa, p.W, step, wq), p.out_dtype)
    if acts.get("hypothesis") and rb is not None and not rb.weights["ok"]:
        # the same activation bug on the one-hot rows: does it explain the weight readback too? (of the
        # hypotheses that fit the exact rows, the first that does is the one named)
        one_hot = dict(act_hypotheses(case, declared, rb.X, p.W, p.prober.chunks(len(rb.X))[0][2], wq))
        fit = [(int(close(rb.obs, one_hot[n], p.out_dtype, 0).sum()), -i, n) for i, n in enumerate(acts["candidates"])
               if close(rb.obs, one_hot[n], p.out_dtype, 2).all()]
        acts["explains_weight_readback"] = bool(fit)
        if fit:  # the one matching most read-back elements exactly
            name = max(fit)[2]
            acts["hypothesis"] = acts["findings"][-1]["pattern"] = rb.weights["explained_by"] = name
    acts.pop("candidates", None)
    loc["activations"] = acts
    loc["probes"].append(f"activation quantization: {len(Xa)} row(s) whose declared quantization is exact")
    return acts, (Xa, bad)


def _own_rows_step(p: _Probing, x, weights: "dict | None", exact_rows: "tuple | None", loc: dict) -> "dict | None":
    """3. the case's own activation rows, one at a time (int8 / MXFP4 activations; the weights read back right):
    conformance/judge/localize_acts.py."""
    case, declared, st = p.case, p.declared, p.st
    if not (x is not None and case.spec.activations in ("int8", "mxfp4") and declared.arithmetic != "opaque" and (
            weights is None or weights["ok"] or weights.get("explained_by"))):
        return None
    try:
        W_own = st.build() if st.kind == "int" else p.W  # (q - z) * s in float64: the integer dots' weights
        rows = RowProbe(case, declared, run=p.prober.run, judge=p.prober.judge, W=W_own,
                        reference_parts=p.prober.parts, bias=p.bias)
        own = analyze_own_rows(rows, x, exact_rows)
    except Exception as e:  # noqa: BLE001 - the kernel raised on a row alone: the other findings stand
        own = {"ok": True, "skipped": f"not run ({type(e).__name__}: {e})"[:300], "findings": [], "n": 0}
    if own is not None:
        loc["own_rows"] = own
        if own.get("rows"):
            loc["probes"].append(f"own rows: the case's rows {_short(own['rows'])} run alone (M = 1), "
                                 "classified by value class")
    return own


def _bias_step(p: _Probing, loc: dict) -> "dict | None":
    """4. bias: all-zero activation rows with the case's bias (added twice, not added, subtracted)."""
    bias, case, out_dtype = p.bias, p.case, p.out_dtype
    if bias is None:
        return None
    Z = np.zeros((max(1, case.M), case.K), np.float32)
    obs, exp, bad = p.prober(Z, bias)
    bad = _off_failing_rows(loc, bad, p.prober.chunks(len(Z))[0][2])
    b = np.asarray(bias, np.float64)[None, :]
    base = exp - round_to_dtype(np.broadcast_to(b, exp.shape), out_dtype)
    hyps = [(n, round_to_dtype(base + f * b, out_dtype)) for n, f in
            (("bias added twice", 2.0), ("bias not added", 0.0), ("bias subtracted instead of added", -1.0))]
    hyps += [(f"bias added {c} times (once per split-K partial or tile, not once)", round_to_dtype(base + c * b, out_dtype))
             for c in range(3, 17)]
    hyps += [(f"bias rounded to {X} before the add (a bias buffer typed {X})",
              round_to_dtype(base + round_to_dtype(np.broadcast_to(b, exp.shape), X), out_dtype))
             for X in ("bfloat16", "float16") if X != out_dtype]
    bias_res = analyze_rows(obs, exp, bad, hyps, out_dtype)
    loc["bias"] = bias_res
    loc["probes"].append("bias: all-zero activation rows with the case's bias")
    if bias_res.get("hypothesis") == "bias not added" and p.st.kind == "int" and p.st.n_groups == 1 and (
            case.spec.activations == "int8"):  # on a zero row sx = 0: a bias folded into the integer dot vanishes too
        _int_bias(p, bias_res, loc)
    return bias_res


def _int_bias(p: _Probing, bias_res: dict, loc: dict) -> None:
    """The bias on rows whose activation quantization is exact (sx > 0): a bias folded into the int32 accumulator
    replaces the zero rows' 'bias not added' (conformance/judge/localize_epilogue.py)."""
    Xa = exact_activation_rows(p.case, p.declared)
    if Xa is None:
        return
    try:
        obs, exp, bad = p.prober(Xa, p.bias)
    except Exception:  # noqa: BLE001 - the kernel refused the probe: the zero rows' finding stands
        return
    sx = a8.quantize_int8_per_token(Xa.astype(np.float32), int8_variant(p.declared, p.case)).scale
    hyps = int_bias_hypotheses(Xa, p.W, p.bias, sx, p.st.scale[:, 0], p.out_dtype)
    res = analyze_rows(obs, exp, bad, hyps, p.out_dtype)
    loc["probes"].append("bias: rows whose activation quantization is exact, with the case's bias")
    if res.get("hypothesis") and res["hypothesis"] != "bias not added":
        bias_res["hypothesis"] = res["hypothesis"]
        bias_res["findings"] = [dict(f, where=f"{f['where']} (rows whose quantization is exact)")
                                for f in res["findings"]]


def _own_output_step(p: _Probing, x, loc: dict) -> "dict | None":
    """5. the case's own output under other declarations of the epilogue / activation dtype, and a skipped
    product (run where no earlier step found anything)."""
    try:
        whole = _own_output(p.case, p.declared, p.prober.run, p.prober, x, p.bias, p.W)
    except Exception as e:  # noqa: BLE001 - the kernel raised on its own rows: the other findings stand
        whole = {"ok": True, "skipped": f"not run ({type(e).__name__}: {e})"[:300], "findings": [], "n": 0}
    if whole is not None:
        loc["own_output"] = whole
        loc["probes"].append("own output: the case's rows as the run gave them, judged under other declarations "
                             "(" + ", ".join(whole.get("tried", [])) + ")")
    return whole


#: the output-side declarations tried on the case's own rows: (value key, title, stage)
_OWN_OUTPUT_ALTERNATIVES = (("bias_stage", "after_output_rounding", "epilogue",
                             "the bias added to the already rounded output, in the output dtype"),
                            ("act_compute_dtype", "bfloat16", "activations",
                             "the activations rounded to bfloat16 before the product"),
                            ("act_compute_dtype", "float16", "activations",
                             "the activations rounded to float16 before the product"))


def _own_output(case: Case, declared: Declared, run: Run, prober: "_Prober", x: np.ndarray, bias, W: np.ndarray):
    """The case's own rows run as the case runs them; when they fail, the declarations (bias_stage,
    act_compute_dtype) under whose interval every element lies, and, for 16-bit activations, a product with a
    zero weight skipped (NaN/Inf x 0 never formed). One kernel call plus at most four interval computations."""
    X = np.asarray(x, np.float32)
    y = np.asarray(run(X, bias), np.float64)
    if y.shape != (len(X), case.N):
        return None
    _, bad = prober.judge(X, y, bias)
    res: dict = {"ok": not bad.any(), "n_bad": int(bad.sum()), "n": int(bad.size), "findings": [], "tried": []}
    if not bad.any():
        return res
    fits = []
    for key, value, stage, what in _OWN_OUTPUT_ALTERNATIVES:
        if key == "bias_stage" and (bias is None or declared.value("bias_stage") == value):
            continue
        if key == "act_compute_dtype" and (case.spec.activations != "a16" or case.act_dtype == value
                                           or declared.act_compute_dtype == value
                                           or (case.act_dtype == "bfloat16" and value == "float16")):
            continue
        d = (dataclasses.replace(declared, act_compute_dtype=value) if key == "act_compute_dtype" else
             dataclasses.replace(declared, variants={**declared.variants, key: value}))
        res["tried"].append(f"{key}={value}")
        try:
            _, bad_d = prober.judge(X, y, bias, d)
        except (ValueError, TypeError):
            continue
        if not bad_d.any():
            fits.append((stage, f"{key}={value} ({what}): every output of the case's own rows lies inside that "
                                f"declaration's interval ({int(bad.sum())} outside the declared one)"))
    if not fits and case.spec.activations == "a16":
        res["tried"].append("products with a zero weight skipped")
        x64 = X.astype(np.float64)
        nonfin = ~np.isfinite(x64)
        if nonfin.any():
            with np.errstate(invalid="ignore", over="ignore"):  # only the products of non-zero weights formed
                yh = np.where(nonfin, 0.0, x64) @ W.T
                for m in np.nonzero(nonfin.any(axis=1))[0]:  # the NaN/Inf activations, row by row
                    kk = np.nonzero(nonfin[m])[0]
                    yh[m] += np.where(W[:, kk] == 0, 0.0, x64[m, kk][None, :] * W[:, kk]).sum(axis=1)
                if bias is not None:
                    yh = yh + np.asarray(bias, np.float64)[None, :]
                ref_nf = nonfin.any(axis=1)[:, None] & np.ones((1, case.N), bool)  # NaN/Inf x 0 is NaN
                same_nf = (np.isnan(yh) & np.isnan(y)) | (np.isinf(yh) & (yh == y)) | (np.isfinite(yh) & np.isfinite(y))
                differs = ref_nf & ~(np.isnan(yh) & np.isnan(y))
            if bad.any() and (bad <= ref_nf).all() and same_nf[bad].all() and differs[bad].all():
                fits.append(("product", "products with a zero weight skipped (a sparsity shortcut): NaN/Inf x 0 is "
                             f"never formed, so {int(bad.sum())} output(s) whose row holds a NaN/Inf activation are "
                             "what the non-zero weights' products alone give (a number or an Inf, not NaN); every "
                             "other output is inside the interval"))
    if not fits:
        res["tried"].append("the output rounded through another dtype, a saturating output, NaN/Inf activations replaced")
        fits += _output_stage_fits(case, declared, prober, (X, y, bad), bias)
    if fits:
        res["stage"], why = fits[0]
        res["hypothesis"] = why
        res["summary"] = f"{fits[0][0]} wrong on the case's own rows: {why}"
        res["findings"] = [{"where": "the case's own rows", "pattern": why, "n": int(bad.sum())}]
    return res


def _output_stage_fits(case: Case, declared: Declared, prober: "_Prober", own: tuple, bias) -> list:
    """[(stage, why)] of the output-stage and activation NaN/Inf hypotheses on the case's own output
    (conformance/judge/localize_epilogue.py)."""
    X, y, bad = own
    iv = prober._interval(X, bias)
    o = OwnOutput(X, y, bad, np.asarray(iv.y_exact, np.float64), declared.output or case.output_dtype, case.act_dtype,
                  lambda Xr, yr: prober.judge(Xr, yr, bias)[1])
    return epilogue_hypotheses(o)


def _short(v: list, limit: int = 8) -> str:
    return ", ".join(map(str, v[:limit])) + (f", ... ({len(v)} in all)" if len(v) > limit else "")


def _finding_text(f: dict) -> str:
    return f"{f['where']}: {f['pattern']}"


def _weights_read(case: Case, weights) -> str:
    """'weights', or 'weights (n of K columns)' where the one-hot readback probed only some columns."""
    n = (weights or {}).get("probed_columns", case.K)
    return "weights" if n >= case.K else f"weights ({n} of {case.K} columns)"


#: the part of the activation quantizer a failing row class points at (when no rule of the vocabulary is named)
_CLASS_PART = {"exact ties after scaling": "rounding of ties", "amax exactly a power of two": "scale",
               "amax one unit below a power of two": "scale", "tiny amax (subnormal scale)": "scale",
               "saturating values": "clamp / saturation", "saturating codes": "clamp / saturation", "zero row": "zero-row guard",
               "NaN/Inf in the row": "NaN/Inf handling", "zero point saturated at the int32 limit": "zero point"}


def _own_rows_verdict(case: Case, own) -> "tuple[str, str] | None":
    """The activation-quantization stage when the case's own rows, run alone, show it: a rule named, or the
    failures confined to a value class only the quantizer sees (rows with ties fail, the others pass)."""
    if not own or own.get("ok") or not own.get("failing_rows"):
        return None
    rows = f"the case's rows {_short(own['failing_rows'])} (of {case.M}) fail alone"
    if own.get("hypothesis"):
        alt = [c for c in own.get("candidates", [])[1:3]]
        return "activation quantization", (f"activation quantization wrong ({own['part']}): {rows}; the kernel "
                                           f"quantizes as {own['hypothesis']}"
                                           + (f" (equally consistent: {'; '.join(alt)})" if alt else "") + _class_note(own))
    fc = [c for c in own.get("failing_classes") or [] if c in QUANTIZER_CLASSES and own["passing_without"].get(c)]
    if fc:
        c = fc[0]
        return "activation quantization", (f"activation quantization wrong ({_CLASS_PART[c]}, by row class): {rows}, "
                                           f"each a row with {c.lower()}; {own['passing_without'][c]} row(s) without "
                                           "it pass (no rule of the vocabulary reproduces the outputs)")
    return None


def _class_note(own: dict) -> str:
    fc = own.get("failing_classes") or []
    if not fc:
        return ""
    t = next(t for t in own["classes"] if t["class"] == fc[0])
    return (f" (every failing row has {fc[0].lower()}; {t['pass']} such row(s) pass, "
            f"{own.get('passing_without', {}).get(fc[0], 0)} without it pass)")


def _conclude(case: Case, weights, acts, bias_res, own=None) -> tuple[str, str]:
    rounding = (weights or {}).get("rounding") or {}
    if rounding.get("what") == "product":
        return "accumulation", f"accumulation wrong: {rounding['pattern']}"
    if rounding.get("what") == "either":
        return "weights or accumulation", f"weights or accumulation wrong: {rounding['pattern']}"
    named_act = acts is not None and not acts["ok"] and acts.get("hypothesis")
    weights_bad = weights is not None and not weights["ok"]
    if weights_bad and weights.get("explained_by") == OUTPUT_RTZ and (acts is None or acts["ok"]
                                                                     or acts.get("hypothesis") == OUTPUT_RTZ):
        return "epilogue", f"epilogue wrong: {OUTPUT_RTZ} (weights right: the one-hot readback is their truncation)"
    if named_act and (not weights_bad or acts.get("explains_weight_readback")):
        name = acts["hypothesis"]
        stage = ("azp correction" if name.startswith(AZP_CORRECTION) else "accumulation" if name.startswith(INT_DOT) else
                 "epilogue" if name.startswith("every output") or name == OUTPUT_RTZ else "activation quantization")
        why = (" (the one-hot weight readback differs by the same bug: weights right)" if weights_bad
               else f" ({_weights_read(case, weights)} read back exact)" if weights is not None else "")
        return stage, f"{stage} wrong on rows whose quantization is exact: {name}{why}"
    unnamed = ("wrong weights (no named pattern)", "wrong by a whole number")
    if (weights_bad and acts is not None and not acts["ok"] and not named_act
            and any(f["pattern"].startswith(unnamed) for f in weights["findings"])):
        # activation-quantized: the one-hot readback passes through the activation quantizer too
        return "weights or activation quantization", (
            "weights or activation quantization wrong: the one-hot weight readback and the rows whose quantization "
            "is exact both differ, with no named pattern: " + "; ".join(_finding_text(f) for f in weights["findings"][:2]))
    if weights_bad:
        also = " (the activation probe differs too, as wrong weights make it)" if acts is not None and not acts["ok"] else ""
        return "weights", "weights wrong: " + "; ".join(_finding_text(f) for f in weights["findings"][:3]) + also
    own_verdict = _own_rows_verdict(case, own)
    if own_verdict and own.get("hypothesis"):  # a rule that explains every row the case has
        return own_verdict
    if acts is not None and not acts["ok"]:
        f = acts["findings"][-1] if acts["findings"] else {"pattern": "outputs differ"}
        stage = "epilogue" if "epilogue" in f["pattern"] else "activation quantization"
        return stage, (f"{stage} wrong on rows whose quantization is exact: {f['pattern']}"
                       + (f" ({_weights_read(case, weights)} read back exact)" if weights is not None else ""))
    if own_verdict:
        return own_verdict
    if bias_res is not None and not bias_res["ok"]:
        return "epilogue", "epilogue wrong: " + "; ".join(f["pattern"] for f in bias_res["findings"][:2])
    checked = [_weights_read(case, weights) if weights is not None else None, "activation quantization" if acts is not None else None,
               "bias" if bias_res is not None else None]
    checked = [c for c in checked if c]
    if own and own.get("alone_vs_together"):
        return ("accumulation or output rounding",
                f"{', '.join(checked) or 'nothing'} read back exact; the case's own rows: {own['alone_vs_together']}: "
                "the kernel path of one row count differs from the other's (product, accumulation, output rounding, "
                "or a state spanning rows)")
    if own and not own.get("ok") and own.get("failing_rows"):
        fc = [c for c in own.get("failing_classes") or [] if c in QUANTIZER_CLASSES]
        how = (f"(each has {fc[0].lower()} and no row without it was run: the quantization of such rows is not "
               "excluded)" if fc else "whatever their value class")
        return ("accumulation or output rounding",
                f"{', '.join(checked) or 'nothing'} read back exact, and the case's own rows fail alone {how}; no "
                "activation-quantization rule of the vocabulary reproduces them: the failure is in the product, the "
                "accumulation or the output rounding")
    return ("accumulation or output rounding",
            f"{', '.join(checked) or 'nothing'} read back exact: the failure is in the product, the accumulation "
            "or the output rounding (or depends on the case's own activations)")


def to_json(loc: dict) -> dict:
    """``loc`` with NumPy scalars made plain (records are JSON)."""
    def plain(o):
        if isinstance(o, dict):
            return {k: plain(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [plain(v) for v in o]
        if isinstance(o, np.generic):
            return o.item()
        return o
    return plain(dataclasses.asdict(loc) if dataclasses.is_dataclass(loc) else loc)
