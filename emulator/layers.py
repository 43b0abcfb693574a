"""Dequantize and run one detected checkpoint layer with its format's semantics.

Semantics: docs/checkpoints.md. This module only routes a ``LayerInfo`` to
the format module that defines it (emulator/formats/*), so each format's
rules stay in one place.
"""

from __future__ import annotations

import functools

import numpy as np

from . import linear as lin
from .activations import int8 as a8
from .checkpoint import Checkpoint, LayerInfo
from .errors import FormatError, UnsupportedFormatError, require
from . import quark
from .formats import awq, compressed_tensors as ct, gptq, mxfp4

__all__ = ["dequantize_layer", "linear_layer", "layer_bias", "overflowing_weights", "MX_FORMATS"]


def _data(tensors: dict, role: str):
    t = tensors.get(role)
    return None if t is None else t.data


def _check_float_scales(info: LayerInfo, tensors: dict, role: str) -> None:
    t = tensors[role]
    require(t.dtype in ("F16", "BF16", "F32"), f"expected a float16/bfloat16/float32 scale tensor, got {t.dtype}",
            layer=info.name, tensor=role)


def _name_layer(fn):
    """Errors raised by the format / linear modules without a layer name get the layer's name."""

    @functools.wraps(fn)
    def wrapper(ckpt, info, *args, **kwargs):
        try:
            return fn(ckpt, info, *args, **kwargs)
        except FormatError as e:
            if e.layer is not None:
                raise
            msg = str(e)
            if e.tensor and msg.startswith(f"{e.tensor}: "):
                msg = msg[len(e.tensor) + 2:]
            raise FormatError(msg, layer=info.name, tensor=e.tensor) from None

    return wrapper


@_name_layer
def dequantize_layer(ckpt: Checkpoint, info: LayerInfo) -> np.ndarray:
    """Exact dequantized weight, float32 [N, K] (stacked experts: [E, N, K]).

    Every tensor of the layer is validated, its bias too (a finite float vector of N), so a
    checkpoint this returns for is one every command accepts. An MXFP4 weight whose exact value
    does not fit float32 (e.g. E8M0 scale 2^127 times E2M1 4) is its RNE rounding, +-Inf, as ONNX
    DequantizeLinear and every peer return (``overflowing_weights`` counts them; docs/formats/mxfp4.md
    #dequantization); an integer format's overflowing weight is an error."""
    layer_bias(ckpt, info)
    tensors = ckpt.layer_tensors(info)
    w = _dequantize(info, tensors)
    _require_finite(info, tensors, w)
    return w


_F32_MAX = float(np.finfo(np.float32).max)


MX_FORMATS = ("ct-mxfp4", "gptoss-mxfp4", "quark-mxfp4")


def overflowing_weights(info: LayerInfo, w: np.ndarray) -> int:
    """How many elements of an MXFP4 layer's weight ``w`` are +-Inf: exact values beyond float32, rounded
    (RNE) to +-Inf (0 for the other formats, which refuse them)."""
    return int(np.isinf(w).sum()) if info.format in MX_FORMATS else 0


def _require_finite(info: LayerInfo, tensors: dict, w: np.ndarray) -> None:
    """An integer format's exact weight must be a float32 value (MXFP4: +-Inf is the canonical RNE rounding
    of an exact value beyond float32, docs/formats/mxfp4.md#dequantization). Skips the full pass when the
    stored scales cannot overflow (max|scale| x 2^bits)."""
    if info.format in MX_FORMATS:
        return
    role = "scales" if "scales" in tensors else "weight_scale"
    s = np.asarray(tensors[role].data, dtype=np.float64)
    if s.size == 0 or float(np.max(np.abs(s))) * 2.0 ** (info.bits + 1) < _F32_MAX:
        return
    bad = ~np.isfinite(w)
    if bad.any():
        idx = [int(i) for i in np.argwhere(bad)[0]]
        shown = info.tensors[role].rsplit(".", 1)[-1]
        raise FormatError(f"the exact dequantized weight at {idx} overflows float32 (its scale is too large)",
                          layer=info.name, tensor=shown)


