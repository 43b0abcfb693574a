"""The pytest plugin turns cases into items that pass, fail with a replay command, or skip with a reason."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pytest(tmp_path, *args, env=None):
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT)
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q",
                           "-p", "no:cacheprovider", "-o", "addopts=", *args],
                          cwd=tmp_path, env=e, capture_output=True, text=True, timeout=600)


def test_plugin_items_pass_on_the_emulator_under_xdist(tmp_path):
    out = tmp_path / "out"
    r = _pytest(tmp_path, "--qconform-backend=emulator", "--qconform-profile=smoke", "--qconform-scheme=w8a8",
                "--qconform-tier=edge", f"--qconform-out={out}", "-n", "2")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    n = int(r.stdout.strip().splitlines()[-1].split()[0])
    assert n >= 5
    recs = [json.loads(l) for f in out.glob("results-*.jsonl") for l in f.read_text().splitlines()]
    assert len(recs) == n and {x["verdict"] for x in recs} <= {"pass", "mistrusted"}


def test_plugin_failure_prints_replay_command(tmp_path):
    out = tmp_path / "out"
    r = _pytest(tmp_path, "--qconform-backend=emulator:act_rounding=rhaz,declare=canonical",
                "--qconform-profile=smoke", "--qconform-scheme=w8a8", "--qconform-tier=edge",
                f"--qconform-out={out}", "-k", "int8-ties")
    assert r.returncode == 1, r.stdout[-2000:]
    assert "qconform replay" in r.stdout and "act_rounding=rhaz" in r.stdout


def test_plugin_without_backend_adds_nothing(tmp_path):
    (tmp_path / "test_x.py").write_text("def test_a():\n    assert True\n")
    r = _pytest(tmp_path)
    assert r.returncode == 0 and "1 passed" in r.stdout


def test_plugin_collects_only_conformance_cases_in_a_vendor_repository(tmp_path):
    """The documented example (docs/conformance.md#pytest): a vendor's repository with its own tests
    (one fails, one cannot even be imported) and a conftest; --qconform-backend runs the cases alone."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_vendor_own.py").write_text("def test_own():\n    assert False, 'vendor test ran'\n")
    (tmp_path / "tests" / "conftest.py").write_text("import pytest\n\n@pytest.fixture\ndef vendor_fixture():\n"
                                                    "    return 1\n")
    (tmp_path / "tests" / "test_vendor_broken.py").write_text("import vendor_module_that_does_not_exist\n")
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\ntestpaths = ['tests']\n")
    r = _pytest(tmp_path, "--qconform-backend=emulator", "--qconform-profile=smoke", "--qconform-scheme=w8a8",
                "--qconform-tier=exact", f"--qconform-out={tmp_path / 'out'}")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "vendor" not in r.stdout and "8 passed" in r.stdout
    r = _pytest(tmp_path)  # without the option the repository's own tests run as usual
    assert r.returncode != 0 and "vendor_module_that_does_not_exist" in r.stdout


def test_plugin_unknown_names_are_usage_errors(tmp_path):
    for opt, named in (("--qconform-backend=emulatr", "'emulatr'"), ("--qconform-backend=emulator:foo=bar", "foo"),
                       ("--qconform-scheme=w4a17", "'w4a17'"), ("--qconform-tier=golen", "'golen'"),
                       ("--qconform-profile=cii", "'cii'")):
        args = [opt] if opt.startswith("--qconform-backend") else ["--qconform-backend=emulator", opt]
        r = _pytest(tmp_path, *args)
        assert r.returncode == 4, (opt, r.stdout[-1000:], r.stderr[-1000:])  # pytest's usage-error status
        err = [l for l in r.stderr.splitlines() if l.strip()]
        assert len(err) == 1 and err[0].startswith("ERROR: qconform: ") and named in err[0], r.stderr


def test_plugin_unavailable_or_unjudged_backend_is_not_green(tmp_path):
    here = Path(__file__).resolve().parent
    env = {"QCONFORM_EXTRA_BACKENDS": "absent=run_doubles:Absent,declines=run_doubles:Declines",
           "PYTHONPATH": os.pathsep.join((str(ROOT), str(here)))}
    r = _pytest(tmp_path, "--qconform-backend=absent", "--qconform-profile=smoke", "--qconform-scheme=w8a8", env=env)
    assert r.returncode == 1, r.stdout[-2000:]
    assert "absent unavailable here: test double: its device is not installed" in r.stdout and "1 failed" in r.stdout
    r = _pytest(tmp_path, "--qconform-backend=declines", "--qconform-profile=smoke", "--qconform-scheme=w8a8",
                "--qconform-tier=exact", env=env)
    assert r.returncode == 1, r.stdout[-2000:]
    assert "8 skipped" in r.stdout and "NOT CERTIFIED: no case of declines was judged" in r.stdout


