"""`qconform run`, `target` and `replay`: honest exits, one result set per run, reports that explain.

A green (exit 0, CONFORMANT) must be impossible to reach with a typo, an unavailable backend, a
run in which nothing was judged, or results left over from another run in the same folder.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import run_doubles
from conformance.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SMALL = ["--profile", "smoke", "--no-progress"]


@pytest.fixture
def doubles(monkeypatch):
    """The absent and declines test backends, importable in this process and in the workers."""
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", run_doubles.SPEC)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p))


def _results(folder: Path) -> list[dict]:
    return [json.loads(l) for l in (folder / "results.jsonl").read_text().splitlines()
            if json.loads(l).get("kind") == "result"]


# -- usage errors: one line, exit 2, before any case runs --------------------------------------------
@pytest.mark.parametrize("argv, named, known", [
    (["--backend", "nosuch"], "'nosuch'", "registered: "),
    (["--backend", "emulatr"], "'emulatr'", "emulator"),
    (["--backend", "emulator:foo=bar"], "emulator:foo=bar", "known: path"),
    (["--scheme", "w4a17"], "'w4a17'", "w4a16, w8a16"),
    (["--tier", "golen"], "'golen'", "exact, edge, random, golden"),
])
def test_unknown_names_are_usage_errors_before_any_case_runs(tmp_path, capsys, argv, named, known):
    out = tmp_path / "out"
    rc = main(["run", *argv, "--out", str(out), *SMALL])
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and known in lines[0], err
    assert "Traceback" not in err
    assert not (out / "results.jsonl").exists()  # nothing ran


def test_argparse_errors_are_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--profile", "cii"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "invalid choice: 'cii'" in err[0] and "smoke" in err[0]


def test_replay_and_target_refuse_unknown_names(tmp_path, capsys):
    assert main(["target", "nosuch", "--out", str(tmp_path)]) == 2
    assert "unknown target 'nosuch'; known: emulator, cpu" in capsys.readouterr().err
    bundle = tmp_path / "b.safetensors"
    bundle.write_bytes(b"")
    assert main(["replay", str(bundle), "--backend", "emulator:foo=bar"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "emulator:foo=bar" in err[0]


def test_empty_selection_is_a_usage_error(tmp_path, capsys):
    # w8a16 has no golden cases: an empty run must not be called conformant
    assert main(["run", "--backend", "emulator", "--scheme", "w8a16", "--tier", "golden", "--out",
                 str(tmp_path / "o"), *SMALL]) == 2
    assert "the selection has no cases" in capsys.readouterr().err


# -- nothing judged, or a backend unavailable: never CONFORMANT, never exit 0 ---------------------------
def test_every_case_unsupported_is_not_certified(doubles, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["run", "--backend", "declines", "--scheme", "w8a8", "--tier", "exact", "--out", str(out), *SMALL])
    console = capsys.readouterr().out
    assert rc == 4
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] is False and summary["status"] == "not-certified" and summary["n_judged"] == 0
    assert summary["not_certified"] == [{"column": "declines",
                                         "why": f"no case judged: all {summary['n_results']} case(s) unsupported"}]
    cell = summary["cells"][0]
    assert cell["unsupported_reasons"] == {"test double declines w8a8": summary["n_results"]}
    md = (out / "report.md").read_text()
    assert "**NOT CERTIFIED**" in md and "**CONFORMANT**" not in md
    assert f"{summary['n_results']} × test double declines w8a8" in md
    html = (out / "report.html").read_text()
    assert 'data-status="not-certified"' in html and ">NOT CERTIFIED:" in html and ">CONFORMANT:" not in html
    assert "test double declines w8a8" in html
    assert "not certified: declines: no case judged" in console
    assert "conformance: NOT CERTIFIED: 0 passed, 0 failed" in console


def test_a_named_unavailable_backend_fails_the_run(doubles, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["run", "--backend", "emulator", "--backend", "absent", "--scheme", "w8a8", "--tier", "exact",
               "--out", str(out), *SMALL])
    console = capsys.readouterr().out
    assert rc == 4
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "not-certified" and summary["n_bad"] == 0
    assert {"column": "absent", "why": "unavailable: test double: its device is not installed"} in \
        summary["not_certified"]
    cols = {c["key"]: c["status"] for c in summary["columns"]}
    assert cols == {"emulator": "conformant", "absent": "unavailable"}
    assert "not certified: absent: unavailable: test double: its device is not installed" in console


def test_target_without_a_device_records_unavailable(doubles, tmp_path, monkeypatch, capsys):
    from conformance.cli import commands

    monkeypatch.setitem(commands.TARGETS, "fake", ["absent"])
    assert main(["target", "fake", "--out", str(tmp_path)]) == 0  # documented tox behaviour
    summary = json.loads((tmp_path / "fake" / "summary.json").read_text())
    assert summary["status"] == "unavailable" and summary["ok"] is False and summary["n_results"] == 0
    assert summary["unavailable"] == {"absent": "test double: its device is not installed"}
    assert "UNAVAILABLE" in (tmp_path / "fake" / "report.md").read_text()
    console = capsys.readouterr().out
    assert "unavailable: absent: test double" in console
    assert "target fake: no backend of this target can run on this host; nothing was certified (status " \
           "unavailable in" in console


def test_default_backends_name_the_ones_left_out(doubles):
    from conformance.cli.commands import available_backends

    skipped = []
    names = available_backends(skipped)
    assert "emulator" in names and "declines" in names and "absent" not in names
    assert ("absent", "test double: its device is not installed") in skipped
    assert "auto" not in names  # the dispatcher is named explicitly, never a default backend


def test_a_plain_install_runs_without_hypothesis_or_torch(tmp_path):
    """`pip install .` brings numpy and ml_dtypes only: the default tiers must not import Hypothesis or torch,
    and the property tier says what it needs (one line, exit 2)."""
    code = ("import sys; sys.modules['hypothesis'] = None; sys.modules['torch'] = None; "
            "from conformance.cli.main import main; sys.exit(main(sys.argv[1:]))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    base = [sys.executable, "-c", code, "run", "--backend", "emulator", "--scheme", "w8a8", "--profile", "smoke",
            "--no-progress"]
    r = subprocess.run(base + ["--tier", "exact", "--out", str(tmp_path / "a")], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    r = subprocess.run(base + ["--tier", "property", "--out", str(tmp_path / "b")], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 2 and "needs Hypothesis" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    ckpt = ROOT / "tests" / "data" / "toolkit_checkpoints" / "auto-round-w4g32-sym-auto_gptq"
    r = subprocess.run([sys.executable, "-c", code, "model", str(ckpt), "--tokens", "1,2", "-o",
                        str(tmp_path / "y.safetensors")], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2 and "needs torch" in r.stderr and len(r.stderr.strip().splitlines()) == 1


# -- a run's summary is that run -----------------------------------------------------------------------
def test_second_run_into_the_same_folder_reports_only_its_own_cases(tmp_path, capsys):
    from conformance.cases.suite import case_list

    out = tmp_path / "out"
    assert main(["run", "--backend", "emulator", "--scheme", "w8a8", "--tier", "exact", "--out", str(out),
                 *SMALL]) == 0
    capsys.readouterr()
    assert main(["run", "--backend", "emulator", "--scheme", "w4a8", "--tier", "exact", "--out", str(out),
                 *SMALL]) == 0
    console = capsys.readouterr().out
    want = {s.case_id for s in case_list(schemes=["w4a8"], tiers=("exact",), profile="smoke")}
    assert {r["case_id"] for r in _results(out)} == want
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_results"] == len(want) and summary["schemes"] == ["w4a8"]
    assert f"{len(want)} passed, 0 failed, 0 unsupported, of {len(want)} result(s)" in console
    assert "held an earlier run; starting a fresh result set" in console


def test_resume_only_continues_the_same_run(tmp_path, capsys):
    out = tmp_path / "out"
    base = ["run", "--backend", "emulator", "--tier", "exact", "--out", str(out), *SMALL]
    assert main([*base, "--scheme", "w8a8"]) == 0
    n = len(_results(out))
    capsys.readouterr()
    assert main([*base, "--scheme", "w4a8", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "another case list" in err and len(err.strip().splitlines()) == 1
    assert main(["run", "--backend", "emulator:path=exact", "--tier", "exact", "--scheme", "w8a8", "--out",
                 str(out), "--resume", *SMALL]) == 2
    assert "backend(s) emulator, not emulator:path=exact" in capsys.readouterr().err
    assert main([*base, "--scheme", "w8a8", "--resume"]) == 0
    assert len(_results(out)) == n  # nothing re-run: every case was done
    assert main([*base, "--scheme", "w8a8", "--resume", "--out", str(tmp_path / "none")]) == 2
    assert "does not exist (drop --resume to start a run)" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([*base, "--scheme", "w8a8", "--resume", "--out", str(tmp_path / "empty")]) == 2
    assert "holds no earlier run to resume" in capsys.readouterr().err


def test_run_refuses_a_certification_bundle_folder(tmp_path, capsys):
    (tmp_path / "MANIFEST.json").write_text("{}")
    assert main(["run", "--backend", "emulator", "--scheme", "w8a8", "--tier", "exact", "--out", str(tmp_path),
                 *SMALL]) == 2
    assert "sealed certification bundle" in capsys.readouterr().err


# -- failures that explain themselves -------------------------------------------------------------------
@pytest.fixture(scope="module")
def failing_run(tmp_path_factory):
    """A kernel that rounds int8 activation ties away from zero while declaring canonical rounding."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("failing") / "out"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["run", "--backend", "emulator:act_rounding=rhaz,declare=canonical", "--scheme", "w8a8", "--tier",
                   "edge", "--out", str(out), *SMALL])
    assert rc == 1
    return out, buf.getvalue()


