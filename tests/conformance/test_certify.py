"""Certification bundles: written by `qconform certify`, re-checked offline by `qconform verify-bundle`.

A fresh bundle verifies (hashes, coverage of the case list, every verdict recomputed from the
stored outputs and intervals, and with --deep re-derived from the emulator); a bundle edited
by hand does not, even when the forger re-seals MANIFEST.json.
"""

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bundle_cache import copy_bundle
from conformance.certify import StoredCase, decode_case, encode_case, verify_bundle
from conformance.cli.main import main


def _results(folder: Path) -> list[dict]:
    latest = {}
    for line in (folder / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "result":
            latest[(r["backend"], r["case_id"])] = r
    return list(latest.values())


def _reseal(folder: Path) -> None:
    """What a forger does after editing: recompute every sha256 in MANIFEST.json (written independently here)."""
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != "MANIFEST.json":
            data = p.read_bytes()
            files[p.relative_to(folder).as_posix()] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    man = json.loads((folder / "MANIFEST.json").read_text())
    man["files"] = files
    (folder / "MANIFEST.json").write_text(json.dumps(man))


def _rederive_reports(folder: Path) -> None:
    """What an informed forger does after editing results or bundle.json: regenerate the reports with the
    suite's own code, so that only the checks that do not trust the reports can catch the edit."""
    from conformance.certify.derive import report_title, reports

    lines = [json.loads(l) for l in (folder / "results.jsonl").read_text().splitlines() if l.strip()]
    meta = json.loads((folder / "bundle.json").read_text())
    labels = list(dict.fromkeys(r["backend"] for r in lines if r.get("kind") == "result"))
    for name, data in reports(lines, meta, report_title(labels, meta["host_label"])).items():
        (folder / name).write_bytes(data)


def _edit_result(folder: Path, pick, edit) -> dict:
    """Edit the first result line ``pick`` selects; returns the edited record."""
    lines = (folder / "results.jsonl").read_text().splitlines()
    for i, line in enumerate(lines):
        r = json.loads(line)
        if r.get("kind") == "result" and pick(r):
            edit(r)
            lines[i] = json.dumps(r)
            (folder / "results.jsonl").write_text("\n".join(lines) + "\n")
            return r
    raise AssertionError("no result line matches")


# -- fresh bundles ---------------------------------------------------------------------------------
def test_fresh_bundle_has_every_part_and_verifies(basic):
    names = {p.relative_to(basic).as_posix() for p in basic.rglob("*") if p.is_file()}
    for want in ("MANIFEST.json", "bundle.json", "results.jsonl", "cases.txt", "summary.json", "report.md",
                 "report.html", "environment.json", "waivers.json", "declared.json", "golden_manifest.json"):
        assert want in names, want
    assert any(n.startswith("outputs/") and n.endswith(".safetensors") for n in names)
    # MANIFEST.json lists every other file with its sha256
    man = json.loads((basic / "MANIFEST.json").read_text())["files"]
    assert set(man) == names - {"MANIFEST.json"}
    for rel, e in man.items():
        assert e["sha256"] == hashlib.sha256((basic / rel).read_bytes()).hexdigest()
    # the ordered case list and its hash, as the run header recorded them
    meta = json.loads((basic / "bundle.json").read_text())
    ids = (basic / "cases.txt").read_text().splitlines()
    h = hashlib.sha256()
    for i in ids:
        h.update(i.encode() + b"\n")
    header = next(json.loads(l) for l in (basic / "results.jsonl").read_text().splitlines()
                  if json.loads(l).get("kind") == "run")
    assert meta["case_list_sha256"] == h.hexdigest() == header["case_list_sha256"]
    assert len(ids) == meta["case_count"] and all("/w8a8/" in i for i in ids)
    assert meta["golden_manifest_sha256"] == hashlib.sha256((basic / "golden_manifest.json").read_bytes()).hexdigest()
    assert meta["emulator_version"] and meta["host_label"] == "host-a"
    env = json.loads((basic / "environment.json").read_text())
    assert env["cpu_flags"] is not None and env["python"] and "libraries" in env
    declared = json.loads((basic / "declared.json").read_text())
    assert "w8a8" in declared["emulator"] and all("accumulate" in d["declared"] for d in declared["emulator"]["w8a8"])

    res = verify_bundle(basic)
    assert res.ok, res.problems
    assert res.checked["results"] == len(ids)  # one backend
    assert res.checked["recomputed"] == len(ids)  # every result had an output and its verdict was recomputed
    assert res.manifest_sha256 == hashlib.sha256((basic / "MANIFEST.json").read_bytes()).hexdigest()


def test_emulator_bundle_stays_small(basic):
    per_case = sum(p.stat().st_size for p in (basic / "outputs").iterdir()) / len(_results(basic))
    elements = sum(r["spec"]["case"]["M"] * r["spec"]["case"]["N"] for r in _results(basic)) / len(_results(basic))
    # output + interval in about 3 bytes an element (docs/certification.md#size)
    assert per_case < 4 * elements + 600, (per_case, elements)


def test_rich_bundle_verifies_with_every_kind_of_verdict(rich):
    res = _results(rich)
    kinds = Counter(r["verdict"] for r in res)
    assert {"pass", "fail", "pass-with-tie-flips", "waived", "crash"} <= set(kinds), kinds
    assert any(r.get("waiver_expired") for r in res)
    assert any("instead of the declared" in r["reason"] for r in res)  # explained by another tie rule
    v = verify_bundle(rich, deep=True)
    assert v.ok, v.problems[:5]
    crashed = sum(1 for r in res if (r.get("waived_verdict") or r["verdict"]) in ("crash", "unsupported"))
    assert v.checked["recomputed"] == len(res) - crashed
    assert v.checked["deep"] == len(res) - crashed
    w = json.loads((rich / "waivers.json").read_text())
    assert len(w["given"]) == 2 and len(w["applied"]) == kinds["waived"] and w["expired"]


def test_cli_verify_and_refusal_to_overwrite(basic, capsys):
    assert main(["verify-bundle", str(basic)]) == 0
    assert "bundle OK" in capsys.readouterr().out
    # a sealed bundle is never overwritten
    rc = main(["certify", "--backend", "emulator", "--scheme", "w8a8", "--profile", "smoke", "--out", str(basic)])
    assert rc == 2
    assert "already holds a sealed bundle" in capsys.readouterr().err


# -- tampering --------------------------------------------------------------------------------------
def test_edited_result_line_fails(basic, tmp_path, capsys):
    b = copy_bundle(basic, tmp_path / "b")
    _edit_result(b, lambda r: r["verdict"] == "pass", lambda r: r.update(verdict="fail"))
    res = verify_bundle(b)
    assert not res.ok and any(p.startswith("results.jsonl: sha256") for p in res.problems)
    assert main(["verify-bundle", str(b)]) == 1
    assert "FAILS" in capsys.readouterr().out
    # re-sealed by the forger: the recomputed verdict still disagrees
    _reseal(b)
    res = verify_bundle(b)
    assert not res.ok
    assert any("recorded verdict fail" in p and "give pass" in p for p in res.problems), res.problems


def test_edited_metric_fails_even_when_resealed(basic, tmp_path):
    b = copy_bundle(basic, tmp_path / "b")
    _edit_result(b, lambda r: r["verdict"] == "pass", lambda r: r["metrics"].update(max_ulp=r["metrics"]["max_ulp"] + 3))
    _reseal(b)
    res = verify_bundle(b)
    assert any("metric max_ulp" in p for p in res.problems), res.problems


@pytest.mark.parametrize("verdict,forged", [("pass-with-tie-flips", "pass"), ("fail", "pass"), ("waived", "pass"),
                                            ("crash", "pass")])
def test_forged_verdicts_of_every_kind_fail(rich, tmp_path, verdict, forged):
    b = copy_bundle(rich, tmp_path / "b")
    r = _edit_result(b, lambda r: r["verdict"] == verdict, lambda r: r.update(verdict=forged))
    _reseal(b)
    res = verify_bundle(b)
    assert not res.ok
    assert any(r["case_id"] in p for p in res.problems), res.problems


def test_removed_file_fails(basic, tmp_path):
    for victim in ("report.html", "cases.txt", "golden_manifest.json"):
        b = copy_bundle(basic, tmp_path / victim)
        (b / victim).unlink()
        res = verify_bundle(b)
        assert any(p.startswith(f"{victim}: missing") for p in res.problems), (victim, res.problems)
    b = copy_bundle(basic, tmp_path / "outputs")
    shutil.rmtree(b / "outputs")
    _reseal(b)  # even re-sealed: verdicts without outputs cannot be recomputed
    res = verify_bundle(b)
    assert any("no stored output" in p for p in res.problems)


def test_added_file_fails(basic, tmp_path):
    b = copy_bundle(basic, tmp_path / "b")
    (b / "notes.txt").write_text("trust me")
    assert any(p.startswith("notes.txt: not listed") for p in verify_bundle(b).problems)


def test_changed_golden_hash_fails(basic, tmp_path):
    b = copy_bundle(basic, tmp_path / "b")
    gm = json.loads((b / "golden_manifest.json").read_text())
    name = sorted(gm["files"])[0]
    gm["files"][name]["sha256"] = "0" * 64
    (b / "golden_manifest.json").write_text(json.dumps(gm, indent=1, sort_keys=True) + "\n")
    res = verify_bundle(b)
    assert any(p.startswith("golden_manifest.json: sha256") for p in res.problems), res.problems
    _reseal(b)
    res = verify_bundle(b)
    assert any("golden_manifest_sha256" in p for p in res.problems), res.problems
    # a forger who also rewrites bundle.json: --deep compares with this checkout's golden manifest
    meta = json.loads((b / "bundle.json").read_text())
    meta["golden_manifest_sha256"] = hashlib.sha256((b / "golden_manifest.json").read_bytes()).hexdigest()
    (b / "bundle.json").write_text(json.dumps(meta))
    _rederive_reports(b)  # (summary.json embeds bundle.json)
    _reseal(b)
    assert verify_bundle(b).ok  # consistent with itself...
    assert any("golden manifest differs" in n for n in verify_bundle(b).notes)
    deep = verify_bundle(b, deep=True)
    assert any("golden manifest differs" in p for p in deep.problems)  # ...but not with the suite


def _edit_outputs(folder: Path, edit) -> str:
    """Apply ``edit(tensors, cases)`` to the first outputs file; returns the edited case's id."""
    from emulator.tensorfile import TensorFile, save_tensors

    f = next((folder / "outputs").iterdir())
    tf = TensorFile(f)
    meta = dict(tf.metadata)
    tensors = {k: tf.get(k).data for k in tf.keys()}
    cases = json.loads(meta["cases"])
    cid = edit(tensors, cases)
    meta["cases"] = json.dumps(cases)
    save_tensors(f, tensors, metadata=meta)
    return cid


def test_edited_output_fails(basic, tmp_path):
    """Moving one stored output element by 64 grid steps turns a recorded pass into a recomputed fail."""
    b = copy_bundle(basic, tmp_path / "b")

    def move(tensors, cases):
        n, c = next((n, c) for n, c in cases.items() if c.get("y_is_ref"))
        del c["y_is_ref"]
        tensors[f"{int(n):06d}.y_idx"] = np.array([0], np.int32)
        tensors[f"{int(n):06d}.y_off"] = np.array([64], np.int8)
        return c["case_id"]

    cid = _edit_outputs(b, move)
    _reseal(b)
    res = verify_bundle(b)
    assert any(cid in p and "give fail" in p for p in res.problems), res.problems


def test_edited_interval_fails(basic, tmp_path):
    """An interval moved off the stored output (both ends above it) contradicts the recorded pass."""
    b = copy_bundle(basic, tmp_path / "b")

    def shift(tensors, cases):
        n, c = next((n, c) for n, c in cases.items() if f"{int(n):06d}.lo" not in tensors)
        key = f"{int(n):06d}"
        size = int(np.prod(c["shape"]))
        for name in [k for k in tensors if k.startswith(key + ".lh")]:
            del tensors[name]
        # (ref - lo, hi - ref) = (-1, 2) everywhere, as exceptions to an all-zero 1-bit field: lo = ref + 1
        tensors[key + ".lh2"] = np.zeros((size + 3) // 4, np.uint8)
        tensors[key + ".lh_xi"] = np.arange(size, dtype=np.int32)
        tensors[key + ".lh_xu"] = np.full(size, -1, np.int8)
        tensors[key + ".lh_xv"] = np.full(size, 2, np.int8)
        return c["case_id"]

    cid = _edit_outputs(b, shift)
    _reseal(b)
    res = verify_bundle(b)
    assert any(cid in p and "give fail" in p for p in res.problems), res.problems


# -- the compact encoding -----------------------------------------------------------------------------
def _grid(v, dtype):
    import ml_dtypes

    dt = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}[dtype]
    with np.errstate(over="ignore"):
        return np.asarray(v).astype(dt).astype(np.float64)


def _next_up(v, dtype, k):
    import ml_dtypes

    dt = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}[dtype]
    out = np.asarray(v).astype(dt)
    for _ in range(abs(k)):
        out = np.nextafter(out, np.array(np.inf if k > 0 else -np.inf, dtype=dt)) if dt is not ml_dtypes.bfloat16 \
            else _bf16_step(out, k > 0)
    return out.astype(np.float64)


