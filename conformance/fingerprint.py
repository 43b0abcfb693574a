"""Semantic fingerprint of a backend: which named variants its outputs are consistent with.

Semantics: docs/fingerprints.md.

``qconform fingerprint --backend B [--scheme S] [--axis A] [--json FILE] [--out DIR]`` runs
*discriminating probes* -- constructed inputs on which named variants of one semantic axis give
outputs that no single kernel output can match at once -- and reports, per scheme and axis, the
variants the kernel's outputs are consistent with, the variants they exclude (with the probe that
excluded each), and where that contradicts the arithmetic the backend declares.

How one axis is decided:

1. A *hypothesis* is a ``Declared``: the backend's own declaration with the axis (and, where
   they interact, some other axes: ``nuisance``) set to named values. Earlier axes of the same
   scheme are fixed to what their probes found (or, where those were ambiguous, ranged over).
2. Probe inputs are searched for with the emulator: seeded candidate inputs built around the
   axis's boundaries (rounding ties and their neighbours, MX scale-rule boundaries, E2M1
   midpoints, tiny amax below the eps clamps, GPTQ zero fields 0x0/0xF, ...) are kept while they
   *separate* a pair of hypotheses with different axis values not yet separated: on some output
   element the two declared intervals (conformance.acceptance.declared_interval) are disjoint, so
   no output can be inside both.
3. Each probe is written as a replay bundle (conformance/bundle.py) and run by the backend in
   a worker subprocess (conformance.runner.WorkerProcess), so a crashing kernel costs one axis,
   not the fingerprint.
4. A hypothesis is *consistent* when the observed output is inside its interval on every probe
   of the axis (conformance.acceptance.compare); a value is consistent when one of its
   hypotheses is. Being a containment test, this is sound whatever the search found: a pair
   the search could not separate shows up as two consistent values, never as a wrong exclusion.

Accumulation precision is the exception: its intervals are nested (a float32 accumulator is
inside the bfloat16 bound too), so its probes are fixed cancellation patterns that make a
coarser accumulator err visibly, and the answer is a bracket: the finest precision whose bound
the output respects, and the finer ones it violates.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from backends.base import Case, Declared
from emulator.numerics.floats import decode, encode, format_of, round_to_dtype
from emulator.variants import AXES as VOCABULARY

from .acceptance import compare, declared_interval
from .bundle import save_bundle
from .cases import CaseInputs
from .generators import _scales_array, int_weight_tensors
from .runner import WorkerProcess
from .suite import CaseSpec

__all__ = ["AXES", "SCHEME_AXES", "Axis", "fingerprint", "register", "format_text"]

#: Declared fields (not variants) an axis may set
_FIELDS = ("weight_dtype", "accumulate", "act_compute_dtype")

def _unset(key: str):
    """The canonical value of a vocabulary axis as the probes spell it (None where it means 'not named')."""
    v = VOCABULARY[key].canonical
    return None if (key, v) in (("weight_scale_dtype", "checkpoint"), ("act_compute_dtype", "none")) else v


#: canonical value of each variant key (what an absent key means), from the vocabulary (emulator/variants.py)
_DEFAULTS = {k: _unset(k) for k in VOCABULARY}


def _norm(key: str, v):
    if v is None:
        v = _DEFAULTS.get(key)
    if v is None:
        return None
    v = VOCABULARY[key].parse(v) if key in VOCABULARY else v
    if isinstance(v, str):
        v = v.lower()
    if key == "weight_dtype" and v == "exact":
        return "float32"  # int formats: 'exact' forms (q - z) * s in float32 (int_common.dequantize_affine)
    if key == "accumulate" and v == "exact":
        return "float64"  # u = 0: no bound wider than float64's on these probes
    if (key, v) in (("weight_scale_dtype", "checkpoint"), ("act_compute_dtype", "none")):
        return None
    return v


# -- axes ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Axis:
    """One semantic axis: named values, each a set of overrides of the declaration."""

    name: str
    title: str
    probe: str  # probe family: int8 | mx | gptq-sym | gptq-v1 | dequant | accumulate
    values: tuple  # ((value name, {key: value}), ...)
    nuisance: tuple = ()  # other axes (names in AXES) ranged over while deciding this one
    depends: tuple = ()  # earlier axes of the scheme whose findings condition this one
    modes: tuple = ()  # candidate-input styles for the search
    note: str = ""


def _vals(key: str, names) -> tuple:
    return tuple((str(n), {key: n}) for n in names)


_ZERO_ROW_VALUES = (("zero", {"zero_row": "zero", "eps": None}), ("nan", {"zero_row": "nan", "eps": None}),
                    ("eps=1e-10", {"zero_row": "eps", "eps": 1e-10}), ("eps=1e-07", {"zero_row": "eps", "eps": 1e-7}),
                    ("eps=1e-05", {"zero_row": "eps", "eps": 1e-5}))

_MX_NAN_VALUES = (("scale_nan", {"mx_nan_block": "scale_nan", "e2m1_nan": None}),) + tuple(
    (f"ignore/{r}", {"mx_nan_block": "ignore", "e2m1_nan": r})
    for r in ("zero", "zero_signed", "zero_sign_flipped", "saturate", "saturate_positive"))

_DEQUANT_VALUES = tuple((f"{d}/{o}", {"weight_dtype": d, "dequant_order": o})
                        for d in ("float32", "bfloat16", "float16")
                        for o in ("sub_then_mul", "mul_then_sub", "float_zero"))

AXES: dict[str, Axis] = {a.name: a for a in [
    # dynamic int8 activations (W8A8, W4A8)
    Axis("act_rounding", "activation rounding (ties)", "int8", _vals("act_rounding", ("rne", "rhaz", "rtz", "rhtz")),
         modes=("pow2", "random")),
    Axis("act_scale_dtype", "activation scale dtype", "int8",
         _vals("act_scale_dtype", ("float32", "bfloat16", "float16")), nuisance=("reciprocal",),
         depends=("act_rounding",), modes=("random", "odd")),
    Axis("reciprocal", "quotient form (x/s, x*(127/amax), x*(1/s))", "int8",
         _vals("reciprocal", ("divide", "recip_amax", "recip_scale")),
         depends=("act_rounding", "act_scale_dtype"), modes=("odd", "random")),
    Axis("zero_row", "zero-row / amax-eps rule", "int8", _ZERO_ROW_VALUES,
         depends=("act_rounding", "act_scale_dtype", "reciprocal"), modes=("tiny", "zero"),
         note="an all-zero row gives 0 under 'zero' and 'nan' alike; only eps clamps show, on rows with amax < eps"),
    Axis("qmin", "int8 clamp range", "int8", (("[-128,127]", {"qmin": -128}), ("[-127,127]", {"qmin": -127})),
         depends=("act_rounding", "act_scale_dtype", "reciprocal", "zero_row"), modes=("subnormal", "random"),
         note="symmetric per-token quotients stay within +-127.5 unless the scale underflows: probed with "
              "subnormal amax"),
    # MXFP4 activations (W4A4)
    Axis("mx_scale_rule", "MX shared-scale rule", "mx", _vals("mx_scale_rule", ("floor", "even", "rceil", "ceil")),
         nuisance=("e2m1_rounding",), modes=("boundary",)),
    Axis("e2m1_rounding", "E2M1 tie rule", "mx", _vals("e2m1_rounding", ("rne", "rhaz", "rtz", "rhtz")),
         depends=("mx_scale_rule",), modes=("boundary",)),
    Axis("mx_nan", "NaN rule (block scale / element code)", "mx", _MX_NAN_VALUES,
         depends=("mx_scale_rule", "e2m1_rounding"), modes=("nan",),
         note="with the block scale made NaN the element code is invisible; codes +0/-0 are equal in a sum"),
    Axis("mx_zero_block", "zero-block scale", "mx", _vals("mx_zero_block", ("min", "half", "eps_fp32", "eps_1e10", "eps_1e10_floor")),
         depends=("mx_scale_rule", "e2m1_rounding"), modes=("zero",),
         note="an all-zero block contributes 0 whatever its scale: not observable in a linear's output"),
    # GPTQ zero points
    Axis("gptq_sym_qzeros", "GPTQ sym=True: are qzeros read?", "gptq-sym",
         (("read (canonical)", {"zero_read": "canonical"}), ("ignored (z=8)", {"zero_read": "ignore_qzeros"})),
         modes=("random",)),
    Axis("gptq_v1_zero", "GPTQ v1 zero convention", "gptq-v1",
         _vals("zero_read", ("canonical", "v1_literal", "v1_wrap", "v1_packed_add")), modes=("random",)),
    # dequantization (A16)
    Axis("weight_scale_dtype", "dtype the weight scales are read in", "dequant",
         (("checkpoint", {"weight_scale_dtype": None}), ("bfloat16", {"weight_scale_dtype": "bfloat16"}),
          ("float16", {"weight_scale_dtype": "float16"})), nuisance=("dequant",), modes=("cancel", "random")),
    Axis("dequant", "weight dtype / dequant order", "dequant", _DEQUANT_VALUES, depends=("weight_scale_dtype",),
         modes=("cancel", "random"),
         note="with 16-bit scales and float32 weights every order is exact, so the orders coincide there"),
    Axis("accumulate", "accumulation precision (bracket)", "accumulate",
         _vals("accumulate", ("float64", "float32", "float16", "bfloat16")),
         depends=("gptq_sym_qzeros", "weight_scale_dtype", "dequant")),
]}

def _check_probe_axes() -> None:
    """Every override of every probe axis names a vocabulary key and a value it accepts (fails at import)."""
    for ax in AXES.values():
        for name, ov in ax.values:
            for k, v in ov.items():
                if k not in VOCABULARY:
                    raise AssertionError(f"fingerprint axis {ax.name}: {k!r} is not a variant key")
                if v is not None:
                    VOCABULARY[k].parse(v)


_check_probe_axes()


#: the axes probed per scheme, in order (later axes are conditioned on earlier ones via ``depends``)
SCHEME_AXES = {
    "w8a8": ("act_rounding", "act_scale_dtype", "reciprocal", "zero_row", "qmin"),
    "w4a8": ("act_rounding", "act_scale_dtype", "reciprocal", "zero_row", "qmin"),
    "w4a16": ("gptq_sym_qzeros", "gptq_v1_zero", "weight_scale_dtype", "dequant", "accumulate"),
    "w4a16-mxfp4": ("accumulate",),
    "w4a4-mxfp4": ("mx_scale_rule", "e2m1_rounding", "mx_nan", "mx_zero_block"),
}


# -- probe cases ----------------------------------------------------------------------------------
def _candidate_cases(scheme: str, probe: str, act: str) -> list[Case]:
    """The probe cases of an axis, best first: the first one the backend can implement is used."""
    N, K = 64, 128
    if scheme == "w8a8":
        return [Case("w8a8", "ct-int-quantized", 1, N, K, group_size=-1, act_dtype=act, scale_dtype=sd)
                for sd in ("float32", "bfloat16")]
    if scheme == "w4a8":
        return [Case("w4a8", "gptq", 1, N, K, group_size=32, sym=True, zero_convention="v1", act_dtype=act),
                Case("w4a8", "ct-pack-quantized", 1, N, K, group_size=32, sym=True, act_dtype=act),
                Case("w4a8", "ct-pack-quantized", 1, N, K, group_size=-1, sym=True, act_dtype=act)]
    if scheme == "w4a4-mxfp4":
        return [Case("w4a4-mxfp4", "ct-mxfp4", 1, N, K, group_size=32, act_dtype=act)]
    if scheme == "w4a16-mxfp4":
        return [Case("w4a16-mxfp4", "ct-mxfp4", 1, N, K, group_size=32, act_dtype=act)]
    if scheme == "w4a16":
        if probe == "gptq-sym":
            return [Case("w4a16", "gptq", 4, N, K, group_size=32, sym=True, zero_convention="v1", act_dtype=act)]
        if probe == "gptq-v1":
            return [Case("w4a16", "gptq", 4, N, K, group_size=32, sym=False, zero_convention="v1", act_dtype=act)]
        if probe == "dequant":
            return [Case("w4a16", "ct-pack-quantized", 4, N, K, group_size=32, sym=False, act_dtype=act),
                    Case("w4a16", "gptq", 4, N, K, group_size=32, sym=False, zero_convention="v2", act_dtype=act),
                    Case("w4a16", "awq", 4, N, K, group_size=32, sym=False, act_dtype=act),
                    Case("w4a16", "gptq", 4, N, K, group_size=32, sym=True, zero_convention="v1", act_dtype=act),
                    Case("w4a16", "ct-pack-quantized", 4, N, K, group_size=32, sym=True, act_dtype=act)]
        return [Case("w4a16", "ct-pack-quantized", 1, N, K, group_size=32, sym=True, act_dtype=act),
                Case("w4a16", "gptq", 1, N, K, group_size=32, sym=True, zero_convention="v1", act_dtype=act),
                Case("w4a16", "awq", 1, N, K, group_size=32, sym=False, act_dtype=act)]
    raise ValueError(f"no probe cases for scheme {scheme!r}")


def _rows_options(probe: str) -> tuple:
    """Row counts tried for a probe (rows are independent: a kernel that takes only M = 1 gets one per probe)."""
    if probe in ("int8", "mx"):
        return (8, 1, 17)
    if probe == "accumulate":
        return (12, 1)
    return (4, 1)


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
        return {"weight": w, "weight_scale": _scales_array(ws, case.scale_dtype)}
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


def _with_rows(case: Case, M: int) -> Case:
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
    return CaseInputs(_with_rows(case, x.shape[0]), 0, t, x.astype(np.float32), None)


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
    return CaseInputs(_with_rows(case, 4), 0, t, _r(x, dt).astype(np.float32), None)


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


# -- hypotheses ------------------------------------------------------------------------------------
def _apply(base: Declared, overrides: dict) -> Declared:
    variants = dict(base.variants)
    fields = {}
    for k, v in overrides.items():
        if k in _FIELDS:
            fields[k] = v
        elif v is None:
            variants.pop(k, None)
        else:
            variants[k] = v
    return dataclasses.replace(base, variants=variants, **fields)


def _declared_value(axis: Axis, base: Declared) -> str | None:
    """The axis value the backend's own declaration names (None: not among the probed values)."""
    for name, ov in axis.values:
        ok = True
        for k, v in ov.items():
            have = getattr(base, k) if k in _FIELDS else base.variants.get(k)
            if k == "eps" and _norm("zero_row", base.variants.get("zero_row")) != "eps":
                continue
            if k == "e2m1_nan" and _norm("mx_nan_block", base.variants.get("mx_nan_block")) == "scale_nan":
                continue
            if _norm(k, have) != _norm(k, v):
                ok = False
                break
        if ok:
            return name
    return None


