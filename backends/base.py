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

The conformance code talks to backends only through this interface.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import numpy as np

__all__ = [
    "SCHEMES",
    "Case",
    "Availability",
    "Support",
    "Declared",
    "Prepared",
    "Backend",
    "BackendError",
    "yes",
    "no",
]

#: scheme name -> (weight kind, activation kind)
SCHEMES = {
    "w4a16": ("int4", "a16"),  # GPTQ / AWQ / compressed-tensors int4 weights, 16-bit activations
    "w8a16": ("int8", "a16"),  # int8 weights (GPTQ 8-bit or CT int8), 16-bit activations
    "w8a8": ("int8", "int8"),  # CT int-quantized weights, dynamic per-token int8 activations
    "w4a8": ("int4", "int8"),  # int4 weights, dynamic per-token int8 activations
    "w4a16-mxfp4": ("mxfp4", "a16"),
    "w4a4-mxfp4": ("mxfp4", "mxfp4"),
    "w4a16-moe": ("int4", "a16"),  # GPTQ symmetric int4 experts
}

WEIGHT_FORMATS = ("gptq", "awq", "ct-pack-quantized", "ct-int-quantized", "ct-mxfp4")
#: checkpoint scale dtype of a Case that names none (every other format: float16)
DEFAULT_SCALE_DTYPE = {"ct-int-quantized": "float32"}


class BackendError(RuntimeError):
    """A backend failed in a way that is its own fault (not the input's)."""


@dataclasses.dataclass(frozen=True)
class Case:
    """A concrete scheme instance: what ``can_implement``/``declared``/``prepare`` look at."""

    scheme: str
    weight_format: str
    M: int
    N: int
    K: int
    group_size: int = 128  # -1: channel-wise
    sym: bool = True
    act_order: bool = False
    zero_convention: str | None = None  # v1 | v2 | literal | offset
    act_dtype: str = "bfloat16"  # float32 | float16 | bfloat16
    out_dtype: str | None = None  # default: act_dtype
    bias: bool = False
    E: int = 0  # MoE: experts
    top_k: int = 0
    bits: int = 4
    #: dtype of the checkpoint's float scales (float16 | bfloat16 | float32); None: the format's default,
    #: float32 for ct-int-quantized (vLLM keeps W8A8 scales in fp32) and float16 otherwise
    scale_dtype: str | None = None

    def __post_init__(self):
        if self.scale_dtype is None:
            object.__setattr__(self, "scale_dtype", DEFAULT_SCALE_DTYPE.get(self.weight_format, "float16"))
        if self.scheme not in SCHEMES:
            raise ValueError(f"unknown scheme {self.scheme!r}; known: {', '.join(SCHEMES)}")
        if self.weight_format not in WEIGHT_FORMATS:
            raise ValueError(f"unknown weight format {self.weight_format!r}; known: {', '.join(WEIGHT_FORMATS)}")
        if self.act_dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"act_dtype must be float32, float16 or bfloat16, got {self.act_dtype!r}")

    @property
    def output_dtype(self) -> str:
        return self.out_dtype or self.act_dtype

    @property
    def group(self) -> int:
        return self.K if self.group_size in (-1, 0) else self.group_size

    def describe(self) -> str:
        extra = f" E={self.E} top_k={self.top_k}" if self.E else ""
        return (f"{self.scheme}/{self.weight_format} M={self.M} N={self.N} K={self.K} g={self.group_size} "
                f"{'sym' if self.sym else 'asym'}{' act_order' if self.act_order else ''} x={self.act_dtype}{extra}")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


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


@dataclasses.dataclass(frozen=True)
class Declared:
    """The arithmetic a backend claims for one case.

    ``variants`` maps emulator variant axes to named values, e.g.
    ``{"act_rounding": "rne", "reciprocal": "recip_scale", "scale_dtype": "float32",
       "zero_read": "ignore_qzeros", "mx_scale_rule": "floor"}``;
    ``weight_dtype`` is the dtype dequantized weights are rounded to before the
    product ("exact" when they are used exactly), ``act_compute_dtype`` the dtype
    activations are rounded to before the product (None: used as given),
    ``accumulate`` the accumulation dtype ("float32", "int32", "float64"), and
    ``output`` the output dtype, rounded once from the accumulator with
    ``output_rounding`` ("rne", or "rtz" for a kernel that truncates, e.g. an
    fp32 -> bf16 conversion that drops the low 16 bits); both are honoured by
    conformance.acceptance (docs/conformance.md#acceptance).

    Variant keys that describe stages around the GEMM: ``bias_stage``
    ("accumulator": the bias is added before the output rounding, canonical;
    "after_output_rounding": the engine adds it to the rounded output),
    ``azp_epilogue`` ("exact" | "compensation", asymmetric W8A8), ``moe``
    (a dict of emulator.moe.MoeVariant fields, ``act_quant`` included).
    """

    variants: dict
    weight_dtype: str = "exact"
    act_compute_dtype: str | None = None
    accumulate: str = "float32"
    output: str = "float32"
    output_rounding: str = "rne"
    notes: str = ""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


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

    def schemes(self) -> list[str]:
        """Schemes this backend can implement for some case (for listings)."""
        return []
