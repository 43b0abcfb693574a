"""The uncached fallback's steps on one 128 x 4096 row block, one thread (docs/performance.md#fallback).

Run: ``python -m benchmarks.fallback_steps`` (about 20 s). Each step and the way it replaced are timed
alternately in one loop, best of ``--repeat`` (the host is shared: compare within a line, not across
runs). Every replaced way is checked to give the same bits first. Steps:

- MXFP4: the old gather of each byte's two E2M1 values then a multiply by the scale broadcast over
  32-element groups, against the one gather from the (scale byte, packed byte) table of products
  (``fast_dequant._scaled_pairs_u64``) with its index;
- GPTQ: the two-copy word transpose of a block against using a column-major qweight's block in place
  (``fast_unpack.transposed_field_rows``), and the transpose a row-major (loaded) qweight still pays;
- integer formats: the group scale step ``w *= s`` (s broadcast over 128-element groups) in NumPy against
  torch's multiply (qconform_torch/blocked.py ``TorchScaledRowsTimesX``);
- the rest of an integer block (spread nibbles, ``q - z`` in int8, cast) and the block's sgemv at M = 1.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from emulator.formats import fast_dequant
from emulator.formats.fast_unpack import spread_fields
from emulator.parallel import single_threaded_blas

R, K = 128, 4096


def _best_many(fns, repeat: int) -> list[float]:
    for f in fns:
        f()
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, f in enumerate(fns):
            t0 = time.perf_counter()
            f()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def _line(name: str, fns: dict, repeat: int) -> None:
    ts = _best_many(list(fns.values()), repeat)
    print(f"{name:34s} " + "   ".join(f"{k}: {t * 1e6:6.0f} us" for k, t in zip(fns, ts)), flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30)
    repeat = ap.parse_args(argv).repeat
    import torch

    torch.set_num_threads(1)
    with single_threaded_blas():
        _steps(repeat, torch)


def _steps(repeat: int, torch) -> None:
    rng = np.random.default_rng(0)

    # MXFP4: realistic scale bytes (a layer's span of ~30 exponents)
    p = rng.integers(0, 256, (R, K // 2), dtype=np.uint8)
    sb = rng.integers(110, 140, (R, K // 32), dtype=np.uint8)
    v = np.empty((R, K), np.float32)
    pairs = fast_dequant._byte_pairs_f32().view(np.uint64).reshape(256)
    table = fast_dequant._scaled_pairs_u64()
    e8m0 = fast_dequant._E8M0_F32

    def mx_old():
        np.take(pairs, p, out=v.view(np.uint64), mode="wrap")
        v3 = v.reshape(R, -1, 32)
        np.multiply(v3, e8m0[sb][..., None], out=v3)

    def mx_new():
        lanes = np.multiply(sb, np.uint64(0x0100_0100_0100_0100), dtype=np.uint64)
        idx = np.repeat(lanes, 4, axis=1).view(np.uint16)
        np.bitwise_or(idx, p, out=idx)
        np.take(table, idx, out=v.view(np.uint64), mode="wrap")

    mx_old()
    a = v.copy()
    mx_new()
    assert np.array_equal(a.view(np.uint32), v.view(np.uint32))
    _line("MXFP4 block", {"gather + scale": mx_old, "one table gather": mx_new}, repeat)

    # GPTQ word transpose of one block, qweight [K/8, N] column-major (as made) and row-major (as loaded)
    words = rng.integers(-(2 ** 31), 2 ** 31, (K // 8, 4096), dtype=np.int64).astype(np.int32).view(np.uint32)
    fortran = np.asfortranarray(words)

    def two_copies(pu=fortran):
        return np.ascontiguousarray(np.ascontiguousarray(pu[:, 256:256 + R]).T)

    def in_place():
        w = fortran[:, 256:256 + R].T
        assert w.flags.c_contiguous
        return w

    assert np.array_equal(two_copies(), in_place())
    _line("GPTQ block words, column-major", {"two copies": two_copies, "in place": in_place}, repeat)
    _line("GPTQ block words, row-major", {"two copies": lambda: two_copies(words)}, repeat)

    # the integer block's steps (codes as GPTQ sym int4 gives them)
    w = np.ascontiguousarray(fortran[:, 256:256 + R].T)
    z = np.full((R, K // 128, 1), 8, np.int8)
    s = (rng.standard_normal((R, K // 128, 1)) * 0.01).astype(np.float32)
    out = np.empty((R, K), np.float32)
    o3 = out.reshape(R, -1, 128)
    q = spread_fields(w, 4)
    d = np.subtract(q.reshape(R, -1, 128).view(np.int8), z)

    def scale_numpy():
        o3[...] = d
        np.multiply(o3, s, out=o3)

    def scale_torch():
        o3[...] = d
        t = torch.from_numpy(o3)
        torch.mul(t, torch.from_numpy(s), out=t)

    scale_numpy()
    a = out.copy()
    scale_torch()
    assert np.array_equal(a.view(np.uint32), out.view(np.uint32))
    _line("int block: cast + group scale", {"NumPy": scale_numpy, "torch multiply": scale_torch}, repeat)
    xt = rng.standard_normal((K, 1)).astype(np.float32)
    yt = np.empty((R, 1), np.float32)
    _line("int block: other steps", {
        "spread nibbles": lambda: spread_fields(w, 4),
        "q - z int8": lambda: np.subtract(q.reshape(R, -1, 128).view(np.int8), z),
        "cast": lambda: o3.__setitem__(Ellipsis, d),
        "sgemv M=1": lambda: np.matmul(out, xt, out=yt)}, repeat)


if __name__ == "__main__":
    main()
