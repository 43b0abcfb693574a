"""Semantic fingerprint of a backend: which named variants its outputs are consistent with.

Semantics: docs/fingerprints.md.

``qconform fingerprint --backend B [--scheme S] [--axis A] [--json FILE] [--out DIR]`` runs
*discriminating probes* -- constructed inputs on which named variants of one semantic axis give
outputs that no single kernel output can match at once -- and reports, per scheme and axis, the
variants the kernel's outputs are consistent with, the variants they exclude (with the probe that
excluded each), and where that contradicts the arithmetic the backend declares.

How one axis is decided:

1. A *hypothesis* is a ``Declared``: the backend's own declaration with the axis (and, where
   they interact, some other axes: ``nuisance``) set to named values. Earlier axes of the same
   scheme are fixed to what their probes found (or, where those were ambiguous, ranged over).
2. Probe inputs are searched for with the emulator: seeded candidate inputs built around the
   axis's boundaries (rounding ties and their neighbours, MX scale-rule boundaries, E2M1
   midpoints, tiny amax below the eps clamps, GPTQ zero fields 0x0/0xF, ...) are kept while they
   *separate* a pair of hypotheses with different axis values not yet separated: on some output
   element the two declared intervals (conformance.judge.acceptance.declared_interval) are disjoint, so
   no output can be inside both.
3. Each probe is written as a replay bundle (conformance/cases/bundle.py) and run by the backend in
   a worker subprocess (conformance.run.runner.WorkerProcess), so a crashing kernel costs one axis,
   not the fingerprint.
4. A hypothesis is *consistent* when the observed output is inside its interval on every probe
   of the axis (conformance.judge.acceptance.compare); a value is consistent when one of its
   hypotheses is. Being a containment test, this is sound whatever the search found: a pair
   the search could not separate shows up as two consistent values, never as a wrong exclusion.

Accumulation precision is the exception: its intervals are nested (a float32 accumulator is
inside the bfloat16 bound too), so its probes are fixed cancellation patterns that make a
coarser accumulator err visibly, and the answer is a bracket: the finest precision whose bound
the output respects, and the finer ones it violates.

The module is split along those steps: axes.py (the probe axes and probe cases), probes.py (candidate
inputs), search.py (hypotheses and the separation search), render.py (text and tables), all in
conformance/fingerprint/; this one runs the probes and decides each axis.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from backends.base import Case, Declared

from conformance.judge.acceptance import compare, declared_interval
from conformance.cases.bundle import ReplayBundle, save_bundle
from conformance.cases.inputs import CaseInputs
from conformance.fingerprint.axes import (PROBE_AXES, SCHEME_AXES, ProbeAxis, candidate_cases, coinciding_values, known_keys,
                               rows_options, values_for_case)
from conformance.fingerprint.axes import DEFAULTS as _DEFAULTS  # noqa: F401 - the old name (test_variant_vocabulary reads it)
from conformance.fingerprint.probes import accumulate_probes, trial_fn, with_rows
from conformance.fingerprint.render import axis_line, format_text, markdown_tables
from conformance.fingerprint.vocab import vocabulary_summary
from conformance.fingerprint.search import (Raises, declared_value, hypotheses, hypothesis_intervals, identify,
                                 search_separating_inputs)
from conformance.run.runner import WorkerProcess
from conformance.cases.suite import CaseSpec

__all__ = ["PROBE_AXES", "SCHEME_AXES", "ProbeAxis", "ProbeOptions", "fingerprint", "register", "format_text", "markdown_tables"]

#: the old name (tests/conformance/test_variant_vocabulary.py reads it from here)
_known_keys = known_keys


# -- running probes -------------------------------------------------------------------------------
class _Prober:
    """Plans and runs probe inputs on one backend in a worker subprocess."""

    def __init__(self, backend: str, out_dir: Path, timeout: float, worker_env: dict | None = None):
        self.backend = backend
        self.out_dir = out_dir
        self.timeout = timeout
        self.worker = WorkerProcess(backend, env=worker_env)
        self._plans: dict = {}
        self.label = backend
        self.hello: dict = {}
        self.last_kind: str | None = None  # the worker's failure kind of the last run (error, crash, ...)

    def start(self) -> dict:
        self.hello = self.worker.request({"op": "hello"}, timeout=self.timeout)
        self.label = self.hello.get("label", self.backend)
        return self.hello

    def plan(self, case: Case) -> dict:
        key = json.dumps(case.to_json(), sort_keys=True)
        if key not in self._plans:
            spec = CaseSpec(case, "probe", "fingerprint", 0)
            self._plans[key] = self.worker.request({"op": "plan", "spec": spec.to_json()}, timeout=self.timeout)
        return self._plans[key]

    def run(self, inp: CaseInputs, pid: str, reason: str) -> tuple[np.ndarray | None, str, str]:
        """(y or None, bundle path, error text)."""
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in pid)
        path = self.out_dir / "probes" / f"{safe}.safetensors"
        spec = CaseSpec(inp.case, "probe", "fingerprint-" + pid.split("/")[1], 0)
        save_bundle(path, ReplayBundle(inp, spec.to_json(), backend=self.label, verdict="probe", reason=reason))
        ypath = self.out_dir / "probes" / f"{safe}.y.safetensors"
        if ypath.exists():
            ypath.unlink()
        r = self.worker.request({"op": "run", "bundle": str(path.resolve()), "out": str(ypath.resolve())},
                                timeout=self.timeout)
        if not r.get("ok"):
            self.last_kind = r.get("kind")
            return None, str(path), f"{r.get('kind')}: {r.get('error', '')}"[:500]
        self.last_kind = None
        from emulator.tensorfile import load_tensors

        return load_tensors(ypath)["y"].data, str(path), ""

    def close(self) -> None:
        self.worker.close()


def _pick_case(prober: _Prober, scheme: str, axis: ProbeAxis, act: str):
    """(case with the row count to use, declared, reasons) for the first candidate the backend implements."""
    reasons = []
    acts = ([axis.act] if axis.act and axis.act != act else []) + [act]
    for cand in (c for a in acts for c in candidate_cases(scheme, axis.probe, a, axis.bias)):
        for M in rows_options(axis.probe):
            case = with_rows(cand, M)
            p = prober.plan(case)
            if not p.get("ok"):
                reasons.append(f"{case.describe()}: plan failed: {p.get('kind')}: {p.get('error', '')[:200]}")
                return None, None, reasons
            if p.get("supported"):
                return case, Declared(**p["declared"]), reasons
            reasons.append(f"{case.describe()}: {p.get('reason', '')}")
    return None, None, reasons


_PREC_ORDER = ("float64", "float32", "float16", "bfloat16")


def _run_axis(prober: _Prober, scheme: str, axis: ProbeAxis, act: str, found: dict, *, max_trials: int, seed: int) -> dict:
    """Decide one axis of ``scheme`` (``found``: the earlier axes' records): a JSON-able record (status, the
    values consistent with the kernel's outputs, those excluded and by which probe, a contradiction of the
    declaration)."""
    res: dict = {"axis": axis.name, "title": axis.title, "status": "ok"}
    case, base, reasons = _pick_case(prober, scheme, axis, act)
    if case is None:
        res.update(status="unsupported", reason="; ".join(reasons[-3:]) or "no probe case")
        return res
    res["case"] = case.describe()
    if base.variants.get("weight_scale_dtype") == case.scale_dtype:  # reading scales in their own dtype
        base = dataclasses.replace(base, variants={k: v for k, v in base.variants.items() if k != "weight_scale_dtype"})
    res["declared_arithmetic"] = base.to_json()
    unmet = _unmet_requirement(axis, found)
    if unmet:
        res.update(status="not-applicable", consistent=[], excluded={}, unseparated=[], reason=unmet)
        return res
    coincide = coinciding_values(axis, case, base)
    if coincide:
        res["coincide"] = coincide
    axis = values_for_case(axis, case, base)
    fixed, ranged = _conditioning(axis, case, found)
    res["fixed"] = {k: v[0] for k, v in fixed.items()}
    res["ranged"] = {k: [v[0] for v in vs] for k, vs in ranged.items()}
    hyps, values = hypotheses(axis, base, fixed, ranged)
    res["values"] = [v for v, _ in values]
    res["value_overrides"] = [(v, ov) for v, ov in values]
    dv = declared_value(axis, base if "act_symmetric" in base.variants or "act_symmetric" not in axis.keys else
                        dataclasses.replace(base, variants={**base.variants, "act_symmetric": case.act_symmetric}))
    if dv is None and len(values) > len(axis.values):
        dv = values[-1][0]
    res["declared"] = dv
    hyps = _evaluable(axis, case, hyps, res, seed)
    if hyps is None:
        return res
    probes, need = _search_probes(axis, case, hyps, max_trials, seed)
    if not probes:
        res.update(status="not-observable", reason="no probe input separates any two values" +
                   (f" ({axis.note})" if axis.note else ""), consistent=list(res["values"]), excluded={},
                   unseparated=[])
        return res
    judged = _run_probes(prober, scheme, axis, probes, hyps, res)
    if judged is not None:
        _decide(res, axis, base, hyps, judged, need)
    return res


def _unmet_requirement(axis: ProbeAxis, found: dict) -> "str | None":
    """Why the axis is not applicable: it acts only under a value an earlier axis of this scheme excluded."""
    if not axis.requires:
        return None
    dep, wanted, why = axis.requires
    f = found.get(dep)
    if f and f.get("consistent") and not any(v.startswith(w) for v in f["consistent"] for w in wanted):
        return f"{why}; {dep} found {', '.join(f['consistent'])}"
    return None


def _conditioning(axis: ProbeAxis, case: Case, found: dict) -> tuple[dict, dict]:
    """(fixed, ranged): earlier axes fixed where their probes were decisive, ranged over where ambiguous, and
    the axis's nuisance axes ranged over; each {axis: (value, overrides)} / {axis: [(value, overrides), ...]}.

    A derived axis takes an ambiguous earlier axis at its identified, else declared, else first consistent
    value: ranging over values that differ elsewhere than its probes only multiplies the hypotheses."""
    fixed, ranged = {}, {}
    for dep in axis.depends:
        f = found.get(dep)
        if not f or not f.get("consistent"):
            continue
        ovs = dict(f["value_overrides"])
        cons = f["consistent"]
        if len(cons) == 1 or axis.derived:
            pick = f.get("identified") or (f.get("declared") if f.get("declared") in cons else cons[0])
            if dep == "accumulate":  # the bracket: the finest precision whose bound the output respects
                pick = min(cons, key=_PREC_ORDER.index) if set(cons) <= set(_PREC_ORDER) else pick
            fixed[dep] = (pick, ovs[pick])
        else:
            ranged[dep] = [(v, ovs[v]) for v in cons]
    for nu in axis.nuisance:
        if nu not in ranged and nu not in fixed:
            ranged[nu] = list(values_for_case(PROBE_AXES[nu], case).values)
    return fixed, ranged


def _evaluable(axis: ProbeAxis, case: Case, hyps: list, res: dict, seed: int) -> "list | None":
    """The hypotheses the emulator can evaluate under this declaration (None: fewer than two values are left,
    ``res`` says so). The others (e.g. a variant that the declared scheme fixes) are not candidates: reported
    apart, never as excluded by a probe; judged on a benign input (one without the NaNs or zero rows a value
    may refuse, see Raises)."""
    benign = dataclasses.replace(axis, modes=("boundary",) if axis.probe == "mx" else ("random",))
    first = accumulate_probes(case)[0] if axis.probe == "accumulate" else trial_fn(benign, case, seed)(0)
    errors = {}
    for h in hyps:
        try:
            declared_interval(first, h.declared)
        except Exception as e:  # noqa: BLE001 - the emulator's own message is the reason
            errors.setdefault(h.value, f"{type(e).__name__}: {e}")
    bad = {v for v in errors if all(hp.value != v or hp.value in errors for hp in hyps)}
    valid_values = [v for v in res["values"] if v not in bad]
    if bad:
        res["inapplicable"] = {v: errors[v][:300] for v in sorted(bad)}
    if len(valid_values) < 2 and axis.probe != "accumulate":
        res.update(status="not-applicable", consistent=valid_values, excluded={}, unseparated=[],
                   reason="the declared arithmetic leaves this axis no choice: " +
                          (next(iter(errors.values()))[:300] if errors else "one value"))
        return None
    res["values"] = valid_values
    return [h for h in hyps if h.value not in bad]


def _search_probes(axis: ProbeAxis, case: Case, hyps: list, max_trials: int, seed: int) -> tuple[list, np.ndarray]:
    """(probe inputs, pairs of hypotheses they were searched to separate); accumulation: its fixed patterns."""
    if axis.probe == "accumulate":
        return accumulate_probes(case), np.zeros((len(hyps), len(hyps)), bool)
    few_rows = axis.probe in ("int8", "int8-asym", "mx") and case.M < 8  # fewer candidates per input: try more inputs
    # (a derived axis's inputs come from a few targeted modes: it gives up sooner)
    patience = (96 if few_rows else 24) // (2 if axis.derived else 1)
    return search_separating_inputs(hyps, trial_fn(axis, case, seed), max_trials * (4 if few_rows else 1),
                                    patience=patience,
                                    min_trials=min(patience, (48 if few_rows else 16) if axis.probe.startswith("int8")
                                                   else 8))


@dataclasses.dataclass(frozen=True)
class _Judged:
    """The probes run and judged: which hypotheses every output lies inside, the probe that excluded each of
    the others, and per probe the hypotheses' intervals and the output (None: refused)."""

    inside: np.ndarray
    excluded_by: dict
    probe_ivs: list
    outputs: list


