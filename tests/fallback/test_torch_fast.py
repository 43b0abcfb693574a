"""The op's A16 fast path on torch's fp32 GEMM for a layer the cache keeps (qconform_torch/torch_fast.py).

Checks: (1) the kept layer's output is exactly nn.functional.linear of ``qconform dequant``'s weight (the
exact dequantized weight, read by the reference dequantizer, not the fast path's), the bias added in fp32
and rounded once to x's dtype, and within fp32 accumulation of a float64 product; (2) one cache entry per
layer whatever M is; (3) where torch's fp32 matmul settings allow narrower operands (bf16 / TF32), or its
GEMM is seen to round them, the op does not use it: it takes NumPy's row blocks, equal bit for bit to the
emulator backend's cached path; (4) the self-check catches a GEMM that rounds its operands to bfloat16.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from backends.registry import create  # noqa: E402
from emulator.checkpoint import Checkpoint  # noqa: E402
from emulator.layer_cases import case_tensors, layer_case  # noqa: E402
from emulator.layers import dequantize_layer, layer_bias  # noqa: E402
from emulator.numerics.fast_round import round_fast  # noqa: E402
from qconform_torch import QuantLinear, op, torch_fast  # noqa: E402

SCHEMES = ["gptq-w4g32-sym-v1", "gptq-w4g32-asym-v2", "awq-w4g32", "ct-w4a16-g32-sym", "ct-mxfp4-w4a16"]
FAST = "emulator:path=fast"


def _x(m, k, dtype, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)).to(dtype)


@pytest.fixture
def big_cache():
    op.set_cache_budget(256)
    yield
    op.set_cache_budget(op.DEFAULT_CACHE_MB)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kept_layer_is_fp32_linear_of_the_exact_weight(scheme, dtype, synthetic, big_cache):
    ck = Checkpoint(synthetic / scheme)
    info = ck.layers()[0]
    m = QuantLinear.from_checkpoint(ck, info.name, backend=FAST)
    w = dequantize_layer(ck, info).astype(np.float32)  # the reference dequantizer's exact weight
    bias = layer_bias(ck, info)
    for M in (1, 5, 17):
        x = _x(M, info.shape[-1], dtype, seed=M)
        y = m(x)
        y32 = torch.nn.functional.linear(x.float(), torch.from_numpy(w)).numpy()
        if bias is not None:
            y32 = y32 + np.asarray(bias, np.float32)
        want = round_fast(y32, {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype])
        np.testing.assert_array_equal(y.float().numpy(), want)
        # an independent bound: fp32 accumulation of the exact products, then one rounding to x's dtype
        x64, w64 = x.double().numpy(), w.astype(np.float64)
        exact = x64 @ w64.T + (0 if bias is None else np.asarray(bias, np.float64))
        mag = np.abs(x64) @ np.abs(w64).T + (0 if bias is None else np.abs(np.asarray(bias, np.float64)))
        tol = (info.shape[-1] + 2) * 2.0 ** -24 * mag + np.abs(exact) * 2.0 ** -(8 if dtype == torch.bfloat16 else 23)
        assert np.all(np.abs(y.double().numpy() - exact) <= tol)
    # one entry for the layer (its fp32 weight + the packed tensors it holds), however many M it ran at
    assert op.cache_stats()["used_bytes"] == 4 * w.size + sum(int(t.untyped_storage().nbytes()) for t in m.weights())


def _numpy_cached(ck, info, x):
    """The emulator backend's own cached fast path (NumPy's row blocks: emulator/formats/fast_matmul.py)."""
    case = layer_case(info, x.shape[0], "float32", "a16")
    emu = create("emulator")
    bias = layer_bias(ck, info)
    extra = {} if bias is None else {"bias": np.asarray(bias, np.float32)}
    return emu.run(emu.prepare(case, case_tensors(ck, info, case)), x.numpy(), **extra)


@pytest.mark.parametrize("setting", ["mkldnn-bf16", "global-medium"])
def test_narrow_fp32_matmul_settings_take_numpy(setting, synthetic, big_cache, monkeypatch):
    ck = Checkpoint(synthetic / "ct-w4a16-g32-sym")
    info = ck.layers()[0]
    m = QuantLinear.from_checkpoint(ck, info.name, backend=FAST)
    x = _x(3, info.shape[-1], torch.float32)
    used = []
    monkeypatch.setattr(torch_fast.TorchFastLinear, "__call__", lambda *a: used.append(1))
    if setting == "mkldnn-bf16":
        saved = torch.backends.mkldnn.matmul.fp32_precision
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        try:
            assert "bf16" in torch_fast.ieee_fp32_matmul_refusal()
            y = m(x)
        finally:
            torch.backends.mkldnn.matmul.fp32_precision = saved
    else:
        monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "medium")
        assert "medium" in torch_fast.ieee_fp32_matmul_refusal()
        y = m(x)
    assert not used
    np.testing.assert_array_equal(y.numpy(), _numpy_cached(ck, info, x))


def test_self_check_catches_a_gemm_that_rounds_operands_to_bf16(monkeypatch):
    real = torch.mm

    def bf16_mm(a, b):  # what oneDNN's bf32 mode does: operands rounded to bfloat16, fp32 accumulation
        return real(a.to(torch.bfloat16).float(), b.to(torch.bfloat16).float())

    try:
        torch_fast.reset_self_check()
        assert torch_fast.self_check() is None  # this host's torch.mm: IEEE fp32
        torch_fast.reset_self_check()
        monkeypatch.setattr(torch, "mm", bf16_mm)
        why = torch_fast.self_check()
        assert why is not None and "round" in why
        assert torch_fast.ieee_fp32_matmul_refusal() == why
    finally:
        monkeypatch.undo()
        torch_fast.reset_self_check()  # the real GEMM's answer for the tests after this one


def _w8a8_inputs(k, dtype):
    """Rows that exercise the per-token quantization: random, a zero row, a row whose amax / 127 underflows
    float32, a row with +-Inf-free extremes, rows whose quotients are exact .5 ties (RNE decides them), and a
    single-element spike."""
    rng = np.random.default_rng(5)
    rows = [rng.standard_normal(k) * s for s in (1.0, 1e-3, 1e4)]
    rows.append(np.zeros(k))
    rows.append(np.where(np.arange(k) % 3 == 0, 1e-44, -1e-45))  # subnormal amax: the scale underflows
    rows.append(np.full(k, 3.0e38) * np.where(np.arange(k) % 2 == 0, 1, -1))
    tie = np.full(k, 127.0)
    tie[1::4] = 0.5
    tie[2::4] = -2.5
    tie[3::4] = 126.5
    rows.append(tie)  # scale 1: quotients 0.5, -2.5, 126.5 are ties
    spike = np.zeros(k)
    spike[k // 2] = -7.0
    rows.append(spike)
    inf_row = rng.standard_normal(k)
    inf_row[k // 3] = np.inf  # amax +Inf: the scale is +Inf, every code 0 (finite / Inf, Inf / Inf = NaN): y NaN
    rows.append(inf_row)
    rows.append(np.where(np.arange(k) == 1, -np.inf, 0.0))  # -Inf among zeros
    x = torch.from_numpy(np.asarray(rows, dtype=np.float32))
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_w8a8_torch_path_is_the_reference_bit_for_bit(dtype, synthetic, big_cache, monkeypatch):
    """The fast W8A8 path's torch ops give the canonical reference's bits (an independent path: the exact
    reference, emulator/linear.py), on rows that exercise every step of the per-token quantization, whichever
    path the first call's measurement keeps (both are forced in turn)."""
    ck = Checkpoint(synthetic / "ct-w8a8-int8")
    info = ck.layers()[0]
    k = info.shape[-1]
    x = _w8a8_inputs(k, dtype)
    if dtype == torch.float16:
        x = torch.nan_to_num(x.float().clamp(-6e4, 6e4)).to(dtype)
    ref = QuantLinear.from_checkpoint(ck, info.name, backend="emulator")(x)
    calls = []
    real = torch_fast.TorchW8A8Linear.__call__
    monkeypatch.setattr(torch_fast.TorchW8A8Linear, "__call__", lambda *a: calls.append(1) or real(*a))
    for torch_wins in (True, False):
        op.set_w8a8_path_choices(None)
        m = QuantLinear.from_checkpoint(ck, info.name, backend=FAST)
        y_first = m(x)  # the measured call: both paths, checked equal
        assert op.w8a8_path_choices()
        op.set_w8a8_path_choices(torch_wins)
        calls.clear()
        y = m(x)
        assert bool(calls) == torch_wins
        # bit for bit, NaN's sign and payload included (the +-Inf rows' outputs are NaN)
        np.testing.assert_array_equal(y_first.float().numpy().view(np.uint32), ref.float().numpy().view(np.uint32))
        np.testing.assert_array_equal(y.float().numpy().view(np.uint32), ref.float().numpy().view(np.uint32))
    op.set_w8a8_path_choices(None)  # later tests measure for themselves