def _extra_declared_value(axis: Axis, base: Declared) -> tuple | None:
    """The declaration's own value of the axis as one more named value, when no probed value is it."""
    keys = sorted({k for _, ov in axis.values for k in ov})
    ov = {k: (getattr(base, k) if k in _FIELDS else base.variants.get(k)) for k in keys}
    if axis.name == "zero_row" and _norm("zero_row", ov.get("zero_row")) == "eps":
        return (f"eps={float(ov['eps']):.0e}", ov)
    label = "/".join(str(_norm(k, ov[k])) for k in keys)
    return (f"declared:{label}", ov)


@dataclasses.dataclass
class _Hyp:
    value: str
    declared: Declared
    combo: dict  # the nuisance values of this hypothesis, by axis


def _hypotheses(axis: Axis, base: Declared, fixed: dict, ranged: dict) -> tuple[list[_Hyp], list[tuple]]:
    """Joint hypotheses: axis values x ranged axes' values, on the base with fixed overrides applied."""
    values = list(axis.values)
    if _declared_value(axis, base) is None:
        extra = _extra_declared_value(axis, base)
        if extra is not None and extra[0] not in dict(values):
            values.append(extra)
    b = base
    for _, ov in fixed.values():
        b = _apply(b, ov)
    names = list(ranged)
    hyps = []
    for combo in itertools.product(*[ranged[n] for n in names]):
        d0 = b
        for ov in (c[1] for c in combo):
            d0 = _apply(d0, ov)
        for vname, ov in values:
            hyps.append(_Hyp(vname, _apply(d0, ov), {n: c[0] for n, c in zip(names, combo)}))
    return hyps, values