def _run_probes(prober: _Prober, scheme: str, axis: ProbeAxis, probes: list, hyps: list, res: dict) -> "_Judged | None":
    """Run each probe on the backend and judge its output under every hypothesis (None: a probe crashed,
    ``res`` says which)."""
    inside = np.ones(len(hyps), bool)
    excluded_by: dict[int, str] = {}
    res["probes"] = []
    probe_ivs, outputs = [], []
    for i, inp in enumerate(probes):
        pid = f"{scheme}/{axis.name}/p{i + 1}"
        y, bundle, err = prober.run(inp, pid, f"fingerprint probe {pid}")
        res["probes"].append({"id": pid, "bundle": bundle, "M": inp.case.M, "error": err or None})
        ivs = hypothesis_intervals(inp, hyps)
        probe_ivs.append(ivs)
        outputs.append(y)
        # an error reply is an answer where some hypothesis predicts one (the backend refused the input)
        refused = y is None and prober.last_kind == "error" and any(isinstance(iv, Raises) for iv in ivs)
        if y is None and not refused:
            res.update(status="crash", reason=f"probe {pid}: {err}")
            return None
        for h, iv in enumerate(ivs):
            if not inside[h]:
                continue
            if refused or isinstance(iv, Raises):
                ok = refused and isinstance(iv, Raises)
            else:
                ok = iv is not None and compare(y, iv).ok
            if not ok:
                inside[h] = False
                excluded_by[h] = pid
    return _Judged(inside, excluded_by, probe_ivs, outputs)


