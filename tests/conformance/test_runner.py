"""The runner survives crashing, hanging and lying backends, and judges what it can."""

import json
import os

import pytest

from conformance.run.runner import Runner, read_results
from conformance.cases.suite import case_list

FAULTY = ",".join(f"{n}=conformance.selftest.doubles.faulty:{c}" for n, c in [
    ("faulty-segfault", "SegfaultBackend"), ("faulty-abort", "AbortBackend"), ("faulty-hang", "HangBackend"),
    ("faulty-nan", "NanBackend"), ("faulty-zero", "ZeroBackend"), ("faulty-raise", "RaiseBackend")])


@pytest.fixture
def faulty_env(monkeypatch):
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", FAULTY)


def _specs(n=6):
    specs = [s for s in case_list(profile="smoke", tiers=("random",)) if s.case.M == 5]
    # two schemes, so 'only=' can make a backend fail on one and pass on the other
    a = [s for s in specs if s.case.scheme == "w4a16"][: n // 2]
    b = [s for s in specs if s.case.scheme == "w8a8"][: n // 2]
    return a + b


def test_crashing_hanging_and_nan_backends_get_verdicts_and_the_run_goes_on(tmp_path, faulty_env):
    specs = _specs()
    r = Runner(tmp_path, timeout=8, jobs=1, progress=False)
    backends = ["faulty-segfault:only=w4a16", "faulty-abort:only=w4a16", "faulty-hang:only=w4a16",
                "faulty-nan:only=w4a16", "faulty-raise:only=w4a16", "emulator"]
    res = r.run(backends, specs)
    by = {}
    for x in res:
        by.setdefault(x["backend"], []).append(x)
    assert set(by) == {"faulty-segfault:only=w4a16", "faulty-abort:only=w4a16", "faulty-hang:only=w4a16",
                       "faulty-nan:only=w4a16", "faulty-raise:only=w4a16", "emulator"}

    def verdicts(b, scheme):
        return {x["verdict"] for x in by[b] if x["scheme"] == scheme}

    assert verdicts("faulty-segfault:only=w4a16", "w4a16") == {"crash"}
    assert all("SIGSEGV" in x["reason"] for x in by["faulty-segfault:only=w4a16"] if x["scheme"] == "w4a16")
    assert verdicts("faulty-abort:only=w4a16", "w4a16") == {"crash"}
    assert all("SIGABRT" in x["reason"] for x in by["faulty-abort:only=w4a16"] if x["scheme"] == "w4a16")
    assert verdicts("faulty-hang:only=w4a16", "w4a16") == {"timeout"}
    assert verdicts("faulty-nan:only=w4a16", "w4a16") == {"fail"}
    assert verdicts("faulty-raise:only=w4a16", "w4a16") == {"crash"}
    # after each crash/hang a fresh worker serves the remaining cases: the other scheme still passes
    for b in by:
        assert verdicts(b, "w8a8") == {"pass"}, b
    # everything is in the JSONL, one line per (backend, case)
    lines = [x for x in read_results(tmp_path / "results.jsonl") if x.get("kind") == "result"]
    assert len(lines) == len(backends) * len(specs)
    # failures and crashes leave replay bundles
    for x in res:
        if x["verdict"] in ("fail", "crash", "timeout"):
            assert os.path.exists(x["bundle"]), x


def test_zero_output_backend_fails(tmp_path, faulty_env):
    r = Runner(tmp_path, timeout=30, progress=False)
    res = r.run(["faulty-zero"], _specs(2))
    assert {x["verdict"] for x in res} == {"fail"}


def test_resume_skips_done_cases(tmp_path):
    specs = _specs(4)
    r = Runner(tmp_path, timeout=60, progress=False)
    first = r.run(["emulator"], specs[:2])
    assert len(first) == 2
    r2 = Runner(tmp_path, timeout=60, progress=False)
    second = r2.run(["emulator"], specs)
    assert {x["case_id"] for x in second} == {s.case_id for s in specs[2:]}
    lines = [x for x in read_results(tmp_path / "results.jsonl") if x.get("kind") == "result"]
    assert len(lines) == 4


def test_truncated_last_line_is_tolerated(tmp_path):
    p = tmp_path / "results.jsonl"
    p.write_text(json.dumps({"kind": "result", "backend": "emulator", "case_id": "x", "verdict": "pass"}) + "\n{\"kind\": \"res")
    assert len(read_results(p)) == 1


def test_non_canonical_variant_fails_canonical_edge_tier_and_passes_when_declared(tmp_path):
    specs = [s for s in case_list(profile="smoke", tiers=("edge",)) if s.generator == "int8-ties"][:2]
    assert specs
    r = Runner(tmp_path / "a", timeout=60, progress=False)
    liar = r.run(["emulator:act_rounding=rhaz,declare=canonical"], specs)
    assert {x["verdict"] for x in liar} == {"fail"}
    assert all("act_rounding=rhaz" in x["reason"] for x in liar)
    honest = Runner(tmp_path / "b", timeout=60, progress=False).run(["emulator:act_rounding=rhaz"], specs)
    assert {x["verdict"] for x in honest} == {"pass"}
    # the bundle replays with the emulator alone and reproduces the failure
    from conformance.cli.commands import cmd_replay

    class A:
        bundle = liar[0]["bundle"]
        backend = None
        timeout = 60

    assert cmd_replay(A) == 1


def test_waivers(tmp_path, faulty_env):
    specs = _specs(2)
    w = tmp_path / "waivers.toml"
    w.write_text(
        '[[waiver]]\nbackend = "faulty-zero*"\nscheme = "w4a16"\ncase = "*"\nreason = "known"\n'
        'issue = "https://example.invalid/1"\nexpires = "2999-01-01"\n'
        '[[waiver]]\nbackend = "emulator"\nscheme = "*"\ncase = "*"\nreason = "stale"\n'
        'issue = "https://example.invalid/2"\nexpires = "2999-01-01"\n')
    from conformance.run.runner import load_waivers

    r = Runner(tmp_path / "o", timeout=60, progress=False, waivers=load_waivers(w))
    res = r.run(["faulty-zero:only=w4a16", "emulator"], specs)
    zero = [x for x in res if x["backend"].startswith("faulty-zero") and x["scheme"] == "w4a16"]
    assert zero and {x["verdict"] for x in zero} == {"waived"}
    emu = [x for x in res if x["backend"] == "emulator"]
    assert all(x.get("unexpected_pass_of_waived_case") for x in emu)
    expired = tmp_path / "expired.toml"
    expired.write_text('[[waiver]]\nbackend = "faulty-zero*"\nscheme = "*"\ncase = "*"\nreason = "old"\n'
                       'issue = "x"\nexpires = "2000-01-01"\n')
    r2 = Runner(tmp_path / "p", timeout=60, progress=False, waivers=load_waivers(expired))
    res2 = r2.run(["faulty-zero:only=w4a16"], specs)
    assert all(x["verdict"] == "fail" and "expired" in x["reason"] for x in res2 if x["scheme"] == "w4a16")
    assert all(x["verdict"] == "fail" and x.get("waiver_expired") for x in res2 if x["scheme"] == "w8a8")


def test_shards_partition_the_case_list():
    from conformance.cases.suite import shard

    specs = case_list(profile="ci")
    parts = [shard(specs, i, 3) for i in (1, 2, 3)]
    ids = [s.case_id for p in parts for s in p]
    assert len(ids) == len(specs) == len(set(ids))
    assert sorted(ids) == sorted(s.case_id for s in specs)
    assert min(len(p) for p in parts) > len(specs) / 6


def test_case_list_is_deterministic():
    a = [s.case_id for s in case_list(profile="ci")]
    b = [s.case_id for s in case_list(profile="ci")]
    assert a == b and len(a) == len(set(a))
