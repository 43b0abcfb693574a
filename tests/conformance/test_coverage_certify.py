"""Certification records its coverage and a bounded, seeded search (docs/certification.md#coverage-and-search):
certify runs the property tier, bundle.json and certificate.md say what was covered and searched, and
verify-bundle checks both (--deep: the coverage against the tables; --rerun: the search replayed)."""

from __future__ import annotations

import json
import shutil

import pytest

from conformance.certify import verify_bundle
from conformance.certify.write import seal
from conformance.cli.main import main

from bundle_cache import shared

SCHEME = "q-uint8-tensor"  # the quickest scheme with a covering design and a property family


def _build(target):
    rc = main(["certify", "--backend", "emulator", "--scheme", SCHEME, "--profile", "ci", "--out", str(target),
               "--search-seed", "7", "--search-examples", "6", "--no-progress"])
    assert rc == 0


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return shared(tmp_path_factory, "coverage-certify", _build)


def _copy(bundle, tmp_path):
    dst = tmp_path / "b"
    shutil.copytree(bundle, dst)
    return dst


def _forge_meta(folder, meta):
    """Write bundle.json and regenerate the reports from it with the suite's own code, as a forger would."""
    from conformance.certify.derive import json_bytes, report_title, reports
    from conformance.run.runner import read_results

    raw = json_bytes(meta)
    (folder / "bundle.json").write_bytes(raw)
    lines = read_results(folder / "results.jsonl")
    for name, data in reports(lines, json.loads(raw), report_title(list(meta["backends"]), meta["host_label"])).items():
        (folder / name).write_bytes(data)


def _meta(folder):
    return json.loads((folder / "bundle.json").read_text())


def test_bundle_records_search_and_coverage(bundle):
    meta = _meta(bundle)
    s = meta["search"]
    assert s["seed"] == 7 and s["examples_per_family"] == 6 and s["ok"] is True
    assert s["families_searched"] == [f"{SCHEME}/none"]
    (entry,) = s["backends"]["emulator"][f"{SCHEME}/none"]
    assert entry["seed"] == 7 and entry["max_examples"] == 6 and entry["verdict"] == "pass" and entry["judged"] > 0
    lines = [json.loads(x) for x in (bundle / "search" / "results.jsonl").read_text().splitlines()]
    assert any(r.get("kind") == "result" and r["tier"] == "property" for r in lines)
    c = meta["coverage"]["schemes"][SCHEME]
    assert c["classes_covered"] == c["classes"] > 0 and c["pairs_covered"] == c["pairs_feasible"] > 0
    assert meta["ok"] is True


def test_certificate_states_what_it_covers(bundle):
    text = (bundle / "certificate.md").read_text()
    assert text.startswith("# qconform certificate: PASS")
    assert f"| `{SCHEME}` |" in text and "seed 7, at most 6 examples per family" in text


def test_bundle_verifies_deep(bundle):
    res = verify_bundle(bundle, deep=True)
    assert res.ok, res.problems


def test_a_failing_search_fails_the_certification(bundle, tmp_path):
    """A search line turned into a failure: the record and ok no longer follow from the search results."""
    b = _copy(bundle, tmp_path)
    p = b / "search" / "results.jsonl"
    lines = [json.loads(x) for x in p.read_text().splitlines()]
    for r in lines:
        if r.get("kind") == "result":
            r["verdict"] = "fail"
    p.write_text("".join(json.dumps(r) + "\n" for r in lines))
    seal(b)
    res = verify_bundle(b)
    assert any("search record differs" in x for x in res.problems), res.problems
    assert any("bundle.json: ok is True" in x for x in res.problems), res.problems
    assert any("without its replay bundle" in x for x in res.problems), res.problems


