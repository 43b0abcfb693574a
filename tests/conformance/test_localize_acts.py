"""Failure localization of activation-quantization bugs and of rounded products, through the worker's
``localize`` op (docs/conformance.md#failure-localization: the case's own rows one at a time; a rounded
product told from a rounded weight).

``ActPlanted`` is a NumPy kernel written from docs/formats/activations.md and docs/formats/mxfp4.md (per-token
int8: scale = amax / 127 in fp32, quotient x / scale in fp32, round half to even, saturate to [-128, 127];
asymmetric: scale = (max - min) / 255, azp = RNE(-128 - min / scale); MXFP4: blocks of 32, scale
2^(floor(log2 amax) - 2), E2M1 round half to even saturating at 6, a NaN makes its block NaN), not from the
emulator. Each bug is coded from its one-line description in ``BUGS`` alone. Its weights come from
test_localize_kernels.Planted (docs/formats/*.md). Workers load it with
QCONFORM_EXTRA_BACKENDS="actplanted=test_localize_acts:ActPlanted" and this folder on PYTHONPATH.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import test_localize_kernels as kernels
from backends.base import Availability, Backend, Case, Declared, Prepared, yes
from conformance.judge.localize_text import localization_lines

HERE = Path(__file__).resolve().parent
SPEC = "actplanted=test_localize_acts:ActPlanted"
f32 = np.float32

BUGS = {
    "none": "no bug (control)",
    "rhaz": "int8 activation quotients rounded half away from zero (std::round) instead of half to even",
    "rtz": "int8 activation quotients converted to int by truncation (a C cast) instead of rounding",
    "pow2_shift": "a power-of-two amax takes a shift fast path that forms the scale as amax / 128 (no rule names it)",
    "recip_mul": "per-token scale formed as amax * fl32(1/127) instead of amax / 127",
    "scale_bf16": "per-token activation scale stored in bfloat16 (and used for the quotient and the epilogue)",
    "zero_inclusive": "asymmetric range taken from min(min, 0) and max(max, 0) instead of the row's min and max",
    "asym_wrap": "asymmetric codes stored to int8 without saturation: a code of 128 wraps to -128",
    "mx_tie5_up": "E2M1 rounding by a threshold ladder with '< 5' between 4 and 6: the tie 5 goes to 6, others RNE",
    "mx_rhaz": "E2M1 activation elements: ties rounded away from zero",
    "mx_no_sat": "MXFP4 activation quotients above 6 map to 0 (lookup table miss) instead of saturating to 6",
    "mx_nan_skipped": "MX block amax skips NaN (fmax) and the NaN element is quantized as 0",
    "mx_ceil": "MX block scale exponent ceil(log2(amax / 6)) instead of floor(log2(amax)) - 2",
    "partial_fp16": "partial sums over each block of 64 K columns stored in float16, then summed in float32",
    "weights_bf16": "weights dequantized exactly, then rounded to bfloat16 before the product (declared exact)",
}
GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])


def _rne_int(v):
    return np.rint(v)


def _int8_rows(x: np.ndarray, symmetric: bool, bug: str) -> np.ndarray:
    """Dequantized activations (float64) per token, docs/formats/activations.md, with ``bug``."""
    x = np.asarray(x, f32)
    rnd = {"rhaz": lambda v: np.sign(v) * np.floor(np.abs(v) + 0.5), "rtz": np.trunc}.get(bug, _rne_int)
    with np.errstate(all="ignore"):
        if symmetric:
            amax = np.max(np.abs(x), axis=1, keepdims=True)
            s = (amax * (f32(1) / f32(127))).astype(f32) if bug == "recip_mul" else (amax / f32(127)).astype(f32)
            if bug == "pow2_shift":
                m, _ = np.frexp(amax)
                s = np.where(m == 0.5, (amax / f32(128)).astype(f32), s)
            if bug == "scale_bf16":
                s = s.astype(ml_dtypes.bfloat16).astype(f32)
            safe = np.where(s > 0, s, f32(1))
            q = np.clip(rnd(np.where(s > 0, (x / safe).astype(f32), 0)), -128, 127)
            return q * s.astype(np.float64)
        lo, hi = np.min(x, axis=1, keepdims=True), np.max(x, axis=1, keepdims=True)
        if bug == "zero_inclusive":
            lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
        s = ((hi - lo).astype(f32) / f32(255)).astype(f32)
        safe = np.where(s > 0, s, f32(1))
        azp = np.where(s > 0, np.rint((f32(-128) - (lo / safe).astype(f32)).astype(f32)), 0)
        r = rnd(np.where(s > 0, (x / safe).astype(f32), 0)) + azp
        q = (((r + 128) % 256) - 128) if bug == "asym_wrap" else np.clip(r, -128, 127)
        return (q - azp) * s.astype(np.float64)


def _mx_rows(x: np.ndarray, bug: str) -> np.ndarray:
    """Dequantized MXFP4 activations (float64), docs/formats/mxfp4.md, with ``bug``."""
    xb = np.asarray(x, np.float64).reshape(len(x), -1, 32)
    with np.errstate(all="ignore"):
        if bug == "mx_nan_skipped":
            xb = np.where(np.isnan(xb), 0.0, xb)
        amax = np.max(np.abs(xb), axis=2, keepdims=True)
        nan_block = ~np.isfinite(amax)
        a = np.where((amax > 0) & ~nan_block, amax, 1.0)
        e = np.ceil(np.log2(a / 6)) if bug == "mx_ceil" else np.floor(np.log2(a)) - 2
        sc = np.ldexp(1.0, np.where(amax > 0, e, -127).astype(np.int64))
        m = np.abs(xb) / sc
        d = np.abs(np.minimum(m, 6)[..., None] - GRID)
        if bug == "mx_rhaz":  # ties go to the larger magnitude
            best = np.argmin(d - 1e-12 * np.arange(8), axis=-1)
        elif bug == "mx_tie5_up":  # only the tie between 4 and 6 goes up
            best = np.argmin(d + 1e-12 * (np.arange(8) % 2), axis=-1)
            best = np.where(m == 5, 7, best)
        else:  # ties to the even code (the code with an even mantissa bit: 0, 1, 2, 4 and 6 of the grid index)
            best = np.argmin(d + 1e-12 * (np.arange(8) % 2), axis=-1)
        v = np.sign(xb) * GRID[best] * sc
        if bug == "mx_no_sat":
            v = np.where(m > 6, 0.0, v)
        v = np.where(nan_block, np.nan, v)
    return v.reshape(np.shape(x))


def _round(y, dtype):
    t = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}[dtype]
    with np.errstate(all="ignore"):
        return np.asarray(y).astype(t).astype(np.float32)


class ActPlanted(Backend):
    name = "actplanted"
    covers = "test kernel with one planted activation or product bug (tests/conformance/test_localize_acts.py)"
    priority = -1000

    def __init__(self, **params):
        super().__init__(**params)
        self.bug = params.get("bug", "none")
        assert self.bug in BUGS, self.bug

    def availability(self):
        return Availability(True, "test kernel", "0", "cpu")

    def can_implement(self, case):
        return yes()

    def declared(self, case):
        acc = "int32" if case.spec.activations == "int8" else "float32"
        return Declared(variants={}, accumulate=acc, output=case.output_dtype, notes=f"planted bug: {self.bug}")

    def prepare(self, case, tensors):
        return Prepared(case, {"W": kernels.Planted(bug="none")._weights(case, tensors)})

    def run(self, prepared, x, bias=None, **_):
        case, W = prepared.case, prepared.data["W"]
        acts = case.spec.activations
        if acts == "int8":
            xd = _int8_rows(x, case.act_symmetric, self.bug)
        elif acts == "mxfp4":
            xd = _mx_rows(x, self.bug)
        else:
            xd = np.asarray(x, np.float64)
        with np.errstate(all="ignore"):
            if self.bug == "weights_bf16":
                W = W.astype(ml_dtypes.bfloat16).astype(np.float64)
            if self.bug == "partial_fp16":
                y = sum((xd[:, k:k + 64] @ W[:, k:k + 64].T).astype(np.float16).astype(np.float64)
                        for k in range(0, W.shape[1], 64))
            else:
                y = xd @ W.T
        if bias is not None:
            y = y + np.asarray(bias, np.float64)
        return _round(y, case.output_dtype)


# -- crafted activation rows: each bug's trigger in some rows, the other rows without it -----------------------------
def _ties_rows(K: int, rng) -> np.ndarray:
    """Symmetric int8, fp32: row 0 holds quotients that are exact .5 ties (amax 127 -> scale 1), rows 1..3 none."""
    X = rng.normal(0, 1, (4, K)).astype(f32)
    X[0] = rng.integers(-126, 127, K) + 0.5  # x / 1 = n + 1/2: a tie in every column
    X[0, 0] = 127.0
    X[0, 1:5] = (2.5, -2.5, 3.5, -0.5)  # ties rounded differently by RNE and half-away
    return X


def _recip_rows(K: int, rng) -> np.ndarray:
    """Symmetric int8, fp32: every row's amax is one where fl32(amax / 127) != fl32(amax * fl32(1/127))
    (found by NumPy float32 arithmetic), the other values below it."""
    X = rng.normal(0, 1, (4, K)).astype(f32)
    for i in range(4):
        while True:
            a = f32(rng.uniform(4, 8))
            if f32(a / f32(127)) != f32(a * (f32(1) / f32(127))):
                break
        X[i, 0] = a
        s1, s2 = f32(a / f32(127)), f32(a * (f32(1) / f32(127)))
        col = 1
        for n in range(3, 120):  # values next to a rounding boundary whose code the two scales give differently
            base = f32((n + 0.5) * s1)
            for c in (base, np.nextafter(base, f32(0)), np.nextafter(base, f32(np.inf))):
                if col < K and np.rint(f32(c / s1)) != np.rint(f32(c / s2)):
                    X[i, col] = c
                    col += 1
    return X


def _pow2_rows(K: int, rng) -> np.ndarray:
    """Symmetric int8, fp32: row 0's amax is exactly 4, the other rows' amax is not a power of two."""
    X = rng.uniform(-3, 3, (4, K)).astype(f32)
    X[0, 0] = 4.0
    X[1:, 0] = (3.3, -5.1, 6.7)
    return X


def _one_signed_rows(K: int, rng) -> np.ndarray:
    """Asymmetric int8: rows 0 and 2 one-signed (all positive / all negative), rows 1 and 3 straddle zero."""
    X = rng.normal(0, 1, (4, K)).astype(f32)
    X[0] = np.abs(X[0]) + 0.25
    X[2] = -np.abs(X[2]) - 0.5
    return X


def _wrap_rows(K: int, rng) -> np.ndarray:
    """Asymmetric int8, fp32: row 0 has min -153.5 and max 101.5 (scale 1, azp RNE(25.5) = 26: the max's
    quotient 101.5 rounds to 102 and 102 + 26 = 128, a code past 127); rows 1..3 ordinary."""
    X = rng.normal(0, 1, (4, K)).astype(f32)
    X[0] = rng.uniform(-150, 100, K).astype(f32)
    X[0, 0], X[0, 1] = -153.5, 101.5
    return X


def _mx_rows_in(K: int, rng, kind: str) -> np.ndarray:
    """MXFP4 rows: row 0 carries the trigger in its first block, rows 1..3 hold E2M1 values times 2^e only
    (amax 4 * 2^e, no ties, nothing to saturate), which every quantizer here keeps exactly."""
    vals = np.array([0, 0.5, 1, 1.5, 2, 3, 4])
    X = (vals[rng.integers(0, 7, (4, K))] * rng.choice((-1, 1), (4, K))).astype(f32)
    X[:, ::32] = 4.0
    if kind == "ties":  # scale 2^0 (amax 4): 2.5 and 3.5 and 5 are ties between E2M1 neighbours
        X[0, 1:6] = (2.5, -3.5, 0.25, 1.75, -1.25)
    elif kind == "tie5":  # scale 2^0 (amax 5): +-5 sit on the midpoint of 4 and 6 (RNE: 4); 2.5 a tie it keeps
        X[0, 1:4] = (5.0, -5.0, 2.5)
    elif kind == "saturate":  # amax 7.5 -> scale 2^0, 7.5 / 1 > 6 saturates
        X[0, 0] = 7.5
        X[0, 1] = -6.5
    elif kind == "nan":
        X[0, 3] = np.nan
    elif kind == "amax":  # amax 7 (not a power of two; floor(log2 7) - 2 = 0, ceil(log2(7 / 6)) = 1)
        X[0, 0] = 7.0
        X[0, 1:4] = (1.5, 0.5, 3.0)
    return X


_S8 = dict(M=4, N=32, K=64, group_size=-1, act_dtype="float32", scale_dtype="float32")
W8S = Case("w8a8", "ct-int-quantized", **_S8)
W8A = Case("w8a8", "ct-int-quantized", sym=False, **_S8)
W4A4 = Case("w4a4-mxfp4", "ct-mxfp4", M=4, N=32, K=64, group_size=32, act_dtype="float32")
A16 = Case("w4a16", "gptq", M=2, N=32, K=128, group_size=64, act_dtype="float32")

# (bug, case, rows, expected stage, substrings the localization must name)
CASES = [
    ("rhaz", W8S, "ties", "activation quantization",
     ["activation quantization wrong (rounding)", "act_rounding=rhaz", "exact ties after scaling"]),
    ("pow2_shift", W8S, "pow2", "activation quantization",
     ["activation quantization wrong (scale, by row class)", "each a row with amax exactly a power of two",
      "row(s) without it pass"]),
    ("rtz", W8S, "normal", "activation quantization", ["activation quantization wrong (rounding)", "act_rounding=rtz"]),
    ("recip_mul", W8S, "recip", "activation quantization",
     ["activation quantization wrong (scale)", "act_scale_formula=recip_mul"]),
    ("scale_bf16", W8S, "normal", "activation quantization",
     ["activation quantization wrong (scale)", "act_scale_dtype=bfloat16",
      # the scale read back from the amax element alone: the bfloat16 rounding of amax / 127, not amax / 127
      "consistent with amax/127 in bfloat16: the activation scale is off"]),
    ("zero_inclusive", W8A, "one_signed", "activation quantization",
     ["activation quantization wrong (zero point)", "act_range=zero_inclusive", "one-signed row"]),
    ("asym_wrap", W8A, "wrap", "activation quantization",
     ["activation quantization wrong (clamp)", "wraps around in int8", "saturating codes"]),
    ("mx_rhaz", W4A4, "ties", "activation quantization",
     ["activation quantization wrong (rounding)", "e2m1_rounding=rhaz", "exact ties after scaling"]),
    ("mx_no_sat", W4A4, "saturate", "activation quantization",
     ["activation quantization wrong (clamp)", "above 6 read as 0", "saturating values"]),
    ("mx_nan_skipped", W4A4, "nan", "activation quantization",
     ["activation quantization wrong (NaN handling)", "mx_nan_block=ignore", "nan/inf in the row"]),
    ("mx_ceil", W4A4, "amax", "activation quantization",
     ["activation quantization wrong (scale)", "mx_scale_rule=",
      # amax 7: ceil(log2(7 / 6)) = 1, so 7 / 2 = 3.5 rounds to 4 (even): 8, where floor gives scale 1 and 6
      "dequantized amax in [7.9", "declared 6 (block scale 2^0); consistent with block scale 2^1"]),
    ("partial_fp16", A16, "normal", "accumulation",
     ["accumulation wrong: the product (or a partial sum) is rounded to float16", "round(v * w), not v * round(w)"]),
    ("weights_bf16", A16, "normal", "weights", ["the weight is rounded to bfloat16 before the product"]),
]


def crafted_inputs(case: Case, rows: str):
    from conformance.cases.inputs import make_inputs

    inp = make_inputs(case, 5)
    rng = np.random.default_rng(11)
    K = case.K
    if rows == "ties":
        x = _mx_rows_in(K, rng, "ties") if case.spec.activations == "mxfp4" else _ties_rows(K, rng)
    elif rows == "pow2":
        x = _pow2_rows(K, rng)
    elif rows == "recip":
        x = _recip_rows(K, rng)
    elif rows == "one_signed":
        x = _one_signed_rows(K, rng)
    elif rows == "wrap":
        x = _wrap_rows(K, rng)
    elif rows in ("saturate", "nan", "amax", "tie5"):
        x = _mx_rows_in(K, rng, rows)
    else:
        x = rng.normal(0, 1, (case.M, K)).astype(f32)
    return dataclasses.replace(inp, x=np.asarray(x, f32))


def _verdict(bug: str, case: Case, inp) -> str:
    from conformance.judge.acceptance import declared_interval
    from conformance.run.runner import judge

    k = ActPlanted(bug=bug)
    decl = k.declared(case)
    y = k.run(k.prepare(case, inp.tensors), inp.x, bias=inp.bias)
    return judge(inp, declared_interval(inp, decl), y, decl).verdict


def worker_localize(bug: str, case: Case, inp, tmp_path: Path) -> dict:
    """The real localization path: the case's inputs as a bundle, the worker's ``localize`` op."""
    from conformance.cases.bundle import ReplayBundle, save_bundle
    from conformance.run.workerclient import WorkerClient
    from conformance.run.workerproc import WorkerProcess

    spec = {"case": case.to_json(), "tier": "test", "generator": "crafted", "seed": 5}
    path = save_bundle(tmp_path / f"{bug}.safetensors",
                       ReplayBundle(inp, spec, backend=f"actplanted:bug={bug}", verdict="fail"))
    env = {"QCONFORM_EXTRA_BACKENDS": SPEC,
           "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)}
    proc = WorkerProcess(f"actplanted:bug={bug}", env=env)
    proc.start()
    try:
        reply = WorkerClient(proc, timeout=300).localize(ActPlanted(bug=bug).declared(case), bundle=path)
    finally:
        proc.close()
    assert reply.failure is None, reply.failure
    return reply.localization


@pytest.mark.parametrize("bug,case,rows,stage,names", CASES, ids=[c[0] for c in CASES])
def test_worker_localization_names_the_planted_bug(tmp_path, bug, case, rows, stage, names):
    inp = crafted_inputs(case, rows)
    assert _verdict("none", case, inp) == "pass"  # the control kernel passes these very inputs
    assert _verdict(bug, case, inp) == "fail", f"{bug} does not change this case's output"
    loc = worker_localize(bug, case, inp, tmp_path)
    text = "\n".join(localization_lines(loc))
    assert loc["stage"] == stage, text
    for n in names:
        assert n.lower() in text.lower(), f"{n!r} not in:\n{text}"
    assert "accumulation or output rounding" not in loc["summary"], text  # never the accumulator when a stage is shown
    if stage == "activation quantization":
        own = loc["own_rows"]
        assert own["failing_rows"] and not own["ok"], text
        if rows not in ("normal", "recip"):  # the crafted triggers sit in these rows only: the others pass alone
            assert own["failing_rows"] == ([0, 2] if rows == "one_signed" else [0]), text


@pytest.mark.parametrize("case,rows", [(W8S, "ties"), (W8A, "one_signed"), (W8A, "wrap"), (W4A4, "ties"),
                                       (W4A4, "saturate"), (A16, "normal")], ids=["w8s", "w8a", "w8a-wrap", "mx-ties",
                                                                                  "mx-sat", "a16"])
def test_correct_kernel_localization_names_nothing(tmp_path, case, rows):
    """The kernel without a bug passes each crafted case, and its localization reads every probe back exact:
    no finding, no own row failing."""
    inp = crafted_inputs(case, rows)
    assert _verdict("none", case, inp) == "pass"
    loc = worker_localize("none", case, inp, tmp_path)
    assert loc["stage"] == "accumulation or output rounding", loc["summary"]
    assert "read back exact" in loc["summary"]
    for part in ("weights", "activations", "own_rows", "bias"):
        if part in loc:
            assert loc[part]["ok"] and not loc[part]["findings"], (part, loc[part])


def test_console_reports_and_replay_name_the_activation_rule(tmp_path, capsys, monkeypatch):
    """`qconform run` (the runner's worker localizes the first failures), report.md, report.html and
    `qconform replay` show the own-row localization of the rhaz kernel on the smoke profile's W8A8 edge cases."""
    import json

    from conformance.cli.main import main

    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", SPEC)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p))
    out = tmp_path / "run"
    assert main(["run", "--profile", "smoke", "--tier", "edge", "--scheme", "w8a8", "-j", "1", "--no-progress",
                 "--backend", "actplanted:bug=rhaz", "--out", str(out)]) == 1
    want = "activation quantization wrong (rounding)"
    rule = "act_rounding=rhaz"
    console = capsys.readouterr().out
    assert want in console and rule in console and "own rows by value class" in console
    for report in ("report.md", "report.html"):
        text = (out / report).read_text()
        assert want in text and rule in text, report
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    localized = [r for r in recs if r.get("kind") == "result" and r.get("localization")]
    assert localized and all(r["localization"]["stage"] == "activation quantization" for r in localized)
    monkeypatch.chdir(out)
    assert main(["replay", localized[0]["bundle"]]) == 1
    replay = capsys.readouterr().out
    assert want in replay and rule in replay


def test_mxfp4_ties_are_not_tolerated():
    """An MX block scale is a power of two, so x / 2^s is exact and an E2M1 tie is a tie in every arithmetic: a
    kernel declaring RNE that sends the ties at 5 (only those) to 6 implements another rounding, not an accident
    of its arithmetic. It must fail, not pass with tie flips (round 3's ``e2m1_threshold_5`` passed 45 cases so);
    the same rows through the correct kernel pass."""
    inp = crafted_inputs(W4A4, "tie5")
    assert _verdict("none", W4A4, inp) == "pass"
    assert _verdict("mx_tie5_up", W4A4, inp) == "fail"
