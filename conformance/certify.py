"""Certification bundles: a run that can be re-checked offline, anywhere.

Semantics and file layout: docs/certification.md.

    qconform certify --backend B [--out DIR] [--profile certification]   # run, then write the bundle
    qconform verify-bundle DIR [--deep]                                  # re-check it offline

A bundle holds the run's results JSONL, the reports, the ordered case list and its hash,
suite / emulator versions, the golden manifest and its hash, the environment, the waivers
given and applied, the declared arithmetic per backend and scheme, and - per judged case -
the observed output and the accepted interval (compactly, in one safetensors file per
backend: see ``encode_case``). ``MANIFEST.json`` lists the sha256 of every other file.

``verify_bundle`` re-checks every hash, that the results cover exactly the case list, and
recomputes every verdict (and the exact metrics) from the stored outputs and intervals:
a bundle edited by hand fails. ``deep=True`` also rebuilds each case's inputs from its id,
recomputes the intervals with this checkout's emulator and re-judges (SQNR and tie counts
included).

Python API (what other tools call; docs/certification.md#python-api):

    from conformance.certify import certify, verify_bundle, add_files
    res = certify(["mykernel"], "bundle-dir", profile="smoke", schemes=["w8a8"])
    res.ok, res.manifest_sha256, res.path
    v = verify_bundle("bundle-dir"); v.ok, v.problems
    add_files("bundle-dir", {"fingerprint.json": b"..."})   # extra/<name>, then re-seals MANIFEST.json
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from emulator import __version__ as emulator_version
from emulator.errors import QconformError

__all__ = ["BUNDLE_FORMAT", "CertifyResult", "VerifyResult", "certify", "verify_bundle", "add_files",
           "encode_case", "decode_case", "load_outputs", "register", "suite_code_sha256", "suite_identity",
           "version_mismatch"]

BUNDLE_FORMAT = "qconform-certification-bundle/1"
OUTPUTS_FORMAT = "qconform-outputs/1"
MANIFEST = "MANIFEST.json"
STAGING = ".staging"
RECOMPUTABLE = ("pass", "pass-with-tie-flips", "quality-warning", "mistrusted", "fail")
BAD = ("fail", "crash", "timeout")
_WIDTH = {"bfloat16": 16, "float16": 16, "float32": 32}

#: the sources whose code decides cases, intervals, verdicts and metrics (hashed into ``suite_code_sha256``);
#: reports, fingerprints, the CLI and test helpers are left out: they do not change what a bundle records
_SUITE_SOURCES = ("conformance/acceptance.py", "conformance/bundle.py", "conformance/cases.py",
                  "conformance/certify.py", "conformance/generators.py", "conformance/golden.py",
                  "conformance/oracles.py", "conformance/runner.py", "conformance/suite.py", "conformance/worker.py",
                  "emulator", "backends/base.py")


# -- which suite wrote a bundle ----------------------------------------------------------------------------
_CODE_SHA: "str | None" = None


def suite_code_sha256() -> str:
    """sha256 over the suite's judging sources (``_SUITE_SOURCES``: the case, interval, verdict and bundle
    modules of conformance/, all of emulator/, backends/base.py): path and bytes of each .py file.

    The package version alone does not change when the judging code does; this hash does. It is
    computed from the files of the running checkout or installation (cached per process).
    """
    global _CODE_SHA
    if _CODE_SHA is None:
        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        paths = []
        for src in _SUITE_SOURCES:
            p = root / src
            paths += sorted(p.rglob("*.py")) if p.is_dir() else ([p] if p.is_file() else [])
        for p in sorted(paths, key=lambda q: q.relative_to(root).as_posix()):
            rel = p.relative_to(root).as_posix().encode()
            data = p.read_bytes()
            h.update(len(rel).to_bytes(4, "little") + rel + len(data).to_bytes(8, "little") + data)
        _CODE_SHA = h.hexdigest()
    return _CODE_SHA


def suite_identity() -> dict:
    """The running suite: package version, emulator version, git commit (when a checkout), code hash."""
    from .commands import _git_commit, suite_version

    return {"suite_version": suite_version(), "emulator_version": emulator_version, "git_commit": _git_commit(),
            "suite_code_sha256": suite_code_sha256()}


def describe_suite(ident: dict) -> str:
    """'qconform 0.1.0 (emulator 0.1.0, commit 1a2b3c4d5e6f, code 5e6f7a8b9c0d)' for messages."""
    parts = [f"emulator {ident.get('emulator_version') or '?'}"]
    if ident.get("git_commit"):
        parts.append(f"commit {str(ident['git_commit'])[:12]}" + ("-dirty" if str(ident["git_commit"])
                                                                   .endswith("-dirty") else ""))
    code = ident.get("suite_code_sha256")
    parts.append(f"code {code[:12]}" if code else "no code hash recorded: a suite older than this check")
    return f"qconform {ident.get('suite_version') or 'checkout'} ({', '.join(parts)})"


def version_mismatch(meta: dict, running: dict) -> "str | None":
    """One line naming both suites when the bundle was written by another suite than the running one."""
    recorded = {k: meta.get(k) for k in ("suite_version", "emulator_version", "git_commit", "suite_code_sha256")}
    same = (recorded["suite_code_sha256"] is not None
            and recorded["suite_code_sha256"] == running["suite_code_sha256"]
            and recorded["suite_version"] == running["suite_version"]
            and recorded["emulator_version"] == running["emulator_version"])
    if same:
        return None
    how = (f"check out commit {str(recorded['git_commit']).removesuffix('-dirty')[:12]}"
           if recorded.get("git_commit") else "install the suite that wrote it")
    return (f"bundle written by {describe_suite(recorded)}, this is {describe_suite(running)}: a bundle is "
            f"verified by the suite version that wrote it ({how}; --any-version recomputes anyway)")


# -- compact encoding of one case's output and interval ----------------------------------------------
def _from_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    if dtype == "float16":
        return bits.astype(np.uint16).view(np.float16).astype(np.float64)
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
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
    return bits if _same(_from_bits(bits, dtype), v64) else None


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


def _pack_pair(t: dict, name: str, u: np.ndarray, v: np.ndarray) -> bool:
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


def _unpack_pair(t: dict, name: str, shape: tuple) -> "tuple[np.ndarray, np.ndarray] | None":
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


def encode_case(y, y_ref, lo, hi, y_exact, out_dtype: str, *, bound_positive: bool, judged=None, tie=None,
                alt=None) -> tuple[dict, dict]:
    """(tensors, meta) storing one case's observed output and accepted interval, losslessly for verdicts.

    All values of the output dtype are kept as steps on its grid (an integer order of its bit patterns,
    -0 one step below +0) relative to the reference y_ref:

    - ``ref``: y_ref as raw bits of the output dtype (U16/U32);
    - the outward interval [lo, hi]: ``lh2``/``lh4``/``lh8``/``lh16`` (the pair (ref - lo, hi - ref) in
      1, 2, 4 or 8 bits a field, outliers in ``lh_x*``), else ``lo``/``hi`` offsets (smallest int type),
      else ``lo_v``/``hi_v`` F64;
    - the judged interval [jlo, jhi] (what ``conformance.runner.judge`` tests insideness against, when
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
    y_ref = np.asarray(y_ref, np.float64)
    shape = y_ref.shape
    t: dict = {}
    meta: dict = {"dtype": out_dtype, "shape": list(shape), "bound_positive": bool(bound_positive)}
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
    if judged is not None and not (_same(judged[0], lo) and _same(judged[1], hi)):
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
    ex = np.asarray(y_exact, np.float64)
    exf = np.isfinite(ex)
    if not np.array_equal(exf, np.isfinite(y_ref)):
        t["exf"] = exf.astype(np.uint8)
    if not _same(np.where(exf, 0.0, ex), np.where(exf, 0.0, y_ref)):
        t["exv"] = np.where(exf, 0.0, ex)
    if tie is not None:
        tlo, thi, ties = tie
        _put_interval(t, "t", tlo, thi, offs(tlo), offs(thi), pack=None)
        t["ties"] = np.asarray(ties, np.int64)
        meta["tie"] = True
    if alt is not None:
        name, alo, ahi = alt
        _put_interval(t, "a", alo, ahi, offs(alo), offs(ahi), pack=None)
        meta["alt"] = name
    return t, meta


def _put_interval(t: dict, prefix: str, lo, hi, lo_off, hi_off, *, pack) -> None:
    if pack is not None and _pack_pair(t, *pack):
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

    pair = _unpack_pair(t, "lh", shape)
    if pair is not None:
        lo_o, hi_o = ref_ord - pair[0], ref_ord + pair[1]
        out["lo"], out["hi"] = from_ord(lo_o), from_ord(hi_o)
    else:
        out["lo"], out["hi"] = _get_interval(t, "", ref_ord, dtype, shape)
        lo_o = hi_o = None
    out["jlo"], out["jhi"] = out["lo"], out["hi"]
    if meta.get("judged"):
        pair = _unpack_pair(t, "jd", shape)
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


# -- recomputing a verdict from stored arrays (mirrors conformance.runner.judge) ---------------------
def offline_verdict(d: dict, bound_positive: bool, out_dtype: str) -> dict:
    """Verdict and exact metrics from decoded arrays, as ``conformance.runner.judge`` decides them.

    Insideness against the judged interval [jlo, jhi]; error/bound ratios, ULP distance, the worst
    element and the quality warning against the outward interval [lo, hi]; outside: another tie
    rule's interval (stored) -> fail, the tie-flip interval (stored) -> pass-with-tie-flips, else fail.
    """
    from .acceptance import Interval, compare

    y = d["y"]
    ex = d["y_exact_proxy"]
    bound = np.array([1.0 if bound_positive else 0.0])
    loose = Interval(y_ref=d["y_ref"], y_exact=ex, lo=d["lo"], hi=d["hi"], bound=bound, out_dtype=out_dtype)
    judged = Interval(y_ref=d["y_ref"], y_exact=ex, lo=d["jlo"], hi=d["jhi"], bound=bound, out_dtype=out_dtype)
    cmp = compare(y, loose)
    cmp_j = compare(y, judged)
    rec = {"max_ratio": cmp.max_ratio, "max_ulp": cmp.max_ulp, "n_outside": cmp_j.n_out,
           "exact_match": cmp.exact_match, "worst": list(cmp.worst) if cmp.worst else None, "tie_flips": 0}
    ref = d["y_ref"]
    finite = np.isfinite(ref)
    degenerate = (not finite.any()) or bool(np.all(ref[finite] == 0)) or (ref.size > 1 and np.unique(ref[finite]).size <= 1)
    y64 = np.asarray(y, np.float64)
    nan_ref = np.isnan(ex)
    if cmp_j.ok:
        if degenerate:
            return dict(rec, verdict="mistrusted")
        fin = np.isfinite(ex)
        with np.errstate(invalid="ignore"):
            side = np.where(y64 >= loose.y_ref, loose.hi - loose.y_ref, loose.y_ref - loose.lo)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(y64 == loose.y_ref, 0.0, np.abs(y64 - loose.y_ref) / side)
        ratio = ratio[fin & np.isfinite(ratio)]
        if ratio.size and bound_positive and ratio.mean() > 0.5 and ratio.max() > 0.9:
            return dict(rec, verdict="quality-warning")
        return dict(rec, verdict="pass")
    nonfinite_ref = ~np.isfinite(ex)
    same_nonfinite = (nan_ref & np.isnan(y64)) | (np.isinf(ex) & (y64 == ex))
    if "alo" in d:
        with np.errstate(invalid="ignore"):
            inside_alt = np.where(nonfinite_ref, same_nonfinite, (y64 >= d["alo"]) & (y64 <= d["ahi"]))
        if inside_alt.all():
            return dict(rec, verdict="fail", alt=True)
    if "tlo" in d:
        with np.errstate(invalid="ignore"):
            inside_decl = (y64 >= judged.lo) & (y64 <= judged.hi)
            inside_tie = ((y64 >= d["tlo"]) & (y64 <= d["thi"])) | (nan_ref & np.isnan(y64))
        if inside_tie.all():
            rows = np.nonzero(~(inside_decl | (nan_ref & np.isnan(y64))).all(axis=1))[0]
            rec["tie_flips"] = int(d["ties"][rows].sum())
            return dict(rec, verdict="pass-with-tie-flips")
    return dict(rec, verdict="fail")


# -- capturing outputs during the run ------------------------------------------------------------------
def _safe(label: str) -> str:
    s = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)[:60]
    return f"{s}-{hashlib.sha256(label.encode()).hexdigest()[:8]}"


