"""Which suite wrote a bundle: versions, git commit and the hash of the judging code.

Semantics: docs/certification.md#verification (step 0).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from emulator import __version__ as emulator_version

__all__ = ["BUNDLE_FORMAT", "OUTPUTS_FORMAT", "MANIFEST", "suite_code_sha256", "suite_sources", "suite_identity", "describe_suite",
           "version_mismatch"]

BUNDLE_FORMAT = "qconform-certification-bundle/2"
OUTPUTS_FORMAT = "qconform-outputs/1"
MANIFEST = "MANIFEST.json"

#: the sources whose code decides cases, intervals, verdicts, metrics and what a bundle must hold (hashed
#: into ``suite_code_sha256``): the rooms that draw cases (their coverage classes included), judge and run them,
#: and certification; reports' layout, fingerprints, the self-test, campaigns, the CLI and test helpers are left out
_SUITE_SOURCES = ("conformance/cases", "conformance/judge", "conformance/run", "conformance/certify", "emulator",
                  "backends/base.py")

# -- which suite wrote a bundle ----------------------------------------------------------------------------
_CODE_SHA: "str | None" = None


def suite_code_sha256() -> str:
    """sha256 over the suite's judging sources (``_SUITE_SOURCES``: the case, interval, verdict and bundle
    modules of conformance/, all of emulator/, backends/base.py): path and bytes of each .py file.

    The package version alone does not change when the judging code does; this hash does. It is
    computed from the files of the running checkout or installation (cached per process).
    """
    global _CODE_SHA
    if _CODE_SHA is None:
        root = Path(__file__).resolve().parents[2]
        h = hashlib.sha256()
        for p in suite_sources():
            rel = p.relative_to(root).as_posix().encode()
            data = p.read_bytes()
            h.update(len(rel).to_bytes(4, "little") + rel + len(data).to_bytes(8, "little") + data)
        _CODE_SHA = h.hexdigest()
    return _CODE_SHA


def suite_sources() -> list[Path]:
    """The .py files ``suite_code_sha256`` hashes, in hashing order (by path below the project root)."""
    root = Path(__file__).resolve().parents[2]
    paths = []
    for src in _SUITE_SOURCES:
        p = root / src
        paths += sorted(p.rglob("*.py")) if p.is_dir() else ([p] if p.is_file() else [])
    return sorted(paths, key=lambda q: q.relative_to(root).as_posix())


def suite_identity() -> dict:
    """The running suite: package version, emulator version, git commit (when a checkout), code hash."""
    from conformance.run.provenance import git_commit, suite_version

    return {"suite_version": suite_version(), "emulator_version": emulator_version, "git_commit": git_commit(),
            "suite_code_sha256": suite_code_sha256()}


def describe_suite(ident: dict) -> str:
    """'qconform 0.1.0 (emulator 0.1.0, commit 1a2b3c4d5e6f, code 5e6f7a8b9c0d)' for messages."""
    parts = [f"emulator {ident.get('emulator_version') or '?'}"]
    if ident.get("git_commit"):
        parts.append(f"commit {str(ident['git_commit'])[:12]}" + ("-dirty" if str(ident["git_commit"])
                                                                   .endswith("-dirty") else ""))
    code = ident.get("suite_code_sha256")
    parts.append(f"code {code[:12]}" if code else "no code hash recorded: a suite older than this check")
    return f"qconform {ident.get('suite_version') or 'checkout'} ({', '.join(parts)})"


def version_mismatch(meta: dict, running: dict) -> "str | None":
    """One line naming both suites when the bundle was written by another suite than the running one."""
    recorded = {k: meta.get(k) for k in ("suite_version", "emulator_version", "git_commit", "suite_code_sha256")}
    same = (recorded["suite_code_sha256"] is not None
            and recorded["suite_code_sha256"] == running["suite_code_sha256"]
            and recorded["suite_version"] == running["suite_version"]
            and recorded["emulator_version"] == running["emulator_version"])
    if same:
        return None
    how = (f"check out commit {str(recorded['git_commit']).removesuffix('-dirty')[:12]}"
           if recorded.get("git_commit") else "install the suite that wrote it")
    return (f"bundle written by {describe_suite(recorded)}, this is {describe_suite(running)}: a bundle is "
            f"verified by the suite version that wrote it ({how}; --any-version recomputes anyway)")

