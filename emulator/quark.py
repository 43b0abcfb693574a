"""AMD Quark (``quant_method: "quark"``) checkpoints: which layers are quantized, and how.

Semantics: docs/formats.md ("AMD Quark"), docs/checkpoints.md. Quark's export (amd-quark 0.13,
``quark.torch.export_safetensors(weight_format="real_quantized")``) writes, per quantized linear,
``weight``, ``weight_scale`` and for integer dtypes ``weight_zero_point``. This module reads the
config that chose each layer's scheme (``exclude`` > ``layer_quant_config`` >
``layer_type_quant_config`` > ``global_quant_config``, Quark's own priority) and dequantizes:

* ``quark-int`` int4 / uint4 ``per_group`` (ch_axis -1): weight int32 [K, N/8] (the weight is
  transposed, then 8 nibbles per word along N), scale [K/G, N], zero point int32 [K/G, N/8]
  packed the same way; int8 ``per_channel`` (ch_axis 0): weight int8 [N, K], scale [N], zero
  point [N]. ``w = (q - z) * s`` in float32, q and z sign-extended for signed dtypes.
* ``quark-mxfp4``: fp4 ``per_group`` 32 with ``scale_format: "e8m0"``: weight uint8 [N, K/2]
  (element 2j in the low nibble), scale bytes [N, K/32]; the layout and arithmetic of
  compressed-tensors MXFP4, so it is dequantized by formats/mxfp4.py.

Every other Quark scheme is refused with one line naming it.
"""

from __future__ import annotations

import numpy as np

from .errors import FormatError, UnsupportedFormatError, require
from .layer_info import LayerInfo

__all__ = ["detect_quark_layers", "dequantize_quark_int", "quark_int_weights", "mx_variant_fields",
           "ORDER_REORDER", "glob_match"]

#: nibble slot i of a packed word holds element ORDER[i] of its 8 (Quark utils/pack.py Pack_4_bits:
#: pack_method "reorder" uses [0, 2, 4, 6, 1, 3, 5, 7], "order" the identity)
ORDER_REORDER = (0, 2, 4, 6, 1, 3, 5, 7)
ORDER_ORDER = tuple(range(8))

def _short(value) -> str:
    r = repr(value)
    return r if len(r) <= 80 else r[:77] + "..."


def _bias(ckpt, prefix: str, tensors: dict) -> dict:
    if ckpt.has(prefix + ".bias"):
        tensors["bias"] = prefix + ".bias"
    return tensors


_INT_DTYPES = {"int4": (4, True), "uint4": (4, False), "int8": (8, True)}
MAX_PATTERN = 1024
#: pattern-matching steps (pattern tokens x name characters) one checkpoint may spend: a few seconds
#: of Python at most, far above real configs (a handful of globs; full names compare in O(1))
MAX_MATCH_WORK = 20_000_000


class MatchWork:
    """The matching budget of one checkpoint's detection (docs/checkpoints.md, Limits)."""

    def __init__(self, where: str, limit: int = MAX_MATCH_WORK):
        self.where, self.left = where, limit

    def spend(self, steps: int) -> None:
        self.left -= steps
        if self.left < 0:
            raise UnsupportedFormatError(f"{self.where}: matching the exclude / layer_quant_config patterns against "
                                         f"the layer names needs more than {MAX_MATCH_WORK} steps")


