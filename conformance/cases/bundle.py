"""Replay bundles: one safetensors file that reproduces a failing case anywhere.

Semantics: docs/conformance.md#replay. A bundle holds the case's inputs
(checkpoint tensors, x, bias, router logits), the backend's observed output,
the expected interval and reference, and in its metadata the case spec, the
backend label, the declared arithmetic and the verdict. ``qconform replay
BUNDLE [--backend B]`` re-runs the case from the stored tensors (not from the
generator, so a bundle stays valid when generators change) and, with the
emulator alone, recomputes the expected interval.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from backends.base import Case
from emulator.tensorfile import Tensor, save_tensors

from conformance.cases.inputs import CaseInputs

__all__ = ["ReplayBundle", "save_bundle", "load_bundle", "load_bundle_inputs"]

_T = "tensor."


def _plain(a):
    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        return Tensor(a.astype(np.float32), "BF16")
    return a


@dataclasses.dataclass(frozen=True)
class ReplayBundle:
    """What one bundle stores: the case's inputs, its labels (metadata) and what a backend gave, if anything.

    ``spec``: the ``CaseSpec.to_json()`` of the case; ``backend``: the backend label; ``declared``: its
    ``Declared.to_json()``; ``verdict`` and ``reason``: the run's verdict, or what the bundle is for ("probe",
    "golden", "inputs"). ``y``: the observed output; ``interval``: the accepted interval (``y_ref``, ``y_exact``,
    ``lo``, ``hi``); ``quantized``: (observed, expected) tensors of a quantize-only case, stored as
    ``q_observed.<name>`` and ``q_expected.<name>`` in their own dtypes (docs/conformance.md#quantize-only-cases).
    """

    inputs: CaseInputs
    spec: dict
    backend: str = ""
    declared: dict | None = None
    verdict: str = ""
    reason: str = ""
    y: np.ndarray | None = None
    interval: object | None = None  # conformance.judge.acceptance.Interval (a higher room: not imported here)
    quantized: tuple | None = None


def save_bundle(path: "str | Path", bundle: ReplayBundle) -> Path:
    """Write ``bundle`` to ``path`` (its folder created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    inp, y, interval, quantized = bundle.inputs, bundle.y, bundle.interval, bundle.quantized
    tensors = {_T + k: _plain(v) for k, v in inp.tensors.items()}
    tensors["x"] = np.asarray(inp.x, np.float32)
    if inp.bias is not None:
        tensors["bias"] = np.asarray(inp.bias, np.float32)
    if inp.router_logits is not None:
        tensors["router_logits"] = np.asarray(inp.router_logits, np.float32)
    if y is not None:
        tensors["y_observed"] = np.asarray(y, np.float32)
    if interval is not None:
        tensors["y_ref"] = np.asarray(interval.y_ref, np.float64)
        tensors["y_exact"] = np.asarray(interval.y_exact, np.float64)
        tensors["lo"] = np.asarray(interval.lo, np.float64)
        tensors["hi"] = np.asarray(interval.hi, np.float64)
    if quantized is not None:
        for prefix, group in zip(("q_observed.", "q_expected."), quantized):
            for k, v in (group or {}).items():
                tensors[prefix + k] = np.asarray(v)
    scale_dtypes = {k: ("bfloat16" if np.asarray(v).dtype.name == "bfloat16" else str(np.asarray(v).dtype))
                    for k, v in inp.tensors.items()}
    meta = {"qconform_bundle": "1", "spec": json.dumps(bundle.spec), "backend": bundle.backend,
            "declared": json.dumps(bundle.declared), "verdict": bundle.verdict, "reason": bundle.reason,
            "tensor_dtypes": json.dumps(scale_dtypes)}
    save_tensors(path, tensors, metadata=meta)
    return path


def load_bundle(path: "str | Path") -> tuple[dict, dict]:
    """(tensors by name, metadata) of a bundle; raises if the file is not a qconform bundle."""
    from emulator.errors import FormatError
    from emulator.tensorfile import TensorFile

    tf = TensorFile(path)
    meta = tf.metadata
    if meta.get("qconform_bundle") != "1":
        raise FormatError(f"{path}: not a qconform replay bundle (no qconform_bundle metadata)")
    return {k: tf.get(k) for k in tf.keys()}, meta


def load_bundle_inputs(path: "str | Path") -> tuple[CaseInputs, dict]:
    tensors, meta = load_bundle(path)
    spec = json.loads(meta["spec"])
    case = Case(**spec["case"])
    dtypes = json.loads(meta.get("tensor_dtypes", "{}"))
    ck = {}
    for k, t in tensors.items():
        if k.startswith(_T):
            name = k[len(_T):]
            data = t.data
            if dtypes.get(name) == "bfloat16":
                import ml_dtypes

                data = data.astype(ml_dtypes.bfloat16)
            ck[name] = data
    get = lambda n: tensors[n].data if n in tensors else None  # noqa: E731
    inp = CaseInputs(case, int(spec.get("seed", 0)), ck, get("x"), get("bias"), get("router_logits"))
    return inp, meta
