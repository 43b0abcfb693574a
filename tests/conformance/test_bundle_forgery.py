"""Bundles that cannot lie: an informed forger who edits a bundle, regenerates every derived file with the
suite's own code and re-seals MANIFEST.json still fails verification; hostile files do not hang or exhaust
the verifier; a certification that judged nothing is not certified; the --rerun audit catches outputs that
the kernel did not compute.
"""

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from bundle_cache import copy_bundle
from conformance.certify import verify_bundle
from conformance.cli.main import main


# -- the informed forger -------------------------------------------------------------------------------
def _lines(folder: Path) -> list[dict]:
    return [json.loads(l) for l in (folder / "results.jsonl").read_text().splitlines() if l.strip()]


def _write_lines(folder: Path, lines: list[dict]) -> None:
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def _forge(folder: Path, **meta_overrides) -> None:
    """Regenerate every derived file from the (edited) results with the suite's own code, then re-seal."""
    from conformance.certify.derive import (backend_lines, declared_table, environment_record, json_bytes,
                                            latest_results, report_title, reports, run_headers, verdict_summary,
                                            waiver_record)

    lines = _lines(folder)
    latest = latest_results(lines)
    blines = backend_lines(lines)
    headers = run_headers(lines)
    labels = list(dict.fromkeys(r["backend"] for r in latest.values()))
    (folder / "declared.json").write_bytes(json_bytes(declared_table(latest)))
    (folder / "waivers.json").write_bytes(json_bytes(waiver_record(latest, headers)))
    (folder / "environment.json").write_bytes(json_bytes(environment_record(headers, blines)))
    meta = json.loads((folder / "bundle.json").read_text())
    meta.update(verdict_summary(latest, labels, blines))
    meta.update(meta_overrides)
    raw = json_bytes(meta)
    (folder / "bundle.json").write_bytes(raw)
    for name, data in reports(lines, json.loads(raw), report_title(labels, meta["host_label"])).items():
        (folder / name).write_bytes(data)
    if (folder / "certificate.md").exists():  # derived from bundle.json too (conformance/certify/coverage_search.py)
        from conformance.certify.coverage_search import certificate_text

        (folder / "certificate.md").write_text(certificate_text(json.loads(raw)), encoding="utf-8")
    _reseal(folder)


def _reseal(folder: Path) -> None:
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.is_symlink() and p.name != "MANIFEST.json":
            data = p.read_bytes()
            files[p.relative_to(folder).as_posix()] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    man = json.loads((folder / "MANIFEST.json").read_text())
    man["files"] = files
    (folder / "MANIFEST.json").write_text(json.dumps(man))


def _set_cases(folder: Path, ids: list[str]) -> None:
    text = "".join(i + "\n" for i in ids)
    (folder / "cases.txt").write_text(text)
    h = hashlib.sha256(text.encode()).hexdigest()
    lines = _lines(folder)
    for r in lines:
        if r.get("kind") == "run":
            r.update(case_list_sha256=h, case_count=len(ids))
    _write_lines(folder, lines)
    meta = json.loads((folder / "bundle.json").read_text())
    meta.update(case_list_sha256=h, case_count=len(ids))
    (folder / "bundle.json").write_text(json.dumps(meta))


def test_fresh_bundles_verify_after_the_forger_helper_changes_nothing(basic, rich, tmp_path):
    """The forger's regeneration reproduces a fresh bundle byte for byte (else the tests below prove nothing)."""
    for src in (basic, rich):
        b = copy_bundle(src, tmp_path / src.name)
        before = {p.name: p.read_bytes() for p in b.iterdir() if p.is_file() and p.name != "MANIFEST.json"}
        _forge(b)
        after = {p.name: p.read_bytes() for p in b.iterdir() if p.is_file() and p.name != "MANIFEST.json"}
        assert before == after
        assert verify_bundle(b).ok


# -- what the issue listed -------------------------------------------------------------------------------
def test_crash_relabelled_unsupported_fails(rich, tmp_path):
    b = copy_bundle(rich, tmp_path / "b")
    lines = _lines(b)
    victim = next(r for r in lines if r.get("kind") == "result" and r["verdict"] == "crash")
    bundle = victim.pop("bundle")
    (b / "bundles" / Path(bundle).name).unlink()
    victim.pop("declared", None)
    victim.update(verdict="unsupported", reason="not implemented", evidence={"refusal": "not implemented"})
    _write_lines(b, lines)
    _forge(b)
    res = verify_bundle(b)
    assert any(victim["case_id"] in p and "same case ran" in p for p in res.problems), res.problems


