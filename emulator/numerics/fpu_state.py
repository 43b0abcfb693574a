"""The host thread's floating-point state that the reference's arithmetic depends on.

Semantics: docs/formats.md#floating-point-formats. Every exact step of the emulator assumes IEEE 754 binary
arithmetic with gradual underflow: a float32 subnormal widens to float64 exactly, a product or quotient that lands
among the subnormals keeps its value. x86's MXCSR can turn that off per thread (DAZ reads subnormal inputs as
zero, FTZ writes subnormal results as zero); ``torch.set_flush_denormal(True)``, which inference code calls for
speed, sets both on the calling thread, and NumPy's casts and ufuncs then obey them. The reference would then
answer +0 where the exact value is a subnormal (or a normal number computed from one: x = 2^-140, w = 2^100 gave
+0 for 2^-40), silently. ``require_gradual_underflow`` refuses that state with one line instead.
"""

from __future__ import annotations

import numpy as np

from ..errors import HostStateError

__all__ = ["subnormals_flushed", "require_gradual_underflow"]

_SMALLEST = np.array([2.0 ** -149], dtype=np.float32)  # float32's smallest subnormal
_MIN_NORMAL = np.array([2.0 ** -126], dtype=np.float32)


def subnormals_flushed() -> bool:
    """Whether this thread reads subnormal inputs as zero (DAZ) or writes subnormal results as zero (FTZ)."""
    widened = _SMALLEST.astype(np.float64)[0]  # DAZ: the cast reads 0
    halved = (_MIN_NORMAL * np.float32(0.5))[0]  # FTZ: 2^-127 is written as 0
    return not (widened == 2.0 ** -149 and halved == np.float32(2.0 ** -127))


def require_gradual_underflow() -> None:
    """Raise ``HostStateError`` where ``subnormals_flushed()``: the reference cannot be exact in that state."""
    if subnormals_flushed():
        raise HostStateError("this thread flushes subnormals to zero (x86 MXCSR FTZ/DAZ, e.g. after "
                             "torch.set_flush_denormal(True)): the reference needs IEEE gradual underflow; "
                             "turn it off (torch.set_flush_denormal(False)) around the call")
