"""Input generators for the exact, edge and random tiers.

Semantics: docs/conformance.md#tiers. A generator is a pure function
``(case, seed) -> CaseInputs``: the same (case, generator, seed) always gives
the same tensors, in any process, so a worker subprocess rebuilds the inputs
it runs on from the case id alone and a replay bundle can be re-derived.

- **exact**: small integers and power-of-two scales, K bounded, so every
  partial sum is exact in fp32 and every accumulation order gives the same
  accumulator: a conforming backend matches the emulator bit for bit.
- **edge**: inputs built to hit what random data never does: rounding ties of
  the activation quantizer (int8 and E2M1), int8 quotients where division and
  reciprocal multiplication round differently, amax exactly on MX scale-rule
  boundaries, MX blocks far below any epsilon, zero rows and blocks, -0,
  NaN/Inf activations, E8M0 bytes 0x00/0xFE/0xFF, GPTQ qzeros fields 0x0/0xF,
  full-mantissa weight scales, router-logit ties at the top-k boundary;
  act-order permutations, K = group size, N not a multiple of 64, M = 1,
  square scale matrices and K not a multiple of 16 are case parameters;
  ``reference-int8`` and ``reference-mx`` separate the named variants of public reference quantizers
  (emulator/reference_quantizers.py) from the canonical ones.
- **random**: seeded draws from realistic distributions (Gaussian, heavy-tailed
  with outlier channels as in LLM activations); conformance/cases/strategies.py has
  the same as composable Hypothesis strategies.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from backends.base import Case
from emulator.activations.int8 import Int8ActVariant, quantize_int8_per_token
from emulator.formats import awq, compressed_tensors as ct, gptq, mxfp4
from emulator.numerics.e2m1 import E2M1_VALUES
from emulator.numerics.floats import round_to_dtype

from conformance.cases.inputs import CaseInputs, ct_tensor_dict, make_inputs

__all__ = ["GENERATORS", "generate", "generators_for", "int_weight_tensors", "scales_array", "uint8_domain_row"]


def _r(a, dtype) -> np.ndarray:
    return round_to_dtype(np.asarray(a, dtype=np.float64), dtype).astype(np.float32)


# -- weights from integer codes ---------------------------------------------------------------
def int_weight_tensors(case: Case, q: np.ndarray, z: np.ndarray, s: np.ndarray, g_idx: np.ndarray | None,
                       *, v1_zero_write: str = "raise") -> dict:
    """Checkpoint tensors for integer codes q [N, K] (unsigned, 0..2^b-1), true zeros z [G, N], scales s [G, N]."""
    fmt = case.weight_format
    G = s.shape[0]
    g = g_idx if g_idx is not None else (np.arange(case.K) // (case.K // G)).astype(np.int32)
    sd = case.scale_dtype
    s_arr = scales_array(s, sd)
    if fmt == "gptq":
        p = gptq.GptqParams(bits=case.bits, group_size=case.group_size, sym=case.sym, desc_act=case.act_order,
                            zero_convention=case.gptq_zero_convention)
        codes = gptq.GptqCodes(q=q.astype(np.uint8), zeros=z.astype(np.int32), scales=s_arr, g_idx=g.astype(np.int32))
        t = gptq.pack_gptq(codes, p, v1_zero_write=v1_zero_write)
        return {"qweight": t.qweight, "qzeros": t.qzeros, "scales": t.scales, "g_idx": g.astype(np.int32)}
    if fmt == "awq":
        t = awq.pack_awq(awq.AwqCodes(q=q.astype(np.uint8), zeros=z.astype(np.int32), scales=s_arr),
                         awq.AwqParams(bits=4, group_size=case.group_size))
        return {"qweight": t.qweight, "qzeros": t.qzeros, "scales": t.scales}
    if fmt == "ct-pack-quantized":
        off = 1 << (case.bits - 1)
        channel = case.group_size in (-1, 0)
        p = ct.CtPackParams(num_bits=case.bits, strategy="channel" if channel else "group",
                            group_size=None if channel else case.group_size, symmetric=case.sym,
                            actorder=case.act_order)
        zp = None if case.sym else (z.T.astype(np.int16) - off).astype(np.int8)
        codes = ct.CtCodes(q=(q.astype(np.int16) - off).astype(np.int8), scales=np.ascontiguousarray(s_arr.T),
                           zero_point=zp, g_idx=g.astype(np.int32) if case.act_order else None)
        return ct_tensor_dict(ct.pack_ct_packed(codes, p))
    raise ValueError(f"integer codes do not apply to format {fmt!r}")


def scales_array(s: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        import ml_dtypes

        return np.asarray(s, np.float32).astype(ml_dtypes.bfloat16)
    return np.asarray(s).astype(dtype)


def _int_codes(case: Case, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    maxq = (1 << case.bits) - 1
    G = case.K // case.group
    q = rng.integers(0, maxq + 1, (case.N, case.K))
    if case.sym:
        z = np.full((G, case.N), 1 << (case.bits - 1))
    else:
        z = rng.integers(1, maxq + 1, (G, case.N))  # v1 cannot store 0: covered by the edge tier
    g_idx = None
    if case.act_order:
        g_idx = (rng.permutation(case.K) // case.group).astype(np.int32)
    return q, z, g_idx


# -- exact tier -----------------------------------------------------------------------------------
def gen_exact(case: Case, seed: int) -> CaseInputs:
    """Small integers x power-of-two scales: every accumulation order is exact."""
    rng = np.random.default_rng(seed)
    M, N, K = case.M, case.N, case.K
    bias = None
    if case.bias:
        bias = _r(rng.integers(-8, 9, N) * 2.0 ** -3, case.act_dtype)
    if case.spec.quantize_only:
        return CaseInputs(case, seed, {}, _quantize_exact_acts(case, rng))
    if case.weight_format in ("gptq", "awq", "ct-pack-quantized"):
        q, z, g_idx = _int_codes(case, rng)
        G = K // case.group
        s = 2.0 ** -rng.integers(2, 7, (G, N)).astype(np.float64)
        tensors = int_weight_tensors(case, q, z, s, g_idx)
        if case.spec.int8_activations:
            x = _int8_exact_acts(case, rng)
        else:
            x = _r(rng.integers(-3, 4, (M, K)) * 2.0 ** rng.integers(-2, 1, (M, 1)), case.act_dtype)
        return CaseInputs(case, seed, tensors, x, bias)
    if case.weight_format == "ct-int-quantized":
        wq = rng.integers(-128, 128, (N, K)).astype(np.int8)
        ws = (2.0 ** -rng.integers(6, 10, (N, 1))).astype(case.scale_dtype if case.scale_dtype != "bfloat16" else np.float32)
        if case.scale_dtype == "bfloat16":
            ws = scales_array(ws, "bfloat16")
        x = _int8_exact_acts(case, rng)
        return CaseInputs(case, seed, {"weight": wq, "weight_scale": ws}, x, bias)
    if case.weight_format == "ct-mxfp4":
        codes = rng.integers(0, 16, (N, K)).astype(np.uint8)
        sb = rng.integers(124, 129, (N, K // 32)).astype(np.uint8)
        tensors = mxfp4.pack_mxfp4_ct(codes, sb)
        if case.scheme == "w4a4-mxfp4":
            x = _mx_exact_acts(case, rng)
        else:
            x = _r(rng.integers(-3, 4, (M, K)) * 0.5, case.act_dtype)
        return CaseInputs(case, seed, tensors, x, bias)
    raise ValueError(f"exact tier has no generator for {case.weight_format}")


def _int8_exact_acts(case: Case, rng) -> np.ndarray:
    """Rows whose amax is 127 * 2**j: the scale is exactly 2**j and every quotient an integer."""
    M, K = case.M, case.K
    j = rng.integers(-6, -1, (M, 1))
    ints = rng.integers(-127, 128, (M, K))
    ints[:, 0] = np.where(rng.random(M) < 0.5, 127, -127)
    return _r(ints * 2.0 ** j, case.act_dtype)


def _quantize_exact_acts(case: Case, rng) -> np.ndarray:
    """Quantize-only cases: inputs every quantizer maps exactly (scale a power of two, integer quotients):
    symmetric int8 rows of amax 127 * 2**j; asymmetric int8 rows spanning exactly [-128, 127] * 2**j; a
    uint8 tensor spanning [-a, 255 - a] * 2**j; MX blocks of E2M1 values with amax 6 * 2**s."""
    M, K = case.M, case.K
    if case.spec.activations == "mxfp4":
        return _mx_exact_acts(case, rng)
    if case.scheme == "q-int8-token" and case.sym:
        return _int8_exact_acts(case, rng)
    j = rng.integers(-6, -1, (M, 1))
    if case.scheme == "q-uint8-tensor":
        a = int(rng.integers(1, 255))
        ints = rng.integers(-a, 256 - a, (M, K))
        ints[0, 0], ints[-1, -1] = -a, 255 - a
        return _r(ints * 2.0 ** j[0, 0], case.act_dtype)
    ints = rng.integers(-128, 128, (M, K))
    ints[:, 0], ints[:, 1] = 127, -128
    return _r(ints * 2.0 ** j, case.act_dtype)


def gen_one_signed(case: Case, seed: int) -> CaseInputs:
    """Rows (for a per-tensor scheme: the whole tensor) of one sign: all positive, all negative, or
    positive with one zero. min/max ranges and zero-inclusive ranges (min(0, min x), max(0, max x)) give
    other scales and zero points here, and only here."""
    inp = _base(case, seed)
    rng = np.random.default_rng(seed)
    M, K = case.M, case.K
    x = np.abs(rng.standard_normal((M, K))) + rng.uniform(0.25, 2.0, (M, 1))
    if case.scheme != "q-uint8-tensor":
        x[1::3] *= -1.0
        x[2::3, 0] = 0.0
    inp.x = _r(x, case.act_dtype)
    return inp


def _mx_exact_acts(case: Case, rng) -> np.ndarray:
    """Blocks of E2M1 values times 2**s with amax 6 * 2**s: quantization is the identity."""
    M, K = case.M, case.K
    codes = rng.integers(0, 16, (M, K))
    vals = E2M1_VALUES[codes].astype(np.float64).reshape(M, K // 32, 32)
    vals[..., 0] = 6.0
    s = rng.integers(-3, 2, (M, K // 32, 1))
    return _r((vals * 2.0 ** s).reshape(M, K), case.act_dtype)


# -- edge tier ------------------------------------------------------------------------------------
def _base(case: Case, seed: int) -> CaseInputs:
    return make_inputs(case, seed)


def gen_int8_ties(case: Case, seed: int) -> CaseInputs:
    """Activations whose quotient x / scale is exactly k + 0.5 (scale = 2**j exactly)."""
    inp = _base(case, seed)
    rng = np.random.default_rng(seed)
    M, K = case.M, case.K
    j = -4
    k = rng.integers(-126, 126, (M, K)) + 0.5
    k[:, 0] = 127
    inp.x = _r(k * 2.0 ** j, case.act_dtype)
    return inp


def gen_zero_rows(case: Case, seed: int) -> CaseInputs:
    """All-zero activation rows (amax = 0) next to ordinary rows, with -0 entries."""
    inp = _base(case, seed)
    x = inp.x.copy()
    x[0, :] = 0.0
    if case.M > 1:
        x[-1, ::3] = -0.0
    inp.x = x
    return inp


def gen_nonfinite_acts(case: Case, seed: int) -> CaseInputs:
    """NaN and +-Inf in activations: A16 propagates them as IEEE arithmetic does; in MXFP4
    activations (W4A4) a NaN or Inf makes its block's scale 0xFF, so the row is NaN."""
    inp = _base(case, seed)
    x = inp.x.copy()
    x[0, 1] = np.nan
    x[1, 2] = np.inf
    x[1, 5] = -np.inf  # +Inf and -Inf in one row: NaN wherever both weights are non-zero
    x[2, 3] = -np.inf
    inp.x = x  # rows 3.. stay finite, so the case still checks ordinary arithmetic
    return inp


