"""Seeded generator of malformed checkpoints for the loader campaign (conformance/campaign.py).

Semantics and counts: docs/checkpoints.md ("Malformed-checkpoint campaign"). Seeds are the
real toolkit checkpoints under tests/data/toolkit_checkpoints and the emulator's own writers
(every scheme of emulator/synthetic.py, with and without bias, one sharded). Each mutation kind
damages one part of a copy of a seed - the config, a safetensors header, a tensor's dtype /
shape / values, the files themselves - and says whether every command must reject the result
(``must_reject``) or whether it may still be a valid checkpoint (a mutated code word is a
different but valid weight).

Input ``i`` of seed ``s`` depends only on ``(s, i)``: the first n inputs of a run are the same
whatever the total count, so a bounded CI subset is a prefix of the full campaign.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import struct
from pathlib import Path
from typing import Callable

import numpy as np

from emulator.synthetic import SCHEMES, write_checkpoint
from emulator.tensorfile import Tensor, TensorFile, load_tensors, save_tensors

__all__ = ["Seed", "Mutation", "Input", "MUTATIONS", "make_seeds", "generate"]

TOOLKIT_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "toolkit_checkpoints"
_COPY = ("config.json", "quantization_config.json", "quantize_config.json", "model.safetensors.index.json")


@dataclasses.dataclass
class Seed:
    name: str
    folder: Path
    layer: str  # the layer dequant / linear are asked for
    n: int  # its output width
    k: int  # its input width (x is [2, K])


@dataclasses.dataclass
class Mutation:
    name: str
    part: str  # config | header | tensor | value | file | index
    must_reject: bool
    apply: Callable  # (rng, folder, seed) -> str detail, or None when the kind does not apply to the seed


@dataclasses.dataclass
class Input:
    index: int
    seed: str
    mutation: str
    part: str
    must_reject: bool
    detail: str
    folder: Path
    layer: str
    x_path: Path


# -- seeds -------------------------------------------------------------------------------------------
def make_seeds(work: Path) -> list[Seed]:
    """Copy / write every seed checkpoint under ``work/seeds``. Every seed must be valid (every layer
    dequantizes), or the campaign's counts would blame mutations for a bad seed."""
    from emulator.checkpoint import Checkpoint
    from emulator.layers import dequantize_layer

    root = work / "seeds"
    root.mkdir(parents=True, exist_ok=True)
    folders = []
    if TOOLKIT_DIR.is_dir():
        for src in sorted(p for p in TOOLKIT_DIR.iterdir() if (p / "config.json").is_file()):
            folders.append(_copy_checkpoint(src, root / f"toolkit-{src.name}"))
    for i, scheme in enumerate(SCHEMES):
        dst = root / f"synthetic-{scheme}"
        if not dst.exists():
            write_checkpoint(dst, scheme, n=32, k=128, bias=i % 2 == 0, n_layers=2 if i % 3 == 0 else 1)
        folders.append(dst)
    dst = root / "synthetic-sharded-gptq-w4g32-asym-v2"
    if not dst.exists():
        write_checkpoint(dst, "gptq-w4g32-asym-v2", n=32, k=128, bias=True, n_layers=2)
        _shard(dst)
    folders.append(dst)
    seeds = []
    for f in folders:
        ck = Checkpoint(f)
        for layer in ck.layers():
            dequantize_layer(ck, layer)
        info = ck.layers()[0]
        seeds.append(Seed(f.name, f, info.name, int(info.shape[-2]), int(info.shape[-1])))
    return seeds


def _copy_checkpoint(src: Path, dst: Path) -> Path:
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for p in src.iterdir():
        if p.name in _COPY or (p.suffix == ".safetensors" and p.name != "toolkit_dequant.safetensors"):
            shutil.copyfile(p, dst / p.name)
    return dst


def _shard(folder: Path) -> None:
    t = load_tensors(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    wm = {name: files[i % 2] for i, name in enumerate(sorted(t))}
    for f in files:
        save_tensors(folder / f, {k: v for k, v in t.items() if wm[k] == f})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))


