"""What is run: profiles, feature tables and their covering design, generators, Hypothesis strategies, golden cases.

The room's place in the suite: docs/design.md#the-rooms-of-conformance.
"""
