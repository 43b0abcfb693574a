"""The uncached fallback's torch scale step (qconform_torch/blocked.py ``TorchScaledRowsTimesX.scale``)
equals NumPy's float32 multiply bit for bit, special values included, and leaves torch's thread count
as it found it."""

import numpy as np
import pytest
import torch

from emulator.formats.fast_matmul import RowSink
from emulator.formats.int_common import DequantVariant
from qconform_torch.blocked import TorchScaledRowsTimesX, one_torch_thread

SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38, 2.0 ** -126, 3.4028235e38,
                    -3.4028235e38, 65504.0, 2.0 ** -24, 1.0, -1.0, 0.1], dtype=np.float32)


def _operands(rng, r, g, gs):
    # the codes' float32 values (what the dequantizer casts: small integers, +-0) and arbitrary floats
    w = np.concatenate([rng.integers(-128, 128, (r, g, gs)).astype(np.float32),
                        rng.standard_normal((r, g, gs)).astype(np.float32) * np.float32(2.0) ** rng.integers(-140, 120, (r, g, gs)).astype(np.float32),
                        rng.choice(SPECIAL, (r, g, gs))], axis=0)
    s = np.concatenate([rng.standard_normal((r, g, 1)).astype(np.float32) * np.float32(2.0) ** rng.integers(-140, 120, (r, g, 1)).astype(np.float32),
                        rng.choice(SPECIAL, (r, g, 1)),
                        rng.choice(SPECIAL, (r, g, 1))], axis=0)
    return w, s


@pytest.mark.parametrize("gs", [1, 7, 32, 128])
def test_torch_scale_equals_numpy_multiply_bit_for_bit(gs):
    rng = np.random.default_rng(gs)
    w, s = _operands(rng, 11, 9, gs)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        expect = w * s
    sink = TorchScaledRowsTimesX(np.zeros((1, 4), np.float32), 4)
    got = w.copy()
    with one_torch_thread():
        sink.scale(got, s)  # broadcast scale [R, G, 1]
    assert np.array_equal(got.view(np.uint32), expect.view(np.uint32))
    full = np.broadcast_to(s, w.shape).copy()
    got = w.copy()
    sink.scale(got, full)  # act-order: the scales gathered to the weight's shape
    assert np.array_equal(got.view(np.uint32), expect.view(np.uint32))
    # NumPy's own step (the cached path's dequantizer, RowSink.scale) gives the same bits
    plain = w.copy()
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        RowSink((1, 4), None).scale(plain, s)
    assert np.array_equal(plain.view(np.uint32), expect.view(np.uint32))


def test_read_only_or_reversed_operands_take_numpys_multiply():
    rng = np.random.default_rng(3)
    w, s = _operands(rng, 2, 3, 8)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        expect = w * s
    ro = s.copy()
    ro.flags.writeable = False
    got = w.copy()
    sink = TorchScaledRowsTimesX(np.zeros((1, 4), np.float32), 4)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        sink.scale(got, ro)
        assert np.array_equal(got.view(np.uint32), expect.view(np.uint32))
        got = w.copy()
        sink.scale(got[:, :, ::-1], s)
        assert np.array_equal(got[:, :, ::-1].view(np.uint32), (w[:, :, ::-1] * s).view(np.uint32))


def test_torch_thread_count_is_restored():
    before = torch.get_num_threads()
    with one_torch_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("order", ["sub_then_mul", "mul_then_sub", "float_zero"])
@pytest.mark.parametrize("compute", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["C", "F"])
def test_streamed_blocks_equal_the_array_for_every_order(order, compute, layout):
    """Every declared order streamed into a sink (NumPy's scale step and torch's) equals the weight
    dequantized into an array: the sink's scale step is used only where the rule is a float32 multiply."""
    from emulator.formats import gptq

    rng = np.random.default_rng(7)
    n, k, group = 48, 256, 64
    qweight = rng.integers(-(2 ** 31), 2 ** 31, (k // 8, n), dtype=np.int64).astype(np.int32)
    qweight = np.asfortranarray(qweight) if layout == "F" else qweight
    qzeros = rng.integers(-(2 ** 31), 2 ** 31, (k // group, n // 8), dtype=np.int64).astype(np.int32)
    scales = (rng.standard_normal((k // group, n)) * 2.0 ** rng.integers(-20, 8, (k // group, n))).astype(np.float16)
    t = gptq.GptqTensors(qweight, qzeros, scales, None)
    p = gptq.GptqParams(bits=4, group_size=group, sym=False)
    kw = {"order": order, "compute_dtype": compute}
    expect = gptq.dequantize_gptq(t, p, shape=(n, k), variant=DequantVariant(**kw))
    for sink_type in (RowSink, TorchScaledRowsTimesX):
        got = np.full((n, k), np.nan, np.float32)

        def keep(r0, r1, block, got=got):
            got[r0:r1] = block

        sink = sink_type(np.zeros((1, k), np.float32), n) if sink_type is TorchScaledRowsTimesX else RowSink((n, k), keep, 16)
        if sink_type is TorchScaledRowsTimesX:
            sink.consume, sink.step = keep, 16
        with one_torch_thread():
            assert gptq.dequantize_gptq(t, p, shape=(n, k), out=sink, variant=DequantVariant(**kw)) is sink
        assert sink.covered == n
        assert np.array_equal(got.view(np.uint32), expect.view(np.uint32)), sink_type.__name__