def _decide(res: dict, axis: ProbeAxis, base: Declared, hyps: list, judged: _Judged, need: np.ndarray) -> None:
    """Into ``res``: the values consistent with every probe and those excluded (by which probes), the value
    identified, the pairs no probe separated, the accumulation bracket, and a contradiction of the declaration."""
    inside = judged.inside
    consistent = []
    excluded: dict[str, list] = {}
    for v in res["values"]:
        idx = [h for h, hp in enumerate(hyps) if hp.value == v]
        if any(inside[h] for h in idx):
            consistent.append(v)
        else:
            excluded[v] = sorted({judged.excluded_by[h] for h in idx if h in judged.excluded_by})
    res["consistent"] = consistent
    res["excluded"] = excluded
    if axis.probe != "accumulate":  # (the accumulation bracket reports nesting itself)
        ident, how = identify([h for h in range(len(hyps)) if inside[h]], hyps, judged.probe_ivs, judged.outputs)
        if ident is not None:
            res["identified"], res["identified_by"] = ident, how
    # pairs of consistent values that no probe input found could separate (ambiguity of the method,
    # as opposed to values the kernel's output cannot tell apart because of other axes' ambiguity)
    res["unseparated"] = sorted({tuple(sorted((hyps[i].value, hyps[j].value)))
                                 for i, j in zip(*np.nonzero(need)) if inside[i] and inside[j]})
    if axis.name == "accumulate":
        res["bracket"] = _bracket(consistent, excluded)
    dv = res["declared"]
    if axis.name == "accumulate" and base.arithmetic == "opaque":
        # an opaque declaration claims no accumulation (docs/conformance.md#opaque-arithmetic): its
        # accumulate field is no claim a probe could contradict; the bracket is still reported
        res["note"] = "arithmetic=opaque is declared: the accumulation is measured, not checked against a claim"
        dv = None
    if dv is not None and dv in excluded:
        res["contradiction"] = (f"declares {axis.name}={dv}, excluded by probe {', '.join(excluded[dv])}; "
                                f"consistent: {', '.join(consistent) or 'none'}")
    elif dv is not None and not consistent:
        res["contradiction"] = f"no probed value (declared {dv} included) explains the output"
    if not consistent:
        res["note"] = ("no value is consistent: the output also differs from the declaration on another axis "
                       "(or in arithmetic the emulator does not model)")


