"""Shared by test_checkpoint.py and test_cli.py (not a test module itself).

- ``EXPECTED``: what detection must report for every synthetic scheme, written from each
  scheme's description in emulator/synthetic.py's SCHEMES table (a format + parameter set), not
  from the detection code.
- ``write`` / ``edit_tensors`` / ``edit_config``: make a synthetic checkpoint and damage it.
- ``MALFORMED``: damaged checkpoints, the error each must raise and the names its message must carry.
- ``half_step_bound``: the largest |dequantized - original| a round-to-nearest quantizer allows,
  per element, from the scales as stored in the checkpoint (read with the `safetensors` library,
  not with the emulator's reader).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable

import numpy as np

from emulator.errors import FormatError, UnsupportedFormatError
from emulator.synthetic import write_checkpoint
from emulator.tensorfile import Tensor, load_tensors, save_tensors

LAYER = "model.layers.0.mlp.down_proj"
EXPERTS = "model.layers.0.mlp.experts.down_proj"  # gpt-oss stores experts as <prefix>_blocks / _scales
N, K = 64, 128

_INT8_TOKEN = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
_MX_GROUP = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32, "dynamic": True}


def _e(fmt, bits, group, sym, act_order, zeros, activation=None):
    return dict(format=fmt, bits=bits, group_size=group, sym=sym, act_order=act_order, zero_convention=zeros,
                activation=activation)


#: scheme -> expected LayerInfo fields (from the SCHEMES descriptions)
EXPECTED = {
    "gptq-w4g32-sym-v1": _e("gptq", 4, 32, True, False, "v1"),
    "gptq-w4g32-asym-v2": _e("gptq", 4, 32, False, False, "v2"),
    "gptq-w4g32-asym-v2-actorder": _e("gptq", 4, 32, False, True, "v2"),
    "gptq-w8g128-sym-v1": _e("gptq", 8, 128, True, False, "v1"),
    "awq-w4g32": _e("awq", 4, 32, False, False, "literal"),
    "ct-w4a16-g32-sym": _e("ct-pack-quantized", 4, 32, True, False, "offset"),
    "ct-w4a16-g32-asym": _e("ct-pack-quantized", 4, 32, False, False, "offset"),
    "ct-w4a16-channel-sym": _e("ct-pack-quantized", 4, -1, True, False, "offset"),
    "ct-w8a8-int8": _e("ct-int-quantized", 8, -1, True, False, None, _INT8_TOKEN),
    "ct-w4a8-g32-sym": _e("ct-pack-quantized", 4, 32, True, False, "offset", _INT8_TOKEN),
    "ct-mxfp4-w4a16": _e("ct-mxfp4", 4, 32, True, False, None),
    "ct-mxfp4-w4a4": _e("ct-mxfp4", 4, 32, True, False, None, _MX_GROUP),
    "gptoss-mxfp4": _e("gptoss-mxfp4", 4, 32, True, False, None),
}
N_EXPERTS = 2  # synthetic gpt-oss checkpoints stack two experts ("two experts stacked" in synthetic.py)


def layer_name(scheme: str, i: int = 0) -> str:
    base = EXPERTS if scheme == "gptoss-mxfp4" else LAYER
    return base.replace("layers.0.", f"layers.{i}.")


def expected_shape(scheme: str, n: int = N, k: int = K) -> tuple:
    return (N_EXPERTS, n, k) if scheme == "gptoss-mxfp4" else (n, k)


def write(folder: Path, scheme: str, **kw) -> dict:
    kw.setdefault("n", N)
    kw.setdefault("k", K)
    return write_checkpoint(folder, scheme, **kw)


def edit_tensors(folder: Path, fn: Callable[[dict], None]) -> None:
    t = load_tensors(folder / "model.safetensors")
    fn(t)
    save_tensors(folder / "model.safetensors", t)


def edit_config(folder: Path, fn: Callable[[dict], None]) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    fn(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))


def shard(folder: Path, n_shards: int = 2) -> dict:
    """Split model.safetensors into n shards (round robin over sorted names, so a layer's tensors
    straddle shards) + model.safetensors.index.json; return the weight_map."""
    t = load_tensors(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = sorted(t)
    files = [f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors" for i in range(n_shards)]
    wm = {name: files[i % n_shards] for i, name in enumerate(names)}
    for f in files:
        save_tensors(folder / f, {k: t[k] for k in names if wm[k] == f})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return wm


# -- malformed checkpoints ---------------------------------------------------------------------
@dataclasses.dataclass
class Case:
    id: str
    scheme: str
    damage: Callable[[Path], None]
    error: type
    names: tuple  # strings the message must contain
    layer: str | None = None  # FormatError.layer, when the error is about one layer
    tensor: "str | tuple | None" = None  # FormatError.tensor (a tuple: any of them)


def _drop(role: str, layer: str = LAYER):
    def damage(folder):
        edit_tensors(folder, lambda t: t.pop(f"{layer}.{role}"))
    return damage


def _set(role: str, fn, *, full: str | None = None):
    """Replace tensor LAYER.role (or the tensor named ``full``) by fn(data, old Tensor)."""
    name = full or f"{LAYER}.{role}"

    def damage(folder):
        def go(t):
            t[name] = fn(t[name].data, t[name])
        edit_tensors(folder, go)
    return damage


def _first(value):
    """Put ``value`` into element 3 (flat) of an array, keeping its dtype."""
    def fn(a, old):
        b = np.array(a, copy=True)
        b.reshape(-1)[3] = value
        return Tensor(b, old.dtype) if old.dtype == "BF16" else b
    return fn


def _cfg(fn):
    return lambda folder: edit_config(folder, fn)


def _qc(**updates):
    return _cfg(lambda c: c["quantization_config"].update(updates))


def _ct_weights(**updates):
    return _cfg(lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(updates))


def _write_text(name: str, text: str):
    return lambda folder: (folder / name).write_text(text)


def _index(map_fn):
    """Shard the checkpoint, then rewrite the index's weight_map with map_fn(weight_map)."""
    def damage(folder):
        wm = shard(folder)
        map_fn(wm)
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    return damage


