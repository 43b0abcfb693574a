"""``torch.nn.Module`` wrappers of ``torch.ops.qconform.quant_linear``.

Semantics: docs/fallback.md#the-module.

- ``QuantLinear.from_checkpoint(ckpt, layer_name, backend="auto", expert=None)``: one layer of any
  format qconform reads (GPTQ v1/v2 incl. act order and GPTQModel's packed v1 zeros, AWQ,
  compressed-tensors int4/int8/MXFP4, gpt-oss stacked MXFP4 experts with ``expert=e``; W8A8, W4A8,
  W4A4 as the checkpoint declares its activations). It holds the checkpoint's packed tensors as
  they are stored (no dequantized copy) and is validated once, as ``qconform dequant`` validates.
- ``QuantExperts``: a Mixtral / Qwen-MoE style expert block whose experts are quantized linears
  (gate, up, down per expert), with the ``forward(hidden, top_k_index, top_k_weights)`` of
  transformers' fused experts modules.
- ``QuantGptOssExperts``: a gpt-oss expert block (stacked MXFP4 ``gate_up_proj`` / ``down_proj``, expert
  biases, clamped SwiGLU), with the ``forward(hidden, router_indices, routing_weights)`` of transformers'
  ``GptOssExperts``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from emulator.checkpoint import Checkpoint, LayerInfo
from emulator.layers import dequantize_layer

from .op import layer_spec, roles

__all__ = ["QuantLinear", "QuantExperts", "QuantGptOssExperts", "open_ckpt"]

_TORCH = {"F16": torch.float16, "F32": torch.float32, "F64": torch.float64, "I64": torch.int64,
          "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8}


def open_ckpt(ckpt) -> Checkpoint:
    return ckpt if isinstance(ckpt, Checkpoint) else Checkpoint(ckpt)


def checkpoint_tensor_to_torch(t) -> torch.Tensor:
    if t.dtype == "BF16":
        return torch.from_numpy(np.ascontiguousarray(t.data, np.float32)).to(torch.bfloat16)
    if t.dtype not in _TORCH:
        raise ValueError(f"cannot hold a {t.dtype} checkpoint tensor")
    return torch.from_numpy(np.ascontiguousarray(t.data))


class QuantLinear(nn.Module):
    """y = x @ W^T (+ bias) for one quantized checkpoint layer; x [..., K] -> y [..., N] in x's dtype."""

    def __init__(self, info: LayerInfo, tensors: dict[str, torch.Tensor], *, backend: str = "auto",
                 expert: int | None = None):
        super().__init__()
        if backend not in ("auto", "emulator"):
            from backends.registry import create

            create(backend)  # an unknown name or parameter fails here, not at the first forward call
        self.info = info
        self.backend = backend
        self.expert = expert
        self.in_features = int(info.shape[-1])
        self.out_features = int(info.shape[-2])
        self._roles = roles(info)
        self._spec = layer_spec(info, expert)
        for role in self._roles:  # not persistent: the checkpoint, not a state_dict, is the source
            self.register_buffer("q_" + role, tensors[role], persistent=False)

    @classmethod
    def from_checkpoint(cls, ckpt, layer_name: str, *, backend: str = "auto", expert: int | None = None,
                        validate: bool = True) -> "QuantLinear":
        ck = open_ckpt(ckpt)
        info = ck.layer(layer_name)
        if validate:  # a module built from a checkpoint dequant refuses is never built
            dequantize_layer(ck, info)
        if (expert is None) != (len(info.shape) == 2):
            raise ValueError(f"{info.name}: shape {list(info.shape)}: "
                             + ("stacked experts need expert=e" if expert is None else "a 2-D layer takes no expert"))
        tensors = {role: checkpoint_tensor_to_torch(t) for role, t in ck.layer_tensors(info).items()}
        return cls(info, tensors, backend=backend, expert=expert)

    @classmethod
    def stacked_from_checkpoint(cls, ckpt, layer_name: str, *, backend: str = "auto") -> nn.ModuleList:
        """Every expert of a stacked [E, N, K] layer (gpt-oss blocks) as a ModuleList of QuantLinear; the
        experts share the layer's packed tensors (one copy), each dequantizes only its own blocks."""
        ck = open_ckpt(ckpt)
        info = ck.layer(layer_name)
        if len(info.shape) != 3:
            raise ValueError(f"{info.name}: shape {list(info.shape)} is not a stacked [E, N, K] layer")
        dequantize_layer(ck, info)
        tensors = {role: checkpoint_tensor_to_torch(t) for role, t in ck.layer_tensors(info).items()}
        return nn.ModuleList(cls(info, tensors, backend=backend, expert=e) for e in range(info.shape[0]))

    @property
    def spec(self) -> str:
        """The op's ``layer`` argument for this module (``op.layer_spec``)."""
        return self._spec

    def weights(self) -> list[torch.Tensor]:
        b = self._buffers  # the buffers as registered (nn.Module.__getattr__ per role costs more than the dict)
        return [b["q_" + r] for r in self._roles]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = torch.ops.qconform.quant_linear(x.reshape(-1, self.in_features), self.weights(), self._spec, self.backend)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        e = "" if self.expert is None else f", expert={self.expert}"
        return (f"{self.info.name}: {self.info.format} {self.in_features}->{self.out_features}, "
                f"backend={self.backend}{e}")


