"""Named variants of public reference quantizers (issue 13, part 3): hand-derived values, and the edge
generators ``reference-int8`` / ``reference-mx`` separating every named value from canonical.

What each variant does is derived here by hand from its definition (docs/formats/activations.md#reference-
implementations, docs/formats/mxfp4.md#reference-implementations); the libraries themselves are the oracles of
tests/emulator/test_reference_libraries.py.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from backends.base import Case
from conformance.cases.generators import generate
from emulator.activations.int8 import Int8ActVariant, quantize_int8_per_token
from emulator.declaration import Declared, int8_variant, mx_variant
from emulator.formats.mxfp4 import MxVariant, quantize_mxfp4
from emulator.numerics.e8m0 import mx_scale_byte

F = np.float32


def test_half_range_divisor_gives_scale_amax_over_127_5():
    x = np.array([[127.5, 1.0, -0.5]], F)
    a = quantize_int8_per_token(x, Int8ActVariant(sym_divisor="half_range"))
    assert a.scale.tolist() == [[1.0]]  # 127.5 / 127.5
    assert a.q.tolist() == [[127, 1, 0]]  # 127.5 saturates, -0.5 is a tie to even (0)
    c = quantize_int8_per_token(x)
    assert c.scale[0, 0] == F(127.5) / F(127) and c.q.tolist() == [[127, 1, 0]]


def test_dtype_eps_replaces_a_zero_scale_by_the_arithmetic_dtypes_epsilon():
    x = np.zeros((1, 4), F)
    for dtype, eps in (("float32", 2.0**-23), ("bfloat16", 2.0**-7), ("float16", 2.0**-10)):
        for sym in (True, False):
            a = quantize_int8_per_token(x, Int8ActVariant(symmetric=sym, zero_row="dtype_eps", arith_dtype=dtype))
            assert a.scale.tolist() == [[eps]] and a.q.tolist() == [[0, 0, 0, 0]] and a.zero_point.tolist() == [[0]]
    assert quantize_int8_per_token(x).scale.tolist() == [[0.0]]


def test_input_arith_dtype_follows_the_array():
    x = np.array([[1.0, 0.3]], ml_dtypes.bfloat16)  # 0.3 -> 0.30078125 in bf16
    a = quantize_int8_per_token(x, Int8ActVariant(arith_dtype="input"))
    b = quantize_int8_per_token(x.astype(F), Int8ActVariant(arith_dtype="bfloat16"))
    assert np.array_equal(a.scale, b.scale) and np.array_equal(a.q, b.q)
    # bf16 scale: 1/127 = 0.0078740... rounds to 0.00787353515625 (8 significant bits)
    assert a.scale.tolist() == [[0.00787353515625]]
    assert quantize_int8_per_token(x).scale[0, 0] == F(1) / F(127)


def test_zero_inclusive_range_and_clamped_zero_point():
    x = np.array([[1.0, 2.0, 3.0, 4.0]], F)  # all positive: the range becomes [0, 4]
    v = Int8ActVariant(symmetric=False, range_rule="zero_inclusive", azp_clamp=True)
    a = quantize_int8_per_token(x, v)
    assert a.scale[0, 0] == F(4) / F(255) and a.zero_point.tolist() == [[-128]]
    c = quantize_int8_per_token(x, Int8ActVariant(symmetric=False))  # canonical: range [1, 4]
    assert c.scale[0, 0] == F(3) / F(255) and c.zero_point[0, 0] < -128  # -128 - 85: an int32 zero point


def test_unit_range_gives_scale_one_over_255_on_a_constant_row():
    x = np.zeros((1, 3), F)
    a = quantize_int8_per_token(x, Int8ActVariant(symmetric=False, range_rule="zero_inclusive", zero_row="unit_range",
                                                  azp_clamp=True, azp_domain="uint8", uint8_zp128=True))
    assert a.scale[0, 0] == F(1) / F(255) and a.zero_point.tolist() == [[-128]] and a.q.tolist() == [[-128] * 3]
    assert a.stored(Int8ActVariant(uint8_zp128=True)).tolist() == [[0, 0, 0]]


def test_uint8_zero_point_domain_differs_where_subtracting_128_rounds():
    """int8 domain: azp = round(fl32(-128 - m)); uint8 domain: zp = round(-m), azp = zp - 128 (m = fl32(min / s),
    round = Python's round-half-even). They part where fl32(-128 - m) rounds onto or off a tie."""
    rng = np.random.default_rng(3)
    # min / scale near -(k + 0.5): rows [min, max] with max chosen so that 255 * |min| / (max - min) ~ k + 0.5
    k = rng.integers(0, 120, 4000)
    t = (k + 0.5 + rng.integers(-40, 41, 4000) * 2.0**-21) / 255.0
    xmin = -(F(1) * t).astype(F)
    x = np.stack([xmin, (F(1) + xmin).astype(F)], axis=1)  # max = 1 + min > 0 (|min| < 0.5): span ~ 1
    base = dict(symmetric=False, range_rule="zero_inclusive", azp_clamp=True)
    i8 = quantize_int8_per_token(x, Int8ActVariant(**base))
    u8 = quantize_int8_per_token(x, Int8ActVariant(**base, azp_domain="uint8"))
    differ = 0
    for r in range(len(x)):
        s_ = F(i8.scale[r, 0])
        m = F(F(min(x[r].min(), 0)) / s_)
        want_i8 = round(float(min(max(float(F(F(-128) - m)), -128.0), 127.0)))
        want_u8 = round(float(min(max(-float(m), 0.0), 255.0))) - 128
        assert (i8.zero_point[r, 0], u8.zero_point[r, 0]) == (want_i8, want_u8), r
        differ += want_i8 != want_u8
    assert differ > 0  # the two domains really part on these rows


def test_full_int32_saturation_and_int_min_zero_point_on_a_one_ulp_row():
    # fp32 row [-2, -2 + 2**-23]: scale = 2**-23 / 255, -min / scale = 255 * 2**24 overflows int32
    x = np.array([[-2.0, -2.0 + 2.0**-23]], F)
    canon = quantize_int8_per_token(x, Int8ActVariant(symmetric=False))
    assert canon.zero_point.tolist() == [[2**31 - 1]] and canon.q.tolist() == [[0, 0]]  # -(2**31 - 1) + (2**31 - 1)
    full = quantize_int8_per_token(x, Int8ActVariant(symmetric=False, int32_saturation="full"))
    assert full.zero_point.tolist() == [[2**31 - 1]] and full.q.tolist() == [[-1, -1]]  # -2**31 + (2**31 - 1)
    x86 = quantize_int8_per_token(x, Int8ActVariant(symmetric=False, azp_overflow="int_min"))
    assert x86.zero_point.tolist() == [[-(2**31)]]


def _block(*vals):
    b = np.zeros((1, 32), F)
    b[0, :len(vals)] = vals
    return b


def test_byte0_divisor():
    x = _block(2.0**-125, -(2.0**-127))  # FLOOR: floor(log2 2**-125) - 2 = -127 -> byte 0
    codes = {d: quantize_mxfp4(x, MxVariant(byte0_divisor=d)) for d in ("byte", "min_normal", "one")}
    assert all(s.tolist() == [[0]] for _, s in codes.values())
    assert codes["byte"][0][0, :2].tolist() == [6, 10]  # 4, -1
    assert codes["min_normal"][0][0, :2].tolist() == [4, 9]  # 2, -0.5
    assert codes["one"][0][0, :2].tolist() == [0, 8]  # +0, -0
    y = _block(1.0, -2.0)  # byte 125: unaffected
    assert all(np.array_equal(quantize_mxfp4(y, MxVariant(byte0_divisor=d))[0], quantize_mxfp4(y)[0])
               for d in ("min_normal", "one"))


def test_rceil_log2f_under_rounds_just_above_a_power_of_two():
    amax = F(6144.0 * (1 + 2.0**-22))  # amax / 6 = 2**10 * (1 + 2**-22) exactly
    assert F(amax / F(6)) == F(1024.0 * (1 + 2.0**-22))
    # exact: ceil(log2) = 11 -> byte 138; fp32 log2 = 10 + 3.4e-7 rounds to 10 (half an ulp of 10 is 4.8e-7)
    assert mx_scale_byte(np.array([amax], F), "rceil").tolist() == [138]
    assert mx_scale_byte(np.array([amax], F), "rceil_log2f").tolist() == [137]
    # powers of two and values away from them agree
    a = np.array([6.0, 12.0, 1.0, 7.0, 3e-30], F)
    assert np.array_equal(mx_scale_byte(a, "rceil"), mx_scale_byte(a, "rceil_log2f"))


@pytest.mark.parametrize("amax,canonical", [(3.4e38, 253), (F(1.75 * 2.0**127), 253), (F(1.7499999 * 2.0**127), 252)])
def test_scale_overflow_nan_at_the_top_of_the_exponent_range(amax, canonical):
    x = _block(amax, 1.0)
    c, s = quantize_mxfp4(x, MxVariant(scale_rule="even"))
    assert s.tolist() == [[canonical]]
    c2, s2 = quantize_mxfp4(x, MxVariant(scale_rule="even", scale_overflow="nan"))
    if amax >= 1.75 * 2.0**127:
        assert s2.tolist() == [[0xFF]] and not c2.any()
    else:
        assert s2.tolist() == s.tolist() and np.array_equal(c2, c)


# -- the edge generators separate every named value from canonical ------------------------------------------
_ASYM = {"act_symmetric": False}
INT8_SEPARATED = [
    ({"act_sym_divisor": "half_range"}, {}), ({"act_arith_dtype": "input"}, {}), ({"zero_row": "dtype_eps"}, {}),
    ({"zero_row": "unit_range"}, {}), ({"act_range": "zero_inclusive"}, _ASYM), ({"azp_clamp": True}, _ASYM),
    ({"azp_domain": "uint8"}, dict(_ASYM, act_range="zero_inclusive", azp_clamp=True)),
    ({"int32_saturation": "full"}, _ASYM), ({"azp_overflow": "int_min"}, _ASYM),
    ({"azp_fused": True}, dict(_ASYM, azp_before_rounding=True, reciprocal="recip_scale")),
]


def _int8_result(variants: dict, case: Case, x):
    a = quantize_int8_per_token(x, int8_variant(Declared(variants=variants), case))
    return a.q, a.scale, a.zero_point


@pytest.mark.parametrize("named,base", INT8_SEPARATED, ids=[",".join(f"{k}={v}" for k, v in n.items())
                                                             for n, _ in INT8_SEPARATED])
def test_reference_int8_generator_separates_each_named_value(named, base):
    """On the reference-int8 rows, the named value changes codes, scales or zero points (against the same
    declaration without it), for an fp32 or a bf16 case; act_arith_dtype=input needs a 16-bit case."""
    separated = []
    for dtype in ("float32", "bfloat16"):
        case = Case("w8a8", "ct-int-quantized", 8, 32, 64, group_size=-1, act_dtype=dtype, sym=True)
        x = np.asarray(generate(case, "reference-int8", 0).x, F)
        with_v = _int8_result({**base, **named}, case, x)
        without = _int8_result(base, case, x)
        separated.append(not all(np.array_equal(a, b) for a, b in zip(with_v, without)))
    assert any(separated), named


MX_SEPARATED = [({"mx_byte0_divisor": "min_normal"}, {}), ({"mx_byte0_divisor": "one"}, {}),
                ({"mx_scale_rule": "rceil_log2f"}, {"mx_scale_rule": "rceil"}),
                ({"mx_scale_overflow": "nan"}, {"mx_scale_rule": "even"})]


@pytest.mark.parametrize("named,base", MX_SEPARATED, ids=[",".join(f"{k}={v}" for k, v in n.items())
                                                         for n, _ in MX_SEPARATED])
def test_reference_mx_generator_separates_each_named_value(named, base):
    dtypes = ("float32",) if "mx_scale_rule" in named else ("float32", "bfloat16")  # rceil_log2f: fp32 amax only
    for dtype in dtypes:
        x = np.asarray(generate(Case("w4a4-mxfp4", "ct-mxfp4", 6, 32, 128, group_size=32, act_dtype=dtype),
                                "reference-mx", 0).x, F)
        c1, s1 = quantize_mxfp4(x, mx_variant(Declared(variants={**base, **named})))
        c0, s0 = quantize_mxfp4(x, mx_variant(Declared(variants=base)))
        assert not (np.array_equal(c1, c0) and np.array_equal(s1, s0)), (named, dtype)


def test_input_arith_dtype_resolves_to_the_case_dtype():
    d = Declared(variants={"act_arith_dtype": "input"})
    assert int8_variant(d, Case("w8a8", "ct-int-quantized", 2, 32, 64, group_size=-1, act_dtype="float16")
                        ).arith_dtype == "float16"
    assert int8_variant(d).arith_dtype == "input"  # no case: the quantizer reads the dtype of x
    from emulator.declaration import moe_variant

    moe = Case("w4a16-moe", "gptq", 3, 32, 64, group_size=32, act_dtype="bfloat16", E=4, top_k=2)
    d = Declared(variants={"act_arith_dtype": "input", "moe_act_quant": "int8"})
    assert moe_variant(d, moe).act_quant.arith_dtype == "bfloat16"


def test_levels_of_the_reference_declarations():
    from emulator.reference_quantizers import reference_variants
    from emulator.variants import Level

    asym = Case("w8a8", "ct-int-quantized", 2, 32, 64, group_size=-1, act_dtype="bfloat16", sym=False)
    sym = Case("w8a8", "ct-int-quantized", 2, 32, 64, group_size=-1, act_dtype="bfloat16", sym=True)
    fp32_sym = Case("w8a8", "ct-int-quantized", 2, 32, 64, group_size=-1, act_dtype="float32", sym=True)
    # a clamped zero point moves every code of an all-positive row unless 0 is in the range
    assert Declared(variants={"azp_clamp": True}).level(asym) is Level.SEMANTIC
    assert Declared(variants={"azp_clamp": True, "act_range": "zero_inclusive"}).level(asym) is Level.ROUNDING
    assert Declared(variants={"azp_clamp": True, "azp_overflow": "int_min"}).level(sym) is Level.CANONICAL
    assert Declared(variants={"act_arith_dtype": "input"}).level(fp32_sym) is Level.CANONICAL
    assert Declared(variants={"act_arith_dtype": "input"}).level(sym) is Level.ROUNDING
    assert Declared(variants={"azp_fused": True}).level(asym) is Level.CANONICAL  # nothing to fuse
    lv = {n: Declared(variants=reference_variants(n)).level(asym) for n in
          ("compressed-tensors-int8-asym", "onnx-dynamicquantizelinear", "vllm-cuda-int8-azp", "vllm-cpu-int8-azp")}
    assert lv == {"compressed-tensors-int8-asym": Level.ROUNDING, "onnx-dynamicquantizelinear": Level.SEMANTIC,
                  "vllm-cuda-int8-azp": Level.ROUNDING, "vllm-cpu-int8-azp": Level.SEMANTIC}
    assert Declared(variants=reference_variants("compressed-tensors-int8-sym")).level(sym) is Level.ROUNDING
    mx = Case("w4a4-mxfp4", "ct-mxfp4", 2, 32, 64, group_size=32, act_dtype="bfloat16")
    assert Declared(variants=reference_variants("torchao-mx-even")).level(mx) is Level.SEMANTIC  # byte-0 blocks
    assert Declared(variants={"mx_scale_rule": "rceil_log2f"}).level(mx) is Level.ROUNDING


def test_cli_linear_resolves_input_arith_dtype_to_the_activation_dtype(tmp_path, capsys):
    """``qconform linear --variant act_arith_dtype=input`` on bf16 activations computes in bf16 (x is carried as
    float32 inside the CLI: the variant must not silently fall back to fp32 arithmetic)."""
    torch = pytest.importorskip("torch")
    import qc_ckpt_cases as cases
    import safetensors.torch as stt

    from conformance.cli.main import main

    folder = tmp_path / "ckpt"
    cases.write(folder, "ct-w8a8-int8", bias=True)
    rng = np.random.default_rng(0)
    x = torch.from_numpy((rng.standard_normal((3, cases.K)) * 3).astype(F)).to(torch.bfloat16)
    stt.save_file({"x": x}, str(tmp_path / "x.safetensors"))
    accs = {}
    for v in ("input", "bfloat16", "float32"):
        out = tmp_path / f"{v}.safetensors"
        rc = main(["linear", str(folder), "--layer", cases.LAYER, "-i", str(tmp_path / "x.safetensors"), "-o",
                   str(out), "--act", "int8", "--variant", f"act_arith_dtype={v}"])
        assert rc == 0, capsys.readouterr().err
        accs[v] = stt.load_file(str(out))["acc"].numpy()
    assert np.array_equal(accs["input"], accs["bfloat16"])
    assert not np.array_equal(accs["input"], accs["float32"])