def _retarget(folder):
    def fn(c):
        c["quantization_config"]["config_groups"]["group_0"]["targets"] = ["re:.*self_attn.*"]
    edit_config(folder, fn)


QW = f"{LAYER}.qweight"
_F32 = lambda a, old: np.asarray(a, dtype=np.float32)  # noqa: E731
_I32 = lambda a, old: np.asarray(a).astype(np.int32)  # noqa: E731

MALFORMED = [
    # missing tensors
    Case("gptq-asym-no-qzeros", "gptq-w4g32-asym-v2", _drop("qzeros"), FormatError, (LAYER, "qzeros"), LAYER, "qzeros"),
    Case("gptq-no-scales", "gptq-w4g32-sym-v1", _drop("scales"), FormatError, (LAYER, "scales"), LAYER, "scales"),
    Case("gptq-no-qweight", "gptq-w4g32-asym-v2", _drop("qweight"), FormatError, (LAYER, "qweight"), LAYER, "qweight"),
    Case("gptq-actorder-no-g_idx", "gptq-w4g32-asym-v2-actorder", _drop("g_idx"), FormatError, (LAYER, "g_idx"),
         LAYER, "g_idx"),
    Case("awq-no-qzeros", "awq-w4g32", _drop("qzeros"), FormatError, (LAYER, "qzeros"), LAYER, "qzeros"),
    Case("awq-no-scales", "awq-w4g32", _drop("scales"), FormatError, (LAYER, "scales"), LAYER, "scales"),
    Case("ct-pack-no-weight_scale", "ct-w4a16-g32-sym", _drop("weight_scale"), FormatError, (LAYER, "weight_scale"),
         LAYER, "weight_scale"),
    Case("ct-asym-no-zero_point", "ct-w4a16-g32-asym", _drop("weight_zero_point"), FormatError,
         (LAYER, "weight_zero_point"), LAYER, "weight_zero_point"),
    Case("ct-int8-no-weight_scale", "ct-w8a8-int8", _drop("weight_scale"), FormatError, (LAYER, "weight_scale"),
         LAYER, "weight_scale"),
    Case("ct-mxfp4-no-weight_scale", "ct-mxfp4-w4a16", _drop("weight_scale"), FormatError, (LAYER, "weight_scale"),
         LAYER, "weight_scale"),
    Case("gptoss-no-scales", "gptoss-mxfp4", lambda f: edit_tensors(f, lambda t: t.pop(EXPERTS + "_scales")),
         FormatError, (EXPERTS, "scales"), EXPERTS, "down_proj_scales"),
    # wrong dtype
    Case("gptq-scales-int32", "gptq-w4g32-asym-v2", _set("scales", _I32), FormatError, (LAYER, "scales"), LAYER,
         "scales"),
    Case("gptq-qweight-float", "gptq-w4g32-asym-v2", _set("qweight", _F32), FormatError, (LAYER, "qweight"), LAYER,
         "qweight"),
    Case("awq-scales-int32", "awq-w4g32", _set("scales", _I32), FormatError, (LAYER, "scales"), LAYER, "scales"),
    Case("awq-qweight-float", "awq-w4g32", _set("qweight", _F32), FormatError, (LAYER, "qweight"), LAYER, "qweight"),
    Case("ct-weight_scale-int32", "ct-w4a16-g32-asym", _set("weight_scale", _I32), FormatError,
         (LAYER, "weight_scale"), LAYER, "weight_scale"),
    Case("ct-weight_packed-float", "ct-w4a16-g32-asym", _set("weight_packed", _F32), FormatError,
         (LAYER, "weight_packed"), LAYER, "weight_packed"),
    Case("ct-int8-weight_scale-int32", "ct-w8a8-int8", _set("weight_scale", _I32), FormatError,
         (LAYER, "weight_scale"), LAYER, "weight_scale"),
    Case("ct-int8-weight-float", "ct-w8a8-int8", _set("weight", _F32), UnsupportedFormatError, (LAYER, "weight")),
    # wrong shape
    Case("gptq-scales-wrong-N", "gptq-w4g32-asym-v2", _set("scales", lambda a, o: a[:, :-8]), FormatError,
         (LAYER, "scales"), LAYER, "scales"),
    Case("gptq-qweight-K-vs-g_idx", "gptq-w4g32-asym-v2", _set("qweight", lambda a, o: a[:-4]), FormatError,
         (LAYER,), LAYER, ("qweight", "g_idx", "scales")),
    Case("gptq-qzeros-wrong-shape", "gptq-w4g32-asym-v2", _set("qzeros", lambda a, o: a[:, :-1]), FormatError,
         (LAYER, "qzeros"), LAYER, "qzeros"),
    Case("awq-scales-wrong-N", "awq-w4g32", _set("scales", lambda a, o: a[:, :-8]), FormatError, (LAYER, "scales"),
         LAYER, "scales"),
    Case("ct-weight_scale-wrong-N", "ct-w4a16-g32-sym", _set("weight_scale", lambda a, o: a[:-1]), FormatError,
         (LAYER, "weight_scale"), LAYER, "weight_scale"),
    Case("ct-int8-weight_scale-wrong-N", "ct-w8a8-int8", _set("weight_scale", lambda a, o: a[:-1]), FormatError,
         (LAYER, "weight_scale"), LAYER, "weight_scale"),
    Case("mxfp4-weight_scale-wrong-shape", "ct-mxfp4-w4a16", _set("weight_scale", lambda a, o: a[:, :-1]),
         FormatError, (LAYER, "weight_scale"), LAYER, "weight_scale"),
    # K not divisible by the group size
    Case("gptq-K-not-multiple-of-group", "gptq-w4g32-asym-v2", _qc(group_size=48), FormatError, (LAYER, "48"), LAYER),
    Case("awq-K-not-multiple-of-group", "awq-w4g32", _qc(group_size=48), FormatError, (LAYER, "48"), LAYER),
    Case("ct-K-not-multiple-of-group", "ct-w4a16-g32-sym", _ct_weights(group_size=48), FormatError, (LAYER, "48"),
         LAYER),
    # NaN / Inf scales, E8M0 0xFF
    Case("gptq-nan-scale", "gptq-w4g32-asym-v2", _set("scales", _first(np.nan)), FormatError, (LAYER, "scales"),
         LAYER, "scales"),
    Case("gptq-inf-scale", "gptq-w4g32-sym-v1", _set("scales", _first(np.inf)), FormatError, (LAYER, "scales"),
         LAYER, "scales"),
    Case("awq-nan-scale", "awq-w4g32", _set("scales", _first(np.nan)), FormatError, (LAYER, "scales"), LAYER,
         "scales"),
    Case("ct-nan-scale", "ct-w4a16-g32-asym", _set("weight_scale", _first(np.nan)), FormatError,
         (LAYER, "weight_scale"), LAYER, "weight_scale"),
    Case("ct-int8-nan-scale", "ct-w8a8-int8", _set("weight_scale", _first(np.nan)), FormatError,
         (LAYER, "weight_scale"), LAYER, "weight_scale"),
    Case("mxfp4-e8m0-0xff", "ct-mxfp4-w4a16", _set("weight_scale", _first(0xFF)), FormatError,
         (LAYER, "weight_scale", "0xFF"), LAYER, "weight_scale"),
    Case("gptoss-e8m0-0xff", "gptoss-mxfp4", _set("", _first(0xFF), full=EXPERTS + "_scales"), FormatError,
         (EXPERTS, "scales", "0xFF"), EXPERTS, "down_proj_scales"),
    # config
    Case("unknown-quant_method", "gptq-w4g32-sym-v1", _qc(quant_method="fancyquant"), UnsupportedFormatError,
         ("config.json", "fancyquant")),
    Case("no-quantization_config", "gptq-w4g32-sym-v1", _cfg(lambda c: c.pop("quantization_config")),
         UnsupportedFormatError, ("config.json", "quantization_config")),
    Case("malformed-config-json", "gptq-w4g32-sym-v1", _write_text("config.json", '{"quantization_config": {'),
         FormatError, ("config.json", "JSON")),
    Case("config-json-not-object", "gptq-w4g32-sym-v1", _write_text("config.json", "[1, 2]"), FormatError,
         ("config.json", "object")),
    Case("no-config-json", "gptq-w4g32-sym-v1", lambda f: (f / "config.json").unlink(), FormatError,
         ("config.json", "not found")),
    Case("group_size-not-integer", "gptq-w4g32-sym-v1", _qc(group_size="g32"), UnsupportedFormatError,
         (LAYER, "group_size", "g32")),
    Case("bits-null", "awq-w4g32", _qc(bits=None), UnsupportedFormatError, (LAYER, "bits")),
    Case("ct-config_groups-not-object", "ct-w4a16-g32-sym", _qc(config_groups=["group_0"]), FormatError,
         ("config.json", "config_groups")),
    Case("ct-layer-not-targeted", "ct-w4a16-g32-sym", _retarget, FormatError, (LAYER, "config_groups"), LAYER),
    Case("ct-target-regex-invalid", "ct-w4a16-g32-sym",
         _cfg(lambda c: c["quantization_config"]["config_groups"]["group_0"].update(targets=["re:model.(layers"])),
         UnsupportedFormatError, ("re:model.(layers", "regular expression")),
    Case("auto-round-extra_config-regex-invalid", "gptq-w4g32-sym-v1",
         _qc(quant_method="auto-round", packing_format="auto_round:auto_gptq", extra_config={"re:[": {"bits": 8}}),
         UnsupportedFormatError, ("re:[", "regular expression")),
    # sharded checkpoints
    Case("index-missing-shard", "gptq-w4g32-sym-v1",
         _index(lambda wm: wm.__setitem__(f"{LAYER}.scales", "model-00009-of-00009.safetensors")), FormatError,
         ("model.safetensors.index.json", "model-00009-of-00009.safetensors", f"{LAYER}.scales")),
    Case("index-shard-outside-folder", "gptq-w4g32-sym-v1",
         _index(lambda wm: wm.__setitem__(QW, "../model-00001-of-00002.safetensors")), FormatError,
         ("model.safetensors.index.json", "outside", QW)),
    Case("index-absolute-shard-path", "gptq-w4g32-sym-v1",
         _index(lambda wm: wm.__setitem__(QW, "/etc/hostname")), FormatError,
         ("model.safetensors.index.json", "outside", QW)),
    Case("index-shard-not-a-string", "gptq-w4g32-sym-v1", _index(lambda wm: wm.__setitem__(QW, 7)), FormatError,
         ("model.safetensors.index.json", QW)),
    Case("index-tensor-not-in-shard", "gptq-w4g32-sym-v1",
         _index(lambda wm: wm.__setitem__(f"{LAYER}.qzeros", wm[f"{LAYER}.scales"] if wm[f"{LAYER}.scales"]
                                          != wm[f"{LAYER}.qzeros"] else wm[QW])), FormatError,
         ("model.safetensors.index.json", f"{LAYER}.qzeros")),
]


