"""Whole-model reference runs: ``qconform model CKPT --tokens 1,2,3 [--backend ...] -o OUT.safetensors``.

Semantics: docs/fallback.md#run-a-model.

The model skeleton comes from the checkpoint's ``config.json`` through transformers (its
``quantization_config`` removed: no quantizer integration is used, none of them runs without GPU
libraries). Every quantized linear is replaced by a ``QuantLinear`` and every Mixtral / Qwen-MoE
style block of quantized experts by a ``QuantExperts`` and every gpt-oss block of stacked MXFP4 experts
(``experts.gate_up_proj`` / ``experts.down_proj``, ``*_blocks`` / ``*_scales``) by a ``QuantGptOssExperts``;
every other tensor (embeddings, norms,
router, lm_head) is loaded from the checkpoint, and a model tensor the checkpoint does not hold is an
error, never a random weight. One forward pass on the token ids gives ``logits`` [T, vocab] float32.

``dense_reference_model`` builds the same model with plain float64 ``nn.Linear`` weights from
``qconform dequant`` (emulator/layers.py ``dequantize_layer``): the float64 dense forward the
emulator run is compared with.
"""

from __future__ import annotations

import logging
import re

import numpy as np
import torch
from torch import nn

from emulator.checkpoint import Checkpoint, LayerInfo
from emulator.errors import FormatError, UnsupportedFormatError
from emulator.layers import dequantize_layer

from .module import QuantExperts, QuantGptOssExperts, QuantLinear, checkpoint_tensor_to_torch, open_ckpt

__all__ = ["load_quantized_model", "dense_reference_model", "forward_logits", "expert_groups", "stacked_groups"]

log = logging.getLogger("qconform.fallback")

#: checkpoint module path -> transformers 5 module path (Mixtral checkpoints name the MoE block
#: ``block_sparse_moe``; transformers 5 names it ``mlp``)
ALIASES = (("block_sparse_moe.", "mlp."),)
_EXPERT = re.compile(r"^(?P<prefix>.+)\.experts\.(?P<e>\d+)\.(?P<proj>w1|w2|w3|gate_proj|up_proj|down_proj)$")
#: a stacked [E, N, K] expert layer of a gpt-oss block (transformers' GptOssExperts parameter names)
_STACKED = re.compile(r"^(?P<prefix>.+)\.experts\.(?P<proj>gate_up_proj|down_proj)$")
_ROLE = {"w1": "gate", "gate_proj": "gate", "w3": "up", "up_proj": "up", "w2": "down", "down_proj": "down"}


def _alias(name: str) -> str:
    for a, b in ALIASES:
        name = name.replace(a, b)
    return name


def expert_groups(layers: list[LayerInfo]) -> tuple[dict[str, dict[int, dict[str, LayerInfo]]], list[LayerInfo]]:
    """(expert block prefix -> expert -> gate/up/down -> layer, the other layers)."""
    groups: dict = {}
    rest = []
    for info in layers:
        m = _EXPERT.match(info.name)
        if m and len(info.shape) == 2:
            groups.setdefault(m["prefix"], {}).setdefault(int(m["e"]), {})[_ROLE[m["proj"]]] = info
        else:
            rest.append(info)
    return groups, rest


def stacked_groups(layers: list[LayerInfo]) -> tuple[dict[str, dict[str, LayerInfo]], list[LayerInfo]]:
    """(gpt-oss expert block prefix -> gate_up_proj / down_proj -> its stacked [E, N, K] layer, the other layers)."""
    groups: dict = {}
    rest = []
    for info in layers:
        m = _STACKED.match(info.name)
        if m and len(info.shape) == 3:
            groups.setdefault(m["prefix"], {})[m["proj"]] = info
        else:
            rest.append(info)
    return groups, rest


def _gptoss_experts_module(model, prefix: str, parts: dict[str, LayerInfo]):
    """The model's gpt-oss experts module of a block, checked against the checkpoint's stacked layers."""
    mod = _get(model, _alias(prefix + ".experts"), prefix)
    missing = {"gate_up_proj", "down_proj"} - set(parts)
    if missing:
        raise FormatError(f"{prefix}.experts: the checkpoint has no quantized {', '.join(sorted(missing))} "
                          "(a gpt-oss expert block needs both)")
    if not all(hasattr(mod, a) for a in ("_apply_gate", "alpha", "limit", "gate_up_proj_bias", "down_proj_bias")):
        raise UnsupportedFormatError(f"{prefix}.experts: stacked experts {list(parts['gate_up_proj'].shape)} in a "
                                     f"{type(mod).__name__}; whole-model runs wire stacked experts into gpt-oss "
                                     "expert blocks only (transformers' GptOssExperts)")
    for proj, info in parts.items():
        want = tuple(getattr(mod, proj).shape)  # transformers holds W^T: [E, K, N]
        E, N, K = info.shape
        if want != (E, K, N):
            raise FormatError(f"{info.name}: checkpoint shape {list(info.shape)} ([E, N, K]) does not match the "
                              f"model's {proj} {list(want)} ([E, K, N])")
    return mod


