"""Fingerprint probe inputs: seeded candidate inputs built around each axis's boundaries.

Part of conformance/fingerprint/decide.py; semantics: docs/fingerprints.md (how one axis is decided, step 2).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from backends.base import Case
from emulator.numerics.floats import decode, encode, format_of, round_to_dtype

from conformance.cases.inputs import CaseInputs, make_inputs
from conformance.fingerprint.axes import ProbeAxis
from conformance.cases.generators import int_weight_tensors, scales_array

__all__ = ["with_rows", "trial_fn", "accumulate_probes"]


# -- numeric helpers ------------------------------------------------------------------------------
def _r(a, dtype: str) -> np.ndarray:
    return round_to_dtype(np.asarray(a, dtype=np.float64), dtype)


def _step(v, dtype: str, n) -> np.ndarray:
    """The value n representable steps away from v in ``dtype`` (v a member of dtype; n may be an array)."""
    fmt = format_of(dtype)
    b = encode(np.asarray(v, np.float64), fmt).astype(np.int64)
    sign = 1 << (fmt.bits - 1)
    mag = b & (sign - 1)
    o = np.where(b & sign, -mag, mag) + np.asarray(n, np.int64)
    nb = np.where(o < 0, sign | (-o), o)
    return decode(nb.astype(np.uint64), fmt)


def _diag_int_tensors(case: Case, anchor: bool = False) -> dict:
    """Weights with W[n, n] = 1 and 0 elsewhere: each output reads one activation's quantized value.

    ``anchor``: odd columns also read x[0] (the row's +-amax, code +-127), so y = (q_n +- 127) * s
    there: a one-code difference near the clamp shows against a cancelled sum (next to 0), where
    the output resolves it, instead of next to 127 * s, where one code is about one 16-bit ulp.
    Their weight scale is 2^14 (wide-range activations), which lifts the sums of subnormal
    activation scales out of the output's subnormal range.
    """
    N, K = case.N, case.K
    idx = np.arange(min(N, K))
    odd = idx[1::2]
    lift = 2.0 ** 14 if (anchor and case.act_dtype != "float16") else 1.0
    if case.weight_format == "ct-int-quantized":
        w = np.zeros((N, K), np.int8)
        w[idx, idx] = 1
        ws = np.ones((N, 1))
        if anchor:
            w[odd, 0] = 1
            ws[odd] = lift
        return {"weight": w, "weight_scale": scales_array(ws, case.scale_dtype)}
    if case.weight_format == "ct-mxfp4":
        from emulator.formats import mxfp4

        codes = np.zeros((N, K), np.uint8)
        codes[idx, idx] = 2  # E2M1 1.0
        return mxfp4.pack_mxfp4_ct(codes, np.full((N, K // 32), 127, np.uint8))
    G = K // case.group
    q = np.full((N, K), 8)
    q[idx, idx] = 9
    s = np.ones((G, N))
    if anchor:
        q[odd, 0] = 9
        s[:, odd] = lift
    return int_weight_tensors(case, q, np.full((G, N), 8), s, None)


def with_rows(case: Case, M: int) -> Case:
    return dataclasses.replace(case, M=int(M))


# -- candidate inputs per probe family --------------------------------------------------------------
def _int8_row(rng, case: Case, mode: str) -> np.ndarray:
    """One activation row: x[0] = +-amax, x[1:N] candidates around the quantizer's boundaries."""
    dt, N, K = case.act_dtype, case.N, case.K
    for _ in range(100):
        if mode == "pow2":  # scale 2^j: every quotient form is exact, ties stay ties
            amax = 127.0 * 2.0 ** int(rng.integers(-10, 3))
        elif mode == "odd":  # scale m * 2^j (m = 3, 5, 7, 9): ties exact for x / s, not through 1/s or 127/amax
            amax = 127.0 * float(rng.choice([3.0, 5.0, 7.0, 9.0, 1.5, 1.25])) * 2.0 ** int(rng.integers(-10, 3))
        elif mode == "tiny":
            lo = -12.0 if dt != "float16" else -7.3
            amax = float(_r(10.0 ** rng.uniform(lo, -4.0), dt))
        elif mode == "subnormal":
            # amax a little above 127 units of the smallest subnormal of a scale dtype: amax / 127
            # rounds to that one unit, so |x / scale| reaches up to ~2 * 127 and the clamp shows
            unit = float(rng.choice([2.0 ** -133, 2.0 ** -24] + ([2.0 ** -149] if dt == "float32" else [])))
            amax = float(_r(unit * rng.integers(128, 250), dt))
        elif mode == "zero":
            amax = 0.0
        else:
            amax = float(_r(np.exp(rng.uniform(np.log(0.02), np.log(200.0))), dt))
        if mode == "zero" or (amax > 0 and np.isfinite(amax)):
            break
    row = np.zeros(K)
    if amax == 0.0:
        row[1:N:3] = -0.0
        return row
    row[0] = amax if rng.random() < 0.5 else -amax
    with np.errstate(over="ignore", divide="ignore", under="ignore"):
        s32 = np.float32(amax) / np.float32(127.0)
        scales = [float(s32), float(_r(s32, "bfloat16")), float(_r(s32, "float16")),
                  float(np.float32(1.0) / (np.float32(127.0) / np.float32(amax))),
                  float(np.float32(amax) * (np.float32(1.0) / np.float32(127.0)))]  # recip_mul scale formula
    scales = [s for s in scales if s > 0 and np.isfinite(s)] or [amax / 127.0]
    n = N - 1
    sc = np.asarray(scales)[rng.integers(0, len(scales), n)]
    k = rng.integers(0, 40 if mode == "odd" else 127, n).astype(np.float64)  # odd: (2k + 1) m fits 8 bits
    frac = rng.choice(np.array([0.5, 0.5, 0.5, 0.25, 0.75, 0.0]), n)
    uni = rng.random(n) < 0.15
    v = np.where(uni, rng.random(n) * amax, (k + frac) * sc)
    v = _r(v, dt)
    v = _step(v, dt, rng.integers(-2, 3, n))
    v = np.minimum(np.abs(v), amax)
    v = _r(v, dt)
    v = np.where(v > amax, amax, v)
    row[1:N] = np.where(rng.random(n) < 0.5, -v, v)
    if mode == "subnormal":  # slots at -amax and its neighbours: the quotients that reach past -127.5
        near = rng.random(n) < 0.5
        row[1:N] = np.where(near, -_step(amax, dt, -rng.integers(0, 4, n)), row[1:N])
    return row


_E2M1_POS = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_E2M1_MID = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def _mx_row(rng, case: Case, mode: str) -> np.ndarray:
    """One activation row; the blocks the diagonal weights read (the first N columns) hold probes."""
    dt, N, K = case.act_dtype, case.N, case.K
    row = np.zeros(K)
    nb = max(1, min(N, K) // 32)
    emin, emax = (-6, 6) if dt == "float16" else (-12, 12)
    for b in range(nb):
        e = int(rng.integers(emin, emax + 1))
        m = float(rng.choice([1.0, 1.75, 1.5 * (1 + 2.0 ** -7), 1.5, 1.25, 1.875, 1.0 + rng.random()]))
        amax = float(_r(m * 2.0 ** e, dt))
        amax = float(_step(amax, dt, int(rng.integers(-1, 2))))
        fl = int(np.floor(np.log2(amax))) - 2
        sc = 2.0 ** (fl + rng.integers(-1, 2, 32))
        grid = np.where(rng.random(32) < 0.6, rng.choice(_E2M1_MID, 32), rng.choice(_E2M1_POS, 32))
        v = _r(grid * sc, dt)
        v = _step(v, dt, rng.choice(np.array([-1, 0, 0, 0, 1]), 32))
        v = np.minimum(np.abs(v), amax)
        v = np.where(rng.random(32) < 0.5, -v, v)
        v[int(rng.integers(0, 32))] = amax if rng.random() < 0.5 else -amax
        row[32 * b:32 * b + 32] = v
    if mode == "nan":
        for b in range(nb):
            pos = rng.choice(32, int(rng.integers(1, 3)), replace=False)
            row[32 * b + pos] = np.where(rng.random(len(pos)) < 0.5, np.nan, -np.nan)
    if mode == "zero":
        row[0:32] = 0.0
        row[1:32:3] = -0.0
    if mode in ("tiny", "huge"):  # one block at the ends of the scale range, the rest zero
        row[:] = 0.0
        if mode == "tiny":  # amax 2^-125 .. 2^-128: scale byte 0, whose divisor rules differ
            row[0:32] = rng.choice(_E2M1_POS, 32) / 6.0 * 2.0 ** -int(rng.integers(125, 129))
            row[0] = 2.0 ** -125 if rng.random() < 0.5 else 1.5 * 2.0 ** -126
        else:  # amax 1.875 * 2^127: EVEN rounds it past the largest scale
            row[0:32] = rng.choice(_E2M1_POS, 32) / 6.0 * 2.0 ** 127
            row[0] = 1.875 * 2.0 ** 127
        row[0:32] *= np.where(rng.random(32) < 0.5, -1.0, 1.0)
    return _r(row, dt)


def _int_codes_tensors(case: Case, q, z, s, *, v1_zero_write="raise") -> dict:
    return int_weight_tensors(case, q, z, s, None, v1_zero_write=v1_zero_write)


def _onehot_rows(case: Case) -> np.ndarray:
    """One row per group, each a one-hot at a position of that group: y[m, n] = W[n, k_m]."""
    G = case.K // case.group
    x = np.zeros((G, case.K))
    for g in range(G):
        x[g, g * case.group + (g * 5) % case.group] = 1.0
    return x


def _gptq_zero_inputs(rng, case: Case, probe: str) -> CaseInputs:
    N, K, G = case.N, case.K, case.K // case.group
    q = rng.integers(0, 16, (N, K))
    s = 2.0 ** -rng.integers(2, 6, (G, N)).astype(np.float64)
    if probe == "gptq-sym":
        t = _int_codes_tensors(case, q, np.full((G, N), 8), s)
        fields = rng.integers(0, 15, (G, N))  # canonical readers read field + 1 in 1..15, sym kernels 8
        fields[rng.random((G, N)) < 0.2] = 7
        qz = np.zeros((G, N // 8), np.uint32)
        for j in range(8):
            qz |= (fields[:, j::8].astype(np.uint32) & np.uint32(0xF)) << np.uint32(4 * j)
        t["qzeros"] = qz.view(np.int32)
    else:
        z = rng.integers(1, 16, (G, N))
        z[rng.random((G, N)) < 0.3] = 0  # v1 field 0xF: 16 canonically, 0 wrapped, a carry for a packed add
        z[rng.random((G, N)) < 0.15] = 15
        t = _int_codes_tensors(case, q, z, s, v1_zero_write="field_all_ones")
    x = _onehot_rows(case)
    return CaseInputs(with_rows(case, x.shape[0]), 0, t, x.astype(np.float32), None)


def _dequant_inputs(rng, case: Case, mode: str) -> CaseInputs:
    """Weights with full-mantissa fp16 scales and rows that cancel: weight rounding shows in the output."""
    N, K, G, gs = case.N, case.K, case.K // case.group, case.group
    dt = case.act_dtype
    s0 = _r(2.0 ** rng.uniform(-8, -3, N), "float16")
    if mode == "cancel":  # scales of every group near each other: x_a w_a - x_b w_b nearly cancels
        s = _r(s0[None, :] * (1 + rng.integers(-6, 7, (G, N)) * 2.0 ** -10), "float16")
    else:
        s = _r(2.0 ** rng.uniform(-8, -3, (G, N)), "float16")
    s = np.where(s == 0, 2.0 ** -8, s)
    if case.sym:
        z = np.full((G, N), 8)
    else:
        z = rng.integers(0, 16, (G, N))
        if case.weight_format == "gptq" and case.zero_convention != "v2":
            z = np.maximum(z, 1)
    q = rng.integers(0, 16, (N, K))
    if mode == "cancel":
        # same code distance to the zero point in positions 0 of every group
        d = rng.integers(-8, 8, N)
        for g in range(G):
            q[:, g * gs] = np.clip(z[g] + d, 0, 15)
    t = _int_codes_tensors(case, q, z, s)
    x = np.zeros((4, K))
    x[0, 0], x[0, gs] = 1.0, -1.0
    if G > 2:
        x[1, gs], x[1, 2 * gs] = 1.0, -1.0
    else:
        x[1, 1], x[1, 2] = 1.0, -1.0
    x[2, 3] = 1.0
    ks = rng.choice(K, 3, replace=False)
    x[3, ks] = _r(rng.choice([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0], 3), dt)
    return CaseInputs(with_rows(case, 4), 0, t, _r(x, dt).astype(np.float32), None)


def _accumulate_rows(case: Case) -> np.ndarray:
    """Cancellation rows: +B ... -B around K - 2 small terms +(1 + f), -(1 - f), ...

    The small terms sum exactly to (K - 2) f; an accumulator whose partial sums hold +-B loses
    their low bits whenever B's ulp in its dtype exceeds 2 f: B = 2^8 with f = 2^-5 separates 16-bit
    accumulators from float32, B = 2^20 (bf16 activations; f = 2^-5) or B = 2^15 (fp16 activations,
    whose range stops at 65504; f = 2^-10) separates float32 from float64.
    """
    K, dt = case.K, case.act_dtype
    if dt == "float16":
        plan = [(2.0 ** 8, 2.0 ** -5), (2.0 ** 11, 2.0 ** -5), (2.0 ** 15, 2.0 ** -10)]
    else:
        plan = [(2.0 ** 8, 2.0 ** -5), (2.0 ** 12, 2.0 ** -5), (2.0 ** 16, 2.0 ** -5), (2.0 ** 20, 2.0 ** -5)]
    rows = []
    for B, f in plan:
        small = np.where(np.arange(K - 2) % 2 == 0, 1 + f, -(1 - f))
        for a, b in ((0, K - 1), (K - 1, 0), (0, K // 2)):
            r = np.zeros(K)
            rest = [k for k in range(K) if k not in (a, b)]
            r[rest] = small[:len(rest)]
            r[a], r[b] = B, -B
            rows.append(r)
    return _r(np.asarray(rows), dt)


def _accumulate_tensors(case: Case) -> dict:
    """Every weight 2^-(n % 4) exactly (q = z + 1, power-of-two scales): exact in every weight dtype."""
    N, K = case.N, case.K
    if case.weight_format == "ct-mxfp4":
        from emulator.formats import mxfp4

        codes = np.full((N, K), 2, np.uint8)
        sb = np.repeat((127 - np.arange(N) % 4)[:, None], K // 32, axis=1).astype(np.uint8)
        return mxfp4.pack_mxfp4_ct(codes, sb)
    G = K // case.group
    z = np.full((G, N), 8)
    s = np.repeat((2.0 ** -(np.arange(N) % 4))[None, :], G, axis=0)
    return _int_codes_tensors(case, np.full((N, K), 9), z, s)


def _bias(rng, case: Case):
    """A bias of act-dtype values of mixed magnitude (None when the case has none)."""
    if not case.bias:
        return None
    b = rng.standard_normal(case.N) * 2.0 ** rng.integers(-6, 3, case.N)
    return _r(b, case.act_dtype).astype(np.float32)


def _skew(rng, row: np.ndarray, dt: str) -> np.ndarray:
    """An asymmetric row: the negative side shrunk by a random factor (a non-zero activation zero point)."""
    f = float(rng.choice([0.0, 0.125, 0.3, 0.5]))
    return _r(np.where(row < 0, row * f, row), dt)


def _wide(rng, x: np.ndarray, dt: str) -> np.ndarray:
    """Rows scaled by 2^-30 .. 2^17 (whole rows, so the output shows them): outside a narrower dtype's
    range or below its normals."""
    return _r(x * 2.0 ** rng.integers(-30, 18, (x.shape[0], 1)), dt)


def _moe_inputs(rng, case: Case, mode: str, t: int) -> CaseInputs:
    """The suite's seeded MoE inputs; 'tie': router rows with exact ties across the top-k boundary."""
    inp = make_inputs(case, int(rng.integers(0, 1 << 30)))
    logits = inp.router_logits.copy()
    x = inp.x
    if mode == "tie":
        E = case.E
        for m in range(case.M):
            v = float(rng.choice([0.5, 1.0, 2.0]))
            row = rng.standard_normal(E).astype(np.float32) - 4.0
            tied = rng.choice(E, min(E, case.top_k + 1), replace=False)
            row[tied] = v  # top_k + 1 experts share the top logit: which one drops out is the tie rule
            logits[m] = row
    if mode == "wide":
        x = _wide(rng, x, case.act_dtype).astype(np.float32)
    return dataclasses.replace(inp, x=x, router_logits=logits, bias=_bias(rng, case), weight_fp=None)


def _generic_inputs(rng, case: Case, mode: str) -> CaseInputs:
    """The suite's seeded inputs (conformance.cases.inputs.make_inputs), reshaped by ``mode``."""
    inp = make_inputs(case, int(rng.integers(0, 1 << 30)))
    x = inp.x
    if mode == "wide":
        x = _wide(rng, x, case.act_dtype).astype(np.float32)
    return dataclasses.replace(inp, x=x, bias=_bias(rng, case), weight_fp=None)


# -- a probe family's candidate inputs, by trial number ------------------------------------------
def trial_fn(axis: ProbeAxis, case: Case, seed: int):
    rng = np.random.default_rng(seed)
    modes = axis.modes or ("random",)

    def trial(t: int) -> CaseInputs:
        mode = modes[t % len(modes)]
        if mode.startswith("gen:"):  # an edge generator of the suite built to separate these variants
            from conformance.cases.generators import GENERATORS

            inp = GENERATORS[mode[4:]][1](case, int(rng.integers(0, 1 << 30)))
            return dataclasses.replace(inp, bias=_bias(rng, case), weight_fp=None)
        if axis.probe in ("int8", "int8-asym"):
            rows = []
            for _ in range(case.M):
                r = _int8_row(rng, case, "random" if mode in ("wide", "bias") else mode)
                if axis.probe == "int8-asym" and mode == "constant" and rng.random() < 0.6:  # max == min
                    r = np.full_like(r, float(_r(rng.choice([-1.0, 1.0]) * 2.0 ** rng.uniform(-12, 8), case.act_dtype)))
                rows.append(_skew(rng, r, case.act_dtype) if axis.probe == "int8-asym" and rng.random() < 0.7 else r)
            x = np.stack(rows)
            if mode == "wide":
                x = _wide(rng, x, case.act_dtype)
            return CaseInputs(case, 0, _diag_int_tensors(case, anchor=True), _r(x, case.act_dtype).astype(np.float32),
                              _bias(rng, case))
        if axis.probe == "mx":
            x = np.stack([_mx_row(rng, case, mode) for _ in range(case.M)])
            if mode == "wide":
                x = _wide(rng, x, case.act_dtype)
            return CaseInputs(case, 0, _diag_int_tensors(case), x.astype(np.float32), _bias(rng, case))
        if axis.probe == "moe":
            return _moe_inputs(rng, case, mode, t)
        if axis.probe in ("generic", "int8-f32-scales"):  # the latter: the suite's inputs on float32-scale cases
            return _generic_inputs(rng, case, mode)
        if axis.probe in ("gptq-sym", "gptq-v1"):
            return _gptq_zero_inputs(rng, case, axis.probe)
        if axis.probe == "dequant":
            return _dequant_inputs(rng, case, mode)
        raise ValueError(axis.probe)

    return trial


def accumulate_probes(case: Case) -> list[CaseInputs]:
    rows = _accumulate_rows(case)
    t = _accumulate_tensors(case)
    out = []
    for i in range(0, rows.shape[0], case.M):
        chunk = rows[i:i + case.M]
        if chunk.shape[0] < case.M:
            chunk = np.concatenate([chunk, rows[:case.M - chunk.shape[0]]])
        out.append(CaseInputs(case, 0, t, chunk.astype(np.float32), None))
    return out
