"""Regression gate of the suite's power, round 3: kernels of examples/independent-kernels/round3/, written from the
public format docs only, run through `qconform run` on their smallest catching tier.

Round 3's two misses (README "Missed bugs": green in ci and certified PASS) are closed by the value classes added
for them (conformance/cases/coverage.py): ``g_idx-unequal-groups`` (act order whose groups are not all G wide: a
kernel that sorts by g_idx and takes group = rank // G reads the wrong scales) and ``act-byte0-fine-steps`` (W4A4
blocks at E8M0 scale byte 0 with finest-step elements, against 0xFE weight blocks: an activation scale exponent
clamped at -126 changes visible products). Both must stay caught, the tie bug too, and the correct kernels with
their honest declarations must stay green on the same slices. The kernels are NumPy (host-independent). Measured
results of all bugs of the round: examples/independent-kernels/round3/README.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from independent_kernels import run_plugin

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "examples" / "independent-kernels" / "round3"
SPEC = ",".join(f"{n}=qconform_r3.backend:{c}" for n, c in [
    ("r3-a16", "R3A16"), ("r3-a16-f32", "R3A16F32"), ("r3-mx16", "R3Mx16"), ("r3-w8a8", "R3W8A8"),
    ("r3-w4a8", "R3W4A8"), ("r3-w4a4", "R3W4A4"), ("r3-moe", "R3Moe"), ("r3-q", "R3Quant")])

pytestmark = pytest.mark.slow


def _run(tmp_path, backend: str, scheme: str, tier: str) -> tuple[int, dict, str]:
    return run_plugin(tmp_path, PLUGIN, SPEC, backend, scheme, tier)


# (bug, backend, scheme, tier, value class whose cases must fail or None, localization stage or None)
CAUGHT = [
    # g_idx sorted, group = rank // G: right only when every group is G wide; the vc-g_idx-unequal-groups cases
    ("gidx_sorted_uniform", "r3-a16", "w4a16", "edge", "g_idx-unequal-groups", "weights"),
    # activation scale exponent clamped at -126 instead of -127: the vc-act-byte0-fine-steps cases
    ("w4a4_exp_min_126", "r3-w4a4", "w4a4-mxfp4", "edge", "act-byte0-fine-steps", None),
    # declares RNE, rounds the E2M1 tie at 5 up: caught where the flip moves a scale too (NaN/Inf rows, amax 2^k - ulp)
    ("e2m1_threshold_5", "r3-w4a4", "w4a4-mxfp4", "edge", None, None),
]


@pytest.mark.parametrize("bug,backend,scheme,tier,cls,stage", CAUGHT, ids=[b[0] for b in CAUGHT])
def test_planted_bug_is_caught(tmp_path, bug, backend, scheme, tier, cls, stage):
    rc, s, log = _run(tmp_path, f"{backend}:bug={bug}", scheme, tier)
    assert rc == 1, f"{bug}: expected a red run (exit 1), got {rc}\n{log[-3000:]}"
    assert s.get("status") != "conformant" and s.get("n_bad", 0) > 0, log[-3000:]
    failures = s.get("failures", [])
    if cls is not None:  # the class added for this hole is what catches it
        ids = [f.get("case_id", "") for f in failures]
        assert any(f"/vc-{cls}/" in i for i in ids), f"{bug}: no vc-{cls} case among the failures {ids[:5]}"
    if stage is not None:
        locs = [f.get("localization") or {} for f in failures]
        assert any(lz.get("stage") == stage for lz in locs), \
            f"{bug}: no failure localized to {stage!r}: {[lz.get('summary') for lz in locs][:3]}"


CORRECT = [("r3-a16", "w4a16", "edge"), ("r3-w4a4", "w4a4-mxfp4", "edge")]


@pytest.mark.parametrize("backend,scheme,tier", CORRECT, ids=[f"{b}-{s}" for b, s, _ in CORRECT])
def test_correct_kernel_with_honest_declaration_passes(tmp_path, backend, scheme, tier):
    rc, s, log = _run(tmp_path, backend, scheme, tier)
    assert rc == 0, f"{backend} {scheme}: expected green, got exit {rc}\n{log[-3000:]}"
    assert s["status"] == "conformant" and s["n_bad"] == 0 and s["n_judged"] == s["n_results"] > 0
