"""The property tier (conformance/cases/property.py): Hypothesis searches run through the isolated worker,
shrink a failure to a minimal example, keep their database in the output folder, and follow --seed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.cases.bundle import load_bundle_inputs
from conformance.selftest.doubles.mutants import EXTRA_BACKENDS_ENTRY
from conformance.cases.property import PROPERTY_PROFILES, families
from conformance.run.property_search import run_property
from conformance.selftest.property_kills import mutant_kills
from conformance.run.runner import Runner, Waiver

ROOT = Path(__file__).resolve().parents[2]
MUTANT_ENV = {"QCONFORM_EXTRA_BACKENDS": EXTRA_BACKENDS_ENTRY}


def _size(desc: dict) -> tuple:
    """(M*N*K, M, N, K) of a described example: what shrinking makes smaller."""
    parts = dict(p.split("=") for p in desc["case"].split() if "=" in p and p.split("=")[0] in "MNK")
    m, n, k = int(parts["M"]), int(parts["N"]), int(parts["K"])
    return m * n * k, m, n, k


def _cli(*args, env=None, cwd=None):
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "conformance.cli.main", *args], env=e, cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_emulator_passes_every_family(tmp_path):
    """The reference backend: every family judged (not merely unsupported) and none failed."""
    runner = Runner(tmp_path, progress=False)
    recs = run_property(runner, ["emulator"], profile="ci")
    assert [r["property"]["family"] for r in recs] == [f"{s}/{f}" for s, f in families()]
    assert {r["verdict"] for r in recs} == {"pass"}, [(r["case_id"], r["reason"]) for r in recs if r["verdict"] != "pass"]
    assert all(r["property"]["judged"] >= PROPERTY_PROFILES["ci"]["examples"] // 2 for r in recs)


def test_mutant_is_caught_and_shrunk_below_the_first_failure(tmp_path):
    """int8pack-k-tail garbles K tails (K % 16 != 0, bf16): the tier finds it without being told where,
    and the reported example is smaller than the first failing one and still has a K tail."""
    res = mutant_kills(["int8pack-k-tail"], tmp_path)["int8pack-k-tail"]
    assert res["killed"] and res["verdict"] == "fail"
    size_min, m, _n, k = _size(res["minimal"])
    assert size_min < _size(res["first_failure"])[0]
    assert m == 1 and k % 16 != 0 and "x=bfloat16" in res["minimal"]["case"]
    rec = next(json.loads(line) for line in (tmp_path / "int8pack-k-tail" / "results.jsonl").read_text().splitlines()
               if json.loads(line).get("verdict") == "fail")
    inp, meta = load_bundle_inputs(rec["bundle"])  # the replay bundle holds the minimal example itself
    assert (inp.case.M, inp.case.K) == (m, k) and meta["verdict"] == "fail"


def test_awq_order_mutant_killed_only_on_awq(tmp_path):
    res = mutant_kills(["awq-sequential"], tmp_path)["awq-sequential"]
    assert res["killed"] and res["family"] == "w4a16/awq"
    assert _size(res["minimal"])[0] <= _size(res["first_failure"])[0]


def test_control_mutant_survives(tmp_path):
    """The mutants' pipeline without a bug: the kills above come from the bugs, not the pipeline."""
    res = mutant_kills(["none"], tmp_path)["none"]
    assert not res["killed"] and res["families"] == len(families())


def test_database_replays_the_known_failure_first(tmp_path):
    first = mutant_kills(["int8pack-k-tail"], tmp_path)["int8pack-k-tail"]
    assert (tmp_path / "int8pack-k-tail" / "hypothesis").is_dir()
    again = mutant_kills(["int8pack-k-tail"], tmp_path)["int8pack-k-tail"]
    # the rerun's first failing example is the stored minimal one, found before any new draw
    assert again["first_failure"]["case"] == first["minimal"]["case"]
    assert again["minimal"] == first["minimal"]
    assert again["calls"] < first["calls"]


def test_seed_makes_a_run_reproducible(tmp_path):
    a = mutant_kills(["awq-sequential"], tmp_path / "a", seed=7)["awq-sequential"]
    b = mutant_kills(["awq-sequential"], tmp_path / "b", seed=7)["awq-sequential"]
    assert a["case_id"] == b["case_id"] and a["first_failure"] == b["first_failure"]


def test_waiver_turns_a_found_defect_into_waived_never_pass(tmp_path):
    waiver = Waiver("mutant:bug=int8pack-k-tail", "w8a16", "property/w8a16/*", "test", "T-1", "2099-01-01")
    runner = Runner(tmp_path, progress=False, waivers=[waiver], worker_env=MUTANT_ENV)
    recs = run_property(runner, ["mutant:bug=int8pack-k-tail"], schemes=["w8a16"])
    assert recs and {r["verdict"] for r in recs} == {"waived"}, [(r["verdict"], r["reason"]) for r in recs]
    assert all(r["waiver"]["issue"] == "T-1" and r["waived_verdict"] in ("fail", "crash") for r in recs)


