"""``qconform selftest``: prove the suite catches kernel bugs (mutation testing).

Semantics: docs/selftest.md. The suite's cases (the ``ci`` profile by default) run
against *mutant backends* (conformance/selftest/doubles/mutants.py): the emulator with one planted bug
each, modelled on bugs real kernels have had, each declaring the arithmetic a correct
kernel would. A mutant is *killed* by a tier at the first case of that tier whose
verdict is ``fail``, ``crash`` or ``timeout``; the tier then stops for that mutant
(the table reports, per tier, the number of cases and the seconds it took to kill).
Only the cases a mutant's bug can affect run (its schemes and its ``live`` predicate).

The mutation score is the share of mutants killed; the target is 100 %, with every
mutant killed by a deterministic tier (exact, edge or golden), so no kill depends on
a lucky random draw. A survivor is a gap in the suite, closed by a case, never by
removing the mutant.

``--fast`` (the CI test, tests/conformance/test_selftest.py) runs only the
deterministic tiers and stops each mutant at its first kill. The control mutant
(``bug=none``: the same pipeline without a bug) must survive every case it runs: it
proves the kills come from the bugs.

Mutants run in this process (``-j N``: N worker processes, one mutant at a time
each), created directly; ``--isolate`` runs each through ``python -m
conformance.run.worker --backend mutant:bug=NAME`` with
``QCONFORM_EXTRA_BACKENDS=mutant=conformance.selftest.doubles.mutants:MutantBackend``, as ``qconform
run`` runs a backend. Neither puts a mutant in the default registry.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from backends.base import Declared

from conformance.cases.suite import PROFILES, TIERS, CaseSpec, case_list
from conformance.judge.verdict import Verdict

__all__ = ["DETERMINISTIC", "KILLING", "SelftestOptions", "run_selftest", "mutant_specs", "format_table", "format_markdown",
           "register"]

DETERMINISTIC = ("exact", "edge", "golden")
#: the verdicts that kill a mutant (``Verdict.bad``), in the order the report names them
KILLING = tuple(v.value for v in (Verdict.FAIL, Verdict.CRASH, Verdict.TIMEOUT))
#: passes that show a mutant came close: outside the declared interval only by tie flips, or at its edge
NEAR_MISS = (Verdict.PASS_WITH_TIE_FLIPS.value, Verdict.QUALITY_WARNING.value)


def _mutants():
    from conformance.selftest.doubles import mutants

    return mutants


def select_mutants(patterns=None) -> list[str]:
    """Mutant names matching any of the fnmatch ``patterns`` (all mutants when None or empty)."""
    names = _mutants().mutant_names()
    if not patterns:
        return names
    out = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if "none" in patterns:
        out.append("none")
    unknown = [p for p in patterns if p != "none" and not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if unknown:
        raise ValueError(f"no mutant matches {', '.join(unknown)}; known: {', '.join(names)}")
    return out


_SPECS: dict = {}


def _profile_specs(profile: str, tiers: tuple) -> list:
    """The profile's case list, computed once per process (nightly's fresh seeds stay fixed for the run)."""
    key = (profile, tiers)
    if key not in _SPECS:
        # the mutants are linear-kernel bugs; the quantize-only cases (no weights, no matmul) have their own
        # planted-defect tests (tests/conformance/test_quantize_only.py)
        _SPECS[key] = [s for s in case_list(tiers=tiers, profile=profile) if not s.case.spec.quantize_only]
    return _SPECS[key]


def mutant_specs(name: str, profile: str = "ci", tiers=TIERS) -> dict:
    """tier -> the profile's cases (in case-list order) that the mutant's bug can affect."""
    m = _mutants().get(name)
    specs = _profile_specs(profile, tuple(tiers))
    return {t: [s for s in specs if s.tier == t and m.applies(s.case)] for t in tiers}


# -- evaluating one case ------------------------------------------------------------------------------
class _Cache:
    """Inputs and declared intervals shared by the mutants a process runs (both are read-only)."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self.inputs: dict = {}
        self.intervals: dict = {}

    def get_inputs(self, spec: CaseSpec):
        inp = self.inputs.get(spec.case_id)
        if inp is None:
            if len(self.inputs) >= self.limit:
                self.inputs.clear()
            inp = self.inputs[spec.case_id] = spec.inputs()
        return inp

    def get_interval(self, spec: CaseSpec, inp, declared: Declared):
        from conformance.judge.verdict import judged_against

        key = (spec.case_id, json.dumps(declared.to_json(), sort_keys=True))
        iv = self.intervals.get(key)
        if iv is None:
            if len(self.intervals) >= self.limit:
                self.intervals.clear()
            iv = self.intervals[key] = judged_against(inp, declared)  # as the runner judges
        return iv


