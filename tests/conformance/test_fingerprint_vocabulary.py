"""Every axis and value of the variant vocabulary (emulator/variants.py) is decided by a fingerprint probe,
and each probe really tells its value apart (docs/fingerprints.md#every-vocabulary-axis).

The axes are enumerated from their definition. For each value, the emulator *computes* that value while
*declaring canonical semantics* (``emulator:<key>=<value>,declare=canonical``): the fingerprint, seeing
only outputs, must identify the value -- or, for the values no linear output can tell apart
(conformance/fingerprint/vocab.SAME_NUMBERS, each with its reason), report the value it cannot be told from as
consistent. The expected value is the one passed to the emulator, never read from the fingerprint.
"""

from __future__ import annotations

import pytest

from backends.emulator import FIELD_KEYS, VARIANT_KEYS
from conformance.judge.acceptance import UNIT_ROUNDOFF
from conformance.fingerprint.decide import fingerprint
from conformance.fingerprint.axes import PROBE_AXES, DECLARATION_ONLY, SCHEME_AXES, norm_value, value_label
from conformance.fingerprint.vocab import SAME_NUMBERS, coverage, missing_probes, representative_values
from emulator.variants import AXES as VOCABULARY

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

SEQ = "seq-acc=conformance.selftest.doubles.faulty:SequentialAccumulatorBackend"

#: where a value shows on one scheme's probes and not on another's, the scheme to check it on (why)
SCHEME_FOR = {
    # W8A8's fp32 epilogue bound (two roundings) covers a one-ulp difference of the scale itself
    "act_scale_formula": "w4a8",
}
#: where a value shows only together with another axis's value, the probe value to check it with (why)
LABEL_FOR = {
    # with float32 weights and 16-bit scales every dequantization order is exact (docs/fingerprints.md)
    "dequant_order": "bfloat16/",
    # 16-bit weights round the difference a finer zero point makes away (conformance/fingerprint/axes._DEQUANT_VALUES)
    "zero_dtype": "float32/",
}
#: emulator parameters a value needs to act at all (why)
CONTEXT = {
    "weight_rounding": {"weight_dtype": "bfloat16"},  # rounding to float32 weights changes nothing
    "weight_formation": {"weight_dtype": "bfloat16"},  # float32 weights are formed in float32 either way
}


def test_every_vocabulary_axis_and_value_has_a_probe():
    problems = missing_probes()
    assert not problems, "fingerprint probes missing:\n" + "\n".join(problems)


def test_docs_table_is_generated_from_the_definitions():
    from pathlib import Path

    from conformance.fingerprint.vocab import markdown_coverage

    text = (Path(__file__).resolve().parents[2] / "docs" / "fingerprints.md").read_text(encoding="utf-8")
    body = text.split("<!-- BEGIN GENERATED: python -m conformance.fingerprint.vocab -->\n", 1)[1]
    assert body.split("<!-- END GENERATED -->")[0] == markdown_coverage(), \
        "docs/fingerprints.md is stale: regenerate its table with `python -m conformance.fingerprint.vocab`"
    for key in VOCABULARY:
        assert f"`{key}`" in body


def test_declaration_only_axes_are_not_computations():
    # an axis may be left unprobed only as a claim about the declaration: a Declared field that no
    # backend parameter selects (the emulator computes every variant it accepts)
    for key in DECLARATION_ONLY:
        assert VOCABULARY[key].field and key not in FIELD_KEYS and key not in VARIANT_KEYS, key


def test_every_probe_axis_value_names_vocabulary_values():
    for ax in PROBE_AXES.values():
        for _, ov in ax.values:
            for k, v in ov.items():
                assert k in VOCABULARY, (ax.name, k)
                if v is not None:
                    VOCABULARY[k].parse(v)
    for scheme, names in SCHEME_AXES.items():
        assert len(set(names)) == len(names), scheme


