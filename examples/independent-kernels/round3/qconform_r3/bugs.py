"""The planted bugs of round 3: backend -> {bug: (where it lives, what, where a real kernel gets it)}.

Written before any run, after reading the bug lists of rounds 1 and 2 only to avoid their kinds."""

BUGS = {
    "r3-a16": {
        "gidx_sorted_uniform": ("w4a16 act order", "act order run Marlin-style: columns sorted by g_idx and group = rank // G (assumes every group holds exactly G columns)", "gptq_marlin sort_weights + a kernel that recomputes the group from the sorted position"),
        "actorder_x_perm_only": ("w4a16/w8a16 act order", "activations permuted by argsort(g_idx) but the packed weight rows not permuted", "process_weights_after_loading forgets the qweight row permutation that goes with the g_idx sort"),
        "awq_scales_interleaved": ("w4a16 awq", "AWQ's slot order (0 2 4 6 1 3 5 7) applied to the (unpacked) scales too", "a loader that runs the AWQ reorder over qweight, qzeros and scales alike"),
        "ct_codes_as_int4": ("w4a16 ct-pack", "compressed-tensors codes read as two's complement int4 instead of offset binary (q + 8)", "an int4 unpack helper with sign extension reused for offset-binary fields"),
        "top_field_arith_shift": ("w4a16/w8a16 packed codes", "top field of each int32 word extracted by an arithmetic shift with no mask: codes >= 2^(b-1) there go negative", "(w >> 28) on a signed int32 'needs no mask for the last field'"),
        "qzeros_top_field_arith_shift": ("w4a16/w8a16 zero points", "the same for the top zero-point field of each word (columns n mod F = F-1)", "qzeros unpack with a signed shift for the last field"),
        "gptq8_sign_extend": ("w8a16 gptq 8-bit", "8-bit code fields cast to int8 (sign-extended): codes >= 128 read as q - 256", "(w >> 8*i).to(torch.int8) instead of & 0xFF"),
        "words_byteswapped": ("w4a16/w8a16 packed", "packed int32 tensors (qweight, qzeros, weight_packed, weight_zero_point) loaded big-endian", "np.frombuffer(..., '>i4') in a hand-written safetensors reader"),
        "group_boundary_plus1": ("w4a16/w8a16 grouped, no act order", "column k uses group (k + 1) // G (1-based column index), clamped to the last group", "for (k = 1; k <= K; ++k) g = k / G"),
        "ct_zp_n_floor": ("w4a16 ct-pack asym, N % 8 != 0", "zero-point words read for N // 8 rows: the last N % 8 rows get field 0 (zp = -8)", "zero-point buffer sized N / 8 (floor) instead of ceil"),
        "int8_w_clamp_m127": ("w8a16 ct-int-quantized", "int8 weight code -128 clamped to -127", "a VNNI s8 path that keeps weights in [-127, 127] so that -w never overflows"),
        "out_via_fp16": ("w4a16/w8a16 bf16 output", "bf16 output stored through an fp16 epilogue buffer: RNE to fp16, then to bf16", "an epilogue template instantiated for half, its result converted for bf16 callers"),
        "out_satfinite": ("w4a16/w8a16 overflow and Inf", "output conversion saturates: +-Inf and overflow become +-max finite (NaN kept)", "cvt.rn.satfinite / _mm512_cvtneps_ph with saturation"),
        "act_nan_to_num": ("w4a16/w8a16 NaN/Inf activations", "activations sanitized with nan_to_num (NaN -> 0, +-Inf -> +-max) in the prologue", "a defensive torch.nan_to_num(x) before the GEMM"),
        "bias_to_bf16": ("w4a16/w8a16 fp32/fp16 with bias", "bias converted to bf16 (the kernel's bias buffer type) before the add", "bias pointer typed as bf16 in a kernel written for bf16 models"),
        "m1_no_bias": ("w4a16/w8a16 M = 1 with bias", "the M = 1 (GEMV) path drops the bias", "a separate decode kernel with no bias argument"),
        "m_tail_skipped": ("w4a16/w8a16 M > 8, M % 8 != 0", "row tiles of 8: rows past the last full tile left 0 (M < 8 runs the small-M path)", "for (m0 = 0; m0 + 8 <= M; m0 += 8) with no remainder loop"),
    },
    "r3-a16-f32": {
        "splitk_bias_each": ("w4a16/w8a16 K > 128 with bias", "split-K over chunks of 128: each split adds the bias to its partial sum", "the bias epilogue run by every split instead of split 0"),
        "tf32_products": ("w4a16/w8a16 fp32 activations", "fp32 activations and weights rounded to TF32 (10-bit mantissa) before the product", "allow_tf32 / oneDNN fpmath_mode=tf32 left on"),
    },
    "r3-mx16": {
        "e2m1_twos_complement": ("w4a16-mxfp4", "FP4 codes 9..15 decoded as -LUT[16 - code] (two's complement), not sign-magnitude", "an int4 sign extension reused for E2M1"),
        "e8m0_signed_char": ("w4a16-mxfp4 scale bytes >= 128", "E8M0 byte read through a signed char: bytes >= 128 become byte - 256", "int8_t* scale pointer"),
    },
    "r3-w8a8": {
        "w8a8_vpmaddubsw_sat": ("w8a8", "activations shifted to uint8 (q + 128), u8 x s8 pairs summed with int16 saturation (AVX2 vpmaddubsw), then 128 * rowsum removed", "the classic AVX2 int8 GEMM inner loop"),
        "w8a8_bias_int32": ("w8a8 with bias", "bias folded into the int32 accumulator as RNE(bias / (sx * sw)) before the scale", "static-quantization style bias in the integer epilogue"),
        "w8a8_m1_sym": ("w8a8 asym, M = 1", "the M = 1 path quantizes activations symmetrically (amax / 127, no zero point)", "a decode kernel with only the symmetric quantizer"),
        "int8_w_clamp_m127": ("w8a8", "int8 weight code -128 clamped to -127", "as in r3-a16"),
    },
    "r3-w4a8": {
        "w4a8_comp_rowsum_not_group": ("w4a8 gptq grouped", "zero-point compensation z * sum qx taken over the whole row, not over each group", "activation row sum computed once per token and reused per group"),
        "w4a8_act_per_group": ("w4a8 grouped", "activations quantized per (token, weight group) instead of per token", "a per-token-group quantizer (group = the weight group) in a kernel declared per-token"),
    },
    "r3-w4a4": {
        "w4a4_exp_min_126": ("w4a4-mxfp4 tiny blocks", "activation scale exponent clamped to [-126, 127] (a normal fp32 scale), zero block byte 1", "scale built as a normal float: max(exp, -126)"),
        "e2m1_threshold_5": ("w4a4-mxfp4", "E2M1 rounding by thresholds with '< 5' between 4 and 6: the tie 5 goes to 6 (others RNE)", "one comparison typed < instead of <= in a threshold ladder"),
    },
    "r3-moe": {
        "moe_top1_no_renorm": ("w4a16-moe top-1", "top-1 fast path skips renormalization: weight p instead of 1", "if top_k == 1: weights = probs[ids]  # 'nothing to renormalize'"),
        "moe_logits_to_act_dtype": ("w4a16-moe 16-bit", "router logits rounded to the activation dtype before softmax", "the gate's output kept in bf16/fp16 before fused_topk"),
        "moe_intermediate_fp16": ("w4a16-moe bf16/fp32", "intermediate silu(gate) * up always stored in fp16", "intermediate cache allocated as torch.half regardless of the model dtype"),
        "moe_scales_expert0": ("w4a16-moe E > 1", "w13 scales of expert 0 used for every expert (scale pointer not advanced by expert)", "expert offset applied to qweight but not to scales"),
        "moe_scatter_sorted_order": ("w4a16-moe M > 1", "outputs of the expert-sorted (token, slot) pairs added to row r // k of the sorted list, not to their token", "missing inverse permutation after moe_align_block_size"),
        "moe_topk_duplicate": ("w4a16-moe top-k > 1", "iterative argmax without masking: every slot picks the top-1 expert", "mask write to a copy, not the working buffer"),
    },
    "r3-q": {
        "qint8_zp_sign": ("q-int8-token asym", "zero_point returned as -azp (x = (q + zp) * s convention)", "a library convention mix-up in the output packing"),
        "q_dequant_fp32": ("q-int8-token / q-mxfp4 16-bit inputs", "dequantized left in float32, not rounded to the input dtype", "dequantized tensor allocated in float32"),
        "qu8_zp_trunc": ("q-uint8-tensor", "zero point truncated (C cast) instead of rounded to nearest even", "static_cast<uint8_t>(-rmin / scale)"),
        "qmx_zero_sign": ("q-mxfp4", "elements that round to 0 get code 0 (+0), -0 and small negatives lose the sign", "sign taken as (x > 0 ? 0 : 8) only for nonzero magnitudes"),
        "qmx_dequant_ldexp": ("q-mxfp4 NaN/Inf blocks", "dequantized = ldexp(E2M1, byte - 127): a 0xFF block of zero codes dequantizes to 0, not NaN", "gpt-oss/transformers style ldexp decode"),
    },
}


def check(backend: str, bug: str | None) -> None:
    if bug and bug not in BUGS[backend]:
        raise ValueError(f"{backend}: unknown bug {bug!r}; known: {', '.join(sorted(BUGS[backend]))}")
