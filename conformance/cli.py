"""The ``qconform`` command line.

Commands (contract fixed by issue #2; more arrive with the suite):

- ``qconform inspect CKPT [--json]``            every quantized layer and its format
- ``qconform dequant CKPT --layer NAME -o OUT``   exact float32 weight as safetensors tensor ``weight``
- ``qconform linear CKPT --layer NAME -i X -o Y`` reference y (x's dtype) and y_exact (float64)
- ``qconform run``                                the main job: conformance of every available backend
- ``qconform selfcheck``                          the emulator end to end through checkpoint folders

Errors in the input print one line naming the layer, tensor and problem and
exit with status 2; no traceback unless ``--debug``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

EXIT_OK, EXIT_FAIL, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


def _cmd_inspect(args) -> int:
    from emulator.checkpoint import Checkpoint

    ck = Checkpoint(args.checkpoint)
    layers = ck.layers()
    if args.json:
        print(json.dumps({"checkpoint": str(ck.folder), "quant_method": ck.method,
                          "layers": [l.to_json() for l in layers]}, indent=2))
        return EXIT_OK
    cols = ["layer", "format", "shape", "bits", "group", "sym", "act_order", "zeros", "activation"]
    rows = []
    for l in layers:
        act = "-" if not l.activation else f"{l.activation.get('type')}{l.activation.get('num_bits')}"
        rows.append([l.name, l.format, "x".join(map(str, l.shape)), str(l.bits), str(l.group_size),
                     "-" if l.sym is None else str(l.sym).lower(), str(l.act_order).lower(),
                     l.zero_convention or "-", act])
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    print(f"{ck.folder}  quant_method={ck.method}  layers={len(layers)}")
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)))
    return EXIT_OK


def _cmd_dequant(args) -> int:
    from emulator.checkpoint import Checkpoint
    from emulator.layers import dequantize_layer
    from emulator.tensorfile import save_tensors

    ck = Checkpoint(args.checkpoint)
    info = ck.layer(args.layer)
    w = dequantize_layer(ck, info)
    save_tensors(args.output, {"weight": np.ascontiguousarray(w, dtype=np.float32)},
                 metadata={"layer": info.name, "format": info.format, "producer": "qconform"})
    print(f"{info.name}: {info.format} {list(w.shape)} -> {args.output}")
    return EXIT_OK


def _parse_variant_opts(opts: list[str]) -> dict:
    out = {}
    for o in opts or []:
        if "=" not in o:
            raise ValueError(f"--variant expects key=value, got {o!r}")
        k, v = o.split("=", 1)
        out[k.strip()] = v.strip()
    return out


_INT8_KEYS = ("rounding", "reciprocal", "scale_dtype", "zero_row", "nan_to_int", "qmin", "qmax", "eps", "symmetric",
              "uint8_zp128")
_MX_KEYS = ("scale_rule", "element_rounding", "element_nan", "zero_block", "nan_block")


def _check_variant_keys(opts: dict) -> None:
    unknown = sorted(set(opts) - set(_INT8_KEYS) - set(_MX_KEYS))
    if unknown:
        raise ValueError(f"--variant: unknown key(s) {', '.join(unknown)}; int8 activations: {', '.join(_INT8_KEYS)}; "
                         f"mxfp4: {', '.join(_MX_KEYS)}")


def _int8_variant(opts: dict):
    from emulator.activations.int8 import Int8ActVariant

    kw = {}
    for k, v in opts.items():
        if k in ("rounding", "reciprocal", "scale_dtype", "zero_row", "nan_to_int"):
            kw[k] = v
        elif k in ("qmin", "qmax"):
            kw[k] = int(v)
        elif k == "eps":
            kw[k] = float(v)
        elif k in ("symmetric", "uint8_zp128"):
            if v.lower() not in ("1", "true", "yes", "0", "false", "no"):
                raise ValueError(f"--variant {k}={v!r}: expected true or false")
            kw[k] = v.lower() in ("1", "true", "yes")
    return Int8ActVariant(**kw)


def _mx_variant(opts: dict):
    from emulator.formats.mxfp4 import MxVariant

    return MxVariant(**{k: v for k, v in opts.items() if k in _MX_KEYS})


def _cmd_linear(args) -> int:
    from emulator.checkpoint import Checkpoint
    from emulator.errors import FormatError
    from emulator.layers import linear_layer
    from emulator.tensorfile import Tensor, load_tensors, save_tensors

    ck = Checkpoint(args.checkpoint)
    info = ck.layer(args.layer)
    tensors = load_tensors(args.input)
    if "x" not in tensors:
        raise FormatError(f"{args.input}: missing tensor 'x' (found: {', '.join(sorted(tensors)) or 'none'})")
    xt = tensors["x"]
    dtype = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}.get(xt.dtype)
    if dtype is None:
        raise FormatError(f"{args.input}: tensor 'x' must be F32, F16 or BF16, got {xt.dtype}")
    x = xt.data
    if x.ndim != 2:
        raise FormatError(f"{args.input}: tensor 'x' must be 2-D [M, K], got shape {list(x.shape)}")
    if not np.all(np.isfinite(x)):
        raise FormatError(f"{args.input}: tensor 'x' contains NaN or Inf")
    opts = _parse_variant_opts(args.variant)
    _check_variant_keys(opts)
    res = linear_layer(ck, info, x, act=args.act, int8_variant=_int8_variant(opts), mx_variant=_mx_variant(opts),
                       out_dtype=dtype)
    y = res.y
    if dtype == "float16":
        y_out = y.astype(np.float16)
    elif dtype == "bfloat16":
        y_out = Tensor(y.astype(np.float32), "BF16")
    else:
        y_out = y.astype(np.float32)
    out = {"y": y_out, "y_exact": res.y_exact.astype(np.float64)}
    if res.acc is not None:
        out["acc"] = res.acc.astype(np.int64)
    save_tensors(args.output, out, metadata={"layer": info.name, "format": info.format, "producer": "qconform"})
    amb = int(res.y_ambiguous.sum())
    print(f"{info.name}: y {list(y.shape)} {dtype} -> {args.output}" + (f" ({amb} element(s) within the float64 "
                                                                         "bound of a rounding boundary)" if amb else ""))
    return EXIT_OK


def _cmd_selfcheck(args) -> int:
    from . import selfcheck

    return selfcheck.main(args)


class OneLineParser(argparse.ArgumentParser):
    """argparse with the project's contract for usage errors: one line naming the problem, exit 2
    (the full usage stays behind --help)."""

    def error(self, message: str):
        self.exit(EXIT_INPUT, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="qconform", description="Conformance suite and bit-exact emulator for quantized LLM formats")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("inspect", help="list every quantized layer of a checkpoint and its format")
    s.add_argument("checkpoint")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=_cmd_inspect)

    s = sub.add_parser("dequant", help="write a layer's exact float32 weight [N, K] as safetensors tensor 'weight'")
    s.add_argument("checkpoint")
    s.add_argument("--layer", required=True)
    s.add_argument("-o", "--output", required=True)
    s.set_defaults(fn=_cmd_dequant)

    s = sub.add_parser("linear", help="reference linear of a layer on x from a safetensors file")
    s.add_argument("checkpoint")
    s.add_argument("--layer", required=True)
    s.add_argument("-i", "--input", required=True, help="safetensors file with tensor x [M, K] (F32/F16/BF16)")
    s.add_argument("-o", "--output", required=True)
    s.add_argument("--act", choices=["a16", "int8", "mxfp4"], help="activation scheme (default: the checkpoint's)")
    s.add_argument("--variant", action="append", metavar="KEY=VALUE",
                   help="activation variant, e.g. rounding=rhaz, reciprocal=recip_amax, scale_rule=even")
    s.set_defaults(fn=_cmd_linear)

    s = sub.add_parser("selfcheck", help="end-to-end check of the emulator through checkpoint folders")
    s.add_argument("--out", default="qconform-out", help="output folder")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(fn=_cmd_selfcheck)

    from .commands import add_commands

    add_commands(sub)
    return p


def _one_line(e: BaseException) -> str:
    """The error as one line (the contract: one line naming the layer, tensor and problem)."""
    text = str(e) if str(e) else type(e).__name__
    return " ".join(text.split())


def _closed_pipe() -> int:
    """The reader of our output went away (`qconform backends --json | head`): end quietly, as a
    command killed by SIGPIPE would (exit 141), without a traceback at interpreter shutdown."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 128 + 13


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from emulator.errors import QconformError

    try:
        rc = int(args.fn(args) or 0)
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        return _closed_pipe()
    except (QconformError, ValueError, TypeError, FileNotFoundError, IsADirectoryError, PermissionError) as e:
        if args.debug:
            raise
        print(f"qconform {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # an emulator bug, not the user's input: still no raw traceback
        if args.debug:
            raise
        print(f"qconform {args.command}: internal error ({type(e).__name__}: {_one_line(e)}); rerun with --debug and "
              "report it", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
