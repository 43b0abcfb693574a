"""The value classes of the coverage tables: one generator each (``vc-<class>``), and the check that a
case's tensors really have the class.

Semantics: docs/conformance.md#coverage; the classes are listed in conformance/cases/coverage.py
(``VALUE_CLASS_DOCS``). A generator starts from the case's ordinary inputs (conformance/cases/inputs.py) and
rebuilds the part its class is about: integer codes, zero points and scales packed by the format's own
packer, MXFP4 codes and E8M0 bytes, or the activations. ``realized`` reads the class back from the tensors
with independent code (conformance/judge/oracles.py's unpackers for the weights, plain NumPy for the
activations; the amax classes by their ulp formula, where the generators step with ``nextafter``), so a
case counts for a class only when its inputs hold it.
"""

from __future__ import annotations

import numpy as np

from backends.base import Case
from emulator.formats import mxfp4
from emulator.numerics.floats import round_to_dtype

from conformance.cases.inputs import CaseInputs, make_inputs
from conformance.cases.coverage import AMAX, TABLES, W_INT, W_MX
from conformance.cases.generators import gen_router_ties, int_weight_tensors, scales_array, uint8_domain_row

__all__ = ["VALUE_GENERATORS", "generate_value", "realized", "activation_units"]

#: mantissa bits of each activation dtype (the ulp of 2^k is 2^(k - bits))
_MANT = {"bfloat16": 7, "float16": 10, "float32": 23}
_WEIGHT_CLASSES = set(W_INT) | set(W_MX) | {"w-rowsum-beyond-int16"}
#: the largest int16
_INT16_MAX = 32767


def _round(a, dtype: str) -> np.ndarray:
    return round_to_dtype(np.asarray(a, dtype=np.float64), dtype).astype(np.float32)


def _np_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype).type


def _step(v: float, dtype: str, direction: float) -> float:
    """The ``dtype`` value next to ``v`` toward ``direction`` (nextafter in the dtype itself)."""
    t = _np_dtype(dtype)
    return float(np.nextafter(np.array(v, dtype=t), np.array(direction, dtype=t)))


def _amax_target(cls: str, k: int, dtype: str) -> float:
    two = 2.0 ** k
    return {"amax=2^k": two, "amax=2^k-ulp": _step(two, dtype, 0.0), "amax=2^k+ulp": _step(two, dtype, np.inf),
            "amax=1.5*2^k-ulp": _step(1.5 * two, dtype, 0.0), "amax=1.5*2^k+ulp": _step(1.5 * two, dtype, np.inf),
            "amax=1.75*2^k": 1.75 * two}[cls]


def activation_units(case: Case) -> str:
    """What one activation scale covers: ``row`` (per-token int8), ``tensor`` (per-tensor uint8),
    ``block`` (MX blocks of 32 along K), or ``none`` (16-bit activations are not quantized)."""
    acts = case.spec.activations
    if acts == "uint8":
        return "tensor"
    if acts == "mxfp4":
        return "block"
    if acts == "int8":
        return "row"
    return "none"


def _units(x: np.ndarray, unit: str) -> list:
    """Views of x, one per activation scale."""
    M, K = x.shape
    if unit == "tensor":
        return [x.reshape(-1)]
    if unit == "block":
        return [x[m, b:b + 32] for m in range(M) for b in range(0, K, 32)]
    return [x[m] for m in range(M)]


