"""The malformed-checkpoint campaign: ``qconform campaign`` (issue #16).

Semantics and the last full run's counts: docs/checkpoints.md ("Malformed-checkpoint campaign").
conformance/campaign/mutations.py makes the inputs; this module runs ``inspect``, ``dequant`` and
``linear`` on each, every run in its own forked process under a wall-clock limit, and sorts
every run into one outcome class:

- ``named``   exit 2 with one line ``qconform <cmd>: error: ...`` naming the checkpoint's file,
              a layer or a tensor;
- ``other``   anything else that is not exit 0 (another exit status, an internal error, a
              message that names nothing, more than one line, a crash);
- ``exit0``   exit 0;
- ``hang``    killed at the time limit;
- ``memory``  peak resident memory over the bound (or a MemoryError).

and checks the campaign's targets: no ``other``, no ``hang``, no ``memory``, and no exit 0
that is a false green: on an input whose mutation must be rejected, or from ``inspect`` /
``linear`` where ``dequant`` of the same layer rejects. The command exits 0 only when every
target holds (and at least one input ran).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import json
import os
import re
import resource
import select
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from conformance.campaign.mutations import MUTATIONS, Input, generate, make_seeds

__all__ = ["Run", "run_isolated", "classify", "run_campaign", "main", "OUTCOMES", "COMMANDS"]

COMMANDS = ("inspect", "dequant", "linear")
OUTCOMES = ("named", "other", "exit0", "hang", "memory")
OUTCOME_TITLES = {"named": "exit 2 naming the problem", "other": "other error", "exit0": "exit 0",
                  "hang": "hang", "memory": "memory over bound"}


@dataclasses.dataclass
class Run:
    rc: "int | None"  # None: killed (time limit) or died
    out: str
    err: str
    seconds: float
    peak_mib: float  # peak resident memory of the child above the parent's at fork
    rss_mib: float = 0.0  # the child's peak resident memory (with the pages it shares with the parent)
    timed_out: bool = False
    signal: "int | None" = None


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _current_rss_mib() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except OSError:  # pragma: no cover - non-Linux
        return _rss_mib()


def run_isolated(fn, args: tuple, *, timeout: float, memory_mib: float) -> Run:
    """Run ``fn(*args) -> (rc, out, err)`` in a forked child: killed after ``timeout`` seconds; its
    address space is capped (a runaway allocation fails fast instead of swapping the host) and its
    peak RSS is measured by the kernel (wait4)."""
    base = _current_rss_mib()
    r, w = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(r)
            limit = int((_vm_mib() + 4 * memory_mib) * 2 ** 20)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            try:
                rc, out, err = fn(*args)
            except MemoryError:
                rc, out, err = None, "", "MemoryError"
            except BaseException as e:  # noqa: BLE001 - reported to the parent as 'other'
                rc, out, err = None, "", f"uncaught {type(e).__name__}: {e}"
            payload = json.dumps({"rc": rc, "out": out[:4000], "err": err[:4000]}).encode()
            with os.fdopen(w, "wb") as f:
                f.write(payload)
        except BaseException:  # noqa: BLE001
            code = 70
        finally:
            os._exit(code)
    os.close(w)
    chunks, deadline, timed_out = [], t0 + timeout, False
    with os.fdopen(r, "rb") as f:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                break
            ready, _, _ = select.select([f], [], [], min(left, 1.0))
            if ready:
                b = os.read(f.fileno(), 1 << 16)
                if not b:
                    break
                chunks.append(b)
    _, status, usage = os.wait4(pid, 0)
    seconds = time.monotonic() - t0
    rss = usage.ru_maxrss / 1024.0
    peak = max(0.0, rss - base)
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    if timed_out:
        return Run(None, "", "", seconds, peak, rss, timed_out=True)
    try:
        doc = json.loads(b"".join(chunks).decode())
    except ValueError:
        return Run(None, "", f"child died (status {status})", seconds, peak, rss, signal=sig)
    return Run(doc["rc"], doc["out"], doc["err"], seconds, peak, rss, signal=sig)


def _vm_mib() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except OSError:  # pragma: no cover
        return 0.0


def _cli(cli_main, argv: list) -> tuple:
    """The qconform CLI entry ``cli_main`` in this (child) process, output captured."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli_main([str(a) for a in argv])
        except SystemExit as e:  # argparse
            rc = e.code if isinstance(e.code, int) else 2
    return rc, out.getvalue(), err.getvalue()


