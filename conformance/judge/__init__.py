"""Whether an output is right: reference intervals, the verdict core (verdict.judge), quantize-only judging, oracles, failure localization.

The room's place in the suite: docs/design.md#the-rooms-of-conformance.
"""
