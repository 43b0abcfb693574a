"""Test helper: canonical int4 codes of checkpoint tensors, read by the emulator's own unpackers.

Shared by the CUDA and XPU layout-transform tests, which decode each kernel's repacked
weights with the kernel's layout and compare against these.
"""

import numpy as np

from emulator.formats import awq, compressed_tensors as ct, gptq


def canonical_codes(case, t, zero_read="canonical"):
    """(q [N, K] unsigned codes, z [K/G, N] true zero points) for a 4-bit case's tensors ``t``."""
    if case.weight_format == "gptq":
        p = gptq.GptqParams(bits=4, group_size=case.group_size, sym=case.sym,
                            zero_convention=case.gptq_zero_convention)
        c = gptq.unpack_gptq(gptq.GptqTensors(t["qweight"], t["qzeros"], t["scales"], t["g_idx"]), p,
                             shape=(case.N, case.K), zero_read=zero_read)
        return c.q, c.zeros
    if case.weight_format == "awq":
        c = awq.unpack_awq(awq.AwqTensors(t["qweight"], t["qzeros"], t["scales"]),
                           awq.AwqParams(bits=4, group_size=case.group_size), shape=(case.N, case.K))
        return c.q, c.zeros
    channel = case.group_size in (-1, 0)
    p = ct.CtPackParams(num_bits=4, strategy="channel" if channel else "group",
                        group_size=None if channel else case.group_size, symmetric=case.sym)
    c = ct.unpack_ct_packed(ct.CtPackedTensors(t["weight_packed"], t["weight_scale"], t["weight_shape"],
                                               t.get("weight_zero_point")), p)
    z = np.zeros((case.K // case.group, case.N), np.int64) if c.zero_point is None else np.asarray(c.zero_point).T
    return np.asarray(c.q).astype(np.int64) + 8, z + 8
