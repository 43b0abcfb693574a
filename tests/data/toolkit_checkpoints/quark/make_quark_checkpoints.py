#!/usr/bin/env python3
"""Regenerate the AMD Quark reference checkpoints under tests/data/toolkit_checkpoints/quark/.

NOT run by CI. A human reruns it (README.md next to this file has the install line):

    PYTHONPATH=/tmp/quarklib HF_HUB_OFFLINE=1 python make_quark_checkpoints.py [folder ...]

Per scheme it builds the same tiny random Llama with the same planted degenerate groups as
make_toolkit_checkpoints.py, quantizes it data-free with amd-quark 0.13 on CPU
(ModelQuantizer.quantize_model + freeze), exports it with quark.torch.export_safetensors
(weight_format="real_quantized", the scheme's pack_method), and then dequantizes the SAVED
tensors with Quark's own import-side code: a StaticScaledRealQuantizer built from the saved
config (quark/torch/export/nn/modules/realquantizer.py), its buffers loaded from
model.safetensors, and its forward() (pack_method.unpack + quark.torch.kernel.dequantize).
The result (float32, -0.0 canonicalised to +0.0) is toolkit_dequant.safetensors.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))  # tests/data/toolkit_checkpoints/quark
sys.path.insert(0, os.path.dirname(HERE))  # make_toolkit_checkpoints.py: the same model and degenerate groups
from make_toolkit_checkpoints import (LINEARS, MODEL_DTYPE, build_model, build_tokenizer,  # noqa: E402
                                      degenerate_map_json, plant_degenerate)

import quark  # noqa: E402
from quark.torch import ModelQuantizer, export_safetensors  # noqa: E402
from quark.torch.quantization.config.config import (Int4PerGroupSpec, Int8PerChannelSpec,  # noqa: E402
                                                    OCP_MXFP4Spec, QConfig, QLayerConfig, Uint4PerGroupSpec)


def _int4(gs, sym=True):
    return Int4PerGroupSpec(ch_axis=-1, is_dynamic=False, scale_type="float", group_size=gs,
                            symmetric=sym).to_quantization_spec()


def _uint4(gs):
    return Uint4PerGroupSpec(ch_axis=-1, is_dynamic=False, scale_type="float", group_size=gs,
                             symmetric=False).to_quantization_spec()


def scheme_int4():
    # global int4 g32 sym; down_proj overridden by name to g128; k_proj excluded
    return QConfig(global_quant_config=QLayerConfig(weight=_int4(32)),
                   layer_quant_config={"*down_proj": QLayerConfig(weight=_int4(128))},
                   exclude=["lm_head", "*k_proj"])


def scheme_uint4():
    return QConfig(global_quant_config=QLayerConfig(weight=_uint4(32)),
                   layer_quant_config={"*o_proj": QLayerConfig(weight=_int4(32, sym=False))},
                   exclude=["lm_head"])


def scheme_mxfp4():
    w = OCP_MXFP4Spec(ch_axis=-1, is_dynamic=False).to_quantization_spec()
    a = OCP_MXFP4Spec(ch_axis=-1, is_dynamic=True).to_quantization_spec()
    return QConfig(global_quant_config=QLayerConfig(weight=w, input_tensors=a),
                   layer_quant_config={"*v_proj": QLayerConfig(weight=w)},  # weight-only override
                   exclude=["lm_head"])


def scheme_int8():
    w = Int8PerChannelSpec(ch_axis=0, symmetric=True, is_dynamic=False).to_quantization_spec()
    a = Int8PerChannelSpec(ch_axis=1, symmetric=True, is_dynamic=True).to_quantization_spec()
    return QConfig(global_quant_config=QLayerConfig(weight=w, input_tensors=a), exclude=["lm_head"])


SCHEMES = {
    "quark-int4-g32-sym-reorder": (scheme_int4, "reorder",
                                   "int4 sym per_group 32 (down_proj: layer_quant_config g128; k_proj excluded)"),
    "quark-uint4-g32-asym-order": (scheme_uint4, "order",
                                   "uint4 asym per_group 32 (o_proj: layer_quant_config int4 asym g32)"),
    "quark-mxfp4-w4a4": (scheme_mxfp4, "reorder",
                         "OCP MXFP4 weights + dynamic MXFP4 activations (v_proj: weight-only override)"),
    "quark-int8-w8a8": (scheme_int8, "reorder",
                        "int8 sym per-channel weights + dynamic per-token int8 activations"),
}


def _layer_spec(qc: dict, module: str):
    """The weight spec the saved config gives ``module`` (fnmatch, as Quark's own config lookup)."""
    import fnmatch
    for pat, body in (qc.get("layer_quant_config") or {}).items():
        if fnmatch.fnmatch(module, pat):
            return body
    return qc["global_quant_config"]


def quark_dequant(folder: str, qc: dict) -> dict:
    from quark.torch.export.nn.modules.realquantizer import StaticScaledRealQuantizer
    from quark.torch.quantization.config.config import QLayerConfig as QL
    reorder = qc["export"]["pack_method"] == "reorder"
    out, how = {}, {}
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        names = set(f.keys())
        for mod in LINEARS:
            if mod + ".weight_scale" not in names:
                continue
            spec = QL.from_dict(_layer_spec(qc, mod)).weight
            w = f.get_tensor(mod + ".weight")
            rq = StaticScaledRealQuantizer(spec, None, reorder, True, MODEL_DTYPE, torch.device("cpu"),
                                           tuple(f.get_slice(mod + ".weight_scale").get_shape()),
                                           tuple(f.get_slice(mod + ".weight_zero_point").get_shape())
                                           if mod + ".weight_zero_point" in names else None)
            rq.scale = f.get_tensor(mod + ".weight_scale")
            if mod + ".weight_zero_point" in names:
                rq.zero_point = f.get_tensor(mod + ".weight_zero_point")
            with torch.no_grad():
                d = rq.forward(w).to(torch.float32)
            d = torch.where(d == 0, torch.zeros_like(d), d)  # canonicalise -0.0
            out[mod + ".weight"] = d.contiguous()
            how[mod] = ("quark.torch.export.nn.modules.realquantizer.StaticScaledRealQuantizer.forward "
                        f"(real_quantized=True, reorder={reorder}, dtype={spec.dtype.value}, "
                        f"qscheme={spec.qscheme.value}) -> float32")
    return out, how


def make(name: str):
    build, pack_method, doc = SCHEMES[name]
    folder = os.path.join(HERE, name)
    shutil.rmtree(folder, ignore_errors=True)
    model = build_model()
    entries = plant_degenerate(model)
    q = ModelQuantizer(build())
    # dynamic activation specs still ask for a dataloader: one tiny fixed batch (weights are
    # quantized from their own min/max, so it does not change any exported tensor)
    calib = [torch.randint(4, 128, (1, 16), generator=torch.Generator().manual_seed(7))]
    model = q.quantize_model(model, calib)
    model = q.freeze(model)
    export_safetensors(model, folder, weight_format="real_quantized", pack_method=pack_method)
    build_tokenizer().save_pretrained(folder)
    qc = json.load(open(os.path.join(folder, "config.json")))["quantization_config"]
    deq, how = quark_dequant(folder, qc)
    save_file(deq, os.path.join(folder, "toolkit_dequant.safetensors"))
    tensors = {}
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        for k in sorted(f.keys()):
            s = f.get_slice(k)
            tensors[k] = {"dtype": s.get_dtype(), "shape": list(s.get_shape())}
    prov = {
        "toolkit": "amd-quark", "toolkit_version": quark.__version__ if hasattr(quark, "__version__") else "0.13",
        "torch": torch.__version__, "python": platform.python_version(),
        "scheme": doc, "quantize_call": f"ModelQuantizer({build.__name__}()).quantize_model(model, [one fixed 16-token batch]); freeze; "
        f"export_safetensors(model, folder, weight_format='real_quantized', pack_method={pack_method!r})",
        "dequant_function": how, "arithmetic_dtype": "float32", "model_dtype": str(MODEL_DTYPE),
        "degenerate_groups": degenerate_map_json(entries), "quantization_config": qc, "tensors": tensors,
    }
    with open(os.path.join(folder, "provenance.json"), "w") as fh:
        json.dump(prov, fh, indent=1, sort_keys=True, default=str)
    print("wrote", folder)


def activation_reference():
    """quark_act_qdq.safetensors: Quark's own dynamic activation quantizers (the down_proj input
    quantizer of the W4A4 and W8A8 schemes, after quantize_model) applied to a fixed x, float32 in
    and out. Quark's bf16/fp16 MXFP4 path is a HIP/CUDA kernel (kernel/__init__.py
    MXFP4DynamicFakeQuantizeFunction); for float32 it runs the Python fake quantizer read here."""
    out = {}
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(64, 128, generator=g) * torch.logspace(-3, 1, 64)[:, None]).to(torch.bfloat16).float()
    x[0] = 0
    x[1, :32] = 0
    x[2, 0], x[2, 1:] = 1.75, 0.25  # amax 1.75 * 2^0: EVEN rounds the scale exponent up, FLOOR does not
    x[3] = 1e-8
    for kind, build in (("mxfp4", scheme_mxfp4), ("int8", scheme_int8)):
        model = build_model()
        plant_degenerate(model)
        q = ModelQuantizer(build())
        calib = [torch.randint(4, 128, (1, 16), generator=torch.Generator().manual_seed(7))]
        model = q.quantize_model(model, calib)
        qi = model.model.layers[0].mlp.down_proj._input_quantizer
        with torch.no_grad():  # the model's activations are [batch, seq, K]: per-token is ch_axis 1 of that
            xq = qi(x[None])[0] if kind == "int8" else qi(x)
        out[f"{kind}.x"], out[f"{kind}.xq"] = x.clone(), xq.float().contiguous()
    save_file(out, os.path.join(HERE, "quark_act_qdq.safetensors"))
    print("wrote quark_act_qdq.safetensors")


if __name__ == "__main__":
    todo = sys.argv[1:] or list(SCHEMES) + ["activations"]
    for n in todo:
        activation_reference() if n == "activations" else make(n)
