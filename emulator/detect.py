"""Detection rules: which format each layer of a checkpoint uses.

Semantics: docs/checkpoints.md. Each rule reads only the config keys the
toolkit writes and the tensor names present; no tensor data is read here
except dtypes and shapes from the safetensors headers.
"""

from __future__ import annotations

import dataclasses
import re

from typing import TYPE_CHECKING

from .layer_info import LayerInfo

if TYPE_CHECKING:  # annotations only: checkpoint.py calls into this module
    from .checkpoint import Checkpoint
from .errors import FormatError, UnsupportedFormatError
from .saferegex import MAX_CONFIG_PATTERNS, Budget

#: config_groups one compressed-tensors config may hold (each name is tested against each group's targets)
MAX_CONFIG_GROUPS = 1_000

_GPTQ_SUFFIXES = ("qweight", "qzeros", "scales", "g_idx", "bias")


def detect_layers(ckpt: Checkpoint, rule=None) -> list[LayerInfo]:
    """``rule``: the method's detection rule where it lives in its own module (emulator/quark.py)."""
    rule = rule or {
        "gptq": _detect_gptq,
        "auto-round": _detect_auto_round,
        "awq": _detect_awq,
        "compressed-tensors": _detect_compressed_tensors,
        "mxfp4": _detect_gptoss_mxfp4,
    }[ckpt.method]
    check_config_types(ckpt.qconfig, str(ckpt.qconfig_source))
    check_config_sizes(ckpt.qconfig, str(ckpt.qconfig_source))
    # one budget for all the re: matching of this checkpoint (emulator/saferegex.py)
    layers = rule(ckpt, ckpt.qconfig, Budget(where=str(ckpt.qconfig_source)))
    if not layers:
        raise FormatError(f"{ckpt.folder}: quant_method {ckpt.method!r} but no quantized layer tensors were found")
    for info in layers:
        _check_storage(ckpt, info)
    return sorted(layers, key=lambda l: l.name)


_FLOAT = ("F16", "BF16", "F32")
_INDEX = ("I32", "I64")
#: format -> role -> the safetensors dtypes each toolkit stores that tensor as (docs/checkpoints.md).
#: Packed codes must carry their storage dtype: an fp8 tensor holding MXFP4 nibbles is not one.
STORAGE = {
    "gptq": {"qweight": ("I32",), "qzeros": ("I32",), "scales": _FLOAT, "g_idx": _INDEX},
    "awq": {"qweight": ("I32",), "qzeros": ("I32",), "scales": _FLOAT},
    "ct-pack-quantized": {"weight_packed": ("I32",), "weight_scale": _FLOAT, "weight_zero_point": ("I32",),
                          "weight_g_idx": _INDEX, "weight_shape": _INDEX},
    "ct-int-quantized": {"weight": ("I8",), "weight_scale": _FLOAT, "weight_zero_point": ("I8", "I32")},
    "ct-mxfp4": {"weight_packed": ("U8",), "weight_scale": ("U8",)},
    "gptoss-mxfp4": {"blocks": ("U8",), "scales": ("U8",)},
    # AMD Quark real_quantized export (emulator/quark.py): int4/uint4 packed in int32, int8 as int8
    "quark-int": {"weight": ("I32", "I8"), "weight_scale": _FLOAT, "weight_zero_point": ("I32", "I8")},
    "quark-mxfp4": {"weight": ("U8",), "weight_scale": ("U8",)},
}
_BIAS = ("F16", "BF16", "F32", "F64")


def _check_storage(ckpt: Checkpoint, info: LayerInfo) -> None:
    """Header-level checks every command shares: storage dtypes, no zero-size dimension."""
    allowed = STORAGE.get(info.format, {})
    for role, tname in info.tensors.items():
        dt, shape = ckpt.tensor_info(tname, layer=info.name)
        want = _BIAS if role == "bias" else allowed.get(role)
        shown = tname.rsplit(".", 1)[-1]
        if want is not None and dt not in want:
            raise FormatError(f"stored as {dt}; {info.format} stores {role} as {'/'.join(want)}",
                              layer=info.name, tensor=shown)
        if 0 in shape and role != "bias":
            raise FormatError(f"zero-size dimension in shape {list(shape)}", layer=info.name, tensor=shown)
    if any(not isinstance(d, int) or d <= 0 for d in info.shape):
        dims = "K = 0" if info.shape and info.shape[-1] == 0 else "a zero-size dimension"
        raise FormatError(f"logical weight shape {list(info.shape)} has {dims}", layer=info.name)


def _prefixes(ckpt: Checkpoint, suffix: str) -> list[str]:
    tail = "." + suffix
    return sorted(n[: -len(tail)] for n in ckpt.tensor_names() if n.endswith(tail))