def _dequantize(info: LayerInfo, tensors: dict) -> np.ndarray:
    name = info.name
    if info.format == "gptq":
        _check_float_scales(info, tensors, "scales")
        _check_gptq_optional(info, tensors)
        params = _gptq_params(info)
        qz = _data(tensors, "qzeros")
        if qz is None:  # sym checkpoint without qzeros: the midpoint zero, written in the layer's convention
            qz = _midpoint_qzeros(info, params)
        t = gptq.GptqTensors(qweight=_data(tensors, "qweight"), qzeros=qz, scales=_data(tensors, "scales"),
                             g_idx=_data(tensors, "g_idx"))
        return gptq.dequantize_gptq(t, params, shape=info.shape, layer=name, zero_read=_zero_read(info))
    if info.format == "awq":
        _check_float_scales(info, tensors, "scales")
        require("qzeros" in tensors, "missing tensor", layer=name, tensor="qzeros")
        params = awq.AwqParams(bits=info.bits, group_size=info.group_size)
        t = awq.AwqTensors(qweight=_data(tensors, "qweight"), qzeros=_data(tensors, "qzeros"),
                           scales=_data(tensors, "scales"))
        return awq.dequantize_awq(t, params, shape=info.shape, layer=name)
    if info.format == "ct-pack-quantized":
        _check_float_scales(info, tensors, "weight_scale")
        return ct.dequantize_ct_packed(_ct_tensors(info, tensors), _ct_params(info), layer=name)
    if info.format == "ct-int-quantized":
        _check_float_scales(info, tensors, "weight_scale")
        return ct.dequantize_ct_int8(ct.CtInt8Tensors(weight=tensors["weight"].data,
                                                      weight_scale=tensors["weight_scale"].data), layer=name)
    if info.format == "ct-mxfp4":
        raw = {k: v.data for k, v in tensors.items() if k in ("weight_packed", "weight_scale")}
        _no_nan_scales(raw["weight_scale"], name, "weight_scale")
        return mxfp4.dequantize_mxfp4_ct(raw, layer=name)
    if info.format == "gptoss-mxfp4":
        b, s = tensors["blocks"].data, tensors["scales"].data
        names = (info.tensors["blocks"].rsplit(".", 1)[-1], info.tensors["scales"].rsplit(".", 1)[-1])
        _no_nan_scales(s, name, names[1])
        return mxfp4.dequantize_mxfp4_gptoss(b, s, layer=name, names=names)
    if info.format == "quark-int":
        return quark.dequantize_quark_int(info, tensors)
    if info.format == "quark-mxfp4":
        _no_nan_scales(tensors["weight_scale"].data, name, "weight_scale")
        return _quark_as_ct(name, lambda raw: mxfp4.dequantize_mxfp4_ct(raw, layer=name), tensors)
    raise UnsupportedFormatError(f"{name}: format {info.format!r} has no dequantizer")


def _quark_as_ct(name: str, fn, tensors: dict):
    """Quark MXFP4 has compressed-tensors' MXFP4 layout under other names (docs/formats.md, AMD Quark):
    run ``fn`` on the ct names, and name Quark's tensor in any error."""
    raw = {"weight_packed": tensors["weight"].data, "weight_scale": tensors["weight_scale"].data}
    try:
        return fn(raw)
    except FormatError as e:
        if e.tensor != "weight_packed":
            raise
        msg = str(e).split(": ", 1)[-1] if str(e).startswith(f"{name}.") else str(e)
        raise FormatError(msg, layer=name, tensor="weight") from None