def _case_key(case_id: str) -> str:
    return hashlib.sha256(case_id.encode()).hexdigest()[:32]


class _Stager:
    """Runner.on_output callback: encodes each judged output into DIR/.staging/<backend>/<case>.safetensors."""

    def __init__(self, folder: Path):
        self.folder = folder

    def __call__(self, label, spec, inp, declared, iv, y, rec) -> None:
        from emulator.tensorfile import save_tensors

        from . import runner as R
        from .acceptance import declared_interval, round_down, round_up

        # the interval the judge tests insideness against (conformance.runner.rounded_interval where the
        # runner narrows the outward interval to one declared rounding)
        narrow = getattr(R, "rounded_interval", lambda v, _d: v)
        jiv = narrow(iv, declared)
        tie = alt = None
        if rec["verdict"] in ("fail", "pass-with-tie-flips"):  # (called before waivers are applied)
            a = R._alternative_rule(inp, y, declared) if rec["verdict"] != "pass-with-tie-flips" else None
            if a is not None:
                axis, rule, _mine = a
                alt_decl = dataclasses.replace(declared, variants=dict(declared.variants, **{axis: rule}))
                aiv = narrow(declared_interval(inp, alt_decl), alt_decl)
                alt = (f"{axis}={rule}", aiv.lo, aiv.hi)
            elif np.isfinite(jiv.y_exact).all():
                widened = R._tie_widening(jiv, inp, declared)
                if widened is not None:
                    widen, ties_per_row = widened
                    with np.errstate(invalid="ignore"):
                        wide = narrow(dataclasses.replace(
                            jiv, lo=round_down(jiv.y_exact - jiv.bound - widen, jiv.out_dtype),
                            hi=round_up(jiv.y_exact + jiv.bound + widen, jiv.out_dtype), bound=jiv.bound + widen),
                            declared)
                    tie = (wide.lo, wide.hi, ties_per_row)
        tensors, meta = encode_case(y, iv.y_ref, iv.lo, iv.hi, iv.y_exact, iv.out_dtype,
                                    bound_positive=bool(jiv.bound.max(initial=0) > 0), judged=(jiv.lo, jiv.hi),
                                    tie=tie, alt=alt)
        d = self.folder / _safe(label)
        d.mkdir(parents=True, exist_ok=True)
        save_tensors(d / f"{_case_key(spec.case_id)}.safetensors", tensors,
                     metadata={"case_id": spec.case_id, "backend": label, "meta": json.dumps(meta)})


