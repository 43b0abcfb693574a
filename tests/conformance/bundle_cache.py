"""Certification bundles built once per test session and shared by pytest-xdist workers.

Each bundle is built under the session's base temp folder (the parent shared by all xdist
workers) behind an flock, so `-n 2` does not certify twice. Tests must not modify a shared
bundle: they copy it (``copy_bundle``) before tampering.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from pathlib import Path

#: test backends of conformance/selftest/doubles/faulty.py, registered for the workers through the environment
FAULTY = "faulty-nan=conformance.selftest.doubles.faulty:NanBackend,faulty-raise=conformance.selftest.doubles.faulty:RaiseBackend"

WAIVERS = """
[[waiver]]
backend = "faulty-nan"
scheme  = "w8a8"
case    = "random/*"
reason  = "test: NaN output on random cases is known"
issue   = "https://example.invalid/issue/1"
expires = "2999-01-01"

[[waiver]]
backend = "emulator:*reciprocal=*"
scheme  = "w8a8"
case    = "exact/*"
reason  = "test: an expired waiver turns its cases into fail"
issue   = "https://example.invalid/issue/2"
expires = "2001-01-01"
"""


def _shared_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


@contextlib.contextmanager
def _env(**kw):
    old = {k: os.environ.get(k) for k in kw}
    os.environ.update(kw)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def shared(tmp_path_factory, name: str, build) -> Path:
    root = _shared_root(tmp_path_factory)
    target = root / f"qconform-shared-{name}"
    done = root / f"qconform-shared-{name}.done"
    with open(root / f"qconform-shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not done.exists():
                if target.exists():
                    shutil.rmtree(target)
                build(target)
                done.write_text("ok")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target


def _cli(argv: list[str]) -> int:
    from conformance.cli.main import main

    return main(argv)


def basic_bundle(tmp_path_factory) -> Path:
    """The emulator on the smoke profile's w8a8 cases, as host 'host-a'."""

    def build(target: Path):
        rc = _cli(["certify", "--backend", "emulator", "--scheme", "w8a8", "--profile", "smoke", "--out", str(target),
                   "--host-label", "host-a", "--no-progress"])
        assert rc == 0

    return shared(tmp_path_factory, "basic", build)


def rich_bundle(tmp_path_factory) -> Path:
    """Every kind of verdict on w8a8 (exact + random tiers), as host 'host-b':

    - emulator with RHAZ activation rounding declaring canonical semantics: fails, explained by another tie rule;
    - emulator with the 127/amax reciprocal declaring canonical: passes, one case with activation tie flips;
      its exact-tier cases fall under an expired waiver (-> fail);
    - faulty-nan: fails; its random-tier cases are waived;
    - faulty-raise: crashes (the backend raises).
    """

    def build(target: Path):
        wfile = target.parent / "qconform-shared-rich-waivers.toml"
        wfile.write_text(WAIVERS, encoding="utf-8")
        argv = ["certify", "--scheme", "w8a8", "--profile", "smoke", "--tier", "exact", "--tier", "random",
                "--out", str(target), "--host-label", "host-b", "--waivers", str(wfile), "--timeout", "60",
                "--no-progress"]
        for b in ("emulator:act_rounding=rhaz,declare=canonical", "emulator:reciprocal=recip_amax,declare=canonical",
                  "faulty-nan", "faulty-raise"):
            argv += ["--backend", b]
        with _env(QCONFORM_EXTRA_BACKENDS=FAULTY):
            rc = _cli(argv)
        assert rc == 1  # failures and crashes: the certification does not pass, the bundle is written

    return shared(tmp_path_factory, "rich", build)


def copy_bundle(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _gone_backend():
    from backends.base import Availability
    from backends.emulator import EmulatorBackend

    class GoneBackend(EmulatorBackend):
        """A backend whose library or device is absent on this host."""

        name = "gone"

        def availability(self):
            return Availability(False, "test: the device is not on this host")

    return GoneBackend


def __getattr__(name):  # the worker imports tests.conformance.bundle_cache:GoneBackend lazily
    if name == "GoneBackend":
        return _gone_backend()
    raise AttributeError(name)
