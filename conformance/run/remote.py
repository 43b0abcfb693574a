"""Workers on other hosts: the same isolated worker process, started on a Dask cluster's nodes.

Semantics: docs/scaling.md. ``qconform run/certify --executor dask --address HOST:PORT`` makes each of the
runner's worker slots a ``RemoteWorker``: it has ``WorkerProcess``'s interface (``request``, ``close``), and
each request travels as a Dask task to a node, where ``serve_request`` hands it to a local
``WorkerProcess`` (the same process isolation, timeout, memory cap and log handling as a local run). The
runner still draws the inputs, computes the references, judges and writes every result line: the cluster
only runs kernels, so resume, reports and bundles are unchanged.

What travels: the request as JSON, the input bundle and the output as safetensors bytes, and the node's
host identity. (Dask's own protocol serialises the task call between the scheduler and the nodes the user
started; qconform's payloads are never pickled objects.)

Losses: a node that dies takes its running task with it; Dask re-runs the task elsewhere (``retries``), and
the runner writes a case's result once, when its request returns. A node whose host class differs from the
first node a backend ran on is not trusted with that backend's cases: its reply becomes a ``crash`` naming
both host classes, so a certification never mixes host classes silently.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path

__all__ = ["DaskExecutor", "RemoteWorker", "host_class", "serve_request", "close_slot", "ExecutorError"]

#: how many times Dask re-runs a request whose node died before answering
RETRIES = 3
#: seconds added to the case timeout for the trip to the node and back (the worker's own timeout still applies)
TRANSIT_S = 120.0


class ExecutorError(ValueError):
    """The cluster cannot be used (no dask, no scheduler at the address, no worker node): one line, exit 2."""


def host_class(env: dict) -> dict:
    """What must match between two nodes for their results to be one host's: CPU model, ISA flags, core count,
    accelerators, Python and the libraries' versions (a subset of ``provenance.environment()``)."""
    libs = env.get("libraries") or {}
    return {"cpu": env.get("cpu"), "machine": env.get("machine"), "cpu_count": env.get("cpu_count"),
            "cpu_flags": sorted(env.get("cpu_flags") or []), "devices": list(env.get("devices") or []),
            "python": env.get("python"), "libraries": {k: v for k, v in sorted(libs.items()) if k != "qconform"}}


def _node_identity() -> dict:
    from conformance.run.provenance import environment

    env = environment()
    return {"host": env.get("host"), "pid": os.getpid(), "class": host_class(env)}


# -- the node's side --------------------------------------------------------------------------------------
_NODE_WORKERS: dict = {}
_NODE_LOCK = threading.Lock()


def serve_request(backend_spec: str, slot: str, request: dict, files: dict, timeout: float,
                  env: "dict | None", memory_limit: int) -> dict:
    """Run one worker request on this node (a Dask task). ``files``: {request key: safetensors bytes} for the
    request's input paths; the output file comes back as bytes. One local worker process per (backend, slot)."""
    from conformance.run.workerproc import WorkerProcess

    with _NODE_LOCK:
        entry = _NODE_WORKERS.get((backend_spec, slot))
        if entry is None:
            scratch = Path(tempfile.mkdtemp(prefix="qconform-node-"))
            entry = {"worker": WorkerProcess(backend_spec, env=env, memory_limit=memory_limit), "lock": threading.Lock(),
                     "scratch": scratch}
            _NODE_WORKERS[(backend_spec, slot)] = entry
    with entry["lock"]:
        req = dict(request)
        scratch = entry["scratch"]
        for key, data in files.items():
            p = scratch / f"{key}.safetensors"
            p.write_bytes(data)
            req[key] = str(p)
        out = None
        if "out" in req:
            out = scratch / "out.safetensors"
            if out.exists():
                out.unlink()
            req["out"] = str(out)
        reply = entry["worker"].request(req, timeout=timeout)
        data = out.read_bytes() if out is not None and reply.get("ok") and out.exists() else None
        return {"reply": json.dumps(reply), "out": data, "node": _node_identity()}


