"""Write tests/data/fallback/gptoss-mxfp4: a tiny random gpt-oss with MXFP4 experts in gpt-oss's layout.

What wrote what (provenance.json in the folder repeats it):

- the model: transformers 5.24.0 ``GptOssForCausalLM(GptOssConfig(...))`` (2 layers: one sliding-window, one
  full attention; 4 experts, top-2; hidden 64, intermediate 64), its weights re-drawn with a fixed seed so
  that the router separates experts and the clamped SwiGLU's clamps (limit 7.0) are really reached, then
  cast to bfloat16 (gpt-oss stores its non-expert tensors in bf16);
- ``config.json``, ``generation_config.json`` and every non-expert tensor: transformers' ``save_pretrained``;
- the experts' MXFP4 codes and E8M0 scales: torchao 0.18.0 ``to_mx(W, float4_e2m1fn_x2, 32)`` (the OCP MX
  v1.0 FLOOR scale rule) of each expert's [N, K] weight, its packed bytes (even element in the low nibble,
  as gpt-oss stores them) reshaped to gpt-oss's ``*_blocks [E, N, K/32, 16]`` / ``*_scales [E, N, K/32]``;
  the bf16 ``gate_up_proj`` / ``down_proj`` tensors ``save_pretrained`` wrote are replaced by them, and
  ``quantization_config`` is the one openai/gpt-oss-20b ships (``quant_method: mxfp4``).

transformers' MXFP4 writer needs Triton GPU kernels (integrations/mxfp4.py), so it cannot write this file
here; its reader can: tests/fallback/test_fallback_gptoss.py loads the folder with
``from_pretrained(..., quantization_config=Mxfp4Config(dequantize=True))`` and checks that its dequantized
experts are qconform's. Rerun by hand: ``PYTHONPATH=. python tests/fallback/make_gptoss_checkpoint.py``;
CI never runs it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "data" / "fallback" / "gptoss-mxfp4"
H, I, E, TOPK, VOCAB, HEADS, KV, HD, LAYERS = 64, 64, 4, 2, 128, 4, 1, 16, 2
QCFG = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                            "model.embed_tokens", "lm_head"]}


def main() -> None:
    import safetensors.torch as st
    import torch
    import torchao
    import transformers
    from torchao.prototype.mx_formats.mx_tensor import to_mx
    from transformers import GptOssConfig, GptOssForCausalLM

    cfg = GptOssConfig(vocab_size=VOCAB, hidden_size=H, intermediate_size=I, num_hidden_layers=LAYERS,
                       num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HD, num_local_experts=E,
                       num_experts_per_tok=TOPK, sliding_window=4, max_position_embeddings=256,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False)
    torch.manual_seed(1234)
    model = GptOssForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(1234)

    def draw(shape, std, mean=0.0):
        return torch.randn(shape, generator=g) * std + mean

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("experts.gate_up_proj"):
                p.copy_(draw(p.shape, 0.9))  # gate/up pre-activations beyond +-7: the clamps are reached
            elif name.endswith("experts.down_proj"):
                p.copy_(draw(p.shape, 0.1))
            elif "layernorm" in name or name == "model.norm.weight":
                p.copy_(draw(p.shape, 0.1, 1.0))
            elif name.endswith("router.weight"):
                p.copy_(draw(p.shape, 0.5))
            elif name.endswith(("_bias", ".bias", "sinks")):
                p.copy_(draw(p.shape, 1.0 if "experts" in name else 0.3))
            elif name == "model.embed_tokens.weight":
                p.copy_(draw(p.shape, 1.0))
            else:  # attention projections, lm_head
                p.copy_(draw(p.shape, 0.1))
    model = model.to(torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)  # transformers' own writer: config.json, generation_config.json, safetensors
        files = sorted(Path(tmp).glob("*.safetensors"))
        assert len(files) == 1, files
        tensors = st.load_file(str(files[0]))
        tensors = {k: v.contiguous() for k, v in tensors.items()}
        for layer in range(LAYERS):
            for proj in ("gate_up_proj", "down_proj"):
                key = f"model.layers.{layer}.mlp.experts.{proj}"
                w = tensors.pop(key).float().transpose(1, 2).contiguous()  # transformers holds W^T [E, K, N]
                scale, data = to_mx(w, torch.float4_e2m1fn_x2, 32)
                n, k = w.shape[1], w.shape[2]
                tensors[key + "_blocks"] = data.view(torch.uint8).reshape(E, n, k // 32, 16).contiguous()
                tensors[key + "_scales"] = scale.view(torch.uint8).reshape(E, n, k // 32).contiguous()
        OUT.mkdir(parents=True, exist_ok=True)
        for f in OUT.iterdir():
            f.unlink()
        st.save_file(tensors, str(OUT / "model.safetensors"), metadata={"format": "pt"})
        config = json.loads((Path(tmp) / "config.json").read_text())
        config["quantization_config"] = QCFG
        (OUT / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        shutil.copy(Path(tmp) / "generation_config.json", OUT / "generation_config.json")
    prov = {"writer": "tests/fallback/make_gptoss_checkpoint.py",
            "model": f"transformers {transformers.__version__} GptOssForCausalLM, save_pretrained (bf16)",
            "experts": f"torchao {torchao.__version__} to_mx(W [E, N, K] float32, float4_e2m1fn_x2, block 32), "
                       "ScaleCalculationMode.FLOOR; packed bytes -> *_blocks [E, N, K/32, 16], E8M0 -> *_scales",
            "torch": torch.__version__, "seed": 1234,
            "tensors": {k: f"{str(v.dtype).removeprefix('torch.')} {list(v.shape)}" for k, v in sorted(tensors.items())}}
    (OUT / "provenance.json").write_text(json.dumps(prov, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