def _check_gptq_optional(info: LayerInfo, tensors: dict) -> None:
    """qzeros may be left out only by a symmetric layer, g_idx only without act order
    (desc_act=True permutes the groups, and only g_idx says how)."""
    require("qzeros" in tensors or info.sym, "missing tensor (an asymmetric GPTQ layer needs its zero points)",
            layer=info.name, tensor="qzeros")
    require("g_idx" in tensors or not info.act_order, "missing tensor (desc_act=True needs g_idx)",
            layer=info.name, tensor="g_idx")


def _gptq_params(info: LayerInfo) -> gptq.GptqParams:
    return gptq.GptqParams(bits=info.bits, group_size=info.group_size, sym=bool(info.sym), desc_act=info.act_order,
                           zero_convention="gptq_v2" if info.zero_convention == "v2" else "gptq")


def _zero_read(info: LayerInfo) -> str:
    """v1-packed: the writer subtracted 0x11111111 from whole words, so read by adding it back."""
    return "v1_packed_add" if info.zero_convention == "v1-packed" else "canonical"


def _no_nan_scales(scale, layer, tensor):
    s = np.asarray(scale)
    if s.dtype == np.uint8 and np.any(s == 0xFF):
        idx = tuple(int(i) for i in np.argwhere(s == 0xFF)[0])
        raise FormatError(f"E8M0 byte 0xFF (NaN scale) at index {list(idx)}: a stored weight scale must be finite",
                          layer=layer, tensor=tensor)


