"""Reference linear layers for every scheme: y = x @ W^T + bias.

Semantics: docs/formats/activations.md#reference-linear.

Each function returns a ``LinearResult``:

- ``y_exact`` (float64): the mathematically exact result of the scheme's
  definition, computed in float64. Where float64 itself can round (sums of
  products of fp32-range values), ``y_bound`` is a rigorous bound on
  |y_exact - exact| (Higham's gamma_n applied to the float64 evaluation);
  integer paths are exact (``y_bound`` = 0), since every partial sum of int8 x
  int8 (or int4) products is an integer below 2**53.
- ``y``: the exact result rounded to the output dtype with RNE (the value a
  kernel that accumulates exactly and rounds once would return).
- ``y_ambiguous``: elements where y_exact +- y_bound straddles a rounding
  boundary of the output dtype, so float64 alone cannot say which neighbour the
  exact value rounds to; ``y`` there is decided from the exact value
  (``decide_exactly``, emulator/numerics/exact_sum.py), so ``y`` is the exact
  result rounded once at every element, whatever the float64 evaluation order.
- ``acc``: the exact integer accumulator for int paths ([M, N], or
  [M, n_groups, N] for W4A8).
- ``parts``: the intermediates (activation codes and scales, ties) that the
  conformance suite compares tie-aware.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .errors import FormatError, require
from .activations import int8 as a8
from .formats import mxfp4 as mx
from .fast_linear import exact_int_matmul, lowest_bit_exponent, row_min_lowest_bit
from .numerics import exact_sum, output_grid
from .numerics.fpu_state import require_gradual_underflow
from .numerics.output_grid import gamma, round_output
from .numerics.rounding import as_float64

__all__ = [
    "decide_exactly",
    "LinearResult",
    "DECIDE_BYTES",
    "dtype_name",
    "activations_float64",
    "bias_float64",
    "add_bias",
    "bias_terms",
    "rounded_result",
    "gamma",
    "round_output",
    "lowest_bit_exponent",
    "exact_in_float64",
    "linear_w16",
    "linear_w8a8",
    "linear_w4a8",
    "linear_mxfp4_w4a4",
]

OUT_DTYPES = output_grid.OUT_DTYPES


@dataclasses.dataclass
class LinearResult:
    y: np.ndarray
    y_exact: np.ndarray
    y_bound: np.ndarray
    y_ambiguous: np.ndarray
    out_dtype: str
    acc: np.ndarray | None = None
    parts: dict = dataclasses.field(default_factory=dict)
    #: sum_k |a_k b_k| in float64 where the path formed it (A16, MXFP4): acceptance bounds reuse it
    mag: np.ndarray | None = None


def dtype_name(x) -> str:
    """'float32' | 'float16' | 'bfloat16' for a numpy array (bf16 via ml_dtypes, by name)."""
    name = np.asarray(x).dtype.name
    if name not in OUT_DTYPES:
        raise FormatError(f"activations must be float32, float16 or bfloat16, got {name}", tensor="x")
    return name


def bias_float64(bias, N: int) -> np.ndarray:
    if bias is None:
        return np.zeros(N, dtype=np.float64)
    b = as_float64(bias)
    require(b.shape == (N,), f"expected bias of shape [{N}], got {list(b.shape)}", tensor="bias")
    return b


def bias_sum(y: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fl(y + b), |its rounding error|) in float64: the error exact by TwoSum (``exact_sum.two_sum``), 0 where it
    is not finite."""
    with np.errstate(invalid="ignore", over="ignore"):
        s, err = exact_sum.two_sum(y, b)
    return s, np.where(np.isfinite(err), np.abs(err), 0.0)


def add_bias(y: np.ndarray, bound: np.ndarray, b: np.ndarray):
    """y + bias in float64; the addition's rounding (if any) is added to the bound."""
    s, extra = bias_sum(y, b)
    return s, bound + extra


def rounded_result(y64, bound, out_dtype, acc=None, parts=None, mag=None) -> LinearResult:
    # round_output's arrays, its outward-rounded ends formed only where a cheap test does not decide (speed)
    y, amb = output_grid.round_output_fast(y64, bound, out_dtype)
    return LinearResult(y=y, y_exact=y64, y_bound=bound, y_ambiguous=amb, out_dtype=out_dtype,
                        acc=acc, parts=parts or {}, mag=mag)


#: bytes of float64 terms one vectorised decision pass holds at a time (a chunk of undecided elements)
DECIDE_BYTES = 32 << 20


