"""The runner under concurrency, signals, floods, escaping processes and full disks (issue 22).

Each test attacks one way a run could lose results or end green without them:

- a second run into a busy --out removes nothing and is refused; a run (or a report) with fewer
  results than cases is never CONFORMANT;
- SIGINT / SIGTERM to the run's process group, and a reader that goes away (`| head -1`), stop the
  workers at once; the summary and reports of what finished say INTERRUPTED; the exit is 130 / 143 /
  141; the printed --resume command finishes the run;
- a kernel flooding stderr leaves a log of bounded size (its head and tail); a full disk (a file-size
  limit in the child) is exit 2 naming the file, results.jsonl keeps whole lines, --resume repairs a
  torn last line and completes;
- a setsid() daemon of a kernel (with and without its environment) does not outlive the run;
- a read-only or full --out is exit 2 with one line;
- verify-bundle refuses a padded results.jsonl after reading no more lines than the case list allows.

Fault doubles: conformance/selftest/doubles/faulty.py (faulty-slow, faulty-flood, faulty-setsid).
"""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance.run.completeness import enforce
from conformance.run.resultfile import append_line, repair_torn_tail
from conformance.run.runner import Runner, read_results
from conformance.cases.suite import case_list
from conformance.run.workerproc import LOG_HEAD, LOG_KEEP

ROOT = Path(__file__).resolve().parents[2]
_DOUBLES = {"faulty-slow": "SlowBackend", "faulty-flood": "FloodBackend", "faulty-setsid": "SetsidBackend"}
EXTRA = ",".join(f"{n}=conformance.selftest.doubles.faulty:{c}" for n, c in _DOUBLES.items())
#: a small case list: 8 cases
SELECT = ["--profile", "smoke", "--scheme", "w8a8", "--tier", "exact"]
N_CASES = 8


@pytest.fixture
def doubles_env(monkeypatch):
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", EXTRA)


def _env(**kw) -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                QCONFORM_EXTRA_BACKENDS=EXTRA, **kw)


def _cli(*argv, **popen) -> subprocess.Popen:
    """`qconform ARGV` in a session of its own (so a test can signal its whole process group)."""
    return subprocess.Popen([sys.executable, "-m", "conformance.cli.main", *map(str, argv)], env=_env(), cwd=ROOT,
                            start_new_session=True, text=True, **popen)


def _results(out: Path) -> list:
    return [r for r in read_results(out / "results.jsonl") if r.get("kind") == "result"]


def _whole_lines(path: Path) -> list:
    data = path.read_bytes()
    assert data.endswith(b"\n"), data[-200:]
    return [json.loads(line) for line in data.decode().splitlines()]  # every line parses


