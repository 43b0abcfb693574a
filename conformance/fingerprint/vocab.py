"""The fingerprint seen from the variant vocabulary: which probe decides each axis and value of
emulator/variants.py, which values no linear output can tell apart (and why), and the value the
fingerprint identified for each vocabulary key of a scheme.

Part of conformance/fingerprint/decide.py; semantics: docs/fingerprints.md#every-vocabulary-axis.
"""

from __future__ import annotations

from emulator.variants import AXES as VOCABULARY

from conformance.fingerprint.axes import AXES, DECLARATION_ONLY, NOT_APPLICABLE, SCHEME_AXES, TUNING, norm_value, value_label

__all__ = ["SAME_NUMBERS", "representative_values", "coverage", "missing_probes", "vocabulary_summary"]

#: (key, value) -> (value it cannot be told from, why): values whose outputs are those of another value on
#: every input a linear can be given (the fingerprint reports both as consistent; the test checks it)
SAME_NUMBERS: dict[tuple, tuple] = {
    ("zero_row", "nan"): ("zero", "an all-zero row gives 0 under both; only eps clamps show"),
    ("nan_to_int", "low"): ("zero", "a NaN quotient comes only from an all-zero row, whose scale 0 makes its codes "
                                    "(0 or -128) add 0"),
    ("e2m1_nan", "zero_signed"): ("zero", "the codes +0 and -0 add the same 0"),
    ("e2m1_nan", "zero_sign_flipped"): ("zero", "the codes +0 and -0 add the same 0"),
    ("e2m1_zero_sign", "positive"): ("keep", "the codes +0 and -0 add the same 0"),
    ("uint8_zp128", True): (False, "codes q + 128 held in uint8 are the same values as q in int8"),
    ("azp_clamp_nan", "high"): ("keep", "a NaN real zero point comes only from a scale that underflowed to 0, "
                                        "which makes every code add 0"),
    # x / 2**s of an fp32/fp16/bf16 x is exact in each dtype down to its subnormals, where the E2M1 code is 0
    ("mx_quotient_dtype", "input"): ("exact", "a quotient only changes where it underflows: to a +-0 code"),
    ("mx_quotient_dtype", "float32"): ("exact", "a quotient only changes where it underflows: to a +-0 code"),
    ("mx_quotient_dtype", "bfloat16"): ("exact", "a quotient only changes where it underflows: to a +-0 code"),
    ("mx_quotient_dtype", "float16"): ("exact", "a quotient only changes where it underflows: to a +-0 code"),
    ("mx_zero_block", "half"): ("min", "an all-zero block adds 0 whatever its scale byte"),
    ("mx_zero_block", "eps_fp32"): ("min", "an all-zero block adds 0 whatever its scale byte"),
    ("mx_zero_block", "eps_1e10"): ("min", "an all-zero block adds 0 whatever its scale byte"),
    ("mx_zero_block", "eps_1e10_floor"): ("min", "an all-zero block adds 0 whatever its scale byte"),
    ("moe_expert_output_dtype", "float32"): ("exact", "an fp32 store moves y by at most 2^-24 of the weighted "
                                                      "expert outputs' magnitude, inside the fp32 accumulation "
                                                      "bound the probes judge with"),
    ("moe_tie_order", "any"): ("lower_index_first", "'any' accepts every order on ties: an output consistent "
                                                    "with one order is consistent with 'any' too"),
    ("azp_epilogue", "compensation"): ("exact", "compensation widens the accepted interval around the same "
                                                "reference: an exact epilogue is consistent with both"),
    ("weight_scale_dtype", "float32"): ("checkpoint", "float32 holds every float16/bfloat16 scale unchanged"),
    ("act_compute_dtype", "float32"): ("none", "float32 holds every 16-bit activation unchanged"),
    ("act_compute_dtype", "bfloat16"): ("none", "the probes' activations are bfloat16 already"),
    ("act_dequant_scale_dtype", "float32"): ("same", "the activation scale is float32 already"),
    ("accumulate", "tf32"): ("float16", "the same unit roundoff (2^-11) bounds both: the bracket cannot tell them"),
    ("accumulate", "exact"): ("float64", "no accumulation error shows on the probes under either"),
    ("accumulate", "int32"): ("float64", "int32 accumulation of integer products is exact"),
    ("weight_dtype", "exact"): ("float32", "int and MX weights are formed exactly in float32"),
    ("mx_scale_rule", "rceil_log2f"): ("rceil", "they differ only on float32 amax just above 6 * 2^k, which the "
                                                "bfloat16 probes cannot hold"),
    ("zero_dtype", "float32"): ("weight", "with float32 weights (where a zero dtype shows) float32 is the weight dtype"),
}