def _bias(ckpt: Checkpoint, prefix: str, tensors: dict) -> dict:
    if ckpt.has(prefix + ".bias"):
        tensors["bias"] = prefix + ".bias"
    return tensors


def _int(value, key: str, where: str) -> int:
    """An integer config value; UnsupportedFormatError naming ``where`` and the key otherwise."""
    if isinstance(value, bool):
        ok = False
    elif isinstance(value, int):
        return value
    elif isinstance(value, float):
        ok = value.is_integer()
    elif isinstance(value, str):
        ok = re.fullmatch(r"[+-]?[0-9]{1,9}", value.strip()) is not None  # ASCII digits only: not "²", not "+-4"
    else:
        ok = False
    if not ok:
        raise UnsupportedFormatError(f"{where}: quantization_config {key}={_short(value)} is not an integer")
    return int(float(value)) if isinstance(value, float) else int(value)


INT_KEYS = ("bits", "group_size", "num_bits", "w_bit", "q_group_size", "act_bits", "act_group_size")
#: keys whose type is checked wherever a toolkit writes them (top level, config_groups[*],
#: config_groups[*].weights / input_activations, extra_config[*]), read by a rule or not: a
#: "false" string is an error even where qconform ignores the key.
BOOL_KEYS = ("sym", "desc_act", "symmetric", "zero_point", "act_sym", "act_dynamic", "true_sequential",
             "static_groups", "enable_quanted_input")
STR_KEYS = ("quant_method", "checkpoint_format", "packing_format", "version", "format", "type", "strategy",
            "data_type", "act_data_type")


def _typed_sections(qc: dict):
    yield "", qc
    groups = qc.get("config_groups")
    if isinstance(groups, dict):
        for g, body in groups.items():
            if isinstance(body, dict):
                yield f"config_groups.{g}.", body
                for sub in ("weights", "input_activations"):
                    if isinstance(body.get(sub), dict):
                        yield f"config_groups.{g}.{sub}.", body[sub]
    extra = qc.get("extra_config")
    if isinstance(extra, dict):
        for k, body in extra.items():
            if isinstance(body, dict):
                yield f"extra_config[{_short(k)}].", body


def _int_like(value) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, str)) or (isinstance(value, float) and value.is_integer())


def check_config_types(qc: dict, where: str) -> None:
    """Every known key has its type (null allowed: the toolkit default)."""
    for prefix, section in _typed_sections(qc):
        for key, value in section.items():
            if value is None:
                continue
            if key in BOOL_KEYS and not isinstance(value, bool):
                raise UnsupportedFormatError(f"{where}: quantization_config {prefix}{key}={_short(value)} "
                                             "is not a boolean (true or false)")
            if key in INT_KEYS and not _int_like(value):
                # (digit strings are checked where a rule reads them, so that error can name the layer)
                raise UnsupportedFormatError(f"{where}: quantization_config {prefix}{key}={_short(value)} "
                                             "is not an integer")
            if key in STR_KEYS and not isinstance(value, str):
                raise UnsupportedFormatError(f"{where}: quantization_config {prefix}{key}={_short(value)} is not a string")


def _config_strings(qc: dict):
    """Every string a detection rule matches names against: extra_config keys, ignore, every targets."""
    extra = qc.get("extra_config")
    if isinstance(extra, dict):
        yield from extra
    for key in ("ignore", "targets"):
        v = qc.get(key)
        yield from ([v] if isinstance(v, str) else v if isinstance(v, list) else [])
    groups = qc.get("config_groups")
    if isinstance(groups, dict):
        for g in groups.values():
            v = g.get("targets") if isinstance(g, dict) else None
            yield from ([v] if isinstance(v, str) else v if isinstance(v, list) else [])


def check_config_sizes(qc: dict, where: str) -> None:
    """The counted limits of docs/checkpoints.md#limits, before any pattern is compiled or any name matched:
    at most MAX_CONFIG_PATTERNS ``re:`` patterns and MAX_CONFIG_GROUPS config_groups."""
    n = sum(1 for t in _config_strings(qc) if isinstance(t, str) and t.startswith("re:"))
    if n > MAX_CONFIG_PATTERNS:
        raise UnsupportedFormatError(f"{where}: quantization_config holds {n} re: patterns (extra_config, targets, "
                                     f"ignore), more than the {MAX_CONFIG_PATTERNS} qconform matches; refused")
    groups = qc.get("config_groups")
    if isinstance(groups, dict) and len(groups) > MAX_CONFIG_GROUPS:
        raise UnsupportedFormatError(f"{where}: quantization_config holds {len(groups)} config_groups, more than "
                                     f"the {MAX_CONFIG_GROUPS} qconform matches; refused")


