"""The canonical reference by row blocks (qconform_torch/exact_blocks.py, docs/fallback.md#memory).

- every format's row blocks dequantize to exactly the same rows of the whole layer (`qconform dequant`);
- the op with backend="emulator" in blocks of a few rows equals ``qconform linear`` (the CLI's whole-layer
  reference) on every synthetic scheme and every toolkit checkpoint's formats, at every element the float64
  bound decides (the only ones the reference defines; none of these inputs has another);
- a bad tensor in a later block is reported as the whole layer reports it;
- the working set (tracemalloc) stays within max(budget, 1 MiB) + a small constant, where the whole layer
  allocates ~65 bytes per weight element.
"""

from __future__ import annotations

import dataclasses
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from emulator.checkpoint import Checkpoint
from emulator.errors import FormatError
from emulator.layers import dequantize_layer, linear_layer
from emulator.synthetic import SCHEMES, write_checkpoint
from emulator.tensorfile import Tensor, load_tensors, save_tensors
from qconform_torch import exact_blocks
from qconform_torch.exact_blocks import BlockTensors, exact_by_rows, row_slicer

torch = pytest.importorskip("torch")

from conformance.cli.main import main as qconform  # noqa: E402
from qconform_torch import QuantLinear, op  # noqa: E402

TOOLKIT = Path(__file__).resolve().parents[1] / "data" / "toolkit_checkpoints"
TOOLKIT_CKPTS = sorted(p.name for p in TOOLKIT.iterdir() if (p / "config.json").exists())
MiB = 1 << 20


@pytest.fixture
def tiny_blocks(monkeypatch):
    """Blocks of the smallest row count the layout allows (budget 0, no minimum)."""
    monkeypatch.setattr(exact_blocks, "MIN_BLOCK_BYTES", 0)
    op.set_cache_budget(0)
    yield
    op.set_cache_budget(op.DEFAULT_CACHE_MB)


def _one_expert(ck, info):
    """Stacked experts: expert 1 as a [1, N, K] layer (what the op computes for expert=1)."""
    if len(info.shape) != 3:
        return ck, info
    t = {r: Tensor(v.data[1:2], v.dtype) for r, v in ck.layer_tensors(info).items()}
    sub = dataclasses.replace(info, shape=(1, *info.shape[1:]))
    return BlockTensors(sub, t), sub


def _layers(ck):
    return list({(l.format, tuple(l.shape)): l for l in ck.layers()}.values())


def _all_cases(synthetic):
    for s in SCHEMES:
        yield s, synthetic / s
    for name in TOOLKIT_CKPTS:
        yield name, TOOLKIT / name


def test_blocks_dequantize_to_the_whole_layers_rows(synthetic):
    sliced = set()
    for name, folder in _all_cases(synthetic):
        ck = Checkpoint(folder)
        for info in _layers(ck):
            src, info = _one_expert(ck, info)
            sl = row_slicer(info, src.layer_tensors(info))
            if sl is None:
                continue
            sliced.add(info.format)
            mult, take = sl
            whole = dequantize_layer(src, info)
            N = info.shape[-2]
            bounds = list(range(0, N, max(mult, 8))) + [N]
            for n0, n1 in zip(bounds, bounds[1:]):
                sub, t = take(n0, n1)
                np.testing.assert_array_equal(dequantize_layer(BlockTensors(sub, t), sub), whole[..., n0:n1, :],
                                              err_msg=f"{name} {info.name} rows {n0}:{n1}")
    # every format qconform_torch slices was seen (Quark int is not sliced: whole-layer path)
    assert sliced >= {"gptq", "awq", "ct-pack-quantized", "ct-int-quantized", "ct-mxfp4", "gptoss-mxfp4"}, sliced