# -- activations -------------------------------------------------------------------------------------------
def _acts(case: Case, cls: str, rng, x: np.ndarray) -> np.ndarray:
    M, K, dt = case.M, case.K, case.act_dtype
    unit = activation_units(case)
    x = x.astype(np.float64).copy()
    if cls in AMAX:
        lo, hi = (-6, 7) if dt == "float16" else (-12, 13)
        for u in _units(x, unit):
            a = _amax_target(cls, int(rng.integers(lo, hi)), dt)
            u[:] = _round(rng.uniform(-0.99, 0.99, u.shape) * a, dt)
            u[int(rng.integers(0, u.size))] = a * rng.choice([-1.0, 1.0])
    elif cls == "act-one-signed":
        for i, u in enumerate(_units(x, unit)):
            v = np.abs(rng.standard_normal(u.shape)) + rng.uniform(0.25, 2.0)
            sign = (-1.0 if i % 3 == 1 else 1.0) if unit != "tensor" else (1.0 if rng.random() < 0.5 else -1.0)
            u[:] = v * sign
            if i % 3 == 2 and u.size > 1:
                u[0] = 0.0
    elif cls == "act-constant-rows":  # even rows: odd rows stay ordinary, so codes and outputs vary
        for m in range(0, M, 2):
            x[m] = rng.uniform(0.5, 2.0) * 2.0 ** int(rng.integers(-3, 3)) * rng.choice([-1.0, 1.0])
    elif cls == "act-saturation":  # block amax mantissa 1.625..1.875: amax / 2^(floor(log2 amax) - 2) > 6
        for u in _units(x, "block"):
            a = rng.choice([1.625, 1.75, 1.875]) * 2.0 ** int(rng.integers(-3, 4))
            u[:] = rng.uniform(-0.9, 0.9, u.shape) * a
            u[0] = a * rng.choice([-1.0, 1.0])
    elif cls == "azp-int32-saturation":  # fp32 only (coverage.CONSTRAINTS): the one-ulp row, in every row
        for m in range(M):
            lo = -2.0 ** int(rng.integers(-3, 4))
            up = float(np.nextafter(np.float32(lo), np.float32(0)))
            x[m] = np.where(rng.random(K) < 0.5, lo, up)
            x[m, 0], x[m, -1] = lo, up
    elif cls == "azp-int8-domain":  # fp32 only (coverage.CONSTRAINTS)
        for m in range(M):
            x[m] = uint8_domain_row(K, int(rng.integers(0, 2 ** 31)))
    elif cls == "act-code-saturation":
        for m in range(M):
            lo, hi = (-127.5, 127.5) if dt == "bfloat16" else ((-153.5, 101.5) if m % 2 == 0 else (-101.5, 153.5))
            j = 2.0 ** int(rng.integers(-8, 5))
            if K == 1:
                continue  # one element: max == min (coverage.CONSTRAINTS keeps K-min out of asym rows)
            # the inner elements: half-integers and integers of the range, representable in every dtype
            x[m] = np.round(rng.uniform(lo, hi, K) * 2) / 2 * j
            x[m, 0], x[m, 1] = lo * j, hi * j
            if dt == "bfloat16":
                x[m] = np.clip(np.trunc(x[m] / j), -127, 127) * j
                x[m, 0], x[m, 1] = lo * j, hi * j
    elif cls == "nan-act":
        x[0, int(rng.integers(0, K))] = np.nan
    elif cls == "inf-act":
        x[0, int(rng.integers(0, K))] = np.inf
        if M >= 3:
            x[1, int(rng.integers(0, K))] = -np.inf
    return _round(x, dt)


