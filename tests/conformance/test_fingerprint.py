"""`qconform fingerprint` recovers the variant a kernel computes, whatever it declares.

The emulator runs as named variants (``emulator:act_rounding=rhaz,...``) while *declaring* canonical
semantics (``declare=canonical``): the fingerprint must find each computed variant from the outputs
alone -- exactly that value among the probed ones -- and flag the contradiction with the
declaration. Several variants of independent axes share one backend (one worker each), which also
checks that an axis's probes are not disturbed by the other axes' variants.

Expected values below come from the variant names passed to the emulator, not from the fingerprint.
Values that no linear output can tell apart are expected as groups, with the reason:

- zero_row ``zero`` / ``nan``: an all-zero row yields 0 under both;
- mx_nan ``ignore/zero*``: +0 and -0 element codes add the same 0;
- act_scale_dtype ``float16`` / ``float32`` under ``recip_amax``: the quotient ignores the scale, and
  the dequantization scales differ by less than a bf16 output ulp;
- mx_scale_rule ``rceil`` / ``rceil_log2f``: they differ only on float32 amax just above 6 * 2^k, which
  bf16 activations cannot hold.
"""

import pytest

from conformance.fingerprint.decide import PROBE_AXES, SCHEME_AXES, fingerprint

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

SEQ = "seq-acc=conformance.selftest.doubles.faulty:SequentialAccumulatorBackend"

# (emulator variant spec, {(scheme, axis): expected consistent values})
COMBOS = [
    ("act_rounding=rhaz,mx_scale_rule=even,zero_read=v1_wrap,weight_dtype=bfloat16",
     {("w8a8", "act_rounding"): {"rhaz"}, ("w4a4-mxfp4", "mx_scale_rule"): {"even"},
      ("w4a4-mxfp4", "e2m1_rounding"): {"rne"}, ("w4a16", "gptq_v1_zero"): {"v1_wrap"},
      ("w4a16", "dequant"): {"bfloat16/sub_then_mul"}}),
    ("act_rounding=rtz,mx_scale_rule=rceil,e2m1_rounding=rhaz,zero_read=v1_literal,weight_dtype=float16",
     {("w8a8", "act_rounding"): {"rtz"}, ("w4a4-mxfp4", "mx_scale_rule"): {"rceil", "rceil_log2f"},
      ("w4a4-mxfp4", "e2m1_rounding"): {"rhaz"}, ("w4a16", "gptq_v1_zero"): {"v1_literal"},
      ("w4a16", "dequant"): {"float16/sub_then_mul"}}),
    ("act_rounding=rhtz,mx_scale_rule=ceil,e2m1_rounding=rtz,zero_read=v1_packed_add,dequant_order=mul_then_sub,"
     "weight_dtype=bfloat16",
     {("w8a8", "act_rounding"): {"rhtz"}, ("w4a4-mxfp4", "mx_scale_rule"): {"ceil"},
      ("w4a4-mxfp4", "e2m1_rounding"): {"rtz"}, ("w4a16", "gptq_v1_zero"): {"v1_packed_add"},
      ("w4a16", "dequant"): {"bfloat16/mul_then_sub"}}),
    ("reciprocal=recip_scale,e2m1_rounding=rhtz,zero_read=ignore_qzeros,weight_scale_dtype=bfloat16",
     {("w8a8", "act_rounding"): {"rne"}, ("w8a8", "act_scale_dtype"): {"float32"},
      ("w8a8", "reciprocal"): {"recip_scale"}, ("w4a4-mxfp4", "e2m1_rounding"): {"rhtz"},
      ("w4a16", "gptq_sym_qzeros"): {"ignored (z=8)"}, ("w4a16", "weight_scale_dtype"): {"bfloat16"},
      # bf16 scales times 4-bit codes are exact in float32 and float16: every order, and a float16 zero, coincide
      ("w4a16", "dequant"): {"float32/sub_then_mul", "float32/mul_then_sub", "float32/float_zero",
                             "float32/float_zero/zero=float16"}}),
    ("reciprocal=recip_amax,mx_nan_block=ignore,e2m1_nan=saturate,dequant_order=float_zero,weight_dtype=bfloat16",
     {("w8a8", "act_scale_dtype"): {"float32", "float16"}, ("w8a8", "reciprocal"): {"recip_amax"},
      ("w4a4-mxfp4", "mx_nan"): {"ignore/saturate"}, ("w4a16", "dequant"): {"bfloat16/float_zero"}}),
    ("act_scale_dtype=bfloat16,qmin=-127,mx_nan_block=ignore",
     {("w8a8", "act_scale_dtype"): {"bfloat16"}, ("w8a8", "reciprocal"): {"divide"},
      ("w8a8", "qmin"): {"[-127,127]"},
      ("w4a4-mxfp4", "mx_nan"): {"ignore/zero", "ignore/zero_signed", "ignore/zero_sign_flipped"}}),
    ("act_scale_dtype=float16,reciprocal=recip_scale", {("w8a8", "act_scale_dtype"): {"float16"}}),
    ("zero_row=eps,eps=1e-10", {("w8a8", "zero_row"): {"eps=1e-10"}}),
    ("zero_row=eps,eps=1e-7", {("w4a8", "zero_row"): {"eps=1e-07"}}),
    ("zero_row=eps,eps=1e-5", {("w8a8", "zero_row"): {"eps=1e-05"}}),
    ("zero_row=nan", {("w8a8", "zero_row"): {"zero", "nan"}}),
]