_NAME = re.compile(r"\bmodel\.[A-Za-z0-9_.]*[A-Za-z0-9_]")


def _names(inp: Input) -> list:
    """What an error may name: the input's folder (so any file in it) or its layer; any other
    tensor or layer name (``model.<...>``) is recognised by classify's pattern."""
    return [str(inp.folder), inp.layer]


def classify(command: str, run: Run, names: list, *, memory_mib: float) -> str:
    if run.timed_out:
        return "hang"
    if run.peak_mib > memory_mib or "MemoryError" in run.err:
        return "memory"
    if run.rc == 0:
        return "exit0"
    lines = run.err.strip("\n").split("\n")
    if (run.rc == 2 and len(lines) == 1 and lines[0].startswith(f"qconform {command}: error: ")
            and "internal error" not in lines[0] and "Traceback" not in run.err and run.out == ""
            and (any(n and n in lines[0] for n in names) or _NAME.search(lines[0]))):
        return "named"
    return "other"


def _argv(command: str, inp: Input, out_dir: Path) -> list:
    if command == "inspect":
        return ["inspect", inp.folder]
    if command == "dequant":
        return ["dequant", inp.folder, "--layer", inp.layer, "-o", out_dir / f"{inp.index:05d}-w.safetensors"]
    return ["linear", inp.folder, "--layer", inp.layer, "-i", inp.x_path, "-o", out_dir / f"{inp.index:05d}-y.safetensors"]


def run_campaign(seed: int, count: int, work: Path, cli_main, *, timeout: float = 60.0, memory_mib: float = 1024.0,
                 progress=None) -> dict:
    """Generate ``count`` inputs under ``work`` and run every command of the CLI entry ``cli_main`` (the
    ``qconform`` main function, given by the caller: the campaign exercises the CLI and does not import
    it) on each; the summary dict."""
    seeds = make_seeds(work)
    inputs = generate(seed, count, work, seeds)
    out_dir = work / "outputs"
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {c: collections.Counter() for c in COMMANDS}
    records, false_greens, peak, rss, slowest = [], [], 0.0, 0.0, 0.0
    for k, inp in enumerate(inputs):
        rec = {"index": inp.index, "seed": inp.seed, "mutation": inp.mutation, "must_reject": inp.must_reject,
               "detail": inp.detail if len(inp.detail) <= 200 else inp.detail[:197] + "...", "layer": inp.layer}
        for command in COMMANDS:
            run = run_isolated(_cli, (cli_main, _argv(command, inp, out_dir)), timeout=timeout,
                               memory_mib=memory_mib)
            outcome = classify(command, run, _names(inp), memory_mib=memory_mib)
            counts[command][outcome] += 1
            peak = max(peak, run.peak_mib)
            slowest = max(slowest, run.seconds)
            rss = max(rss, run.rss_mib)
            rec[command] = {"outcome": outcome, "rc": run.rc, "err": run.err.strip()[:500],
                            "seconds": round(run.seconds, 3), "peak_mib": round(run.peak_mib, 1),
                            "rss_mib": round(run.rss_mib, 1)}
        why = false_green(rec)
        if why:
            false_greens.append({**rec, "why": why})
        records.append(rec)
        if progress and (k + 1) % 50 == 0:
            progress(f"{k + 1}/{len(inputs)} inputs")
    kinds = collections.Counter(i.mutation for i in inputs)
    return {"seed": seed, "inputs": len(inputs), "requested": count, "mutation_kinds": len(kinds),
            "kinds_defined": len(MUTATIONS), "seeds": len(seeds), "timeout_s": timeout, "memory_mib": memory_mib,
            "counts": {c: {o: counts[c][o] for o in OUTCOMES} for c in COMMANDS},
            "false_greens": false_greens, "peak_mib": round(peak, 1), "rss_mib": round(rss, 1),
            "slowest_s": round(slowest, 2),
            "records": records,
            "per_kind": {m: kinds[m] for m in sorted(kinds)}}


