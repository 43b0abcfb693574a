"""Hugging Face style checkpoint folders: detect each quantized layer's format.

Semantics: docs/checkpoints.md.

A checkpoint folder holds ``config.json`` (with ``quantization_config``) and
one or more ``*.safetensors`` files (sharded ones are listed by
``model.safetensors.index.json``). Detection reads the config's
``quant_method`` and then looks at the tensors each layer actually has:

================  ==========================================  ======================
quant_method      discriminating keys                         layer format
================  ==========================================  ======================
gptq              checkpoint_format gptq / gptq_v2            gptq (v1 / v2 zeros)
auto-round        packing_format auto_round:auto_gptq|awq     gptq / awq layout
awq               version gemm                                awq
compressed-tens.  config_groups[*].weights, format             ct-pack-quantized,
                                                              ct-int-quantized, ct-mxfp4
mxfp4             *_blocks / *_scales tensors                 gptoss-mxfp4
================  ==========================================  ======================
"""

from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path

import numpy as np

from .errors import FormatError, QconformError, UnsupportedFormatError, require
from .layer_info import LayerInfo
from .tensorfile import MAX_HEADER_BYTES, Tensor, TensorFile, header_length, open_regular

__all__ = ["LayerInfo", "Checkpoint", "open_checkpoint"]

SUPPORTED_METHODS = ("gptq", "awq", "auto-round", "compressed-tensors", "mxfp4", "quark")


#: size limits of the JSON files a checkpoint folder holds (docs/checkpoints.md, "Limits"):
#: configs are kilobytes in practice (auto-round extra_config of a large MoE: a few MiB), the
#: shard index of the largest public models about 10 MiB.
MAX_CONFIG_JSON_BYTES = 8 * 1024 * 1024
MAX_INDEX_JSON_BYTES = 32 * 1024 * 1024
#: all safetensors headers of one checkpoint together (one file may use the format's whole limit;
#: many shards may not add up to many times that memory)
MAX_TOTAL_HEADER_BYTES = MAX_HEADER_BYTES


def _load_json(path: Path, what: str, limit: int = MAX_CONFIG_JSON_BYTES) -> dict:
    """A JSON object from a regular file of at most ``limit`` bytes (checked before reading)."""
    with open_regular(path, what) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise FormatError(f"{path}: {what} is {size} bytes, over the {limit}-byte limit for this file")
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise FormatError(f"{path}: {what} grew past the {limit}-byte limit while being read")
    try:
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=_refuse_duplicate_keys)
    except _DuplicateKey as e:
        raise FormatError(f"{path}: {what} has the key {_clip(repr(e.args[0]), 120)} twice in one object (the "
                          "readers disagree on which wins); refused") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise FormatError(f"{path}: malformed JSON ({type(e).__name__}: {_clip(str(e))})") from None
    if not isinstance(data, dict):
        raise FormatError(f"{path}: {what} is not a JSON object")
    return data


class _DuplicateKey(Exception):
    pass


