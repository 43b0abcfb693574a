"""``tensor_levels.activation_deviation`` (the fast quantizer and the codes-and-scales bound) against the judgement
formed by the definition: both int8 quantizations by ``int8.quantize_int8_per_token``, dequantized exactly, every
element compared with 2 canonical steps (docs/fallback.md#the-dispatcher). Oracle independent of the fast code:
the definition and a plain NumPy comparison. Same verdict and same count of far activations, on inputs where the
bound decides (ordinary rows, where zentorch's bf16 dequantization scale moves nothing), where it cannot (rows below
an amax clamp, a zero row under a NaN rule, huge values, ties under another tie rule) and on random inputs."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from emulator.activations import int8 as a8
from emulator.declaration import Declared, int8_variant
from emulator.schemes import Case
from emulator.tensor_levels import STEPS, activation_deviation

DECLARED = {
    "zentorch": {"act_dequant_scale_dtype": "bfloat16", "zero_row": "eps", "eps": 127e-10},
    "clamp 1e-5": {"zero_row": "eps", "eps": 1e-5},
    "nan rule": {"zero_row": "nan", "nan_to_int": "zero"},
    "rhaz": {"act_rounding": "rhaz"},
    "recip bf16 scale": {"reciprocal": "recip_scale", "act_scale_dtype": "bfloat16"},
    "fp16 dequant scale": {"act_dequant_scale_dtype": "float16"},
    "qmin -127": {"qmin": -127},
    "qmax 100": {"qmax": 100},  # the same scales, codes up to 27 apart: the codes decide
}


def _far_by_definition(declared: Declared, case: Case, x: np.ndarray) -> int | None:
    """How many dequantized activations the declared quantizer moves beyond STEPS canonical steps (None: the
    canonical quantizer raises, nothing to judge)."""
    try:
        ref_a = a8.quantize_int8_per_token(x, int8_variant(Declared(variants={}), case))
    except Exception:  # noqa: BLE001 - NaN input
        return None
    got_a = a8.quantize_int8_per_token(x, int8_variant(declared, case))
    ref, got = a8.dequantize_int8_per_token(ref_a), a8.dequantize_int8_per_token(got_a)
    step = np.abs(ref_a.scale.astype(np.float64))
    with np.errstate(all="ignore"):
        far = np.zeros(ref.shape, bool)
        for i, j in np.ndindex(ref.shape):
            r, g = ref[i, j], got[i, j]
            if np.isfinite(r) and np.isfinite(g):
                far[i, j] = abs(g - r) > STEPS * step[i, 0]
            else:
                far[i, j] = not (r == g or (np.isnan(r) and np.isnan(g)))
    return int(far.sum())


def _check(variants: dict, x: np.ndarray) -> None:
    declared = Declared(variants=variants)
    case = Case("w8a8", "ct-int-quantized", x.shape[0], 16, x.shape[1], group_size=-1, act_dtype="float32")
    want = _far_by_definition(declared, case, x)
    got = activation_deviation(declared, case, x)
    if not want:
        assert got is None, (variants, got)
        return
    assert got is not None, (variants, want)
    assert int(re.search(r"moves (\d+) of", got).group(1)) == want


def _inputs() -> dict:
    rng = np.random.default_rng(3)
    special = (rng.standard_normal((6, 24)) * 3).astype(np.float32)
    special[1] = 1e-12 * np.linspace(-1, 1, 24)  # below zentorch's and the 1e-5 clamp
    special[2] = 0.0
    special[3, :3] = [3e38, -3e38, 1.0]
    special[4] = (np.arange(24) - 11.5) * np.float32(2.0 ** -3)  # quotient ties where amax = 127 steps
    special[4, 0] = 127 * 2.0 ** -3
    return {"ordinary": (rng.standard_normal((5, 40)) * 7).astype(np.float32), "special": special}


@pytest.mark.parametrize("name", list(DECLARED))
@pytest.mark.parametrize("which", ["ordinary", "special"])
def test_same_verdict_as_the_definition(name, which):
    _check(DECLARED[name], _inputs()[which])


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, st.tuples(st.integers(1, 4), st.integers(1, 24)),
                  elements=st.one_of(st.floats(width=32, allow_nan=False), st.floats(-2.0 ** -30, 2.0 ** -30, width=32))),
       st.sampled_from(list(DECLARED)))
def test_random_inputs(x, name):
    _check(DECLARED[name], x)