def test_failing_case_shows_worst_element_notes_and_relative_replay(failing_run):
    from emulator.tensorfile import load_tensors

    out, console = failing_run
    summary = json.loads((out / "summary.json").read_text())
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    fails = [r for r in _results(out) if r["verdict"] == "fail"]
    assert fails and len(summary["failures"]) == len(fails)
    for f in summary["failures"]:
        we = f["worst_element"]
        # the worst element is a real element of the stored output, outside the interval it names, which
        # lies inside the bundle's outward interval at that element
        t = load_tensors(out / f["bundle"])
        idx = tuple(we["index"])
        assert float(t["y_observed"].data[idx]) == we["observed"]
        assert not (we["lo"] <= we["observed"] <= we["hi"])
        assert t["lo"].data[idx] <= we["lo"] <= we["hi"] <= t["hi"].data[idx]
        assert float(t["y_exact"].data[idx]) == we["expected"]
        assert we["ulp"] >= 1
        assert not Path(f["bundle"]).is_absolute() and f["replay"] == f"qconform replay {f['bundle']}"
        row = f"| `{f['case_id']}` | [{idx[0]}, {idx[1]}]: observed {we['observed']:.9g}"
        assert row in md, row
        assert f["replay"] in md and f["replay"] in html
        assert f"observed {we['observed']:.9g}" in html
    assert f["notes"] == "claims canonical semantics"
    assert "declaration notes: claims canonical semantics" in md and "claims canonical semantics" in html
    assert "worst element [" in console and "declaration notes: claims canonical semantics" in console
    assert "reproduce (in the output folder): qconform replay bundles/" in console
    assert str(out) not in md.split("## Environment")[0]  # no absolute path before the environment section


