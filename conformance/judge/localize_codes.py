"""Failure localization, integer codes and zero points: one code value read as another (code -128 read as -127,
...), and the zero-point term of every group applied to every column.

Semantics: docs/conformance.md#failure-localization. The weight diff of conformance/judge/localize_weights.py
tries these hypotheses next to its others (the same greedy claim with its >= 90 % place rule): for each code
value c among the elements no other hypothesis has explained yet, the code the read-back weights imply there,
((read-back weight / v) / s + z); when those agree on one other integer c', "code c read as c'" is a
hypothesis (every element of code c changed, the rest kept). The E2M1 table of MXFP4 has its own (FP4 code
read as a value); this is the integer formats' counterpart.

``zero_term_hypotheses``: a kernel that removes the zero point as a compensation term, z_g * sum_k qx[k], over
the whole row instead of over the columns of group g, computes a linear map whose weight of column k is
s_g(k) q[n, k] - sum_g s_g z_g[n]: every column carries every group's zero-point term (docs/formats/
activations.md names the compensation form).
"""

from __future__ import annotations

import numpy as np

__all__ = ["code_value_hypotheses", "zero_term_hypotheses"]

#: at most this many code values (the most frequent among the unexplained elements) are tried
MAX_CODES = 8


def _note(c: int, c2: int, lo: int, hi: int) -> str:
    if c == lo and c2 == lo + 1:
        return f" (the lowest code clamped: a symmetric code range [{lo + 1}, {hi}])"
    if c == hi and c2 == hi - 1:
        return f" (the highest code clamped: a code range [{lo}, {hi - 1}])"
    if c2 == -c:
        return " (its sign flipped)"
    return ""


def code_value_hypotheses(st, obs_w: np.ndarray, exp_w: np.ndarray, todo: np.ndarray, ks: np.ndarray) -> list:
    """[(name, weights [N, K])]: for integer codes, each code value c of the unexplained elements ``todo``
    [N, len(ks)] read as the one other integer code c' the read-back weights ``obs_w`` imply there (``exp_w``:
    the expected read-back, giving the probe value v = exp_w / W)."""
    if st.kind != "int" or not todo.any():
        return []
    Wk = st.W[:, ks]
    g = st.grp[ks]
    s, z = st.scale[:, g], st.zero[:, g]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        ratio = exp_w / Wk
        ratio = ratio[todo & (Wk != 0) & np.isfinite(ratio)]
        ratio = ratio if ratio.size else (exp_w / Wk)[(Wk != 0) & np.isfinite(exp_w / Wk)]
        if not ratio.size:
            return []
        v = float(np.median(ratio))
        implied = obs_w / (v * s) + z
    codes = st.codes[:, ks]
    lo, hi = ((0, 2 ** st.bits - 1) if st.unsigned else (-(2 ** (st.bits - 1)), 2 ** (st.bits - 1) - 1))
    vals, counts = np.unique(codes[todo], return_counts=True)
    out = []
    for c in vals[np.argsort(-counts)][:MAX_CODES]:
        r = implied[todo & (codes == c) & np.isfinite(implied)]
        if not r.size:
            continue
        c2 = float(np.median(r))
        if abs(c2 - round(c2)) > 0.05 or round(c2) == c or not lo - 1 <= round(c2) <= hi + 1:
            continue
        c, c2 = int(c), int(round(c2))
        out.append((f"code {c} read as {c2}{_note(c, c2, lo, hi)}", st.build(q=np.where(st.codes == c, c2, st.q))))
    return out


def zero_term_hypotheses(st) -> list:
    """[(name, weights [N, K])]: the zero-point compensation summed over the whole row (grouped integer weights
    with zero points)."""
    if st.kind != "int" or st.n_groups < 2 or not np.any(st.zero):
        return []
    with np.errstate(invalid="ignore", over="ignore"):
        Wh = st.scale[:, st.grp] * st.q - (st.scale * st.zero).sum(axis=1)[:, None]
    return [("the zero-point compensation z_g * sum_k qx[k] taken over the whole row instead of group g's columns "
             "(every column carries every group's zero-point term, sum_g s_g z_g)", Wh)]