def test_w8a8_torch_path_refuses_nan(synthetic, big_cache):
    ck = Checkpoint(synthetic / "ct-w8a8-int8")
    info = ck.layers()[0]
    m = QuantLinear.from_checkpoint(ck, info.name, backend=FAST)
    x = _x(2, info.shape[-1], torch.float32)
    x[1, 3] = float("nan")
    with pytest.raises(Exception, match="NaN in activations"):
        m(x)
    mm = torch_fast.TorchW8A8Linear(np.zeros((4, 8), np.int8), np.ones(4, np.float32))
    with pytest.raises(ValueError, match="NaN in activations"):
        mm(x[:, :8].numpy().copy(), None, "float32")


@pytest.mark.parametrize("scheme", ["gptq-w4g32-asym-v2", "awq-w4g32", "ct-w4a16-g32-asym", "ct-w8a8-int8",
                                    "ct-w4a8-g32-sym", "ct-mxfp4-w4a16", "ct-mxfp4-w4a4"])
def test_reference_reusing_its_layer_work_is_linear_layer(scheme, synthetic, big_cache):
    """The op's reference keeps what it forms from a layer's tensors alone (the dequantized weight, the W8A8
    engine, that linear_layer accepted the tensors): its later calls, at other M and dtypes, still equal
    ``linear_layer`` (``qconform linear``) bit for bit, and they do hit the cache."""
    from emulator.layers import linear_layer

    ck = Checkpoint(synthetic / scheme)
    info = ck.layers()[0]
    m = QuantLinear.from_checkpoint(ck, info.name, backend="emulator")
    hits0 = op.cache_stats()["hits"]
    for i, (M, dtype) in enumerate([(3, torch.float32), (8, torch.float32), (3, torch.bfloat16), (1, torch.float16)]):
        x = _x(M, info.shape[-1], dtype, seed=i)
        want = linear_layer(ck, info, x.float().numpy(), out_dtype={torch.float32: "float32",
                            torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]).y
        np.testing.assert_array_equal(m(x).float().numpy(), np.asarray(want, np.float32))
    if scheme in ("ct-w8a8-int8",) or "w4a16" in scheme or scheme.startswith(("gptq", "awq")):
        assert op.cache_stats()["hits"] >= hits0 + 3