def test_failures_are_grouped_by_signature(failing_run):
    out, console = failing_run
    summary = json.loads((out / "summary.json").read_text())
    groups = summary["failure_groups"]
    assert sum(g["count"] for g in groups) == len(summary["failures"])
    assert len(groups) < len(summary["failures"])  # the near-identical failures collapse
    for g in groups:
        assert g["count"] == len(g["case_ids"]) and g["example"]["case_id"] in g["case_ids"]
        assert "act_rounding=rhaz instead of the declared act_rounding=rne" in g["signature"]["reason"]
        assert f"FAIL x{g['count']}: emulator:act_rounding=rhaz,declare=canonical w8a8" in console
    md = (out / "report.md").read_text()
    assert f"### {groups[0]['count']} × fail: emulator:act_rounding=rhaz,declare=canonical · w8a8" in md


def test_html_says_what_pass_means(failing_run):
    out, _ = failing_run
    html = (out / "report.html").read_text()
    assert '<p id="pass-meaning">' in html and "inside the interval that the backend" in html


def test_console_table_fits_100_columns(failing_run):
    _, console = failing_run
    table = console.split("\n\n", 1)[1].split("FAIL x", 1)[0]
    assert table.strip() and max(len(l) for l in table.splitlines()) <= 100


def test_replay_from_the_output_folder(failing_run):
    out, _ = failing_run
    summary = json.loads((out / "summary.json").read_text())
    f = summary["failures"][0]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "conformance.cli.main", "replay", f["bundle"]], cwd=out, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "declaration notes: claims canonical semantics" in r.stdout
    assert f"worst element [{f['worst_element']['index'][0]}, " in r.stdout


