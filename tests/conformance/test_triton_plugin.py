"""The Triton W4A16 example plugin (examples/triton-w4a16) needs a CUDA GPU: CI skips it.

Its certification on an H100 is recorded in examples/triton-w4a16/README.md and
docs/fingerprints.md (run with examples/triton-w4a16/device_certify.sh). Here: on a CUDA machine,
a small certification subset through the adapter; everywhere, the adapter's refusals.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "triton-w4a16"))


def _cuda_reason() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (the Triton W4A16 plugin needs a CUDA GPU; certified on H100, see " \
               "examples/triton-w4a16/README.md)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (the Triton W4A16 plugin is certified on H100: examples/triton-w4a16/README.md)"
    return None


def test_adapter_refuses_what_the_kernel_does_not_do():
    from backends.base import Case
    from qconform_triton_w4a16.backend import TritonW4A16Backend

    b = TritonW4A16Backend()
    av = b.availability()
    if _cuda_reason():
        assert not av.available and av.reason
    assert not b.can_implement(Case("w4a16", "awq", 1, 64, 128, group_size=32, sym=False))
    assert "TF32" in b.can_implement(Case("w4a16", "gptq", 1, 64, 128, group_size=32, act_dtype="float32")).reason
    assert b.can_implement(Case("w4a16", "gptq", 1, 64, 128, group_size=32, act_order=True, zero_convention="v1"))
    d = b.declared(Case("w4a16", "gptq", 1, 64, 128, group_size=32, act_dtype="float16"))
    assert d.weight_dtype == "float16" and d.accumulate == "float32"


@pytest.mark.skipif(_cuda_reason() is not None, reason=str(_cuda_reason()))
def test_triton_plugin_passes_a_certification_subset(tmp_path, monkeypatch):
    from conformance.run.runner import Runner
    from conformance.cases.suite import case_list

    monkeypatch.setenv("QCONFORM_EXTRA_BACKENDS", "triton-w4a16=qconform_triton_w4a16.backend:TritonW4A16Backend")
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "examples" / "triton-w4a16"))
    specs = [s for s in case_list(schemes=["w4a16"], profile="smoke") if s.case.weight_format == "gptq"]
    res = Runner(tmp_path, timeout=300, progress=False).run(["triton-w4a16"], specs)
    verdicts = {r["verdict"] for r in res}
    assert verdicts <= {"pass", "mistrusted", "unsupported"}, [r for r in res if r["verdict"] not in verdicts]
    assert any(r["verdict"] == "pass" for r in res)
