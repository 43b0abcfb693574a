"""Hand-built inputs for the two bugs ci missed: does the suite's own judge fail them?"""
import numpy as np
from emulator.schemes import Case
from emulator.formats import gptq
from conformance.cases.inputs import make_inputs, CaseInputs
from conformance.run.inprocess import judge_inputs

# 1. GPTQ act order with unequal group sizes (valid: docs/formats/gptq.md "any map into [0, K/G)")
case = Case("w4a16", "gptq", M=4, N=64, K=128, group_size=32, sym=True, act_order=True, act_dtype="float32")
inp = make_inputs(case, seed=1)
rng = np.random.default_rng(0)
g = np.array([0] * 40 + [1] * 24 + [2] * 32 + [3] * 32, dtype=np.int32)[rng.permutation(128)]
p = gptq.GptqParams(bits=4, group_size=32, sym=True, desc_act=True, zero_convention="gptq")
t = gptq.quantize_gptq(inp.weight_fp, p, g, scale_dtype="float16")
tensors = {"qweight": t.qweight, "qzeros": t.qzeros, "scales": t.scales, "g_idx": np.asarray(t.g_idx, np.int32)}
inp2 = CaseInputs(case, 1, tensors, inp.x, None, None, inp.weight_fp)
for spec in ("r3-a16", "r3-a16:bug=gidx_sorted_uniform"):
    r = judge_inputs(spec, inp2)
    print("gidx unequal groups", spec, r["verdict"], str(r.get("reason"))[:150])

# 2. W4A4 fp32: one activation block of amax 2^-125 with 1.5 * 2^-127, weights of scale byte 0xFE, codes +-0.5
case = Case("w4a4-mxfp4", "ct-mxfp4", M=2, N=8, K=64, group_size=32, act_dtype="float32")
inp = make_inputs(case, seed=2)
x = inp.x.copy()
x[0, :32] = 0.0
x[0, 0] = 2.0 ** -125
x[0, 1:8] = 1.5 * 2.0 ** -127
x[0, 8:16] = -(2.0 ** -128)
t = dict(inp.tensors)
wp = t["weight_packed"].copy(); ws = t["weight_scale"].copy()
wp[:, :16] = 0x11  # codes 1 (+0.5) in block 0
ws[:, 0] = 0xFE
t["weight_packed"], t["weight_scale"] = wp, ws
inp3 = CaseInputs(case, 2, t, x.astype(np.float32), None, None, None)
for spec in ("r3-w4a4", "r3-w4a4:bug=w4a4_exp_min_126"):
    r = judge_inputs(spec, inp3)
    print("w4a4 tiny block x 0xFE weights", spec, r["verdict"], str(r.get("reason"))[:150])
