"""Summaries and what people read: summary statuses, console lines, report.md / report.html, documentation tables.

The room's place in the suite: docs/design.md#the-rooms-of-conformance.
"""
