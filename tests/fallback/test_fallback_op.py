"""torch.ops.qconform.quant_linear and QuantLinear (docs/fallback.md).

- opcheck passes for the op on every scheme qconform writes (emulator/synthetic.py SCHEMES), with the
  canonical reference and with the dispatcher;
- QuantLinear(backend="emulator") equals ``qconform linear`` (the CLI's reference output) bit for bit
  on every layer format of the toolkit-written checkpoints and on every synthetic scheme;
- the dispatcher's choice is logged once per layer, with skip reasons; bad tensors are refused.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conformance.cli.main import main as qconform  # noqa: E402
from emulator.checkpoint import Checkpoint  # noqa: E402
from emulator.errors import FormatError  # noqa: E402
from emulator.layers import dequantize_layer  # noqa: E402
from emulator.synthetic import SCHEMES, write_checkpoint  # noqa: E402
from emulator.tensorfile import Tensor, load_tensors, save_tensors  # noqa: E402
from qconform_torch import QuantLinear  # noqa: E402

TOOLKIT = Path(__file__).resolve().parents[1] / "data" / "toolkit_checkpoints"
#: every toolkit-written checkpoint, AMD Quark's included (quark/NAME)
TOOLKIT_CKPTS = sorted(str(p.parent.relative_to(TOOLKIT)) for p in TOOLKIT.glob("*/config.json")) + \
    sorted(str(p.parent.relative_to(TOOLKIT)) for p in TOOLKIT.glob("quark/*/config.json"))
#: checkpoints whose declared activations `qconform linear` refuses without --act (module: the same error)
REFUSED = {"quark/quark-int8-w8a8": "Quark dynamic int8 input_tensors"}


def _x(M, K, dtype, seed=0):
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((M, K)).astype(np.float32))
    return x.to(dtype)


def _cli_linear(tmp_path, ckpt, layer, x: torch.Tensor) -> np.ndarray:
    """``qconform linear`` (the emulator reference, no --backend) on x: its y as float32."""
    xin = tmp_path / "x.safetensors"
    t = (Tensor(x.float().numpy(), "BF16") if x.dtype == torch.bfloat16 else x.numpy())
    save_tensors(xin, {"x": t})
    out = tmp_path / "y.safetensors"
    assert qconform(["linear", str(ckpt), "--layer", layer, "-i", str(xin), "-o", str(out)]) == 0
    return np.asarray(load_tensors(out)["y"].data, np.float32)


@pytest.mark.parametrize("name", TOOLKIT_CKPTS)
def test_module_equals_qconform_linear_on_toolkit_checkpoints(name, tmp_path):
    ck = Checkpoint(TOOLKIT / name)
    layers = ck.layers()
    # every distinct shape (q/o/gate/up/down are [128,128], k/v [32,128]) and every layer format
    picked = {(l.format, tuple(l.shape), l.group_size): l for l in layers}.values()
    assert len(TOOLKIT_CKPTS) >= 17 and any(n.startswith("quark/") for n in TOOLKIT_CKPTS)
    for i, info in enumerate(picked):
        for dtype in (torch.float32, torch.bfloat16):
            x = _x(3, info.shape[-1], dtype, seed=i)
            m = QuantLinear.from_checkpoint(ck, info.name, backend="emulator")
            if name in REFUSED:  # both refuse, with the same reason
                from emulator.errors import UnsupportedFormatError

                with pytest.raises(UnsupportedFormatError, match=REFUSED[name]):
                    m(x)
                xin = tmp_path / "x.safetensors"
                save_tensors(xin, {"x": x.float().numpy()})
                assert qconform(["linear", str(TOOLKIT / name), "--layer", info.name, "-i", str(xin),
                                 "-o", str(tmp_path / "y.safetensors")]) == 2
                continue
            y = m(x)
            assert y.dtype == dtype and tuple(y.shape) == (3, info.shape[0])
            ref = _cli_linear(tmp_path, TOOLKIT / name, info.name, x)
            np.testing.assert_array_equal(y.float().numpy(), ref, err_msg=f"{name} {info.name} {dtype}")


@pytest.mark.parametrize("scheme", [s for s in SCHEMES if s != "gptoss-mxfp4"])
def test_module_equals_qconform_linear_on_every_scheme(scheme, synthetic, tmp_path):
    ck = Checkpoint(synthetic / scheme)
    info = ck.layers()[0]
    x = _x(4, info.shape[-1], torch.float16, seed=3)
    y = QuantLinear.from_checkpoint(ck, info.name, backend="emulator")(x.unsqueeze(0))[0]  # 3-D input too
    np.testing.assert_array_equal(y.float().numpy(), _cli_linear(tmp_path, synthetic / scheme, info.name, x))


def test_stacked_experts_one_expert_at_a_time(synthetic):
    """gpt-oss blocks: expert e of the module is x @ W_e^T of `qconform dequant`'s [E, N, K] weight,
    rounded once to fp32 (float64 products of fp32 values, K=128: exact to far below one fp32 ULP)."""
    ck = Checkpoint(synthetic / "gptoss-mxfp4")
    info = ck.layers()[0]
    w = dequantize_layer(ck, info).astype(np.float64)
    x = _x(5, info.shape[-1], torch.float32)
    for e in range(info.shape[0]):
        y = QuantLinear.from_checkpoint(ck, info.name, backend="emulator", expert=e)(x)
        np.testing.assert_array_equal(y.numpy(), (x.double().numpy() @ w[e].T).astype(np.float32))
    assert not np.array_equal(w[0], w[1])  # the two experts differ: the index is not ignored
    experts = QuantLinear.stacked_from_checkpoint(ck, info.name, backend="emulator")
    assert len(experts) == info.shape[0]
    for e, m in enumerate(experts):
        np.testing.assert_array_equal(m(x).numpy(), (x.double().numpy() @ w[e].T).astype(np.float32))
    with pytest.raises(ValueError, match="need expert"):
        QuantLinear.from_checkpoint(ck, info.name)


@pytest.mark.parametrize("backend", ["emulator", "auto"])
@pytest.mark.parametrize("name", [n for n in TOOLKIT_CKPTS if n.startswith("quark/") and n not in REFUSED])
def test_opcheck_quark_layers(name, backend):
    """AMD Quark's formats (no synthetic scheme writes them): opcheck on each distinct layer format."""
    ck = Checkpoint(TOOLKIT / name)
    for info in {(l.format, l.group_size): l for l in ck.layers()}.values():
        m = QuantLinear.from_checkpoint(ck, info.name, backend=backend)
        x = _x(4, info.shape[-1], torch.float32, seed=2)
        res = torch.library.opcheck(torch.ops.qconform.quant_linear.default, (x, m.weights(), m.spec, backend))
        assert res and all(v == "SUCCESS" for v in res.values()), (name, info.name, res)


