"""Strict safetensors reading and writing, NumPy only (no pickle, no torch).

Vendors feed qconform files they did not make, so the reader validates
everything before it touches data: header length, JSON shape (an object that
starts with ``{``, no duplicate keys, ``__metadata__`` a str -> str map),
dtype names, that every tensor's byte range lies inside the file and matches
its shape, and that the ranges tile the data section exactly (no overlap, no
hole, no trailing bytes: the safetensors format rules, which keep polyglot
files out). Errors name the file and tensor; nothing is ever unpickled.

bfloat16 tensors have no NumPy dtype: they are returned as float32 arrays
(bf16 -> fp32 is exact) and the ``Tensor.dtype`` keeps "BF16"; writing a
tensor with dtype "BF16" stores the upper halves of float32 values that
must be exactly bf16-representable. fp8 / fp6 / fp4 tensors are returned as
their raw bytes (uint8); "F4" (4 bits an element, two to a byte, as
``torch.float4_e2m1fn_x2``) comes back with its last dimension halved, and
packed streams that do not split into whole bytes per row (fp6, F4 with an
odd last dimension) come back flat.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import stat
import struct
from pathlib import Path

import numpy as np

from .errors import FormatError

__all__ = ["Tensor", "read_header", "header_length", "load_tensors", "save_tensors", "TensorFile", "open_regular", "MAX_HEADER_BYTES"]

_NP = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
    "C64": np.complex64,
}
#: bits per element of every dtype the safetensors format defines
_BITS = {k: 8 * np.dtype(v).itemsize for k, v in _NP.items()}
_BITS.update({"BF16": 16, "F8_E8M0": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
              "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4})
#: the safetensors format's own header limit (the reference reader refuses larger headers too).
#: Parsing costs about 11 bytes of memory per header byte (measured: 22 MB header, 240 MiB).
MAX_HEADER_BYTES = 100_000_000
_MAX_HEADER = MAX_HEADER_BYTES
#: a tensor of more dimensions than this is refused (PyTorch and NumPy stop at 64)
MAX_DIMS = 32


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: "str | os.PathLike", what: str = "file"):
    """Open ``path`` for binary reading only if it is a regular file (after symlinks).

    A FIFO, device or socket is refused *before* it is opened for reading (opening a FIFO
    blocks until a writer appears, reading /dev/zero never ends); the descriptor is opened
    non-blocking and checked again, so a file swapped in between is refused too. Errors name
    the path."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FormatError(f"{path}: {what} not found") from None
    except OSError as e:
        raise FormatError(f"{path}: cannot read {what} ({e.strerror or type(e).__name__})") from None
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"{path}: {what} is {_kind(st.st_mode)}, not a regular file; refused")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise FormatError(f"{path}: cannot read {what} ({e.strerror or type(e).__name__})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise FormatError(f"{path}: {what} is {_kind(st.st_mode)}, not a regular file; refused")
    return os.fdopen(fd, "rb")


def _nbytes(shape: list, dt: str, limit: int) -> "int | None":
    """Bytes a tensor of ``shape`` and ``dt`` occupies; None when that is not a whole number of
    bytes; ``limit + 1`` when it exceeds ``limit`` (Python ints, stopped early: no overflow and no
    huge products from a hostile header)."""
    if 0 in shape:
        return 0
    nbits = _BITS[dt]
    for d in shape:
        nbits *= d
        if nbits > 8 * limit + 8:
            return limit + 1
    return nbits // 8 if nbits % 8 == 0 else None


def _no_duplicates(pairs: list) -> dict:
    seen = dict(pairs)  # C speed; the loop below runs only when a key repeats
    if len(seen) != len(pairs):
        keys: set = set()
        for k, _ in pairs:
            if k in keys:
                raise FormatError(f"duplicate key {_short(k)}")
            keys.add(k)
    return seen


class _Entry(tuple):
    """A header entry kept compact: (dtype, shape tuple, begin, end) in a tuple (no dict, no lists: about a
    third of the memory of the parsed JSON object); ``entry["dtype"]`` etc. still read like the JSON."""

    __slots__ = ()

    def __getitem__(self, key):
        if key == "dtype":
            return tuple.__getitem__(self, 0)
        if key == "shape":
            return list(tuple.__getitem__(self, 1))
        if key == "data_offsets":
            return [tuple.__getitem__(self, 2), tuple.__getitem__(self, 3)]
        return tuple.__getitem__(self, key)


def _pairs_hook(pairs: list):
    """json object_pairs_hook: a well-typed tensor entry becomes an ``_Entry`` while the JSON is parsed (the
    peak memory is the compact form's); any other object a dict, duplicate keys refused."""
    if len(pairs) == 3:
        d = dict(pairs)
        if len(d) == 3:
            dt, sh, of = d.get("dtype"), d.get("shape"), d.get("data_offsets")
            if (type(dt) is str and type(sh) is list and type(of) is list and len(of) == 2
                    and type(of[0]) is int and type(of[1]) is int and all(type(x) is int for x in sh)):
                return _Entry((dt, tuple(sh), of[0], of[1]))
    return _no_duplicates(pairs)


@dataclasses.dataclass
class Tensor:
    """A tensor read from a file: NumPy data plus the dtype name it had on disk."""

    data: np.ndarray
    dtype: str  # safetensors dtype string, e.g. "F16", "BF16", "I32", "U8"

    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)