def _judge(spec, inp, y, declared, cache) -> tuple[str, str]:
    from conformance.judge.verdict import judge

    try:
        iv = cache.get_interval(spec, inp, declared)
    except Exception as e:  # noqa: BLE001 - the declaration itself cannot be evaluated
        return Verdict.CRASH.value, f"reference failed for this declaration: {type(e).__name__}: {e}"
    j = judge(inp, iv, np.asarray(y, np.float32), declared)
    return j.verdict.value, j.reason


class _InProcess:
    """Runs a mutant created directly (``conformance.selftest.doubles.mutants.MutantBackend``) in this process."""

    def __init__(self, name: str, cache: _Cache):
        from conformance.selftest.doubles.mutants import MutantBackend

        self.backend = MutantBackend(bug=name)
        self.cache = cache

    def evaluate(self, spec: CaseSpec) -> tuple[str, str]:
        inp = self.cache.get_inputs(spec)
        b = self.backend
        sup = b.can_implement(inp.case)
        if not sup.ok:
            return Verdict.UNSUPPORTED.value, sup.reason
        declared = Declared(**b.declared(inp.case).to_json())  # the same JSON round trip as the worker's
        try:
            y = b.run(b.prepare(inp.case, inp.tensors), inp.x, bias=inp.bias, router_logits=inp.router_logits)
        except Exception as e:  # noqa: BLE001 - a raising backend is a crash, as in qconform run
            return Verdict.CRASH.value, f"backend raised {type(e).__name__}: {e}"
        return _judge(spec, inp, y, declared, self.cache)

    def close(self) -> None:
        pass


class _Isolated:
    """Runs a mutant in a worker subprocess registered through QCONFORM_EXTRA_BACKENDS."""

    def __init__(self, name: str, cache: _Cache, timeout: float):
        import tempfile

        from conformance.selftest.doubles.mutants import EXTRA_BACKENDS_ENTRY

        from conformance.run.workerclient import WorkerClient
        from conformance.run.workerproc import WorkerProcess

        extra = os.environ.get("QCONFORM_EXTRA_BACKENDS", "")
        env = {"QCONFORM_EXTRA_BACKENDS": ",".join(x for x in (extra, EXTRA_BACKENDS_ENTRY) if x)}
        self.worker = WorkerClient(WorkerProcess(f"mutant:bug={name}", env=env), timeout)
        self.cache = cache
        self.timeout = timeout
        self.tmp = Path(tempfile.mkdtemp(prefix="qconform-selftest-"))

    def evaluate(self, spec: CaseSpec) -> tuple[str, str]:
        from emulator.tensorfile import load_tensors

        plan = self.worker.plan(spec)
        if plan.failure is not None:
            return _failed(plan.failure), f"planning failed: {plan.failure.error}"
        if not plan.supported:
            return Verdict.UNSUPPORTED.value, plan.reason
        declared = plan.declared
        out = self.tmp / "y.safetensors"
        if out.exists():
            out.unlink()
        reply = self.worker.run(out, spec=spec)
        if reply.failure is not None:
            return _failed(reply.failure), reply.failure.error
        inp = self.cache.get_inputs(spec)
        return _judge(spec, inp, load_tensors(out)["y"].data, declared, self.cache)

    def close(self) -> None:
        self.worker.close()
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)


def _failed(failure) -> str:
    """A worker request that failed: timeout, else crash (a malformed output too, as before the client)."""
    return Verdict.TIMEOUT.value if failure.kind == "timeout" else Verdict.CRASH.value