@pytest.mark.parametrize("backend", ["emulator", "auto"])
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_opcheck_every_scheme(scheme, backend, synthetic):
    ck = Checkpoint(synthetic / scheme)
    info = ck.layers()[0]
    m = QuantLinear.from_checkpoint(ck, info.name, backend=backend, expert=1 if len(info.shape) == 3 else None)
    x = _x(6, info.shape[-1], torch.float32, seed=1)
    res = torch.library.opcheck(torch.ops.qconform.quant_linear.default, (x, m.weights(), m.spec, backend))
    assert res and all(v == "SUCCESS" for v in res.values()), res


def test_dispatcher_choice_logged_once_per_layer(synthetic, caplog):
    ck = Checkpoint(synthetic / "gptq-w4g32-asym-v2-actorder")
    info = ck.layers()[0]
    m = QuantLinear.from_checkpoint(ck, info.name, backend="auto")
    x = _x(2, info.shape[-1], torch.float32)
    from qconform_torch.op import selection_lines

    m(x)
    with caplog.at_level(logging.INFO, logger="qconform.fallback"):
        m(x)
        m(_x(2, info.shape[-1], torch.float32, seed=5))
    assert not [r for r in caplog.records if r.name == "qconform.fallback"]  # logged once, at the first call
    lines = selection_lines(m.spec)
    assert len(lines) == 1 and "-> emulator" in lines[0]
    # act order: every CPU kernel declines it; the line names each and why
    assert "torch-cpu: cannot implement" in lines[0] and "act order" in lines[0]


def test_auto_refuses_nan_scale_before_any_kernel(synthetic):
    ck = Checkpoint(synthetic / "ct-w4a16-g32-sym")
    info = ck.layers()[0]
    m = QuantLinear.from_checkpoint(ck, info.name, backend="auto")
    m.q_weight_scale[0, 0] = float("nan")
    with pytest.raises(FormatError, match="weight_scale"):
        m(_x(2, info.shape[-1], torch.float32))


