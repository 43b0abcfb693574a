"""The property tier's search: each family's Hypothesis search run through the runner, one result line each.

Semantics: docs/conformance.md#property-tier. The strategies that draw a case and its inputs are
conformance/cases/property.py; this module runs each drawn example through the backend in its isolated
worker (``Runner.run_case`` with the drawn inputs sent as a bundle file) and judges it as every other tier
does. A ``fail``/``crash``/``timeout`` that no waiver covers fails the example, so Hypothesis shrinks it;
the minimal example becomes the family's one result line (tier ``property``) with a replay bundle, and
the first failing example found is kept next to it (``property.first_failure``). The example database
lives in ``OUT/hypothesis`` (keyed by backend label and family).
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections import Counter
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, Phase, given, reject, settings as hyp_settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import Unsatisfiable


from conformance.cases.inputs import CaseInputs
from conformance.run.record import ResultRecord
from conformance.cases.specs import PROPERTY_TIER, CaseSpec
from conformance.judge.verdict import BAD, Verdict
from conformance.run.workerclient import WorkerClient
from conformance.cases.property import (GENERATOR, PROPERTY_PROFILES, example_digest, describe_example, families,
                                        property_case, property_inputs)


#: Hypothesis reports several distinct failures as an ExceptionGroup (Python 3.11+; on 3.10 its
#: backport's class, when installed, else nothing to catch)
try:
    _EXCEPTION_GROUP = ExceptionGroup  # noqa: F821 - a builtin from Python 3.11
except NameError:  # pragma: no cover - Python 3.10
    try:
        from exceptiongroup import ExceptionGroup as _EXCEPTION_GROUP
    except ImportError:
        _EXCEPTION_GROUP = ()

__all__ = ["PropertySearch", "run_property", "failure_signature"]


class _Failure(Exception):
    """Raised inside the search for a non-pass verdict no waiver covers: Hypothesis shrinks it."""


_FAILURE_TYPES: dict = {}


def failure_signature(rec: dict, inp: "CaseInputs | None" = None) -> str:
    """What kind of failure a record is: the verdict, and for a crash the exception or signal named
    first in its reason. Each signature is searched and shrunk on its own (one minimal example each),
    so a crash that is easy to hit does not hide a wrong answer of the same family."""
    verdict = rec["verdict"]
    if verdict == Verdict.CRASH:
        head = str(rec.get("reason") or "").split(":")[0].strip()
        return f"crash-{head.split()[0] if head else 'unknown'}"[:60]
    if verdict == Verdict.FAIL:
        reason = str(rec.get("reason", ""))
        if reason.startswith("malformed"):
            return "fail-malformed"
        worst = (rec.get("metrics") or {}).get("worst_element") or {}
        if "NaN or infinite" in reason or not all(np.isfinite(worst.get(k, 0.0)) for k in ("expected", "lo", "hi")):
            # where the reference is NaN or infinite: from NaN/Inf inputs (the NaN/Inf policy), or overflow
            if inp is not None and not all(np.isfinite(a).all() for a in (inp.x, inp.bias) if a is not None):
                return "fail-nonfinite-input"
            return "fail-overflow"
        if "SQNR" in reason:  # opaque arithmetic below its declared floor
            return "fail-sqnr"
        return "fail-interval"
    return verdict


def _failure_type(signature: str) -> type:
    """One exception class per signature: Hypothesis tells bugs apart by the exception's type."""
    if signature not in _FAILURE_TYPES:
        _FAILURE_TYPES[signature] = type(f"PropertyFailure[{signature}]", (_Failure,), {})
    return _FAILURE_TYPES[signature]


