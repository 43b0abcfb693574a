"""The strict safetensors reader/writer (emulator/tensorfile.py).

- round trips against the reference `safetensors` library, both ways: every NumPy dtype,
  bfloat16 (through safetensors.torch), fp8 / E8M0 / fp4 raw bytes, empty and 0-d tensors,
  metadata;
- the strictness promises: each malformed file raises FormatError naming the file (and the
  tensor, where there is one), never anything else; nothing is unpickled;
- Hypothesis fuzzing: random byte mutations and random header values of a valid file give
  FormatError or a successful read, never another exception, never a hang; and whatever the
  strict reader accepts, the reference library reads to the same bytes.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import struct
import tempfile
from contextlib import contextmanager
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy as stnp
import safetensors.torch as stt
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulator.errors import FormatError
from emulator.tensorfile import Tensor, TensorFile, load_tensors, read_header, save_tensors

# safetensors dtype names of the NumPy dtypes (from the safetensors format documentation)
NP_NAMES = {
    np.float64: "F64", np.float32: "F32", np.float16: "F16", np.int64: "I64", np.int32: "I32", np.int16: "I16",
    np.int8: "I8", np.uint64: "U64", np.uint32: "U32", np.uint16: "U16", np.uint8: "U8", np.bool_: "BOOL",
}


def _sample(dtype, shape, rng):
    if dtype is np.bool_:
        return np.asarray(rng.integers(0, 2, shape), dtype=bool)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.asarray(rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True), dtype=dtype)
    a = np.asarray(rng.standard_normal(shape) * 1e3, dtype=dtype)
    if a.size >= 4:
        a.reshape(-1)[:4] = [np.inf, -np.inf, -0.0, np.finfo(dtype).tiny]
    return a


SHAPES = [(3, 5), (), (0,), (2, 0, 3), (7,), (2, 3, 4)]


# -- round trips ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", list(NP_NAMES), ids=[NP_NAMES[d] for d in NP_NAMES])
def test_ours_to_safetensors_numpy(tmp_path, dtype):
    rng = np.random.default_rng(0)
    tensors = {f"t{i}": _sample(dtype, s, rng) for i, s in enumerate(SHAPES)}
    tensors["transposed"] = _sample(dtype, (4, 6), rng).T  # not C-contiguous
    p = tmp_path / "a.safetensors"
    save_tensors(p, tensors)
    back = stnp.load_file(str(p))
    assert set(back) == set(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == np.dtype(dtype) and back[k].shape == v.shape, k
        assert back[k].tobytes() == np.ascontiguousarray(v).tobytes(), k


@pytest.mark.parametrize("dtype", list(NP_NAMES), ids=[NP_NAMES[d] for d in NP_NAMES])
def test_safetensors_numpy_to_ours(tmp_path, dtype):
    rng = np.random.default_rng(1)
    tensors = {f"t{i}": _sample(dtype, s, rng) for i, s in enumerate(SHAPES)}
    p = tmp_path / "a.safetensors"
    stnp.save_file(tensors, str(p))
    back = load_tensors(p)
    assert set(back) == set(tensors)
    for k, v in tensors.items():
        t = back[k]
        assert t.dtype == NP_NAMES[dtype]
        assert t.data.dtype == np.dtype(dtype) and t.shape == v.shape, k
        assert t.data.tobytes() == v.tobytes(), k
        assert t.data.flags.writeable  # a copy, not a view of a read-only buffer


def test_big_endian_input_is_written_little_endian(tmp_path):
    a = np.arange(6, dtype=">i4").reshape(2, 3)
    save_tensors(tmp_path / "a.safetensors", {"a": a})
    back = stnp.load_file(str(tmp_path / "a.safetensors"))["a"]
    assert np.array_equal(back, a) and back.dtype == np.dtype("<i4")


def _bf16_values(rng, shape):
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(torch.bfloat16)


def test_bf16_safetensors_torch_to_ours(tmp_path):
    rng = np.random.default_rng(2)
    t = {"w": _bf16_values(rng, (5, 9)), "scalar": torch.tensor(-3.5, dtype=torch.bfloat16),
         "empty": torch.zeros((0, 4), dtype=torch.bfloat16),
         "special": torch.tensor([float("inf"), -0.0, 1e-40, 3.0e38], dtype=torch.bfloat16)}
    stt.save_file(t, str(tmp_path / "a.safetensors"))
    back = load_tensors(tmp_path / "a.safetensors")
    for k, v in t.items():
        assert back[k].dtype == "BF16" and back[k].data.dtype == np.float32
        assert back[k].shape == tuple(v.shape)
        ref = v.float().numpy()  # bf16 -> fp32 is exact
        assert np.array_equal(back[k].data.view(np.uint32), ref.view(np.uint32)), k


def test_bf16_ours_to_safetensors_torch(tmp_path):
    rng = np.random.default_rng(3)
    ref = _bf16_values(rng, (4, 6))
    as_f32 = ref.float().numpy()
    as_ml = as_f32.astype(ml_dtypes.bfloat16)
    save_tensors(tmp_path / "a.safetensors", {"f32": Tensor(as_f32, "BF16"), "ml": as_ml,
                                              "scalar": Tensor(np.float32(0.5), "BF16")})
    back = stt.load_file(str(tmp_path / "a.safetensors"))
    for k in ("f32", "ml"):
        assert back[k].dtype == torch.bfloat16
        assert torch.equal(back[k].view(torch.int16), ref.view(torch.int16)), k
    assert back["scalar"].shape == () and back["scalar"].item() == 0.5


def test_bf16_write_refuses_values_that_need_rounding(tmp_path):
    with pytest.raises(FormatError) as e:
        save_tensors(tmp_path / "a.safetensors", {"w": Tensor(np.array([1.0 + 2.0 ** -10], np.float32), "BF16")})
    assert "'w'" in str(e.value)


def test_tensor_data_must_match_its_dtype(tmp_path):
    with pytest.raises(FormatError) as e:
        save_tensors(tmp_path / "a.safetensors", {"w": Tensor(np.zeros(3, np.float32), "F16")})
    assert "'w'" in str(e.value)
    assert not (tmp_path / "a.safetensors").exists()


@pytest.mark.parametrize("dtype,name", [(torch.float8_e4m3fn, "F8_E4M3"), (torch.float8_e5m2, "F8_E5M2"),
                                        (torch.float8_e8m0fnu, "F8_E8M0")])
def test_fp8_raw_bytes_both_ways(tmp_path, dtype, name):
    raw = torch.from_numpy(np.random.default_rng(4).integers(0, 255, (3, 8), dtype=np.uint8))
    stt.save_file({"x": raw.view(dtype)}, str(tmp_path / "a.safetensors"))
    t = load_tensors(tmp_path / "a.safetensors")["x"]
    assert t.dtype == name and t.data.dtype == np.uint8 and np.array_equal(t.data, raw.numpy())
    save_tensors(tmp_path / "b.safetensors", {"x": t})
    back = stt.load_file(str(tmp_path / "b.safetensors"))["x"]
    assert back.dtype == dtype and torch.equal(back.view(torch.uint8), raw)


def test_fp4_x2_raw_bytes_both_ways(tmp_path):
    """safetensors "F4" counts 4-bit elements: torch's float4_e2m1fn_x2 [2, 3] is F4 [2, 6] on disk."""
    raw = torch.from_numpy(np.arange(6, dtype=np.uint8).reshape(2, 3) * 17)
    stt.save_file({"x": raw.view(torch.float4_e2m1fn_x2)}, str(tmp_path / "a.safetensors"))
    assert read_header(tmp_path / "a.safetensors")[0]["x"]["shape"] == [2, 6]
    t = load_tensors(tmp_path / "a.safetensors")["x"]
    assert t.dtype == "F4" and t.data.shape == (2, 3) and np.array_equal(t.data, raw.numpy())
    save_tensors(tmp_path / "b.safetensors", {"x": t})
    back = stt.load_file(str(tmp_path / "b.safetensors"))["x"]
    assert back.dtype == torch.float4_e2m1fn_x2 and torch.equal(back.view(torch.uint8), raw)


