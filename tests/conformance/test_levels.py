"""Conformance levels in a run (docs/conformance.md#levels): a semantic deviation is NOT CONFORMANT (exit 1)
unless waived; rounding-level variants pass as CONFORMANT WITH DECLARED VARIANTS with their measured distance
from the canonical reference; canonical declarations are CONFORMANT."""

import json
from pathlib import Path

from conformance.cli.main import main

SMALL = ["--profile", "smoke", "--no-progress", "-j", "1"]


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_semantic_deviation_is_not_conformant(tmp_path, capsys):
    out = tmp_path / "v1"
    rc = main(["run", "--backend", "emulator:zero_read=v1_literal", "--scheme", "w4a16", "--out", str(out), *SMALL])
    text = capsys.readouterr().out
    s = _summary(out)
    assert rc == 1, text
    assert s["status"] == "not-conformant" and s["headline"] == "NOT CONFORMANT" and s["n_bad"] == 0
    assert s["level"] == "semantic"
    assert s["semantic_deviations"] and all(d["variants"] == ["zero_read=v1_literal"] for d in s["semantic_deviations"])
    # the deviation is measured: asymmetric v1 GPTQ read one code low leaves the canonical interval
    devs = [d for c in s["cells"] for d in c["deviations"]]
    assert devs and devs[0]["level"] == "semantic" and devs[0]["n_outside"] > 0
    assert "semantic deviation: emulator:zero_read=v1_literal: zero_read=v1_literal (semantic)" in text
    assert "conformance: NOT CONFORMANT" in text
    md = (out / "report.md").read_text()
    assert "Run level: **semantic**" in md and "zero_read=v1_literal (semantic)" in md
    html = (out / "report.html").read_text()
    assert 'data-level="semantic"' in html and "NOT CONFORMANT" in html


def test_semantic_deviation_named_by_a_waiver_is_accepted_and_listed(tmp_path, capsys):
    waivers = tmp_path / "w.toml"
    waivers.write_text('[[waiver]]\nbackend = "emulator:zero_read=v1_literal"\nscheme = "w4a16"\ncase = "*"\n'
                       'reason = "the engine reads v1 zeros literally (documented)"\nissue = "X-1"\n'
                       'expires = "2099-01-01"\n')
    out = tmp_path / "v1w"
    rc = main(["run", "--backend", "emulator:zero_read=v1_literal", "--scheme", "w4a16", "--out", str(out),
               "--waivers", str(waivers), *SMALL])
    text = capsys.readouterr().out
    s = _summary(out)
    assert rc == 0, text
    assert not s["semantic_deviations"] and s["status"] == "conformant"
    assert s["level"] == "semantic"  # still stated: never called canonical
    assert "waived" in text and s["headline"] != "CONFORMANT"


def test_rounding_variant_is_conformant_with_declared_variants(tmp_path, capsys):
    out = tmp_path / "rhaz"
    rc = main(["run", "--backend", "emulator:act_rounding=rhaz", "--scheme", "w8a8", "--out", str(out), *SMALL])
    text = capsys.readouterr().out
    s = _summary(out)
    assert rc == 0, text
    assert s["headline"] == "CONFORMANT WITH DECLARED VARIANTS" and s["level"] == "rounding"
    dev = [d for c in s["cells"] for d in c["deviations"]]
    assert [d["variant"] for d in dev] == ["act_rounding=rhaz"]
    assert dev[0]["max_ulp"] is not None and dev[0]["min_sqnr_db"] is not None
    assert "declared variant: emulator:act_rounding=rhaz: act_rounding=rhaz (rounding)" in text
    assert "conformance: CONFORMANT WITH DECLARED VARIANTS" in text


def test_canonical_emulator_is_conformant(tmp_path, capsys):
    out = tmp_path / "canon"
    rc = main(["run", "--backend", "emulator", "--scheme", "w8a8", "--out", str(out), *SMALL])
    s = _summary(out)
    assert rc == 0 and s["headline"] == "CONFORMANT" and s["level"] == "canonical"
    assert all(not c["deviations"] for c in s["cells"])


def test_a_variant_waiver_accepts_the_deviation_but_no_failure(tmp_path, capsys):
    """A waiver naming a variant accepts exactly that semantic deviation: the run is not NOT CONFORMANT for it,
    but a waiver of that kind never turns a failure into 'waived' (docs/conformance.md#waivers)."""
    waivers = tmp_path / "w.toml"
    waivers.write_text('[[waiver]]\nbackend = "emulator:*"\nscheme = "w4a16"\ncase = "*"\n'
                       'variant = "zero_read=v1_literal"\nreason = "documented engine semantics"\nissue = "X-2"\n'
                       'expires = "2099-01-01"\n')
    out = tmp_path / "vw"
    rc = main(["run", "--backend", "emulator:zero_read=v1_literal", "--scheme", "w4a16", "--out", str(out),
               "--waivers", str(waivers), *SMALL])
    s = _summary(out)
    assert rc == 0 and not s["semantic_deviations"] and s["headline"] == "CONFORMANT WITH DECLARED VARIANTS"
    # the same waiver on a kernel that fails: the failures stay failures
    out2 = tmp_path / "vw2"
    rc2 = main(["run", "--backend", "emulator:zero_read=v1_literal,declare=canonical", "--scheme", "w4a16",
                "--out", str(out2), "--waivers", str(waivers), *SMALL])
    s2 = _summary(out2)
    assert rc2 == 1 and s2["n_bad"] > 0 and not s2["totals"].get("waived")
    bad = tmp_path / "bad.toml"
    bad.write_text(waivers.read_text().replace("v1_literal", "v1_literl"))
    assert main(["run", "--backend", "emulator", "--out", str(tmp_path / "x"), "--waivers", str(bad), *SMALL]) == 2
    assert "v1_literl" in capsys.readouterr().err


def test_certifying_a_semantic_deviation_fails(tmp_path, capsys):
    """A certificate is never PASS for a declaration computing other numbers than the checkpoint defines."""
    out = tmp_path / "cert"
    rc = main(["certify", "--backend", "emulator:zero_read=v1_literal", "--scheme", "w4a16", "--profile", "smoke",
               "--out", str(out), "-j", "1"])
    text = capsys.readouterr().out
    assert rc == 1 and "certification: FAIL" in text and "NOT CONFORMANT, level semantic" in text
    bundle = json.loads((out / "bundle.json").read_text())
    assert bundle["semantic_deviations"] > 0 and bundle["ok"] is False and bundle["level"] == "semantic"
    assert main(["verify-bundle", str(out)]) == 0  # the bundle is consistent: it says FAIL, and verifies
