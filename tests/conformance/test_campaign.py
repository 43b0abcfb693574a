"""The malformed-checkpoint campaign (conformance/campaign/execute.py, conformance/campaign/mutations.py).

- the isolation harness really detects a hang and a memory blow-up (a sleeping and an allocating
  child), so "0 hangs" in a report is a measurement, not a default;
- the classifier sorts crafted runs into the documented classes (a message naming nothing, two
  lines or an internal error is "other", never "named");
- the generator is seeded: same seed, same inputs; the first n inputs do not depend on the total;
  every mutation kind applies to some seed and there are >= 40 kinds over every part of a checkpoint;
- the bounded CI subset: one input of every kind through inspect, dequant and linear meets every
  target (no other error, no hang, no memory over bound, no false green), through the CLI.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from conformance.campaign import execute as campaign
from conformance.campaign.execute import Run, classify, run_isolated
from conformance.cli.main import main
from conformance.campaign.mutations import MUTATIONS, generate, make_seeds


def _sleep(seconds):
    time.sleep(seconds)
    return 0, "", ""


def _allocate(mib):
    a = np.ones(mib * 2 ** 20 // 8)
    a += 1
    return 0, "", ""


def test_isolated_run_reports_a_hang():
    r = run_isolated(_sleep, (30,), timeout=1.0, memory_mib=512)
    assert r.timed_out and r.seconds < 10
    assert classify("inspect", r, ["x"], memory_mib=512) == "hang"


def test_isolated_run_measures_peak_memory():
    small = run_isolated(_allocate, (8,), timeout=60, memory_mib=256)  # address-space cap: 4 x 256 MiB
    big = run_isolated(_allocate, (400,), timeout=60, memory_mib=256)
    assert small.rc == 0 and big.rc == 0
    # (margins: the parent's file pages can be reclaimed under memory pressure between the
    # parent's RSS reading and the fork)
    assert big.peak_mib > 200 and small.peak_mib < 64
    assert classify("dequant", big, ["x"], memory_mib=64) == "memory"
    assert classify("dequant", small, ["x"], memory_mib=64) == "exit0"


def test_isolated_run_caps_the_address_space():
    r = run_isolated(_allocate, (8 * 1024,), timeout=60, memory_mib=128)  # 8 GiB: far over the cap
    assert classify("linear", r, ["x"], memory_mib=128) == "memory"


@pytest.mark.parametrize("rc,err,out,want", [
    (2, "qconform dequant: error: /ck/config.json: malformed JSON\n", "", "named"),
    (2, "qconform dequant: error: model.layers.3.mlp.up_proj.scales: missing tensor\n", "", "named"),
    (2, "qconform dequant: error: invalid literal for int() with base 10: '²'\n", "", "other"),
    (2, "qconform dequant: error: /ck: bad\nsecond line\n", "", "other"),
    (3, "qconform dequant: internal error (TypeError: /ck x); rerun with --debug and report it\n", "", "other"),
    (2, "qconform inspect: error: /ck: wrong command prefix\n", "", "other"),
    (None, "uncaught KeyError: 'x'", "", "other"),
    (0, "", "ok\n", "exit0"),
])
def test_classifier(rc, err, out, want):
    run = Run(rc=rc, out=out, err=err, seconds=0.1, peak_mib=1.0)
    assert classify("dequant", run, ["/ck", "model.layers.0.mlp.down_proj"], memory_mib=100) == want


def test_false_green_rules():
    ok = {"outcome": "named"}
    zero = {"outcome": "exit0"}
    base = {"must_reject": False, "mutation": "m"}
    assert campaign.false_green({**base, "inspect": zero, "dequant": ok, "linear": ok})  # dequant rejects
    assert campaign.false_green({**base, "inspect": ok, "dequant": ok, "linear": zero})
    assert campaign.false_green({**base, "must_reject": True, "inspect": ok, "dequant": zero, "linear": ok})
    assert campaign.false_green({**base, "inspect": zero, "dequant": zero, "linear": zero}) is None
    assert campaign.false_green({**base, "inspect": ok, "dequant": ok, "linear": ok}) is None


def test_mutation_kinds_cover_every_part():
    assert len(MUTATIONS) >= 40
    assert len({m.name for m in MUTATIONS}) == len(MUTATIONS)
    assert {m.part for m in MUTATIONS} == {"config", "header", "tensor", "value", "file", "index"}


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    work = tmp_path_factory.mktemp("campaign-seeds")
    return work, make_seeds(work)


def test_seeds_are_every_toolkit_checkpoint_and_every_synthetic_scheme(seeds):
    from emulator.synthetic import SCHEMES

    _, ss = seeds
    names = {s.name for s in ss}
    assert sum(n.startswith("toolkit-") for n in names) >= 14
    assert {f"synthetic-{s}" for s in SCHEMES} <= names


def test_generation_is_seeded_and_prefix_stable(seeds, tmp_path):
    work, ss = seeds
    key = lambda inputs: [(i.index, i.seed, i.mutation, i.detail) for i in inputs]  # noqa: E731
    a = generate(7, 2 * len(MUTATIONS), tmp_path / "a", ss)
    b = generate(7, len(MUTATIONS), tmp_path / "b", ss)
    c = generate(8, len(MUTATIONS), tmp_path / "c", ss)
    assert key(a)[: len(b)] == key(b)
    assert key(c) != key(b)
    assert len(a) == 2 * len(MUTATIONS)  # every kind applied to some seed
    assert {i.mutation for i in a} == {m.name for m in MUTATIONS}


def test_bounded_campaign_meets_every_target(capsys, tmp_path):
    """CI subset: one input of every mutation kind (seed 0); the full run is `qconform campaign`."""
    rc = main(["campaign", "--seed", "0", "--count", str(len(MUTATIONS)), "--work", str(tmp_path / "w"),
               "--timeout", "120"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "targets met: yes" in out
    rows = {line[:28].strip(): line[28:].split() for line in out.splitlines()[2:7]}
    assert rows["other error"] == ["0"] * 4 and rows["hang"] == ["0"] * 4 and rows["memory over bound"] == ["0"] * 4
    named = [int(v) for v in rows["exit 2 naming the problem"]]
    assert sum(named) > 2 * len(MUTATIONS)  # most inputs are rejected by name


def test_campaign_count_must_be_positive(capsys):
    assert main(["campaign", "--count", "0"]) == 2
    assert "--count" in capsys.readouterr().err