def decide_exactly(res: LinearResult, groups_at, *, at: tuple[np.ndarray, np.ndarray] | None = None) -> LinearResult:
    """``res.y`` at the elements ``res.y_ambiguous`` marks, from their exact value; everywhere else the float64
    bound already decided ``y``. ``groups_at(ms, ns)`` lists, for the elements (ms[u], ns[u]), the tuples of
    [U, L] factor arrays whose summed products are each element's exact value (the path's own definition; a
    bias is a 1-tuple of [U, 1]).

    All of them at once (docs/formats/activations.md#deciding-the-undecided-elements): the one rounding
    boundary mu between the two output values the element's bounded interval straddles, and the sign of
    (exact value - mu) from error-free transformations (emulator/numerics/exact_sum.py ``decide_rows``).
    An element that proof cannot decide (operands outside TwoProduct's range, intervals spanning more than
    one boundary, sums that do not distil) is rounded one at a time by ``round_exact_products``. ``at``: the
    (ms, ns) indices of ``res.y_ambiguous``'s True elements where the caller has them (speed only)."""
    if at is None:
        if not res.y_ambiguous.any():
            return res
        ms, ns = np.nonzero(res.y_ambiguous)
    else:
        ms, ns = at
        if not ms.size:
            return res
    val = np.full(ms.shape, np.nan)
    _decide_between(val, res.y_exact[ms, ns], res.y_bound[ms, ns], res.out_dtype, ms, ns, groups_at, refine=True)
    for i in np.nonzero(np.isnan(val))[0]:  # the one-element path: Python's exact sums, or rationals
        groups = groups_at(ms[i:i + 1], ns[i:i + 1])
        val[i] = exact_sum.round_exact_products([tuple(f[0] for f in g) for g in groups], res.out_dtype)
    res.y[ms, ns] = val
    return res


