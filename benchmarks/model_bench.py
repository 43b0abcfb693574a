"""Model-level benchmark (issue 25): a whole forward pass of a small random Llama quantized three ways, on every
path the fallback offers and the toolkits' own CPU paths, timed alternately, best of N.

Run: ``qconform bench --model [--hidden 1024] [--layers 4] [--threads N] [--formats ...] [--json FILE]``
(docs/performance.md#model-level). ``--threads 1`` runs every contender on one thread and times the process's
CPU time: on a shared host that measures each contender's work, where wall times measure its share of the cores.

The bench writes its own checkpoints (project-written: emulator/formats quantizers from seeded random
fp32 weights): compressed-tensors W4A16 (pack-quantized, group 128, symmetric), GPTQ v1 (int4, group 128,
symmetric) and compressed-tensors W8A8 (int8 channel weights, dynamic per-token int8 activations). For
each, at T = 8 and T = 128 tokens, contenders (each a ``forward(tokens) -> logits`` on float32
activations):

- ``fast``: qconform_torch with ``--backend emulator:path=fast`` (the emulator backend's fast path: exactly
  dequantized weights through fp32 BLAS, W8A8 with its exact integer accumulator), cache budget large
  enough for the whole model (the fp32 weights are dequantized once, then kept);
- ``fast-streamed``: the same with ``--cache-mb`` of half the model's fp32 weights (the scan-resistant cache:
  qconform_torch/prepared_cache.py), its hit rate reported;
- ``auto``: ``--backend auto`` (the dispatcher's choice on this host); target: never slower than ``fast``
  (auto / fast <= 1.0 within ``AUTO_NOISE``, issue 25 item 1);
- ``exact``: ``--backend emulator`` (the canonical reference, exact);
- ``dense``: plain fp32 ``nn.Linear`` of the exactly dequantized weights (``dense_reference_model``);
- ``toolkit``: transformers + compressed-tensors' own CPU forward (CT checkpoints), or auto-round-lib's ARK
  kernel on every layer (GPTQ; through backends/ark.py, auto-round's own loader not being installed here);
  skipped with the reason where the library is missing, refuses, or returns logits of another model.

Every ratio is between contenders timed in the same loop on the same tokens. The projection of the exact
reference to 8B / 70B models uses its measured cost per weight on one 4096 x 4096 layer.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from emulator.numerics.sqnr import sqnr_db

FORMATS = ("ct-w4a16", "gptq", "ct-w8a8")
#: a toolkit contender whose logits are further than this from the dense forward of the same weights is not
#: timing the same model (W8A8's own activation quantization stays far above it)
TOOLKIT_FLOOR_DB = 20.0
HEADS, KV = 16, 4
#: issue 25 item 1: ``auto`` never slower than the fast path. Marked met where auto / fast <= 1 + AUTO_NOISE: the
#: noise of one ratio of best-of-N times of the same work (auto keeps the fast path on every layer where no kernel
#: beats it, so there the ratio measures the bench's noise and auto's per-call cost only: 0.99-1.08 in the quiet
#: run of docs/performance.md#model-level)
AUTO_NOISE = 0.10


def auto_missed(seconds: dict) -> bool | None:
    """Whether auto is slower than the fast path beyond AUTO_NOISE (None: one of them was not timed)."""
    if "auto" not in seconds or "fast" not in seconds:
        return None
    return seconds["auto"] / seconds["fast"] > 1 + AUTO_NOISE


def _qconfig(fmt: str) -> dict:
    if fmt == "gptq":
        return {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False,
                "checkpoint_format": "gptq"}
    if fmt == "ct-w8a8":
        weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}
        act = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
        f = "int-quantized"
    else:
        weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128,
                   "dynamic": False}
        act, f = None, "pack-quantized"
    return {"quant_method": "compressed-tensors", "format": f,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": act,
                                          "format": f}}, "ignore": ["lm_head"],
            "quantization_status": "compressed"}


def _quantized(fmt: str, name: str, w: np.ndarray) -> dict:
    from emulator.formats import compressed_tensors as ct
    from emulator.formats import gptq

    if fmt == "gptq":
        p = gptq.GptqParams(bits=4, group_size=128, sym=True, desc_act=False, zero_convention="gptq")
        t = gptq.quantize_gptq(w, p)
        return {f"{name}.qweight": t.qweight, f"{name}.qzeros": t.qzeros, f"{name}.scales": t.scales,
                f"{name}.g_idx": (np.arange(w.shape[1]) // 128).astype(np.int32)}
    if fmt == "ct-w8a8":
        t = ct.quantize_ct_int8(w)
        return {f"{name}.weight": t.weight, f"{name}.weight_scale": t.weight_scale}
    t = ct.quantize_ct_packed(w, ct.CtPackParams(num_bits=4, group_size=128, symmetric=True))
    return {f"{name}.weight_packed": t.weight_packed, f"{name}.weight_scale": t.weight_scale,
            f"{name}.weight_shape": np.asarray(t.weight_shape, dtype=np.int64)}


def write_llama(folder: Path, fmt: str, *, hidden: int, intermediate: int, layers: int, vocab: int,
                seed: int = 0) -> dict:
    """A random Llama checkpoint quantized as ``fmt`` (project-written); returns its sizes."""
    from emulator.tensorfile import save_tensors

    rng = np.random.default_rng(seed)
    H, I = hidden, intermediate  # noqa: N806
    hd = H // HEADS
    shapes = {"self_attn.q_proj": (H, H), "self_attn.k_proj": (KV * hd, H), "self_attn.v_proj": (KV * hd, H),
              "self_attn.o_proj": (H, H), "mlp.gate_proj": (I, H), "mlp.up_proj": (I, H), "mlp.down_proj": (H, I)}
    t: dict = {}
    weights = 0
    for layer in range(layers):
        for mod, (n, k) in shapes.items():
            w = (rng.standard_normal((n, k)) * (1.0 / np.sqrt(k))).astype(np.float16)
            t.update(_quantized(fmt, f"model.layers.{layer}.{mod}", w))
            weights += n * k
        for norm in ("input_layernorm", "post_attention_layernorm"):
            t[f"model.layers.{layer}.{norm}.weight"] = np.ones(H, np.float16)
    t["model.norm.weight"] = np.ones(H, np.float16)
    t["model.embed_tokens.weight"] = (rng.standard_normal((vocab, H)) * 0.02).astype(np.float16)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": I,
           "num_hidden_layers": layers, "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": hd,
           "vocab_size": vocab, "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "hidden_act": "silu",
           "tie_word_embeddings": True, "rope_theta": 10000.0, "torch_dtype": "float16",
           "quantization_config": _qconfig(fmt)}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    save_tensors(folder / "model.safetensors", t)
    return {"quantized_weights": weights, "fp32_MiB": 4 * weights / 2 ** 20}


def _qconform(folder: Path, backend: str, cache_mb: float):
    """forward(tokens) through qconform_torch with ``backend``; ``forward.cache_mb``: the budget it runs with."""
    import torch

    from qconform_torch.model import load_quantized_model

    model, _ = load_quantized_model(folder, backend=backend, dtype=torch.float32)

    def forward(tokens):
        with torch.no_grad():
            return model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].float().numpy()
    forward.cache_mb = cache_mb
    return forward


def _dense(folder: Path):
    import torch

    from qconform_torch.model import dense_reference_model

    model = dense_reference_model(folder, dtype=torch.float32)

    def forward(tokens):
        with torch.no_grad():
            return model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].float().numpy()
    return forward


def _toolkit(folder: Path, fmt: str):
    """(forward, name) of the toolkit's own CPU path, or (None, why not)."""
    import torch

    try:
        from transformers import AutoModelForCausalLM

        if fmt == "gptq":
            # auto-round's own loader (the `auto_round` package) is not installed here; its ARK kernel is
            # (auto-round-lib), run through the project's adapter (backends/ark.py) on every layer
            from backends.registry import create
            from qconform_torch import op

            av = create("ark").availability()
            if not av.available:
                return None, f"skipped: ark unavailable ({av.reason})"
            return _qconform(folder, "ark", op.DEFAULT_CACHE_MB), "ARK kernel (auto-round-lib, backends/ark.py)"
        else:
            import compressed_tensors  # noqa: F401

            model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
            name = "transformers + compressed-tensors"
    except Exception as e:  # noqa: BLE001 - an optional contender: skipped with the reason
        return None, f"skipped: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"

    def forward(tokens):
        with torch.no_grad():
            return model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].float().numpy()
    return forward, name


