"""The calling thread's state while the op computes a layer (docs/fallback.md#the-op).

- NumPy's BLAS on the calling thread (``emulator.parallel.single_threaded_blas``): OpenBLAS's own threads spin
  after each call and stall torch's next operations;
- IEEE gradual underflow: where the model turned on flush-to-zero (``torch.set_flush_denormal(True)`` sets the
  calling thread's MXCSR FTZ/DAZ, which NumPy's casts and ufuncs obey), it is turned off for the layer's
  computation and back on after, so the reference stays exact (emulator/numerics/fpu_state.py) and the model's
  own operations keep the mode it chose.
"""

from __future__ import annotations

import contextlib

import torch

from emulator.numerics.fpu_state import subnormals_flushed
from emulator.parallel import single_threaded_blas

__all__ = ["op_thread_state"]


@contextlib.contextmanager
def op_thread_state():
    flushed = subnormals_flushed()
    if flushed:
        torch.set_flush_denormal(False)
    try:
        with single_threaded_blas():
            yield
    finally:
        if flushed:
            torch.set_flush_denormal(True)