def _split_patterns(entries, budget: Budget, key) -> tuple:
    """(plain names as a set, [re: patterns in order]) of a list, built once per checkpoint (budget.memo)."""
    hit = budget.memo.get(key)
    if hit is None:
        plain = {t for t in entries if not t.startswith("re:")}
        hit = budget.memo[key] = (plain, [t for t in entries if t.startswith("re:")])
    return hit


def _suffix_hit(name: str, plain: set) -> bool:
    """``name == t or name.endswith("." + t)`` for some t of ``plain``, in O(len(name)) set look-ups."""
    if name in plain:
        return True
    i = name.find(".")
    while i >= 0:
        if name[i + 1:] in plain:
            return True
        i = name.find(".", i + 1)
    return False


def _cfg_int(cfg: dict, key: str, default: int, where: str) -> int:
    return _int(cfg.get(key, default), key, where)


def _bool(cfg: dict, key: str, default: bool, where: str) -> bool:
    """A boolean config value: JSON true/false only (null or absent: ``default``). The string
    "false" is an error, not a truthy value."""
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise UnsupportedFormatError(f"{where}: quantization_config {key}={_short(value)} is not a boolean (true or false)")
    return value


def _str(cfg: dict, key: str, default: str, where: str) -> str:
    """A string config value, lower-cased (null or absent: ``default``)."""
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise UnsupportedFormatError(f"{where}: quantization_config {key}={_short(value)} is not a string")
    return value.lower()


