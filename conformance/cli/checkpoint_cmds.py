"""The checkpoint commands: ``qconform inspect``, ``qconform dequant`` and ``qconform linear``.

- ``qconform inspect CKPT [--json]``            every quantized layer and its format
- ``qconform dequant CKPT --layer NAME -o OUT``   exact float32 weight as safetensors tensor ``weight``
- ``qconform linear CKPT --layer NAME -i X -o Y`` reference y (x's dtype) and y_exact (float64)

Semantics: docs/checkpoints.md (what each toolkit writes) and docs/formats/*. Errors in the input raise
one-line errors that conformance/cli/main.py prints with exit status 2.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np

from conformance.cli.exits import EXIT_FAIL, EXIT_OK

_VALUES_CHECKED = "values: checked (every layer dequantized and validated as `qconform dequant` does)"
_VALUES_NOT_CHECKED = ("values: NOT checked (--headers-only: layouts, dtypes and shapes only; "
                       "`qconform dequant` may still reject a layer)")


def _cmd_inspect(args) -> int:
    from emulator.checkpoint import Checkpoint
    from emulator.layers import dequantize_layer

    ck = Checkpoint(args.checkpoint)
    layers = ck.layers()
    if not args.headers_only:
        # A green inspect must mean every layer is readable: validate values, one layer at a time.
        for info in layers:
            dequantize_layer(ck, info)
    if args.json:
        print(json.dumps({"checkpoint": str(ck.folder), "quant_method": ck.method,
                          "values_checked": not args.headers_only,
                          "skipped_files": [{"file": f, "why": why} for f, why in ck.skipped_files],
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
    for f, why in ck.skipped_files:
        print(f"skipped file: {f} ({why})")
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)))
    print(_VALUES_NOT_CHECKED if args.headers_only else _VALUES_CHECKED)
    return EXIT_OK


def _cmd_dequant(args) -> int:
    from emulator.checkpoint import Checkpoint
    from emulator.layers import dequantize_layer, overflowing_weights
    from emulator.tensorfile import save_tensors

    ck = Checkpoint(args.checkpoint)
    info = ck.layer(args.layer)
    w = dequantize_layer(ck, info)
    save_tensors(args.output, {"weight": np.ascontiguousarray(w, dtype=np.float32)},
                 metadata={"layer": info.name, "format": info.format, "producer": "qconform"})
    print(f"{info.name}: {info.format} {list(w.shape)} -> {args.output}")
    n_inf = overflowing_weights(info, w)
    if n_inf:
        first = [int(i) for i in np.argwhere(np.isinf(w))[0]]
        print(f"note: {n_inf} weight(s) exceed float32 (first at {first}): written as +-Inf, the RNE rounding of "
              "the exact value, as ONNX DequantizeLinear and torch give (docs/formats/mxfp4.md#dequantization)")
    return EXIT_OK


#: the vocabulary stages ``qconform linear`` applies on its direct path (emulator/layers.py); any other
#: variant takes the Case path (the layer as a Case, emulator/declaration.py ``declared_output``)
LINEAR_STAGES = ("int8-activations", "mx-activations")
#: Declared fields --variant may set (the others describe a kernel, not the reference: accumulate, output,
#: arithmetic)
LINEAR_FIELDS = ("weight_dtype", "act_compute_dtype", "output_rounding")


def linear_variant_keys() -> list[str]:
    """Every key ``qconform linear --variant`` takes: the vocabulary's variants and LINEAR_FIELDS."""
    from emulator.variants import AXES

    return [k for k, a in AXES.items() if not a.field or k in LINEAR_FIELDS]