# -- one mutant -------------------------------------------------------------------------------------
def _run_tier(runner, specs: list) -> dict:
    rec = {"cases": len(specs), "run": 0, "killed": False, "seconds": 0.0,
           "near_misses": {v: 0 for v in NEAR_MISS}, "other": {}}
    t0 = time.perf_counter()
    for i, spec in enumerate(specs, 1):
        verdict, reason = runner.evaluate(spec)
        rec["run"] = i
        if verdict in NEAR_MISS:
            rec["near_misses"][verdict] += 1
        elif verdict not in (Verdict.PASS.value, *KILLING):
            rec["other"][verdict] = rec["other"].get(verdict, 0) + 1
        if verdict in KILLING:
            rec.update(killed=True, cases_to_kill=i, seconds_to_kill=round(time.perf_counter() - t0, 4),
                       case_id=spec.case_id, verdict=verdict, reason=reason)
            break
    rec["seconds"] = round(time.perf_counter() - t0, 4)
    return rec


_PROCESS_CACHE: _Cache | None = None


def run_mutant(name: str, profile: str = "ci", tiers=TIERS, *, fast: bool = False, isolate: bool = False,
               timeout: float = 120.0) -> dict:
    """Run one mutant tier by tier (a fresh backend per tier); in ``fast`` mode stop at its first kill."""
    global _PROCESS_CACHE
    if _PROCESS_CACHE is None:
        _PROCESS_CACHE = _Cache()
    cache = _PROCESS_CACHE
    m = _mutants().get(name)
    by_tier = mutant_specs(name, profile, tiers)
    out = {"name": m.name, "title": m.title, "source": m.source, "schemes": list(m.schemes), "tiers": {}}
    t0 = time.perf_counter()
    for tier in tiers:
        specs = by_tier[tier]
        if fast and any(r.get("killed") for r in out["tiers"].values()):
            out["tiers"][tier] = {"cases": len(specs), "run": 0, "killed": False, "skipped": True}
            continue
        runner = _Isolated(name, cache, timeout) if isolate else _InProcess(name, cache)
        try:
            out["tiers"][tier] = _run_tier(runner, specs)
        finally:
            runner.close()
    killers = [t for t in tiers if out["tiers"][t].get("killed")]
    out.update(killed=bool(killers), killed_by=killers, deterministic=any(t in DETERMINISTIC for t in killers),
               seconds=round(time.perf_counter() - t0, 3))
    return out


def _task(args) -> dict:
    name, profile, tiers, fast, isolate, timeout = args
    return run_mutant(name, profile, tiers, fast=fast, isolate=isolate, timeout=timeout)


# -- the whole run ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SelftestOptions:
    """Which mutants the self-test runs, on which cases, and how (docs/selftest.md); ``qconform selftest``'s
    options build one."""

    profile: str = "ci"
    tiers: "list | None" = None  # None: every tier (``fast``: the deterministic ones, exact, edge, golden)
    mutants: "list | None" = None  # names or globs; None: every mutant
    fast: bool = False
    jobs: int = 1
    isolate: bool = False  # each mutant in worker processes, as the runner runs a backend
    timeout: float = 120.0
    control: bool = False  # also run the bug-free control, which must not be killed


def run_selftest(options: "SelftestOptions | None" = None, *, progress=None, **fields) -> dict:
    """Run the selected mutants (all by default) and return the report (see docs/selftest.md).

    ``options`` (SelftestOptions; its fields may also be given as keywords, which replace the options');
    ``progress(row, done, total)`` is called after each mutant.
    """
    opts = dataclasses.replace(options or SelftestOptions(), **fields)
    profile, tiers, mutants, fast = opts.profile, opts.tiers, opts.mutants, opts.fast
    jobs, isolate, timeout, control = opts.jobs, opts.isolate, opts.timeout, opts.control
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    tiers = tuple(tiers) if tiers else (("exact", "edge", "golden") if fast else TIERS)
    for t in tiers:
        if t not in TIERS:
            raise ValueError(f"unknown tier {t!r}; known: {', '.join(TIERS)}")
    names = select_mutants(mutants)
    if control and "none" not in names:
        names = names + ["none"]
    # biggest first, so the last job to finish is a short one
    sizes = {n: sum(len(v) for v in mutant_specs(n, profile, tiers).values()) for n in names}
    order = sorted(names, key=lambda n: -sizes[n])
    args = [(n, profile, tiers, fast, isolate, timeout) for n in order]
    t0 = time.perf_counter()
    results: dict = {}
    jobs = max(1, int(jobs))
    if jobs == 1 or len(args) == 1:
        for a in args:
            results[a[0]] = _task(a)
            if progress:
                progress(results[a[0]], len(results), len(args))
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
        for k in saved:  # one BLAS thread per worker process: -j is the parallelism
            os.environ[k] = "1"
        try:
            with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as ex:
                futs = {ex.submit(_task, a): a[0] for a in args}
                for f in as_completed(futs):
                    results[futs[f]] = f.result()
                    if progress:
                        progress(results[futs[f]], len(results), len(args))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    wall = time.perf_counter() - t0
    listed = [results[n] for n in names if n != "none"]
    report = {"profile": profile, "tiers": list(tiers), "fast": fast, "isolate": isolate, "jobs": jobs,
              "mutants": listed, "score": _score(listed, tiers), "wall_seconds": round(wall, 2)}
    if "none" in results:
        report["control"] = results["none"]
    return report


