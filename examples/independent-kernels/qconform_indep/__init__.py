"""Independent NumPy kernels (correct and deliberately buggy) for checking qconform's power.

Written from docs/formats/*.md and docs/variants.md only (not from emulator/). See README.md."""

__version__ = "0.1.0"
