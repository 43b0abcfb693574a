"""Failure localization, weights: layout bugs (where a kernel reads the right tensors at the wrong index).

Semantics: docs/conformance.md#failure-localization (step 1). ``conformance.judge.localize_weights`` asks
``layout_hypotheses`` for these besides its own; each is one class of bug written as the weights it would
produce from the checkpoint's decomposition (``Structure``), for any format and shape:

- the scales' buffer read in the other layout: a [N, G] scale matrix reshaped to [G, N] instead of
  transposed (the scale of row n, group g taken from flat position g * N + n), or a [G, N] one read as
  [N, G] (flat position n * G + g); with or without the zero points read the same way;
- the group size wrong: the kernel's groups are G' columns instead of G (hard-coded 32/64/128/..., or
  computed as K // n_groups where K is not a multiple of G), column k read with group min(k // G', n - 1);
- the packed fields extracted with the wrong stride or width: field i of a 32-bit word read from bits
  s * i .. s * i + w - 1 instead of b * i .. b * i + b - 1 (codes, and codes and zero points alike).

The claim rule (a pattern is named only where the readback matches it on >= 90 % of the elements it changes)
is the caller's (``localize_weights._claim_greedily``).
"""

from __future__ import annotations

import numpy as np

from emulator.formats import awq

__all__ = ["layout_hypotheses", "restride"]

#: group sizes a kernel may hard-code (besides K // n_groups)
_GROUP_SIZES = (8, 16, 32, 64, 128, 256)


def layout_hypotheses(st, case):
    """(pattern, weights [N, K]) for the layout bugs that ``st`` (a localize_weights.Structure) can express."""
    if st.kind != "int":
        return
    yield from _scale_layout(st)
    yield from _group_size(st, case)
    yield from _field_stride(st, case)


# -- scales read in the other layout ------------------------------------------------------------------------
def _scale_layout(st):
    N, G = st.scale.shape
    if G < 2 or N < 2:
        return
    zeros_vary = bool(np.any(st.zero != st.zero[:1, :1]))
    for name, perm in (
            (f"the scales' [N, G] = [{N}, {G}] matrix reshaped to [G, N] instead of transposed: the scale of row n, "
             f"group g read from flat position g * N + n", lambda a: a.reshape(G, N).T),
            (f"the scales' [G, N] = [{G}, {N}] matrix reshaped to [N, G] instead of transposed: the scale of row n, "
             f"group g read from flat position n * G + g", lambda a: a.T.reshape(N, G))):
        yield (name + " (zero points right)" if zeros_vary else name, st.build(scale=perm(st.scale)))
        if zeros_vary:
            yield (name.replace("the scales'", "the scales' and zero points'"),
                   st.build(scale=perm(st.scale), zero=perm(st.zero)))


