"""``qconform golden regenerate``: write every golden file and its manifest, each cross-checked first.

Semantics: docs/conformance.md#golden-tensors. The golden cases and the byte check (``verify``) are
conformance/cases/golden.py; writing them is judging work: before a file is written, the emulator's
dequantized weights and reference output are cross-checked against independent code
(conformance/judge/oracles.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from emulator import __version__ as emulator_version

from conformance.cases.bundle import ReplayBundle, save_bundle
from conformance.cases.golden import GOLDEN_DIR, MANIFEST, file_name, sha256_of, source_specs

__all__ = ["regenerate"]


def regenerate(folder: "str | Path" = GOLDEN_DIR, *, check_oracles: bool = True) -> dict:
    """Write every golden file and the manifest into ``folder``; returns the manifest."""
    from conformance.judge.acceptance import declared_interval
    from backends.base import Declared

    from conformance.judge import oracles

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for spec in source_specs():
        inp = spec.inputs()
        decl = Declared(variants={}, accumulate="exact", output=spec.case.output_dtype)
        if spec.case.spec.quantize_only:  # inputs + the canonical codes, scales, zero points, dequantized values
            from conformance.judge.quantized import expected_for

            expected = expected_for(spec.case, inp.x, decl)
            oracle = oracles.cross_check_quantized(inp, expected) if check_oracles else "not checked"
            name = file_name(spec) + ".safetensors"
            save_bundle(folder / name, ReplayBundle(inp, spec.to_json(), backend="emulator", declared=decl.to_json(),
                                                    verdict="golden", reason="canonical reference",
                                                    quantized=(None, expected)))
            files[name] = {"sha256": sha256_of(folder / name), "spec": spec.to_json(), "oracle": oracle}
            continue
        iv = declared_interval(inp, decl)
        oracle = oracles.cross_check(inp, iv) if check_oracles else "not checked"
        name = file_name(spec) + ".safetensors"
        save_bundle(folder / name, ReplayBundle(inp, spec.to_json(), backend="emulator", declared=decl.to_json(),
                                                verdict="golden", reason="canonical reference", interval=iv))
        files[name] = {"sha256": sha256_of(folder / name), "spec": spec.to_json(), "oracle": oracle}
    manifest = {"emulator_version": emulator_version, "generator": "conformance.judge.golden_regenerate.regenerate",
                "files": dict(sorted(files.items()))}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return manifest