class QuantExperts(nn.Module):
    """Experts as quantized linears: expert e computes down(act(gate(x)) * up(x)) (Mixtral w1/w3/w2).

    ``forward(hidden [T, H], top_k_index [T, k], top_k_weights [T, k])`` sums each token's experts
    weighted by its routing weights, in the order transformers' fused experts modules do (experts in
    index order, ``index_add_`` into a zero tensor of the hidden dtype), so only the linears differ.
    """

    def __init__(self, gate: list[QuantLinear], up: list[QuantLinear], down: list[QuantLinear], act_fn):
        super().__init__()
        if not (len(gate) == len(up) == len(down)) or not gate:
            raise ValueError(f"QuantExperts: gate/up/down lists differ in length ({len(gate)}/{len(up)}/{len(down)})")
        self.num_experts = len(gate)
        self.gate = nn.ModuleList(gate)
        self.up = nn.ModuleList(up)
        self.down = nn.ModuleList(down)
        self.act_fn = act_fn

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        out = torch.zeros_like(hidden_states)
        for e in range(self.num_experts):
            top_k_pos, token_idx = torch.where((top_k_index == e).T)
            if token_idx.numel() == 0:
                continue
            h = hidden_states[token_idx]
            h = self.act_fn(self.gate[e](h)) * self.up[e](h)
            h = self.down[e](h) * top_k_weights[token_idx, top_k_pos, None]
            out.index_add_(0, token_idx, h.to(out.dtype))
        return out


class QuantGptOssExperts(nn.Module):
    """gpt-oss experts with quantized stacked weights: transformers 5.24.0 ``GptOssExperts`` (models/gpt_oss/
    modeling_gpt_oss.py, the eager ``forward``) with each ``x @ W[e]`` replaced by a ``QuantLinear``.

    The semantics, each as transformers' eager code has it (docs/fallback.md#gpt-oss-experts):

    - experts in ascending index order, each over the (top-k slot, token) pairs routed to it in
      ``torch.where`` order (slot-major), its output added with ``index_add_`` into a zero tensor of
      the hidden dtype;
    - ``gate_up = gate_up_proj(x) + gate_up_proj_bias[e]``: the linear rounded once to x's dtype (the
      op's reference), then the bias added in x's dtype;
    - the activation is transformers' own ``GptOssExperts._apply_gate`` (called, not copied):
      interleaved gate/up (gate = even columns, up = odd), gate clamped above at ``limit`` (7.0), up
      clamped to [-limit, limit], ``glu = gate * sigmoid(alpha * gate)`` (alpha 1.702),
      ``(up + 1) * glu``;
    - ``out = down_proj(act) + down_proj_bias[e]``, then times the token's routing weight.

    Routing (top-k of the router logits, softmax over the k chosen logits) stays in transformers'
    ``GptOssTopKRouter``, which is not quantized.
    """

    def __init__(self, gate_up: list[QuantLinear], down: list[QuantLinear], *, alpha: float, limit: float,
                 apply_gate):
        super().__init__()
        if len(gate_up) != len(down) or not gate_up:
            raise ValueError(f"QuantGptOssExperts: gate_up/down lists differ in length ({len(gate_up)}/{len(down)})")
        self.num_experts = len(gate_up)
        self.gate_up = nn.ModuleList(gate_up)
        self.down = nn.ModuleList(down)
        two_i, h = gate_up[0].out_features, down[0].out_features
        # filled from the checkpoint (the model's own tensor names) by qconform_torch/model.py
        self.gate_up_proj_bias = nn.Parameter(torch.empty(self.num_experts, two_i, device="meta"), requires_grad=False)
        self.down_proj_bias = nn.Parameter(torch.empty(self.num_experts, h, device="meta"), requires_grad=False)
        self.alpha = alpha
        self.limit = limit
        self._apply_gate_fn = apply_gate

    def forward(self, hidden_states: torch.Tensor, router_indices=None, routing_weights=None) -> torch.Tensor:
        out = torch.zeros_like(hidden_states)
        for e in range(self.num_experts):
            top_k_pos, token_idx = torch.where((router_indices == e).T)
            if token_idx.numel() == 0:
                continue
            h = self.gate_up[e](hidden_states[token_idx]) + self.gate_up_proj_bias[e]
            h = self._apply_gate_fn(self, h)
            h = self.down[e](h) + self.down_proj_bias[e]
            out.index_add_(0, token_idx, (h * routing_weights[token_idx, top_k_pos, None]).to(out.dtype))
        return out
