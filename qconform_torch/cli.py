"""``qconform model``: one forward pass of a quantized checkpoint (wired into conformance/cli/main.py).

Semantics: docs/fallback.md#run-a-model.
"""

from __future__ import annotations

import os
import resource
import sys

import numpy as np

__all__ = ["register"]


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _require(module: str) -> None:
    """One line naming what is missing (a plain `pip install .` has neither torch nor transformers)."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        raise ValueError(f"qconform model needs {module}: pip install 'qconform[torch]' (torch==2.13.0, "
                         "transformers==5.24.0: the fallback's own extra)") from None


def cmd_model(args) -> int:
    _require("torch")
    _require("transformers")
    from . import op

    saved = op.certifier()
    try:
        return _model(args)
    finally:  # the command's dispatch settings end with it (an in-process caller keeps its own)
        op.use_floor(None)
        op.use_certifications(saved)


def _model(args) -> int:
    import torch

    from backends.registry import create
    from emulator.tensorfile import save_tensors

    from . import op
    from .model import forward_logits, load_quantized_model, parse_tokens

    if args.backend not in ("auto", "emulator"):
        create(args.backend)  # an unknown name or parameter: exit 2 now, not in the middle of the forward pass
    if args.cache_mb < 0:
        raise ValueError(f"--cache-mb must be >= 0, got {args.cache_mb}")
    op.set_cache_budget(args.cache_mb)
    if any(not p.strip() for p in args.certified):
        raise ValueError("--certified: an empty path (give a certification bundle folder)")
    env = os.environ.get("QCONFORM_CERTIFIED", "")
    bundles = args.certified or [p for p in env.split(os.pathsep) if p.strip()]
    if env and not args.certified and not bundles:
        raise ValueError(f"QCONFORM_CERTIFIED={env!r} names no bundle folder (unset it, or give folders "
                         f"separated by {os.pathsep!r})")
    if bundles:
        if args.backend != "auto":
            source = "--certified" if args.certified else "QCONFORM_CERTIFIED"
            raise ValueError(f"{source} applies to --backend auto (the dispatcher's choice), not to "
                             f"--backend {args.backend}")
        if args.certifier_factory is None:
            raise ValueError("--certified needs the conformance suite's certifier (run it as `qconform model`)")
    # this run's dispatch only: certifications (a bundle that does not verify: one line, exit 2) or none,
    # and a fresh selection log
    op.use_certifications(args.certifier_factory(bundles) if bundles else None)
    op.clear_selections()
    from backends.base import quiet_library_import

    dtype = getattr(torch, args.dtype)
    with quiet_library_import(python_warnings=False):  # transformers' quantizer registry imports torchao
        model, modules = load_quantized_model(args.checkpoint, backend=args.backend, dtype=dtype)
    tokens = parse_tokens(args.tokens, int(model.config.vocab_size))
    rule = _model_rule(args.checkpoint) if args.check else None
    if rule is not None and args.backend == "auto":
        # no layer goes to a kernel whose own output on its first input is already below the floor (with a
        # margin for the layers' errors adding up: 10 log10(layers) dB); the model-level check stays the judge
        op.use_floor(rule[1] + 10 * np.log10(max(rule[2], 1)))
    try:
        logits, seen = forward_logits(model, tokens, capture=modules if args.layers else None)
    except RuntimeError as e:  # a named backend that cannot run a layer: not the input's fault, no result
        print(f"qconform model: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    if not torch.isfinite(logits).all():
        print("qconform model: the forward pass produced non-finite logits; nothing written", file=sys.stderr)
        return 1
    ok = True
    if rule is not None:
        ok, logits, seen = _check(args, rule, model, modules, logits, seen, tokens, dtype)
    out = {"logits": np.ascontiguousarray(logits.numpy(), dtype=np.float32)}
    for name, calls in sorted(seen.items()):
        for i, (x, y) in enumerate(calls):
            tag = name if len(calls) == 1 else f"{name}#{i}"
            out[f"x.{tag}"] = np.ascontiguousarray(x.numpy(), np.float32)
            out[f"y.{tag}"] = np.ascontiguousarray(y.numpy(), np.float32)
    save_tensors(args.output, out, metadata={"producer": "qconform model", "checkpoint": str(args.checkpoint),
                                             "backend": args.backend, "dtype": args.dtype, "tokens": ",".join(map(str, tokens))})
    print(f"{args.checkpoint}: logits {list(logits.shape)} float32 -> {args.output}"
          + (f" (+ {len(seen)} quantized layers' x and y)" if args.layers else ""))
    print_choices(op.selections())
    st = op.cache_stats()
    print(f"cache: budget {st['budget_bytes'] / 2**20:g} MiB, peak {st['peak_bytes'] / 2**20:.2f} MiB, "
          f"{st['hits']} hits, {st['misses']} misses, {st['uncached']} layer(s) too large to cache; "
          f"peak RSS {_peak_rss_mib():.0f} MiB")
    if st["exact_calls"]:
        print(f"exact path: {st['exact_calls']} layer call(s), {st['exact_blocked']} by row blocks of at most "
              f"max(--cache-mb, 1 MiB) working set; {st['exact_ambiguous']} element(s) the float64 bound left "
              "undecided, decided from their exact value")
    return 0 if ok else 1


def _model_rule(checkpoint) -> tuple[bool, float, int]:
    """(activation-quantized?, the model-level SQNR floor, the number of quantized 2-D layers)."""
    from emulator.checkpoint import Checkpoint
    from emulator.layers import declared_activation

    layers = [l for l in Checkpoint(checkpoint).layers() if len(l.shape) == 2]
    act_quantized = any(declared_activation(l) != "a16" for l in layers)
    return act_quantized, SQNR_FLOOR_DB["act-quantized" if act_quantized else "a16"], len(layers)


def _check(args, rule, model, modules, logits, seen, tokens, dtype):
    """--check: the run's logits against the canonical reference forward (--backend emulator) under the
    model-level rule of docs/fallback.md#comparing-logits (SQNR floor; argmax agreement for A16). Under
    ``auto`` a run outside the rule is done again with every layer on the emulator's fast path, whose
    logits are then the answer (and are checked the same way). Returns (ok, logits, seen)."""
    from . import op
    from .model import forward_logits, load_quantized_model

    act_quantized, floor, _ = rule
    if args.backend == "emulator":
        print("check: --backend emulator is the reference itself; nothing to compare")
        return True, logits, seen
    ref, _ = forward_logits(load_quantized_model(args.checkpoint, backend="emulator", dtype=dtype)[0], tokens)

    def judge(lg, what):
        db = sqnr_db(lg.numpy(), ref.numpy())
        argmax_ok = act_quantized or bool((lg.argmax(dim=1) == ref.argmax(dim=1)).all())
        ok = db >= floor and argmax_ok
        print(f"check{what}: SQNR vs the reference forward {db:.1f} dB (floor {floor:g} dB for "
              f"{'activation-quantized' if act_quantized else '16-bit-activation'} checkpoints)"
              + ("" if act_quantized else f"; argmax {'agrees' if argmax_ok else 'DIFFERS'}")
              + f": {'within' if ok else 'OUTSIDE'} the model-level rule")
        return ok, db

    ok, db = judge(logits, "")
    if ok or args.backend != "auto":
        return ok, logits, seen
    op.use_fast_path_only(f"the model-level check found auto's kernels {db:.1f} dB from the reference, below "
                          f"its {floor:g} dB floor: every layer re-run on the emulator's fast path")
    op.clear_selections()
    logits, seen = forward_logits(model, tokens, capture=modules if args.layers else None)
    ok, _ = judge(logits, " (fast path re-run)")
    return ok, logits, seen


#: docs/fallback.md#comparing-logits
SQNR_FLOOR_DB = {"a16": 80.0, "act-quantized": 30.0}


def sqnr_db(y, ref) -> float:
    y64, r64 = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    err = float(((y64 - r64) ** 2).sum())
    return float("inf") if err == 0 else float(10 * np.log10(float((r64 ** 2).sum()) / err))


def print_choices(selections: dict) -> None:
    """Each layer's choice line; where every line skips the same backends for the same reasons, that list is
    printed once above them instead of on every layer (issue 22: a 600-character line per layer)."""
    rows = [(name, line) for name, lines in sorted(selections.items()) for line in lines]
    marker = " (skipped: "
    skips = {line.rpartition(marker)[2] for _, line in rows if marker in line}
    common = None
    if len(rows) > 1 and len(skips) == 1 and all(marker in line for _, line in rows):
        common = skips.pop()
        print(f"  every layer skipped: {common[:-1] if common.endswith(')') else common}")
    for name, line in rows:
        print(f"  {name}: {line.rpartition(marker)[0] if common is not None else line}")


def register(sub, services=None) -> None:
    """``qconform model``. ``services.certifier_factory(bundles)``: the certifier ``--certified`` builds (the suite
    passes conformance.certify.CertificationStore; qconform_torch itself never imports the suite)."""
    certifier_factory = getattr(services, "certifier_factory", None)
    s = sub.add_parser("model", help="one forward pass of a quantized HF checkpoint through qconform's op "
                                     "(logits [T, vocab] as safetensors tensor 'logits')")
    s.add_argument("checkpoint")
    s.add_argument("--tokens", required=True, help="comma-separated token ids, e.g. 1,2,3")
    s.add_argument("--backend", default="auto", metavar="auto|emulator|NAME",
                   help="auto: the dispatcher's choice per layer; emulator: the canonical reference forward")
    s.add_argument("--certified", action="append", default=[], metavar="BUNDLE",
                   help="certified dispatch: with --backend auto, a layer runs only on a backend this certification "
                        "bundle (qconform certify) certifies on this host for its case family, the fastest of them, "
                        "else the emulator; repeatable (docs/fallback.md#certified-dispatch; env QCONFORM_CERTIFIED)")
    s.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="the model's activation and plain-weight dtype (default float32); each quantized layer "
                        "sees activations of this dtype (and its Case says so: certified dispatch matches it)")
    s.add_argument("--cache-mb", type=float, default=256, help="bound of the fp32 / prepared-kernel cache (MiB)")
    s.add_argument("--layers", action="store_true", help="also write every quantized layer's input x.NAME and "
                                                         "output y.NAME")
    s.add_argument("--check", action="store_true", help="also run the reference forward and apply the model-level "
                                                       "rule (SQNR floor, docs/fallback.md); exit 1 outside it")
    s.add_argument("-o", "--output", required=True)
    s.set_defaults(fn=cmd_model, certifier_factory=certifier_factory)