def test_replay_on_an_unavailable_backend_is_not_a_pass(doubles, failing_run, capsys):
    out, _ = failing_run
    f = json.loads((out / "summary.json").read_text())["failures"][0]
    assert main(["replay", str(out / f["bundle"]), "--backend", "absent"]) == 4
    text = capsys.readouterr().out
    assert "backend absent unavailable here" in text and "NOT REPLAYED on absent" in text


# -- progress, pipes ---------------------------------------------------------------------------------------
def test_line_progress_every_tenth_or_every_few_seconds():
    import io

    from conformance.report.console import LineProgress

    t = [0.0]
    buf = io.StringIO()
    p = LineProgress(100, stream=buf, every=5.0, clock=lambda: t[0])
    for i in range(1, 101):
        t[0] += 0.01
        p(i, 0, {"backend": "emulator", "verdict": "fail" if i == 3 else "pass"})
    lines = buf.getvalue().splitlines()
    assert len(lines) == 10 and lines[0].startswith("progress: 10/100 (10 %), 1 failing")
    assert lines[-1].startswith("progress: 100/100 (100 %)")
    buf2 = io.StringIO()
    p = LineProgress(10 ** 6, stream=buf2, every=5.0, clock=lambda: t[0])
    for i in range(1, 4):
        t[0] += 6.0  # slow cases: a line every 5 s even far below 10 %
        p(i, 0, {"backend": "b", "verdict": "pass"})
    assert len(buf2.getvalue().splitlines()) == 3


def test_progress_reaches_a_log(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "conformance.cli.main", "run", "--backend", "emulator", "--scheme", "w8a8",
                        "--tier", "exact", "--profile", "smoke", "--out", str(tmp_path / "o")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    prog = [l for l in r.stderr.splitlines() if l.startswith("progress: ")]
    assert prog and prog[-1].startswith("progress: 8/8 (100 %)")


def test_closed_pipe_ends_quietly():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-m", "conformance.cli.main", "backends", "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    p.stdout.close()  # the reader went away before the first byte (`| head -0`)
    err = p.stderr.read().decode()
    rc = p.wait(timeout=300)
    assert rc == 141 and err == "", (rc, err)


@pytest.mark.parametrize("argv, named", [
    (["--backend", "nosuch"], "'nosuch'"),
    (["--backend", "emulator:foo=bar"], "emulator:foo=bar"),
    (["--backend", "emulator", "--scheme", "w4a17"], "'w4a17'"),
])
def test_certify_refuses_unknown_names_before_writing_anything(tmp_path, capsys, argv, named):
    out = tmp_path / "cert"
    assert main(["certify", *argv, "--out", str(out), "--profile", "smoke", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0]
    assert not out.exists()


def _run_args(out, backends):
    import argparse

    return argparse.Namespace(backend=backends, scheme=["w8a8"], tier=["exact"], profile="smoke", out=str(out),
                              jobs=1, shard=None, waivers=None, timeout=60.0, resume=False, no_progress=True)


def test_target_with_some_backends_unavailable(doubles, tmp_path, capsys):
    """What `qconform target` runs when part of its backends cannot start: those are recorded as
    unavailable (not certified, exit 0 by the documented tox behaviour); a backend that did start but
    judged nothing still exits 4."""
    from conformance.cli.commands import cmd_run

    why = {"absent": "test double: its device is not installed"}
    assert cmd_run(_run_args(tmp_path / "a", ["emulator"]), unavailable=why) == 0
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["status"] == "not-certified" and summary["unavailable"] == why
    assert "not certified: absent: unavailable: test double" in capsys.readouterr().out
    assert cmd_run(_run_args(tmp_path / "b", ["declines"]), unavailable=why) == 4


def test_a_relative_out_folder_works(tmp_path, monkeypatch, capsys):
    """README's first command, `qconform run --out qconform-out`, names its folder relative to the caller's
    directory; the workers run elsewhere, so every path they are given must be absolute (the shared inputs
    and each case's output). Before that fix every case crashed with 'file not found'."""
    monkeypatch.chdir(tmp_path)
    rc = main(["run", "--backend", "emulator", "--profile", "smoke", "--scheme", "w8a8", "--out", "qconform-out"])
    out = capsys.readouterr().out
    assert rc == 0, out[-2000:]
    assert "CONFORMANT" in out and "NOT CONFORMANT" not in out
    recs = [r for r in _results(tmp_path / "qconform-out") if r.get("kind") == "result"]
    assert recs and all(r["verdict"] == "pass" for r in recs), {r["verdict"] for r in recs}