# -- separation search ---------------------------------------------------------------------------
def _intervals(inp: CaseInputs, hyps: list[_Hyp]):
    out = []
    for h in hyps:
        try:
            out.append(declared_interval(inp, h.declared))
        except Exception:  # a hypothesis the emulator cannot evaluate on this input separates nothing
            out.append(None)
    return out


def _separated(ivs) -> np.ndarray:
    """[H, H] boolean: hypotheses i and j have disjoint accepted sets on some output element."""
    H = len(ivs)
    sep = np.zeros((H, H), bool)
    ok = [iv for iv in ivs if iv is not None]
    if not ok:
        return sep
    shape = ok[0].y_exact.shape
    y = np.full((H,) + shape, np.nan)
    lo = np.full((H,) + shape, np.nan)
    hi = np.full((H,) + shape, np.nan)
    valid = np.zeros(H, bool)
    for i, iv in enumerate(ivs):
        if iv is not None and iv.y_exact.shape == shape:
            y[i], lo[i], hi[i], valid[i] = iv.y_exact, iv.lo, iv.hi, True
    fin = np.isfinite(y)
    for i in range(H):
        if not valid[i]:
            continue
        with np.errstate(invalid="ignore"):
            d = (hi[i] < lo) | (hi < lo[i])
            both = fin[i] & fin
            nan_same = (~fin[i] & ~fin) & ((np.isnan(y[i]) & np.isnan(y)) | (y[i] == y))
            s = np.where(both, d, np.where(fin[i] & fin, False, ~nan_same))
        sep[i] = s.reshape(H, -1).any(axis=1) & valid
    return sep


