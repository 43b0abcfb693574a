"""Bit-level numerics: rounding modes, float formats, E2M1, E8M0 and MX scale rules.

Semantics: docs/formats.md#numerics.
"""

from .rounding import Rounding, NanToInt, round_to_integer, quantize_to_int, as_float64  # noqa: F401
from .floats import FloatFormat, Overflow, FP32, FP16, BF16, E2M1, round_to_format, round_to_dtype, encode, decode  # noqa: F401