def _str_list(value, key: str, where: str) -> list:
    """targets / ignore: a string or a list of strings (null: empty)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UnsupportedFormatError(f"{where}: quantization_config {key}={_short(value)} is not a list of strings")
    return value


def _short(value) -> str:
    r = repr(value)
    return r if len(r) <= 80 else r[:77] + "..."


def _group(gs, where: str = "config.json", key: str = "group_size") -> int:
    gs = _int(gs, key, where) if gs is not None else -1
    return -1 if gs <= 0 else gs


def _scale_dtype(ckpt: Checkpoint, name: str, layer: str) -> str:
    return ckpt.tensor_info(name, layer=layer)[0]


def _int_prefixes(ckpt: Checkpoint) -> list[str]:
    """Layers of the GPTQ/AWQ layouts: every prefix with a qweight, qzeros or scales (so a layer whose
    qweight is missing is reported, not silently left out)."""
    return sorted(set(_prefixes(ckpt, "qweight")) | set(_prefixes(ckpt, "qzeros")) | set(_prefixes(ckpt, "scales")))


def _require_2d(ckpt: Checkpoint, prefix: str, role: str, layout: str) -> tuple:
    dt, shape = ckpt.tensor_info(f"{prefix}.{role}", layer=prefix)
    if len(shape) != 2:
        raise FormatError(f"expected a 2-D {layout} tensor, got shape {list(shape)}", layer=prefix, tensor=role)
    return shape


# -- GPTQ family --------------------------------------------------------------------------
def _gptq_layer(ckpt: Checkpoint, prefix: str, cfg: dict, zero_convention: str) -> LayerInfo:
    bits = _cfg_int(cfg, "bits", 4, prefix)
    if bits not in (4, 8):
        raise UnsupportedFormatError(f"{prefix}: GPTQ bits={bits} is not defined (4 or 8)")
    # N and K come from qweight [K / (32/bits), N], the layer's main tensor: a scales, qzeros or
    # g_idx tensor that disagrees with it is the one the error names.
    qshape = _require_2d(ckpt, prefix, "qweight", f"[K/{32 // bits}, N]")
    sname = prefix + ".scales"
    _require_2d(ckpt, prefix, "scales", "[K/G, N]")
    N, K = qshape[1], qshape[0] * (32 // bits)
    group = _group(cfg.get("group_size", 128), prefix)
    tensors = {"qweight": prefix + ".qweight", "scales": sname}
    for opt in ("qzeros", "g_idx"):
        if ckpt.has(f"{prefix}.{opt}"):
            tensors[opt] = f"{prefix}.{opt}"
    if "g_idx" in tensors:
        _, gshape = ckpt.tensor_info(tensors["g_idx"], layer=prefix)
        _, sshape = ckpt.tensor_info(sname, layer=prefix)
        if len(gshape) == 1 and gshape[0] != K:
            # g_idx has one entry per input channel; blame qweight when g_idx agrees with the scales
            g_ok = group > 0 and gshape[0] == sshape[0] * group
            raise FormatError(f"qweight {list(qshape)} holds K = {K} input channels but g_idx has {gshape[0]}",
                              layer=prefix, tensor="qweight" if g_ok else "g_idx")
    return LayerInfo(
        name=prefix, format="gptq", shape=(N, K), bits=bits, group_size=group,
        sym=_bool(cfg, "sym", True, prefix), act_order=_bool(cfg, "desc_act", False, prefix),
        zero_convention=zero_convention, tensors=_bias(ckpt, prefix, tensors),
        scale_dtype=_scale_dtype(ckpt, sname, prefix))


def _awq_layer(ckpt: Checkpoint, prefix: str, cfg: dict) -> LayerInfo:
    bits = _int(cfg.get("w_bit", cfg.get("bits", 4)), "w_bit" if "w_bit" in cfg else "bits", prefix)
    if bits != 4:
        raise UnsupportedFormatError(f"{prefix}: AWQ bits={bits} is not defined (4)")
    # qweight [K, N/8] is the layer's main tensor (see _gptq_layer).
    qshape = _require_2d(ckpt, prefix, "qweight", "[K, N/8]")
    sname = prefix + ".scales"
    _require_2d(ckpt, prefix, "scales", "[K/G, N]")
    N, K = qshape[1] * (32 // bits), qshape[0]
    tensors = {"qweight": prefix + ".qweight", "scales": sname}
    if ckpt.has(prefix + ".qzeros"):
        tensors["qzeros"] = prefix + ".qzeros"
    gkey = "q_group_size" if "q_group_size" in cfg else "group_size"
    return LayerInfo(
        name=prefix, format="awq", shape=(N, K), bits=bits,
        group_size=_group(cfg.get(gkey, 128), prefix, gkey),
        sym=not _bool(cfg, "zero_point", True, prefix) if "zero_point" in cfg else _bool(cfg, "sym", False, prefix),
        act_order=False, zero_convention="literal", tensors=_bias(ckpt, prefix, tensors),
        scale_dtype=_scale_dtype(ckpt, sname, prefix))


def _detect_gptq(ckpt: Checkpoint, cfg: dict, budget: Budget) -> list[LayerInfo]:
    fmt = _str(cfg, "checkpoint_format", "gptq", f"{ckpt.qconfig_source}")
    if fmt not in ("gptq", "gptq_v2"):
        raise UnsupportedFormatError(f"{ckpt.folder}: GPTQ checkpoint_format {_short(fmt)} is not defined (gptq, gptq_v2)")
    conv = "v2" if fmt == "gptq_v2" else "v1"
    if conv == "v1" and _written_by_gptqmodel(cfg):
        # GPTQModel writes v1 by subtracting 0x11111111 from whole packed v2 words, so a true zero
        # point 0 borrows from the next field; its own loader adds 0x11111111 back (docs/checkpoints.md).
        conv = "v1-packed"
    return [_gptq_layer(ckpt, p, _layer_cfg(cfg, p, budget), conv) for p in _int_prefixes(ckpt)]


def _written_by_gptqmodel(cfg: dict) -> bool:
    meta = cfg.get("meta") or {}
    quantizer = meta.get("quantizer") if isinstance(meta, dict) else None
    names = quantizer if isinstance(quantizer, list) else [quantizer]
    return any(isinstance(q, str) and q.lower().startswith("gptqmodel") for q in names)


def _re(pattern: str, name: str, budget: Budget, *, full: bool = False) -> bool:
    """Match a config's ``re:`` pattern with the linear-time matcher (emulator/saferegex.py): same
    answers as ``re.match`` / ``re.fullmatch``; a pattern that does not compile is the config's error."""
    rx = budget.compile(pattern[3:])
    return rx.fullmatch(name, budget) if full else rx.match(name, budget)


def _layer_cfg(cfg: dict, prefix: str, budget: Budget) -> dict:
    """Per-layer overrides (auto-round ``extra_config``)."""
    extra = cfg.get("extra_config")
    out = dict(cfg)
    if extra is None:
        return out
    if not isinstance(extra, dict):
        raise UnsupportedFormatError(f"{prefix}: quantization_config extra_config={_short(extra)} is not an object")
    memo = budget.memo.get(("extra_config", id(extra)))
    if memo is None:  # once per checkpoint: the key order, and which keys are patterns
        for key, over in extra.items():
            if not isinstance(over, dict):
                raise UnsupportedFormatError(f"{prefix}: quantization_config extra_config[{_short(key)}]="
                                             f"{_short(over)} is not an object")
        order = {key: i for i, key in enumerate(extra)}
        memo = budget.memo[("extra_config", id(extra))] = (order, [k for k in extra if k.startswith("re:")])
    order, patterns = memo
    # the keys that apply, in the config's order (a later key overrides an earlier one, as before)
    hits = [k for k in patterns if _re(k, prefix, budget, full=True)]
    if prefix in order:
        hits.append(prefix)
    for key in sorted(hits, key=order.__getitem__):
        out.update(extra[key])
    return out