def _search(hyps: list[_Hyp], trial, max_trials: int, patience: int = 24, min_trials: int = 8):
    """Keep candidate inputs while they separate new pairs of hypotheses with different values.

    Stops when every pair is separated, after ``patience`` candidates without progress, or -- after
    ``min_trials`` candidates -- when every pair left has had identical references on every candidate
    (values that coincide by construction, e.g. a zero block's scale).
    """
    H = len(hyps)
    need = np.array([[hyps[i].value != hyps[j].value for j in range(H)] for i in range(H)])
    need &= np.triu(np.ones((H, H), bool), 1)
    differs = np.zeros((H, H), bool)
    kept, stale = [], 0
    for t in range(max_trials):
        if not need.any() or stale >= patience or (t >= min_trials and not (need & differs).any()):
            break
        inp = trial(t)
        ivs = _intervals(inp, hyps)
        sep = _separated(ivs)
        sep = sep | sep.T
        differs |= _differ(ivs)
        new = need & sep
        if new.any():
            kept.append(inp)
            need &= ~new
            stale = 0
        else:
            stale += 1
    return kept, need


def _differ(ivs) -> np.ndarray:
    """[H, H]: the two hypotheses' references or intervals differ somewhere (NaN equal to NaN)."""
    H = len(ivs)
    out = np.ones((H, H), bool)
    ok = [iv for iv in ivs if iv is not None]
    if not ok:
        return out
    shape = ok[0].y_exact.shape
    valid = np.array([iv is not None and iv.y_exact.shape == shape for iv in ivs])
    st = np.full((H, 3) + shape, np.nan)
    for i, iv in enumerate(ivs):
        if valid[i]:
            st[i] = (iv.y_exact, iv.lo, iv.hi)
    flat = st.reshape(H, -1)
    for i in np.nonzero(valid)[0]:
        same = ((flat == flat[i]) | (np.isnan(flat) & np.isnan(flat[i]))).all(axis=1) & valid
        out[i] = ~same
    return out


