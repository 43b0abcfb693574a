"""pytest plugin: the conformance cases as test items.

Semantics: docs/conformance.md#pytest.

    pytest --qconform-backend=emulator [--qconform-scheme=w4a16] [--qconform-profile=ci]
           [--qconform-tier=edge] [--qconform-out=DIR] -n auto

``--qconform-tier=property`` (never a default) adds one item per (scheme, format) family: a
Hypothesis search (conformance/run/property_search.py) that fails with the shrunk minimal example;
``--qconform-seed`` fixes its seed.

Without ``--qconform-backend`` the plugin adds nothing. With it, pytest collects *only* the
conformance cases (not the repository's own tests), so the command runs as is in a vendor's
repository. Every backend, scheme, tier and profile named is checked before collection: an
unknown one is a usage error (one line, pytest's usage-error exit status 4). A backend that is
unavailable here gives one failing item saying why (not a green run of skips), and a backend
whose every case was unsupported fails the session. Each item runs its case
in a backend worker subprocess (one per pytest process, reused), so a crashing
kernel fails that item with ``crash`` and the session goes on; items are
deterministic and independent, so ``pytest -n auto`` (pytest-xdist) spreads
them. Results are also written to ``DIR/results-<worker>.jsonl`` (one file per xdist
worker, merged by ``qconform report``); each session starts a fresh result set in DIR.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_WORKERS: dict = {}


def pytest_addoption(parser):
    g = parser.getgroup("qconform", "qconform conformance suite")
    g.addoption("--qconform-backend", action="append", default=[], help="backend spec to certify (repeatable)")
    g.addoption("--qconform-scheme", action="append", default=[], help="restrict to a scheme (repeatable)")
    g.addoption("--qconform-tier", action="append", default=[], help="restrict to a tier (repeatable)")
    g.addoption("--qconform-profile", default="ci", help="ci | smoke | certification | nightly | model")
    g.addoption("--qconform-out", default=None, help="folder for results JSONL and replay bundles")
    g.addoption("--qconform-timeout", type=float, default=120.0, help="seconds per case")
    g.addoption("--qconform-waivers", default=None, help="waivers TOML")
    g.addoption("--qconform-seed", type=int, default=None, help="--qconform-tier=property: the Hypothesis seed")


def _session_worker(item):
    """(out folder, a Runner writing this xdist worker's results file, the backend's shared worker process,
    its label) for one item; an unavailable backend fails the item."""
    from conformance.run.runner import Runner, WorkerProcess, load_waivers
    from conformance.run.workerclient import WorkerClient

    item.user_properties.append(("qconform_backend", item.backend))
    cfg = item.config
    out = _out_dir(cfg)
    wid = os.environ.get("PYTEST_XDIST_WORKER", "main")
    runner = Runner(Path(out), timeout=cfg.getoption("--qconform-timeout"), progress=False,
                    waivers=load_waivers(cfg.getoption("--qconform-waivers")))
    runner.results_path = Path(out) / f"results-{wid}.jsonl"
    worker = _WORKERS.get(item.backend)
    if worker is None:
        worker = _WORKERS[item.backend] = WorkerProcess(item.backend)
    hello = WorkerClient(worker, runner.timeout).hello()
    if not hello.available:
        raise QconformFailure(f"{item.backend} unavailable: {hello.why_unavailable}")
    return out, runner, worker, hello.label or item.backend


class QconformItem(pytest.Item):
    def __init__(self, *, backend: str, spec, **kw):
        super().__init__(**kw)
        self.backend = backend
        self.spec = spec
        self.add_marker(pytest.mark.qconform)

    def runtest(self):
        import time

        from conformance.judge.verdict import BAD, Verdict

        out, runner, worker, label = _session_worker(self)
        tmp = Path(tempfile.mkdtemp(prefix="qconform-item-"))
        rec = runner.run_case(worker, label, self.spec, tmp, today=time.strftime("%Y-%m-%d"))
        runner.write_result(rec)
        self.user_properties.append(("verdict", rec["verdict"]))
        if rec["verdict"] == Verdict.UNSUPPORTED:
            pytest.skip(f"unsupported: {rec['reason']}")
        if rec["verdict"] == Verdict.WAIVED:  # a known defect: never a plain pass (docs/conformance.md#pytest)
            w = rec.get("waiver") or {}
            pytest.xfail(f"waived {rec.get('waived_verdict')} (waiver {w.get('issue')}: {w.get('reason')}): "
                         f"{rec['reason']}")
        if rec["verdict"] in BAD:
            msg = f"{rec['verdict']}: {rec['reason']}"
            we = (rec.get("metrics") or {}).get("worst_element")
            if we:
                from conformance.report.summary import describe_worst

                msg += f"\n  worst element {describe_worst(we)}"
            from conformance.judge.localize_text import localization_lines

            msg += "".join(f"\n  {line}" for line in localization_lines(rec.get("localization")))
            notes = (rec.get("declared") or {}).get("notes")
            if notes:
                msg += f"\n  declaration notes: {notes}"
            if rec.get("bundle"):
                msg += f"\n  reproduce (in {out}): qconform replay bundles/{Path(rec['bundle']).name}"
            raise QconformFailure(msg)
        if rec.get("level") == "semantic" and not rec.get("deviation_waiver"):
            devs = ", ".join(d["variant"] for d in rec.get("deviations") or [] if d["level"] == "semantic")
            raise QconformFailure(f"semantic deviation: the backend declares {devs}, other numbers than the checkpoint "
                                  "defines (docs/conformance.md#levels); NOT CONFORMANT unless a waiver names it")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, QconformFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"{self.backend} {self.spec.case_id}"


class QconformFailure(Exception):
    pass


class PropertyItem(pytest.Item):
    """One property-tier search (conformance/run/property_search.py) of one (scheme, format) family on one backend:
    fails with the shrunk minimal example of each failure it found, skips when no example was judged."""

    def __init__(self, *, backend: str, scheme: str, fmt: str, **kw):
        super().__init__(**kw)
        self.backend, self.scheme, self.fmt = backend, scheme, fmt
        self.add_marker(pytest.mark.qconform)

    def runtest(self):
        import time

        from conformance.run.property_search import PropertySearch
        from conformance.judge.verdict import BAD, Verdict

        out, runner, worker, label = _session_worker(self)
        cfg = self.config
        search = PropertySearch(runner, self.backend, label, cfg.getoption("--qconform-profile"),
                                cfg.getoption("--qconform-seed"))
        tmp = Path(tempfile.mkdtemp(prefix="qconform-property-"))
        recs = search.run_family(worker, self.scheme, self.fmt, tmp, time.strftime("%Y-%m-%d"))
        for rec in recs:
            runner.write_result(rec)
        bad = [r for r in recs if r["verdict"] in BAD]
        verdict = bad[0]["verdict"] if bad else recs[0]["verdict"]
        self.user_properties.append(("verdict", verdict))
        if bad:
            lines = []
            for r in bad:
                m = (r.get("property") or {}).get("minimal") or {}
                lines.append(f"{r['verdict']}: {r['reason']}\n  minimal example: {m.get('case')} "
                             f"(scale dtype {m.get('scale_dtype')}, {m.get('choices')})")
                if r.get("bundle"):
                    lines.append(f"  reproduce (in {out}): qconform replay bundles/{Path(r['bundle']).name}")
            raise QconformFailure("\n".join(lines))
        if verdict == Verdict.UNSUPPORTED:
            pytest.skip(f"unsupported: {recs[0]['reason']}")
        if verdict == Verdict.WAIVED:  # the search hit a known defect: never a plain pass
            pytest.xfail(f"waived: {recs[0]['reason']}")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, QconformFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"{self.backend} property/{self.scheme}/{self.fmt}"


class UnavailableItem(pytest.Item):
    """One failing item for a backend that cannot run here: no case of it is certified."""

    def __init__(self, *, backend: str, reason: str, **kw):
        super().__init__(**kw)
        self.backend, self.reason = backend, reason

    def runtest(self):
        import json

        self.user_properties.append(("qconform_backend", self.backend))
        out = _out_dir(self.config)
        out.mkdir(parents=True, exist_ok=True)
        wid = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(out / f"results-{wid}.jsonl", "a", encoding="utf-8") as f:  # the reports mark it unavailable
            f.write(json.dumps({"kind": "backend", "backend": self.backend, "spec": self.backend,
                                "available": False, "reason": self.reason}) + "\n")
        raise QconformFailure(f"{self.backend} unavailable here: {self.reason}; none of its cases was run")

    def repr_failure(self, excinfo, style=None):
        return str(excinfo.value)

    def reportinfo(self):
        return self.path, None, f"{self.backend} availability"


class QconformCollector(pytest.Collector):
    def collect(self):
        from conformance.cases.specs import PROPERTY_TIER
        from conformance.cases.suite import TIERS, case_list

        cfg = self.config
        tiers = tuple(cfg.getoption("--qconform-tier")) or TIERS
        seeded = tuple(t for t in tiers if t != PROPERTY_TIER)
        schemes = cfg.getoption("--qconform-scheme") or None
        specs = case_list(schemes=schemes, tiers=seeded, profile=cfg.getoption("--qconform-profile")) if seeded else []
        fams = []
        if PROPERTY_TIER in tiers:  # Hypothesis only for the property tier
            from conformance.cases.property import families

            fams = families(schemes)
        for backend in cfg.getoption("--qconform-backend"):
            why = _UNAVAILABLE.get(backend)
            if why is not None:
                yield UnavailableItem.from_parent(self, name=f"{backend}::availability", backend=backend, reason=why)
                continue
            for spec in specs:
                yield QconformItem.from_parent(self, name=f"{backend}::{spec.case_id}", backend=backend, spec=spec)
            for scheme, fmt in fams:
                yield PropertyItem.from_parent(self, name=f"{backend}::property/{scheme}/{fmt}", backend=backend,
                                               scheme=scheme, fmt=fmt)


_UNAVAILABLE: dict = {}  # backend spec -> why it cannot run here (found once, in pytest_configure)
_JUDGED: dict = {}  # backend spec -> [judged, unsupported] (from the item reports; under xdist in the controller)


def _out_dir(config) -> Path:
    return Path(config.getoption("--qconform-out") or os.path.join(tempfile.gettempdir(), "qconform-pytest"))


def pytest_configure(config):
    config.addinivalue_line("markers", "qconform: a qconform conformance case")
    _UNAVAILABLE.clear()
    _JUDGED.clear()
    backends = config.getoption("--qconform-backend")
    if not backends:
        return
    from conformance.cases.selection import check_backends, check_selection
    from conformance.cases.specs import PROPERTY_TIER

    tiers = [t for t in config.getoption("--qconform-tier") or () if t != PROPERTY_TIER] or None
    try:
        check_selection(schemes=config.getoption("--qconform-scheme") or None, tiers=tiers,
                        profile=config.getoption("--qconform-profile"))
        built = check_backends(backends, option="--qconform-backend")
    except ValueError as e:
        raise pytest.UsageError(f"qconform: {e}") from None
    for spec, b in built.items():
        av = b.availability()
        if not av.available:
            _UNAVAILABLE[spec] = av.reason or "unavailable"
    for spec in backends:
        _JUDGED[spec] = [0, 0]
    if not hasattr(config, "workerinput"):  # the controller, before any xdist worker starts: a fresh result set
        _fresh_out(_out_dir(config))


def _fresh_out(out: Path) -> None:
    """Remove what an earlier session wrote into the output folder, so its reports count this session."""
    import shutil

    if not out.is_dir():
        return
    if (out / "MANIFEST.json").exists():
        raise pytest.UsageError(f"qconform: --qconform-out {out} holds a sealed certification bundle; choose another")
    for p in [out / n for n in ("results.jsonl", "summary.json", "report.md", "report.html")] + \
            sorted(out.glob("results-*.jsonl")):
        if p.exists():
            p.unlink()
    if (out / "bundles").is_dir():
        shutil.rmtree(out / "bundles")


def pytest_ignore_collect(collection_path, config):
    """With --qconform-backend the session is the conformance cases only: no test file is collected."""
    if config.getoption("--qconform-backend"):
        return True
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    if not config.getoption("--qconform-backend"):
        return
    col = QconformCollector.from_parent(session, name="qconform")
    items.extend(col.collect())


def pytest_runtest_logreport(report):
    props = dict(getattr(report, "user_properties", ()) or ())
    b = props.get("qconform_backend")
    if b not in _JUDGED or report.when != "call" or "verdict" not in props:
        return
    _JUDGED[b][props["verdict"] == "unsupported"] += 1  # (Verdict.UNSUPPORTED; this hook imports nothing)


def pytest_sessionfinish(session, exitstatus):
    for w in _WORKERS.values():
        w.close()
    _WORKERS.clear()
    if hasattr(session.config, "workerinput") or not _JUDGED:
        return  # an xdist worker: the controller sees every report
    unjudged = [b for b, (judged, unsup) in _JUDGED.items() if not judged and unsup]
    if unjudged and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    session.config._qconform_unjudged = unjudged


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for b in getattr(config, "_qconform_unjudged", []):
        terminalreporter.write_line(f"qconform: NOT CERTIFIED: no case of {b} was judged (every selected case is "
                                    "unsupported); the session fails", red=True)