def _checks():
    """(key, value, scheme, probe axis, emulator params) for every non-canonical representative value."""
    cov = coverage()
    out = []
    for key, a in VOCABULARY.items():
        if key in DECLARATION_ONLY or key in ("accumulate", "output"):
            continue  # (accumulate, output: realized by other backends below)
        for v in representative_values(key):
            if _is(key, v, a.canonical):
                continue
            hits = cov[key][value_label(v)]
            if not hits:
                continue  # test_every_vocabulary_axis_and_value_has_a_probe names it
            pref = SCHEME_FOR.get(key)
            hits = [h for h in hits if h[2].startswith(LABEL_FOR.get(key, ""))] or hits
            scheme, name, label = next((h for h in hits if h[0] == pref), hits[0])
            ov = dict(PROBE_AXES[name].values)[label]
            params = {k: x for k, x in ov.items() if x is not None}
            params[key] = v  # (SAME_NUMBERS values: the probe value is the one it cannot be told from)
            params.update(CONTEXT.get(key, {}))
            spec = ",".join(f"{k}={value_label(x)}" for k, x in params.items())
            out.append(pytest.param(key, v, scheme, name, spec, id=f"{key}={value_label(v)}"))
    return out


def _is(key, v, w) -> bool:
    try:
        return norm_value(key, v) == norm_value(key, w)
    except Exception:  # noqa: BLE001
        return False


def _project(rec: dict, key: str, labels) -> set:
    ovs = dict(rec["value_overrides"])
    return {value_label(norm_value(key, ovs[lab][key]) if ovs[lab].get(key) is not None else
                        norm_value(key, VOCABULARY[key].canonical)) for lab in labels if key in ovs[lab]}


@pytest.mark.parametrize("key,value,scheme,probe,spec", _checks())
def test_the_fingerprint_identifies_each_value_the_emulator_computes(key, value, scheme, probe, spec):
    res = fingerprint(f"emulator:{spec},declare=canonical", schemes=[scheme], axes=[probe])
    rec = next(a for a in res["schemes"][scheme]["axes"] if a["axis"] == probe)
    want = value_label(norm_value(key, value))
    assert rec["status"] in ("ok", "not-observable"), (spec, rec.get("status"), rec.get("reason"))
    consistent = _project(rec, key, rec["consistent"])
    co = rec.get("coincide", {}).get(value_label(value))
    if co is not None:  # computes another value's numbers on this probe case (the record says which and why)
        assert co[1] and _project(rec, key, [co[0]]) <= consistent, (spec, co, rec["consistent"])
        return
    group = _group(key, value)
    if (key, value) in SAME_NUMBERS:
        other = value_label(norm_value(key, SAME_NUMBERS[(key, value)][0]))
        assert other in consistent and consistent <= group, (spec, rec["consistent"], rec.get("excluded"))
        return
    assert rec["status"] == "ok", (spec, rec.get("reason"))
    ident = rec.get("identified")
    # identified: every consistent value has this key's value (or one it cannot be told from, SAME_NUMBERS),
    # or the probes single it out
    assert (want in consistent and consistent <= group) or \
        (ident is not None and _project(rec, key, [ident]) == {want}), \
        (spec, "identified:", ident, "consistent:", rec["consistent"], "unseparated:", rec.get("unseparated"))
    row = res["vocabulary"][scheme][key]  # the vocabulary view of the result says the same
    assert row["status"] in ("identified", "ambiguous") and value_label(value) in row["values"], row


def _group(key, value) -> set:
    """The value and those SAME_NUMBERS says it cannot be told from (either way round, transitively)."""
    out = {value_label(norm_value(key, value))}
    pairs = [{value_label(norm_value(k, v)), value_label(norm_value(k, w))}
             for (k, v), (w, _) in SAME_NUMBERS.items() if k == key]
    grown = True
    while grown:
        grown = False
        for p in pairs:
            if p & out and not p <= out:
                out |= p
                grown = True
    return out