def _score(rows: list, tiers) -> dict:
    n = len(rows)
    killed = sum(r["killed"] for r in rows)
    det = sum(r["deterministic"] for r in rows)
    per = {t: sum(bool(r["tiers"][t].get("killed")) for r in rows) for t in tiers}
    return {"mutants": n, "killed": killed, "killed_deterministic": det,
            "mutation_score": round(100.0 * killed / n, 1) if n else 0.0,
            "deterministic_score": round(100.0 * det / n, 1) if n else 0.0,
            "killed_per_tier": per,
            "survivors": [r["name"] for r in rows if not r["killed"]],
            "not_killed_deterministically": [r["name"] for r in rows if not r["deterministic"]]}


def ok(report: dict) -> bool:
    """Every mutant killed by a deterministic tier, and the control (if run) killed by nothing."""
    good = all(r["deterministic"] for r in report["mutants"])
    if "control" in report:
        good = good and not report["control"]["killed"]
    return good


# -- output -----------------------------------------------------------------------------------------
def _cell(t: dict) -> str:
    if t.get("skipped"):
        return "(not run)"
    if not t["cases"]:
        return "n/a"
    if t.get("killed"):
        return f"{t['cases_to_kill']} / {t['seconds_to_kill']:.3f}s"
    return f"survived ({t['run']})"


def format_table(report: dict) -> str:
    tiers = report["tiers"]
    w = max([len(r["name"]) for r in report["mutants"]] + [6])
    lines = [f"{'mutant':{w}s}  " + "  ".join(f"{t:>16s}" for t in tiers) + "  deterministic"]
    for r in report["mutants"] + ([report["control"]] if "control" in report else []):
        lines.append(f"{r['name']:{w}s}  " + "  ".join(f"{_cell(r['tiers'][t]):>16s}" for t in tiers)
                     + f"  {'yes' if r['deterministic'] else ('-' if r['name'] == 'none' else 'NO')}")
    s = report["score"]
    lines.append("")
    lines.append("cells: cases to kill / seconds to kill (first fail, crash or timeout of the tier; the tier stops "
                 "there); survived (cases run); n/a: no case of the tier can show the bug")
    lines.append(f"mutation score ({report['profile']} profile, tiers {', '.join(tiers)}): "
                 f"{s['killed']}/{s['mutants']} killed ({s['mutation_score']:.1f} %)")
    lines.append(f"killed by a deterministic tier (exact, edge or golden): {s['killed_deterministic']}/{s['mutants']} "
                 f"({s['deterministic_score']:.1f} %)")
    lines.append("kills per tier: " + ", ".join(f"{t} {n}" for t, n in s["killed_per_tier"].items()))
    if s["survivors"]:
        lines.append("SURVIVED (a gap in the suite): " + ", ".join(s["survivors"]))
    if s["not_killed_deterministically"]:
        lines.append("NOT KILLED BY A DETERMINISTIC TIER: " + ", ".join(s["not_killed_deterministically"]))
    if "control" in report:
        c = report["control"]
        lines.append("control (no bug): " + ("KILLED: the mutant pipeline itself is wrong: "
                                             + "; ".join(f"{t}: {c['tiers'][t].get('case_id')}: "
                                                         f"{c['tiers'][t].get('reason')}" for t in c["killed_by"])
                                             if c["killed"] else
                                             f"survived all {sum(t['run'] for t in c['tiers'].values())} cases"))
    lines.append(f"wall time {report['wall_seconds']:.1f} s, -j {report['jobs']}")
    return "\n".join(lines)