def gen_mx_boundaries(case: Case, seed: int) -> CaseInputs:
    """MX blocks whose scale depends on the scale rule, and elements on E2M1 ties after scaling.

    Even rows (row 0 included) are *rule rows*: each block's amax has mantissa 1.875 (FLOOR keeps
    2**(e-2), EVEN, RCEIL and CEIL take 2**(e-1)), 1.625 (FLOOR and EVEN fine, RCEIL and CEIL
    coarse) or 1.375 (only CEIL coarse), so every ordered pair of the four rules gives a different
    scale in some block of every row; the other elements are E2M1 values and +-0.375 / +-0.625
    steps of the fine scale, which round differently at the two scales while no element of the
    row is a tie under any rule. A wrong scale rule then fails outright: no activation tie can
    explain it. Odd rows are *tie rows*: amax on the rule boundaries (1.75 * 2**e, 2**e,
    1.5 * 2**e + ulp, ...) and elements on E2M1 midpoints of the FLOOR scale (the tie rule), with an
    all-zero block holding a -0 in row 1.
    """
    inp = _base(case, seed)
    rng = np.random.default_rng(seed)
    M, K = case.M, case.K
    nb = K // 32
    amax_choices = np.array([1.75, 1.0, 2.0, 1.5 * (1 + 2 ** -23), 6.0, 1.25, 0.75, 3.5])
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.0, -0.25, -0.75, -1.25, -2.5, -5.0])
    rule_mantissas = np.array([1.875, 1.625, 1.375])
    clean = np.array([0.0, 0.375, 0.625, 1.0, 2.0, 3.0, 4.0, -0.375, -0.625, -1.0, -2.0, -3.0, -4.0])
    x = np.zeros((M, nb, 32))
    for m in range(M):
        for b in range(nb):
            e = int(rng.integers(-3, 3))
            if m % 2 == 0:
                fine = 2.0 ** (e - 2)
                blk = rng.choice(clean, 32) * fine
                blk[0] = rule_mantissas[(m // 2 + b) % 3] * 2.0 ** e * rng.choice([-1.0, 1.0])
            else:
                amax = amax_choices[(m * nb + b) % len(amax_choices)] * 2.0 ** e
                # FLOOR scale of this block is 2**(floor(log2 amax) - 2): ties are mids * that scale
                sc = 2.0 ** (np.floor(np.log2(amax)) - 2)
                blk = rng.choice(mids, 32) * sc
                blk = np.clip(blk, -amax, amax)
                blk[0] = amax
            x[m, b] = blk
    if M > 1:
        x[1, 0, :] = 0.0  # an all-zero block
        x[1, 0, 5] = -0.0
    inp.x = _r(x.reshape(M, K), case.act_dtype)
    return inp


def gen_e8m0_extremes(case: Case, seed: int) -> CaseInputs:
    """MXFP4 weights with scale bytes 0x00 (2**-127) and 0xFE (2**127) and one 0xFF (NaN) block."""
    inp = _base(case, seed)
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 16, (case.N, case.K)).astype(np.uint8)
    sb = np.full((case.N, case.K // 32), 127, np.uint8)
    sb[0, :] = 0x00
    if case.N > 1:
        sb[1, 0] = 0xFE
        codes[1, :32] = rng.integers(0, 2, 32)  # tiny codes so 2**127 stays finite in fp32 sums
    if case.N > 2:
        sb[2, -1] = 0xFF
    inp.tensors = mxfp4.pack_mxfp4_ct(codes, sb)
    inp.x = _r(rng.integers(-2, 3, (case.M, case.K)) * 2.0 ** -8, case.act_dtype)
    return inp


def gen_gptq_zero_fields(case: Case, seed: int) -> CaseInputs:
    """GPTQ asymmetric zero points 0 (v1 field 0xF, read as 16) and 15 (v1 field 0xE), and v2 zeros 0."""
    inp = _base(case, seed)
    rng = np.random.default_rng(seed)
    q, z, g_idx = _int_codes(case, rng)
    z[:, 0] = 0
    z[:, -1] = 15
    if case.N > 9:
        z[:, 9] = 0  # field 1 of word 1: a packed add would carry into field 2
    G = z.shape[0]
    s = rng.uniform(0.005, 0.02, (G, case.N))
    s = round_to_dtype(s, case.scale_dtype)
    # v1 cannot store 0 canonically: write the field 0xF with no borrow (FIELD_ALL_ONES), which
    # canonical readers read as 16, exactly as AutoGPTQ-era kernels do.
    write = "field_all_ones" if case.zero_convention != "v2" else "raise"
    inp.tensors = int_weight_tensors(case, q, z, s, g_idx, v1_zero_write=write)
    return inp


def gen_sym_nonmidpoint_qzeros(case: Case, seed: int) -> CaseInputs:
    """A symmetric GPTQ checkpoint whose qzeros are not 0x77777777: canonical readers use them."""
    inp = _base(case, seed)
    qz = np.asarray(inp.tensors["qzeros"]).copy()
    qz.view(np.uint32)[0, :] = np.uint32(0x66666666)
    inp.tensors = dict(inp.tensors, qzeros=qz)
    return inp


def gen_saturation(case: Case, seed: int) -> CaseInputs:
    """Large activation outliers (one channel 1000x) and weights at the code range ends."""
    inp = _base(case, seed)
    x = inp.x.copy()
    x[:, 0] *= 1000.0
    inp.x = _r(x, case.act_dtype)
    return inp


def _odd_mantissa_scales(shape, dtype: str, rng) -> np.ndarray:
    """Positive scales that use every mantissa bit of ``dtype`` (lowest bit set), times 2**-5..2**-8."""
    m = {"float16": 10, "bfloat16": 7, "float32": 23}[dtype]
    mant = 1.0 + (2.0 * rng.integers(0, 1 << (m - 1), shape) + 1.0) * 2.0 ** -m
    return mant * 2.0 ** -rng.integers(5, 9, shape).astype(np.float64)


def gen_weight_mantissa(case: Case, seed: int) -> CaseInputs:
    """Integer codes with full-mantissa scales and exact small-integer activations.

    Every dequantized weight (q - z) * s needs more significant bits than bf16 holds (often
    more than fp16): a kernel that forms or stores the weights in a narrower dtype than it
    declares, or truncates them, is outside the interval at any M (M = 1 included), while the
    activations stay exact so nothing else can explain the difference.
    """
    rng = np.random.default_rng(seed)
    M, N, K = case.M, case.N, case.K
    bias = _r(rng.integers(-8, 9, N) * 2.0 ** -3, case.act_dtype) if case.bias else None
    x = _r(rng.integers(-3, 4, (M, K)) * 2.0 ** rng.integers(-2, 1, (M, 1)), case.act_dtype)
    if case.weight_format == "ct-int-quantized":
        wq = rng.integers(-127, 128, (N, K)).astype(np.int8)
        sd = case.scale_dtype
        ws = _odd_mantissa_scales((N, 1), sd, rng) * 2.0 ** -2
        ws = scales_array(ws, sd) if sd == "bfloat16" else ws.astype(sd)
        return CaseInputs(case, seed, {"weight": wq, "weight_scale": ws}, x, bias)
    q, z, g_idx = _int_codes(case, rng)
    s = _odd_mantissa_scales((K // case.group, N), case.scale_dtype, rng)
    return CaseInputs(case, seed, int_weight_tensors(case, q, z, s, g_idx), x, bias)


def _recip_sensitive_amaxes(dtype: str) -> dict:
    """Row amaxes a in [1, 2) (``dtype`` values) for which x = a / 2 is quantized differently by the
    canonical fl32(x / fl32(a / 127)) and by a reciprocal form; the canonical quotient is never an
    exact tie (63.5), so the difference is not a tie flip. Keys: ``recip_scale`` (x * fl32(1 / s)),
    ``recip_amax`` (x * fl32(127 / a)), ``recip_mul_scale`` (s = fl32(a * fl32(1 / 127))).

    Why a / 2: its true quotient x * 127 / a is exactly 63.5, so the fp32 roundings of the scale
    and of the reciprocal decide on which side of the tie each form lands.
    """
    key = ("_cache", dtype)
    cache = _recip_sensitive_amaxes.__dict__
    if key in cache:
        return cache[key]
    bits = {"bfloat16": 7, "float16": 10, "float32": 13}[dtype]
    f32 = np.float32
    a = (1.0 + np.arange(1 << bits) * 2.0 ** -bits + (2.0 ** -23 if dtype == "float32" else 0.0)).astype(f32)
    s = (a / f32(127)).astype(f32)
    x = (a / f32(2)).astype(f32)
    q = (x / s).astype(f32)
    forms = {
        "recip_scale": (x * (f32(1) / s).astype(f32)).astype(f32),
        "recip_amax": (x * (f32(127) / a).astype(f32)).astype(f32),
        "recip_mul_scale": (x / (a * (f32(1) / f32(127)).astype(f32)).astype(f32)).astype(f32),
    }
    out = {k: a[(q != f32(63.5)) & (np.rint(q) != np.rint(v))].astype(np.float64) for k, v in forms.items()}
    cache[key] = out
    return out


def gen_int8_recip(case: Case, seed: int) -> CaseInputs:
    """Rows whose codes differ between x / scale and every reciprocal-multiply form (no ties).

    Row m has amax a (from ``_recip_sensitive_amaxes``, cycling over the three forms, times a
    power of two) and many elements +-a/2, whose quotient is within one fp32 ulp of 63.5: the
    division and the multiplication by a rounded reciprocal (of the scale, of amax / 127, or a
    scale formed as amax * fl32(1/127)) round it to different integers. The rest of the row is
    ordinary values below a.
    """
    inp = _base(case, seed)
    rng = np.random.default_rng(seed)
    M, K = case.M, case.K
    table = _recip_sensitive_amaxes(case.act_dtype)
    forms = sorted(table)
    x = np.empty((M, K))
    for m in range(M):
        pool = table[forms[m % len(forms)]]
        if M == 1:  # one row: an amax that trips as many forms as possible
            counts = {float(v): sum(float(v) in set(table[f].tolist()) for f in forms) for v in np.concatenate(
                [table[f] for f in forms])}
            best = max(counts.values())
            pool = np.array(sorted(v for v, c in counts.items() if c == best))
        a = float(pool[(seed + m) % len(pool)]) * 2.0 ** int(rng.integers(-4, 3))
        row = rng.uniform(-0.9, 0.9, K) * a
        row[1::3] = np.where(rng.random(len(row[1::3])) < 0.5, a / 2, -a / 2)
        row[0] = a if m % 2 == 0 else -a
        x[m] = row
    inp.x = _r(x, case.act_dtype)
    return inp


def gen_mx_tiny_blocks(case: Case, seed: int) -> CaseInputs:
    """MX activation blocks with amax far below 6e-10 (bf16/fp32 only; fp16 cannot hold them).

    Canonically the scale follows the block (2**(floor(log2 amax) - 2), down to 2**-127); a kernel
    that floors amax (or amax / 6) at an epsilon — the way some treat zero blocks — gives these
    blocks a scale so large that every element rounds to zero.
    """
    inp = _base(case, seed)
    rng = np.random.default_rng(seed)
    M, K = case.M, case.K
    nb = K // 32
    e = rng.integers(-60, -36, (M, nb, 1)).astype(np.float64)
    x = rng.standard_normal((M, nb, 32)) * 2.0 ** e
    if M > 1:
        x[1::2, ::2, :] = 0.0  # zero blocks next to tiny ones
    inp.x = _r(x.reshape(M, K), case.act_dtype)
    return inp


def uint8_domain_row(K: int, seed: int) -> np.ndarray:
    """An fp32 row [min, 1 + min, ...] whose zero point differs between the int8 domain
    (round(fl32(-128 - min / s))) and the uint8 domain (round(-min / s)): min / s lies just past a
    half-integer by less than half an fp32 ulp of 128, so only the int8 form rounds it onto the tie.
    (16-bit activations almost never allow such a row, and ONNX's DynamicQuantizeLinear takes fp32 only.)"""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    base = dict(symmetric=False, range_rule="zero_inclusive", azp_clamp=True)
    for _ in range(4000):
        t = (int(rng.integers(0, 120)) + 0.5 + int(rng.integers(1, 40)) * 2.0 ** -21) / 255.0
        lo = -f32(t)
        row = np.concatenate([[lo, f32(1) + lo], rng.uniform(float(lo), float(f32(1) + lo), K - 2)]).astype(f32)
        a = quantize_int8_per_token(row[None, :], Int8ActVariant(**base))
        b = quantize_int8_per_token(row[None, :], Int8ActVariant(**base, azp_domain="uint8"))
        if a.zero_point[0, 0] != b.zero_point[0, 0]:
            return row
    raise AssertionError("no uint8-domain row found")  # deterministic: about one candidate in 30 qualifies


def gen_reference_int8(case: Case, seed: int) -> CaseInputs:
    """Rows that separate the int8 activation quantizers of public reference implementations from the
    canonical one (docs/formats/activations.md#reference-implementations):

    - row 0 all zero: the zero-scale rules (canonical scale 0; compressed-tensors dtype epsilon; ONNX 1/255);
    - row 1 all positive and row 2 all negative: the zero-inclusive range (0 always in range) and the
      clamped zero point (an unclamped int8-domain zero point lies below -128 or above 127 there);
    - row 3, fp32 cases: [-2, -2 + 2**-23]: -min / scale = 255 * 2**24 overflows int32, so the zero point
      saturates (canonical) or is stored as INT32_MIN (x86), and the quotient saturates at -(2**31 - 1)
      (canonical) or -2**31 (vLLM CUDA), giving codes 0 or -1; 16-bit cases: a constant negative row;
    - row 4, fp32 cases: a row whose zero point differs between the int8 and the uint8 (ONNX) domain;
    - every row: the symmetric divisor 127.5 and quotients rounded to a 16-bit activation dtype change
      the scale and most codes; the other rows are Gaussian.
    """
    inp = _base(case, seed)
    rng = np.random.default_rng(seed)
    K = case.K
    x = inp.x.astype(np.float64).copy()
    x[0] = 0.0
    x[1] = np.abs(rng.standard_normal(K)) * 4 + 0.25
    x[2] = -(np.abs(rng.standard_normal(K)) * 4 + 0.25)
    if case.act_dtype == "float32":
        x[3] = np.where(np.arange(K) % 2 == 0, -2.0, -2.0 + 2.0 ** -23)
    else:
        x[3] = -1.5
    x[4] = uint8_domain_row(K, seed) if case.act_dtype == "float32" else rng.uniform(-0.4, 0.6, K)
    inp.x = _r(x, case.act_dtype)
    return inp


def gen_reference_mx(case: Case, seed: int) -> CaseInputs:
    """MX activation blocks that separate the reference quantizers of docs/formats/mxfp4.md#reference-
    implementations from the canonical one:

    - row 0, block 0: amax 2**-125 with elements 2**-125 * {1, -1/4, 3/4, ...}: scale byte 0 under every
      rule; torchao divides it by 2**-126 (FLOOR/EVEN/CEIL) or by 1 (RCEIL) instead of 2**-127;
    - row 1, block 0: amax 1.875 * 2**127: EVEN rounds it to Inf, which compressed-tensors turns into the
      scale 2**128 (byte 0xFF, a NaN block); canonical EVEN clamps to byte 253;
    - row 2, block 0, fp32 cases: amax = 6 * 2**k * (1 + 2**-22), 8 <= k < 20: amax / 6 lies just above 2**k, where
      RCEIL takes 2**(k+1) and its fp32-log2 form 2**k (16-bit dtypes cannot hold such an amax);
    - the other blocks are Gaussian.
    """
    inp = _base(case, seed)
    rng = np.random.default_rng(seed)
    x = inp.x.astype(np.float64).copy()
    grid = np.array([1.0, -0.25, 0.75, -0.5, 0.375, 0.125, -1.0, 0.0625])
    x[0, :32] = rng.choice(grid, 32) * 2.0 ** -125
    x[0, 0] = 2.0 ** -125
    x[1, :32] = rng.standard_normal(32) * 2.0 ** 126
    x[1, 0] = 1.875 * 2.0 ** 127
    if case.act_dtype == "float32":
        k = int(rng.integers(8, 20))  # |k| >= 8: 2**-22 / ln 2 is below half an fp32 ulp of k
        amax = 6.0 * 2.0 ** k * (1 + 2.0 ** -22)
        x[2, :32] = np.clip(rng.standard_normal(32) * amax / 2, -amax, amax)
        x[2, 0] = -amax
    inp.x = _r(x, case.act_dtype)
    return inp


def gen_router_ties(case: Case, seed: int) -> CaseInputs:
    """Router logits with an exact tie across the top-k boundary in every row.

    top_k - 1 experts have clearly larger logits and two experts share the next one exactly, so
    the tie rule alone (canonical: the lower expert index first) decides the last chosen expert.
    """
    inp = _base(case, seed)
    rng = np.random.default_rng(seed)
    M, E, k = case.M, case.E, case.top_k
    logits = np.empty((M, E), dtype=np.float32)
    for m in range(M):
        order = rng.permutation(E)
        row = np.empty(E)
        row[order[:k - 1]] = 2.0 + rng.random(k - 1)
        row[order[k - 1:k + 1]] = 1.0
        row[order[k + 1:]] = -1.0 - rng.random(E - k - 1)
        logits[m] = row
    inp.router_logits = logits
    return inp


# -- random tier ------------------------------------------------------------------------------------
def gen_gaussian(case: Case, seed: int) -> CaseInputs:
    return make_inputs(case, seed)


def gen_outlier_channels(case: Case, seed: int) -> CaseInputs:
    """Heavy-tailed activations (Student-t, 3 dof) with a few outlier channels x20-x100 (LLM.int8 style)."""
    inp = make_inputs(case, seed)
    rng = np.random.default_rng(seed + 99)
    x = rng.standard_t(3, (case.M, case.K))
    ch = rng.choice(case.K, max(1, case.K // 64), replace=False)
    x[:, ch] *= rng.uniform(20, 100, len(ch))
    inp.x = _r(x, case.act_dtype)
    return inp



# -- layer-sized inputs (the model profile) ----------------------------------------------------------
def _nibble_words(rng, shape) -> np.ndarray:
    """int32 words of 8 independent 4-bit codes, each (a >> 1) + (b >> 1) + c (a, b uniform 0..15, c a
    random bit): 0..15, bell-shaped around 7.5 like the codes of an RTN-quantized Gaussian weight. Every
    code is valid in every int4 layout (GPTQ, AWQ, compressed-tensors), so the words are the packed
    tensor whatever its packing order."""
    a = rng.integers(0, 1 << 32, shape, dtype=np.uint32)
    b = rng.integers(0, 1 << 32, shape, dtype=np.uint32)
    c = rng.integers(0, 1 << 32, shape, dtype=np.uint32)
    a >>= 1
    a &= np.uint32(0x77777777)
    b >>= 1
    b &= np.uint32(0x77777777)
    c &= np.uint32(0x11111111)
    a += b
    a += c  # per nibble at most 7 + 7 + 1 = 15: no carry into the next field
    return a.view(np.int32)


def _layer_activations(case: Case, rng) -> np.ndarray:
    """Gaussian activations with a few outlier channels x20-x100 (LLM.int8 style)."""
    x = rng.standard_normal((case.M, case.K))
    ch = rng.choice(case.K, max(1, case.K // 256), replace=False)
    x[:, ch] *= rng.uniform(20, 100, len(ch))
    return _r(x, case.act_dtype)


def _group_scales(rng, shape, dtype: str) -> np.ndarray:
    """Positive scales around 0.006 (a Gaussian weight of std 0.02 in 4 bits), log-normal spread, in ``dtype``."""
    return scales_array(np.exp(rng.normal(np.log(0.006), 0.35, shape)), dtype)


def gen_layer_codes(case: Case, seed: int) -> CaseInputs:
    """Layer-sized checkpoint tensors drawn directly in their packed form, in linear time.

    The model profile's generator (docs/conformance.md#model-profile): quantizing a float weight of
    Llama-3-8B's 14336 x 4096 with the emulator's exact RTN quantizer takes ~20 s, so the packed codes
    are drawn directly (``_nibble_words``; int8: a bell-shaped byte; MXFP4: uniform E2M1 codes with
    E8M0 bytes 2**-8..2**-5), the scales log-normal; the activations are Gaussian with outlier
    channels. The tensors are valid checkpoints of the case's format: the reference and the kernels
    read them like any other.
    """
    rng = np.random.default_rng(seed)
    N, K = case.N, case.K
    x = _layer_activations(case, rng)
    bias = _r(rng.standard_normal(N) * 0.1, case.act_dtype) if case.bias else None
    fmt = case.weight_format
    if case.scheme == "w4a16-moe":
        return _layer_experts(case, seed, rng, x)
    if fmt in ("gptq", "awq", "ct-pack-quantized") and case.bits == 4 and not case.act_order:
        G = K // case.group
        z = np.full((G, N), 8) if case.sym else rng.integers(6, 11, (G, N))
        s = _group_scales(rng, (G, N), case.scale_dtype).astype(np.float64)
        # the zero points and scales through the format's own packer, on a stand-in with one packed word
        # per group (they depend on G and N only); the weight words drawn at full size
        stand_in = dataclasses.replace(case, K=G * 8, group_size=8 if G > 1 or not case.channelwise else -1)
        t = int_weight_tensors(stand_in, np.zeros((N, G * 8), np.uint8), z, s, None)
        if fmt == "gptq":
            t["qweight"] = _nibble_words(rng, (K // 8, N))
            t["g_idx"] = (np.arange(K) // case.group).astype(np.int32)
        elif fmt == "awq":
            t["qweight"] = _nibble_words(rng, (K, N // 8))
        else:
            t["weight_packed"] = _nibble_words(rng, (N, K // 8))
            t["weight_shape"] = np.asarray([N, K], dtype=np.int64)
        return CaseInputs(case, seed, t, x, bias)
    if fmt == "ct-int-quantized":
        a = rng.integers(-128, 128, (N, K), dtype=np.int8)
        b = rng.integers(-128, 128, (N, K), dtype=np.int8)
        a >>= 1
        b >>= 1
        a += b  # -128..126, triangular around 0
        np.maximum(a, -127, out=a)  # symmetric int8 weights: -128 is not a code
        ws = scales_array(np.exp(rng.normal(np.log(0.02 * 4 / 127), 0.3, (N, 1))).astype(np.float32),
                          case.scale_dtype)
        return CaseInputs(case, seed, {"weight": a, "weight_scale": ws}, x, bias)
    if fmt == "ct-mxfp4":
        packed = rng.integers(0, 256, (N, K // 2), dtype=np.uint8)
        sb = rng.integers(119, 123, (N, K // 32), dtype=np.uint8)
        return CaseInputs(case, seed, {"weight_packed": packed, "weight_scale": sb}, x, bias)
    raise ValueError(f"layer-codes has no generator for {case.describe()}")


def _layer_experts(case: Case, seed: int, rng, x) -> CaseInputs:
    """Stacked symmetric GPTQ int4 experts in vLLM's FusedMoE layout (as ``make_inputs`` writes them):
    ``w13_qweight [E, K/8, 2I]``, ``w2_qweight [E, I/8, K]`` and their float16 group scales."""
    E, I, K = case.E, case.N, case.K
    g2 = min(case.group, I)
    tensors = {"w13_qweight": _nibble_words(rng, (E, K // 8, 2 * I)),
               "w13_scales": _group_scales(rng, (E, K // case.group, 2 * I), case.scale_dtype),
               "w2_qweight": _nibble_words(rng, (E, I // 8, K)),
               "w2_scales": _group_scales(rng, (E, I // g2, K), case.scale_dtype)}
    logits = rng.standard_normal((case.M, E)).astype(np.float32)
    return CaseInputs(case, seed, tensors, x, None, logits, None)


#: generator name -> (tier, function, predicate(case) -> bool)
GENERATORS = {
    "exact": ("exact", gen_exact, lambda c: c.scheme != "w4a16-moe"),
    "int8-ties": ("edge", gen_int8_ties, lambda c: c.spec.activations == "int8"),
    "zero-rows": ("edge", gen_zero_rows, lambda c: c.M > 1),
    "nonfinite-acts": ("edge", gen_nonfinite_acts,
                       lambda c: c.spec.activations in ("a16", "mxfp4") and c.M > 3),
    "mx-boundaries": ("edge", gen_mx_boundaries, lambda c: c.spec.activations == "mxfp4"),
    "e8m0-extremes": ("edge", gen_e8m0_extremes, lambda c: c.weight_format == "ct-mxfp4"),
    "gptq-zero-fields": ("edge", gen_gptq_zero_fields, lambda c: c.weight_format == "gptq" and not c.sym),
    "sym-nonmidpoint-qzeros": ("edge", gen_sym_nonmidpoint_qzeros,
                               lambda c: c.weight_format == "gptq" and c.sym and c.scheme != "w4a16-moe"),
    "saturation": ("edge", gen_saturation, lambda c: c.spec.activations in ("int8", "mxfp4")),
    "weight-mantissa": ("edge", gen_weight_mantissa,
                        lambda c: c.spec.activations == "a16" and c.spec.weights in ("int4", "int8")
                        and c.weight_format in ("gptq", "awq", "ct-pack-quantized", "ct-int-quantized")),
    "int8-recip": ("edge", gen_int8_recip, lambda c: c.spec.activations == "int8"),
    "mx-tiny-blocks": ("edge", gen_mx_tiny_blocks,
                       lambda c: c.spec.activations == "mxfp4" and c.act_dtype != "float16"),
    "one-signed": ("edge", gen_one_signed,
                   lambda c: c.scheme == "q-uint8-tensor" or (c.scheme == "q-int8-token" and not c.sym)),
    "router-ties": ("edge", gen_router_ties, lambda c: c.scheme == "w4a16-moe" and c.E >= c.top_k + 1),
    "reference-int8": ("edge", gen_reference_int8, lambda c: c.spec.activations == "int8" and c.M >= 5
                       and c.scheme != "w4a16-moe"),
    "reference-mx": ("edge", gen_reference_mx, lambda c: c.spec.activations == "mxfp4" and c.M >= 3
                     and c.act_dtype != "float16"),
    "gaussian": ("random", gen_gaussian, lambda c: True),
    "outlier-channels": ("random", gen_outlier_channels, lambda c: c.scheme != "w4a16-moe"),
    # drawn only where a profile names it (the model profile, conformance/cases/model_profile.py): never by default
    "layer-codes": ("random", gen_layer_codes, lambda c: False),
    # the coverage design's value classes, ``vc-<class>`` (conformance/cases/coverage_values.py), are added by
    # conformance/cases/specs.py: they are built on this module's packers
}


def generators_for(case: Case, tiers) -> list[str]:
    return [name for name, (tier, _, pred) in GENERATORS.items() if tier in tiers and pred(case)]


def generate(case: Case, generator: str, seed: int) -> CaseInputs:
    if generator not in GENERATORS:
        raise ValueError(f"unknown generator {generator!r}; known: {', '.join(GENERATORS)}")
    return GENERATORS[generator][1](case, seed)
