"""The uncached fallback (qconform_torch/blocked.py ``fused_fast_linear``): row blocks dequantized and
multiplied while in cache, never a full fp32 weight.

Checks: (1) equal bit for bit to the emulator backend's cached path (same row blocks, same BLAS
calls: emulator/formats/fast_matmul.py), across M, thread counts and block heights; (2) within fp32
accumulation of an independent float64 product of the whole layer's dequantized weight (so a block
that was skipped, repeated or misplaced fails, whatever both paths share); (3) every row is
delivered exactly once.
"""

import dataclasses

import numpy as np
import pytest

from backends.base import Case
from backends.registry import create
from conformance.cases.inputs import make_inputs
from emulator.declaration import declared_weight
from emulator.formats import fast_matmul
from emulator.formats.fast_matmul import RowSink, RowsTimesX, matmul_rows
import emulator.parallel as parallel
from qconform_torch.blocked import fused_fast_linear

CASES = {
    "gptq-sym": Case("w4a16", "gptq", 3, 72, 512, group_size=128, sym=True, zero_convention="v1"),
    "gptq-asym-v2": Case("w4a16", "gptq", 3, 64, 256, group_size=32, sym=False, zero_convention="v2",
                         act_dtype="bfloat16"),
    "awq": Case("w4a16", "awq", 3, 80, 256, group_size=64, sym=False),
    "ct-sym": Case("w4a16", "ct-pack-quantized", 3, 56, 384, group_size=128, sym=True, act_dtype="float16"),
    "mxfp4": Case("w4a16-mxfp4", "ct-mxfp4", 3, 40, 256, group_size=32, act_dtype="bfloat16"),
}


def _inputs(name, m):
    case = dataclasses.replace(CASES[name], M=m)
    inp = make_inputs(case, 3)
    return case, inp


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("m", [1, 2, 16])
@pytest.mark.parametrize("step,threads", [(8, 3), (16, 1), (None, 2)])
def test_fused_equals_cached_bit_for_bit(name, m, step, threads, monkeypatch):
    case, inp = _inputs(name, m)
    monkeypatch.setattr(parallel, "row_threads", lambda: threads)
    monkeypatch.setattr(parallel, "MIN_ELEMENTS", 0)  # blocks on worker threads even for small layers
    if step is not None:
        monkeypatch.setattr(fast_matmul, "block_rows", lambda row_bytes, align=1: step)
    emu = create("emulator")
    x = np.asarray(inp.x, np.float32)
    bias = inp.bias
    extra = {} if bias is None else {"bias": np.asarray(bias, np.float32)}
    y_cached = emu.run(emu.prepare(case, inp.tensors), x, **extra)
    y_fused = fused_fast_linear(emu, case, inp.tensors, x, bias)
    assert y_fused is not None
    np.testing.assert_array_equal(y_fused, y_cached)
    # an independent product: float64 over the whole layer's dequantized weight
    w = declared_weight(case, inp.tensors, emu.computed(case)).astype(np.float64)
    x64 = x.astype(np.float64)
    exact = x64 @ w.T + (0 if bias is None else np.asarray(bias, np.float64))
    mag = np.abs(x64) @ np.abs(w).T + (0 if bias is None else np.abs(np.asarray(bias, np.float64)))
    tol = (case.K + 2) * 2.0 ** -24 * mag + np.abs(exact) * 2.0 ** -(8 if case.output_dtype == "bfloat16" else 11)
    assert np.all(np.abs(y_fused.astype(np.float64) - exact) <= tol)


def test_row_sink_counts_rows_and_refuses_a_wrong_shape():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((20, 16)).astype(np.float32)
    x = rng.standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(matmul_rows(x, w), x @ w.T, rtol=1e-5, atol=1e-5)
    sink = RowsTimesX(x, 20)
    sink.deliver(0, 8, w[0:8])
    with pytest.raises(AssertionError, match="8 of 20 rows"):
        sink.result()
    from emulator.formats.fast_dequant import dequantize_mxfp4_packed

    with pytest.raises(ValueError, match="row sink"):
        dequantize_mxfp4_packed(np.zeros((4, 8), np.uint8), np.full((4, 1), 127, np.uint8), out=RowSink((5, 16), None))


def test_m1_activation_transpose_has_unit_strides():
    """x [1, K]: its transpose must be a real [K, 1] array, or NumPy's matmul leaves BLAS (a 400x slowdown)."""
    s = RowsTimesX(np.ones((1, 64), np.float32), 8)
    assert s._xt.strides == (4, 4)
