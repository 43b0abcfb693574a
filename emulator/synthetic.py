"""Write small checkpoint folders in every format qconform defines.

Used by the main job (``qconform run``), by tests of the checkpoint reader
and the CLI, and by vendors who want a checkpoint with known contents. The
weights are seeded Gaussians with planted degenerate groups (all-zero,
constant, all-positive, all-negative, tiny, one outlier): the groups where
toolkits and kernels disagree.

Each writer produces ``config.json`` with the ``quantization_config`` the
real toolkit writes (see docs/checkpoints.md) and ``model.safetensors``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .formats import awq, compressed_tensors as ct, gptq, mxfp4
from .numerics.floats import round_to_dtype
from .tensorfile import Tensor, save_tensors

__all__ = ["SCHEMES", "TINY", "tiny_amplitude", "make_weight", "write_checkpoint"]

#: scheme name -> short description; every name is a format + parameter set write_checkpoint knows.
SCHEMES = {
    "gptq-w4g32-sym-v1": "GPTQ int4, group 32, symmetric, checkpoint_format gptq (v1 zeros)",
    "gptq-w4g32-asym-v2": "GPTQ int4, group 32, asymmetric, checkpoint_format gptq_v2",
    "gptq-w4g32-asym-v2-actorder": "GPTQ int4, group 32, asymmetric, desc_act (permuted g_idx), gptq_v2",
    "gptq-w8g128-sym-v1": "GPTQ int8, group 128, symmetric, v1",
    "awq-w4g32": "AutoAWQ GEMM int4, group 32",
    "ct-w4a16-g32-sym": "compressed-tensors pack-quantized int4, group 32, symmetric",
    "ct-w4a16-g32-asym": "compressed-tensors pack-quantized int4, group 32, asymmetric",
    "ct-w4a16-channel-sym": "compressed-tensors pack-quantized int4, channel",
    "ct-w8a8-int8": "compressed-tensors int-quantized int8 channel weights, dynamic per-token int8 activations",
    "ct-w4a8-g32-sym": "compressed-tensors pack-quantized int4, group 32, with dynamic int8 activations (W4A8)",
    "ct-mxfp4-w4a16": "compressed-tensors MXFP4 weights, 16-bit activations",
    "ct-mxfp4-w4a4": "compressed-tensors MXFP4 weights and MXFP4 dynamic activations",
    "gptoss-mxfp4": "gpt-oss MXFP4 experts (*_blocks / *_scales)",
}


#: amplitude of the planted "tiny" group for 4-bit weights with float16 scales: its scale lands a few
#: quanta above float16's smallest subnormal (2**-24), the deepest a stored scale can go
TINY = 1e-6


def tiny_amplitude(bits: int = 4, scale_dtype: str = "float16") -> float:
    """Amplitude of the planted tiny group for ``bits``-bit weights with ``scale_dtype`` scales.

    A group's scale is about amplitude * 2 / (2**bits - 1); with float16 scales 4-bit weights use
    ``TINY`` (scales around 5 * 2**-24), and wider codes scale the amplitude by (2**bits - 1) / 15 so
    that their scales land on the same subnormal float16 values instead of underflowing to 0 (which
    no quantizer can store). bfloat16 and float32 scales reach far lower: ``TINY`` for every width.
    """
    if scale_dtype != "float16" or bits <= 4:
        return TINY
    return TINY * ((1 << bits) - 1) / 15


def make_weight(n: int, k: int, seed: int, *, group: int = 32, dtype=np.float16, tiny: float = TINY) -> np.ndarray:
    """Seeded Gaussian weight [N, K] with planted degenerate groups in its first rows.

    ``tiny`` is the amplitude of the tiny group (see ``tiny_amplitude``).
    """
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)) * 0.02
    g = min(group, k)
    patterns = [
        np.zeros(g),  # all zero
        np.full(g, 0.0625),  # constant
        np.abs(rng.standard_normal(g)) * 0.02 + 0.005,  # all positive
        -(np.abs(rng.standard_normal(g)) * 0.02 + 0.005),  # all negative
        rng.standard_normal(g) * tiny,  # tiny
    ]
    outlier = rng.standard_normal(g) * 0.02
    outlier[g // 3] = 1.0
    patterns.append(outlier)
    for i, p in enumerate(patterns):
        if i < n:
            w[i, :g] = p
    return w.astype(dtype)


def _dump(folder: Path, qconfig: dict, tensors: dict, *, extra_config: dict | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["QconformSyntheticForTest"], "model_type": "qconform-synthetic",
           "quantization_config": qconfig}
    if extra_config:
        cfg.update(extra_config)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_tensors(folder / "model.safetensors", tensors)


def _layer_names(n_layers: int) -> list[str]:
    return [f"model.layers.{i}.mlp.down_proj" for i in range(n_layers)]


def write_checkpoint(folder: "str | Path", scheme: str, *, n: int = 64, k: int = 128, seed: int = 0,
                     n_layers: int = 1, bias: bool = False) -> dict:
    """Write ``scheme`` (a key of SCHEMES) to ``folder``; return {layer name: original fp16 weight}."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown synthetic scheme {scheme!r}; known: {', '.join(SCHEMES)}")
    folder = Path(folder)
    originals: dict[str, np.ndarray] = {}
    tensors: dict = {}
    names = _layer_names(n_layers)
    for li, name in enumerate(names):
        w = make_weight(n, k, seed + li)
        originals[name] = w
        if bias:
            tensors[name + ".bias"] = (np.random.default_rng(seed + 100 + li).standard_normal(n) * 0.1).astype(np.float16)
        tensors.update(_layer_tensors(scheme, name, w, seed + li))
    _dump(folder, _qconfig(scheme), tensors)
    return originals