CANONICAL = {"act_rounding": "rne", "act_scale_dtype": "float32", "reciprocal": "divide", "zero_row": "zero",
             "qmin": "[-128,127]", "mx_scale_rule": "floor", "e2m1_rounding": "rne", "mx_nan": "scale_nan",
             "gptq_sym_qzeros": "read (canonical)", "gptq_v1_zero": "canonical", "weight_scale_dtype": "checkpoint",
             "dequant": "float32/sub_then_mul"}


def _axes(result):
    return {(s, a["axis"]): a for s, rec in result["schemes"].items() for a in rec["axes"]}


@pytest.mark.parametrize("spec,expected", COMBOS, ids=[c[0][:60] for c in COMBOS])
def test_fingerprint_recovers_the_computed_variant_against_a_canonical_declaration(spec, expected):
    schemes = sorted({s for s, _ in expected})
    axes = sorted({a for _, a in expected})
    res = fingerprint(f"emulator:{spec},declare=canonical", schemes=schemes, axes=axes)
    got = _axes(res)
    for key, want in expected.items():
        a = got[key]
        assert a["status"] == "ok", (key, a)
        assert set(a["consistent"]) == want, (key, a["consistent"], a["excluded"])
        # every excluded value names the probe that excluded it, and that probe exists
        probe_ids = {p["id"] for p in a["probes"]}
        for v, by in a["excluded"].items():
            assert by and set(by) <= probe_ids, (key, v, by)
        # the declaration is flagged exactly where the computed value excludes it
        flagged = bool(a.get("contradiction"))
        assert flagged == (_declared(spec, key[1]) not in want), (key, a.get("contradiction"))
    assert len(res["contradictions"]) == sum(1 for k, w in expected.items() if _declared(spec, k[1]) not in w)


def _declared(spec: str, axis: str) -> str:
    """What ``emulator:<spec>,declare=canonical`` claims: canonical variants, but its own weight dtype
    (declare=canonical clears the variants, not the Declared fields; backends/emulator.py)."""
    if axis == "dequant":
        params = dict(kv.split("=") for kv in spec.split(","))
        return f"{params.get('weight_dtype', 'float32')}/sub_then_mul"
    return CANONICAL[axis]


def test_canonical_emulator_is_canonical_everywhere_and_unobservable_axes_say_so():
    res = fingerprint("emulator", schemes=["w8a8", "w4a4-mxfp4"], axes=["act_rounding", "reciprocal", "qmin",
                                                                         "mx_scale_rule", "mx_zero_block"])
    got = _axes(res)
    assert set(got[("w8a8", "act_rounding")]["consistent"]) == {"rne"}
    assert set(got[("w8a8", "reciprocal")]["consistent"]) == {"divide"}
    assert set(got[("w4a4-mxfp4", "mx_scale_rule")]["consistent"]) == {"floor"}
    # the clamp acts only where the scale underflows: probed with float32 activations (subnormal amax), where
    # the canonical [-128, 127] excludes [-127, 127]
    assert got[("w8a8", "qmin")]["case"].endswith("x=float32")
    assert set(got[("w8a8", "qmin")]["consistent"]) == {"[-128,127]"}
    # an all-zero block adds 0 whatever its scale byte
    assert got[("w4a4-mxfp4", "mx_zero_block")]["status"] == "not-observable"
    assert res["contradictions"] == []