def glob_match(pattern: str, name: str, work: MatchWork | None = None) -> bool:
    """``fnmatch.fnmatchcase`` semantics (``*``, ``?``, ``[seq]``, ``[!seq]``) in O(len(p) * len(n))
    time, whatever the pattern (Quark matches exclude / layer_quant_config keys with fnmatch)."""
    if not any(c in pattern for c in "*?["):
        return pattern == name
    if work is not None:
        work.spend((len(pattern) + 1) * (len(name) + 1))
    toks = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "[":
            j = i + 1
            if j < len(pattern) and pattern[j] == "!":
                j += 1
            if j < len(pattern) and pattern[j] == "]":
                j += 1
            while j < len(pattern) and pattern[j] != "]":
                j += 1
            if j >= len(pattern):
                toks.append(("lit", "["))
                i += 1
                continue
            body = pattern[i + 1:j]
            neg = body.startswith("!")
            if neg:
                body = body[1:]
            ranges = []  # (lo, hi) code points: a range is never expanded
            k = 0
            while k < len(body):
                if k + 2 < len(body) and body[k + 1] == "-":
                    ranges.append((ord(body[k]), ord(body[k + 2])))
                    k += 3
                else:
                    ranges.append((ord(body[k]), ord(body[k])))
                    k += 1
            toks.append(("set", (neg, tuple(ranges))))
            i = j + 1
        elif c == "*":
            if not toks or toks[-1] != ("star", None):
                toks.append(("star", None))
            i += 1
        else:
            toks.append(("any", None) if c == "?" else ("lit", c))
            i += 1
    # reachable[j]: the first t tokens can match name[:j]
    reach = [True] + [False] * len(name)
    for kind, arg in toks:
        if kind == "star":
            nxt, seen = [], False
            for r in reach:
                seen = seen or r
                nxt.append(seen)
        else:
            nxt = [False] * (len(name) + 1)
            for j in range(len(name)):
                if reach[j]:
                    ch = name[j]
                    ok = (kind == "any" or (kind == "lit" and ch == arg)
                          or (kind == "set" and (any(lo <= ord(ch) <= hi for lo, hi in arg[1]) != arg[0])))
                    nxt[j + 1] = ok
        reach = nxt
    return reach[-1]


def _obj(value, key: str, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UnsupportedFormatError(f"{where}: quantization_config {key}={_short(value)} is not an object")
    return value


def _field(spec: dict, key: str, kinds, where: str, default=None):
    v = spec.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds):
        raise UnsupportedFormatError(f"{where}: quantization_config {key}={_short(v)} is not a "
                                     f"{'/'.join(k.__name__ for k in kinds)}")
    return v


def _patterns(qc: dict, key: str, where: str) -> list:
    v = qc.get(key)
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(p, str) and len(p) <= MAX_PATTERN for p in v):
        raise UnsupportedFormatError(f"{where}: quantization_config {key}={_short(v)} is not a list of strings "
                                     f"(each at most {MAX_PATTERN} characters)")
    return v


def layer_config(qc: dict, name: str, where: str, work: MatchWork | None = None) -> dict | None:
    """The QLayerConfig Quark applies to linear ``name`` (None: excluded or not quantized)."""
    if any(glob_match(p, name, work) for p in _patterns(qc, "exclude", where)):
        return None
    lqc = _obj(qc.get("layer_quant_config"), "layer_quant_config", where)
    for pat, body in lqc.items():
        if len(pat) > MAX_PATTERN:
            raise UnsupportedFormatError(f"{where}: layer_quant_config key longer than {MAX_PATTERN} characters")
        if glob_match(pat, name, work):
            return _obj(body, f"layer_quant_config[{_short(pat)}]", where)
    ltq = _obj(qc.get("layer_type_quant_config"), "layer_type_quant_config", where)
    for tname, body in ltq.items():
        if tname != "Linear":  # Quark writes the class __name__ (QConfig.to_dict)
            # the checkpoint holds no module types: only Linear (every exported layer) is known
            raise UnsupportedFormatError(f"{where}: layer_type_quant_config[{_short(tname)}] is not defined "
                                         "(qconform reads Linear only)")
        return _obj(body, f"layer_type_quant_config[{_short(tname)}]", where)
    return _obj(qc.get("global_quant_config"), "global_quant_config", where)


def _weight_spec(cfg: dict, name: str) -> dict | None:
    w = cfg.get("weight")
    if isinstance(w, list):
        raise UnsupportedFormatError(f"{name}: Quark two-stage weight spec (a list of specs) is not defined")
    return _obj(w, "weight", name) or None


def _refuse(name: str, what: str) -> None:
    raise UnsupportedFormatError(f"{name}: Quark {what} is not defined (qconform reads int4/uint4 per_group, "
                                 "int8 per_channel, fp4 per_group 32 e8m0)")


def _check_common(spec: dict, name: str, role: str) -> None:
    for key in ("is_dynamic", "is_scale_quant"):
        if _field(spec, key, (bool,), name, False) and role == "weight":
            _refuse(name, f"weight {key}=true")
    zpt = _field(spec, "zero_point_type", (str,), name, "int32")
    if zpt != "int32":
        _refuse(name, f"zero_point_type {zpt!r}")