def _gptq_params(scheme: str) -> gptq.GptqParams:
    bits = 8 if "-w8" in scheme else 4
    group = 128 if "g128" in scheme else 32
    return gptq.GptqParams(bits=bits, group_size=group, sym="-sym" in scheme, desc_act="actorder" in scheme,
                           zero_convention="gptq_v2" if "-v2" in scheme else "gptq")


def _ct_params(scheme: str) -> ct.CtPackParams:
    if "channel" in scheme:
        return ct.CtPackParams(num_bits=4, strategy="channel", group_size=None, symmetric="-sym" in scheme)
    return ct.CtPackParams(num_bits=4, strategy="group", group_size=32, symmetric="-sym" in scheme)


def _layer_tensors(scheme: str, name: str, w: np.ndarray, seed: int) -> dict:
    if scheme.startswith("gptq"):
        p = _gptq_params(scheme)
        g_idx = None
        if p.desc_act:
            K = w.shape[1]
            g_idx = (np.random.default_rng(seed).permutation(K) // p.group_size).astype(np.int32)
        # v1 cannot store a zero point of 0 (all-positive groups): GPTQModel's packed subtraction
        # is what real v1 exports do with it.
        t = gptq.quantize_gptq(w, p, g_idx, v1_zero_write="packed_sub" if not p.sym else "raise")
        out = {f"{name}.qweight": t.qweight, f"{name}.qzeros": t.qzeros, f"{name}.scales": t.scales}
        out[f"{name}.g_idx"] = (t.g_idx if t.g_idx is not None else np.arange(w.shape[1]) // p.group_size).astype(np.int32)
        return out
    if scheme.startswith("awq"):
        t = awq.quantize_awq(w, awq.AwqParams(bits=4, group_size=32))
        return {f"{name}.qweight": t.qweight, f"{name}.qzeros": t.qzeros, f"{name}.scales": t.scales}
    if scheme in ("ct-w4a16-g32-sym", "ct-w4a16-g32-asym", "ct-w4a16-channel-sym", "ct-w4a8-g32-sym"):
        t = ct.quantize_ct_packed(w, _ct_params(scheme))
        out = {f"{name}.weight_packed": t.weight_packed, f"{name}.weight_scale": t.weight_scale,
               f"{name}.weight_shape": np.asarray(t.weight_shape, dtype=np.int64)}
        if t.weight_zero_point is not None:
            out[f"{name}.weight_zero_point"] = t.weight_zero_point
        return out
    if scheme == "ct-w8a8-int8":
        t = ct.quantize_ct_int8(w)
        return {f"{name}.weight": t.weight, f"{name}.weight_scale": t.weight_scale}
    if scheme.startswith("ct-mxfp4"):
        codes, sb = mxfp4.quantize_mxfp4(w)
        packed = mxfp4.pack_mxfp4_ct(codes, sb)
        return {f"{name}.weight_packed": packed["weight_packed"], f"{name}.weight_scale": packed["weight_scale"]}
    if scheme == "gptoss-mxfp4":
        # two experts stacked: [E, N, K/32, 16] like gpt-oss *_blocks
        w2 = np.stack([w, make_weight(*w.shape, seed + 50)])
        codes, sb = mxfp4.quantize_mxfp4(w2)
        blocks, scales = mxfp4.pack_mxfp4_gptoss(codes, sb)
        base = name.replace("mlp.down_proj", "mlp.experts.down_proj")
        return {base + "_blocks": blocks, base + "_scales": scales}
    raise AssertionError(scheme)


def _qconfig(scheme: str) -> dict:
    if scheme.startswith("gptq"):
        p = _gptq_params(scheme)
        return {"quant_method": "gptq", "bits": p.bits, "group_size": p.group_size, "sym": p.sym,
                "desc_act": p.desc_act, "checkpoint_format": p.zero_convention.value}
    if scheme.startswith("awq"):
        return {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}
    if scheme.startswith("ct-"):
        if scheme == "ct-w8a8-int8":
            weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}
            act = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
            fmt = "int-quantized"
        elif scheme.startswith("ct-mxfp4"):
            weights = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32,
                       "scale_dtype": "torch.uint8"}
            act = ({"num_bits": 4, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32,
                    "dynamic": True} if scheme.endswith("w4a4") else None)
            fmt = "mxfp4-pack-quantized"
        else:
            p = _ct_params(scheme)
            weights = {"num_bits": 4, "type": "int", "symmetric": p.symmetric, "strategy": p.strategy.value,
                       "group_size": p.group_size, "dynamic": False}
            act = ({"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
                   if "w4a8" in scheme else None)
            fmt = "pack-quantized"
        return {"quant_method": "compressed-tensors", "format": fmt,
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": act,
                                              "format": fmt}},
                "ignore": ["lm_head"]}
    if scheme == "gptoss-mxfp4":
        return {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}
    raise AssertionError(scheme)


def save_activations(path: "str | Path", x: np.ndarray, dtype: str = "float16") -> None:
    """Write x [M, K] as tensor 'x' in the given dtype (float32 | float16 | bfloat16)."""
    if dtype == "bfloat16":
        # round to nearest even, once, from the given values (truncating the float32 bits would
        # round toward zero, and float64 -> float32 -> bfloat16 could round twice)
        xb = round_to_dtype(np.asarray(x, dtype=np.float64), "bfloat16").astype(np.float32)
        save_tensors(path, {"x": Tensor(xb, "BF16")})
    elif dtype in ("float32", "float16"):
        save_tensors(path, {"x": np.asarray(x, dtype=dtype)})
    else:
        raise ValueError(f"activation dtype must be float32, float16 or bfloat16, got {dtype!r}")
