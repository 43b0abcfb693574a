"""pytest plugin: the conformance cases as test items.

Semantics: docs/conformance.md#pytest.

    pytest --qconform-backend=emulator [--qconform-scheme=w4a16] [--qconform-profile=ci]
           [--qconform-tier=edge] [--qconform-out=DIR] -n auto

Without ``--qconform-backend`` the plugin adds nothing. Each item runs its case
in a backend worker subprocess (one per pytest process, reused), so a crashing
kernel fails that item with ``crash`` and the session goes on; items are
deterministic and independent, so ``pytest -n auto`` (pytest-xdist) spreads
them. Results are also appended to ``DIR/results.jsonl`` (one file per xdist
worker, ``results-<worker>.jsonl``, merged by ``qconform report``).
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
    g.addoption("--qconform-profile", default="ci", help="ci | smoke | certification | nightly")
    g.addoption("--qconform-out", default=None, help="folder for results JSONL and replay bundles")
    g.addoption("--qconform-timeout", type=float, default=120.0, help="seconds per case")
    g.addoption("--qconform-waivers", default=None, help="waivers TOML")


class QconformItem(pytest.Item):
    def __init__(self, *, backend: str, spec, **kw):
        super().__init__(**kw)
        self.backend = backend
        self.spec = spec
        self.add_marker(pytest.mark.qconform)

    def runtest(self):
        from .runner import BAD, Runner, load_waivers

        cfg = self.config
        out = cfg.getoption("--qconform-out") or os.path.join(tempfile.gettempdir(), "qconform-pytest")
        wid = os.environ.get("PYTEST_XDIST_WORKER", "main")
        runner = Runner(Path(out), timeout=cfg.getoption("--qconform-timeout"), progress=False,
                        waivers=load_waivers(cfg.getoption("--qconform-waivers")))
        runner.results_path = Path(out) / f"results-{wid}.jsonl"
        worker = _WORKERS.get(self.backend)
        if worker is None:
            from .runner import WorkerProcess

            worker = _WORKERS[self.backend] = WorkerProcess(self.backend)
        tmp = Path(tempfile.mkdtemp(prefix="qconform-item-"))
        hello = worker.request({"op": "hello"}, timeout=runner.timeout)
        label = hello.get("label", self.backend)
        if not hello.get("available"):
            pytest.skip(f"{self.backend} unavailable: {hello.get('reason') or hello.get('error')}")
        rec = runner._run_one(worker, label, self.spec, tmp)
        import time

        rec = runner._apply_waiver(label, self.spec, rec, time.strftime("%Y-%m-%d"))
        runner._write(rec)
        self.user_properties.append(("verdict", rec["verdict"]))
        if rec["verdict"] == "unsupported":
            pytest.skip(f"unsupported: {rec['reason']}")
        if rec["verdict"] in BAD:
            msg = f"{rec['verdict']}: {rec['reason']}"
            if rec.get("bundle"):
                msg += f"\n  reproduce: qconform replay {rec['bundle']}"
            raise QconformFailure(msg)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, QconformFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"{self.backend} {self.spec.case_id}"


class QconformFailure(Exception):
    pass


class QconformCollector(pytest.Collector):
    def collect(self):
        from .suite import TIERS, case_list

        cfg = self.config
        tiers = tuple(cfg.getoption("--qconform-tier")) or TIERS
        specs = case_list(schemes=cfg.getoption("--qconform-scheme") or None, tiers=tiers,
                          profile=cfg.getoption("--qconform-profile"))
        for backend in cfg.getoption("--qconform-backend"):
            for spec in specs:
                yield QconformItem.from_parent(self, name=f"{backend}::{spec.case_id}", backend=backend, spec=spec)


def pytest_configure(config):
    config.addinivalue_line("markers", "qconform: a qconform conformance case")


def pytest_collection_modifyitems(session, config, items):
    if not config.getoption("--qconform-backend"):
        return
    col = QconformCollector.from_parent(session, name="qconform")
    items.extend(col.collect())


def pytest_sessionfinish(session, exitstatus):
    for w in _WORKERS.values():
        w.close()
    _WORKERS.clear()
