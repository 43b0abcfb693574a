"""Round 3 of the independent check (issue 21): NumPy CPU kernels written from README.md, docs/formats/*.md,
docs/variants.md, docs/conformance.md and backends/base.py only. Each backend is correct by default; ``bug=NAME``
plants one defect (the list with one line each: ``qconform_r3.bugs.BUGS``)."""

__version__ = "0.1.0"