def _decide_between(val, s, b, out_dtype, ms, ns, groups_at, *, refine: bool) -> None:
    """Fill ``val`` (NaN: not yet decided) for the elements (ms, ns) whose exact value lies in s +- b: by the sign
    of (exact value - the one rounding boundary in that interval); where the interval holds more than one
    boundary (a sum that cancels), first narrow it by ``exact_sum.refined_values`` (``refine``)."""
    lo, hi, mu, ok = output_grid.boundary_between(s, b, out_dtype)
    # a zero neighbour: the sign of a zero result is the exact value's, which the sign of (v - mu) does not
    # give (|v| below the output dtype's smallest subnormal): left to the one-element path
    ok &= (lo != 0) & (hi != 0)
    tie = output_grid.rne(np.where(ok, mu, 0.0), out_dtype)
    todo = np.nonzero(ok)[0]
    if todo.size:
        g1 = groups_at(ms[:1], ns[:1])
        width = sum(max(f.shape[1] for f in g) * (1 << (len(g) - 1)) * 2 for g in g1) + 1
        step = max(1, DECIDE_BYTES // (8 * width))
        for c0 in range(0, todo.size, step):
            u = todo[c0:c0 + step]
            sign, decided = exact_sum.decide_rows(lo[u], hi[u], mu[u], groups_at(ms[u], ns[u]))
            v = np.where(sign < 0, lo[u], np.where(sign > 0, hi[u], tie[u]))
            val[u[decided]] = v[decided]
    wide = np.nonzero(~ok & np.isfinite(s) & np.isfinite(b))[0]
    if refine and wide.size:
        s2, b2, good = exact_sum.refined_values(groups_at(ms[wide], ns[wide]))
        wide, s2, b2 = wide[good], s2[good], b2[good]
        y2, amb2 = output_grid.round_output(s2, b2, out_dtype)
        done = ~amb2 & (y2 != 0)  # a zero's sign is the exact value's: the one-element path decides those
        val[wide[done]] = y2[done]  # the narrowed interval decides these by itself
        sub = np.full(int(amb2.sum()), np.nan)
        w2 = wide[amb2]
        if w2.size:
            _decide_between(sub, s2[amb2], b2[amb2], out_dtype, ms[w2], ns[w2], groups_at, refine=False)
            val[w2] = sub


def bias_terms(bias, b: np.ndarray, ns: np.ndarray) -> list:
    return [] if bias is None else [(b[ns][:, None],)]


def exact_in_float64(a64: np.ndarray, b64: np.ndarray, mag: np.ndarray) -> np.ndarray:
    """Where float64 evaluation of sum_k a[m,k] * b[n,k] is provably exact.

    Every product is a multiple of 2**(ea_min[m] + eb_min[n]) (lowest set bits), so
    every partial sum is too; if the sum of magnitudes stays below 2**53 times that
    quantum, no partial sum (nor product) can round.
    """
    ea = row_min_lowest_bit(a64)
    eb = row_min_lowest_bit(b64)
    q = ea[:, None] + eb[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        room = np.log2(np.where(mag > 0, mag, 1.0)) - q
    return (mag == 0) | (np.isfinite(q) & (room < 52)) | ~np.isfinite(q)


def activations_float64(x, K: int) -> np.ndarray:
    require_gradual_underflow()  # a flushed subnormal would be a silent wrong value (numerics/fpu_state.py)
    x64 = as_float64(x)
    require(x64.ndim == 2, f"expected activations [M, K], got shape {list(x64.shape)}", tensor="x")
    require(x64.shape[1] == K, f"activations have K={x64.shape[1]} but the weight has K={K}", tensor="x")
    return x64


def linear_w16(x, w, bias=None, *, out_dtype: str | None = None) -> LinearResult:
    """A16 with dequantized weights w [N, K] (W4A16, W8A16, MXFP4 W4A16): x @ w^T + bias.

    ``w`` is the exact dequantized weight (float32 or float64 values). The readable definition: y and
    sum_k |x w| from two float64 GEMMs. Its speed code (the same ``y`` from one GEMM and row norms, for float32
    weights): emulator/fast_linear_w16.py ``linear_w16_fast``.
    """
    out_dtype = out_dtype or dtype_name(x)
    w_in = np.asarray(w)
    w64 = as_float64(w)
    require(w64.ndim == 2, f"expected weight [N, K], got shape {list(w64.shape)}", tensor="weight")
    N, K = w64.shape
    x64 = activations_float64(x, K)
    b = bias_float64(bias, N)
    with np.errstate(invalid="ignore", over="ignore"):
        y = x64 @ w64.T
        mag = np.abs(x64) @ np.abs(w64).T
    # the lowest set bits of a float32 weight are read in float32 (the same values, half the bytes)
    bound = np.where(exact_in_float64(x64, w_in if w_in.dtype == np.float32 else w64, mag), 0.0, gamma(K) * mag)
    if bias is None:
        y = y + 0.0  # what adding the zero bias does (-0 becomes +0), without its TwoSum passes
    else:
        y, bound = add_bias(y, bound, b)
    return decide_exactly(rounded_result(y, bound, out_dtype, mag=mag),
                          lambda ms, ns: [(x64[ms], w64[ns])] + bias_terms(bias, b, ns))


def linear_w8a8(x, w_q, w_scale, bias=None, *, act: a8.Int8ActVariant = a8.CANONICAL_SYM,
                out_dtype: str | None = None, int_engine=None, quantize=None) -> LinearResult:
    """W8A8 dynamic: int8 weights [N, K] with per-channel scales [N] (or [N, 1]).

    ``int_engine`` (speed only): an engine for the exact integer accumulator (emulator/fast_linear.py
    ``exact_int_matmul_for``); any correct engine gives the same numbers. ``quantize`` (speed only):
    ``quantize_int8_per_token``'s stand-in with its values field for field (emulator/activations/int8_fast.py
    ``quantize_int8_fast``, what the op's exact reference passes).

    acc = sum_k (qx - azp) * qw  (exact int), y = acc * sx * sw + bias.
    """
    out_dtype = out_dtype or dtype_name(x)
    wq = np.asarray(w_q)
    require(wq.ndim == 2 and wq.dtype.kind in "iu", f"expected integer weight [N, K], got {wq.dtype} {list(wq.shape)}",
            tensor="weight")
    N, K = wq.shape
    ws = as_float64(w_scale).reshape(-1)
    require(ws.shape == (N,), f"expected per-channel scales [N]={N}, got {ws.size}", tensor="weight_scale")
    require(bool(np.all(np.isfinite(ws))), "NaN or Inf in weight scales", tensor="weight_scale")
    x64 = activations_float64(x, K)
    acts = (quantize or a8.quantize_int8_per_token)(x64.astype(np.float32), act)
    qx = acts.q.astype(np.float64) - acts.zero_point
    acc = exact_int_matmul(qx, wq, engine=int_engine)  # exact integer sums (emulator/fast_linear.py)
    b = bias_float64(bias, N)
    scale = acts.scale.astype(np.float64) * ws[None, :]  # exact: 24 x 24 bits
    y = acc * scale + b
    bound = gamma(2) * (np.abs(acc * scale) + np.abs(b))
    sx = acts.scale.astype(np.float64).reshape(-1)
    res = rounded_result(y, bound, out_dtype, acc=acc.astype(np.int64),
                  parts={"x_q": acts.q, "x_scale": acts.scale, "x_zero_point": acts.zero_point, "x_tie": acts.tie,
                         "x_quotient": acts.quotient})
    return decide_exactly(res, lambda ms, ns: [(acc[ms, ns][:, None], sx[ms][:, None], ws[ns][:, None])]
                           + bias_terms(bias, b, ns))


def linear_w4a8(x, w_int, w_scales, group_size: int, bias=None, *, g_idx=None,
                act: a8.Int8ActVariant = a8.CANONICAL_SYM, out_dtype: str | None = None) -> LinearResult:
    """W4A8: int4 weights as signed integers (q - z) [N, K] with group scales [n_groups, N].

    Per group g: acc_g = sum_{k in g} qx[m,k] * (q - z)[n,k] (exact int);
    y = sx[m] * sum_g sw[g, n] * acc_g + bias.
    """
    out_dtype = out_dtype or dtype_name(x)
    wi = np.asarray(w_int)
    require(wi.ndim == 2 and wi.dtype.kind in "iu", "expected integer (q - z) weight [N, K]", tensor="weight")
    N, K = wi.shape
    ws = as_float64(w_scales)
    gs = K if group_size in (-1, 0, None) else int(group_size)
    require(K % gs == 0, f"K={K} is not a multiple of group_size={gs}", tensor="weight")
    n_groups = K // gs
    require(ws.shape == (n_groups, N), f"expected scales [{n_groups}, {N}], got {list(ws.shape)}", tensor="scales")
    gi = np.arange(K) // gs if g_idx is None else np.asarray(g_idx).astype(np.int64)
    x64 = activations_float64(x, K)
    acts = a8.quantize_int8_per_token(x64.astype(np.float32), act)
    qx = acts.q.astype(np.float64) - acts.zero_point
    M = qx.shape[0]
    acc = np.zeros((M, n_groups, N), dtype=np.float64)
    wf = wi.astype(np.float64)
    for g in range(n_groups):
        cols = np.nonzero(gi == g)[0]
        acc[:, g, :] = qx[:, cols] @ wf[:, cols].T
    terms = acc * ws[None, :, :]  # exact: int (< 2**24 per group) x fp16/fp32 scale
    s = terms.sum(axis=1)
    b = bias_float64(bias, N)
    y = acts.scale.astype(np.float64) * s + b
    bound = gamma(n_groups + 2) * (np.abs(acts.scale.astype(np.float64)) * np.abs(terms).sum(axis=1) + np.abs(b))
    sx = acts.scale.astype(np.float64).reshape(-1)
    res = rounded_result(y, bound, out_dtype, acc=acc.astype(np.int64),
                  parts={"x_q": acts.q, "x_scale": acts.scale, "x_zero_point": acts.zero_point, "x_tie": acts.tie,
                         "x_quotient": acts.quotient})
    return decide_exactly(res, lambda ms, ns: [(acc[ms, :, ns], ws[:, ns].T, np.repeat(sx[ms][:, None], n_groups, 1))]
                           + bias_terms(bias, b, ns))


def linear_mxfp4_w4a4(x, w_codes, w_scales, bias=None, *, act: mx.MxVariant = mx.CANONICAL,
                      out_dtype: str | None = None) -> LinearResult:
    """MXFP4 W4A4: activations quantized per 32-block along K with ``act``, weights MXFP4.

    y = sum_blocks 2**(sx_b + sw_b) * sum_{k in b} e2m1(x)_k * e2m1(w)_k + bias;
    a 0xFF scale on either side makes the output NaN.
    """
    out_dtype = out_dtype or dtype_name(x)
    wc = np.asarray(w_codes)
    require(wc.ndim == 2, f"expected weight codes [N, K], got shape {list(wc.shape)}", tensor="weight")
    N, K = wc.shape
    x64 = activations_float64(x, K)
    xc, xs = mx.quantize_mxfp4(x64.astype(np.float32), act, what="x")
    xd = mx.dequantize_mxfp4(xc, xs, dtype=np.float64)
    wd = mx.dequantize_mxfp4(wc, np.asarray(w_scales), dtype=np.float64, what="weight")
    b = bias_float64(bias, N)
    with np.errstate(invalid="ignore", over="ignore"):
        y = xd @ wd.T
        mag = np.abs(xd) @ np.abs(wd).T
    # Products of e2m1 values and power-of-two scales are exact; only the sum can round.
    bound = np.where(exact_in_float64(xd, wd, mag), 0.0, gamma(K) * mag)
    bound = np.where(np.isnan(bound), 0.0, bound)
    y, bound = add_bias(y, bound, b)
    tie = _e2m1_ties(x64.astype(np.float32), xs)
    return decide_exactly(rounded_result(y, bound, out_dtype, parts={"x_codes": xc, "x_scale": xs, "x_tie": tie}, mag=mag),
                           lambda ms, ns: [(xd[ms], wd[ns])] + bias_terms(bias, b, ns))


def _e2m1_ties(x32: np.ndarray, scale_bytes: np.ndarray) -> np.ndarray:
    """Elements whose scaled value x / 2**s sits exactly on an E2M1 midpoint (below 6)."""
    s = np.where(scale_bytes == 0xFF, 0, scale_bytes.astype(np.int64) - 127)
    xb = x32.reshape(x32.shape[:-1] + (-1, mx.BLOCK)).astype(np.float64)
    y = np.abs(np.ldexp(xb, -s[..., None])).reshape(x32.shape)
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    return np.isin(y, mids)
