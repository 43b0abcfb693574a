"""The one interface every backend implements.

Semantics: docs/backends.md#interface.

A backend answers, in this order (the order vLLM's kernel selection uses):

1. ``availability()``   — usable on this host? if not, why (library missing,
   import error, no device, ISA missing); the library version;
2. ``can_implement(case)`` — for a concrete scheme + parameters + shapes:
   yes, or the reason it cannot;
3. ``declared(case)``   — the arithmetic it claims: which named emulator
   variants it follows and in which dtypes it forms weights, accumulates and
   rounds the output (checked by the conformance suite);
4. ``prepare(case, tensors)`` — repack canonical checkpoint tensors into the
   kernel's own layout, as the inference engine does;
5. ``run(prepared, x)`` — the output, as a NumPy array of the output dtype's
   values (float32 holding fp16/bf16 values is fine).

A quantize-only case (``case.spec.quantize_only``: activations in, codes + scales out, no weights;
docs/conformance.md#quantize-only-cases) calls ``quantize(prepared, x)`` instead of ``run``. A backend
that does not override ``quantize`` refuses every such case by name in ``can_implement`` (enforced here,
for every subclass), so none can pass one silently.

The conformance code talks to backends only through this interface.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import logging
import warnings
from typing import Any

import numpy as np

from emulator.declaration import Declared
from emulator.schemes import DEFAULT_SCALE_DTYPE, SCHEMES, WEIGHT_FORMATS, Case

__all__ = [
    "SCHEMES",
    "WEIGHT_FORMATS",
    "DEFAULT_SCALE_DTYPE",
    "Case",
    "Availability",
    "Support",
    "Declared",
    "Prepared",
    "Backend",
    "BackendError",
    "yes",
    "no",
    "quiet_library_import",
]

#: loggers that warn at import on every CPU host: torchao for each optional CUDA extension it cannot load
#: (none can here), torch for each Enum a library registers with its pytree
_IMPORT_NOISE = ("torchao", "torchao.kernel.intmm", "torch.utils._pytree")


@contextlib.contextmanager
def quiet_library_import(python_warnings: bool = True):
    """Import a kernel library without its import-time log warnings (availability is reported by the adapter,
    with its reason; these lines would only repeat on every command: `qconform backends`, `qconform model`);
    ``python_warnings``: also Python's ``warnings`` (False keeps them, e.g. around a model load)."""
    saved = {n: logging.getLogger(n).level for n in _IMPORT_NOISE}
    for n in _IMPORT_NOISE:
        logging.getLogger(n).setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            if python_warnings:
                warnings.simplefilter("ignore")
            yield
    finally:
        for n, lvl in saved.items():
            logging.getLogger(n).setLevel(lvl)


class BackendError(RuntimeError):
    """A backend failed in a way that is its own fault (not the input's)."""


@dataclasses.dataclass(frozen=True)
class Availability:
    available: bool
    reason: str = ""
    version: str | None = None
    device: str | None = None


@dataclasses.dataclass(frozen=True)
class Support:
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


def yes() -> Support:
    return Support(True, "")


def no(reason: str) -> Support:
    return Support(False, reason)


@dataclasses.dataclass
class Prepared:
    """What ``prepare`` returns: the kernel's own tensors plus anything ``run`` needs."""

    case: Case
    data: dict[str, Any]


class Backend(abc.ABC):
    """Base class: subclasses set ``name`` and implement the five methods."""

    name: str = "?"
    #: one line: which public kernel / PR the adapter covers
    covers: str = ""
    #: dispatcher priority: higher is preferred (docs/backends.md#dispatcher)
    priority: int = 0

    def __init__(self, **params: str):
        self.params = dict(params)

    @property
    def label(self) -> str:
        if not self.params:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))

    @abc.abstractmethod
    def availability(self) -> Availability: ...

    @abc.abstractmethod
    def can_implement(self, case: Case) -> Support: ...

    @abc.abstractmethod
    def declared(self, case: Case) -> Declared: ...

    @abc.abstractmethod
    def prepare(self, case: Case, tensors: dict[str, np.ndarray]) -> Prepared: ...

    @abc.abstractmethod
    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray: ...

    def quantize(self, prepared: Prepared, x: np.ndarray) -> dict[str, np.ndarray]:
        """Quantize-only cases: {"codes", "scale"[, "zero_point"], "dequantized"} in the dtypes and shapes of
        emulator/quantize_only.output_contract (docs/conformance.md#quantize-only-cases)."""
        raise NotImplementedError(f"{self.name} has no activation-quantization entry point")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("can_implement")
        if own is None or getattr(own, "_quantize_gate", False):
            return

        def can_implement(self, case, _own=own):
            if case.spec.quantize_only and type(self).quantize is Backend.quantize:
                return no(f"{self.name} implements no activation quantization entry point (Backend.quantize): "
                          f"quantize-only scheme {case.scheme} is not a kernel of this backend")
            return _own(self, case)

        can_implement._quantize_gate = True
        can_implement.__doc__ = own.__doc__
        cls.can_implement = can_implement

    def schemes(self) -> list[str]:
        """Schemes this backend can implement for some case (for listings)."""
        return []

    def known_defect(self, case: Case) -> str | None:
        """A defect of the kernel the adapter knows for ``case`` (it returns wrong numbers or crashes), or None.

        The suite still runs such cases (the defect is a fail or crash verdict, waived only by name); the
        dispatcher never routes a case to it (docs/backends.md#dispatcher)."""
        return None
