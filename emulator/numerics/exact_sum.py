"""Exactly rounded sums of exact products: how the reference decides an output float64 cannot.

Semantics: docs/formats/activations.md#reference-linear ("Deciding the undecided elements").

The reference linear layers evaluate y in float64 with a rigorous error bound. Where that bound
straddles a rounding boundary of the output dtype, float64 alone cannot say which neighbour the
exact value rounds to, and two float64 evaluation orders (one BLAS call over a whole layer, or one
per block of rows) may pick different ones. These elements are few (about 1e-5 of them at K = 4096),
so each is decided here from its exact value:

- ``two_product(a, b)``: Dekker's product (Veltkamp split), ``a * b == p + e`` exactly for float64
  operands whose product neither overflows nor underflows (checked by ``exact_terms``; the operands
  of every quantized format are far inside that range);
- the exact value is the sum of such terms; ``math.fsum`` returns it correctly rounded to float64
  (Shewchuk's algorithm, exact partials), and ``fsum`` of the terms and ``-s`` the sign of the
  residual exact - s;
- ``round_exact_sum`` rounds the exact value once to the output dtype: a correctly rounded float64
  ``s`` rounds to the same output value as the exact sum except where ``s`` is itself a midpoint of
  the output grid (midpoints have one more significand bit than the output dtype, so they are float64
  values); there the residual's sign picks the neighbour, and a zero residual the even one (RNE).

``exact_sum_fraction`` does the same with Python's rationals (``fractions.Fraction``): the slow,
obviously exact oracle the tests compare against, and the path for terms outside ``two_product``'s
range.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .floats import round_to_dtype
from .rounding import Rounding

__all__ = ["two_product", "two_sum", "sum_signs", "decide_rows", "exact_terms", "product_terms", "round_exact_sum", "round_exact_products",
           "exact_products_fraction", "round_fraction"]

_SPLIT = 134217729.0  # 2**27 + 1: Veltkamp's splitter for 53-bit significands
#: two_product is exact when every operand is below this (the split's c * a does not overflow) ...
_MAX_OPERAND = 2.0 ** 995
#: ... and every nonzero product at least this (its error term does not underflow: Dekker's condition)
_MIN_PRODUCT = 2.0 ** -960


def two_product(a, b) -> tuple[np.ndarray, np.ndarray]:
    """(p, e) with p = fl(a * b) and a * b = p + e exactly (float64, elementwise; see the module)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    p = a * b
    ca = _SPLIT * a
    ah = ca - (ca - a)
    al = a - ah
    cb = _SPLIT * b
    bh = cb - (cb - b)
    bl = b - bh
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


def exact_terms(a, b) -> np.ndarray | None:
    """Float64 terms whose exact sum is sum_k a_k * b_k, or None where ``two_product`` is not proved
    exact for these operands (non-finite, too large, or a product too small)."""
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return None
    if a.size and (np.max(np.abs(a)) >= _MAX_OPERAND or np.max(np.abs(b)) >= _MAX_OPERAND):
        return None
    p, e = two_product(a, b)
    nz = np.abs(p[p != 0])
    if nz.size and nz.min() < _MIN_PRODUCT:
        return None
    if np.any((p == 0) & (a != 0) & (b != 0)):  # a product that underflowed to zero
        return None
    return np.concatenate([p, e])


def _max_finite(out_dtype: str) -> float:
    return {"float32": float(np.finfo(np.float32).max), "float16": 65504.0,
            "bfloat16": float.fromhex("0x1.fep127")}[out_dtype]


def _rne(v: float, out_dtype: str) -> float:
    return float(round_to_dtype(np.array([v]), out_dtype, Rounding.RNE)[0])


def _decide(s: float, residual_sign: int, out_dtype: str) -> float:
    """RNE to ``out_dtype`` of exact = s + r, given s = the exact value correctly rounded to float64 and
    the sign of r (-1, 0, 1)."""
    d = _rne(s, out_dtype)
    if d == s or residual_sign == 0:
        return d
    if math.isinf(d):
        # the overflow threshold max + ulp(max)/2 is the one "midpoint" beside Inf
        top = _max_finite(out_dtype)
        other = math.copysign(top, s)
        threshold = math.copysign(top + (2.0 ** (math.frexp(top)[1]) - top) / 2, s)
        mid = s == threshold
    else:
        other = 2 * s - d  # exact (Sterbenz): the neighbour across s if s is a midpoint
        mid = other != d and _rne(other, out_dtype) == other
    if not mid:
        return d
    up = residual_sign > 0
    return max(d, other) if up else min(d, other)


