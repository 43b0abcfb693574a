"""Reading a bundle's files safely: inside the bundle, regular files only, bounded, hashed as a stream.

Semantics: docs/certification.md#verification. A bundle comes from elsewhere: a path in it may try
to leave it (``..``, an absolute path, a symlink), a "file" may be a FIFO (a read blocks forever) or a
device (``/dev/zero``: a read never ends), and a file may be huge. Every file is opened with
O_NOFOLLOW | O_NONBLOCK, must be a regular file (fstat), is read in chunks up to a size limit and
hashed as it is read.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path, PurePosixPath

__all__ = ["MAX_FILE_BYTES", "MAX_PARSED_BYTES", "BundleFileError", "bad_relpath", "scan", "read_file",
           "hash_file"]

#: a bundle file larger than this is refused (the certification profile's largest file is ~20 MB)
MAX_FILE_BYTES = 4 << 30
#: a file parsed in memory (JSON, text, safetensors) larger than this is refused
MAX_PARSED_BYTES = 512 << 20
_CHUNK = 1 << 20


class BundleFileError(Exception):
    pass


def bad_relpath(rel) -> "str | None":
    """Why ``rel`` is not a plain relative path inside the bundle, or None."""
    if not isinstance(rel, str) or not rel:
        return "not a path"
    if "\\" in rel or "\x00" in rel:
        return "a backslash or NUL in the path"
    p = PurePosixPath(rel)
    if p.is_absolute() or rel.startswith("/"):
        return "an absolute path"
    if any(part in ("..", ".", "") for part in rel.split("/")):
        return "a path with '..', '.' or an empty part"
    return None


def scan(folder: Path) -> "tuple[dict[str, int], list[str]]":
    """({relative path: size} of the regular files under ``folder``, [problems]) without following
    links: a symlink (to a file or a folder) or a special file (FIFO, device, socket) is a problem."""
    files: dict[str, int] = {}
    problems: list[str] = []
    for root, dirs, names in os.walk(folder, followlinks=False):
        for name in list(dirs) + names:
            p = Path(root) / name
            rel = p.relative_to(folder).as_posix()
            try:
                st = os.lstat(p)
            except OSError as e:
                problems.append(f"{rel}: unreadable ({e.strerror})")
                continue
            if stat.S_ISLNK(st.st_mode):
                problems.append(f"{rel}: a symlink (a bundle holds regular files only)")
            elif stat.S_ISDIR(st.st_mode):
                continue
            elif not stat.S_ISREG(st.st_mode):
                problems.append(f"{rel}: a special file (FIFO, device or socket), not a regular file")
            else:
                files[rel] = st.st_size
        dirs[:] = [d for d in dirs if not os.path.islink(Path(root) / d)]
    return files, problems


def _open(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise BundleFileError(f"cannot open ({e.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise BundleFileError("not a regular file")
    return fd


def hash_file(path: Path, limit: int = MAX_FILE_BYTES, *, keep: bool = False) -> "tuple[str, int, bytes | None]":
    """(sha256, size, the bytes when ``keep``) of a regular file, read in chunks, at most ``limit`` bytes."""
    fd = _open(path)
    h = hashlib.sha256()
    n = 0
    parts = [] if keep else None
    try:
        while True:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                break
            n += len(chunk)
            if n > limit:
                raise BundleFileError(f"larger than the {limit}-byte limit")
            h.update(chunk)
            if keep:
                parts.append(chunk)
    finally:
        os.close(fd)
    return h.hexdigest(), n, (b"".join(parts) if keep else None)


def read_file(path: Path, limit: int = MAX_PARSED_BYTES) -> bytes:
    return hash_file(path, limit, keep=True)[2]


def tail(path: Path, n: int) -> bytes:
    """The last ``n`` bytes of a regular file."""
    fd = _open(path)
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - n), os.SEEK_SET)
        out = b""
        while len(out) < min(n, size):
            chunk = os.read(fd, n - len(out))
            if not chunk:
                break
            out += chunk
        return out
    finally:
        os.close(fd)