def test_relabelled_without_evidence_fails(rich, tmp_path):
    b = copy_bundle(rich, tmp_path / "b")
    lines = _lines(b)
    victim = next(r for r in lines if r.get("kind") == "result" and r["verdict"] == "crash")
    victim.pop("evidence")
    _write_lines(b, lines)
    _forge(b)
    assert any(victim["case_id"] in p and "without evidence" in p for p in verify_bundle(b).problems)


def test_bundle_json_set_to_ok_with_edited_counts_fails(rich, tmp_path):
    b = copy_bundle(rich, tmp_path / "b")
    meta = json.loads((b / "bundle.json").read_text())
    n = sum(meta["verdicts"].values())
    meta.update(ok=True, verdicts={"pass": n}, n_bad=0)
    (b / "bundle.json").write_text(json.dumps(meta))
    _reseal(b)
    res = verify_bundle(b)
    assert any(p.startswith("bundle.json: ok is True") for p in res.problems), res.problems
    assert any(p.startswith("bundle.json: verdicts") for p in res.problems)


@pytest.mark.parametrize("name", ["report.md", "report.html", "summary.json", "declared.json", "waivers.json",
                                  "environment.json"])
def test_edited_derived_file_fails(basic, tmp_path, name):
    b = copy_bundle(basic, tmp_path / "b")
    p = b / name
    p.write_bytes(p.read_bytes().replace(b"emulator", b"emulatoR", 1) + b"\n")
    _reseal(b)
    res = verify_bundle(b)
    assert any(x.startswith(f"{name}: differs") for x in res.problems), res.problems


def test_failing_cases_removed_and_profile_relabelled_nightly_fails_deep(rich, tmp_path):
    b = copy_bundle(rich, tmp_path / "b")
    lines = _lines(b)
    failing = {r["case_id"] for r in lines if r.get("kind") == "result" and r["verdict"] in ("fail", "crash")}
    lines = [r for r in lines if r.get("kind") != "result" or r["case_id"] not in failing]
    for r in lines:
        if r.get("kind") == "run":
            r["profile"] = "nightly"
    _write_lines(b, lines)
    ids = [i for i in (b / "cases.txt").read_text().splitlines() if i not in failing]
    _set_cases(b, ids)
    # the outputs of the removed cases go too, or the outputs file would betray them
    from emulator.tensorfile import TensorFile, save_tensors

    for f in (b / "outputs").iterdir():
        tf = TensorFile(f)
        cases = json.loads(tf.metadata["cases"])
        keep = {n: c for n, c in cases.items() if c["case_id"] not in failing}
        tensors = {k: tf.get(k).data for k in tf.keys() if str(int(k.split(".")[0])) in keep}
        save_tensors(f, tensors, metadata=dict(tf.metadata, cases=json.dumps(keep)))
    meta = json.loads((b / "bundle.json").read_text())
    from conformance.certify.codec import load_outputs

    for info in meta["backends"].values():
        info["outputs_cases"] = len(load_outputs(b / info["outputs"])[1])
    (b / "bundle.json").write_text(json.dumps(meta))
    for bp in (b / "bundles").iterdir():
        bp.unlink()
    shutil.rmtree(b / "search")  # the property search failed too: the forger claims none was run
    _forge(b, profile="nightly", search=None)
    assert verify_bundle(b).ok  # self-consistent: offline cannot know which cases should be there ...
    deep = verify_bundle(b, deep=True)
    # ... but --deep re-derives the list: a nightly bundle must record its seed
    assert any("records no base_seed" in p for p in deep.problems), deep.problems
    _forge(b, profile="nightly", base_seed=12345)
    lines = _lines(b)
    for r in lines:
        if r.get("kind") == "run":
            r["base_seed"] = 12345
    _write_lines(b, lines)
    _forge(b, profile="nightly", base_seed=12345)
    deep = verify_bundle(b, deep=True)
    assert any("is not the case list this checkout derives" in p for p in deep.problems), deep.problems


def test_outputs_path_outside_the_bundle_fails(basic, tmp_path):
    b = copy_bundle(basic, tmp_path / "b")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    meta = json.loads((b / "bundle.json").read_text())
    (label, info), = meta["backends"].items()
    shutil.move(b / info["outputs"], outside / "out.safetensors")
    info["outputs"] = "../elsewhere/out.safetensors"
    _forge(b, backends=meta["backends"])
    res = verify_bundle(b)
    assert any("not a file of the bundle" in p for p in res.problems), res.problems
    # a manifest entry that leaves the bundle is refused too
    man = json.loads((b / "MANIFEST.json").read_text())
    man["files"]["../elsewhere/out.safetensors"] = {"sha256": "0" * 64, "bytes": 1}
    (b / "MANIFEST.json").write_text(json.dumps(man))
    assert any("a bundle's files stay inside it" in p for p in verify_bundle(b).problems)


