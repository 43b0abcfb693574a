"""Wiring of the qconform commands, and the pytest plugin.

The room's place in the suite: docs/design.md#the-rooms-of-conformance.
"""