def header_length(path: "str | os.PathLike") -> int:
    """The header length a safetensors file declares (its first 8 bytes), without parsing it:
    lets a caller budget the headers of many shards before reading any."""
    with open_regular(path, "safetensors file") as f:
        raw = f.read(8)
    if len(raw) < 8:
        raise FormatError(f"{path}: not a safetensors file (shorter than 8 bytes)")
    return struct.unpack("<Q", raw)[0]


def read_header(path: "str | os.PathLike") -> tuple[dict, int]:
    """Parse and validate the JSON header -> (entries, data offset)."""
    path = Path(path)
    with open_regular(path, "safetensors file") as f:
        size = os.fstat(f.fileno()).st_size
        raw = f.read(8)
        if len(raw) < 8:
            raise FormatError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n > _MAX_HEADER or 8 + n > size:
            raise FormatError(f"{path}: not a safetensors file (header length {n} exceeds the file "
                              f"({size} bytes) or the {_MAX_HEADER}-byte limit)")
        text = f.read(n)
    if len(text) != n:
        raise FormatError(f"{path}: file shrank while reading its header")
    if not text.startswith(b"{"):
        raise FormatError(f"{path}: safetensors header is not a JSON object (it must start with '{{')")
    gc_was = gc.isenabled()
    gc.disable()  # millions of small containers: the collector's passes over them made parsing superlinear
    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_pairs_hook)
        del text
        return _validate_header(path, header, size, n)
    except FormatError as e:
        if str(e).startswith(str(path)):
            raise
        raise FormatError(f"{path}: malformed safetensors header ({e})") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise FormatError(f"{path}: malformed safetensors header ({type(e).__name__}: {e})") from None
    finally:
        if gc_was:
            gc.enable()


