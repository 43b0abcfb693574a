"""What a run is asked to do, checked before any case runs: backends, schemes, formats, tiers, profile.

Semantics: docs/conformance.md#usage-errors. A typo must never become a green run: an unknown
name or backend parameter is the caller's error (one line naming it and the known values; the
CLI exits 2), found here in the parent process, not as 'unsupported' verdicts from a worker
that could not start.
"""

from __future__ import annotations

from backends.base import SCHEMES, WEIGHT_FORMATS

__all__ = ["check_names", "check_backends", "check_selection"]


def check_names(what: str, given, known) -> None:
    """Raise ValueError naming the first of ``given`` that is not in ``known``."""
    for g in given or ():
        if g not in known:
            raise ValueError(f"unknown {what} {g!r}; known: {', '.join(known)}")


def check_selection(*, schemes=None, tiers=None, profile=None, formats=None) -> None:
    """Every scheme, tier, profile and weight format named is one the suite knows."""
    from conformance.cases.specs import PROFILES, TIERS

    check_names("scheme", schemes, tuple(SCHEMES))
    check_names("tier", tiers, TIERS)
    check_names("weight format", formats, WEIGHT_FORMATS)
    if profile is not None:
        check_names("profile", [profile], tuple(PROFILES))


def check_backends(specs, *, option: str = "--backend") -> dict:
    """Construct each backend spec once in this process; returns {spec: Backend}.

    ``registry.create`` raises for an unknown name; each adapter's constructor raises for a
    parameter it does not know (``emulator:foo=bar``). Either becomes one ValueError naming the
    spec. An adapter whose module cannot be imported is not a usage error: it is constructed as
    unavailable and the run reports it so.
    """
    from backends.registry import create

    out = {}
    for spec in specs or ():
        if spec in out:
            raise ValueError(f"{option} {spec!r} is given twice")
        try:
            out[spec] = create(spec)
        except Exception as e:  # noqa: BLE001 - any constructor error is the spec's fault
            text = " ".join((str(e) or type(e).__name__).split())
            raise ValueError(f"{option} {spec}: {text}") from None
        # result lines are keyed by label: two spellings of one backend would overwrite each other's verdicts
        twin = next((s for s, b in out.items() if s != spec and b.label == out[spec].label), None)
        if twin is not None:
            raise ValueError(f"{option} {spec!r} and {twin!r} name the same backend ({out[spec].label}); give it once")
    return out