def _skeleton(folder, dtype: torch.dtype, *, meta: bool = False):
    """The model from config.json; ``meta``: no storage at all (every tensor is assigned from the
    checkpoint or replaced by a quantized module afterwards), so no fp32 copy of a quantized weight
    is ever allocated."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(folder))
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds: one line, exit 2
        raise FormatError(f"{folder}: config.json is not one transformers can read ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:300]})") from None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config._attn_implementation = "eager"  # one attention implementation for every run of the model
    config._experts_implementation = "eager"  # the per-expert loop (grouped_mm takes no float64)
    torch.manual_seed(0)
    try:
        if meta:
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    except Exception as e:  # noqa: BLE001
        raise UnsupportedFormatError(f"{folder}: transformers cannot build model_type "
                                     f"{getattr(config, 'model_type', '?')!r} ({type(e).__name__}: {e})") from None
    return model.eval()


def _get(model: nn.Module, path: str, what: str) -> nn.Module:
    try:
        return model.get_submodule(path)
    except AttributeError:
        raise FormatError(f"{what}: the model built from config.json has no module {path!r}") from None


def _set(model: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, leaf = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def _experts_module(model, prefix: str, experts: dict, what: str):
    """The transformers fused experts module of an expert block, checked against the checkpoint's experts."""
    mod = _get(model, _alias(prefix + ".experts"), what)
    n = getattr(mod, "num_experts", None)
    if n is None or sorted(experts) != list(range(n)):
        raise FormatError(f"{prefix}: the checkpoint has experts {sorted(experts)[:8]}...; the model expects "
                          f"{n} fused experts")
    for e, parts in experts.items():
        missing = {"gate", "up", "down"} - set(parts)
        if missing:
            raise FormatError(f"{prefix}.experts.{e}: missing quantized {', '.join(sorted(missing))} projection")
    return mod


def _replace_quantized(model, ck: Checkpoint, backend: str) -> dict[str, nn.Module]:
    stacked, rest = stacked_groups(ck.layers())
    groups, rest = expert_groups(rest)
    modules: dict[str, nn.Module] = {}
    for info in rest:
        if len(info.shape) != 2:
            raise UnsupportedFormatError(f"{info.name}: stacked experts {list(info.shape)} ({info.format}) outside "
                                         "a gpt-oss expert block (...experts.gate_up_proj / down_proj) are not wired "
                                         "into whole-model runs; QuantLinear.from_checkpoint(..., expert=e) runs "
                                         "each expert")
        path = _alias(info.name)
        old = _get(model, path, info.name)
        if not isinstance(old, nn.Linear) or (old.out_features, old.in_features) != tuple(info.shape):
            raise FormatError(f"{info.name}: checkpoint shape {list(info.shape)} does not match the model's "
                              f"{type(old).__name__} {getattr(old, 'out_features', '?')}x{getattr(old, 'in_features', '?')}")
        if old.bias is not None and "bias" not in info.tensors:
            raise FormatError(f"{info.name}: the model's linear has a bias the checkpoint does not store")
        q = QuantLinear.from_checkpoint(ck, info.name, backend=backend)
        _set(model, path, q)
        modules[info.name] = q
    for prefix, experts in groups.items():
        old = _experts_module(model, prefix, experts, prefix)
        lists = {r: [] for r in ("gate", "up", "down")}
        for e in sorted(experts):
            for r in lists:
                q = QuantLinear.from_checkpoint(ck, experts[e][r].name, backend=backend)
                lists[r].append(q)
                modules[experts[e][r].name] = q
        _set(model, _alias(prefix + ".experts"), QuantExperts(lists["gate"], lists["up"], lists["down"], old.act_fn))
    for prefix, parts in stacked.items():
        old = _gptoss_experts_module(model, prefix, parts)
        per = {}
        for proj, info in parts.items():
            per[proj] = list(QuantLinear.stacked_from_checkpoint(ck, info.name, backend=backend))
            for e, q in enumerate(per[proj]):
                modules[f"{info.name}[{e}]"] = q
        new = QuantGptOssExperts(per["gate_up_proj"], per["down_proj"], alpha=float(old.alpha),
                                 limit=float(old.limit), apply_gate=type(old)._apply_gate)
        _set(model, _alias(prefix + ".experts"), new)
    return modules


def _assign(model: nn.Module, key: str, value: torch.Tensor) -> None:
    path, _, leaf = key.rpartition(".")
    mod = model.get_submodule(path) if path else model
    if leaf in mod._parameters:
        mod._parameters[leaf] = nn.Parameter(value, requires_grad=False)
    else:
        mod._buffers[leaf] = value