def round_exact_sum(terms, out_dtype: str) -> float:
    """The exact sum of the float64 ``terms`` (all finite) rounded once (RNE) to ``out_dtype``."""
    t = [float(v) for v in np.asarray(terms, dtype=np.float64).reshape(-1)]
    s = math.fsum(t)
    if not math.isfinite(s):  # the exact sum exceeds float64: not a case the reference's bound marks
        raise OverflowError("exact sum outside the float64 range")
    r = math.fsum(t + [-s])
    return _decide(s, (r > 0) - (r < 0), out_dtype)


def product_terms(factors) -> np.ndarray | None:
    """Float64 terms whose exact sum is sum_k prod_i factors[i][k] (one, two or three factor arrays of one
    length), or None where ``two_product`` is not proved exact for them."""
    fs = [np.asarray(f, dtype=np.float64).reshape(-1) for f in factors]
    if len(fs) == 1:
        return fs[0] if np.all(np.isfinite(fs[0])) else None
    t = exact_terms(fs[0], fs[1])
    if t is None or len(fs) == 2:
        return t
    if len(fs) == 3:  # (p + e) * c = p * c + e * c, each split again
        c = np.concatenate([fs[2], fs[2]])
        return exact_terms(t, c)
    raise ValueError(f"product_terms: {len(fs)} factors (at most 3)")


def exact_products_fraction(products) -> Fraction:
    """sum over ``products`` (tuples of factor arrays) of sum_k prod_i f_i[k], in Python rationals (exact)."""
    total = Fraction(0)
    for factors in products:
        cols = [np.asarray(f, dtype=np.float64).reshape(-1) for f in factors]
        for vals in zip(*cols):
            term = Fraction(1)
            for v in vals:
                term *= Fraction(float(v))
            total += term
    return total


def round_exact_products(products, out_dtype: str) -> float:
    """sum over ``products`` (tuples of 1-3 equally long factor arrays; a bias is a 1-tuple) of
    sum_k prod_i f_i[k], exactly, rounded once (RNE) to ``out_dtype``: by ``two_product`` and ``math.fsum``,
    or by rationals where ``two_product``'s range does not hold."""
    terms = []
    for factors in products:
        t = product_terms(factors)
        if t is None:
            return round_fraction(exact_products_fraction(products), out_dtype)
        terms.append(t)
    return round_exact_sum(np.concatenate(terms) if terms else np.zeros(0), out_dtype)


def round_fraction(f: Fraction, out_dtype: str) -> float:
    """A rational rounded once (RNE) to ``out_dtype``: float(f) is correctly rounded to float64 (CPython
    divides the integers exactly rounded), then the same midpoint rule as ``round_exact_sum``."""
    s = float(f)
    diff = f - Fraction(s)
    return _decide(s, (diff > 0) - (diff < 0), out_dtype)


# --------------------------------------------------------------------------- vectorised: many elements at once
#
# The elements float64 leaves undecided are decided together (docs/formats/activations.md#deciding-the-
# undecided-elements): every element's products split exactly into float64 terms (``two_product``, rows
# outside its proved range are left to ``round_exact_products``), the rounding boundary mu between the two
# output values its bounded interval straddles appended as the term -mu, and the sign of the exact sum of
# each row's terms found by exact extraction (``sum_signs``).


