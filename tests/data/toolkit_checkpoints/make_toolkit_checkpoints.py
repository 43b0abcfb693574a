#!/usr/bin/env python3
"""Regenerate the toolkit-written reference checkpoints under tests/data/toolkit_checkpoints/.

NOT run by CI. A human reruns it (see README.md next to this file for the exact
virtualenvs / pip lines).  Each toolkit lives in its own virtualenv because their
pins conflict, so the script is run once per venv:

    HF_HUB_OFFLINE=1 /work/toolkit-venv/bin/python        make_toolkit_checkpoints.py --toolkit auto-round
    HF_HUB_OFFLINE=1 /work/toolkit-venv-llmc/bin/python   make_toolkit_checkpoints.py --toolkit llmcompressor
    HF_HUB_OFFLINE=1 /work/toolkit-venv-gptqmodel/bin/python make_toolkit_checkpoints.py --toolkit gptqmodel

What it does, per (toolkit, scheme):
  1. builds a tiny random Llama (fixed seed, no hub access) + a local WordLevel tokenizer,
  2. plants degenerate quantization groups (all-zero, constant, all-positive, all-negative,
     tiny ~1e-8, single outlier) in a few rows of q_proj / down_proj / gate_proj,
  3. quantizes it data-free (RTN) on CPU with the toolkit and saves the checkpoint,
  4. re-loads the SAVED checkpoint with the toolkit's own loader and obtains the toolkit's own
     dequantized weights (its unpack/dequantize code path; nothing here re-implements a format),
  5. writes toolkit_dequant.safetensors (float32, [out_features, in_features], name
     "<module>.weight") and provenance.json into the checkpoint folder.

Everything runs offline on CPU.  Only safetensors/json files are read back (no pickle).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import sys
import tempfile
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 1234

# --------------------------------------------------------------------------------------
# tiny model + tokenizer
# --------------------------------------------------------------------------------------
MODEL_KW = dict(
    hidden_size=128,
    intermediate_size=128,  # every linear has K=128 (4 groups of 32, 1 group of 128); keeps the folder small
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=1,  # head_dim 32 -> k_proj / v_proj are [32, 128]
    vocab_size=128,
    max_position_embeddings=256,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
)
MODEL_DTYPE = torch.bfloat16  # bf16 so that the ~1e-8 "tiny" group is representable (fp16 would flush it)

LINEARS = [
    "model.layers.0.self_attn.q_proj",
    "model.layers.0.self_attn.k_proj",
    "model.layers.0.self_attn.v_proj",
    "model.layers.0.self_attn.o_proj",
    "model.layers.0.mlp.gate_proj",
    "model.layers.0.mlp.up_proj",
    "model.layers.0.mlp.down_proj",
]

# (module, row, k_start, k_end, pattern).  Spans are aligned to 32 (and the whole-row /
# 128-wide spans are also whole groups for group_size 128 and MXFP4's 32-blocks).
DEGENERATE_PLAN = [
    ("model.layers.0.self_attn.q_proj", 0, 0, 32, "all_zero"),
    ("model.layers.0.self_attn.q_proj", 0, 32, 64, "constant_pos"),
    ("model.layers.0.self_attn.q_proj", 0, 64, 96, "all_positive"),
    ("model.layers.0.self_attn.q_proj", 0, 96, 128, "all_negative"),
    ("model.layers.0.self_attn.q_proj", 1, 0, 32, "tiny"),
    ("model.layers.0.self_attn.q_proj", 1, 32, 64, "outlier"),
    ("model.layers.0.self_attn.q_proj", 1, 64, 96, "constant_neg"),
    ("model.layers.0.self_attn.q_proj", 1, 96, 128, "all_zero"),
    ("model.layers.0.self_attn.q_proj", 2, 0, 128, "all_zero"),
    ("model.layers.0.self_attn.q_proj", 3, 0, 128, "constant_pos"),
    ("model.layers.0.self_attn.q_proj", 4, 0, 128, "all_positive"),
    ("model.layers.0.self_attn.q_proj", 5, 0, 128, "all_negative"),
    ("model.layers.0.self_attn.q_proj", 6, 0, 128, "tiny"),
    ("model.layers.0.self_attn.q_proj", 7, 0, 128, "outlier"),
    ("model.layers.0.self_attn.q_proj", 8, 0, 128, "constant_neg"),
    ("model.layers.0.mlp.down_proj", 0, 0, 128, "all_zero"),
    ("model.layers.0.mlp.down_proj", 1, 0, 32, "constant_neg"),
    ("model.layers.0.mlp.down_proj", 1, 32, 64, "tiny"),
    ("model.layers.0.mlp.down_proj", 1, 64, 96, "outlier"),
    ("model.layers.0.mlp.down_proj", 1, 96, 128, "all_positive"),
    ("model.layers.0.mlp.down_proj", 2, 0, 128, "all_negative"),
    ("model.layers.0.mlp.down_proj", 127, 0, 32, "all_zero"),
    ("model.layers.0.mlp.down_proj", 127, 96, 128, "all_negative"),
    ("model.layers.0.mlp.gate_proj", 0, 0, 128, "all_zero"),
    ("model.layers.0.mlp.gate_proj", 127, 96, 128, "outlier"),
]

PATTERN_DOC = {
    "all_zero": "every value exactly 0.0",
    "constant_pos": "every value exactly +0.0625",
    "constant_neg": "every value exactly -0.03125",
    "all_positive": "|N(0,0.02)| + 0.005 (strictly positive, min>0)",
    "all_negative": "-(|N(0,0.02)| + 0.005) (strictly negative, max<0)",
    "tiny": "N(0,1) * 1e-8 (mixed sign, ~1e-8 magnitude; bf16-representable)",
    "outlier": "N(0,0.02) except one element = +1.0 (at k_start + 7)",
}


def build_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    cfg = LlamaConfig(**MODEL_KW)
    model = LlamaForCausalLM(cfg)
    # explicit deterministic init (transformers' default init is also seeded, but be explicit)
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    model = model.to(MODEL_DTYPE)
    model.eval()
    return model


def build_tokenizer(vocab_size=128):
    """A tiny local WordLevel tokenizer ("w4".."w127" + 4 specials). Never downloaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
    for i in range(4, vocab_size):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def _pattern_values(pattern, n, g):
    if pattern == "all_zero":
        return torch.zeros(n)
    if pattern == "constant_pos":
        return torch.full((n,), 0.0625)
    if pattern == "constant_neg":
        return torch.full((n,), -0.03125)
    if pattern == "all_positive":
        return torch.randn(n, generator=g).abs() * 0.02 + 0.005
    if pattern == "all_negative":
        return -(torch.randn(n, generator=g).abs() * 0.02 + 0.005)
    if pattern == "tiny":
        return torch.randn(n, generator=g) * 1e-8
    if pattern == "outlier":
        v = torch.randn(n, generator=g) * 0.02
        v[7] = 1.0
        return v
    raise ValueError(pattern)


