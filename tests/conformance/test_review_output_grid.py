"""False green: an output that is not a value of the declared output dtype (review of the judge).

A kernel declaring bfloat16 (or float16) output but returning float32 values passed any element whose
judged interval spans two grid values: the judge compared values, never their grid. The oracle is
ml_dtypes / torch: a value is on the bf16 grid exactly when converting it to bf16 and back is the
identity.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from backends.base import Case, Declared
from conformance.judge.acceptance import declared_interval
from conformance.judge.output_grid import off_grid
from conformance.cases.inputs import make_inputs
from conformance.run.runner import judge, rounded_interval

GOOD = ("pass", "pass-with-tie-flips", "quality-warning", "pass-sqnr")


def _inputs(out_dtype: str):
    case = Case("w4a16", "gptq", 8, 64, 512, group_size=128, sym=False, zero_convention="v2",
                act_dtype="bfloat16" if out_dtype == "bfloat16" else "float16", out_dtype=out_dtype)
    return make_inputs(case, seed=3)


@pytest.mark.parametrize("out_dtype,native", [("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16)])
def test_between_grid_values_fails(out_dtype, native):
    inp = _inputs(out_dtype)
    d = Declared(variants={}, output=out_dtype)
    iv = declared_interval(inp, d)
    judged = rounded_interval(iv, d)
    y = judged.y_ref.astype(np.float32)
    wide = np.isfinite(judged.lo) & (judged.hi > judged.lo)
    assert wide.any(), "the case needs an element whose interval holds two grid values"
    y[wide] = ((judged.lo[wide] + judged.hi[wide]) / 2).astype(np.float32)  # float32, strictly between
    idx = tuple(np.argwhere(wide)[0])
    # independent oracle: the planted value is not a value of the output dtype
    assert float(np.float32(y[idx]).astype(native).astype(np.float32)) != float(y[idx])
    assert (y[wide] >= judged.lo[wide]).all() and (y[wide] <= judged.hi[wide]).all()  # inside the interval
    rec = judge(inp, iv, y, d).record()
    assert rec["verdict"] == "fail", rec
    assert out_dtype in rec["reason"] and "grid" in rec["reason"]
    assert rec["worst_element"]["index"] in [list(map(int, i)) for i in np.argwhere(wide)]


def test_on_grid_output_still_passes():
    """Control: the same interval's reference (on the grid) passes."""
    inp = _inputs("bfloat16")
    d = Declared(variants={}, output="bfloat16")
    iv = declared_interval(inp, d)
    y = torch.from_numpy(rounded_interval(iv, d).y_ref.astype(np.float32)).to(torch.bfloat16).float().numpy()
    assert judge(inp, iv, y, d).verdict in GOOD


def test_off_grid_against_torch():
    """off_grid agrees with torch's conversion round trip on random float32 values, specials included."""
    rng = np.random.default_rng(0)
    v = np.concatenate([rng.standard_normal(4000).astype(np.float32) * 10.0 ** rng.integers(-8, 8, 4000),
                        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 1e-8, 6e-8], np.float32)])
    v = v.astype(np.float32)
    v = np.concatenate([v, torch.from_numpy(v).to(torch.bfloat16).float().numpy()])
    for name, td in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        t = torch.from_numpy(v)
        with np.errstate(invalid="ignore"):
            expect = np.isfinite(v) & (t.to(td).float().numpy() != v)
        assert np.array_equal(off_grid(v, name), expect), name
    assert not off_grid(v, "float32").any()


def test_verify_bundle_recomputes_the_grid_check():
    """verify-bundle's recomputed verdict (conformance/certify/offline.py) applies the same rule: a stored
    bfloat16 output between two grid values, inside the stored interval, is a failure there too."""
    from conformance.certify.offline import offline_verdict

    lo = np.array([[1.0, 2.0]])
    hi = np.array([[1.0078125, 2.0]])  # two bf16 values: 1 and 1 + 2^-7
    d = {"y_ref": np.array([[1.0, 2.0]]), "y_exact_proxy": np.array([[1.003, 2.0]]), "lo": lo, "hi": hi,
         "jlo": lo, "jhi": hi, "y": np.array([[1.00390625, 2.0]], np.float32)}  # 1 + 2^-8: not a bf16 value
    assert float(ml_dtypes.bfloat16(1.00390625)) != 1.00390625
    rec = offline_verdict(d, {"dtype": "bfloat16", "bound_positive": True}, {"variants": {}}).record()
    assert rec["verdict"] == "fail" and "bfloat16" in rec["reason"], rec
    d["y"] = np.array([[1.0078125, 2.0]], np.float32)  # control: the grid value passes
    assert offline_verdict(d, {"dtype": "bfloat16", "bound_positive": True}, {"variants": {}}).verdict != "fail"
