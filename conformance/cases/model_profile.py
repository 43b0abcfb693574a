"""The ``model`` profile: the layer shapes of widely used checkpoints at real token counts.

Semantics and the published configurations these shapes come from: docs/conformance.md#model-profile.
Kernels take other code paths at real layer sizes (blocking, threading, K tails of 14336) than at the
small shapes of the ci profile; this profile runs them there. Shapes are ``N x K`` = out x in features.
"""

from __future__ import annotations

from backends.base import Case

__all__ = ["MODEL_M", "MOE_M", "MODEL_LAYERS", "MODEL_GENERATOR", "model_cases"]

#: token counts: one decode token, a small batch, a prefill chunk, a long prefill
MODEL_M = (1, 16, 128, 512)
#: the MoE block's token counts: the same (its M = 512 exact reference is the profile's most expensive
#: case; docs/performance.md#model-profile)
MOE_M = MODEL_M
#: the generator of every model-profile case (conformance/cases/generators.py ``gen_layer_codes``)
MODEL_GENERATOR = "layer-codes"

#: checkpoint -> its published config.json values this profile's shapes derive from
MODEL_CONFIGS = {
    # meta-llama/Meta-Llama-3-8B config.json
    "Llama-3-8B": {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                   "num_key_value_heads": 8},
    # Qwen/Qwen1.5-MoE-A2.7B-Chat-GPTQ-Int4 config.json (quantization_config: bits 4, group_size 128, sym)
    "Qwen1.5-MoE-A2.7B": {"hidden_size": 2048, "moe_intermediate_size": 1408, "num_experts": 60,
                          "num_experts_per_tok": 4, "group_size": 128},
    # openai/gpt-oss-20b config.json (quantization_config: quant_method mxfp4)
    "gpt-oss-20b": {"hidden_size": 2880, "intermediate_size": 2880, "num_local_experts": 32,
                    "experts_per_token": 4},
}


def _llama_layers() -> list[tuple[str, int, int]]:
    c = MODEL_CONFIGS["Llama-3-8B"]
    h, i = c["hidden_size"], c["intermediate_size"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    return [("q_proj/o_proj", h, h), ("k_proj/v_proj", kv, h), ("gate_proj/up_proj", i, h), ("down_proj", h, i)]


def _layers() -> list[tuple[str, str, dict]]:
    """(checkpoint, layer, Case keyword arguments without M) of every layer of the profile."""
    out = []
    for layer, n, k in _llama_layers():
        # GPTQ int4 group 128 symmetric (the AutoGPTQ / GPTQModel default of Llama-3-8B checkpoints) and
        # compressed-tensors W8A8 (int8 channel weights, dynamic per-token int8 activations), bf16 activations
        out.append(("Llama-3-8B", layer, dict(scheme="w4a16", weight_format="gptq", N=n, K=k, group_size=128, sym=True,
                                              zero_convention="v1", act_dtype="bfloat16")))
        out.append(("Llama-3-8B", layer, dict(scheme="w8a8", weight_format="ct-int-quantized", N=n, K=k,
                                              group_size=-1, sym=True, act_dtype="bfloat16",
                                              scale_dtype="bfloat16")))
    q = MODEL_CONFIGS["Qwen1.5-MoE-A2.7B"]
    out.append(("Qwen1.5-MoE-A2.7B", "experts (w13, w2)",
                dict(scheme="w4a16-moe", weight_format="gptq", N=q["moe_intermediate_size"], K=q["hidden_size"],
                     group_size=q["group_size"], sym=True, act_dtype="float16", E=q["num_experts"],
                     top_k=q["num_experts_per_tok"])))
    g = MODEL_CONFIGS["gpt-oss-20b"]
    for layer, n, k in (("experts gate_up_proj", 2 * g["intermediate_size"], g["hidden_size"]),
                        ("experts down_proj", g["hidden_size"], g["intermediate_size"])):
        out.append(("gpt-oss-20b", layer, dict(scheme="w4a16-mxfp4", weight_format="ct-mxfp4", N=n, K=k, group_size=32,
                                               act_dtype="bfloat16")))
    return out


#: (checkpoint, layer, N, K, scheme) of every layer of the profile, for docs and tests
MODEL_LAYERS = tuple((ck, layer, kw["N"], kw["K"], kw["scheme"]) for ck, layer, kw in _layers())


def model_cases() -> list[Case]:
    """Every case of the model profile: each layer at each M of ``MODEL_M`` (the MoE block: ``MOE_M``)."""
    return [Case(M=m, **kw) for _ck, _layer, kw in _layers() for m in (MOE_M if kw.get("E") else MODEL_M)]