def _refuse_duplicate_keys(pairs: list) -> dict:
    """json object_pairs_hook: a key twice in one object is an error (as in safetensors headers), not last-wins."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return out


def _inside(root: Path, path: Path) -> bool:
    """``path`` (symlinks resolved) lies inside ``root`` (resolved)."""
    return root in path.resolve().parents


def _clip(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


class Checkpoint:
    """A checkpoint folder: config + lazily read safetensors shards."""

    def __init__(self, folder: "str | Path"):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise FormatError(f"{self.folder}: not a checkpoint folder")
        self.config = _load_json(self.folder / "config.json", "config.json")
        qc = self.config.get("quantization_config")
        source = self.folder / "config.json"
        if qc is None and (self.folder / "quantization_config.json").exists():
            source = self.folder / "quantization_config.json"
            qc = _load_json(source, "quantization_config.json")
        elif qc is None and (self.folder / "quantize_config.json").exists():
            # AutoGPTQ / GPTQModel side file (checkpoints saved without transformers): GPTQ by definition
            source = self.folder / "quantize_config.json"
            qc = {"quant_method": "gptq", **_load_json(source, "quantize_config.json")}
        if not isinstance(qc, dict):
            raise UnsupportedFormatError(f"{source}: no quantization_config (not a quantized checkpoint)")
        self.qconfig = qc
        self.qconfig_source = source
        raw_method = qc.get("quant_method", "")
        if not isinstance(raw_method, str):
            raise UnsupportedFormatError(f"{source}: quant_method {_clip(repr(raw_method))} is not a string")
        method = raw_method.lower().replace("intel/", "").replace("_", "-")
        if method not in SUPPORTED_METHODS:
            raise UnsupportedFormatError(
                f"{source}: unknown quant_method {_clip(repr(qc.get('quant_method')), 80)}; "
                f"supported: {', '.join(SUPPORTED_METHODS)}")
        self.method = method
        self._header_bytes = 0
        #: (file name, why) for every *.safetensors in the folder that is not read (docs/checkpoints.md)
        self.skipped_files: list[tuple[str, str]] = []
        self._files = self._index_files()
        self._layers: dict[str, LayerInfo] | None = None

    # -- tensors --------------------------------------------------------------------------
    def _index_files(self) -> dict[str, TensorFile]:
        index = self.folder / "model.safetensors.index.json"
        names: dict[str, TensorFile] = {}
        if index.exists():
            wm = _load_json(index, "model.safetensors.index.json", MAX_INDEX_JSON_BYTES).get("weight_map")
            if not isinstance(wm, dict):
                raise FormatError(f"{index}: no weight_map")
            files: dict[str, TensorFile] = {}
            root = self.folder.resolve()
            for tname, fname in wm.items():
                if isinstance(fname, str) and "\0" in fname:
                    raise FormatError(f"{index}: weight_map entry for tensor {_clip(repr(tname), 120)} names the file "
                                      f"{_clip(repr(fname), 120)}, which holds a NUL byte (no file has such a name)")
                if not isinstance(fname, str) or not fname:
                    raise FormatError(f"{index}: weight_map entry for tensor {_clip(repr(tname), 120)} is not a file name: {_clip(repr(fname), 120)}")
                if fname not in files:
                    p = (self.folder / fname).resolve()
                    if root not in p.parents:
                        raise FormatError(
                            f"{index}: shard {_clip(repr(fname), 120)} (tensor {_clip(repr(tname), 120)}) lies outside the checkpoint folder")
                    if not p.exists():
                        raise FormatError(f"{index}: shard {_clip(repr(fname), 120)} (tensor {_clip(repr(tname), 120)}) not found in {self.folder}")
                    files[fname] = self._open_shard(p)
                tf = files[fname]
                if tname not in tf.header or tname == "__metadata__":
                    raise FormatError(f"{index}: tensor {_clip(repr(tname), 120)} is not in shard {_clip(fname, 120)}")
                names[tname] = tf
            listed = {Path(f).name for f in files}
            self.skipped_files = [(p.name, "not read: model.safetensors.index.json does not list it")
                                  for p in sorted(self.folder.glob("*.safetensors")) if p.name not in listed]
            return names
        chosen = self._single_file()
        tf = self._open_shard(chosen)
        for k in tf.keys():
            names[k] = tf
        return names

    def _single_file(self) -> Path:
        """No index: the file transformers reads (``model.safetensors``, else the folder's only ``*.safetensors``),
        inside the folder after symlinks; every other ``*.safetensors`` beside it is named in ``skipped_files``."""
        present = sorted(p.name for p in self.folder.glob("*.safetensors"))
        if not present:
            raise FormatError(f"{self.folder}: no *.safetensors files")
        if "model.safetensors" in present:
            name = "model.safetensors"
        elif len(present) == 1:
            name = present[0]
        else:
            raise FormatError(f"{self.folder}: {len(present)} *.safetensors files ({_clip(', '.join(present), 160)}), "
                              "none named model.safetensors and no model.safetensors.index.json to say which hold the "
                              "model (transformers reads model.safetensors, an index, or a single file)")
        path = self.folder / name
        if not _inside(self.folder.resolve(), path):
            raise FormatError(f"{path}: a symlink to {_clip(str(path.resolve()), 160)}, outside the checkpoint folder; "
                              "refused")
        self.skipped_files = [(n, f"not read: {name} holds the model (no index)") for n in present if n != name]
        return path

    def _open_shard(self, path: Path) -> TensorFile:
        self._header_bytes += header_length(path)
        if self._header_bytes > MAX_TOTAL_HEADER_BYTES:
            raise FormatError(f"{path}: the safetensors headers of this checkpoint add up to more than "
                              f"{MAX_TOTAL_HEADER_BYTES} bytes (the limit for all shards together)")
        return TensorFile(path)

    def has(self, name: str) -> bool:
        return name in self._files

    def tensor(self, name: str, *, layer: str | None = None) -> Tensor:
        if name not in self._files:
            raise FormatError("missing tensor", layer=layer, tensor=name.rsplit(".", 1)[-1] if layer else name)
        return self._files[name].get(name)

    def tensor_info(self, name: str, *, layer: str | None = None) -> tuple[str, tuple]:
        """(dtype, shape) from the header, without reading data; FormatError when absent."""
        if name not in self._files:
            raise FormatError("missing tensor", layer=layer, tensor=name.rsplit(".", 1)[-1] if layer else name)
        return self._files[name].info(name)

    def tensor_names(self) -> list[str]:
        return sorted(self._files)

    # -- layers ---------------------------------------------------------------------------
    def layers(self) -> list[LayerInfo]:
        if self._layers is None:
            from . import detect, quark  # local import: detection rules live in their own modules

            rule = quark.detect_quark_layers if self.method == "quark" else None
            self._layers = {l.name: l for l in detect.detect_layers(self, rule=rule)}
        return list(self._layers.values())

    def layer(self, name: str) -> LayerInfo:
        self.layers()
        assert self._layers is not None
        if name in self._layers:
            return self._layers[name]
        # Accept a tensor name or a trailing ".weight".
        stripped = re.sub(r"(\.(weight|qweight|weight_packed)|_blocks)$", "", name)
        if stripped in self._layers:
            return self._layers[stripped]
        close = difflib.get_close_matches(stripped, list(self._layers), n=5, cutoff=0.6)
        close += [n for n in self._layers if stripped.split(".")[-1] in n and n not in close]
        hint = f"; similar: {', '.join(close[:5])}" if close else f"; layers: {', '.join(list(self._layers)[:5])}" + (
            ", ..." if len(self._layers) > 5 else "")
        raise QconformError(f"{self.folder}: no quantized layer named {_clip(repr(name), 120)}{hint}")

    def layer_tensors(self, info: LayerInfo) -> dict[str, Tensor]:
        return {role: self.tensor(tname, layer=info.name) for role, tname in info.tensors.items()}


def open_checkpoint(folder: "str | Path") -> Checkpoint:
    return Checkpoint(folder)


def describe_dtype(t: Tensor) -> str:
    return t.dtype


def as_int_array(t: Tensor, *, layer: str, tensor: str, dtypes=("I32",)) -> np.ndarray:
    require(t.dtype in dtypes, f"expected dtype {'/'.join(dtypes)}, got {t.dtype}", layer=layer, tensor=tensor)
    return t.data
