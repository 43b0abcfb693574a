"""Naming a kernel's arithmetic from discriminating probes (docs/fingerprints.md).

The room's place in the suite: docs/design.md#the-rooms-of-conformance.
"""
