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
from conformance.cases.coverage import ACT_ORDER_VALUES, AMAX, NAN_SCALE, TABLES, W_INT, W_MX
from conformance.cases.generators import gen_router_ties, int_weight_tensors, scales_array, uint8_domain_row

__all__ = ["VALUE_GENERATORS", "generate_value", "activation_units", "units_of", "MANTISSA_BITS", "INT16_MAX"]

#: mantissa bits of each activation dtype (the ulp of 2^k is 2^(k - bits))
MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "float32": 23}
_WEIGHT_CLASSES = set(W_INT) | set(W_MX) | set(ACT_ORDER_VALUES) | {"w-rowsum-beyond-int16"}
#: the largest int16
INT16_MAX = 32767


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


def units_of(x: np.ndarray, unit: str) -> list:
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
        for u in units_of(x, unit):
            a = _amax_target(cls, int(rng.integers(lo, hi)), dt)
            u[:] = _round(rng.uniform(-0.99, 0.99, u.shape) * a, dt)
            u[int(rng.integers(0, u.size))] = a * rng.choice([-1.0, 1.0])
    elif cls == "act-one-signed":
        for i, u in enumerate(units_of(x, unit)):
            v = np.abs(rng.standard_normal(u.shape)) + rng.uniform(0.25, 2.0)
            sign = (-1.0 if i % 3 == 1 else 1.0) if unit != "tensor" else (1.0 if rng.random() < 0.5 else -1.0)
            u[:] = v * sign
            if i % 3 == 2 and u.size > 1:
                u[0] = 0.0
    elif cls == "act-constant-rows":  # even rows: odd rows stay ordinary, so codes and outputs vary
        for m in range(0, M, 2):
            x[m] = rng.uniform(0.5, 2.0) * 2.0 ** int(rng.integers(-3, 3)) * rng.choice([-1.0, 1.0])
    elif cls == "act-saturation":  # block amax mantissa 1.625..1.875: amax / 2^(floor(log2 amax) - 2) > 6
        for u in units_of(x, "block"):
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
    elif cls == "act-byte0-fine-steps":  # bf16/fp32 only (coverage.CONSTRAINTS): one block column, every row
        b = byte0_block(case)
        for m in range(M):
            x[m, 32 * b:32 * b + 32] = _byte0_block_values(rng)
    elif cls == "nan-act":
        x[0, int(rng.integers(0, K))] = np.nan
    elif cls == "inf-act":
        x[0, int(rng.integers(0, K))] = np.inf
        if M >= 3:
            x[1, int(rng.integers(0, K))] = -np.inf
    return _round(x, dt)


#: E2M1 magnitudes (docs/formats/mxfp4.md)
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def byte0_block(case: Case) -> int:
    """The block column of act-byte0-fine-steps, from the shape alone, so weights and activations agree."""
    return (case.M + case.N) % (case.K // 32)


def _byte0_block_values(rng) -> np.ndarray:
    """32 values whose MX block scale is 2^-127 (E8M0 byte 0): amax 4 or 6 * 2^-127 (2^-125 or 1.5 * 2^-125, so
    floor(log2 amax) - 2 = -127), every value on the E2M1 grid at that scale, with +-0.5 and +-1.5 steps (odd
    multiples of 2^-128) present: a scale clamped at 2^-126 rounds exactly those."""
    v = rng.choice(_E2M1, 32) * rng.choice([-1.0, 1.0], 32)
    v[0] = rng.choice([4.0, 6.0]) * rng.choice([-1.0, 1.0])
    v[1], v[2], v[3], v[4] = 0.5, -0.5, 1.5, -1.5
    v[1:] = v[1:][rng.permutation(31)]
    return v * 2.0 ** -127


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


def unequal_g_idx(K: int, group: int, rng) -> np.ndarray:
    """A g_idx into [0, K / group) whose groups are not all ``group`` wide, randomly permuted: two groups of
    group + group/4 and group - group/4 columns; three or more: one group empty, the others of random sizes
    of at least one column (docs/formats/gptq.md: desc_act accepts any map into [0, K/G))."""
    ng = K // group
    if ng == 2:
        d = max(1, group // 4)
        sizes = np.array([group + d, group - d])[rng.permutation(2)]
    else:
        empty = int(rng.integers(0, ng))
        live = [i for i in range(ng) if i != empty]
        cuts = np.sort(rng.choice(np.arange(1, K), len(live) - 1, replace=False))
        sizes = np.zeros(ng, np.int64)
        sizes[live] = np.diff(np.concatenate([[0], cuts, [K]]))
    return rng.permutation(np.repeat(np.arange(ng), sizes)).astype(np.int32)


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


def _negate_every_other(s: np.ndarray) -> np.ndarray:
    """Scales [G, N] with every other group negated (one group: every other output channel; one scale: it)."""
    s = s.copy()
    if s.shape[0] > 1:
        s[1::2] = -s[1::2]
    elif s.shape[1] > 1:
        s[:, 1::2] = -s[:, 1::2]
    else:
        s = -s
    return s


def _int_weights(case: Case, cls: str, rng) -> dict:
    q, z, s, g_idx, g = _int_parts(case, rng)
    maxq = (1 << case.bits) - 1
    N = case.N
    if cls == "g_idx-unequal-groups":  # act order only (coverage.CONSTRAINTS)
        g_idx = g = unequal_g_idx(case.K, case.group, rng)
    elif cls == "w-one-signed":
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
    elif cls == "scale-negative":
        s = _negate_every_other(s)
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
    elif cls == "scale-negative":
        ws = _negate_every_other(ws.T).T
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
    elif cls == "act-byte0-fine-steps":  # every row's block b: byte 0xFE, codes +-0.5 (2^126 * 2^-128 is normal)
        b = byte0_block(case)
        sb[:, b] = 0xFE
        codes[:, 32 * b:32 * b + 32] = rng.choice([1, 9], (N, 32))
    elif cls == "scale-extreme":
        r = 1 if N > 1 else 0
        sb[r, 0] = 0xFE
        codes[r, :32] = rng.choice([0, 1, 8, 9], 32)  # 0, +-0.5: 2^127 * 0.5 * tiny activations stay finite
    elif cls in NAN_SCALE:
        n, b = N // 2, int(rng.integers(0, nb))
        sb[n, b] = 0xFF
        if cls == "nan-scale-zero-codes":  # +0 and -0 codes
            codes[n, 32 * b:32 * b + 32] = rng.choice([0, 8], 32)
        elif cls == "nan-scale-one-signed":  # magnitudes 0.5..6, one sign bit
            codes[n, 32 * b:32 * b + 32] = rng.integers(1, 8, 32) | (8 if rng.random() < 0.5 else 0)
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
        if cls == "nan-scale-one-signed":  # activations of one sign over the 0xFF block, in every row
            b = int(np.argwhere(np.asarray(inp.tensors["weight_scale"]) == 0xFF)[0][1])
            x = np.asarray(inp.x, np.float64).copy()
            x[:, 32 * b:32 * b + 32] = (rng.choice([-1.0, 1.0]) * 2.0 ** int(rng.integers(-2, 3))
                                        * rng.uniform(0.5, 1.0, (case.M, 32)))
            inp.x = _round(x, case.act_dtype)
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