#: the clock of ``timed_rounds``: wall time, or the process's CPU time where every contender runs on one thread
_CLOCK = {"fn": time.perf_counter}


def thread_env(threads: int | None) -> dict:
    """Environment for a child whose BLAS and OpenMP pools must hold ``threads`` threads (read when they load)."""
    if not threads:
        return {}
    n = str(int(threads))
    return {"OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "MKL_NUM_THREADS": n}


def model_floor_db(fmt: str) -> float:
    """The model-level SQNR floor of a bench format (``qconform model --check``'s: docs/fallback.md#comparing-logits)."""
    from qconform_torch.cli import SQNR_FLOOR_DB

    return SQNR_FLOOR_DB["act-quantized" if fmt == "ct-w8a8" else "a16"]


def model_rule(fmt: str, logits: dict) -> dict:
    """Each contender's logits against the exact reference's under the model-level rule (docs/fallback.md#comparing-
    logits, ``qconform model --check``): SQNR at least the floor (80 dB with 16-bit activations, 30 dB where they
    are quantized) and, with 16-bit activations, the same argmax token at every position. {} without the exact
    contender."""
    ex = logits.get("exact")
    if ex is None:
        return {}
    a16 = fmt != "ct-w8a8"
    floor = model_floor_db(fmt)
    out = {}
    for k, v in logits.items():
        if k in ("exact", "dense"):
            continue
        db = sqnr_db(v, ex)
        argmax = bool(np.array_equal(v.argmax(axis=-1), ex.argmax(axis=-1)))
        out[k] = {"sqnr_db": db, "argmax_agrees": argmax, "within": bool(db >= floor and (argmax or not a16))}
    return {"floor_db": floor, "argmax_rule": a16, "contenders": out}


def check_auto(fmt: str, fns: dict, tokens, repeat: int, logits: dict, times: dict, per_round: dict) -> dict | None:
    """``auto`` as ``qconform model --check`` runs it (issue 25 item 1: "where a model-level check is asked for,
    never one below the floor"): where its logits are outside the model-level rule against the exact forward, every
    layer runs on the fast path again (FallbackOnly, as the check's re-run does), and that forward is auto's answer
    and time. Returns what the first forward measured (None: within the rule, nothing re-run)."""
    from qconform_torch import op

    first = (model_rule(fmt, logits).get("contenders") or {}).get("auto")
    if first is None or first["within"]:
        return None
    op.use_fast_path_only(f"the model-level check found auto's kernels {first['sqnr_db']:.1f} dB from the reference")
    op.clear_selections()
    try:
        again: dict = {}
        t = timed_rounds({"auto": fns["auto"]}, tokens, repeat, again)
        logits["auto"] = fns["auto"](tokens)
    finally:
        op.use_fast_path_only(None)
        op.clear_selections()
    out = {"first_seconds": times["auto"], "first_sqnr_db": first["sqnr_db"], "first_rounds": per_round["auto"]}
    times["auto"], per_round["auto"] = t["auto"], again["auto"]
    return out


def limit_threads(threads: int | None) -> None:
    """Run this process's contenders on ``threads`` threads: torch's intra-op pool, and (through the CPU affinity
    the emulator's row workers read: emulator/parallel.py) NumPy's; with 1, ``timed_rounds`` reads CPU time, which
    on a shared host measures the work rather than the share of the cores the process got."""
    if not threads:
        return
    import torch

    cpus = sorted(os.sched_getaffinity(0))[:threads]
    os.sched_setaffinity(0, cpus)
    torch.set_num_threads(threads)
    _CLOCK["fn"] = time.process_time if threads == 1 else time.perf_counter


def timed_rounds(fns: dict, tokens, repeat: int, rounds: dict | None = None) -> dict:
    """Best time of each contender over ``repeat`` rounds, contenders in turn within each round, the order rotated
    by one each round (a disturbance of the host then cannot fall on the same contender's slot in every round, nor
    can what the contender before it leaves behind). The op has one cache per process: a qconform contender first
    sets its own budget (which empties the cache) and runs once untimed (its cache filled as its own runs would
    leave it), then runs timed. ``rounds``: filled with each contender's time in every round."""
    from qconform_torch import op

    best = {k: float("inf") for k in fns}
    names = list(fns)
    for r in range(repeat):
        for k in names[r % len(names):] + names[:r % len(names)]:
            f = fns[k]
            mb = getattr(f, "cache_mb", None)
            if mb is not None:
                op.set_cache_budget(mb)
            f(tokens)
            clock = _CLOCK["fn"]
            t0 = clock()
            f(tokens)
            t = clock() - t0
            best[k] = min(best[k], t)
            if rounds is not None:
                rounds.setdefault(k, []).append(t)
    return {k: best[k] for k in fns}


def bench_model(fmt: str, hidden: int, layers: int, repeat: int, ts=(8, 128), contenders=None) -> dict:
    """One checkpoint format: every contender at each T (see the module docstring)."""
    from qconform_torch import op

    inter = int(hidden * 2.75) // 128 * 128
    with tempfile.TemporaryDirectory() as d:
        # auto measures its choices in this run: a host dispatch cache written by earlier runs (other code, another
        # load) would stand for a measurement this bench did not make
        saved = os.environ.get("QCONFORM_DISPATCH_CACHE")
        os.environ["QCONFORM_DISPATCH_CACHE"] = str(Path(d) / "dispatch")
        op.use_certifications(None)
        op.clear_selections()
        try:
            return _bench_in(d, fmt, hidden, inter, layers, repeat, ts, contenders)
        finally:
            if saved is None:
                os.environ.pop("QCONFORM_DISPATCH_CACHE", None)
            else:
                os.environ["QCONFORM_DISPATCH_CACHE"] = saved
            op.use_certifications(None)


def _bench_in(d: str, fmt: str, hidden: int, inter: int, layers: int, repeat: int, ts, contenders) -> dict:
    """``bench_model``'s body, in the temporary folder ``d``."""
    from qconform_torch import op

    folder = Path(d) / fmt
    sizes = write_llama(folder, fmt, hidden=hidden, intermediate=inter, layers=layers, vocab=8192)
    whole = sizes["fp32_MiB"] + 64
    fns = {"fast": _qconform(folder, "emulator:path=fast", whole),
           "fast-streamed": _qconform(folder, "emulator:path=fast", sizes["fp32_MiB"] / 2),
           "auto": _qconform(folder, "auto", op.DEFAULT_CACHE_MB),
           "exact": _qconform(folder, "emulator", op.DEFAULT_CACHE_MB),
           "dense": _dense(folder)}
    tk, tk_name = _toolkit(folder, fmt)
    if tk is not None:
        fns["toolkit"] = tk
    if contenders:
        fns = {k: v for k, v in fns.items() if k in contenders}
    rows = []
    rng = np.random.default_rng(1)
    # auto as `qconform model --check` runs it: no layer goes to a kernel already below the floor (with the check's
    # margin for 7 layers per block adding up) on its first input; check_auto then judges the whole forward
    op.use_floor(model_floor_db(fmt) + 10 * np.log10(7 * layers))
    for T in ts:
        tokens = [int(v) for v in rng.integers(0, 8192, T)]
        # the streamed contender's cache: one forward after a warm one, counted
        stats = None
        if "fast-streamed" in fns:
            op.set_cache_budget(fns["fast-streamed"].cache_mb)
            fns["fast-streamed"](tokens)
            before = op.cache_stats()
            fns["fast-streamed"](tokens)
            after = op.cache_stats()
            hits = after["hits"] - before["hits"]
            calls = hits + after["misses"] - before["misses"]
            stats = {"hits": hits, "calls": calls, "hit_rate": hits / max(calls, 1),
                     "cached_MiB": after["used_bytes"] / 2 ** 20, "budget_MiB": after["budget_bytes"] / 2 ** 20}
        per_round: dict = {}
        times = timed_rounds(fns, tokens, repeat, per_round)
        logits = {}
        for k, f in fns.items():
            if getattr(f, "cache_mb", None) is not None:
                op.set_cache_budget(f.cache_mb)
            logits[k] = f(tokens)
        ref = logits.get("dense")
        if ref is not None and "toolkit" in logits and sqnr_db(logits["toolkit"], ref) < TOOLKIT_FLOOR_DB:
            # a toolkit that loaded something else (e.g. tensors it did not recognise, initialised at
            # random) is not a contender: its time would compare with a different model
            tk_name = (f"skipped: its logits are {sqnr_db(logits['toolkit'], ref):.1f} dB from the dense "
                       f"forward of the same weights (< {TOOLKIT_FLOOR_DB} dB): not the same model")
            fns.pop("toolkit")
            times.pop("toolkit")
            per_round.pop("toolkit", None)
        choices = sorted({line for ls in op.selections().values() for line in ls})[:6]
        checked = check_auto(fmt, fns, tokens, repeat, logits, times, per_round)
        rows.append({"T": T, "seconds": times, "seconds_per_round": per_round, "load": round(os.getloadavg()[0], 2),
                     "sqnr_db_vs_dense": ({k: sqnr_db(v, ref) for k, v in logits.items() if k != "dense"}
                                          if ref is not None else {}),
                     "model_rule": model_rule(fmt, logits), "auto_check": checked,
                     "streamed_cache": stats,
                     "auto_choices": choices})
    op.use_floor(None)
    return {"bench": "model", "clock": _CLOCK["fn"].__name__, "format": fmt, "hidden": hidden, "intermediate": inter, "layers": layers,
        "toolkit": tk_name, **sizes, "rows": rows}


def bench_projection(repeat: int) -> dict:
    """The exact reference's cost per weight on a 4096 x 4096 compressed-tensors W4A16 layer at T = 8 and 128
    (qconform_torch/exact_blocks.py, default budget, as the op runs it: NumPy's BLAS on the calling thread) against
    fp32 dense of the same layer (torch's linear, as the model's dense forward), projected to the quantized linears
    of Llama-3-8B (32 layers) and Llama-3-70B (80 layers). (A NumPy dense product before it left OpenBLAS's threads
    spinning through the reference's torch operations: 1.5-2x its time.)"""
    import torch

    from emulator.checkpoint import open_checkpoint
    from emulator.layers import dequantize_layer
    from emulator.parallel import single_threaded_blas
    from emulator.synthetic import write_checkpoint
    from qconform_torch.exact_blocks import exact_by_rows

    n = k = 4096
    per_model = {"Llama-3-8B": 32 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096),
                 "Llama-3-70B": 80 * (2 * 8192 * 8192 + 2 * 1024 * 8192 + 3 * 28672 * 8192)}
    out = {"bench": "projection", "layer": f"{n}x{k}", "rows": []}
    with tempfile.TemporaryDirectory() as d:
        write_checkpoint(d, "ct-w4a16-g32-sym", n=n, k=k)
        ck = open_checkpoint(d)
        info = ck.layers()[0]
        w = torch.from_numpy(dequantize_layer(ck, info))
        rng = np.random.default_rng(0)
        for T in (8, 128):
            x = rng.standard_normal((T, k)).astype(np.float32)
            best = [float("inf"), float("inf")]
            clock = _CLOCK["fn"]
            for _ in range(repeat):
                t0 = clock()
                with single_threaded_blas():
                    exact_by_rows(ck, info, x, "float32", 256 << 20)
                t1 = clock()
                _ = torch.nn.functional.linear(torch.from_numpy(x), w)
                t2 = clock()
                best = [min(best[0], t1 - t0), min(best[1], t2 - t1)]
            per_w = best[0] / (n * k)
            out["rows"].append({"T": T, "exact_seconds": best[0], "dense_seconds": best[1],
                                "exact_over_dense": best[0] / best[1],
                                "projected_seconds": {m: per_w * nw for m, nw in per_model.items()}})
    return out


