"""A multi-layer random Llama GPTQ checkpoint whose fp32 weights (184 MiB) dwarf its packed size
(24 MiB): what the bounded-memory test (test_fallback_memory.py) runs. Codes are random (pack_gptq), not
quantized from weights: the test measures memory, not accuracy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from emulator.formats import gptq
from emulator.tensorfile import save_tensors

H, I, LAYERS, HEADS, KV, VOCAB = 512, 1536, 16, 4, 1, 128


def fp32_quantized_bytes() -> int:
    hd = H // HEADS
    per_layer = 2 * H * H + 2 * KV * hd * H + 3 * I * H
    return 4 * LAYERS * per_layer


def largest_layer_elems() -> int:
    return I * H


def write(folder: Path, layers: int = LAYERS, *, hidden: int = H, intermediate: int = I) -> None:
    """``layers`` decoder layers of hidden size ``hidden`` (the test's baseline: 1 layer, hidden 128)."""
    H, I = hidden, intermediate  # noqa: N806 - the module constants' names
    rng = np.random.default_rng(0)
    p = gptq.GptqParams(bits=4, group_size=128, sym=True, desc_act=False, zero_convention="gptq")
    t = {}
    hd = H // HEADS
    shapes = {"self_attn.q_proj": (H, H), "self_attn.k_proj": (KV * hd, H), "self_attn.v_proj": (KV * hd, H),
              "self_attn.o_proj": (H, H), "mlp.gate_proj": (I, H), "mlp.up_proj": (I, H), "mlp.down_proj": (H, I)}
    for layer in range(layers):
        for mod, (n, k) in shapes.items():
            g = k // 128
            codes = gptq.GptqCodes(q=rng.integers(0, 16, (n, k), dtype=np.uint8), zeros=np.full((g, n), 8, np.int64),
                                   scales=(rng.random((g, n)) * 0.01 + 0.001).astype(np.float16),
                                   g_idx=(np.arange(k) // 128).astype(np.int32))
            q = gptq.pack_gptq(codes, p)
            name = f"model.layers.{layer}.{mod}"
            t.update({f"{name}.qweight": q.qweight, f"{name}.qzeros": q.qzeros, f"{name}.scales": q.scales,
                      f"{name}.g_idx": q.g_idx.astype(np.int32)})
        for norm in ("input_layernorm", "post_attention_layernorm"):
            t[f"model.layers.{layer}.{norm}.weight"] = np.ones(H, np.float16)
    t["model.norm.weight"] = np.ones(H, np.float16)
    t["model.embed_tokens.weight"] = rng.standard_normal((VOCAB, H)).astype(np.float16)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": I,
           "num_hidden_layers": layers, "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": hd,
           "vocab_size": VOCAB, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "hidden_act": "silu",
           "tie_word_embeddings": True, "rope_theta": 10000.0,
           "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True,
                                   "desc_act": False, "checkpoint_format": "gptq"}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    save_tensors(folder / "model.safetensors", t)