def _auto_round_zero_convention(cfg: dict) -> str:
    """auto-round's GPTQ-layout packing writes v1 zero points (stored z - 1), like AutoGPTQ:
    its own dequantized weights match only the v1 reading (tests/emulator/test_toolkit_checkpoints.py)."""
    return "v1"


def _detect_auto_round(ckpt: Checkpoint, cfg: dict, budget: Budget) -> list[LayerInfo]:
    packing = _str(cfg, "packing_format", "auto_round:auto_gptq", str(ckpt.qconfig_source))
    if packing not in ("auto_round:llm_compressor", "llm_compressor"):
        # the GPTQ / AWQ layouts hold integer codes: a float data_type (mx_fp, nv_fp, fp8) there is a
        # contradiction, not something to read as int
        dt = _str(cfg, "data_type", "int", str(ckpt.qconfig_source))
        if not dt.startswith("int"):
            raise UnsupportedFormatError(f"{ckpt.qconfig_source}: auto-round data_type {_short(dt)} with packing_format "
                                         f"{_short(packing)} is not defined (the GPTQ/AWQ layouts hold int codes)")
    if packing in ("auto_round:auto_gptq", "auto_round:gptq", "auto_gptq", "auto_round"):
        conv = _auto_round_zero_convention(cfg)
        return [_gptq_layer(ckpt, p, _layer_cfg(cfg, p, budget), conv) for p in _int_prefixes(ckpt)]
    if packing in ("auto_round:auto_awq", "auto_awq", "auto_round:awq"):
        out = []
        for p in _int_prefixes(ckpt):
            lc = _layer_cfg(cfg, p, budget)
            info = _awq_layer(ckpt, p, {"bits": lc.get("bits", 4), "group_size": lc.get("group_size", 128)})
            info.sym = _bool(lc, "sym", False, p)
            out.append(info)
        return out
    if packing in ("auto_round:llm_compressor", "llm_compressor"):
        return _auto_round_llm_compressor(ckpt, cfg, budget)
    raise UnsupportedFormatError(f"{ckpt.folder}: auto-round packing_format {_short(packing)} is not defined")


def _auto_round_act(cfg: dict, where: str) -> dict | None:
    bits = _int(cfg.get("act_bits", 16) or 16, "act_bits", where)
    if bits >= 16:
        return None
    dt = _str(cfg, "act_data_type", "int", where)
    group = _int(cfg.get("act_group_size", 0) or 0, "act_group_size", where)
    return {"num_bits": bits, "type": "float" if "fp" in dt else "int", "symmetric": _bool(cfg, "act_sym", True, where),
            "strategy": "group" if group > 0 else "token", "dynamic": _bool(cfg, "act_dynamic", True, where),
            "group_size": group if group > 0 else None}


def _auto_round_llm_compressor(ckpt: Checkpoint, cfg: dict, budget: Budget) -> list[LayerInfo]:
    """auto-round exporting in compressed-tensors layouts (packing_format auto_round:llm_compressor)."""
    dt = _str(cfg, "data_type", "int", str(ckpt.qconfig_source))
    layers = []
    if dt in ("mx_fp", "mx_fp_rceil", "mxfp4", "mx_fp4"):
        # a weight_scale without its weight_packed is a damaged layer, not an unquantized one
        for prefix in sorted(set(_prefixes(ckpt, "weight_packed")) | set(_prefixes(ckpt, "weight_scale"))):
            if not ckpt.has(prefix + ".weight_packed"):
                raise FormatError("missing tensor (the layer has a weight_scale)", layer=prefix, tensor="weight_packed")
            lc = _layer_cfg(cfg, prefix, budget)
            if _cfg_int(lc, "bits", 4, prefix) != 4 or _cfg_int(lc, "group_size", 32, prefix) != 32:
                raise UnsupportedFormatError(f"{prefix}: auto-round mx_fp with bits={lc.get('bits')} "
                                             f"group_size={lc.get('group_size')} is not MXFP4")
            pshape = _require_2d(ckpt, prefix, "weight_packed", "[N, K/2]")
            _require_2d(ckpt, prefix, "weight_scale", "[N, K/32]")
            tensors = {"weight_packed": prefix + ".weight_packed", "weight_scale": prefix + ".weight_scale"}
            layers.append(LayerInfo(
                name=prefix, format="ct-mxfp4", shape=(pshape[0], pshape[1] * 2), bits=4, group_size=32, sym=True,
                act_order=False, zero_convention=None, tensors=_bias(ckpt, prefix, tensors),
                activation=_auto_round_act(lc, prefix), scale_dtype="E8M0"))
        return layers
    raise UnsupportedFormatError(f"{ckpt.folder}: auto-round llm_compressor export of data_type {_short(dt)} is not defined")