def test_reference_does_not_reuse_work_after_an_in_place_write(synthetic, big_cache):
    """A weight tensor written in place (its version moves) is validated again: a NaN scale written after
    the first call is refused, never served from what the cache kept."""
    from emulator.errors import FormatError

    for scheme, role in (("ct-w8a8-int8", "weight_scale"), ("ct-w4a16-g32-sym", "weight_scale")):
        ck = Checkpoint(synthetic / scheme)
        info = ck.layers()[0]
        m = QuantLinear.from_checkpoint(ck, info.name, backend="emulator")
        x = _x(2, info.shape[-1], torch.float32)
        m(x)
        m(x)
        getattr(m, "q_" + role).view(-1)[0] = float("nan")
        with pytest.raises((FormatError, RuntimeError), match="weight_scale|NaN"):
            m(x)


@pytest.mark.parametrize("scheme", ["ct-w4a16-g32-sym", "ct-w8a8-int8"])
def test_repeated_calls_see_in_place_writes(scheme, synthetic, big_cache):
    """A named backend's later calls skip the per-call checks only while the layer's tensors (and their versions)
    are those checked: a bias written in place after several calls moves the output by exactly that bias."""
    ck = Checkpoint(synthetic / scheme)
    info = ck.layers()[0]
    m = QuantLinear.from_checkpoint(ck, info.name, backend=FAST)
    x = _x(4, info.shape[-1], torch.float32)
    y0 = [m(x) for _ in range(3)][-1]
    with torch.no_grad():
        m.q_bias.zero_()
    y1 = m(x)
    ref = QuantLinear.from_checkpoint(ck, info.name, backend="emulator")
    with torch.no_grad():
        ref.q_bias.zero_()
    np.testing.assert_allclose(y1.numpy(), ref(x).numpy(), rtol=0, atol=1e-5 * float(ref(x).abs().max()))
    assert not torch.equal(y0, y1)