@pytest.mark.parametrize("edit", ["seed", "examples", "drop-family", "certificate"])
def test_edited_search_records_are_caught(bundle, tmp_path, edit):
    b = _copy(bundle, tmp_path)
    meta = _meta(b)
    if edit == "seed":
        meta["search"]["seed"] = 8
    elif edit == "examples":
        meta["search"]["examples_per_family"] = 600
    elif edit == "drop-family":
        p = b / "search" / "results.jsonl"
        p.write_text("".join(x + "\n" for x in p.read_text().splitlines() if '"kind": "result"' not in x
                             and '"kind":"result"' not in x))
    if edit != "certificate":
        (b / "bundle.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    else:
        (b / "certificate.md").write_text((b / "certificate.md").read_text().replace("at most 6", "at most 600"))
    seal(b)
    res = verify_bundle(b)
    assert not res.ok
    want = {"seed": "search", "examples": "search", "drop-family": "searched 0 of 1 families",
            "certificate": "certificate.md"}[edit]
    assert any(want in x for x in res.problems), res.problems


def test_deep_checks_the_coverage_record(bundle, tmp_path):
    b = _copy(bundle, tmp_path)
    meta = _meta(b)
    meta["coverage"]["schemes"][SCHEME]["classes_covered"] += 1
    (b / "bundle.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    from conformance.certify.coverage_search import certificate_text

    (b / "certificate.md").write_text(certificate_text(json.loads((b / "bundle.json").read_text())))
    seal(b)
    res = verify_bundle(b, deep=True)
    assert any("coverage record differs" in x for x in res.problems), res.problems


def test_rerun_replays_the_search(bundle, tmp_path):
    res = verify_bundle(bundle, rerun=1, rerun_seed=0)
    assert res.ok, res.problems
    assert res.checked["search_replayed"] == 1
    # a recorded judged count the replay does not reproduce (results and record forged alike)
    b = _copy(bundle, tmp_path)
    p = b / "search" / "results.jsonl"
    lines = [json.loads(x) for x in p.read_text().splitlines()]
    for r in lines:
        if r.get("kind") == "result":
            r["property"]["judged"] += 3
            r["property"]["calls"] += 3
    raw = "".join(json.dumps(r, sort_keys=True) + "\n" for r in lines)
    p.write_text(raw)
    from conformance.certify.coverage_search import certificate_text, search_record

    meta = _meta(b)
    meta["search"] = search_record(raw.encode(), profile="ci", schemes=[SCHEME], seed=7, examples=6)
    _forge_meta(b, meta)
    (b / "certificate.md").write_text(certificate_text(json.loads((b / "bundle.json").read_text())))
    seal(b)
    assert verify_bundle(b).ok  # self-consistent: only a replay can tell
    res = verify_bundle(b, rerun=1, rerun_seed=0)
    assert any("search replay" in x and "judged examples" in x for x in res.problems), res.problems


def test_search_examples_must_be_positive(tmp_path, capsys):
    rc = main(["certify", "--backend", "emulator", "--scheme", SCHEME, "--profile", "smoke", "--out",
               str(tmp_path / "x"), "--search-examples", "0"])
    assert rc == 2
    assert "--search-examples" in capsys.readouterr().err


def test_profiles_of_given_shapes_skip_the_search_unless_asked():
    """families (--for-model) and model certify given layer shapes: no search by default; every other profile
    searches. --search forces it (the CLI's flag reaches certify as search=True)."""
    from conformance.certify.write import search_by_default
    from conformance.cli.main import build_parser

    assert not search_by_default("families") and not search_by_default("model")
    assert all(search_by_default(p) for p in ("certification", "ci", "smoke", "nightly"))
    args = build_parser().parse_args(["certify", "--backend", "emulator", "--profile", "model", "--search"])
    assert args.search and not args.no_search


def test_a_fail_from_the_search_alone_is_named_on_the_certification_line(tmp_path):
    """`certification: FAIL (0 failing of 400; CONFORMANT ...)` confused a vendor: the search's failures are named."""
    import json

    from conformance.certify.cli import search_failures

    (tmp_path / "bundle.json").write_text(json.dumps({"search": {"ok": False, "n_bad": 2}}))
    assert search_failures(tmp_path) == 2
    (tmp_path / "bundle.json").write_text(json.dumps({"search": {"ok": True, "n_bad": 0}}))
    assert search_failures(tmp_path) == 0
    (tmp_path / "bundle.json").write_text(json.dumps({"search": None}))
    assert search_failures(tmp_path) == 0
