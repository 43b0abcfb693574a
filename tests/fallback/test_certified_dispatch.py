"""Certified dispatch (qconform_torch/certified.py, docs/fallback.md#certified-dispatch): with certification
bundles, ``auto`` runs a layer only on a backend certified on this host for the layer's case family, the
fastest of them, else the emulator. The bundles are real ``qconform certify`` runs of this host's kernels."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from backends.base import Case  # noqa: E402
from backends.registry import create  # noqa: E402
from conformance.certify import certify  # noqa: E402
from conformance.cli.main import main as qconform  # noqa: E402
from emulator.checkpoint import Checkpoint  # noqa: E402
from emulator.layers import linear_layer  # noqa: E402
from emulator.synthetic import write_checkpoint  # noqa: E402
from emulator.tensorfile import load_tensors, save_tensors  # noqa: E402
from qconform_torch import QuantLinear, op  # noqa: E402
from conformance.certify import CertificationError, CertificationStore  # noqa: E402


def _have(name: str) -> bool:
    return create(name).availability().available


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """torch-cpu (and zentorch where installed) certified on the smoke profile's W8A8 cases, on this host."""
    if not _have("torch-cpu"):
        pytest.skip("torch-cpu unavailable")
    # auto (the dispatcher) is certified too: a bundle may hold it, the store must never offer it
    names = ["torch-cpu", "auto"] + (["zentorch"] if _have("zentorch") else [])
    out = tmp_path_factory.mktemp("cert") / "b"
    res = certify(names, out, profile="smoke", schemes=["w8a8"], jobs=2)
    assert res.ok, "the W8A8 smoke certification of this host's kernels failed"
    return out


@pytest.fixture
def w8a8_layer(tmp_path):
    """A W8A8 layer with float32 weight scales (the synthetic writer's fp16 scales, widened exactly): the
    smoke profile certifies W8A8 with bf16 and fp32 scales."""
    write_checkpoint(tmp_path / "c", "ct-w8a8-int8", n=64, k=128)  # K = 128: certified at every smoke shape
    path = tmp_path / "c" / "model.safetensors"
    t = load_tensors(path)
    t = {k: (v.data.astype(np.float32) if k.endswith("weight_scale") else v) for k, v in t.items()}
    save_tensors(path, t)
    ck = Checkpoint(tmp_path / "c")
    return ck, ck.layers()[0]


@pytest.fixture(autouse=True)
def _no_certifications():
    op.use_certifications(None)
    yield
    op.use_certifications(None)


def _certify_op(bundle):
    op.use_certifications(CertificationStore([bundle]))


def _case(**kw) -> Case:
    base = dict(scheme="w8a8", weight_format="ct-int-quantized", M=4, N=64, K=128, group_size=-1, act_dtype="bfloat16",
                scale_dtype="bfloat16", bits=8)  # a checkpoint layer says 8; the suite's cases leave the default
    return Case(**{**base, **kw})


def test_store_certifies_a_passed_family_and_nothing_else(bundle):
    store = CertificationStore([bundle])
    version = create("torch-cpu").availability().version
    assert store.why_not("torch-cpu", version, _case()) is None
    assert store.why_not("torch-cpu", version, _case(M=64, N=4096)) is None  # M and N are not the family
    why = store.why_not("torch-cpu", version, _case(act_dtype="float32"))
    assert why and "no case of this family" in why
    assert "(nearest certified: act_dtype " in why and ", not float32)" in why  # the --dtype mismatch, named
    why = store.why_not("torch-cpu", "0.0.0", _case())
    assert why and "certified version" in why and "installed 0.0.0" in why
    assert "no certification on this host" in store.why_not("ark", None, _case())


def test_a_failed_case_withholds_its_family(bundle, tmp_path):
    """One result of the family turned into a fail (and the bundle re-derived as the suite would write it
    is not possible without the judging code, so the store is read through its parsing only): the family
    is withheld, other families are not."""
    store = CertificationStore([bundle])
    cert = store.certs["torch-cpu"][0]
    key = next(iter(cert.families))
    cert.families[key].withheld.append(("some/case", "fail"))
    from conformance.certify.dispatch import family_key

    case_json = json.loads(key)
    case = Case(**{**case_json, "M": 2, "N": 64, "K": 256})
    assert family_key(case.to_json()) == key
    why = store.why_not("torch-cpu", cert.version, case)
    assert why and "did not pass" in why and "fail: some/case" in why