def false_green(rec: dict) -> "str | None":
    """An exit 0 that the campaign's ground truth contradicts."""
    zero = [c for c in COMMANDS if rec[c]["outcome"] == "exit0"]
    if rec["must_reject"] and zero:
        return f"{', '.join(zero)} exit 0 on a {rec['mutation']} input (must be rejected)"
    if rec["dequant"]["outcome"] != "exit0":
        bad = [c for c in ("inspect", "linear") if c in zero]
        if bad:
            return f"{', '.join(bad)} exit 0 where dequant of the same layer fails"
    return None


def targets_met(summary: dict) -> bool:
    c = summary["counts"]
    bad = sum(c[cmd][o] for cmd in COMMANDS for o in ("other", "hang", "memory"))
    return summary["inputs"] > 0 and bad == 0 and not summary["false_greens"]


def format_summary(summary: dict) -> str:
    c = summary["counts"]
    lines = [f"campaign seed={summary['seed']}: {summary['inputs']} malformed checkpoints, "
             f"{summary['mutation_kinds']} mutation kinds, {summary['seeds']} seed checkpoints; "
             f"limits {summary['timeout_s']:g} s and {summary['memory_mib']:g} MiB a run"]
    head = f"{'outcome':<28}" + "".join(f"{cmd:>9}" for cmd in COMMANDS) + f"{'total':>9}"
    lines.append(head)
    for o in OUTCOMES:
        row = [c[cmd][o] for cmd in COMMANDS]
        lines.append(f"{OUTCOME_TITLES[o]:<28}" + "".join(f"{v:>9}" for v in row) + f"{sum(row):>9}")
    lines.append(f"false greens (exit 0 on an input that must be / dequant is rejected): {len(summary['false_greens'])}")
    lines.append(f"largest peak RSS of one run: {summary['rss_mib']} MiB ({summary['peak_mib']} MiB above the campaign "
                 f"process at fork); slowest run: {summary['slowest_s']} s")
    for fg in summary["false_greens"][:10]:
        lines.append(f"  FALSE GREEN #{fg['index']} {fg['mutation']} on {fg['seed']}: {fg['why']} ({fg['detail']})")
    shown = 0
    for rec in summary["records"]:
        for cmd in COMMANDS:
            if rec[cmd]["outcome"] in ("other", "hang", "memory") and shown < 20:
                shown += 1
                lines.append(f"  {rec[cmd]['outcome'].upper()} #{rec['index']} {cmd} {rec['mutation']} on {rec['seed']} "
                             f"({rec['detail']}): rc={rec[cmd]['rc']} {rec[cmd]['err'][:200]}")
    lines.append("targets met: " + ("yes" if targets_met(summary) else "NO"))
    return "\n".join(lines)


def register(sub, services) -> None:
    s = sub.add_parser("campaign", help="malformed-checkpoint campaign: every loader command on seeded mutants")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--count", type=int, default=1000, help="number of malformed checkpoints (default 1000)")
    s.add_argument("--timeout", type=float, default=60.0, help="seconds a run may take before it counts as a hang")
    s.add_argument("--memory-mib", type=float, default=1024.0, help="peak RSS bound of one run")
    s.add_argument("--work", help="folder for the inputs (default: a temporary folder, removed afterwards)")
    s.add_argument("--json", help="write the summary and every run's record to this file")
    s.set_defaults(fn=main)


def main(args) -> int:
    if args.count < 1:
        raise ValueError(f"--count must be at least 1, got {args.count}")
    keep = args.work is not None
    work = Path(args.work) if keep else Path(tempfile.mkdtemp(prefix="qconform-campaign-"))
    try:
        summary = run_campaign(args.seed, args.count, work, args.cli_main, timeout=args.timeout,
                               memory_mib=args.memory_mib,
                               progress=lambda m: print(m, file=sys.stderr, flush=True))
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1, default=str))
    print(format_summary(summary))
    return 0 if targets_met(summary) else 1
