"""The qconform backend adapter of the example kernel (registered as ``vendor-w4a16``).

It answers qconform's five questions (docs/backends.md#interface) for ``kernel.py``: available
everywhere NumPy is; implements W4A16 GPTQ int4 without act order; declares the arithmetic the
kernel really does -- weights formed in bfloat16 from bf16 scales, fp32 accumulation, one RNE
rounding of the output -- which ``qconform certify`` checks and ``qconform fingerprint`` recovers.
"""

from __future__ import annotations

import numpy as np

from backends.base import Availability, Backend, Case, Declared, Prepared, Support, no, yes

from . import __version__
from .kernel import prepare_gptq, w4a16_matmul


class VendorW4A16Backend(Backend):
    name = "vendor-w4a16"
    covers = "example vendor plugin: NumPy int4 W4A16 for GPTQ (bf16 weights, fp32 accumulation)"
    priority = 0  # third-party default (docs/backends.md#dispatcher)

    def availability(self) -> Availability:
        return Availability(True, "NumPy kernel", __version__, "cpu")

    def schemes(self) -> list[str]:
        return ["w4a16"]

    def can_implement(self, case: Case) -> Support:
        if case.scheme != "w4a16":
            return no(f"only w4a16 (got {case.scheme})")
        if case.weight_format != "gptq":
            return no(f"only GPTQ checkpoints (got {case.weight_format})")
        if case.bits != 4:
            return no("only 4-bit weights")
        if case.act_order:
            return no("act order (g_idx permutations) is not supported: the kernel reads groups as contiguous K blocks")
        if case.K % case.group or case.K % 8 or case.N % 8:
            return no(f"K={case.K} and N={case.N} must be multiples of 8 and K of the group size {case.group}")
        return yes()

    def declared(self, case: Case) -> Declared:
        return Declared(variants={}, weight_dtype="bfloat16", act_compute_dtype=None, accumulate="float32",
                        output=case.output_dtype, output_rounding="rne",
                        notes="w = bf16((q - z) * bf16(s)) with the canonical zero reading (v1: field + 1, v2: "
                              "field; sym checkpoints' qzeros are read); fp32 sgemm per group, fp32 group sum and "
                              "bias; output rounded RNE to the activation dtype")

    def prepare(self, case: Case, tensors: dict) -> Prepared:
        p = prepare_gptq(tensors["qweight"], tensors["qzeros"], tensors["scales"], group_size=case.group,
                         zero_offset=0 if case.zero_convention == "v2" else 1)
        return Prepared(case, p)

    def run(self, prepared: Prepared, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        return w4a16_matmul(x, prepared.data, inputs.get("bias"), prepared.case.output_dtype)