# -- the search ------------------------------------------------------------------------------------
def _search_outcome(test, st_: dict) -> str:
    """Run the Hypothesis test: "passed", "failed" (failure signatures in ``st_["found"]``), "unsatisfiable" or
    "flaky (...)" (an error after a failure was found; raised when none was)."""
    try:
        test()
    except (_Failure, _EXCEPTION_GROUP) as e:
        if isinstance(e, _EXCEPTION_GROUP) and not all(isinstance(x, _Failure) for x in e.exceptions):
            raise
        return "failed"
    except Unsatisfiable:
        return "unsatisfiable"
    except Exception as e:  # noqa: BLE001 - Hypothesis's Flaky (a failure that did not repeat) and the like
        if not st_["found"]:
            raise
        return f"flaky ({type(e).__name__})"
    return "passed"


@dataclasses.dataclass
class PropertySearch:
    """One backend's property searches, run through ``runner`` (conformance.run.runner.Runner) in one worker."""

    runner: object
    backend_spec: str
    label: str
    profile: str = "ci"
    seed: "int | None" = None
    max_examples: "int | None" = None
    #: optional predicate on a drawn Case: False rejects it (the self-test: only cases a mutant's bug lives in)
    case_filter: object = None

    def __post_init__(self):
        if self.profile not in PROPERTY_PROFILES:
            raise ValueError(f"unknown profile {self.profile!r}; known: {', '.join(PROPERTY_PROFILES)}")
        if self.seed is None:
            self.seed = int(time.time()) if self.profile == "nightly" else 0
        self.limits = dict(PROPERTY_PROFILES[self.profile])
        if self.max_examples is not None:
            self.limits["examples"] = int(self.max_examples)

    def database(self) -> DirectoryBasedExampleDatabase:
        return DirectoryBasedExampleDatabase(str(Path(self.runner.out_dir) / "hypothesis"))

    def run_family(self, worker, scheme: str, fmt: str, tmpdir: Path, today: str) -> list[dict]:
        """The family's result lines: one per failure signature found (its shrunk example), else one
        line for the whole search (pass-kind, or unsupported when no example was judged)."""
        st_ = {"calls": 0, "judged": 0, "unsupported": 0, "waived": 0, "verdicts": Counter(), "found": {},
               "refusals": Counter(), "levels": [], "deviations": {}, "semantic_unwaived": 0,
               "deviation_waiver": None}
        test = self._hypothesis_test(self._example_judge(worker, scheme, fmt, tmpdir, today, st_), scheme, fmt)
        t0 = time.perf_counter()
        outcome = _search_outcome(test, st_)
        seconds = time.perf_counter() - t0
        info = {"family": f"{scheme}/{fmt}", "seed": self.seed, "profile": self.profile,
                "max_examples": self.limits["examples"], "calls": st_["calls"], "judged": st_["judged"],
                "unsupported": st_["unsupported"], "waived": st_["waived"], "verdicts": dict(st_["verdicts"]),
                "database": str(Path(self.runner.out_dir) / "hypothesis"), "search_s": round(seconds, 2),
                "outcome": outcome}
        if st_["found"]:
            return [self._minimal_record(worker, tmpdir, today, found, dict(info, signature=sig))
                    for sig, found in st_["found"].items()]
        return [self._search_record(scheme, fmt, info, seconds, st_)]

    def _example_judge(self, worker, scheme: str, fmt: str, tmpdir: Path, today: str, st_: dict):
        """The Hypothesis test body: draw a case and its inputs, run and judge them on ``worker``, count the outcome
        into ``st_``; a failure raises its signature's exception (Hypothesis then shrinks it)."""
        runner, label = self.runner, self.label
        lim = self.limits

        def judge_example(data) -> None:
            st_["calls"] += 1
            case = data.draw(property_case(scheme, fmt, lim["max_m"], lim["max_n"], lim["max_k"]), label="case")
            if self.case_filter is not None and not self.case_filter(case):
                reject()
            plan = WorkerClient(worker, runner.timeout).plan(CaseSpec(case, PROPERTY_TIER, GENERATOR, 0))
            if plan.failure is None and not plan.supported:
                st_["unsupported"] += 1
                st_["refusals"][plan.reason[:200]] += 1
                reject()
            inp = data.draw(property_inputs(case), label="inputs")
            spec = CaseSpec(case, PROPERTY_TIER, GENERATOR, example_digest(inp))
            rec = runner.run_case(worker, label, spec, tmpdir, today=today, inp=inp, write_bundle=False)
            st_["verdicts"][rec["verdict"]] += 1
            if rec.get("level") and rec["verdict"] != Verdict.UNSUPPORTED:  # the family's level: its farthest example's
                st_["levels"].append(rec["level"])
                for d in rec.get("deviations") or []:
                    st_["deviations"][d["variant"]] = d["level"]
                if rec["level"] == "semantic":
                    if rec.get("deviation_waiver"):
                        st_["deviation_waiver"] = rec["deviation_waiver"]
                    else:
                        st_["semantic_unwaived"] += 1
            if rec["verdict"] == Verdict.WAIVED:
                st_["waived"] += 1
                st_["waived_rec"] = rec
            if rec["verdict"] in BAD:
                ex = {"spec": spec, "inp": inp, "rec": rec}
                sig = failure_signature(rec, inp)
                found = st_["found"].setdefault(sig, {"first": ex})
                found["last"] = ex
                raise _failure_type(sig)(sig)
            # judged: an example whose verdict says something of the kernel (not refused, not a reference that
            # proves nothing, not a known defect)
            if not Verdict.parse(rec["verdict"]).neutral and rec["verdict"] != Verdict.WAIVED:
                st_["judged"] += 1

        return judge_example

    def _hypothesis_test(self, judge_example, scheme: str, fmt: str):
        """``judge_example`` as a seeded Hypothesis test over the family's example budget and database."""
        test = given(st.data())(judge_example)
        test = hyp_settings(max_examples=self.limits["examples"], database=self.database(), deadline=None,
                            derandomize=False, report_multiple_bugs=True, print_blob=False,
                            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
                            suppress_health_check=list(HealthCheck))(test)
        # what hypothesis.seed() does, less its side effect of switching the example database off: the
        # database in OUT/hypothesis is what makes a rerun start from the known failures
        test._hypothesis_internal_use_seed = self.seed
        test._hypothesis_internal_database_key = f"qconform-property/{self.label}/{scheme}/{fmt}".encode()
        return test

    def _search_record(self, scheme: str, fmt: str, info: dict, seconds: float, st_: dict) -> dict:
        """The one line of a search that found no failure: unsupported when no example was judged, else the
        weakest passing verdict of its judged examples (waived when a known defect was hit)."""
        family_spec = f"{PROPERTY_TIER}/{scheme}/{fmt}/search/seed{self.seed}"
        if st_["judged"] == 0:
            why = (f"no example of {scheme}/{fmt} was judged ({st_['unsupported']} refused, "
                   f"{st_['waived']} waived, verdicts {dict(st_['verdicts'])})")
            if st_["refusals"]:
                why += "; refusal: " + st_["refusals"].most_common(1)[0][0]
            return self._family_record(family_spec, scheme, fmt, Verdict.UNSUPPORTED, why, info, seconds)
        # the family's verdict: the weakest of its judged examples' (none failed; mistrusted ones say nothing)
        worst = Verdict.worst(v for v, n in st_["verdicts"].items()
                              if n and (Verdict.parse(v).passing or v == Verdict.PASS_SQNR)) or Verdict.PASS
        reason = (f"{st_['judged']} Hypothesis example(s) of {scheme}/{fmt} judged, none failed "
                  f"(seed {self.seed}, {st_['unsupported']} refused, {st_['waived']} waived)")
        rec = self._family_record(family_spec, scheme, fmt, worst, reason, info, seconds, st_)
        if st_["waived"]:  # a known defect was hit: the family is reported waived, never plain pass
            rec.update(verdict=Verdict.WAIVED.value, waived_verdict=st_["waived_rec"].get("waived_verdict"),
                       waiver=st_["waived_rec"].get("waiver"),
                       reason=f"{st_['waived']} example(s) failed and were waived "
                              f"({st_['waived_rec'].get('waiver', {}).get('issue')}); {reason}")
        return rec

    def _family_record(self, case_id, scheme, fmt, verdict, reason, info, seconds, st_=None) -> dict:
        rec = ResultRecord(self.label, case_id, PROPERTY_TIER, scheme, fmt, GENERATOR, verdict, reason,
                           property=info, seconds=seconds).to_json()
        if st_ is not None and st_["levels"]:
            # the family's conformance level (docs/conformance.md#levels): the farthest of its judged examples;
            # a semantic deviation counts as accepted only when a waiver accepted it on every such example
            from conformance.judge.levels import run_level

            rec["level"] = run_level(st_["levels"])
            rec["deviations"] = [{"variant": v, "level": lv} for v, lv in sorted(st_["deviations"].items())]
            if rec["level"] == "semantic" and not st_["semantic_unwaived"] and st_["deviation_waiver"]:
                rec["deviation_waiver"] = st_["deviation_waiver"]
        return rec

    def _minimal_record(self, worker, tmpdir, today, st_: dict, info) -> dict:
        """The shrunk example, judged once more with its replay bundle written (a failure that does not
        repeat is reported as such, with the failing record kept)."""
        last, first = st_["last"], st_["first"]
        rec = self.runner.run_case(worker, self.label, last["spec"], tmpdir, today=today, inp=last["inp"],
                                   write_bundle=True)
        if rec["verdict"] not in BAD:
            kept = dict(last["rec"])
            kept["reason"] = (f"{kept.get('reason', '')} (did not repeat on a rerun: verdict {rec['verdict']}; "
                              f"the backend is not deterministic on this example)")
            rec = kept
            rec["bundle"] = str(self.runner.write_replay_bundle(self.label, last["spec"], last["inp"], None,
                                                                rec["verdict"], rec["reason"]))
        info = dict(info, minimal=describe_example(last["inp"]), first_failure=describe_example(first["inp"]),
                    first_failure_case_id=first["spec"].case_id)
        rec["property"] = info
        return rec