def test_plugin_session_is_one_result_set_with_relative_replay(tmp_path):
    """A second session into the same --qconform-out replaces the first one's results; a failure's
    replay command names the bundle relative to that folder."""
    from conformance.cli.main import main

    out = tmp_path / "out"
    r = _pytest(tmp_path, "--qconform-backend=emulator", "--qconform-profile=smoke", "--qconform-scheme=w8a8",
                "--qconform-tier=exact", f"--qconform-out={out}")
    assert r.returncode == 0, r.stdout[-2000:]
    r = _pytest(tmp_path, "--qconform-backend=emulator:act_rounding=rhaz,declare=canonical",
                "--qconform-profile=smoke", "--qconform-scheme=w8a8", "--qconform-tier=edge",
                f"--qconform-out={out}", "-k", "int8-ties")
    assert r.returncode == 1
    recs = [json.loads(l) for f in out.glob("results-*.jsonl") for l in f.read_text().splitlines()]
    assert recs and all(x["backend"] == "emulator:act_rounding=rhaz,declare=canonical" for x in recs)
    line = next(l for l in r.stdout.splitlines() if "reproduce (in " in l)
    rel = line.split("qconform replay ", 1)[1].strip()
    assert rel.startswith("bundles/") and (out / rel).is_file()
    assert "worst element [" in r.stdout and "declaration notes: claims canonical semantics" in r.stdout
    assert main(["report", str(out), "--md"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_results"] == len(recs) and summary["status"] == "not-conformant"


def test_plugin_unavailable_backend_reaches_the_report(tmp_path):
    from conformance.cli.main import main

    here = Path(__file__).resolve().parent
    env = {"QCONFORM_EXTRA_BACKENDS": "absent=run_doubles:Absent",
           "PYTHONPATH": os.pathsep.join((str(ROOT), str(here)))}
    out = tmp_path / "out"
    r = _pytest(tmp_path, "--qconform-backend=absent", "--qconform-profile=smoke", "--qconform-scheme=w8a8",
                f"--qconform-out={out}", env=env)
    assert r.returncode == 1
    assert main(["report", str(out), "--md"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "unavailable" and summary["ok"] is False
    assert summary["unavailable"] == {"absent": "test double: its device is not installed"}


def test_plugin_refuses_to_overwrite_a_certification_bundle(tmp_path):
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "MANIFEST.json").write_text("{}")
    (out / "report.md").write_text("sealed")
    r = _pytest(tmp_path, "--qconform-backend=emulator", f"--qconform-out={out}")
    assert r.returncode == 4 and "holds a sealed certification bundle" in r.stderr
    assert (out / "report.md").read_text() == "sealed"


def test_plugin_semantic_deviation_is_not_green(tmp_path):
    """Items pass only inside their interval *and* without an unwaived semantic deviation (docs/conformance.md#levels)."""
    out = tmp_path / "out"
    r = _pytest(tmp_path, "--qconform-backend=emulator:zero_read=v1_literal", "--qconform-profile=smoke",
                "--qconform-scheme=w4a16", "--qconform-tier=exact", f"--qconform-out={out}", "-k", "asym and v1")
    assert r.returncode == 1, r.stdout[-2000:]
    assert "semantic deviation" in r.stdout and "zero_read=v1_literal" in r.stdout


def test_plugin_reports_a_waived_failure_as_xfail_never_as_pass(tmp_path):
    """A known defect a waiver names is an expected failure naming the waiver (docs/conformance.md#pytest)."""
    out = tmp_path / "out"
    (tmp_path / "w.toml").write_text('[[waiver]]\nbackend = "emulator:*"\nscheme = "w8a8"\ncase = "*"\n'
                                     'reason = "test: known tie rule"\nissue = "T-9"\nexpires = "2999-01-01"\n')
    r = _pytest(tmp_path, "--qconform-backend=emulator:act_rounding=rhaz,declare=canonical",
                "--qconform-profile=smoke", "--qconform-scheme=w8a8", "--qconform-tier=edge",
                f"--qconform-out={out}", "--qconform-waivers=w.toml", "-k", "int8-ties", "-rx")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    recs = [json.loads(x) for f in out.glob("results-*.jsonl") for x in f.read_text().splitlines()]
    waived = [x for x in recs if x["verdict"] == "waived"]
    assert waived and all(x["waived_verdict"] == "fail" for x in waived)
    assert f"{len(waived)} xfailed" in r.stdout and "waiver T-9" in r.stdout
    assert f"{len(waived)} passed" not in r.stdout
