"""Regression gate of the suite's power, round 2: kernels of examples/independent-kernels/round2/, written from the
public format docs only (MoE included), run through `qconform run` on their smallest catching tier.

Each planted bug must turn its slice red (exit 1; where the README reads the localization as right, the named
stage and pattern too); each correct kernel with its honest declaration must stay green. Every suite hole of
that round is closed: the two input holes (scale_abs, e8m0_ff_finite) by the value classes added for them
(scale-negative, nan-scale-zero-codes, nan-scale-one-signed: conformance/cases/coverage.py), the three MoE ones by
the per-element MoE bound; each must stay caught.
The kernels are NumPy (host-independent). Measured results of all 55 bugs: examples/independent-kernels/round2/README.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from independent_kernels import run_plugin

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "examples" / "independent-kernels" / "round2"
SPEC = ",".join(f"{n}=qconform_r2.backend:{c}" for n, c in [
    ("r2-a16", "R2A16"), ("r2-a16-bf16w", "R2A16Bf16Weights"), ("r2-mx16", "R2Mx16"), ("r2-w8a8", "R2W8A8"),
    ("r2-w4a8", "R2W4A8"), ("r2-w4a4", "R2W4A4"), ("r2-moe", "R2Moe")])

pytestmark = pytest.mark.slow


def _run(tmp_path, backend: str, scheme: str, tier: str) -> tuple[int, dict, str]:
    return run_plugin(tmp_path, PLUGIN, SPEC, backend, scheme, tier)


# (bug, backend, scheme, tier, localization stage the report must name or None, words the finding must contain)
CAUGHT = [
    # E8M0 bias 126: every MX block's scale one step high
    ("e8m0_bias_126", "r2-mx16", "w4a16-mxfp4", "exact", "weights", "E8M0"),
    # activation scale amax / 128: named on the exact probe rows
    ("w4a8_amax_128", "r2-w4a8", "w4a8", "exact", "activation quantization", "amax/128"),
    # azp row sums in int16: only the vc-w-rowsum-beyond-int16 rows wrap
    ("w8a8_rowsum_int16", "r2-w8a8", "w8a8", "edge", None, None),
    # the down projection of the next expert (MoE is not localized)
    ("moe_w2_next_expert", "r2-moe", "w4a16-moe", "edge", None, None),
    # |scale|: only the vc-scale-negative cases have a negative scale; named on the negated groups/channels
    ("scale_abs", "r2-a16", "w4a16", "edge", "weights", "sign flipped"),
    # E8M0 0xFF decoded as 2^128: the vc-nan-scale-zero-codes (0, not NaN) and -one-signed (+-Inf) cases
    ("e8m0_ff_finite", "r2-mx16", "w4a16-mxfp4", "edge", None, None),
]


@pytest.mark.parametrize("bug,backend,scheme,tier,stage,words", CAUGHT, ids=[b[0] for b in CAUGHT])
def test_planted_bug_is_caught(tmp_path, bug, backend, scheme, tier, stage, words):
    rc, s, log = _run(tmp_path, f"{backend}:bug={bug}", scheme, tier)
    assert rc == 1, f"{bug}: expected a red run (exit 1), got {rc}\n{log[-3000:]}"
    assert s.get("status") != "conformant" and s.get("n_bad", 0) > 0, log[-3000:]
    if stage is not None:
        locs = [f.get("localization") or {} for f in s.get("failures", [])]
        hits = [lz for lz in locs if lz.get("stage") == stage and words.lower() in json.dumps(lz).lower()]
        assert hits, f"{bug}: no failure localized to {stage!r} naming {words!r}: {[lz.get('summary') for lz in locs][:3]}"


CORRECT = [("r2-moe", "w4a16-moe", "edge"), ("r2-w8a8", "w8a8", "edge"), ("r2-w4a4", "w4a4-mxfp4", "edge"),
           ("r2-a16", "w4a16", "edge"), ("r2-mx16", "w4a16-mxfp4", "edge")]


@pytest.mark.parametrize("backend,scheme,tier", CORRECT, ids=[f"{b}-{s}" for b, s, _ in CORRECT])
def test_correct_kernel_with_honest_declaration_passes(tmp_path, backend, scheme, tier):
    rc, s, log = _run(tmp_path, backend, scheme, tier)
    assert rc == 0, f"{backend} {scheme}: expected green, got exit {rc}\n{log[-3000:]}"
    assert s["status"] == "conformant" and s["n_bad"] == 0 and s["n_judged"] == s["n_results"] > 0


#: holes of round 2 closed since (README "Missed bugs"). The three MoE bugs (measured with run_one.sh ci: 44, 1 and
#: 57 of 75 cases fail): router probabilities rounded to fp16, an eps in the renormalization and an unrounded
#: intermediate passed the MoE interval's blanket 2^-7 allowance (3e6 fp32 ULP for a kernel declaring float64); the
#: per-element MoE bound (docs/formats/moe.md) fails them. scale_abs and e8m0_ff_finite: CAUGHT above.
CLOSED = [("moe_softmax_fp16", "r2-moe", "w4a16-moe"), ("moe_renorm_eps", "r2-moe", "w4a16-moe"),
          ("moe_intermediate_no_round", "r2-moe", "w4a16-moe")]


@pytest.mark.parametrize("bug,backend,scheme", CLOSED, ids=[b for b, _, _ in CLOSED])
def test_closed_round2_hole_stays_caught_by_the_edge_tier(tmp_path, bug, backend, scheme):
    rc, s, log = _run(tmp_path, f"{backend}:bug={bug}", scheme, "edge")
    assert rc == 1 and s.get("n_bad", 0) > 0, f"{bug}: green again on the edge tier\n{log[-2000:]}"
