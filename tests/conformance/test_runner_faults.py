"""Kernels that misbehave in every way the runner has to survive: each case still gets its verdict.

The fault-injecting backends are in conformance/selftest/doubles/faulty.py. Each fault is triggered on one
scheme only (``only=w4a16``); the other scheme's cases must still pass, which proves the run went on
after the fault with a clean worker and a clean reply channel.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conformance.run.outlock import OutLock, OutputLocked
from conformance.run.runner import Runner, read_results
from conformance.cases.suite import case_list

_FAULTS = {
    "faulty-shape": "WrongShapeBackend", "faulty-transposed": "TransposedBackend", "faulty-complex": "ComplexBackend",
    "faulty-none": "NoneBackend", "faulty-scalar": "ScalarBackend", "faulty-printf": "PrintfBackend",
    "faulty-json-stdout": "JsonStdoutBackend", "faulty-partial-hang": "PartialLineHangBackend",
    "faulty-fork": "ForkBackend", "faulty-memory-hog": "MemoryHogBackend", "faulty-hang": "HangBackend",
}
FAULTY = ",".join(f"{n}=conformance.selftest.doubles.faulty:{c}" for n, c in _FAULTS.items())


@pytest.fixture
def faulty_env(monkeypatch):
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", FAULTY)


def _specs():
    specs = [s for s in case_list(profile="smoke", tiers=("random",)) if s.case.M == 5]
    return [s for s in specs if s.case.scheme == "w4a16"][:2] + [s for s in specs if s.case.scheme == "w8a8"][:2]


def _by_scheme(res):
    out = {}
    for r in res:
        out.setdefault(r["scheme"], []).append(r)
    return out


def _run(tmp_path, backend, **kw):
    specs = _specs()
    r = Runner(tmp_path, timeout=kw.pop("timeout", 20), progress=False, lock=True, **kw)
    try:
        res = r.run([backend], specs)
    finally:
        r.close()
    # every case has exactly one result line, in the JSONL too
    lines = [x for x in read_results(tmp_path / "results.jsonl") if x.get("kind") == "result"]
    assert sorted(x["case_id"] for x in lines) == sorted(s.case_id for s in specs)
    assert len(res) == len(specs)
    by = _by_scheme(res)
    assert {x["verdict"] for x in by["w8a8"]} == {"pass"}, by["w8a8"]  # the run went on, cleanly
    return by["w4a16"]


@pytest.mark.parametrize("backend,verdict,words", [
    ("faulty-shape", "fail", "output shape"),
    ("faulty-transposed", "fail", "output shape"),
    ("faulty-complex", "fail", "complex"),
    ("faulty-none", "fail", "None"),
    ("faulty-scalar", "fail", "scalar"),
])
def test_malformed_outputs_are_that_case_s_verdict(tmp_path, faulty_env, backend, verdict, words):
    bad = _run(tmp_path, f"{backend}:only=w4a16")
    assert {x["verdict"] for x in bad} == {verdict}, bad
    assert all(words in x["reason"] for x in bad), [x["reason"] for x in bad]
    assert all(os.path.exists(x["bundle"]) for x in bad)


@pytest.mark.parametrize("backend", ["faulty-printf", "faulty-json-stdout"])
def test_what_a_kernel_writes_to_fd_1_is_not_a_reply(tmp_path, faulty_env, backend):
    """C printf, os.write and a reply-shaped line on fd 1: the answers are still right (pass), and the
    writes are in the worker's log, never in the runner's reply channel."""
    bad = _run(tmp_path, f"{backend}:only=w4a16")
    assert {x["verdict"] for x in bad} == {"pass"}, [(x["verdict"], x["reason"]) for x in bad]


def test_half_a_line_and_a_hang_is_a_timeout(tmp_path, faulty_env):
    t0 = time.monotonic()
    bad = _run(tmp_path, "faulty-partial-hang:only=w4a16", timeout=4)
    assert {x["verdict"] for x in bad} == {"timeout"}
    assert time.monotonic() - t0 < 60  # bounded by the case timeout, not by the hang
    # the evidence: the kept log (in the output folder) holds what the kernel wrote
    ev = bad[0]["evidence"]
    assert ev["worker"] == "timeout" and ev["log"].startswith("logs/")
    assert '{"ok": tr' in (tmp_path / ev["log"]).read_text()
    assert ev["log_tail"].endswith('{"ok": tr')


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_forked_helpers_do_not_outlive_the_run(tmp_path, faulty_env):
    pidfile = tmp_path / "pids.txt"
    bad = _run(tmp_path / "o", f"faulty-fork:only=w4a16,pidfile={pidfile}")
    assert {x["verdict"] for x in bad} == {"pass"}
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids), pids


def test_memory_hog_meets_the_cap_and_gets_a_verdict(tmp_path, faulty_env):
    bad = _run(tmp_path, "faulty-memory-hog:only=w4a16,gib=8", memory_limit="1G")
    assert {x["verdict"] for x in bad} == {"crash"}, bad
    assert all("MemoryError" in x["reason"] or "signal" in x["reason"] for x in bad), [x["reason"] for x in bad]


def test_worker_logs_live_in_the_output_folder(tmp_path, faulty_env, monkeypatch):
    import tempfile

    tmp = tmp_path / "tmp"  # a temp folder of this test's own (other processes share the system one)
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    out = tmp_path / "out"
    _run(out, "faulty-printf:only=w4a16")
    assert os.listdir(tmp) == []
    # clean workers leave no log; nothing is left behind but the results (and the lock file)
    assert not list(out.rglob("*.log"))
    assert sorted(p.name for p in out.iterdir()) == [".qconform-lock", "results.jsonl"]


_ORPHAN = r"""
import sys, time
from conformance.run.workerproc import WorkerProcess
w = WorkerProcess("faulty-hang")
w.start()
print(w.proc.pid, flush=True)
w.request({"op": "run", "spec": SPEC, "out": "/dev/null"}, timeout=600)
"""


def test_a_worker_dies_with_its_parent(tmp_path, faulty_env):
    spec = next(s for s in _specs() if s.case.scheme == "w4a16").to_json()
    code = _ORPHAN.replace("SPEC", json.dumps(spec).replace("null", "None").replace("true", "True")
                           .replace("false", "False"))
    env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        worker_pid = int(parent.stdout.readline())
        time.sleep(2)
        assert _alive(worker_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(worker_pid)
    finally:
        parent.kill()


def test_second_writer_of_a_folder_is_refused(tmp_path):
    held = OutLock.for_folder(tmp_path).acquire()
    try:
        code = ("import sys\nfrom conformance.run.runner import Runner\nfrom conformance.run.outlock import OutputLocked\n"
                "try:\n    Runner(sys.argv[1], progress=False, lock=True)\nexcept OutputLocked as e:\n    print(e); sys.exit(7)\n")
        env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env)
        assert r.returncode == 7, r.stderr
        assert f"pid {os.getpid()}" in r.stdout and "another qconform process" in r.stdout
    finally:
        held.release()
    # within one process the lock is re-entrant; once released, another process may take it
    a = Runner(tmp_path, progress=False, lock=True)
    b = Runner(tmp_path, progress=False, lock=True)
    a.close()
    b.close()
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr


def test_cli_run_into_a_locked_folder_exits_2(tmp_path, capsys):
    from conformance.cli.main import main

    code = ("import sys, time\nfrom conformance.run.outlock import OutLock\nheld = OutLock.for_folder(sys.argv[1]).acquire()\n"
            "print('held', flush=True)\ntime.sleep(60)\n")
    env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        rc = main(["run", "--backend", "emulator", "--scheme", "w8a8", "--profile", "smoke", "--tier", "exact",
                   "--out", str(tmp_path), "--no-progress"])
        assert rc == 2
        assert "another qconform process" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    assert OutputLocked.__mro__[1].__name__ == "QconformError"


def test_memory_limit_sizes():
    from conformance.run.workerproc import parse_size

    assert parse_size("8G") == 8 * 1024 ** 3 and parse_size("512M") == 512 * 1024 ** 2
    assert parse_size("1.5GiB") == 3 * 512 * 1024 ** 2 and parse_size("0") == 0 and parse_size(4096) == 4096
    for bad in ("-1G", "12Q", "nanG", "inf", ""):
        with pytest.raises(ValueError, match="--memory-limit"):
            parse_size(bad)