def test_another_host_certifies_nothing(bundle):
    from conformance.run.provenance import environment

    env = dict(environment(), cpu="AMD EPYC 9B45 (another host)")
    store = CertificationStore([bundle], here=env)
    why = store.why_not("torch-cpu", create("torch-cpu").availability().version, _case())
    assert why and "another host" in why and "cpu" in why


def test_a_tampered_or_missing_bundle_is_an_error(bundle, tmp_path):
    with pytest.raises(CertificationError, match="not a folder"):
        CertificationStore([tmp_path / "missing"])
    bad = tmp_path / "bad"
    shutil.copytree(bundle, bad)
    lines = (bad / "results.jsonl").read_text().splitlines()
    i = next(i for i, l in enumerate(lines) if '"verdict": "pass"' in l)
    lines[i] = lines[i].replace('"verdict": "pass"', '"verdict": "fail"')  # claims a different verdict
    (bad / "results.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(CertificationError, match="does not verify"):
        CertificationStore([bad])


def test_the_op_runs_a_certified_kernel_and_logs_why(bundle, w8a8_layer, caplog):
    ck, info = w8a8_layer
    _certify_op(bundle)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((4, 128)).astype(np.float32)).to(torch.bfloat16)
    m = QuantLinear.from_checkpoint(ck, info.name, backend="auto")
    with caplog.at_level(logging.INFO, logger="qconform.fallback"):
        y = m(x)
    line = " ".join(op.selection_lines(m.spec))
    assert "[certified on this host]" in line or "[fastest certified on this host" in line, line
    chosen = line.split("-> ", 1)[1].split(" ", 1)[0]
    # the certified kernels are timed against the emulator's fast path: the fastest of them runs
    assert chosen in ("torch-cpu", "zentorch", "emulator"), line
    assert "torch-cpu " in line.split("timed at M = 4: ", 1)[1], line
    assert "no certification bundle given for it" in line  # e.g. ark, vllm-cpu: never considered
    # the certified kernel's answer is within its declared interval of the reference (a W8A8 kernel rounds
    # its own way): here simply close to the canonical reference
    ref = linear_layer(ck, info, x.float().numpy(), out_dtype="bfloat16").y
    assert np.abs(y.float().numpy() - ref).max() <= 0.05 * np.abs(ref).max()


def test_an_uncertified_family_runs_the_emulator(bundle, w8a8_layer):
    """float32 activations: no W8A8 case of the smoke profile has them, so no kernel is certified for
    the layer; the reference answers, bit for bit, and the log says why."""
    ck, info = w8a8_layer
    _certify_op(bundle)
    # this call's own line: a layer's line is logged once per chosen backend, and an earlier test of the same
    # layer description may have chosen the emulator fast path already (whichever timed fastest there)
    op.clear_selections()
    x = np.random.default_rng(1).standard_normal((3, 128)).astype(np.float32)
    m = QuantLinear.from_checkpoint(ck, info.name, backend="auto")
    y = m(torch.from_numpy(x)).numpy()
    line = " ".join(op.selection_lines(m.spec))
    # the emulator backend's W8A8 fast path accumulates int8 products exactly (its declaration says so)
    assert "-> emulator fast path (exact accumulation; --backend emulator is the reference) " \
           "[no backend certified for this case on this host]" in line, line
    assert "no case of this family" in line
    ref = linear_layer(ck, info, x, out_dtype="float32").y.astype(np.float32)
    assert np.abs(y - ref).max() <= 1e-6 * np.abs(ref).max()  # the emulator backend's fp32 fast path


def test_the_fastest_of_several_certified_kernels_is_timed_and_logged(bundle, w8a8_layer):
    if not _have("zentorch"):
        pytest.skip("zentorch is not installed: only one certified W8A8 kernel here")
    ck, info = w8a8_layer
    _certify_op(bundle)
    op.clear_selections()  # this call's own line (logged once per layer and chosen backend: see above)
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((4, 128)).astype(np.float32)).to(torch.bfloat16)
    m = QuantLinear.from_checkpoint(ck, info.name, backend="auto")
    m(x)
    line = " ".join(op.selection_lines(m.spec))
    assert "fastest certified on this host or the fast path for M in 3..4, timed at M = 4: " in line, line
    assert "torch-cpu" in line and "zentorch" in line and " ms" in line


