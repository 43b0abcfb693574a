"""Channel-wise MoE experts keep one w2 group over I whatever I and K are (docs/formats/moe.md).

Before the fix the suite built and declared w2 with group min(K, I), so a channel-wise case with
I > K and I not a multiple of K (found by the nightly property tier: I=96, K=64) could not even be
built, and one with I a multiple of K was silently grouped.
"""

import numpy as np
import pytest

from backends.registry import create
from conformance.judge.acceptance import declared_interval
from conformance.cases.inputs import make_inputs
from conformance.run.runner import judge
from emulator.schemes import Case


@pytest.mark.parametrize("I,K", [(96, 64), (64, 32), (32, 128), (64, 64)])
def test_channelwise_moe_w2_is_one_group_and_the_emulator_passes(I, K):
    case = Case("w4a16-moe", "gptq", M=3, N=I, K=K, group_size=-1, E=2, top_k=1, act_dtype="bfloat16",
                scale_dtype="float16")
    inp = make_inputs(case, 0)
    assert inp.tensors["w2_scales"].shape == (2, 1, K)
    assert inp.tensors["w13_scales"].shape == (2, 1, 2 * I)
    b = create("emulator")
    d = b.declared(case)
    y = b.run(b.prepare(case, inp.tensors), inp.x, bias=None, router_logits=inp.router_logits)
    rec = judge(inp, declared_interval(inp, d), np.asarray(y, np.float32), d).record()
    assert rec["verdict"] == "pass", rec["reason"]


def test_grouped_moe_w2_group_is_capped_at_I():
    assert Case("w4a16-moe", "gptq", M=1, N=32, K=128, group_size=64, E=2, top_k=1).moe_w2_group_size == 32
    assert Case("w4a16-moe", "gptq", M=1, N=128, K=128, group_size=64, E=2, top_k=1).moe_w2_group_size == 64
    assert Case("w4a16-moe", "gptq", M=1, N=96, K=64, group_size=-1, E=2, top_k=1).moe_w2_group_size == -1
