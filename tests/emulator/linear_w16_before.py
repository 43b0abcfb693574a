"""The A16 exact reference's fast path as it stood before emulator/fast_linear_w16.py replaced it: main at 9556177,
``emulator/linear.py`` ``linear_w16(..., fp32_magnitudes=True)`` (the bound from a float32 GEMM of the magnitudes)
and its helpers, kept verbatim (linear.py's helpers under the public names they have since) as the baseline
of the regression gate in tests/emulator/test_fast_linear_w16.py. Test code only: nothing outside that test imports it.
"""

from __future__ import annotations

import numpy as np

from emulator.errors import require
from emulator.linear import (LinearResult, activations_float64, add_bias, bias_float64, bias_terms, decide_exactly,
                             dtype_name, exact_in_float64, gamma, rounded_result)
from emulator.numerics.rounding import as_float64


def linear_w16(x, w, bias=None, *, out_dtype: str | None = None, fp32_magnitudes: bool = False) -> LinearResult:
    """A16 with dequantized weights w [N, K] (W4A16, W8A16, MXFP4 W4A16): x @ w^T + bias.

    ``w`` is the exact dequantized weight (float32 or float64 values).

    ``fp32_magnitudes`` (speed; float32 ``w`` only): sum_k |x w| is taken from a float32 GEMM, raised to a
    rigorous upper bound (``magnitudes_upper_bound_fp32``), instead of a second float64 GEMM, and no element is
    proved exact in float64 (``exact_in_float64``). ``y`` is the same (every element the bound leaves
    undecided is decided from its exact value); ``y_ambiguous`` may mark more elements and ``mag`` is that
    upper bound.
    """
    out_dtype = out_dtype or dtype_name(x)
    w_in = np.asarray(w)
    w64 = as_float64(w)
    require(w64.ndim == 2, f"expected weight [N, K], got shape {list(w64.shape)}", tensor="weight")
    N, K = w64.shape
    x64 = activations_float64(x, K)
    b = bias_float64(bias, N)
    fast = fp32_magnitudes and w_in.dtype == np.float32
    with np.errstate(invalid="ignore", over="ignore"):
        # speed: y^T = w @ x^T measured faster in OpenBLAS here for M >= 16 (docs/performance.md); a fresh [K, M]
        # x^T (a transposed view of a [1, K] x keeps a K-stride on its unit axis, which leaves BLAS)
        y = _t_matmul(w64, x64) if fast else x64 @ w64.T
        mag = magnitudes_upper_bound_fp32(x64, w_in) if fast else None
        if mag is None:
            mag = np.abs(x64) @ np.abs(w64).T
    if fast:
        # no proof that float64 was exact (it seldom is on real activations, and reading every weight's lowest
        # set bit costs a dozen passes over it): where it was, the element is at worst undecided, then decided
        bound = np.where(mag == 0, 0.0, gamma(K) * mag)
    else:
        # the lowest set bits of a float32 weight are read in float32 (the same values, half the bytes)
        bound = np.where(exact_in_float64(x64, w_in if w_in.dtype == np.float32 else w64, mag), 0.0, gamma(K) * mag)
    if bias is None:
        y = y + 0.0  # what adding the zero bias does (-0 becomes +0), without its TwoSum passes
    else:
        y, bound = add_bias(y, bound, b)
    if fast:  # float32 factors: their products are exact float64s (exact_sum._rows_products)
        x32 = x64.astype(np.float32)
        return decide_exactly(rounded_result(y, bound, out_dtype, mag=mag),
                              lambda ms, ns: [(x32[ms], w_in[ns])] + bias_terms(bias, b, ns))
    return decide_exactly(rounded_result(y, bound, out_dtype, mag=mag),
                          lambda ms, ns: [(x64[ms], w64[ns])] + bias_terms(bias, b, ns))


def _t_matmul(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x @ w^T computed as (w @ x^T)^T, C-contiguous [M, N] (a float sum in another order: callers bound it)."""
    xt = np.empty((x.shape[1], x.shape[0]), dtype=x.dtype)
    xt[...] = x.T
    return np.ascontiguousarray((w @ xt).T)


def magnitudes_upper_bound_fp32(x64: np.ndarray, w32: np.ndarray) -> np.ndarray | None:
    """An upper bound of sum_k |x[m, k] w[n, k]| (float64 [M, N]) from one float32 GEMM, or None where x is not
    float32-valued or the float32 GEMM overflows.

    The terms are non-negative, so the float32 result c32 of any summation order (blocked, with or without
    FMA) satisfies c <= c32 / (1 - gamma_K(2**-24)) plus, for products that underflow, at most 2**-150 each
    (additions of subnormals are exact): c <= (c32 + K 2**-149) / (1 - gamma_K(2**-24)). The float64
    evaluation of that expression rounds at most four times; the factor 1 + 2**-40 covers it."""
    x32 = x64.astype(np.float32)
    if not np.array_equal(x32, x64):
        return None
    K = x64.shape[1]
    c32 = _t_matmul(np.abs(w32), np.abs(x32))
    if not np.all(np.isfinite(c32)):
        return None
    return (c32.astype(np.float64) + K * 2.0 ** -149) * ((1.0 + 2.0 ** -40) / (1.0 - gamma(K, 2.0 ** -24)))
