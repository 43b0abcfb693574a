"""Round 2 of the independent check (issue 21): NumPy CPU kernels written from docs/formats/*.md and
docs/variants.md only, each backend correct by default and carrying one planted bug with ``bug=NAME``
(the list with one line each: ``qconform_r2.bugs.BUGS``)."""

__version__ = "0.1.0"
