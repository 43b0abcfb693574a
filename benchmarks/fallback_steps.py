"""The uncached fallback's steps on one 128 x 4096 row block, one thread (docs/performance.md#fallback).

Run: ``python -m benchmarks.fallback_steps`` (about 20 s). Each step and the way it replaced are timed
alternately in one loop, best of ``--repeat`` (the host is shared: compare within a line, not across
runs). Every replaced way is checked to give the same bits first. Steps:

- MXFP4: the old gather of each byte's two E2M1 values then a multiply by the scale broadcast over
  32-element groups, against the one gather from the (scale byte, packed byte) table of products
  (``fast_dequant.scaled_pairs_u64``) with its index;
- GPTQ: the two-copy word transpose of a block against using a column-major qweight's block in place
  (``fast_unpack.transposed_field_rows``), and the transpose a row-major (loaded) qweight still pays;
- integer formats: the group scale step ``w *= s`` (s broadcast over 128-element groups) in NumPy against
  torch's multiply (qconform_torch/blocked.py ``TorchScaledRowsTimesX``);
- the rest of an integer block (spread nibbles, ``q - z`` in int8, cast) and the block's sgemv at M = 1.

``--heights [--m M]``: the whole 4096 x 4096 layer of each format (the cases of ``qconform bench``) at M (1) by
row-block height (8, 16, 32, 128 rows, forced for both paths): the uncached path's CPU time on one
thread, then uncached / cached on all cores, each height timed alternately with the others.
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
    ap.add_argument("--heights", action="store_true", help="the whole layer by row-block height instead")
    ap.add_argument("--m", type=int, default=1, help="activation rows for --heights")
    args = ap.parse_args(argv)
    repeat = args.repeat
    if args.heights:
        _heights(min(repeat, 9), args.m)
        return
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
    pairs = fast_dequant.byte_pairs_f32().view(np.uint64).reshape(256)
    table = fast_dequant.scaled_pairs_u64()
    e8m0 = fast_dequant.E8M0_F32

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



def _heights(repeat: int, m: int = 1, heights=(8, 16, 32, 64, 128)) -> None:
    import contextlib
    import dataclasses

    import emulator.parallel as par
    from backends.base import Case
    from backends.registry import create
    from conformance.cases.inputs import make_inputs
    from emulator.formats import fast_matmul
    from qconform_torch.blocked import blocked_fast_linear

    n = k = 4096
    cases = {"gptq": Case("w4a16", "gptq", 1, n, k, group_size=128, sym=True, zero_convention="v1",
                          act_dtype="bfloat16"),
             "ct": Case("w4a16", "ct-pack-quantized", 1, n, k, group_size=128, sym=True, act_dtype="bfloat16"),
             "mxfp4": Case("w4a16-mxfp4", "ct-mxfp4", 1, n, k, group_size=32, act_dtype="bfloat16")}
    default_rows, default_threads = fast_matmul.block_rows, par.row_threads

    @contextlib.contextmanager
    def height(rows, one_thread=False):
        with single_threaded_blas():  # BLAS on one thread first (it is a no-op once one thread is set)
            fast_matmul.block_rows = lambda row_bytes, align=1: rows
            if one_thread:
                par.row_threads = lambda: 1
            try:
                yield
            finally:
                fast_matmul.block_rows, par.row_threads = default_rows, default_threads

    for fmt, case in cases.items():
        case = dataclasses.replace(case, M=m)
        inp = make_inputs(case, 0)
        x = np.ascontiguousarray(np.asarray(inp.x, np.float32))
        emu = create("emulator")
        prep = emu.prepare(case, inp.tensors)
        cpu = {h: float("inf") for h in heights}
        unc = {h: float("inf") for h in heights}
        cac = {h: float("inf") for h in heights}
        for _ in range(repeat):
            for h in heights:
                with height(h, one_thread=True):
                    t0 = time.process_time()
                    blocked_fast_linear(emu, case, inp.tensors, x, None, 0)
                    cpu[h] = min(cpu[h], time.process_time() - t0)
                fast_matmul.block_rows = lambda row_bytes, align=1, h=h: h
                try:
                    t0 = time.perf_counter()
                    blocked_fast_linear(emu, case, inp.tensors, x, None, 0)
                    t1 = time.perf_counter()
                    emu.run(prep, x)
                    t2 = time.perf_counter()
                finally:
                    fast_matmul.block_rows = default_rows
                unc[h], cac[h] = min(unc[h], t1 - t0), min(cac[h], t2 - t1)
        print(f"{fmt:6s} M={m}  one thread, uncached CPU ms: " + " / ".join(f"{h} rows {cpu[h] * 1e3:.1f}" for h in heights)
              + "\n       all cores, uncached / cached ms: "
              + " / ".join(f"{h} rows {unc[h] * 1e3:.1f} / {cac[h] * 1e3:.1f} = {unc[h] / cac[h]:.2f}x" for h in heights),
              flush=True)


if __name__ == "__main__":
    main()