def representative_values(key: str) -> tuple:
    """The values of a vocabulary axis the fingerprint must decide (a typed axis: representative ones)."""
    a = VOCABULARY[key]
    t = TUNING.get(key, {})
    if "values" in t:
        return tuple(t["values"])
    if a.values:
        return tuple(a.values)
    if a.kind == "bool":
        return (a.canonical, not a.canonical)
    if key == "qmin":
        return (-128, -127)
    if key == "eps":
        return (1e-10, 1e-07, 1e-05)
    return (a.canonical,)


def _same(key, v, w) -> bool:
    try:
        return norm_value(key, v) == norm_value(key, w)
    except Exception:  # noqa: BLE001 - a value of another type is not this one
        return False


def coverage() -> dict:
    """{key: {value label: [(scheme, probe axis, probe value label), ...]}}: the probe values that set each
    representative value of each vocabulary key (the accumulation bracket decides ``accumulate``)."""
    where: dict = {}
    for scheme, names in SCHEME_AXES.items():
        for name in names:
            ax = AXES[name]
            for label, ov in ax.values:
                for k, v in ov.items():
                    if k in ax.context:
                        continue
                    where.setdefault(k, []).append((scheme, name, label, v))
    out = {}
    for key in VOCABULARY:
        out[key] = {}
        for v in representative_values(key):
            hits = [(s, n, lab) for s, n, lab, pv in where.get(key, ()) if _same(key, pv, v)]
            if not hits and (key, v) in SAME_NUMBERS:
                other = SAME_NUMBERS[(key, v)][0]
                hits = [(s, n, lab) for s, n, lab, pv in where.get(key, ()) if _same(key, pv, other)]
            out[key][value_label(v)] = hits
    return out


def missing_probes() -> list[str]:
    """One line per vocabulary key or value no probe decides (empty when the fingerprint covers them all)."""
    lines = []
    cov = coverage()
    for key, a in VOCABULARY.items():
        if key in DECLARATION_ONLY:
            continue
        if not any(cov[key].values()):
            lines.append(f"vocabulary axis {key!r} (stage {a.stage.value}, schemes {', '.join(a.schemes)}): no "
                         f"fingerprint probe sets it; conformance/fingerprint_axes.derive_axes makes one from its "
                         f"stage unless its stage has no probe family (_STAGE_FAMILY) or its values are not typed "
                         f"(TUNING[{key!r}]['values'])")
            continue
        for label, hits in cov[key].items():
            if not hits:
                lines.append(f"vocabulary axis {key!r}: value {label!r} is set by no probe value (add it to the "
                             f"probe axis of conformance/fingerprint/axes.py that decides {key!r}, or name the value "
                             f"it cannot be told from in fingerprint_vocab.SAME_NUMBERS with the reason)")
    return lines


#: keys that act only under another key's value: a probe value leaving them unset (None) says nothing of them
CONDITIONAL = {"eps": "acts only under zero_row=eps", "e2m1_nan": "acts only under mx_nan_block=ignore",
               "zero_dtype": "acts only under dequant_order=float_zero"}


def _project(rec: dict, key: str) -> list:
    """The values of ``key`` among a probe axis record's consistent values."""
    ovs = dict(rec.get("value_overrides", []))
    out = []
    for label in rec.get("consistent", []):
        ov = ovs.get(label, {})
        if key in ov and not (ov[key] is None and key in CONDITIONAL):
            v = value_label(ov[key] if ov[key] is not None else VOCABULARY[key].canonical)
            if v not in out:
                out.append(v)
    return out