def _pack_outputs(staging: Path, label: str, index: dict[str, int], dest: Path) -> int:
    """One safetensors file per backend: tensors '<n>.<field>' (n: the case's position in cases.txt)."""
    from emulator.tensorfile import TensorFile, save_tensors

    tensors, cases = {}, {}
    d = staging / _safe(label)
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


# -- writing a bundle ------------------------------------------------------------------------------------
@dataclasses.dataclass
class CertifyResult:
    path: Path
    ok: bool  # every backend available, and no fail, crash or timeout (after waivers)
    n_results: int
    n_bad: int
    manifest_sha256: str  # the bundle's identity: sha256 of its MANIFEST.json
    counts: dict
    unavailable: dict = dataclasses.field(default_factory=dict)  # backend label -> why it could not run


def _sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_json(p: Path, obj) -> None:
    from .report import _json_safe

    p.write_text(json.dumps(_json_safe(obj), indent=1, sort_keys=True, allow_nan=False) + "\n", encoding="utf-8")


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink())


def _seal(folder: Path) -> str:
    """Write MANIFEST.json (sha256 and size of every other file); returns its own sha256."""
    files = {}
    for p in _files(folder):
        rel = p.relative_to(folder).as_posix()
        if rel == MANIFEST or rel.startswith(STAGING + "/"):
            continue
        files[rel] = {"sha256": _sha256_file(p), "bytes": p.stat().st_size}
    (folder / MANIFEST).write_text(json.dumps({"format": BUNDLE_FORMAT, "files": files}, indent=1, sort_keys=True)
                                   + "\n", encoding="utf-8")
    return _sha256_file(folder / MANIFEST)


