"""Review: `qconform report` on a run folder never says CONFORMANT for fewer results than the run asked for.

The run's own summary enforces the invariant with the exact (backend, case) pairs it asked for; `qconform
report OUT` recomputes it from the folder's run header alone (conformance/run/completeness.py
``header_shortfall``). A property-tier run stopped after some of its searches left a folder whose
report said CONFORMANT: the header counted the seeded cases only, and the property results were not
counted at all.
"""

from __future__ import annotations

import json

from conformance.cli.main import main


def _write(out, header: dict, results: list[dict]) -> None:
    out.mkdir()
    lines = [dict(kind="run", suite="qconform", profile="ci", backends=["emulator"], **header),
             {"kind": "backend", "backend": "emulator", "available": True, "version": "0"}]
    lines += [dict(kind="result", backend="emulator", scheme="w4a16", weight_format="gptq", generator="g",
                   reason="", **r) for r in results]
    (out / "results.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))


def test_a_property_run_missing_searches_is_not_conformant(tmp_path):
    """A run of 3 property searches on one backend, stopped after the first (which passed)."""
    out = tmp_path / "out"
    _write(out, {"tiers": ["property"], "case_count": 0, "property_searches": 3},
           [{"case_id": "property/w4a16/gptq/search/seed0", "tier": "property", "verdict": "pass"}])
    assert main(["report", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "incomplete" and s["ok"] is False and s["n_missing"] == 2, s["status"]


def test_seeded_cases_complete_but_property_searches_missing(tmp_path):
    out = tmp_path / "out"
    _write(out, {"tiers": ["exact", "property"], "case_count": 2, "property_searches": 1},
           [{"case_id": f"exact/c{i}", "tier": "exact", "verdict": "pass"} for i in range(2)])
    main(["report", str(out)])
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "incomplete" and s["n_missing"] == 1


def test_complete_property_run_stays_conformant(tmp_path):
    """Control: every search has its result line."""
    out = tmp_path / "out"
    _write(out, {"tiers": ["exact", "property"], "case_count": 1, "property_searches": 1},
           [{"case_id": "exact/c0", "tier": "exact", "verdict": "pass"},
            {"case_id": "property/w4a16/gptq/search/seed0", "tier": "property", "verdict": "pass"}])
    main(["report", str(out)])
    s = json.loads((out / "summary.json").read_text())
    assert s.get("n_missing") is None and s["status"] != "incomplete", s["notes"]