def _wait_for_results(out: Path, n: int, proc: subprocess.Popen, limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while len(_results(out)) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run wrote no result"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _gone(pids, limit: float = 10) -> bool:
    deadline = time.monotonic() + limit
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(_alive(p) for p in pids)


# -- 1. two runs into one folder; the completeness invariant ----------------------------------------------
def test_a_second_run_into_a_busy_folder_removes_nothing(tmp_path, doubles_env, capsys):
    """The bug: the second run deleted the first one's results.jsonl before it found the lock; the first
    then ended CONFORMANT over the few results written after that."""
    from conformance.cli.main import main

    out = tmp_path / "out"
    first = _cli("run", "--backend", "faulty-slow:seconds=0.4", *SELECT, "--out", out, "--no-progress",
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for_results(out, 2, first)
        before = (out / "results.jsonl").read_bytes()
        rc = main(["run", "--backend", "emulator", *SELECT, "--out", str(out), "--no-progress"])
        assert rc == 2
        assert "another qconform process" in capsys.readouterr().err
        assert (out / "results.jsonl").read_bytes().startswith(before)  # nothing removed or rewritten
        stdout, _ = first.communicate(timeout=300)
    finally:
        first.kill()
    assert first.returncode == 0, stdout
    assert "conformance: CONFORMANT" in stdout
    assert len({r["case_id"] for r in _results(out)}) == N_CASES


def test_fewer_results_than_cases_is_never_conformant(tmp_path, capsys, monkeypatch):
    """A result line that never reached results.jsonl (however it got lost): the run says INCOMPLETE and
    exits 4; `qconform report` on the folder says so too, from the run header's case count."""
    from conformance.cli.main import main

    out = tmp_path / "out"
    real = Runner._append
    dropped = []

    def lose_one(self, rec):
        if rec.get("kind") == "result" and not dropped:
            dropped.append(rec["case_id"])
            return
        real(self, rec)

    monkeypatch.setattr(Runner, "_append", lose_one)
    rc = main(["run", "--backend", "emulator", *SELECT, "--out", str(out), "--no-progress"])
    text = capsys.readouterr().out
    assert rc == 4, text
    assert "conformance: INCOMPLETE" in text and "CONFORMANT:" not in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "incomplete" and summary["ok"] is False and summary["n_missing"] == 1
    monkeypatch.setattr(Runner, "_append", real)
    # the report of the folder, from its files alone
    assert main(["report", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["status"] == "incomplete"
    assert "INCOMPLETE" in (out / "report.md").read_text()


def test_certify_seals_nothing_with_a_result_missing(tmp_path, capsys, monkeypatch):
    from conformance.cli.main import main

    real = Runner._append
    dropped = []

    def lose_one(self, rec):
        if rec.get("kind") == "result" and not dropped:
            dropped.append(rec["case_id"])
            return
        real(self, rec)

    monkeypatch.setattr(Runner, "_append", lose_one)
    out = tmp_path / "bundle"
    rc = main(["certify", "--backend", "emulator", *SELECT, "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "1 result(s) missing after the run" in err, err
    assert not (out / "MANIFEST.json").exists()


def test_enforce_keeps_failures_and_never_leaves_a_green():
    base = {"status": "conformant", "ok": True, "n_results": 3, "columns": [{"key": "b", "status": "conformant"}],
            "notes": []}
    s = enforce(dict(base, columns=[dict(base["columns"][0])], notes=[]), missing={"b": 2})
    assert (s["status"], s["ok"], s["headline"], s["columns"][0]["status"]) == ("incomplete", False, "INCOMPLETE",
                                                                                 "incomplete")
    s = enforce(dict(base, status="not-conformant", ok=False, notes=[]), missing={"b": 2})
    assert s["status"] == "not-conformant"  # a failure found stays a failure
    s = enforce(dict(base, notes=[]), interrupted="SIGINT")
    assert (s["status"], s["ok"], s["headline"]) == ("interrupted", False, "INTERRUPTED")
    s = enforce(dict(base, notes=[]), missing={})
    assert s["status"] == "conformant" and s["ok"] is True  # nothing missing: unchanged


# -- 2. Ctrl-C, SIGTERM, a closed pipe -----------------------------------------------------------------------
@pytest.mark.parametrize("sig,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_run_and_reports_what_finished(tmp_path, doubles_env, sig, status):
    out = tmp_path / "out"
    pids = tmp_path / "pids.txt"
    run = _cli("run", "--backend", f"faulty-slow:seconds=2,pidfile={pids}", *SELECT, "--out", out, "--no-progress",
               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for_results(out, 1, run)
        os.killpg(run.pid, sig)
        stdout, stderr = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == status, stdout + stderr
    assert "Traceback" not in stderr, stderr
    assert "conformance: INTERRUPTED" in stdout and "CONFORMANT:" not in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["ok"] is False
    assert "INTERRUPTED" in (out / "report.md").read_text() and (out / "report.html").exists()
    got = [r for r in _whole_lines(out / "results.jsonl") if r.get("kind") == "result"]
    assert 1 <= len(got) < N_CASES and summary["n_results"] == len(got)
    # the worker that was running a case when the signal came is gone
    assert _gone([int(p) for p in pids.read_text().split()])
    resume = next(line for line in stdout.splitlines() if "continue with: " in line).split("continue with: ")[1]
    assert resume.startswith("qconform run ") and resume.endswith(" --resume") and str(out) in resume


def test_resume_after_an_interrupt_completes_the_run(tmp_path, doubles_env):
    out = tmp_path / "out"
    args = ["run", "--backend", "faulty-slow:seconds=1", *SELECT, "--out", out, "--no-progress"]
    run = _cli(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for_results(out, 1, run)
        os.killpg(run.pid, signal.SIGINT)
        stdout, _ = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 130
    n_first = len(_results(out))
    with open(out / "results.jsonl", "ab") as f:  # and a line a kill -9 cut in half
        f.write(b'{"kind": "result", "backend": "faulty-slow:seco')
    resumed = _cli(*args, "--resume", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stdout + stderr
    assert "removed a torn last line" in stdout and "conformance: CONFORMANT" in stdout
    got = [r for r in _whole_lines(out / "results.jsonl") if r.get("kind") == "result"]
    assert sorted(r["case_id"] for r in got) == sorted({r["case_id"] for r in got})  # each case once
    assert len(got) == N_CASES and n_first < N_CASES


def test_a_reader_that_goes_away_stops_the_run_quietly(tmp_path, doubles_env):
    """`qconform run | head -1`: the run notices its stdout's reader is gone, stops, writes its files and
    exits 141 without a traceback."""
    out = tmp_path / "out"
    run = _cli("run", "--backend", "faulty-slow:seconds=2", *SELECT, "--out", out, "--no-progress",
               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert run.stdout.readline().startswith("qconform run: ")
        _wait_for_results(out, 1, run)
        run.stdout.close()  # head -1 exits
        run.wait(timeout=60)
        stderr = run.stderr.read()
    finally:
        run.kill()
    assert run.returncode == 141, stderr
    assert stderr == ""  # quietly
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert len(_results(out)) < N_CASES
    _whole_lines(out / "results.jsonl")


# -- 4. floods and full disks ------------------------------------------------------------------------------
def _specs(scheme="w8a8", n=2):
    return [s for s in case_list(profile="smoke", tiers=("exact",)) if s.case.scheme == scheme][:n]


@pytest.mark.parametrize("crash", [False, True])
def test_a_flood_on_stderr_keeps_a_bounded_log(tmp_path, doubles_env, crash):
    out = tmp_path / "out"
    r = Runner(out, timeout=120, progress=False, lock=True)
    try:
        res = r.run([f"faulty-flood:mib=32,crash={str(crash).lower()}"], _specs(n=1))
    finally:
        r.close()
    (rec,) = res
    if not crash:  # a clean worker keeps no log at all
        assert rec["verdict"] == "pass" and not list(out.rglob("*.log"))
        return
    assert rec["verdict"] == "crash" and "SIGABRT" in rec["reason"]
    log = out / rec["evidence"]["log"]
    data = log.read_bytes()
    assert len(data) <= LOG_HEAD + LOG_KEEP + 200  # of 32 MiB written
    assert data.startswith(b"FLOOD-START\n")  # the head ...
    assert b"FLOOD-END\n" in data[-LOG_KEEP:]  # ... and the tail are kept
    dropped = int(data.split(b"[qconform: ")[1].split(b" bytes")[0])
    assert dropped >= 32 * 1024 * 1024 - LOG_HEAD - LOG_KEEP  # counted, not kept
    assert rec["evidence"]["log_tail"] == data[-600:].decode("utf-8", "replace").strip()


def _fsize_limit(nbytes):
    def pre():
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return pre


def test_a_full_disk_is_exit_2_and_keeps_whole_lines_then_resume_completes(tmp_path):
    """A file-size limit in the run's process (as a full disk: writes past it fail, the one that crosses it
    is short): exit 2 naming the file; results.jsonl ends in a whole line; --resume finishes the run."""
    out = tmp_path / "out"
    argv = ["run", "--backend", "emulator", "--profile", "smoke", "--scheme", "w4a16", "--tier", "exact",
            "--out", out, "--no-progress", "--jobs", "1"]
    full = _cli(*argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_fsize_limit(48 << 10))
    stdout, stderr = full.communicate(timeout=600)
    assert full.returncode == 2, stdout + stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qconform run: error: ") and "Traceback" not in stderr
    assert "results.jsonl: cannot write: the file size limit is reached" in lines[0], lines
    got = _whole_lines(out / "results.jsonl")
    n_first = sum(1 for r in got if r.get("kind") == "result")
    assert 0 < n_first < 54
    resumed = _cli(*argv, "--resume", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, stdout + stderr
    assert len({r["case_id"] for r in _results(out)}) == 54


def test_a_short_write_is_cut_back_to_a_whole_line(tmp_path):
    p = tmp_path / "results.jsonl"
    append_line(p, '{"a": 1}')

    def half_then_full(fd, data):
        if len(data) > 4:
            return os.write(fd, data[:4])
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as e:
        append_line(p, '{"b": 2, "c": 3}', fault=half_then_full)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(p)
    assert p.read_bytes() == b'{"a": 1}\n'
    with open(p, "ab") as f:
        f.write(b'{"torn')
    assert repair_torn_tail(p) == len(b'{"torn') and p.read_bytes() == b'{"a": 1}\n'
    assert repair_torn_tail(p) == 0


def test_a_worker_that_cannot_write_its_output_stops_the_run_not_a_crash_verdict(tmp_path):
    """The worker's own write into OUT/.work failing for lack of space is the folder's fault: OutputUnwritable,
    never a crash recorded against the kernel."""
    from conformance.run.resultfile import OutputUnwritable, check_worker_output_fault

    rec = {"verdict": "crash", "evidence": {"worker": "raised",
                                            "exception": "OSError: [Errno 28] No space left on device",
                                            "traceback": 'File "worker.py", in main\n    save_tensors(req["out"], ...)'}}
    with pytest.raises(OutputUnwritable, match="no space|No space"):
        check_worker_output_fault(rec, tmp_path)
    kernel = dict(rec, evidence=dict(rec["evidence"], traceback='File "kernel.py", in run\n    open(cache)'))
    check_worker_output_fault(kernel, tmp_path)  # the kernel's own ENOSPC stays the kernel's crash


# -- 5. processes that escape the worker ---------------------------------------------------------------
@pytest.mark.parametrize("clean_env", [False, True])
def test_a_setsid_daemon_does_not_outlive_the_run(tmp_path, doubles_env, clean_env):
    """fork, setsid, fork, exit: the daemon leaves the worker's process group and session. With
    clean_env it also drops the worker's environment (found as a descendant of the subreaper worker)."""
    pidfile = tmp_path / "pids.txt"
    r = Runner(tmp_path / "out", timeout=60, progress=False, lock=True)
    try:
        res = r.run([f"faulty-setsid:pidfile={pidfile},clean_env={str(clean_env).lower()}"], _specs(n=2))
    finally:
        r.close()
    assert [x["verdict"] for x in res] == ["pass", "pass"]
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2
    assert _gone(pids), [p for p in pids if _alive(p)]


# -- 6. an output folder that cannot be written ------------------------------------------------------------
def test_an_unwritable_output_is_exit_2_with_one_line(tmp_path, capsys, monkeypatch):
    from conformance.run import outlock
    from conformance.cli.main import main

    out = tmp_path / "ro"
    real_open = os.open

    def read_only(path, flags, *a):
        if str(path).startswith(str(out)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *a)

    monkeypatch.setattr(outlock.os, "open", read_only)
    rc = main(["run", "--backend", "emulator", *SELECT, "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("qconform run: error: ") and str(out) in err[0] and "read-only" in err[0]


def test_a_full_output_at_the_start_is_exit_2_with_one_line(tmp_path):
    out = tmp_path / "full"
    run = _cli("run", "--backend", "emulator", *SELECT, "--out", out, "--no-progress", stdout=subprocess.PIPE,
               stderr=subprocess.PIPE, preexec_fn=_fsize_limit(0))
    stdout, stderr = run.communicate(timeout=300)
    lines = stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, stdout + stderr
    assert str(out) in lines[0] and "cannot write" in lines[0] and "internal error" not in lines[0]


def test_any_command_writing_into_a_full_folder_is_exit_2_with_one_line(tmp_path):
    """`qconform report` (it writes summary.json and the reports) under a file-size limit of 0: one line
    naming the file, exit 2, not an internal error (the CLI's catch-all for output errors)."""
    from conformance.cli.main import main

    out = tmp_path / "out"
    assert main(["run", "--backend", "emulator", *SELECT, "--out", str(out), "--no-progress"]) == 0
    (out / "summary.json").unlink()
    rep = _cli("report", out, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_fsize_limit(0))
    stdout, stderr = rep.communicate(timeout=300)
    lines = stderr.strip().splitlines()
    assert rep.returncode == 2 and len(lines) == 1, stdout + stderr
    assert lines[0].startswith(f"qconform report: error: {out}") and "None" not in lines[0]
    assert "file size limit" in lines[0] and "internal error" not in lines[0]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_folder_is_exit_2(tmp_path, capsys):
    from conformance.cli.main import main

    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        rc = main(["run", "--backend", "emulator", *SELECT, "--out", str(out), "--no-progress"])
    finally:
        out.chmod(0o700)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(out) in err[0]


# -- 7. verify-bundle on a padded results file ----------------------------------------------------------------
def _reseal(folder: Path) -> None:
    import hashlib

    man = json.loads((folder / "MANIFEST.json").read_text())
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != "MANIFEST.json":
            data = p.read_bytes()
            man["files"][p.relative_to(folder).as_posix()] = {"sha256": hashlib.sha256(data).hexdigest(),
                                                               "bytes": len(data)}
    (folder / "MANIFEST.json").write_text(json.dumps(man))


def test_verify_refuses_a_padded_results_file_reading_no_more_than_the_cases_allow(basic, tmp_path, monkeypatch):
    import shutil

    from conformance.certify import verify

    b = tmp_path / "b"
    shutil.copytree(basic, b)
    meta = json.loads((b / "bundle.json").read_text())
    bound = verify.results_bound(meta["case_count"], len(meta["backends"]))
    n_real = len((b / "results.jsonl").read_text().splitlines())
    assert n_real <= bound and verify.verify_bundle(b).ok  # a real bundle fits its bound
    with open(b / "results.jsonl", "ab") as f:
        f.write(b"{}\n" * 400_000)  # (issue 22 used 40 M lines; the bound does not depend on it)
    _reseal(b)
    parsed = []
    real = verify._jsonl
    monkeypatch.setattr(verify, "_jsonl", lambda data, *a, **k: parsed.append(data) or real(data, *a, **k))
    res = verify.verify_bundle(b)
    assert not res.ok
    assert any(p.startswith(f"results.jsonl: more than {bound} lines") for p in res.problems), res.problems
    assert len(parsed) <= bound  # it stopped at the bound, not at the end of the file