def test_metadata_both_ways(tmp_path):
    md = {"format": "pt", "note": "ünïcode ✓", "empty": ""}
    stnp.save_file({"a": np.zeros(2, np.float32)}, str(tmp_path / "a.safetensors"), metadata=md)
    assert TensorFile(tmp_path / "a.safetensors").metadata == md
    assert TensorFile(tmp_path / "a.safetensors").keys() == ["a"]
    save_tensors(tmp_path / "b.safetensors", {"a": np.zeros(2, np.float32)}, metadata=md)
    with safetensors.safe_open(str(tmp_path / "b.safetensors"), framework="np") as f:
        assert f.metadata() == md
        assert list(f.keys()) == ["a"]


def test_empty_file_both_ways(tmp_path):
    save_tensors(tmp_path / "a.safetensors", {})
    assert stnp.load_file(str(tmp_path / "a.safetensors")) == {}
    stnp.save_file({}, str(tmp_path / "b.safetensors"))
    assert load_tensors(tmp_path / "b.safetensors") == {}


def test_writer_is_deterministic_and_aligned(tmp_path):
    rng = np.random.default_rng(5)
    t = {"b": rng.standard_normal((3, 3)).astype(np.float16), "a": np.arange(5, dtype=np.int8)}
    save_tensors(tmp_path / "1.safetensors", t)
    save_tensors(tmp_path / "2.safetensors", dict(reversed(list(t.items()))))
    raw = (tmp_path / "1.safetensors").read_bytes()
    assert raw == (tmp_path / "2.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % 8 == 0
    assert not list(tmp_path.glob("*.tmp"))


def test_lazy_get_and_unknown_name(tmp_path):
    save_tensors(tmp_path / "a.safetensors", {"a": np.arange(3, dtype=np.int32)})
    tf = TensorFile(tmp_path / "a.safetensors")
    assert tf.info("a") == ("I32", (3,))
    for bad in ("b", "__metadata__"):
        for fn in (tf.get, tf.info):
            with pytest.raises(FormatError) as e:
                fn(bad)
            assert "a.safetensors" in str(e.value) and repr(bad) in str(e.value)


# -- strictness ----------------------------------------------------------------------------------
def _file(path: Path, header, data: bytes = b"", *, n: int | None = None, raw_header: bytes | None = None) -> Path:
    hj = raw_header if raw_header is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(hj) if n is None else n) + hj + data)
    return path


