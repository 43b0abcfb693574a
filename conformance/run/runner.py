"""Run cases against backends in isolated workers; verdicts; JSONL results.

Semantics: docs/conformance.md#verdicts and #isolation. The worker protocol is in worker.py (the
worker) and workerproc.py (the runner's side); the verdict rule in verdict.py; the output-folder
lock in outlock.py.

Verdicts (their names, what each counts as, and ``judge``, which decides them): conformance/judge/verdict.py;
the result line's schema: conformance/run/record.py; the worker calls: conformance/run/workerclient.py.
Public for one case (the pytest plugin, the property tier): ``Runner.run_case``, ``write_result``,
``open_worker``, ``write_replay_bundle``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np

from backends.base import Declared

from conformance.judge.acceptance import Interval, declared_interval
from conformance.cases.bundle import ReplayBundle, save_bundle
from conformance.judge.levels import assess
from conformance.run.outlock import OutLock
from conformance.run.record import ResultRecord
from conformance.run.refcache import ReferenceCache
from conformance.run.resultfile import append_line, check_worker_output_fault, is_output_error, repair_torn_tail, unwritable
from conformance.run.placement import Slot, UnitQueue, slots, work_units
from conformance.run.runstop import RunInterrupted, StopSwitch
from conformance.cases.suite import CaseSpec
# the verdict core (conformance/judge/verdict.py); judge, rounded_interval and reference_declaration re-exported for callers
from conformance.judge.verdict import BAD, Judgement, Verdict, judge, reference_declaration, rounded_interval
from conformance.run.workerclient import WorkerClient, WorkerFailure
from conformance.run.workerproc import DEFAULT_MEMORY_LIMIT, WorkerProcess, parse_size, signal_name

__all__ = ["VERDICTS", "BAD", "WorkerProcess", "judge", "rounded_interval", "reference_declaration", "Runner",
           "RunInterrupted", "read_results", "DEFAULT_MEMORY_LIMIT", "parse_size", "signal_name", "RunnerOptions"]

#: every verdict a result line can hold (docs/conformance.md#verdicts)
VERDICTS = tuple(Verdict)


# -- waivers --------------------------------------------------------------------------------------
@dataclasses.dataclass
class Waiver:
    """A named exception (docs/conformance.md#waivers). With ``variant`` (e.g. "act_scheme=kai_qa8dx") it only
    accepts that declared semantic deviation on the matching cases and waives no failure; without it, it
    waives the matching cases' failures and accepts their semantic deviations."""

    backend: str
    scheme: str
    case: str
    reason: str
    issue: str
    expires: str
    variant: str = ""

    def matches(self, backend: str, spec: CaseSpec) -> bool:
        from fnmatch import fnmatch

        return (fnmatch(backend, self.backend) and fnmatch(spec.case.scheme, self.scheme)
                and fnmatch(spec.case_id, self.case))

    def expired(self, today: str) -> bool:
        return bool(self.expires) and self.expires < today


def load_waivers(path: "str | Path | None") -> list[Waiver]:
    if not path:
        return []
    import tomllib

    from emulator.errors import QconformError

    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise QconformError(f"{path}: waiver file not found") from None
    except tomllib.TOMLDecodeError as e:
        raise QconformError(f"{path}: malformed TOML ({e})") from None
    out = []
    for i, w in enumerate(data.get("waiver", [])):
        missing = [k for k in ("backend", "scheme", "case", "reason", "issue", "expires") if k not in w]
        if missing:
            raise QconformError(f"{path}: waiver #{i + 1} lacks {', '.join(missing)}")
        unknown = sorted(set(w) - {"backend", "scheme", "case", "reason", "issue", "expires", "variant"})
        if unknown:
            raise QconformError(f"{path}: waiver #{i + 1} has unknown key(s) {', '.join(unknown)}")
        variant = str(w.get("variant", ""))
        if variant:
            from emulator.variants import VariantError, axis

            key, _, value = variant.partition("=")
            try:
                axis(key).parse(value)
            except VariantError as e:
                raise QconformError(f"{path}: waiver #{i + 1}: {e}") from None
        out.append(Waiver(str(w["backend"]), str(w["scheme"]), str(w["case"]), str(w["reason"]), str(w["issue"]),
                          str(w["expires"]), variant))
    return out


# -- runner ---------------------------------------------------------------------------------------
def read_results(path: "str | Path") -> list[dict]:
    out = []
    p = Path(path)
    if not p.exists():
        return out
    with open(p, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by an interrupted run
    return out


@dataclasses.dataclass(frozen=True)
class RunnerOptions:
    """How a ``Runner`` runs: its limits, what it does with each judged output, and where workers run."""

    timeout: float = 120.0  # seconds a case may take
    jobs: int = 1  # workers at once
    waivers: "list | None" = None  # Waiver objects (load_waivers)
    progress: object = True  # a progress callable, True (the default bar) or False
    worker_env: "dict | None" = None  # the workers' environment (None: this process's)
    #: optional callback(label, spec, inp, declared, interval, y, rec, judgement), called (from worker threads)
    #: for every judged output before waivers and before its result line is written (a quantize-only case:
    #: y the observed tensors, judgement the expected ones); conformance/certify keeps the observed outputs
    #: and the judged intervals with it
    on_output: object = None
    memory_limit: "int | str | None" = None  # per worker (None: DEFAULT_MEMORY_LIMIT)
    lock: bool = False  # hold the output folder's lock from construction until close()
    #: accelerators the worker slots are placed on (conformance/run/placement.py; docs/scaling.md)
    devices: "list | None" = None
    #: where worker processes run: None = this host; a conformance.run.remote.DaskExecutor = a cluster's nodes
    executor: object = None


class Runner:
    """Runs cases on backends, one worker per job, and appends a result line per (backend, case) to
    ``OUT/results.jsonl``. With ``lock=True`` (``qconform run`` and ``certify``) it holds the folder's lock
    (``conformance.run.outlock``) from construction until ``close()`` (or the end of the process): a second
    process writing into the same folder is refused. (The pytest plugin's xdist workers share a folder,
    each with its own results-<worker>.jsonl, and take no lock.)

    ``run`` stops early on SIGINT or SIGTERM (handlers installed for its duration, from the main
    thread), when its stdout or stderr is a pipe whose reader went away, or on ``stop()``: workers are
    killed at once, the cases that finished keep their result lines, and ``RunInterrupted`` is raised.
    Result lines are appended whole (conformance/run/resultfile.py); an output folder that cannot take
    them (full, read-only) raises ``OutputUnwritable``."""

    #: failing cases localized per (backend, scheme, format); 0: none (docs/conformance.md#failure-localization)
    localize_per_group = 2

    def __init__(self, out_dir: "str | Path", options: "RunnerOptions | None" = None, **fields):
        """``options`` (RunnerOptions; its fields may also be given as keywords, which replace the options')."""
        opts = dataclasses.replace(options or RunnerOptions(), **fields)
        self.out_dir = Path(out_dir)
        # scratch files workers read and write: absolute, because a worker process runs in its own
        # directory and a path relative to ours (`qconform run --out qconform-out`) names nothing there
        self.work_dir = self.out_dir.resolve() / ".work"
        self.on_output = opts.on_output  # RunnerOptions.on_output
        self.memory_limit = DEFAULT_MEMORY_LIMIT if opts.memory_limit is None else parse_size(opts.memory_limit)
        self.lock = OutLock.for_folder(self.out_dir)
        if opts.lock:
            self.lock.acquire()  # (creates the folder) before anything in it is read, removed or written
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            if is_output_error(e):
                raise unwritable(e, self.out_dir) from None
            raise
        self.results_path = self.out_dir / "results.jsonl"
        self.log_dir = self.out_dir / "logs"
        self.timeout = opts.timeout
        self.jobs = max(1, int(opts.jobs))
        self.waivers = opts.waivers or []
        self.progress = opts.progress
        self.worker_env = opts.worker_env
        self.devices = list(opts.devices or [])  # [] = no placement
        self.executor = opts.executor
        self._lock = threading.Lock()
        #: failing cases localized so far per (backend, scheme, format) (docs/conformance.md#failure-localization)
        self._localized: dict = {}
        self._done = 0
        self._total = 0
        #: the run's stop flag (conformance/run/runstop.py): set, no new case starts and pending requests kill
        #: their worker; ``switch.stopped_by``: the signal that stopped the run
        self.switch = StopSwitch()
        self._stop = self.switch.event
        self.labels: dict = {}  # backend spec -> its label (the worker's hello), for the completeness check
        self.repaired = 0  # bytes of a torn last line removed from results.jsonl before a resumed run
        #: inputs and intervals shared by the backends of one ``run`` (conformance/run/refcache.py); None outside it
        self.refs: "ReferenceCache | None" = None
        self.ref_stats: dict = {}

    def close(self) -> None:
        """Release the folder's lock (also released when the process ends)."""
        self.lock.release()

    def _worker(self, bspec: str, slot: "Slot | None" = None) -> WorkerProcess:
        """A worker process for ``bspec`` in ``slot`` (its device's visibility variable set before the library
        loads); on a cluster (``executor``), the same worker on one of its nodes."""
        slot = slot if slot is not None else (slots(1, self.devices)[0])
        env = dict(self.worker_env or {}, **slot.env())
        if self.executor is not None:
            return self.executor.worker(bspec, f"{os.getpid()}-{slot.number}", env=env or None,
                                        memory_limit=self.memory_limit)
        return WorkerProcess(bspec, env=env or None, log_dir=self.log_dir, memory_limit=self.memory_limit,
                             cancel=self._stop)

    # -- stopping (conformance/run/runstop.py) ----------------------------------------------------------
    @property
    def stopped_by(self) -> "int | None":
        """The signal that stopped the run (signal.SIGPIPE: our output's reader went away), or None."""
        return self.switch.stopped_by

    def stop(self, signum: int = signal.SIGINT) -> None:
        self.switch.stop(signum)

    def interruptible(self):
        """SIGINT and SIGTERM stop this runner while the ``with`` block runs (``StopSwitch.interruptible``)."""
        return self.switch.interruptible()

    def _append(self, rec: dict) -> None:
        """One whole line into results.jsonl, or OutputUnwritable (the run stops)."""
        try:
            append_line(self.results_path, json.dumps(rec, default=_json_default))
        except OSError as e:
            if not is_output_error(e):
                raise
            self._stop.set()
            raise unwritable(e, self.results_path, hint="results.jsonl keeps whole lines for the cases that "
                                                         "finished; make room and continue with --resume") from None

    def _write(self, rec: dict) -> None:
        with self._lock:
            self._append(rec)
            self._done += 1
            try:
                if callable(self.progress):  # e.g. conformance/report/console.py's line printer for logs and pipes
                    self.progress(self._done, self._total, rec)
                elif self.progress:
                    width = 30
                    frac = self._done / max(self._total, 1)
                    bar = "#" * int(width * frac) + "-" * (width - int(width * frac))
                    sys.stderr.write(f"\r[{bar}] {self._done}/{self._total} {rec['backend'][:20]:20s} "
                                     f"{rec['verdict']:20s}")
                    sys.stderr.flush()
            except BrokenPipeError:  # the reader of the progress went away: stop, as for SIGPIPE
                self.progress = False
                self.stop(signal.SIGPIPE)

    def hello(self, backend_spec: str) -> dict:
        w = self._worker(backend_spec)
        try:
            r = w.request({"op": "hello"}, timeout=self.timeout)
        finally:
            w.close()
        if r.get("kind") == "interrupted":
            raise RunInterrupted(self.stopped_by or signal.SIGINT)
        return r

    def run(self, backend_specs: list[str], specs: list[CaseSpec], *, resume: bool = True,
            header: dict | None = None) -> list[dict]:
        """Every (backend, case) not yet in results.jsonl (with ``resume``); the new result records.
        Raises ``RunInterrupted`` (with the records that finished) when stopped before the end."""
        with self.interruptible():
            return self._run(backend_specs, specs, resume=resume, header=header)

    def _run(self, backend_specs, specs, *, resume, header) -> list[dict]:
        if self.lock.held:  # the sole writer: scratch space a killed run left behind can go
            shutil.rmtree(self.work_dir, ignore_errors=True)
            if resume:  # a line a killed run left half-written would be dropped silently, then appended to
                try:
                    self.repaired = repair_torn_tail(self.results_path)
                except OSError as e:
                    if is_output_error(e):
                        raise unwritable(e, self.results_path) from None
                    raise
        done = set()
        if resume:
            for r in read_results(self.results_path):
                if r.get("kind") == "result":
                    done.add((r["backend"], r["case_id"]))
        if header is not None:
            self._append(dict(header, kind="run"))
        results: list[dict] = []
        today = time.strftime("%Y-%m-%d")
        self.refs = ReferenceCache(self.work_dir)
        try:
            try:
                self._run_backends(backend_specs, specs, done, results, today)
            except RunInterrupted:
                pass  # (self.stopped_by says by what; raised below once the scratch space is gone)
        finally:
            self.ref_stats = dict(self.refs.stats)  # inputs drawn / reused, intervals computed / reused
            self.refs.close()
            self.refs = None
            try:
                (self.work_dir).rmdir()
            except OSError:
                pass
        if self.progress and not callable(self.progress) and self._total:
            sys.stderr.write("\n")
        try:
            self.log_dir.rmdir()  # only when empty: logs are kept only for workers that crashed or timed out
        except OSError:
            pass
        if self.stopped_by is not None:
            raise RunInterrupted(self.stopped_by, results)
        return results

    def _run_backends(self, backend_specs, specs, done, results, today) -> None:
        for bspec in backend_specs:
            self.switch.check_outputs()
            if self._stop.is_set():
                return
            hello = self.hello(bspec)
            label = hello.get("label", bspec)
            self.labels[bspec] = label
            # one line per backend: version and device, for the reports' environment section
            with self._lock:
                self._append({"kind": "backend", "backend": label, "spec": bspec,
                              "available": bool(hello.get("ok") and hello.get("available")),
                              "reason": hello.get("reason") or hello.get("error") or "",
                              "version": hello.get("version"), "device": hello.get("device"),
                              "covers": hello.get("covers"), "deterministic": hello.get("deterministic", True)})
            todo = [s for s in specs if (label, s.case_id) not in done]
            self._total += len(todo)
            if not hello.get("ok") or not hello.get("available"):
                reason = hello.get("reason") or hello.get("error") or "unavailable"
                for s in todo:
                    if self._stop.is_set():
                        return
                    rec = self._record(label, s, "unsupported", f"backend unavailable: {reason}",
                                       evidence={"unavailable": reason})
                    self._write(rec)
                    results.append(rec)
                continue
            # units of one kernel configuration, pulled by the slots (conformance/run/placement.py)
            queue = UnitQueue(work_units(todo, self.jobs))
            places = slots(self.jobs, self.devices)
            with ThreadPoolExecutor(max_workers=len(places)) as ex:
                futures = [ex.submit(self._run_slot, bspec, label, slot, queue, today) for slot in places]
                # the main thread watches for a closed output (and runs the signal handlers) meanwhile
                while wait(futures, timeout=0.25, return_when=FIRST_EXCEPTION).not_done:
                    self.switch.check_outputs()
                    if any(f.done() and f.exception() is not None for f in futures):
                        self._stop.set()  # one chunk failed (an unwritable folder): the others stop too
                        break
            for f in futures:
                results.extend(f.result())  # (re-raises a slot's error, e.g. OutputUnwritable)
            if not self._stop.is_set():  # every device retired before the queue emptied: nothing is lost
                for spec in queue.drain():
                    why = (f"not run: every device of this run was retired ({queue.retired_text()}); the device "
                           "stopped working during the run")
                    rec = self._apply_waiver(label, spec, self._record(label, spec, "crash", why,
                                                                       evidence={"runner": why}), today)
                    self._write(rec)
                    results.append(rec)

    def _record(self, label: str, spec: CaseSpec, verdict: "Verdict | str", reason: str, **extra) -> dict:
        """A result line (conformance/run/record.py's schema) as the dict the run passes on and writes."""
        return ResultRecord.for_case(label, spec, verdict, reason, **extra).to_json()

    # -- the public interface of one case (the pytest plugin, the property tier) ---------------------
    def open_worker(self, backend_spec: str) -> WorkerProcess:
        """A worker process for ``backend_spec`` (close it when done)."""
        return self._worker(backend_spec)

    def run_case(self, worker: WorkerProcess, label: str, spec: CaseSpec, tmpdir: Path, *, today: str,
                 inp=None, write_bundle: bool = True) -> dict:
        """Plan, run and judge one case on ``worker`` and apply the waivers as of ``today``: the result line,
        not yet written (``write_result``). The suite's own failure to judge is a ``crash`` line naming it.
        ``inp``: inputs drawn in this process (the property tier), sent to the worker as a bundle file;
        ``write_bundle=False``: no replay bundle for a failure (the caller writes one for the example it keeps)."""
        rec = self._case_record(worker, label, spec, tmpdir, inp=inp, write_bundle=write_bundle)
        return self.apply_waivers(label, spec, rec, today)

    def _case_record(self, worker: WorkerProcess, label: str, spec: CaseSpec, tmpdir: Path, *, inp=None,
                     write_bundle: bool = True) -> dict:
        """``_run_one``, the suite's own failure on the case made its ``crash`` record; an output folder that is
        full or read-only stops the run instead (OutputUnwritable: the run's fault, not the case's)."""
        try:
            rec = self._run_one(worker, label, spec, tmpdir, inp=inp, write_bundle=write_bundle)
        except OSError as e:
            if is_output_error(e):
                self._stop.set()
                raise unwritable(e, self.out_dir, hint="continue with --resume once there is room") from None
            rec = self._runner_crash(label, spec, e)
        except Exception as e:  # noqa: BLE001 - the suite's own failure on this case: a verdict, not an abort
            rec = self._runner_crash(label, spec, e)
        check_worker_output_fault(rec, self.work_dir)
        return rec

    def _runner_crash(self, label: str, spec: CaseSpec, e: Exception) -> dict:
        return self._record(label, spec, Verdict.CRASH, f"the runner could not judge this case: {type(e).__name__}: {e}",
                            evidence={"runner": f"{type(e).__name__}: {e}"})

    def apply_waivers(self, label: str, spec: CaseSpec, rec: dict, today: str) -> dict:
        """``rec`` under this runner's waivers as of ``today`` (docs/conformance.md#waivers)."""
        return self._apply_waiver(label, spec, rec, today)

    def write_result(self, rec: "dict | ResultRecord") -> None:
        """Append one line to the results file (and count it for the progress display)."""
        self._write(rec.to_json() if isinstance(rec, ResultRecord) else rec)

    def write_replay_bundle(self, label: str, spec: CaseSpec, inp, declared, verdict, reason, y=None,
                            iv=None) -> Path:
        """The replay bundle of a case under OUT/bundles/ (``qconform replay``); returns its path."""
        return self._bundle(label, spec, inp, declared, verdict, reason, y, iv)

    def _apply_waiver(self, label: str, spec: CaseSpec, rec: dict, today: str) -> dict:
        semantic = {d["variant"] for d in rec.get("deviations") or [] if d["level"] == "semantic"}
        for w in self.waivers:
            if w.variant and w.matches(label, spec) and w.variant in semantic:
                if w.expired(today):
                    rec["waiver_expired"] = {"issue": w.issue, "expires": w.expires, "reason": w.reason}
                else:  # accepts the named deviation only: failures stay failures
                    rec["deviation_waiver"] = {"issue": w.issue, "reason": w.reason, "expires": w.expires,
                                               "variant": w.variant}
        for w in self.waivers:
            if w.variant:
                continue
            if w.matches(label, spec):
                if w.expired(today):
                    rec["waiver_expired"] = {"issue": w.issue, "expires": w.expires, "reason": w.reason}
                    rec["reason"] = (rec.get("reason") or "") + f" (waiver {w.issue} expired {w.expires})"
                    if rec["verdict"] not in BAD:  # a stale waiver cannot hide a problem
                        rec["verdict"] = Verdict.FAIL.value
                    return rec
                if rec.get("level") == "semantic":  # a waiver naming the case accepts its semantic deviation
                    rec["deviation_waiver"] = {"issue": w.issue, "reason": w.reason, "expires": w.expires}
                if rec["verdict"] in BAD:
                    rec["waived_verdict"] = rec["verdict"]
                    rec["verdict"] = Verdict.WAIVED.value
                    rec["waiver"] = {"issue": w.issue, "reason": w.reason, "expires": w.expires}
                elif rec.get("level") != "semantic":
                    rec["unexpected_pass_of_waived_case"] = {"issue": w.issue, "reason": w.reason}
                return rec
        return rec

    def _run_slot(self, bspec: str, label: str, slot: Slot, queue: "UnitQueue", today: str) -> list[dict]:
        """Run units from ``queue`` in one worker placed in ``slot`` until the queue is empty, the run stops, or
        the slot's device is retired (a fresh worker finds its backend unavailable after a crash or timeout:
        the unit's remaining cases go back to the queue for the other slots)."""
        out = []
        worker = self._worker(bspec, slot)
        tmpdir = self.work_dir / f"{os.getpid()}-{threading.get_ident()}"
        tmpdir.mkdir(parents=True, exist_ok=True)
        try:
            while not self._stop.is_set() and not queue.is_retired(slot.device):
                unit = queue.take(self._stop.is_set)
                if unit is None:
                    break
                try:
                    for i, spec in enumerate(unit):
                        if self._stop.is_set():
                            break
                        try:
                            rec = self.run_case(worker, label, spec, tmpdir, today=today)
                        except RunInterrupted:
                            return out  # stopped while this case ran: it has no result (a resumed run runs it)
                        if slot.device is not None:
                            rec["device"] = slot.device.to_json()
                        node = getattr(worker, "last_node", None)
                        if node is not None:
                            rec["node"] = node.get("host")
                        self._write(rec)
                        out.append(rec)
                        if (slot.device is not None and rec["verdict"] in (Verdict.CRASH, Verdict.TIMEOUT)
                                and self._device_lost(worker, slot, queue, unit[i + 1:])):
                            break
                finally:
                    queue.done()
        except BaseException:
            self._stop.set()  # the sibling slots end too
            raise
        finally:
            worker.close()
            shutil.rmtree(tmpdir, ignore_errors=True)
            try:
                (self.work_dir).rmdir()
            except OSError:
                pass
        return out

    def _device_lost(self, worker, slot: Slot, queue: "UnitQueue", rest: list) -> bool:
        """After a crash or timeout on a device: does a fresh worker still find its backend available? If not,
        the device is retired and ``rest`` goes back to the queue (True)."""
        hello = WorkerClient(worker, self.timeout).hello()
        if hello.available:
            return False
        queue.retire(slot.device, hello.why_unavailable, rest)
        return True

    def _failed_request(self, label, spec, failure: WorkerFailure, what: str, t0: float, declared=None) -> dict:
        """The record of a request the worker did not answer with ok: crash, timeout, or a malformed output."""
        kind = failure.kind
        if kind == "interrupted":  # the run was stopped while this request ran: no verdict for the case
            raise RunInterrupted(self.stopped_by or signal.SIGINT)
        evidence = dict(failure.evidence)
        if kind == "malformed":
            verdict, reason = Verdict.FAIL, f"malformed output: {failure.error}"
            evidence = {"malformed": failure.error}
        elif kind == "timeout":
            verdict, reason = Verdict.TIMEOUT, failure.error
        else:
            verdict = Verdict.CRASH
            reason = (f"{what}: " if what else "") + failure.error
            if kind == "error":  # the backend raised: the worker is alive and says what
                evidence = {"worker": "raised", "exception": failure.error, "traceback": failure.traceback}
            elif not evidence:  # (a reply of another kind: the worker did not follow the protocol)
                evidence = {"runner": f"{kind}: {failure.error}"}
        if evidence.get("log"):
            evidence["log"] = f"logs/{evidence['log']}"
        extra = {"declared": declared.to_json()} if declared is not None else {}
        return self._record(label, spec, verdict, reason, evidence=evidence, seconds=time.perf_counter() - t0,
                            **extra)

    def _run_one(self, worker: WorkerProcess, label: str, spec: CaseSpec, tmpdir: Path, *, inp=None,
                 write_bundle: bool = True) -> dict:
        """Plan, run and judge one case, before waivers (``run_case`` is the public form)."""
        t0 = time.perf_counter()
        client = WorkerClient(worker, self.timeout)
        given = None  # inputs that are not spec's own: the plan sees them too (a dispatcher chooses on them)
        if inp is not None:
            given = save_bundle(tmpdir / "inputs.safetensors",
                                ReplayBundle(inp, spec.to_json(), backend=label, reason="inputs"))
        plan = client.plan(spec, bundle=given)
        if plan.failure is not None:
            return self._failed_request(label, spec, plan.failure, "planning failed", t0)
        if not plan.supported:
            reason = plan.reason.strip() or "(the backend gave no reason)"
            return self._record(label, spec, Verdict.UNSUPPORTED, reason, evidence={"refusal": reason},
                                seconds=time.perf_counter() - t0)
        declared = plan.declared
        ypath = tmpdir / "y.safetensors"
        if ypath.exists():
            ypath.unlink()
        shared = inp is None and self.refs is not None
        if shared:
            # drawn once per run; the worker runs from the same file (conformance/run/refcache.py) and checks
            # that it ran these bytes
            inp, path, digest = self.refs.inputs(spec)
            source = {"spec": spec, "bundle": path}  # the inputs the case ran on (a localization probes the same)
            reply = client.run(ypath, **source, inputs_sha256=digest)
        elif inp is None:
            inp = spec.inputs()
            source = {"spec": spec}
            reply = client.run(ypath, **source)
        else:
            source = {"spec": spec, "bundle": given}
            reply = client.run(ypath, **source)
        if reply.failure is not None:
            rec = self._failed_request(label, spec, reply.failure, "", t0, declared)
            if write_bundle:
                rec["bundle"] = str(self._bundle(label, spec, inp, declared, rec["verdict"], rec["reason"], None, None))
            return rec
        if spec.case.spec.quantize_only:
            return self._judge_quantized(label, spec, inp, declared, ypath, reply, t0, write_bundle)
        from emulator.tensorfile import load_tensors

        y = load_tensors(ypath)["y"].data

        def interval(decl: Declared) -> Interval:
            return self.refs.interval(inp, decl) if shared else declared_interval(inp, decl)

        try:
            iv = interval(reference_declaration(spec.case, declared))
        except Exception as e:  # noqa: BLE001 - the declaration cannot be evaluated on this case: a crash naming it
            return self._record(label, spec, Verdict.CRASH,
                                f"reference failed for this declaration: {type(e).__name__}: {e}",
                                declared=declared.to_json(), seconds=time.perf_counter() - t0,
                                evidence={"runner": f"{type(e).__name__}: {e}"})
        j: Judgement = judge(inp, iv, y, declared)
        rec = self._record(label, spec, j.verdict, j.reason, declared=declared.to_json(), metrics=dict(j.metrics),
                           seconds=time.perf_counter() - t0, kernel_s=reply.run_s, prepare_s=reply.prepare_s,
                           **assess(spec.case, declared, inp, y, interval=interval))
        if j.verdict is Verdict.FAIL and self._take_localization(label, spec):
            rec["localization"] = self._localize(client, source, declared)
        if j.verdict is Verdict.FAIL and write_bundle:
            rec["bundle"] = str(self._bundle(label, spec, inp, declared, j.verdict.value, j.reason, y, iv))
        if self.on_output is not None:
            self.on_output(label, spec, inp, declared, iv, y, rec, j)
        return rec

    def _take_localization(self, label: str, spec: CaseSpec) -> bool:
        """Localize the first LOCALIZE_PER_GROUP failures of each (backend, scheme, format): the console and the
        reports show one example per failure group, and a broken kernel fails hundreds of cases alike."""
        if self.localize_per_group <= 0:
            return False
        key = (label, spec.case.scheme, spec.case.weight_format)
        with self._lock:
            n = self._localized.get(key, 0)
            self._localized[key] = n + 1
        return n < self.localize_per_group

    def _localize(self, client: WorkerClient, source: dict, declared: Declared) -> dict:
        """The worker's localization of a failing case (conformance/judge/localize.py) on the inputs it ran (``source``:
        spec, bundle); a probe that crashes the kernel or raises is reported as the localization's error, never as
        the case's verdict."""
        try:
            reply = client.localize(declared, **source)
        except Exception as e:  # noqa: BLE001 - the localization never changes the verdict
            return {"error": f"{type(e).__name__}: {e}"}
        if reply.failure is not None:
            return {"error": f"{reply.failure.kind}: {reply.failure.error[:500]}"}
        return reply.localization

    def _judge_quantized(self, label, spec, inp, declared, ypath, reply, t0, write_bundle) -> dict:
        """A quantize-only case (docs/conformance.md#quantize-only-cases): codes, scales, zero points and
        dequantized values against the emulator's reference, exactly."""
        from conformance.judge.quantized import assess_quantized, judge_quantized, load_observed

        observed = load_observed(ypath)
        metrics, expected = judge_quantized(spec.case, inp.x, declared, observed)
        if metrics.get("first_mismatch"):  # what the reports and the console show as the worst element
            metrics["worst_element"] = metrics["first_mismatch"]
        verdict = metrics.pop("verdict")
        reason = metrics.pop("reason")
        if expected is None:
            return self._record(label, spec, verdict, reason, declared=declared.to_json(),
                                seconds=time.perf_counter() - t0, evidence={"runner": reason})
        rec = self._record(label, spec, verdict, reason, declared=declared.to_json(), metrics=metrics,
                           seconds=time.perf_counter() - t0, kernel_s=reply.run_s,
                           **assess_quantized(spec.case, declared, inp.x, observed))
        if verdict == "fail" and write_bundle:
            safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{label}__{spec.case_id}")
            path = self.out_dir / "bundles" / (safe[:180] + ".safetensors")
            save_bundle(path, ReplayBundle(inp, spec.to_json(), backend=label, declared=declared.to_json(),
                                           verdict=verdict, reason=reason, quantized=(observed, expected)))
            rec["bundle"] = str(path)
        if self.on_output is not None:
            self.on_output(label, spec, inp, declared, None, observed, rec, expected)
        return rec

    def _bundle(self, label, spec, inp, declared, verdict, reason, y, iv) -> Path:
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{label}__{spec.case_id}")
        path = self.out_dir / "bundles" / (safe[:180] + ".safetensors")
        y_ok = y is not None and iv is not None and np.shape(y) == np.shape(iv.y_ref)
        save_bundle(path, ReplayBundle(inp, spec.to_json(), backend=label,
                                       declared=declared.to_json() if declared else None, verdict=verdict,
                                       reason=reason, y=y if y_ok else None, interval=iv))
        return path


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o))
