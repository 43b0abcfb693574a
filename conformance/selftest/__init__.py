"""The suite testing itself: mutation testing against planted-bug doubles, and the emulator's end-to-end self-check.

The room's place in the suite: docs/design.md#the-rooms-of-conformance.
"""