def test_float32_outputs_skip_round_fast_only_where_it_changes_nothing():
    """Both torch paths return a float32 output without ``round_fast``: (1) the W8A8 path casts its float64 result
    with torch's float64 -> float32 conversion, which must be ``round_fast``'s RNE to float32 bit for bit on every
    class of value (random bit patterns, NaN payloads of both signs and both quiet bits, subnormal results, the
    overflow threshold and ties at float32's half ulp, built from their bits); (2) the A16 path returns the GEMM's
    float32 sums as they are, where ``round_fast`` would only quiet a signalling NaN: a signalling NaN in x comes
    out quiet (an arithmetic result), i.e. already what ``round_fast`` returns."""
    rng = np.random.default_rng(11)
    bits = rng.integers(0, 2 ** 63, 100_000, dtype=np.uint64) | (rng.integers(0, 2, 100_000, dtype=np.uint64) << 63)
    ulp_half = [(127 + e - 24) for e in (-120, -10, 0, 10, 100)]  # float32 half ulps at several exponents
    ties = [2.0 ** (b - 127) * (1 + 2.0 ** -24) for b in ulp_half] + [2.0 ** (b - 127) * (1 + 3 * 2.0 ** -24) for b in ulp_half]
    special = np.array([np.inf, -np.inf, 0.0, -0.0, 2.0 ** 128 * (1 - 2.0 ** -25), 2.0 ** 128 * (1 - 2.0 ** -25) * (1 - 2.0 ** -40),
                        2.0 ** -149 * 0.5, -(2.0 ** -149) * 0.5, 2.0 ** -149 * 1.5, 2.0 ** -149 * 2.5, 2.0 ** -126 * (1 - 2.0 ** -30),
                        *ties, *[-t for t in ties]], np.float64)
    nans = np.array([0x7FF0000000000001, 0xFFF0000000000001, 0x7FF8000000000001, 0x7FF4000020000000,
                     0xFFF7FFFFFFFFFFFF, 0x7FF80000E0000000], np.uint64).view(np.float64)
    v = np.concatenate([bits.view(np.float64), special, nans, rng.standard_normal(50_000) * 1e-40])
    got = torch.from_numpy(v).to(torch.float32).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), round_fast(v, "float32").view(np.uint32))

    mm = torch_fast.TorchFastLinear(np.random.default_rng(3).standard_normal((5, 16)).astype(np.float32))
    x = np.ones((2, 16), np.float32)
    x[0, 3] = np.array([0x7F800001], np.uint32).view(np.float32)[0]  # a signalling NaN
    y = mm(x, None, "float32")
    assert np.isnan(y[0]).all() and not np.isnan(y[1]).any()
    np.testing.assert_array_equal(y.view(np.uint32), round_fast(y.copy(), "float32").view(np.uint32))