def _unless_inputs_wrong(prober: _Prober, scheme: str, axis: ProbeAxis, act: str, rec: dict) -> None:
    """Withdraw the accumulation bracket when the failure localization (conformance/judge/localize.py, run by the
    worker on the axis's case) shows the weights or the activation quantization wrong: an accumulator
    cannot be named from outputs whose inputs are already wrong (docs/fingerprints.md)."""
    from conformance.judge.localize import WEIGHTS_OR_ACTIVATIONS

    case, base, _ = _pick_case(prober, scheme, axis, act)
    if case is None:
        return
    spec = CaseSpec(case, "random", "gaussian", 0)  # the case with seeded ordinary weights and activations
    r = prober.worker.request({"op": "localize", "spec": spec.to_json(), "declared": base.to_json()},
                              timeout=prober.timeout)
    loc = r.get("localization") if r.get("ok") else None
    if not loc or loc.get("stage") not in WEIGHTS_OR_ACTIVATIONS:
        return
    for k in ("contradiction", "identified", "identified_by", "bracket"):
        rec.pop(k, None)
    rec.update(status="not-named", consistent=[], excluded={}, unseparated=[], localization=loc,
               reason=f"no accumulation named: {loc['summary']}")


def _bracket(consistent: list, excluded: dict) -> str:
    cons = [p for p in _PREC_ORDER if p in consistent]
    exc = [p for p in _PREC_ORDER if p in excluded]
    if not cons:
        return "no accumulation precision explains the output"
    if cons[0] == "float64":
        return "no accumulation error observed (consistent with float64)"
    finer = [p for p in exc if _PREC_ORDER.index(p) < _PREC_ORDER.index(cons[0])]
    return f"coarser than {finer[-1] if finer else '?'}, within the {cons[0]} bound"