# -- running probes -------------------------------------------------------------------------------
class _Prober:
    """Plans and runs probe inputs on one backend in a worker subprocess."""

    def __init__(self, backend: str, out_dir: Path, timeout: float, worker_env: dict | None = None):
        self.backend = backend
        self.out_dir = out_dir
        self.timeout = timeout
        self.worker = WorkerProcess(backend, env=worker_env)
        self._plans: dict = {}
        self.label = backend
        self.hello: dict = {}

    def start(self) -> dict:
        self.hello = self.worker.request({"op": "hello"}, timeout=self.timeout)
        self.label = self.hello.get("label", self.backend)
        return self.hello

    def plan(self, case: Case) -> dict:
        key = json.dumps(case.to_json(), sort_keys=True)
        if key not in self._plans:
            spec = CaseSpec(case, "probe", "fingerprint", 0)
            self._plans[key] = self.worker.request({"op": "plan", "spec": spec.to_json()}, timeout=self.timeout)
        return self._plans[key]

    def run(self, inp: CaseInputs, pid: str, reason: str) -> tuple[np.ndarray | None, str, str]:
        """(y or None, bundle path, error text)."""
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in pid)
        path = self.out_dir / "probes" / f"{safe}.safetensors"
        spec = CaseSpec(inp.case, "probe", "fingerprint-" + pid.split("/")[1], 0)
        save_bundle(path, inp, spec=spec.to_json(), backend=self.label, declared=None, verdict="probe",
                    reason=reason)
        ypath = self.out_dir / "probes" / f"{safe}.y.safetensors"
        if ypath.exists():
            ypath.unlink()
        r = self.worker.request({"op": "run", "bundle": str(path.resolve()), "out": str(ypath.resolve())},
                                timeout=self.timeout)
        if not r.get("ok"):
            return None, str(path), f"{r.get('kind')}: {r.get('error', '')}"[:500]
        from emulator.tensorfile import load_tensors

        return load_tensors(ypath)["y"].data, str(path), ""

    def close(self) -> None:
        self.worker.close()


def _pick_case(prober: _Prober, scheme: str, axis: Axis, act: str):
    """(case with the row count to use, declared, reasons) for the first candidate the backend implements."""
    reasons = []
    for cand in _candidate_cases(scheme, axis.probe, act):
        for M in _rows_options(axis.probe):
            case = _with_rows(cand, M)
            p = prober.plan(case)
            if not p.get("ok"):
                reasons.append(f"{case.describe()}: plan failed: {p.get('kind')}: {p.get('error', '')[:200]}")
                return None, None, reasons
            if p.get("supported"):
                return case, Declared(**p["declared"]), reasons
            reasons.append(f"{case.describe()}: {p.get('reason', '')}")
    return None, None, reasons


def _trial_fn(axis: Axis, case: Case, seed: int):
    rng = np.random.default_rng(seed)
    modes = axis.modes or ("random",)

    def trial(t: int) -> CaseInputs:
        mode = modes[t % len(modes)]
        if axis.probe == "int8":
            x = np.stack([_int8_row(rng, case, mode) for _ in range(case.M)])
            return CaseInputs(case, 0, _diag_int_tensors(case, anchor=True), _r(x, case.act_dtype).astype(np.float32),
                              None)
        if axis.probe == "mx":
            x = np.stack([_mx_row(rng, case, mode) for _ in range(case.M)])
            return CaseInputs(case, 0, _diag_int_tensors(case), x.astype(np.float32), None)
        if axis.probe in ("gptq-sym", "gptq-v1"):
            return _gptq_zero_inputs(rng, case, axis.probe)
        if axis.probe == "dequant":
            return _dequant_inputs(rng, case, mode)
        raise ValueError(axis.probe)

    return trial


def _accumulate_probes(case: Case) -> list[CaseInputs]:
    rows = _accumulate_rows(case)
    t = _accumulate_tensors(case)
    out = []
    for i in range(0, rows.shape[0], case.M):
        chunk = rows[i:i + case.M]
        if chunk.shape[0] < case.M:
            chunk = np.concatenate([chunk, rows[:case.M - chunk.shape[0]]])
        out.append(CaseInputs(case, 0, t, chunk.astype(np.float32), None))
    return out


_PREC_ORDER = ("float64", "float32", "float16", "bfloat16")


def _values_for_case(axis: Axis, case: Case) -> Axis:
    """Drop values that coincide by construction on this case (so they are not reported as unseparated)."""
    vals = axis.values
    if axis.name == "dequant" and (case.sym or case.weight_format == "ct-mxfp4"):
        vals = tuple(v for v in vals if not v[0].endswith("/float_zero"))
    if axis.name == "weight_scale_dtype":
        vals = tuple(v for v in vals if v[0] != case.scale_dtype)
    return dataclasses.replace(axis, values=vals)