def _cli_linear(tmp_path, folder, layer, x: torch.Tensor) -> np.ndarray:
    xin, out = tmp_path / "x.safetensors", tmp_path / "y.safetensors"
    save_tensors(xin, {"x": Tensor(x.float().numpy(), "BF16") if x.dtype == torch.bfloat16 else x.numpy()})
    assert qconform(["linear", str(folder), "--layer", layer, "-i", str(xin), "-o", str(out)]) == 0
    return np.asarray(load_tensors(out)["y"].data, np.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_op_in_row_blocks_equals_qconform_linear(dtype, synthetic, tiny_blocks, tmp_path):
    blocked_formats = set()
    for name, folder in _all_cases(synthetic):
        ck = Checkpoint(folder)
        for i, info in enumerate(_layers(ck)):
            if len(info.shape) == 3:
                continue  # stacked experts: qconform linear does not take them (test_fallback_model.py)
            x = torch.from_numpy(np.random.default_rng(i).standard_normal((5, info.shape[1])).astype(np.float32))
            x = x.to(dtype)
            before = op.cache_stats()["exact_blocked"]
            y = QuantLinear.from_checkpoint(ck, info.name, backend="emulator")(x).float().numpy()
            if op.cache_stats()["exact_blocked"] > before:
                blocked_formats.add(info.format)
            ref = _cli_linear(tmp_path, folder, info.name, x)
            np.testing.assert_array_equal(y, ref, err_msg=f"{name} {info.name} {dtype}")
    assert blocked_formats >= {"gptq", "awq", "ct-pack-quantized", "ct-int-quantized", "ct-mxfp4"}, blocked_formats


def test_stacked_expert_in_row_blocks_equals_whole(synthetic, tiny_blocks):
    ck = Checkpoint(synthetic / "gptoss-mxfp4")
    info = ck.layers()[0]
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((4, info.shape[-1])).astype(np.float32))
    y = QuantLinear.from_checkpoint(ck, info.name, backend="emulator", expert=1)(x).numpy()
    w = dequantize_layer(ck, info)[1].astype(np.float64)
    np.testing.assert_array_equal(y, (x.double().numpy() @ w.T).astype(np.float32))  # K=128: exact in float64
    assert op.cache_stats()["exact_blocked"] >= 1


def test_bad_tensor_in_a_later_block_is_the_whole_layers_error(synthetic, tiny_blocks):
    ck = Checkpoint(synthetic / "ct-mxfp4-w4a16")
    info = ck.layers()[0]
    t = dict(ck.layer_tensors(info))
    sc = t["weight_scale"].data.copy()
    sc[40, 2] = 0xFF  # E8M0 NaN in row 40: a later block
    t["weight_scale"] = Tensor(sc, t["weight_scale"].dtype)
    src = BlockTensors(info, t)
    with pytest.raises(FormatError) as whole:
        dequantize_layer(src, info)
    with pytest.raises(FormatError) as blocked:
        exact_by_rows(src, info, np.ones((2, info.shape[1]), np.float32), "float32", 0)
    assert str(blocked.value) == str(whole.value) and "[40, 2]" in str(blocked.value)


def test_a_tensor_with_another_row_count_takes_the_whole_layer(synthetic):
    """A tensor whose row axis disagrees with the layer's N is never sliced (slicing would hide it)."""
    ck = Checkpoint(synthetic / "gptq-w4g32-sym-v1")
    info = ck.layers()[0]
    t = dict(ck.layer_tensors(info))
    t["scales"] = Tensor(np.concatenate([t["scales"].data, t["scales"].data[:, :8]], axis=1), t["scales"].dtype)
    assert row_slicer(info, t) is None
    with pytest.raises(FormatError, match="scales"):
        exact_by_rows(BlockTensors(info, t), info, np.ones((2, info.shape[1]), np.float32), "float32", 0)


@pytest.mark.parametrize("scheme", ["gptq-w4g32-asym-v2", "ct-w8a8-int8", "ct-w4a8-g32-sym", "ct-mxfp4-w4a4",
                                    "gptoss-mxfp4"])
def test_block_working_set_within_budget(scheme, tmp_path):
    """tracemalloc peak of one 1024 x 1024 layer's reference: <= 1 MiB budget + 0.5 MiB (x's copies, block
    bookkeeping) by blocks, where the whole layer takes > 32 bytes per weight element (the test can fail)."""
    N = K = 1024
    write_checkpoint(tmp_path / scheme, scheme, n=N, k=K)
    ck = Checkpoint(tmp_path / scheme)
    src, info = _one_expert(ck, ck.layers()[0])
    # in memory before measuring, as the op holds them: the packed tensors are not the budget
    src = BlockTensors(info, src.layer_tensors(info))
    x = np.random.default_rng(0).standard_normal((4, K)).astype(np.float32)

    def peak(fn):
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            fn()
            return tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()

    whole = peak(lambda: exact_by_rows(src, info, x, "float32", 1 << 30))
    blocked = peak(lambda: exact_by_rows(src, info, x, "float32", 1 * MiB))
    # the whole layer holds at least its fp32 dequantized weight or int8 codes and their float copies (A16: ~5.6 bytes
    # per element since emulator/fast_linear_w16.py widens the weight by cached row blocks; W4A4 ~65)
    assert whole > 4 * N * K
    assert blocked <= 1 * MiB + MiB // 2, f"{blocked / MiB:.2f} MiB"


