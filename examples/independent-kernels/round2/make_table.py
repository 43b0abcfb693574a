"""Markdown rows for the README from the run folders: bug | lives in | one line | ci pass/fail | failing
generators (most failing first) | localization summary of the most frequent group.

usage: python make_table.py ROOT/ci   (folders named <backend>_bug_<bug>-<scheme>)"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from qconform_r2.bugs import BUGS  # noqa: E402
from summarize import summarize  # noqa: E402

#: the localization read as a kernel author would (by hand, from the console text of the failing cases):
#: right = place and pattern; place = right place, pattern wrong or unnamed; generic = "weights (and activation
#: quantization) read back exact: the failure is in the product, the accumulation or the output rounding"
#: while the bug is elsewhere; wrong = names another place/pattern; - = MoE, not localized
JUDGE = {
    "gptq_v1_wrap": "place: rows 0, 9 'zero point ignored' (it is field 0xF wrapping to 0)",
    "gptq_zero_group0": "place: K groups >= 1, zero points; pattern wrong ('off by one' / 'read as zero', not 'group 0's zero points')",
    "gidx_ignored": "right", "awq_zeros_natural_order": "right", "awq_order_inverted": "right",
    "ct_zp_offset_kept": "wrong: 'sign flipped', 'zero points: nibbles swapped' (it is zp + 8: 8 scale steps)",
    "ct_k_tail_from_end": "wrong: 'nibbles in reverse order', 'zero point off by one' (codes shifted along K by the padding)",
    "ct_scale_reshape": "place: other groups' scales, x2 factors (no 'scales transposed')",
    "scale_bf16_bits_as_fp16": "right", "scale_to_bf16": "right", "scale_abs": "missed",
    "scale_ftz": "place: 'row 4 read as zero' (+ an invented 'channel n - 4' on ct); no 'subnormal scale flushed'",
    "gptq8_zero_mask_nibble": "place: 'every row wrong by 112 scale steps: codes or zero points misread'",
    "gptq8_field_stride4": "place: 'bytes in reverse order' on some columns (codes, but not the stride)",
    "ct_int8_first_scale": "place: per-row factors (x2, ...), not 'row 0's scale on every row'",
    "m1_sym_zero": "right (the M = 1 path is what is read back)", "k_tail_dropped": "right", "n_tail_zero": "right",
    "act_to_bf16": "generic (activation rounding not probed)", "skip_zero_weights": "generic (reason names the NaN mismatches first: good)",
    "bias_after_round": "generic (the x = 0 bias probe cannot see it); reason says 'e.g. truncated' on 14 cases",
    "out_rtz": "right (output rounding; 'truncated instead of rounded')",
    "mx_nibble_swap": "right", "e8m0_bias_126": "right", "e8m0_byte0_zero": "right (row 0 = the byte-0 row)",
    "e8m0_ff_finite": "missed", "e2m1_lut_typo": "place: 'every weight scaled by 0.8333' (5/6: not 'code 7 read as 5')",
    "w8a8_recip": "generic; 2 cases' reason 'matches act_rounding=rhtz' (misnamed)",
    "w8a8_rhaz": "reason right ('matches act_rounding=rhaz'); localization contradicts it ('activation quantization read back exact')",
    "w8a8_clamp127": "right", "w8a8_azp_sign": "right",
    "w8a8_rowsum_int16": "place: rows 0, 1 'scaled by -292.7', stage 'weights or activation quantization' (it is the azp row-sum term)",
    "w8a8_rowsum_k_tail": "place: 'activation zero point ignored' (the azp correction, but not 'its last K % 32 columns')",
    "w8a8_zero_inclusive": "generic", "w8a8_const_row_eps": "generic",
    "w8a8_sx_bf16": "generic; 33 cases' reason 'not the declared rounding (e.g. truncated)'",
    "w8a8_m_tail_scale": "right (epilogue, per-token factor)",
    "w4a8_single_scale": "place: 'scale of group g-1 used for group g' (it is group 0's for all)",
    "w4a8_per_tensor_act": "right", "w4a8_amax_128": "right",
    "w4a8_hardcoded_g32": "place: K group 0, columns k mod 128 in 32.. (no pattern)",
    "w4a4_rceil": "generic", "w4a4_rhaz": "generic; reason names 'eNmN_rounding=rhaz' (not a vocabulary key)",
    "w4a4_nan_ignored": "generic (reason: NaN mismatches first)", "w4a4_amax_via_bf16": "generic",
    "moe_intermediate_no_round": "missed", "moe_softmax_fp16": "missed", "moe_renorm_eps": "missed",
}
for _b in ("moe_no_renorm", "moe_tie_higher", "moe_gate_up_swapped", "moe_sigmoid_not_silu", "moe_w2_next_expert",
           "moe_scatter_overwrite", "moe_w2_group_from_hidden"):
    JUDGE[_b] = "- (MoE: 'no localization for w4a16-moe yet')"

root = pathlib.Path(sys.argv[1])
for backend, bugs in BUGS.items():
    for bug, (where, line) in bugs.items():
        runs = sorted(root.glob(f"{backend}_bug_{bug}-*"))
        cells = []
        for r in runs:
            if not (r / "results.jsonl").exists():
                continue
            s = summarize(r)
            scheme = r.name.rsplit("-", 1)[-1] if not r.name.endswith("mxfp4") and not r.name.endswith("moe") else \
                r.name.split(f"{bug}-", 1)[1]
            v = s["verdicts"]
            gens = ", ".join(f"{k} {n}" for k, n in list(s["failing"].items())[:3])
            loc = next(iter(s["localization"]), "-").replace("|", "/")
            ties = v.get("pass-with-tie-flips", 0)
            cells.append(f"{scheme}: {v.get('pass', 0)} pass" + (f" + {ties} tie-flip pass" if ties else "")
                         + f" / {v.get('fail', 0)} fail"
                         + (f"; {gens}" if gens else "") + (f"; loc: {loc[:160]}" if loc != "-" else ""))
        j = JUDGE.get(bug, "")
        print(f"| `{backend}:{bug}` | {where} | {line} | {'<br>'.join(cells) or 'not run'} | {j} |")
