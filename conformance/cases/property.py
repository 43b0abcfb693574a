"""The property tier: Hypothesis searches each backend for a failing case and shrinks it to a minimal one.

Semantics: docs/conformance.md#property-tier. For every (scheme, weight format) family the backend
implements, a Hypothesis search draws a case (shapes with K tails, N off multiples of 8/16/64, M = 1;
group size; act order; symmetry and zero convention; dtypes; bias) and its inputs (integer codes,
zero points and scales of chosen magnitudes: subnormal, huge, negative, zero; activations with exact
rounding ties, zero rows, NaN/Inf), runs each example through the backend in its isolated worker
(``Runner.run_case`` with the drawn inputs sent as a bundle file) and judges it as every other tier
does. A ``fail``/``crash``/``timeout`` that no waiver covers fails the example, so Hypothesis shrinks
it; the minimal example becomes the family's one result line (tier ``property``) with a replay
bundle, and the first failing example found is kept next to it (``property.first_failure``).

The Hypothesis example database lives in ``OUT/hypothesis`` (keyed by backend label and family): a
rerun into the same folder replays the known failures first. ``seed`` makes a search reproducible;
without it the ``ci``/``smoke``/``certification`` profiles use seed 0 and ``nightly`` a fresh one
(recorded in the result line). A family where every example passed gets one ``pass``-kind line
counting the judged examples; one the backend never implements gets ``unsupported``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import time
from collections import Counter
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, Phase, given, reject, settings as hyp_settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import Unsatisfiable

from backends.base import SCHEMES, Case
from emulator.formats import mxfp4
from emulator.numerics.floats import round_to_dtype

from conformance.cases.inputs import CaseInputs, ct_tensor_dict, make_inputs  # noqa: F401 (ct_tensor_dict: re-used by int_weight_tensors)
from conformance.cases.generators import generate, int_weight_tensors, scales_array
from conformance.run.record import ResultRecord
from conformance.cases.specs import PROPERTY_TIER, CaseSpec
from conformance.judge.verdict import BAD, Verdict
from conformance.run.workerclient import WorkerClient

#: Hypothesis reports several distinct failures as an ExceptionGroup (Python 3.11+; on 3.10 its
#: backport's class, when installed, else nothing to catch)
try:
    _EXCEPTION_GROUP = ExceptionGroup  # noqa: F821 - a builtin from Python 3.11
except NameError:  # pragma: no cover - Python 3.10
    try:
        from exceptiongroup import ExceptionGroup as _EXCEPTION_GROUP
    except ImportError:
        _EXCEPTION_GROUP = ()

__all__ = ["PROPERTY_TIER", "PROPERTY_PROFILES", "families", "property_case", "property_inputs",
           "PropertySearch", "run_property"]

GENERATOR = "property"

#: profile -> examples per family and shape limits (M, N, K at most)
PROPERTY_PROFILES = {
    "smoke": {"examples": 4, "max_m": 4, "max_n": 40, "max_k": 128},
    "ci": {"examples": 20, "max_m": 8, "max_n": 72, "max_k": 256},
    "certification": {"examples": 40, "max_m": 16, "max_n": 136, "max_k": 512},
    "nightly": {"examples": 150, "max_m": 33, "max_n": 264, "max_k": 1024},
}

def families(schemes=None) -> list[tuple[str, str]]:
    """(scheme, weight format) pairs, in the suite's order; ``schemes`` restricts them."""
    return [(s.name, f) for s in SCHEMES.values() for f in s.formats if not schemes or s.name in schemes]


# -- cases -----------------------------------------------------------------------------------------
def _n_multiple(scheme: str, fmt: str, bits: int) -> int:
    """N must be a multiple of this: GPTQ packs qzeros along N, AWQ packs qweight along N."""
    if fmt == "gptq" or scheme == "w4a16-moe":
        return 32 // bits
    if fmt == "awq":
        return 8
    return 1


def _k_multiple(fmt: str, bits: int) -> int:
    """K must be a multiple of this (channel-wise): GPTQ packs qweight along K; MXFP4 blocks are 32 wide."""
    if fmt == "gptq":
        return 32 // bits
    if fmt == "ct-mxfp4":
        return 32
    return 1