def certify(backends: list[str], out: "str | Path" = "qconform-certification", *, profile: str = "certification",
            schemes=None, tiers=None, shard: str | None = None, waivers: "str | Path | None" = None, jobs: int = 1,
            timeout: float = 120.0, host_label: str | None = None, extra_files: dict | None = None,
            progress: bool = False, log=print) -> CertifyResult:
    """Run the suite on ``backends`` and write a certification bundle into ``out``.

    ``out`` must not hold a finished bundle (MANIFEST.json); a folder left by an interrupted
    certify is resumed. ``extra_files`` ({name: bytes | str | Path}) are stored under extra/.
    """
    from .commands import environment
    from .report import load_source, summarize_sources, write_reports
    from .runner import Runner, load_waivers, read_results
    from .suite import TIERS, case_list, list_hash, parse_shard
    from .suite import shard as do_shard

    folder = Path(out)
    if (folder / MANIFEST).exists():
        raise QconformError(f"{folder}: already holds a sealed bundle (MANIFEST.json); choose another --out")
    if not backends:
        raise ValueError("certify: give at least one --backend")
    from .selection import check_backends

    check_backends(backends)  # an unknown name or parameter: exit 2 before any case runs or any file is written
    tiers = tuple(tiers) if tiers else TIERS
    for t in tiers:
        if t not in TIERS:
            raise ValueError(f"unknown tier {t!r}; known: {', '.join(TIERS)}")
    specs = case_list(schemes=schemes or None, tiers=tiers, profile=profile)
    sh = parse_shard(shard)
    if sh:
        specs = do_shard(specs, *sh)
    if not specs:
        raise ValueError("certify: the selection has no cases")
    folder.mkdir(parents=True, exist_ok=True)
    ids = [s.case_id for s in specs]
    cases_txt = "".join(i + "\n" for i in ids)
    if (folder / "cases.txt").exists() and (folder / "cases.txt").read_text(encoding="utf-8") != cases_txt:
        raise QconformError(f"{folder}: holds an interrupted certification of another case list; choose another --out")
    (folder / "cases.txt").write_text(cases_txt, encoding="utf-8")
    case_hash = list_hash(specs)
    wv = load_waivers(waivers)
    env = environment()
    host = host_label or env.get("host") or "host"
    run_date = time.strftime("%Y-%m-%d")
    header = {"suite": "qconform", "emulator_version": emulator_version, "profile": profile, "tiers": list(tiers),
              "schemes": list(schemes) if schemes else "all", "backends": list(backends), "shard": shard,
              "case_count": len(specs), "case_list_sha256": case_hash, "environment": env,
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "waivers": [w.__dict__ for w in wv],
              "certify": True, "host_label": host, "waiver_date": run_date}
    staging = folder / STAGING
    runner = Runner(folder, timeout=timeout, jobs=jobs, waivers=wv, progress=progress, on_output=_Stager(staging))
    log(f"qconform certify: {len(specs)} case(s) x {len(backends)} backend(s) [{', '.join(backends)}], profile "
        f"{profile} -> {folder}")
    import warnings

    with warnings.catch_warnings():
        # NumPy's invalid-value warnings on the suite's deliberate NaN/Inf inputs are not findings
        warnings.simplefilter("ignore", RuntimeWarning)
        runner.run(list(backends), specs, resume=True, header=header)

    lines = read_results(runner.results_path)
    headers = [r for r in lines if r.get("kind") == "run"]
    blines = {r["backend"]: r for r in lines if r.get("kind") == "backend"}
    latest = {}
    for r in lines:
        if r.get("kind") == "result":
            latest[(r["backend"], r["case_id"])] = r
    labels = list(dict.fromkeys(r["backend"] for r in latest.values()))
    index = {cid: n for n, cid in enumerate(ids)}
    backends_info = {}
    for label in labels:
        rel = f"outputs/{_safe(label)}.safetensors"
        n = _pack_outputs(staging, label, index, folder / rel)
        b = blines.get(label, {})
        backends_info[label] = {"outputs": rel, "outputs_cases": n, "spec": b.get("spec"),
                                "version": b.get("version"), "device": b.get("device"),
                                "available": b.get("available"), "reason": b.get("reason")}
    shutil.rmtree(staging, ignore_errors=True)

    # declared arithmetic per backend and scheme: each distinct declaration with its case count
    declared: dict = {}
    for r in latest.values():
        if not r.get("declared"):
            continue
        slot = declared.setdefault(r["backend"], {}).setdefault(r["scheme"], [])
        for e in slot:
            if e["declared"] == r["declared"]:
                e["cases"] += 1
                break
        else:
            slot.append({"declared": r["declared"], "cases": 1, "example_case": r["case_id"]})
    _write_json(folder / "declared.json", declared)
    applied = [{"backend": r["backend"], "case_id": r["case_id"], "waived_verdict": r.get("waived_verdict"),
                "waiver": r.get("waiver")} for r in latest.values() if r["verdict"] == "waived"]
    expired = [{"backend": r["backend"], "case_id": r["case_id"], "waiver": r["waiver_expired"]}
               for r in latest.values() if r.get("waiver_expired")]
    stale = [{"backend": r["backend"], "case_id": r["case_id"], "waiver": r["unexpected_pass_of_waived_case"]}
             for r in latest.values() if r.get("unexpected_pass_of_waived_case")]
    given = []
    for h in headers:
        for w in h.get("waivers") or []:
            if w not in given:
                given.append(w)
    run_dates = sorted({h.get("waiver_date") or (h.get("time") or "")[:10] for h in headers} - {""})
    _write_json(folder / "waivers.json", {"given": given, "applied": applied, "expired": expired, "stale": stale,
                                          "dates": run_dates})
    _write_json(folder / "environment.json", dict(env, backends=list(blines.values())))
    from .golden import GOLDEN_DIR

    gm = GOLDEN_DIR / "MANIFEST.json"
    golden_sha = None
    if gm.exists():
        shutil.copyfile(gm, folder / "golden_manifest.json")
        golden_sha = _sha256_file(folder / "golden_manifest.json")
    for name, data in (extra_files or {}).items():
        _put_extra(folder, name, data)
    counts = Counter(r["verdict"] for r in latest.values())
    n_bad = sum(counts.get(v, 0) for v in BAD)
    # a backend that could not run certifies nothing: its cases are all 'unsupported', and no pass is claimed
    unavailable = {label: info.get("reason") or "unavailable" for label, info in backends_info.items()
                   if info.get("available") is False}
    bundle = {"format": BUNDLE_FORMAT, "suite_version": env.get("suite_version"), "emulator_version": emulator_version,
              "git_commit": env.get("git_commit"), "suite_code_sha256": suite_code_sha256(), "host_label": host, "profile": profile, "tiers": list(tiers),
              "schemes": list(schemes) if schemes else "all", "shard": shard, "case_count": len(specs),
              "case_list_sha256": case_hash, "cases_file": "cases.txt", "golden_manifest": "golden_manifest.json"
              if golden_sha else None, "golden_manifest_sha256": golden_sha, "backends": backends_info,
              "waiver_dates": run_dates, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "verdicts": dict(counts), "unavailable": unavailable, "ok": n_bad == 0 and not unavailable}
    _write_json(folder / "bundle.json", bundle)
    summary = summarize_sources([load_source(folder)])
    write_reports(folder, summary, title=f"qconform certification: {', '.join(labels)} on {host}")
    sha = _seal(folder)
    return CertifyResult(folder, n_bad == 0 and not unavailable, len(latest), n_bad, sha, dict(counts), unavailable)