# -- the group size wrong ----------------------------------------------------------------------------------------
def _group_size(st, case):
    K, n, G = case.K, st.n_groups, st.group_size
    if n < 2 or case.channelwise:
        return
    zeros_vary = bool(np.any(st.zero[:, 1:] != st.zero[:, :1]))
    seen = [st.grp]
    cands = sorted({g for g in _GROUP_SIZES if g < K} | {K // n, -(-K // n)} - {G, 0})
    for Gp in cands:
        grp = np.minimum(np.arange(K) // Gp, n - 1)
        if any(np.array_equal(grp, s) for s in seen):
            continue
        seen.append(grp)
        how = ("K // n_groups" if Gp == K // n else "ceil(K / n_groups)") if Gp in (K // n, -(-K // n)) else "hard-coded"
        name = (f"group size {Gp} ({how}) instead of {G}: column k read with the scale and zero point of group "
                f"min(k // {Gp}, {n - 1})")
        yield name, st.build(grp=grp)
        if zeros_vary:  # the kernel's scale loop on the wrong groups, its zero points right
            yield (name.replace("the scale and zero point", "the scale") + " (zero point right)",
                   (st.q - st.zero[:, st.grp]) * st.scale[:, grp])


# -- packed fields at the wrong stride or width ---------------------------------------------------------------------
def restride(u: np.ndarray, bits: int, stride: int, width: int, order=None) -> np.ndarray:
    """Fields [..., L] (unsigned, ``bits`` wide, packed 32 // bits to an int32 word along the last axis, LSB
    first; ``order``: slot s of a word holds field order[s]) re-extracted with field i of a word read from
    bits ``stride * i`` .. ``stride * i + width - 1`` (bits past the word's 32 read as 0). Returns [..., L]."""
    F = 32 // bits
    L = u.shape[-1]
    pad = (-L) % F
    f = np.concatenate([u, np.zeros(u.shape[:-1] + (pad,), u.dtype)], axis=-1).astype(np.uint64)
    f = f.reshape(u.shape[:-1] + (-1, F))
    if order is not None:  # logical field order[s] sits in slot s
        f = f[..., list(order)]
    words = np.zeros(f.shape[:-1], np.uint64)
    for s in range(F):
        words |= (f[..., s] & np.uint64((1 << bits) - 1)) << np.uint64(bits * s)
    out = np.stack([(words >> np.uint64(stride * s)) & np.uint64((1 << width) - 1) if stride * s < 64
                    else np.zeros_like(words) for s in range(F)], axis=-1)
    if order is not None:
        back = np.empty_like(out)
        back[..., list(order)] = out
        out = back
    return out.reshape(u.shape[:-1] + (-1,))[..., :L].astype(np.float64)


def _field_stride(st, case):
    b = st.bits
    if b not in (2, 4, 8) or case.weight_format not in ("gptq", "awq", "ct-pack-quantized"):
        return
    off = 0.0 if st.unsigned else 2.0 ** (b - 1)  # the stored field is q + off (compressed-tensors: q + 2^(b-1))
    order = awq.AWQ_PACK_ORDER if case.weight_format == "awq" else None
    u = st.q + off
    along_n = st.pack_axis == "N"
    src = u.T if along_n else u  # packed axis last
    pairs = []
    for s in sorted({b // 2, 2 * b, 4, 8} - {0}):
        for w in sorted({b, s}):
            pairs.append((s, w))
    pairs += [(b, w) for w in sorted({4, 8, 2 * b, b // 2} - {b, 0})]
    zero_stored = _zero_fields(st, case)
    seen = set()
    for s, w in pairs:
        if (s, w) in seen or w > 16 or s > 16 or (s, w) == (b, b):
            continue
        seen.add((s, w))
        q2 = restride(src, b, s, w, order)
        q2 = (q2.T if along_n else q2) - off
        what = f"{b}-bit codes extracted with a {s}-bit field stride" if w == b else (
            f"{b}-bit codes extracted as {w}-bit fields" if s == b else
            f"{b}-bit codes extracted as {w}-bit fields at a {s}-bit stride")
        name = (f"{what}: field i of each 32-bit word read from bits {s}i..{s}i+{w - 1} instead of "
                f"{b}i..{b}i+{b - 1} (the packed fields' stride or width wrong)")
        yield name, st.build(q=q2)
        if zero_stored is not None:  # the zero points, packed along N, unpacked by the same code
            zu, zoff = zero_stored
            z2 = restride(zu.T, b, s, w, order).T + zoff
            if not np.array_equal(z2, st.zero):  # else the same hypothesis as the codes' alone
                yield name + " (codes and zero points alike)", st.build(q=q2, zero=z2)


def _zero_fields(st, case):
    """(stored zero-point fields [N, G], what a reader adds back) where the zero points are packed with the
    codes' field width along N and vary (GPTQ v1: z - 1 stored, mod 2^b; v2 and AWQ: z; compressed-tensors:
    z + 2^(b-1)); None otherwise."""
    if not np.any(st.zero) or case.weight_format not in ("gptq", "awq", "ct-pack-quantized"):
        return None
    if case.weight_format == "ct-pack-quantized" and case.sym:
        return None
    b = st.bits
    if case.weight_format == "gptq":
        d = 1.0 if case.gptq_zero_convention == "gptq" else 0.0
        return np.mod(st.zero - d, 2 ** b), d
    if case.weight_format == "awq":
        return st.zero.copy(), 0.0
    return st.zero + 2.0 ** (b - 1), -(2.0 ** (b - 1))
