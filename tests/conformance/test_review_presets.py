"""Review: a preset named after a library never silently differs from that library.

compressed-tensors' MXFP4 activation quantizer computes its E8M0 scales in x's own dtype; in float16 a block
whose amax is subnormal (or zero) gets the scale 1.0 and all-zero codes (its round_to_power_2 masks the
float16 bits: compressed_tensors/quantization/utils/mxfp_utils.py). The preset compressed-tensors-mxfp4-act
was checked against the library for float32 and bfloat16 only, and `qconform quantize --preset` on float16
input wrote other scales and codes under the library's name. Either it equals the library or it refuses
(exit 2, one line).
"""

from __future__ import annotations

import numpy as np
import pytest

import test_quantize_cli as q


def test_ct_mxfp4_preset_on_float16_equals_the_library_or_refuses(capsys, tmp_path):
    pytest.importorskip("compressed_tensors")
    rng = np.random.default_rng(0)
    x = np.stack([np.zeros(32), rng.standard_normal(32) * 2.0 ** -20, rng.standard_normal(32)]).astype(np.float16)
    x = x.astype(np.float32)
    codes, sb = q._ct_mxfp4(x, "float16")
    rc, out, text = q._quantize(capsys, tmp_path, x, "float16", "--preset", "compressed-tensors-mxfp4-act")
    if rc == 0:
        assert np.array_equal(out["scale"], sb) and np.array_equal(out["codes"], codes), (out["scale"], sb)
    else:
        assert rc == 2 and "float16" in text and "Traceback" not in text and len(text.strip().splitlines()) == 1, text


def test_ct_mxfp4_preset_on_bfloat16_still_runs(capsys, tmp_path):
    """Control: the dtypes the preset was checked on run and equal the library."""
    pytest.importorskip("compressed_tensors")
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    codes, sb = q._ct_mxfp4(q.round_to_dtype(x, "bfloat16").astype(np.float32), "bfloat16")
    rc, out, text = q._quantize(capsys, tmp_path, q.round_to_dtype(x, "bfloat16").astype(np.float32), "bfloat16",
                                "--preset", "compressed-tensors-mxfp4-act")
    assert rc == 0, text
    assert np.array_equal(out["scale"], sb) and np.array_equal(out["codes"], codes)