def build(case: Case, folder: Path) -> Path:
    write(folder, case.scheme)
    case.damage(folder)
    return folder


# -- half a quantization step -------------------------------------------------------------------
_EPS = {"F16": 2.0 ** -11, "BF16": 2.0 ** -8, "F32": 2.0 ** -24}  # unit roundoff of the stored scale
_TINY = {"F16": 2.0 ** -25, "BF16": 2.0 ** -134, "F32": 2.0 ** -150}  # half the smallest subnormal


def _raw(folder: Path) -> dict:
    """Checkpoint tensors read with the safetensors library (torch framework: bf16 / fp8 too)."""
    from safetensors import safe_open

    out = {}
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            if t.dtype.is_floating_point and t.element_size() == 1:  # fp8 / e8m0: raw bytes
                import torch

                out[k] = (t.view(torch.uint8).numpy(), "U8")
            else:
                out[k] = (t.double().numpy() if t.dtype.is_floating_point else t.numpy(), str(t.dtype))
    return out


def _dtype_key(torch_dtype: str) -> str:
    return {"torch.float16": "F16", "torch.bfloat16": "BF16", "torch.float32": "F32"}[torch_dtype]


def _mx_bound(orig: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """E2M1 elements {0, .5, 1, 1.5, 2, 3, 4, 6} x scale: half the local spacing, or the saturation."""
    v = np.abs(orig) / scale
    half = np.where(v < 2, 0.25, np.where(v < 4, 0.5, 1.0)) * scale
    return np.where(v > 6, (v - 6) * scale, half)


def half_step_bound(folder: Path, scheme: str, layer: str, orig: np.ndarray) -> np.ndarray:
    """Per element of the layer's weight ([N, K], or [E, N, K]), the largest |deq - orig| allowed."""
    raw = _raw(folder)
    fmt = EXPECTED[scheme]["format"]
    o = np.asarray(orig, dtype=np.float64)
    if fmt in ("ct-mxfp4", "gptoss-mxfp4"):
        sb = raw[layer + (".weight_scale" if fmt == "ct-mxfp4" else "_scales")][0].astype(np.float64)
        scale = np.repeat(2.0 ** (sb - 127), 32, axis=-1)
        return _mx_bound(o, scale[..., : o.shape[-1]] if scale.ndim == o.ndim else scale)
    bits = EXPECTED[scheme]["bits"]
    n, k = o.shape
    if fmt == "gptq":
        s, dt = raw[layer + ".scales"]
        g = raw[layer + ".g_idx"][0] if layer + ".g_idx" in raw else np.arange(k) // (k // s.shape[0])
        S = s[g, :].T
    elif fmt == "awq":
        s, dt = raw[layer + ".scales"]
        S = s[np.arange(k) // (k // s.shape[0]), :].T
    else:  # compressed-tensors: weight_scale [N, n_groups], contiguous groups along K
        s, dt = raw[layer + ".weight_scale"]
        S = s[:, np.arange(k) // (k // s.shape[1])]
    key = _dtype_key(dt)
    levels = 2 ** bits
    return S / 2 + levels * np.maximum(S * _EPS[key], _TINY[key])


def on_e2m1_grid(w: np.ndarray, folder: Path, layer: str, fmt: str) -> bool:
    """Every dequantized MXFP4 value is an E2M1 value times its block's power-of-two scale."""
    raw = _raw(folder)
    sb = raw[layer + (".weight_scale" if fmt == "ct-mxfp4" else "_scales")][0].astype(np.float64)
    scale = np.repeat(2.0 ** (sb - 127), 32, axis=-1)
    v = np.abs(w.astype(np.float64)) / scale
    return bool(np.all(np.isin(v, [0, 0.5, 1, 1.5, 2, 3, 4, 6])))