def test_fifo_symlink_and_device_do_not_hang_the_verifier(basic, tmp_path):
    b = copy_bundle(basic, tmp_path / "b")
    os.mkfifo(b / "extra.fifo")
    os.symlink("/dev/zero", b / "zero.bin")
    os.symlink(str(b / "outputs"), b / "linked")
    man = json.loads((b / "MANIFEST.json").read_text())
    for rel in ("extra.fifo", "zero.bin"):
        man["files"][rel] = {"sha256": "0" * 64, "bytes": 0}
    (b / "MANIFEST.json").write_text(json.dumps(man))
    t0 = time.monotonic()
    res = verify_bundle(b)
    assert time.monotonic() - t0 < 30
    assert any(p.startswith("extra.fifo: a special file") for p in res.problems), res.problems
    assert any(p.startswith("zero.bin: a symlink") for p in res.problems)
    assert any(p.startswith("linked: a symlink") for p in res.problems)


def test_huge_files_are_read_with_a_limit(basic, tmp_path, monkeypatch):
    from conformance.certify import verify as V

    b = copy_bundle(basic, tmp_path / "b")
    monkeypatch.setattr(V, "MAX_FILE_BYTES", 4096)
    res = verify_bundle(b)
    assert any("outputs/" in p and "larger than the 4096-byte limit" in p for p in res.problems), res.problems


def test_edited_crash_evidence_fails(rich, tmp_path):
    b = copy_bundle(rich, tmp_path / "b")
    lines = _lines(b)
    victim = next(r for r in lines if r.get("kind") == "result" and r["verdict"] == "crash")
    assert victim["evidence"]["worker"] == "raised" and victim["evidence"]["exception"] in victim["reason"]
    victim["evidence"]["exception"] = "MemoryError: made up"
    _write_lines(b, lines)
    _forge(b)
    assert any(victim["case_id"] in p and "exception in its evidence" in p for p in verify_bundle(b).problems)


