"""Shared plumbing of the backends that quantize activations alone (reference libraries' runtime quantizers).

Semantics: docs/conformance.md#quantize-only-cases and docs/backends.md. Such a backend implements
``Backend.quantize`` only: it refuses every linear scheme by name, has nothing to repack (``prepare``
keeps the case), and ``run`` is never reached. Subclasses set ``SCHEMES`` (scheme -> why it applies) and
implement ``_quantize(case, x) -> dict`` with the library's own calls.
"""

from __future__ import annotations

import numpy as np

from .base import Backend, BackendError, Case, Prepared, Support, no, yes

__all__ = ["QuantizeOnlyBackend", "e2m1_codes_from_values", "e8m0_bytes_from_scales"]

# E2M1 magnitudes by code 0..7 (OCP MX v1.0 Table 5); code | 8 is the negative value
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


class QuantizeOnlyBackend(Backend):
    """A runtime quantizer: ``quantize`` for its schemes, every other case refused with the reason."""

    SCHEMES: dict = {}

    def can_implement(self, case: Case) -> Support:
        if case.scheme not in self.SCHEMES:
            return no(f"{self.name} is an activation quantizer: it covers the quantize-only scheme(s) "
                      f"{', '.join(self.SCHEMES)}, not {case.scheme}")
        av = self.availability()
        if not av.available:
            return no(av.reason)
        return self._can(case)

    def _can(self, case: Case) -> Support:
        return yes()

    def schemes(self) -> list[str]:
        return list(self.SCHEMES)

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        return Prepared(case, {})

    def run(self, prepared: Prepared, x, **inputs):
        raise BackendError(f"{self.name} has no linear kernel: it quantizes activations only")

    def quantize(self, prepared: Prepared, x: np.ndarray) -> dict:
        return self._quantize(prepared.case, np.asarray(x, np.float32))

    def _quantize(self, case: Case, x: np.ndarray) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError


def e2m1_codes_from_values(v: np.ndarray) -> np.ndarray:
    """The E2M1 code of each value a library returns as a float on the E2M1 grid (sign bit from the float's
    own sign, so -0 is code 8). A value off the grid raises BackendError: it is no E2M1 value, and
    rounding it here would hide the library's answer."""
    v = np.asarray(v, np.float64)
    mag = np.abs(v)
    idx = np.searchsorted(_E2M1, mag)
    idx = np.clip(idx, 0, 7)
    ok = _E2M1[idx] == mag
    if not ok.all():
        i = tuple(int(a) for a in np.argwhere(~ok)[0])
        raise BackendError(f"the library returned {v[i]!r} at {list(i)}, which is not an E2M1 value")
    return (idx + 8 * np.signbit(v)).astype(np.uint8)


def e8m0_bytes_from_scales(s: np.ndarray) -> np.ndarray:
    """The E8M0 byte of each power-of-two scale a library returns as a float (2**(b - 127) -> b). NaN and +Inf
    map to 0xFF: a library that decodes its bytes as ``2.0 ** (b - 127)`` in fp32 (compressed-tensors
    ``maybe_convert_from_mx_exp``) turns byte 255 into 2**128 = +Inf. Any other scale that is not a power of
    two in [2**-127, 2**127] raises BackendError."""
    s = np.asarray(s, np.float64)
    out = np.full(s.shape, 0xFF, np.uint8)
    fin = ~(np.isnan(s) | (s == np.inf))
    m, e = np.frexp(s[fin])
    good = (m == 0.5) & (e - 1 >= -127) & (e - 1 <= 127)
    if not good.all():
        bad = s[fin][~good][0]
        raise BackendError(f"the library returned the scale {bad!r}, which is not an E8M0 power of two")
    out[fin] = (e - 1 + 127).astype(np.uint8)
    return out