def test_cli_refuses_a_bad_bundle_in_one_line(tmp_path, w8a8_layer, capsys):
    rc = qconform(["model", str(tmp_path), "--tokens", "1,2", "--certified", str(tmp_path / "nope"),
                   "-o", str(tmp_path / "o.safetensors")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "not a folder" in err[0], err


def test_qconform_model_with_certified_dispatch_end_to_end(bundle, tmp_path, capsys):
    """A checkpoint llm-compressor wrote (W8A8, bf16 scales), run in bf16 with the bundle: every layer on a
    certified kernel, logits within the model-level rule of the reference forward (--check)."""
    pytest.importorskip("transformers")
    from pathlib import Path

    ckpt = Path(__file__).resolve().parents[1] / "data" / "toolkit_checkpoints" / "llmcompressor-w8a8-int8"
    out = tmp_path / "o.safetensors"
    rc = qconform(["model", str(ckpt), "--tokens", "1,2,3", "--dtype", "bfloat16", "--certified", str(bundle),
                   "--check", "-o", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    layer_lines = [l for l in text.splitlines() if "ct-int-quantized ->" in l]
    assert len(layer_lines) == 7, text  # q, k, v, o, gate, up, down
    # each layer: a certified kernel or the fast path, whichever measured fastest, never the exact reference
    assert all("fastest certified on this host" in l and "-> emulator reference" not in l for l in layer_lines), text
    assert "within the model-level rule" in text
    assert load_tensors(out)["logits"].data.shape == (3, 128)


def test_the_dispatcher_and_the_emulator_are_never_candidates(bundle):
    store = CertificationStore([bundle])
    assert "auto" not in store.labels() and "emulator" not in store.labels()
    assert "torch-cpu" in store.labels()
    assert "no certification on this host" in store.why_not("auto", None, _case())


def test_no_extrapolation_beyond_the_certified_k(bundle):
    store = CertificationStore([bundle])
    version = create("torch-cpu").availability().version
    why = store.why_not("torch-cpu", version, _case(K=4096))
    assert why and "up to K = " in why and "this layer has K = 4096" in why


def test_a_fail_in_any_bundle_withholds_the_family(bundle, tmp_path):
    other = tmp_path / "copy"
    shutil.copytree(bundle, other)
    for order in ([bundle, other], [other, bundle]):
        store = CertificationStore(order)
        version = create("torch-cpu").availability().version
        assert store.why_not("torch-cpu", version, _case()) is None
        from conformance.certify.dispatch import family_key

        bad = next(c for c in store.certs["torch-cpu"] if c.bundle == str(other))
        bad.families[family_key(_case().to_json())].withheld.append(("x/case", "crash"))
        why = store.why_not("torch-cpu", version, _case())
        assert why and "did not pass" in why and "crash: x/case" in why, order


def test_a_partial_certification_is_refused(tmp_path):
    out = tmp_path / "part"
    certify(["torch-cpu"], out, profile="smoke", schemes=["w8a8"], tiers=["exact"], jobs=1)
    with pytest.raises(CertificationError, match="partial certification"):
        CertificationStore([out])


def test_an_int32_accumulator_that_can_wrap_is_never_dispatched():
    from backends.registry import refusal

    b = create("torch-cpu")
    assert refusal(b, _case(K=4096)) is None
    why = refusal(b, _case(K=1 << 17))
    assert why and "int32 accumulator can wrap" in why


def test_another_cpu_count_is_another_host(bundle):
    from conformance.run.provenance import environment

    env = environment()
    store = CertificationStore([bundle], here=dict(env, cpu_count=(env.get("cpu_count") or 1) * 8))
    assert "another host" in store.why_not("torch-cpu", create("torch-cpu").availability().version, _case())


def test_cli_certified_env_and_empty_paths_are_usage_errors(tmp_path, capsys, monkeypatch):
    o = str(tmp_path / "o.safetensors")
    assert qconform(["model", str(tmp_path), "--tokens", "1", "--certified", "", "-o", o]) == 2
    assert "empty path" in capsys.readouterr().err
    monkeypatch.setenv("QCONFORM_CERTIFIED", ":")
    assert qconform(["model", str(tmp_path), "--tokens", "1", "-o", o]) == 2
    assert "names no bundle folder" in capsys.readouterr().err
    monkeypatch.setenv("QCONFORM_CERTIFIED", str(tmp_path))
    assert qconform(["model", str(tmp_path), "--tokens", "1", "--backend", "emulator", "-o", o]) == 2
    assert "QCONFORM_CERTIFIED applies to --backend auto" in capsys.readouterr().err