def _activation(cfg: dict, name: str) -> dict | None:
    a = cfg.get("input_tensors")
    if a is None:
        return None
    if isinstance(a, list):
        raise UnsupportedFormatError(f"{name}: Quark two-stage input_tensors spec is not defined")
    a = _obj(a, "input_tensors", name)
    dtype = _field(a, "dtype", (str,), name, "")
    qscheme = _field(a, "qscheme", (str,), name, "")
    dyn = _field(a, "is_dynamic", (bool,), name, False)
    out = {"quark_dtype": dtype, "qscheme": qscheme, "dynamic": dyn,
           "symmetric": _field(a, "symmetric", (bool,), name, None),
           "ch_axis": _field(a, "ch_axis", (int,), name, None),
           "group_size": _field(a, "group_size", (int,), name, None),
           "round_method": _field(a, "round_method", (str,), name, None),
           "scale_calculation_mode": _field(a, "scale_calculation_mode", (str,), name, None),
           "scale_format": _field(a, "scale_format", (str,), name, None)}
    if dtype == "fp4":
        out.update(type="float", num_bits=4)
    elif dtype == "int8":
        out.update(type="int", num_bits=8)
    else:
        out.update(type=dtype, num_bits=None)
    return out


def mx_variant_fields(act: dict, name: str) -> dict:
    """MxVariant fields of Quark's dynamic MXFP4 activation quantizer, or a named refusal.

    Quark 0.13 quantization/utils.py ``even_round`` (scale_calculation_mode "even", the default):
    amax rounded to one mantissa bit then floor log2, minus emax 2; an all-zero block gets scale
    2^-127 (byte 0). Elements: round_method half_even = RNE (docs/formats.md, Quark section)."""
    mode = act.get("scale_calculation_mode") or "even"
    rnd = act.get("round_method") or "half_even"
    fmt = act.get("scale_format") or "e8m0"
    if not (act.get("dynamic") and act.get("qscheme") == "per_group" and act.get("group_size") == 32
            and act.get("ch_axis") in (-1, 1)):
        raise UnsupportedFormatError(f"{name}: Quark fp4 input_tensors other than dynamic per_group 32 along K "
                                     f"are not defined (got {_short({k: act.get(k) for k in ('dynamic', 'qscheme', 'group_size', 'ch_axis')})})")
    if mode != "even" or rnd != "half_even" or fmt != "e8m0":
        raise UnsupportedFormatError(
            f"{name}: Quark MXFP4 activations with scale_calculation_mode={mode!r}, round_method={rnd!r}, "
            f"scale_format={fmt!r} are not an emulator variant (defined: even / half_even / e8m0)")
    return {"scale_rule": "even", "element_rounding": "rne", "zero_block": "min"}