# -- a certification that judged nothing -----------------------------------------------------------------
def test_backend_refusing_every_case_is_not_certified(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", "faulty-refuse-all=conformance.selftest.doubles.faulty:RefuseAllBackend")
    out = tmp_path / "b"
    rc = main(["certify", "--backend", "faulty-refuse-all", "--scheme", "w8a8", "--profile", "smoke", "--tier",
               "exact", "--out", str(out), "--no-progress"])
    text = capsys.readouterr().out
    assert rc == 1 and "NOT CERTIFIED" in text and "PASS" not in text, text
    meta = json.loads((out / "bundle.json").read_text())
    assert meta["ok"] is False and meta["no_judged_case"] == ["faulty-refuse-all"]
    assert verify_bundle(out).ok  # a true record of a backend that refused everything
    _forge(out, ok=True)
    assert any(p.startswith("bundle.json: ok is True") for p in verify_bundle(out).problems)


# -- writing: one writer, renamed into place when sealed -------------------------------------------------
def test_certify_refuses_a_locked_folder_and_leaves_no_partial_bundle(tmp_path, capsys):
    from conformance.run.outlock import OutLock

    out = tmp_path / "b"
    held = OutLock.beside(out).acquire()
    try:
        # (a second certify in another process meets the same lock file; in-process the lock is re-entrant,
        # so take it from a child process here)
        import subprocess
        import sys

        env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
        r = subprocess.run([sys.executable, "-m", "conformance.cli.main", "certify", "--backend", "emulator", "--scheme",
                            "w8a8", "--profile", "smoke", "--tier", "exact", "--out", str(out), "--no-progress"],
                           capture_output=True, text=True, env=env, timeout=300)
    finally:
        held.release()
    assert r.returncode == 2 and "another qconform process" in r.stderr, (r.stdout, r.stderr)
    assert not out.exists() and not out.with_name("b.partial").exists()


def test_interrupted_certify_leaves_only_a_partial_folder(tmp_path, monkeypatch):
    from conformance.certify import write as W

    out = tmp_path / "b"

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(W, "seal", boom)
    with pytest.raises(KeyboardInterrupt):
        W.certify(["emulator"], out, profile="smoke", schemes=["w8a8"], tiers=["exact"], log=lambda *a: None)
    assert not out.exists() and (tmp_path / "b.partial" / "results.jsonl").is_file()
    monkeypatch.undo()
    res = W.certify(["emulator"], out, profile="smoke", schemes=["w8a8"], tiers=["exact"], log=lambda *a: None)
    assert res.ok and (out / "MANIFEST.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".b.qconform-lock", "b"]  # no partial, no staging
    assert verify_bundle(out).ok


# -- nightly: seeds recorded, the case list re-derivable ---------------------------------------------------
def test_nightly_bundle_records_its_seed_and_deep_rederives_the_list(tmp_path):
    from conformance.certify import certify

    # (no --shard: the nightly seed comes from the clock, and a shard of its 16 cases is empty 1 time in 19)
    res = certify(["emulator"], tmp_path / "n", profile="nightly", schemes=["w8a16"], tiers=["exact"],
                  log=lambda *a: None)
    meta = json.loads((res.path / "bundle.json").read_text())
    assert isinstance(meta["base_seed"], int)
    v = verify_bundle(res.path, deep=True)
    assert v.ok, v.problems[:3]


# -- the audit ---------------------------------------------------------------------------------------------
def test_rerun_reproduces_a_fresh_bundle(basic):
    n = len((basic / "cases.txt").read_text().splitlines())
    v = verify_bundle(basic, rerun=5, rerun_seed=7)
    assert v.ok, v.problems
    assert v.checked["rerun"] == 5 and v.rerun_seed == 7
    assert any("seed 7" in x for x in v.notes)
    again = verify_bundle(basic, rerun=5, rerun_seed=7)
    assert [x for x in again.notes if "chosen" in x] == [x for x in v.notes if "chosen" in x]  # seeded: repeatable
    assert n > 5


def test_rerun_catches_an_output_the_kernel_did_not_compute(basic, tmp_path):
    """A consistent forgery (output moved one grid step inside its interval, metrics and reports recomputed):
    offline verification cannot tell; re-executing the case can."""
    from emulator.tensorfile import TensorFile, save_tensors

    from conformance.certify import decode_case, offline_verdict

    b = copy_bundle(basic, tmp_path / "b")
    f = next((b / "outputs").iterdir())
    tf = TensorFile(f)
    tensors = {k: tf.get(k).data for k in tf.keys()}
    cases = json.loads(tf.metadata["cases"])
    lines = _lines(b)
    by_id = {r["case_id"]: r for r in lines if r.get("kind") == "result"}
    forged = None
    for n, c in cases.items():
        key = f"{int(n):06d}"
        fields = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith(key + ".")}
        d = decode_case(fields, c)
        room = np.flatnonzero(np.asarray(d["jhi"] > d["y"]).reshape(-1))  # one grid step up stays inside
        if not c.get("y_is_ref") or room.size == 0:
            continue
        c2 = dict(c)
        del c2["y_is_ref"]
        new = dict(fields, y_idx=np.array([room[0]], np.int32), y_off=np.array([1], np.int8))
        got = offline_verdict(decode_case(new, c2), c2, by_id[c["case_id"]]["declared"]).record()
        if got["verdict"] != "pass":
            continue
        cases[n] = c2
        tensors[key + ".y_idx"] = new["y_idx"]
        tensors[key + ".y_off"] = new["y_off"]
        rec = by_id[c["case_id"]]
        rec["metrics"].update({k: got[k] for k in ("max_ratio", "max_ulp", "n_outside", "exact_match", "worst",
                                                    "sqnr_db", "tie_flips")})
        rec["metrics"]["worst_element"] = got.get("worst_element")
        forged = c["case_id"]
        break
    assert forged, "no case to forge"
    save_tensors(f, tensors, metadata=dict(tf.metadata, cases=json.dumps(cases)))
    _write_lines(b, lines)
    _forge(b)
    assert verify_bundle(b).ok  # offline: complete and self-consistent
    n_cases = len((b / "cases.txt").read_text().splitlines())
    v = verify_bundle(b, rerun=n_cases, rerun_seed=1)
    assert any(forged in p and "output differs from the stored one" in p for p in v.problems), v.problems


def test_crash_evidence_is_the_worker_s_signal_and_log(tmp_path, monkeypatch):
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", "faulty-segfault=conformance.selftest.doubles.faulty:SegfaultBackend,"
                                                  "faulty-printf=conformance.selftest.doubles.faulty:PrintfBackend")
    from conformance.certify import certify

    res = certify(["faulty-segfault"], tmp_path / "c", profile="smoke", schemes=["w8a8"], tiers=["exact"],
                  shard="1/4", log=lambda *a: None)
    assert not res.ok and set(res.counts) == {"crash"}
    recs = [r for r in _lines(res.path) if r.get("kind") == "result"]
    for r in recs:
        ev = r["evidence"]
        assert ev["worker"] == "crash" and ev["signal"] == "SIGSEGV" and "SIGSEGV" in r["reason"]
        assert ev["log"].startswith("logs/") and (res.path / ev["log"]).is_file()
    assert verify_bundle(res.path).ok
    b = copy_bundle(res.path, tmp_path / "forged")
    log = b / recs[0]["evidence"]["log"]
    log.write_text("nothing to see here\n")
    _reseal(b)
    assert any("is not the end of" in p for p in verify_bundle(b).problems)
    lines = _lines(b)
    for r in lines:  # a crash without its signal in the reason
        if r.get("kind") == "result":
            r["reason"] = "exited"
    _write_lines(b, lines)
    _forge(b)
    assert any("which its reason does not name" in p for p in verify_bundle(b).problems)


