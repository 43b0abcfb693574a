"""Backend worker: runs cases for one backend in its own process.

Semantics: docs/conformance.md#isolation. The runner (``conformance.run.runner.WorkerProcess``) starts
``python -m conformance.run.worker --backend SPEC --request-fd R --reply-fd W [--memory-limit BYTES]``
with its stdin on /dev/null and its file descriptors 1 and 2 on its log file (at the OS level, so
what a kernel writes there with ``printf``, ``os.write`` or a library's logger ends in the log). The
runner's requests arrive on fd R and the replies leave on fd W, one JSON object a line: nothing a
kernel prints can reach that channel.

A segfault, abort or hang in a kernel kills only this process (and its process group); the runner
records ``crash`` (with the signal) or ``timeout`` and starts a fresh worker for the remaining cases.
The worker exits when its parent goes (it polls its parent's pid), taking its process group along.

Requests:
  {"op": "hello"}                                 -> availability
  {"op": "plan", "spec": {...}}                  -> can_implement + declared
  {"op": "run", "spec": {...}, "out": "y.safetensors"} -> runs, writes tensor "y"
  {"op": "run", "bundle": "case.safetensors", "out": ...}  (inputs from a bundle: a replay, or the run's
                                                  shared inputs with "inputs_sha256", checked before running)
  (a quantize-only case writes its named tensors "q.<name>" instead of "y": docs/conformance.md#quantize-only-cases)
  {"op": "localize", "spec" | "bundle", "declared": {...}} -> {"localization": {...}}: probes run on the
                                                  case's own weights, and its own activation rows one
                                                  at a time (conformance/judge/localize.py)
  {"op": "exit"}
A kernel output that is not a real-valued array (None, a scalar, complex, object) is refused with
``{"ok": false, "kind": "malformed", "error": ...}``; a Python exception (MemoryError under the
memory cap included) with ``{"ok": false, "kind": "error", ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback


def _watch_parent(ppid: int) -> None:
    """Exit (with the whole process group: forked kernel helpers too) when the parent process goes."""
    while True:
        time.sleep(0.5)
        if os.getppid() != ppid:
            try:
                os.killpg(os.getpgid(0), signal.SIGKILL)
            finally:
                os._exit(3)


def _cap_memory(limit: int) -> None:
    """RLIMIT_DATA: the heap and private writable mappings, i.e. what NumPy, torch and malloc allocate.

    Not RLIMIT_AS: GPU runtimes reserve far more address space than they use (inaccessible mappings,
    which RLIMIT_DATA does not count), and an address-space cap would stop them at initialisation.
    """
    if limit <= 0:
        return
    import resource

    try:
        _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        value = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (value, hard))
    except (ValueError, OSError):
        pass


def output_problem(y) -> "tuple[object, str | None]":
    """(float32 array, None) for a usable kernel output, else (None, what is wrong with it)."""
    import numpy as np

    if y is None:
        return None, "the kernel returned None"
    try:
        a = np.asarray(y)
    except Exception as e:  # noqa: BLE001 - whatever the kernel returned
        return None, f"the kernel returned a {type(y).__name__} that is not an array ({type(e).__name__}: {e})"
    if a.dtype.kind == "c":
        return None, f"the kernel returned complex values ({a.dtype}): the output must be real"
    if a.dtype.kind not in "fiubV" or a.dtype == object:
        return None, f"the kernel returned an array of dtype {a.dtype}, not numbers"
    if a.ndim == 0:
        return None, f"the kernel returned a scalar ({a.dtype}), not an output matrix"
    try:
        return np.asarray(a, dtype=np.float32), None
    except (TypeError, ValueError) as e:
        return None, f"the kernel's output of dtype {a.dtype} does not convert to float32 ({e})"


#: the dtypes a quantize-only output tensor may travel in (the judge then checks the contract's dtype)
QUANT_DTYPES = ("int8", "uint8", "int16", "int32", "int64", "float16", "float32", "float64", "bool")


def quantized_problem(out) -> "tuple[dict | None, str | None]":
    """({name: array}, None) for a quantize-only output that can be stored and judged, else (None, why)."""
    import numpy as np

    if not isinstance(out, dict):
        return None, f"the backend returned a {type(out).__name__}, not a dict of named tensors"
    arrays = {}
    for k, v in out.items():
        if not isinstance(k, str) or not k or not all(ch.isalnum() or ch == "_" for ch in k):
            return None, f"output tensor name {k!r} is not a plain name"
        if v is None:
            return None, f"output tensor {k!r} is None"
        try:
            a = np.asarray(v)
        except Exception as e:  # noqa: BLE001 - whatever the backend returned
            return None, f"output tensor {k!r} is a {type(v).__name__} that is not an array ({e})"
        if a.dtype.name not in QUANT_DTYPES:
            return None, f"output tensor {k!r} has dtype {a.dtype}, not one of {', '.join(QUANT_DTYPES)}"
        arrays[k] = np.ascontiguousarray(a)
    return arrays, None


def main(argv=None) -> int:
    args = _parse_args(argv)
    requests, reply = _open_channel(args)
    sys.stdout = sys.stderr  # Python-level prints go to the log too (fds 1 and 2 are the log already)
    os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("QCONFORM_WORKER_THREADS", "1"))

    from backends.registry import create  # (after OMP_NUM_THREADS: a kernel library reads it on import)
    from emulator import tensorfile  # noqa: F401 - what the handlers use, loaded before the backend as always

    from conformance.cases import bundle, suite  # noqa: F401

    backend = create(args.backend)
    for line in requests:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
        except json.JSONDecodeError as e:
            reply({"ok": False, "kind": "protocol", "error": f"bad request: {e}"})
            continue
        op = req.get("op")
        try:
            if op == "exit":
                reply({"ok": True})
                return 0
            handler = _OPS.get(op)
            reply(handler(backend, req) if handler else {"ok": False, "kind": "protocol", "error": f"unknown op {op!r}"})
        except Exception as e:  # the backend's own failure (MemoryError under the cap too): report it, keep serving
            reply({"ok": False, "kind": "error", "error": f"{type(e).__name__}: {e}"[:2000],
                   "traceback": traceback.format_exc(limit=6)[-4000:]})
    return 0


def _parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", required=True)
    ap.add_argument("--request-fd", type=int, required=True)
    ap.add_argument("--reply-fd", type=int, required=True)
    ap.add_argument("--memory-limit", type=int, default=0, help="bytes; 0: no cap")
    return ap.parse_args(argv)


def _open_channel(args: argparse.Namespace):
    """(the request lines, reply(obj)): the protocol channel on its own fds, kept from the kernel's children;
    the parent watched and the memory capped first."""
    # children the kernel starts (exec) do not get the protocol channel
    for fd in (args.request_fd, args.reply_fd):
        os.set_inheritable(fd, False)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    _cap_memory(args.memory_limit)
    requests = os.fdopen(args.request_fd, "r", encoding="utf-8")
    replies = os.fdopen(args.reply_fd, "w", encoding="utf-8")

    def reply(obj: dict) -> None:
        replies.write(json.dumps(obj) + "\n")
        replies.flush()

    return requests, reply


def _hello(backend, req: dict) -> dict:
    av = backend.availability()
    return {"ok": True, "available": av.available, "reason": av.reason, "version": av.version,
            "device": av.device, "label": backend.label, "covers": backend.covers,
            "deterministic": bool(getattr(backend, "deterministic", True))}


def _plan(backend, req: dict) -> dict:
    from conformance.cases.bundle import load_bundle_inputs
    from conformance.cases.suite import CaseSpec

    spec = CaseSpec.from_json(req["spec"])
    if hasattr(backend, "plan_on"):  # a dispatcher judges its choice on the case's own activations
        backend.plan_on(load_bundle_inputs(req["bundle"])[0] if "bundle" in req else spec.inputs())
    sup = backend.can_implement(spec.case)
    decl = backend.declared(spec.case).to_json() if sup.ok else None
    return {"ok": True, "supported": sup.ok, "reason": sup.reason, "declared": decl}


def _request_inputs(req: dict):
    """The case's inputs: from the request's bundle (its "inputs_sha256", where given, checked) or its spec."""
    from conformance.cases.bundle import load_bundle_inputs
    from conformance.cases.suite import CaseSpec

    if "bundle" not in req:
        return CaseSpec.from_json(req["spec"]).inputs()
    inp, _meta = load_bundle_inputs(req["bundle"])
    if "inputs_sha256" in req:  # the runner judges against the inputs it hashed: same bytes only
        from conformance.run.refcache import inputs_digest

        if inputs_digest(inp) != req["inputs_sha256"]:
            raise RuntimeError(f"{req['bundle']}: inputs differ from the ones the runner judges "
                               "against (sha256 mismatch); not run")
    return inp


def _run(backend, req: dict) -> dict:
    from emulator.tensorfile import save_tensors

    inp = _request_inputs(req)
    t0 = time.perf_counter()
    prepared = backend.prepare(inp.case, inp.tensors)
    t1 = time.perf_counter()
    if inp.case.spec.quantize_only:  # docs/conformance.md#quantize-only-cases
        q, problem = quantized_problem(backend.quantize(prepared, inp.x))
        t2 = time.perf_counter()
        if problem:
            return {"ok": False, "kind": "malformed", "error": problem}
        save_tensors(req["out"], {"q." + k: v for k, v in q.items()}, metadata={"quantized": "1"})
        return {"ok": True, "prepare_s": t1 - t0, "run_s": t2 - t1}
    y = backend.run(prepared, inp.x, bias=inp.bias, router_logits=inp.router_logits)
    t2 = time.perf_counter()
    y, problem = output_problem(y)
    if problem:
        return {"ok": False, "kind": "malformed", "error": problem}
    save_tensors(req["out"], {"y": y})
    return {"ok": True, "prepare_s": t1 - t0, "run_s": t2 - t1}


def _localize(backend, req: dict) -> dict:
    """docs/conformance.md#failure-localization: probes on the case's own weights."""
    from backends.base import Declared

    from conformance.cases.bundle import load_bundle_inputs
    from conformance.cases.suite import CaseSpec
    from conformance.judge.localize import localize, to_json

    inp = load_bundle_inputs(req["bundle"])[0] if "bundle" in req else CaseSpec.from_json(req["spec"]).inputs()
    prepared = backend.prepare(inp.case, inp.tensors)

    def probe(x, bias, _p=prepared, router_logits=None):
        y, problem = output_problem(backend.run(_p, x, bias=bias, router_logits=router_logits))
        if problem:
            raise ValueError(problem)
        return y

    loc = localize(inp.case, inp.tensors, Declared(**req["declared"]), probe, inp.bias, x=inp.x,
                   router_logits=inp.router_logits)
    return {"ok": True, "localization": to_json(loc)}


#: the request ops besides "exit": op -> handler(backend, request) -> reply
_OPS = {"hello": _hello, "plan": _plan, "run": _run, "localize": _localize}


if __name__ == "__main__":
    sys.exit(main())
