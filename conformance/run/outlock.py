"""One writer per output folder: an advisory lock (flock) that `run` and `certify` hold on --out.

Semantics: docs/conformance.md#isolation. The lock is a file ``.qconform-lock`` in the folder
(``certify`` locks ``.<name>.qconform-lock`` next to its bundle folder, which it creates only when
sealed). A second process that asks for a held lock gets ``OutputLocked`` (a QconformError: exit 2,
one line) naming the holder's pid; the kernel drops the lock when the holder exits, however it ends.
Within one process the lock is re-entrant (counted), so a process may open several Runners on its
own folder one after another.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from emulator.errors import QconformError

__all__ = ["OutputLocked", "OutLock", "LOCK_NAME"]

LOCK_NAME = ".qconform-lock"
_held: dict[str, list] = {}  # lock file (resolved) -> [fd, count]
_guard = threading.Lock()


class OutputLocked(QconformError):
    pass


class OutLock:
    """``OutLock(path).acquire()`` / ``.release()``, or ``with OutLock(path):``."""

    def __init__(self, lock_file: "str | Path", what: str):
        self.lock_file = Path(lock_file)
        self.what = what
        self.held = False

    @classmethod
    def for_folder(cls, folder: "str | Path") -> "OutLock":
        folder = Path(folder)
        return cls(folder / LOCK_NAME, str(folder))

    @classmethod
    def beside(cls, folder: "str | Path") -> "OutLock":
        folder = Path(folder)
        return cls(folder.parent / f".{folder.name}{LOCK_NAME}", str(folder))

    def acquire(self) -> "OutLock":
        if self.held:
            return self
        try:
            return self._acquire()
        except OSError as e:  # a read-only, full or foreign folder: exit 2 with one line, never an internal error
            from conformance.run.resultfile import is_output_error, unwritable

            if is_output_error(e):
                raise unwritable(e, self.lock_file) from None
            raise

    def _acquire(self) -> "OutLock":
        self.lock_file.parent.mkdir(parents=True, exist_ok=True)
        key = str(self.lock_file.resolve())
        with _guard:
            if key in _held:
                _held[key][1] += 1
                self.held = True
                return self
            fd = os.open(key, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
                finally:
                    os.close(fd)
                raise OutputLocked(f"{self.what}: another qconform process (pid {holder}) is writing into this "
                                   "folder; wait for it to end or choose another --out") from None
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError:
                os.close(fd)
                raise
            _held[key] = [fd, 1]
        self.held = True
        return self

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        key = str(self.lock_file.resolve())
        with _guard:
            entry = _held.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del _held[key]
                try:
                    fcntl.flock(entry[0], fcntl.LOCK_UN)
                finally:
                    os.close(entry[0])

    def __enter__(self) -> "OutLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
