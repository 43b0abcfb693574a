"""The runner's side of a backend worker (conformance/worker.py): start, ask, time out, kill.

Semantics: docs/conformance.md#isolation. Requests and replies travel on two pipes of their own
(not the worker's fds 0, 1 or 2, which go to /dev/null and the worker's log): whatever a kernel
prints cannot be taken for a reply. Every wait for a reply is bounded by the case timeout, also
when the worker sends half a line and hangs. The worker runs in its own process group; a timeout,
a crash and ``close`` kill the whole group, so processes a kernel forks go with it.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["WorkerProcess", "DEFAULT_MEMORY_LIMIT", "parse_size", "signal_name"]

MAX_REPLY = 1 << 20  # a reply line longer than this is not the worker speaking the protocol
LOG_TAIL = 600  # characters of the worker's log kept in a crash/timeout record
LOG_KEEP = 64 << 10  # a kept log is cut to its last 64 KiB


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


#: per worker: half the host's memory (at least 2 GiB), so one runaway kernel meets its cap (MemoryError or
#: a failed allocation: a crash verdict) before the host's OOM killer picks a victim
DEFAULT_MEMORY_LIMIT = max(2 << 30, _physical_memory() // 2)


def parse_size(text) -> int:
    """'8G', '512M', '1.5G', '0' (no cap) or a byte count -> bytes."""
    t = str(text).strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    try:
        value = int(float(t[:-1]) * mult[t[-1]]) if t and t[-1] in mult else int(float(t))
    except (ValueError, OverflowError):
        value = -1
    if value < 0:
        raise ValueError(f"--memory-limit: expected a size such as 8G, 512M or 0 (no cap), got {text!r}")
    return value


def signal_name(rc: int) -> "str | None":
    if rc is None or rc >= 0:
        return None
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def _describe_exit(rc: int) -> str:
    sig = signal_name(rc)
    return f"killed by signal {sig}" if sig else f"exited with status {rc}"


_counter = itertools.count(1)


class WorkerProcess:
    """One backend worker subprocess with line-JSON requests on a private channel and a per-request timeout.

    ``log_dir``: where the worker's log (its fds 1 and 2) is written; a log is kept only when the
    worker crashed or timed out (cut to its last 64 KiB) and removed otherwise. Without ``log_dir``
    the log lives in the system temp folder and is always removed. ``last_log`` names the kept log.
    """

    def __init__(self, backend_spec: str, *, env: dict | None = None, log_dir: "str | Path | None" = None,
                 memory_limit: "int | None" = None):
        self.backend_spec = backend_spec
        self.env = env
        self.log_dir = Path(log_dir) if log_dir else None
        self.memory_limit = DEFAULT_MEMORY_LIMIT if memory_limit is None else int(memory_limit)
        self.proc: subprocess.Popen | None = None
        self.log_path: "Path | None" = None
        self.last_log: "Path | None" = None
        self._req = self._rep = None
        self._buf = b""
        self.last_tail = ""  # the end of the last log, read when the worker was killed

    def start(self) -> None:
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in self.backend_spec)[:60]
            self.log_path = self.log_dir / f"worker-{safe}-{os.getpid()}-{next(_counter)}.log"
            log = open(self.log_path, "wb")
        else:
            fd, name = tempfile.mkstemp(prefix="qconform-worker-", suffix=".log")
            self.log_path = Path(name)
            log = os.fdopen(fd, "wb")
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        from .golden import GOLDEN_DIR

        env.setdefault("QCONFORM_GOLDEN_DIR", str(GOLDEN_DIR))  # the worker's cwd differs from ours
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "conformance.worker", "--backend", self.backend_spec, "--request-fd",
                 str(req_r), "--reply-fd", str(rep_w), "--memory-limit", str(self.memory_limit)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(req_r, rep_w), env=env, cwd=root,
                start_new_session=True)
        finally:
            os.close(req_r)
            os.close(rep_w)
            log.close()
        self._req, self._rep = req_w, rep_r
        os.set_blocking(rep_r, False)
        os.set_blocking(req_w, False)  # a worker that stops reading cannot block the runner's write
        self._buf = b""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = LOG_TAIL) -> str:
        p = self.log_path
        if p is None:
            return self.last_tail
        try:
            with open(p, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - n))
                data = f.read(n)
            return data.decode("utf-8", "replace").strip()
        except (OSError, TypeError):
            return ""

    def request(self, obj: dict, timeout: float) -> dict:
        """Send one request; returns the reply, or {"ok": False, "kind": "crash"|"timeout", "evidence": ...}."""
        if not self.alive():
            self.kill(keep_log=False)
            self.start()
        deadline = time.monotonic() + timeout
        data = (json.dumps(obj) + "\n").encode()
        try:
            while data:
                left = deadline - time.monotonic()
                if left <= 0:
                    return self._timeout(timeout)
                _, w, _ = select.select([], [self._req], [], min(left, 0.5))
                if w:
                    try:
                        data = data[os.write(self._req, data):]
                    except BlockingIOError:
                        continue
                elif self.proc.poll() is not None:
                    return self._dead()
        except OSError:
            return self._dead()
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line, self._buf = self._buf[:nl], self._buf[nl + 1:]
                try:
                    reply = json.loads(line)
                    if not isinstance(reply, dict):
                        raise ValueError("not an object")
                    return reply
                except ValueError:
                    return self._dead(f"the worker broke the reply protocol (a line that is not a JSON object: "
                                      f"{line[:120]!r})")
            if len(self._buf) > MAX_REPLY:
                return self._dead(f"the worker broke the reply protocol (a reply longer than {MAX_REPLY} bytes)")
            left = deadline - time.monotonic()
            if left <= 0:
                return self._timeout(timeout)
            r, _, _ = select.select([self._rep], [], [], min(left, 0.5))
            if r:
                try:
                    chunk = os.read(self._rep, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    return self._dead()
                self._buf += chunk
            elif self.proc.poll() is not None:
                return self._dead()  # (a forked child may still hold the reply pipe open: no EOF comes)

    def _timeout(self, timeout: float) -> dict:
        self.kill(keep_log=True)
        tail = self.last_tail
        return {"ok": False, "kind": "timeout", "error": f"no answer within {timeout:g} s; worker killed",
                "evidence": {"worker": "timeout", "timeout_s": timeout, "log": self._log_name(), "log_tail": tail}}

    def _dead(self, why: "str | None" = None) -> dict:
        rc = None
        if self.proc is not None:
            if why is None:
                try:
                    rc = self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    why = "the worker closed its reply channel but did not exit"
        self.kill(keep_log=True)
        tail = self.last_tail
        what = why or _describe_exit(rc)
        return {"ok": False, "kind": "crash", "error": what + (f"; log: {tail}" if tail else ""), "returncode": rc,
                "evidence": {"worker": "crash", "returncode": rc, "signal": signal_name(rc) if rc is not None else None,
                             "what": what, "log": self._log_name(), "log_tail": tail}}

    def _log_name(self) -> "str | None":
        if self.last_log is None or self.log_dir is None:
            return None
        return self.last_log.name

    def kill(self, *, keep_log: bool = False) -> None:
        """Kill the worker's process group, close the channel; keep (cut) or remove its log."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            self.proc = None
        for fd in (self._req, self._rep):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._req = self._rep = None
        self._buf = b""
        if self.log_path is not None:
            self.last_tail = self.log_tail()
            if keep_log and self.log_dir is not None:
                _cut(self.log_path, LOG_KEEP)
                self.last_log = self.log_path
            else:  # a clean end, or a temp-folder log: the tail above is all that is kept
                self.last_log = None
                _remove(self.log_path)
            self.log_path = None

    def close(self) -> None:
        if self.alive():
            try:
                self.request({"op": "exit"}, timeout=5)
            except Exception:  # noqa: BLE001
                pass
        self.kill(keep_log=False)


def _remove(p: Path) -> None:
    try:
        p.unlink()
    except OSError:
        pass


def _cut(p: Path, keep: int) -> None:
    try:
        size = p.stat().st_size
        if size > keep:
            with open(p, "rb") as f:
                f.seek(size - keep)
                tail = f.read(keep)
            p.write_bytes(tail)
    except OSError:
        pass
