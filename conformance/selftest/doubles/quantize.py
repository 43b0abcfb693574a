"""Test doubles for the quantize-only judge (docs/conformance.md#quantize-only-cases): the emulator with one
planted defect each in what it returns. Registered through QCONFORM_EXTRA_BACKENDS by the tests
(tests/conformance/test_quantize_only.py); none is a kernel.
"""

import numpy as np

from backends.emulator import EmulatorBackend


class _Planted(EmulatorBackend):
    covers = "test double: the emulator's quantize-only output with a planted defect"

    def plant(self, out: dict) -> dict:  # pragma: no cover - overridden
        raise NotImplementedError

    def quantize(self, prepared, x):
        return self.plant(dict(super().quantize(prepared, x)))


class NoZeroPoint(_Planted):
    name = "qd-nozp"

    def plant(self, out):
        out.pop("zero_point", None)
        return out


class WrongCode(_Planted):
    name = "qd-code"

    def plant(self, out):
        c = out["codes"].copy()
        c.flat[5] = c.flat[5] - 1 if c.flat[5] > c.min() else c.flat[5] + 1
        out["codes"] = c
        return out


class WrongScale(_Planted):
    name = "qd-scale"

    def plant(self, out):
        s = out["scale"].copy()
        if s.dtype == np.uint8:
            s.flat[0] += 1
        else:
            s.view(np.uint32).flat[0] ^= 1  # one ulp
        out["scale"] = s
        return out


class NanScale(_Planted):
    name = "qd-nanscale"

    def plant(self, out):
        out["scale"] = np.full_like(out["scale"], np.nan)
        return out


class WideCodes(_Planted):
    name = "qd-int32"

    def plant(self, out):
        out["codes"] = out["codes"].astype(np.int32)  # the same values in another dtype
        return out


class Empty(_Planted):
    name = "qd-empty"

    def plant(self, out):
        return {}


SPEC = ",".join(f"{c.name}=conformance.selftest.doubles.quantize:{c.__name__}"
                for c in (NoZeroPoint, WrongCode, WrongScale, NanScale, WideCodes, Empty))
