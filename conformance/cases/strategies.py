"""Hypothesis strategies for the random tier, public and composable (vendors reuse them).

Semantics: docs/conformance.md#tiers.

    from hypothesis import given
    from conformance.cases.strategies import case_inputs
    from conformance.run.inprocess import judge_inputs

    @given(case_inputs(schemes=["w4a16"], formats=["gptq"]))
    def test_my_kernel(inp):
        rec = judge_inputs("mykernel", inp)        # in-process; use the runner for crashy kernels
        assert rec["verdict"] in ("pass", "pass-with-tie-flips"), rec["reason"]

Profiles (tests/conftest.py): ``ci`` is derandomised and bounded; ``nightly`` draws
fresh examples, many more of them, and ``judge_inputs(..., target=True)`` reports the
error/bound ratio to ``hypothesis.target`` so the search climbs toward the worst case.

Distributions follow what LLM activations look like: Gaussian; heavy-tailed (Student-t,
3 degrees of freedom); a few outlier channels 20x–100x larger than the rest (Dettmers et
al., LLM.int8(), arXiv:2208.07339, §3); plus exact ties and all-zero rows drawn on purpose.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from backends.base import Case

from conformance.cases.inputs import CaseInputs, make_inputs
from conformance.cases.generators import GENERATORS

__all__ = ["DISTRIBUTIONS", "activations", "cases", "case_inputs"]

DISTRIBUTIONS = ("gaussian", "heavy_tailed", "outlier_channels", "int8_ties", "zero_rows")

_SCHEME_FORMATS = {
    "w4a16": ("gptq", "awq", "ct-pack-quantized"),
    "w8a16": ("gptq", "ct-int-quantized"),
    "w8a8": ("ct-int-quantized",),
    "w4a8": ("gptq", "ct-pack-quantized"),
    "w4a16-mxfp4": ("ct-mxfp4",),
    "w4a4-mxfp4": ("ct-mxfp4",),
    "w4a16-moe": ("gptq",),
}


@st.composite
def activations(draw, m: int, k: int, dtype: str = "bfloat16", distributions=DISTRIBUTIONS) -> np.ndarray:
    """x [m, k] as float32 holding ``dtype`` values, from one of the LLM-like distributions."""
    from emulator.numerics.floats import round_to_dtype

    dist = draw(st.sampled_from(list(distributions)))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    rng = np.random.default_rng(seed)
    scale = 2.0 ** draw(st.integers(-6, 4))
    if dist == "gaussian":
        x = rng.standard_normal((m, k))
    elif dist == "heavy_tailed":
        x = rng.standard_t(3, (m, k))
    elif dist == "outlier_channels":
        x = rng.standard_normal((m, k))
        ch = rng.choice(k, max(1, k // 64), replace=False)
        x[:, ch] *= rng.uniform(20, 100, len(ch))
    elif dist == "int8_ties":
        x = (rng.integers(-126, 126, (m, k)) + 0.5) / 128.0
        x[:, 0] = 127 / 128.0  # amax = 127 * 2**-7: every quotient is k + 0.5 exactly
    else:  # zero_rows
        x = rng.standard_normal((m, k))
        x[rng.random(m) < 0.5] = 0.0
    return round_to_dtype(x * scale, dtype).astype(np.float32)


@st.composite
def cases(draw, schemes=None, formats=None, max_m: int = 16, max_n: int = 256, max_k: int = 512) -> Case:
    """A valid Case: scheme, format, group size, symmetry, zero convention, dtypes, shapes."""
    scheme = draw(st.sampled_from(sorted(schemes or _SCHEME_FORMATS)))
    fmts = [f for f in _SCHEME_FORMATS[scheme] if not formats or f in formats]
    if not fmts:
        raise ValueError(f"no format of {formats} serves scheme {scheme}")
    fmt = draw(st.sampled_from(fmts))
    k = 32 * draw(st.integers(1, max_k // 32))
    n = 8 * draw(st.integers(1, max_n // 8))
    m = draw(st.integers(1, max_m))
    act = draw(st.sampled_from(["bfloat16", "float16", "float32"]))
    if scheme == "w4a16-moe":
        g = 32
        return Case(scheme, fmt, m, max(32, n - n % 32), k, group_size=g, sym=True, act_dtype=act,
                    E=draw(st.integers(2, 6)), top_k=2)
    if fmt in ("ct-mxfp4",):
        return Case(scheme, fmt, m, n, k, group_size=32, act_dtype=act)
    if fmt == "ct-int-quantized":
        return Case(scheme, fmt, m, n, k, group_size=-1, act_dtype=act, bias=draw(st.booleans()))
    bits = 8 if scheme == "w8a16" else 4
    groups = [g for g in (32, 64, 128, -1) if g == -1 or k % g == 0]
    g = draw(st.sampled_from(groups))
    sym = True if scheme in ("w4a8", "w8a16") else draw(st.booleans())
    if fmt == "awq":
        sym = False
    zc = None
    act_order = False
    if fmt == "gptq":
        zc = "v1" if sym else draw(st.sampled_from(["v1", "v2"]))
        act_order = g != -1 and scheme == "w4a16" and draw(st.booleans())
    return Case(scheme, fmt, m, n, k, group_size=g, sym=sym, zero_convention=zc, act_order=act_order,
                act_dtype=act, bias=draw(st.booleans()), bits=bits)


@st.composite
def case_inputs(draw, schemes=None, formats=None, distributions=DISTRIBUTIONS, **shape_limits) -> CaseInputs:
    """Inputs for a drawn case: seeded weights (with degenerate groups) and drawn activations."""
    case = draw(cases(schemes=schemes, formats=formats, **shape_limits))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    inp = make_inputs(case, seed)
    inp.x = draw(activations(case.M, case.K, case.act_dtype, distributions))
    return inp


#: the tier names of the seeded random generators (the runner's random tier) kept in step with these
RANDOM_GENERATORS = tuple(n for n, (tier, _, _) in GENERATORS.items() if tier == "random")
