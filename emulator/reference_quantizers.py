"""What public reference quantizers compute, named in the variant vocabulary (emulator/variants.py).

Semantics: docs/formats/activations.md#reference-implementations and
docs/formats/mxfp4.md#reference-implementations. Each entry is the ``Declared.variants`` a backend
wrapping that library declares; tests/emulator/test_reference_libraries.py checks every entry against
the library itself, bit for bit, on the separating inputs of conformance/cases/generators.py.
"""

from __future__ import annotations

import dataclasses

from .variants import normalize_variants

__all__ = ["ReferenceQuantizer", "REFERENCE_QUANTIZERS", "reference_variants"]


@dataclasses.dataclass(frozen=True)
class ReferenceQuantizer:
    name: str
    variants: dict
    source: str
    #: the activation dtypes its equality with the library was checked on (tests/conformance/test_quantize_cli.py);
    #: () for every dtype. Another dtype is refused by the commands, never answered under the library's name.
    input_dtypes: tuple = ()


def _entry(name: str, source: str, input_dtypes: tuple = (), **variants) -> ReferenceQuantizer:
    return ReferenceQuantizer(name, normalize_variants(variants), source, tuple(input_dtypes))


_CT_INT8 = dict(act_sym_divisor="half_range", act_range="zero_inclusive", act_arith_dtype="input",
                zero_row="dtype_eps")

REFERENCE_QUANTIZERS: dict[str, ReferenceQuantizer] = {e.name: e for e in [
    _entry("compressed-tensors-int8-sym",
           "compressed_tensors 0.20 quantization/utils/helpers.py calculate_qparams + lifecycle/forward.py quantize "
           "(strategy=token, dynamic, symmetric; 3-D [batch, tokens, hidden] input)", **_CT_INT8),
    _entry("compressed-tensors-int8-asym",
           "compressed_tensors 0.20 calculate_qparams + forward quantize (strategy=token, dynamic, asymmetric)",
           act_symmetric=False, azp_clamp=True, azp_before_rounding=True, **_CT_INT8),
    _entry("onnx-dynamicquantizelinear",
           "onnx 1.23 reference/ops/op_dynamic_quantize_linear.py (uint8 codes and zero point, one scale per tensor)",
           act_symmetric=False, act_range="zero_inclusive", azp_clamp=True, azp_domain="uint8",
           zero_row="unit_range", uint8_zp128=True, act_granularity="per_tensor",
           # a range whose fp32 scale underflows to 0: zp = max(0, min(255, NaN or +Inf)) = 255 and
           # rint(0 / 0) = NaN clipped and cast to uint8 is 0 (x86 and Arm conversions of NaN give 0)
           azp_clamp_nan="high", nan_to_int="low"),
    _entry("vllm-cuda-int8-azp",
           "vLLM csrc/quantization/compressed_tensors/int8_quant_kernels.cu dynamic_scaled_int8_azp_quant_kernel",
           act_symmetric=False, int32_saturation="full"),
    _entry("vllm-cpu-int8-azp",
           "vLLM csrc/cpu/dnnl_kernels.cpp dynamic_scaled_int8_quant_impl<AZP=true>",
           act_symmetric=False, azp_before_rounding=True, reciprocal="recip_scale", azp_overflow="int_min",
           zero_row="nan", azp_fused=True),
    _entry("torchao-mx-floor", "torchao 0.18 prototype/mx_formats/mx_tensor.py to_mx(FLOOR), FP4 E2M1",
           mx_scale_rule="floor", mx_byte0_divisor="min_normal"),
    _entry("torchao-mx-even", "torchao 0.18 to_mx(EVEN), FP4 E2M1", mx_scale_rule="even", mx_byte0_divisor="min_normal"),
    _entry("torchao-mx-ceil", "torchao 0.18 to_mx(CEIL), FP4 E2M1", mx_scale_rule="ceil", mx_byte0_divisor="min_normal"),
    _entry("torchao-mx-rceil", "torchao 0.18 to_mx(RCEIL) eager fallback (_to_mx_rceil), FP4 E2M1",
           mx_scale_rule="rceil_log2f", mx_byte0_divisor="one"),
    _entry("compressed-tensors-mxfp4-act",
           "compressed_tensors 0.20 MXFP4 input_activations: calculate_qparams -> generate_mx_scales, forward quantize",
           # float16 x: the library's bit-masked power of 2 of a subnormal or zero block amax gives scale 1.0 and
           # all-zero codes (compressed_tensors/quantization/utils/mxfp_utils.py round_to_power_2): not modelled
           input_dtypes=("float32", "bfloat16"),
           mx_scale_rule="even", e2m1_zero_sign="positive", mx_scale_overflow="nan", mx_quotient_dtype="input"),
]}


def reference_variants(name: str) -> dict:
    """The variants of reference quantizer ``name`` (a copy); KeyError listing the known names otherwise."""
    try:
        return dict(REFERENCE_QUANTIZERS[name].variants)
    except KeyError:
        raise KeyError(f"unknown reference quantizer {name!r}; known: {', '.join(REFERENCE_QUANTIZERS)}") from None