def _load_plain(model, ck: Checkpoint, used: set[str], dtype: torch.dtype, filled: set[str] = frozenset()) -> None:
    """Every remaining model tensor from the checkpoint (assigned, not copied: the skeleton may be on the
    meta device); missing or unused checkpoint tensors are errors, never random weights."""
    by_model = {_alias(n): n for n in ck.tensor_names() if n not in used}
    consumed = set()
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    for key, t in model.state_dict(keep_vars=True).items():
        if key in filled:
            continue
        src = by_model.get(key)
        if src is None:
            if tied and key == "lm_head.weight":
                continue
            raise FormatError(f"{ck.folder}: the model needs tensor {key!r}; the checkpoint does not hold it")
        value = checkpoint_tensor_to_torch(ck.tensor(src))
        if tuple(value.shape) != tuple(t.shape):
            raise FormatError(f"{src}: shape {list(value.shape)}; the model expects {list(t.shape)}")
        _assign(model, key, value.to(t.dtype if t.is_floating_point() else value.dtype))
        consumed.add(src)
    if tied:
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    unused = sorted(set(by_model.values()) - consumed)
    if unused:
        raise FormatError(f"{ck.folder}: checkpoint tensor(s) used by no module of the model: {', '.join(unused[:5])}"
                          + (" ..." if len(unused) > 5 else ""))
    _materialize_buffers(model)


def _materialize_buffers(model: nn.Module) -> None:
    """Non-persistent buffers a meta skeleton left without storage (rotary inv_freq): the module is
    built again on the CPU from the config; any other tensor still on meta is an error."""
    for name, mod in list(model.named_modules()):
        if any(b is not None and b.is_meta for b in mod._buffers.values()):
            if any(True for _ in mod.parameters(recurse=False)):
                raise FormatError(f"module {name!r} has buffers the checkpoint cannot supply")
            _set(model, name, type(mod)(config=model.config))
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise FormatError(f"model tensor(s) neither in the checkpoint nor computable: {', '.join(left[:5])}")


def _quantized_tensor_names(ck: Checkpoint) -> set[str]:
    return {n for info in ck.layers() for n in info.tensors.values()}


def load_quantized_model(folder, *, backend: str = "auto", dtype: torch.dtype = torch.float32):
    """(model with QuantLinear / QuantExperts, {layer name: its QuantLinear})."""
    ck = open_ckpt(folder)
    model = _skeleton(ck.folder, dtype, meta=True)
    modules = _replace_quantized(model, ck, backend)
    _load_plain(model, ck, _quantized_tensor_names(ck), dtype)
    return model, modules


def dense_reference_model(folder, *, dtype: torch.dtype = torch.float64):
    """The same model with every quantized weight dequantized exactly (``qconform dequant``) into plain
    ``nn.Linear`` / fused-expert weights of ``dtype``: the dense reference forward."""
    ck = open_ckpt(folder)
    model = _skeleton(ck.folder, dtype)
    stacked, rest = stacked_groups(ck.layers())
    groups, rest = expert_groups(rest)
    filled = set()
    with torch.no_grad():
        for prefix, parts in stacked.items():  # gpt-oss: transformers' own GptOssExperts, in ``dtype``
            mod = _gptoss_experts_module(model, prefix, parts)
            for proj, info in parts.items():
                w = torch.from_numpy(dequantize_layer(ck, info).astype(np.float64)).transpose(1, 2)
                getattr(mod, proj).copy_(w)
                filled.add(_alias(info.name))
        for info in rest:
            if len(info.shape) != 2:
                raise UnsupportedFormatError(f"{info.name}: stacked experts are not wired into whole-model runs")
            lin = _get(model, _alias(info.name), info.name)
            lin.weight.copy_(torch.from_numpy(dequantize_layer(ck, info).astype(np.float64)))
            filled.add(_alias(info.name) + ".weight")
            if "bias" in info.tensors:
                lin.bias.copy_(checkpoint_tensor_to_torch(ck.tensor(info.tensors["bias"])).to(dtype))
                filled.add(_alias(info.name) + ".bias")
        for prefix, experts in groups.items():
            mod = _experts_module(model, prefix, experts, prefix)
            for e, parts in experts.items():
                w = {r: torch.from_numpy(dequantize_layer(ck, parts[r]).astype(np.float64)) for r in parts}
                mod.gate_up_proj[e].copy_(torch.cat([w["gate"], w["up"]], dim=0))
                mod.down_proj[e].copy_(w["down"])
            filled |= {_alias(prefix + ".experts.gate_up_proj"), _alias(prefix + ".experts.down_proj")}
    _load_plain(model, ck, _quantized_tensor_names(ck), dtype, filled)
    return model


def parse_tokens(text: str, vocab: int) -> list[int]:
    try:
        toks = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--tokens must be comma-separated integers, got {text[:80]!r}") from None
    if not toks:
        raise ValueError("--tokens is empty: give at least one token id")
    bad = [t for t in toks if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"--tokens: id {bad[0]} is outside the vocabulary [0, {vocab})")
    return toks


def forward_logits(model, tokens: list[int], *, capture: dict[str, nn.Module] | None = None):
    """(logits [T, vocab] float32, {layer name: (x, y) of each call}) for one forward pass."""
    seen: dict[str, list] = {}
    hooks = []
    for name, mod in (capture or {}).items():
        def hook(m, args, out, name=name):
            seen.setdefault(name, []).append((args[0].detach().reshape(-1, m.in_features).float().clone(),
                                              out.detach().reshape(-1, m.out_features).float().clone()))
        hooks.append(mod.register_forward_hook(hook))
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([tokens], dtype=torch.long), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return out.logits[0].float().contiguous(), seen
