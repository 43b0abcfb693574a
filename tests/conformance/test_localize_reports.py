"""Failure localization end to end (docs/conformance.md#failure-localization): computed in the isolated worker
for the first failures of a backend/scheme/format, shown in the console, report.md, report.html and
`qconform replay`; a passing kernel's run holds none."""

import json
import os
from pathlib import Path

import pytest

import test_localize_kernels as kernels
from conformance.cli.main import main

HERE = Path(__file__).resolve().parent
RUN = ["run", "--profile", "smoke", "--no-progress", "-j", "1", "--scheme", "w8a8", "--tier", "exact",
       "--shard", "1/4"]
NAME = "activation scale amax/128 instead of amax/127"


@pytest.fixture
def planted(monkeypatch):
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", kernels.SPEC)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p))


def _records(out: Path) -> list:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]


def test_run_console_reports_and_replay_name_the_bug(planted, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert main(RUN + ["--backend", "planted:bug=w8a8_amax_128", "--out", str(out)]) == 1
    console = capsys.readouterr().out
    assert f"localization: activation quantization wrong on rows whose quantization is exact: {NAME}" in console
    recs = [r for r in _records(out) if r.get("kind") == "result"]
    assert recs and all(r["verdict"] == "fail" for r in recs)
    localized = [r for r in recs if r.get("localization")]
    assert 1 <= len(localized) <= 2  # the first failures of the (backend, scheme, format) only
    assert all(r["localization"]["stage"] == "activation quantization" for r in localized)
    assert NAME in (out / "report.md").read_text()
    assert NAME in (out / "report.html").read_text()
    monkeypatch.chdir(out)
    assert main(["replay", localized[0]["bundle"]]) == 1
    replay = capsys.readouterr().out
    assert f"localization: activation quantization wrong on rows whose quantization is exact: {NAME}" in replay


def test_probes_that_raise_leave_the_verdict_and_say_so(planted, tmp_path, capsys):
    out = tmp_path / "raises"
    assert main(RUN + ["--backend", "planted:bug=probe_raises", "--out", str(out)]) == 1
    assert "localization: not localized: the probes failed (error: ValueError: one-hot rows refused)" in \
        capsys.readouterr().out
    recs = [r for r in _records(out) if r.get("kind") == "result"]
    assert recs and all(r["verdict"] == "fail" for r in recs)  # the verdict is the case's own


def test_a_passing_kernel_gets_no_localization(planted, tmp_path, capsys):
    out = tmp_path / "ok"
    assert main(RUN + ["--backend", "planted:bug=none", "--out", str(out)]) == 0
    assert "localization" not in capsys.readouterr().out
    assert not any(r.get("localization") for r in _records(out))


def test_fingerprint_names_no_accumulator_while_the_weights_are_wrong(planted):
    """The accumulation bracket is withdrawn when the localization shows the weights wrong, and kept for the
    same kernel without the bug."""
    from conformance.fingerprint.decide import ProbeOptions, fingerprint
    from conformance.fingerprint.render import format_text

    bad = fingerprint("planted:bug=ct_nibble_swap", schemes=["w4a16"], axes=["accumulate"],
                      options=ProbeOptions(timeout=120))
    acc = bad["schemes"]["w4a16"]["axes"][0]
    assert acc["status"] == "not-named" and "bracket" not in acc and not acc["consistent"]
    assert "weights wrong" in acc["reason"] and "nibbles swapped within a byte" in acc["reason"]
    assert "not named" in format_text(bad)
    ok = fingerprint("planted:bug=none", schemes=["w4a16"], axes=["accumulate"], options=ProbeOptions(timeout=120))
    acc = ok["schemes"]["w4a16"]["axes"][0]
    assert acc["status"] == "ok" and acc.get("bracket") and acc["consistent"]