def test_bad_x_is_one_clear_error(synthetic):
    ck = Checkpoint(synthetic / "awq-w4g32")
    info = ck.layers()[0]
    m = QuantLinear.from_checkpoint(ck, info.name, backend="emulator")
    with pytest.raises(ValueError, match=r"x must be \[M, K=128\]"):
        torch.ops.qconform.quant_linear(torch.zeros(2, 64), m.weights(), m.spec, "emulator")
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        m(torch.zeros(2, 128, dtype=torch.float64))


@pytest.mark.parametrize("scheme", ["gptq-w4g32-sym-v1", "gptq-w4g32-asym-v2", "gptq-w8g128-sym-v1", "awq-w4g32",
                                    "ct-w4a16-g32-sym", "ct-w4a16-channel-sym", "ct-mxfp4-w4a16"])
def test_blocked_dequant_equals_whole_layer(scheme, synthetic):
    """Row blocks of the packed tensors dequantize to exactly the same rows of the whole layer's weight,
    and the blocked fast path stays within fp32 accumulation of the cached (whole-weight) fast path."""
    from backends.registry import create
    from emulator.declaration import declared_weight
    from emulator.layer_cases import case_tensors, layer_case
    from emulator.layers import layer_bias
    from qconform_torch.blocked import blocked_fast_linear, row_slicer

    ck = Checkpoint(synthetic / scheme)
    info = ck.layers()[0]
    case = layer_case(info, 3, "float32", "a16")
    tensors = case_tensors(ck, info, case)
    emu = create("emulator")
    whole = declared_weight(case, tensors, emu.computed(case))
    mult, take = row_slicer(case, tensors)
    import dataclasses

    for n0, n1 in ((0, 8), (8, 24), (24, case.N)):
        sub = dataclasses.replace(case, N=n1 - n0)
        np.testing.assert_array_equal(declared_weight(sub, take(n0, n1), emu.computed(sub)), whole[n0:n1])
    x = np.random.default_rng(0).standard_normal((3, case.K)).astype(np.float32)
    bias = layer_bias(ck, info)
    import qconform_torch.blocked as blocked_mod

    old = blocked_mod.MIN_BLOCK_BYTES
    blocked_mod.MIN_BLOCK_BYTES = 0
    try:
        y_blk = blocked_fast_linear(emu, case, tensors, x, bias, budget_bytes=8 * 4 * case.K)  # 8-row blocks
    finally:
        blocked_mod.MIN_BLOCK_BYTES = old
    y_cached = emu.run(emu.prepare(case, tensors), x, **({} if bias is None else {"bias": np.float32(bias)}))
    mag = np.abs(x.astype(np.float64)) @ np.abs(whole.astype(np.float64)).T + (0 if bias is None else np.abs(bias))
    assert np.all(np.abs(y_blk.astype(np.float64) - y_cached) <= 2 * (case.K + 2) * 2.0 ** -24 * mag)


def test_op_uses_blocks_when_the_layer_does_not_fit(synthetic):
    from qconform_torch import op

    ck = Checkpoint(synthetic / "gptq-w8g128-sym-v1")  # every CPU kernel declines it: the emulator backend
    info = ck.layers()[0]
    m = QuantLinear.from_checkpoint(ck, info.name, backend="auto")
    x = _x(4, info.shape[-1], torch.float32)
    try:
        op.set_cache_budget(0)
        y0 = m(x)
        assert op.cache_stats()["uncached"] >= 1 and op.cache_stats()["peak_bytes"] == 0
        op.set_cache_budget(256)
        y1 = m(x)
        assert op.cache_stats()["peak_bytes"] >= 4 * info.shape[0] * info.shape[1]  # the fp32 weight, cached
    finally:
        op.set_cache_budget(op.DEFAULT_CACHE_MB)
    ref = QuantLinear.from_checkpoint(ck, info.name, backend="emulator")(x).double()
    for y in (y0, y1):  # both within fp32 accumulation of the canonical reference
        assert float((y.double() - ref).abs().max()) <= 1e-5 * float(ref.abs().max())