def _detect_awq(ckpt: Checkpoint, cfg: dict, budget: Budget) -> list[LayerInfo]:
    version = _str(cfg, "version", "gemm", str(ckpt.qconfig_source))
    if version != "gemm":
        raise UnsupportedFormatError(f"{ckpt.folder}: AWQ version {_short(version)} is not defined (gemm)")
    return [_awq_layer(ckpt, p, cfg) for p in _int_prefixes(ckpt)]


# -- compressed-tensors ------------------------------------------------------------------
def _ct_targets_match(targets, name: str, budget: Budget, where: str) -> bool:
    plain, patterns = _split_patterns(_str_list(targets, "targets", where), budget, ("targets", id(targets)))
    budget.spend(1, "targets")
    if "Linear" in plain or _suffix_hit(name, plain):
        return True
    return any(_re(t, name, budget) for t in patterns)


def _ct_ignored(cfg: dict, name: str, budget: Budget, where: str) -> bool:
    ignore = cfg.get("ignore")
    plain, patterns = _split_patterns(_str_list(ignore, "ignore", where), budget, ("ignore", id(ignore)))
    return _suffix_hit(name, plain) or any(_re(t, name, budget) for t in patterns)


def _ct_scheme_for(cfg: dict, name: str, budget: Budget, where: str) -> dict | None:
    groups = cfg.get("config_groups") or {}
    for gname, g in groups.items():
        if not isinstance(g, dict):
            raise UnsupportedFormatError(f"{where}: quantization_config config_groups[{_short(gname)}] is not an object")
        if _ct_targets_match(g.get("targets"), name, budget, where):
            return g
    return None


def _detect_compressed_tensors(ckpt: Checkpoint, cfg: dict, budget: Budget) -> list[LayerInfo]:
    where = str(ckpt.qconfig_source)
    top_format = _str(cfg, "format", "", where)
    if top_format not in _CT_FORMATS:
        raise UnsupportedFormatError(f"{where}: compressed-tensors format {_short(top_format)} is not defined "
                                     f"({', '.join(f for f in _CT_FORMATS if f)})")
    if not isinstance(cfg.get("config_groups") or {}, dict):
        raise FormatError(f"{ckpt.folder}/config.json: compressed-tensors quantization_config.config_groups "
                          f"is not an object")
    layers: list[LayerInfo] = []
    candidates = set(_prefixes(ckpt, "weight_packed")) | set(_prefixes(ckpt, "weight_scale"))
    # An int8 weight is quantized whatever tensors sit next to it: a targeted one without its
    # weight_scale is reported, not silently left out.
    candidates |= {p for p in _prefixes(ckpt, "weight")
                   if ckpt.tensor_info(p + ".weight")[0] == "I8" and _ct_scheme_for(cfg, p, budget, where) is not None}
    for prefix in sorted(candidates):
        if _ct_ignored(cfg, prefix, budget, where):
            continue
        scheme = _ct_scheme_for(cfg, prefix, budget, where)
        if scheme is None:
            raise FormatError("quantized tensors present but no config_groups entry targets this layer", layer=prefix)
        w = _ct_weight_args(scheme, prefix, top_format)
        if ckpt.has(prefix + ".weight_packed"):
            layers.append(_ct_packed_layer(ckpt, prefix, w))
        elif ckpt.has(prefix + ".weight"):
            layers.append(_ct_int8_layer(ckpt, prefix, w))
        else:
            raise FormatError("missing tensor: the layer has a weight_scale but neither weight_packed nor weight",
                              layer=prefix, tensor="weight_packed")
    return layers


@dataclasses.dataclass(frozen=True)
class _CtWeightArgs:
    """One layer's compressed-tensors weight scheme, read and checked (config_groups' ``weights``)."""

    fmt: str
    num_bits: int
    wtype: str  # "int" or "float"
    group_size: "object"  # as written (None when absent)
    group: int  # the group size in effect (-1: none)
    actorder: "str | None"
    sym: bool
    activation: "object"  # the layer's activation scheme (_ct_activation)