# -- weights --------------------------------------------------------------------------------------------------
def _int_parts(case: Case, rng):
    maxq = (1 << case.bits) - 1
    G = case.K // case.group
    q = rng.integers(0, maxq + 1, (case.N, case.K))
    if case.sym:
        z = np.full((G, case.N), 1 << (case.bits - 1))
    else:  # GPTQ v1 cannot store a zero point 0: 1..maxq for every format alike
        z = rng.integers(1, maxq + 1, (G, case.N))
    s = round_to_dtype(rng.uniform(0.004, 0.02, (G, case.N)), case.scale_dtype)
    g_idx = (rng.permutation(case.K) // case.group).astype(np.int32) if case.act_order else None
    g = g_idx if g_idx is not None else np.arange(case.K) // case.group
    return q, z, s, g_idx, g


def _huge_exponent(case: Case) -> int:
    """Scales of 2^E keep the outputs finite with activations of 2^-E (fp16 holds neither 2^60 nor 2^-60)."""
    if case.scale_dtype == "float16":
        return 14
    return 20 if case.act_dtype == "float16" else 60


def _small_scales(shape, dtype: str, rng) -> np.ndarray:
    """Positive subnormal values of ``dtype``."""
    lo = {"float16": -24, "bfloat16": -133, "float32": -149}[dtype]
    steps = {"float16": 1 << 10, "bfloat16": 1 << 7, "float32": 1 << 23}[dtype]
    return round_to_dtype(rng.integers(1, steps, shape) * 2.0 ** lo, dtype)


def _int_weights(case: Case, cls: str, rng) -> dict:
    q, z, s, g_idx, g = _int_parts(case, rng)
    maxq = (1 << case.bits) - 1
    N = case.N
    if cls == "w-one-signed":
        z[:, 0] = np.minimum(z[:, 0], maxq - 1)
        zk = z[g, 0]
        q[0] = rng.integers(zk, maxq + 1)
        q[0, 0] = maxq
        if N > 1:
            zk1 = z[g, 1]
            q[1] = rng.integers(0, zk1 + 1)
            q[1, 0] = 0
    elif cls == "w-constant-rows":
        z[:, 0], s[:, 0] = z[0, 0], s[0, 0]
        c = (z[0, 0] + 3) % (maxq + 1)
        q[0] = c if c != z[0, 0] else (c + 1) % (maxq + 1)
    elif cls == "code-eq-zero":
        q[0] = z[g, 0]
        mask = rng.random(q.shape) < 1 / 8
        zz = z[g, :].T  # [N, K]: each element's zero point
        q[mask] = zz[mask]
    elif cls == "w-saturation":
        for gi in range(z.shape[0]):
            cols = np.flatnonzero(g == gi)
            if len(cols) >= 2:
                q[:, cols[0]], q[:, cols[1]] = 0, maxq
    elif cls == "scale-subnormal":
        if s.shape[0] > 1:  # every other group, else every other output channel
            s[::2] = _small_scales(s[::2].shape, case.scale_dtype, rng)
        else:
            s[:, ::2] = _small_scales(s[:, ::2].shape, case.scale_dtype, rng)
    elif cls == "scale-extreme":
        s = round_to_dtype(rng.uniform(1.0, 1.9, s.shape) * 2.0 ** _huge_exponent(case), case.scale_dtype)
    return int_weight_tensors(case, q, z, s, g_idx)


def _int8_weights(case: Case, cls: str, rng) -> dict:
    N, K = case.N, case.K
    wq = rng.integers(-127, 128, (N, K))
    ws = round_to_dtype(rng.uniform(0.002, 0.01, (N, 1)), case.scale_dtype)
    if cls == "w-one-signed":
        wq[0] = rng.integers(0, 128, K)
        wq[0, 0] = 127
        if N > 1:
            wq[1] = rng.integers(-127, 1, K)
            wq[1, 0] = -127
    elif cls == "w-constant-rows":
        wq[0] = 37
    elif cls == "code-eq-zero":
        wq[0] = 0
        wq[rng.random(wq.shape) < 1 / 8] = 0
    elif cls == "w-saturation":
        wq[:, 0] = -127
        if K > 1:
            wq[:, 1] = 127
    elif cls == "w-rowsum-beyond-int16":  # K >= 512 (coverage.VALUE_MIN_K): 512 * 96 > 32767
        wq[0] = rng.integers(96, 128, K)
        if N > 1:
            wq[1] = -rng.integers(96, 128, K)
    elif cls == "scale-subnormal":
        ws[::2] = _small_scales(ws[::2].shape, case.scale_dtype, rng)
    elif cls == "scale-extreme":
        ws = round_to_dtype(rng.uniform(1.0, 1.9, ws.shape) * 2.0 ** _huge_exponent(case), case.scale_dtype)
    return {"weight": wq.astype(np.int8), "weight_scale": scales_array(ws, case.scale_dtype)}


def _mx_weights(case: Case, cls: str, rng) -> dict:
    N, K = case.N, case.K
    nb = K // 32
    codes = rng.integers(0, 16, (N, K))
    sb = rng.integers(124, 130, (N, nb))
    if cls == "w-one-signed":
        codes[0] = rng.integers(0, 8, K)
        codes[0, 0] = 7
        if N > 1:
            codes[1] = rng.integers(8, 16, K)
            codes[1, 0] = 15
    elif cls == "w-constant-rows":
        codes[0], sb[0] = 5, 127
    elif cls == "w-saturation":
        codes[:, 0::32], codes[:, 1::32] = 7, 15
    elif cls == "scale-subnormal":
        if nb > 1:  # every other block, else every other row
            sb[:, ::2] = rng.integers(0, 2, sb[:, ::2].shape)
        else:
            sb[::2] = rng.integers(0, 2, sb[::2].shape)
    elif cls == "scale-extreme":
        r = 1 if N > 1 else 0
        sb[r, 0] = 0xFE
        codes[r, :32] = rng.choice([0, 1, 8, 9], 32)  # 0, +-0.5: 2^127 * 0.5 * tiny activations stay finite
    elif cls == "nan-scale":
        sb[N // 2, int(rng.integers(0, nb))] = 0xFF
    return mxfp4.pack_mxfp4_ct(codes.astype(np.uint8), sb.astype(np.uint8))


def generate_value(case: Case, cls: str, seed: int) -> CaseInputs:
    """Inputs of ``case`` holding value class ``cls``."""
    if cls == "router-ties":
        return gen_router_ties(case, seed)
    if case.spec.quantize_only or case.scheme == "w4a16-moe":
        inp = make_inputs(case, seed)
        if cls == "ordinary":
            return inp
    else:  # weights from codes: the format's quantizer cannot write every legal shape (K = 1, fp16 scales)
        r0 = np.random.default_rng(seed)
        x = _round(r0.standard_normal((case.M, case.K)), case.act_dtype)
        bias = _round(r0.standard_normal(case.N) * 0.1, case.act_dtype) if case.bias else None
        inp = CaseInputs(case, seed, {}, x, bias)
    rng = np.random.default_rng([seed, 0x5eed])
    if not inp.tensors and not case.spec.quantize_only:
        fmt = case.weight_format
        if fmt == "ct-mxfp4":
            inp.tensors = _mx_weights(case, cls, rng)
        elif fmt == "ct-int-quantized":
            inp.tensors = _int8_weights(case, cls, rng)
        else:
            inp.tensors = _int_weights(case, cls, rng)
        if cls == "scale-extreme":
            e = 100 if fmt == "ct-mxfp4" and case.act_dtype != "float16" else (
                12 if fmt == "ct-mxfp4" else _huge_exponent(case))
            inp.x = _round(rng.standard_normal((case.M, case.K)) * 2.0 ** -e, case.act_dtype)
        if cls in _WEIGHT_CLASSES:
            return inp
    inp.x = _acts(case, cls, rng, inp.x)
    return inp


def _value_generator(cls: str):
    def gen(case: Case, seed: int) -> CaseInputs:
        return generate_value(case, cls, seed)

    gen.__name__ = f"gen_vc_{cls}"
    gen.__doc__ = f"Coverage value class {cls!r} (conformance/cases/coverage.py VALUE_CLASS_DOCS)."
    return gen


#: generator name -> (tier, function, predicate): drawn only by the coverage design, never by default;
#: conformance/cases/specs.py adds them to ``generators.GENERATORS``
VALUE_GENERATORS = {f"vc-{c}": ("edge", _value_generator(c), lambda c: False)
                    for c in dict.fromkeys(v for t in TABLES.values() for v in t["values"])}


# -- realization -----------------------------------------------------------------------------------------------
def _f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float32).astype(np.float64) if np.asarray(a).dtype.name == "bfloat16" \
        else np.asarray(a).astype(np.float64)


def _element_scales(case: Case, t: dict):
    """(scale of every weight element [N, K], group of every column [K]) read from the tensors."""
    N, K, fmt = case.N, case.K, case.weight_format
    if fmt == "gptq":
        g = np.asarray(t["g_idx"]).astype(np.int64)
        return _f64(t["scales"])[g, :].T, g
    if fmt == "awq":
        s = _f64(t["scales"])
        g = np.arange(K) // (K // s.shape[0])
        return s[g, :].T, g
    if fmt == "ct-pack-quantized":
        s = _f64(t["weight_scale"])
        g = np.asarray(t["weight_g_idx"]).astype(np.int64) if "weight_g_idx" in t else np.arange(K) // (K // s.shape[1])
        return s[:, g], g
    if fmt == "ct-int-quantized":
        return np.broadcast_to(_f64(t["weight_scale"]).reshape(N, 1), (N, K)), np.zeros(K, np.int64)
    sb = np.asarray(t["weight_scale"]).astype(np.int64)
    s = np.where(sb == 0xFF, np.nan, np.exp2((sb - 127).astype(np.float64)))
    return np.repeat(s, 32, axis=1), np.arange(K) // 32


def _reference(inp: CaseInputs) -> np.ndarray:
    from emulator.declaration import canonical_declaration

    from conformance.judge.acceptance import declared_interval

    return np.asarray(declared_interval(inp, canonical_declaration(inp.case)).y_ref, np.float64)


def _finite_and_not(y: np.ndarray, what: str) -> tuple[bool, str]:
    bad, good = ~np.isfinite(y), np.isfinite(y)
    if what == "nan":
        bad = np.isnan(y)
    return bool(bad.any() and good.any()), f"reference output: {int(bad.sum())} {what}, {int(good.sum())} finite"


def _asym_rows(x: np.ndarray):
    """Per row, in fp32 as docs/formats/activations.md#canonical-asymmetric-azp writes it (plain NumPy, not the
    emulator): (scale, fl32(min / scale), fl32(-128 - min / scale), the quotients fl32(x / scale))."""
    f32 = np.float32
    x = np.asarray(x, f32)
    with np.errstate(all="ignore"):
        mn, mx = x.min(axis=1), x.max(axis=1)
        scale = ((mx - mn).astype(f32) / f32(255)).astype(f32)
        m = (mn / scale).astype(f32)
        zr = (f32(-128) - m).astype(f32)
        quo = (x / scale[:, None]).astype(f32)
    return scale, m.astype(np.float64), zr.astype(np.float64), quo.astype(np.float64)


def _realized_asym_acts(cls: str, case: Case, x: np.ndarray) -> tuple[bool, str]:
    if case.act_symmetric or activation_units(case) != "row":
        return False, "not asymmetric per-token int8 activations"
    scale, m, zr, quo = _asym_rows(x)
    live = (scale > 0) & np.isfinite(scale)
    within = live & (np.abs(zr) <= 2.0 ** 31 - 1)
    if cls == "azp-int32-saturation":
        n = int((live & ~within).sum())
        return n > 0, f"{n} row(s) whose zero point saturates int32"
    if cls == "azp-int8-domain":
        n = int((within & (np.rint(zr) != np.rint(-m) - 128)).sum())
        return n > 0, f"{n} row(s) whose int8- and uint8-domain zero points differ"
    pre = np.rint(quo) + np.rint(zr)[:, None]  # codes before saturation
    n = int((live & ((pre > 127) | (pre < -128)).any(axis=1)).sum())
    return n > 0, f"{n} row(s) with a code outside [-128, 127] before saturation"


def realized(cls: str, inp: CaseInputs) -> tuple[bool, str]:
    """Whether the inputs hold value class ``cls``, and what was seen."""
    case, x = inp.case, np.asarray(inp.x, np.float64)
    if cls in ("azp-int32-saturation", "azp-int8-domain", "act-code-saturation"):
        return _realized_asym_acts(cls, case, x)
    if cls == "ordinary":
        return bool(np.isfinite(x).all()), "finite activations"
    if cls == "router-ties":
        lg = np.sort(np.asarray(inp.router_logits, np.float64), axis=1)[:, ::-1]
        k = case.top_k
        ok = bool(np.all(lg[:, k - 1] == lg[:, k]))
        return ok, f"k-th and (k+1)-th logits equal in every row: {ok}"
    if cls in AMAX or cls.startswith("act-"):
        unit = activation_units(case) if cls != "act-saturation" else "block"
        units = _units(x, unit if unit != "none" else "row")
        if cls in AMAX:
            m = _MANT[case.act_dtype]
            seen = []
            for u in units:
                a = float(np.max(np.abs(u)))
                e = int(np.floor(np.log2(a)))
                forms = {"amax=2^k": [2.0 ** e], "amax=2^k-ulp": [2.0 ** (e + 1) - 2.0 ** (e - m)],
                         "amax=2^k+ulp": [2.0 ** e + 2.0 ** (e - m)],
                         "amax=1.5*2^k-ulp": [1.5 * 2.0 ** e - 2.0 ** (e - m)],
                         "amax=1.5*2^k+ulp": [1.5 * 2.0 ** e + 2.0 ** (e - m)], "amax=1.75*2^k": [1.75 * 2.0 ** e]}
                seen.append(a in forms[cls])
            return all(seen), f"{sum(seen)} of {len(seen)} {unit}s with {cls}"
        if cls == "act-one-signed":
            n = sum(bool(((u >= 0).all() and (u > 0).any()) or ((u <= 0).all() and (u < 0).any())) for u in units)
            return n > 0, f"{n} one-signed {unit}(s)"
        if cls == "act-constant-rows":
            n = sum(bool((r == r[0]).all() and r[0] != 0) for r in x)
            return n > 0, f"{n} constant non-zero row(s)"
        if cls == "act-saturation":
            n = 0
            for u in units:
                a = float(np.max(np.abs(u)))
                n += bool(a > 0 and a / 2.0 ** (np.floor(np.log2(a)) - 2) > 6)
            return n > 0, f"{n} block(s) whose amax scales above 6"
    if cls in ("nan-act", "inf-act"):
        finite_rows = int(np.isfinite(x).all(axis=1).sum())
        has = np.isnan(x).any() if cls == "nan-act" else (np.isinf(x).any() and not np.isnan(x).any())
        if not has or not finite_rows:
            return False, f"{cls}: activations hold it: {bool(has)}; {finite_rows} finite row(s)"
        if case.spec.quantize_only:
            return True, f"{finite_rows} finite row(s)"
        return _finite_and_not(_reference(inp), "nan" if cls == "nan-act" else "non-finite")
    # weight classes
    from conformance.judge.oracles import independent_weight

    t = inp.tensors
    W = independent_weight(case, t)
    S, g = _element_scales(case, t)
    if cls == "w-one-signed":
        n = sum(bool(((r >= 0).all() and (r > 0).any()) or ((r <= 0).all() and (r < 0).any())) for r in W)
        return n > 0, f"{n} one-signed weight row(s)"
    if cls == "w-constant-rows":
        n = sum(bool((r == r[0]).all() and r[0] != 0) for r in W)
        return n > 0, f"{n} constant non-zero weight row(s)"
    if cls == "w-rowsum-beyond-int16":
        sums = np.rint(W / S).sum(axis=1)
        n = int((np.abs(sums) > _INT16_MAX).sum())
        asym = not case.act_symmetric
        return n > 0 and asym, f"{n} weight row(s) with |sum of codes| > {_INT16_MAX}; asymmetric activations: {asym}"
    if cls == "code-eq-zero":
        n = sum(bool((W[i] == 0).all() and (S[i] != 0).all()) for i in range(W.shape[0]))
        return n > 0, f"{n} row(s) whose codes all equal their zero points (non-zero scales)"
    if cls == "w-saturation":
        c = W[0] / S[0]
        if case.weight_format == "ct-mxfp4":
            ok = all(c[g == b].max() == 6 and c[g == b].min() == -6 for b in np.unique(g))
        elif case.weight_format == "ct-int-quantized":
            ok = bool(c.max() == 127 and c.min() == -127)
        else:
            maxq = (1 << case.bits) - 1
            ok = all(c[g == b].max() - c[g == b].min() == maxq for b in np.unique(g))
        return ok, f"row 0 reaches both ends of the code range in every group: {ok}"
    if cls == "scale-subnormal":
        if case.weight_format == "ct-mxfp4":
            n = int(np.isin(np.asarray(t["weight_scale"]), (0, 1)).sum())
            return n > 0, f"{n} E8M0 byte(s) 0x00/0x01"
        key = {"gptq": "scales", "awq": "scales"}.get(case.weight_format, "weight_scale")
        s = _f64(t[key])
        tiny = {"float16": 2.0 ** -14, "bfloat16": 2.0 ** -126, "float32": 2.0 ** -126}[case.scale_dtype]
        n = int(((s != 0) & (np.abs(s) < tiny)).sum())
        return n > 0, f"{n} subnormal {case.scale_dtype} scale(s)"
    if cls == "scale-extreme":
        if case.weight_format == "ct-mxfp4":
            big = bool((np.asarray(t["weight_scale"]) == 0xFE).any())
        else:
            big = bool(np.nanmax(np.abs(S)) >= 2.0 ** 14)
        y = _reference(inp)
        return big and bool(np.isfinite(y).any()), f"huge scale present: {big}; {int(np.isfinite(y).sum())} finite output(s)"
    if cls == "nan-scale":
        has = bool((np.asarray(t["weight_scale"]) == 0xFF).any()) and bool(np.isfinite(x).all())
        if not has:
            return False, "no 0xFF byte with finite activations"
        return _finite_and_not(_reference(inp), "nan")
    raise ValueError(f"unknown value class {cls!r}")