def close_slot(backend_spec: str, slot: str) -> bool:
    """End this node's worker process of (backend, slot), if it started one (run on every node at the end)."""
    with _NODE_LOCK:
        entry = _NODE_WORKERS.pop((backend_spec, slot), None)
    if entry is None:
        return False
    with entry["lock"]:
        entry["worker"].close()
    import shutil

    shutil.rmtree(entry["scratch"], ignore_errors=True)
    return True


# -- the runner's side ------------------------------------------------------------------------------------
class DaskExecutor:
    """A connection to a Dask scheduler; makes ``RemoteWorker``s and keeps each backend's host class."""

    def __init__(self, address: str, *, client=None):
        if client is None:
            try:
                from distributed import Client
            except ImportError:
                raise ExecutorError("--executor dask needs the 'distributed' package: pip install "
                                    "'qconform[dask]'") from None
            try:
                client = Client(address, timeout="30s")
            except (OSError, TimeoutError) as e:
                raise ExecutorError(f"--address {address}: no Dask scheduler answered ({type(e).__name__}: {e})") from None
        self.client = client
        self.address = address
        self._classes: dict = {}  # backend spec -> (host class, node) of the first reply
        self._lock = threading.Lock()
        nodes = self.client.scheduler_info().get("workers") or {}
        if not nodes:
            raise ExecutorError(f"--address {address}: the Dask scheduler has no worker node")

    def nodes(self) -> list[dict]:
        """Every node's identity (asked of each node once, for the run's header)."""
        return list(self.client.run(_node_identity).values())

    def worker(self, backend_spec: str, slot: str, *, env: "dict | None", memory_limit: int) -> "RemoteWorker":
        return RemoteWorker(self, backend_spec, slot, env=env, memory_limit=memory_limit)

    def check_class(self, backend_spec: str, node: dict) -> "str | None":
        """None where ``node`` is of the backend's host class (the first node's), else why not."""
        with self._lock:
            first = self._classes.setdefault(backend_spec, (node["class"], node["host"]))
        if first[0] == node["class"]:
            return None
        diff = sorted(k for k in node["class"] if node["class"].get(k) != first[0].get(k))
        return (f"node {node['host']} is of another host class than node {first[1]} (differs in "
                f"{', '.join(diff)}): results of one backend never mix host classes")

    def close(self) -> None:
        self.client.close()


class RemoteWorker:
    """``WorkerProcess``'s interface over the cluster: a request becomes a task, its output comes back as bytes."""

    def __init__(self, executor: DaskExecutor, backend_spec: str, slot: str, *, env, memory_limit: int):
        self.executor = executor
        self.backend_spec = backend_spec
        self.slot = slot
        self.env = env
        self.memory_limit = memory_limit
        self.last_node: "dict | None" = None

    def request(self, obj: dict, timeout: float) -> dict:
        req = dict(obj)
        files = {}
        for key in ("bundle",):
            if key in req:
                files[key] = Path(req.pop(key)).read_bytes()
        local_out = Path(req["out"]) if "out" in req else None
        fut = self.executor.client.submit(serve_request, self.backend_spec, self.slot, req, files, timeout, self.env,
                                          self.memory_limit, pure=False, retries=RETRIES)
        try:
            got = fut.result(timeout=timeout + TRANSIT_S)
        except Exception as e:  # noqa: BLE001 - a lost task (KilledWorker after the retries), a cancelled one
            return {"ok": False, "kind": "crash", "error": f"the cluster lost this request: {type(e).__name__}: {e}",
                    "evidence": {"worker": "crash", "what": f"dask: {type(e).__name__}: {e}"}}
        node = got["node"]
        self.last_node = node
        wrong = self.executor.check_class(self.backend_spec, node)
        if wrong:
            return {"ok": False, "kind": "crash", "error": wrong, "evidence": {"worker": "crash", "what": wrong,
                                                                              "node": node}}
        reply = json.loads(got["reply"])
        if local_out is not None and got["out"] is not None:
            local_out.write_bytes(got["out"])
        reply.setdefault("node", node["host"])
        return reply

    def close(self) -> None:
        """End this slot's worker processes on every node that started one."""
        try:
            self.executor.client.run(close_slot, self.backend_spec, self.slot)
        except Exception:  # noqa: BLE001 - a node gone at the end loses nothing (its workers died with it)
            pass

    def kill(self, *, keep_log: bool = False) -> None:
        self.close()

    def alive(self) -> bool:
        return True
