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

__all__ = ["two_product", "exact_terms", "product_terms", "round_exact_sum", "round_exact_products",
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
