"""Compact, lossless storage of each judged case's output and intervals (outputs/<backend>.safetensors).

Semantics and field list: docs/certification.md#outputs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np

from emulator.errors import QconformError

from conformance.certify.identity import OUTPUTS_FORMAT

__all__ = ["StoredCase", "encode_case", "decode_case", "load_outputs", "pack_outputs", "safe_label", "case_key", "decode_quantized"]

_WIDTH = {"bfloat16": 16, "float16": 16, "float32": 32}


# -- compact encoding of one case's output and interval ----------------------------------------------
def _from_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    if dtype == "float16":
        return bits.astype(np.uint16).view(np.float16).astype(np.float64)
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Same values, NaN where NaN, same sign of zero."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape or not np.array_equal(a, b, equal_nan=True):
        return False
    nn = ~np.isnan(a)
    return bool(np.array_equal(np.signbit(a[nn]), np.signbit(b[nn])))


def _to_bits(v, dtype: str) -> "np.ndarray | None":
    """The output dtype's bit patterns of ``v`` (uint16/uint32), or None where v is not on that grid."""
    if dtype not in _WIDTH:
        return None
    v64 = np.asarray(v, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "float16":
            bits = v64.astype(np.float16).view(np.uint16)
        else:
            b32 = v64.astype(np.float32).view(np.uint32)
            bits = (b32 >> np.uint32(16)).astype(np.uint16) if dtype == "bfloat16" else b32
    return bits if same_values(_from_bits(bits, dtype), v64) else None


def _ord(bits: np.ndarray, w: int) -> np.ndarray:
    """A bijection from w-bit float patterns to integers, monotone in value (-0 just below +0)."""
    b = bits.astype(np.int64)
    mag = b & ((1 << (w - 1)) - 1)
    return np.where((b >> (w - 1)) & 1, -mag - 1, mag)


def _unord(o: np.ndarray, w: int) -> np.ndarray:
    o = o.astype(np.int64)
    b = np.where(o < 0, (1 << (w - 1)) | (-o - 1), o)
    return b.astype(np.uint16 if w == 16 else np.uint32)


def _small_int(a: np.ndarray) -> np.ndarray:
    lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
    for t in (np.int8, np.int16, np.int32):
        if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max:
            return a.astype(t)
    return a.astype(np.int64)


def _offsets(values, ref_ord: np.ndarray, dtype: str) -> "np.ndarray | None":
    bits = _to_bits(values, dtype)
    if bits is None:
        return None
    return _ord(bits, _WIDTH[dtype]) - ref_ord


_PAIR_BITS = (1, 2, 4, 8)  # bits per field: an element's pair takes 2, 4, 8 or 16 bits


def pack_pair(t: dict, name: str, u: np.ndarray, v: np.ndarray) -> bool:
    """Store two small non-negative integer fields per element in k bits each (k = 1, 2, 4 or 8, the
    smallest file), ``<name><2k>`` (U8, or U16 for k = 8); elements whose fields do not fit are listed as
    exceptions (``<name>_xi`` index, ``_xu``/``_xv`` values). False (nothing stored) when more than a
    quarter of the elements would be exceptions at every k."""
    u = u.reshape(-1).astype(np.int64)
    v = v.reshape(-1).astype(np.int64)
    n = u.size
    best = None
    for k in _PAIR_BITS:
        top = (1 << k) - 1
        ok = (u >= 0) & (u <= top) & (v >= 0) & (v <= top)
        n_bad = int(n - ok.sum())
        if n_bad > n // 4:
            continue
        cost = (n * 2 * k + 7) // 8 + n_bad * 8
        if best is None or cost < best[0]:
            best = (cost, k, ok)
    if best is None:
        return False
    _, k, ok = best
    code = np.where(ok, (u << k) | v, 0)
    if k == 8:
        packed = code.astype(np.uint16)
    else:
        per = 8 // (2 * k)  # elements per byte
        code = np.concatenate([code, np.zeros((-n) % per, np.int64)]).reshape(-1, per)
        packed = np.zeros(code.shape[0], np.int64)
        for i in range(per):
            packed |= code[:, i] << (2 * k * (per - 1 - i))
        packed = packed.astype(np.uint8)
    t[f"{name}{2 * k}"] = packed
    bad = np.flatnonzero(~ok)
    if bad.size:
        t[name + "_xi"] = bad.astype(np.uint16 if n <= 65536 else np.int32)
        t[name + "_xu"] = _small_int(u[bad])
        t[name + "_xv"] = _small_int(v[bad])
    return True


def unpack_pair(t: dict, name: str, shape: tuple) -> "tuple[np.ndarray, np.ndarray] | None":
    n = int(np.prod(shape)) if shape else 1
    key = next((f"{name}{2 * k}" for k in _PAIR_BITS if f"{name}{2 * k}" in t), None)
    if key is None:
        return None
    k = int(key[len(name):]) // 2
    p = t[key].astype(np.int64)
    if k == 8:
        code = p
    else:
        per = 8 // (2 * k)
        mask = (1 << (2 * k)) - 1
        code = np.stack([(p >> (2 * k * (per - 1 - i))) & mask for i in range(per)], axis=1).reshape(-1)
    code = code[:n]
    u, v = code >> k, code & ((1 << k) - 1)
    if name + "_xi" in t:
        idx = t[name + "_xi"].astype(np.int64)
        u[idx] = t[name + "_xu"].astype(np.int64)
        v[idx] = t[name + "_xv"].astype(np.int64)
    return u.reshape(shape), v.reshape(shape)


@dataclasses.dataclass(frozen=True)
class StoredCase:
    """One judged case as a certification bundle keeps it: the arrays and labels the verdict was decided on.

    ``y``: the observed output; ``y_ref``, ``lo``, ``hi``, ``y_exact``: the declared reference rounded to
    ``out_dtype``, the outward interval and the exact reference; ``bound_positive``: whether the judged bound
    is anywhere above zero; ``judged``: (jlo, jhi), the judged interval where narrower than [lo, hi]; ``tie``:
    (tlo, thi, ties) of the activation tie flips; ``alt``: (rule name, alo, ahi) of another tie rule.
    """

    y: np.ndarray
    y_ref: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    y_exact: np.ndarray
    out_dtype: str
    bound_positive: bool
    judged: tuple | None = None
    tie: tuple | None = None
    alt: tuple | None = None


def encode_case(case: StoredCase) -> tuple[dict, dict]:
    """(tensors, meta) storing one case's observed output and accepted interval, losslessly for verdicts.

    All values of the output dtype are kept as steps on its grid (an integer order of its bit patterns,
    -0 one step below +0) relative to the reference y_ref:

    - ``ref``: y_ref as raw bits of the output dtype (U16/U32);
    - the outward interval [lo, hi]: ``lh2``/``lh4``/``lh8``/``lh16`` (the pair (ref - lo, hi - ref) in
      1, 2, 4 or 8 bits a field, outliers in ``lh_x*``), else ``lo``/``hi`` offsets (smallest int type),
      else ``lo_v``/``hi_v`` F64;
    - the judged interval [jlo, jhi] (what ``conformance.judge.verdict.decide`` tests insideness against, when
      narrower than [lo, hi]: a kernel that rounds once, as declared, cannot reach the outward
      neighbour): ``jd2``..``jd16`` (the pair (jlo - lo, hi - jhi)), else ``jlo``/``jhi`` offsets,
      else ``jlo_v``/``jhi_v``; absent (meta ``judged`` false) when it equals [lo, hi];
    - the observed y: nothing when it equals y_ref bit for bit (meta ``y_is_ref``), else ``y_idx``/
      ``y_off`` (sparse: the elements that differ), ``y_off`` dense, or ``y_v`` (F32, the worker's values
      as written) when y is not on the output grid;
    - ``exf`` (U8) only where y_exact's finiteness differs from y_ref's (overflow); ``exv`` (F64) where a
      non-finite y_exact is not y_ref's value;
    - ``tlo``/``thi`` + ``ties`` (per row): the judged interval widened by activation tie flips;
      ``alo``/``ahi``: the judged interval of another tie rule that explains the output (meta ``alt``).

    y_exact itself is not kept (8 bytes an element): SQNR is re-checked by ``verify_bundle(deep=True)``.
    Typical cost: 2.5 bytes an element (2 for ref, 1/4 + 1/4 for the two intervals).
    """
    y, lo, hi, out_dtype, judged = case.y, case.lo, case.hi, case.out_dtype, case.judged
    y_ref = np.asarray(case.y_ref, np.float64)
    shape = y_ref.shape
    t: dict = {}
    meta: dict = {"dtype": out_dtype, "shape": list(shape), "bound_positive": bool(case.bound_positive)}
    ref_bits = _to_bits(y_ref, out_dtype)
    ref_ord = None if ref_bits is None else _ord(ref_bits, _WIDTH[out_dtype])

    def offs(values):
        return None if ref_ord is None else _offsets(values, ref_ord, out_dtype)

    lo_off, hi_off = offs(lo), offs(hi)
    if ref_ord is None:  # an output dtype without a grid encoding here: dense float64
        meta["dense"] = True
        t["ref_v"] = y_ref
    else:
        t["ref"] = ref_bits
    _put_interval(t, "", lo, hi, lo_off, hi_off,
                  pack=None if lo_off is None or hi_off is None else ("lh", -lo_off, hi_off))
    if judged is not None and not (same_values(judged[0], lo) and same_values(judged[1], hi)):
        meta["judged"] = True
        jlo_off, jhi_off = offs(judged[0]), offs(judged[1])
        pack = None
        if not any(o is None for o in (jlo_off, jhi_off, lo_off, hi_off)):
            pack = ("jd", jlo_off - lo_off, hi_off - jhi_off)
        _put_interval(t, "j", judged[0], judged[1], jlo_off, jhi_off, pack=pack)
    y_off = offs(y) if np.asarray(y).shape == shape else None
    if y_off is None:
        t["y_v"] = np.asarray(y, np.float32)
    else:
        nz = np.flatnonzero(y_off)
        if nz.size == 0:
            meta["y_is_ref"] = True
        elif nz.size <= y_off.size // 8:
            t["y_idx"] = nz.astype(np.uint16 if y_off.size <= 65536 else np.int32)
            t["y_off"] = _small_int(y_off.reshape(-1)[nz])
        else:
            t["y_off"] = _small_int(y_off)
    ex = np.asarray(case.y_exact, np.float64)
    exf = np.isfinite(ex)
    if not np.array_equal(exf, np.isfinite(y_ref)):
        t["exf"] = exf.astype(np.uint8)
    if not same_values(np.where(exf, 0.0, ex), np.where(exf, 0.0, y_ref)):
        t["exv"] = np.where(exf, 0.0, ex)
    if case.tie is not None:
        tlo, thi, ties = case.tie
        _put_interval(t, "t", tlo, thi, offs(tlo), offs(thi), pack=None)
        t["ties"] = np.asarray(ties, np.int64)
        meta["tie"] = True
    if case.alt is not None:
        name, alo, ahi = case.alt
        _put_interval(t, "a", alo, ahi, offs(alo), offs(ahi), pack=None)
        meta["alt"] = name
    return t, meta


def _put_interval(t: dict, prefix: str, lo, hi, lo_off, hi_off, *, pack) -> None:
    if pack is not None and pack_pair(t, *pack):
        return
    if lo_off is None or hi_off is None:
        t[prefix + "lo_v"] = np.asarray(lo, np.float64)
        t[prefix + "hi_v"] = np.asarray(hi, np.float64)
    else:
        t[prefix + "lo"] = _small_int(lo_off)
        t[prefix + "hi"] = _small_int(hi_off)


def _get_interval(t: dict, prefix: str, ref_ord, dtype: str, shape: tuple):
    if prefix + "lo_v" in t:
        return t[prefix + "lo_v"].astype(np.float64), t[prefix + "hi_v"].astype(np.float64)
    w = _WIDTH[dtype]
    lo_off, hi_off = t[prefix + "lo"].astype(np.int64), t[prefix + "hi"].astype(np.int64)
    return _from_bits(_unord(ref_ord + lo_off, w), dtype), _from_bits(_unord(ref_ord + hi_off, w), dtype)


def decode_case(t: dict, meta: dict) -> dict:
    """The arrays ``encode_case`` stored: y, y_ref, lo, hi, jlo, jhi (float64), y_exact_proxy, tie/alt intervals.

    ``y_exact_proxy`` equals y_exact wherever y_exact is non-finite and is finite exactly where y_exact is:
    all the judge needs from y_exact besides SQNR.
    """
    dtype = meta["dtype"]
    shape = tuple(meta["shape"])
    out = {}
    if meta.get("dense"):
        ref = t["ref_v"].astype(np.float64).reshape(shape)
        ref_ord = None
    else:
        ref = _from_bits(t["ref"], dtype).reshape(shape)
        ref_ord = _ord(t["ref"], _WIDTH[dtype]).reshape(shape)
    w = _WIDTH.get(dtype)

    def from_ord(o):
        return _from_bits(_unord(o, w), dtype)

    pair = unpack_pair(t, "lh", shape)
    if pair is not None:
        lo_o, hi_o = ref_ord - pair[0], ref_ord + pair[1]
        out["lo"], out["hi"] = from_ord(lo_o), from_ord(hi_o)
    else:
        out["lo"], out["hi"] = _get_interval(t, "", ref_ord, dtype, shape)
        lo_o = hi_o = None
    out["jlo"], out["jhi"] = out["lo"], out["hi"]
    if meta.get("judged"):
        pair = unpack_pair(t, "jd", shape)
        if pair is not None:
            if lo_o is None:
                lo_o = _ord(_to_bits(out["lo"], dtype), w)
                hi_o = _ord(_to_bits(out["hi"], dtype), w)
            out["jlo"], out["jhi"] = from_ord(lo_o + pair[0]), from_ord(hi_o - pair[1])
        else:
            out["jlo"], out["jhi"] = _get_interval(t, "j", ref_ord, dtype, shape)
    if meta.get("y_is_ref"):
        out["y"] = ref.copy()
    elif "y_v" in t:
        out["y"] = t["y_v"].astype(np.float64)
    elif "y_idx" in t:
        off = np.zeros(ref.size, np.int64)
        off[t["y_idx"].astype(np.int64)] = t["y_off"].astype(np.int64)
        out["y"] = from_ord(ref_ord + off.reshape(shape))
    else:
        out["y"] = from_ord(ref_ord + t["y_off"].astype(np.int64))
    out["y_ref"] = ref
    exf = t["exf"].astype(bool) if "exf" in t else np.isfinite(ref)
    big = np.finfo(np.float64).max
    proxy = np.where(np.isfinite(ref), ref, np.where(ref > 0, big, -big))  # finite stand-in where ref overflowed
    nonfinite_value = t["exv"] if "exv" in t else ref
    out["y_exact_proxy"] = np.where(exf, proxy, nonfinite_value)
    if meta.get("tie"):
        out["tlo"], out["thi"] = _get_interval(t, "t", ref_ord, dtype, shape)
        out["ties"] = t["ties"].astype(np.int64)
    if meta.get("alt"):
        out["alo"], out["ahi"] = _get_interval(t, "a", ref_ord, dtype, shape)
    return out



# -- one file per backend ------------------------------------------------------------------------------
def safe_label(label: str) -> str:
    s = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)[:60]
    return f"{s}-{hashlib.sha256(label.encode()).hexdigest()[:8]}"


