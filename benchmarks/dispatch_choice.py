"""What ``auto`` chooses on this host for a GPTQ, a compressed-tensors W4A16 and a W8A8 layer (docs/fallback.md#the-dispatcher).

Run: ``python -m benchmarks.dispatch_choice [--n 2048] [--k 2048] [--tokens 8,128]`` (a minute or two on a
shared 2-core host). For each layer (written by emulator/synthetic.py: GPTQ int4 g32 symmetric, every qzeros
field the midpoint; compressed-tensors W4A16 g32 symmetric; compressed-tensors W8A8 int8 per-channel with
dynamic per-token activations) and each token count, a fresh measured dispatcher (no on-disk cache) times
every admitted contender and the emulator's fast path on a random input, as ``qconform model --backend
auto`` does, and prints its choice line: the contenders with their best-of-three times and the one kept.
Timings are this run's, on this host: compare within a line, not across runs.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

LAYERS = {"GPTQ w4 g32 sym (midpoint qzeros)": "gptq-w4g32-sym-v1", "CT W4A16 g32 sym": "ct-w4a16-g32-sym",
          "CT W8A8 int8": "ct-w8a8-int8"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--tokens", default="8,128")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    a = p.parse_args(argv)
    os.environ["QCONFORM_DISPATCH_CACHE"] = "off"  # measure, never read a previous run's choice
    import torch

    from emulator.checkpoint import Checkpoint
    from emulator.synthetic import write_checkpoint
    from qconform_torch import QuantLinear, op

    tokens = [int(t) for t in a.tokens.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for title, scheme in LAYERS.items():
            write_checkpoint(Path(tmp) / scheme, scheme, n=a.n, k=a.k)
            ck = Checkpoint(Path(tmp) / scheme)
            info = ck.layers()[0]
            for T in tokens:
                op.use_certifications(None)  # a fresh measured policy: nothing kept from the previous line
                op.clear_selections()
                m = QuantLinear.from_checkpoint(ck, info.name, backend="auto")
                x = torch.from_numpy(np.random.default_rng(T).standard_normal((T, a.k)).astype(np.float32))
                m(x.to(getattr(torch, a.dtype)))
                line = op.selection_lines(m.spec)[0]
                head, _, rest = line.partition(" [")
                how, _, skipped = rest.partition("] (skipped: ")
                print(f"{title}, {a.n} x {a.k}, T = {T}, {a.dtype}: {head.split(' -> ', 1)[1]}\n    {how}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