def _put_extra(folder: Path, name: str, data) -> Path:
    if "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"extra file name {name!r}: a plain file name is required")
    p = folder / "extra" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, (bytes, bytearray)):
        p.write_bytes(bytes(data))
    elif isinstance(data, Path):
        shutil.copyfile(data, p)
    else:
        p.write_text(str(data), encoding="utf-8")
    return p


def add_files(bundle: "str | Path", files: dict) -> str:
    """Add files under extra/ of a bundle that verifies, then re-seal it; returns the new MANIFEST sha256."""
    folder = Path(bundle)
    res = verify_bundle(folder)
    if not res.ok:
        raise QconformError(f"{folder}: will not add files to a bundle that does not verify: {res.problems[0]}")
    for name, data in files.items():
        _put_extra(folder, name, data)
    return _seal(folder)


# -- verifying a bundle ----------------------------------------------------------------------------------
@dataclasses.dataclass
class VerifyResult:
    path: Path
    problems: list
    notes: list
    checked: dict
    manifest_sha256: str | None
    version_mismatch: "str | None" = None  # set when another suite version wrote the bundle

    @property
    def ok(self) -> bool:
        return not self.problems


def _expected_verdict(raw: str, rec: dict, waivers: list, dates: list) -> set:
    """The final verdicts ``raw`` can turn into under the bundle's waivers (a set: one per run date)."""
    from .suite import CaseSpec

    spec = CaseSpec.from_json(rec["spec"])
    match = next((w for w in waivers if w.matches(rec["backend"], spec)), None)
    if match is None:
        return {raw}
    out = set()
    for day in dates or [time.strftime("%Y-%m-%d")]:
        if match.expired(day):
            out.add(raw if raw in BAD else "fail")
        else:
            out.add("waived" if raw in BAD else raw)
    return out


def _num_equal(a, b) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return list(a) == list(b)
    fa, fb = float(a), float(b)
    return fa == fb or (np.isnan(fa) and np.isnan(fb))