def run_property(runner, backend_specs: list[str], *, profile: str = "ci", seed: "int | None" = None,
                 schemes=None, max_examples: "int | None" = None, stop_at_first_failure: bool = False,
                 case_filter=None) -> list[dict]:
    """Run the property tier for each backend through ``runner``; one result line per (backend, family).

    A backend that is unavailable gets one ``unsupported`` line per family, as ``Runner.run`` does.
    ``stop_at_first_failure`` (the mutation self-test): a backend's remaining families are skipped
    after its first failing one.
    """
    results = []
    today = time.strftime("%Y-%m-%d")
    for bspec in backend_specs:
        hello = runner.hello(bspec)
        label = hello.get("label", bspec)
        search = PropertySearch(runner, bspec, label, profile, seed, max_examples, case_filter)
        worker = runner.open_worker(bspec)
        tmpdir = Path(runner.out_dir) / ".work" / f"property-{label}".replace("/", "_").replace(":", "_")
        tmpdir.mkdir(parents=True, exist_ok=True)
        try:
            for scheme, fmt in families(schemes):
                if not hello.get("ok") or not hello.get("available"):
                    reason = hello.get("reason") or hello.get("error") or "unavailable"
                    recs = [search._family_record(f"{PROPERTY_TIER}/{scheme}/{fmt}/search/seed{search.seed}", scheme,
                                                  fmt, Verdict.UNSUPPORTED, f"backend unavailable: {reason}",
                                                  {"family": f"{scheme}/{fmt}", "seed": search.seed}, 0.0)]
                else:
                    recs = search.run_family(worker, scheme, fmt, tmpdir, today)
                for rec in recs:
                    runner.write_result(rec)
                    results.append(rec)
                if stop_at_first_failure and any(r["verdict"] in BAD for r in recs):
                    break
        finally:
            worker.close()
            shutil.rmtree(tmpdir, ignore_errors=True)
            try:
                (Path(runner.out_dir) / ".work").rmdir()
            except OSError:
                pass
    return results