def _layer(ckpt, name: str, cfg: dict, reorder: bool) -> LayerInfo:
    spec = _weight_spec(cfg, name)
    if spec is None:
        raise FormatError("Quark tensors present but the layer's config has no weight spec", layer=name)
    dtype = _field(spec, "dtype", (str,), name, "")
    qscheme = _field(spec, "qscheme", (str,), name, "")
    _check_common(spec, name, "weight")
    for role in ("bias", "output_tensors"):  # they change the layer's numbers; no format here defines them
        if cfg.get(role) is not None:
            raise UnsupportedFormatError(f"{name}: Quark {role} quantization is not defined")
    act = _activation(cfg, name)
    sym = _field(spec, "symmetric", (bool,), name, None)
    tensors = {"weight": name + ".weight", "weight_scale": name + ".weight_scale"}
    if not ckpt.has(name + ".weight_scale"):
        raise FormatError("missing tensor", layer=name, tensor="weight_scale")
    wdt, wshape = ckpt.tensor_info(name + ".weight", layer=name)
    if len(wshape) != 2:
        raise FormatError(f"expected a 2-D weight, got shape {list(wshape)}", layer=name, tensor="weight")
    scale_format = _field(spec, "scale_format", (str,), name, None)
    if dtype in ("int4", "uint4"):
        if qscheme != "per_group" or _field(spec, "ch_axis", (int,), name, -1) not in (-1, 1):
            _refuse(name, f"{dtype} {qscheme or 'qscheme null'} (ch_axis {spec.get('ch_axis')})")
        if scale_format is not None:
            _refuse(name, f"{dtype} scale_format {scale_format!r}")
        gs = _field(spec, "group_size", (int,), name, None)
        if gs is None or gs <= 0:
            raise UnsupportedFormatError(f"{name}: Quark per_group group_size={_short(spec.get('group_size'))} "
                                         "is not a positive integer")
        K, N = wshape[0], wshape[1] * 8
        if not ckpt.has(name + ".weight_zero_point"):
            raise FormatError("missing tensor", layer=name, tensor="weight_zero_point")
        tensors["weight_zero_point"] = name + ".weight_zero_point"
        return LayerInfo(name=name, format="quark-int", shape=(N, K), bits=4, group_size=gs,
                         sym=bool(sym) if sym is not None else dtype == "int4", act_order=False,
                         zero_convention=f"{dtype}-{'reorder' if reorder else 'order'}",
                         tensors=_bias(ckpt, name, tensors), activation=act,
                         scale_dtype=ckpt.tensor_info(name + ".weight_scale")[0])
    if dtype == "int8":
        if qscheme != "per_channel" or _field(spec, "ch_axis", (int,), name, 0) != 0:
            _refuse(name, f"int8 {qscheme or 'qscheme null'} (ch_axis {spec.get('ch_axis')})")
        if scale_format is not None:
            _refuse(name, f"int8 scale_format {scale_format!r}")
        if not ckpt.has(name + ".weight_zero_point"):
            raise FormatError("missing tensor", layer=name, tensor="weight_zero_point")
        tensors["weight_zero_point"] = name + ".weight_zero_point"
        return LayerInfo(name=name, format="quark-int", shape=tuple(wshape), bits=8, group_size=-1,
                         sym=bool(sym) if sym is not None else True, act_order=False, zero_convention="int8",
                         tensors=_bias(ckpt, name, tensors), activation=act,
                         scale_dtype=ckpt.tensor_info(name + ".weight_scale")[0])
    if dtype == "fp4":
        gs = _field(spec, "group_size", (int,), name, None)
        if qscheme != "per_group" or gs != 32 or (scale_format or "") != "e8m0" \
                or _field(spec, "ch_axis", (int,), name, -1) not in (-1, 1):
            _refuse(name, f"fp4 qscheme={qscheme!r} group_size={gs!r} scale_format={scale_format!r} "
                          "(MXFP4 is per_group 32 e8m0 along K)")
        return LayerInfo(name=name, format="quark-mxfp4", shape=(wshape[0], wshape[1] * 2), bits=4, group_size=32,
                         sym=True, act_order=False, zero_convention=None, tensors=_bias(ckpt, name, tensors),
                         activation=act, scale_dtype="E8M0")
    mx = spec.get("mx_element_dtype")
    _refuse(name, f"weight dtype {dtype!r}" + (f" (mx_element_dtype {mx!r})" if mx else ""))


def detect_quark_layers(ckpt, qc: dict, budget=None) -> list[LayerInfo]:
    """The detect.detect_layers rule for quant_method "quark" (budget unused: globs run in linear time)."""
    where = str(ckpt.qconfig_source)
    export = _obj(qc.get("export"), "export", where)
    wf = _field(export, "weight_format", (str,), where, "real_quantized")
    if wf != "real_quantized":
        raise UnsupportedFormatError(f"{where}: Quark export weight_format {wf!r} is not defined (real_quantized; "
                                     "fake_quantized holds float weights, no quantized format)")
    pm = _field(export, "pack_method", (str,), where, "reorder")
    if pm not in ("reorder", "order"):
        raise UnsupportedFormatError(f"{where}: Quark export pack_method {pm!r} is not defined (reorder, order)")
    for key in ("kv_cache_quant_config",):
        if _obj(qc.get(key), key, where):
            raise UnsupportedFormatError(f"{where}: Quark {key} (KV-cache quantization) is not defined")
    if qc.get("softmax_quant_spec") is not None:
        raise UnsupportedFormatError(f"{where}: Quark softmax_quant_spec is not defined")
    layers = []
    # a layer is quantized where it has a scale or zero point, or an integer weight: one missing its
    # weight_scale is reported, not silently read as unquantized
    names = set()
    for n in ckpt.tensor_names():
        for tail in (".weight_scale", ".weight_zero_point"):
            if n.endswith(tail):
                names.add(n[: -len(tail)])
        if n.endswith(".weight") and ckpt.tensor_info(n)[0] in ("I32", "I8", "U8"):
            names.add(n[: -len(".weight")])
    work = MatchWork(where)
    for name in sorted(names):
        cfg = layer_config(qc, name, where, work)
        if cfg is None:
            raise FormatError("quantized tensors present but quantization_config exclude names this layer",
                              layer=name)
        layers.append(_layer(ckpt, name, cfg, pm == "reorder"))
    return layers


