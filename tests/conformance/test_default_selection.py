"""A default run (no --backend) judges the backends that can judge something (issue 22 item 13): a backend it
chose by availability that has no case for the selection is reported ("not judged: no applicable case"), not a
NOT CERTIFIED run; a backend the user named still is; a run where nothing was judged is never CONFORMANT."""

import json

from conformance.report.write import load_source
from conformance.report.summary import summarize_sources


def _source(tmp_path, *, default_selection, verdicts: dict):
    """A results.jsonl of one run: ``verdicts`` = {backend: [verdict per case]}."""
    lines = [{"kind": "run", "suite": "qconform", "backends": list(verdicts), "case_count": 2}]
    if default_selection is not None:
        lines[0]["default_selection"] = default_selection
    for b, vs in verdicts.items():
        lines.append({"kind": "backend", "backend": b, "available": True, "version": "1"})
        for i, v in enumerate(vs):
            lines.append({"kind": "result", "backend": b, "case_id": f"c{i}", "scheme": "w4a16", "verdict": v,
                          "reason": "refused" if v == "unsupported" else ""})
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return summarize_sources([load_source(tmp_path)])


def test_default_selected_backend_without_cases_is_reported_not_failed(tmp_path):
    s = _source(tmp_path, default_selection=["emulator", "vendor"],
                verdicts={"emulator": ["pass", "pass"], "vendor": ["unsupported", "unsupported"]})
    assert s["status"] == "conformant" and s["ok"]
    assert s["not_certified"] == []
    assert [n["column"] for n in s["no_applicable_case"]] == ["vendor"]
    assert any(n.startswith("not judged: vendor: no applicable case") for n in s["notes"])
    assert {c["key"]: c["status"] for c in s["columns"]} == {"emulator": "conformant", "vendor": "no-applicable-case"}


def test_named_backend_without_cases_is_still_not_certified(tmp_path):
    s = _source(tmp_path, default_selection=None,
                verdicts={"emulator": ["pass", "pass"], "vendor": ["unsupported", "unsupported"]})
    assert s["status"] == "not-certified" and not s["ok"]
    assert [n["column"] for n in s["not_certified"]] == ["vendor"]


def test_default_run_where_nothing_was_judged_is_not_conformant(tmp_path):
    s = _source(tmp_path, default_selection=["emulator", "vendor"],
                verdicts={"emulator": ["unsupported", "unsupported"], "vendor": ["unsupported", "unsupported"]})
    assert s["status"] != "conformant" and not s["ok"] and s["n_judged"] == 0


def test_default_selected_backend_that_fails_still_fails_the_run(tmp_path):
    s = _source(tmp_path, default_selection=["emulator", "vendor"],
                verdicts={"emulator": ["pass", "pass"], "vendor": ["fail", "unsupported"]})
    assert s["status"] == "not-conformant" and s["n_bad"] == 1
