import os, sys, tempfile, time
from pathlib import Path
import numpy as np
sys.path.insert(0, os.getcwd())
threads = int(sys.argv[1]); fmt = sys.argv[2]
from benchmarks import model_bench as mb
import torch
torch.set_num_threads(threads)
from qconform_torch import op
folder = Path(tempfile.mkdtemp()) / fmt
mb.write_llama(folder, fmt, hidden=1024, intermediate=2816, layers=2, vocab=8192)
ex = mb._qconform(folder, "emulator", op.DEFAULT_CACHE_MB)
de = mb._dense(folder)
op.set_cache_budget(op.DEFAULT_CACHE_MB)
for T in (8, 128):
    tokens = [int(v) for v in np.random.default_rng(1).integers(0, 8192, T)]
    for name, f in (("exact", ex), ("dense", de)):
        f(tokens); bc = bw = 1e9
        for _ in range(3):
            c0 = time.process_time(); w0 = time.perf_counter(); f(tokens)
            bc = min(bc, time.process_time() - c0); bw = min(bw, time.perf_counter() - w0)
        print(fmt, T, threads, name, f"cpu {bc*1e3:.0f} ms wall {bw*1e3:.0f} ms", flush=True)
