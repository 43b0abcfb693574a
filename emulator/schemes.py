"""The schemes qconform defines and the concrete layer instance (``Case``) every stage looks at.

Semantics: docs/formats.md (one section per weight format) and docs/conformance.md#cases.

A *scheme* names a weight kind and an activation kind (``w4a16``: int4 weights, 16-bit
activations). A ``Case`` is one concrete instance: scheme, checkpoint weight format, shapes,
group size, symmetry, act order, dtypes. It lives here, below ``backends`` and ``conformance``,
because the emulator's declared computation (emulator/declaration.py) is a function of it.
"""

from __future__ import annotations

import dataclasses

__all__ = ["Scheme", "SCHEMES", "QUANTIZE_SCHEMES", "WEIGHT_FORMATS", "DEFAULT_SCALE_DTYPE", "ACT_DTYPES", "Case", "scheme"]


@dataclasses.dataclass(frozen=True)
class Scheme:
    """One scheme: the kind of its weights and of its activations, and the formats that carry it."""

    name: str
    weights: str  # int4 | int8 | mxfp4 | none (a quantize-only scheme: activations alone)
    activations: str  # a16 | int8 | uint8 | mxfp4 | moe (16-bit activations through a fused MoE block)
    formats: tuple[str, ...]
    title: str

    @property
    def int8_activations(self) -> bool:
        return self.activations == "int8" and not self.quantize_only

    @property
    def quantize_only(self) -> bool:
        """An activation quantizer alone: input -> codes, scales (+ zero points), judged bit-exactly
        (docs/conformance.md#quantize-only-cases), no weights and no matmul."""
        return self.weights == "none"


_ALL_SCHEMES = (
    Scheme("w4a16", "int4", "a16", ("gptq", "awq", "ct-pack-quantized"),
           "int4 weights (GPTQ / AWQ / compressed-tensors), 16-bit activations"),
    Scheme("w8a16", "int8", "a16", ("gptq", "ct-int-quantized"), "int8 weights (GPTQ 8-bit or CT int8), 16-bit activations"),
    Scheme("w8a8", "int8", "int8", ("ct-int-quantized",), "CT int8 weights, dynamic per-token int8 activations"),
    Scheme("w4a8", "int4", "int8", ("gptq", "ct-pack-quantized"), "int4 weights, dynamic per-token int8 activations"),
    Scheme("w4a16-mxfp4", "mxfp4", "a16", ("ct-mxfp4",), "MXFP4 weights, 16-bit activations"),
    Scheme("w4a4-mxfp4", "mxfp4", "mxfp4", ("ct-mxfp4",), "MXFP4 weights and MXFP4-quantized activations"),
    Scheme("w4a16-moe", "int4", "moe", ("gptq",), "GPTQ symmetric int4 experts of a fused MoE block"),
    # quantize-only schemes (docs/conformance.md#quantize-only-cases): weight format "none"
    Scheme("q-int8-token", "none", "int8", ("none",),
           "dynamic per-token int8 activation quantization alone (sym: amax/127; asym: min/max + zero point)"),
    Scheme("q-uint8-tensor", "none", "uint8", ("none",),
           "dynamic per-tensor uint8 activation quantization alone (ONNX DynamicQuantizeLinear)"),
    Scheme("q-mxfp4", "none", "mxfp4", ("none",),
           "MXFP4 activation quantization alone (OCP MX: blocks of 32, E8M0 scales, E2M1 codes)"),
)

#: scheme name -> Scheme, in the order the suite lists them
SCHEMES: dict[str, Scheme] = {s.name: s for s in _ALL_SCHEMES}

WEIGHT_FORMATS = ("gptq", "awq", "ct-pack-quantized", "ct-int-quantized", "ct-mxfp4", "none")
#: the schemes that quantize activations alone (no weights, no matmul)
QUANTIZE_SCHEMES = tuple(s.name for s in _ALL_SCHEMES if s.quantize_only)
ACT_DTYPES = ("float32", "float16", "bfloat16")
#: checkpoint scale dtype of a Case that names none (every other format: float16)
DEFAULT_SCALE_DTYPE = {"ct-int-quantized": "float32"}


def scheme(name: str) -> Scheme:
    """The Scheme called ``name``; ValueError naming the known ones otherwise."""
    try:
        return SCHEMES[name]
    except KeyError:
        raise ValueError(f"unknown scheme {name!r}; known: {', '.join(SCHEMES)}") from None


@dataclasses.dataclass(frozen=True)
class Case:
    """A concrete scheme instance: what ``can_implement``/``declared``/``prepare`` look at."""

    scheme: str
    weight_format: str
    M: int
    N: int
    K: int
    group_size: int = 128  # -1: channel-wise
    sym: bool = True  # weights' symmetry; for W8A8 (always symmetric int8 weights) the activations'
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
        scheme(self.scheme)
        if self.weight_format not in WEIGHT_FORMATS:
            raise ValueError(f"unknown weight format {self.weight_format!r}; known: {', '.join(WEIGHT_FORMATS)}")
        if self.act_dtype not in ACT_DTYPES:
            raise ValueError(f"act_dtype must be float32, float16 or bfloat16, got {self.act_dtype!r}")
        if (self.weight_format == "none") != self.spec.quantize_only:
            raise ValueError(f"weight format 'none' belongs to the quantize-only schemes "
                             f"({', '.join(QUANTIZE_SCHEMES)}); scheme {self.scheme!r} with {self.weight_format!r}")

    @property
    def spec(self) -> Scheme:
        return SCHEMES[self.scheme]

    @property
    def output_dtype(self) -> str:
        return self.out_dtype or self.act_dtype

    @property
    def group(self) -> int:
        return self.K if self.group_size in (-1, 0) else self.group_size

    @property
    def channelwise(self) -> bool:
        return self.group_size in (-1, 0)

    @property
    def moe_w2_group_size(self) -> int:
        """Group size of a MoE block's w2 (input dimension I = N): channel-wise stays one group over I;
        otherwise the case's group, capped at I (docs/formats/moe.md)."""
        return -1 if self.channelwise else min(self.group, self.N)

    @property
    def gptq_zero_convention(self) -> str:
        """GPTQ ``zero_convention`` of the checkpoint (``gptq`` = v1, ``gptq_v2``)."""
        return "gptq_v2" if self.zero_convention == "v2" else "gptq"

    @property
    def act_symmetric(self) -> bool:
        """Whether the checkpoint's dynamic int8 activations are symmetric: W8A8 cases carry it in
        ``sym`` (their int8 weights are always symmetric); every other int8-activation scheme
        defines symmetric activations. The quantize-only ``q-int8-token`` carries it in ``sym`` too."""
        return bool(self.sym) if self.scheme in ("w8a8", "q-int8-token") else True

    def describe(self) -> str:
        extra = f" E={self.E} top_k={self.top_k}" if self.E else ""
        return (f"{self.scheme}/{self.weight_format} M={self.M} N={self.N} K={self.K} g={self.group_size} "
                f"{'sym' if self.sym else 'asym'}{' act_order' if self.act_order else ''} x={self.act_dtype}{extra}")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)
