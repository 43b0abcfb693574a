"""Failure localization, weights: the kernel's effective weights read back, diffed in the format's terms.

Semantics: docs/conformance.md#failure-localization. ``conformance.judge.localize`` runs the probes; this
module takes the read-back weights (one-hot probe rows: output element [k, n] is the kernel's weight
[n, k] times the probe value, rounded to the output dtype) and says where and how they differ from the
declared ones: per row, K group, zero point, scale block and packed field position, naming the pattern
(a zero point off by one, nibbles swapped within a byte, the scale of group g+1 used for group g,
g_idx ignored, the partial last group read as zero, an E8M0 byte 0xFF decoded as finite, an FP4 code
read as another value, ...).

How: the checkpoint is decomposed into codes q, zero points z and scales s per (row, group) and a group
index per column (``Structure``); each *hypothesis* is one concrete bug written as the weights it would
produce from that decomposition. A hypothesis explains an element when its weight, rounded as the probe
output is, equals the read-back one within one unit in the last place of the output dtype. Hypotheses
are chosen greedily by how many mismatching elements they explain; what none explains is described by
place only.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

from emulator.declaration import declared_weight
from emulator.formats import awq, compressed_tensors as ct, gptq, mxfp4
from emulator.numerics.e2m1 import decode_e2m1
from emulator.numerics.floats import round_to_dtype

from backends.base import Case, Declared

from conformance.judge.localize_codes import code_value_hypotheses, zero_term_hypotheses
from conformance.judge.localize_layout import layout_hypotheses

__all__ = ["Structure", "structure", "mismatch", "close", "analyze_weights", "where_text"]

#: significand bits (without the hidden one) of the output dtypes
_MANT = {"float32": 23, "float16": 10, "bfloat16": 7}
_MIN_EXP = {"float32": -126, "float16": -14, "bfloat16": -126}
_MIN_NORMAL = {k: 2.0 ** v for k, v in _MIN_EXP.items()}
#: a hypothesis is reported only if it explains at least this share of what is still unexplained
_MIN_SHARE = 0.02
#: ... and only if the readback matches it on at least this share of the elements it changes in its place
_MIN_PRECISION = 0.9


@dataclasses.dataclass
class Structure:
    """A checkpoint's weights in the terms of its format (float64 unless said otherwise)."""

    kind: str  # "int" | "mxfp4"
    W: np.ndarray  # [N, K] the declared weights, exact (before any declared weight_dtype rounding)
    q: np.ndarray  # [N, K] code values as the rule uses them (int codes; E2M1 values for MXFP4)
    codes: np.ndarray  # [N, K] raw codes (MXFP4: 0..15)
    zero: np.ndarray  # [N, G] zero points (0 where the format has none)
    scale: np.ndarray  # [N, G] scales (MXFP4: 2^(byte - 127), NaN for 0xFF)
    grp: np.ndarray  # [K] group of each column
    group_size: int
    bits: int
    pack_axis: str  # "K" | "N": the axis the packed fields run along
    fields: int  # fields per packed word (8 for int4 in int32, 2 for MXFP4 bytes)
    scale_bytes: np.ndarray | None = None  # [N, G] E8M0 bytes (MXFP4)
    unsigned: bool = True  # codes stored unsigned (GPTQ, AWQ) rather than signed (compressed-tensors)
    default_grp: np.ndarray | None = None  # [K] k // G where the checkpoint has its own g_idx

    @property
    def n_groups(self) -> int:
        return self.scale.shape[1]

    def build(self, q=None, zero=None, scale=None, grp=None) -> np.ndarray:
        """(q - z[grp]) * s[grp] from the parts, each defaulting to the checkpoint's."""
        q = self.q if q is None else q
        zero = self.zero if zero is None else zero
        scale = self.scale if scale is None else scale
        grp = self.grp if grp is None else grp
        with np.errstate(invalid="ignore", over="ignore"):
            return (q - zero[:, grp]) * scale[:, grp]


