"""Failure localization, the probe rows whose quantization is exact and the hypotheses judged on them.

Semantics: docs/conformance.md#failure-localization (steps 1 and 2). ``conformance.judge.localize`` runs the
probes; this module chooses their values and names what a mismatch on them means:

- the one-hot readback's values (``one_hot_value``, ``second_value``): a value v whose one-hot row the declared
  activation quantization keeps exactly, and a second one (3 v first) at which a rounded product and a rounded
  weight differ;
- rows whose declared activation quantization is exact (``exact_activation_rows``: int8 codes times 2^j, E2M1
  values times 2^e), and the activation-quantization and epilogue bugs that would show on them
  (``act_hypotheses``: scale amax/128, codes clamped to [-127, 127], the zero point flipped or ignored, an MX
  block scale one step off, every output scaled by 127/128, the output truncated, ...);
- ``analyze_rows``: which hypothesis explains a probe's failing outputs (within 2 units in the last place,
  most exact matches first), else a per-row or per-column factor.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from emulator.activations import int8 as a8
from emulator.declaration import int8_variant, mx_variant
from emulator.formats import mxfp4
from emulator.numerics.e2m1 import decode_e2m1, encode_e2m1
from emulator.numerics.fast_round import round_fast
from emulator.numerics.floats import round_to_dtype

from backends.base import Case, Declared

from conformance.judge.localize_weights import close

__all__ = ["OUTPUT_RTZ", "AZP_CORRECTION", "INT_DOT", "round_output", "one_hot_value", "second_value", "exact_activation_rows",
           "act_hypotheses", "analyze_rows"]

OUTPUT_RTZ = "output rounded toward zero (truncated) instead of to nearest"


def round_output(v: np.ndarray, dtype: str) -> np.ndarray:
    """RNE to ``dtype`` (float64 out) by the emulator's fast path; NaN stays NaN (its payload is not compared)."""
    return round_fast(np.asarray(v, np.float64), dtype, as_float64=True)


# -- exact activation values --------------------------------------------------------------------------------
def _quantization_exact(case: Case, declared: Declared, X: np.ndarray) -> bool:
    """The declared activation quantization of every row of X (float32) gives back X exactly."""
    acts = case.spec.activations
    if acts == "int8":
        q = a8.quantize_int8_per_token(X.astype(np.float32), int8_variant(declared, case))
        return bool(np.array_equal(a8.dequantize_int8_per_token(q), X.astype(np.float64)))
    if acts == "mxfp4":
        codes, sb = mxfp4.quantize_mxfp4(X.astype(np.float32), mx_variant(declared))
        return bool(np.array_equal(mxfp4.dequantize_mxfp4(codes, sb, dtype=np.float64), X.astype(np.float64)))
    return True


def one_hot_value(case: Case, declared: Declared) -> float | None:
    """A value v whose one-hot row the declared activation quantization keeps exactly (None: none found)."""
    return next((v for v in (1.0, 127.0, 255.0, 6.0, 4.0, 2.0, 0.5) if _one_hot_exact(case, declared, v)), None)


def _one_hot_exact(case: Case, declared: Declared, v: float) -> bool:
    """Whether one-hot rows of value v (at the first and the last column) reach the product exactly: v is a value
    of the activation dtype and the declared quantization keeps the rows."""
    x = np.zeros((2, case.K), np.float32)
    x[0, 0] = v
    x[1, case.K - 1] = v
    return bool(round_to_dtype(np.float64(v), case.act_dtype) == v) and _quantization_exact(case, declared, x)


def second_value(case: Case, declared: Declared, v: float) -> float | None:
    """A second one-hot value whose products with the weights need more bits than the weights (3 v first)."""
    return next((v * f for f in (3.0, 1.5, 5.0, 1.25) if _one_hot_exact(case, declared, v * f)), None)