def format_markdown(report: dict) -> str:
    tiers = report["tiers"]
    head = "| mutant | planted bug | modelled on | " + " | ".join(tiers) + " |"
    lines = [head, "|" + " --- |" * (3 + len(tiers))]
    for r in report["mutants"]:
        cells = []
        for t in tiers:
            c = r["tiers"][t]
            if c.get("skipped"):
                cells.append("not run")
            elif not c["cases"]:
                cells.append("n/a")
            elif c.get("killed"):
                cells.append(f"**{c['cases_to_kill']}** / {c['seconds_to_kill']:.3f} s")
            else:
                cells.append(f"survived ({c['run']})")
        lines.append(f"| `{r['name']}` | {r['title']} | {r['source']} | " + " | ".join(cells) + " |")
    s = report["score"]
    lines.append("")
    lines.append(f"Mutation score ({report['profile']} profile): {s['killed']}/{s['mutants']} "
                 f"({s['mutation_score']:.1f} %); killed by a deterministic tier: {s['killed_deterministic']}/"
                 f"{s['mutants']} ({s['deterministic_score']:.1f} %). Kills per tier: "
                 + ", ".join(f"{t} {n}" for t, n in s["killed_per_tier"].items()) + ".")
    if "control" in report:
        c = report["control"]
        lines.append("")
        lines.append("Control (`none`, the same pipeline without a bug): " + (
            "killed by " + ", ".join(c["killed_by"]) + " (the harness is wrong)" if c["killed"] else
            f"passes all {sum(t['run'] for t in c['tiers'].values())} cases it can run."))
    return "\n".join(lines) + "\n"


# -- command line -----------------------------------------------------------------------------------
def cmd_selftest(args) -> int:
    mod = _mutants()
    if args.list:
        for name in mod.mutant_names():
            m = mod.get(name)
            print(f"{name:28s} [{', '.join(m.schemes)}] {m.title}\n{'':28s} modelled on: {m.source}")
        return 0
    tty = sys.stderr.isatty() and not args.no_progress

    def progress(r, done, total):
        if tty:
            sys.stderr.write(f"\r[{done}/{total}] {r['name'][:40]:40s} "
                             f"{'killed by ' + ','.join(r['killed_by']) if r['killed'] else 'SURVIVED':30s}")
            sys.stderr.flush()

    control = (not args.fast) if args.control is None else args.control
    options = SelftestOptions(profile=args.profile, tiers=args.tier, mutants=args.mutant, fast=args.fast,
                              jobs=args.jobs, isolate=args.isolate, timeout=args.timeout, control=control)
    report = run_selftest(options, progress=progress)
    if tty:
        sys.stderr.write("\n")
    print(format_table(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"JSON -> {args.json}")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(format_markdown(report), encoding="utf-8")
        print(f"markdown table -> {args.markdown}")
    return 0 if ok(report) else 1


def register(sub, services) -> None:
    s = sub.add_parser("selftest", help="mutation self-test: run the suite against mutant backends (one planted "
                                        "bug each) and report which tier kills each")
    s.add_argument("--profile", default="ci", choices=sorted(PROFILES))
    s.add_argument("--tier", action="append", choices=TIERS, help="restrict to these tiers (repeatable)")
    s.add_argument("--fast", action="store_true",
                   help="CI mode: deterministic tiers only (exact, edge, golden); stop each mutant at its first kill")
    s.add_argument("--mutant", action="append", metavar="PATTERN",
                   help="only mutants matching this fnmatch pattern (repeatable; 'none' is the control)")
    s.add_argument("-j", "--jobs", type=int, default=1, help="worker processes (one mutant at a time each)")
    s.add_argument("--isolate", action="store_true",
                   help="run each mutant in a conformance.run.worker subprocess (as qconform run does)")
    s.add_argument("--timeout", type=float, default=120.0, help="per-case timeout with --isolate (seconds)")
    s.add_argument("--control", dest="control", action="store_true", default=None,
                   help="also run the bug-free control (default: on, except with --fast)")
    s.add_argument("--no-control", dest="control", action="store_false")
    s.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    s.add_argument("--markdown", metavar="FILE", help="write the table as Markdown (docs/selftest.md)")
    s.add_argument("--list", action="store_true", help="list the mutants and what each is modelled on")
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(fn=cmd_selftest)
