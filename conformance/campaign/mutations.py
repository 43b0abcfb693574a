"""Seeded generator of malformed checkpoints for the loader campaign (conformance/campaign/execute.py).

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
import random
import shutil
from pathlib import Path
from typing import Callable

import numpy as np

from emulator.synthetic import SCHEMES, write_checkpoint
from emulator.tensorfile import load_tensors, save_tensors

from conformance.campaign import mutate_config as cfg
from conformance.campaign import mutate_tensors as st

__all__ = ["Seed", "Mutation", "Input", "MUTATIONS", "make_seeds", "generate"]

TOOLKIT_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "toolkit_checkpoints"
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


M = Mutation
#: every mutation kind; ``must_reject``: every command must exit 2 on it
MUTATIONS = [
    M("config-bool-as-string", "config", True, cfg.m_bool_string),
    M("config-bool-as-int", "config", True, cfg.m_bool_int),
    M("config-int-garbage-string", "config", False, cfg.m_int_garbage),
    M("config-int-wrong-type", "config", True, cfg.m_int_wrong_type),
    M("config-int-extreme", "config", False, cfg.m_int_extreme),
    M("config-str-wrong-type", "config", True, cfg.m_str_wrong_type),
    M("config-str-unknown", "config", False, cfg.m_str_unknown),
    M("config-delete-key", "config", False, cfg.m_delete_key),
    M("config-type-swap", "config", False, cfg.m_type_swap),
    M("config-no-quantization_config", "config", True, cfg.m_no_qconfig),
    M("config-regex-catastrophic", "config", False, cfg.m_regex_catastrophic),
    M("config-regex-refused", "config", False, cfg.m_regex_refused),
    M("config-regex-invalid", "config", False, cfg.m_regex_invalid),
    M("config-regex-huge", "config", False, cfg.m_regex_huge),
    M("config-targets-wrong-type", "config", True, cfg.m_targets_wrong_type),
    M("config-extra_config-wrong-type", "config", False, cfg.m_extra_config_wrong_type),
    M("config-activation-garbage", "config", False, cfg.m_activation_garbage),
    M("json-truncated", "file", True, cfg.m_json_truncated),
    M("json-garbage-bytes", "file", False, cfg.m_json_garbage),
    M("json-deep-nesting", "file", True, cfg.m_json_deep),
    M("json-not-an-object", "file", True, cfg.m_json_not_object),
    M("json-huge-sparse", "file", True, cfg.m_json_huge_sparse),
    M("json-big-valid", "file", False, cfg.m_json_big_valid),
    M("config-special-file", "file", True, cfg.m_config_special),
    M("shard-special-file", "file", True, st.m_shard_special),
    # (beside model.safetensors and with no index, transformers reads model.safetensors only: the extra file is
    # skipped and named, never opened: docs/checkpoints.md; tests/emulator/test_checkpoint.py)
    M("extra-special-safetensors", "file", False, st.m_extra_special_safetensors),
    M("header-dtype-swap", "header", False, st.m_header_dtype_swap),
    M("header-dtype-unknown", "header", True, st.m_header_dtype_unknown),
    M("header-shape-garbage", "header", True, st.m_header_shape_garbage),
    M("header-shape-reinterpret", "header", False, st.m_header_shape_reinterpret),
    M("header-data-offsets", "header", True, st.m_header_offsets),
    M("header-entry", "header", False, st.m_header_entry),
    M("header-bytes", "header", False, st.m_header_bytes),
    M("header-many-entries", "header", False, st.m_header_many_entries),
    M("file-truncated", "file", True, st.m_file_truncate),
    M("file-trailing-bytes", "file", True, st.m_file_append),
    M("tensor-drop", "tensor", False, st.m_tensor_drop),
    M("tensor-rename", "tensor", False, st.m_tensor_rename),
    M("tensor-dtype-convert", "tensor", False, st.m_tensor_dtype_convert),
    M("tensor-reshape", "tensor", False, st.m_tensor_reshape),
    M("tensor-slice", "tensor", False, st.m_tensor_slice),
    M("tensor-zero-size", "tensor", True, st.m_tensor_zero_size),
    M("tensor-stray", "tensor", False, st.m_tensor_stray),
    M("value-nonfinite-scale", "value", True, st.m_value_nonfinite_scale),
    M("value-odd-scale", "value", False, st.m_value_odd_scale),
    M("value-e8m0-0xff", "value", True, st.m_value_e8m0_ff),
    M("value-e8m0-extreme", "value", False, st.m_value_e8m0_extreme),
    M("value-random-codes", "value", False, st.m_value_random_codes),
    M("value-g_idx", "value", False, st.m_value_g_idx),
    M("value-weight_shape", "value", False, st.m_value_weight_shape),
    M("bias-malformed", "value", True, st.m_bias),
    M("index-malformed", "index", True, st.m_index),
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