def _midpoint_qzeros(info: LayerInfo, params) -> np.ndarray:
    N, K = info.shape
    n_groups = 1 if info.group_size == -1 else K // info.group_size
    z = np.full((n_groups, N), params.sym_zero, dtype=np.int64)
    codes = gptq.GptqCodes(q=np.zeros((N, K), np.uint8), zeros=z, scales=np.ones((n_groups, N), np.float16),
                           g_idx=np.arange(K, dtype=np.int32) // (K if info.group_size == -1 else info.group_size))
    return gptq.pack_gptq(codes, params).qzeros


def _ct_params(info: LayerInfo):
    channel = info.group_size == -1
    return ct.CtPackParams(num_bits=info.bits, strategy="channel" if channel else "group",
                           group_size=None if channel else info.group_size, symmetric=bool(info.sym),
                           actorder=info.act_order and "weight_g_idx" in info.tensors)


def _ct_tensors(info: LayerInfo, tensors: dict):
    shape = tensors["weight_shape"].data if "weight_shape" in tensors else np.array(info.shape, dtype=np.int64)
    return ct.CtPackedTensors(weight_packed=tensors["weight_packed"].data, weight_scale=tensors["weight_scale"].data,
                              weight_shape=shape, weight_zero_point=_data(tensors, "weight_zero_point"),
                              weight_g_idx=_data(tensors, "weight_g_idx"))


def layer_bias(ckpt: Checkpoint, info: LayerInfo):
    if "bias" not in info.tensors:
        return None
    b = ckpt.tensor(info.tensors["bias"], layer=info.name)
    require(b.dtype in ("F16", "BF16", "F32", "F64"), f"expected a float bias, got {b.dtype}", layer=info.name,
            tensor="bias")
    require(b.data.ndim == 1 and b.data.shape[0] == info.shape[-2], f"expected bias [{info.shape[-2]}], got {list(b.shape)}",
            layer=info.name, tensor="bias")
    bad = ~np.isfinite(b.data)
    if bad.any():
        i = int(np.argmax(bad))
        raise FormatError(f"non-finite value {b.data[i]} at index {i}: a bias must be finite", layer=info.name,
                          tensor="bias")
    return b.data


@_name_layer
def linear_layer(ckpt: Checkpoint, info: LayerInfo, x, *, act: str | None = None,
                 int8_variant: a8.Int8ActVariant | None = None,
                 mx_variant: mxfp4.MxVariant | None = None, out_dtype: str | None = None,
                 int_engine=None) -> lin.LinearResult:
    """Reference linear for a layer: the checkpoint's declared activation scheme unless ``act`` overrides.

    act: "a16" | "int8" | "mxfp4" (None: from the checkpoint config; a16 when it declares none).
    int_engine: the W8A8 exact integer accumulator's engine (``lin.linear_w8a8``; speed only).
    """
    if len(info.shape) != 2:
        raise UnsupportedFormatError(f"{info.name}: linear of stacked experts {list(info.shape)}: use the MoE reference")
    # Every scheme validates every tensor exactly as dequant does (NaN scales, E8M0 0xFF, bias, ...):
    # the int8 / mxfp4 paths below read the codes directly and would carry a NaN through.
    w = dequantize_layer(ckpt, info)
    bias = layer_bias(ckpt, info)
    scheme = act or _declared_act(info)
    if act is None and scheme == "int8" and info.format == "quark-int":
        # Quark's dynamic int8 observer: scale = amax / 127.5 ((qmax - qmin) / 2), no emulator variant
        if not (info.activation or {}).get("dynamic"):
            raise UnsupportedFormatError(
                f"{info.name}: Quark static int8 input_tensors (a stored input scale) are not defined (qconform linear "
                "can run the layer with --act a16 or --act int8: dynamic, canonical amax / 127)")
        raise UnsupportedFormatError(
            f"{info.name}: Quark dynamic int8 input_tensors (scale = amax / 127.5, quantization/observer/observer.py) "
            "are not an emulator variant (qconform linear can run the layer with --act a16 or --act int8: canonical "
            "amax / 127)")
    if scheme == "a16":
        return lin.linear_w16(x, w, bias, out_dtype=out_dtype)
    if scheme == "int8":
        v = int8_variant or a8.CANONICAL_SYM
        if info.format == "quark-int" and info.bits == 8:
            t = ckpt.layer_tensors(info)
            d, scales, _ = quark.quark_int_weights(info, t)
            return lin.linear_w8a8(x, d.astype(np.int8) if np.all((d >= -128) & (d <= 127)) else _too_wide(info),
                                   scales.reshape(-1), bias, act=v, out_dtype=out_dtype, int_engine=int_engine)
        if info.format == "ct-int-quantized":
            t = ckpt.layer_tensors(info)
            _check_float_scales(info, t, "weight_scale")
            return lin.linear_w8a8(x, t["weight"].data, t["weight_scale"].data.reshape(-1), bias, act=v,
                                   out_dtype=out_dtype, int_engine=int_engine)
        w_int, scales, gs, g_idx = _int_weights(ckpt, info)
        return lin.linear_w4a8(x, w_int, scales, gs, bias, g_idx=g_idx, act=v, out_dtype=out_dtype)
    if scheme == "mxfp4":
        if info.format not in ("ct-mxfp4", "quark-mxfp4"):
            raise UnsupportedFormatError(f"{info.name}: MXFP4 activations need MXFP4 weights (layer is {info.format})")
        t = ckpt.layer_tensors(info)
        if info.format == "quark-mxfp4":
            codes, sb = _quark_as_ct(info.name, lambda raw: mxfp4.unpack_mxfp4_ct(raw, layer=info.name), t)
            if act is None:
                mx_variant = _quark_mx_variant(info, mx_variant)
        else:
            codes, sb = mxfp4.unpack_mxfp4_ct({k: t[k].data for k in ("weight_packed", "weight_scale")},
                                              layer=info.name)
        return lin.linear_mxfp4_w4a4(x, codes, sb, bias, act=mx_variant or mxfp4.CANONICAL, out_dtype=out_dtype)
    raise UnsupportedFormatError(f"unknown activation scheme {scheme!r} (a16, int8, mxfp4)")


def _declared_act(info: LayerInfo) -> str:
    a = info.activation
    if not a:
        return "a16"
    kind, bits = str(a.get("type") or "int").lower(), a.get("num_bits")
    if kind == "int" and bits in (None, 8):
        return "int8"
    if kind == "float" and bits == 4:
        return "mxfp4"
    raise UnsupportedFormatError(f"{info.name}: declared input_activations {a} are not a defined scheme")


def _int_weights(ckpt: Checkpoint, info: LayerInfo):
    """(q - z) as signed ints [N, K], scales [n_groups, N], group size, g_idx — for W4A8."""
    tensors = ckpt.layer_tensors(info)
    if info.format == "gptq":
        _check_float_scales(info, tensors, "scales")
        _check_gptq_optional(info, tensors)
        params = _gptq_params(info)
        qz = _data(tensors, "qzeros")
        if qz is None:
            qz = _midpoint_qzeros(info, params)
        c = gptq.unpack_gptq(gptq.GptqTensors(_data(tensors, "qweight"), qz, _data(tensors, "scales"),
                                              _data(tensors, "g_idx")), params, shape=info.shape, layer=info.name,
                             zero_read=_zero_read(info))
        w_int = c.q.astype(np.int32) - c.zeros[c.g_idx, :].T
        return w_int, np.asarray(c.scales), info.group_size, c.g_idx
    if info.format == "awq":
        _check_float_scales(info, tensors, "scales")
        require("qzeros" in tensors, "missing tensor", layer=info.name, tensor="qzeros")
        c = awq.unpack_awq(awq.AwqTensors(_data(tensors, "qweight"), _data(tensors, "qzeros"), _data(tensors, "scales")),
                           awq.AwqParams(bits=info.bits, group_size=info.group_size), shape=info.shape, layer=info.name)
        K = c.q.shape[1]
        gs = K // c.zeros.shape[0]
        g = np.arange(K) // gs
        return c.q.astype(np.int32) - c.zeros[g, :].T, np.asarray(c.scales), gs, None
    if info.format == "ct-pack-quantized":
        _check_float_scales(info, tensors, "weight_scale")
        c = ct.unpack_ct_packed(_ct_tensors(info, tensors), _ct_params(info), layer=info.name)
        N, K = c.q.shape
        n_groups = np.asarray(c.scales).shape[1]
        g = c.g_idx if c.g_idx is not None else np.arange(K) // (K // n_groups)
        z = 0 if c.zero_point is None else c.zero_point[:, g].astype(np.int32)
        return c.q.astype(np.int32) - z, np.asarray(c.scales).T, K // n_groups, g
    if info.format == "quark-int" and info.bits == 4:
        w_int, scales, gs = quark.quark_int_weights(info, tensors)
        return w_int, scales, gs, None
    raise FormatError(f"W4A8 needs int4 weights; layer format is {info.format}", layer=info.name)


def _quark_mx_variant(info: LayerInfo, given: "mxfp4.MxVariant | None") -> mxfp4.MxVariant:
    """The activation quantizer a Quark layer declares (scale_calculation_mode etc., emulator/quark.py),
    with any field the caller set away from canonical kept (an explicit --variant wins)."""
    declared = quark.mx_variant_fields(info.activation or {}, info.name)
    base = given or mxfp4.CANONICAL
    fields = base.describe()
    canon = mxfp4.CANONICAL.describe()
    for k, v in declared.items():
        if fields[k] == canon[k]:
            fields[k] = v
    return mxfp4.MxVariant(**fields)


def _too_wide(info: LayerInfo):
    raise FormatError("q - zero_point leaves int8 (an int8 W8A8 GEMM needs zero points that keep it in range)",
                      layer=info.name, tensor="weight_zero_point")


def checkpoint_activation_variants(info: LayerInfo) -> dict:
    """The activation-quantizer fields a checkpoint itself declares (Quark's scale_calculation_mode and the like),
    as MxVariant field -> value; empty for formats whose activations follow the canonical rule."""
    if info.format == "quark-mxfp4" and info.activation:
        return {k: getattr(v, "value", v) for k, v in quark.mx_variant_fields(info.activation, info.name).items()}
    return {}


def declared_activation(info: LayerInfo) -> str:
    """The activation scheme a layer's checkpoint declares: "a16", "int8" or "mxfp4"."""
    return _declared_act(info)
