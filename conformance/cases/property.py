"""The property tier's strategies: the families, and the Hypothesis draws of a case and of its inputs.

The search that runs them through the runner is conformance/run/property_search.py.

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

import hashlib

import numpy as np
from hypothesis import strategies as st

from backends.base import SCHEMES, Case
from emulator.formats import mxfp4
from emulator.numerics.floats import round_to_dtype

from conformance.cases.inputs import CaseInputs, ct_tensor_dict, make_inputs  # noqa: F401 (ct_tensor_dict: re-used by int_weight_tensors)
from conformance.cases.generators import generate, int_weight_tensors, scales_array
from conformance.cases.specs import PROPERTY_TIER

__all__ = ["PROPERTY_TIER", "PROPERTY_PROFILES", "families", "property_case", "property_inputs",
           "describe_example", "example_digest"]

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


def example_digest(inp: CaseInputs) -> int:
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