def _bf16_step(a, up):
    import ml_dtypes

    with np.errstate(invalid="ignore"):
        f32 = a.astype(np.float32)
    bits = f32.view(np.uint32).astype(np.int64) >> 16
    neg = bits >= 0x8000
    mag = bits & 0x7FFF
    # moving up: magnitude +1 for positives, -1 for negatives (and -0 -> +smallest); mirrored for down
    grow = np.where(neg, not up, up)
    new = np.where(grow, mag + 1, mag - 1)
    sign = np.where(mag == 0, 0 if up else 0x8000, bits & 0x8000)
    new = np.where(mag == 0, 1, new)
    with np.errstate(invalid="ignore"):
        return ((sign | new).astype(np.uint32) << 16).view(np.float32).astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_encoding_round_trips_exactly(dtype):
    rng = np.random.default_rng(7)
    exact = rng.standard_normal((6, 40)) * 50
    exact[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    ref = _grid(exact, dtype)
    ref[1, 0] = -0.0
    lo = _next_up(ref, dtype, -1)
    hi = _next_up(ref, dtype, 2)
    for a in (lo, hi):
        a[0, :3] = exact[0, :3]
    y = ref.copy()
    y[2, 3] = hi[2, 3]
    y[3, 5] = np.nan
    cases = [(y, lo, hi)]
    # wide intervals (more than 15 steps), an off-grid output, and y of another shape
    cases.append((y, _next_up(ref, dtype, -40), _next_up(ref, dtype, 300)))
    off = y.astype(np.float32)
    off[0, 5] = np.nextafter(off[0, 5], np.float32(np.inf))  # off the bf16/fp16 grid
    cases.append((off.astype(np.float64), lo, hi))
    for yy, l, h in cases:
        jl = np.where(np.arange(l.size).reshape(l.shape) % 3 == 0, ref, l)  # narrower at every third element
        t, meta = encode_case(StoredCase(yy.astype(np.float32), ref, l, h, exact, dtype, bound_positive=True,
                                         judged=(jl, h), tie=(l, h, np.arange(6)), alt=("act_rounding=rhaz", l, h)))
        d = decode_case(t, json.loads(json.dumps(meta)))
        for k, want in (("y_ref", ref), ("lo", l), ("hi", h), ("jlo", jl), ("jhi", h), ("tlo", l), ("thi", h),
                        ("alo", l), ("ahi", h)):
            np.testing.assert_array_equal(d[k], want, err_msg=k)
            assert np.array_equal(np.signbit(d[k][~np.isnan(want)]), np.signbit(want[~np.isnan(want)])), k
        np.testing.assert_array_equal(d["y"], yy.astype(np.float32).astype(np.float64))
        # the y_exact stand-in: non-finite exactly where y_exact is, with its value there
        assert np.array_equal(np.isfinite(d["y_exact_proxy"]), np.isfinite(exact))
        np.testing.assert_array_equal(d["y_exact_proxy"][~np.isfinite(exact)], exact[~np.isfinite(exact)])


def test_encoding_keeps_overflowed_references_finite():
    """y_exact beyond the output range: y_ref is Inf but the judge treats the element as finite."""
    exact = np.array([[1.0, 70000.0, -70000.0, np.inf]])
    ref = _grid(exact, "float16")
    assert np.isinf(ref[0, 1])
    t, meta = encode_case(StoredCase(ref.astype(np.float32), ref, ref, ref, exact, "float16", bound_positive=False))
    assert "exf" in t
    d = decode_case(t, meta)
    assert np.array_equal(np.isfinite(d["y_exact_proxy"]), np.isfinite(exact))


def test_typical_case_costs_two_and_a_half_bytes_an_element():
    """A bf16 output equal to its reference, the outward and judged intervals one step either side,
    a few elements near zero with wide intervals: 2 bytes for ref + 1/4 + 1/4 for the intervals."""
    rng = np.random.default_rng(1)
    exact = rng.standard_normal((33, 256))
    ref = _grid(exact, "bfloat16")
    lo, hi = _next_up(ref, "bfloat16", -1), _next_up(ref, "bfloat16", 1)
    lo[0, :5] = _next_up(ref[0, :5], "bfloat16", -300)  # outliers: exceptions, not a wider encoding
    t, meta = encode_case(StoredCase(ref.astype(np.float32), ref, lo, hi, exact, "bfloat16", bound_positive=True,
                                     judged=(np.where(rng.random(ref.shape) < 0.5, lo, ref), ref)))
    assert meta["y_is_ref"] and meta["judged"]
    assert sum(a.nbytes for a in t.values()) <= 2.5 * ref.size + 128, {k: a.nbytes for k, a in t.items()}
    d = decode_case(t, meta)
    np.testing.assert_array_equal(d["lo"], lo)
    np.testing.assert_array_equal(d["jhi"], ref)


def test_unavailable_backend_is_not_certified(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", "gone=tests.conformance.bundle_cache:GoneBackend")
    out = tmp_path / "b"
    rc = main(["certify", "--backend", "gone", "--scheme", "w8a8", "--profile", "smoke", "--tier", "exact",
               "--out", str(out), "--no-progress"])
    text = capsys.readouterr().out
    assert rc == 1 and "NOT CERTIFIED" in text and "not on this host" in text
    meta = json.loads((out / "bundle.json").read_text())
    assert meta["ok"] is False and "gone" in meta["unavailable"]
    assert {r["verdict"] for r in _results(out)} == {"unsupported"}
    assert verify_bundle(out).ok  # a true record of what could not run


@pytest.mark.parametrize("spread", [1, 3, 15, 255, 5000])
def test_pair_packing_round_trips_with_exceptions(spread):
    from conformance.certify import pack_pair, unpack_pair

    rng = np.random.default_rng(spread)
    for shape in [(1, 1), (3, 7), (33, 65)]:
        u = rng.integers(0, spread + 1, shape)
        v = rng.integers(0, spread + 1, shape)
        u.flat[0] = -1  # negatives and outliers go to the exception list
        v.flat[-1] = 70000
        t = {}
        if not pack_pair(t, "p", u, v):
            # refused only where more than a quarter of the elements would be exceptions
            assert spread > 255 or u.size < 8
            continue
        assert spread > 255 or u.size < 8 or any(k.startswith("p") and k[1:].isdigit() for k in t)
        got = unpack_pair(t, "p", shape)
        np.testing.assert_array_equal(got[0], u)
        np.testing.assert_array_equal(got[1], v)


# -- another suite version -----------------------------------------------------------------------------
def _set_meta(folder: Path, **kw) -> None:
    meta = json.loads((folder / "bundle.json").read_text())
    for k, v in kw.items():
        if v is None:
            meta.pop(k, None)
        else:
            meta[k] = v
    (folder / "bundle.json").write_text(json.dumps(meta))


def test_fresh_bundle_records_the_suite_that_wrote_it(basic):
    from conformance.certify import suite_code_sha256

    meta = json.loads((basic / "bundle.json").read_text())
    assert meta["suite_code_sha256"] == suite_code_sha256() and len(meta["suite_code_sha256"]) == 64
    assert verify_bundle(basic).version_mismatch is None


def test_bundle_of_another_suite_version_gets_one_line(basic, tmp_path, capsys):
    """An older suite judged differently: its recorded metrics no longer match what this suite recomputes.
    verify-bundle says which suite wrote the bundle, once, instead of one problem per case."""
    b = copy_bundle(basic, tmp_path / "b")
    n_results = len(_results(b))
    for r in _results(b):  # every case's metric as another judging code recorded it
        _edit_result(b, lambda x, cid=r["case_id"]: x["case_id"] == cid,
                     lambda x: x["metrics"].update(max_ratio=(x["metrics"].get("max_ratio") or 0) + 0.5))
    _set_meta(b, suite_code_sha256="ab" * 32, git_commit="0123456789abcdef0123456789abcdef01234567")
    _reseal(b)
    res = verify_bundle(b)
    assert not res.ok and len(res.problems) == 1, res.problems[:3]
    line = res.problems[0]
    assert res.version_mismatch == line
    assert "code abababababab" in line and "commit 0123456789ab" in line  # the writer ...
    from conformance.certify import suite_code_sha256

    assert f"code {suite_code_sha256()[:12]}" in line  # ... and this suite
    assert res.checked["results"] == n_results and res.checked["recomputed"] == 0
    # --any-version recomputes anyway: the stale metrics show up, the version line becomes a note
    anyv = verify_bundle(b, any_version=True)
    assert any("metric max_ratio" in p for p in anyv.problems) and line in anyv.notes
    assert len(anyv.problems) >= n_results
    assert main(["verify-bundle", str(b)]) == 1
    out = capsys.readouterr().out
    assert "bundle NOT VERIFIED: written by another suite version" in out
    assert sum(1 for l in out.splitlines() if l.startswith("verify-bundle:")) == 1


def test_bundle_without_code_hash_is_an_older_suite(basic, tmp_path):
    b = copy_bundle(basic, tmp_path / "b")
    _set_meta(b, suite_code_sha256=None, git_commit="HEAD")
    _rederive_reports(b)  # as the older suite would have written them
    _reseal(b)
    res = verify_bundle(b)
    assert len(res.problems) == 1 and "no code hash recorded" in res.problems[0]
    assert verify_bundle(b, any_version=True).ok  # its data are this suite's own: they recompute


def test_version_mismatch_still_checks_hashes(basic, tmp_path):
    b = copy_bundle(basic, tmp_path / "b")
    _set_meta(b, emulator_version="0.0.9")
    _reseal(b)
    (b / "cases.txt").write_text((b / "cases.txt").read_text() + "extra/case\n")  # tampered after sealing
    res = verify_bundle(b)
    assert any("emulator 0.0.9" in p for p in res.problems)
    assert any(p.startswith("cases.txt: sha256") for p in res.problems)


def test_git_commit_is_a_hash_or_absent(monkeypatch):
    import subprocess

    from conformance.cli import commands
    from conformance.run import provenance

    def fake(stdout, rc):
        return lambda argv, **kw: subprocess.CompletedProcess(argv, rc, stdout=stdout, stderr="")

    # a .git whose HEAD does not resolve: `git rev-parse HEAD` prints "HEAD" and fails
    monkeypatch.setattr(subprocess, "run", fake("HEAD\n", 128))
    assert provenance.git_commit() is None
    assert "git_commit" not in commands.environment()
    monkeypatch.setattr(subprocess, "run", fake("HEAD\n", 0))
    assert provenance.git_commit() is None
    monkeypatch.setattr(subprocess, "run", fake("0123456789abcdef0123456789abcdef01234567\n", 0))
    assert provenance.git_commit() in ("0123456789abcdef0123456789abcdef01234567",
                                      "0123456789abcdef0123456789abcdef01234567-dirty")


def test_the_code_hash_covers_every_module_that_decides_a_verdict():
    """A bundle's suite_code_sha256 must move when any code that draws, judges or runs its cases moves: it once
    hashed a hand-kept list of flat modules, which left out the coverage classes (conformance/cases/coverage*.py)
    and half of judge/ after the move to rooms, so a bundle written with other cases verified as this suite's."""
    from pathlib import Path

    from conformance.certify.identity import suite_sources

    root = Path(__file__).resolve().parents[2]
    hashed = {p.relative_to(root).as_posix() for p in suite_sources()}
    for room in ("conformance/cases", "conformance/judge", "conformance/run", "conformance/certify", "emulator"):
        files = {p.relative_to(root).as_posix() for p in (root / room).rglob("*.py")}
        assert files and files <= hashed, sorted(files - hashed)
    assert "backends/base.py" in hashed
    assert not any(h.startswith(("conformance/report/", "conformance/cli/")) for h in hashed)
