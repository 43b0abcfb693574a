"""``verify-bundle --rerun N``: re-execute N randomly chosen cases of a bundle on their backend.

Semantics: docs/certification.md#audit. Offline verification proves a bundle complete and
self-consistent; it cannot prove that the stored outputs came from the kernel. The audit re-runs a
seeded random sample where the backend is available: a deterministic backend must reproduce the
stored output bit for bit; one that declares itself non-deterministic (``deterministic = False``)
must land on the same verdict against the stored interval. A refused case must still be refused
(for the same reason) and a run case must still be accepted, with the same declared arithmetic.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["rerun_cases"]


def rerun_cases(folder: Path, meta: dict, latest: dict, stored_all: dict, n: int, seed, timeout, res) -> int:
    """Re-execute ``n`` cases chosen with ``seed`` (random when None); problems and notes go into ``res``."""
    from conformance.run.workerproc import WorkerProcess

    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    seed = int(seed)
    keys = sorted(latest, key=lambda k: (str(k[0]), str(k[1])))
    chosen = random.Random(seed).sample(keys, min(int(n), len(keys)))
    res.notes.append(f"rerun: {len(chosen)} case(s) chosen with seed {seed} (repeat: --rerun {n} --rerun-seed "
                     f"{seed}): " + ", ".join(f"{b} {cid}" for b, cid in chosen))
    t = float(timeout or 120.0)
    workers: dict = {}
    tmp = Path(tempfile.mkdtemp(prefix="qconform-rerun-"))
    try:
        for b, cid in chosen:
            rec = latest[(b, cid)]
            if b not in workers:
                info = (meta.get("backends") or {}).get(b) or {}
                w = WorkerProcess(str(info.get("spec") or b))
                hello = w.request({"op": "hello"}, timeout=t)
                if not (hello.get("ok") and hello.get("available")) or hello.get("label") != b:
                    why = hello.get("reason") or hello.get("error") or f"it calls itself {hello.get('label')!r}"
                    res.notes.append(f"rerun: backend {b} is not available here ({why}): its chosen cases were "
                                     "not re-executed")
                    w.close()
                    workers[b] = None
                else:
                    workers[b] = (w, hello)
            if workers[b] is None:
                res.checked["rerun_skipped"] += 1
                continue
            w, hello = workers[b]
            _rerun_one(w, bool(hello.get("deterministic", True)), rec, stored_all.get(b, {}).get(cid), t, tmp, res)
    finally:
        for x in workers.values():
            if x is not None:
                x[0].close()
        shutil.rmtree(tmp, ignore_errors=True)
    return seed


def _rerun_one(w, deterministic: bool, rec: dict, entry, timeout: float, tmp: Path, res) -> None:
    from emulator.tensorfile import load_tensors

    from conformance.certify.codec import same_values, decode_case
    from conformance.certify.offline import offline_verdict

    who = f"{rec['backend']} {rec['case_id']}"
    raw = rec.get("waived_verdict") or rec.get("verdict")
    problems, notes = res.problems, res.notes
    plan = w.request({"op": "plan", "spec": rec["spec"]}, timeout=timeout)
    res.checked["rerun"] += 1
    if not plan.get("ok"):
        (notes if raw in ("crash", "timeout") else problems).append(
            f"{who}: rerun: planning failed ({plan.get('kind')}: {plan.get('error')}); the bundle records {raw}")
        return
    if not plan.get("supported"):
        if raw != "unsupported":
            problems.append(f"{who}: rerun: the backend refuses this case ({plan.get('reason')}); the bundle records "
                            f"{raw}")
        elif (plan.get("reason") or "").strip() != rec.get("reason"):
            problems.append(f"{who}: rerun: refused for {plan.get('reason')!r}, the bundle records {rec.get('reason')!r}")
        return
    if raw == "unsupported":
        problems.append(f"{who}: rerun: the backend accepts this case; the bundle records it unsupported "
                        f"({rec.get('reason')})")
        return
    if plan.get("declared") != rec.get("declared"):
        problems.append(f"{who}: rerun: the backend declares other arithmetic than the bundle records")
        return
    ypath = tmp / "y.safetensors"
    if ypath.exists():
        ypath.unlink()
    reply = w.request({"op": "run", "spec": rec["spec"], "out": str(ypath)}, timeout=timeout)
    if not reply.get("ok"):
        if raw in ("crash", "timeout") or (rec.get("evidence") or {}).get("malformed"):
            return
        problems.append(f"{who}: rerun: {reply.get('kind')} ({reply.get('error')}); the bundle records {raw}")
        return
    if raw in ("crash", "timeout"):
        notes.append(f"{who}: rerun: recorded {raw}, ran to completion now (an intermittent fault?)")
        return
    if entry is None:
        problems.append(f"{who}: rerun: produced an output; the bundle records {raw} without one")
        return
    if entry["meta"].get("kind") == "quantize":  # the quantize-only outputs are judged exactly: compare them
        from conformance.judge.quantized import decide_quantized, load_observed
        from conformance.certify.codec import decode_quantized

        obs, _exp = decode_quantized(entry)
        again = decide_quantized(load_observed(ypath), obs)
        if again["verdict"] not in ("pass", "mistrusted"):
            problems.append(f"{who}: rerun: the quantized output differs from the stored one ({again['reason']})")
        return
    y2 = np.asarray(load_tensors(ypath)["y"].data, np.float64)
    d = decode_case(entry["tensors"], entry["meta"])
    if deterministic:
        if not same_values(y2, d["y"]):
            n = int(np.sum(~((y2 == d["y"]) | (np.isnan(y2) & np.isnan(d["y"]))))) if y2.shape == d["y"].shape else -1
            problems.append(f"{who}: rerun: the output differs from the stored one "
                            + (f"in {n} element(s)" if n >= 0 else f"(shape {y2.shape}, stored {d['y'].shape})")
                            + ": the stored output is not what this kernel computes")
        return
    again = offline_verdict(dict(d, y=y2), entry["meta"], rec.get("declared")).verdict
    stored = offline_verdict(d, entry["meta"], rec.get("declared")).verdict
    if again != stored:
        problems.append(f"{who}: rerun: the new output is {again} against the stored interval, the stored one {stored}")
