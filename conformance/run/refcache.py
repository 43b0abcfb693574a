"""One run's inputs and acceptance intervals, computed once per case and shared by every backend.

Semantics: docs/conformance.md#reference-sharing. At real layer sizes (the model profile) drawing a
case's inputs and computing its exact reference and interval cost seconds each; the runner judges
every backend of a run on the same cases, so it computes them once:

- ``inputs(spec)``: the case's inputs, drawn once and written as a bundle file; every backend's
  worker runs from that file (not from its own draw), so the tensors a kernel saw are byte for byte
  the tensors the reference was computed from. Returned with their content digest (SHA-256 over
  the case, every tensor's name, dtype, shape and bytes).
- ``interval(inp, declared)``: the interval of a declaration, keyed by SHA-256 of the inputs' digest
  (computed here, from the arrays passed), the declaration and ``REFERENCE_FORMAT``.

Why a cached reference cannot stand for other inputs: the key is a function of the inputs' *content*
(not of the case id or seed), and a file is used only when its own metadata names that key and that
inputs digest and the digest of its arrays matches the arrays read back; anything else (a stale,
truncated or altered file) is recomputed and rewritten. The folder belongs to one Runner of one
process (``.work/refcache-<pid>-<n>`` in the output folder, removed when the run ends), so no file
outlives the run that wrote it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np

from backends.base import Declared

from conformance.judge.acceptance import Interval, declared_interval
from conformance.cases.bundle import ReplayBundle, load_bundle_inputs, save_bundle
from conformance.cases.inputs import CaseInputs

__all__ = ["REFERENCE_FORMAT", "ReferenceCache", "inputs_digest"]

#: bumped when what an interval file holds changes; part of every key
REFERENCE_FORMAT = "qconform-refcache-2"  # 2: typed Interval intermediates
_ARRAYS = ("y_ref", "y_exact", "lo", "hi", "bound")
_GRID = ("y_ref", "lo", "hi")  # values on the output dtype's grid: float32 holds them exactly
_counter = itertools.count(1)


def _update(h, name: str, a) -> None:
    a = np.ascontiguousarray(a)
    h.update(f"{name}|{a.dtype.str if a.dtype.name != 'bfloat16' else 'bf16'}|{a.shape}|".encode())
    h.update(a.view(np.uint8).reshape(-1).data if a.size else b"")


def inputs_digest(inp: CaseInputs) -> str:
    """SHA-256 of a case's inputs: the case, then every checkpoint tensor, x, bias and router logits."""
    h = hashlib.sha256(json.dumps(inp.case.to_json(), sort_keys=True).encode())
    for k in sorted(inp.tensors):
        _update(h, "tensor." + k, inp.tensors[k])
    for name in ("x", "bias", "router_logits"):
        v = getattr(inp, name)
        if v is not None:
            _update(h, name, v)
    return h.hexdigest()