def _run_axis(prober: _Prober, scheme: str, axis: Axis, act: str, found: dict, *, max_trials: int, seed: int) -> dict:
    res: dict = {"axis": axis.name, "title": axis.title, "status": "ok"}
    case, base, reasons = _pick_case(prober, scheme, axis, act)
    if case is None:
        res.update(status="unsupported", reason="; ".join(reasons[-3:]) or "no probe case")
        return res
    res["case"] = case.describe()
    if base.variants.get("weight_scale_dtype") == case.scale_dtype:  # reading scales in their own dtype
        base = dataclasses.replace(base, variants={k: v for k, v in base.variants.items() if k != "weight_scale_dtype"})
    res["declared_arithmetic"] = base.to_json()
    axis = _values_for_case(axis, case)
    # conditioning: earlier axes fixed where their probes were decisive, ranged over where ambiguous
    fixed, ranged = {}, {}
    for dep in axis.depends:
        f = found.get(dep)
        if not f or not f.get("consistent"):
            continue
        ovs = dict(f["value_overrides"])
        if len(f["consistent"]) == 1:
            fixed[dep] = (f["consistent"][0], ovs[f["consistent"][0]])
        else:
            ranged[dep] = [(v, ovs[v]) for v in f["consistent"]]
    for nu in axis.nuisance:
        if nu not in ranged and nu not in fixed:
            ranged[nu] = list(_values_for_case(AXES[nu], case).values)
    res["fixed"] = {k: v[0] for k, v in fixed.items()}
    res["ranged"] = {k: [v[0] for v in vs] for k, vs in ranged.items()}
    hyps, values = _hypotheses(axis, base, fixed, ranged)
    res["values"] = [v for v, _ in values]
    res["value_overrides"] = [(v, ov) for v, ov in values]
    dv = _declared_value(axis, base)
    if dv is None and len(values) > len(axis.values):
        dv = values[-1][0]
    res["declared"] = dv
    # hypotheses the emulator cannot evaluate under this declaration (e.g. a variant that the declared
    # scheme fixes) are not candidates: report them apart, never as excluded by a probe
    first = _accumulate_probes(case)[0] if axis.probe == "accumulate" else _trial_fn(axis, case, seed)(0)
    errors = {}
    for h in hyps:
        try:
            declared_interval(first, h.declared)
        except Exception as e:  # noqa: BLE001 - the emulator's own message is the reason
            errors.setdefault(h.value, f"{type(e).__name__}: {e}")
    bad = {v for v in errors if all(hp.value != v or hp.value in errors for hp in hyps)}
    valid_values = [v for v in res["values"] if v not in bad]
    if bad:
        res["inapplicable"] = {v: errors[v][:300] for v in sorted(bad)}
    if len(valid_values) < 2 and axis.probe != "accumulate":
        res.update(status="not-applicable", consistent=valid_values, excluded={}, unseparated=[],
                   reason="the declared arithmetic leaves this axis no choice: " +
                          (next(iter(errors.values()))[:300] if errors else "one value"))
        return res
    hyps = [h for h in hyps if h.value not in bad]
    res["values"] = valid_values
    # probes
    if axis.probe == "accumulate":
        probes, need = _accumulate_probes(case), np.zeros((len(hyps), len(hyps)), bool)
    else:
        few_rows = axis.probe in ("int8", "mx") and case.M < 8  # fewer candidates per input: try more inputs
        probes, need = _search(hyps, _trial_fn(axis, case, seed), max_trials * (4 if few_rows else 1),
                               patience=96 if few_rows else 24,
                               min_trials=(48 if few_rows else 16) if axis.probe == "int8" else 8)
    if not probes:
        res.update(status="not-observable", reason="no probe input separates any two values" +
                   (f" ({axis.note})" if axis.note else ""), consistent=list(res["values"]), excluded={},
                   unseparated=[])
        return res
    # run and judge
    inside = np.ones(len(hyps), bool)
    excluded_by: dict[int, str] = {}
    res["probes"] = []
    for i, inp in enumerate(probes):
        pid = f"{scheme}/{axis.name}/p{i + 1}"
        y, bundle, err = prober.run(inp, pid, f"fingerprint probe {pid}")
        res["probes"].append({"id": pid, "bundle": bundle, "M": inp.case.M, "error": err or None})
        if y is None:
            res.update(status="crash", reason=f"probe {pid}: {err}")
            return res
        for h, iv in enumerate(_intervals(inp, hyps)):
            if not inside[h]:
                continue
            ok = iv is not None and compare(y, iv).ok
            if not ok:
                inside[h] = False
                excluded_by[h] = pid
    consistent = []
    excluded: dict[str, list] = {}
    for v in res["values"]:
        idx = [h for h, hp in enumerate(hyps) if hp.value == v]
        if any(inside[h] for h in idx):
            consistent.append(v)
        else:
            excluded[v] = sorted({excluded_by[h] for h in idx if h in excluded_by})
    res["consistent"] = consistent
    res["excluded"] = excluded
    # pairs of consistent values that no probe input found could separate (ambiguity of the method,
    # as opposed to values the kernel's output cannot tell apart because of other axes' ambiguity)
    res["unseparated"] = sorted({tuple(sorted((hyps[i].value, hyps[j].value)))
                                 for i, j in zip(*np.nonzero(need)) if inside[i] and inside[j]})
    if axis.name == "accumulate":
        res["bracket"] = _bracket(consistent, excluded)
    dv = res["declared"]
    if dv is not None and dv in excluded:
        res["contradiction"] = (f"declares {axis.name}={dv}, excluded by probe {', '.join(excluded[dv])}; "
                                f"consistent: {', '.join(consistent) or 'none'}")
    elif dv is not None and not consistent:
        res["contradiction"] = f"no probed value (declared {dv} included) explains the output"
    if not consistent:
        res["note"] = ("no value is consistent: the output also differs from the declaration on another axis "
                       "(or in arithmetic the emulator does not model)")
    return res