def exact_activation_rows(case: Case, declared: Declared, seed: int = 7) -> np.ndarray | None:
    """Rows whose declared quantization is exact: int8 codes times 2^j (amax 127 * 2^j; asymmetric: 255
    levels from -100 * 2^j, and a one-signed row), or E2M1 values times 2^e (block amax 6 * 2^e)."""
    rng = np.random.default_rng(seed)
    K = case.K
    rows = []
    if case.spec.activations == "int8":
        for j in (0, -3, 2, -1, 4, 1, -5, 3):
            if declared.act_symmetric_for(case):
                t = rng.integers(-127, 128, K).astype(np.float64)
                t[rng.integers(K)] = 127 * rng.choice((-1, 1))
            else:
                lo = -100 if j % 2 == 0 else 0  # one-signed rows too
                t = rng.integers(lo, lo + 256, K).astype(np.float64)
                t[0], t[-1] = lo, lo + 255
            rows.append(np.ldexp(t, j))
    elif case.spec.activations == "mxfp4":
        vals = np.asarray([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)
        for e in (0, -2, 3, -1, 1, -4, 2, 0):
            t = vals[rng.integers(0, 8, K)] * rng.choice((-1, 1), K)
            t[::32] = 6 * rng.choice((-1, 1), len(t[::32]))
            rows.append(np.ldexp(t, e))
    else:
        return None
    X = np.stack(rows).astype(np.float32)
    keep = [i for i in range(len(X)) if _quantization_exact(case, declared, X[i:i + 1])]
    X = X[keep]
    if not len(X) or not _quantization_exact(case, declared, X):  # per-tensor quantizers: one amax for all
        X = X[:1]
    if not len(X) or round_to_dtype(X.astype(np.float64), case.act_dtype).tolist() != X.astype(np.float64).tolist():
        return None
    return X


# -- activation / epilogue hypotheses -------------------------------------------------------------------------
#: the stage-naming prefix of integer-dot hypotheses (stage `accumulation`)
INT_DOT = "the integer dot product"
AZP_CORRECTION = "the zero-point correction term"


def _pairs_saturated(qa: np.ndarray, zp: np.ndarray, wq: tuple) -> np.ndarray:
    """[M, N] sum over pairs k = 2i, 2i+1 of clip((qa + 128) qw, int16), minus (128 + zp) rowsum(qw), times the
    weight scale: the integer dot of an u8 x s8 pair instruction that saturates its 16-bit pair sums."""
    qw, sw = np.asarray(wq[0], np.float64), np.asarray(wq[1], np.float64).reshape(-1)
    u = np.asarray(qa, np.float64) + 128.0
    K = u.shape[1]
    if K % 2:
        u, qw2 = np.pad(u, ((0, 0), (0, 1))), np.pad(qw, ((0, 0), (0, 1)))
    else:
        qw2 = qw
    pairs = u[:, None, 0::2] * qw2[None, :, 0::2] + u[:, None, 1::2] * qw2[None, :, 1::2]
    acc = np.clip(pairs, -32768, 32767).sum(axis=-1) - (128.0 + zp.reshape(-1, 1)) * qw.sum(axis=1)[None, :]
    return acc * sw[None, :]


def act_hypotheses(case: Case, declared: Declared, X: np.ndarray, W: np.ndarray, chunk: int | None = None,
                    wq: "tuple | None" = None) -> list:
    """(pattern, output) for activation-quantization and epilogue bugs on the exact rows X (``chunk``: the rows
    of one kernel call, for the per-tensor hypothesis; ``wq``: (integer weight codes [N, K], per-channel scales
    [N]) where the weights are per-channel int, for the asymmetric zero-point correction term)."""
    out_dtype = declared.output or case.output_dtype
    x64 = X.astype(np.float64)
    exact = x64 @ W.T
    H = []
    if case.spec.activations == "int8":
        q = a8.quantize_int8_per_token(X.astype(np.float32), int8_variant(declared, case))
        s = q.scale.astype(np.float64)
        zp = q.zero_point.astype(np.float64)
        amax = np.abs(x64).max(axis=1, keepdims=True)
        for d, lo, name in ((128.0, -128, "activation scale amax/128 instead of amax/127"),
                            (127.5, -128, "activation scale amax/127.5 instead of amax/127")):
            sc = (amax / d).astype(np.float32).astype(np.float64)
            with np.errstate(invalid="ignore", divide="ignore"):
                c = np.clip(np.rint(np.where(sc > 0, x64 / sc, 0)), lo, 127)
            H.append((name, (c * sc) @ W.T))
        H.append(("activation codes clamped to [-127, 127] instead of [-128, 127]",
                  ((np.clip(q.q, -127, 127) - zp) * s) @ W.T))
        if chunk is not None and len(x64) > 1:  # one scale over the rows of each call instead of one per row
            xt = np.empty_like(x64)
            for a in range(0, len(x64), chunk):
                rows = X[a:a + chunk].astype(np.float32)
                v = dataclasses.replace(int8_variant(declared, case), granularity="per_tensor")
                xt[a:a + chunk] = a8.dequantize_int8_per_token(a8.quantize_int8_per_token(rows, v))
            H.append(("one activation scale for the whole tensor instead of one per token (per-tensor)", xt @ W.T))
        if np.any(zp) and wq is not None:  # the term azp * sum_k qw[n, k] removed with wrong row sums
            qw, sw = np.asarray(wq[0], np.float64), np.asarray(wq[1], np.float64).reshape(-1)
            rs = qw.sum(axis=1)
            alts = [("the weight row sums kept in int16 (wrapped)", (rs + 32768) % 65536 - 32768)]
            K = qw.shape[1]
            for T in (32, 16, 64, 8, 128):
                if K % T:
                    alts.append((f"the weight row sums skip the last K mod {T} = {K % T} columns"
                                 + (" (all of them)" if K < T else ""), qw[:, : K - K % T].sum(axis=1)))
            seen = []
            for what, rs2 in alts:
                if np.any(rs2 != rs) and not any(np.array_equal(rs2, r) for r in seen):
                    seen.append(rs2)
                    H.append((f"{AZP_CORRECTION} (azp * sum_k qw[n, k], removed from the integer dot) uses wrong "
                              f"weight row sums: {what}", exact + (-zp * s) * ((rs2 - rs) * sw)[None, :]))
        if wq is not None:  # an integer dot with 16-bit pair sums (AVX2 vpmaddubsw: u8 x s8 pairs, saturating)
            H.append((f"{INT_DOT}: u8 x s8 pairs of products summed with int16 saturation (the activation codes "
                      "offset by +128 to u8, then (128 + azp) * sum_k qw[n, k] removed; AVX2 vpmaddubsw)",
                      _pairs_saturated(q.q, zp, wq) * s))
        if np.any(zp):
            H.append(("activation zero point sign flipped ((q + zp) * s)", ((q.q + zp) * s) @ W.T))
            H.append(("activation zero point ignored (q * s: the azp term not removed)", (q.q * s) @ W.T))
        H.append(("activation scale not applied (the integer codes used as values)", (q.q - zp) @ W.T))
        H.append(("activation scale applied twice", ((q.q - zp) * s * s) @ W.T))
    elif case.spec.activations == "mxfp4":
        blocks = x64.reshape(len(x64), -1, 32)
        with np.errstate(divide="ignore"):
            e = np.floor(np.log2(np.abs(blocks).max(axis=2, keepdims=True))) - 2  # OCP MX: emax(E2M1) = 2
        e = np.where(np.isfinite(e), e, -127)
        for d, name in ((1, "activation block scale one E8M0 step high (exponent floor(log2 amax) - 1)"),
                        (-1, "activation block scale one E8M0 step low (exponent floor(log2 amax) - 3)")):
            sc = np.ldexp(1.0, (e + d).astype(np.int64))
            xq = decode_e2m1(encode_e2m1(blocks / sc)).astype(np.float64) * sc
            H.append((name, xq.reshape(x64.shape) @ W.T))
        H.append(("activation codes right, dequantized with twice their block scale", 2 * exact))
        H.append(("activation codes right, dequantized with half their block scale", exact / 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        H.append(("every output scaled by 127/128", exact * 127 / 128))
        H.append(("every output scaled by 128/127", exact * 128 / 127))
    return [(n, round_output(y, out_dtype)) for n, y in H] + [(OUTPUT_RTZ, round_to_dtype(exact, out_dtype, "rtz"))]


def _per_axis_factor(obs: np.ndarray, exp: np.ndarray, dtype: str) -> str | None:
    """'every token (row) scaled by its own factor' / 'every output channel ...' when one factor per row
    or per column explains the mismatch."""
    with np.errstate(invalid="ignore", divide="ignore"):
        r = obs / exp
    for axis, what in ((1, "token (row)"), (0, "output channel (column)")):
        f = np.nanmedian(np.where(np.isfinite(r) & (exp != 0), r, np.nan), axis=axis, keepdims=True)
        if np.all(np.isnan(f)):
            continue
        hyp = round_to_dtype(np.nan_to_num(f, nan=1.0) * exp, dtype)
        if close(obs, hyp, dtype, 2).all() and not np.allclose(f[np.isfinite(f)], 1.0):
            fs = np.unique(np.round(f[np.isfinite(f)], 6))
            return (f"each {what} scaled by its own factor ({', '.join(f'{v:g}' for v in fs[:4])}"
                    + (", ..." if fs.size > 4 else "") + "): a per-"
                    + ("token activation scale" if axis == 1 else "channel weight scale") + " in the epilogue")
    return None


def analyze_rows(obs, exp, bad, hyps, dtype: str) -> dict:
    res = {"ok": not bad.any(), "n_bad": int(bad.sum()), "n": int(bad.size), "findings": []}
    if not bad.any():
        return res
    nonfin = bad & (~np.isfinite(obs) | ~np.isfinite(exp))
    if nonfin.any():
        res["findings"].append({"where": f"{int(nonfin.sum())} element(s)", "n": int(nonfin.sum()),
                                "pattern": "NaN/Inf where the reference is finite" if np.isfinite(exp[nonfin]).all()
                                else "non-finite mismatch"})
    # every failing element within 2 ulps of the hypothesis (the kernel's own arithmetic rounds too); the
    # hypothesis that matches most failing elements exactly wins (two rules can both come within 2 ulps)
    fits = [(int(close(obs, hyp, dtype, 0)[bad].sum()), -i, name) for i, (name, hyp) in enumerate(hyps)
            if close(obs, hyp, dtype, 2)[bad].all()]
    if fits:
        ranked = [f[2] for f in sorted(fits, reverse=True)]
        res["findings"].append({"where": "every probe row", "pattern": ranked[0], "n": int(bad.sum())})
        res["hypothesis"], res["candidates"] = ranked[0], ranked
        return res
    f = _per_axis_factor(obs, exp, dtype)
    res["findings"].append({"where": "probe rows " + ", ".join(map(str, np.nonzero(bad.any(axis=1))[0][:6])),
                            "pattern": f or "outputs differ (no named pattern)", "n": int(bad.sum())})
    return res