@st.composite
def property_case(draw, scheme: str, fmt: str, max_m: int = 8, max_n: int = 72, max_k: int = 256) -> Case:
    """A valid case of one family. Draws shrink toward M = 1, the smallest N and K, group size 32,
    bf16 activations, symmetric weights, no act order and no bias."""
    m = draw(st.integers(1, max_m), label="M")
    if SCHEMES[scheme].quantize_only:  # activations alone (docs/conformance.md#quantize-only-cases)
        act = "float32" if scheme == "q-uint8-tensor" else draw(st.sampled_from(["bfloat16", "float16", "float32"]),
                                                                 label="act_dtype")
        if scheme == "q-mxfp4":
            return Case(scheme, fmt, m, 0, 32 * draw(st.integers(1, max(1, max_k // 32)), label="K/32"),
                        group_size=32, act_dtype=act)
        sym = scheme == "q-int8-token" and not draw(st.booleans(), label="asym")
        return Case(scheme, fmt, m, 0, draw(st.integers(1, max_k), label="K"), group_size=-1, sym=sym, act_dtype=act)
    act = draw(st.sampled_from(["bfloat16", "float16", "float32"]), label="act_dtype")
    if scheme == "w4a16-moe":
        g = draw(st.sampled_from([32, -1]), label="group_size")
        n = 32 * draw(st.integers(1, max(1, max_n // 32)), label="I/32")
        k = 32 * draw(st.integers(1, max(1, max_k // 32)), label="K/32")
        e = draw(st.integers(2, 6), label="E")
        top_k = draw(st.integers(1, min(2, e)), label="top_k")
        return Case(scheme, fmt, m, n, k, group_size=g, sym=True, act_dtype=act, E=e, top_k=top_k)
    bits = 8 if scheme in ("w8a16", "w8a8") else 4
    n_mult = _n_multiple(scheme, fmt, bits)
    n = n_mult * draw(st.integers(1, max(1, max_n // n_mult)), label="N")
    bias = draw(st.booleans(), label="bias")
    if fmt == "ct-mxfp4":
        k = 32 * draw(st.integers(1, max(1, max_k // 32)), label="K/32")
        return Case(scheme, fmt, m, n, k, group_size=32, act_dtype=act, bias=bias)
    if fmt == "ct-int-quantized":
        k = draw(st.integers(1, max_k), label="K")
        sd = draw(st.sampled_from(["float32", "bfloat16", "float16"]), label="scale_dtype")
        sym = draw(st.booleans(), label="act_sym") if scheme == "w8a8" else True
        return Case(scheme, fmt, m, n, k, group_size=-1, sym=sym, act_dtype=act, bias=bias, scale_dtype=sd)
    g = draw(st.sampled_from([g for g in (32, -1, 64, 128) if g <= max_k]), label="group_size")
    if g == -1:
        km = _k_multiple(fmt, bits)
        k = km * draw(st.integers(1, max(1, max_k // km)), label="K")
    else:
        k = g * draw(st.integers(1, max(1, max_k // g)), label="K/group")
    if scheme in ("w4a8", "w8a16"):
        sym = True
    elif fmt == "awq":
        sym = False
    else:
        sym = not draw(st.booleans(), label="asym")
    zc = None
    if fmt == "gptq":
        zc = "v1" if sym else draw(st.sampled_from(["v1", "v2"]), label="zero_convention")
    act_order = (g != -1 and fmt in ("gptq", "ct-pack-quantized") and scheme == "w4a16"
                 and draw(st.booleans(), label="act_order"))
    # GPTQ and AWQ checkpoints hold fp16/bf16 scales (docs/formats/gptq.md); compressed-tensors also fp32
    sd_choices = ["float16", "bfloat16"] + (["float32"] if fmt == "ct-pack-quantized" else [])
    sd = draw(st.sampled_from(sd_choices), label="scale_dtype")
    return Case(scheme, fmt, m, n, k, group_size=g, sym=sym, zero_convention=zc, act_order=act_order,
                act_dtype=act, bias=bias, bits=bits, scale_dtype=sd)


# -- inputs ----------------------------------------------------------------------------------------
#: exponent ranges (powers of two) of each scale magnitude, per scale dtype
_MAGNITUDES = {
    "normal": {"float16": (-8, -3), "bfloat16": (-8, -3), "float32": (-8, -3)},
    # subnormal in the scale's own dtype: the fp32 products underflow, which the acceptance interval
    # bounds with its absolute underflow term (docs/findings.md#interval-underflow)
    "subnormal": {"float16": (-24, -15), "bfloat16": (-133, -127), "float32": (-149, -127)},
    # huge, yet every fp32 partial sum stays finite (|x| < 2**14, |q - z| <= 2**8, K <= 2**10): the
    # acceptance interval bounds rounding error, not an accumulator that overflows before the end
    "huge": {"float16": (8, 14), "bfloat16": (40, 80), "float32": (40, 80)},
}


@st.composite
def _scales(draw, shape, dtype: str, rng, choices: dict) -> np.ndarray:
    """Scales (float64 holding ``dtype`` values) of a drawn magnitude, mantissa and sign pattern."""
    mag = choices["scale_magnitude"] = draw(st.sampled_from(["normal", "subnormal", "huge", "zero"]),
                                            label="scale_magnitude")
    if mag == "zero":
        s = np.zeros(shape)
        s[..., ::2] = 2.0 ** -5  # zero scales next to ordinary ones (valid: docs/formats/gptq.md#errors)
    else:
        lo, hi = _MAGNITUDES[mag][dtype]
        s = 2.0 ** rng.integers(lo, hi + 1, shape).astype(np.float64)
        choices["scale_mantissa"] = draw(st.sampled_from(["pow2", "full"]), label="scale_mantissa")
        if choices["scale_mantissa"] == "full":
            s = s * rng.uniform(1.0, 2.0, shape)
    sign = choices["scale_sign"] = draw(st.sampled_from(["positive", "some-negative", "negative"]), label="scale_sign")
    if sign == "negative":
        s = -s
    elif sign == "some-negative":
        s = np.where(rng.random(shape) < 0.5, -s, s)
    return round_to_dtype(s, dtype)


@st.composite
def _activations(draw, case: Case, rng, choices: dict) -> np.ndarray:
    """x [M, K] (float32 holding act_dtype values): a drawn distribution and power-of-two scale, exact
    rounding ties of the activation quantizer, zero rows and NaN/Inf where the scheme defines them."""
    M, K = case.M, case.K
    kinds = ["small-int", "gaussian", "heavy-tailed", "outlier-channels"]
    acts = case.spec.activations
    if acts == "int8":
        kinds += ["int8-ties", "int8-recip"]
    if acts == "mxfp4":
        kinds += ["e2m1-ties", "mx-boundaries", "mx-tiny-blocks"]
    kind = choices["x"] = draw(st.sampled_from(kinds), label="x_distribution")
    e = choices["x_exponent"] = draw(st.integers(-6, 4), label="x_exponent")
    if kind == "small-int":
        x = rng.integers(-3, 4, (M, K)).astype(np.float64)
    elif kind == "gaussian":
        x = rng.standard_normal((M, K))
    elif kind == "heavy-tailed":
        x = rng.standard_t(3, (M, K))
    elif kind == "outlier-channels":
        x = rng.standard_normal((M, K))
        ch = rng.choice(K, max(1, K // 64), replace=False)
        x[:, ch] *= rng.uniform(20, 100, len(ch))
    elif kind == "int8-ties":  # amax 127: every quotient x / (amax / 127) is k + 0.5 exactly
        x = rng.integers(-126, 126, (M, K)) + 0.5
        x[:, 0] = 127.0
    elif kind in ("int8-recip", "mx-boundaries", "mx-tiny-blocks"):
        # the edge tier's constructions as distributions: rows where x / scale and reciprocal forms round
        # apart; MX blocks on the scale-rule boundaries; MX blocks far below any epsilon
        x = generate(case, kind, int(rng.integers(0, 2 ** 31))).x.astype(np.float64)
        e = choices["x_exponent"] = 0  # their magnitudes are the point: not rescaled
    else:  # e2m1-ties: blocks with amax 6 (scale 1 under every rule) and elements on E2M1 midpoints
        mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
        x = rng.choice(mids, (M, K)) * rng.choice([-1.0, 1.0], (M, K))
        x[:, ::32] = 6.0
    x = x * 2.0 ** e
    choices["zero_row"] = draw(st.booleans(), label="zero_row")
    if choices["zero_row"]:
        x[0, :] = 0.0
        if M > 1:
            x[-1, ::3] = -0.0
    if acts in ("a16", "mxfp4"):
        special = choices["nonfinite"] = draw(st.sampled_from(["none", "nan", "inf", "-inf"]), label="nonfinite")
        if special != "none":
            r = draw(st.integers(0, M - 1), label="nonfinite_row")
            c = draw(st.integers(0, K - 1), label="nonfinite_col")
            choices["nonfinite_at"] = [r, c]
            x[r, c] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}[special]
    return round_to_dtype(x, case.act_dtype).astype(np.float32)


def _codes(draw, rng, lo: int, hi: int, shape, label: str, choices: dict) -> np.ndarray:
    if draw(st.sampled_from(["constant", "random"]), label=f"{label}_mode") == "constant":
        v = choices[label] = draw(st.integers(lo, hi), label=f"{label}_value")
        return np.full(shape, v)
    choices[label] = "random"
    return rng.integers(lo, hi + 1, shape)


@st.composite
def property_inputs(draw, case: Case) -> CaseInputs:
    """Inputs for ``case``: checkpoint tensors packed by the emulator from drawn codes and scales,
    drawn activations, bias and router logits. Every random part comes from one drawn NumPy seed;
    the structure (constant or random codes, scale magnitude, sign, distribution) is drawn by
    Hypothesis, so a shrunk example says which of these the failure needs."""
    choices: dict = {"numpy_seed": draw(st.integers(0, 2 ** 32 - 1), label="numpy_seed")}
    rng = np.random.default_rng(choices["numpy_seed"])
    N, K = case.N, case.K
    bias = None
    if case.bias:
        bias = round_to_dtype(rng.standard_normal(N) * 0.1, case.act_dtype).astype(np.float32)
    fmt = case.weight_format
    logits = None
    if case.spec.quantize_only:
        x = draw(_activations(case, rng, choices))
        inp = CaseInputs(case, 0, {}, x)
        inp.choices = choices
        return inp
    if case.scheme == "w4a16-moe":
        base = make_inputs(case, int(rng.integers(0, 2 ** 31)))
        tensors, logits = base.tensors, base.router_logits
        choices["router_ties"] = draw(st.booleans(), label="router_ties")
        if choices["router_ties"]:  # two experts share the k-th largest logit exactly
            logits = np.zeros_like(logits)
            logits[:, : case.top_k - 1] = 1.0
    elif fmt in ("gptq", "awq", "ct-pack-quantized"):
        maxq = (1 << case.bits) - 1
        q = _codes(draw, rng, 0, maxq, (N, K), "q", choices)
        G = K // case.group
        if case.sym:
            z = np.full((G, N), 1 << (case.bits - 1))
            if fmt == "gptq" and case.scheme != "w4a16-moe":
                # a sym checkpoint whose stored qzeros are not the midpoint: canonical readers use them
                choices["sym_qzeros"] = draw(st.sampled_from(["midpoint", "not-midpoint"]), label="sym_qzeros")
                if choices["sym_qzeros"] == "not-midpoint":
                    z[0, :] = (1 << (case.bits - 1)) - 1
        else:  # GPTQ v1 cannot store a zero point 0 canonically (the edge tier covers that field)
            z = _codes(draw, rng, 1 if case.zero_convention == "v1" else 0, maxq, (G, N), "zero", choices)
        s = draw(_scales((G, N), case.scale_dtype, rng, choices))
        g_idx = (rng.permutation(K) // case.group).astype(np.int32) if case.act_order else None
        tensors = int_weight_tensors(case, q, z, s, g_idx)
    elif fmt == "ct-int-quantized":
        wq = _codes(draw, rng, -128, 127, (N, K), "q", choices).astype(np.int8)
        ws = draw(_scales((N, 1), case.scale_dtype, rng, choices))
        tensors = {"weight": wq, "weight_scale": scales_array(ws, case.scale_dtype)}
    else:  # ct-mxfp4
        codes = _codes(draw, rng, 0, 15, (N, K), "code", choices).astype(np.uint8)
        mode = choices["e8m0_scales"] = draw(st.sampled_from(["unit", "near", "wide", "extremes"]), label="e8m0_scales")
        sb = {"unit": lambda: np.full((N, K // 32), 127),
              "near": lambda: rng.integers(124, 130, (N, K // 32)),
              # 2^-40..2^40 and 0x00 (2^-127), 0xFF (NaN): as with "huge" int scales, fp32 partial sums stay
              # finite (0xFE = 2^127 overflows them; the edge tier's e8m0-extremes pairs it with tiny codes)
              "wide": lambda: rng.integers(127 - 40, 127 + 41, (N, K // 32)),
              "extremes": lambda: rng.choice(np.array([0x00, 0x7F, 0xFF]), (N, K // 32))}[mode]()
        tensors = mxfp4.pack_mxfp4_ct(codes, sb.astype(np.uint8))
    x = draw(_activations(case, rng, choices))
    inp = CaseInputs(case, 0, tensors, x, bias, logits)
    inp.choices = choices  # what the shrunk example needs (describe_example)
    return inp


def _digest(inp: CaseInputs) -> int:
    """A 32-bit id of the inputs (the ``seed`` of a property spec): equal inputs, equal case ids."""
    h = hashlib.sha256()
    for k in sorted(inp.tensors):
        h.update(k.encode() + np.ascontiguousarray(inp.tensors[k]).tobytes())
    for a in (inp.x, inp.bias, inp.router_logits):
        if a is not None:
            h.update(np.ascontiguousarray(a).tobytes())
    return int.from_bytes(h.digest()[:4], "little")


def describe_example(inp: CaseInputs) -> dict:
    """The case and the drawn choices of one example (what the closing note and docs/findings show)."""
    c = inp.case
    return {"case": c.describe(), "scale_dtype": c.scale_dtype, "bias": c.bias, "size": c.M * c.N * c.K,
            "choices": dict(getattr(inp, "choices", {}))}


class _Failure(Exception):
    """Raised inside the search for a non-pass verdict no waiver covers: Hypothesis shrinks it."""


_FAILURE_TYPES: dict = {}


def failure_signature(rec: dict, inp: "CaseInputs | None" = None) -> str:
    """What kind of failure a record is: the verdict, and for a crash the exception or signal named
    first in its reason. Each signature is searched and shrunk on its own (one minimal example each),
    so a crash that is easy to hit does not hide a wrong answer of the same family."""
    verdict = rec["verdict"]
    if verdict == Verdict.CRASH:
        head = str(rec.get("reason") or "").split(":")[0].strip()
        return f"crash-{head.split()[0] if head else 'unknown'}"[:60]
    if verdict == Verdict.FAIL:
        reason = str(rec.get("reason", ""))
        if reason.startswith("malformed"):
            return "fail-malformed"
        worst = (rec.get("metrics") or {}).get("worst_element") or {}
        if "NaN or infinite" in reason or not all(np.isfinite(worst.get(k, 0.0)) for k in ("expected", "lo", "hi")):
            # where the reference is NaN or infinite: from NaN/Inf inputs (the NaN/Inf policy), or overflow
            if inp is not None and not all(np.isfinite(a).all() for a in (inp.x, inp.bias) if a is not None):
                return "fail-nonfinite-input"
            return "fail-overflow"
        if "SQNR" in reason:  # opaque arithmetic below its declared floor
            return "fail-sqnr"
        return "fail-interval"
    return verdict


def _failure_type(signature: str) -> type:
    """One exception class per signature: Hypothesis tells bugs apart by the exception's type."""
    if signature not in _FAILURE_TYPES:
        _FAILURE_TYPES[signature] = type(f"PropertyFailure[{signature}]", (_Failure,), {})
    return _FAILURE_TYPES[signature]


# -- the search ------------------------------------------------------------------------------------
@dataclasses.dataclass
class PropertySearch:
    """One backend's property searches, run through ``runner`` (conformance.run.runner.Runner) in one worker."""

    runner: object
    backend_spec: str
    label: str
    profile: str = "ci"
    seed: "int | None" = None
    max_examples: "int | None" = None
    #: optional predicate on a drawn Case: False rejects it (the self-test: only cases a mutant's bug lives in)
    case_filter: object = None

    def __post_init__(self):
        if self.profile not in PROPERTY_PROFILES:
            raise ValueError(f"unknown profile {self.profile!r}; known: {', '.join(PROPERTY_PROFILES)}")
        if self.seed is None:
            self.seed = int(time.time()) if self.profile == "nightly" else 0
        self.limits = dict(PROPERTY_PROFILES[self.profile])
        if self.max_examples is not None:
            self.limits["examples"] = int(self.max_examples)

    def database(self) -> DirectoryBasedExampleDatabase:
        return DirectoryBasedExampleDatabase(str(Path(self.runner.out_dir) / "hypothesis"))

    def run_family(self, worker, scheme: str, fmt: str, tmpdir: Path, today: str) -> list[dict]:
        """The family's result lines: one per failure signature found (its shrunk example), else one
        line for the whole search (pass-kind, or unsupported when no example was judged)."""
        runner, label = self.runner, self.label
        lim = self.limits
        st_ = {"calls": 0, "judged": 0, "unsupported": 0, "waived": 0, "verdicts": Counter(), "found": {},
               "refusals": Counter(), "levels": [], "deviations": {}, "semantic_unwaived": 0,
               "deviation_waiver": None}

        def judge_example(data) -> None:
            st_["calls"] += 1
            case = data.draw(property_case(scheme, fmt, lim["max_m"], lim["max_n"], lim["max_k"]), label="case")
            if self.case_filter is not None and not self.case_filter(case):
                reject()
            plan = WorkerClient(worker, runner.timeout).plan(CaseSpec(case, PROPERTY_TIER, GENERATOR, 0))
            if plan.failure is None and not plan.supported:
                st_["unsupported"] += 1
                st_["refusals"][plan.reason[:200]] += 1
                reject()
            inp = data.draw(property_inputs(case), label="inputs")
            spec = CaseSpec(case, PROPERTY_TIER, GENERATOR, _digest(inp))
            rec = runner.run_case(worker, label, spec, tmpdir, today=today, inp=inp, write_bundle=False)
            st_["verdicts"][rec["verdict"]] += 1
            if rec.get("level") and rec["verdict"] != Verdict.UNSUPPORTED:  # the family's level: its farthest example's
                st_["levels"].append(rec["level"])
                for d in rec.get("deviations") or []:
                    st_["deviations"][d["variant"]] = d["level"]
                if rec["level"] == "semantic":
                    if rec.get("deviation_waiver"):
                        st_["deviation_waiver"] = rec["deviation_waiver"]
                    else:
                        st_["semantic_unwaived"] += 1
            if rec["verdict"] == Verdict.WAIVED:
                st_["waived"] += 1
                st_["waived_rec"] = rec
            if rec["verdict"] in BAD:
                ex = {"spec": spec, "inp": inp, "rec": rec}
                sig = failure_signature(rec, inp)
                found = st_["found"].setdefault(sig, {"first": ex})
                found["last"] = ex
                raise _failure_type(sig)(sig)
            # judged: an example whose verdict says something of the kernel (not refused, not a reference that
            # proves nothing, not a known defect)
            if not Verdict.parse(rec["verdict"]).neutral and rec["verdict"] != Verdict.WAIVED:
                st_["judged"] += 1

        test = given(st.data())(judge_example)
        test = hyp_settings(max_examples=lim["examples"], database=self.database(), deadline=None,
                            derandomize=False, report_multiple_bugs=True, print_blob=False,
                            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
                            suppress_health_check=list(HealthCheck))(test)
        # what hypothesis.seed() does, less its side effect of switching the example database off: the
        # database in OUT/hypothesis is what makes a rerun start from the known failures
        test._hypothesis_internal_use_seed = self.seed
        test._hypothesis_internal_database_key = f"qconform-property/{label}/{scheme}/{fmt}".encode()
        t0 = time.perf_counter()
        outcome = "passed"
        try:
            test()
        except (_Failure, _EXCEPTION_GROUP) as e:
            outcome = "failed"
            if isinstance(e, _EXCEPTION_GROUP) and not all(isinstance(x, _Failure) for x in e.exceptions):
                raise
        except Unsatisfiable:
            outcome = "unsatisfiable"
        except Exception as e:  # noqa: BLE001 - Hypothesis's Flaky (a failure that did not repeat) and the like
            if not st_["found"]:
                raise
            outcome = f"flaky ({type(e).__name__})"
        seconds = time.perf_counter() - t0
        info = {"family": f"{scheme}/{fmt}", "seed": self.seed, "profile": self.profile,
                "max_examples": lim["examples"], "calls": st_["calls"], "judged": st_["judged"],
                "unsupported": st_["unsupported"], "waived": st_["waived"], "verdicts": dict(st_["verdicts"]),
                "database": str(Path(runner.out_dir) / "hypothesis"), "search_s": round(seconds, 2),
                "outcome": outcome}
        if st_["found"]:
            return [self._minimal_record(worker, tmpdir, today, found, dict(info, signature=sig))
                    for sig, found in st_["found"].items()]
        family_spec = f"{PROPERTY_TIER}/{scheme}/{fmt}/search/seed{self.seed}"
        if st_["judged"] == 0:
            why = (f"no example of {scheme}/{fmt} was judged ({st_['unsupported']} refused, "
                   f"{st_['waived']} waived, verdicts {dict(st_['verdicts'])})")
            if st_["refusals"]:
                why += "; refusal: " + st_["refusals"].most_common(1)[0][0]
            return [self._family_record(family_spec, scheme, fmt, Verdict.UNSUPPORTED, why, info, seconds)]
        # the family's verdict: the weakest of its judged examples' (none failed; mistrusted ones say nothing)
        worst = Verdict.worst(v for v, n in st_["verdicts"].items()
                              if n and (Verdict.parse(v).passing or v == Verdict.PASS_SQNR)) or Verdict.PASS
        reason = (f"{st_['judged']} Hypothesis example(s) of {scheme}/{fmt} judged, none failed "
                  f"(seed {self.seed}, {st_['unsupported']} refused, {st_['waived']} waived)")
        rec = self._family_record(family_spec, scheme, fmt, worst, reason, info, seconds, st_)
        if st_["waived"]:  # a known defect was hit: the family is reported waived, never plain pass
            rec.update(verdict=Verdict.WAIVED.value, waived_verdict=st_["waived_rec"].get("waived_verdict"),
                       waiver=st_["waived_rec"].get("waiver"),
                       reason=f"{st_['waived']} example(s) failed and were waived "
                              f"({st_['waived_rec'].get('waiver', {}).get('issue')}); {reason}")
        return [rec]

    def _family_record(self, case_id, scheme, fmt, verdict, reason, info, seconds, st_=None) -> dict:
        rec = ResultRecord(self.label, case_id, PROPERTY_TIER, scheme, fmt, GENERATOR, verdict, reason,
                           property=info, seconds=seconds).to_json()
        if st_ is not None and st_["levels"]:
            # the family's conformance level (docs/conformance.md#levels): the farthest of its judged examples;
            # a semantic deviation counts as accepted only when a waiver accepted it on every such example
            from conformance.judge.levels import run_level

            rec["level"] = run_level(st_["levels"])
            rec["deviations"] = [{"variant": v, "level": lv} for v, lv in sorted(st_["deviations"].items())]
            if rec["level"] == "semantic" and not st_["semantic_unwaived"] and st_["deviation_waiver"]:
                rec["deviation_waiver"] = st_["deviation_waiver"]
        return rec

    def _minimal_record(self, worker, tmpdir, today, st_: dict, info) -> dict:
        """The shrunk example, judged once more with its replay bundle written (a failure that does not
        repeat is reported as such, with the failing record kept)."""
        last, first = st_["last"], st_["first"]
        rec = self.runner.run_case(worker, self.label, last["spec"], tmpdir, today=today, inp=last["inp"],
                                   write_bundle=True)
        if rec["verdict"] not in BAD:
            kept = dict(last["rec"])
            kept["reason"] = (f"{kept.get('reason', '')} (did not repeat on a rerun: verdict {rec['verdict']}; "
                              f"the backend is not deterministic on this example)")
            rec = kept
            rec["bundle"] = str(self.runner.write_replay_bundle(self.label, last["spec"], last["inp"], None,
                                                                rec["verdict"], rec["reason"]))
        info = dict(info, minimal=describe_example(last["inp"]), first_failure=describe_example(first["inp"]),
                    first_failure_case_id=first["spec"].case_id)
        rec["property"] = info
        return rec


def run_property(runner, backend_specs: list[str], *, profile: str = "ci", seed: "int | None" = None,
                 schemes=None, max_examples: "int | None" = None, stop_at_first_failure: bool = False,
                 case_filter=None) -> list[dict]:
    """Run the property tier for each backend through ``runner``; one result line per (backend, family).

    A backend that is unavailable gets one ``unsupported`` line per family, as ``Runner.run`` does.
    ``stop_at_first_failure`` (the mutation self-test): a backend's remaining families are skipped
    after its first failing one.
    """
    results = []
    today = time.strftime("%Y-%m-%d")
    for bspec in backend_specs:
        hello = runner.hello(bspec)
        label = hello.get("label", bspec)
        search = PropertySearch(runner, bspec, label, profile, seed, max_examples, case_filter)
        worker = runner.open_worker(bspec)
        tmpdir = Path(runner.out_dir) / ".work" / f"property-{label}".replace("/", "_").replace(":", "_")
        tmpdir.mkdir(parents=True, exist_ok=True)
        try:
            for scheme, fmt in families(schemes):
                if not hello.get("ok") or not hello.get("available"):
                    reason = hello.get("reason") or hello.get("error") or "unavailable"
                    recs = [search._family_record(f"{PROPERTY_TIER}/{scheme}/{fmt}/search/seed{search.seed}", scheme,
                                                  fmt, Verdict.UNSUPPORTED, f"backend unavailable: {reason}",
                                                  {"family": f"{scheme}/{fmt}", "seed": search.seed}, 0.0)]
                else:
                    recs = search.run_family(worker, scheme, fmt, tmpdir, today)
                for rec in recs:
                    runner.write_result(rec)
                    results.append(rec)
                if stop_at_first_failure and any(r["verdict"] in BAD for r in recs):
                    break
        finally:
            worker.close()
            shutil.rmtree(tmpdir, ignore_errors=True)
            try:
                (Path(runner.out_dir) / ".work").rmdir()
            except OSError:
                pass
    return results


def mutant_kills(names, out_dir: "str | Path", *, profile: str = "ci", seed: "int | None" = None,
                 timeout: float = 120.0) -> dict:
    """The mutation self-test for this tier (docs/selftest.md): each mutant of conformance/selftest/doubles/mutants.py
    runs in a worker (``mutant:bug=NAME``), searched over the families of its schemes until one fails.

    Returns {name: {"killed": bool, "family": ..., "verdict": ..., "minimal": ..., "first_failure": ...,
    "calls": ...}}. The control (``none``) must survive: it shows the kills come from the bugs.
    """
    from conformance.selftest.doubles.mutants import EXTRA_BACKENDS_ENTRY, MUTANTS

    from conformance.run.runner import Runner

    extra = os.environ.get("QCONFORM_EXTRA_BACKENDS", "")
    env = {"QCONFORM_EXTRA_BACKENDS": ",".join(x for x in (extra, EXTRA_BACKENDS_ENTRY) if x)}
    out = {}
    for name in names:
        schemes = MUTANTS[name].schemes if name in MUTANTS else None
        runner = Runner(Path(out_dir) / name, timeout=timeout, progress=False, worker_env=env)
        recs = run_property(runner, [f"mutant:bug={name}"], profile=profile, seed=seed, schemes=schemes,
                            stop_at_first_failure=True,
                            case_filter=_mutant_filter(MUTANTS.get(name)))
        bad = [r for r in recs if r["verdict"] in BAD]
        info = {"killed": bool(bad), "families": len(recs),
                "calls": sum((r.get("property") or {}).get("calls", 0) for r in recs)}
        if bad:
            p = bad[0].get("property") or {}
            info.update(family=p.get("family"), verdict=bad[0]["verdict"], case_id=bad[0]["case_id"],
                        minimal=p.get("minimal"), first_failure=p.get("first_failure"))
        out[name] = info
    return out


def _mutant_filter(mutant):
    """The cases a mutant's bug lives in. Its int8 stage is a symmetric quantizer (the seeded suite's
    W8A8 is symmetric), so asymmetric-activation cases are left out for mutants that replace it: they
    would be killed by the symmetry, not by their bug."""
    if mutant is None:
        return None
    return lambda c: mutant.applies(c) and (c.act_symmetric or mutant.int8 is None)