def _bracket(consistent: list, excluded: dict) -> str:
    cons = [p for p in _PREC_ORDER if p in consistent]
    exc = [p for p in _PREC_ORDER if p in excluded]
    if not cons:
        return "no accumulation precision explains the output"
    if cons[0] == "float64":
        return "no accumulation error observed (consistent with float64)"
    finer = [p for p in exc if _PREC_ORDER.index(p) < _PREC_ORDER.index(cons[0])]
    return f"coarser than {finer[-1] if finer else '?'}, within the {cons[0]} bound"


def _unmodelled_keys(declared: dict | None) -> list[str]:
    if not declared:
        return []
    return sorted(k for k in declared.get("variants", {}) if k not in _known_keys())


def _known_keys() -> set:
    """Every key of the variant vocabulary (emulator/variants.py): the acceptance code models each one."""
    return set(VOCABULARY)


def fingerprint(backend: str, *, schemes=None, axes=None, act_dtype: str = "bfloat16", out_dir=None,
                timeout: float = 120.0, max_trials: int = 60, seed: int = 0, worker_env: dict | None = None,
                log=None) -> dict:
    """Fingerprint ``backend`` (a spec 'name[:k=v,...]'); the result as a JSON-able dict."""
    for s in schemes or ():
        if s not in SCHEME_AXES:
            raise ValueError(f"fingerprint: no probes for scheme {s!r}; known: {', '.join(SCHEME_AXES)}")
    for a in axes or ():
        if a not in AXES:
            raise ValueError(f"fingerprint: unknown axis {a!r}; known: {', '.join(AXES)}")
    from backends.registry import create

    create(backend)  # an unknown name or parameter is the caller's error (one line, exit 2), not a worker crash
    tmp = None
    if out_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="qconform-fp-")
        out = Path(tmp.name)
    else:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
    prober = _Prober(backend, out, timeout, worker_env)
    t0 = time.perf_counter()
    result = {"backend": backend, "act_dtype": act_dtype, "schemes": {}, "contradictions": []}
    try:
        hello = prober.start()
        result.update(label=prober.label, available=bool(hello.get("available")), version=hello.get("version"),
                      device=hello.get("device"), reason=hello.get("reason") or hello.get("error"))
        if not hello.get("ok") or not hello.get("available"):
            result["status"] = "unavailable"
            return result
        for scheme in (schemes or list(SCHEME_AXES)):
            found: dict = {}
            srec = {"axes": [], "unmodelled_keys": []}
            for name in SCHEME_AXES[scheme]:
                if axes and name not in axes:
                    continue
                ax = AXES[name]
                t1 = time.perf_counter()
                rec = _run_axis(prober, scheme, ax, act_dtype, found, max_trials=max_trials,
                                seed=seed + sum(map(ord, scheme + name)))
                rec["seconds"] = round(time.perf_counter() - t1, 2)
                if rec["status"] == "ok":
                    found[name] = rec
                for k in _unmodelled_keys(rec.get("declared_arithmetic")):
                    if k not in srec["unmodelled_keys"]:
                        srec["unmodelled_keys"].append(k)
                if rec.get("contradiction"):
                    result["contradictions"].append(f"{scheme} {name}: {rec['contradiction']}")
                srec["axes"].append(rec)
                if log:
                    log(_axis_line(scheme, rec))
            if srec["axes"] and all(a["status"] == "unsupported" for a in srec["axes"]):
                srec["status"] = "unsupported"
            result["schemes"][scheme] = srec
        result["status"] = "ok"
        return result
    finally:
        prober.close()
        result["seconds"] = round(time.perf_counter() - t0, 2)
        if tmp is not None:
            tmp.cleanup()


