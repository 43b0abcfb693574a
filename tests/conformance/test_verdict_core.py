"""The verdict core (conformance/judge/verdict.py): one ``Verdict`` for every verdict the suite writes, its
properties as docs/conformance.md#verdicts states them, result lines through ``ResultRecord``, and
certification's writer and deep verifier deciding by ``judge`` itself."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pytest

from conformance.run.record import RecordError, ResultRecord, read_records
from conformance.judge.verdict import BAD, JUDGED, PASSING, Verdict

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
#: a results.jsonl written by the suite before the verdict core existed (one line per kind of record)
BEFORE = Path(__file__).parent / "data" / "results_before_verdict_core.jsonl"


def _backticked(text: str) -> set:
    return set(re.findall(r"`([a-z-]+)`", text))


# -- the names and their properties, against the documentation --------------------------------------
def test_the_enum_is_the_documented_verdict_table():
    table = DOC.split("## Verdicts", 1)[1].split("###", 1)[0]
    documented = {m.group(1) for m in re.finditer(r"^\| `([a-z-]+)` \|", table, re.M)}
    assert documented == {v.value for v in Verdict}


def test_passing_and_bad_are_what_the_docs_promise():
    # "The console's closing line counts as *passed* only `pass`, `pass-with-tie-flips` and `quality-warning`"
    sentence = DOC.split("counts as *passed* only", 1)[1].split(";", 1)[0]
    assert {v.value for v in PASSING} == _backticked(sentence) == {"pass", "pass-with-tie-flips", "quality-warning"}
    # CONFORMANT: "no case is `fail`, `crash` or `timeout` (after waivers)"
    row = next(line for line in DOC.splitlines() if line.startswith("| `conformant` | CONFORMANT |"))
    assert {v.value for v in BAD} == _backticked(row.split("no case is", 1)[1].split("(after", 1)[0])
    # neither a waived known defect nor opaque arithmetic nor a proof-less agreement is a pass
    for v in (Verdict.WAIVED, Verdict.PASS_SQNR, Verdict.MISTRUSTED, Verdict.UNSUPPORTED):
        assert not v.passing and not v.bad
    assert all(v.judged for v in PASSING) and Verdict.FAIL.judged and not Verdict.CRASH.judged
    assert not Verdict.UNSUPPORTED.judged and not Verdict.WAIVED.judged
    assert {v for v in Verdict if v.passing} == PASSING and {v for v in Verdict if v.bad} == BAD
    assert {v for v in Verdict if v.judged} == JUDGED


def test_order_is_a_total_severity_with_bad_first_and_unsupported_last():
    ranked = sorted(Verdict, key=lambda v: v.order)
    assert len({v.order for v in Verdict}) == len(Verdict)
    assert set(ranked[:3]) == BAD and ranked[-1] is Verdict.UNSUPPORTED and ranked[-2] is Verdict.PASS
    # every non-pass ranks below every conformance pass: a cell or family holding one never reads as passing
    worst_pass = min(v.order for v in PASSING)
    for v in (Verdict.WAIVED, Verdict.PASS_SQNR, *BAD):
        assert v.order < worst_pass
    assert Verdict.worst(["pass", "pass-sqnr", "quality-warning"]) is Verdict.PASS_SQNR
    assert Verdict.worst(["pass", "waived"]) is Verdict.WAIVED
    assert Verdict.worst([]) is None


def test_a_verdict_is_its_string():
    assert Verdict.PASS == "pass" and "fail" in BAD and "waived" not in PASSING
    assert json.dumps({"verdict": Verdict.PASS_WITH_TIE_FLIPS}) == '{"verdict": "pass-with-tie-flips"}'
    assert f"{Verdict.FAIL:6s}|" == "fail  |" and str(Verdict.CRASH) == "crash"
    with pytest.raises(ValueError, match="unknown verdict 'pas'; known: pass"):
        Verdict.parse("pas")


def _verdict_expr(node) -> bool:
    """``x["verdict"]``, ``x.get("verdict")`` or ``x["waived_verdict"]``-like expressions."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value).endswith("verdict")
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and node.args and isinstance(node.args[0], ast.Constant)):
        return str(node.args[0].value).endswith("verdict")
    return False


def _strings(node) -> list:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    return []


