"""Quantize-only cases: the verdict rule on codes, scales, zero points and dequantized values.

Semantics: docs/conformance.md#quantize-only-cases. ``decide_quantized`` is pure (observed and expected
tensors in, a record out): the runner calls it with the emulator's reference
(emulator/quantize_only.py) and ``verify-bundle`` with the tensors a certification bundle stores, so
both judge by the same code. There is no interval: every tensor must equal the reference exactly, in
the contract's dtype and shape (a missing tensor, an extra one, another dtype or shape is a fail, never
converted). Integer tensors compare by value; ``scale`` by its bits (any NaN matches a NaN); the
``dequantized`` tensor by value (any NaN matches a NaN, and -0 equals +0 there: the codes carry the sign).
The codes of an MX block whose scale byte is 0xFF (NaN) are unspecified (OCP MX v1.0 §5.3) and not compared.
"""

from __future__ import annotations

import numpy as np

from conformance.judge.verdict import Verdict

__all__ = ["decide_quantized", "mismatch_mask", "assess_quantized", "expected_for", "load_observed", "judge_quantized"]


def _fmt(v):
    if isinstance(v, (np.integer, int)):
        return int(v)
    f = float(v)
    return f


def mismatch_mask(name: str, obs: np.ndarray, exp: np.ndarray) -> np.ndarray:
    """True where ``obs`` differs from ``exp`` (same dtype and shape already checked)."""
    if exp.dtype.kind != "f":
        return obs != exp
    both_nan = np.isnan(obs) & np.isnan(exp)
    if name == "dequantized":
        with np.errstate(invalid="ignore"):
            return ~((obs == exp) | both_nan)
    w = {2: np.uint16, 4: np.uint32, 8: np.uint64}[exp.dtype.itemsize]
    return (obs.view(w) != exp.view(w)) & ~both_nan


def _unspecified_codes(expected: dict) -> np.ndarray:
    """True for the codes of MX blocks whose expected scale byte is 0xFF (NaN): OCP MX v1.0 leaves their
    elements unspecified (the block decodes to NaN whatever they hold), so they are not compared; the scale
    byte and the dequantized NaNs still are."""
    codes, scale = np.asarray(expected.get("codes")), np.asarray(expected.get("scale"))
    if scale.dtype != np.uint8 or codes.ndim != 2 or scale.ndim != 2 or codes.shape[1] != 32 * scale.shape[1]:
        return np.zeros(codes.shape, bool)
    return np.repeat(scale == 0xFF, 32, axis=1)


def decide_quantized(observed: dict, expected: dict) -> dict:
    """Verdict and metrics of a quantize-only output: ``pass`` only when every expected tensor is present
    with the expected dtype and shape and equal to the reference, and nothing else is returned.

    ``mistrusted`` when it matches but the expected codes are one constant value (agreement proves little).
    A fail names the first problem: a missing or unexpected tensor, a dtype or shape, or the first
    differing element (tensor, index, observed and expected value).
    """
    rec = {"exact_match": False, "n_outside": 0, "mismatch": {}, "first_mismatch": None, "max_ulp": None}
    if not isinstance(observed, dict) or not observed:
        return dict(rec, verdict=Verdict.FAIL.value, reason="the backend returned no tensors")
    missing = [k for k in expected if k not in observed]
    if missing:
        return dict(rec, verdict=Verdict.FAIL.value, reason=f"missing output tensor(s) {', '.join(missing)} (expected "
                                                f"{', '.join(expected)})")
    extra = sorted(k for k in observed if k not in expected)
    if extra:
        return dict(rec, verdict=Verdict.FAIL.value, reason=f"unexpected output tensor(s) {', '.join(extra)} (expected "
                                                f"{', '.join(expected)})")
    first = None
    for name, exp in expected.items():
        exp = np.asarray(exp)
        obs = np.asarray(observed[name])
        if obs.dtype != exp.dtype:
            return dict(rec, verdict=Verdict.FAIL.value, reason=f"{name}: dtype {obs.dtype}, expected {exp.dtype}")
        if obs.shape != exp.shape:
            return dict(rec, verdict=Verdict.FAIL.value, reason=f"{name}: shape {list(obs.shape)}, expected {list(exp.shape)}")
        bad = mismatch_mask(name, obs, exp)
        if name == "codes":
            bad &= ~_unspecified_codes(expected)
        n = int(np.count_nonzero(bad))
        rec["mismatch"][name] = n
        rec["n_outside"] += n
        if n and first is None:
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            first = {"tensor": name, "index": list(idx), "observed": _fmt(obs[idx]), "expected": _fmt(exp[idx]),
                     "count": n, "size": int(exp.size)}
    if first is not None:
        rec["first_mismatch"] = first
        parts = ", ".join(f"{k} {v}" for k, v in rec["mismatch"].items() if v)
        return dict(rec, verdict=Verdict.FAIL.value, reason=f"{parts} element(s) differ; first: {first['tensor']}"
                                                f"{first['index']} observed {first['observed']!r}, expected "
                                                f"{first['expected']!r}")
    rec["exact_match"] = True
    codes = np.asarray(expected.get("codes"))
    if codes.size > 1 and np.unique(codes).size <= 1:
        return dict(rec, verdict=Verdict.MISTRUSTED.value, reason="the expected codes are one constant value: agreement "
                                                      "proves little")
    return dict(rec, verdict=Verdict.PASS.value, reason="")


def expected_for(case, x, declared) -> dict:
    """The emulator's reference tensors of a quantize-only case under ``declared``."""
    from emulator.quantize_only import quantize_reference

    with np.errstate(all="ignore"):
        return quantize_reference(case, np.asarray(x, np.float32), declared)


def assess_quantized(case, declared, x, observed: "dict | None") -> dict:
    """{"level", "deviations"[, "canonical_distance"]}: as conformance/levels.assess, the distance being the
    number of elements that differ from the canonical reference (codes, scales, zero points, dequantized)."""
    from emulator.declaration import canonical_declaration
    from emulator.variants import Level

    devs = declared.deviations(case, None)
    level = max((d.level for d in devs), default=Level.CANONICAL)
    out = {"level": level.label, "deviations": [{"variant": str(d), "level": d.level.label} for d in devs]}
    if devs and observed:
        try:
            canon = expected_for(case, x, canonical_declaration(case))
            j = decide_quantized(observed, canon)
        except Exception as e:  # noqa: BLE001 - the canonical reference may be undefined for the input
            out["canonical_distance"] = {"error": f"{type(e).__name__}: {e}"}
        else:
            out["canonical_distance"] = {"n_outside": j["n_outside"], "max_ulp": None, "sqnr_db": None,
                                         "differs": j["reason"]}
    return out


def load_observed(path) -> dict:
    """The tensors a worker wrote for a quantize-only case ("q.<name>" -> name)."""
    from emulator.tensorfile import load_tensors

    return {k[2:]: t.data for k, t in load_tensors(path).items() if k.startswith("q.")}


def judge_quantized(case, x, declared, observed: dict) -> "tuple[dict, dict | None]":
    """(record, expected tensors) of one quantize-only output; the record says ``crash`` naming the reason
    where the reference itself is undefined for the input."""
    try:
        expected = expected_for(case, x, declared)
    except Exception as e:  # noqa: BLE001
        return {"verdict": Verdict.CRASH.value, "reason": f"reference failed for this declaration: {type(e).__name__}: {e}"}, None
    return decide_quantized(observed, expected), expected