@pytest.mark.parametrize("acc,act,consistent", [
    ("float32", "bfloat16", {"float32", "float16", "bfloat16"}),
    ("bfloat16", "bfloat16", {"bfloat16"}),
    ("float16", "float16", {"float16", "bfloat16"}),
])
def test_accumulation_bracket(monkeypatch, acc, act, consistent):
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", SEQ)
    res = fingerprint(f"seq-acc:acc={acc}", schemes=["w4a16"], axes=["accumulate"], act_dtype=act)
    a = _axes(res)[("w4a16", "accumulate")]
    assert set(a["consistent"]) == consistent
    assert "float64" in a["excluded"]  # a sequential accumulator visibly loses the cancelled terms
    assert a["bracket"].endswith(f"within the {acc} bound")
    assert not a.get("contradiction")


@pytest.mark.parametrize("opaque", [False, True])
def test_an_opaque_declaration_claims_no_accumulation(monkeypatch, opaque):
    """A bf16 accumulator declared as fp32: a contradiction, unless the declaration is opaque (ARK's int8
    cores declare accumulate=float32 with arithmetic=opaque: docs/fingerprints.md)."""
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", SEQ)
    res = fingerprint(f"seq-acc:acc=bfloat16,claim=float32,opaque={str(opaque).lower()}", schemes=["w4a16"],
                      axes=["accumulate"])
    a = _axes(res)[("w4a16", "accumulate")]
    assert "float32" in a["excluded"] and set(a["consistent"]) == {"bfloat16"}
    assert bool(a.get("contradiction")) is (not opaque)
    assert bool(res["contradictions"]) is (not opaque)


def test_exact_emulator_path_shows_no_accumulation_error():
    res = fingerprint("emulator:path=exact", schemes=["w4a16"], axes=["accumulate"])
    a = _axes(res)[("w4a16", "accumulate")]
    assert "float64" in a["consistent"] and a["excluded"] == {}


def test_crashing_backend_costs_the_axis_not_the_fingerprint(monkeypatch):
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", "faulty-segfault=conformance.selftest.doubles.faulty:SegfaultBackend")
    res = fingerprint("faulty-segfault:only=w8a8", schemes=["w8a8", "w4a16"], axes=["act_rounding", "gptq_v1_zero"])
    got = _axes(res)
    assert got[("w8a8", "act_rounding")]["status"] == "crash"
    assert "SIGSEGV" in got[("w8a8", "act_rounding")]["reason"]
    assert got[("w4a16", "gptq_v1_zero")]["status"] == "ok"
    assert set(got[("w4a16", "gptq_v1_zero")]["consistent"]) == {"canonical"}


def test_every_scheme_axis_is_defined_and_cli_writes_json(tmp_path, capsys):
    for scheme, axes in SCHEME_AXES.items():
        for a in axes:
            assert a in PROBE_AXES, (scheme, a)
    from conformance.cli.main import main

    out = tmp_path / "fp.json"
    rc = main(["fingerprint", "--backend", "emulator:act_rounding=rhaz,declare=canonical", "--scheme", "w8a8",
               "--axis", "act_rounding", "--json", str(out), "--out", str(tmp_path / "probes")])
    text = capsys.readouterr().out
    assert rc == 1 and "CONTRADICTS DECLARATION" in text
    import json

    data = json.loads(out.read_text())
    a = data["schemes"]["w8a8"]["axes"][0]
    assert a["consistent"] == ["rhaz"]
    # the probes are replayable bundles
    from conformance.cases.bundle import load_bundle_inputs

    inp, meta = load_bundle_inputs(a["probes"][0]["bundle"])
    assert inp.case.scheme == "w8a8" and meta["verdict"] == "probe"
