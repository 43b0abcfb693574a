"""The measured dispatcher's choices, kept on disk per host so a second process does not time again.

Semantics: docs/fallback.md#measured-dispatch.

One JSON file per host identity (CPU model, machine, CPU count, the whole CPU flag set of
/proc/cpuinfo, Python, NumPy, the emulator's version and a digest of the timed code: ``code_digest``), in
``$QCONFORM_DISPATCH_CACHE`` (a folder; ``off`` turns it off) or ``$XDG_CACHE_HOME/qconform/dispatch`` (default ``~/.cache/qconform/dispatch``). Each entry
also records the library version of every contender it timed. The file is a *hint about speed*, never
about correctness: a choice read from it is followed only when the chosen backend is one of the contenders
the dispatcher admitted for this layer now (its own rules, judged on the layer's tensors) and every
contender's version is the one installed now; anything else is measured again. A file that cannot be
read, is not this format, or was written for another host identity is ignored with one warning line
(and replaced at the next write).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
from pathlib import Path
from .host import cpu_info

__all__ = ["HostChoiceCache", "host_identity", "code_digest", "FORMAT"]

log = logging.getLogger("qconform.dispatch")

FORMAT = "qconform-dispatch-cache/1"


def host_identity() -> dict:
    """What a timing depends on besides the kernels' own versions (those are recorded per entry)."""
    import numpy

    from emulator import __version__ as emulator_version

    info = cpu_info()
    model, flags = info["model_name"], sorted(info["flags"])
    return {"cpu": model, "machine": platform.machine(), "cpu_count": os.cpu_count(), "cpu_flags": flags,
            "python": platform.python_version(), "numpy": numpy.__version__, "emulator": emulator_version,
            "code": code_digest()}


#: the packages whose code a timing measured: the emulator's fast path, the adapters, the op around them
_TIMED_PACKAGES = ("emulator", "backends", "qconform_torch")


def code_digest(root: "Path | None" = None) -> str:
    """sha256 (16 hex digits) of the sources of ``_TIMED_PACKAGES`` as installed: the emulator's version does not
    change when its fast path gets faster, so a choice timed against an older fast path is not followed (a
    checkout with edited sources measures again)."""
    root = Path(__file__).resolve().parents[1] if root is None else Path(root)
    h = hashlib.sha256()
    for pkg in _TIMED_PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _default_folder() -> Path | None:
    env = os.environ.get("QCONFORM_DISPATCH_CACHE")
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "none") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "qconform" / "dispatch"


class HostChoiceCache:
    """The measured choices of this host: ``get(key, contenders, versions)`` / ``put(key, entry)``."""

    def __init__(self, folder: str | os.PathLike | None = None, *, identity: dict | None = None):
        self.identity = host_identity() if identity is None else identity
        digest = hashlib.sha256(json.dumps(self.identity, sort_keys=True).encode()).hexdigest()[:16]
        self.path = None if folder is None else Path(folder) / f"dispatch-{digest}.json"
        self._entries: dict | None = None
        self.warnings: list[str] = []

    @classmethod
    def default(cls) -> "HostChoiceCache | None":
        """The cache in the default folder, or None where ``QCONFORM_DISPATCH_CACHE=off``."""
        folder = _default_folder()
        return None if folder is None else cls(folder)

    def _warn(self, why: str) -> None:
        line = f"dispatch cache {self.path}: {why}; ignored (the choices are measured again)"
        self.warnings.append(line)
        log.warning("%s", line)

    def _load(self) -> dict:
        if self._entries is not None:
            return self._entries
        self._entries = {}
        if self.path is None or not self.path.exists():
            return self._entries
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError) as e:
            self._warn(f"unreadable ({type(e).__name__}: {' '.join(str(e).split())[:120]})")
            return self._entries
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("choices"), dict):
            self._warn(f"not a {FORMAT} file")
            return self._entries
        if data.get("host") != self.identity:
            theirs = data.get("host") if isinstance(data.get("host"), dict) else {}
            diff = sorted(k for k in set(self.identity) | set(theirs) if self.identity.get(k) != theirs.get(k))
            self._warn(f"written for another host identity ({', '.join(diff) or 'malformed'} differ)")
            return self._entries
        self._entries = {k: v for k, v in data["choices"].items() if isinstance(v, dict)}
        return self._entries

    def get(self, key: str, contenders: list[str], versions: dict[str, str | None]) -> tuple[dict | None, str]:
        """(the stored entry for ``key`` if it may be followed, else None; why not, '' where none was stored)."""
        entry = self._load().get(key)
        if entry is None:
            return None, ""
        chosen = entry.get("chosen")
        if chosen not in contenders:
            return None, (f"the host cache names {chosen!r}, not a contender for this layer now "
                          f"({', '.join(contenders)}): not followed")
        if entry.get("versions") != {c: versions.get(c) for c in contenders}:
            return None, "the host cache's entry was timed with other library versions: not followed"
        if not isinstance(entry.get("times_ms"), dict):
            return None, "the host cache's entry has no timings: not followed"
        return entry, ""

    def put(self, key: str, entry: dict) -> None:
        if self.path is None:
            return
        entries = self._load()
        entries[key] = entry
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".dispatch-", dir=self.path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"format": FORMAT, "host": self.identity, "choices": entries}, f, sort_keys=True, indent=1)
            os.replace(tmp, self.path)  # atomic: a concurrent reader sees the old file or the new one
        except OSError as e:  # a read-only home: the choice still holds in this process
            log.warning("dispatch cache %s: cannot write (%s); this process keeps its choices", self.path, e)
