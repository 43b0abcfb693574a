"""Bounded memory (docs/fallback.md#memory): a whole-model run with ``--cache-mb 1`` never holds a
full fp32 copy of the model's quantized weights.

Peak RSS is measured in subprocesses (resource.getrusage ru_maxrss).

- ``--backend emulator`` (the canonical reference, by row blocks: qconform_torch/exact_blocks.py): the
  baseline is the same command on a 1-layer model of hidden size 128 (same libraries, same code paths,
  a negligible layer), so the growth covers the packed checkpoint, the block working set
  (max(--cache-mb, 1 MiB)), activations and a stated constant, and *no* per-layer term: a whole-layer
  working set (65 bytes per weight element, measured) of the largest layer would exceed the bound.
- ``--backend auto`` (kernels prepare whole layers): the baseline is a 1-layer model of the same
  architecture, and the bound adds one layer's working set.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import fallback_memory_model as memory_model  # noqa: E402  (this folder is on sys.path: no __init__.py)

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20
#: docs/fallback.md#memory: the reference linear's working set per weight element of the largest layer
#: (fp32 dequantized copy, float64 copies and the float64 error-bound terms of emulator/linear.py)
WORKING_SET_BYTES_PER_ELEM = 80
#: docs/fallback.md#memory: allocator and library slack
CONSTANT = 16 * MiB
#: docs/fallback.md#memory: the exact path's block working set is within max(--cache-mb, 1 MiB)
EXACT_BLOCK_MIN = 1 * MiB
#: what the reference linear of a whole layer allocates per weight element (tracemalloc, every A16 format:
#: tests/fallback/test_fallback_exact_blocks.py): the term the exact path's bound leaves out
WHOLE_LAYER_BYTES_PER_ELEM = 64


def _peak_rss(ckpt: Path, out: Path, backend: str) -> int:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "conformance.cli.main", "model", str(ckpt), "--tokens", "1,2,3,4",
                        "--backend", backend, "--cache-mb", "1", "-o", str(out)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r"cache: budget 1 MiB, peak ([0-9.]+) MiB.*peak RSS ([0-9]+) MiB", r.stdout)
    assert m, r.stdout
    assert float(m.group(1)) <= 1.0  # the cache itself stayed inside its budget
    return int(m.group(2)) * MiB


def test_exact_path_cache_mb_1_has_no_per_layer_term(tmp_path):
    """--backend emulator --cache-mb 1: growth <= packed + budget (what the cache keeps of layers the reference
    takes whole) + max(1 MiB, budget) + constant, a bound that a whole-layer working set of the largest layer
    would break."""
    big, base = tmp_path / "big", tmp_path / "base"
    memory_model.write(big)
    memory_model.write(base, layers=1, hidden=128, intermediate=128)
    packed = sum(f.stat().st_size for f in big.iterdir())
    grown = _peak_rss(big, tmp_path / "o1.safetensors", "emulator") - _peak_rss(base, tmp_path / "o2.safetensors",
                                                                                  "emulator")
    bound = packed + 1 * MiB + max(1 * MiB, EXACT_BLOCK_MIN) + CONSTANT
    whole_layer = WHOLE_LAYER_BYTES_PER_ELEM * memory_model.largest_layer_elems()
    assert bound < packed + whole_layer  # a whole-layer working set would not fit: the test can fail
    assert grown <= bound, f"peak RSS grew {grown / MiB:.0f} MiB; bound {bound / MiB:.0f} MiB (a whole layer's " \
                           f"working set: {whole_layer / MiB:.0f} MiB)"


@pytest.mark.parametrize("backend", ["auto"])  # the exact path has its own, tighter test above
def test_cache_mb_1_peak_rss_bound(backend, tmp_path):
    big, tiny = tmp_path / "big", tmp_path / "tiny"
    memory_model.write(big)
    memory_model.write(tiny, layers=1)
    packed = sum(f.stat().st_size for f in big.iterdir())
    grown = _peak_rss(big, tmp_path / "o1.safetensors", backend) - _peak_rss(tiny, tmp_path / "o2.safetensors",
                                                                               backend)
    bound = packed + 1 * MiB + WORKING_SET_BYTES_PER_ELEM * memory_model.largest_layer_elems() + CONSTANT
    full_fp32 = memory_model.fp32_quantized_bytes()
    assert bound < full_fp32  # the bound excludes a full fp32 copy: the test can fail
    assert grown <= bound, f"peak RSS grew {grown / MiB:.0f} MiB; bound {bound / MiB:.0f} MiB (fp32 copy: " \
                           f"{full_fp32 / MiB:.0f} MiB)"