def two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(s, e) with s = fl(a + b) and a + b = s + e exactly (Knuth's TwoSum; float64, any magnitudes without
    overflow: an addition that underflows is exact)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _distil(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(S [U], R [U, n']) with S + sum(R) == sum(t) exactly for each row of t [U, n]: a pairwise tree of
    ``two_sum`` (S the tree's float64 sum, R every addition's error)."""
    errs = []
    while t.shape[1] > 1:
        if t.shape[1] % 2:
            t = np.concatenate([t, np.zeros((t.shape[0], 1))], axis=1)
        s, e = two_sum(t[:, 0::2], t[:, 1::2])
        errs.append(e)
        t = s
    r = np.concatenate(errs, axis=1) if errs else np.zeros((t.shape[0], 1))
    return t[:, 0], r


#: extraction passes before an element is left to the one-element path (each pass leaves terms at most
#: 2**-53 n of the previous largest; random layers decide in the first)
MAX_PASSES = 40
_EPS = 2.0 ** -53


def sum_signs(t: np.ndarray) -> np.ndarray:
    """sign(sum_k t[u, k]) of the exact sum of each row (int8: -1, 0, 1), or 2 where MAX_PASSES did not
    decide it (also rows holding a non-finite term, and rows whose magnitudes leave float64's normal range).

    Each pass splits every term exactly at one power of two per row (Rump, Ogita and Oishi, "Accurate
    floating-point summation part I: faithful rounding", SIAM J. Sci. Comput. 31(1), 2008, Lemma 3.2,
    ExtractScalar): with mu = max |t_k|, 2**e > mu and sigma = 2**(M + e), 2**M >= n + 2, each
    q_k = fl(fl(sigma + t_k) - sigma) and r_k = fl(t_k - q_k) satisfy q_k + r_k = t_k exactly, q_k a multiple of
    eps sigma (eps = 2**-53) and |r_k| <= eps sigma. Every partial sum of the q_k is then a multiple of
    eps sigma below sigma in magnitude, so tau = fl(sum q_k) is exact in any order. The exact sum is
    tau + sum r_k with |sum r_k| <= n eps sigma: where |tau| exceeds that (an exact comparison: powers of
    two times integers), the sign is tau's; where tau and every r_k are zero, the sum is zero; other rows
    continue with the terms (tau, r_1, ..., r_n). A row whose eps sigma would fall below float64's normal
    range (the lemma's condition) is first scaled by 2**600 (exact: its terms are all below 2**-900); one
    whose sigma would overflow (terms near 2**1000) is refused (2)."""
    t = np.asarray(t, dtype=np.float64)
    out = np.full(t.shape[0], 2, dtype=np.int8)
    idx = np.arange(t.shape[0])
    with np.errstate(over="ignore", invalid="ignore"):
        ok = np.all(np.isfinite(t), axis=1)
        t, idx = t[ok], idx[ok]
        for _ in range(MAX_PASSES):
            if idx.size == 0:
                break
            n = t.shape[1]
            M = int(np.ceil(np.log2(n + 2)))
            mu = np.maximum(t.max(axis=1), -t.min(axis=1))
            zero = mu == 0
            out[idx[zero]] = 0
            e = np.frexp(mu)[1].astype(np.int64)  # mu < 2**e (mu = f 2**e, f in [0.5, 1))
            tiny = ~zero & (e + M - 53 < -1022)
            if tiny.any():  # scaled by 2**600: exact for every float64 of such a row, the sign unchanged
                t[tiny] *= 2.0 ** 600
                e[tiny] += 600
            k = e + M
            fit = ~zero & (k <= 1023) & (k - 53 >= -1022)
            t, idx, k = t[fit], idx[fit], k[fit]
            sigma = np.ldexp(1.0, k)[:, None]
            q = sigma + t
            q -= sigma
            tau = q.sum(axis=1)
            room = n * np.ldexp(_EPS, k)  # n eps sigma: exact (an integer times a power of two)
            by_tau = np.abs(tau) > room
            out[idx[by_tau]] = np.sign(tau[by_tau]).astype(np.int8)
            rest = ~by_tau
            r = t[rest] - q[rest]  # the low parts, only for the rows that continue
            tau, idx = tau[rest], idx[rest]
            zero = (tau == 0) & ~np.any(r, axis=1)
            out[idx[zero]] = 0
            t = np.concatenate([tau[~zero, None], r[~zero]], axis=1)
            idx = idx[~zero]
    return out


def _rows_in_range(a: np.ndarray, b: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Rows where ``two_product(a, b)`` is proved exact (the conditions of ``exact_terms``, per row)."""
    with np.errstate(invalid="ignore"):
        ok = np.all(np.isfinite(a), axis=1) & np.all(np.isfinite(b), axis=1)
        ok &= np.all(np.abs(a) < _MAX_OPERAND, axis=1) & np.all(np.abs(b) < _MAX_OPERAND, axis=1)
        ok &= ~np.any((p != 0) & (np.abs(p) < _MIN_PRODUCT), axis=1)
        ok &= ~np.any((p == 0) & (a != 0) & (b != 0), axis=1)  # a product that underflowed to zero
    return ok


def _float32_valued(a: np.ndarray) -> bool:
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.all(np.isfinite(a))) and np.array_equal(a.astype(np.float32), a)


def _rows_products(factors) -> tuple[np.ndarray, np.ndarray]:
    """(terms [U, n], ok [U]): float64 terms whose exact row sums are sum_k prod_i factors[i][u, k] (one, two
    or three [U, L] factor arrays), exact on the rows ``ok`` marks (``product_terms`` by rows)."""
    raw = [np.asarray(f) for f in factors]
    if len(raw) == 2 and raw[0].dtype == np.float32 and raw[1].dtype == np.float32:
        # two float32 values: the product of two 24-bit significands is a float64 (48 bits, |p| between
        # 2**-298 and 2**256 when nonzero): fl(a * b) is exact; non-finite rows are left to sum_signs
        return raw[0].astype(np.float64) * raw[1], np.ones(raw[0].shape[0], dtype=bool)
    fs = [np.asarray(f, dtype=np.float64) for f in raw]
    if len(fs) == 1:
        return fs[0], np.all(np.isfinite(fs[0]), axis=1)
    if len(fs) > 3:
        raise ValueError(f"product terms: {len(fs)} factors (at most 3)")
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        if len(fs) == 2 and _float32_valued(fs[0]) and _float32_valued(fs[1]):
            # two float32 values: the product of two 24-bit significands is a float64 (48 bits, |p| between
            # 2**-298 and 2**256 when nonzero), so fl(a * b) is exact and TwoProduct's error term zero
            return fs[0] * fs[1], np.ones(fs[0].shape[0], dtype=bool)
        p, e = two_product(fs[0], fs[1])
        ok = _rows_in_range(fs[0], fs[1], p)
        if len(fs) == 2:
            return (np.concatenate([p, e], axis=1) if np.any(e) else p), ok
        c = fs[2]  # (p + e) * c = p * c + e * c, each split again
        p1, e1 = two_product(p, c)
        p2, e2 = two_product(e, c)
        ok &= _rows_in_range(p, c, p1) & _rows_in_range(e, c, p2)
    return np.concatenate([p1, e1, p2, e2], axis=1), ok


def decide_rows(lo: np.ndarray, hi: np.ndarray, mu: np.ndarray, groups) -> tuple[np.ndarray, np.ndarray]:
    """(sign, decided) for U elements whose exact value v (the sum over ``groups``, each a tuple of 1-3 [U, L]
    factor arrays: v[u] = sum over groups of sum_k prod_i f_i[u, k]) lies between ``lo`` and ``hi``, adjacent
    output values with the one rounding boundary ``mu`` between them (output_grid.boundary_between):
    sign(v - mu) (int8), so v rounds to lo where it is -1, to hi where +1 and to rne(mu) where 0;
    ``decided`` False where the proof did not hold (operands outside ``two_product``'s range, a sum
    ``sum_signs`` left undecided): the caller decides those one at a time."""
    U = lo.shape[0]
    parts, ok = [], np.ones(U, dtype=bool)
    for factors in groups:
        t, good = _rows_products(factors)
        parts.append(t)
        ok &= good
    parts.append(-np.asarray(mu, dtype=np.float64).reshape(U, 1))
    terms = np.concatenate(parts, axis=1)
    sign = np.full(U, 2, dtype=np.int8)
    if ok.any():
        sign[ok] = sum_signs(terms[ok])
    return sign, sign != 2


def refined_values(groups) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(s, b, ok) with |v - s| <= b for each element's exact value v (the sum over ``groups``, as in
    ``decide_rows``), b about one float64 rounding of v: for elements whose first float64 interval spans
    several output values (a sum that cancels). One distillation: v = S + sum R exactly, r = fl(sum R),
    a = fl(sum |R|); s = fl(S + r); |v - s| <= 2 gamma_n a + u |s| (1 + u), raised by 1 + 2**-40 for the
    float64 evaluation of the bound itself. ``ok`` False where the terms are outside ``two_product``'s range
    or not finite."""
    from .output_grid import U64, gamma

    parts, ok = [], None
    for factors in groups:
        t, good = _rows_products(factors)
        parts.append(t)
        ok = good if ok is None else ok & good
    terms = np.concatenate(parts, axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        ok &= np.all(np.isfinite(terms), axis=1)
        S, R = _distil(np.where(ok[:, None], terms, 0.0))
        r = R.sum(axis=1)
        a = np.abs(R).sum(axis=1)
        s = S + r
        b = (2.0 * gamma(max(2, R.shape[1])) * a + 2.0 * U64 * np.abs(s)) * (1.0 + 2.0 ** -40)
        ok &= np.isfinite(s) & np.isfinite(b)
    return s, b, ok