def _unmodelled_keys(declared: dict | None) -> list[str]:
    if not declared:
        return []
    return sorted(k for k in declared.get("variants", {}) if k not in known_keys())


@dataclasses.dataclass(frozen=True)
class ProbeOptions:
    """How the probes of a fingerprint run: ``out_dir`` keeps the probe bundles (and outputs) under
    out_dir/probes (None: a temporary folder), ``timeout`` seconds per probe before the worker is killed,
    ``max_trials`` candidate inputs tried per axis, ``seed`` of the candidate inputs, ``worker_env`` the
    worker's environment (None: this process's)."""

    out_dir: "str | Path | None" = None
    timeout: float = 120.0
    max_trials: int = 60
    seed: int = 0
    worker_env: "dict | None" = None


def fingerprint(backend: str, *, schemes=None, axes=None, act_dtype: str = "bfloat16",
                options: "ProbeOptions | None" = None, log=None) -> dict:
    """Fingerprint ``backend`` (a spec 'name[:k=v,...]'); the result as a JSON-able dict."""
    from emulator.schemes import QUANTIZE_SCHEMES

    options = options or ProbeOptions()
    _check_names(schemes, axes)
    from backends.registry import create

    listed = create(backend).schemes()  # an unknown name or parameter: the caller's error (one line, exit 2)
    tmp = None
    if options.out_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="qconform-fp-")
        out = Path(tmp.name)
    else:
        out = Path(options.out_dir)
        out.mkdir(parents=True, exist_ok=True)
    prober = _Prober(backend, out, options.timeout, options.worker_env)
    t0 = time.perf_counter()
    result = {"backend": backend, "act_dtype": act_dtype, "schemes": {}, "contradictions": []}
    try:
        hello = prober.start()
        result.update(label=prober.label, available=bool(hello.get("available")), version=hello.get("version"),
                      device=hello.get("device"), reason=hello.get("reason") or hello.get("error"))
        if not hello.get("ok") or not hello.get("available"):
            result["status"] = "unavailable"
            return result
        for scheme in (schemes or list(SCHEME_AXES) + [q for q in QUANTIZE_SCHEMES if q in listed]):
            if scheme in QUANTIZE_SCHEMES:  # exact judgement: conformance/fingerprint/quantize.py
                _quantize_scheme(prober, scheme, act_dtype, axes, result, log)
            else:
                result["schemes"][scheme] = _probe_scheme(prober, scheme, act_dtype, axes, options, result, log)
        result["status"] = "ok"
        result["vocabulary"] = vocabulary_summary(result)
        return result
    finally:
        prober.close()
        result["seconds"] = round(time.perf_counter() - t0, 2)
        if tmp is not None:
            tmp.cleanup()