def print_model(r: dict) -> None:
    if r.get("bench") == "projection":
        for x in r["rows"]:
            proj = ", ".join(f"{m} {s / 60:.1f} min" for m, s in x["projected_seconds"].items())
            print(f"projection {r['layer']} T={x['T']:<4d} exact {x['exact_seconds'] * 1e3:.1f} ms = "
                  f"x{x['exact_over_dense']:.1f} dense; projected exact forward: {proj}")
        return
    print(f"model     {r['format']:8s} hidden {r['hidden']}, {r['layers']} layers, fp32 {r['fp32_MiB']:.0f} MiB; "
          f"toolkit: {r['toolkit']}; threads {r.get('threads') or 'all'}, clock {r.get('clock', 'perf_counter')}")
    for x in r["rows"]:
        s = x["seconds"]
        parts = [f"{k} {v * 1e3:.0f} ms" for k, v in s.items()]
        ratios = []
        if "toolkit" in s:
            ratios.append(f"fast/toolkit x{s['fast'] / s['toolkit']:.2f} (target <= 1.2)"
                          + ("  MISSED" if s["fast"] / s["toolkit"] > 1.2 else ""))
        if auto_missed(s) is not None:
            ratios.append(f"auto/fast x{s['auto'] / s['fast']:.2f} (target <= 1.0, noise {AUTO_NOISE:.0%})"
                          + ("  MISSED" if auto_missed(s) else "  met"))
        if "exact" in s and "dense" in s:
            ratios.append(f"exact/dense x{s['exact'] / s['dense']:.1f} (target <= 4)"
                          + ("  MISSED" if s["exact"] / s["dense"] > 4 else ""))
        if "fast-streamed" in s:
            c = x["streamed_cache"]
            ratios.append(f"streamed/fast x{s['fast-streamed'] / s['fast']:.2f}, cache hit rate {c['hit_rate']:.2f} "
                          f"({c['hits']}/{c['calls']}, {c['cached_MiB']:.0f} of {c['budget_MiB']:.0f} MiB)")
        sq = ", ".join(f"{k} {v:.1f}" for k, v in x["sqnr_db_vs_dense"].items())
        print(f"  T={x['T']:<4d} {'; '.join(parts)}\n         {'; '.join(ratios)}\n         SQNR vs dense (dB): {sq}; "
              f"load {x['load']}")
        if x.get("auto_check"):
            c = x["auto_check"]
            print(f"         auto's first forward was {c['first_sqnr_db']:.1f} dB from the exact one ({c['first_seconds'] * 1e3:.0f} "
                  "ms), outside the model-level rule: re-run on the fast path as `qconform model --check` does")
        rule = x.get("model_rule") or {}
        if rule:
            cs = ", ".join(f"{k} {c['sqnr_db']:.1f}" + ("" if c["within"] else " outside" if k == "toolkit" else
                                                        " OUTSIDE") for k, c in rule["contenders"].items())
            print(f"         model-level rule vs exact (>= {rule['floor_db']:g} dB"
                  + (", same argmax" if rule["argmax_rule"] else "") + f"): {cs}")


