"""The runner's side of the worker protocol as calls: ``hello``, ``plan``, ``run``, each returning a dataclass.

Semantics: docs/conformance.md#isolation. The requests and replies are those conformance/run/worker.py
documents (one JSON object a line); ``WorkerProcess`` (conformance/run/workerproc.py) carries them and turns a
dead or silent worker into a ``crash`` or ``timeout`` reply. Every module that talks to a worker goes
through ``WorkerClient``, so a request is built in one place.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from emulator.declaration import Declared

__all__ = ["WorkerClient", "WorkerFailure", "Hello", "Plan", "RunReply", "LocalizeReply"]


@dataclasses.dataclass(frozen=True)
class WorkerFailure:
    """A request the worker did not answer with ok. ``kind``: ``crash`` or ``timeout`` (the worker died or
    was killed: ``evidence`` says how, with its log), ``error`` (the backend raised: ``traceback``),
    ``malformed`` (the kernel's output is not a real-valued array), ``protocol`` (the worker did not follow it)."""

    kind: str
    error: str
    evidence: dict = dataclasses.field(default_factory=dict)
    traceback: str = ""

    @classmethod
    def from_reply(cls, reply: dict) -> "WorkerFailure":
        return cls(str(reply.get("kind") or "protocol"), str(reply.get("error") or ""),
                   dict(reply.get("evidence") or {}), str(reply.get("traceback") or ""))


@dataclasses.dataclass(frozen=True)
class Hello:
    """The backend's availability (``available`` False with ``reason``; ``failure`` when the worker failed)."""

    available: bool
    reason: str
    label: "str | None" = None
    version: "str | None" = None
    device: "str | None" = None
    covers: "list | None" = None
    deterministic: bool = True
    failure: "WorkerFailure | None" = None

    @property
    def why_unavailable(self) -> str:
        return self.reason or (self.failure.error if self.failure else "") or "unavailable"


@dataclasses.dataclass(frozen=True)
class Plan:
    """Whether the backend implements a case (``reason`` when not) and what it declares."""

    supported: bool
    reason: str = ""
    declared: "Declared | None" = None
    failure: "WorkerFailure | None" = None


@dataclasses.dataclass(frozen=True)
class RunReply:
    """A run that wrote its output file (``prepare_s``, ``run_s``: the backend's own timings), or its failure."""

    prepare_s: "float | None" = None
    run_s: "float | None" = None
    failure: "WorkerFailure | None" = None

    @property
    def ok(self) -> bool:
        return self.failure is None


@dataclasses.dataclass(frozen=True)
class LocalizeReply:
    """The worker's localization of a failing case (conformance/judge/localize.py: docs/conformance.md#failure-localization),
    or its failure."""

    localization: "dict | None" = None
    failure: "WorkerFailure | None" = None


class WorkerClient:
    """Calls on one worker process (``conformance.run.workerproc.WorkerProcess``), each within ``timeout`` seconds."""

    def __init__(self, process, timeout: float):
        self.process = process
        self.timeout = timeout

    def hello(self) -> Hello:
        r = self.process.request({"op": "hello"}, timeout=self.timeout)
        if not r.get("ok"):
            f = WorkerFailure.from_reply(r)
            return Hello(False, "", failure=f)
        return Hello(bool(r.get("available")), str(r.get("reason") or ""), r.get("label"), r.get("version"),
                     r.get("device"), r.get("covers"), bool(r.get("deterministic", True)))

    def plan(self, spec, bundle: "str | Path | None" = None) -> Plan:
        """``spec``: a CaseSpec or its JSON form; ``bundle``: the inputs the case will run on where they are not
        ``spec``'s own (a dispatcher plans on them: backends/auto.py ``plan_on``)."""
        req = {"op": "plan", "spec": _spec_json(spec)}
        if bundle is not None:
            req["bundle"] = str(bundle)
        r = self.process.request(req, timeout=self.timeout)
        if not r.get("ok"):
            return Plan(False, failure=WorkerFailure.from_reply(r))
        if not r.get("supported"):
            return Plan(False, str(r.get("reason") or ""))
        return Plan(True, str(r.get("reason") or ""), Declared(**r["declared"]))

    def run(self, out: "str | Path", *, spec=None, bundle: "str | Path | None" = None,
            inputs_sha256: "str | None" = None) -> RunReply:
        """Run the case of ``spec`` (inputs regenerated in the worker) or of the inputs in ``bundle`` (with
        ``inputs_sha256``, the worker refuses other bytes) and write the output to ``out``."""
        req: dict = {"op": "run", "out": str(out)}
        if spec is not None:
            req["spec"] = _spec_json(spec)
        if bundle is not None:
            req["bundle"] = str(bundle)
            if inputs_sha256 is not None:
                req["inputs_sha256"] = inputs_sha256
        if "spec" not in req and "bundle" not in req:
            raise ValueError("run needs a spec or a bundle")
        r = self.process.request(req, timeout=self.timeout)
        if not r.get("ok"):
            return RunReply(failure=WorkerFailure.from_reply(r))
        return RunReply(r.get("prepare_s"), r.get("run_s"))

    def localize(self, declared: Declared, *, spec=None, bundle: "str | Path | None" = None) -> LocalizeReply:
        """Probe the kernel on the case's own weights, and run its own activation rows one at a time (the inputs of
        ``spec`` or ``bundle``, as ``run`` took them)."""
        req: dict = {"op": "localize", "declared": declared.to_json()}
        if bundle is not None:
            req["bundle"] = str(bundle)
        if spec is not None:
            req["spec"] = _spec_json(spec)
        r = self.process.request(req, timeout=self.timeout)
        if not r.get("ok"):
            return LocalizeReply(failure=WorkerFailure.from_reply(r))
        return LocalizeReply(r["localization"])

    def close(self) -> None:
        self.process.close()


def _spec_json(spec) -> dict:
    return spec if isinstance(spec, dict) else spec.to_json()