def vocabulary_summary(result: dict) -> dict:
    """{scheme: {key: {"status", "values", "probe", "reason"}}} for every vocabulary key that applies to the
    scheme: ``identified`` (one value), ``ambiguous`` (several consistent), ``inconsistent`` (none is: the
    output also differs on another axis), ``not-observable``,
    ``not-applicable`` / ``unsupported`` / ``crash`` (with the probe's reason), ``declaration`` (not
    an output property), ``not-probed`` (the key is probed on another scheme only)."""
    out = {}
    for scheme, srec in result.get("schemes", {}).items():
        if scheme not in SCHEME_AXES:
            continue  # (records of other probe kinds, e.g. quantize-only schemes, carry their own view)
        recs = {a["axis"]: a for a in srec.get("axes", [])}
        rows = {}
        for key, va in VOCABULARY.items():
            if not va.applies_to(scheme):
                continue
            if key in DECLARATION_ONLY:
                rows[key] = {"status": "declaration", "values": [], "probe": None, "reason": DECLARATION_ONLY[key]}
                continue
            if (key, scheme) in NOT_APPLICABLE:
                rows[key] = {"status": "not-applicable", "values": [], "probe": None,
                             "reason": NOT_APPLICABLE[(key, scheme)]}
                continue
            probes = [n for n in SCHEME_AXES.get(scheme, ()) if key in AXES[n].keys]
            if not probes:
                rows[key] = {"status": "not-probed", "values": [], "probe": None,
                             "reason": "probed on " + (", ".join(s for s, ns in SCHEME_AXES.items()
                                                                if any(key in AXES[n].keys for n in ns)) or "no scheme")}
                continue
            rec = next((recs[n] for n in probes if n in recs), None)
            if rec is None:
                continue  # not run (--axis)
            st = rec.get("status")
            if st != "ok" and st != "not-observable":
                rows[key] = {"status": st, "values": [], "probe": rec["axis"], "reason": rec.get("reason", "")}
                continue
            vals = _project(rec, key)
            ident = rec.get("identified")
            if ident is not None:
                ov = dict(rec.get("value_overrides", [])).get(ident, {})
                if key in ov and not (ov[key] is None and key in CONDITIONAL):
                    vals = [value_label(ov[key] if ov[key] is not None else VOCABULARY[key].canonical)]
            if not vals and st == "ok" and key in CONDITIONAL:
                rows[key] = {"status": "not-applicable", "values": [], "probe": rec["axis"],
                             "reason": CONDITIONAL[key] + " (not found here)"}
                continue
            if not vals and st == "ok":
                rows[key] = {"status": "inconsistent", "values": [], "probe": rec["axis"],
                             "reason": rec.get("note", "no value is consistent")}
                continue
            status = "identified" if len(vals) == 1 else ("not-observable" if st == "not-observable" else "ambiguous")
            reason = rec.get("identified_by", "") if status == "identified" else (rec.get("reason") or AXES[rec["axis"]].note
                                                                                  if rec["axis"] in AXES else "")
            rows[key] = {"status": status, "values": vals, "probe": rec["axis"], "reason": reason}
        out[scheme] = rows
    return out


def markdown_coverage() -> str:
    """docs/fingerprints.md#every-vocabulary-axis: per vocabulary key, the probe axes (per scheme) that decide
    it and the values no linear output tells apart, derived from the definitions above."""
    lines = ["| key | decided by (schemes) | values that coincide with another |", "| --- | --- | --- |"]
    cov = coverage()
    for key in VOCABULARY:
        if key in DECLARATION_ONLY:
            lines.append(f"| `{key}` | not probed: {DECLARATION_ONLY[key]} | |")
            continue
        by: dict = {}
        for hits in cov[key].values():
            for s, n, _ in hits:
                by.setdefault(n, [])
                if s not in by[n]:
                    by[n].append(s)
        where = "; ".join(f"`{n}` ({', '.join(ss)})" for n, ss in by.items())
        groups: dict = {}
        for (k, v), (w, why) in SAME_NUMBERS.items():
            if k == key:
                groups.setdefault((value_label(w), why), []).append(value_label(v))
        same = "; ".join(f"{', '.join(vs)} ~ {w}: {why}" for (w, why), vs in groups.items())
        lines.append(f"| `{key}` | {where} | {same} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m conformance.fingerprint.vocab: the generated table of docs/fingerprints.md
    print(markdown_coverage(), end="")