def test_two_concurrent_certifies_into_one_folder_one_wins(tmp_path):
    """Both start at once: one writes the bundle (it verifies), the other stops with exit 2 and one line."""
    import subprocess
    import sys

    out = tmp_path / "b"
    env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = [sys.executable, "-m", "conformance.cli.main", "certify", "--backend", "emulator", "--scheme", "w8a8",
            "--profile", "smoke", "--tier", "exact", "--out", str(out), "--no-progress"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    got = sorted((p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for p in procs)
    (rc0, out0, _), (rc1, _, err1) = got
    assert rc0 == 0 and "certification: PASS" in out0
    assert rc1 == 2 and ("another qconform process" in err1 or "already holds a sealed bundle" in err1), err1
    assert verify_bundle(out).ok


def test_malformed_outputs_certify_into_a_bundle_that_verifies(tmp_path, monkeypatch):
    """A kernel of the wrong shape or with complex output fails its cases, and the bundle still records and
    verifies them (the wrong shape recomputed from its stored output, the complex one by its evidence)."""
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", "faulty-shape=conformance.selftest.doubles.faulty:WrongShapeBackend,"
                                                  "faulty-complex=conformance.selftest.doubles.faulty:ComplexBackend")
    from conformance.certify import certify

    res = certify(["faulty-shape", "faulty-complex"], tmp_path / "m", profile="smoke", schemes=["w8a8"],
                  tiers=["exact"], shard="1/4", log=lambda *a: None)
    recs = [r for r in _lines(res.path) if r.get("kind") == "result"]
    assert recs and {r["verdict"] for r in recs} == {"fail"} and not res.ok
    assert all("output shape" in r["reason"] for r in recs if r["backend"] == "faulty-shape")
    assert all(r["evidence"]["malformed"] for r in recs if r["backend"] == "faulty-complex")
    v = verify_bundle(res.path)
    assert v.ok, v.problems
    assert v.checked["recomputed"] == sum(1 for r in recs if r["backend"] == "faulty-shape")


def test_a_backend_dropped_from_the_bundle_fails(rich, tmp_path):
    b = copy_bundle(rich, tmp_path / "b")
    meta = json.loads((b / "bundle.json").read_text())
    gone = "faulty-raise"
    lines = [r for r in _lines(b) if r.get("backend") != gone]
    _write_lines(b, lines)
    for bp in (b / "bundles").glob("faulty-raise__*"):
        bp.unlink()
    info = meta["backends"].pop(gone)
    (b / info["outputs"]).unlink()
    (b / "bundle.json").write_text(json.dumps(meta))
    _forge(b)
    assert any("the run headers ask for backends" in p for p in verify_bundle(b).problems)


# issue 22 item 9: a result's replay-bundle path must name a file of bundles/, not only share its basename
def test_bundle_path_outside_bundles_folder_fails(rich, tmp_path):
    b = copy_bundle(rich, tmp_path / "b")
    lines = _lines(b)
    victim = next(r for r in lines if r.get("kind") == "result" and r.get("bundle"))
    name = Path(victim["bundle"]).name
    assert (b / "bundles" / name).is_file()  # the basename is a real file of the bundle
    victim["bundle"] = "../../../../etc/" + name
    _write_lines(b, lines)
    _forge(b)
    res = verify_bundle(b)
    assert not res.ok
    assert any(victim["case_id"] in p and "replay bundle" in p and "../../../../etc/" in p for p in res.problems), \
        res.problems