def _entry(dtype="F32", shape=(2,), offs=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offs)}


def _valid_bytes() -> bytes:
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "v.safetensors")
        stt.save_file({"w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
                       "b": torch.ones(3, dtype=torch.bfloat16),
                       "s": torch.tensor(7, dtype=torch.int8),
                       "e": torch.zeros((0, 2), dtype=torch.float16),
                       "q": torch.arange(6, dtype=torch.int32),
                       "f": torch.tensor([True, False, True])}, p, metadata={"k": "v"})
        return Path(p).read_bytes()


VALID = _valid_bytes()

STRICT_CASES = {
    # id: (header, data, extra kwargs, strings the message must contain besides the file name)
    "shorter-than-8-bytes": (None, b"", {"raw_header": b"", "n": 0}, []),
    "header-length-beyond-file": ({"a": _entry()}, b"\0" * 8, {"n": 10_000}, ["10000"]),
    "header-length-huge": ({"a": _entry()}, b"\0" * 8, {"n": 2 ** 63}, []),
    "non-json-header": (None, b"", {"raw_header": b"{this is not json}"}, ["header"]),
    "header-not-utf8": (None, b"", {"raw_header": b'{"\xff\xfe": 1}'}, ["header"]),
    "header-not-an-object": ([1, 2, 3], b"", {}, ["object"]),
    "header-leading-space": (None, b"", {"raw_header": b' {"a": {"dtype": "F32", "shape": [0], '
                                                       b'"data_offsets": [0, 0]}}'}, ["object"]),
    "duplicate-tensor-name": (None, b"\0" * 8, {"raw_header": b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": '
                                                             b'[0, 8]}, "a": {"dtype": "F32", "shape": [2], '
                                                             b'"data_offsets": [0, 8]}}'}, ["'a'"]),
    "metadata-not-strings": ({"__metadata__": {"k": 1}, "a": _entry()}, b"\0" * 8, {}, ["__metadata__"]),
    "metadata-not-object": ({"__metadata__": [1], "a": _entry()}, b"\0" * 8, {}, ["__metadata__"]),
    "entry-not-object": ({"a": [1, 2]}, b"", {}, ["'a'"]),
    "entry-lacks-offsets": ({"a": {"dtype": "F32", "shape": [2]}}, b"\0" * 8, {}, ["'a'"]),
    "unknown-dtype": ({"a": _entry(dtype="F12")}, b"\0" * 8, {}, ["'a'", "F12"]),
    "dtype-not-a-string": ({"a": _entry(dtype=["F32"])}, b"\0" * 8, {}, ["'a'"]),
    "negative-dim": ({"a": _entry(shape=(-2,))}, b"\0" * 8, {}, ["'a'"]),
    "float-dim": ({"a": _entry(shape=(2.0,))}, b"\0" * 8, {}, ["'a'"]),
    "bool-dim": ({"a": _entry(shape=(True, 2))}, b"\0" * 8, {}, ["'a'"]),
    "shape-not-a-list": ({"a": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}}, b"\0" * 8, {}, ["'a'"]),
    "offsets-three-numbers": ({"a": _entry(offs=(0, 4, 8))}, b"\0" * 8, {}, ["'a'"]),
    "offsets-outside-data": ({"a": _entry(offs=(0, 16), shape=(4,))}, b"\0" * 8, {}, ["'a'", "outside"]),
    "offsets-negative": ({"a": _entry(offs=(-8, 0))}, b"\0" * 8, {}, ["'a'"]),
    "offsets-reversed": ({"a": _entry(offs=(8, 0), shape=(0,))}, b"\0" * 8, {}, ["'a'"]),
    "byte-count-vs-shape": ({"a": _entry(shape=(3,))}, b"\0" * 8, {}, ["'a'", "[3]"]),
    "huge-dim": ({"a": _entry(shape=(2 ** 70,))}, b"\0" * 8, {}, ["'a'"]),
    "dims-overflow-int64-to-zero": ({"a": _entry(shape=(2 ** 40, 2 ** 40), offs=(0, 0))}, b"", {}, ["'a'"]),
    "fp4-half-byte": ({"a": _entry(dtype="F4", shape=(3,), offs=(0, 2))}, b"\0" * 2, {}, ["'a'"]),
    "overlapping-tensors": ({"a": _entry(offs=(0, 8)), "b": _entry(offs=(4, 12))}, b"\0" * 12, {}, ["'a'", "'b'"]),
    "same-range-twice": ({"a": _entry(offs=(0, 8)), "b": _entry(offs=(0, 8))}, b"\0" * 8, {}, ["'a'", "'b'"]),
    "hole-between-tensors": ({"a": _entry(offs=(0, 8)), "b": _entry(offs=(12, 20))}, b"\0" * 20, {}, ["'b'"]),
    "trailing-bytes": ({"a": _entry(offs=(0, 8))}, b"\0" * 12, {}, ["trailing"]),
    "deeply-nested-json": (None, b"", {"raw_header": b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"}, ["header"]),
    "int-too-long-for-python": (None, b"", {"raw_header": b'{"a": {"dtype": "F32", "shape": [' + b"9" * 5000
                                                          + b'], "data_offsets": [0, 0]}}'}, ["header"]),
}


@pytest.mark.parametrize("case", list(STRICT_CASES))
def test_malformed_file_raises_format_error_naming_file_and_tensor(tmp_path, case):
    header, data, kw, needles = STRICT_CASES[case]
    p = _file(tmp_path / f"{case}.safetensors", header, data, **kw)
    with pytest.raises(FormatError) as e:
        load_tensors(p)
    msg = str(e.value)
    assert str(p) in msg
    for s in needles:
        assert s in msg, (s, msg)


def test_bool_bytes_other_than_0_1_are_rejected(tmp_path):
    p = _file(tmp_path / "b.safetensors", {"flags": _entry(dtype="BOOL", shape=(3,), offs=(0, 3))}, b"\x00\x01\x02")
    with pytest.raises(FormatError) as e:
        load_tensors(p)
    assert str(p) in str(e.value) and "'flags'" in str(e.value)


@pytest.mark.parametrize("cut", [0, 5, 8, 9, 40, len(VALID) - 1, len(VALID) - 16])
def test_truncated_file(tmp_path, cut):
    p = tmp_path / "t.safetensors"
    p.write_bytes(VALID[:cut])
    with pytest.raises(FormatError) as e:
        load_tensors(p)
    assert str(p) in str(e.value)
    n = struct.unpack("<Q", VALID[:8])[0]
    if cut >= len(VALID) - 16:  # the header survives: a tensor whose bytes are cut off is named
        hdr = json.loads(VALID[8: 8 + n])
        cut_off = [k for k in hdr if k != "__metadata__" and hdr[k]["data_offsets"][1] > cut - 8 - n]
        assert cut_off and any(repr(k) in str(e.value) for k in cut_off)


def test_valid_reference_file_reads():
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "v.safetensors"
        p.write_bytes(VALID)
        got = load_tensors(p)
    assert set(got) == {"w", "b", "s", "e", "q", "f"}
    assert got["f"].data.tolist() == [True, False, True]
    assert got["s"].shape == () and got["s"].data.item() == 7
    assert got["e"].shape == (0, 2)


@contextmanager
def _no_unpickling(monkeypatch):
    def forbidden(*a, **k):
        raise AssertionError("tensorfile must never unpickle")

    class Forbidden(pickle.Unpickler):
        def __init__(self, *a, **k):
            forbidden()

    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", Forbidden)
    yield


def test_never_unpickles(tmp_path, monkeypatch):
    pt = tmp_path / "model.safetensors"
    torch.save({"w": torch.ones(2)}, str(pt))  # a pickle (zip) file under a safetensors name
    with _no_unpickling(monkeypatch):
        with pytest.raises(FormatError):
            load_tensors(pt)
        p = tmp_path / "v.safetensors"
        p.write_bytes(VALID)
        got = load_tensors(p)
        save_tensors(tmp_path / "w.safetensors", got)
    assert all(t.data.dtype != object for t in got.values())


def test_header_is_parsed_without_reading_tensor_data(tmp_path):
    """TensorFile reads only the header up front (lazy); a corrupt value never crashes it."""
    p = tmp_path / "v.safetensors"
    p.write_bytes(VALID)
    tf = TensorFile(p)
    assert set(tf.keys()) == {"w", "b", "s", "e", "q", "f"}
    assert tf.metadata == {"k": "v"}


# -- fuzzing -------------------------------------------------------------------------------------
class _Hang(Exception):
    pass


@contextmanager
def _deadline(seconds: float):
    def on_alarm(*_):
        raise _Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _read_all(path: Path):
    """Read like the emulator does: header, then every tensor. Returns {name: (dtype, raw bytes)}."""
    out = {}
    tf = TensorFile(path)
    for k in tf.keys():
        t = tf.get(k)
        assert t.dtype == tf.header[k]["dtype"]
        out[k] = t
    return out


def _reference_bytes(path: Path) -> dict:
    with safetensors.safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _same_content(ours: dict, ref: dict) -> bool:
    if set(ours) != set(ref):
        return False
    for k, t in ours.items():
        r = ref[k]
        if t.dtype == "BF16":
            if not np.array_equal(t.data.view(np.uint32), r.float().numpy().view(np.uint32)):
                return False
        elif r.dtype in (torch.uint16, torch.uint32, torch.uint64):
            if t.data.tobytes() != r.contiguous().view(torch.uint8).numpy().tobytes():
                return False
        elif t.data.tobytes() != r.contiguous().numpy().tobytes():
            return False
    return True


def _check_mutant(blob: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "m.safetensors"
        p.write_bytes(blob)
        with _deadline(5.0):
            try:
                ours = _read_all(p)
            except FormatError as e:
                assert str(p) in str(e)
                return
        # accepted by the strict reader: the reference library must agree, byte for byte
        ref = _reference_bytes(p)
        assert _same_content(ours, ref)


_fuzz = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
                 deadline=None)


@_fuzz
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8),
       st.one_of(st.none(), st.integers(0, len(VALID))))
def test_fuzz_byte_mutations(mutations, cut):
    blob = bytearray(VALID)
    header_end = 8 + struct.unpack("<Q", VALID[:8])[0]
    for pos, val in mutations:
        # half the mutations land in the 8-byte length or the JSON header, where the parsing happens
        if pos % 2:
            pos = pos % header_end
        blob[pos] = val
    if cut is not None:
        blob = blob[:cut]
    _check_mutant(bytes(blob))


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats(allow_nan=True) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)


@_fuzz
@given(st.sampled_from(["w", "b", "s", "e", "q", "f", "__metadata__"]),
       st.sampled_from(["dtype", "shape", "data_offsets", None]),
       _json)
def test_fuzz_header_values(name, field, value):
    """Replace one header field (or a whole entry) with a random JSON value."""
    n = struct.unpack("<Q", VALID[:8])[0]
    header = json.loads(VALID[8: 8 + n])
    if field is None or name == "__metadata__":
        header[name] = value
    else:
        header[name][field] = value
    hj = json.dumps(header).encode()
    _check_mutant(struct.pack("<Q", len(hj)) + hj + VALID[8 + n:])