def plant_degenerate(model):
    g = torch.Generator().manual_seed(SEED + 1)
    mods = dict(model.named_modules())
    entries = []
    with torch.no_grad():
        for mod_name, row, k0, k1, pattern in DEGENERATE_PLAN:
            w = mods[mod_name].weight
            vals = _pattern_values(pattern, k1 - k0, g).to(w.dtype)
            w[row, k0:k1] = vals
            layer = int(mod_name.split(".")[2])
            entry = {
                "module": mod_name,
                "layer": layer,
                "row": row,
                "k_start": k0,
                "k_end": k1,
                "pattern": pattern,
                # group indices (along K) fully covered by the span, per group size
                "groups": {str(gs): list(range(k0 // gs, k1 // gs)) for gs in (32, 128) if (k1 - k0) >= gs},
            }
            if pattern == "outlier":
                entry["outlier_k"] = k0 + 7
            entries.append(entry)
    return entries


def degenerate_map_json(entries):
    return {
        "description": "Planted degenerate quantization groups. Groups run along the input dim K "
        "(columns of the [out_features, in_features] weight) for one output row. "
        "'groups' lists the group indices completely covered by the span for group_size 32 and 128.",
        "model_dtype": str(MODEL_DTYPE),
        "patterns": PATTERN_DOC,
        "entries": entries,
    }


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------
def _ver(pkg):
    try:
        from importlib.metadata import version

        return version(pkg)
    except Exception:
        return None


def env_versions(extra=()):
    pk = ["torch", "transformers", "safetensors", "accelerate", "numpy", *extra]
    return {p: _ver(p) for p in pk} | {"python": platform.python_version()}


def read_quant_config(folder):
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f).get("quantization_config")


def list_tensors(folder):
    from safetensors import safe_open

    out = {}
    for f in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        if os.path.basename(f) == "toolkit_dequant.safetensors":
            continue
        with safe_open(f, "pt") as s:
            for k in s.keys():
                sl = s.get_slice(k)
                out[k] = {"dtype": sl.get_dtype(), "shape": list(sl.get_shape()), "file": os.path.basename(f)}
    return out


KEEP_FILES = (
    "config.json",
    "quantization_config.json",
    "quantize_config.json",
    "quant_config.json",
    "recipe.yaml",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


def copy_checkpoint(src, dst):
    if os.path.isdir(dst):
        shutil.rmtree(dst)
    os.makedirs(dst)
    for f in sorted(os.listdir(src)):
        p = os.path.join(src, f)
        if not os.path.isfile(p):
            continue
        if f.endswith(".safetensors") or f.endswith(".safetensors.index.json") or f in KEEP_FILES:
            shutil.copy2(p, os.path.join(dst, f))
        else:
            print(f"  [skip copying {f}]")


def identity_probe(module, in_features, dtype=torch.float32):
    """Run the toolkit's own quantized-linear forward on an identity matrix.

    y = I @ W^T (+ bias) -> W^T; with bias=None and an fp32 identity the matmul only
    multiplies by exactly 1.0 and adds exact zeros, so this returns the toolkit's
    dequantized weight bit-exactly (as the dtype the toolkit itself produced it in,
    upcast to fp32).
    """
    assert getattr(module, "bias", None) is None, "identity probe needs bias-free layers"
    x = torch.eye(in_features, dtype=dtype)
    with torch.no_grad():
        y = module(x)
    return y.to(torch.float32).t().contiguous()


def write_outputs(folder, dequant, provenance):
    from safetensors.torch import save_file

    tensors = {f"{k}.weight": v.detach().to(torch.float32).contiguous().cpu() for k, v in dequant.items()}
    neg_zeros = 0
    narrow = {}
    for k, v in list(tensors.items()):
        assert v.dim() == 2, (k, v.shape)
        assert torch.isfinite(v).all(), k
        # The identity-probe path (x @ W with x = I) cannot preserve the sign of zero
        # (-0.0 + 0.0 = +0.0) while direct dequant functions can; canonicalise every -0.0 to +0.0
        # so all folders share one convention.  Compare against these with value equality.
        neg_zeros += int(((v == 0) & torch.signbit(v)).sum())
        tensors[k] = torch.where(v == 0, torch.zeros_like(v), v)
        narrow[k] = [str(dt).replace("torch.", "") for dt in (torch.float16, torch.bfloat16)
                     if torch.equal(v.to(dt).to(torch.float32), v)]
    save_file(tensors, os.path.join(folder, "toolkit_dequant.safetensors"), metadata={"format": "pt"})
    provenance = dict(provenance)
    provenance["toolkit_dequant"] = {
        "file": "toolkit_dequant.safetensors",
        "tensor_name": "<module>.weight",
        "dtype": "float32",
        "layout": "[out_features, in_features]",
        "tensors": {k: list(v.shape) for k, v in tensors.items()},
        "negative_zeros_canonicalised_to_plus_zero": neg_zeros,
        "values_exactly_representable_in": narrow,
    }
    provenance["checkpoint_tensors"] = list_tensors(folder)
    provenance["quantization_config"] = read_quant_config(folder)
    with open(os.path.join(folder, "provenance.json"), "w") as f:
        json.dump(provenance, f, indent=1, sort_keys=False)
        f.write("\n")


def sanity_check(dequant, ref_model, tag):
    """Loose check that the toolkit dequant is close to the original weight (catches transposes)."""
    mods = dict(ref_model.named_modules())
    for name, w in dequant.items():
        orig = mods[name].weight.detach().float()
        assert tuple(w.shape) == tuple(orig.shape), (tag, name, w.shape, orig.shape)
        err = (w - orig).abs()
        rel = err.norm() / orig.norm()
        print(f"  {tag} {name}: rel_err={rel:.4f} max_abs_err={err.max():.4g}")
        assert rel < 0.35, f"{tag} {name}: dequant far from original (rel {rel})"


def fresh_model():
    model = build_model()
    entries = plant_degenerate(model)
    return model, entries


# --------------------------------------------------------------------------------------
# auto-round
# --------------------------------------------------------------------------------------
AUTOROUND_JOBS = [
    # folder, scheme kwargs, export format
    ("auto-round-w4g32-sym-auto_gptq", dict(scheme="W4A16", group_size=32, sym=True), "auto_gptq"),
    ("auto-round-w4g32-asym-auto_gptq", dict(scheme="W4A16", group_size=32, sym=False), "auto_gptq"),
    ("auto-round-w4g128-asym-auto_awq", dict(scheme="W4A16", group_size=128, sym=False), "auto_awq"),
    ("auto-round-w4g32-sym-auto_round", dict(scheme="W4A16", group_size=32, sym=True), "auto_round"),
    ("auto-round-w4g32-asym-auto_round", dict(scheme="W4A16", group_size=32, sym=False), "auto_round"),
    ("auto-round-mxfp4-llm_compressor", dict(scheme="MXFP4"), "llm_compressor"),
    ("auto-round-mxfp4-auto_round", dict(scheme="MXFP4"), "auto_round"),
]


def _load_prefix(folder, prefix):
    """Tensors of one module from the checkpoint's safetensors (safetensors only, no pickle)."""
    from safetensors import safe_open

    out = {}
    for f in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        if os.path.basename(f) == "toolkit_dequant.safetensors":
            continue
        with safe_open(f, "pt") as s:
            for k in s.keys():
                if k.startswith(prefix + "."):
                    out[k[len(prefix) + 1 :]] = s.get_tensor(k)
    return out


def _module_dequant(mod, in_features):
    """Toolkit-provided dequant for one loaded quantized module."""
    if hasattr(mod, "dequant_weight_online"):  # auto_round.experimental.qmodules (MX / NVFP / FP8)
        with torch.no_grad():
            w = mod.dequant_weight_online()
        return w.to(torch.float32), f"{type(mod).__qualname__}.dequant_weight_online()"
    return identity_probe(mod, in_features), f"{type(mod).__qualname__}.forward(eye(in_features, fp32)).T"


def _all_tensors(folder):
    from safetensors.torch import load_file

    out = {}
    for f in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        if os.path.basename(f) != "toolkit_dequant.safetensors":
            out.update(load_file(f))
    return out


def ct_dequant(folder):
    """compressed-tensors' own model-free dequantizer:
    compressed_tensors.entrypoints.convert.converters.CompressedTensorsDequantizer(folder, dtype=float32)
    .process(tensors) -- which, per config group, calls
    BaseCompressor.get_value_from_registry(scheme.format).decompress(state_dict, scheme) and then
    upcasts the result (computed in the checkpoint's scale dtype) to float32.

    Cross-checked against the transformers loader path
    (CompressedTensorsConfig(run_compressed=False) -> ModelCompressor.decompress_model)."""
    from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import CompressedTensorsDequantizer

    tensors = _all_tensors(folder)
    # Model-free matching cannot see module types, so a target of "Linear" with the naive
    # int-quantized format (whose first param is plain "weight") would also grab the embedding /
    # norms.  Tell it explicitly which modules are not quantized linears.
    extra_ignore = sorted({k.rsplit(".", 1)[0] for k in tensors if k.endswith(".weight")} - set(LINEARS))
    deq = CompressedTensorsDequantizer(folder, ignore=extra_ignore, dtype=torch.float32)
    formats = {k: str(getattr(v.format, "value", v.format)) for k, v in deq.quant_config.config_groups.items()}
    tensors = deq.process(tensors)
    out, how = {}, {}
    for name in LINEARS:
        out[name] = tensors[f"{name}.weight"].to(torch.float32).contiguous()
        how[name] = (
            "compressed_tensors.entrypoints.convert.converters.ct_dequantizer.CompressedTensorsDequantizer("
            f"ckpt, ignore={extra_ignore}, dtype=torch.float32).process(tensors)  [-> BaseCompressor.get_value_from_registry("
            f"{formats}).decompress(state_dict, scheme)]"
        )
    notes = []
    try:
        from transformers import AutoModelForCausalLM, CompressedTensorsConfig

        m = AutoModelForCausalLM.from_pretrained(
            folder, quantization_config=CompressedTensorsConfig(run_compressed=False), device_map="cpu", dtype="auto"
        )
        same = True
        for name in LINEARS:
            w = m.get_submodule(name).weight.detach()
            if not torch.equal(w.to(torch.float32), out[name]):
                same = False
                diff = (w.float() - out[name]).abs().max().item()
                notes.append(f"transformers CompressedTensorsConfig(run_compressed=False) loader differs on {name} "
                             f"(loader dtype {w.dtype}, max abs diff {diff:.3g})")
        if same:
            notes.append("transformers AutoModelForCausalLM.from_pretrained(ckpt, quantization_config="
                         "CompressedTensorsConfig(run_compressed=False)) decompressed weights "
                         f"(dtype {w.dtype}) are bit-identical after upcast to float32")
    except Exception as e:
        notes.append(f"transformers loader cross-check not possible: {type(e).__name__}: {e}")
    return out, how, notes


def autoround_dequant_via_loader(folder):
    """Load the saved checkpoint through transformers' AutoRoundConfig integration
    (auto_round.inference.convert_model.convert_hf_model chooses the CPU backend) and ask each
    quantized linear for its weight."""
    import auto_round  # noqa: F401  (registers the integration)
    from transformers import AutoModelForCausalLM, AutoRoundConfig

    model = AutoModelForCausalLM.from_pretrained(
        folder, quantization_config=AutoRoundConfig(backend="torch"), device_map="cpu", dtype="auto"
    )
    out, how = {}, {}
    for name in LINEARS:
        mod = model.get_submodule(name)
        if not any(hasattr(mod, a) for a in ("qweight", "weight_packed", "dequant_weight_online")):
            raise RuntimeError(f"{name}: loader left a non-quantized module ({type(mod)})")
        if type(mod).__name__.startswith("Fake"):
            raise RuntimeError(f"{name}: loader fell back to fake-quant module {type(mod)}")
        in_f = getattr(mod, "infeatures", None) or getattr(mod, "in_features")
        out[name], m = _module_dequant(mod, in_f)
        how[name] = f"{type(mod).__module__}.{m}"
    return out, how


def autoround_dequant_direct(folder, qcfg):
    """For packings auto-round's loader has no CPU (pure torch) kernel for (asym GPTQ / AWQ):
    instantiate the SAME module class auto-round packs with, load its buffers from the saved
    safetensors, and run auto-round's own unpack/dequant on it."""
    bits, gs = qcfg["bits"], qcfg["group_size"]
    pf = qcfg.get("packing_format") or ""
    qm = qcfg.get("quant_method", "")
    is_awq = "awq" in qm or "awq" in pf
    out, how = {}, {}
    for name in LINEARS:
        sd = _load_prefix(folder, name)
        if is_awq:
            from auto_round.export.export_to_awq.utils import WQLinear_GEMM, dequantize_gemm

            in_f = sd["qweight"].shape[0]
            out_f = sd["scales"].shape[1]
            lin = torch.nn.Linear(in_f, out_f, bias=False)
            mod = WQLinear_GEMM.from_linear(lin, bits, gs, init_only=True)
            mod.load_state_dict(sd, strict=True)
            with torch.no_grad():
                w = dequantize_gemm(mod.qweight, mod.qzeros, mod.scales, mod.w_bit, mod.group_size)
            out[name] = w.to(torch.float32).t().contiguous()
            how[name] = (
                "auto_round.export.export_to_awq.utils.dequantize_gemm(qweight, qzeros, scales, bits, "
                "group_size).T  [buffers loaded into auto_round...WQLinear_GEMM]"
            )
        else:
            from auto_round_extension.torch.qlinear_torch_zp import QuantLinear

            in_f = sd["qweight"].shape[0] * 32 // bits
            out_f = sd["qweight"].shape[1]
            g_idx = sd.pop("g_idx", None)
            if g_idx is not None:
                # auto-round's own loader drops g_idx (reported UNEXPECTED by transformers) and its
                # g_idx forward branch mis-slices scales when out != in, so do the same as the loader.
                assert torch.equal(g_idx.long(), torch.arange(in_f) // gs), "non-trivial g_idx"
            mod = QuantLinear(bits, gs, in_f, out_f, bias=False, g_idx=False)
            mod.load_state_dict(sd, strict=True)
            mod.eval()
            out[name] = identity_probe(mod, in_f)
            how[name] = (
                "auto_round_extension.torch.qlinear_torch_zp.QuantLinear.forward(eye(in_features, fp32)).T "
                "[buffers loaded from the checkpoint with load_state_dict(strict=True)]"
            )
    return out, how


def run_autoround(outroot, only=None):
    import auto_round
    from auto_round import AutoRound

    results = {}
    for folder_name, skw, fmt in AUTOROUND_JOBS:
        if only and folder_name not in only:
            continue
        print(f"=== {folder_name}")
        dst = os.path.join(outroot, folder_name)
        try:
            model, entries = fresh_model()
            ref = build_model()
            plant_degenerate(ref)
            tok = build_tokenizer()
            with tempfile.TemporaryDirectory() as tmp:
                kw = dict(skw)
                ar = AutoRound(
                    model,
                    tokenizer=tok,
                    iters=0,
                    disable_opt_rtn=True,  # plain RTN (no imatrix / data)
                    device_map="cpu",
                    seed=SEED,
                    **kw,
                )
                _, folders = ar.quantize_and_save(os.path.join(tmp, "out"), format=fmt)
                src = folders[0] if isinstance(folders, (list, tuple)) else folders
                copy_checkpoint(src, dst)
            qcfg = read_quant_config(dst)
            notes = []
            if qcfg.get("quant_method") == "compressed-tensors":
                dq, how, notes = ct_dequant(dst)
            elif qcfg.get("data_type", "int") == "int":
                dq, how = autoround_dequant_direct(dst, qcfg)
                try:
                    dq_loader, how_loader = autoround_dequant_via_loader(dst)
                    for k in dq:
                        assert torch.equal(dq[k], dq_loader[k]), f"{k}: loader and direct dequant differ"
                    notes.append(
                        "transformers+AutoRoundConfig(backend='torch') loader path gave bit-identical weights: "
                        + json.dumps(how_loader)
                    )
                except Exception as e:  # asym gptq/awq: auto-round has no pure-torch CPU kernel
                    notes.append(f"auto-round's own loader could not serve this checkpoint on CPU: {type(e).__name__}: {e}")
            else:
                dq, how = autoround_dequant_via_loader(dst)
            sanity_check(dq, ref, folder_name)
            prov = {
                "toolkit": "auto-round",
                "toolkit_version": auto_round.__version__,
                "versions": env_versions(["auto-round", "compressed-tensors"]),
                "scheme": {
                    **{k: v for k, v in skw.items()},
                    "export_format": fmt,
                    "iters": 0,
                    "disable_opt_rtn": True,
                    "device_map": "cpu",
                },
                "quantize_call": f"auto_round.AutoRound(model, tokenizer, iters=0, disable_opt_rtn=True, "
                f"device_map='cpu', seed={SEED}, **{skw!r}).quantize_and_save(dir, format={fmt!r})",
                "dequant_function": how,
                "dequant_arithmetic": (
                    "compressed-tensors decompress: result in the checkpoint's scale dtype, upcast to fp32"
                    if qcfg.get("quant_method") == "compressed-tensors"
                    else "MX: e2m1 value * 2**(e8m0-127) evaluated in float32 (exact)"
                    if qcfg.get("data_type", "int") != "int"
                    else "scales(float16) * (q - zero) evaluated by the toolkit in float16 (one rounding to fp16), "
                    "then exactly upcast to float32"
                ),
                "dequant_notes": notes,
                "degenerate_groups": degenerate_map_json(entries),
                "model_config": MODEL_KW | {"torch_dtype": str(MODEL_DTYPE), "arch": "LlamaForCausalLM",
                                            "seed": SEED},
            }
            write_outputs(dst, dq, prov)
            results[folder_name] = "ok"
        except Exception as e:  # keep going, record why
            traceback.print_exc()
            results[folder_name] = f"FAILED: {type(e).__name__}: {e}"
            if os.path.isdir(dst) and not os.path.exists(os.path.join(dst, "provenance.json")):
                shutil.rmtree(dst)
    return results


# --------------------------------------------------------------------------------------
# llm-compressor (+ compressed-tensors)
# --------------------------------------------------------------------------------------
LLMC_JOBS = [
    # folder, preset scheme name, weight-arg overrides
    ("llmcompressor-w4a16-g128-sym", "W4A16", {}),
    ("llmcompressor-w4a16_asym-g32", "W4A16_ASYM", {"group_size": 32}),
    ("llmcompressor-w8a8-int8", "W8A8", {}),
    ("llmcompressor-mxfp4a16", "MXFP4A16", {}),
]


def run_llmcompressor(outroot, only=None):
    import compressed_tensors
    import llmcompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    results = {}
    for folder_name, preset, overrides in LLMC_JOBS:
        if only and folder_name not in only:
            continue
        print(f"=== {folder_name}")
        dst = os.path.join(outroot, folder_name)
        try:
            model, entries = fresh_model()
            ref = build_model()
            plant_degenerate(ref)
            tok = build_tokenizer()
            with tempfile.TemporaryDirectory() as tmp:
                # oneshot() insists on re-reading config.json from model.config.name_or_path
                base = os.path.join(tmp, "base")
                model.save_pretrained(base)
                tok.save_pretrained(base)
                model = AutoModelForCausalLM.from_pretrained(base, dtype=MODEL_DTYPE)
                if overrides:
                    scheme = preset_name_to_scheme(preset, ["Linear"])
                    for k, v in overrides.items():
                        setattr(scheme.weights, k, v)
                    modifier = QuantizationModifier(config_groups={"group_0": scheme}, ignore=["lm_head"])
                    recipe_desc = (
                        f"QuantizationModifier(config_groups={{'group_0': preset_name_to_scheme({preset!r}, "
                        f"['Linear']) with weights.{overrides}}}, ignore=['lm_head'])"
                    )
                else:
                    modifier = QuantizationModifier(targets="Linear", scheme=preset, ignore=["lm_head"])
                    recipe_desc = f"QuantizationModifier(targets='Linear', scheme={preset!r}, ignore=['lm_head'])"
                oneshot(model=model, recipe=modifier)  # no dataset -> DataFreePipeline (RTN, min/max observer)
                out = os.path.join(tmp, "out")
                model.save_pretrained(out, save_compressed=True)
                tok.save_pretrained(out)
                copy_checkpoint(out, dst)
            dq, how, notes = ct_dequant(dst)
            sanity_check(dq, ref, folder_name)
            prov = {
                "toolkit": "llmcompressor",
                "toolkit_version": llmcompressor.__version__,
                "compressed_tensors_version": compressed_tensors.__version__,
                "versions": env_versions(["llmcompressor", "compressed-tensors"]),
                "scheme": {"preset": preset, "weight_overrides": overrides, "targets": "Linear",
                           "ignore": ["lm_head"], "calibration": "none (data-free RTN)"},
                "quantize_call": f"llmcompressor.oneshot(model=model, recipe={recipe_desc}); "
                "model.save_pretrained(dir, save_compressed=True)",
                "dequant_function": how,
                "dequant_arithmetic": "compressed_tensors dequantize(): computed in the scale dtype "
                "(bfloat16 here: int schemes round scale*(q-zp) to bf16; MXFP4 multiplies bf16 fp4 values by the "
                "bf16 power-of-two scale, exact), then upcast to float32",
                "dequant_notes": notes,
                "degenerate_groups": degenerate_map_json(entries),
                "model_config": MODEL_KW | {"torch_dtype": str(MODEL_DTYPE), "arch": "LlamaForCausalLM",
                                            "seed": SEED},
            }
            write_outputs(dst, dq, prov)
            results[folder_name] = "ok"
        except Exception as e:
            traceback.print_exc()
            results[folder_name] = f"FAILED: {type(e).__name__}: {e}"
            if os.path.isdir(dst) and not os.path.exists(os.path.join(dst, "provenance.json")):
                shutil.rmtree(dst)
    return results


# --------------------------------------------------------------------------------------
# gptqmodel
# --------------------------------------------------------------------------------------
GPTQMODEL_JOBS = [
    # folder, config class name, kwargs, needs calibration
    ("gptqmodel-gptq-w4g32-sym-desc_act-gptq", "GPTQConfig",
     dict(bits=4, group_size=32, sym=True, desc_act=True, format="gptq"), True),
    ("gptqmodel-rtn-w4g32-asym-gptq", "RTNConfig", dict(bits=4, group_size=32, sym=False, format="gptq"), False),
    ("gptqmodel-rtn-w4g32-asym-gptq_v2", "RTNConfig", dict(bits=4, group_size=32, sym=False, format="gptq_v2"), False),
]


def gptqmodel_dequant(folder):
    """GPTQModel.load(ckpt, backend=BACKEND.TORCH, device='cpu', dtype=torch.float16) and, for each
    gptqmodel TorchLinear, TorchLinear.dequantize_weight() (returns [in, out]); cross-checked
    bit-exactly against TorchLinear.forward(eye(in_features, fp16))."""
    from gptqmodel import BACKEND, GPTQModel

    # dtype=float16: the checkpoint stores fp16 scales; gptqmodel's CPU 'auto' dtype is bfloat16,
    # which would round the scales on load.
    qm = GPTQModel.load(folder, backend=BACKEND.TORCH, device="cpu", dtype=torch.float16)
    out, how, notes = {}, {}, []
    for name in LINEARS:
        mod = qm.model.get_submodule(name)
        with torch.no_grad():
            w = mod.dequantize_weight()
        w = w.to(torch.float32).t().contiguous()
        probe = identity_probe(mod, mod.in_features, dtype=mod.scales.dtype)
        assert torch.equal(w, probe), f"{name}: dequantize_weight() != forward(eye)"
        out[name] = w
        how[name] = (
            f"gptqmodel.GPTQModel.load(ckpt, backend=BACKEND.TORCH, device='cpu', dtype=torch.float16)"
            f" -> {type(mod).__module__}.{type(mod).__qualname__}.dequantize_weight().T "
            f"(scales dtype {mod.scales.dtype}; identical to forward(eye(in_features)))"
        )
    return out, how, notes


def run_gptqmodel(outroot, only=None):
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")  # gptqmodel's pool needs >=2 cpu workers
    import gptqmodel
    from gptqmodel import GPTQModel
    from gptqmodel import quantization as gq

    results = {}
    for folder_name, cfg_cls, cfg_kw, needs_calib in GPTQMODEL_JOBS:
        if only and folder_name not in only:
            continue
        print(f"=== {folder_name}")
        dst = os.path.join(outroot, folder_name)
        try:
            model, entries = fresh_model()
            ref = build_model()
            plant_degenerate(ref)
            tok = build_tokenizer()
            calib_desc = None
            with tempfile.TemporaryDirectory() as tmp:
                base = os.path.join(tmp, "base")
                model.save_pretrained(base)
                tok.save_pretrained(base)
                qcfg = getattr(gq, cfg_cls)(**cfg_kw, offload_to_disk=False)
                cwd = os.getcwd()
                os.chdir(tmp)  # gptqmodel writes ./logs/*.log into the working directory
                try:
                    qm = GPTQModel.load(base, qcfg)
                    if needs_calib:
                        g = torch.Generator().manual_seed(SEED + 2)
                        calib = [{"input_ids": torch.randint(4, MODEL_KW["vocab_size"], (64,), generator=g).tolist()}
                                 for _ in range(16)]
                        calib_desc = "16 sequences x 64 random token ids in [4,128), torch.Generator seed 1236"
                        qm.quantize(calib, tokenizer=tok, batch_size=1)
                    else:
                        qm.quantize(tokenizer=tok)
                    out = os.path.join(tmp, "out")
                    qm.save(out)
                finally:
                    os.chdir(cwd)
                copy_checkpoint(out, dst)
            dq, how, notes = gptqmodel_dequant(dst)
            sanity_check(dq, ref, folder_name)
            prov = {
                "toolkit": "gptqmodel",
                "toolkit_version": gptqmodel.__version__,
                "versions": env_versions(["gptqmodel"]),
                "scheme": {"config_class": f"gptqmodel.quantization.{cfg_cls}", **cfg_kw,
                           "offload_to_disk": False, "calibration": calib_desc or "none (weight-only RTN)"},
                "quantize_call": f"GPTQModel.load(base_dir, {cfg_cls}(**{cfg_kw!r}, offload_to_disk=False))"
                f".quantize({'calib' if needs_calib else ''}, tokenizer=tok); .save(dir)",
                "dequant_function": how,
                "dequant_arithmetic": "scales(float16) * (q - zero) evaluated by the toolkit in float16 "
                "(zeros after gptqmodel's whole-int32 v1->v2 qzeros conversion), then exactly upcast to float32",
                "dequant_notes": notes,
                "degenerate_groups": degenerate_map_json(entries),
                "model_config": MODEL_KW | {"torch_dtype": str(MODEL_DTYPE), "arch": "LlamaForCausalLM",
                                            "seed": SEED},
            }
            if cfg_kw.get("desc_act"):
                prov["degenerate_groups"]["note"] = (
                    "desc_act=True: quantization groups are formed over the activation-order permutation "
                    "(see g_idx), so the planted K-spans are NOT aligned with quantization groups here; and "
                    "GPTQ's error feedback modifies weights after each quantized column."
                )
            write_outputs(dst, dq, prov)
            results[folder_name] = "ok"
        except Exception as e:
            traceback.print_exc()
            results[folder_name] = f"FAILED: {type(e).__name__}: {e}"
            if os.path.isdir(dst) and not os.path.exists(os.path.join(dst, "provenance.json")):
                shutil.rmtree(dst)
    return results


# --------------------------------------------------------------------------------------
TOOLKITS = {
    "gptqmodel": run_gptqmodel,
    "auto-round": run_autoround,
    "llmcompressor": run_llmcompressor,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--toolkit", required=True, choices=sorted(TOOLKITS))
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--only", nargs="*", help="only these output folder names")
    args = ap.parse_args()
    torch.manual_seed(SEED)
    res = TOOLKITS[args.toolkit](args.out, set(args.only) if args.only else None)
    print(json.dumps(res, indent=1))
    if any(v != "ok" for v in res.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