def case_key(case_id: str) -> str:
    return hashlib.sha256(case_id.encode()).hexdigest()[:32]


def pack_outputs(staging: Path, label: str, index: dict[str, int], dest: Path) -> int:
    """One safetensors file per backend: tensors '<n>.<field>' (n: the case's position in cases.txt)."""
    from emulator.tensorfile import TensorFile, save_tensors

    tensors, cases = {}, {}
    d = staging / safe_label(label)
    for f in sorted(d.glob("*.safetensors")) if d.is_dir() else []:
        tf = TensorFile(f)
        cid = tf.metadata["case_id"]
        if cid not in index:
            continue
        n = index[cid]
        cases[str(n)] = dict(json.loads(tf.metadata["meta"]), case_id=cid)
        for k in tf.keys():
            tensors[f"{n:06d}.{k}"] = tf.get(k).data
    dest.parent.mkdir(parents=True, exist_ok=True)
    save_tensors(dest, tensors, metadata={"format": OUTPUTS_FORMAT, "backend": label,
                                         "cases": json.dumps(cases, sort_keys=True, separators=(",", ":"))})
    return len(cases)


def load_outputs(path: "str | Path") -> tuple[str, dict]:
    """(backend label, {case_id: decoded arrays + 'meta'}) of one outputs/<backend>.safetensors file."""
    from emulator.tensorfile import TensorFile

    tf = TensorFile(path)
    if tf.metadata.get("format") != OUTPUTS_FORMAT:
        raise QconformError(f"{path}: not a qconform outputs file (format {tf.metadata.get('format')!r})")
    cases = json.loads(tf.metadata.get("cases", "{}"))
    grouped: dict[str, dict] = {}
    for k in tf.keys():
        n, field = k.split(".", 1)
        grouped.setdefault(str(int(n)), {})[field] = tf.get(k).data
    out = {}
    for n, meta in cases.items():
        out[meta["case_id"]] = {"meta": meta, "n": int(n), "tensors": grouped.get(n, {})}
    for n in grouped:
        if n not in cases:
            raise QconformError(f"{path}: tensors for case #{n} that the index does not list")
    return tf.metadata.get("backend", ""), out



def decode_quantized(entry: dict) -> "tuple[dict, dict]":
    """(observed, expected) tensors of one quantize-only case of an outputs file (``load_outputs``):
    ``obs.<name>`` and ``exp.<name>`` as the index entry lists them; a tensor it does not list is an error."""
    meta, t = entry["meta"], entry["tensors"]
    obs = {k: t[f"obs.{k}"] for k in meta.get("observed") or []}
    exp = {k: t[f"exp.{k}"] for k in meta.get("expected") or []}
    stray = sorted(set(t) - {f"obs.{k}" for k in obs} - {f"exp.{k}" for k in exp})
    if stray:
        raise ValueError(f"tensors {', '.join(stray)} that the case's index does not list")
    return obs, exp
