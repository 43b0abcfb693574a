"""The planted bugs: backend -> {bug: (format / scheme it lives in, one line)}. Written before any run."""

BUGS = {
    "r2-a16": {
        "gptq_v1_wrap": ("w4a16 gptq v1", "v1 zero point read as (field + 1) & 0xF: field 0xF gives 0 instead of 16"),
        "gptq_zero_group0": ("w4a16 gptq", "every K group uses group 0's zero points (zero row index not advanced)"),
        "gidx_ignored": ("w4a16 gptq/ct act order", "act-order g_idx / weight_g_idx ignored: group = k // G"),
        "awq_zeros_natural_order": ("w4a16 awq", "AWQ codes de-interleaved, zero points read in natural slot order"),
        "awq_order_inverted": ("w4a16 awq", "AWQ reverse order used as the pack order (codes and zeros)"),
        "ct_zp_offset_kept": ("w4a16 ct asym", "compressed-tensors zero point keeps its +8 packing offset"),
        "ct_k_tail_from_end": ("w4a16 ct channel-wise", "K % 8 != 0: the K codes taken from the end of the padded row"),
        "ct_scale_reshape": ("w4a16 ct group", "weight_scale [N, K/G] reshaped (not transposed) to [K/G, N]"),
        "scale_bf16_bits_as_fp16": ("w4a16/w8a16 bf16 scales", "bfloat16 scale bits reinterpreted as float16"),
        "scale_to_bf16": ("w4a16/w8a16 fp16 scales", "float16 scales converted to bfloat16 (params_dtype) before dequant"),
        "scale_abs": ("w4a16/w8a16 any", "absolute value of the scale (negative scales assumed impossible)"),
        "scale_ftz": ("w4a16/w8a16 fp16 scales", "float16 subnormal scales flushed to zero (FTZ/DAZ)"),
        "gptq8_zero_mask_nibble": ("w8a16 gptq 8-bit", "8-bit zero point masked with 0xF (4-bit copy-paste)"),
        "gptq8_field_stride4": ("w8a16 gptq 8-bit", "8-bit codes extracted with a 4-bit field stride"),
        "ct_int8_first_scale": ("w8a16 ct-int-quantized", "per-channel weight_scale [N, 1] read as per-tensor (row 0's scale)"),
        "m1_sym_zero": ("w4a16 asym gptq/awq, M = 1", "decode (M = 1) path ignores zero points, uses the midpoint 8"),
        "k_tail_dropped": ("w4a16/w8a16 K % 128 != 0", "K loop in tiles of 128 drops the last K % 128 columns (K >= 128)"),
        "n_tail_zero": ("w4a16/w8a16 N % 64 != 0", "output tile of 64 columns: the last N % 64 columns left at 0"),
        "act_to_bf16": ("w4a16/w8a16 fp32 activations", "fp32 activations converted to bfloat16 before the GEMM (undeclared)"),
        "skip_zero_weights": ("w4a16/w8a16 NaN/Inf activations", "products with a zero weight skipped (sparsity shortcut): NaN*0 lost"),
        "bias_after_round": ("w4a16/w8a16 with bias", "bias added to the rounded output, in the output dtype"),
        "out_rtz": ("w4a16/w8a16 bf16 output", "fp32->bf16 output truncated (RTZ) while RNE is declared"),
    },
    "r2-mx16": {
        "mx_nibble_swap": ("w4a16-mxfp4", "element 2j read from the high nibble"),
        "e8m0_bias_126": ("w4a16-mxfp4", "E8M0 bias 126 instead of 127"),
        "e8m0_byte0_zero": ("w4a16-mxfp4", "E8M0 byte 0 decoded as 0.0 (bits << 23 as float32)"),
        "e8m0_ff_finite": ("w4a16-mxfp4", "E8M0 byte 0xFF decoded as 2^128 (ldexp), not NaN"),
        "e2m1_lut_typo": ("w4a16-mxfp4", "E2M1 table entry of code 7 typed as 5.0 instead of 6.0"),
    },
    "r2-w8a8": {
        "w8a8_recip": ("w8a8 sym/asym", "quotient x * fl32(1/scale) instead of x / scale"),
        "w8a8_rhaz": ("w8a8 sym/asym", "activation codes rounded half away from zero (std::round)"),
        "w8a8_clamp127": ("w8a8 asym", "activation codes clamped to [-127, 127]"),
        "w8a8_azp_sign": ("w8a8 asym", "epilogue adds azp * rowsum(w) instead of subtracting it"),
        "w8a8_rowsum_int16": ("w8a8 asym", "weight row sums for the azp correction kept in int16 (wrap)"),
        "w8a8_rowsum_k_tail": ("w8a8 asym", "weight row sums skip the last K % 32 columns"),
        "w8a8_zero_inclusive": ("w8a8 asym", "asym range widened to include 0 (min(min,0), max(max,0))"),
        "w8a8_const_row_eps": ("w8a8 asym", "range clamped to >= 1e-10 (eps guard) instead of the zero-row rule"),
        "w8a8_sx_bf16": ("w8a8 bf16 activations", "per-token scale rounded to bf16 in the epilogue"),
        "w8a8_m_tail_scale": ("w8a8 M % 4 != 0", "rows of the last partial 4-row tile use the previous row's scale"),
    },
    "r2-w4a8": {
        "w4a8_single_scale": ("w4a8 grouped", "one int32 accumulator over K times group 0's weight scale"),
        "w4a8_per_tensor_act": ("w4a8 M > 1", "one activation scale for the whole tensor"),
        "w4a8_amax_128": ("w4a8", "activation scale amax / 128 (shift-friendly) instead of amax / 127"),
        "w4a8_hardcoded_g32": ("w4a8 group != 32", "weight scale group index k // 32 (kernel written for G = 32)"),
    },
    "r2-w4a4": {
        "w4a4_rceil": ("w4a4-mxfp4", "activation scale 2^ceil(log2(amax / 6)) (RCEIL) while FLOOR is declared"),
        "w4a4_rhaz": ("w4a4-mxfp4", "E2M1 activation elements rounded half away from zero"),
        "w4a4_nan_ignored": ("w4a4-mxfp4 NaN acts", "block amax by nanmax: NaN elements skipped, block not NaN"),
        "w4a4_amax_via_bf16": ("w4a4-mxfp4 fp32/fp16 acts", "block amax rounded to bf16 (the kernel's compute dtype) before the scale exponent"),
    },
    "r2-moe": {
        "moe_no_renorm": ("w4a16-moe top-k < E", "top-k weights not renormalized"),
        "moe_tie_higher": ("w4a16-moe router ties", "top-k ties resolved to the higher expert index"),
        "moe_gate_up_swapped": ("w4a16-moe", "w13 halves read as up, gate"),
        "moe_sigmoid_not_silu": ("w4a16-moe", "sigmoid(gate) * up instead of silu(gate) * up"),
        "moe_w2_next_expert": ("w4a16-moe E > 1", "down projection of expert (e + 1) % E (stacked-tensor stride)"),
        "moe_intermediate_no_round": ("w4a16-moe 16-bit", "silu(gate) * up kept in fp64, not rounded to the activation dtype"),
        "moe_softmax_fp16": ("w4a16-moe", "router softmax rounded to float16 before top-k and weighting"),
        "moe_scatter_overwrite": ("w4a16-moe top-k > 1", "expert outputs written (last slot wins), not accumulated"),
        "moe_renorm_eps": ("w4a16-moe", "renormalization divides by sum + 1e-6"),
        "moe_w2_group_from_hidden": ("w4a16-moe I != K, >= 2 w2 groups", "w2 group size computed from the hidden size K instead of I (K // n_groups)"),
    },
}
BUGS["r2-a16-bf16w"] = {}


def check(backend: str, bug: str | None) -> None:
    if bug and bug not in BUGS[backend]:
        raise ValueError(f"{backend}: unknown bug {bug!r}; known: {', '.join(sorted(BUGS[backend]))}")
