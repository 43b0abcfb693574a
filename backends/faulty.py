"""Deliberately faulty backends that test the suite itself (never real kernels).

They are not in the registry's default list: tests (and ``qconform selftest``)
register them with ``QCONFORM_EXTRA_BACKENDS="name=backends.faulty:Class,..."``.
Each computes through the emulator and then misbehaves in one way real kernels
do: killing the process with a signal, hanging, or returning NaNs.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np

from .emulator import EmulatorBackend


class _Faulty(EmulatorBackend):
    covers = "a deliberately faulty test backend"
    priority = -1000

    def __init__(self, **params):
        only = params.pop("only", None)  # misbehave only for this scheme (others run normally)
        super().__init__(**params)
        self.only = only
        if only is not None:
            self.params["only"] = only  # part of the label

    def _triggered(self, prepared) -> bool:
        return self.only is None or prepared.case.scheme == self.only


class SegfaultBackend(_Faulty):
    name = "faulty-segfault"

    def run(self, prepared, x, **inputs):
        if self._triggered(prepared):
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().run(prepared, x, **inputs)


class AbortBackend(_Faulty):
    name = "faulty-abort"

    def run(self, prepared, x, **inputs):
        if self._triggered(prepared):
            os.abort()
        return super().run(prepared, x, **inputs)


class HangBackend(_Faulty):
    name = "faulty-hang"

    def run(self, prepared, x, **inputs):
        if self._triggered(prepared):
            time.sleep(3600)
        return super().run(prepared, x, **inputs)


class NanBackend(_Faulty):
    name = "faulty-nan"

    def run(self, prepared, x, **inputs):
        y = super().run(prepared, x, **inputs)
        if self._triggered(prepared):
            y = np.full_like(y, np.nan)
        return y


class ZeroBackend(_Faulty):
    name = "faulty-zero"

    def run(self, prepared, x, **inputs):
        y = super().run(prepared, x, **inputs)
        return np.zeros_like(y) if self._triggered(prepared) else y


class RaiseBackend(_Faulty):
    name = "faulty-raise"

    def run(self, prepared, x, **inputs):
        if self._triggered(prepared):
            raise RuntimeError("kernel reported an internal error")
        return super().run(prepared, x, **inputs)