def _linear_variants(opts: list[str], preset: str | None = None, input_dtype: str | None = None):
    """``--variant KEY=VALUE ...`` (and ``--preset NAME`` / ``--variant preset=NAME``) -> (the Declared they
    name, its int8 and MX activation quantizers, whether the direct path applies them all).

    Keys and values come from the variant vocabulary (emulator/variants.py, docs/variants.md); a preset is a
    reference quantizer's whole declaration (emulator/reference_quantizers.py). Activation variants run on
    the direct path; weight, epilogue and field variants need the Case path.
    """
    from emulator.declaration import Declared, int8_variant, mx_variant
    from emulator.variants import AXES

    from conformance.cli.quantize_cmd import parse_variant_options

    for o in opts or []:
        k = o.split("=", 1)[0].strip()
        if k in AXES and AXES[k].field and k not in LINEAR_FIELDS:
            raise ValueError(f"--variant {k}: describes a kernel, not the reference; linear takes the fields "
                             f"{', '.join(LINEAR_FIELDS)} and the variants of docs/variants.md")
    pairs, fields = parse_variant_options(opts, preset, linear_variant_keys(), "linear", LINEAR_FIELDS, input_dtype)
    if "act_compute_dtype" in fields and fields["act_compute_dtype"].lower() == "none":
        fields["act_compute_dtype"] = None
    decl = Declared(variants=pairs, **fields)
    direct = not fields and all(AXES[k].stage.value in LINEAR_STAGES for k in pairs)
    return decl, int8_variant(decl), mx_variant(decl), direct


def _cmd_linear(args) -> int:
    from emulator.checkpoint import Checkpoint
    from emulator.errors import FormatError
    from emulator.layers import declared_activation, linear_layer
    from emulator.tensorfile import Tensor, save_tensors

    ck = Checkpoint(args.checkpoint)
    info = ck.layer(args.layer)
    from conformance.cli.quantize_cmd import read_activations

    x, dtype = read_activations(args.input)  # (F16/BF16 values are exact in float32; out_dtype names the dtype)
    if not np.all(np.isfinite(x)):
        raise FormatError(f"{args.input}: tensor 'x' contains NaN or Inf")
    decl, int8_variant, mx_variant, direct = _linear_variants(args.variant, args.preset, dtype)
    if int8_variant.arith_dtype == "input":  # x travels as float32 here: name its own dtype
        int8_variant = dataclasses.replace(int8_variant, arith_dtype=dtype)
    if mx_variant.quotient_dtype == "input":
        mx_variant = dataclasses.replace(mx_variant, quotient_dtype=dtype)
    if args.backend:
        return _linear_backend(args, ck, info, x, dtype, decl)
    act = args.act or declared_activation(info)
    _check_activation_variants(decl, act)
    if not direct:  # weight, epilogue or field variants: the layer as a Case, the declared reference
        from conformance.cli.linear_backend import linear_with_variants

        y, y_exact = linear_with_variants(ck, info, x, dtype, act, decl)
        save_tensors(args.output, {"y": _in_dtype(y, dtype), "y_exact": y_exact},
                     metadata={"layer": info.name, "format": info.format, "producer": "qconform"})
        print(f"{info.name}: y {list(y.shape)} {dtype} -> {args.output}")
        print(f"activations: {act}; variants: {_named(decl)} (the layer as a Case: emulator/declaration.py)")
        return EXIT_OK
    res = linear_layer(ck, info, x, act=args.act, int8_variant=int8_variant, mx_variant=mx_variant, out_dtype=dtype)
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
    print(f"{info.name}: y {list(y.shape)} {dtype} -> {args.output}" + (f" ({amb} element(s) the float64 bound left "
                                                                         "undecided, decided exactly)" if amb else ""))
    print(f"activations: {act}; variants: {_named(decl)}{_checkpoint_declared(info, act)}")
    return EXIT_OK