def structure(case: Case, tensors: dict, declared: Declared) -> Structure | None:
    """The decomposition of ``case``'s checkpoint tensors, or None for a format it does not cover (MoE)."""
    fmt = case.weight_format
    N, K = case.N, case.K
    exact = dataclasses.replace(declared, weight_dtype="exact")
    W = np.asarray(declared_weight(case, tensors, exact), np.float64)
    default_grp = None
    if fmt == "gptq":
        p = gptq.GptqParams(bits=case.bits, group_size=case.group_size, sym=case.sym, desc_act=case.act_order,
                            zero_convention=case.gptq_zero_convention)
        t = gptq.GptqTensors(tensors["qweight"], tensors["qzeros"], tensors["scales"], tensors.get("g_idx"))
        c = gptq.unpack_gptq(t, p, shape=(N, K), zero_read=declared.value("zero_read"))
        q, scale, grp = c.q.astype(np.float64), np.asarray(c.scales, np.float64).T, np.asarray(c.g_idx, np.int64)
        kind, bits, axis, fields, unsigned = "int", case.bits, "K", 32 // case.bits, True
    elif fmt == "awq":
        t = awq.AwqTensors(tensors["qweight"], tensors["qzeros"], tensors["scales"])
        c = awq.unpack_awq(t, awq.AwqParams(bits=4, group_size=case.group_size), shape=(N, K))
        q, scale = c.q.astype(np.float64), np.asarray(c.scales, np.float64).T
        grp = np.arange(K) // case.group
        kind, bits, axis, fields, unsigned = "int", 4, "N", 8, True
    elif fmt == "ct-pack-quantized":
        p = ct.CtPackParams(num_bits=case.bits, strategy="channel" if case.channelwise else "group",
                            group_size=None if case.channelwise else case.group_size, symmetric=case.sym,
                            actorder=case.act_order)
        t = ct.CtPackedTensors(tensors["weight_packed"], tensors["weight_scale"], tensors["weight_shape"],
                               tensors.get("weight_zero_point"), tensors.get("weight_g_idx"))
        c = ct.unpack_ct_packed(t, p)
        q, scale = c.q.astype(np.float64), np.asarray(c.scales, np.float64).reshape(N, -1)
        grp = (np.asarray(c.g_idx, np.int64) if c.g_idx is not None else
               np.minimum(np.arange(K) // case.group, scale.shape[1] - 1))
        kind, bits, axis, fields, unsigned = "int", case.bits, "K", 32 // case.bits, False
    elif fmt == "ct-int-quantized":
        q = np.asarray(tensors["weight"], np.float64)
        scale = np.asarray(tensors["weight_scale"], np.float64).reshape(N, 1)
        grp = np.zeros(K, np.int64)
        kind, bits, axis, fields, unsigned = "int", 8, "K", 4, False
    elif fmt == "ct-mxfp4":
        codes, sb = mxfp4.unpack_mxfp4_ct(tensors)
        q = decode_e2m1(codes).astype(np.float64)
        scale = np.where(sb == 0xFF, np.nan, np.ldexp(1.0, sb.astype(np.int64) - 127))
        grp = np.arange(K) // 32
        st = Structure("mxfp4", W, q, codes.astype(np.int64), np.zeros_like(scale), scale, grp, 32, 4, "K", 2,
                       scale_bytes=sb, unsigned=False)
        return st
    else:
        return None
    if case.act_order or fmt == "gptq":
        d = np.minimum(np.arange(K) // case.group, scale.shape[1] - 1)
        default_grp = d if not np.array_equal(d, grp) else None
    s_e = scale[:, grp]
    with np.errstate(invalid="ignore", divide="ignore"):
        z_e = np.where((s_e != 0) & np.isfinite(s_e) & np.isfinite(W), q - W / s_e, 0.0)
    z_e = np.rint(np.nan_to_num(z_e))
    zero = np.zeros_like(scale)
    for g in range(scale.shape[1]):  # one column of each group carries the group's zero point
        cols = np.nonzero(grp == g)[0]
        if cols.size:
            zero[:, g] = z_e[:, cols[0]]
    return Structure(kind, W, q, q.astype(np.int64), zero, scale, grp, case.group, bits, axis, fields,
                     unsigned=unsigned, default_grp=default_grp)


# -- comparing ---------------------------------------------------------------------------------------------
def _ulp(v: np.ndarray, dtype: str) -> np.ndarray:
    """One unit in the last place of ``dtype`` at |v| (subnormal spacing below the normal range)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        _, e = np.frexp(np.abs(np.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0)))
    e = np.maximum(e - 1, _MIN_EXP[dtype])
    return np.ldexp(1.0, e - _MANT[dtype])


def mismatch(obs: np.ndarray, exp: np.ndarray) -> np.ndarray:
    """Elements that differ: not equal and not both NaN (an Inf must be the same Inf)."""
    with np.errstate(invalid="ignore"):
        return ~((obs == exp) | (np.isnan(obs) & np.isnan(exp)))


def close(obs: np.ndarray, hyp: np.ndarray, dtype: str, ulps: float = 1.0) -> np.ndarray:
    """``obs`` equals ``hyp`` within ``ulps`` units of ``dtype`` (NaN matches NaN, Inf the same Inf)."""
    with np.errstate(invalid="ignore", over="ignore"):
        fin = np.isfinite(obs) & np.isfinite(hyp)
        near = fin & (np.abs(obs - hyp) <= ulps * _ulp(hyp, dtype))
        return near | (obs == hyp) | (np.isnan(obs) & np.isnan(hyp))


# -- where ---------------------------------------------------------------------------------------------------
def _list(v, limit: int = 6) -> str:
    v = sorted(int(i) for i in v)
    if len(v) > 3 and v[-1] - v[0] == len(v) - 1:
        return f"{v[0]}..{v[-1]}"
    return ", ".join(map(str, v[:limit])) + (f", ... ({len(v)} in all)" if len(v) > limit else "")


def _runs(r) -> str:
    """A set of residues as '{1, 2, 3}', its runs of 8 or more as 'a..b': '{32..127}', '{0, 4..11}'."""
    r = sorted(int(i) for i in r)
    parts, i = [], 0
    while i < len(r):
        j = i
        while j + 1 < len(r) and r[j + 1] == r[j] + 1:
            j += 1
        parts += [f"{r[i]}..{r[j]}"] if j - i >= 7 else [str(v) for v in r[i:j + 1]]
        i = j + 1
    return "{" + ", ".join(parts) + "}"


def _residues(idx: np.ndarray, total: int, periods, var: str) -> str:
    """'n with n mod 8 = 7' / 'n with n mod 8 in {1, ..., 6}' when ``idx`` is exactly the indices below ``total``
    with those residues ('' otherwise)."""
    for F in sorted(set(periods)):  # the shortest period that says it exactly
        if total < 2 * F:
            continue
        r = np.unique(idx % F)
        if r.size < F and np.array_equal(np.sort(idx), np.nonzero(np.isin(np.arange(total) % F, r))[0]):
            return f"{var} with {var} mod {F} = {r[0]}" if r.size == 1 else f"{var} with {var} mod {F} in {_runs(r)}"
    return ""


def where_text(mask: np.ndarray, st: Structure, ks: np.ndarray, case: Case, neutral: np.ndarray | None = None) -> str:
    """Where the True elements of ``mask`` [N, len(ks)] lie: rows, K groups, column pattern. ``neutral``:
    elements where the pattern cannot show (a zero weight read as zero); a row or column all neutral where the
    others are affected counts as affected."""
    N = mask.shape[0]
    cols_i = np.nonzero(mask.any(axis=0))[0]
    rows_m = mask.any(axis=1)
    if neutral is not None and cols_i.size:
        rows_m |= neutral[:, cols_i].all(axis=1)
    rows = np.nonzero(rows_m)[0]
    if neutral is not None and rows.size:
        cols_i = np.nonzero(mask.any(axis=0) | neutral[rows].all(axis=0) & np.isin(st.grp[ks], np.unique(st.grp[ks[cols_i]])))[0]
    cols = ks[cols_i]
    parts = ["every row" if rows.size == N else (f"row {rows[0]}" if rows.size == 1 else f"rows {_list(rows)}")
             + ("" if rows.size == N else f" (of {N})")]
    if rows.size < N and rows.size >= 2:
        res = _residues(rows, N, (st.fields, 8, 4, 2) if st.pack_axis == "N" else (8, 4, 2), "n")
        if res:
            parts[0] = f"rows {res}"
    groups = np.unique(st.grp[cols])
    probed_groups = np.unique(st.grp[ks])
    label = "MX block" if st.kind == "mxfp4" else "K group"
    if st.n_groups > 1:
        if groups.size == probed_groups.size and probed_groups.size == st.n_groups:
            parts.append(f"every {label}")
        else:
            parts.append(f"{label}{'s' if groups.size > 1 else ''} {_list(groups)}")
    in_groups = ks[np.isin(st.grp[ks], groups)]
    K = case.K
    tail = K % st.group_size if st.kind == "int" and not case.channelwise else 0
    col_txt = ""
    if cols.size == in_groups.size:
        col_txt = ""  # every column of those groups
    elif tail and np.array_equal(np.sort(cols), np.arange(K - tail, K)):
        col_txt = f"the last K mod {st.group_size} = {tail} columns (the partial last group)"
    else:
        # the shortest period that says it exactly (within one group, the group size is no period: list the columns)
        for F in sorted({st.group_size, st.fields, 8, 4, 2} - {K} - ({st.group_size} if groups.size == 1 else set())):
            r = np.unique(cols % F)
            same = np.array_equal(np.sort(cols), np.sort(in_groups[np.isin(in_groups % F, r)]))
            if r.size < F and cols.size >= 2 and K >= 2 * F and same:
                col_txt = (f"columns k with k mod {F} = {r[0]}" if r.size == 1 else
                           f"columns k with k mod {F} in {_runs(r)}")
                break
        if not col_txt and cols.size and np.array_equal(np.sort(cols), np.arange(K - cols.size, K)):
            col_txt = f"the last {cols.size} columns"
            for B in (8, 16, 32, 64, 128, 256):
                if K % B == cols.size:
                    col_txt = f"the last K mod {B} = {cols.size} columns"
                    break
        if not col_txt:
            col_txt = f"column{'s' if cols.size > 1 else ''} {_list(cols)}"
    if col_txt:
        parts.append(col_txt)
    return ", ".join(parts)


# -- hypotheses -------------------------------------------------------------------------------------------------
def _perm_along(a: np.ndarray, axis: str, perm_of_index) -> np.ndarray:
    """``a`` with its columns (axis K) or rows (axis N) permuted: out[.., i] = a[.., perm(i)]."""
    if axis == "K":
        return a[:, perm_of_index(np.arange(a.shape[1]))]
    return a[perm_of_index(np.arange(a.shape[0])), :]


def _word_perms(st: Structure, length: int) -> list:
    """(name, index map) for field-position bugs inside a packed word along the packed axis."""
    F = st.fields
    out = []
    full = length - length % F

    def within(fn):
        def perm(i):
            j = i.copy()
            m = i < full
            j[m] = fn(i[m])
            return j
        return perm

    unit = "nibbles" if st.bits == 4 else ("bytes" if st.bits == 8 else "fields")
    if st.bits == 4:
        out.append(("nibbles swapped within a byte", within(lambda i: i ^ 1)))
    if st.bits == 8:
        out.append(("bytes swapped within each 16-bit half-word", within(lambda i: i ^ 1)))
    if F > 2:
        out.append((f"{unit} in reverse order within each 32-bit word", within(lambda i: (i // F) * F + (F - 1 - i % F))))
    if st.pack_axis == "N" and F == 8:
        order, rev = np.asarray(awq.AWQ_PACK_ORDER), np.asarray(awq.AWQ_REVERSE_ORDER)
        out.append(("AWQ's interleaved nibble order (0 2 4 6 1 3 5 7) not applied: fields read in sequential order",
                    within(lambda i: (i // 8) * 8 + order[i % 8])))
        out.append(("AWQ's nibble order applied the wrong way round (0 4 1 5 2 6 3 7)",
                    within(lambda i: (i // 8) * 8 + rev[i % 8])))
    return out


def _scale_and_shift_hypotheses(st: Structure, case: Case):
    """Integer formats: row 0's scale on every row, subnormal scales flushed to zero, codes shifted along K."""
    if np.unique(st.scale[np.isfinite(st.scale)]).size > 1:  # one row's scales on every row (read as per-tensor)
        yield ("row 0's scale used for every row (per-channel scales read as one per tensor)",
               st.build(scale=np.broadcast_to(st.scale[:1], st.scale.shape)))
    if case.scale_dtype in _MIN_NORMAL:  # subnormal scales flushed to zero (FTZ/DAZ)
        sub = (st.scale != 0) & (np.abs(st.scale) < _MIN_NORMAL[case.scale_dtype])
        if sub.any():
            yield (f"subnormal {case.scale_dtype} scales flushed to zero (FTZ/DAZ): the weights of those "
                   "groups read as zero", st.build(scale=np.where(sub, 0.0, st.scale)))
    if st.pack_axis == "K" and st.fields > 1:
        pad = (-case.K) % st.fields
        for sh in sorted({1, -1, pad, -pad} - {0}, key=lambda v: (-abs(v) if v in (pad, -pad) else 0, v)):
            for fill in sorted({0.0, -2.0 ** (st.bits - 1)} if not st.unsigned else {0.0}):
                yield (_shift_name(sh, pad, fill, st), st.build(q=_shift_k(st.q, sh, fill)))


def _group0_hypotheses(st: Structure):
    """One group's parameters on every group (the group index never advanced)."""
    g0 = np.zeros_like(st.grp)
    if np.any(st.zero[:, 1:] != st.zero[:, :1]):
        yield ("the zero point of K group 0 used for every group (scale right: the zero row index not advanced)",
               (st.q - st.zero[:, g0]) * st.scale[:, st.grp])
        yield ("the scale and zero point of K group 0 used for every group", st.build(grp=g0))
    yield ("the scale of K group 0 used for every group (group scales read as per-channel)",
           (st.q - st.zero[:, st.grp]) * st.scale[:, g0])


def hypotheses(st: Structure, case: Case, offsets=()):
    """(pattern, weights [N, K]) for each bug the decomposition can express, one at a time (memory).
    ``offsets``: zero-point offsets c (in scale steps) to try besides +-1, estimated from the readback."""
    s_e = st.scale[:, st.grp]
    W = st.W
    if st.kind == "int":
        has_zero = case.weight_format in ("gptq", "awq") or (case.weight_format == "ct-pack-quantized" and not case.sym)
        what = "a zero point off by one" if has_zero else "codes off by one"
        yield (f"offset by exactly one scale step down (q - (z + 1)): {what}", W - s_e)
        yield (f"offset by exactly one scale step up (q - (z - 1)): {what}", W + s_e)
        for c in offsets:  # the offsets the read-back elements show most often (estimated by the caller)
            if c not in (0, 1, -1):
                yield (_offset_name(c, st.bits, has_zero), W - c * s_e)
        if np.any(st.zero):
            yield ("no zero point subtracted (q * s): the zero point ignored", st.q * s_e)
        if st.unsigned:
            mid = 2.0 ** (st.bits - 1)
            if np.any(st.zero != mid):
                yield (f"the stored zero points ignored: the midpoint {int(mid)} used", (st.q - mid) * s_e)
            neg = np.where(st.q >= mid, st.q - 2.0 ** st.bits, st.q)
            yield (f"codes >= {int(mid)} read as negative (two's complement instead of unsigned)", st.build(q=neg))
        else:
            pos = np.where(st.q < 0, st.q + 2.0 ** st.bits, st.q)
            yield ("negative codes read as unsigned (no sign extension)", st.build(q=pos))
        for dt in ("bfloat16", "float16"):
            if case.scale_dtype != dt:
                yield (f"scales read as {dt} (rounded)", st.build(scale=round_to_dtype(st.scale, dt)))
        if case.scale_dtype in ("float16", "bfloat16"):  # the scale's 16 bits reinterpreted as the other dtype
            other = "bfloat16" if case.scale_dtype == "float16" else "float16"
            src = np.float16 if case.scale_dtype == "float16" else ml_dtypes.bfloat16
            dst = ml_dtypes.bfloat16 if other == "bfloat16" else np.float16
            bits = st.scale.astype(src).view(np.uint16).view(dst).astype(np.float64)
            yield (f"{case.scale_dtype} scale bits read as {other}", st.build(scale=bits))
        yield from _scale_and_shift_hypotheses(st, case)
        if st.scale.shape[1] == 1 and case.K <= case.N:  # one scale per output channel
            sk = st.scale[: case.K, 0][None, :]
            yield ("the per-channel scale indexed by the input channel k instead of the output channel n "
                      "(scale transposed)", (st.q - st.zero[:, :1]) * sk)
    else:
        yield ("E8M0 scale read one step high (x2): byte b read as b + 1", 2 * W)
        yield ("E8M0 scale read one step low (/2): byte b read as b - 1", W / 2)
        yield ("E2M1 codes read without their sign bit", np.abs(W))
    G = st.n_groups
    if G > 1 and st.kind == "int":
        yield from _group0_hypotheses(st)
    if G > 1:
        what, g = ("E8M0 scale of block", "b") if st.kind == "mxfp4" else ("scale and zero point of group", "g")
        up = np.minimum(st.grp + 1, G - 1)
        down = np.maximum(st.grp - 1, 0)
        yield (f"the {what} {g}+1 used for {what.split()[-1]} {g}", st.build(grp=up))
        yield (f"the {what} {g}-1 used for {what.split()[-1]} {g}", st.build(grp=down))
        if st.kind == "int" and np.any(st.zero):
            yield ("the scale of group g+1 used for group g (zero point right)", (st.q - st.zero[:, st.grp]) * st.scale[:, up])
    if st.default_grp is not None:
        yield ("g_idx ignored: column k read with group k // G instead of g_idx[k]", st.build(grp=st.default_grp))
    length = case.K if st.pack_axis == "K" else case.N
    for name, perm in _word_perms(st, length):
        q_perm = _perm_along(st.q, st.pack_axis, perm)
        yield (name, st.build(q=q_perm))
        if st.kind == "int" and np.any(st.zero) and st.pack_axis == "N":  # the same unpacking of qzeros
            yield (name + " (codes and zero points alike)", st.build(q=q_perm, zero=_perm_along(st.zero, "N", perm)))
    if st.kind == "int" and np.any(st.zero) and case.weight_format != "ct-int-quantized":
        zst = dataclasses.replace(st, pack_axis="N", fields=8 if st.bits == 4 else 4)  # zero points: packed along N
        for name, perm in _word_perms(zst, case.N):
            yield (f"zero points: {name}", st.build(zero=_perm_along(st.zero, "N", perm)))
    N = W.shape[0]
    for d in sorted({1, 2, 4, 8, 16, 32, 64, 128, N // 2} - {0}):  # an output tile written from another's results
        if d < N:
            for sgn in (1, -1):
                src = np.arange(N) - sgn * d
                ok = (src >= 0) & (src < N)
                Wd = W.copy()
                Wd[ok] = W[src[ok]]
                yield (f"output channel n computed with the weights of channel n {'-' if sgn > 0 else '+'} {d}", Wd)
    yield from layout_hypotheses(st, case)  # scales in the other layout, a wrong group size, field stride
    yield ("read as zero", np.zeros_like(W))
    yield ("sign flipped", -W)


def _offset_name(c: int, bits: int, has_zero: bool) -> str:
    what = f"a zero point off by {c:+d}" if has_zero else f"codes off by {c:+d}"
    if abs(c) == 2 ** (bits - 1):
        what += f" (the {2 ** (bits - 1)} of the unsigned packing offset kept or applied twice)"
    return f"offset by exactly {abs(c)} scale steps {'down' if c > 0 else 'up'} (q - (z {'+' if c > 0 else '-'} {abs(c)})): {what}"


def _shift_k(q: np.ndarray, sh: int, fill: float) -> np.ndarray:
    """Codes shifted along K: column k reads the code of column k + sh (``fill`` beyond the row's ends)."""
    K = q.shape[1]
    src = np.arange(K) + sh
    ok = (src >= 0) & (src < K)
    out = np.full_like(q, fill)
    out[:, ok] = q[:, src[ok]]
    return out


def _shift_name(sh: int, pad: int, fill: float, st: Structure) -> str:
    why = (f" (the row's {pad} padding field(s) of the last packed word taken as its {'start' if sh > 0 else 'end'}: "
           "the K codes read from the wrong end of the padded row)" if abs(sh) == pad else "")
    beyond = "" if st.unsigned else f"; beyond the row's end, code {fill:g}"
    return f"codes shifted along K by {abs(sh)} column(s): column k reads the code of column k {'+' if sh > 0 else '-'} {abs(sh)}{why}{beyond}"


def _offset_candidates(st: Structure, obs_w, exp_w, todo, ks, limit: int = 2) -> list:
    """The most frequent whole offsets (in scale steps) between the expected and the read-back weights."""
    s = st.scale[:, st.grp[ks]]
    with np.errstate(invalid="ignore", divide="ignore"):
        v = np.median((exp_w / st.W[:, ks])[todo & (st.W[:, ks] != 0) & np.isfinite(exp_w)]) if todo.any() else np.nan
        steps = (exp_w - obs_w)[todo] / (v * s[todo])
    steps = steps[np.isfinite(steps)]
    steps = steps[np.abs(steps - np.rint(steps)) < 0.05]
    if not steps.size:
        return []
    u, n = np.unique(np.rint(steps).astype(np.int64), return_counts=True)
    # a code or zero point cannot be off by more than its 2^bits codes: a larger whole offset is another term
    return [int(c) for c in u[np.argsort(-n)] if abs(c) <= 2 ** st.bits][:limit]


def _code_table_hypotheses(st: Structure, obs_w: np.ndarray, todo: np.ndarray) -> list:
    """MXFP4: for each E2M1 code among the unexplained elements, the value it reads as (when one value)."""
    out = []
    s_e = st.scale[:, st.grp]
    for c in np.unique(st.codes[todo]):
        m = todo & (st.codes == c)
        with np.errstate(invalid="ignore", divide="ignore"):
            r = obs_w[m] / s_e[m]
        r = r[np.isfinite(r)]
        if not r.size:
            continue
        val = float(np.median(r))
        true = float(decode_e2m1(np.array([c], np.uint8))[0])
        name = f"FP4 code 0b{int(c):04b} ({_fmt_e2m1(c, true)}) read as {val:g}"
        out.append((name, np.where(st.codes == c, val * s_e, st.W)))
    return out


def _fmt_e2m1(c, v: float) -> str:
    return "-0" if int(c) == 8 else f"{v:g}"


def analyze_weights(st: Structure, obs_w: np.ndarray, exp_w: np.ndarray, bad: np.ndarray, ks: np.ndarray,
                    case: Case, to_output) -> dict:
    """Diff the read-back weights ``obs_w`` [N, len(ks)] against the expected ``exp_w`` (both as the probe
    outputs them; ``bad``: the elements outside the declared interval); ``to_output(W, ks)`` maps exact weights
    [N, len(ks)] of columns ks to those outputs. Returns
    {"ok", "n_bad", "n", "findings": [{"where", "pattern", "n"}]}."""
    res = {"ok": not bad.any(), "n_bad": int(bad.sum()), "n": int(bad.size), "findings": []}
    if not bad.any():
        return res
    dtype = case.output_dtype
    todo = bad.copy()
    findings = []
    # non-finite mismatches first (docs/conformance.md#failure-localization)
    with np.errstate(invalid="ignore"):
        nan_expected = todo & np.isnan(exp_w) & ~np.isnan(obs_w)
    if nan_expected.any():
        if st.kind == "mxfp4":
            sb = st.scale_bytes[:, st.grp[ks]]
            ff = nan_expected & (sb == 0xFF)
            if ff.any():
                with np.errstate(invalid="ignore", divide="ignore"):
                    r = obs_w[ff] / (st.q[:, ks][ff])
                r = r[np.isfinite(r) & (r > 0)]
                as_ = f" (read as 2^{int(round(np.log2(np.median(r))))})" if r.size else ""
                # the row's other outputs are NaN in the reference too (0 x NaN in the one-hot product)
                via_row = nan_expected & ~np.isnan(st.W[:, ks]) & np.isin(np.arange(len(ff))[:, None],
                                                                             np.nonzero(ff.any(axis=1))[0])
                note = ("; the same rows' other outputs, NaN in the reference through 0 x NaN, are numbers too"
                        if via_row.any() else "")
                findings.append({"where": where_text(ff, st, ks, case), "n": int(ff.sum()),
                                 "pattern": f"E8M0 byte 0xFF (NaN scale) decoded as finite{as_}{note}"})
                todo &= ~(ff | via_row)
                nan_expected &= ~(ff | via_row)
        if nan_expected.any():
            findings.append({"where": where_text(nan_expected, st, ks, case), "n": int(nan_expected.sum()),
                             "pattern": "a NaN weight (a NaN scale) read back as a number"})
            todo &= ~nan_expected
    with np.errstate(invalid="ignore"):
        nan_observed = todo & np.isfinite(exp_w) & ~np.isfinite(obs_w)
    if nan_observed.any():
        findings.append({"where": where_text(nan_observed, st, ks, case), "n": int(nan_observed.sum()),
                         "pattern": "finite weights read back as NaN/Inf"})
        todo &= ~nan_observed
    offsets = _offset_candidates(st, obs_w, exp_w, todo, ks) if st.kind == "int" else []
    # one code value read as another first: on a tie with a wider pattern (a scale rounding that meets the same
    # elements within an output unit), the narrower one is named, the other as equally consistent
    cand = [(n, to_output(Wh[:, ks], ks)) for n, Wh in code_value_hypotheses(st, obs_w, exp_w, todo, ks)
            + zero_term_hypotheses(st)]
    cand += [(name, to_output(Wh[:, ks], ks)) for name, Wh in hypotheses(st, case, offsets)]
    base = to_output(st.W[:, ks], ks)
    fin = todo & np.isfinite(exp_w) & (exp_w != 0)
    if fin.any():
        with np.errstate(invalid="ignore", divide="ignore"):
            r = obs_w[fin] / exp_w[fin]
        r = r[np.isfinite(r)]
        if r.size:
            f = float(np.median(r))
            cand.append((f"every weight scaled by {f:.9g}", to_output(f * st.W[:, ks], ks)))
    if st.kind == "mxfp4":
        cand += [(n, to_output(Wh[:, ks], ks)) for n, Wh in _code_table_hypotheses(
            st, _full(obs_w, ks, st.W.shape), _full(todo, ks, st.W.shape, False))]
    claimed, todo = _claim_greedily(cand, base, obs_w, exp_w, bad, todo,
                                    lambda m, neutral: where_text(m, st, ks, case, neutral), dtype)
    findings += claimed
    term = _per_channel_term(obs_w, base, todo, dtype) if todo.any() else None
    if term is not None:  # what no weight bug explains: one amount added per output channel, whatever the column
        claimed, todo = _claim_greedily([term], base, obs_w, exp_w, bad, todo,  # (a zero weight hides no term)
                                        lambda m, neutral: where_text(m, st, ks, case), dtype)
        findings += [dict(f, not_weights=True) for f in claimed]  # for the stage: a term outside the weights
    if todo.any():
        findings.append({"where": where_text(todo, st, ks, case), "n": int(todo.sum()),
                         "pattern": _residual_pattern(obs_w, exp_w, todo, st, ks)})
    res["findings"] = findings
    return res


def _per_channel_term(obs_w, base, todo, dtype: str):
    """(pattern, outputs): every one-hot output of row n offset by the same c_n (the median over its unexplained
    elements), or None: a term the kernel adds per output channel, not a weight."""
    with np.errstate(invalid="ignore"):
        d = np.where(todo & np.isfinite(obs_w) & np.isfinite(base), obs_w - base, np.nan)
    rows = np.nonzero(np.isfinite(d).sum(axis=1) >= 2)[0]
    if not rows.size:
        return None
    c = np.zeros(base.shape[0])
    c[rows] = np.nanmedian(d[rows], axis=1)
    if not np.any(c):
        return None
    vals = np.unique(c[c != 0])
    shown = ", ".join(f"{v:+.6g}" for v in vals[:4]) + (", ..." if vals.size > 4 else "")
    with np.errstate(invalid="ignore", over="ignore"):
        hyp = np.asarray(round_to_dtype(base + c[:, None], dtype), np.float64)
    return (f"the same amount ({shown}) added to every one-hot output of the row, whatever the input column: "
            "a term added per output channel, not a weight (a bias, or a zero-point correction azp * sum_k qw[n, k] "
            "with wrong weight row sums)", hyp)


def _claim_greedily(cand, base, obs_w, exp_w, bad, todo, where, dtype):
    """Claim hypotheses one at a time (the one explaining most unexplained elements, among those that explain
    their place; on a tie, the one the readback contradicts least: fewest elements it changes that read back
    right); return (findings, what stays unexplained). ``where(mask, neutral)``: the place text."""
    findings = []
    while todo.any():
        best = None
        avail = todo | ~bad  # not yet claimed by a finding
        for name, hyp in cand:
            ok = close(obs_w, hyp, dtype)
            m = todo & ok
            n = int(m.sum())
            if not n or (best is not None and n < best[1]):
                continue
            changed = mismatch(hyp, base)
            prec = _place_precision(m, ok, changed & avail)
            contra = int((changed & ~ok & ~bad).sum())  # it would change them, the readback shows them right
            if prec >= _MIN_PRECISION and (n >= 2 or n == todo.sum()) and (
                    best is None or (n, -contra, prec) > (best[1], -best[4], best[3])):
                best = (name, n, hyp, prec, contra)
        if best is None or best[1] < max(1, _MIN_SHARE * todo.sum()):
            break
        name, n, hyp, _, contra = best
        m = todo & close(obs_w, hyp, dtype)
        same = []
        for c_name, c_hyp in cand:
            if c_name == name or len(same) == 2:
                continue
            ok = close(obs_w, c_hyp, dtype)
            changed = mismatch(c_hyp, base)
            if (int((todo & ok).sum()) == n and ok[m].all() and int((changed & ~ok & ~bad).sum()) <= contra
                    and _place_precision(m, ok, changed & avail) >= _MIN_PRECISION):
                same.append(c_name)
        if same:  # this readback cannot tell them apart: name each
            name = f"{name} (equally consistent: {'; '.join(same)})"
        neutral = ~bad & close(obs_w, hyp, dtype) & (exp_w == 0)  # a zero weight hides most bugs
        findings.append({"where": where(m, neutral), "pattern": name, "n": n})
        todo &= ~m
        cand = [c for c in cand if c[0] != best[0]]
    return findings, todo


def _place_precision(m: np.ndarray, ok: np.ndarray, region: np.ndarray) -> float:
    """Of the elements a hypothesis changes (``region``) in the rows and columns where it explains a mismatch
    (``m``), the share the readback matches (``ok``): a pattern is claimed only where it explains its place,
    not where it meets a few elements by coincidence."""
    place = m.any(axis=1)[:, None] & m.any(axis=0)[None, :] & region
    total = int(place.sum())
    return 1.0 if not total else float((place & ok).sum()) / total


def _full(a: np.ndarray, ks: np.ndarray, shape, fill=np.nan) -> np.ndarray:
    out = np.full(shape, fill, dtype=a.dtype)
    out[:, ks] = a
    return out


def _residual_pattern(obs_w, exp_w, m, st: Structure, ks) -> str:
    """No named bug explains these elements: their offset in scale steps where that is an integer."""
    s = st.scale[:, st.grp[ks]]
    with np.errstate(invalid="ignore", divide="ignore"):
        steps = (obs_w[m] - exp_w[m]) / s[m]
    steps = steps[np.isfinite(steps)]
    if steps.size and np.allclose(steps, np.rint(steps), atol=0.05):
        u = np.unique(np.rint(steps).astype(np.int64))
        return "wrong by a whole number of scale steps (" + _list(u) + "): codes or zero points misread"
    return "wrong weights (no named pattern)"


# -- product or weight rounded ----------------------------------------------------------------------------------
def product_or_weight(Wt: np.ndarray, readbacks: list, out_dtype: str, b=0.0) -> "dict | None":
    """Which rounding a one-hot readback at two magnitudes shows: ``readbacks`` = [(v, observed [rows, N])] of
    one-hot rows of value v over the declared weights ``Wt`` [rows, N] (b: the bias the probe carried).

    A kernel that rounds each product (or a partial sum holding one product) to a dtype X outputs
    round(v * w) to X, one that rounds its weights outputs v * round(w): at v = 1 the two are the same, at
    v = 3 they differ wherever 3 * w needs more bits than X holds. Returns {"dtype", "what" ("product" |
    "weight" | "either"), "pattern"} for the X whose hypothesis matches every element of every readback
    exactly, or None."""
    def out(a):
        with np.errstate(all="ignore"):
            return np.asarray(round_to_dtype(a + b, out_dtype), np.float64)

    for X in ("float16", "bfloat16", "float32"):
        if X == out_dtype or (X == "float32" and out_dtype != "float32"):
            continue
        with np.errstate(all="ignore"):
            hp = [out(np.asarray(round_to_dtype(v * Wt, X), np.float64)) for v, _ in readbacks]
            hw = [out(v * np.asarray(round_to_dtype(Wt, X), np.float64)) for v, _ in readbacks]
        fp = all(close(o, h, out_dtype, 0).all() for (_, o), h in zip(readbacks, hp))
        fw = all(close(o, h, out_dtype, 0).all() for (_, o), h in zip(readbacks, hw))
        if not (fp or fw):
            continue
        vs = " and ".join(f"{v:g}" for v, _ in readbacks)
        if fp and fw:
            return {"dtype": X, "what": "either", "pattern": f"the weight or the product is rounded to {X} (one-hot "
                    f"readbacks at {vs} cannot tell them apart here)"}
        if fp:
            return {"dtype": X, "what": "product", "pattern": f"the product (or a partial sum) is rounded to {X}: the "
                    f"one-hot readbacks at {vs} are round(v * w), not v * round(w) (the weights are right)"}
        return {"dtype": X, "what": "weight", "pattern": f"the weight is rounded to {X} before the product: the "
                f"one-hot readbacks at {vs} are v * round(w), not round(v * w)"}
    return None