def _ct_weight_args(scheme: dict, prefix: str, top_format: str) -> _CtWeightArgs:
    wargs = scheme.get("weights") or {}
    if not isinstance(wargs, dict):
        raise UnsupportedFormatError(f"{prefix}: config_groups weights is not an object")
    fmt = _str(scheme, "format", "", prefix) or top_format
    num_bits = _cfg_int(wargs, "num_bits", 8, prefix)
    wtype = _str(wargs, "type", "int", prefix)
    strategy = _str(wargs, "strategy", "tensor", prefix)
    gs = wargs.get("group_size")
    group = _group(gs, prefix) if strategy in ("group", "tensor_group") else -1
    if wtype not in ("int", "float"):
        raise UnsupportedFormatError(f"{prefix}: compressed-tensors weights type {_short(wtype)} is not defined "
                                     "(int, float)")
    if strategy not in _CT_STRATEGIES:
        raise UnsupportedFormatError(f"{prefix}: compressed-tensors weights strategy {_short(strategy)} is not "
                                     f"defined ({', '.join(_CT_STRATEGIES)})")
    if fmt not in _CT_FORMATS:
        raise UnsupportedFormatError(f"{prefix}: compressed-tensors format {_short(fmt)} is not defined "
                                     f"({', '.join(f for f in _CT_FORMATS if f)})")
    activation = _ct_activation(scheme.get("input_activations"), prefix)
    actorder = _ct_actorder(wargs.get("actorder"), prefix)
    sym = _bool(wargs, "symmetric", True, prefix)
    return _CtWeightArgs(fmt, num_bits, wtype, gs, group, actorder, sym, activation)


