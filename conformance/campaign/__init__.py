"""Hostile inputs for the loaders and the CLI: the malformed-checkpoint campaign.

The room's place in the suite: docs/design.md#the-rooms-of-conformance.
"""
