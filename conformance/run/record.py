"""``ResultRecord``: one result line of ``results.jsonl``, the one schema its writers and readers share.

Semantics: docs/conformance.md#output. The runner (a case) and the property tier (a family) build their
lines through it; ``read_records`` reads them back through it, so a line written by an earlier suite
version (the same field names and values) reads into the same record, and a line whose verdict is no
``Verdict`` is refused with one line saying so. Keys a later version adds are kept (``extra``) and
written back unchanged.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from conformance.judge.verdict import Verdict

__all__ = ["ResultRecord", "read_records", "RecordError"]


class RecordError(ValueError):
    """A result line that is not a record of this schema (which line, what is wrong)."""


#: the fields every result line has, in the order they are written
_REQUIRED = ("backend", "case_id", "tier", "scheme", "weight_format", "generator", "verdict", "reason")


@dataclasses.dataclass
class ResultRecord:
    """One (backend, case) result. ``verdict`` is the final one (after waivers); the fields after ``reason``
    are present only where they apply (None: absent from the line)."""

    backend: str
    case_id: str
    tier: str
    scheme: str
    weight_format: str
    generator: str
    verdict: Verdict
    reason: str
    spec: "dict | None" = None  # CaseSpec.to_json() (a property family's line has none)
    declared: "dict | None" = None  # Declared.to_json() of what was judged
    metrics: "dict | None" = None  # Judgement.metrics (docs/conformance.md#metrics)
    evidence: "dict | None" = None  # why a crash, timeout, refusal or malformed output
    seconds: "float | None" = None
    kernel_s: "float | None" = None
    prepare_s: "float | None" = None
    level: "str | None" = None  # docs/conformance.md#levels
    deviations: "list | None" = None
    canonical_distance: "dict | None" = None
    bundle: "str | None" = None  # the replay bundle of a failure
    localization: "dict | None" = None  # docs/conformance.md#failure-localization
    waived_verdict: "str | None" = None  # the verdict a current waiver turned into ``waived``
    waiver: "dict | None" = None
    waiver_expired: "dict | None" = None
    deviation_waiver: "dict | None" = None
    unexpected_pass_of_waived_case: "dict | None" = None
    property: "dict | None" = None  # the property tier's search (docs/conformance.md#property-tier)
    extra: dict = dataclasses.field(default_factory=dict)  # keys this schema does not name, kept as read
    #: optional fields given as None (written as null, as the line had them); other None fields are left out
    nulls: frozenset = dataclasses.field(default_factory=frozenset)

    def __post_init__(self):
        self.verdict = Verdict.parse(self.verdict)

    @classmethod
    def for_case(cls, label: str, spec, verdict: "Verdict | str", reason: str, **fields) -> "ResultRecord":
        """The record of case ``spec`` (a CaseSpec) on backend ``label``; ``fields``: the optional fields."""
        return cls(label, spec.case_id, spec.tier, spec.case.scheme, spec.case.weight_format, spec.generator,
                   verdict, reason, spec=spec.to_json(), **_split(fields))

    @classmethod
    def from_json(cls, obj: dict) -> "ResultRecord":
        """The record of one parsed result line; RecordError naming what is missing or wrong."""
        if obj.get("kind", "result") != "result":
            raise RecordError(f"a {obj.get('kind')!r} line is not a result")
        missing = [k for k in _REQUIRED if k not in obj]
        if missing:
            raise RecordError(f"result line of {obj.get('backend')!r} {obj.get('case_id')!r} lacks "
                              f"{', '.join(missing)}")
        try:
            return cls(**{k: obj[k] for k in _REQUIRED}, **_split({k: v for k, v in obj.items()
                                                                   if k not in _REQUIRED and k != "kind"}))
        except ValueError as e:
            raise RecordError(f"result line of {obj['backend']!r} {obj['case_id']!r}: {e}") from None

    def to_json(self) -> dict:
        """The line as a dict: ``kind``, the required fields, then the optional ones that are set."""
        out: dict = {"kind": "result"}
        for f in dataclasses.fields(self):
            if f.name in ("extra", "nulls"):
                continue
            v = getattr(self, f.name)
            if f.name in _REQUIRED or v is not None or f.name in self.nulls:
                out[f.name] = v.value if isinstance(v, Verdict) else v
        out.update(self.extra)
        return out


_OPTIONAL = frozenset(f.name for f in dataclasses.fields(ResultRecord)) - set(_REQUIRED) - {"extra", "nulls"}


def _split(fields: dict) -> dict:
    """Named optional fields as they are (those given as None noted in ``nulls``); any other key into ``extra``."""
    known = {k: v for k, v in fields.items() if k in _OPTIONAL}
    rest = {k: v for k, v in fields.items() if k not in _OPTIONAL and k not in ("extra", "nulls")}
    extra = dict(fields.get("extra") or {}, **rest)
    out = dict(known, nulls=frozenset(k for k, v in known.items() if v is None))
    return dict(out, extra=extra) if extra else out


def read_records(path: "str | Path") -> list[ResultRecord]:
    """The result lines of a results.jsonl (other kinds of line, and a line cut by an interrupted run, skipped)."""
    out = []
    p = Path(path)
    if not p.exists():
        return out
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if obj.get("kind") != "result":
                continue
            try:
                out.append(ResultRecord.from_json(obj))
            except RecordError as e:
                raise RecordError(f"{p}:{n}: {e}") from None
    return out
