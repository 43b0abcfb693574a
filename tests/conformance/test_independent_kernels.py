"""Regression gate of the suite's power: independent kernels (examples/independent-kernels/), written from the
public format docs only, run through `qconform run`.

Each planted bug must turn its smallest catching slice red (exit 1, the failure localized in the named stage),
and each correct kernel with its honest declaration must stay green (exit 0, every case judged pass).
The kernels are NumPy (host-independent): the same verdicts on AVX2, AVX-512 and AMX hosts.
Measured results of the full set: examples/independent-kernels/README.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from independent_kernels import run_plugin

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "examples" / "independent-kernels"
SPEC = ("indep-a16=qconform_indep.backend:IndepA16,indep-a16-bf16w=qconform_indep.backend:IndepA16Bf16Weights,"
        "indep-int8act=qconform_indep.backend:IndepInt8Act,indep-mx=qconform_indep.backend:IndepMx")

pytestmark = pytest.mark.slow


def _run(tmp_path, backend: str, scheme: str, tier: str) -> tuple[int, dict, str]:
    return run_plugin(tmp_path, PLUGIN, SPEC, backend, scheme, tier)


# (bug, backend, scheme, tier, localization stage the report must name, words the pattern must contain)
BUGS = [
    # v2 zero points read as v1 (+1): every asymmetric v2 group off by one scale step
    ("gptq_v2_plus1", "indep-a16", "w4a16", "exact", "weights", "zero point"),
    # asymmetric activations from the zero-inclusive range: only one-signed rows differ
    ("asym_zero_inclusive", "indep-int8act", "w8a8", "edge", None, None),
    # E8M0 0xFF decoded as the finite 2**127: visible only where the output would otherwise stay finite
    ("mx_ff_as_2p127", "indep-a16", "w4a16-mxfp4", "edge", "weights", "0xFF"),
    # the K loop runs in blocks of 128 and never visits the last K % 128 columns
    ("k_tail128_dropped", "indep-a16", "w4a16", "edge", "weights", "zero"),
]


@pytest.mark.parametrize("bug,backend,scheme,tier,stage,words", BUGS, ids=[b[0] for b in BUGS])
def test_planted_bug_is_caught_and_localized(tmp_path, bug, backend, scheme, tier, stage, words):
    rc, s, log = _run(tmp_path, f"{backend}:bug={bug}", scheme, tier)
    assert rc == 1, f"{bug}: expected a red run (exit 1), got {rc}\n{log[-3000:]}"
    assert s.get("status") != "conformant" and s.get("n_bad", 0) > 0, log[-3000:]
    if stage is not None:
        locs = [f.get("localization") or {} for f in s.get("failures", [])]
        hits = [lz for lz in locs if lz.get("stage") == stage
                and words.lower() in json.dumps(lz).lower()]
        assert hits, f"{bug}: no failure localized to {stage!r} naming {words!r}: {[lz.get('summary') for lz in locs][:3]}"


CORRECT = [
    ("indep-a16", "w8a16", "edge"),  # exact fp32 weights, float64 GEMM
    ("indep-a16-bf16w", "w4a16", "exact"),  # fp32 dequant, one bf16 rounding: weight_formation=float32_then_round
    # exact integer group sums y = sx * sum_g sw * acc_g (docs' W4A8 formula; w4a8_product=group_int, canonical):
    # its edge tier holds the float32-scale compressed-tensors cases where fl32((q - z) * sw) would differ
    ("indep-int8act", "w4a8", "edge"),
]


@pytest.mark.parametrize("backend,scheme,tier", CORRECT, ids=[f"{b}-{s}" for b, s, _ in CORRECT])
def test_correct_kernel_with_honest_declaration_passes(tmp_path, backend, scheme, tier):
    rc, s, log = _run(tmp_path, backend, scheme, tier)
    assert rc == 0, f"{backend} {scheme}: expected green, got exit {rc}\n{log[-3000:]}"
    assert s["status"] == "conformant" and s["n_bad"] == 0 and s["n_judged"] == s["n_results"] > 0


def _failing_generators(s: dict) -> set:
    return {f["case_id"].split("/")[3] for f in s.get("failures", [])}


# the three W8A8 bugs that stayed green in ci and certification (README "Suite holes"), each with the coverage
# value class (conformance/cases/coverage.py W8A8_ASYM) that now catches it in ci
HOLES = [("azp_rowsum_int16", "vc-w-rowsum-beyond-int16"), ("asym_zp_uint8_domain", "vc-azp-int8-domain"),
         ("act_no_saturation", "vc-act-code-saturation")]


@pytest.mark.parametrize("bug,cls", HOLES, ids=[b for b, _ in HOLES])
def test_former_suite_holes_are_caught_by_their_class(tmp_path, bug, cls):
    rc, s, log = _run(tmp_path, f"indep-int8act:bug={bug}", "w8a8", "edge")
    assert rc == 1, f"{bug}: expected a red run (exit 1), got {rc}\n{log[-3000:]}"
    assert cls in _failing_generators(s), (bug, sorted(_failing_generators(s)))


def test_indep_int8act_fails_only_where_its_zero_point_skips_int32_saturation(tmp_path):
    """A finding, asserted (README, suite hole 2): the otherwise correct kernel keeps the asymmetric zero point
    in int64, so on the one-ulp fp32 rows (-min / scale = 255 * 2^24) it is 4278189568 instead of the canonical
    saturated 2^31 - 1 (docs/formats/activations.md, ``int32_saturation``) and the codes are -128 / 0, not 0.
    Every other w8a8 edge case passes."""
    rc, s, log = _run(tmp_path, "indep-int8act", "w8a8", "edge")
    assert rc == 1 and s["n_bad"] > 0, log[-3000:]
    assert _failing_generators(s) == {"vc-azp-int32-saturation"}, sorted(_failing_generators(s))
