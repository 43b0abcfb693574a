"""What the loader knows of one quantized layer (``LayerInfo``): format, shape, bits, group, tensors.

Semantics: docs/checkpoints.md. A leaf module: the checkpoint folder (checkpoint.py) and the
format detection (detect.py) both build on it.
"""

from __future__ import annotations

import dataclasses

__all__ = ["LayerInfo"]


@dataclasses.dataclass
class LayerInfo:
    """One quantized layer as the checkpoint stores it."""

    name: str
    format: str  # gptq | awq | ct-pack-quantized | ct-int-quantized | ct-mxfp4 | gptoss-mxfp4
    shape: tuple  # logical [N, K], or [E, N, K] for stacked experts
    bits: int
    group_size: int  # -1: one group spans K
    sym: bool | None
    act_order: bool
    zero_convention: str | None  # v1 | v2 | literal | offset | None
    tensors: dict  # role -> full tensor name
    activation: dict | None = None  # activation quantization the checkpoint declares
    scale_dtype: str | None = None

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["shape"] = list(self.shape)
        return d
