"""qconform_torch/int_kernels.py: exact integer accumulators on torch's int8 GEMM, against NumPy's int64
matmul (an independent oracle: Python-sized integers never round or wrap below 2**63)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from emulator.checkpoint import Checkpoint  # noqa: E402
from emulator.layers import linear_layer  # noqa: E402
from emulator.fast_linear import ExactIntMatmul, exact_int_matmul, exact_int_matmul_for  # noqa: E402
from emulator.synthetic import write_checkpoint  # noqa: E402
from qconform_torch import QuantLinear, int_kernels  # noqa: E402
from qconform_torch.int_kernels import MAX_K, MeasuredIntMatmul, TorchInt8Matmul, fastest_int_engine, torch_int8_engine  # noqa: E402


def _oracle(a, w) -> np.ndarray:
    return (np.asarray(a).astype(np.int64) @ np.asarray(w).astype(np.int64).T).astype(np.float64)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 2100), st.integers(1, 12), st.sampled_from(["int8", "asym", "shifted"]),
       st.integers(0, 2 ** 31))
def test_engine_is_exact(m, k, n, kind, seed):
    """int8 activations, asymmetric codes q - zp (up to 255 values a row, beyond int8), and rows far from 0:
    all exact, with extreme -128 weights mixed in."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-128, 128, (n, k)).astype(np.int8)
    w[:, : k // 3] = -128
    if kind == "int8":
        a = rng.integers(-128, 128, (m, k))
    elif kind == "asym":
        zp = rng.integers(-128, 128, (m, 1))
        a = rng.integers(0, 256, (m, k)) - 128 - zp  # uint8 codes minus a zero point: [-255, 255]
    else:
        a = rng.integers(-128, 128, (m, k)) + rng.integers(-5000, 5000, (m, 1))
    mm = torch_int8_engine(w, a_max=int(np.abs(a).max()))
    assert isinstance(mm, TorchInt8Matmul)
    np.testing.assert_array_equal(mm(a.astype(np.float64)), _oracle(a, w))
    np.testing.assert_array_equal(mm(a.astype(np.float32)), _oracle(a, w))


def test_extreme_sums_beyond_fp32_and_int16():
    """K = 4096 products of -128 x -128 (sum 2**26: above fp32's exact integers, far above int16)."""
    w = np.full((3, 4096), -128, np.int8)
    a = np.full((2, 4096), -128.0)
    got = torch_int8_engine(w, a_max=128)(a)
    assert got[0, 0] == 2 ** 26
    np.testing.assert_array_equal(got, _oracle(a, w))


def test_k_equal_1_is_exact():
    """K = 1: torch's transposed [1, N] view has strides (1, 1), which its int8 GEMM mishandles (the output
    comes back uninitialised; qconform_torch/int_kernels.py). The engine's operand must not hit that."""
    w = np.array([[2], [5], [-128]], np.int8)
    a = np.array([[3.0], [-128.0]])
    np.testing.assert_array_equal(torch_int8_engine(w, a_max=128)(a), [[6, 15, -384], [-256, -640, 16384]])


def test_the_self_check_catches_the_k1_layout_bug(monkeypatch):
    """Regression gate for the guard itself: with the K = 1 layout workaround removed, the self-check fails
    (where this torch has the bug), so the engine would decline rather than answer wrongly."""
    monkeypatch.setattr(int_kernels, "_CHECK", {"done": False, "ok": False})
    monkeypatch.setattr(int_kernels, "_b_operand", lambda w8: torch.from_numpy(np.ascontiguousarray(w8)).t())
    w = np.full((3, 1), 2, np.int8)
    raw = torch._int_mm(torch.ones((1, 1), dtype=torch.int8), torch.from_numpy(w).t()).numpy()
    if np.array_equal(raw, [[2, 2, 2]]):
        pytest.skip("this torch multiplies the K = 1 transposed view correctly")
    assert int_kernels.self_check() is False
    monkeypatch.setattr(int_kernels, "_CHECK", {"done": False, "ok": False})


def test_engine_declines_what_it_cannot_do_exactly():
    rng = np.random.default_rng(0)
    assert torch_int8_engine(rng.integers(-200, 200, (4, 64)), a_max=128) is None  # weights beyond int8
    assert torch_int8_engine(np.full((4, 64), 0.5), a_max=128) is None  # not integers
    assert torch_int8_engine(np.zeros((2, MAX_K), np.int8), a_max=128) is None  # int32 sums could overflow
    # a row spanning more than 256 values: the NumPy accumulator answers, still exact
    w = rng.integers(-128, 128, (5, 300)).astype(np.int8)
    a = rng.integers(-1000, 1000, (3, 300))
    mm = torch_int8_engine(w, a_max=1000)
    np.testing.assert_array_equal(mm(a), _oracle(a, w))


def test_a_wrong_kernel_is_never_used(monkeypatch):
    """If torch's int8 GEMM fails the self-check (simulated: off by one), the engine declines everything and
    the NumPy accumulator answers, exactly."""
    monkeypatch.setattr(int_kernels, "_CHECK", {"done": False, "ok": False})
    real = torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda a, b: real(a, b) + 1)
    w = np.random.default_rng(1).integers(-128, 128, (4, 100)).astype(np.int8)
    assert torch_int8_engine(w, a_max=128) is None
    a = np.random.default_rng(2).integers(-128, 128, (2, 100))
    assert isinstance(exact_int_matmul_for(w, 128, engine=torch_int8_engine), ExactIntMatmul)
    np.testing.assert_array_equal(exact_int_matmul(a, w, engine=torch_int8_engine), _oracle(a, w))
    monkeypatch.setattr(int_kernels, "_CHECK", {"done": False, "ok": False})  # the next test re-checks