@pytest.mark.parametrize("scheme", ["gptq-w4g32-asym-v2-actorder", "ct-w8a8-int8", "ct-mxfp4-w4a4", "gptoss-mxfp4"])
def test_opcheck_on_the_blocked_exact_path(scheme, synthetic, tiny_blocks):
    ck = Checkpoint(synthetic / scheme)
    info = ck.layers()[0]
    m = QuantLinear.from_checkpoint(ck, info.name, backend="emulator", expert=1 if len(info.shape) == 3 else None)
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((6, info.shape[-1])).astype(np.float32))
    before = op.cache_stats()["exact_blocked"]
    res = torch.library.opcheck(torch.ops.qconform.quant_linear.default, (x, m.weights(), m.spec, "emulator"))
    assert res and all(v == "SUCCESS" for v in res.values()), res
    assert op.cache_stats()["exact_blocked"] > before


def test_blocks_equal_the_whole_layer_everywhere(tmp_path):
    """A 1024 x 1024 layer, K large enough for float64 rounding to matter: the blocks' float64 sums differ
    from the whole layer's in their last bits, yet every output element is equal (the float64 bound decides
    almost all of them; the reference decides the rest from their exact value)."""
    write_checkpoint(tmp_path / "l", "gptq-w4g32-asym-v2", n=1024, k=1024)
    ck = Checkpoint(tmp_path / "l")
    info = ck.layers()[0]
    src = BlockTensors(info, ck.layer_tensors(info))
    x = np.random.default_rng(0).standard_normal((4, 1024)).astype(np.float32)
    whole = linear_layer(src, info, x, out_dtype="float32")
    y, st = exact_by_rows(src, info, x, "float32", 1 * MiB)
    assert st["blocks"] > 1
    np.testing.assert_array_equal(y, whole.y.astype(np.float32))


def test_blocks_decide_what_float64_cannot_like_the_whole_layer(tmp_path):
    """A compressed-tensors int4 layer built so that float64 cannot decide any output element: each exact
    value is 1 + 2**-24 (a float32 midpoint) + or - 2**-80 (group 0: codes 1, 1 at scale 1; group 1: code
    +-1 at scale 2**-24 times x = 2**-56). Blocks and whole layer both return the exact value rounded once
    (1 + 2**-23 where the tail is positive, 1 where negative), which float64 alone (RNE of the bare
    midpoint: 1 everywhere) would not."""
    from emulator.formats import compressed_tensors as ct

    n, k = 256, 64
    write_checkpoint(tmp_path / "c", "ct-w4a16-g32-sym", n=n, k=k)
    ck = Checkpoint(tmp_path / "c")
    info = ck.layers()[0]
    q = np.zeros((n, k), np.int8)
    q[:, 0] = q[:, 1] = 1
    q[:, 32] = np.where(np.arange(n) % 3 == 0, -1, 1)
    scales = np.stack([np.ones(n), np.full(n, 2.0 ** -24)], axis=1).astype(np.float16)
    t = ct.pack_ct_packed(ct.CtCodes(q=q, scales=scales), ct.CtPackParams(num_bits=4, strategy="group", group_size=32,
                                                                          symmetric=True))
    tensors = dict(ck.layer_tensors(info))
    tensors["weight_packed"] = Tensor(t.weight_packed, tensors["weight_packed"].dtype)
    tensors["weight_scale"] = Tensor(t.weight_scale, "F16")
    src = BlockTensors(info, tensors)
    x = np.zeros((2, k), np.float32)
    x[:, 0], x[:, 1], x[0, 32], x[1, 32] = 1.0, 2.0 ** -24, 2.0 ** -56, -(2.0 ** -56)
    whole = linear_layer(src, info, x, out_dtype="float32")
    assert whole.y_ambiguous.all()
    tail_positive = np.outer([1, -1], np.where(np.arange(n) % 3 == 0, -1, 1)) > 0
    want = np.where(tail_positive, np.float32(1 + 2.0 ** -23), np.float32(1.0))
    np.testing.assert_array_equal(whole.y.astype(np.float32), want)
    y, st = exact_by_rows(src, info, x, "float32", 0)
    assert st["blocks"] > 1 and st["ambiguous"] == 2 * n
    np.testing.assert_array_equal(y, want)


