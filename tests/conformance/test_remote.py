"""--executor dask: a local Dask cluster of 2 worker nodes (processes) runs the same isolated workers.

A run through the cluster equals the local run case for case; a node killed mid-run loses and duplicates
nothing; a node of another host class is refused per case (docs/scaling.md)."""

import json
import os
import signal
import threading
import time

import pytest

distributed = pytest.importorskip("distributed")

from conformance.run.remote import DaskExecutor, RemoteWorker, host_class  # noqa: E402
from conformance.run.runner import Runner  # noqa: E402
from conformance.cases.suite import case_list  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0") as c, Client(c) as client:
        yield c, client


def _results(out):
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line]
    return [r for r in rows if r.get("kind") == "result"]


def _specs(n=16):
    return case_list(profile="ci", schemes=["w4a16", "w8a8"], tiers=["exact"])[:n]


def test_a_cluster_run_equals_the_local_run_case_for_case(tmp_path, cluster):
    _c, client = cluster
    specs = _specs()
    ex = DaskExecutor(cluster[0].scheduler_address, client=client)
    assert len(ex.nodes()) == 2
    remote = Runner(tmp_path / "remote", jobs=2, progress=False, timeout=120, executor=ex)
    local = Runner(tmp_path / "local", jobs=2, progress=False, timeout=120)
    try:
        remote.run(["emulator"], specs)
        local.run(["emulator"], specs)
    finally:
        remote.close()
        local.close()
    r, loc = _results(tmp_path / "remote"), _results(tmp_path / "local")
    assert sorted(x["case_id"] for x in r) == sorted(s.case_id for s in specs)
    assert {x["case_id"]: x["verdict"] for x in r} == {x["case_id"]: x["verdict"] for x in loc}
    assert {x["case_id"]: x["metrics"]["max_ulp"] for x in r} == {x["case_id"]: x["metrics"]["max_ulp"] for x in loc}
    assert all(x.get("node") for x in r)  # each result names the node it ran on


def test_a_node_killed_mid_run_loses_and_duplicates_nothing(tmp_path, monkeypatch):
    from distributed import Client, LocalCluster

    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", "faulty-slow=conformance.selftest.doubles.faulty:SlowBackend")
    specs = _specs(12)
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0") as c, \
            Client(c) as client:
        ex = DaskExecutor(c.scheduler_address, client=client)
        pids = list(client.run(os.getpid).values())
        runner = Runner(tmp_path / "out", jobs=2, progress=False, timeout=120, executor=ex)

        killed = []

        def kill_one():
            path = tmp_path / "out" / "results.jsonl"
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # once a few results are in, a node dies
                if path.exists() and sum(1 for _ in open(path)) >= 4:
                    os.kill(pids[0], signal.SIGKILL)
                    killed.append(sum(1 for _ in open(path)))
                    return
                time.sleep(0.05)

        t = threading.Thread(target=kill_one)
        t.start()
        try:
            runner.run(["faulty-slow:seconds=0.3"], specs)
        finally:
            t.join()
            runner.close()
    res = _results(tmp_path / "out")
    assert killed and killed[0] < len(specs) + 3  # the node died while cases were still to run
    ids = [x["case_id"] for x in res]
    assert sorted(ids) == sorted(s.case_id for s in specs) and len(ids) == len(set(ids))
    assert {x["verdict"] for x in res} == {"pass"}  # the lost node's tasks ran again elsewhere


class _Future:
    def __init__(self, value):
        self.value = value

    def result(self, timeout=None):
        return self.value


class _Client:
    """A stand-in for distributed.Client that answers as two nodes of different host classes would."""

    def __init__(self, replies):
        self.replies = list(replies)

    def scheduler_info(self):
        return {"workers": {"tcp://a": {}, "tcp://b": {}}}

    def submit(self, *args, **kwargs):
        return _Future(self.replies.pop(0))

    def run(self, *args, **kwargs):
        return {}


def _node(host, cpu):
    return {"host": host, "pid": 1, "class": host_class({"cpu": cpu, "machine": "x86_64", "cpu_count": 2,
                                                        "cpu_flags": ["avx2"], "libraries": {"torch": "2.13.0"}})}


def test_a_node_of_another_host_class_is_refused_naming_what_differs():
    ok = {"reply": json.dumps({"ok": True, "supported": True}), "out": None}
    client = _Client([dict(ok, node=_node("a", "AMD EPYC")), dict(ok, node=_node("b", "Intel Xeon")),
                      dict(ok, node=_node("a", "AMD EPYC"))])
    ex = DaskExecutor("tcp://x", client=client)
    w = RemoteWorker(ex, "emulator", "s0", env=None, memory_limit=0)
    assert w.request({"op": "plan"}, timeout=5)["ok"]
    bad = w.request({"op": "plan"}, timeout=5)
    assert bad["ok"] is False and bad["kind"] == "crash"
    assert "node b is of another host class than node a" in bad["error"] and "cpu" in bad["error"]
    assert w.request({"op": "plan"}, timeout=5)["ok"]  # the first class stays the backend's


def test_host_class_ignores_the_host_name_and_the_suite_version_only():
    a = host_class({"host": "n1", "cpu": "X", "libraries": {"qconform": "1", "torch": "2"}})
    b = host_class({"host": "n2", "cpu": "X", "libraries": {"qconform": "2", "torch": "2"}})
    c = host_class({"host": "n2", "cpu": "X", "libraries": {"qconform": "2", "torch": "3"}})
    assert a == b and a != c


def test_no_scheduler_is_one_line_exit_2(capsys, tmp_path):
    from conformance.cli.main import main

    rc = main(["run", "--backend", "emulator", "--executor", "dask", "--address", "tcp://127.0.0.1:9",
               "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no Dask scheduler answered" in err and "Traceback" not in err and not (tmp_path / "o").exists()


def test_resume_through_the_cluster_runs_only_what_is_missing(tmp_path, cluster):
    """--resume is the runner's (the cluster only runs kernels): a run cut after half its cases, resumed through the
    cluster, ends with every case once."""
    _c, client = cluster
    specs = _specs(12)
    ex = DaskExecutor(cluster[0].scheduler_address, client=client)
    first = Runner(tmp_path / "out", jobs=2, progress=False, timeout=120, executor=ex)
    try:
        first.run(["emulator"], specs[:6])
    finally:
        first.close()
    again = Runner(tmp_path / "out", jobs=2, progress=False, timeout=120, executor=ex)
    try:
        new = again.run(["emulator"], specs, resume=True)
    finally:
        again.close()
    assert len(new) == 6  # only the missing half ran
    ids = [x["case_id"] for x in _results(tmp_path / "out")]
    assert sorted(ids) == sorted(s.case_id for s in specs) and len(ids) == len(set(ids))
