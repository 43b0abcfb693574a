"""The golden tensors: one safetensors file per (scheme family, generator) and their checksummed MANIFEST.json.

A data package (no code): it sits at the project's top level, beside emulator/, backends/ and conformance/,
and ships as package data so that ``pip install .`` judges the same golden tier as a checkout. The suite
finds it through ``importlib.resources.files("golden")`` (``conformance.cases.specs.golden_dir``);
``QCONFORM_GOLDEN_DIR`` points it elsewhere. Format and regeneration: docs/conformance.md#golden-tensors.
"""
