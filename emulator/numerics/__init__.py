"""Bit-level numerics: rounding modes, float formats and the one fast rounding to them, E2M1, E8M0 and MX scale
rules, the output grid, exact sums, and the one SQNR.

Semantics: docs/formats.md#numerics.
"""

from .rounding import Rounding, NanToInt, round_to_integer, quantize_to_int, as_float64  # noqa: F401
from .floats import FloatFormat, Overflow, FP32, FP16, BF16, E2M1, round_to_format, round_to_dtype, encode, decode  # noqa: F401
from .fast_round import FAST_DTYPES, round_fast  # noqa: F401
from .sqnr import sqnr_db  # noqa: F401