def _ct_packed_layer(ckpt: Checkpoint, prefix: str, w: _CtWeightArgs) -> LayerInfo:
    """A ``weight_packed`` layer: MXFP4 (float weights) or pack-quantized integers."""
    fmt, num_bits, gs, group = w.fmt, w.num_bits, w.group_size, w.group
    pshape = _require_2d(ckpt, prefix, "weight_packed", "[N, K/pack]")
    if not ckpt.has(prefix + ".weight_scale"):
        raise FormatError("missing tensor", layer=prefix, tensor="weight_scale")
    if w.wtype == "float" or "mxfp4" in fmt or "nvfp4" in fmt:
        if "nvfp4" in fmt:
            raise UnsupportedFormatError(f"{prefix}: compressed-tensors format {_short(fmt)} (NVFP4) is not defined")
        if num_bits != 4 or group not in (-1, 32) or (gs is not None and group != 32):
            raise UnsupportedFormatError(f"{prefix}: compressed-tensors float weights with num_bits={num_bits} "
                                         f"group_size={_short(gs)} are not MXFP4 (num_bits 4, group_size 32)")
        N, K = pshape[0], pshape[1] * 2
        tensors = {"weight_packed": prefix + ".weight_packed", "weight_scale": prefix + ".weight_scale"}
        return LayerInfo(
            name=prefix, format="ct-mxfp4", shape=(N, K), bits=4, group_size=32, sym=True, act_order=False,
            zero_convention=None, tensors=_bias(ckpt, prefix, tensors), activation=w.activation,
            scale_dtype="E8M0")
    if num_bits not in (4, 8):
        raise UnsupportedFormatError(f"{prefix}: pack-quantized num_bits={num_bits} is not defined (4, 8)")
    N = pshape[0]
    K = pshape[1] * (32 // num_bits)
    if ckpt.has(prefix + ".weight_shape"):
        wst = ckpt.tensor(prefix + ".weight_shape", layer=prefix)
        ws = wst.data.reshape(-1)
        if ws.size != 2 or wst.dtype not in ("I64", "I32"):
            raise FormatError(f"expected 2 integers (I64/I32), got {ws.size} of {wst.dtype}", layer=prefix,
                              tensor="weight_shape")
        N, K = int(ws[0]), int(ws[1])
        if N < 0 or K < 0:
            raise FormatError(f"negative dimension in [{N}, {K}]", layer=prefix, tensor="weight_shape")
    tensors = {"weight_packed": prefix + ".weight_packed", "weight_scale": prefix + ".weight_scale"}
    for opt in ("weight_zero_point", "weight_g_idx", "weight_shape"):
        if ckpt.has(f"{prefix}.{opt}"):
            tensors[opt] = f"{prefix}.{opt}"
    if w.actorder == "group" and "weight_g_idx" not in tensors:
        raise FormatError("missing tensor (actorder 'group' stores the group of every input channel)",
                          layer=prefix, tensor="weight_g_idx")
    return LayerInfo(
        name=prefix, format="ct-pack-quantized", shape=(N, K), bits=num_bits, group_size=group, sym=w.sym,
        act_order=w.actorder is not None or "weight_g_idx" in tensors,
        zero_convention="offset", tensors=_bias(ckpt, prefix, tensors), activation=w.activation,
        scale_dtype=_scale_dtype(ckpt, prefix + ".weight_scale", prefix))


def _ct_int8_layer(ckpt: Checkpoint, prefix: str, w: _CtWeightArgs) -> LayerInfo:
    """An int8 ``weight`` with its ``weight_scale`` (int-quantized)."""
    dt, wshape = ckpt.tensor_info(prefix + ".weight")
    if dt != "I8":
        # fp weights with a scale (e.g. FP8) are not an integer format qconform defines yet
        raise UnsupportedFormatError(
            f"{prefix}.weight: compressed-tensors weight of dtype {dt} with weight_scale "
            "is not a defined format")
    if not ckpt.has(prefix + ".weight_scale"):
        raise FormatError("missing tensor", layer=prefix, tensor="weight_scale")
    tensors = {"weight": prefix + ".weight", "weight_scale": prefix + ".weight_scale"}
    if ckpt.has(prefix + ".weight_zero_point"):
        tensors["weight_zero_point"] = prefix + ".weight_zero_point"
    return LayerInfo(
        name=prefix, format="ct-int-quantized", shape=tuple(wshape), bits=8, group_size=w.group,
        sym=w.sym, act_order=False, zero_convention=None,
        tensors=_bias(ckpt, prefix, tensors), activation=w.activation,
        scale_dtype=_scale_dtype(ckpt, prefix + ".weight_scale", prefix))


_ACTORDER = ("group", "weight", "static", "dynamic")
_CT_STRATEGIES = ("tensor", "channel", "group", "tensor_group", "block", "token")
#: compressed-tensors CompressionFormat values ("" = not given: the tensors decide)
_CT_FORMATS = ("", "pack-quantized", "int-quantized", "naive-quantized", "float-quantized", "mxfp4-pack-quantized",
               "nvfp4-pack-quantized", "marlin-24", "dense", "sparse-bitmask", "sparse-24-bitmask")


def _ct_actorder(value, where: str) -> "str | None":
    """compressed-tensors ``actorder``: null / false (none), true (= "group") or one of _ACTORDER."""
    if value is None or value is False:
        return None
    if value is True:
        return "group"
    if isinstance(value, str) and value.lower() in _ACTORDER:
        return value.lower()
    raise UnsupportedFormatError(f"{where}: quantization_config actorder={_short(value)} is not one of "
                                 f"null, true, false, {', '.join(_ACTORDER)}")


def _ct_activation(act, where: str) -> "dict | None":
    """``input_activations`` with every field type-checked (they choose the activation reference)."""
    if act is None:
        return None
    if not isinstance(act, dict):
        raise UnsupportedFormatError(f"{where}: quantization_config input_activations={_short(act)} is not an object")
    dyn = act.get("dynamic")
    if not (dyn is None or isinstance(dyn, bool) or dyn == "local"):
        raise UnsupportedFormatError(f"{where}: quantization_config input_activations dynamic={_short(dyn)} "
                                     "is not true, false or \"local\"")
    gs = act.get("group_size")
    return {"num_bits": _cfg_int(act, "num_bits", 8, where), "type": _str(act, "type", "int", where),
            "symmetric": _bool(act, "symmetric", True, where), "strategy": _str(act, "strategy", "tensor", where),
            "dynamic": dyn, "group_size": None if gs is None else _int(gs, "group_size", where)}


# -- gpt-oss MXFP4 -----------------------------------------------------------------------
def _detect_gptoss_mxfp4(ckpt: Checkpoint, cfg: dict, budget: Budget) -> list[LayerInfo]:
    layers = []
    for prefix in sorted(set(_prefixes_any(ckpt, "_blocks")) | set(_prefixes_any(ckpt, "_scales"))):
        bname, sname = prefix + "_blocks", prefix + "_scales"
        if not ckpt.has(bname):
            raise FormatError("missing tensor (the layer has its scales)", layer=prefix, tensor=bname.rsplit(".", 1)[-1])
        if not ckpt.has(sname):
            raise FormatError("missing tensor", layer=prefix, tensor=sname.rsplit(".", 1)[-1])
        dt, bshape = ckpt.tensor_info(bname)
        if len(bshape) < 3 or bshape[-1] != 16:
            raise FormatError(f"expected [..., N, K/32, 16], got {list(bshape)}", layer=prefix,
                              tensor=bname.rsplit(".", 1)[-1])
        shape = tuple(bshape[:-2]) + (bshape[-2] * 32,)
        layers.append(LayerInfo(
            name=prefix, format="gptoss-mxfp4", shape=shape, bits=4, group_size=32, sym=True, act_order=False,
            zero_convention=None, tensors={"blocks": bname, "scales": sname}, scale_dtype="E8M0"))
    return layers


def _prefixes_any(ckpt: Checkpoint, tail: str) -> list[str]:
    return sorted(n[: -len(tail)] for n in ckpt.tensor_names() if n.endswith(tail))