def verify_bundle(bundle: "str | Path", *, deep: bool = False, any_version: bool = False) -> VerifyResult:
    """Re-check a bundle offline: hashes, case-list coverage, every verdict from stored outputs.

    Verdicts and metrics are recomputed only when the running suite is the one that wrote the
    bundle (same package and emulator version and ``suite_code_sha256``); otherwise the result
    has one problem naming both versions (``version_mismatch``) and the hashes and records are
    still checked. ``any_version=True`` recomputes anyway and keeps that line as a note.
    """
    from .runner import Waiver, read_results

    folder = Path(bundle)
    problems: list[str] = []
    notes: list[str] = []
    checked = Counter()
    res = VerifyResult(folder, problems, notes, checked, None)
    man_p = folder / MANIFEST
    if not man_p.is_file():
        problems.append(f"{MANIFEST}: missing (not a sealed certification bundle)")
        return res
    res.manifest_sha256 = _sha256_file(man_p)
    try:
        man = json.loads(man_p.read_text(encoding="utf-8"))
        listed = man["files"]
        if man.get("format") != BUNDLE_FORMAT:
            problems.append(f"{MANIFEST}: format {man.get('format')!r}, expected {BUNDLE_FORMAT!r}")
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        problems.append(f"{MANIFEST}: malformed ({e})")
        return res
    # 1. every file: present, same bytes; nothing unlisted
    for rel, entry in sorted(listed.items()):
        p = folder / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            problems.append(f"{rel}: path outside the bundle")
            continue
        if not p.is_file() or p.is_symlink():
            problems.append(f"{rel}: missing")
            continue
        checked["files"] += 1
        got = _sha256_file(p)
        if got != entry.get("sha256"):
            problems.append(f"{rel}: sha256 {got[:16]}... does not match MANIFEST.json's {str(entry.get('sha256'))[:16]}...")
    for p in _files(folder):
        rel = p.relative_to(folder).as_posix()
        if rel != MANIFEST and rel not in listed:
            problems.append(f"{rel}: not listed in MANIFEST.json")
    # 2. the bundle's own records agree with each other
    try:
        meta = json.loads((folder / "bundle.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        problems.append(f"bundle.json: unreadable ({e})")
        return res
    res.version_mismatch = version_mismatch(meta, suite_identity())
    recompute = res.version_mismatch is None or any_version
    if res.version_mismatch:
        (notes if any_version else problems).append(res.version_mismatch)
    cases_p = folder / meta.get("cases_file", "cases.txt")
    if not cases_p.is_file():
        problems.append("cases.txt: missing")
        return res
    ids = cases_p.read_text(encoding="utf-8").splitlines()
    case_hash = hashlib.sha256(cases_p.read_bytes()).hexdigest()
    if case_hash != meta.get("case_list_sha256"):
        problems.append(f"cases.txt: sha256 {case_hash[:16]}... is not bundle.json's case_list_sha256")
    if len(ids) != meta.get("case_count"):
        problems.append(f"cases.txt: {len(ids)} case(s), bundle.json says {meta.get('case_count')}")
    if meta.get("golden_manifest"):
        gp = folder / meta["golden_manifest"]
        if not gp.is_file():
            problems.append(f"{meta['golden_manifest']}: missing")
        else:
            g = _sha256_file(gp)
            if g != meta.get("golden_manifest_sha256"):
                problems.append(f"{meta['golden_manifest']}: sha256 {g[:16]}... is not bundle.json's "
                                "golden_manifest_sha256")
            from .golden import GOLDEN_DIR

            local = GOLDEN_DIR / "MANIFEST.json"
            if local.is_file() and _sha256_file(local) != g:
                msg = "the golden manifest differs from this checkout's golden/MANIFEST.json"
                (problems if deep else notes).append(msg + (" (deep: golden cases cannot be re-derived)" if deep
                                                            else " (another suite version?)"))
    lines = read_results(folder / "results.jsonl") if (folder / "results.jsonl").is_file() else None
    if lines is None:
        problems.append("results.jsonl: missing")
        return res
    headers = [r for r in lines if r.get("kind") == "run"]
    for h in headers:
        if h.get("case_list_sha256") != meta.get("case_list_sha256"):
            problems.append("results.jsonl: a run header's case_list_sha256 is not the bundle's")
    latest = {}
    for r in lines:
        if r.get("kind") == "result":
            latest[(r.get("backend"), r.get("case_id"))] = r
    backends = meta.get("backends") or {}
    idset = set(ids)
    for (b, cid) in latest:
        if b not in backends:
            problems.append(f"results.jsonl: a result for backend {b!r} that bundle.json does not list")
        if cid not in idset:
            problems.append(f"results.jsonl: a result for case {cid} that is not in cases.txt")
    for b in backends:
        missing = [cid for cid in ids if (b, cid) not in latest]
        if missing:
            problems.append(f"{b}: {len(missing)} case(s) of cases.txt have no result (first: {missing[0]})")
    try:
        wj = json.loads((folder / "waivers.json").read_text(encoding="utf-8"))
        waivers = [Waiver(**{k: str(w[k]) for k in ("backend", "scheme", "case", "reason", "issue", "expires")})
                   for w in wj.get("given", [])]
        dates = list(wj.get("dates") or meta.get("waiver_dates") or [])
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        problems.append(f"waivers.json: unreadable ({e})")
        waivers, dates = [], []
    # 3. every verdict, recomputed from the stored output and interval (by the suite that wrote them)
    if not recompute:
        checked["results"] = sum(1 for (b, _) in latest if b in backends)
        return res
    for b, info in backends.items():
        op = folder / info.get("outputs", "")
        stored: dict = {}
        if op.is_file():
            try:
                label, stored = load_outputs(op)
                if label != b:
                    problems.append(f"{info['outputs']}: holds backend {label!r}, bundle.json says {b!r}")
            except Exception as e:  # noqa: BLE001 - a malformed file is a finding, not a crash
                problems.append(f"{info.get('outputs')}: unreadable ({type(e).__name__}: {e})")
        elif info.get("outputs"):
            problems.append(f"{info.get('outputs')}: missing")
        for cid in stored:
            if (b, cid) not in latest:
                problems.append(f"{b} {cid}: an output without a result line")
        for (rb, cid), rec in latest.items():
            if rb != b:
                continue
            checked["results"] += 1
            _check_one(rec, stored.get(cid), folder, waivers, dates, problems, checked, deep)
    if deep:
        _deep_case_list(meta, ids, problems, notes)
    return res


def _check_one(rec: dict, entry, folder: Path, waivers, dates, problems: list, checked: Counter, deep: bool) -> None:
    who = f"{rec['backend']} {rec['case_id']}"
    v = rec.get("verdict")
    raw_recorded = rec.get("waived_verdict") or v
    bp = rec.get("bundle")
    if bp and not (folder / "bundles" / Path(bp).name).is_file():
        problems.append(f"{who}: {raw_recorded}: its replay bundle is not in bundles/")
    if entry is None:
        if raw_recorded in RECOMPUTABLE:
            problems.append(f"{who}: verdict {v} but no stored output to recompute it from")
            return
        checked["not_recomputable"] += 1  # crash, timeout, unsupported: nothing was output
        return
    if v in ("unsupported", "crash", "timeout"):
        problems.append(f"{who}: verdict {v} but an output is stored")
        return
    meta = entry["meta"]
    try:
        d = decode_case(entry["tensors"], meta)
        with np.errstate(all="ignore"):
            got = offline_verdict(d, bool(meta.get("bound_positive")), meta["dtype"])
    except Exception as e:  # noqa: BLE001
        problems.append(f"{who}: stored output/interval unreadable ({type(e).__name__}: {e})")
        return
    expected = _expected_verdict(got["verdict"], rec, waivers, dates)
    if v not in expected:
        problems.append(f"{who}: recorded verdict {v}, the stored output and interval give "
                        f"{' or '.join(sorted(expected))}")
        return
    m = rec.get("metrics") or {}
    for k in ("max_ratio", "max_ulp", "n_outside", "exact_match", "worst"):
        if k in m and not _num_equal(m[k], got[k]):
            problems.append(f"{who}: metric {k} recorded {m[k]!r}, recomputed {got[k]!r}")
    if got["verdict"] == "pass-with-tie-flips" and m.get("tie_flips") != got["tie_flips"]:
        problems.append(f"{who}: tie_flips recorded {m.get('tie_flips')}, recomputed {got['tie_flips']}")
    we = m.get("worst_element")
    if we and got["worst"]:
        idx = tuple(got["worst"])
        for k, arr in (("observed", d["y"]), ("lo", d["jlo"]), ("hi", d["jhi"])):
            if not _num_equal(we.get(k), float(arr[idx])):
                problems.append(f"{who}: worst_element.{k} recorded {we.get(k)!r}, stored {float(arr[idx])!r}")
    checked["recomputed"] += 1
    if deep:
        _deep_check(rec, d, problems, checked)


def _deep_check(rec: dict, d: dict, problems: list, checked: Counter) -> None:
    """Rebuild the inputs from the case id, recompute the interval, re-judge the stored output."""
    from backends.base import Declared

    from .acceptance import declared_interval
    from .runner import judge
    from .suite import CaseSpec

    who = f"{rec['backend']} {rec['case_id']}"
    spec = CaseSpec.from_json(rec["spec"])
    if spec.case_id != rec["case_id"]:
        problems.append(f"{who}: the recorded spec gives case id {spec.case_id}")
        return
    try:
        inp = spec.inputs()
        declared = Declared(**rec["declared"])
        with np.errstate(all="ignore"):
            iv = declared_interval(inp, declared)
    except Exception as e:  # noqa: BLE001
        problems.append(f"{who}: deep: cannot rebuild the case ({type(e).__name__}: {e})")
        return
    from . import runner as R

    jiv = getattr(R, "rounded_interval", lambda v, _d: v)(iv, declared)
    for k, arr in (("y_ref", iv.y_ref), ("lo", iv.lo), ("hi", iv.hi), ("jlo", jiv.lo), ("jhi", jiv.hi)):
        if not _same(d[k], arr):
            problems.append(f"{who}: deep: stored {k} differs from the interval recomputed here")
            return
    with np.errstate(all="ignore"):
        j = judge(inp, iv, d["y"], declared)
    m = rec.get("metrics") or {}
    raw = rec.get("waived_verdict") or rec.get("verdict")
    if rec.get("waiver_expired") and raw == "fail" and j["verdict"] != "fail":
        raw = j["verdict"]  # an expired waiver turned a non-failure into fail
    if j["verdict"] != raw:
        problems.append(f"{who}: deep: re-judged {j['verdict']}, recorded {raw}")
    for k in ("sqnr_db", "tie_flips", "max_ratio", "max_ulp"):
        if k in m and not _num_equal(m[k], j.get(k)):
            problems.append(f"{who}: deep: metric {k} recorded {m[k]!r}, recomputed {j.get(k)!r}")
    checked["deep"] += 1


def _deep_case_list(meta: dict, ids: list, problems: list, notes: list) -> None:
    from .suite import PROFILES, TIERS, case_list, parse_shard, shard

    prof = meta.get("profile")
    if prof not in PROFILES:
        problems.append(f"deep: unknown profile {prof!r}")
        return
    if PROFILES[prof].get("fresh_seeds"):
        notes.append(f"deep: profile {prof} draws fresh seeds: its case list cannot be re-derived")
        return
    schemes = None if meta.get("schemes") in (None, "all") else meta["schemes"]
    specs = case_list(schemes=schemes, tiers=tuple(meta.get("tiers") or TIERS), profile=prof)
    sh = parse_shard(meta.get("shard"))
    if sh:
        specs = shard(specs, *sh)
    if [s.case_id for s in specs] != ids:
        problems.append("deep: cases.txt is not the case list this checkout derives for the bundle's profile, "
                        "schemes, tiers and shard")


# -- command line ----------------------------------------------------------------------------------------
def cmd_certify(args) -> int:
    res = certify(args.backend, args.out, profile=args.profile, schemes=args.scheme, tiers=args.tier,
                  shard=args.shard, waivers=args.waivers, jobs=args.jobs, timeout=args.timeout,
                  host_label=args.host_label, progress=not args.no_progress and sys.stderr.isatty())
    counts = ", ".join(f"{n} {v}" for v, n in sorted(res.counts.items()))
    print(f"bundle: {res.path} ({counts})")
    print(f"bundle sha256 (of MANIFEST.json): {res.manifest_sha256}")
    print(f"report: {res.path / 'report.html'}")
    print(f"verify: qconform verify-bundle {res.path}")
    for label, why in res.unavailable.items():
        print(f"unavailable: {label}: {why}")
    if res.unavailable:
        print(f"certification: NOT CERTIFIED ({len(res.unavailable)} backend(s) could not run here; "
              f"{res.n_bad} failing of {res.n_results})")
    else:
        print(f"certification: {'PASS' if res.ok else 'FAIL'} ({res.n_bad} failing of {res.n_results})")
    return 0 if res.ok else 1


def cmd_verify_bundle(args) -> int:
    res = verify_bundle(args.bundle, deep=args.deep, any_version=args.any_version)
    if args.json:
        print(json.dumps({"ok": res.ok, "problems": res.problems, "notes": res.notes, "checked": dict(res.checked),
                          "manifest_sha256": res.manifest_sha256, "version_mismatch": res.version_mismatch},
                         indent=1))
        return 0 if res.ok else 1
    for p in res.problems[:200]:
        print(f"verify-bundle: {p}")
    if len(res.problems) > 200:
        print(f"verify-bundle: ... {len(res.problems) - 200} more problem(s)")
    for n in res.notes:
        print(f"note: {n}")
    c = res.checked
    print(f"{res.path}: {c.get('files', 0)} file(s) hashed, {c.get('results', 0)} result(s), "
          f"{c.get('recomputed', 0)} verdict(s) recomputed from stored outputs"
          + (f", {c.get('deep', 0)} re-derived from the emulator" if args.deep else "")
          + f", {c.get('not_recomputable', 0)} without output (crash/timeout/unsupported)")
    print(f"bundle sha256 (of MANIFEST.json): {res.manifest_sha256}")
    if res.ok:
        print("bundle OK")
    elif res.version_mismatch and not args.any_version and len(res.problems) == 1:
        print("bundle NOT VERIFIED: written by another suite version (its hashes and records check out; "
              "its verdicts were not recomputed)")
    else:
        print(f"bundle FAILS verification: {len(res.problems)} problem(s)")
    return 0 if res.ok else 1


def register(sub) -> None:
    from .suite import PROFILES, TIERS

    s = sub.add_parser("certify", help="run the certification profile on backends and write a verifiable bundle")
    s.add_argument("--backend", action="append", required=True, help="backend spec; repeatable")
    s.add_argument("--out", default="qconform-certification", help="bundle folder (must not hold a sealed bundle)")
    s.add_argument("--profile", default="certification", choices=sorted(PROFILES))
    s.add_argument("--scheme", action="append", help="restrict to a scheme; repeatable")
    s.add_argument("--tier", action="append", help=f"restrict to a tier ({', '.join(TIERS)}); repeatable")
    s.add_argument("--shard", help="i/n: certify shard i of n of the case list")
    s.add_argument("--waivers", help="waivers TOML file")
    s.add_argument("-j", "--jobs", type=int, default=1, help="worker processes per backend")
    s.add_argument("--timeout", type=float, default=120.0, help="seconds per case before the worker is killed")
    s.add_argument("--host-label", help="name of this host in merged reports (default: the host name)")
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(fn=cmd_certify)

    s = sub.add_parser("verify-bundle", help="re-check a certification bundle offline (hashes, every verdict)")
    s.add_argument("bundle")
    s.add_argument("--deep", action="store_true", help="also rebuild every case from its id and recompute the "
                                                       "intervals with this checkout's emulator")
    s.add_argument("--any-version", action="store_true",
                   help="recompute verdicts even when another suite version wrote the bundle (expect spurious "
                        "problems where the judging code changed)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_verify_bundle)