@pytest.mark.parametrize("acc,act", [("float32", "bfloat16"), ("float16", "float16"), ("bfloat16", "bfloat16")])
def test_accumulate_values_are_bracketed(monkeypatch, acc, act):
    # the emulator accumulates exactly whatever it declares: a sequential accumulator in each dtype computes them
    # (a float16 accumulator overflows on the bfloat16 probes' 2^20 terms: probed with float16 activations)
    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", SEQ)
    res = fingerprint(f"seq-acc:acc={acc}", schemes=["w4a16"], axes=["accumulate"], act_dtype=act)
    rec = res["schemes"]["w4a16"]["axes"][0]
    order = ["float64", "float32", "float16", "bfloat16"]
    finest = min(rec["consistent"], key=order.index)
    assert finest == acc and set(rec["consistent"]) == set(order[order.index(acc):]), rec["consistent"]


def test_accumulate_exact_values_and_tf32():
    res = fingerprint("emulator:path=exact", schemes=["w4a16"], axes=["accumulate"])
    rec = res["schemes"]["w4a16"]["axes"][0]
    assert "float64" in rec["consistent"] and not rec["excluded"]  # exact, int32 and float64: no error shows
    assert UNIT_ROUNDOFF["tf32"] == UNIT_ROUNDOFF["float16"]  # SAME_NUMBERS' reason for tf32


@pytest.mark.parametrize("scheme", ["w8a8", "w4a16"])
def test_output_dtype_values_are_identified_from_their_outputs(scheme):
    # no backend here returns another dtype than the case's (the emulator's output follows the case): each
    # output dtype's reference on the fingerprint's own probes is judged as the fingerprint judges a backend
    from backends.emulator import EmulatorBackend
    from conformance.judge.acceptance import compare
    from conformance.fingerprint.axes import candidate_cases, rows_options, values_for_case
    from conformance.fingerprint.probes import trial_fn, with_rows
    from conformance.fingerprint.search import hypotheses, hypothesis_intervals, identify, search_separating_inputs

    name = next(n for n in SCHEME_AXES[scheme] if n.split("@")[0] == "output")
    ax = PROBE_AXES[name]
    case = with_rows(candidate_cases(scheme, ax.probe, "bfloat16")[0], rows_options(ax.probe)[0])
    ax = values_for_case(ax, case)
    hyps, _ = hypotheses(ax, EmulatorBackend().declared(case), {}, {})
    probes, _ = search_separating_inputs(hyps, trial_fn(ax, case, 0), 60)
    ivs = [hypothesis_intervals(p, hyps) for p in probes]
    assert {h.value for h in hyps} == {"case", "float32", "float16"}  # bfloat16 is the case's own dtype
    for j, hj in enumerate(hyps):
        outputs = [iv[j].y_ref for iv in ivs]  # a kernel computing exactly hj
        inside = [h for h in range(len(hyps)) if all(compare(y, iv[h]).ok for y, iv in zip(outputs, ivs))]
        assert identify(inside, hyps, ivs, outputs)[0] == hj.value, (hj.value, [hyps[h].value for h in inside])


def test_fingerprint_reports_every_vocabulary_key_of_a_scheme():
    res = fingerprint("emulator", schemes=["w4a4-mxfp4"])
    rows = res["vocabulary"]["w4a4-mxfp4"]
    assert set(rows) == {k for k, a in VOCABULARY.items() if a.applies_to("w4a4-mxfp4")}
    assert rows["mx_scale_rule"] == {"status": "identified", "values": ["floor"], "probe": "mx_scale_rule",
                                     "reason": "only consistent"}
    assert rows["e2m1_zero_sign"]["status"] == "not-observable"
    assert rows["arithmetic"]["status"] == "declaration"
    assert "weight_rounding" not in rows  # W4A4 multiplies the codes: no weight dtype (docs/formats/gptq.md)