def _checkpoint_declared(info, act: str) -> str:
    """'; the checkpoint declares mx_scale_rule=even' where the checkpoint names its own activation rule."""
    from emulator.declaration import MX_VARIANT_FIELDS
    from emulator.layers import checkpoint_activation_variants

    fields = checkpoint_activation_variants(info) if act == "mxfp4" else {}
    key_of = {f: k for k, f in MX_VARIANT_FIELDS.items()}
    named = [f"{key_of.get(f, f)}={v}" for f, v in fields.items()]
    return f" (the checkpoint declares {', '.join(named)})" if named else ""


def _check_activation_variants(decl, act: str) -> None:
    """An activation variant must match the activation scheme that runs (a named variant never goes unused)."""
    from emulator.variants import axis

    need = {"int8-activations": "int8", "mx-activations": "mxfp4"}
    for k in decl.variants:
        want = need.get(axis(k).stage.value)
        if want and want != act:
            raise ValueError(f"--variant {k}: a {want} activation variant, but this run's activations are {act} "
                             f"(the checkpoint's, or --act): use --act {want} or drop it")


def _named(decl) -> str:
    named = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in decl.variants.items()]
    named += [f"{k}={getattr(decl, k)}" for k in LINEAR_FIELDS if decl.value(k) != _field_default(k)]
    return ", ".join(named) if named else "canonical"


def _field_default(key: str):
    from emulator.variants import AXES

    return AXES[key].canonical


def _in_dtype(y, dtype: str):
    from emulator.tensorfile import Tensor

    if dtype == "float16":
        return y.astype(np.float16)
    if dtype == "bfloat16":
        return Tensor(y.astype(np.float32), "BF16")
    return y.astype(np.float32)


def _linear_backend(args, ck, info, x, dtype, decl) -> int:
    """``linear --backend auto|NAME``: the layer through a backend or the dispatcher (conformance/cli/linear_backend.py)."""
    from emulator.layers import declared_activation
    from emulator.tensorfile import Tensor, save_tensors

    from conformance.cli.linear_backend import linear_through_backend

    if decl.variants:
        raise ValueError("--variant names emulator variants; with --backend the backend's own declaration applies")
    act = args.act or declared_activation(info)
    try:
        y, lines, inside = linear_through_backend(ck, info, x, dtype, act, args.backend)
    except RuntimeError as e:  # unavailable or refusing backend: not the input's fault, not a result either
        print(f"qconform linear: {e}", file=sys.stderr)
        return EXIT_FAIL
    y_out = (y.astype(np.float16) if dtype == "float16" else Tensor(y.astype(np.float32), "BF16")
             if dtype == "bfloat16" else y.astype(np.float32))
    save_tensors(args.output, {"y": y_out}, metadata={"layer": info.name, "format": info.format,
                                                      "producer": "qconform", "backend": lines[0]})
    print(f"{info.name}: y {list(y.shape)} {dtype} -> {args.output}")
    for line in lines:
        print(line)
    return EXIT_OK if inside else EXIT_FAIL


def register(sub, services) -> None:
    """``inspect``, ``dequant``, ``linear`` (conformance/cli/main.py's COMMANDS)."""
    s = sub.add_parser("inspect", help="list every quantized layer of a checkpoint and its format")
    s.add_argument("checkpoint")
    s.add_argument("--json", action="store_true")
    s.add_argument("--headers-only", action="store_true",
                   help="read headers only (fast); the output then says that values were not checked")
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
                   help="a variant from docs/variants.md, e.g. act_rounding=rhaz, zero_read=v1_literal, "
                        "mx_scale_rule=even, or preset=NAME; keys: " + ", ".join(linear_variant_keys()))
    s.add_argument("--preset", metavar="NAME", help="a reference quantizer's declaration (emulator/"
                   "reference_quantizers.py), e.g. torchao-mx-floor, compressed-tensors-int8-sym; also "
                   "--variant preset=NAME")
    s.add_argument("--backend", metavar="auto|NAME", help="run the layer on a backend (auto: the dispatcher's "
                                                         "choice, printed with why it skipped the others)")
    s.set_defaults(fn=_cmd_linear)