def missed(results: list) -> list[str]:
    out = []
    for r in results:
        if r.get("bench") != "model":
            continue
        for x in r["rows"]:
            s = x["seconds"]
            if "toolkit" in s and s["fast"] / s["toolkit"] > 1.2:
                out.append(f"model {r['format']} T={x['T']} fast x{s['fast'] / s['toolkit']:.2f} of the toolkit (<= 1.2)")
            if auto_missed(s):
                out.append(f"model {r['format']} T={x['T']} auto x{s['auto'] / s['fast']:.2f} of the fast path "
                           f"(<= 1.0 within {AUTO_NOISE:.0%})")
            if "exact" in s and "dense" in s and s["exact"] / s["dense"] > 4:
                out.append(f"model {r['format']} T={x['T']} exact x{s['exact'] / s['dense']:.1f} of dense (<= 4)")
            rule = x.get("model_rule") or {}
            for k, c in rule.get("contenders", {}).items():
                # the toolkit is a timing contender, not a path qconform routes to: its distance is shown, not judged
                # (compressed-tensors' own W8A8 forward quantizes activations its own way: docs/backends.md)
                if not c["within"] and k != "toolkit":
                    out.append(f"model {r['format']} T={x['T']} {k} outside the model-level rule: {c['sqnr_db']:.1f} dB "
                               f"from the exact forward (>= {rule['floor_db']:g})"
                               + ("" if c["argmax_agrees"] else ", argmax differs"))
    return out
