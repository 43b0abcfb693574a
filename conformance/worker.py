"""Backend worker: runs cases for one backend in its own process.

Semantics: docs/conformance.md#isolation. The runner starts
``python -m conformance.worker --backend SPEC`` and talks to it with one JSON
object per line on stdin/stdout. A segfault, abort or hang in a kernel kills
only this process; the runner records ``crash`` (with the signal) or
``timeout`` and starts a fresh worker for the remaining cases.

Requests:
  {"op": "hello"}                                 -> availability
  {"op": "plan", "spec": {...}}                  -> can_implement + declared
  {"op": "run", "spec": {...}, "out": "y.safetensors"} -> runs, writes tensor "y"
  {"op": "run", "bundle": "case.safetensors", "out": ...}  (inputs from a replay bundle)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback


def _reply(obj: dict) -> None:
    sys.__stdout__.write(json.dumps(obj) + "\n")
    sys.__stdout__.flush()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", required=True)
    args = ap.parse_args(argv)
    # Kernel libraries print to stdout; keep the protocol channel clean.
    sys.stdout = sys.stderr
    os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("QCONFORM_WORKER_THREADS", "1"))

    import numpy as np

    from backends.registry import create
    from emulator.tensorfile import save_tensors

    from .bundle import load_bundle_inputs
    from .suite import CaseSpec

    backend = create(args.backend)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
        except json.JSONDecodeError as e:
            _reply({"ok": False, "kind": "protocol", "error": f"bad request: {e}"})
            continue
        op = req.get("op")
        try:
            if op == "hello":
                av = backend.availability()
                _reply({"ok": True, "available": av.available, "reason": av.reason, "version": av.version,
                        "device": av.device, "label": backend.label, "covers": backend.covers})
            elif op == "plan":
                spec = CaseSpec.from_json(req["spec"])
                sup = backend.can_implement(spec.case)
                decl = backend.declared(spec.case).to_json() if sup.ok else None
                _reply({"ok": True, "supported": sup.ok, "reason": sup.reason, "declared": decl})
            elif op == "run":
                if "bundle" in req:
                    inp, _meta = load_bundle_inputs(req["bundle"])
                else:
                    inp = CaseSpec.from_json(req["spec"]).inputs()
                t0 = time.perf_counter()
                prepared = backend.prepare(inp.case, inp.tensors)
                t1 = time.perf_counter()
                y = backend.run(prepared, inp.x, bias=inp.bias, router_logits=inp.router_logits)
                t2 = time.perf_counter()
                y = np.asarray(y, dtype=np.float32)
                save_tensors(req["out"], {"y": y})
                _reply({"ok": True, "prepare_s": t1 - t0, "run_s": t2 - t1})
            elif op == "exit":
                _reply({"ok": True})
                return 0
            else:
                _reply({"ok": False, "kind": "protocol", "error": f"unknown op {op!r}"})
        except Exception as e:  # the backend's own failure: report it, keep serving
            tb = traceback.format_exc(limit=6)
            _reply({"ok": False, "kind": "error", "error": f"{type(e).__name__}: {e}", "traceback": tb})
    return 0


if __name__ == "__main__":
    sys.exit(main())
