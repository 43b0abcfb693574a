"""Executing cases in isolated workers, anywhere: the runner, the result record, worker processes and their client, placement, remote executors.

The room's place in the suite: docs/design.md#the-rooms-of-conformance.
"""