def _check_names(schemes, axes) -> None:
    """ValueError (one line) for a scheme without probes or an unknown axis."""
    from emulator.schemes import QUANTIZE_SCHEMES
    from emulator.variants import VARIANT_AXES

    for s in schemes or ():
        if s not in SCHEME_AXES and s not in QUANTIZE_SCHEMES:
            raise ValueError(f"fingerprint: no probes for scheme {s!r}; known: "
                             f"{', '.join(list(SCHEME_AXES) + list(QUANTIZE_SCHEMES))}")
    for a in axes or ():
        if a not in PROBE_AXES and a not in VARIANT_AXES:
            raise ValueError(f"fingerprint: unknown axis {a!r}; known: {', '.join(PROBE_AXES)}")


def _quantize_scheme(prober: _Prober, scheme: str, act_dtype: str, axes, result: dict, log) -> None:
    """A quantize-only scheme, judged exactly (conformance/fingerprint/quantize.py), into ``result``."""
    from conformance.fingerprint.quantize import quantize_scheme_records

    for key, srec in quantize_scheme_records(prober.worker, prober.label, scheme, act_dtype, prober.out_dir,
                                             prober.timeout, axes).items():
        for rec in srec["axes"]:
            if rec.get("contradiction"):
                result["contradictions"].append(f"{key} {rec['axis']}: {rec['contradiction']}")
            if log:
                log(axis_line(key, rec))
        result["schemes"][key] = srec


def _probe_scheme(prober: _Prober, scheme: str, act_dtype: str, axes, options: ProbeOptions, result: dict,
                  log) -> dict:
    """The record of one scheme: its axes decided in order (each conditioned on the earlier ones found);
    contradictions into ``result``."""
    found: dict = {}
    srec = {"axes": [], "unmodelled_keys": []}
    for name in SCHEME_AXES[scheme]:
        if axes and name not in axes:
            continue
        ax = PROBE_AXES[name]
        t1 = time.perf_counter()
        rec = _run_axis(prober, scheme, ax, act_dtype, found, max_trials=options.max_trials,
                        seed=options.seed + sum(map(ord, scheme + name)))
        if name == "accumulate" and rec["status"] == "ok":
            _unless_inputs_wrong(prober, scheme, ax, act_dtype, rec)
        rec["seconds"] = round(time.perf_counter() - t1, 2)
        if rec["status"] == "ok":
            found[name] = rec
        for k in _unmodelled_keys(rec.get("declared_arithmetic")):
            if k not in srec["unmodelled_keys"]:
                srec["unmodelled_keys"].append(k)
        if rec.get("contradiction"):
            result["contradictions"].append(f"{scheme} {name}: {rec['contradiction']}")
        srec["axes"].append(rec)
        if log:
            log(axis_line(scheme, rec))
    if srec["axes"] and all(a["status"] == "unsupported" for a in srec["axes"]):
        srec["status"] = "unsupported"
    return srec


def _cmd_fingerprint(args) -> int:
    res = fingerprint(args.backend, schemes=args.scheme, axes=args.axis, act_dtype=args.act_dtype,
                      options=ProbeOptions(out_dir=args.out, timeout=args.timeout, max_trials=args.max_trials,
                                           seed=args.seed),
                      log=(lambda s: print(s, file=sys.stderr)) if args.verbose else None)
    print(format_text(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
        print(f"fingerprint JSON -> {args.json}")
    if res.get("status") == "unavailable":
        return 2
    return 1 if res["contradictions"] else 0


def register(sub, services) -> None:
    s = sub.add_parser("fingerprint", help="which named variants a backend's outputs are consistent with "
                                           "(discriminating probes)")
    s.add_argument("--backend", required=True, help="backend spec name[:key=value,...]")
    s.add_argument("--scheme", action="append", help=f"restrict to a scheme ({', '.join(SCHEME_AXES)}); repeatable")
    s.add_argument("--axis", action="append", help="restrict to an axis; repeatable")
    s.add_argument("--act-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    s.add_argument("--json", help="write the fingerprint as JSON to this file")
    s.add_argument("--out", help="keep the probe bundles (and outputs) under DIR/probes")
    s.add_argument("--timeout", type=float, default=120.0, help="seconds per probe before the worker is killed")
    s.add_argument("--max-trials", type=int, default=60, help="candidate inputs tried per axis")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("-v", "--verbose", action="store_true", help="print each axis as it is decided")
    s.set_defaults(fn=_cmd_fingerprint)
