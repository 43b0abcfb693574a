"""Strict safetensors reading and writing, NumPy only (no pickle, no torch).

Vendors feed qconform files they did not make, so the reader validates
everything before it touches data: header length, JSON shape, dtype names,
that every tensor's byte range lies inside the file, matches its shape, and
that ranges do not overlap. Errors name the file and tensor.

bfloat16 tensors have no NumPy dtype: they are returned as float32 arrays
(bf16 -> fp32 is exact) and the ``Tensor.dtype`` keeps "BF16"; writing a
tensor with dtype "BF16" stores the upper halves of float32 values that
must be exactly bf16-representable.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from pathlib import Path

import numpy as np

from .errors import FormatError

__all__ = ["Tensor", "read_header", "load_tensors", "save_tensors", "TensorFile"]

_NP = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}
_SIZE = {k: np.dtype(v).itemsize for k, v in _NP.items()}
_SIZE.update({"BF16": 2, "F8_E8M0": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F4": 1})
_MAX_HEADER = 100 * 1024 * 1024


@dataclasses.dataclass
class Tensor:
    """A tensor read from a file: NumPy data plus the dtype name it had on disk."""

    data: np.ndarray
    dtype: str  # safetensors dtype string, e.g. "F16", "BF16", "I32", "U8"

    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)


def read_header(path: "str | os.PathLike") -> tuple[dict, int]:
    """Parse and validate the JSON header -> (entries, data offset)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise FormatError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n > _MAX_HEADER or 8 + n > size:
            raise FormatError(f"{path}: not a safetensors file (header length {n} exceeds the file or limit)")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise FormatError(f"{path}: malformed safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise FormatError(f"{path}: safetensors header is not a JSON object")
    data_len = size - 8 - n
    ranges = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor {name!r}"
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            raise FormatError(f"{where}: header entry lacks dtype/shape/data_offsets")
        dt = info["dtype"]
        if dt not in _SIZE:
            raise FormatError(f"{where}: unknown dtype {dt!r}")
        shape = info["shape"]
        offs = info["data_offsets"]
        if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
                or not isinstance(offs, list) or len(offs) != 2 or not all(isinstance(o, int) for o in offs)):
            raise FormatError(f"{where}: malformed shape or data_offsets")
        begin, end = offs
        if not (0 <= begin <= end <= data_len):
            raise FormatError(f"{where}: data_offsets {offs} outside the data section ({data_len} bytes)")
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if end - begin != count * _SIZE[dt]:
            raise FormatError(f"{where}: {end - begin} bytes do not hold shape {shape} of {dt}")
        ranges.append((begin, end, name))
    ranges.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(ranges, ranges[1:]):
        if b1 < e0:
            raise FormatError(f"{path}: tensors {n0!r} and {n1!r} overlap")
    return header, 8 + n


class TensorFile:
    """Lazy access to one safetensors file (reads only the tensors asked for)."""

    def __init__(self, path: "str | os.PathLike"):
        self.path = Path(path)
        self.header, self._base = read_header(self.path)

    def keys(self) -> list[str]:
        return [k for k in self.header if k != "__metadata__"]

    @property
    def metadata(self) -> dict:
        return self.header.get("__metadata__", {}) or {}

    def info(self, name: str) -> tuple[str, tuple]:
        e = self.header[name]
        return e["dtype"], tuple(e["shape"])

    def get(self, name: str) -> Tensor:
        if name not in self.header or name == "__metadata__":
            raise FormatError(f"{self.path}: no tensor named {name!r}")
        e = self.header[name]
        dt, shape = e["dtype"], tuple(e["shape"])
        begin, end = e["data_offsets"]
        with open(self.path, "rb") as f:
            f.seek(self._base + begin)
            buf = f.read(end - begin)
        if dt == "BF16":
            bits = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << np.uint32(16)
            data = bits.view(np.float32).reshape(shape)
        elif dt in _NP:
            data = np.frombuffer(buf, dtype=np.dtype(_NP[dt]).newbyteorder("<")).reshape(shape)
            data = data.astype(_NP[dt])  # native byte order, writable copy
        else:  # fp8 / fp4 bytes: keep the raw bytes, the format module interprets them
            data = np.frombuffer(buf, dtype=np.uint8).reshape(shape).copy()
        return Tensor(data=data, dtype=dt)


def load_tensors(path: "str | os.PathLike") -> dict[str, Tensor]:
    """Read every tensor of a safetensors file."""
    tf = TensorFile(path)
    return {k: tf.get(k) for k in tf.keys()}


def _np_dtype_name(a: np.ndarray) -> str:
    for k, v in _NP.items():
        if a.dtype == np.dtype(v):
            return k
    if a.dtype.name == "bfloat16":
        return "BF16"
    raise FormatError(f"cannot store dtype {a.dtype} in safetensors")


def save_tensors(path: "str | os.PathLike", tensors: dict, metadata: dict | None = None) -> None:
    """Write tensors (NumPy arrays or ``Tensor``) deterministically (sorted names).

    A ``Tensor`` with dtype "BF16" holding float32 data is stored as bf16
    (its values must be exactly representable).
    """
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        if isinstance(t, Tensor):
            arr, dt = np.ascontiguousarray(t.data), t.dtype
        else:
            arr = np.ascontiguousarray(t)
            dt = _np_dtype_name(arr)
        if dt == "BF16":
            if arr.dtype.name == "bfloat16":
                raw = arr.view(np.uint16).astype("<u2").tobytes()
            else:
                f32 = arr.astype(np.float32)
                bits = f32.view(np.uint32)
                if np.any(bits & np.uint32(0xFFFF)):
                    raise FormatError(f"tensor {name!r}: values are not exactly representable in bfloat16")
                raw = (bits >> np.uint32(16)).astype("<u2").tobytes()
        else:
            raw = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    hj = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)  # align the data section, as the reference writer does
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