def _validate_header(path: Path, header, size: int, n: int) -> tuple[dict, int]:
    """Every entry's dtype, shape and byte range; the ranges tile the data section. Entries become ``_Entry``."""
    if not isinstance(header, dict):
        raise FormatError(f"{path}: safetensors header is not a JSON object")
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict)
                                 and all(isinstance(v, str) for v in meta.values())):
        raise FormatError(f"{path}: __metadata__ must be an object of string values")
    data_len = size - 8 - n
    ranges = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if type(info) is _Entry:  # parsed well-typed (_pairs_hook): only the values are left to check
            dt, shape, begin, end = tuple.__iter__(info)
            offs = [begin, end]
            if dt not in _BITS:
                raise FormatError(f"{path}: tensor {name!r}: unknown dtype {dt!r}")
            if any(d < 0 for d in shape):
                raise FormatError(f"{path}: tensor {name!r}: malformed shape {_short(list(shape))} or data_offsets "
                                  f"{_short(offs)}")
            shape = list(shape)
        else:
            where = f"{path}: tensor {name!r}"
            if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
                raise FormatError(f"{where}: header entry lacks dtype/shape/data_offsets")
            dt = info["dtype"]
            if not isinstance(dt, str) or dt not in _BITS:
                raise FormatError(f"{where}: unknown dtype {dt!r}")
            shape = info["shape"]
            offs = info["data_offsets"]
            if (not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape)
                    or not isinstance(offs, list) or len(offs) != 2 or not all(_is_int(o) for o in offs)):
                raise FormatError(f"{where}: malformed shape {_short(shape)} or data_offsets {_short(offs)}")
            header[name] = _Entry((dt, tuple(shape), offs[0], offs[1]))
        where = f"{path}: tensor {name!r}"
        if len(shape) > MAX_DIMS:
            raise FormatError(f"{where}: {len(shape)} dimensions (at most {MAX_DIMS} are accepted)")
        begin, end = offs
        if not (0 <= begin <= end <= data_len):
            raise FormatError(f"{where}: data_offsets {offs} outside the data section ({data_len} bytes)")
        nbytes = _nbytes(shape, dt, data_len)
        if nbytes is None:
            raise FormatError(f"{where}: shape {shape} of {dt} is not a whole number of bytes")
        if end - begin != nbytes:
            need = f"{nbytes} bytes" if nbytes <= data_len else "more bytes than the file holds"
            raise FormatError(f"{where}: {end - begin} bytes do not hold shape {shape} of {dt} ({need})")
        ranges.append((begin, end, name))
    # The data section must be tiled exactly: no overlap, no hole, nothing after the last tensor.
    ranges.sort()
    pos, prev = 0, None
    for b, e, name in ranges:
        if b < pos:
            raise FormatError(f"{path}: tensors {prev!r} and {name!r} overlap")
        if b > pos:
            after = f"after tensor {prev!r}" if prev is not None else "at the start of the data section"
            raise FormatError(f"{path}: tensor {name!r}: {b - pos} byte(s) {after} belong to no tensor")
        pos, prev = e, name
    if pos != data_len:
        raise FormatError(f"{path}: {data_len - pos} trailing byte(s) after the last tensor belong to no tensor")
    return header, 8 + n


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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
        if name not in self.header or name == "__metadata__":
            raise FormatError(f"{self.path}: no tensor named {name!r}")
        e = self.header[name]
        return e["dtype"], tuple(e["shape"])

    def get(self, name: str) -> Tensor:
        if name not in self.header or name == "__metadata__":
            raise FormatError(f"{self.path}: no tensor named {name!r}")
        e = self.header[name]
        dt, shape = e["dtype"], tuple(e["shape"])
        begin, end = e["data_offsets"]
        with open_regular(self.path, "safetensors file") as f:
            f.seek(self._base + begin)
            buf = f.read(end - begin)
        if len(buf) != end - begin:
            raise FormatError(f"{self.path}: tensor {name!r}: file shrank since its header was read")
        if dt == "BF16":
            bits = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << np.uint32(16)
            data = bits.view(np.float32).reshape(shape)
        elif dt == "BOOL":
            raw = np.frombuffer(buf, dtype=np.uint8)
            if np.any(raw > 1):
                i = int(np.argmax(raw > 1))
                raise FormatError(f"{self.path}: tensor {name!r}: byte {raw[i]} at element {i} is not a bool (0 or 1)")
            data = raw.astype(np.bool_).reshape(shape)
        elif dt in _NP:
            data = np.frombuffer(buf, dtype=np.dtype(_NP[dt]).newbyteorder("<")).reshape(shape)
            data = data.astype(_NP[dt])  # native byte order, writable copy
        elif dt == "F4" and shape and shape[-1] % 2 == 0:  # two elements a byte: [..., L] -> bytes [..., L/2]
            data = np.frombuffer(buf, dtype=np.uint8).reshape(shape[:-1] + (shape[-1] // 2,)).copy()
        elif _BITS[dt] == 8:  # fp8 bytes: keep the raw bytes, the format module interprets them
            data = np.frombuffer(buf, dtype=np.uint8).reshape(shape).copy()
        else:  # fp6, or F4 with an odd last dimension: a packed bit stream, returned flat
            data = np.frombuffer(buf, dtype=np.uint8).copy()
        return Tensor(data=data, dtype=dt)


def load_tensors(path: "str | os.PathLike") -> dict[str, Tensor]:
    """Read every tensor of a safetensors file."""
    tf = TensorFile(path)
    return {k: tf.get(k) for k in tf.keys()}


def _np_dtype_name(a: np.ndarray) -> str:
    for k, v in _NP.items():
        if a.dtype.newbyteorder("=") == np.dtype(v):
            return k
    if a.dtype.name == "bfloat16":
        return "BF16"
    raise FormatError(f"cannot store dtype {a.dtype} in safetensors")


def save_tensors(path: "str | os.PathLike", tensors: dict, metadata: dict | None = None) -> None:
    """Write tensors (NumPy arrays or ``Tensor``) deterministically (sorted names).

    A ``Tensor`` with dtype "BF16" holding float32 data is stored as bf16
    (its values must be exactly representable); a ``Tensor`` with an fp8 /
    fp6 / fp4 dtype holds its raw bytes as uint8 (F4: last dimension halved,
    as ``TensorFile.get`` returns it). Any other ``Tensor`` must hold data of
    its dtype.
    """
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        if not isinstance(name, str) or name == "__metadata__":
            raise FormatError(f"tensor name {name!r} is not allowed")
        t = tensors[name]
        if isinstance(t, Tensor):
            arr, dt = np.asarray(t.data, order="C"), t.dtype  # (ascontiguousarray would make 0-d 1-d)
            if dt not in _BITS:
                raise FormatError(f"tensor {name!r}: unknown dtype {dt!r}")
        else:
            arr = np.asarray(t, order="C")
            dt = _np_dtype_name(arr)
        shape = list(arr.shape)
        if dt == "BF16":
            if arr.dtype.name == "bfloat16":
                raw = arr.view(np.uint16).astype("<u2").tobytes()
            else:
                f32 = arr.astype(np.float32)
                bits = f32.view(np.uint32)
                if np.any(bits & np.uint32(0xFFFF)):
                    raise FormatError(f"tensor {name!r}: values are not exactly representable in bfloat16")
                raw = (bits >> np.uint32(16)).astype("<u2").tobytes()
        elif dt in _NP:
            if arr.dtype.newbyteorder("=") != np.dtype(_NP[dt]):
                raise FormatError(f"tensor {name!r}: data of dtype {arr.dtype} cannot be stored as {dt}")
            raw = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        else:  # raw bytes of a sub-16-bit float format
            if arr.dtype != np.uint8:
                raise FormatError(f"tensor {name!r}: {dt} data must be its raw bytes (uint8), got {arr.dtype}")
            raw = arr.tobytes()
            if dt == "F4":
                if not shape:
                    raise FormatError(f"tensor {name!r}: F4 needs at least one dimension")
                shape[-1] *= 2
            elif _BITS[dt] != 8:
                raise FormatError(f"tensor {name!r}: writing {dt} is not supported")
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    hj = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)  # align the data section, as the reference writer does
    parent = Path(path).parent
    if not parent.is_dir():  # named here, not as the temporary file the open below would report
        raise FileNotFoundError(f"{path}: the output folder {parent} does not exist")
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