def test_cli_property_tier(tmp_path):
    ok = _cli("run", "--tier", "property", "--backend", "emulator", "--scheme", "w4a8", "--out",
              str(tmp_path / "ok"), "--no-progress", "--seed", "3")
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    recs = [json.loads(x) for x in (tmp_path / "ok" / "results.jsonl").read_text().splitlines()]
    res = [r for r in recs if r.get("kind") == "result"]
    assert len(res) == 2 and all(r["tier"] == "property" and r["verdict"] == "pass" for r in res)
    assert all(r["property"]["seed"] == 3 for r in res)
    bad = _cli("run", "--tier", "property", "--backend", "mutant:bug=awq-sequential", "--scheme", "w4a16", "--out",
               str(tmp_path / "bad"), "--no-progress", env=MUTANT_ENV)
    assert bad.returncode == 1 and "property/w4a16/awq" in bad.stdout, bad.stdout[-2000:]
    assert list((tmp_path / "bad" / "bundles").glob("*awq*.safetensors"))


@pytest.mark.parametrize("args, needle", [
    (["--tier", "edge", "--seed", "1"], "--seed applies to --tier property"),
    (["--tier", "property", "--shard", "1/2"], "--shard does not apply"),
    (["--tier", "propertee"], "unknown tier"),
])
def test_cli_usage_errors(tmp_path, args, needle):
    r = _cli("run", "--backend", "emulator", "--out", str(tmp_path / "o"), "--no-progress", *args)
    assert r.returncode == 2 and needle in (r.stdout + r.stderr), r.stdout + r.stderr


def test_pytest_plugin_property_tier(tmp_path):
    e = dict(os.environ, PYTHONPATH=str(ROOT), **MUTANT_ENV)
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--qconform-tier=property"]
    ok = subprocess.run(base + ["--qconform-backend=emulator", "--qconform-scheme=w4a8",
                                f"--qconform-out={tmp_path / 'ok'}"], cwd=tmp_path, env=e, capture_output=True,
                        text=True, timeout=600)
    assert ok.returncode == 0 and "2 passed" in ok.stdout, ok.stdout[-2000:]
    bad = subprocess.run(base + ["--qconform-backend=mutant:bug=int8pack-k-tail", "--qconform-scheme=w8a16",
                                 f"--qconform-out={tmp_path / 'bad'}"], cwd=tmp_path, env=e, capture_output=True,
                         text=True, timeout=600)
    assert bad.returncode == 1 and "minimal example: w8a16/" in bad.stdout and "qconform replay" in bad.stdout


def test_emulator_fast_w8a8_quantizes_asymmetric_activations_as_azp():
    """The property tier's first find (docs/findings.md, new finding 1): a constant row under the
    canonical azp rule (max = min) gives codes 0, so the output is 0; the fast path used to quantize
    it symmetrically and return x * w * s = -0.3671875."""
    import numpy as np

    from backends.base import Case
    from backends.registry import create

    case = Case("w8a8", "ct-int-quantized", 1, 1, 1, group_size=-1, sym=False, act_dtype="bfloat16")
    b = create("emulator")
    tensors = {"weight": np.array([[89]], np.int8), "weight_scale": np.array([[2.0 ** -5]], np.float32)}
    y = b.run(b.prepare(case, tensors), np.array([[-0.1318359375]], np.float32))
    assert float(np.asarray(y)[0, 0]) == 0.0


def test_property_family_records_carry_the_level(tmp_path, capsys):
    """A family of rounding-level declarations is never called CONFORMANT (docs/conformance.md#levels)."""
    import json

    from conformance.cli.main import main

    out = tmp_path / "rhaz"
    rc = main(["run", "--tier", "property", "--backend", "emulator:act_rounding=rhaz", "--scheme", "w8a8",
               "--out", str(out), "--no-progress"])
    text = capsys.readouterr().out
    s = json.loads((out / "summary.json").read_text())
    assert rc == 0, text[-2000:]
    assert s["level"] == "rounding" and s["headline"] == "CONFORMANT WITH DECLARED VARIANTS", s["headline"]
    out2 = tmp_path / "v1"
    rc2 = main(["run", "--tier", "property", "--backend", "emulator:zero_read=v1_literal", "--scheme", "w4a16",
                "--out", str(out2), "--no-progress"])
    s2 = json.loads((out2 / "summary.json").read_text())
    assert rc2 == 1 and s2["headline"] == "NOT CONFORMANT" and s2["semantic_deviations"], capsys.readouterr().out[-2000:]
