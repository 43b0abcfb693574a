"""Run cases against backends in isolated workers; verdicts; JSONL results.

Semantics: docs/conformance.md#verdicts and #isolation.

Verdicts:

- ``pass``: every output element inside the declared interval;
- ``pass-with-tie-flips``: outside the declared interval only where an
  activation-quantization tie (int8 k + 0.5, E2M1 midpoint) resolved the other
  way can explain it, within the interval widened by exactly those flips; the
  number of tie elements involved is recorded;
- ``quality-warning``: inside the interval, but the error uses most of the
  allowed bound almost everywhere (mean error/bound ratio > 0.5 with max > 0.9):
  a kernel that is correct by the contract's letter but consistently at its edge;
- ``fail``: outside the interval; a replay bundle is written;
- ``crash``: the worker died (signal or exit code) or the backend raised;
- ``timeout``: no answer within the per-case time limit (the worker is killed);
- ``unsupported``: the backend's ``can_implement`` said no (its reason is kept);
- ``waived``: a matching waiver (waivers.toml) covers a non-pass;
- ``mistrusted``: inside the interval, but the reference output is all zero,
  constant or non-finite, so agreement proves nothing about the kernel.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from backends.base import Declared

from .acceptance import Interval, compare, declared_interval, round_down, round_up
from .levels import assess
from .bundle import save_bundle
from .suite import CaseSpec

__all__ = ["VERDICTS", "WorkerProcess", "judge", "Runner", "read_results"]

VERDICTS = ("pass", "pass-with-tie-flips", "quality-warning", "fail", "crash", "timeout", "unsupported", "waived",
            "mistrusted")
BAD = {"fail", "crash", "timeout"}


def _signal_name(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with status {rc}"


class WorkerProcess:
    """One backend worker subprocess with line-JSON requests and a per-request timeout."""

    def __init__(self, backend_spec: str, *, env: dict | None = None):
        self.backend_spec = backend_spec
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.stderr_path: str | None = None

    def start(self) -> None:
        fd, self.stderr_path = tempfile.mkstemp(prefix="qconform-worker-", suffix=".log")
        os.close(fd)
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        from .golden import GOLDEN_DIR

        env.setdefault("QCONFORM_GOLDEN_DIR", str(GOLDEN_DIR))  # the worker's cwd differs from ours
        self._err = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "conformance.worker", "--backend", self.backend_spec],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                     env=env, cwd=root, text=True, bufsize=1)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stderr_tail(self, n: int = 600) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                data = f.read()[-n:]
            return data.decode("utf-8", "replace").strip()
        except (OSError, TypeError):
            return ""

    def request(self, obj: dict, timeout: float) -> dict:
        """Send one request; returns the reply, or {"ok": False, "kind": "crash"|"timeout", ...}."""
        if not self.alive():
            self.start()
        assert self.proc and self.proc.stdin and self.proc.stdout
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return self._dead()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                return {"ok": False, "kind": "timeout", "error": f"no answer within {timeout:.0f} s; worker killed"}
            r, _, _ = select.select([self.proc.stdout], [], [], min(left, 1.0))
            if r:
                line = self.proc.stdout.readline()
                if not line:
                    return self._dead()
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    continue  # stray output from a library: ignore
            elif self.proc.poll() is not None:
                return self._dead()

    def _dead(self) -> dict:
        rc = self.proc.wait() if self.proc else -1
        tail = self.stderr_tail()
        self.proc = None
        return {"ok": False, "kind": "crash", "error": _signal_name(rc) + (f"; stderr: {tail}" if tail else ""),
                "returncode": rc}

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def close(self) -> None:
        if self.alive():
            try:
                self.request({"op": "exit"}, timeout=5)
            except Exception:
                pass
        self.kill()


# -- verdicts -------------------------------------------------------------------------------------
def _tie_widening(iv: Interval, inp, declared: Declared) -> tuple[np.ndarray, np.ndarray] | None:
    """Extra allowed error per output element if every activation tie could flip, and tie counts per row."""
    tie = iv.parts.get("x_tie")
    if tie is None or not np.any(tie):
        return None
    from .acceptance import declared_weight

    case = inp.case
    if case.scheme in ("w8a8", "w4a8"):
        w = declared_weight(case, inp.tensors, dataclasses.replace(declared, weight_dtype="exact")).astype(np.float64)
        step = np.abs(iv.parts["x_scale"].astype(np.float64)) * tie  # one code = one scale step
    elif case.scheme == "w4a4-mxfp4":
        from emulator.formats import mxfp4

        codes, sb = mxfp4.unpack_mxfp4_ct(inp.tensors)
        w = mxfp4.dequantize_mxfp4(codes, sb, dtype=np.float64)
        xs = iv.parts["x_scale"]
        s = np.where(xs == 0xFF, 0, xs.astype(np.int64) - 127)
        scale = np.repeat(2.0 ** s, 32, axis=-1)
        # E2M1 spacing at a midpoint m: 0.5 below 2, 1 in [2, 4), 2 above
        xq = np.abs(inp.x.astype(np.float64)) / scale
        spacing = np.where(xq < 2, 0.5, np.where(xq < 4, 1.0, 2.0))
        step = spacing * scale * tie
    else:
        return None
    with np.errstate(invalid="ignore"):
        widen = step @ np.abs(w).T
    return widen, tie.sum(axis=1)


_TIE_AXES = {"w8a8": "act_rounding", "w4a8": "act_rounding", "w4a4-mxfp4": "e2m1_rounding"}


def rounded_interval(iv: Interval, declared: Declared) -> Interval:
    """The interval narrowed to the outputs a kernel that rounds *once*, as it declares, can produce.

    A kernel's accumulator lies in [y - b, y + b]; it rounds it once to the output dtype with its
    declared ``output_rounding`` R (rne or rtz). R is monotone and returns grid points unchanged, so
    its outputs are exactly the grid points of [R(y - b), R(y + b)] (the arguments widened by one
    float64 ulp outward, so the float64 evaluation of y -+ b cannot exclude a correct value). The
    interval from ``declared_interval`` rounds outward ([RD(y - b), RU(y + b)]), which also admits
    the neighbour on the other side of a correctly rounded value: a kernel that truncates while
    declaring round-to-nearest would pass it. Where the declaration adds a stage after the rounding
    (``bias_stage=after_output_rounding``) or uses another rounding, the interval is kept as is.
    """
    mode = (declared.output_rounding or "rne").lower()
    if mode not in ("rne", "rtz") or iv.parts.get("bias_stage") == "after_output_rounding":
        return iv
    from emulator.numerics.floats import round_to_dtype

    with np.errstate(invalid="ignore", over="ignore"):
        lo_t = round_to_dtype(np.nextafter(iv.y_exact - iv.bound, -np.inf), iv.out_dtype, mode)
        hi_t = round_to_dtype(np.nextafter(iv.y_exact + iv.bound, np.inf), iv.out_dtype, mode)
        fin = np.isfinite(iv.y_exact) & np.isfinite(iv.bound)
        lo = np.where(fin, np.maximum(iv.lo, lo_t), iv.lo)
        hi = np.where(fin, np.minimum(iv.hi, hi_t), iv.hi)
    return dataclasses.replace(iv, lo=lo, hi=hi)


def _alternative_rule(inp, y, declared: Declared):
    """If the output is explained by another tie rule than the declared one, name it.

    A kernel that resolves *every* tie by a different rule is not flipping ties by
    accident of its arithmetic: it implements another rounding mode.
    """
    axis = _TIE_AXES.get(inp.case.scheme)
    if axis is None:
        return None
    mine = declared.variants.get(axis) or "rne"
    for rule in ("rne", "rhaz", "rhtz", "rtz"):
        if rule == mine:
            continue
        alt = dataclasses.replace(declared, variants=dict(declared.variants, **{axis: rule}))
        try:
            if compare(y, rounded_interval(declared_interval(inp, alt), alt)).ok:
                return axis, rule, mine
        except Exception:
            continue
    return None


def _ulp_at(y, iv: Interval, idx) -> int | None:
    """ULP distance (in the output dtype) of the observed element from the correctly rounded reference."""
    from .acceptance import _ordinal

    a, b = float(np.asarray(y, np.float64)[idx]), float(iv.y_ref[idx])
    if not (np.isfinite(a) and np.isfinite(b)):
        return None
    return int(abs(int(_ordinal(np.array([a]), iv.out_dtype)[0]) - int(_ordinal(np.array([b]), iv.out_dtype)[0])))


def judge(inp, iv: Interval, y: np.ndarray, declared: Declared) -> dict:
    """Verdict and metrics for one observed output.

    Inside means inside ``rounded_interval`` (the outputs of one declared rounding of an accumulator
    within the bound); the error/bound ratios and the quality warning use the outward interval.
    """
    loose, iv = iv, rounded_interval(iv, declared)
    cmp = compare(y, loose)
    cmp_t = compare(y, iv)
    rounding_only = cmp.ok and not cmp_t.ok
    cmp = dataclasses.replace(cmp, ok=cmp_t.ok, n_out=cmp_t.n_out)
    rec = {"max_ratio": cmp.max_ratio, "max_ulp": cmp.max_ulp, "sqnr_db": cmp.sqnr_db, "n_outside": cmp.n_out,
           "exact_match": cmp.exact_match, "worst": list(cmp.worst) if cmp.worst else None, "tie_flips": 0}
    if rec["worst"] is not None:
        idx = tuple(rec["worst"])
        rec["worst_element"] = {"index": rec["worst"], "observed": float(np.asarray(y, np.float64)[idx]),
                                "expected": float(iv.y_exact[idx]), "lo": float(iv.lo[idx]), "hi": float(iv.hi[idx]),
                                "reference": float(iv.y_ref[idx]), "ulp": _ulp_at(y, iv, idx)}
    ref = iv.y_ref
    finite = np.isfinite(ref)
    degenerate = (not finite.any()) or bool(np.all(ref[finite] == 0)) or (ref.size > 1 and np.unique(ref[finite]).size <= 1)
    if cmp.ok:
        if degenerate:
            rec.update(verdict="mistrusted", reason="reference output is all zero, constant or non-finite")
            return rec
        y64 = np.asarray(y, np.float64)
        fin = np.isfinite(iv.y_exact)
        with np.errstate(divide="ignore", invalid="ignore"):
            side = np.where(y64 >= loose.y_ref, loose.hi - loose.y_ref, loose.y_ref - loose.lo)
            ratio = np.where(y64 == loose.y_ref, 0.0, np.abs(y64 - loose.y_ref) / side)
        ratio = ratio[fin & np.isfinite(ratio)]
        if ratio.size and iv.bound.max(initial=0) > 0 and ratio.mean() > 0.5 and ratio.max() > 0.9:
            rec.update(verdict="quality-warning", reason=f"error uses {ratio.mean():.0%} of the bound on average")
            return rec
        rec.update(verdict="pass", reason="")
        return rec
    alt = _alternative_rule(inp, y, declared)
    if alt is not None:
        rec.update(verdict="fail", reason=f"{cmp.n_out} output element(s) outside the declared interval; the output "
                                          f"matches {alt[0]}={alt[1]} instead of the declared {alt[0]}={alt[2]}")
        return rec
    widened = _tie_widening(iv, inp, declared) if np.isfinite(iv.y_exact).all() else None
    if widened is not None:
        widen, ties_per_row = widened
        y64 = np.asarray(y, np.float64)
        with np.errstate(invalid="ignore"):
            wide = rounded_interval(dataclasses.replace(
                iv, lo=round_down(iv.y_exact - iv.bound - widen, iv.out_dtype),
                hi=round_up(iv.y_exact + iv.bound + widen, iv.out_dtype), bound=iv.bound + widen), declared)
            lo, hi = wide.lo, wide.hi
        nan_ref = np.isnan(iv.y_exact)
        inside_decl = (y64 >= iv.lo) & (y64 <= iv.hi)
        inside_tie = ((y64 >= lo) & (y64 <= hi)) | (nan_ref & np.isnan(y64))
        if inside_tie.all():
            rows = np.nonzero(~(inside_decl | (nan_ref & np.isnan(y64))).all(axis=1))[0]
            rec["tie_flips"] = int(ties_per_row[rows].sum())
            rec.update(verdict="pass-with-tie-flips",
                       reason=f"outside the declared interval only where {rec['tie_flips']} activation tie(s) "
                              f"in {len(rows)} row(s) can flip")
            return rec
    if rounding_only:
        rec.update(verdict="fail", reason=f"{cmp.n_out} output element(s) are not the declared rounding "
                                          f"({(declared.output_rounding or 'rne').lower()}) of any accumulator "
                                          "within the bound (e.g. truncated instead of rounded to nearest)")
        return rec
    rec.update(verdict="fail", reason=f"{cmp.n_out} output element(s) outside the declared interval")
    return rec


# -- waivers --------------------------------------------------------------------------------------
@dataclasses.dataclass
class Waiver:
    backend: str
    scheme: str
    case: str
    reason: str
    issue: str
    expires: str

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
        out.append(Waiver(str(w["backend"]), str(w["scheme"]), str(w["case"]), str(w["reason"]), str(w["issue"]),
                          str(w["expires"])))
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


class Runner:
    def __init__(self, out_dir: "str | Path", *, timeout: float = 120.0, jobs: int = 1, waivers=None,
                 progress: bool = True, worker_env: dict | None = None, on_output=None):
        self.out_dir = Path(out_dir)
        #: optional callback(label, spec, inp, declared, interval, y, rec), called (from worker threads)
        #: for every judged output before its result line is written; conformance/certify.py keeps the
        #: observed outputs and intervals with it
        self.on_output = on_output
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.results_path = self.out_dir / "results.jsonl"
        self.timeout = timeout
        self.jobs = max(1, int(jobs))
        self.waivers = waivers or []
        self.progress = progress
        self.worker_env = worker_env
        self._lock = threading.Lock()
        self._done = 0
        self._total = 0

    def _write(self, rec: dict) -> None:
        with self._lock:
            with open(self.results_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec, default=_json_default) + "\n")
                f.flush()
                os.fsync(f.fileno())
            self._done += 1
            if callable(self.progress):  # e.g. conformance/console.py's line printer for logs and pipes
                self.progress(self._done, self._total, rec)
            elif self.progress:
                width = 30
                frac = self._done / max(self._total, 1)
                bar = "#" * int(width * frac) + "-" * (width - int(width * frac))
                sys.stderr.write(f"\r[{bar}] {self._done}/{self._total} {rec['backend'][:20]:20s} {rec['verdict']:20s}")
                sys.stderr.flush()

    def hello(self, backend_spec: str) -> dict:
        w = WorkerProcess(backend_spec, env=self.worker_env)
        try:
            r = w.request({"op": "hello"}, timeout=self.timeout)
        finally:
            w.close()
        return r

    def run(self, backend_specs: list[str], specs: list[CaseSpec], *, resume: bool = True,
            header: dict | None = None) -> list[dict]:
        done = set()
        if resume:
            for r in read_results(self.results_path):
                if r.get("kind") == "result":
                    done.add((r["backend"], r["case_id"]))
        if header is not None:
            with open(self.results_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(dict(header, kind="run"), default=_json_default) + "\n")
        results: list[dict] = []
        today = time.strftime("%Y-%m-%d")
        for bspec in backend_specs:
            hello = self.hello(bspec)
            label = hello.get("label", bspec)
            # one line per backend: version and device, for the reports' environment section
            with self._lock, open(self.results_path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"kind": "backend", "backend": label, "spec": bspec,
                                    "available": bool(hello.get("ok") and hello.get("available")),
                                    "reason": hello.get("reason") or hello.get("error") or "",
                                    "version": hello.get("version"), "device": hello.get("device"),
                                    "covers": hello.get("covers")}, default=_json_default) + "\n")
            todo = [s for s in specs if (label, s.case_id) not in done]
            self._total += len(todo)
            if not hello.get("ok") or not hello.get("available"):
                reason = hello.get("reason") or hello.get("error") or "unavailable"
                for s in todo:
                    rec = self._record(label, s, "unsupported", f"backend unavailable: {reason}")
                    self._write(rec)
                    results.append(rec)
                continue
            chunks = [todo[i::self.jobs] for i in range(self.jobs)]
            with ThreadPoolExecutor(max_workers=self.jobs) as ex:
                for part in ex.map(lambda c: self._run_chunk(bspec, label, c, today), chunks):
                    results.extend(part)
        if self.progress and not callable(self.progress) and self._total:
            sys.stderr.write("\n")
        return results

    def _record(self, label: str, spec: CaseSpec, verdict: str, reason: str, **extra) -> dict:
        rec = {"kind": "result", "backend": label, "case_id": spec.case_id, "tier": spec.tier,
               "scheme": spec.case.scheme, "weight_format": spec.case.weight_format, "generator": spec.generator,
               "verdict": verdict, "reason": reason, "spec": spec.to_json()}
        rec.update(extra)
        return rec

    def _apply_waiver(self, label: str, spec: CaseSpec, rec: dict, today: str) -> dict:
        for w in self.waivers:
            if w.matches(label, spec):
                if w.expired(today):
                    rec["waiver_expired"] = {"issue": w.issue, "expires": w.expires, "reason": w.reason}
                    rec["reason"] = (rec.get("reason") or "") + f" (waiver {w.issue} expired {w.expires})"
                    if rec["verdict"] not in BAD:
                        rec["verdict"] = "fail"
                    return rec
                if rec.get("level") == "semantic":  # a waiver naming the case accepts its semantic deviation
                    rec["deviation_waiver"] = {"issue": w.issue, "reason": w.reason, "expires": w.expires}
                if rec["verdict"] in BAD:
                    rec["waived_verdict"] = rec["verdict"]
                    rec["verdict"] = "waived"
                    rec["waiver"] = {"issue": w.issue, "reason": w.reason, "expires": w.expires}
                elif rec.get("level") != "semantic":
                    rec["unexpected_pass_of_waived_case"] = {"issue": w.issue, "reason": w.reason}
                return rec
        return rec

    def _run_chunk(self, bspec: str, label: str, specs: list[CaseSpec], today: str) -> list[dict]:
        out = []
        worker = WorkerProcess(bspec, env=self.worker_env)
        tmpdir = Path(tempfile.mkdtemp(prefix="qconform-y-"))
        try:
            for spec in specs:
                rec = self._run_one(worker, label, spec, tmpdir)
                rec = self._apply_waiver(label, spec, rec, today)
                self._write(rec)
                out.append(rec)
        finally:
            worker.close()
        return out

    def _run_one(self, worker: WorkerProcess, label: str, spec: CaseSpec, tmpdir: Path) -> dict:
        t0 = time.perf_counter()
        plan = worker.request({"op": "plan", "spec": spec.to_json()}, timeout=self.timeout)
        if not plan.get("ok"):
            return self._record(label, spec, plan.get("kind") if plan.get("kind") in ("crash", "timeout") else "crash",
                                f"planning failed: {plan.get('error')}", seconds=time.perf_counter() - t0)
        if not plan.get("supported"):
            return self._record(label, spec, "unsupported", plan.get("reason", ""), seconds=time.perf_counter() - t0)
        declared = Declared(**plan["declared"])
        ypath = tmpdir / "y.safetensors"
        if ypath.exists():
            ypath.unlink()
        reply = worker.request({"op": "run", "spec": spec.to_json(), "out": str(ypath)}, timeout=self.timeout)
        inp = spec.inputs()
        if not reply.get("ok"):
            kind = reply.get("kind")
            verdict = "timeout" if kind == "timeout" else "crash"
            reason = reply.get("error", "")
            rec = self._record(label, spec, verdict, reason, declared=declared.to_json(),
                               seconds=time.perf_counter() - t0)
            rec["bundle"] = str(self._bundle(label, spec, inp, declared, verdict, reason, None, None))
            return rec
        from emulator.tensorfile import load_tensors

        y = load_tensors(ypath)["y"].data
        try:
            iv = declared_interval(inp, declared)
        except Exception as e:
            return self._record(label, spec, "crash", f"reference failed for this declaration: {type(e).__name__}: {e}",
                                declared=declared.to_json(), seconds=time.perf_counter() - t0)
        metrics = judge(inp, iv, y, declared)
        verdict = metrics.pop("verdict")
        reason = metrics.pop("reason")
        rec = self._record(label, spec, verdict, reason, declared=declared.to_json(), metrics=metrics,
                           seconds=time.perf_counter() - t0, kernel_s=reply.get("run_s"),
                           **assess(spec.case, declared, inp, y))
        if verdict == "fail":
            rec["bundle"] = str(self._bundle(label, spec, inp, declared, verdict, reason, y, iv))
        if self.on_output is not None:
            self.on_output(label, spec, inp, declared, iv, y, rec)
        return rec

    def _bundle(self, label, spec, inp, declared, verdict, reason, y, iv) -> Path:
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{label}__{spec.case_id}")
        path = self.out_dir / "bundles" / (safe[:180] + ".safetensors")
        save_bundle(path, inp, spec=spec.to_json(), backend=label, declared=declared.to_json() if declared else None,
                    verdict=verdict, reason=reason, y=y, interval=iv)
        return path


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o))