# -- dequantization -------------------------------------------------------------------
def _unpack_nibbles(words: np.ndarray, order: tuple, signed: bool, what: str, layer: str) -> np.ndarray:
    """int32 [R, C] -> int32 [R, 8C]: nibble i (bits 4i..4i+3) of word c is element 8c + order[i]."""
    w = np.ascontiguousarray(words).view(np.uint32)
    nib = np.stack([(w >> np.uint32(4 * i)) & np.uint32(0xF) for i in range(8)], axis=-1).astype(np.int32)
    out = np.empty_like(nib)
    out[..., list(order)] = nib
    out = out.reshape(w.shape[0], -1)
    if signed:
        out = np.where(out >= 8, out - 16, out)
    return out


def quark_int_weights(info: LayerInfo, tensors: dict):
    """(q - z) int32 [N, K], scales float32 [n_groups, N], group size — the integer view of a quark-int layer."""
    name = info.name
    q = tensors["weight"]
    s = tensors["weight_scale"]
    z = tensors["weight_zero_point"]
    require(s.dtype in ("F16", "BF16", "F32"), f"expected a float16/bfloat16/float32 scale, got {s.dtype}",
            layer=name, tensor="weight_scale")
    scale = np.asarray(s.data, dtype=np.float32)
    if info.bits == 8:
        N, K = info.shape
        require(q.dtype == "I8", f"expected int8, got {q.dtype}", layer=name, tensor="weight")
        require(scale.shape == (N,), f"expected shape [{N}], got {list(scale.shape)}", layer=name, tensor="weight_scale")
        require(tuple(z.shape) == (N,), f"expected shape [{N}], got {list(z.shape)}", layer=name,
                tensor="weight_zero_point")
        zp = np.asarray(z.data).astype(np.int32)
        require(bool(np.all((zp >= -128) & (zp <= 127))), "zero point outside int8 [-128, 127]", layer=name,
                tensor="weight_zero_point")
        return np.asarray(q.data).astype(np.int32) - zp[:, None], scale[None, :], K
    dtype, pm = info.zero_convention.split("-")
    order = ORDER_REORDER if pm == "reorder" else ORDER_ORDER
    signed = dtype == "int4"
    N, K = info.shape
    G = info.group_size
    require(q.dtype == "I32", f"expected int32, got {q.dtype}", layer=name, tensor="weight")
    require(K % G == 0, f"K={K} is not a multiple of group_size {G}", layer=name, tensor="weight")
    require(scale.shape == (K // G, N), f"expected shape [K/G, N] = {[K // G, N]}, got {list(scale.shape)}",
            layer=name, tensor="weight_scale")
    require(z.dtype == "I32" and tuple(z.shape) == (K // G, N // 8),
            f"expected int32 [K/G, N/8] = {[K // G, N // 8]}, got {z.dtype} {list(z.shape)}",
            layer=name, tensor="weight_zero_point")
    qt = _unpack_nibbles(q.data, order, signed, "weight", name)  # [K, N]
    zt = _unpack_nibbles(z.data, order, signed, "weight_zero_point", name)  # [K/G, N]
    g = np.arange(K) // G
    return (qt - zt[g, :]).T, scale, G


def dequantize_quark_int(info: LayerInfo, tensors: dict) -> np.ndarray:
    """w = (q - z) * s in float32 (Quark kernel/hw_emulation dequantize_int_per_*_affine)."""
    d, scale, G = quark_int_weights(info, tensors)
    N, K = info.shape
    g = np.arange(K) // G if info.bits == 4 else np.zeros(K, dtype=np.int64)
    s = scale[g, :].T if info.bits == 4 else scale[0][:, None]
    return d.astype(np.float32) * s
