"""Errors the emulator raises for malformed input.

Every error names *where* (layer, tensor) and *what* is wrong, so the CLI can
print it as one line instead of a traceback.
"""

from __future__ import annotations


class QconformError(Exception):
    """Base class: a problem with the input that the user can fix."""


class FormatError(QconformError, ValueError):
    """A tensor does not match the format's layout (shape, dtype, value range)."""

    def __init__(self, message: str, *, layer: str | None = None, tensor: str | None = None):
        self.layer = layer
        self.tensor = tensor
        where = ".".join(p for p in (layer, tensor) if p)
        super().__init__(f"{where}: {message}" if where else message)


class UnsupportedFormatError(QconformError, ValueError):
    """A quant_method / scheme / parameter combination qconform does not define."""


class HostStateError(QconformError, RuntimeError):
    """The host thread's floating-point state keeps the reference from being exact (emulator/numerics/fpu_state.py)."""


def require(cond: bool, message: str, *, layer: str | None = None, tensor: str | None = None) -> None:
    """Raise FormatError(message) unless ``cond``."""
    if not cond:
        raise FormatError(message, layer=layer, tensor=tensor)
