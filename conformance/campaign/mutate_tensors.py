"""Mutations of a checkpoint's safetensors files (headers, tensors, values), its shard index and its
file types, for the loader campaign.

Part of the generator in conformance/campaign/mutations.py (which lists every kind and says which must be
rejected); semantics: docs/checkpoints.md ("Malformed-checkpoint campaign"). Each function takes
(rng, folder, seed), damages the copy in ``folder`` and returns a one-line description, or None
when the kind does not apply to the seed.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from emulator.tensorfile import Tensor, TensorFile, load_tensors, save_tensors

from conformance.campaign.mutate_config import SPECIAL_FILES, special_file


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


def _layer_tensors(folder: Path, seed) -> dict:
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


def _raw_header(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write_raw(path: Path, header: "dict | bytes", data: bytes) -> None:
    hj = header if isinstance(header, bytes) else json.dumps(header).encode()
    hj += b" " * (-len(hj) % 8)
    path.write_bytes(struct.pack("<Q", len(hj)) + hj + data)


def m_shard_special(rng, folder, seed):
    shard = rng.choice([p.name for p in _shards(folder)])
    return special_file(folder, shard, rng.choice(SPECIAL_FILES[:-1]))


def m_extra_special_safetensors(rng, folder, seed):
    if (folder / "model.safetensors.index.json").exists():
        return None
    return special_file(folder, "zz-extra.safetensors", rng.choice(SPECIAL_FILES[:-2]))


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


def m_header_dtype_swap(rng, folder, seed):
    def fn(r, h, name):
        old = h[name]["dtype"]
        new = r.choice(_SAME_WIDTH.get(old, ["U8"]))
        h[name]["dtype"] = new
        return f"dtype {old} -> {new} (bytes unchanged)"
    return _header_edit(rng, folder, seed, fn)


def m_header_dtype_unknown(rng, folder, seed):
    def fn(r, h, name):
        h[name]["dtype"] = r.choice(["F128", "int4", "", 7, None, "f16"])
        return f"dtype -> {h[name]['dtype']!r}"
    return _header_edit(rng, folder, seed, fn)


def m_header_shape_garbage(rng, folder, seed):
    def fn(r, h, name):
        h[name]["shape"] = r.choice([[-1, 4], [1.5], "4x4", [None], [True, 2], [2 ** 70], [1] * 65, [1] * 33])
        return f"shape -> {h[name]['shape']!r}"
    return _header_edit(rng, folder, seed, fn)


def m_header_shape_reinterpret(rng, folder, seed):
    def fn(r, h, name):
        shape = h[name]["shape"]
        n = int(np.prod(shape)) if shape else 1
        new = r.choice([[n], shape[::-1], [1] + shape, shape + [1], [n, 1], [1, n] if n else [0]])
        h[name]["shape"] = new
        return f"shape {shape} -> {new} (bytes unchanged)"
    return _header_edit(rng, folder, seed, fn)


def m_header_offsets(rng, folder, seed):
    def fn(r, h, name):
        b, e = h[name]["data_offsets"]
        new = r.choice([[b, e + 8], [b - 4, e], [e, b], [b, 2 ** 64], [-1, e], [b + 0.5, e], [b]])
        h[name]["data_offsets"] = new
        return f"data_offsets {[b, e]} -> {new}"
    return _header_edit(rng, folder, seed, fn)


def m_header_entry(rng, folder, seed):
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


def m_header_bytes(rng, folder, seed):
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


def m_header_many_entries(rng, folder, seed):
    """A valid header with very many (zero-size, stray) tensors: header parsing time and memory."""
    path = rng.choice(_shards(folder))
    header, data = _raw_header(path)
    n = rng.choice([10_000, 100_000])
    for i in range(n):
        header[f"model.pad.{i}"] = {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}
    _write_raw(path, header, data)
    return f"{path.name}: + {n} zero-size tensors ({path.stat().st_size} bytes)"


def m_file_truncate(rng, folder, seed):
    path = rng.choice(_shards(folder))
    raw = path.read_bytes()
    cut = rng.choice([0, 4, 8, 12, len(raw) // 2, len(raw) - 1])
    path.write_bytes(raw[:cut])
    return f"{path.name} cut to {cut} of {len(raw)} bytes"


def m_file_append(rng, folder, seed):
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


def m_tensor_drop(rng, folder, seed):
    return _tensor_mut(rng, folder, seed, lambda r, t, d: d.append("dropped"))


def m_tensor_rename(rng, folder, seed):
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


def m_tensor_dtype_convert(rng, folder, seed):
    def fn(r, t, d):
        a = t.data
        target = r.choice([np.float32, np.float16, np.int64, np.int32, np.uint8, np.int8, np.float64])
        d.append(f"{t.dtype} -> {np.dtype(target).name} (values converted)")
        with np.errstate(all="ignore"):
            return a.astype(target)
    return _tensor_mut(rng, folder, seed, fn)


def m_tensor_reshape(rng, folder, seed):
    def fn(r, t, d):
        a = t.data
        new = r.choice([a.reshape(-1), a.T.copy() if a.ndim == 2 else a[None], a[None], a[..., None]])
        d.append(f"shape {list(a.shape)} -> {list(new.shape)}")
        return Tensor(new, t.dtype)
    return _tensor_mut(rng, folder, seed, fn)


def m_tensor_slice(rng, folder, seed):
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


def m_tensor_zero_size(rng, folder, seed):
    def fn(r, t, d):
        a = t.data
        axis = r.randrange(max(a.ndim, 1)) if a.ndim else 0
        z = np.take(a.reshape(a.shape or (1,)), [], axis=axis)
        d.append(f"shape {list(a.shape)} -> {list(z.shape)}")
        return Tensor(z, t.dtype)
    return _tensor_mut(rng, folder, seed, fn)


def m_tensor_stray(rng, folder, seed):
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


def m_value_nonfinite_scale(rng, folder, seed):
    layer = _layer_tensors(folder, seed)
    if not any(n.endswith(_FLOAT_SCALE_ROLES) and TensorFile(p).info(n)[0] in ("F16", "BF16", "F32")
               for n, p in layer.items()):
        return None
    return _float_scale(rng, folder, seed, [np.nan, np.inf, -np.inf], True)


def m_value_odd_scale(rng, folder, seed):
    layer = _layer_tensors(folder, seed)
    if not any(n.endswith(_FLOAT_SCALE_ROLES) and TensorFile(p).info(n)[0] in ("F16", "BF16", "F32")
               for n, p in layer.items()):
        return None
    return _float_scale(rng, folder, seed, [0.0, -0.0, -1.0, 6e-8, 65504.0, 2.0 ** -24], False)


def m_value_e8m0_ff(rng, folder, seed):
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


def m_value_e8m0_extreme(rng, folder, seed):
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


def m_value_random_codes(rng, folder, seed):
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


def m_value_g_idx(rng, folder, seed):
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


def m_value_weight_shape(rng, folder, seed):
    def fn(r, t, d):
        a = np.array(t.data, copy=True)
        v = r.choice([[0, a[1]], [a[0], 0], [-1, a[1]], [a[0], a[1] * 2], [a[0] + 1, a[1]], [2 ** 40, a[1]]])
        d.append(f"{a.tolist()} -> {v}")
        return np.asarray(v, dtype=a.dtype)
    return _tensor_mut(rng, folder, seed, fn, roles=(".weight_shape",))


def m_bias(rng, folder, seed):
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
def m_index(rng, folder, seed):
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
