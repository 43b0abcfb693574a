"""``qconform quantize``: activations from a safetensors file to codes, scales and zero points under any preset
or variant (docs/variants.md#the-command-line), and the ``--variant`` / ``--preset`` parsing ``linear`` shares.

Semantics: docs/conformance.md#quantize-only-cases (the output contract of each scheme) and docs/variants.md
(the keys). A user compares a library's quantizer with the named reference without Python: the output file
holds ``codes``, ``scale``, ``zero_point`` (where the scheme has one, in the codes' own domain: uint8 codes
q + 128 come with the zero point + 128, as ONNX DynamicQuantizeLinear stores them) and ``dequantized``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PRESET_KEY", "parse_variant_options", "read_activations", "quantize_variant_keys", "cmd_quantize",
           "register"]

#: ``--variant preset=NAME``: a reference quantizer's whole declaration (emulator/reference_quantizers.py)
PRESET_KEY = "preset"
QUANTIZE_SCHEMES = ("q-int8-token", "q-uint8-tensor", "q-mxfp4")


def _presets() -> dict:
    from emulator.reference_quantizers import REFERENCE_QUANTIZERS

    return REFERENCE_QUANTIZERS


def parse_variant_options(opts: list[str] | None, preset: str | None, accepted: list[str], command: str,
                          field_keys: tuple = (), input_dtype: str | None = None) -> tuple[dict, dict]:
    """``--variant KEY=VALUE`` options and ``--preset NAME`` -> (variants, Declared fields).

    A preset (``--preset NAME`` or ``--variant preset=NAME``) contributes its variants first; a ``--variant``
    naming one of its keys again overrides it. A key the command does not take is refused with the keys it
    takes (``accepted``), never the whole vocabulary.
    """
    presets = []
    pairs: list[tuple[str, str]] = []
    for o in opts or []:
        if "=" not in o:
            raise ValueError(f"--variant expects key=value, got {o!r}")
        k, v = (t.strip() for t in o.split("=", 1))
        if k == PRESET_KEY:
            presets.append(v)
        else:
            pairs.append((k, v))
    if preset:
        presets.insert(0, preset)
    variants: dict = {}
    for name in presets:
        if name not in _presets():
            raise ValueError(f"unknown preset {name!r}; known: {', '.join(_presets())}")
        dtypes = _presets()[name].input_dtypes
        if input_dtype is not None and dtypes and input_dtype not in dtypes:
            raise ValueError(f"preset {name} is checked against its library for {' and '.join(dtypes)} activations "
                             f"only, not {input_dtype} (the library computes otherwise there: docs/variants.md)")
        variants.update(_presets()[name].variants)
    fields: dict = {}
    for k, v in pairs:
        if k not in accepted:
            takes = f"{PRESET_KEY}, {', '.join(accepted)}" if accepted else "no variant key (the scheme is fixed)"
            raise ValueError(f"--variant {k}: not a key {command} takes; it takes: {takes} (docs/variants.md)")
        (fields if k in field_keys else variants)[k] = v
    return variants, fields


def quantize_variant_keys(scheme: str | None = None) -> list[str]:
    """The variant keys ``qconform quantize`` takes for ``scheme`` (all quantize-only schemes: None)."""
    from emulator.variants import AXES

    schemes = (scheme,) if scheme else QUANTIZE_SCHEMES
    return [k for k, a in AXES.items() if not a.field and any(a.applies_to(s) for s in schemes)]


def read_activations(path) -> tuple[np.ndarray, str]:
    """Tensor ``x`` [M, K] (F32/F16/BF16) of a safetensors file -> (float32 values, its dtype name)."""
    from emulator.errors import FormatError
    from emulator.tensorfile import load_tensors

    tensors = load_tensors(path)
    if "x" not in tensors:
        raise FormatError(f"{path}: missing tensor 'x' (found: {', '.join(sorted(tensors)) or 'none'})")
    xt = tensors["x"]
    dtype = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}.get(xt.dtype)
    if dtype is None:
        raise FormatError(f"{path}: tensor 'x' must be F32, F16 or BF16, got {xt.dtype}")
    x = np.asarray(xt.data, np.float32)
    if x.ndim != 2:
        raise FormatError(f"{path}: tensor 'x' must be 2-D [M, K], got shape {list(x.shape)}")
    return x, dtype


def _scheme_of(args, variants: dict) -> str:
    """--scheme, else the one the named variants belong to (int8 or MX activation keys)."""
    from emulator.variants import AXES

    if args.scheme:
        return args.scheme
    stages = {AXES[k].stage.value for k in variants}
    if stages == {"mx-activations"}:
        return "q-mxfp4"
    if stages == {"int8-activations"}:
        return "q-int8-token"
    raise ValueError("name the scheme: --scheme q-int8-token, q-uint8-tensor or q-mxfp4 (no preset or variant "
                     "implies one)")


def _zero_point_in_codes_domain(codes: np.ndarray, zero_point: np.ndarray, contract: dict) -> np.ndarray:
    """The zero point in the domain of the stored codes, so that ``(codes - zero_point) * scale`` is the
    dequantized value whatever the codes' dtype.

    The reference's int8-domain zero point (int32) goes with int8 codes. Codes stored as uint8 q + 128
    (``uint8_zp128``: the ONNX DynamicQuantizeLinear preset, the SGL CPU W4A8 path) take the zero point + 128,
    stored as uint8 as ONNX does (its ``y_zero_point`` is uint8) where every value fits, else as int32."""
    zp = np.asarray(zero_point, np.int64)
    if codes.dtype != np.uint8 or contract["zero_point"][0] == "uint8":
        return np.ascontiguousarray(zp).astype(contract["zero_point"][0])  # already the codes' own domain
    zp = zp + 128
    fits = bool(np.all((zp >= 0) & (zp <= 255)))
    return np.ascontiguousarray(zp).astype(np.uint8 if fits else np.int32)


def cmd_quantize(args) -> int:
    from emulator.declaration import Declared
    from emulator.errors import FormatError
    from emulator.quantize_only import output_contract, quantize_reference
    from emulator.schemes import Case
    from emulator.tensorfile import save_tensors

    x, dtype = read_activations(args.input)
    variants, _ = parse_variant_options(args.variant, args.preset, quantize_variant_keys(args.scheme), "quantize",
                                        input_dtype=dtype)
    scheme = _scheme_of(args, variants)
    keys = quantize_variant_keys(scheme)
    wrong = [k for k in variants if k not in keys]
    if wrong:
        raise ValueError(f"--scheme {scheme} takes none of {', '.join(wrong)}; it takes: "
                         f"{', '.join(keys) or 'no variant (the scheme is ONNX DynamicQuantizeLinear itself)'}")
    M, K = x.shape
    if scheme == "q-mxfp4" and K % 32:
        raise FormatError(f"{args.input}: tensor 'x' has K = {K}, not a multiple of the MX block 32")
    case = Case(scheme, "none", M, 0, K, group_size=32 if scheme == "q-mxfp4" else -1,
                sym=scheme != "q-uint8-tensor", act_dtype=dtype)
    declared = Declared(variants=variants)
    out = quantize_reference(case, x, declared)
    contract = output_contract(case, declared)
    tensors = {name: np.ascontiguousarray(out[name]).astype(contract[name][0]) for name in contract}
    if "zero_point" in tensors:
        tensors["zero_point"] = _zero_point_in_codes_domain(tensors["codes"], out["zero_point"], contract)
    named = ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in variants.items())
    save_tensors(args.output, tensors, metadata={"scheme": scheme, "variants": named or "canonical",
                                                 "producer": "qconform"})
    print(f"x {list(x.shape)} {dtype} -> {args.output}: {scheme}; "
          + ", ".join(f"{n} {tensors[n].dtype} {list(contract[n][1])}" for n in contract)
          + ("; dequantized = (codes - zero_point) * scale" if "zero_point" in tensors else ""))
    print(f"variants: {named or 'canonical'}" + (f" (preset {args.preset})" if args.preset else ""))
    return 0


def register(sub, services) -> None:
    from emulator.reference_quantizers import REFERENCE_QUANTIZERS

    s = sub.add_parser("quantize", help="quantize activations x from a safetensors file to codes, scales and zero "
                                        "points (safetensors) under a preset or variants")
    s.add_argument("-i", "--input", required=True, help="safetensors file with tensor x [M, K] (F32/F16/BF16)")
    s.add_argument("-o", "--output", required=True)
    s.add_argument("--scheme", choices=QUANTIZE_SCHEMES,
                   help="q-int8-token (per-token int8), q-uint8-tensor (ONNX DynamicQuantizeLinear), q-mxfp4 "
                        "(OCP MX); default: the one the preset or variants belong to")
    s.add_argument("--preset", metavar="NAME", help="a reference quantizer's declaration: " +
                   ", ".join(REFERENCE_QUANTIZERS))
    s.add_argument("--variant", action="append", metavar="KEY=VALUE",
                   help="a variant from docs/variants.md (or preset=NAME); keys: " + ", ".join(quantize_variant_keys()))
    s.set_defaults(fn=cmd_quantize)
