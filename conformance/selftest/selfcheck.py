"""The main job, as of issue #2: the emulator checks itself end to end on every scheme.

For every synthetic scheme (emulator/synthetic.py) it writes a checkpoint
folder in the real toolkit layout, reads it back through format detection,
dequantizes each layer, runs the reference linear on seeded fp16 and bf16
activations, and checks three properties that could each fail:

1. detection: the layer's detected format is the one written;
2. round trip: dequantized weights are within half a quantization step of the
   original weights (MXFP4: within the element grid's half spacing times the
   block scale), i.e. the checkpoint was read with the semantics it was written with;
3. linear: the reference y equals an independent recomputation (float64 matmul
   of the dequantized weights, rounded with ml_dtypes/numpy casts when those
   agree with RNE), bit for bit, outside the elements it marks ambiguous.

Results go to OUT/results.jsonl (one line per check, appended as they
finish) and a table on stdout. Later issues replace this with the full
conformance run over every available backend.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from emulator import __version__ as emulator_version
from emulator.checkpoint import Checkpoint
from emulator.layers import dequantize_layer, linear_layer
from emulator.numerics.floats import round_to_dtype
from emulator.synthetic import SCHEMES, write_checkpoint

_EXPECTED_FORMAT = {
    "gptq": "gptq", "awq": "awq", "ct-w4": "ct-pack-quantized", "ct-w8a8": "ct-int-quantized",
    "ct-mxfp4": "ct-mxfp4", "gptoss": "gptoss-mxfp4",
}


def _expected_format(scheme: str) -> str:
    for prefix, fmt in _EXPECTED_FORMAT.items():
        if scheme.startswith(prefix):
            return fmt
    raise KeyError(scheme)


_SCALE_EPS = {"F16": 2.0 ** -11, "BF16": 2.0 ** -8, "F32": 2.0 ** -24}  # unit roundoff of the stored scale
_SCALE_ABS = {"F16": 2.0 ** -25, "BF16": 2.0 ** -134, "F32": 2.0 ** -150}  # half the smallest subnormal


def _step_bound(scheme: str, orig: np.ndarray, deq: np.ndarray, bits: int = 4,
                scale_dtype: str | None = None) -> np.ndarray:
    """Largest allowed |deq - orig| per element for a round-to-nearest quantizer."""
    if "mxfp4" in scheme:
        # spacing of E2M1 next to a value v, times the block scale, halved; saturation at 6*scale allowed
        blocks = orig.reshape(orig.shape[:-1] + (-1, 32)).astype(np.float64)
        amax = np.abs(blocks).max(axis=-1, keepdims=True)
        scale = np.where(amax > 0, 2.0 ** (np.floor(np.log2(np.where(amax > 0, amax, 1))) - 2), 0)
        step = np.maximum(scale * 2.0, 1e-30)  # widest E2M1 spacing (4 -> 6) is 2 units
        return np.broadcast_to(step / 2 + np.maximum(np.abs(blocks) - 6 * scale, 0), blocks.shape).reshape(orig.shape)
    # Integer formats with 2**bits levels: a group's scale is at most 2 * max|w| / (2**bits - 1), so
    # rounding to the grid (and the half-step clamp of a symmetric grid's top level) moves an element
    # by at most max|w| / (2**bits - 1), with max|w| over the row. Rounding the scale to its stored
    # dtype moves the outermost grid levels by up to 2**bits scale roundings.
    levels = 2 ** bits
    eps, tiny = _SCALE_EPS.get(scale_dtype or "F16", 2.0 ** -8), _SCALE_ABS.get(scale_dtype or "F16", 2.0 ** -25)
    span = np.abs(orig.astype(np.float64)).max(axis=-1, keepdims=True)
    return np.broadcast_to(span / (levels - 1) * (1 + levels * eps) + levels * tiny, orig.shape)


def check_scheme(scheme: str, folder: Path, seed: int) -> list[dict]:
    out: list[dict] = []
    t0 = time.perf_counter()
    originals = write_checkpoint(folder, scheme, seed=seed, bias=True)
    ck = Checkpoint(folder)
    for info in ck.layers():
        rec = {"scheme": scheme, "layer": info.name, "format": info.format}
        ok_format = info.format == _expected_format(scheme)
        deq = dequantize_layer(ck, info)
        orig = originals.get(info.name)
        if orig is None:  # stacked experts: compare the first expert
            orig = originals[next(iter(originals))]
            deq_cmp = deq[0]
        else:
            deq_cmp = deq
        err = np.abs(deq_cmp.astype(np.float64) - orig.astype(np.float64))
        bound = _step_bound(scheme, orig, deq_cmp, info.bits, info.scale_dtype)
        ok_round = bool(np.all(err <= bound))
        ok_linear = True
        detail = ""
        if len(info.shape) == 2:
            for dtype in ("float16", "bfloat16"):
                rng = np.random.default_rng(seed + 7)
                x = round_to_dtype(rng.standard_normal((4, info.shape[1])), dtype).astype(np.float32)
                res = linear_layer(ck, info, x, act=None, out_dtype=dtype)
                if res.acc is None and info.activation is None:
                    w = deq.astype(np.float64)
                    bias = ck.tensor(info.tensors["bias"]).data.astype(np.float64) if "bias" in info.tensors else 0.0
                    y_ref = round_to_dtype(x.astype(np.float64) @ w.T + bias, dtype)
                    mism = (y_ref != res.y) & ~res.y_ambiguous & np.isfinite(y_ref)
                    if mism.any():
                        ok_linear = False
                        detail = f"{int(mism.sum())} output element(s) differ in {dtype}"
                elif res.acc is not None:
                    if not np.array_equal(res.acc, np.rint(res.acc)):
                        ok_linear = False
                        detail = "non-integer accumulator"
                if not np.all(np.isfinite(res.y)):
                    ok_linear = False
                    detail = f"non-finite output in {dtype}"
        rec.update({
            "detected_format_ok": ok_format, "round_trip_ok": ok_round,
            "max_error": float(err.max()), "linear_ok": ok_linear,
            "verdict": "pass" if (ok_format and ok_round and ok_linear) else "fail",
            "detail": detail or (f"max |w - w0| {err.max():.3g} exceeds bound" if not ok_round else ""),
            "seconds": round(time.perf_counter() - t0, 4),
        })
        out.append(rec)
    return out


def main(args) -> int:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results_path = out_dir / "results.jsonl"
    header = {"kind": "run", "backend": "emulator", "emulator_version": emulator_version,
              "schemes": list(SCHEMES), "seed": args.seed, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    passed = failed = 0
    with open(results_path, "w", encoding="utf-8") as f:
        f.write(json.dumps(header) + "\n")
        print(f"qconform run: backend emulator {emulator_version}, {len(SCHEMES)} schemes -> {results_path}")
        print(f"{'scheme':34s} {'layer':40s} {'format':18s} verdict  max|w-w0|")
        for scheme in SCHEMES:
            try:
                recs = check_scheme(scheme, out_dir / "checkpoints" / scheme, args.seed)
            except Exception as e:  # a crash in one scheme must not lose the others
                recs = [{"scheme": scheme, "layer": "-", "format": "-", "verdict": "crash",
                         "detail": f"{type(e).__name__}: {e}"}]
            for r in recs:
                f.write(json.dumps(r) + "\n")
                f.flush()
                ok = r["verdict"] == "pass"
                passed += ok
                failed += not ok
                err = f"{r['max_error']:.3g}" if "max_error" in r else "-"
                print(f"{scheme:34s} {r['layer']:40s} {r['format']:18s} {r['verdict']:8s} {err}"
                      + (f"  {r['detail']}" if r.get("detail") else ""))
    print(f"emulator: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def register(sub, services) -> None:
    """``qconform selfcheck`` (conformance/cli/main.py's COMMANDS)."""
    s = sub.add_parser("selfcheck", help="end-to-end check of the emulator through checkpoint folders")
    s.add_argument("--out", default="qconform-out", help="output folder")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(fn=main)
