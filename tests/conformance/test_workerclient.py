"""``WorkerClient`` (conformance/run/workerclient.py): the worker protocol as calls returning dataclasses, against a
real worker process."""

from __future__ import annotations

import os

import numpy as np
import pytest

from backends.base import Case, Declared
from conformance.run.refcache import ReferenceCache
from conformance.cases.suite import CaseSpec
from conformance.run.workerclient import WorkerClient
from conformance.run.workerproc import WorkerProcess
from emulator.tensorfile import load_tensors


@pytest.fixture()
def emulator_client():
    c = WorkerClient(WorkerProcess("emulator"), timeout=120)
    yield c
    c.close()


def test_hello_plan_run_on_the_emulator(emulator_client, tmp_path):
    c = emulator_client
    hello = c.hello()
    assert hello.available and hello.label == "emulator" and hello.failure is None and hello.deterministic
    spec = CaseSpec(Case("w4a16", "gptq", M=2, N=16, K=64, group_size=32), "random", "gaussian", 0)
    plan = c.plan(spec)
    assert plan.supported and isinstance(plan.declared, Declared) and plan.failure is None
    out = tmp_path / "y.safetensors"
    reply = c.run(out, spec=spec)
    assert reply.ok and reply.run_s is not None and reply.run_s >= 0
    assert load_tensors(out)["y"].data.shape == (2, 16)
    # the same case from the run's shared input file: the worker checks it runs the bytes the runner judges
    inp, path, digest = ReferenceCache(tmp_path / "refs").inputs(spec)
    out2 = tmp_path / "y2.safetensors"
    assert c.run(out2, spec=spec, bundle=path, inputs_sha256=digest).ok
    np.testing.assert_array_equal(load_tensors(out2)["y"].data, load_tensors(out)["y"].data)
    bad = c.run(tmp_path / "z.safetensors", spec=spec, bundle=path, inputs_sha256="0" * 64)
    assert not bad.ok and bad.failure.kind == "error" and "sha256 mismatch" in bad.failure.error
    assert not (tmp_path / "z.safetensors").exists()


def test_a_refusal_carries_the_backends_reason(tmp_path):
    c = WorkerClient(WorkerProcess("onnx-reference"), timeout=120)
    try:
        plan = c.plan(CaseSpec(Case("w4a16", "gptq", M=2, N=16, K=64, group_size=32), "random", "gaussian", 0))
    finally:
        c.close()
    assert not plan.supported and plan.declared is None and plan.failure is None and plan.reason.strip()


def test_a_dead_worker_is_restarted_and_a_raising_backend_is_a_failure_not_an_exception(emulator_client, tmp_path):
    c = emulator_client
    assert c.hello().available
    os.kill(c.process.proc.pid, 9)
    c.process.proc.wait()
    assert c.hello().available  # the next request starts a fresh worker
    bad = c.run(tmp_path / "y.safetensors", spec={"case": {"scheme": "no-such-scheme"}})
    assert not bad.ok and bad.failure.kind == "error" and bad.failure.error and bad.failure.traceback


def test_run_needs_a_spec_or_a_bundle(emulator_client, tmp_path):
    with pytest.raises(ValueError, match="spec or a bundle"):
        emulator_client.run(tmp_path / "y.safetensors")
