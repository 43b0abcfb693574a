"""The suite kills every planted kernel bug (mutation self-test), and the cases built for it do what they say.

The full table (every tier, the control on all 1200+ ci cases) is a command, not a test:
``qconform selftest -j 2 --json selftest.json`` (docs/selftest.md). Here the fast mode runs: the
deterministic tiers only, each mutant stopped at its first kill.
"""

import json
import warnings

import numpy as np
import pytest

from backends.base import Case, Declared
from conformance.selftest import mutation as selftest
from conformance.judge.acceptance import declared_interval, declared_weight
from conformance.cases.generators import generate
from conformance.run.runner import judge, rounded_interval
from conformance.cases.suite import case_list
from emulator.activations import int8 as a8
from emulator.formats import mxfp4
from emulator.numerics.floats import round_to_dtype

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def test_every_mutant_is_killed_by_a_deterministic_tier():
    report = selftest.run_selftest(profile="ci", fast=True)
    names = {r["name"] for r in report["mutants"]}
    assert len(names) >= 50
    survivors = [r["name"] for r in report["mutants"] if not r["deterministic"]]
    assert survivors == [], f"mutants the deterministic tiers miss (gaps in the suite): {survivors}"
    for r in report["mutants"]:
        kill = r["tiers"][r["killed_by"][0]]
        assert kill["verdict"] in selftest.KILLING and kill["cases_to_kill"] >= 1, r["name"]
    assert report["score"]["deterministic_score"] == 100.0
    assert selftest.ok(report)


def test_the_control_survives_every_deterministic_case():
    """The same pipeline without a bug passes: the kills above come from the bugs, not from the harness."""
    report = selftest.run_selftest(profile="ci", mutants=["none"], fast=True)
    c = report["control"]
    assert not c["killed"], {t: (v.get("case_id"), v.get("reason")) for t, v in c["tiers"].items() if v.get("killed")}
    assert all(c["tiers"][t]["run"] == c["tiers"][t]["cases"] > 0 for t in ("exact", "edge", "golden"))