def test_same_layer_description_other_weights_never_share_a_cache_entry(synthetic, tmp_path):
    """Two checkpoints whose layer has the same name, format and shape but other values: each module
    computes with its own weights (the cache is keyed by the tensors too)."""
    write_checkpoint(tmp_path / "other", "gptq-w4g32-sym-v1", seed=7, bias=True)
    a = QuantLinear.from_checkpoint(Checkpoint(synthetic / "gptq-w4g32-sym-v1"), "model.layers.0.mlp.down_proj",
                                    backend="auto")
    b = QuantLinear.from_checkpoint(Checkpoint(tmp_path / "other"), "model.layers.0.mlp.down_proj", backend="auto")
    assert a.spec == b.spec
    x = _x(2, 128, torch.float32)
    ya, yb = a(x), b(x)
    ra = QuantLinear.from_checkpoint(Checkpoint(synthetic / "gptq-w4g32-sym-v1"), "model.layers.0.mlp.down_proj",
                                     backend="emulator")(x)
    rb = QuantLinear.from_checkpoint(Checkpoint(tmp_path / "other"), "model.layers.0.mlp.down_proj",
                                     backend="emulator")(x)
    assert not torch.equal(ra, rb)
    assert float((ya - ra).abs().max()) <= 1e-5 * float(ra.abs().max())
    assert float((yb - rb).abs().max()) <= 1e-5 * float(rb.abs().max())


def test_a_typo_in_the_backend_fails_when_the_module_is_built(synthetic):
    ck = Checkpoint(synthetic / "ct-w4a16-g32-sym")
    with pytest.raises(ValueError, match="torch_cpu"):
        QuantLinear.from_checkpoint(ck, ck.layers()[0].name, backend="torch_cpu")


def test_an_output_in_a_missing_folder_is_one_line(tmp_path, capsys):
    """The writer names the folder, not the temporary file it would have opened."""
    ckpt = Path(__file__).resolve().parents[1] / "data" / "toolkit_checkpoints" / "llmcompressor-w8a8-int8"
    pytest.importorskip("transformers")
    rc = qconform(["model", str(ckpt), "--tokens", "1,2", "--backend", "emulator",
                   "-o", str(tmp_path / "no" / "such" / "o.safetensors")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "output folder" in err[0] and ".tmp" not in err[0], err


def test_numpy_blas_runs_on_the_calling_thread_inside_the_op(tmp_path, monkeypatch):
    """Inside the op, OpenBLAS is set to one thread (its idle threads spin after a call and stall torch's next
    operations: docs/fallback.md#the-op), and the count is restored after."""
    from emulator import parallel
    from qconform_torch import exact_blocks

    before = parallel.blas_threads()
    if before is None or parallel.row_threads() == 1:
        pytest.skip("NumPy's BLAS is not the bundled OpenBLAS here, or one CPU: nothing to set")
    write_checkpoint(tmp_path / "ck", "ct-w4a16-g32-sym")
    ck = Checkpoint(tmp_path / "ck")
    seen = []
    real = exact_blocks.linear_w16_fast

    def recording(*a, **k):
        seen.append(parallel.blas_threads())
        return real(*a, **k)

    monkeypatch.setattr(exact_blocks, "linear_w16_fast", recording)
    m = QuantLinear.from_checkpoint(ck, ck.layers()[0].name, backend="emulator")
    m(torch.ones(2, ck.layers()[0].shape[-1]))
    assert seen and set(seen) == {1}
    assert parallel.blas_threads() == before


def test_the_op_stays_exact_under_the_models_flush_denormal_mode(tmp_path):
    """A model that turned on flush-to-zero (``torch.set_flush_denormal(True)``) still gets the exact reference from
    the op: subnormal activations are read as themselves (the mode is off during the op's computation:
    qconform_torch/host_state.py), and the mode is on again after the call (the model's own choice)."""
    from emulator.numerics.fpu_state import subnormals_flushed

    write_checkpoint(tmp_path / "ck", "ct-w4a16-g32-sym")
    ck = Checkpoint(tmp_path / "ck")
    info = ck.layers()[0]
    m = QuantLinear.from_checkpoint(ck, info.name, backend="emulator")
    x = torch.full((2, info.shape[-1]), 2.0 ** -140)  # float32 subnormals
    want = m(x)
    assert torch.any(want != 0)
    if not torch.set_flush_denormal(True):
        torch.set_flush_denormal(False)
        pytest.skip("this CPU has no flush-denormal mode")
    try:
        got = m(x)
        assert subnormals_flushed()
    finally:
        torch.set_flush_denormal(False)
    assert torch.equal(got, want)