# -- output ---------------------------------------------------------------------------------------
def _axis_line(scheme: str, a: dict) -> str:
    head = f"  {scheme:12s} {a['axis']:20s}"
    if a["status"] == "unsupported":
        return f"{head} unsupported: {a.get('reason', '')[:160]}"
    if a["status"] == "not-applicable":
        return f"{head} not applicable: {a.get('reason', '')[:200]}"
    if a["status"] in ("crash", "error"):
        return f"{head} {a['status']}: {a.get('reason', '')[:200]}"
    cons = ", ".join(a.get("consistent", [])) or "NONE"
    if a["axis"] == "accumulate" and a.get("bracket"):
        cons = f"{a['bracket']} (consistent: {cons})"
    exc = "; ".join(f"{v} [{', '.join(p) or '-'}]" for v, p in a.get("excluded", {}).items())
    line = f"{head} consistent: {cons}"
    if exc:
        line += f" | excluded: {exc}"
    if a["status"] == "not-observable":
        line += " | not observable"
    if a.get("unseparated"):
        line += " | not separated: " + ", ".join("/".join(p) for p in a["unseparated"][:4])
    line += f" | declared: {a.get('declared') or '-'}"
    if a.get("contradiction"):
        line += f"  ** CONTRADICTS DECLARATION: {a['contradiction']}"
    return line


def format_text(result: dict) -> str:
    lines = [f"fingerprint of {result.get('label', result['backend'])} "
             f"({result.get('version') or '-'}, {result.get('device') or '-'}), activations {result['act_dtype']}"]
    if result.get("status") == "unavailable":
        lines.append(f"  unavailable: {result.get('reason')}")
        return "\n".join(lines)
    for scheme, s in result["schemes"].items():
        for a in s["axes"]:
            lines.append(_axis_line(scheme, a))
        if s.get("unmodelled_keys"):
            lines.append(f"  {scheme:12s} declared keys the emulator does not model: {', '.join(s['unmodelled_keys'])}")
    if result["contradictions"]:
        lines.append(f"{len(result['contradictions'])} contradiction(s) with the declared arithmetic:")
        lines += [f"  - {c}" for c in result["contradictions"]]
    else:
        lines.append("no contradiction with the declared arithmetic")
    return "\n".join(lines)


def _cmd_fingerprint(args) -> int:
    res = fingerprint(args.backend, schemes=args.scheme, axes=args.axis, act_dtype=args.act_dtype,
                      out_dir=args.out, timeout=args.timeout, max_trials=args.max_trials, seed=args.seed,
                      log=(lambda s: print(s, file=sys.stderr)) if args.verbose else None)
    print(format_text(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
        print(f"fingerprint JSON -> {args.json}")
    if res.get("status") == "unavailable":
        return 2
    return 1 if res["contradictions"] else 0


def register(sub) -> None:
    s = sub.add_parser("fingerprint", help="which named variants a backend's outputs are consistent with "
                                           "(discriminating probes)")
    s.add_argument("--backend", required=True, help="backend spec name[:key=value,...]")
    s.add_argument("--scheme", action="append", help=f"restrict to a scheme ({', '.join(SCHEME_AXES)}); repeatable")
    s.add_argument("--axis", action="append", help="restrict to an axis; repeatable")
    s.add_argument("--act-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    s.add_argument("--json", help="write the fingerprint as JSON to this file")
    s.add_argument("--out", help="keep the probe bundles (and outputs) under DIR/probes")
    s.add_argument("--timeout", type=float, default=120.0, help="seconds per probe before the worker is killed")
    s.add_argument("--max-trials", type=int, default=60, help="candidate inputs tried per axis")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("-v", "--verbose", action="store_true", help="print each axis as it is decided")
    s.set_defaults(fn=_cmd_fingerprint)


# -- tables (docs/fingerprints.md) -------------------------------------------------------------------
def _cell(a: dict | None) -> str:
    if a is None:
        return ""
    st = a.get("status")
    if st == "unsupported":
        return "-"
    if st == "not-applicable":
        return "n/a"
    if st in ("crash", "error"):
        return st
    cons = a.get("consistent") or []
    if a["axis"] == "accumulate" and a.get("bracket"):
        b = a["bracket"]
        text = ("<= float64" if b.startswith("no accumulation error") else
                b.replace("coarser than ", "> ").replace(", within the ", ", <= ").replace(" bound", ""))
    elif st == "not-observable":
        text = "not observable"
    else:
        text = " / ".join(cons) if cons else "NONE"
    if a.get("contradiction"):
        text += f" **(declared {a.get('declared')})**"
    return text


def markdown_tables(results: list[dict], names: list[str] | None = None) -> str:
    """One markdown table per scheme: a row per fingerprint, a column per axis (consistent values)."""
    names = names or [r.get("label", r["backend"]) for r in results]
    out = []
    for scheme, axes in SCHEME_AXES.items():
        rows = []
        for name, r in zip(names, results):
            got = {a["axis"]: a for a in r.get("schemes", {}).get(scheme, {}).get("axes", [])}
            if not got or all(a.get("status") == "unsupported" for a in got.values()):
                continue
            rows.append(f"| {name} | " + " | ".join(_cell(got.get(ax)) for ax in axes) + " |")
        if not rows:
            continue
        out.append(f"**{scheme}**\n")
        out.append("| backend | " + " | ".join(axes) + " |")
        out.append("| --- | " + " | ".join("---" for _ in axes) + " |")
        out += rows
        out.append("")
    return "\n".join(out)
