"""Independent re-derivations used to cross-check golden tensors before they are written.

Written apart from emulator/ on purpose (plain loops over bit fields, ml_dtypes
for MXFP4, compressed-tensors' own unpacker where installed), so a bug in the
emulator's packers or dequantizers cannot silently become a golden value.
"""

from __future__ import annotations

import numpy as np

__all__ = ["independent_weight", "cross_check"]


def _fields(words: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """Unpack int32 words LSB-first along ``axis`` with a Python-level loop over field positions."""
    w = np.moveaxis(np.asarray(words).view(np.uint32), axis, -1)
    per = 32 // bits
    mask = (1 << bits) - 1
    out = np.empty(w.shape[:-1] + (w.shape[-1] * per,), dtype=np.int64)
    for i in range(per):
        out[..., i::per] = (w >> np.uint32(bits * i)) & np.uint32(mask)
    return np.moveaxis(out, -1, axis)


def _f64(a) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        return a.astype(np.float32).astype(np.float64)
    return a.astype(np.float64)


def independent_weight(case, t: dict) -> np.ndarray:
    """Dequantized weight [N, K] in float64 from checkpoint tensors, without emulator code."""
    fmt, N, K, b = case.weight_format, case.N, case.K, case.bits
    if fmt == "gptq":
        q = _fields(t["qweight"], b, 0)[:K, :].T  # [N, K]
        zf = _fields(t["qzeros"], b, 1)[:, :N]  # [G, N]
        z = zf if case.zero_convention == "v2" else zf + 1
        g = np.asarray(t["g_idx"]).astype(np.int64)
        s = _f64(t["scales"])
        return (q - z[g, :].T) * s[g, :].T
    if fmt == "awq":
        order = [0, 4, 1, 5, 2, 6, 3, 7]  # inverse of the AWQ pack order 0,2,4,6,1,3,5,7
        q = _fields(t["qweight"], 4, 1)  # [K, N] in slot order
        z = _fields(t["qzeros"], 4, 1)
        perm = np.concatenate([np.array(order) + 8 * j for j in range(N // 8)])
        q, z = q[:, perm], z[:, perm]
        G = z.shape[0]
        g = np.arange(K) // (K // G)
        s = _f64(t["scales"])
        return ((q - z[g, :]) * s[g, :]).T
    if fmt == "ct-pack-quantized":
        off = 1 << (b - 1)
        q = _fields(t["weight_packed"], b, 1)[:, :K] - off
        s = _f64(t["weight_scale"])
        G = s.shape[1]
        g = np.asarray(t["weight_g_idx"]).astype(np.int64) if "weight_g_idx" in t else np.arange(K) // (K // G)
        zp = 0 if "weight_zero_point" not in t else (_fields(t["weight_zero_point"], b, 0)[:N, :] - off)[:, g]
        return (q - zp) * s[:, g]
    if fmt == "ct-int-quantized":
        return np.asarray(t["weight"]).astype(np.float64) * _f64(t["weight_scale"]).reshape(-1, 1)
    if fmt == "ct-mxfp4":
        import ml_dtypes

        p = np.asarray(t["weight_packed"])
        codes = np.stack([p & 0xF, p >> 4], axis=-1).reshape(p.shape[0], -1).astype(np.uint8)
        vals = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float64)
        sc = np.asarray(t["weight_scale"]).view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
        return vals * np.repeat(sc, 32, axis=1)
    raise ValueError(fmt)


def cross_check(inp, iv) -> str:
    """Raise AssertionError if the emulator's reference disagrees with independent code; say what was used."""
    case = inp.case
    if case.scheme == "w4a16-moe":
        return "moe: torch float64 loop reference in tests/emulator/test_moe.py"
    from backends.base import Declared

    from conformance.judge.acceptance import declared_weight

    w = independent_weight(case, inp.tensors)
    ours = declared_weight(case, inp.tensors, Declared(variants={})).astype(np.float64)
    # the canonical dequantized weight is the exact value rounded once to float32 (numpy's cast is RNE)
    with np.errstate(over="ignore"):
        w32 = w.astype(np.float32)
    same = (w32 == ours.astype(np.float32)) | (np.isnan(w32) & np.isnan(ours))
    if not same.all():
        raise AssertionError(f"{case.describe()}: independent dequant disagrees at {np.argwhere(~same)[0].tolist()}")
    x = inp.x.astype(np.float64)
    if case.spec.activations == "a16":
        with np.errstate(invalid="ignore", over="ignore"):
            y = x @ w.T + (0 if inp.bias is None else inp.bias.astype(np.float64))
        ok = np.isclose(y, iv.y_exact, rtol=1e-12, atol=0, equal_nan=True) | (np.isinf(y) & (y == iv.y_exact))
        if not ok.all():
            raise AssertionError(f"{case.describe()}: independent reference disagrees at {np.argwhere(~ok)[0].tolist()}")
        return "independent shift-and-mask / ml_dtypes dequant, float64 matmul"
    return "weights only: independent dequant (activation quantization checked by its own oracle tests)"


def cross_check_quantized(inp, expected: dict) -> str:
    """Quantize-only golden cases: the emulator's reference against independent code where there is some;
    raise AssertionError on a disagreement, say what was used."""
    case = inp.case
    if case.scheme == "q-mxfp4":
        import ml_dtypes

        # ml_dtypes' own E2M1 decoding of the codes, times 2**(byte - 127), rounded once to the input dtype
        mag = (expected["codes"] & 7).astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
        sb = expected["scale"].astype(np.float64)
        scale = np.where(sb == 255, np.nan, 2.0 ** (sb - 127))  # E8M0 byte 0xFF is NaN
        val = np.where(expected["codes"] & 8, -mag, mag) * np.repeat(scale, 32, axis=1)
        want = val.astype(ml_dtypes.bfloat16 if case.act_dtype == "bfloat16" else case.act_dtype).astype(np.float32)
        same = (want == expected["dequantized"]) | (np.isnan(want) & np.isnan(expected["dequantized"]))
        if not same.all():
            raise AssertionError(f"{case.describe()}: ml_dtypes E2M1 decode disagrees at {np.argwhere(~same)[0].tolist()}")
        return "ml_dtypes E2M1 decode of the codes x 2**(byte - 127) reproduces the dequantized values"
    if case.scheme == "q-uint8-tensor":
        try:
            from onnx import helper, TensorProto
            from onnx.reference import ReferenceEvaluator
        except ImportError:
            return "not checked: onnx is not installed"
        node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(inp.x.shape))],
                              [helper.make_tensor_value_info(n, t, None) for n, t in
                               (("y", TensorProto.UINT8), ("s", TensorProto.FLOAT), ("z", TensorProto.UINT8))])
        y, sc, z = ReferenceEvaluator(helper.make_model(g)).run(None, {"x": inp.x.astype(np.float32)})
        if not (np.array_equal(y, expected["codes"]) and float(sc) == float(expected["scale"][0])
                and int(z) == int(expected["zero_point"][0])):
            raise AssertionError(f"{case.describe()}: the ONNX reference DynamicQuantizeLinear disagrees")
        return "onnx.reference DynamicQuantizeLinear: codes, scale and zero point identical"
    return "not checked: the emulator defines it (hand-derived tests in tests/emulator/test_activations_int8.py)"
