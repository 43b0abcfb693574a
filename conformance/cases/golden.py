"""Golden tensors: fixed cases for every scheme and edge class, with a checksummed manifest.

Semantics: docs/conformance.md#golden-tensors.

``golden/`` (package data: it ships with ``pip install .``) holds one safetensors file per case (inputs + the canonical
reference ``y_ref``/``y_exact``) and ``MANIFEST.json`` (sha256 of each file,
the case spec that generated it, the emulator version, the oracle that
cross-checked it). ``qconform golden regenerate`` rewrites them byte for byte
(conformance/judge/golden_regenerate.py);
``qconform golden verify`` names any file whose bytes changed, is missing, or
is not in the manifest.

Before a file is written, the emulator's dequantized weights and reference
output are cross-checked against independent code (conformance/judge/oracles.py:
ml_dtypes decoding for MXFP4, plain shift-and-mask unpackers written apart
from the emulator for the integer formats, compressed-tensors' own unpacker
where installed).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


from backends.base import Case
from emulator.errors import QconformError
from emulator.tensorfile import load_tensors

from conformance.cases.generators import generators_for
from conformance.cases.specs import GOLDEN_DIR, MANIFEST, CaseSpec, golden_inputs  # noqa: F401 - GOLDEN_DIR, golden_inputs re-exported

__all__ = ["GOLDEN_DIR", "golden_cases", "golden_specs", "golden_inputs", "verify", "source_specs", "file_name", "sha256_of"]



def golden_cases() -> list[Case]:
    """One small case per scheme x format x parameter family."""
    M, N, K = 5, 72, 128
    return [
        Case("w4a16", "gptq", M, N, K, group_size=32, sym=True, zero_convention="v1", act_dtype="bfloat16"),
        Case("w4a16", "gptq", M, N, K, group_size=32, sym=False, zero_convention="v1", act_dtype="float16"),
        Case("w4a16", "gptq", M, N, K, group_size=32, sym=False, zero_convention="v2", act_dtype="bfloat16",
             bias=True),
        Case("w4a16", "gptq", 1, N, K, group_size=128, sym=True, zero_convention="v1", act_dtype="float16"),
        Case("w4a16", "awq", M, N, K, group_size=32, sym=False, act_dtype="float16"),
        Case("w4a16", "ct-pack-quantized", M, N, K, group_size=32, sym=True, act_dtype="bfloat16",
             scale_dtype="bfloat16"),
        Case("w4a16", "ct-pack-quantized", M, N, K, group_size=32, sym=False, act_dtype="bfloat16"),
        Case("w4a16", "ct-pack-quantized", M, N, K, group_size=-1, sym=True, act_dtype="float16"),
        Case("w8a8", "ct-int-quantized", M, N, K, group_size=-1, act_dtype="bfloat16", scale_dtype="float32"),
        Case("w4a8", "ct-pack-quantized", M, N, K, group_size=32, sym=True, act_dtype="bfloat16"),
        Case("w4a16-mxfp4", "ct-mxfp4", M, N, K, group_size=32, act_dtype="bfloat16"),
        Case("w4a4-mxfp4", "ct-mxfp4", M, N, K, group_size=32, act_dtype="bfloat16"),
        Case("w4a16-moe", "gptq", M, 64, K, group_size=32, sym=True, act_dtype="bfloat16", E=4, top_k=2),
        # quantize-only (docs/conformance.md#quantize-only-cases): activations alone
        Case("q-int8-token", "none", M, 0, K, group_size=-1, sym=True, act_dtype="bfloat16"),
        Case("q-int8-token", "none", M, 0, K, group_size=-1, sym=False, act_dtype="float16"),
        Case("q-uint8-tensor", "none", M, 0, K, group_size=-1, sym=False, act_dtype="float32"),
        Case("q-mxfp4", "none", M, 0, K, group_size=32, act_dtype="bfloat16"),
    ]


def source_specs() -> list[CaseSpec]:
    from conformance.cases.generators import GENERATORS

    out = []
    for case in golden_cases():
        for gen in generators_for(case, ("exact", "edge", "random")):
            if GENERATORS[gen][0] == "random" and gen != "gaussian":
                continue
            out.append(CaseSpec(case, GENERATORS[gen][0], gen, 0))
    return out


def file_name(spec: CaseSpec) -> str:
    c = spec.case
    flags = ("sym" if c.sym else "asym") + (f"-{c.zero_convention}" if c.zero_convention else "") + \
        ("-bias" if c.bias else "")
    return f"{c.scheme}__{c.weight_format}__g{c.group_size}-{flags}-{c.act_dtype}__{spec.generator}"


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _manifest(folder: Path) -> dict:
    p = folder / MANIFEST
    if not p.exists():
        return {"files": {}}
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise QconformError(f"{p}: malformed manifest ({e})") from None


def verify(folder: "str | Path" = GOLDEN_DIR) -> list[str]:
    """Problems found (empty when every file matches its checksum)."""
    folder = Path(folder)
    man = _manifest(folder)
    problems = []
    if not man.get("files"):
        return [f"{folder}/{MANIFEST}: missing or empty"]
    for name, entry in sorted(man["files"].items()):
        p = folder / name
        if not p.exists():
            problems.append(f"{name}: missing")
            continue
        got = sha256_of(p)
        if got != entry["sha256"]:
            problems.append(f"{name}: sha256 {got[:16]}... does not match the manifest's {entry['sha256'][:16]}...")
    for p in sorted(folder.glob("*.safetensors")):
        if p.name not in man["files"]:
            problems.append(f"{p.name}: not in the manifest")
    return problems


def golden_specs(folder: "str | Path" = GOLDEN_DIR) -> list[CaseSpec]:
    """The golden-tier cases: one per file of the folder's manifest. A folder without its manifest
    (a broken install, a wrong QCONFORM_GOLDEN_DIR) raises: it must not shrink the case list."""
    folder = Path(folder)
    man = _manifest(folder)
    if not man.get("files"):
        raise QconformError(f"golden tensors not found: {folder / MANIFEST} is missing or empty (the golden "
                            "tier needs them; reinstall qconform, or set QCONFORM_GOLDEN_DIR to a folder that "
                            "'qconform golden verify --dir' accepts)")
    out = []
    for name, entry in sorted(man["files"].items()):
        src = CaseSpec.from_json(entry["spec"])
        out.append(CaseSpec(src.case, "golden", name[: -len(".safetensors")], src.seed))
    return out


def golden_expected(spec: CaseSpec, folder: "str | Path" = GOLDEN_DIR) -> dict:
    t = load_tensors(Path(folder) / (spec.generator + ".safetensors"))
    return {k: t[k].data for k in ("y_ref", "y_exact") if k in t}