def _verdict_literals(tree) -> list:
    """(line, string) of every literal the code writes as a verdict or compares a verdict with."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("ReplayBundle",):  # a bundle's label ("probe", "golden", "inputs"), not a verdict
                continue
            for kw in node.keywords:
                if kw.arg in ("verdict", "waived_verdict"):
                    out += [(node.lineno, s) for s in _strings(kw.value)]
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value in ("verdict", "waived_verdict"):
                    out += [(node.lineno, s) for s in _strings(v)]
        elif isinstance(node, ast.Assign) and any(_verdict_expr(t) for t in node.targets):
            out += [(node.lineno, s) for s in _strings(node.value)]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_verdict_expr(s) for s in sides):
                out += [(node.lineno, s) for side in sides for s in _strings(side)]
    return out


def test_every_verdict_string_in_the_code_is_a_member():
    """A typo'd verdict ("pass-sqrn") written or compared anywhere would silently never match."""
    known = {v.value for v in Verdict}
    bad, seen = [], 0
    for top in ("conformance", "qconform_torch", "benchmarks"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for line, s in _verdict_literals(ast.parse(path.read_text(encoding="utf-8"))):
                seen += 1
                if s not in known:
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {s!r}")
    assert not bad, "verdict strings that are no Verdict:\n" + "\n".join(bad)
    assert seen  # the scan reaches the code that still spells verdicts out (its own test: below)


def test_the_scan_sees_a_misspelt_verdict():
    code = ('rec["verdict"] = "pas"\nif r.get("verdict") in ("fail", "crsh"):\n    pass\n'
            'x = dict(verdict="waivd")\ny = {"verdict": "timeout"}\nReplayBundle(inp, spec, verdict="probe")\n')
    assert {s for _, s in _verdict_literals(ast.parse(code))} == {"pas", "fail", "crsh", "waivd", "timeout"}


def test_every_table_lists_every_verdict():
    from conformance.report.console import TABLE_VERDICTS
    from conformance.report.html import COLOURS, TINTS
    from conformance.run.runner import VERDICTS
    from conformance.report.summary import VERDICT_ORDER

    every = {v.value for v in Verdict}
    assert {v for v, _ in TABLE_VERDICTS} == every and all(len(t) <= 6 for _, t in TABLE_VERDICTS)
    assert set(VERDICT_ORDER) == every and set(VERDICTS) == every  # runner.VERDICTS once lacked pass-sqnr
    assert set(COLOURS) == every and set(TINTS) == every


# -- the summary never calls an unknown verdict green -------------------------------------------------
def test_a_verdict_that_is_none_of_the_suites_is_never_conformant():
    from conformance.report.summary import summarize_sources

    def src(verdict):
        rec = {"kind": "result", "backend": "b", "case_id": "c", "scheme": "w4a16", "verdict": verdict}
        return [{"path": ".", "folder": ".", "headers": [], "backends": {}, "results": [rec], "environment": {},
                 "host": None}]

    assert summarize_sources(src("pass"))["status"] == "conformant"
    s = summarize_sources(src("pas"))  # a damaged or hand-edited line
    assert s["status"] == "not-conformant" and s["n_bad"] == 1


def test_a_certification_counts_an_unknown_verdict_as_bad():
    from conformance.certify.derive import verdict_summary

    latest = {("b", "c"): {"backend": "b", "case_id": "c", "verdict": "passs", "scheme": "w4a16"}}
    out = verdict_summary(latest, ["b"], {"b": {"available": True}})
    assert out["n_bad"] == 1 and out["ok"] is False


# -- result records -----------------------------------------------------------------------------------
def test_a_result_file_written_before_the_verdict_core_reads_and_writes_back_unchanged():
    lines = [json.loads(line) for line in BEFORE.read_text(encoding="utf-8").splitlines() if line.strip()]
    results = [r for r in lines if r.get("kind") == "result"]
    recs = read_records(BEFORE)
    assert len(recs) == len(results) >= 10  # the run and backend lines are skipped
    assert {r.verdict for r in recs} >= {Verdict.PASS, Verdict.FAIL, Verdict.WAIVED, Verdict.UNSUPPORTED,
                                         Verdict.PASS_WITH_TIE_FLIPS}
    for rec, line in zip(recs, results):
        assert rec.to_json() == line  # same keys, same values (nulls kept as null)
        assert json.loads(json.dumps(rec.to_json())) == line
    waived = next(r for r in recs if r.verdict is Verdict.WAIVED)
    assert waived.waived_verdict in BAD and waived.waiver["issue"] and waived.bundle
    expired = next(r for r in recs if r.waiver_expired)
    assert expired.verdict is Verdict.FAIL and "expired" in expired.reason


def test_a_record_with_an_unknown_verdict_or_missing_field_is_refused(tmp_path):
    line = json.loads(next(x for x in BEFORE.read_text(encoding="utf-8").splitlines() if '"kind": "result"' in x))
    with pytest.raises(RecordError, match="unknown verdict 'pas'"):
        ResultRecord.from_json(dict(line, verdict="pas"))
    short = {k: v for k, v in line.items() if k != "scheme"}
    with pytest.raises(RecordError, match="lacks scheme"):
        ResultRecord.from_json(short)
    p = tmp_path / "results.jsonl"
    p.write_text(json.dumps(line) + "\n" + json.dumps(dict(line, verdict="ok")) + "\n", encoding="utf-8")
    with pytest.raises(RecordError, match=r"results.jsonl:2: .*unknown verdict 'ok'"):
        read_records(p)


def test_a_later_field_is_kept():
    line = json.loads(next(x for x in BEFORE.read_text(encoding="utf-8").splitlines() if '"kind": "result"' in x))
    rec = ResultRecord.from_json(dict(line, future_field={"a": 1}))
    assert rec.extra == {"future_field": {"a": 1}} and rec.to_json()["future_field"] == {"a": 1}


# -- one judge: the certification writer and the deep verifier decide by it ---------------------------
@pytest.fixture(scope="module")
def small_bundle(tmp_path_factory):
    """A certification of the emulator and a mutant that truncates its output (fails, and passes by tie flips)."""
    import os

    from conformance.certify import certify
    from conformance.selftest.doubles.mutants import EXTRA_BACKENDS_ENTRY

    old = os.environ.get("QCONFORM_EXTRA_BACKENDS")
    os.environ["QCONFORM_EXTRA_BACKENDS"] = EXTRA_BACKENDS_ENTRY
    try:
        out = tmp_path_factory.mktemp("vc") / "bundle"
        res = certify(["emulator", "mutant:bug=output-truncated-fp16"], out, profile="smoke", schemes=["w8a8"],
                      tiers=["exact", "edge"], log=lambda *a: None)
    finally:
        if old is None:
            os.environ.pop("QCONFORM_EXTRA_BACKENDS", None)
        else:
            os.environ["QCONFORM_EXTRA_BACKENDS"] = old
    return res


def test_writer_and_deep_verifier_agree_with_judge(small_bundle):
    """Regression gate: every stored case's judged interval is the one ``judge`` forms, and re-judging the
    stored output gives the recorded verdict; the deep verifier, which calls ``judge``, finds nothing."""
    from backends.base import Declared

    from conformance.certify import decode_case, load_outputs, verify_bundle
    from conformance.cases.suite import CaseSpec
    from conformance.judge.verdict import judge, judged_against

    path = small_bundle.path
    lines = [json.loads(x) for x in (path / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    recs = {(r["backend"], r["case_id"]): r for r in lines if r.get("kind") == "result"}
    verdicts = {r["verdict"] for r in recs.values()}
    assert {"pass", "fail"} <= verdicts, verdicts
    checked = 0
    for f in sorted((path / "outputs").glob("*.safetensors")):
        label, stored = load_outputs(f)
        for case_id, entry in stored.items():
            rec = recs[(label, case_id)]
            d = decode_case(entry["tensors"], entry["meta"])
            spec = CaseSpec.from_json(rec["spec"])
            declared = Declared(**rec["declared"])
            inp = spec.inputs()
            with np.errstate(all="ignore"):
                j = judge(inp, judged_against(inp, declared), d["y"], declared)
            assert j.verdict == rec["verdict"], (label, case_id)
            np.testing.assert_array_equal(d["jlo"], j.judged.lo)
            np.testing.assert_array_equal(d["jhi"], j.judged.hi)
            np.testing.assert_array_equal(d["lo"], j.loose.lo)
            checked += 1
    assert checked == sum(1 for r in recs.values() if r["verdict"] != "unsupported")
    res = verify_bundle(path, deep=True)
    assert res.ok, res.problems
    assert res.checked["deep"] == checked