# -- helpers -------------------------------------------------------------------------------------------
def _shards(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.safetensors"))


def _where(folder: Path) -> dict:
    """tensor name -> shard path"""
    out = {}
    for p in _shards(folder):
        for k in TensorFile(p).keys():
            out[k] = p
    return out


def _layer_tensors(folder: Path, seed: Seed) -> dict:
    return {k: p for k, p in _where(folder).items() if k.startswith(seed.layer)}


def _pick(rng, items):
    items = sorted(items)
    return rng.choice(items) if items else None


def _edit_tensor(folder: Path, name: str, fn) -> None:
    path = _where(folder)[name]
    t = load_tensors(path)
    new = fn(t[name])
    if new is None:
        t.pop(name)
    else:
        t[name] = new
    save_tensors(path, t)


def _config_path(folder: Path) -> Path:
    return folder / "config.json"


def _qc(folder: Path) -> tuple[dict, dict]:
    cfg = json.loads(_config_path(folder).read_text())
    return cfg, cfg["quantization_config"]


def _save_cfg(folder: Path, cfg: dict) -> None:
    _config_path(folder).write_text(json.dumps(cfg))


def _raw_header(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write_raw(path: Path, header: "dict | bytes", data: bytes) -> None:
    hj = header if isinstance(header, bytes) else json.dumps(header).encode()
    hj += b" " * (-len(hj) % 8)
    path.write_bytes(struct.pack("<Q", len(hj)) + hj + data)


def _cfg_nodes(qc, path=()):
    """(path, value) of every node of the quantization_config tree."""
    yield path, qc
    if isinstance(qc, dict):
        for k, v in qc.items():
            yield from _cfg_nodes(v, path + (k,))
    elif isinstance(qc, list):
        for i, v in enumerate(qc):
            yield from _cfg_nodes(v, path + (i,))


def _set_path(root, path, value):
    node = root
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value


# -- config mutations --------------------------------------------------------------------------------
_BOOL_KEYS = ("sym", "desc_act", "symmetric", "zero_point", "act_sym", "act_dynamic", "true_sequential",
              "static_groups", "enable_quanted_input")
_INT_KEYS = ("bits", "group_size", "num_bits", "w_bit", "q_group_size", "act_bits", "act_group_size")
_STR_KEYS = ("quant_method", "checkpoint_format", "packing_format", "version", "format", "type", "strategy",
             "data_type")


def _sections(qc):
    """Paths of the config sections toolkits write scheme keys in (top level, config_groups[*] and
    their weights / input_activations, extra_config[*])."""
    yield ()
    for g, body in (qc.get("config_groups") or {}).items() if isinstance(qc.get("config_groups"), dict) else ():
        if isinstance(body, dict):
            yield ("config_groups", g)
            for sub in ("weights", "input_activations"):
                if isinstance(body.get(sub), dict):
                    yield ("config_groups", g, sub)
    for k, body in (qc.get("extra_config") or {}).items() if isinstance(qc.get("extra_config"), dict) else ():
        if isinstance(body, dict):
            yield ("extra_config", k)


def _keyed(rng, folder, keys, value_fn):
    """Set a key of ``keys`` that a scheme section of the config has to value_fn(old)."""
    cfg, qc = _qc(folder)
    hits = []
    for sec in _sections(qc):
        node = qc
        for p in sec:
            node = node[p]
        hits += [(sec + (k,), v) for k, v in node.items() if k in keys and not isinstance(v, (dict, list))]
    if not hits:
        return None
    path, old = hits[rng.randrange(len(hits))]
    new = value_fn(rng, old)
    _set_path(qc, path, new)
    _save_cfg(folder, cfg)
    return f"{'.'.join(map(str, path))}: {old!r} -> {new!r}"


def _m_bool_string(rng, folder, seed):
    return _keyed(rng, folder, _BOOL_KEYS, lambda r, old: r.choice(["false", "true", "False", "0", "yes"]))


def _m_bool_int(rng, folder, seed):
    return _keyed(rng, folder, ("sym", "desc_act", "symmetric", "zero_point"), lambda r, old: r.choice([0, 1, 2]))


def _m_int_garbage(rng, folder, seed):
    return _keyed(rng, folder, _INT_KEYS, lambda r, old: r.choice(["²", "4x", "", " ", "0x10", "四", "1e3", "+-4"]))


def _m_int_wrong_type(rng, folder, seed):
    return _keyed(rng, folder, ("bits", "num_bits", "group_size"),
                  lambda r, old: r.choice([[4], {"v": 4}, 4.5, True, float("nan"), float("inf")]))


def _m_int_extreme(rng, folder, seed):
    return _keyed(rng, folder, _INT_KEYS, lambda r, old: r.choice([0, -1, -128, 3, 7, 10 ** 30, 2 ** 63, 1 << 40]))


def _m_str_wrong_type(rng, folder, seed):
    return _keyed(rng, folder, _STR_KEYS, lambda r, old: r.choice([7, ["gptq"], {"a": 1}, True, 0.5]))


def _m_str_unknown(rng, folder, seed):
    return _keyed(rng, folder, _STR_KEYS, lambda r, old: r.choice(["fancy", "", "GPTQ_V3", "x" * 10000, "é"]))


def _m_delete_key(rng, folder, seed):
    cfg, qc = _qc(folder)
    paths = [p for p, _ in _cfg_nodes(qc) if p and isinstance(p[-1], str)]
    path = paths[rng.randrange(len(paths))]
    node = qc
    for p in path[:-1]:
        node = node[p]
    del node[path[-1]]
    _save_cfg(folder, cfg)
    return "deleted " + ".".join(map(str, path))


def _m_type_swap(rng, folder, seed):
    cfg, qc = _qc(folder)
    nodes = [p for p, _ in _cfg_nodes(qc) if p]
    path = nodes[rng.randrange(len(nodes))]
    new = rng.choice([None, 0, -7, 3.25, "", "x", [], [1, "a"], {}, {"k": None}, True, False])
    _set_path(qc, path, new)
    _save_cfg(folder, cfg)
    return f"{'.'.join(map(str, path))} -> {new!r}"


def _m_no_qconfig(rng, folder, seed):
    cfg, _ = _qc(folder)
    cfg["quantization_config"] = rng.choice([None, [], "gptq", 4])
    for side in ("quantization_config.json", "quantize_config.json"):
        (folder / side).unlink(missing_ok=True)
    _save_cfg(folder, cfg)
    return f"quantization_config -> {cfg['quantization_config']!r}"


_CATASTROPHIC = [r"(.|.)*X", r"(a|a?)+$", r".*.*.*.*.*.*.*.*.*.*.*.*Z", r"(\w+\w+)*!", r"(.*.*)*q$", r"((.+)+)+Y"]
_REFUSED = [r"(a)\1", r"model(?=\.layers)", r"(?<!x)model.*", r"(?>m.*)", r"m.++", r"(m)?(?(1)o|x).*"]
_INVALID = [r"model.(layers", r"[", r"*", r"(?P<a>x)(?P<a>y)", r"a{2,1}", r"\p"]


def _regex_into(rng, folder, seed, patterns):
    cfg, qc = _qc(folder)
    pat = "re:" + rng.choice(patterns)
    if isinstance(qc.get("config_groups"), dict) and qc["config_groups"]:
        g = qc["config_groups"][sorted(qc["config_groups"])[0]]
        where = rng.choice(["targets", "ignore"])
        if where == "targets":
            g["targets"] = [pat] + (g.get("targets") if isinstance(g.get("targets"), list) else [])
        else:
            qc["ignore"] = [pat] + (qc.get("ignore") if isinstance(qc.get("ignore"), list) else [])
    else:
        where = "extra_config"
        qc.setdefault("quant_method", "gptq")
        qc["extra_config"] = {pat: {"bits": 8}, **(qc.get("extra_config") or {})}
    _save_cfg(folder, cfg)
    return f"{where} += {pat!r}"


def _m_regex_catastrophic(rng, folder, seed):
    return _regex_into(rng, folder, seed, _CATASTROPHIC)


def _m_regex_refused(rng, folder, seed):
    return _regex_into(rng, folder, seed, _REFUSED)


def _m_regex_invalid(rng, folder, seed):
    return _regex_into(rng, folder, seed, _INVALID)


def _m_regex_huge(rng, folder, seed):
    return _regex_into(rng, folder, seed, ["(" + "|".join(f"model\\.layers\\.{i}\\..*" for i in range(2000)) + ")",
                                           "a" * 100_000, "(?:(?:a{100}){100}){100}"])


def _m_targets_wrong_type(rng, folder, seed):
    cfg, qc = _qc(folder)
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        return None
    g = groups[sorted(groups)[0]]
    g["targets"] = rng.choice([7, [7], {"Linear": True}, [["Linear"]], [None]])
    _save_cfg(folder, cfg)
    return f"targets -> {g['targets']!r}"


def _m_extra_config_wrong_type(rng, folder, seed):
    cfg, qc = _qc(folder)
    qc["extra_config"] = rng.choice([7, "x", [1], {seed.layer: 4}, {seed.layer: {"bits": "8"}},
                                     {seed.layer: {"sym": "false"}}])
    _save_cfg(folder, cfg)
    return f"extra_config -> {qc['extra_config']!r}"


def _m_activation_garbage(rng, folder, seed):
    cfg, qc = _qc(folder)
    groups = qc.get("config_groups")
    if isinstance(groups, dict) and groups:
        g = groups[sorted(groups)[0]]
        g["input_activations"] = rng.choice([{"num_bits": "8"}, {"num_bits": 4, "type": "float", "dynamic": "yes"},
                                             {"type": 5}, [8], {"num_bits": 3, "type": "int"}])
        detail = f"input_activations -> {g['input_activations']!r}"
    else:
        qc["act_bits"] = rng.choice(["4", 4.5, [4], 3])
        qc["act_data_type"] = rng.choice(["mx_fp", 7, "int"])
        detail = f"act_bits -> {qc['act_bits']!r}, act_data_type -> {qc['act_data_type']!r}"
    _save_cfg(folder, cfg)
    return detail


# config.json as bytes / files
def _m_json_truncated(rng, folder, seed):
    p = _config_path(folder)
    raw = p.read_bytes()
    cut = rng.randrange(1, len(raw) - 1)
    p.write_bytes(raw[:cut])
    return f"config.json cut at byte {cut} of {len(raw)}"


def _m_json_garbage(rng, folder, seed):
    p = _config_path(folder)
    raw = bytearray(p.read_bytes())
    kind = rng.choice(["invalid-utf8", "nul", "bom", "trailing"])
    if kind == "invalid-utf8":
        raw[rng.randrange(len(raw))] = 0xFF
    elif kind == "nul":
        raw[rng.randrange(len(raw))] = 0
    elif kind == "bom":
        raw = bytearray(b"\xef\xbb\xbf") + raw
    else:
        raw += b" }"
    p.write_bytes(bytes(raw))
    return f"config.json {kind}"


def _m_json_deep(rng, folder, seed):
    depth = rng.choice([10_000, 100_000, 1_000_000])
    _config_path(folder).write_text("[" * depth + "]" * depth)
    return f"config.json nested {depth} deep"


def _m_json_not_object(rng, folder, seed):
    text = rng.choice(["[1, 2]", "null", "7", '"config"', "", '{"quantization_config": 5}'])
    for side in ("quantization_config.json", "quantize_config.json"):  # side files could still configure it
        (folder / side).unlink(missing_ok=True)
    _config_path(folder).write_text(text)
    return f"config.json = {text!r}"


def _m_json_huge_sparse(rng, folder, seed):
    p = _config_path(folder)
    size = rng.choice([9 * 2 ** 20, 3 * 2 ** 29, 2 ** 40])
    with open(p, "r+b") as f:
        f.truncate(size)  # sparse: no disk, no time
    return f"config.json grown to {size} bytes (sparse)"


def _m_json_big_valid(rng, folder, seed):
    cfg, qc = _qc(folder)
    # just under the 8 MiB limit: long strings, or 2.6 million empty lists (the most Python objects a byte)
    qc["padding"] = rng.choice([["x" * 1000] * 2000, ["x" * 1000] * 8000, [[]] * 2_600_000])
    _config_path(folder).write_text(json.dumps(cfg, separators=(",", ":")))
    return f"config.json padded to {_config_path(folder).stat().st_size} bytes"


def _special_file(folder: Path, name: str, kind: str) -> str:
    p = folder / name
    if p.exists() or p.is_symlink():
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "dev-zero":
        p.symlink_to("/dev/zero")
    elif kind == "dev-null":
        p.symlink_to("/dev/null")
    elif kind == "dir":
        p.mkdir()
    elif kind == "dangling":
        p.symlink_to(folder / "no-such-file")
    elif kind == "missing":
        pass
    return f"{name} -> {kind}"


_SPECIAL = ["fifo", "dev-zero", "dev-null", "dir", "dangling", "missing"]


def _m_config_special(rng, folder, seed):
    return _special_file(folder, "config.json", rng.choice(_SPECIAL))


def _m_shard_special(rng, folder, seed):
    shard = rng.choice([p.name for p in _shards(folder)])
    return _special_file(folder, shard, rng.choice(_SPECIAL[:-1]))


def _m_extra_special_safetensors(rng, folder, seed):
    if (folder / "model.safetensors.index.json").exists():
        return None
    return _special_file(folder, "zz-extra.safetensors", rng.choice(_SPECIAL[:-2]))


# -- safetensors header mutations ----------------------------------------------------------------------
def _header_edit(rng, folder, seed, fn):
    layer = _layer_tensors(folder, seed)
    name = _pick(rng, layer)
    path = layer[name]
    header, data = _raw_header(path)
    detail = fn(rng, header, name)
    _write_raw(path, header, data)
    return f"{name}: {detail}"


_SAME_WIDTH = {"I32": ["F32", "U32", "I16", "F16", "U8"], "U8": ["I8", "F8_E4M3", "F8_E8M0", "F8_E5M2", "BOOL"],
               "F16": ["BF16", "I16", "U16"], "BF16": ["F16", "I16"], "I8": ["U8", "F8_E4M3"], "F32": ["I32", "U32"],
               "I64": ["F64", "U64", "I32"]}


def _m_header_dtype_swap(rng, folder, seed):
    def fn(r, h, name):
        old = h[name]["dtype"]
        new = r.choice(_SAME_WIDTH.get(old, ["U8"]))
        h[name]["dtype"] = new
        return f"dtype {old} -> {new} (bytes unchanged)"
    return _header_edit(rng, folder, seed, fn)


def _m_header_dtype_unknown(rng, folder, seed):
    def fn(r, h, name):
        h[name]["dtype"] = r.choice(["F128", "int4", "", 7, None, "f16"])
        return f"dtype -> {h[name]['dtype']!r}"
    return _header_edit(rng, folder, seed, fn)


def _m_header_shape_garbage(rng, folder, seed):
    def fn(r, h, name):
        h[name]["shape"] = r.choice([[-1, 4], [1.5], "4x4", [None], [True, 2], [2 ** 70], [1] * 65, [1] * 33])
        return f"shape -> {h[name]['shape']!r}"
    return _header_edit(rng, folder, seed, fn)


def _m_header_shape_reinterpret(rng, folder, seed):
    def fn(r, h, name):
        shape = h[name]["shape"]
        n = int(np.prod(shape)) if shape else 1
        new = r.choice([[n], shape[::-1], [1] + shape, shape + [1], [n, 1], [1, n] if n else [0]])
        h[name]["shape"] = new
        return f"shape {shape} -> {new} (bytes unchanged)"
    return _header_edit(rng, folder, seed, fn)


def _m_header_offsets(rng, folder, seed):
    def fn(r, h, name):
        b, e = h[name]["data_offsets"]
        new = r.choice([[b, e + 8], [b - 4, e], [e, b], [b, 2 ** 64], [-1, e], [b + 0.5, e], [b]])
        h[name]["data_offsets"] = new
        return f"data_offsets {[b, e]} -> {new}"
    return _header_edit(rng, folder, seed, fn)


def _m_header_entry(rng, folder, seed):
    def fn(r, h, name):
        kind = r.choice(["drop-key", "not-object", "metadata", "extra-key"])
        if kind == "drop-key":
            h[name].pop(r.choice(["dtype", "shape", "data_offsets"]))
        elif kind == "not-object":
            h[name] = r.choice([[1], "x", None])
        elif kind == "metadata":
            h["__metadata__"] = r.choice([{"a": 1}, [1], "x", {"a": None}])
        else:
            h[name]["extra"] = {"nested": [1, 2]}
        return kind
    return _header_edit(rng, folder, seed, fn)


def _m_header_bytes(rng, folder, seed):
    path = rng.choice(_shards(folder))
    raw = bytearray(path.read_bytes())
    kind = rng.choice(["len-huge", "len-zero", "len-short", "len-over-file", "not-json", "dup-key", "flip"])
    (n,) = struct.unpack("<Q", raw[:8])
    if kind == "len-huge":
        raw[:8] = struct.pack("<Q", 2 ** 63 + 5)
    elif kind == "len-zero":
        raw[:8] = struct.pack("<Q", 0)
    elif kind == "len-short":
        raw[:8] = struct.pack("<Q", max(1, n // 2))
    elif kind == "len-over-file":
        raw[:8] = struct.pack("<Q", len(raw))
    elif kind == "not-json":
        raw[8:8 + n] = b"[" + b" " * (n - 1)
    elif kind == "dup-key":
        text = raw[8:8 + n].decode().rstrip()
        first = next(iter(json.loads(text)))
        dup = text[:-1] + "," + json.dumps(first) + ":" + json.dumps(json.loads(text)[first]) + "}"
        hj = dup.encode() + b" " * (-len(dup) % 8)
        raw = bytearray(struct.pack("<Q", len(hj)) + hj + raw[8 + n:])
    else:
        i = rng.randrange(8, 8 + n)
        raw[i] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(raw))
    return f"{path.name}: {kind}"


def _m_header_many_entries(rng, folder, seed):
    """A valid header with very many (zero-size, stray) tensors: header parsing time and memory."""
    path = rng.choice(_shards(folder))
    header, data = _raw_header(path)
    n = rng.choice([10_000, 100_000])
    for i in range(n):
        header[f"model.pad.{i}"] = {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}
    _write_raw(path, header, data)
    return f"{path.name}: + {n} zero-size tensors ({path.stat().st_size} bytes)"


def _m_file_truncate(rng, folder, seed):
    path = rng.choice(_shards(folder))
    raw = path.read_bytes()
    cut = rng.choice([0, 4, 8, 12, len(raw) // 2, len(raw) - 1])
    path.write_bytes(raw[:cut])
    return f"{path.name} cut to {cut} of {len(raw)} bytes"


def _m_file_append(rng, folder, seed):
    path = rng.choice(_shards(folder))
    extra = rng.choice([b"\0", b"\0" * 8, b"PK\x03\x04", os.urandom(64)])
    with open(path, "ab") as f:
        f.write(extra)
    return f"{path.name} + {len(extra)} trailing byte(s)"


# -- tensor mutations (through the writer: the file stays well formed) --------------------------------------
def _tensor_mut(rng, folder, seed, fn, roles=None):
    layer = _layer_tensors(folder, seed)
    names = [n for n in layer if roles is None or any(n.endswith(r) for r in roles)]
    name = _pick(rng, names)
    if name is None:
        return None
    detail = []
    _edit_tensor(folder, name, lambda t: fn(rng, t, detail))
    return f"{name}: {detail[0] if detail else ''}"


def _m_tensor_drop(rng, folder, seed):
    return _tensor_mut(rng, folder, seed, lambda r, t, d: d.append("dropped"))


def _m_tensor_rename(rng, folder, seed):
    layer = _layer_tensors(folder, seed)
    name = _pick(rng, layer)
    new = rng.choice([name + "_x", name.replace(".", "..", 1), name.upper(), name.replace(seed.layer, seed.layer + "0")])
    path = layer[name]
    t = load_tensors(path)
    t[new] = t.pop(name)
    save_tensors(path, t)
    idx = folder / "model.safetensors.index.json"
    if idx.exists():
        doc = json.loads(idx.read_text())
        doc["weight_map"][new] = doc["weight_map"].pop(name)
        idx.write_text(json.dumps(doc))
    return f"{name} -> {new}"


def _m_tensor_dtype_convert(rng, folder, seed):
    def fn(r, t, d):
        a = t.data
        target = r.choice([np.float32, np.float16, np.int64, np.int32, np.uint8, np.int8, np.float64])
        d.append(f"{t.dtype} -> {np.dtype(target).name} (values converted)")
        with np.errstate(all="ignore"):
            return a.astype(target)
    return _tensor_mut(rng, folder, seed, fn)


def _m_tensor_reshape(rng, folder, seed):
    def fn(r, t, d):
        a = t.data
        new = r.choice([a.reshape(-1), a.T.copy() if a.ndim == 2 else a[None], a[None], a[..., None]])
        d.append(f"shape {list(a.shape)} -> {list(new.shape)}")
        return Tensor(new, t.dtype)
    return _tensor_mut(rng, folder, seed, fn)


def _m_tensor_slice(rng, folder, seed):
    def fn(r, t, d):
        a = t.data
        if a.ndim == 0 or a.shape[0] < 2:
            d.append("unchanged (too small)")
            return t
        axis = r.randrange(a.ndim)
        cut = np.take(a, range(a.shape[axis] - 1), axis=axis) if a.shape[axis] > 1 else a
        d.append(f"axis {axis}: {a.shape[axis]} -> {cut.shape[axis]}")
        return Tensor(np.ascontiguousarray(cut), t.dtype)
    return _tensor_mut(rng, folder, seed, fn)


def _m_tensor_zero_size(rng, folder, seed):
    def fn(r, t, d):
        a = t.data
        axis = r.randrange(max(a.ndim, 1)) if a.ndim else 0
        z = np.take(a.reshape(a.shape or (1,)), [], axis=axis)
        d.append(f"shape {list(a.shape)} -> {list(z.shape)}")
        return Tensor(z, t.dtype)
    return _tensor_mut(rng, folder, seed, fn)


def _m_tensor_stray(rng, folder, seed):
    path = rng.choice(_shards(folder))
    t = load_tensors(path)
    suffix = rng.choice(["qweight", "qzeros", "weight_packed", "weight_scale", "_blocks", "scales"])
    name = "model.layers.99.mlp.stray" + ("" if suffix.startswith("_") else ".") + suffix
    t[name] = rng.choice([np.zeros((4, 4), np.int32), np.ones(3, np.float16), np.zeros((2, 2, 16), np.uint8)])
    save_tensors(path, t)
    idx = folder / "model.safetensors.index.json"
    if idx.exists():
        doc = json.loads(idx.read_text())
        doc["weight_map"][name] = path.name
        idx.write_text(json.dumps(doc))
    return f"+ {name} {list(t[name].shape)}"


# -- value mutations ------------------------------------------------------------------------------------
_FLOAT_SCALE_ROLES = (".scales", ".weight_scale")


def _float_scale(rng, folder, seed, values, must):
    def fn(r, t, d):
        if t.dtype not in ("F16", "BF16", "F32"):
            d.append(f"not a float scale ({t.dtype})")
            return t
        a = np.array(t.data, copy=True)
        i = r.randrange(a.size)
        v = r.choice(values)
        a.reshape(-1)[i] = v
        d.append(f"element {i} -> {v}")
        return Tensor(a, t.dtype) if t.dtype == "BF16" else a
    return _tensor_mut(rng, folder, seed, fn, roles=_FLOAT_SCALE_ROLES)


def _m_value_nonfinite_scale(rng, folder, seed):
    layer = _layer_tensors(folder, seed)
    if not any(n.endswith(_FLOAT_SCALE_ROLES) and TensorFile(p).info(n)[0] in ("F16", "BF16", "F32")
               for n, p in layer.items()):
        return None
    return _float_scale(rng, folder, seed, [np.nan, np.inf, -np.inf], True)


def _m_value_odd_scale(rng, folder, seed):
    layer = _layer_tensors(folder, seed)
    if not any(n.endswith(_FLOAT_SCALE_ROLES) and TensorFile(p).info(n)[0] in ("F16", "BF16", "F32")
               for n, p in layer.items()):
        return None
    return _float_scale(rng, folder, seed, [0.0, -0.0, -1.0, 6e-8, 65504.0, 2.0 ** -24], False)


def _m_value_e8m0_ff(rng, folder, seed):
    layer = _layer_tensors(folder, seed)
    names = [n for n in layer if (n.endswith(".weight_scale") or n.endswith("_scales")) and
             TensorFile(layer[n]).info(n)[0] == "U8"]
    name = _pick(rng, names)
    if name is None:
        return None

    def fn(t):
        a = t.data.copy()
        a.reshape(-1)[rng.randrange(a.size)] = 0xFF
        return a
    _edit_tensor(folder, name, fn)
    return f"{name}: one E8M0 byte -> 0xFF"


def _m_value_e8m0_extreme(rng, folder, seed):
    layer = _layer_tensors(folder, seed)
    names = [n for n in layer if (n.endswith(".weight_scale") or n.endswith("_scales")) and
             TensorFile(layer[n]).info(n)[0] == "U8"]
    name = _pick(rng, names)
    if name is None:
        return None
    v = rng.choice([0, 1, 254, 200])

    def fn(t):
        a = t.data.copy()
        a.reshape(-1)[:] = v
        return a
    _edit_tensor(folder, name, fn)
    return f"{name}: every E8M0 byte -> {v}"


def _m_value_random_codes(rng, folder, seed):
    def fn(r, t, d):
        a = np.array(t.data, copy=True)
        g = np.random.default_rng(r.randrange(2 ** 32))
        flat = a.reshape(-1).view(np.uint8)
        idx = g.integers(0, flat.size, max(1, flat.size // 50))
        flat[idx] = g.integers(0, 256, idx.size, dtype=np.uint8)
        d.append(f"{idx.size} random bytes")
        return Tensor(a, t.dtype)
    return _tensor_mut(rng, folder, seed, fn, roles=(".qweight", ".qzeros", ".weight_packed", "_blocks", ".weight",
                                                      ".weight_zero_point"))


def _m_value_g_idx(rng, folder, seed):
    def fn(r, t, d):
        a = np.array(t.data, copy=True)
        kind = r.choice(["out-of-range", "negative", "permuted", "all-zero"])
        if kind == "out-of-range":
            a[r.randrange(a.size)] = 10 ** 6
        elif kind == "negative":
            a[r.randrange(a.size)] = -1
        elif kind == "permuted":
            np.random.default_rng(r.randrange(2 ** 32)).shuffle(a)
        else:
            a[:] = 0
        d.append(kind)
        return a
    return _tensor_mut(rng, folder, seed, fn, roles=(".g_idx", ".weight_g_idx"))


def _m_value_weight_shape(rng, folder, seed):
    def fn(r, t, d):
        a = np.array(t.data, copy=True)
        v = r.choice([[0, a[1]], [a[0], 0], [-1, a[1]], [a[0], a[1] * 2], [a[0] + 1, a[1]], [2 ** 40, a[1]]])
        d.append(f"{a.tolist()} -> {v}")
        return np.asarray(v, dtype=a.dtype)
    return _tensor_mut(rng, folder, seed, fn, roles=(".weight_shape",))


def _m_bias(rng, folder, seed):
    name = seed.layer + ".bias"
    where = _where(folder)
    if seed.layer + "_blocks" in where:  # stacked experts have no per-layer bias role
        return None
    n_out = seed.n
    kind = rng.choice(["nan", "inf", "int", "wrong-length", "2-d", "u8"])
    if kind in ("nan", "inf"):
        b = np.zeros(n_out, np.float16)
        b[rng.randrange(n_out)] = np.nan if kind == "nan" else np.inf
    elif kind == "int":
        b = np.arange(n_out, dtype=np.int32)
    elif kind == "wrong-length":
        b = np.zeros(n_out + 1, np.float16)
    elif kind == "2-d":
        b = np.zeros((1, n_out), np.float16)
    else:
        b = np.zeros(n_out, np.uint8)
    path = where.get(name) or _shards(folder)[0]
    t = load_tensors(path)
    t[name] = b
    save_tensors(path, t)
    idx = folder / "model.safetensors.index.json"
    if idx.exists() and name not in where:
        doc = json.loads(idx.read_text())
        doc["weight_map"][name] = path.name
        idx.write_text(json.dumps(doc))
    return f"{name} -> {kind} {list(b.shape)}"


# -- index mutations ----------------------------------------------------------------------------------------
def _m_index(rng, folder, seed):
    idx = folder / "model.safetensors.index.json"
    if not idx.exists():
        return None
    doc = json.loads(idx.read_text())
    wm = doc["weight_map"]
    name = _pick(rng, [n for n in wm if n.startswith(seed.layer)])
    kind = rng.choice(["missing-shard", "outside", "absolute", "not-a-string", "not-in-shard", "no-weight_map",
                       "weight_map-list", "extra-tensor", "fifo-index", "empty-name"])
    if kind == "missing-shard":
        wm[name] = "model-00009-of-00009.safetensors"
    elif kind == "outside":
        wm[name] = "../" + wm[name]
    elif kind == "absolute":
        wm[name] = "/dev/zero"
    elif kind == "not-a-string":
        wm[name] = rng.choice([7, None, ["a"]])
    elif kind == "not-in-shard":
        others = sorted(set(wm.values()) - {wm[name]})
        wm[name] = others[0]
    elif kind == "no-weight_map":
        doc.pop("weight_map")
    elif kind == "weight_map-list":
        doc["weight_map"] = list(wm)
    elif kind == "extra-tensor":
        wm["model.layers.0.ghost.qweight"] = next(iter(wm.values()))
    elif kind == "empty-name":
        wm[name] = ""
    if kind == "fifo-index":
        idx.unlink()
        os.mkfifo(idx)
    else:
        idx.write_text(json.dumps(doc))
    return f"index: {kind} ({name})"


M = Mutation
#: every mutation kind; ``must_reject``: every command must exit 2 on it
MUTATIONS = [
    M("config-bool-as-string", "config", True, _m_bool_string),
    M("config-bool-as-int", "config", True, _m_bool_int),
    M("config-int-garbage-string", "config", False, _m_int_garbage),
    M("config-int-wrong-type", "config", True, _m_int_wrong_type),
    M("config-int-extreme", "config", False, _m_int_extreme),
    M("config-str-wrong-type", "config", True, _m_str_wrong_type),
    M("config-str-unknown", "config", False, _m_str_unknown),
    M("config-delete-key", "config", False, _m_delete_key),
    M("config-type-swap", "config", False, _m_type_swap),
    M("config-no-quantization_config", "config", True, _m_no_qconfig),
    M("config-regex-catastrophic", "config", False, _m_regex_catastrophic),
    M("config-regex-refused", "config", False, _m_regex_refused),
    M("config-regex-invalid", "config", False, _m_regex_invalid),
    M("config-regex-huge", "config", False, _m_regex_huge),
    M("config-targets-wrong-type", "config", True, _m_targets_wrong_type),
    M("config-extra_config-wrong-type", "config", False, _m_extra_config_wrong_type),
    M("config-activation-garbage", "config", False, _m_activation_garbage),
    M("json-truncated", "file", True, _m_json_truncated),
    M("json-garbage-bytes", "file", False, _m_json_garbage),
    M("json-deep-nesting", "file", True, _m_json_deep),
    M("json-not-an-object", "file", True, _m_json_not_object),
    M("json-huge-sparse", "file", True, _m_json_huge_sparse),
    M("json-big-valid", "file", False, _m_json_big_valid),
    M("config-special-file", "file", True, _m_config_special),
    M("shard-special-file", "file", True, _m_shard_special),
    M("extra-special-safetensors", "file", True, _m_extra_special_safetensors),
    M("header-dtype-swap", "header", False, _m_header_dtype_swap),
    M("header-dtype-unknown", "header", True, _m_header_dtype_unknown),
    M("header-shape-garbage", "header", True, _m_header_shape_garbage),
    M("header-shape-reinterpret", "header", False, _m_header_shape_reinterpret),
    M("header-data-offsets", "header", True, _m_header_offsets),
    M("header-entry", "header", False, _m_header_entry),
    M("header-bytes", "header", False, _m_header_bytes),
    M("header-many-entries", "header", False, _m_header_many_entries),
    M("file-truncated", "file", True, _m_file_truncate),
    M("file-trailing-bytes", "file", True, _m_file_append),
    M("tensor-drop", "tensor", False, _m_tensor_drop),
    M("tensor-rename", "tensor", False, _m_tensor_rename),
    M("tensor-dtype-convert", "tensor", False, _m_tensor_dtype_convert),
    M("tensor-reshape", "tensor", False, _m_tensor_reshape),
    M("tensor-slice", "tensor", False, _m_tensor_slice),
    M("tensor-zero-size", "tensor", True, _m_tensor_zero_size),
    M("tensor-stray", "tensor", False, _m_tensor_stray),
    M("value-nonfinite-scale", "value", True, _m_value_nonfinite_scale),
    M("value-odd-scale", "value", False, _m_value_odd_scale),
    M("value-e8m0-0xff", "value", True, _m_value_e8m0_ff),
    M("value-e8m0-extreme", "value", False, _m_value_e8m0_extreme),
    M("value-random-codes", "value", False, _m_value_random_codes),
    M("value-g_idx", "value", False, _m_value_g_idx),
    M("value-weight_shape", "value", False, _m_value_weight_shape),
    M("bias-malformed", "value", True, _m_bias),
    M("index-malformed", "index", True, _m_index),
]


def generate(seed: int, count: int, work: Path, seeds: list[Seed]) -> list[Input]:
    """``count`` malformed checkpoints under ``work/inputs``: input i uses mutation kind
    i mod len(MUTATIONS) on a seed checkpoint drawn from Random((seed, i))."""
    out = []
    root = work / "inputs"
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        mut = MUTATIONS[i % len(MUTATIONS)]
        rng = random.Random(f"{seed}:{i}")
        order = list(seeds)
        rng.shuffle(order)
        for s in order:
            folder = root / f"{i:05d}-{mut.name}"
            if folder.exists():
                shutil.rmtree(folder)
            shutil.copytree(s.folder, folder, symlinks=True)
            detail = mut.apply(rng, folder, s)
            if detail is not None:
                break
            shutil.rmtree(folder)
        else:
            continue
        x_path = folder.parent / f"{i:05d}-x.safetensors"
        xs = np.random.default_rng(i).standard_normal((2, s.k)).astype(np.float32)
        save_tensors(x_path, {"x": xs})
        out.append(Input(i, s.name, mut.name, mut.part, mut.must_reject, detail, folder, s.layer, x_path))
    return out
