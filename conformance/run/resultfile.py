"""Whole-line appends to a run's JSONL files, and the one error a run's output folder may raise.

Semantics: docs/conformance.md#isolation. A result line is written with one ``write`` on an
``O_APPEND`` descriptor; where the write is short (the disk filled up, a file-size limit) the bytes
that did land are cut off again, so ``results.jsonl`` only ever ends in a whole line.
``repair_torn_tail`` removes a torn last line that a killed process (or an older version) left, before
a resumed run appends to the file. Any OSError of the output folder that is not the run's fault
(no space, read-only, quota, permission) becomes ``OutputUnwritable``: exit 2 with one line.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from emulator.errors import QconformError

__all__ = ["OutputUnwritable", "append_line", "repair_torn_tail", "is_output_error", "unwritable",
           "check_worker_output_fault"]

#: errors that say the output folder cannot take what the run writes (not a fault of a case or a kernel)
OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR}
_WHY = {errno.ENOSPC: "no space left on the device (the disk is full)",
        errno.EDQUOT: "the disk quota is exhausted",
        errno.EFBIG: "the file size limit is reached (the disk or a ulimit is full)",
        errno.EROFS: "the file system is read-only",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
        errno.ENOTDIR: "a part of the path is not a folder"}


class OutputUnwritable(QconformError):
    """The output folder cannot be written (full, read-only, over quota): a usage error, exit 2."""


def is_output_error(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in OUTPUT_ERRNOS


def unwritable(e: OSError, path: "str | Path | None" = None, *, hint: str = "",
               verb: str = "cannot write") -> OutputUnwritable:
    """The one-line error for ``e``, naming the file (``e.filename`` or ``path``) and the cause (``verb``:
    what could not be done; empty where the caller does not know whether it was a read or a write)."""
    where = e.filename or path or "an output file"
    why = _WHY.get(e.errno) or e.strerror or str(e)
    return OutputUnwritable(f"{where}: " + (f"{verb}: " if verb else "") + why + (f"; {hint}" if hint else ""))


def append_line(path: "str | Path", line: str, *, sync: bool = True, fault=None) -> None:
    """Append ``line`` (a newline is added) to ``path`` whole, or not at all.

    ``fault`` (tests): a function ``(fd, data) -> int`` used instead of ``os.write``, to inject a
    short write or an error. A short write is retried for the rest; where the rest fails too, the
    file is cut back to its size before this call and the OSError is raised.
    """
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    write = fault or os.write
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.fstat(fd).st_size  # the run's lock makes this process the file's only writer
        done = 0
        try:
            while done < len(data):
                n = write(fd, data[done:])
                if n <= 0:  # (a write that takes nothing and says nothing: treat as a full disk)
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
                done += n
            if sync:
                os.fsync(fd)
        except OSError as e:
            if done:
                try:
                    os.ftruncate(fd, start)  # shrinking needs no space: the file ends in a whole line again
                except OSError:
                    pass
            if not e.filename:
                e.filename = str(path)
            raise
    finally:
        os.close(fd)


def repair_torn_tail(path: "str | Path") -> int:
    """Cut a last line that has no newline (a write a kill interrupted); the number of bytes removed."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(p, "rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        # walk back to the last newline, 64 KiB at a time (a result line is far shorter than the file)
        end = size
        keep = 0
        while end > 0:
            start = max(0, end - (64 << 10))
            f.seek(start)
            chunk = f.read(end - start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            end = start
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
        return size - keep


_DISK_ERRNOS = ("[Errno 28]", "[Errno 122]", "[Errno 27]", "[Errno 30]")  # ENOSPC, EDQUOT, EFBIG, EROFS


def check_worker_output_fault(rec: dict, work_dir: "str | Path") -> None:
    """A worker that could not write its output file into the run's scratch folder (disk full) is the
    folder's fault, not the kernel's: OutputUnwritable (the run stops) instead of a ``crash`` record."""
    ev = rec.get("evidence") or {}
    exc = str(ev.get("exception") or "")
    if (rec.get("verdict") == "crash" and ev.get("worker") == "raised" and exc.startswith("OSError")
            and any(code in exc for code in _DISK_ERRNOS) and "save_tensors" in str(ev.get("traceback") or "")):
        raise OutputUnwritable(f"{work_dir}: cannot write: the worker could not write its output ({exc}); "
                               "make room and continue with --resume")