def test_the_op_runs_w8a8_on_the_engine_and_equals_the_numpy_reference(tmp_path, monkeypatch):
    """QuantLinear's canonical reference (backend emulator) of a W8A8 layer: its accumulator comes from the
    torch engine (counted), and y equals the NumPy-only reference bit for bit."""
    write_checkpoint(tmp_path / "c", "ct-w8a8-int8", n=64, k=256)
    ck = Checkpoint(tmp_path / "c")
    info = ck.layers()[0]
    calls = []
    real = TorchInt8Matmul.__call__
    monkeypatch.setattr(TorchInt8Matmul, "__call__", lambda self, a: calls.append(1) or real(self, a))
    x = np.random.default_rng(3).standard_normal((5, 256)).astype(np.float32)
    y = QuantLinear.from_checkpoint(ck, info.name, backend="emulator")(torch.from_numpy(x)).numpy()
    assert calls, "the op's W8A8 reference did not use the torch int8 engine"
    want = linear_layer(ck, info, x, out_dtype="float32")  # no engine here: NumPy's accumulator
    np.testing.assert_array_equal(y, want.y.astype(np.float32))
    assert np.abs(want.acc).max() > 2 ** 14  # sums a 16-bit accumulator could not hold


@pytest.mark.parametrize("dtype", [np.int16, np.int32])
def test_narrow_integer_activations_never_wrap(dtype):
    """int16 rows spanning -30000..30000 (beyond one int8 shift: the NumPy accumulator answers) and the
    dtype's extremes: the span and shift checks must not wrap in the input dtype (reviewer's reproducer)."""
    rng = np.random.default_rng(4)
    w = rng.integers(-128, 128, (3, 4)).astype(np.int8)
    info = np.iinfo(dtype)
    for a in (np.array([[-30000, 30000, 5, 7]], dtype), np.array([[info.min, 0, 0, 0]], dtype),
              np.array([[info.max, info.max - 3, info.max - 200, info.max]], dtype)):
        got = exact_int_matmul(a, w, engine=torch_int8_engine)
        want = [[sum(int(x) * int(y) for x, y in zip(a[0], w[n])) for n in range(3)]]
        assert got.tolist() == [[float(v) for v in want[0]]], (dtype, a)


def test_int64_extremes_are_refused_not_rounded():
    """int64 min: abs() wraps, and the sums exceed what float64 holds exactly: an error, as without the engine."""
    from emulator.errors import FormatError

    w = np.ones((3, 4), np.int8)
    a = np.array([[np.iinfo(np.int64).min, 0, 0, 0]], np.int64)
    with pytest.raises(FormatError, match="overflow"):
        exact_int_matmul(a, w)
    with pytest.raises(FormatError, match="overflow"):
        exact_int_matmul(a, w, engine=torch_int8_engine)


def test_the_measured_engine_is_exact_on_every_call_and_records_its_choice(monkeypatch):
    """``fastest_int_engine``: the first call of a shape class times both exact engines, later calls run the
    faster one; every call equals the int64 oracle, and the choice is recorded per (N, K, M class)."""
    monkeypatch.setattr(int_kernels, "_CHOICE", {})
    rng = np.random.default_rng(8)
    w = rng.integers(-128, 128, (24, 3000)).astype(np.int8)
    mm = fastest_int_engine(w, 128)
    assert isinstance(mm, MeasuredIntMatmul)
    for m in (1, 5, 5, 40, 1):
        a = rng.integers(-128, 128, (m, 3000))
        np.testing.assert_array_equal(mm(a), _oracle(a, w))
    got = int_kernels.engine_choices()
    assert set(got) == {"24x3000, M <= 1", "24x3000, M <= 8", "24x3000, M <= 128"}
    assert set(got.values()) <= {"torch int8 GEMM", "float32 sgemm over K-chunks"}


def test_the_measured_engine_never_keeps_a_kernel_that_disagrees(monkeypatch, caplog):
    """A torch int8 GEMM that passed the self-check but is wrong at this shape (simulated: off by one after
    the check): the measuring call sees the disagreement, answers NumPy's exact sums and keeps NumPy."""
    monkeypatch.setattr(int_kernels, "_CHOICE", {})
    assert int_kernels.self_check()
    real = int_kernels._int8_product
    monkeypatch.setattr(int_kernels, "_int8_product", lambda a, b: real(a, b) + 1)
    rng = np.random.default_rng(9)
    w = rng.integers(-128, 128, (8, 700)).astype(np.int8)
    a = rng.integers(-128, 128, (3, 700))
    mm = fastest_int_engine(w, 128)
    with caplog.at_level("WARNING", logger="qconform.fallback"):
        np.testing.assert_array_equal(mm(a), _oracle(a, w))
    assert "disagreed" in caplog.text
    np.testing.assert_array_equal(mm(a), _oracle(a, w))
    assert int_kernels.engine_choices() == {"8x700, M <= 8": "float32 sgemm over K-chunks"}