def _arrays_digest(tensors: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(tensors):
        _update(h, k, tensors[k])
    return h.hexdigest()


class ReferenceCache:
    """Inputs and intervals of one run (docs/conformance.md#reference-sharing); thread-safe."""

    def __init__(self, parent: "str | Path"):
        # absolute: worker processes run in their own directories, and a path relative to this one
        # (`qconform run --out qconform-out`) would name a file they cannot find
        self.folder = Path(parent).resolve() / f"refcache-{os.getpid()}-{next(_counter)}"
        self._lock = threading.Lock()
        self._inputs: dict[str, tuple[Path, str]] = {}  # case id -> (bundle path, inputs digest)
        self.stats = {"inputs_drawn": 0, "inputs_reused": 0, "intervals_computed": 0, "intervals_reused": 0,
                      "rejected": 0}

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def _name(self, text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    # -- inputs -------------------------------------------------------------------------------------
    def inputs(self, spec) -> tuple[CaseInputs, Path, str]:
        """(inputs, bundle file a worker runs them from, their digest) of ``spec``, drawn once per run."""
        entry = self._inputs.get(spec.case_id)
        if entry is not None:
            path, digest = entry
            try:
                inp, meta = load_bundle_inputs(path)
                if json.loads(meta["spec"]) == spec.to_json() and inputs_digest(inp) == digest:
                    self._count("inputs_reused")
                    return inp, path, digest
            except Exception:  # noqa: BLE001 - an unreadable file is redrawn, never trusted
                pass
            self._count("rejected")
        inp = spec.inputs()
        digest = inputs_digest(inp)
        path = self.folder / f"inputs-{self._name(spec.case_id)}.safetensors"
        tmp = path.with_suffix(f".tmp{threading.get_ident()}")
        save_bundle(tmp, ReplayBundle(inp, spec.to_json(), reason="inputs"))
        os.replace(tmp, path)
        self._inputs[spec.case_id] = (path, digest)
        self._count("inputs_drawn")
        return inp, path, digest

    # -- intervals ----------------------------------------------------------------------------------
    def key(self, digest: str, declared: Declared) -> str:
        """SHA-256 of the format, the inputs' digest and every field of the declaration but its free-text
        ``notes`` (which no interval reads: two backends declaring the same arithmetic share it)."""
        decl = {k: v for k, v in declared.to_json().items() if k != "notes"}
        return hashlib.sha256(json.dumps([REFERENCE_FORMAT, digest, decl], sort_keys=True,
                                         default=str).encode()).hexdigest()

    def interval(self, inp: CaseInputs, declared: Declared) -> Interval:
        """``declared_interval(inp, declared)``, computed once per (inputs, declaration) in this run.

        The key is derived here from the content of ``inp`` (no caller-supplied digest can point it at
        another case's file)."""
        digest = inputs_digest(inp)
        key = self.key(digest, declared)
        path = self.folder / f"ref-{key[:32]}.safetensors"
        if path.exists():
            iv = self._load(path, key, digest, inp.case)
            if iv is not None:
                self._count("intervals_reused")
                return iv
            self._count("rejected")
        iv = declared_interval(inp, declared)
        self._save(path, key, digest, iv)
        self._count("intervals_computed")
        return iv

    def _save(self, path: Path, key: str, digest: str, iv: Interval) -> None:
        from emulator.tensorfile import save_tensors

        tensors = {}
        for name in _ARRAYS:
            a = np.asarray(getattr(iv, name), np.float64)
            if name in _GRID and iv.out_dtype in ("float32", "float16", "bfloat16"):
                a = a.astype(np.float32)  # exact: every value is on the output grid (or inf / nan)
            tensors[name] = a
        scalars = {}
        for k, v in iv.intermediates().items():
            if isinstance(v, np.ndarray):
                tensors["part." + k] = v
            elif isinstance(v, (str, int, float, bool)) or v is None:
                scalars[k] = v
            else:
                return  # a part this file cannot hold: no file, the interval is recomputed next time
        meta = {"format": REFERENCE_FORMAT, "key": key, "inputs_digest": digest, "out_dtype": iv.out_dtype,
                "parts": json.dumps(scalars), "arrays_sha256": _arrays_digest(tensors)}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{threading.get_ident()}")
        try:
            save_tensors(tmp, tensors, metadata=meta)
        except Exception:  # noqa: BLE001 - e.g. a dtype safetensors cannot hold: simply not cached
            tmp.unlink(missing_ok=True)
            return
        os.replace(tmp, path)

    def _load(self, path: Path, key: str, digest: str, case) -> "Interval | None":
        from emulator.tensorfile import TensorFile

        try:
            tf = TensorFile(path)
            meta = tf.metadata
            if (meta.get("format") != REFERENCE_FORMAT or meta.get("key") != key
                    or meta.get("inputs_digest") != digest):
                return None
            tensors = {k: tf.get(k).data for k in tf.keys()}
            if _arrays_digest(tensors) != meta.get("arrays_sha256"):
                return None
            arrays = {name: np.asarray(tensors[name], np.float64) for name in _ARRAYS}
            parts = {k[len("part."):]: v for k, v in tensors.items() if k.startswith("part.")}
            parts.update(json.loads(meta.get("parts", "{}")))
            shape = (case.M, case.K if case.E else case.N)
            if any(a.shape != shape for a in arrays.values()):
                return None
            return Interval(out_dtype=meta["out_dtype"], **arrays, **parts)
        except Exception:  # noqa: BLE001 - an unreadable file is recomputed, never trusted
            return None

