"""Write tests/data/fallback/mixtral-gptq-w4g32-sym: a tiny random Mixtral with GPTQ int4 experts.

No toolkit installed here writes MoE GPTQ checkpoints (GPTQModel / AutoGPTQ are not installable
without a GPU build), so this one is written by qconform's own GPTQ writer
(emulator/formats/gptq.py ``quantize_gptq``: round-to-nearest, symmetric, group 32, v1 zeros) under
the tensor names and config of a Mixtral GPTQ export (``block_sparse_moe.experts.E.w1/w2/w3``).
Rerun by hand: ``PYTHONPATH=. python tests/fallback/make_moe_checkpoint.py``; CI never runs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from emulator.formats import gptq
from emulator.tensorfile import Tensor, save_tensors

OUT = Path(__file__).resolve().parents[1] / "data" / "fallback" / "mixtral-gptq-w4g32-sym"
H, I, E, TOPK, VOCAB, HEADS, KV = 64, 64, 4, 2, 128, 4, 1
QCFG = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True, "desc_act": False,
        "checkpoint_format": "gptq"}


def bf16(a: np.ndarray) -> Tensor:
    b = np.asarray(a, np.float32).view(np.uint32)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)  # RNE to bf16
    return Tensor(b.view(np.float32), "BF16")


def main() -> None:
    rng = np.random.default_rng(1234)
    params = gptq.GptqParams(bits=4, group_size=32, sym=True, desc_act=False, zero_convention="gptq")
    t: dict = {}

    def quant(name: str, n: int, k: int, amp: float = 0.05):
        w = (rng.standard_normal((n, k)) * amp).astype(np.float16)
        q = gptq.quantize_gptq(w, params)
        t[f"{name}.qweight"], t[f"{name}.qzeros"], t[f"{name}.scales"] = q.qweight, q.qzeros, q.scales
        t[f"{name}.g_idx"] = (np.arange(k) // 32).astype(np.int32)

    hd = H // HEADS
    p = "model.layers.0"
    quant(f"{p}.self_attn.q_proj", HEADS * hd, H)
    quant(f"{p}.self_attn.k_proj", KV * hd, H)
    quant(f"{p}.self_attn.v_proj", KV * hd, H)
    quant(f"{p}.self_attn.o_proj", H, HEADS * hd)
    for e in range(E):
        quant(f"{p}.block_sparse_moe.experts.{e}.w1", I, H)
        quant(f"{p}.block_sparse_moe.experts.{e}.w3", I, H)
        quant(f"{p}.block_sparse_moe.experts.{e}.w2", H, I)
    t[f"{p}.block_sparse_moe.gate.weight"] = bf16(rng.standard_normal((E, H)) * 0.5)
    t[f"{p}.input_layernorm.weight"] = bf16(1 + 0.1 * rng.standard_normal(H))
    t[f"{p}.post_attention_layernorm.weight"] = bf16(1 + 0.1 * rng.standard_normal(H))
    t["model.norm.weight"] = bf16(1 + 0.1 * rng.standard_normal(H))
    t["model.embed_tokens.weight"] = bf16(rng.standard_normal((VOCAB, H)))
    t["lm_head.weight"] = bf16(rng.standard_normal((VOCAB, H)) * 0.1)
    config = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": H,
              "intermediate_size": I, "num_hidden_layers": 1, "num_attention_heads": HEADS,
              "num_key_value_heads": KV, "head_dim": hd, "num_local_experts": E, "num_experts_per_tok": TOPK,
              "vocab_size": VOCAB, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "hidden_act": "silu",
              "rope_theta": 10000.0, "tie_word_embeddings": False, "router_jitter_noise": 0.0,
              "dtype": "bfloat16", "quantization_config": QCFG,
              "qconform_provenance": "tests/fallback/make_moe_checkpoint.py (qconform's GPTQ writer, RTN)"}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_tensors(OUT / "model.safetensors", t)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