def test_a_survivor_is_reported_and_fails_the_command(tmp_path, capsys):
    # the random tier alone cannot see a sym checkpoint's non-midpoint qzeros: the harness must say so
    report = selftest.run_selftest(mutants=["sym-qzeros-ignored"], tiers=["random"])
    assert report["score"]["survivors"] == ["sym-qzeros-ignored"] and not selftest.ok(report)
    from conformance.cli.main import main

    out = tmp_path / "s.json"
    assert main(["selftest", "--mutant", "sym-qzeros-ignored", "--tier", "random", "--no-control",
                 "--json", str(out)]) == 1
    assert "SURVIVED" in capsys.readouterr().out
    assert json.loads(out.read_text())["score"]["killed"] == 0
    # the deterministic tiers kill it, and the command says so with status 0
    assert main(["selftest", "--fast", "--mutant", "sym-qzeros-ignored", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["mutants"][0]["killed_by"] == ["edge"] and data["score"]["mutation_score"] == 100.0


def test_isolated_workers_kill_at_the_same_case():
    """Through conformance.run.worker with QCONFORM_EXTRA_BACKENDS, as qconform run runs a backend."""
    kw = dict(mutants=["stale-weight-cache", "int8-rhaz"], tiers=["exact", "edge"])
    a = selftest.run_selftest(**kw)
    b = selftest.run_selftest(isolate=True, **kw)
    for ra, rb in zip(a["mutants"], b["mutants"]):
        for t in ("exact", "edge"):
            assert ra["tiers"][t].get("case_id") == rb["tiers"][t].get("case_id"), (ra["name"], t)


def test_mutants_are_not_in_the_default_registry(monkeypatch):
    from backends.registry import create, registered

    monkeypatch.delenv("QCONFORM_EXTRA_BACKENDS", raising=False)
    assert "mutant" not in registered()  # qconform run's default backends come from registered()
    with pytest.raises(ValueError, match="unknown backend"):
        create("mutant:bug=int8-rhaz")
    from conformance.selftest.doubles.mutants import EXTRA_BACKENDS_ENTRY

    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", EXTRA_BACKENDS_ENTRY)
    b = create("mutant:bug=int8-rhaz")
    assert b.label == "mutant:bug=int8-rhaz"
    assert b.declared(Case("w8a8", "ct-int-quantized", 2, 64, 128, group_size=-1)).variants == {}
    with pytest.raises(ValueError, match="unknown mutant"):
        create("mutant:bug=no-such-bug")


# -- the judge: one declared rounding, not any neighbour -------------------------------------------------
def test_truncated_output_fails_and_every_rne_of_an_accumulator_in_the_bound_passes():
    spec = next(s for s in case_list(profile="ci", tiers=("random",))
                if s.case.scheme == "w4a16" and s.case.act_dtype == "float16")
    inp = spec.inputs()
    d = Declared(variants={}, accumulate="float32", output="float16")
    iv = declared_interval(inp, d)
    assert judge(inp, iv, iv.y_ref.astype(np.float32), d).verdict == "pass"
    trunc = round_to_dtype(iv.y_exact, "float16", "rtz")
    assert not np.array_equal(trunc, iv.y_ref)  # the case can tell them apart
    # the outward interval alone admits truncation: that is the gap the narrowing closes
    assert np.all((trunc >= iv.lo) & (trunc <= iv.hi))
    rec = judge(inp, iv, trunc.astype(np.float32), d).record()
    assert rec["verdict"] == "fail" and "declared rounding" in rec["reason"]
    # soundness: any accumulator inside the bound, rounded once with RNE, is accepted
    rng = np.random.default_rng(0)
    tight = rounded_interval(iv, d)
    for _ in range(20):
        acc = iv.y_exact + iv.bound * rng.uniform(-1, 1, iv.y_exact.shape)
        acc[0, 0] = iv.y_exact[0, 0] + iv.bound[0, 0]  # the ends too
        y = round_to_dtype(acc, "float16")
        assert np.all((y >= tight.lo) & (y <= tight.hi))


def test_declared_truncation_is_judged_with_its_own_rounding():
    spec = next(s for s in case_list(profile="ci", tiers=("exact",))
                if s.case.scheme == "w4a16" and s.case.act_dtype == "bfloat16")
    inp = spec.inputs()
    d = Declared(variants={}, accumulate="float32", output="bfloat16", output_rounding="rtz")
    iv = declared_interval(inp, d)
    trunc = round_to_dtype(iv.y_exact, "bfloat16", "rtz").astype(np.float32)
    assert judge(inp, iv, trunc, d).verdict == "pass"


# -- the cases the self-test needed ------------------------------------------------------------------------
def _case(scheme, fmt, act="bfloat16", **kw):
    return Case(scheme, fmt, kw.pop("M", 5), kw.pop("N", 64), kw.pop("K", 256), act_dtype=act, **kw)


@pytest.mark.parametrize("act", ["bfloat16", "float16"])
def test_int8_recip_rows_separate_division_from_every_reciprocal_form(act):
    inp = generate(_case("w8a8", "ct-int-quantized", act, group_size=-1, M=6), "int8-recip", 11)
    x32 = inp.x.astype(np.float32)
    canon = a8.quantize_int8_per_token(x32)
    assert not canon.tie.any()  # no code is a tie: a different form cannot pass as a tie flip
    forms = {"recip_scale": a8.quantize_int8_per_token(x32, a8.Int8ActVariant(reciprocal="recip_scale")).q,
             "recip_amax": a8.quantize_int8_per_token(x32, a8.Int8ActVariant(reciprocal="recip_amax")).q}
    # the scale formula fl32(amax * fl32(1/127)), computed here without the emulator
    amax = np.abs(x32).max(axis=1, keepdims=True)
    s2 = (amax * (np.float32(1) / np.float32(127))).astype(np.float32)
    forms["recip_mul_scale"] = np.clip(np.rint((x32 / s2).astype(np.float32)), -128, 127)
    for name, q in forms.items():
        differs = (q != canon.q).any(axis=1)
        assert differs.any(), name
    # rows cycle over the forms: every form is tripped in the rows built for it
    assert all((forms[f] != canon.q).any(axis=1)[i] for i, f in enumerate(sorted(forms)))


def test_mx_boundary_rule_rows_separate_every_pair_of_rules_without_ties():
    inp = generate(_case("w4a4-mxfp4", "ct-mxfp4", M=4, K=128), "mx-boundaries", 5)
    x32 = inp.x.astype(np.float32)
    rules = ("floor", "even", "rceil", "ceil")
    sb = {r: mxfp4.quantize_mxfp4(x32, mxfp4.MxVariant(scale_rule=r))[1] for r in rules}
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    for m in (0, 2):  # rule rows
        for a in rules:
            for b in rules:
                if a != b:
                    assert (sb[a][m] != sb[b][m]).any(), (m, a, b)
            s = sb[a][m].astype(np.int64) - 127
            scaled = np.abs(x32[m].reshape(-1, 32).astype(np.float64) / 2.0 ** s[:, None])
            assert not np.isin(scaled, mids).any(), (m, a)
    # tie rows keep elements on E2M1 midpoints of the FLOOR scale
    s = sb["floor"][1].astype(np.int64) - 127
    assert np.isin(np.abs(x32[1].reshape(-1, 32).astype(np.float64) / 2.0 ** s[:, None]), mids).any()


def test_mx_tiny_blocks_vanish_under_an_epsilon_floor_only():
    inp = generate(_case("w4a4-mxfp4", "ct-mxfp4", M=3, K=128), "mx-tiny-blocks", 2)
    x32 = inp.x.astype(np.float32)
    codes, sb = mxfp4.quantize_mxfp4(x32)
    assert (codes[0] & 7).any() and np.abs(x32).max() < 6e-10
    assert (sb < 127 - 33).all()  # canonically each block keeps its own (tiny) scale
    floor_sb = mxfp4.quantize_mxfp4(np.full((1, 32), 6e-10, np.float32))[1][0, 0]
    scaled = np.abs(x32.astype(np.float64)) / 2.0 ** (int(floor_sb) - 127)
    assert (scaled < 0.25).all()  # with amax floored at 6e-10 every element rounds to 0


def test_router_ties_decide_the_last_expert():
    from emulator import moe

    inp = generate(_case("w4a16-moe", "gptq", N=64, K=128, group_size=32, E=4, top_k=2), "router-ties", 3)
    lo, _ = moe.route(inp.router_logits, 2)
    hi, _ = moe.route(inp.router_logits, 2, moe.MoeVariant(tie_lower_index_first=False))
    assert (np.sort(lo, axis=1) != np.sort(hi, axis=1)).any(axis=1).all()


@pytest.mark.parametrize("fmt,kw", [("gptq", dict(sym=True, zero_convention="v1")), ("awq", dict(sym=False)),
                                    ("ct-pack-quantized", dict(sym=False)), ("ct-int-quantized", dict(group_size=-1))])
def test_weight_mantissa_weights_do_not_fit_bf16(fmt, kw):
    kw.setdefault("group_size", 32)
    case = _case("w4a16" if fmt != "ct-int-quantized" else "w8a16", fmt, M=1, **kw)
    inp = generate(case, "weight-mantissa", 4)
    w = declared_weight(case, inp.tensors, Declared(variants={})).astype(np.float64)
    wb = declared_weight(case, inp.tensors, Declared(variants={}, weight_dtype="bfloat16")).astype(np.float64)
    assert np.mean(w != wb) > 0.5
    assert np.array_equal(inp.x, np.round(inp.x * 4) / 4)  # activations stay small exact values


def test_the_grid_has_the_shapes_the_mutants_needed():
    cases = {s.case for s in case_list(profile="ci")}
    assert any(c.weight_format == "awq" and c.N == c.K // c.group for c in cases)  # square scales
    assert any(c.weight_format == "ct-mxfp4" and c.N == c.K // 32 for c in cases)
    assert any(c.scheme == "w8a16" and c.act_dtype == "bfloat16" and c.K % 16 for c in cases)  # K tail
    assert any(c.scheme == "w4a16-moe" and c.group_size == -1 and c.N != c.K for c in cases)  # w2 group size


def test_markdown_and_table_name_every_tier():
    report = selftest.run_selftest(mutants=["bias-twice"], tiers=["exact", "golden"])
    md = selftest.format_markdown(report)
    assert "`bias-twice`" in md and "| exact | golden |" in md
    assert "bias-twice" in selftest.format_table(report)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert selftest.select_mutants(["mx-rule-*-for-floor"]) == [
            "mx-rule-even-for-floor", "mx-rule-rceil-for-floor", "mx-rule-ceil-for-floor"]
    with pytest.raises(ValueError, match="no mutant matches"):
        selftest.select_mutants(["nope*"])


# -- the mutants' own building blocks --------------------------------------------------------------------
def test_local_int8_quantizer_without_its_bug_is_the_emulators():
    from conformance.selftest.doubles import mutants

    rng = np.random.default_rng(1)
    x = round_to_dtype(rng.standard_normal((6, 96)) * 2.0 ** rng.integers(-8, 4, (6, 1)), "bfloat16")
    x[2] = 0.0
    x32 = x.astype(np.float32)
    q, s = mutants.int8_local()(None, x32)
    ref = a8.quantize_int8_per_token(x32)
    assert np.array_equal(q, ref.q) and np.array_equal(s, ref.scale.astype(np.float64))
    qn, _ = mutants.int8_local(zero_row="nan")(None, x32)
    assert np.isnan(qn[2]).all() and np.array_equal(np.delete(qn, 2, 0), np.delete(ref.q, 2, 0))
    assert np.array_equal(mutants.mx_local()(None, x32),
                          mxfp4.dequantize_mxfp4(*mxfp4.quantize_mxfp4(x32), dtype=np.float64))


def test_unmasked_negative_zero_takes_the_exponent_add():
    from conformance.selftest.doubles import mutants

    codes = np.full((1, 96), 8, np.uint8)  # E2M1 -0 everywhere
    sb = np.array([[127, 126, 0]], np.uint8)
    t = mxfp4.pack_mxfp4_ct(codes, sb)
    case = Case("w4a16-mxfp4", "ct-mxfp4", 1, 1, 96, group_size=32)
    w = mutants.canonical_weight(case, t)
    assert np.all(w == 0)
    got = mutants.mx_neg_zero_unmasked(None, case, t, w)
    # byte 127: 0x8000 + 0 stays -0; byte 126: 0x8000 - 0x80 = 0x7F80 = +Inf; byte 0: 0x8000 - 0x3F80 = 0x4080 = 4.0
    assert np.all(got[0, :32] == 0) and np.all(np.isposinf(got[0, 32:64])) and np.all(got[0, 64:] == 4.0)
