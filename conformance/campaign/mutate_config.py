"""Mutations of a checkpoint's config and JSON files, for the loader campaign.

Part of the generator in conformance/campaign/mutations.py (which lists every kind and says which must be
rejected); semantics: docs/checkpoints.md ("Malformed-checkpoint campaign"). Each function takes
(rng, folder, seed), damages the copy in ``folder`` and returns a one-line description, or None
when the kind does not apply to the seed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path


def _config_path(folder: Path) -> Path:
    return folder / "config.json"


def _qc(folder: Path) -> tuple[dict, dict]:
    cfg = json.loads(_config_path(folder).read_text())
    return cfg, cfg["quantization_config"]


def _save_cfg(folder: Path, cfg: dict) -> None:
    _config_path(folder).write_text(json.dumps(cfg))


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


def m_bool_string(rng, folder, seed):
    return _keyed(rng, folder, _BOOL_KEYS, lambda r, old: r.choice(["false", "true", "False", "0", "yes"]))


def m_bool_int(rng, folder, seed):
    return _keyed(rng, folder, ("sym", "desc_act", "symmetric", "zero_point"), lambda r, old: r.choice([0, 1, 2]))


def m_int_garbage(rng, folder, seed):
    return _keyed(rng, folder, _INT_KEYS, lambda r, old: r.choice(["²", "4x", "", " ", "0x10", "四", "1e3", "+-4"]))


def m_int_wrong_type(rng, folder, seed):
    return _keyed(rng, folder, ("bits", "num_bits", "group_size"),
                  lambda r, old: r.choice([[4], {"v": 4}, 4.5, True, float("nan"), float("inf")]))


def m_int_extreme(rng, folder, seed):
    return _keyed(rng, folder, _INT_KEYS, lambda r, old: r.choice([0, -1, -128, 3, 7, 10 ** 30, 2 ** 63, 1 << 40]))


def m_str_wrong_type(rng, folder, seed):
    return _keyed(rng, folder, _STR_KEYS, lambda r, old: r.choice([7, ["gptq"], {"a": 1}, True, 0.5]))


def m_str_unknown(rng, folder, seed):
    return _keyed(rng, folder, _STR_KEYS, lambda r, old: r.choice(["fancy", "", "GPTQ_V3", "x" * 10000, "é"]))


def m_delete_key(rng, folder, seed):
    cfg, qc = _qc(folder)
    paths = [p for p, _ in _cfg_nodes(qc) if p and isinstance(p[-1], str)]
    path = paths[rng.randrange(len(paths))]
    node = qc
    for p in path[:-1]:
        node = node[p]
    del node[path[-1]]
    _save_cfg(folder, cfg)
    return "deleted " + ".".join(map(str, path))


def m_type_swap(rng, folder, seed):
    cfg, qc = _qc(folder)
    nodes = [p for p, _ in _cfg_nodes(qc) if p]
    path = nodes[rng.randrange(len(nodes))]
    new = rng.choice([None, 0, -7, 3.25, "", "x", [], [1, "a"], {}, {"k": None}, True, False])
    _set_path(qc, path, new)
    _save_cfg(folder, cfg)
    return f"{'.'.join(map(str, path))} -> {new!r}"


def m_no_qconfig(rng, folder, seed):
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


def m_regex_catastrophic(rng, folder, seed):
    return _regex_into(rng, folder, seed, _CATASTROPHIC)


def m_regex_refused(rng, folder, seed):
    return _regex_into(rng, folder, seed, _REFUSED)


def m_regex_invalid(rng, folder, seed):
    return _regex_into(rng, folder, seed, _INVALID)


def m_regex_huge(rng, folder, seed):
    return _regex_into(rng, folder, seed, ["(" + "|".join(f"model\\.layers\\.{i}\\..*" for i in range(2000)) + ")",
                                           "a" * 100_000, "(?:(?:a{100}){100}){100}"])


def m_targets_wrong_type(rng, folder, seed):
    cfg, qc = _qc(folder)
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        return None
    g = groups[sorted(groups)[0]]
    g["targets"] = rng.choice([7, [7], {"Linear": True}, [["Linear"]], [None]])
    _save_cfg(folder, cfg)
    return f"targets -> {g['targets']!r}"


def m_extra_config_wrong_type(rng, folder, seed):
    cfg, qc = _qc(folder)
    qc["extra_config"] = rng.choice([7, "x", [1], {seed.layer: 4}, {seed.layer: {"bits": "8"}},
                                     {seed.layer: {"sym": "false"}}])
    _save_cfg(folder, cfg)
    return f"extra_config -> {qc['extra_config']!r}"


def m_activation_garbage(rng, folder, seed):
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
def m_json_truncated(rng, folder, seed):
    p = _config_path(folder)
    raw = p.read_bytes()
    cut = rng.randrange(1, len(raw) - 1)
    p.write_bytes(raw[:cut])
    return f"config.json cut at byte {cut} of {len(raw)}"


def m_json_garbage(rng, folder, seed):
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


def m_json_deep(rng, folder, seed):
    depth = rng.choice([10_000, 100_000, 1_000_000])
    _config_path(folder).write_text("[" * depth + "]" * depth)
    return f"config.json nested {depth} deep"


def m_json_not_object(rng, folder, seed):
    text = rng.choice(["[1, 2]", "null", "7", '"config"', "", '{"quantization_config": 5}'])
    for side in ("quantization_config.json", "quantize_config.json"):  # side files could still configure it
        (folder / side).unlink(missing_ok=True)
    _config_path(folder).write_text(text)
    return f"config.json = {text!r}"


def m_json_huge_sparse(rng, folder, seed):
    p = _config_path(folder)
    size = rng.choice([9 * 2 ** 20, 3 * 2 ** 29, 2 ** 40])
    with open(p, "r+b") as f:
        f.truncate(size)  # sparse: no disk, no time
    return f"config.json grown to {size} bytes (sparse)"


def m_json_big_valid(rng, folder, seed):
    cfg, qc = _qc(folder)
    # just under the 8 MiB limit: long strings, or 2.6 million empty lists (the most Python objects a byte)
    qc["padding"] = rng.choice([["x" * 1000] * 2000, ["x" * 1000] * 8000, [[]] * 2_600_000])
    _config_path(folder).write_text(json.dumps(cfg, separators=(",", ":")))
    return f"config.json padded to {_config_path(folder).stat().st_size} bytes"


def special_file(folder: Path, name: str, kind: str) -> str:
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


SPECIAL_FILES = ["fifo", "dev-zero", "dev-null", "dir", "dangling", "missing"]


def m_config_special(rng, folder, seed):
    return special_file(folder, "config.json", rng.choice(SPECIAL_FILES))
