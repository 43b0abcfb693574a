import os, sys, tempfile, time, json
from pathlib import Path
import numpy as np
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tests", "emulator"))
threads = int(sys.argv[1]); layers = int(sys.argv[2]); fmts = sys.argv[3].split(",")
from benchmarks import model_bench as mb
import torch
torch.set_num_threads(threads)
clock = time.process_time if threads == 1 else time.perf_counter
from qconform_torch import op, exact_blocks
from emulator import linear as lin
import linear_w16_before as before
new_w16 = exact_blocks._w16
def old_w16(x32, w, bias, dtype, weights):
    return before.linear_w16(x32, w, bias, out_dtype=dtype, fp32_magnitudes=True)
out = {}
for fmt in fmts:
    folder = Path(tempfile.mkdtemp()) / fmt
    mb.write_llama(folder, fmt, hidden=1024, intermediate=2816, layers=layers, vocab=8192)
    ex = mb._qconform(folder, "emulator", op.DEFAULT_CACHE_MB)
    de = mb._dense(folder)
    for T in (8, 128):
        tokens = [int(v) for v in np.random.default_rng(1).integers(0, 8192, T)]
        fns = {"exact-new": (ex, new_w16), "exact-old": (ex, old_w16), "dense": (de, None)}
        best = {k: 1e9 for k in fns}; ys = {}
        for _ in range(3):
            for k, (f, w16) in fns.items():
                if w16 is not None:
                    exact_blocks._w16 = w16; op.set_cache_budget(op.DEFAULT_CACHE_MB)
                ys[k] = f(tokens)
                t0 = clock(); f(tokens); best[k] = min(best[k], clock() - t0)
        same = bool(np.array_equal(ys["exact-new"].view(np.uint32), ys["exact-old"].view(np.uint32)))
        row = {k: round(v * 1e3, 1) for k, v in best.items()}
        row.update(new_dense=round(best["exact-new"] / best["dense"], 2), old_dense=round(best["exact-old"] / best["dense"], 2), same_bits=same)
        print(fmt, T, threads, row, flush=True)
        out[f"{fmt}|{T}|{threads}"] = row
print(json.dumps(out))
