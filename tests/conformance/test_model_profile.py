"""The model profile (docs/conformance.md#model-profile) and the run's shared references
(docs/conformance.md#reference-sharing, conformance/run/refcache.py)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from backends.base import Declared
from conformance.judge.acceptance import grid_neighbour, declared_interval, round_down, round_up
from emulator.numerics.fast_round import round_fast
from conformance.run.refcache import ReferenceCache, inputs_digest
from conformance.run.runner import Runner
from conformance.cases.suite import case_list, list_hash
from emulator.declaration import canonical_declaration
from emulator.numerics.floats import decode, encode, format_of, round_to_dtype
from emulator.numerics.rounding import Rounding

# --- published configurations (the checkpoints' config.json on the Hugging Face Hub), written here from
# those files, not from conformance/cases/model_profile.py:
# meta-llama/Meta-Llama-3-8B: hidden_size 4096, intermediate_size 14336, num_attention_heads 32,
# num_key_value_heads 8 (head_dim 128: k/v project to 8 * 128 = 1024)
LLAMA3_8B = {(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)}
# Qwen/Qwen1.5-MoE-A2.7B-Chat-GPTQ-Int4: hidden_size 2048, moe_intermediate_size 1408, num_experts 60,
# num_experts_per_tok 4; quantization_config bits 4, group_size 128, sym true
QWEN_MOE = {"N": 1408, "K": 2048, "E": 60, "top_k": 4, "group_size": 128}
# openai/gpt-oss-20b: hidden_size 2880, intermediate_size 2880, num_local_experts 32, experts_per_token 4,
# quantization_config quant_method mxfp4 (block 32): gate_up_proj 2 * 2880 x 2880, down_proj 2880 x 2880
GPT_OSS_20B = {(5760, 2880), (2880, 2880)}
MODEL_M = {1, 16, 128, 512}


@pytest.fixture(scope="module")
def model_specs():
    return case_list(profile="model")


def _shapes(specs, scheme):
    return {(s.case.N, s.case.K) for s in specs if s.case.scheme == scheme}


def test_llama_shapes_are_the_published_ones(model_specs):
    for scheme in ("w4a16", "w8a8"):
        assert _shapes(model_specs, scheme) == LLAMA3_8B, scheme
        for nk in LLAMA3_8B:
            assert {s.case.M for s in model_specs if s.case.scheme == scheme and (s.case.N, s.case.K) == nk} == MODEL_M


def test_moe_block_is_qwen15_moe(model_specs):
    moe = [s.case for s in model_specs if s.case.scheme == "w4a16-moe"]
    assert {c.M for c in moe} == {1, 16, 128, 512}  # the M set, as for every layer
    for c in moe:
        assert (c.N, c.K, c.E, c.top_k, c.group_size, c.weight_format, c.sym) == (
            QWEN_MOE["N"], QWEN_MOE["K"], QWEN_MOE["E"], QWEN_MOE["top_k"], QWEN_MOE["group_size"], "gptq", True)


def test_gpt_oss_experts_are_mxfp4_at_the_published_shapes(model_specs):
    mx = [s.case for s in model_specs if s.case.weight_format == "ct-mxfp4"]
    assert {(c.N, c.K) for c in mx} == GPT_OSS_20B
    assert {c.group_size for c in mx} == {32} and {c.M for c in mx} == MODEL_M


def test_model_profile_is_its_own_case_list(model_specs):
    assert len(model_specs) == len({s.case_id for s in model_specs}) == 44
    assert {s.generator for s in model_specs} == {"layer-codes"}
    # the tiers filter it; a tier it has no case of is an empty selection, not the default grid
    assert case_list(profile="model", tiers=("exact", "edge")) == []
    assert list_hash(case_list(profile="model")) == list_hash(model_specs)  # derandomised


def test_layer_codes_are_valid_checkpoints_of_their_format(model_specs):
    """The packed draws decode: the canonical reference reads them (k/v, the smallest Llama layer, at M=1)."""
    for scheme in ("w4a16", "w8a8"):
        spec = next(s for s in model_specs if s.case.scheme == scheme and s.case.M == 1 and s.case.N == 1024)
        inp = spec.inputs()
        iv = declared_interval(inp, canonical_declaration(spec.case, accumulate="float32"))
        assert iv.y_exact.shape == (1, 1024) and np.isfinite(iv.y_exact).all()
        assert np.unique(iv.y_ref).size > 500  # not degenerate
        assert inputs_digest(spec.inputs()) == inputs_digest(inp)  # a pure function of (case, seed)


# --- the fast roundings of the acceptance intervals equal the specification (round_to_dtype) --------
def _values():
    rng = np.random.default_rng(7)
    parts = [rng.standard_normal(4000) * 10.0 ** rng.integers(-45, 40, 4000),
             rng.integers(-2 ** 20, 2 ** 20, 4000) * 2.0 ** rng.integers(-160, 140, 4000),
             np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 3.4028234663852886e38, 1e300, -1e300,
                       5.960464477539063e-08, 2.98e-08, 1.401298464324817e-45, 7e-46, 9.18354961579912e-41])]
    for dt in ("float32", "float16", "bfloat16"):
        fmt = format_of(dt)
        g = round_to_dtype(rng.standard_normal(2000) * 10.0 ** rng.integers(-8, 5, 2000), dt)
        nb = decode(encode(g, fmt).astype(np.uint64) + 1, fmt)
        parts += [g, (g + nb) / 2, np.nextafter(g, np.inf), np.nextafter(g, -np.inf)]  # grid, ties, neighbours
    return np.concatenate(parts)


def _same(a, b):
    return ((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_fast_roundings_equal_round_to_dtype(dtype):
    v = _values()
    for mode in (Rounding.RNE, Rounding.RTZ):
        assert _same(round_fast(v, dtype, mode, as_float64=True), round_to_dtype(v, dtype, mode)).all(), mode
    fmt = format_of(dtype)
    t = round_to_dtype(v, dtype, Rounding.RTZ)
    bits = encode(t, fmt).astype(np.int64)
    for toward in (np.inf, -np.inf):
        # the neighbour by the bit pattern (sign-magnitude: away from zero +1, toward zero -1, zero crosses)
        sign_bit = 1 << (fmt.bits - 1)
        neg, mag = (bits & sign_bit) != 0, bits & (sign_bit - 1)
        away = np.where(neg, toward < 0, toward > 0)
        new = np.where(mag == 0, (0 if toward > 0 else sign_bit) | 1,
                       (bits & sign_bit) | np.where(away, mag + 1, mag - 1))
        want = np.where(np.isfinite(t), decode(new.astype(np.uint64), fmt), t)
        assert _same(grid_neighbour(t, dtype, toward), want).all()
    fin = np.isfinite(v)
    assert (round_down(v, dtype)[fin] <= v[fin]).all() and (round_up(v, dtype)[fin] >= v[fin]).all()


def test_float32_lowest_bits_equal_the_float64_rule():
    """emulator/linear.py reads the lowest set bit of float32 weights in uint32 arithmetic: every bit class."""
    from emulator.linear import lowest_bit_exponent, row_min_lowest_bit

    rng = np.random.default_rng(3)
    v = np.concatenate([rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
                        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 2.0 ** -149, 1.1754942e-38, 3.0, 2.0 ** 127],
                                 np.float32),
                        (rng.integers(-16, 16, 20_000) * rng.standard_normal(20_000)).astype(np.float32)])
    v = v[: v.size // 50 * 50].reshape(-1, 50)
    with np.errstate(invalid="ignore"):
        want = lowest_bit_exponent(v.astype(np.float64)).min(axis=1)
    assert np.array_equal(row_min_lowest_bit(v), want)


# --- the reference cache ----------------------------------------------------------------------------
@pytest.fixture()
def small_case():
    spec = next(s for s in case_list(profile="ci") if s.case.scheme == "w4a16" and s.tier == "random")
    return spec, Declared(variants={}, accumulate="float32", output=spec.case.output_dtype)


def _equal_interval(a, b):
    return all(np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True) for f in ("y_ref", "y_exact", "lo", "hi",
                                                                                        "bound"))


def test_cache_reuses_only_the_same_inputs_and_declaration(tmp_path, small_case):
    spec, decl = small_case
    cache = ReferenceCache(tmp_path)
    inp, path, digest = cache.inputs(spec)
    first = cache.interval(inp, decl)
    again = cache.interval(inp, dataclasses.replace(decl, notes="another backend, same arithmetic"))
    assert cache.stats["intervals_computed"] == 1 and cache.stats["intervals_reused"] == 1
    assert _equal_interval(first, again)
    # the same case with other activations: never the cached interval (this fails if the key were the case)
    other = dataclasses.replace(inp, x=(inp.x * 2).astype(np.float32))
    iv_other = cache.interval(other, decl)
    assert cache.stats["intervals_computed"] == 2
    assert _equal_interval(iv_other, declared_interval(other, decl))
    assert not np.array_equal(iv_other.y_exact, first.y_exact)
    # ... and another declaration of the same inputs is its own interval
    rtz = dataclasses.replace(decl, output_rounding="rtz")
    assert _equal_interval(cache.interval(inp, rtz), declared_interval(inp, rtz))
    assert cache.stats["intervals_computed"] == 3
    cache.close()
    assert not cache.folder.exists()


def test_cache_rejects_a_corrupt_or_foreign_file(tmp_path, small_case):
    spec, decl = small_case
    cache = ReferenceCache(tmp_path)
    inp, _, _ = cache.inputs(spec)
    good = cache.interval(inp, decl)
    (ref,) = cache.folder.glob("ref-*.safetensors")
    data = bytearray(ref.read_bytes())
    data[-9] ^= 0x40  # one bit of the last array: the file's arrays digest no longer matches
    ref.write_bytes(bytes(data))
    assert _equal_interval(cache.interval(inp, decl), good)
    assert cache.stats["rejected"] == 1 and cache.stats["intervals_reused"] == 0
    # a file of other inputs put under this key's name: its metadata names other inputs, so it is not used
    other = dataclasses.replace(inp, x=(inp.x * 2).astype(np.float32))
    cache.interval(other, decl)
    (foreign,) = [p for p in cache.folder.glob("ref-*.safetensors") if p != ref]
    foreign.replace(ref)
    assert _equal_interval(cache.interval(inp, decl), good)
    assert cache.stats["rejected"] == 2


def test_cache_redraws_inputs_whose_file_changed(tmp_path, small_case):
    spec, _ = small_case
    cache = ReferenceCache(tmp_path)
    inp, path, digest = cache.inputs(spec)
    again, path2, digest2 = cache.inputs(spec)
    assert (path2, digest2) == (path, digest) and cache.stats["inputs_reused"] == 1
    from conformance.cases.bundle import ReplayBundle, save_bundle

    tampered = dataclasses.replace(inp, x=(inp.x + 1).astype(np.float32))
    save_bundle(path, ReplayBundle(tampered, spec.to_json(), reason="inputs"))
    redrawn, _, digest3 = cache.inputs(spec)
    assert digest3 == digest and np.array_equal(redrawn.x, inp.x) and cache.stats["rejected"] == 1


# --- a judged subset of the model profile ----------------------------------------------------------
def test_model_subset_runs_and_shares_its_references(tmp_path):
    """k/v (1024 x 4096) at M=1, W4A16 and W8A8, on two backends (the emulator's fast and exact paths): every
    output judged inside its interval, inputs drawn once per case for both backends."""

    specs = [s for s in case_list(profile="model") if s.case.M == 1 and s.case.N == 1024]
    backends = ["emulator", "emulator:path=exact"]  # two backends, no torch start-up (CI time)
    runner = Runner(tmp_path, timeout=300, progress=False)
    results = runner.run(backends, specs)
    assert len(results) == len(specs) * len(backends)
    for r in results:
        assert r["verdict"] in ("pass", "unsupported"), (r["backend"], r["case_id"], r["verdict"], r["reason"])
    assert sum(r["verdict"] == "pass" for r in results) >= len(specs)
    lines = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert {x["case_id"] for x in lines if x.get("kind") == "result"} == {s.case_id for s in specs}
    judged = sum(r["verdict"] == "pass" for r in results)
    stats = runner.ref_stats
    assert stats["inputs_drawn"] == len(specs)  # once per case, whatever the number of backends
    assert stats["inputs_drawn"] + stats["inputs_reused"] == judged
    assert not (tmp_path / ".work").exists()  # the run's shared files go with it


def test_worker_refuses_inputs_other_than_the_judged_ones(tmp_path, small_case):
    """The worker runs shared inputs only when their SHA-256 is the one the runner judges against."""
    from conformance.run.workerproc import WorkerProcess

    spec, _ = small_case
    cache = ReferenceCache(tmp_path)
    inp, path, digest = cache.inputs(spec)
    w = WorkerProcess("emulator")
    try:
        ok = w.request({"op": "run", "bundle": str(path), "inputs_sha256": digest, "out": str(tmp_path / "y.st")},
                       timeout=120)
        bad = w.request({"op": "run", "bundle": str(path), "inputs_sha256": "0" * 64, "out": str(tmp_path / "z.st")},
                        timeout=120)
    finally:
        w.close()
    assert ok.get("ok") is True
    assert bad.get("ok") is False and "sha256 mismatch" in bad.get("error", "")
    assert not (tmp_path / "z.st").exists()
