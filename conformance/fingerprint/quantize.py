"""Fingerprint of a quantize-only backend: which named variants its codes, scales and zero points are
consistent with (docs/fingerprints.md#quantize-only-schemes).

Part of ``qconform fingerprint`` (conformance/fingerprint/decide.py calls ``quantize_scheme_records`` for the
quantize-only schemes). The judgement is exact, so no separating-input search is needed: the probes are
the suite's own inputs for a probe case (every exact, edge and random generator that applies, at M = 8),
each run once by the backend in a worker subprocess; then for each axis of the variant vocabulary that
applies to the scheme, each value is a hypothesis (the backend's declaration with that axis set to the
value), and a value is *consistent* when the emulator's reference under it equals the observed tensors on
every probe (conformance/quantized.decide_quantized), *excluded* (naming the probe) otherwise. Values the
emulator cannot combine with the declaration are listed as inapplicable; values whose references are
identical on every probe are reported as not separated. Numeric axes (qmin, qmax, eps) are not probed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from backends.base import Case, Declared

from conformance.cases.bundle import ReplayBundle, save_bundle
from conformance.cases.generators import GENERATORS, generators_for
from conformance.judge.quantized import decide_quantized, expected_for, load_observed
from conformance.cases.specs import CaseSpec
from conformance.judge.verdict import Verdict
from conformance.run.workerclient import WorkerClient

__all__ = ["probe_cases", "quantize_scheme_records"]


def _agrees(verdict: str) -> bool:
    """The observed tensors equal the expected ones (``mistrusted``: equal, but constant codes)."""
    return Verdict.parse(verdict).agrees


def probe_cases(scheme: str, act_dtype: str) -> list[Case]:
    """The probe cases of a quantize-only scheme (both symmetries for q-int8-token)."""
    M, K = 8, 256
    if scheme == "q-int8-token":
        return [Case(scheme, "none", M, 0, K, group_size=-1, sym=s, act_dtype=act_dtype) for s in (True, False)]
    if scheme == "q-uint8-tensor":
        return [Case(scheme, "none", M, 0, K, group_size=-1, sym=False, act_dtype="float32")]
    return [Case(scheme, "none", M, 0, K, group_size=32, act_dtype=act_dtype)]


def _axes(scheme: str) -> list:
    from emulator.variants import VARIANT_AXES

    return [a for a in VARIANT_AXES.values() if a.applies_to(scheme) and a.kind in ("choice", "bool")]


def _values(a) -> list:
    return list(a.values) if a.kind == "choice" else [False, True]


def quantize_scheme_records(worker, label: str, scheme: str, act_dtype: str, out_dir: Path, timeout: float,
                            axes=None) -> "dict[str, dict]":
    """{scheme key: {"axes": [axis record, ...], "unmodelled_keys": []}} for one quantize-only scheme; the
    key names the symmetry where a scheme has both (``q-int8-token (asym)``)."""
    out = {}
    for case in probe_cases(scheme, act_dtype):
        key = scheme if case.sym or scheme != "q-int8-token" else f"{scheme} (asym)"
        spec = CaseSpec(case, "probe", "fingerprint", 0)
        plan = WorkerClient(worker, timeout).plan(spec)
        if not plan.supported:
            why = plan.reason or (plan.failure.error if plan.failure else "") or "refused"
            out[key] = {"status": "unsupported", "unmodelled_keys": [],
                        "axes": [{"axis": "(every axis)", "title": "the scheme", "status": "unsupported", "reason": why}]}
            continue
        base = plan.declared
        probes, crashed = _run_probes(worker, label, case, out_dir, timeout)
        recs = []
        chosen = [a for a in _axes(scheme) if not axes or a.key in axes]
        for a in chosen or [None]:
            if a is None:  # a scheme without variant axes (q-uint8-tensor): is it the scheme's definition?
                rec = {"axis": "(definition)", "title": "the scheme's own definition", "status": "ok",
                       "case": case.describe(), "declared_arithmetic": base.to_json(), "declared": "canonical"}
            else:
                rec = {"axis": a.key, "title": a.title, "status": "ok", "case": case.describe(),
                       "declared_arithmetic": base.to_json(), "declared": _txt(_declared_value(a, base, case))}
            if crashed:
                rec["crashed_probes"] = crashed
            if not probes:
                rec.update(status="crash", reason="; ".join(crashed)[:500] or "no probe input")
            else:
                rec.update(_decide_axis(a, base, case, probes) if a else _decide_definition(base, case, probes))
                if rec.get("contradiction") is None:
                    rec.pop("contradiction", None)
            recs.append(rec)
        out[key] = {"axes": recs, "unmodelled_keys": []}
    return out


def _decide_definition(base: Declared, case: Case, probes) -> dict:
    bad = [pid for pid, inp, obs in probes if not _agrees(decide_quantized(obs, expected_for(case, inp.x, base))["verdict"])]
    res = {"values": ["canonical"], "consistent": [] if bad else ["canonical"], "unseparated": [],
           "excluded": {"canonical": bad[:3]} if bad else {}}
    if bad:
        res["contradiction"] = f"the declared definition is excluded by probe {', '.join(bad[:3])}"
    return res


def _run_probes(worker, label, case: Case, out_dir: Path, timeout: float):
    """([(probe id, inputs, observed tensors)], [what each failed probe said]) for every generator of ``case``:
    a probe the backend fails on (raises, crashes, malformed output) is named, and the others still decide."""
    probes, crashed = [], []
    for gen in generators_for(case, ("exact", "edge", "random")):
        seed = 1000 + len(probes)
        inp = GENERATORS[gen][1](case, seed)
        pid = f"{case.scheme}{'' if case.sym else '-asym'}/{gen}"
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in pid)
        path = out_dir / "probes" / f"{safe}.safetensors"
        spec = CaseSpec(case, "probe", "fingerprint-" + gen, seed).to_json()
        save_bundle(path, ReplayBundle(inp, spec, backend=label, verdict="probe", reason=f"fingerprint probe {pid}"))
        ypath = out_dir / "probes" / f"{safe}.y.safetensors"
        if ypath.exists():
            ypath.unlink()
        r = WorkerClient(worker, timeout).run(ypath.resolve(), bundle=path.resolve())
        if r.failure is not None:
            crashed.append(f"probe {pid}: {r.failure.kind}: {r.failure.error}"[:300])
            continue  # (a dead worker is restarted by the next request)
        probes.append((pid, inp, load_observed(ypath)))
    return probes, crashed


def _declared_value(a, base: Declared, case: Case):
    """The value the declaration gives axis ``a`` for ``case`` (act_symmetric left silent follows the case)."""
    if a.key == "act_symmetric" and a.key not in base.variants:
        return case.act_symmetric
    return base.value(a.key)


def _txt(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _decide_axis(a, base: Declared, case: Case, probes) -> dict:
    res = _decide_axis_typed(a, base, case, probes)
    for k in ("values", "consistent"):
        res[k] = [_txt(v) for v in res[k]]
    res["excluded"] = {_txt(v): p for v, p in res["excluded"].items()}
    return res


def _decide_axis_typed(a, base: Declared, case: Case, probes) -> dict:
    values, refs, inapplicable = [], {}, {}
    for v in _values(a):
        try:
            hyp = dataclasses.replace(base, variants=dict(base.variants, **{a.key: v}))
            refs[v] = [expected_for(case, inp.x, hyp) for _pid, inp, _obs in probes]
            values.append(v)
        except Exception as e:  # noqa: BLE001 - the emulator's own message is the reason
            inapplicable[str(v)] = f"{type(e).__name__}: {e}"[:300]
    res = {"values": values}
    if inapplicable:
        res["inapplicable"] = inapplicable
    match = {v: [_agrees(decide_quantized(obs, ref)["verdict"]) for (_pid, _inp, obs), ref in zip(probes, refs[v])]
             for v in values}
    # a probe that no value of this axis explains differs on another axis (or in arithmetic the emulator does not
    # model): it says nothing about this axis, so it is set aside and named, never used to exclude a value
    unexplained = [pid for i, (pid, _inp, _obs) in enumerate(probes) if not any(match[v][i] for v in values)]
    if unexplained:
        res["unexplained_probes"] = unexplained
    consistent, excluded = [], {}
    for v in values:
        bad = [pid for i, (pid, _inp, _obs) in enumerate(probes) if not match[v][i] and pid not in unexplained]
        if bad:
            excluded[v] = bad[:3]
        else:
            consistent.append(v)
    unseparated = sorted({tuple(sorted((_txt(u), _txt(w)))) for i, u in enumerate(values) for w in values[i + 1:]
                          if all(_agrees(decide_quantized(x, y)["verdict"]) for x, y in zip(refs[u], refs[w]))})
    res.update(consistent=consistent, excluded=excluded, unseparated=unseparated)
    if len(values) > 1 and len(unseparated) == len(values) * (len(values) - 1) // 2:
        res["status"] = "not-observable"
        res["reason"] = "every value gives the same tensors on every probe"
    dv = _declared_value(a, base, case)
    res["contradiction"] = None
    if dv in excluded:
        res["contradiction"] = (f"declares {a.key}={_txt(dv)}, excluded by probe {', '.join(excluded[dv])}; "
                                f"consistent: {', '.join(map(_txt, consistent)) or 'none'}")
    if unexplained:
        res["note"] = (f"probe(s) {', '.join(unexplained)} match no value of this axis (they differ on another axis "
                       "or in arithmetic the emulator does not model) and were set aside")
    if len(unexplained) == len(probes):
        res.update(status="not-observable", reason="no probe matches any value of this axis")
    return res
