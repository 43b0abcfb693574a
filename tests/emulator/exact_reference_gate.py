"""The exact reference's outputs on the project's checkpoints and on large synthetic layers: the cases of the
regression gate ``test_exact_reference_gate.py`` (not a test module itself).

``python tests/emulator/exact_reference_gate.py --write`` stores every case's ``y`` (float32 holding values
of the output dtype) and ``y_ambiguous`` (the elements the float64 bound left undecided, which the reference
decided from their exact value) in ``tests/data/exact_reference_gate.safetensors``. The stored file was
written with main's code at commit c8c12d5, before the undecided elements were decided vectorised
(docs/formats/activations.md#deciding-the-undecided-elements); it is never rewritten to make the gate pass.

Cases: every 2-D quantized layer of every checkpoint under tests/data (toolkit-written and the fallback's
own), run with its declared activations in float32 and with A16 in float16 and bfloat16, plus W4A8 for the
4-bit integer formats and W4A4 for MXFP4 weights; expert 0 of stacked gpt-oss experts (A16); and synthetic
layers with K = 2048-4096 whose float32 outputs leave hundreds of elements undecided by float64 alone.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "exact_reference_gate.safetensors"
_DT = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def _rng(key: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(key.encode()))


def _x(key: str, m: int, k: int, dtype: str) -> np.ndarray:
    x = _rng(key).standard_normal((m, k)).astype(np.float32)
    return x.astype(_DT[dtype])


def _w16(fast: bool):
    """The A16 reference the direct calls run: the readable definition, or its speed code."""
    if fast:
        from emulator.fast_linear_w16 import linear_w16_fast

        return linear_w16_fast
    from emulator.linear import linear_w16

    return linear_w16


def _checkpoint_cases(fast: bool = False):
    from emulator.checkpoint import open_checkpoint
    from emulator.layers import dequantize_layer, linear_layer

    w16 = _w16(fast)

    for cfg in sorted((ROOT / "tests" / "data").rglob("config.json")):
        folder = cfg.parent
        rel = folder.relative_to(ROOT / "tests" / "data").as_posix()
        ck = open_checkpoint(folder)
        for info in ck.layers():
            K = int(info.shape[-1])
            if len(info.shape) == 3:
                key = f"{rel}|{info.name}|e0|a16|float32"
                x = _x(key, 6, K, "float32")
                yield key, (lambda ck=ck, info=info, x=x: w16(x, dequantize_layer(ck, info)[0], None,
                                                              out_dtype="float32"))
                continue
            # Quark's dynamic int8 observer is no emulator variant: its layers run the canonical int8 one
            declared = "int8" if info.format == "quark-int" and info.activation else None
            runs = [(declared, "float32"), ("a16", "float16"), ("a16", "bfloat16")]
            if info.format in ("gptq", "awq", "ct-pack-quantized") and info.bits == 4:
                runs.append(("int8", "float32"))
            if info.format in ("ct-mxfp4", "quark-mxfp4"):
                runs.append(("mxfp4", "float32"))
            for act, dtype in runs:
                key = f"{rel}|{info.name}|{act or 'declared'}|{dtype}"
                x = _x(key, 7, K, dtype)
                yield key, (lambda ck=ck, info=info, x=x, act=act: linear_layer(ck, info, x, act=act))


def _synthetic_cases(fast: bool = False):
    from emulator.formats import mxfp4 as mx
    from emulator.linear import linear_mxfp4_w4a4, linear_w4a8, linear_w8a8

    linear_w16 = _w16(fast)

    def w16(key, m, n, k, dtype, bias):
        r = _rng(key)
        w = (r.standard_normal((n, k)) * 0.02).astype(np.float32)
        x = _x(key, m, k, dtype)
        b = (r.standard_normal(n) * 0.1).astype(np.float32) if bias else None
        return linear_w16(x, w, b, out_dtype=dtype)

    def w8a8(key, m, n, k, dtype):
        r = _rng(key)
        w = r.integers(-128, 128, (n, k)).astype(np.int8)
        s = (r.random(n) * 0.01 + 1e-3).astype(np.float32)
        return linear_w8a8(_x(key, m, k, dtype), w, s, None, out_dtype=dtype)

    def w4a8(key, m, n, k, dtype):
        r = _rng(key)
        w = r.integers(-8, 8, (n, k)).astype(np.int8)
        s = (r.random((k // 128, n)) * 0.01 + 1e-3).astype(np.float16)
        return linear_w4a8(_x(key, m, k, dtype), w, s, 128, None, out_dtype=dtype)

    def w4a4(key, m, n, k, dtype):
        r = _rng(key)
        codes = r.integers(0, 16, (n, k)).astype(np.uint8)
        scales = r.integers(118, 128, (n, k // mx.BLOCK)).astype(np.uint8)
        return linear_mxfp4_w4a4(_x(key, m, k, dtype), codes, scales, None, out_dtype=dtype)

    specs = [
        ("synthetic|w16|48x512x4096|float32", lambda k: w16(k, 48, 512, 4096, "float32", False)),
        ("synthetic|w16|64x768x4096|float32", lambda k: w16(k, 64, 768, 4096, "float32", False)),
        ("synthetic|w16-bias|32x384x2048|float32", lambda k: w16(k, 32, 384, 2048, "float32", True)),
        ("synthetic|w16|16x256x4096|bfloat16", lambda k: w16(k, 16, 256, 4096, "bfloat16", True)),
        ("synthetic|w8a8|16x256x4096|float32", lambda k: w8a8(k, 16, 256, 4096, "float32")),
        ("synthetic|w4a8|16x256x2048|float32", lambda k: w4a8(k, 16, 256, 2048, "float32")),
        ("synthetic|w4a4|32x256x4096|float32", lambda k: w4a4(k, 32, 256, 4096, "float32")),
    ]
    for key, fn in specs:
        yield key, (lambda fn=fn, key=key: fn(key))


def cases(fast: bool = False):
    """(key, thunk returning a LinearResult) for every case of the gate, in a fixed order; ``fast``: the direct A16
    calls run ``linear_w16_fast`` (emulator/fast_linear_w16.py, what the fallback's exact reference runs) instead
    of ``linear_w16`` (the stored outputs are those of the readable ``linear_w16``)."""
    yield from _checkpoint_cases(fast)
    yield from _synthetic_cases(fast)


def write(path: Path = GOLDEN) -> dict:
    from safetensors.numpy import save_file

    out = {}
    undecided = 0
    for key, run in cases():
        r = run()
        y32 = np.ascontiguousarray(r.y, dtype=np.float32)  # values of the output dtype: float32 holds them
        assert np.array_equal(y32.astype(np.float64), r.y, equal_nan=True), key
        out[key + "|y"] = y32
        out[key + "|ambiguous"] = np.ascontiguousarray(r.y_ambiguous, dtype=np.uint8)
        undecided += int(r.y_ambiguous.sum())
    save_file(out, str(path), metadata={"what": "exact reference outputs (regression gate)",
                                         "undecided": str(undecided)})
    return {"cases": len(out) // 2, "undecided": undecided}


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/emulator/exact_reference_gate.py --write")
    print(write())
